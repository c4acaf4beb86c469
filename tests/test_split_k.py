"""The GEMM planners (tkx.target) and split-K, checked without a GPU.

Split-K forced on every tiled GEMM (wgmma on sm_90a: split_k=2 and 4) runs through the schedule
interpreter and matches the reference interpreter; the hazards checker finds nothing; the kernel
compiles for sm_90a without spills. Unit tests of the tile planner and of the split-K decision.
"""

from __future__ import annotations

import pytest
import torch

import tkx
from tkx import arena as arena_mod
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get, names
from tkx.options import Options
from tkx.schedule import schedule
from tkx.schedule.check import check_hazards
from tkx.schedule.interpreter import run as run_schedule
from tkx.target import SM_COUNT, GemmProblem, choose_gemm, gemm_emitter


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if not torch.isfinite(want).all():
        return 0.0 if torch.equal(got.isnan(), want.isnan()) else float("inf")
    return (got - want).norm().item() / max(want.norm().item(), 1e-30)


TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3, "int64": 0.0, "int32": 0.0, "bool": 0.0}


@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("name", names())
def test_split_k_on_every_gemm_matches_the_reference(name, split):
    ex = get(name)
    program = tkx.capture(ex.step_fn, ex.example_inputs).lower()
    sched = schedule(program, Options(arch="sm_90a", split_k=split, fp32_math="tf32"))
    gemms = [g for g in sched.groups.values() if g.kind == "gemm"]
    for g in gemms:
        steps = -(-g.plan.k // g.plan.tile_k)
        if g.plan.impl.startswith("wgmma"):
            assert g.plan.split_k == min(split, steps), g.plan
        if g.plan.split_k > 1:
            partial = sched.groups[f"{g.id}k"]
            assert partial.kind == "gemm_partial" and partial.stores == (g.plan.partials,)
            assert sched.stage_of(partial.id) < sched.stage_of(g.id)
            assert partial.work_items == g.plan.split_k * -(-g.plan.m // g.plan.tile_m) \
                * -(-g.plan.n // g.plan.tile_n) * g.plan.batch
    plan = arena_mod.plan(sched)
    assert check_hazards(sched, plan) == []
    inputs = ex.make_inputs(seed=3)
    want = tkx.reference.run(program, inputs)
    got = run_schedule(sched, plan, inputs)
    for a, b in zip(got.outputs, want.outputs):
        assert rel_err(a, b) <= TOL[str(b.dtype).removeprefix("torch.")], name
    for k in want.updates:
        assert rel_err(got.updates[k], want.updates[k]) <= TOL[str(want.updates[k].dtype).removeprefix("torch.")]


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
@pytest.mark.parametrize("name", ["small", "medium"])
def test_split_k_kernels_compile_for_sm_90a(name):
    ex = get(name)
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=name, arch="sm_90a", split_k=4)
    assert any(g.kind == "gemm_partial" for g in exp.schedule.groups.values())
    report = exp.cuda.check("sm_90a")
    assert report.spill_bytes == 0, report.summary()
    assert "ks_split" in exp.cuda.text and "split-K slices" in exp.cuda.text


def test_wgmma_tiles_per_problem():
    o = Options(arch="sm_90a")
    wide = choose_gemm(GemmProblem(256, 4096, 1024, dtype="bfloat16"), o, "sm_90a")
    assert wide.impl == "wgmma_bf16" and wide.tile_m % 64 == 0 and wide.tile_k == 64
    tiles = -(-256 // wide.tile_m) * -(-4096 // wide.tile_n)
    assert tiles <= SM_COUNT  # one wave
    big = choose_gemm(GemmProblem(4096, 1024, 256, dtype="bfloat16", a_k_contiguous=False), o, "sm_90a")
    assert (big.tile_m, big.tile_n) == (128, 128)  # many tiles: the largest
    tf32 = choose_gemm(GemmProblem(256, 256, 256), Options(fp32_math="tf32"), "sm_90a")
    assert tf32.impl == "wgmma_tf32" and tf32.tile_k == 32
    assert choose_gemm(GemmProblem(256, 256, 256, dtype="bfloat16"), o, "sm_90").impl == "wmma_bf16"
    narrow = choose_gemm(GemmProblem(256, 256, 256, dtype="bfloat16"), Options(threads_per_block=64), "sm_90a")
    assert narrow.impl == "wmma_bf16" and "warpgroups" in narrow.why
    for plan in (wide, big, tf32):
        assert gemm_emitter(plan.impl).registers(plan) <= 255


def test_split_k_decision():
    o = Options(arch="sm_90a")
    deep = choose_gemm(GemmProblem(256, 1024, 4096, dtype="bfloat16"), o, "sm_90a")
    assert deep.split_k > 1 and "split-K" in deep.why  # few tiles, deep K
    wide = choose_gemm(GemmProblem(4096, 1024, 256, dtype="bfloat16"), o, "sm_90a")
    assert wide.split_k == 1  # enough tiles
    off = choose_gemm(GemmProblem(256, 1024, 4096, dtype="bfloat16"), Options(split_k="off"), "sm_90a")
    assert off.split_k == 1
    cut = choose_gemm(GemmProblem(256, 1024, 128, dtype="bfloat16"), Options(split_k=16), "sm_90a")
    assert cut.split_k == 2 and "cut to 2" in cut.adjusted
    portable = choose_gemm(GemmProblem(256, 1024, 4096, dtype="bfloat16"), Options(split_k=4), "sm_80")
    assert portable.split_k == 1 and "not applied" in portable.adjusted
