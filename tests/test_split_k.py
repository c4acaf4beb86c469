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
from tkx import target
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get, names
from tkx.options import Options
from tkx.schedule import schedule
from tkx.schedule.check import check_hazards
from tkx.schedule.interpreter import ScheduleError
from tkx.schedule.interpreter import run as run_schedule
from tkx.target import SM_COUNT, GemmProblem, choose_gemm, gemm_emitter


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if not torch.isfinite(want).all():
        return 0.0 if torch.equal(got.isnan(), want.isnan()) else float("inf")
    return (got - want).norm().item() / max(want.norm().item(), 1e-30)


TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3, "int64": 0.0, "int32": 0.0, "bool": 0.0}


@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("name, last_slice", [(n, True) for n in names()] + [("small", False), ("medium", False)],
                         ids=lambda v: {True: "last-slice", False: "stage"}.get(v, v) if isinstance(v, bool) else v)
def test_split_k_on_every_gemm_matches_the_reference(name, split, last_slice):
    ex = get(name)
    program = tkx.capture(ex.step_fn, ex.example_inputs).lower()
    sched = schedule(program, Options(arch="sm_90a", split_k=split, fp32_math="tf32",
                                      split_k_final="last-slice" if last_slice else "stage"))
    gemms = [g for g in sched.groups.values() if g.kind == "gemm"]
    for g in gemms:
        steps = -(-g.plan.k // g.plan.tile_k)
        if g.plan.impl.startswith("wgmma"):
            assert g.plan.split_k == min(split, steps), g.plan
        if g.plan.split_k <= 1:
            continue
        items = g.plan.split_k * g.plan.tiles
        if last_slice:  # one group: its items write the slices, the last of each tile adds them
            assert g.plan.split_final == "last-slice" and f"{g.id}k" not in sched.groups
            assert g.plan.partials in g.stores and g.work_items == items
            assert "last of the" in g.plan.why
            assert any(d.kind == "split-k" and d.fused and d.consumer == g.id for d in sched.decisions)
        else:
            partial = sched.groups[f"{g.id}k"]
            assert partial.kind == "gemm_partial" and partial.stores == (g.plan.partials,)
            assert sched.stage_of(partial.id) < sched.stage_of(g.id)
            assert partial.work_items == items and g.plan.split_final == "stage"
    assert not last_slice or not any(g.kind == "gemm_partial" for g in sched.groups.values())
    plan = arena_mod.plan(sched)
    assert check_hazards(sched, plan) == []
    inputs = ex.make_inputs(seed=3)
    want = tkx.reference.run(program, inputs)
    counters: dict = {}
    runs = [run_schedule(sched, plan, inputs, splitk_counters=counters, splitk_order=order)
            for order in ("reverse", 7)]  # two launches sharing the sync words, items in two orders
    assert all(c == 0 for tiles in counters.values() for c in tiles)
    assert bool(counters) == (last_slice and any(g.plan.split_k > 1 for g in gemms))
    for got in runs:
        for a, b in zip(got.outputs, want.outputs):
            assert rel_err(a, b) <= TOL[str(b.dtype).removeprefix("torch.")], name
        for k in want.updates:
            assert rel_err(got.updates[k], want.updates[k]) <= TOL[str(want.updates[k].dtype).removeprefix("torch.")]
    for a, b in zip(runs[0].outputs, runs[1].outputs):  # slice order fixed: the same bits in any arrival order
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), name


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
@pytest.mark.parametrize("last_slice", [True, False], ids=["last-slice", "stage"])
@pytest.mark.parametrize("name", ["small", "medium"])
def test_split_k_kernels_compile_for_sm_90a(name, last_slice):
    ex = get(name)
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=name, arch="sm_90a", split_k=4,
                      split_k_final="last-slice" if last_slice else "stage")
    assert any(g.kind == "gemm_partial" for g in exp.schedule.groups.values()) != last_slice
    report = exp.cuda.check("sm_90a")
    assert report.spill_bytes == 0, report.summary()
    text = exp.cuda.text
    assert "ks_split" in text
    split = [g for g in exp.schedule.groups.values() if g.kind == "gemm" and g.plan.split_k > 1]
    tiles = sum(g.plan.tiles for g in split)
    if last_slice:  # one arrival counter per tile, in the sync words past the status words
        assert "split-K slices" not in text and text.count("tkx_atom_add_acq_rel((tkx_tiles + ") == len(split)
        assert "unsigned int* const tkx_tiles = sync + 12;" in text and exp.cuda.sync_words == 12 + tiles
        assert all(exp.cuda.notes[g.id].get("split_final") == "last-slice" for g in split)
    else:
        assert "split-K slices" in text and "tkx_tiles" not in text and exp.cuda.sync_words == 8


