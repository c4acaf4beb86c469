"""Schedule + arena checked without a GPU: interpreter == reference, hazards, decisions."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline import LARGE_EXAMPLES
from programs import programs

import tkx
from tkx import arena as arena_mod
from tkx.examples import get, names
from tkx.options import Options
from tkx.schedule import fusion_rule, keep, remove_fusion_rule, schedule
from tkx.schedule.check import check_hazards
from tkx.schedule.interpreter import run as run_schedule

OPTION_SETS = {
    "default": Options(),
    "no-fusion": Options(fuse_pointwise=False, fuse_epilogues=False, fuse_reductions=False),
    "block": Options(mode="block"),
    "no-epilogues": Options(fuse_epilogues=False),
    "no-reduction-fusion": Options(fuse_reductions=False),
    "grid-small-tiles": Options(mode="grid", tile_m=16, tile_n=16, tile_k=8, threads_per_block=128),
}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if not torch.isfinite(want).all():
        return 0.0 if torch.equal(got.isnan(), want.isnan()) else float("inf")
    return (got - want).norm().item() / max(want.norm().item(), 1e-30)


def assert_same(got, want, tol=1e-6):
    for a, b in zip(got.outputs, want.outputs):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert rel_err(a, b) <= tol
    assert got.updates.keys() == want.updates.keys()
    for k in want.updates:
        assert rel_err(got.updates[k], want.updates[k]) <= tol


@pytest.mark.parametrize("opt", list(OPTION_SETS), ids=list(OPTION_SETS))
@pytest.mark.parametrize("name", names())
def test_schedule_interpreter_matches_reference(name, opt):
    if name in LARGE_EXAMPLES and opt != "default":
        pytest.skip("a large example: default options only (tests/test_models.py runs every CPU stage)")
    ex = get(name)
    program = tkx.capture(ex.step_fn, ex.example_inputs).lower()
    sched = schedule(program, OPTION_SETS[opt])
    plan = arena_mod.plan(sched)
    assert check_hazards(sched, plan) == []
    inputs = ex.make_inputs(seed=2)
    want = tkx.reference.run(program, inputs)
    got = run_schedule(sched, plan, inputs)
    assert_same(got, want)
    assert plan.lower_bound_bytes <= plan.size_bytes <= plan.no_reuse_bytes


@settings(max_examples=int(os.environ.get("TKX_HYPOTHESIS_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), opt=st.sampled_from(list(OPTION_SETS)), seed=st.integers(0, 2**16))
def test_random_programs(program, opt, seed):
    sched = schedule(program, OPTION_SETS[opt])
    plan = arena_mod.plan(sched)
    assert check_hazards(sched, plan) == []
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(i.value.shape, generator=g) for i in program.inputs]
    want = tkx.reference.run(program, inputs)
    got = run_schedule(sched, plan, inputs)
    assert_same(got, want)


def test_hazard_checker_catches_a_missing_barrier():
    ex = get("tiny_online")
    sched = schedule(tkx.capture(ex.step_fn, ex.example_inputs).lower())
    flat = tuple(g for st_ in sched.stages for g in st_)
    broken = type(sched)(**{**sched.__dict__, "stages": (flat,), "barriers": ()})
    assert any(p.startswith("RAW") for p in check_hazards(broken))


def test_arena_checker_catches_overlap():
    ex = get("online")
    sched = schedule(tkx.capture(ex.step_fn, ex.example_inputs).lower())
    plan = arena_mod.plan(sched)
    slots = dict(plan.slots)
    a, b = sorted(slots.values(), key=lambda s: s.first)[:2]
    slots[b.buffer] = type(b)(b.buffer, a.offset, b.nbytes, a.first, max(a.last, b.last), b.kind, b.dtype)
    broken = type(plan)(sched, slots, plan.size_bytes, plan.lower_bound_bytes, plan.no_reuse_bytes,
                        plan.in_place, plan.staged)
    assert arena_mod.check(broken)


def test_decisions_are_recorded_with_reasons():
    ex = get("digits_mlp")
    sched = schedule(tkx.capture(ex.step_fn, ex.example_inputs).lower())
    assert sched.decisions and all(d.reason and d.code and d.rule for d in sched.decisions)
    not_fused = sched.why_not_fused()
    assert any(d.code == "multi-use" and "consumers" in d.reason for d in not_fused)
    assert any(d.code == "gemm-operand" for d in not_fused)
    # Momentum SGD: updates fused into the weight-gradient epilogues and written in place.
    assert any(d.kind == "in-place" and d.fused for d in sched.decisions)
    assert "stage 0" in str(sched)


def test_user_fusion_rule_changes_the_schedule():
    ex = get("digits_mlp")
    program = tkx.capture(ex.step_fn, ex.example_inputs).lower()
    # without row fusion: a materialised exp would otherwise join the row pass of softmax (in registers)
    before = schedule(program, tkx.Options(fuse_rows=False))

    @fusion_rule("keep-exp", kinds=("inline",), replace=True)
    def keep_exp(c):
        if c.producer.kind == "exp":
            return keep("user", "not fused: this notebook keeps exp materialised")
        return None

    try:
        after = schedule(program, tkx.Options(fuse_rows=False))
    finally:
        remove_fusion_rule("keep-exp")
    mine = [d for d in after.decisions if d.rule == "keep-exp"]
    assert mine and all(not d.fused for d in mine)
    exps = {op.id for op in program.ops if op.kind == "exp"}
    assert exps & set(after.materialized)
    assert not exps & set(before.materialized)
    plan = arena_mod.plan(after)
    inputs = ex.make_inputs(seed=4)
    assert_same(run_schedule(after, plan, inputs), tkx.reference.run(program, inputs))


def test_block_mode_uses_syncthreads():
    ex = get("linear_regression")
    sched = schedule(tkx.capture(ex.step_fn, ex.example_inputs).lower(), Options(mode="block"))
    assert sched.mode == "block" and sched.blocks == 1
    assert all(b.kind == "__syncthreads" for b in sched.barriers)
