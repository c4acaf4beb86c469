"""The predicted timeline: the cost model times the kernel's tasks without a GPU; measured and predicted
timelines share one class and one renderer; on a GPU the two side by side (gpu-marked tests)."""

from __future__ import annotations

import re

import pytest
import torch

import tkx
from tkx import costs
from tkx.dataflow import build
from tkx.dataflow.cost import barrier_us, span_us, task_us
from tkx.dataflow.timeline import Span, Timeline, TimelineComparison, predicted_timeline
from tkx.dataflow.vm import critical_path, run_timed
from tkx.examples import get


def explored(name, **kw):
    ex = get(name)
    return tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output, **kw)


@pytest.fixture(scope="module")
def digits():
    return explored("digits_mlp", mode="grid")


def test_prediction_places_every_task_by_the_cost_model(digits):
    tl = digits.timeline
    cuda = digits.cuda
    dag = build(cuda.schedule, cuda.arena, work_items=cuda.work_items)
    assert isinstance(tl, Timeline) and (tl.kind, tl.unit) == ("predicted", "ns")
    assert sorted(s.task for s in tl.spans) == list(range(dag.num_tasks))
    c = costs.constants()
    for s in tl.spans:  # every bar lasts what the cost model gives its group
        assert s.end - s.start == pytest.approx(span_us(dag, s.group, cuda.blocks, cuda.sync, c) * 1e3)
        assert s.end - s.start >= task_us(dag, s.group, c) * 1e3 - 1e-9
    # barriers: no task of a stage starts before every task of the earlier stages has ended plus a barrier
    bar = barrier_us(cuda.blocks, "grid", c) * 1e3
    end_of_stage: dict[int, float] = {}
    for s in tl.spans:
        st = dag.stage_of[s.group]
        end_of_stage[st] = max(end_of_stage.get(st, 0.0), s.end)
    for s in tl.spans:
        st = dag.stage_of[s.group]
        if st > 0:
            assert s.start >= max(end_of_stage[k] for k in range(st)) + bar - 1e-6
    # one block runs one task at a time
    for b in range(tl.blocks):
        mine = sorted((s for s in tl.spans if s.block == b), key=lambda s: s.start)
        assert all(x.end <= y.start + 1e-9 for x, y in zip(mine, mine[1:]))
    # the critical path runs from a first task to the one that ends last, each link ending where the next starts
    path = {s.task: s for s in tl.spans}
    chain = [path[t] for t in tl.critical]
    assert chain[-1].end == tl.makespan and chain[0].start == 0.0
    assert all(y.start == pytest.approx(x.end) or y.start > x.end for x, y in zip(chain, chain[1:]))


def test_counters_wait_for_their_groups_only():
    exp = explored("digits_mlp", mode="grid", sync="counters")
    tl = exp.timeline
    dag = exp.cuda.dag
    assert exp.cuda.sync == "counters" and "counters" in tl.note
    c = costs.constants()
    end = {}
    for s in sorted(tl.spans, key=lambda s: s.task):
        end[s.group] = max(end.get(s.group, 0.0), s.end)
    for s in tl.spans:
        for w in dag.waits[s.group]:
            assert s.start >= end[dag.counters[w.counter].group] + c["handoff_us"] * 1e3 - 1e-6
    barrier = predicted_timeline(exp.cuda, sync="barrier")
    assert barrier.makespan != tl.makespan


