"""Where the time of a step goes: the critical path of a timeline split into GEMM groups, other groups,
barriers / waits, idle time and the step outside its tasks (tkx.dataflow.breakdown)."""

from __future__ import annotations

import pytest

from tkx import examples
from tkx.dataflow.breakdown import breakdown, critical_spans, what_would_close
from tkx.dataflow.timeline import Span, Timeline, predicted_timeline

# two stages with a barrier: g0 (GEMM) on blocks 0 and 1, g1 (pointwise) after it, two items on block 0
GROUPS = {"g0": ("gemm", 0), "g1": ("pointwise", 1)}
SPANS = (Span(0, 0, "g0", 0, 0.0, 3000.0, 0.0), Span(1, 1, "g0", 1, 0.0, 5000.0, 0.0),
         Span(0, 2, "g1", 0, 6000.0, 7000.0, 0.0), Span(0, 3, "g1", 1, 7200.0, 8000.0, 0.0))


def test_a_barrier_gap_is_sync_and_a_gap_inside_a_stage_is_idle():
    tl = Timeline("t", SPANS)
    path = critical_spans(tl, GROUPS)
    assert [(s.task, released) for s, released in path] == [(1, True), (2, True), (3, False)]
    b = breakdown(tl, step_us=10.0, groups=GROUPS)
    assert b["gemm_us"] == pytest.approx(5.0) and b["other_us"] == pytest.approx(1.8)
    assert b["sync_us"] == pytest.approx(1.0) and b["idle_us"] == pytest.approx(0.2)
    assert b["critical_path_us"] == pytest.approx(8.0) and b["outside_us"] == pytest.approx(2.0)
    assert b["fractions"]["gemm_us"] == pytest.approx(0.5)
    assert what_would_close(b).startswith("GEMM-bound: GEMM groups are 50% of the step")
    assert what_would_close(dict(b, fractions={"gemm_us": 0.39, "sync_us": 0.34, "outside_us": 0.27})).endswith(
        "; next, grid barriers / counter waits (34%)")
    assert what_would_close({"fractions": {}}) == ""


def test_a_counter_wait_counts_as_sync_up_to_the_time_waited():
    spans = (Span(0, 0, "g0", 0, 0.0, 2000.0, 0.0), Span(1, 1, "g1", 0, 2500.0, 3000.0, 300.0))
    b = breakdown(Timeline("t", spans), groups={"g0": ("gemm", 0), "g1": ("reduction", 0)})
    assert b["sync_us"] == pytest.approx(0.3) and b["idle_us"] == pytest.approx(0.2)
    assert b["other_us"] == pytest.approx(0.5) and b["outside_us"] == 0.0


def test_the_parts_of_a_predicted_timeline_add_up_to_its_makespan():
    ex = examples.get("digits_mlp")
    import tkx

    exp = tkx.explore(ex.step_fn, ex.example_inputs, arch="sm_90a")
    tl = predicted_timeline(exp.cuda)
    b = breakdown(tl)
    assert sum(b[k] for k in ("gemm_us", "other_us", "sync_us", "idle_us")) == pytest.approx(tl.makespan / 1e3,
                                                                                          abs=0.01)
    assert b["gemm_us"] > 0 and b["sync_us"] > 0 and b["tasks"] >= len(exp.schedule.stages)


def test_errors():
    with pytest.raises(ValueError, match="in ns"):
        breakdown(Timeline("t", SPANS, unit="events"), groups=GROUPS)
    with pytest.raises(ValueError, match="DAG"):
        breakdown(Timeline("t", SPANS))
    assert breakdown(Timeline("t", ()), groups={})["critical_path_us"] == 0.0
