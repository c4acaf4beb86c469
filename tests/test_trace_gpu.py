"""On a GPU: the kernel's recorded timeline merged into a torch.profiler trace (CUPTI's kernel slice found by
name, the tasks under it), and the runner's NVTX / profiler ranges around launches and graph replays."""

from __future__ import annotations

import pytest
import torch

import tkx
import tkx.runtime
from tkx.dataflow.trace import check_trace, merge_profiler_trace, read_trace
from tkx.examples import get
from tkx.options import Options
from tkx.runtime import ranges

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEV = "cuda"


@pytest.fixture(scope="module")
def built():
    ex = get("digits_mlp")
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV), Options(mode="grid", sync="counters",
                                                                           timeline=True), name="digits_mlp",
                               loss=ex.loss_output)
    return runner, ex.make_inputs(1, DEV)


def test_profiler_trace_merges_with_the_kernel_timeline(built, tmp_path):
    from torch.profiler import ProfilerActivity, profile

    runner, args = built
    runner(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner(*args)
        torch.cuda.synchronize()
    tl = runner.timeline()
    assert tl.kernel == runner.source.kernel_name and tl.origin > 0
    path = tmp_path / "profile.json"
    prof.export_chrome_trace(str(path))
    names = {e.get("name") for e in read_trace(path)["traceEvents"]}
    assert runner.range_name("launch") in names  # the record_function range around the launch
    merged = merge_profiler_trace(path, tl, tmp_path / "merged.json.gz")
    info = merged["otherData"]["tkx_alignment"]
    ours = [e for e in merged["traceEvents"] if e.get("pid") == info["pid"] or e.get("cat") == "tkx"]
    assert check_trace(ours) == []  # what tkx added (the profiler's own events are torch's business)
    assert (info["kernel"], info["launches"], info["align"]) == (runner.source.kernel_name, 1, "start")
    assert "profiler_minus_globaltimer_ns" in info
    tasks = [e for e in merged["traceEvents"] if e.get("cat") == "task"]
    assert len(tasks) == runner.source.dag.num_tasks
    assert check_trace(tl.chrome_trace()) == []


def test_nvtx_and_profiler_ranges_around_launches_and_replays(built):
    from torch.profiler import ProfilerActivity, profile

    runner, args = built
    was = ranges.set_nvtx(True)  # as under Nsight Systems: torch.cuda.nvtx push/pop around each launch
    try:
        runner(*args)
        graph = runner.capture_graph(*args)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        graph.check_status()
    finally:
        ranges.set_nvtx(was)
    assert runner.range_name("graph replay") in {e.name for e in prof.events()}
    name = runner.range_name("launch")
    assert name.startswith("tkx digits_mlp launch [") and "sync=counters" in name and "timeline=True" in name