#: The last-slice split-K final (off by default: slower on the H200, see ``Options.split_k_final``).
LAST_SLICE = {"split_k_final": "last-slice"}


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
def test_last_slice_counters_follow_the_dataflow_counters():
    """With sync="counters" the tile counters sit past the dataflow counters (the ABI's words)."""
    ex = get("small")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name="small", arch="sm_90a", mode="grid", sync="counters",
                      **LAST_SLICE)
    src = exp.cuda
    assert src.sync == "counters"
    tiles = sum(g.plan.tiles for g in exp.schedule.groups.values() if g.kind == "gemm" and g.plan.split_k > 1)
    assert tiles and src.sync_words == 12 + len(src.dag.counters) + tiles
    assert f"unsigned int* const tkx_tiles = sync + {12 + len(src.dag.counters)};" in src.text


def test_last_slice_counters_left_set_are_caught():
    """A counter the previous launch left above 0 (no reset) finishes a tile too early: the interpreter
    refuses it, naming the group and the tile."""
    ex = get("small")
    program = tkx.capture(ex.step_fn, ex.example_inputs).lower()
    sched = schedule(program, Options(arch="sm_90a", split_k=2, **LAST_SLICE))
    plan = arena_mod.plan(sched)
    g = next(g for g in sched.groups.values() if g.kind == "gemm" and g.plan.split_k > 1)
    stale = {g.id: [1] + [0] * (g.plan.tiles - 1)}
    with pytest.raises(ScheduleError, match=f"group {g.id}: .*arrival counter"):
        run_schedule(sched, plan, ex.make_inputs(seed=1), splitk_counters=stale)


def test_last_slice_task_vm_two_launches():
    """The task VM (counters kernel semantics) over several grids and policies, two launches each
    sharing the tile counters: every result matches the reference and the counters end at 0."""
    from tkx.dataflow import build
    from tkx.dataflow.vm import run as vm_run
    ex = get("small")
    program = tkx.capture(ex.step_fn, ex.example_inputs).lower()
    sched = schedule(program, Options(arch="sm_90a", split_k=4, mode="grid", sync="counters", **LAST_SLICE))
    assert any(g.plan.get("split_final") == "last-slice" for g in sched.groups.values() if g.kind == "gemm")
    dag = build(sched, arena_mod.plan(sched))
    inputs = ex.make_inputs(seed=2)
    ref = tkx.reference.run(program, inputs)
    for blocks, policy, seed in ((1, "serial", 0), (3, "random", 1), (5, "lifo", 2)):
        r = vm_run(dag, inputs, blocks=blocks, policy=policy, seed=seed, launches=2, reference=ref, rtol=2e-2)
        r.raise_if_faulty()
        assert len(r.outputs) == 2 and r.splitk_counters
        assert all(c == 0 for tiles in r.splitk_counters.values() for c in tiles)


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


def test_tiny_gemms_take_wmma_on_hopper():
    """Below ``Options.wgmma_min_macs`` multiply-adds a GEMM takes wmma even on sm_90a (the wgmma tile's fixed
    cost per item exceeds its math: mixed_precision and llama_block were faster so on the H200); the plan's
    ``why`` says so; the threshold at 0 restores wgmma."""
    o = Options(arch="sm_90a")
    tiny = choose_gemm(GemmProblem(32, 256, 128, dtype="bfloat16"), o, "sm_90a")
    assert tiny.impl == "wmma_bf16" and "tiny GEMM" in tiny.why and "wgmma_min_macs" in tiny.why
    edge = o.wgmma_min_macs // (64 * 128)
    assert choose_gemm(GemmProblem(64, 128, edge, dtype="bfloat16"), o, "sm_90a").impl == "wgmma_bf16"
    assert choose_gemm(GemmProblem(64, 128, edge - 1, dtype="bfloat16"), o, "sm_90a").impl == "wmma_bf16"
    every = o.replace(wgmma_min_macs=0)
    assert choose_gemm(GemmProblem(32, 256, 128, dtype="bfloat16"), every, "sm_90a").impl == "wgmma_bf16"


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