def test_timed_run_and_critical_path_on_a_hand_made_dag():
    dag = build(explored("tiny_online", mode="grid").schedule, explored("tiny_online", mode="grid").arena)
    tasks = run_timed(dag, blocks=2, task_us={g: 1.0 for g in dag.order}, sync="barrier", barrier_us=0.5)
    assert [t.task for t in tasks] == list(range(dag.num_tasks))
    stages = sorted(set(dag.stage_of.values()))
    per_stage = [max(1, -(-sum(dag.items[g] for g in dag.order if dag.stage_of[g] == s) // 2)) for s in stages]
    assert max(t.end for t in tasks) == pytest.approx(sum(per_stage) + 0.5 * (len(stages) - 1))
    path = critical_path(tasks)
    assert path[-1] == max(tasks, key=lambda t: (t.end, -t.task)).task
    with pytest.raises(tkx.TkxError, match="unknown sync"):
        run_timed(dag, blocks=2, task_us={g: 1.0 for g in dag.order}, sync="spin")


def test_prediction_of_the_largest_kernel_is_aggregated_not_dropped():
    exp = explored("gpt_block")
    tl = exp.timeline
    from tkx.render.timeline import MAX_ROWS, aggregated, timeline_svg
    assert tl.blocks > MAX_ROWS and aggregated(tl)
    svg = timeline_svg(tl)
    counts = {g: int(n) for g, n in re.findall(r">([\w]+) ×(\d+)</text>", svg)}
    assert sum(counts.values()) == len(tl.spans)  # every task counted in its group's row
    assert counts == {g: t.tasks for g, t in tl.groups().items()}


def test_tens_of_thousands_of_tasks_are_drawn_per_group():
    spans = tuple(Span(k % 132, k, f"g{k // 10000}", k, float(k), float(k) + 50.0, 0.0) for k in range(30000))
    tl = Timeline("big", spans, "ns", kind="predicted", critical=(29999,))
    html = tl._repr_mimebundle_()["text/html"]
    assert html.count("<rect") < 50 and ">g2 ×10000</text>" in html and "predicted" in html


def test_a_tall_chart_has_its_time_axis_above_the_rows_too():
    from tkx.render.timeline import TOP_AXIS_ROWS, timeline_svg

    def chart(groups: int) -> str:
        spans = tuple(Span(k % 100, k, f"g{k % groups}", k, float(k), float(k) + 50.0, 0.0) for k in range(5000))
        return timeline_svg(Timeline("tall", spans, "ns", kind="predicted"))

    tall, short = chart(TOP_AXIS_ROWS + 10), chart(5)
    label = sorted(int(y) for y in re.findall(r'<text x="70.00" y="(\d+)" text-anchor="middle">0 µs</text>', tall))
    assert len(label) == 2 and label[0] < 40 < label[1]  # above the first row and below the last
    assert len(re.findall(r'text-anchor="middle">0 µs</text>', short)) == 1


def test_measured_and_predicted_share_one_renderer(digits):
    predicted = digits.timeline
    rows = [((s.block << 32) | s.task, int(s.start) + 100, int(s.end) + 100, int(s.wait)) for s in predicted.spans]
    dag = build(digits.cuda.schedule, digits.cuda.arena, work_items=digits.cuda.work_items)
    measured = Timeline.from_records(dag, rows)
    assert measured.kind == "measured" and type(measured) is type(predicted)
    for tl, word in ((predicted, "predicted"), (measured, "measured")):
        svg = tl.svg()
        assert f'data-tkx-timeline="{word}"' in svg and f"{word} - " in svg
        assert svg.count("<title>") == len(tl.spans)
    assert Timeline.from_json(predicted.to_json()) == predicted


def test_comparison_gives_the_error_of_every_group(digits):
    predicted = digits.timeline
    # a measurement twice as slow as predicted: every group's error is -50%
    spans = tuple(Span(s.block, s.task, s.group, s.item, 2 * s.start, 2 * s.end, 2 * s.wait) for s in predicted.spans)
    measured = Timeline(predicted.name, spans, "ns", kind="measured")
    cmp = predicted.compare(measured)
    assert isinstance(cmp, TimelineComparison)
    rows = cmp.rows()
    assert {g for g, *_ in rows} == set(predicted.groups())
    assert all(err == pytest.approx(-0.5) for g, p, m, err in rows if m)
    assert cmp.makespan_error == pytest.approx(-0.5)
    html = cmp._repr_mimebundle_()["text/html"]
    assert html.count("<svg") == 2 and "-50%" in html and "predicted µs" in html
    with pytest.raises(ValueError, match="events"):
        predicted.compare(Timeline("x", (), "events", kind="events"))


def test_explorer_timeline_tab_works_on_the_cpu(digits):
    from tkx.explorer import Explorer

    e = Explorer(digits, debounce_s=0)
    e.select_tab("timeline")
    html = "".join(o["data"].get("text/html", "") for o in e.outputs["timeline"].outputs)
    assert "not available" not in html and "predicted" in html and "<svg" in html
    e.controls["tile_n"].value = 32
    assert "reused" not in e.status.value or "timeline" not in e.status.value.split("reused")[1]
    e.select_tab("timeline")
    html = "".join(o["data"].get("text/html", "") for o in e.outputs["timeline"].outputs)
    assert "predicted" in html and e.exploration.timeline.kind == "predicted"


# -- on the GPU: prediction beside measurement ------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name,kw", [("digits_mlp", dict(mode="grid")),
                                     ("digits_mlp", dict(mode="grid", sync="counters")), ("gpt_block", {})])
def test_prediction_beside_the_measurement_on_the_gpu(name, kw):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ex = get(name)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), tkx.Options(timeline=True, **kw), name=name,
                               loss=ex.loss_output)
    args = ex.make_inputs(1, "cuda")
    for _ in range(3):
        runner(*args)
    measured = runner.timeline()
    cmp = runner.timeline_vs_predicted()
    predicted = cmp.predicted
    assert predicted.kind == "predicted" and cmp.measured.kind == "measured"
    assert sorted(s.task for s in predicted.spans) == sorted(s.task for s in measured.spans)
    # the same grid-stride deal: every task on the block that ran it
    assert {s.task: s.block for s in predicted.spans} == {s.task: s.block for s in measured.spans}
    rows = cmp.rows()
    assert {g for g, *_ in rows} == set(runner.source.dag.order)
    # %globaltimer ticks coarsely: a short group may measure 0 ns (then it has no error figure)
    assert all(p is not None and m is not None and p > 0 and m >= 0 for _, p, m, _ in rows)
    assert all((err is None) == (m == 0) for _, _, m, err in rows)
    html = cmp._repr_mimebundle_()["text/html"]
    assert 'data-tkx-timeline="predicted"' in html and 'data-tkx-timeline="measured"' in html
    print(f"\n{name} {kw}: {cmp!r}")
    for g, p, m, err in rows:
        print(f"  {g:>6} predicted {p:8.2f} µs  measured {m:8.2f} µs  error "
              + (f"{100 * err:+6.0f}%" if err is not None else "-"))
