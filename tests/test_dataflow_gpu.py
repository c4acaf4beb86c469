"""On a GPU: every zoo example verified with sync="counters" and with barriers (grid mode), repeated
launches and CUDA-graph replays without a reset, and a recorded timeline."""

from __future__ import annotations

import pytest
import torch

import tkx
import tkx.runtime
from tkx.examples import get, names
from tkx.options import Options

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEV = "cuda"


@pytest.mark.parametrize("sync", ["counters", "barrier"])
@pytest.mark.parametrize("name", names())
def test_verify_with_counters_and_barriers(name, sync):
    ex = get(name)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV), Options(mode="grid", sync=sync), name=name,
                               loss=ex.loss_output)
    assert runner.source.sync == sync
    for _ in range(2):  # repeated launches: the epoch advances, no reset
        runner.verify(seeds=(0, 1), strict=True)  # raises VerificationError on a mismatch
    runner.check_status()


@pytest.mark.parametrize("name", ["tiny_online", "digits_mlp"])
def test_counters_graph_replays_and_timeline(name):
    ex = get(name)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV), Options(mode="grid", sync="counters",
                                                                           timeline=True), name=name,
                               loss=ex.loss_output)
    args = ex.make_inputs(1, DEV)
    graph = runner.capture_graph(*args)
    for _ in range(20):
        graph.replay()
    graph.check_status()
    runner(*ex.make_inputs(2, DEV))
    tl = runner.timeline()
    assert len(tl.spans) == runner.source.dag.num_tasks
    assert all(s.end >= s.start >= 0 for s in tl.spans)
    assert tl.svg().startswith("<svg")