def test_last_slice_final_in_the_tile_code():
    """emit_gemm with a SplitFinal: the slice store, the arrival on the tile's counter, and the final that
    adds the slices in slice order (its own from the shared C tile), batched or (ragged tiles) rolled."""
    from tkx.codegen import gemm as G

    def ld(b, r, c):
        return f"tkx_ld_bf16(A, {r} * 512 + {c})"

    def store(b, r, c, acc):
        return f"S[(long long)ks_split * 65536LL + (long long){r} * 256 + {c}] = {acc};"

    def final(b, r, c, acc):
        return f"const long long tkx_e = ((long long){r} * 256 + {c});\ntkx_st_f32(C, tkx_e, {acc});"
    for m, batched in ((256, True), (200, False)):
        p = G.GemmProblem(m, 256, 512, dtype="bfloat16")
        code = G.emit_gemm("wgmma_bf16", p, ld, ld, store, tile=(128, 128, 64), split=4,
                           ptr_a=lambda b, r, k: f"(A + {r} * 512 + {k})",
                           ptr_b=lambda b, k, c: f"(B + {k} * 256 + {c})",
                           split_final=G.SplitFinal("S", "(T + 3)", final))
        text = code.code
        assert code.params["split_final"] == "last-slice" and code.work_items == 4 * (-(-m // 128)) * 2
        assert "tkx_atom_add_acq_rel((T + 3) + tkx_tile, 1u)" in text and "arrived == 3u" in text
        assert "tkx_st_relaxed((T + 3) + tkx_tile, 0u)" in text
        order = [text.index(f"ks_split == {s} ?") for s in range(4)]
        assert order == sorted(order)  # slice order
        assert text.index("S[(long long)ks_split") < text.index("tkx_atom_add_acq_rel") < text.index("tkx_st_f32(C")
        assert ("elements per thread and pass, 4 slice loads each" in text) == batched
    with pytest.raises(ValueError, match="split > 1"):
        G.emit_gemm("wgmma_bf16", G.GemmProblem(256, 256, 512, dtype="bfloat16"), ld, ld, store, tile=(128, 128, 64),
                    split_final=G.SplitFinal("S", "T", final))


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
def test_epilogue_prefetch_compiles_without_spills():
    """``Options.epilogue_prefetch``: the SGD updates of medium's weight gradients prefetch the weights' tile
    rows into L2 (one request per 128-byte line); the kernel compiles for sm_90a without spills."""
    from tkx.codegen.kernel_gemm import _point_reads
    code = ("const float v = tkx_ld_bf16(in2, tkx_e) - tkx_ld_f32(reinterpret_cast<float*>(arena + 64), tkx_e) "
            "+ tkx_ld_bf16(in3, tkx_e + 1);")  # the last is not at the point
    assert _point_reads(code) == (("in2", 2), ("reinterpret_cast<float*>(arena + 64)", 4))
    ex = get("medium")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name="medium", arch="sm_90a", epilogue_prefetch=True)
    notes = exp.cuda.notes
    updates = [g.id for g in exp.schedule.groups.values() if g.kind == "gemm" and g.plan.tile_m == 128]
    assert updates and all(notes[g].get("epilogue_prefetch") == 1 for g in updates)
    assert exp.cuda.text.count('prefetch.global.L2 [%0];') >= len(updates)
    report = exp.cuda.check("sm_90a")
    assert report.spill_bytes == 0, report.summary()


def test_split_k_auto_rule_for_latency_bound_gemms():
    """``split_k="auto"``: no split below SPLIT_K_FIRST_STEPS K steps; else doubling while the slices fit
    the SMs and keep ``Options.split_k_min_steps`` steps each (small's GEMMs: 4 and 8 ways, 2 steps per slice)."""
    o = Options(arch="sm_90a")

    def plan(m, n, k, o=o):
        return choose_gemm(GemmProblem(m, n, k, dtype="bfloat16"), o, "sm_90a")
    cases = {(64, 1024, 512): 4, (64, 128, 1024): 8, (256, 1024, 4096): 4, (32, 32, 256): 1, (4096, 1024, 256): 1}
    for (m, n, k), want in cases.items():
        p = plan(m, n, k)
        assert p.split_k == want, (m, n, k, p.why)
        steps = -(-k // p.tile_k)
        if want > 1:
            assert p.tiles * want <= SM_COUNT and steps // want >= o.split_k_min_steps
            assert steps >= target.SPLIT_K_FIRST_STEPS and f"({steps // want} per slice)" in p.why
    # at least 4 steps per slice: half the splits
    four = o.replace(split_k_min_steps=4)
    assert plan(64, 1024, 512, four).split_k == 2 and plan(64, 128, 1024, four).split_k == 4


def test_small_with_the_auto_splits_matches_the_reference():
    ex = get("small")
    program = tkx.capture(ex.step_fn, ex.example_inputs).lower()
    sched = schedule(program, Options(arch="sm_90a"))
    splits = {(g.plan.m, g.plan.n, g.plan.k): g.plan.split_k for g in sched.groups.values()
              if g.kind == "gemm" and g.plan.impl != "gemv"}
    assert splits[64, 1024, 512] == 4 and splits[64, 128, 1024] == 8
    plan = arena_mod.plan(sched)
    assert check_hazards(sched, plan) == []
    inputs = ex.make_inputs(seed=4)
    want = tkx.reference.run(program, inputs)
    got = run_schedule(sched, plan, inputs, splitk_order="reverse")
    for a, b in zip(got.outputs, want.outputs):
        assert rel_err(a, b) <= TOL[str(b.dtype).removeprefix("torch.")]
    for k in want.updates:
        assert rel_err(got.updates[k], want.updates[k]) <= TOL[str(want.updates[k].dtype).removeprefix("torch.")]
