"""The per-stage and per-item latency switches.

* the grid barrier (``Options.grid_barrier``, :mod:`tkx.codegen.cuda_prelude`): ``"counter"`` (a monotonic 64-bit
  arrival count, red.release arrivals, acquire polls), ``"generation"`` (the previous one) and
  ``"auto"`` (counter up to :data:`~tkx.codegen.cuda_prelude.COUNTER_BARRIER_MAX_BLOCKS` blocks) in the
  generated kernels; on a GPU: many launches and CUDA-graph replays of ``small`` leave the arrival
  count at exactly launches x barriers x grid and verify, and a block that never arrives is reported
  as a barrier timeout naming the stage, after which the words are clean again;
* the tensor maps prefetched at kernel entry (``Options.tensormap_prefetch``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tkx
from tkx.codegen import cuda_prelude as P
from tkx.codegen import gemm as G
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get
from tkx.options import Options

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC not available")


def kernel_text(name: str, **options) -> tuple[str, object]:
    ex = get(name)
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0, "cpu"), options=Options(arch="sm_90a", **options),
                      loss=ex.loss_output)
    return exp.cuda.text, exp


def kernel_body(text: str) -> str:
    return text.split("===== end of tkx prelude =====")[1]


@pytest.mark.parametrize("kind", P.GRID_BARRIERS)
def test_grid_barrier_kind_in_generated_kernel(kind):
    text, exp = kernel_text("small", grid_barrier=kind)
    body = kernel_body(text)
    barriers = exp.schedule.num_barriers
    assert barriers >= 3
    if kind == "counter":
        assert body.count("tkx_grid_barrier(sync, tkx_gen += gridDim.x, status, ") == barriers
        assert "unsigned long long tkx_gen = tkx_arrivals_base(sync);" in body
        assert "tkx_grid_barrier_generation(" not in body and "tkx_barrier_init" not in body
    else:
        assert body.count("tkx_grid_barrier_generation(sync, tkx_gen++, status, ") == barriers
        assert "unsigned int tkx_gen = tkx_barrier_init(sync);" in body
        assert "tkx_grid_barrier(sync" not in body
    # each barrier still names the stage it precedes (the error channel)
    for stage in range(1, barriers + 1):
        assert f"status, {stage}, " in body


@pytest.mark.parametrize("per_sm, kind", [(1, "counter"), (8, "generation")])
def test_auto_grid_barrier_follows_the_grid(per_sm, kind):
    text, exp = kernel_text("medium", blocks_per_sm=per_sm, mode="grid")
    assert exp.schedule.num_barriers >= 1
    assert (exp.schedule.blocks <= P.COUNTER_BARRIER_MAX_BLOCKS) == (kind == "counter")
    assert f"// Grid barrier: {kind} (grid_barrier = 'auto', grid of at most " in text
    body = kernel_body(text)
    assert ("tkx_grid_barrier(sync" in body) == (kind == "counter")
    assert ("tkx_grid_barrier_generation(sync, tkx_gen++" in body) == (kind == "generation")


def test_counters_mode_has_no_grid_barrier_of_either_kind():
    text, exp = kernel_text("online", sync="counters")
    assert exp.cuda.sync == "counters"
    body = kernel_body(text)
    assert "tkx_grid_barrier" not in body and "tkx_arrivals_base" not in body
    assert "tkx_counters_init(sync)" in body


@pytest.mark.parametrize("on", [True, False])
def test_tensor_maps_prefetched_at_kernel_entry(on):
    text, exp = kernel_text("small", tensormap_prefetch=on)
    maps = len(exp.cuda.launch.tensor_maps)
    assert maps >= 2
    body = kernel_body(text)
    entry = body[:body.index("// ==== stage 0")]
    line = f"for (int m = threadIdx.x; m < {maps} && threadIdx.x < 32; m += 32)"
    assert (line in entry) == on
    if on:
        assert 'asm volatile("prefetch.tensormap [%0];\\n" :: "l"(tmaps + 128 * m) : "memory");' in entry
    # the per-item prefetch before each item's first copy stays either way
    assert body.count('"prefetch.tensormap [%0];\\n" :: "l"(tma_a)') >= 1


def test_no_tensor_map_prefetch_without_maps():
    text, exp = kernel_text("small", gemm_copy="cp.async")
    assert not exp.cuda.launch.tensor_maps and "prefetch.tensormap" not in kernel_body(text)
    assert G.tensormap_prefetch(0, on=True) == "" and G.tensormap_prefetch(3, on=False) == ""


@needs_nvrtc
@pytest.mark.parametrize("kind", P.GRID_BARRIERS)
def test_both_barriers_compile_for_sm_90a_without_spills(kind):
    _, exp = kernel_text("medium", grid_barrier=kind)
    report = exp.cuda.check("sm_90a")
    assert report.spill_bytes == 0


# --------------------------------------------------------------------------------------
# on a GPU
# --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", P.GRID_BARRIERS)
@pytest.mark.parametrize("name", ["small", "medium"])
def test_step_barrier_over_many_launches_and_replays(name, kind):
    ex = get(name)
    inputs = ex.make_inputs(0, "cuda")
    runner = tkx.runtime.build(ex.step_fn, inputs, Options(grid_barrier=kind), name=name, loss=ex.loss_output)
    assert runner.source.sync == "barrier" and runner.kernel.mode == "grid"
    barriers, grid = runner.source.schedule.num_barriers, runner.kernel.grid
    assert barriers >= 3
    ver = runner.verify(seeds=(0,), make_inputs=ex.make_inputs)
    assert ver.passed, ver.summary()
    before = runner._words[:2].clone()
    for _ in range(50):
        runner(*ex.make_inputs(1, "cuda"), check=False)
    runner.check_status()
    graph = runner.capture_graph(*ex.make_inputs(2, "cuda"), warmup=3)
    for _ in range(200):
        graph.replay()
    graph.check_status()
    if kind == "counter":
        def count(words):
            return int(words[:2].view(torch.int64).item())
        assert count(runner._words) - count(before) == 50 * barriers * grid
        assert count(graph._words) == (3 + 200) * barriers * grid  # the warm-up launches and the replays
    else:
        assert runner._words[0].item() == 0 and graph._words[0].item() == 0  # re-armed
    # the runner (and its words) still verify after all those launches
    ver = runner.verify(seeds=(3,), make_inputs=ex.make_inputs)
    assert ver.passed, ver.summary()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", P.GRID_BARRIERS)
def test_block_that_never_arrives_reports_the_stage(kind):
    ex = get("small")
    source = tkx.runtime.lower(ex.step_fn, ex.make_inputs(0), Options(spin_limit=200_000, grid_barrier=kind),
                               name="small")
    setup = P.barrier_setup("grid", choice=kind)
    assert setup in source.text
    text = source.text.replace(setup, setup + "\n    if (blockIdx.x == 1) return;  // test: never arrives", 1)
    runner = tkx.runtime.CompiledRunner(dataclasses.replace(source, text=text))
    with pytest.raises(tkx.runtime.KernelError) as info:
        runner(*ex.make_inputs(0, "cuda"))
    err = info.value
    assert err.code == 1 and err.stage == 1 and "barrier before stage 1" in str(err)
    assert int(runner._words.abs().sum()) == 0  # cleared for the next launch
    # a good kernel on fresh words after the failure
    good = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), Options(), name="small", loss=ex.loss_output)
    good(*ex.make_inputs(0, "cuda"))
    good.check_status()
