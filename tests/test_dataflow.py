"""Dataflow sync on CPU: the task DAG, the static checker and the task VM on the zoo and random
programs, planted faults caught by both, counters codegen compiled by NVRTC, the timeline."""

from __future__ import annotations

import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from programs import programs

import tkx
from tkx import arena as arena_mod
from tkx import dataflow
from tkx.dataflow import vm
from tkx.dataflow.dag import Wait
from tkx.dataflow.timeline import Timeline
from tkx.examples import get, names
from tkx.options import Options, OptionsError
from tkx.schedule import schedule

_CACHE: dict = {}


def explored(name: str, **opts):
    key = (name, tuple(sorted(opts.items())))
    if key not in _CACHE:
        ex = get(name)
        _CACHE[key] = tkx.explore(ex.step_fn, ex.example_inputs, name=name, mode="grid", **opts)
    return _CACHE[key]


def dag_of(name: str):
    e = explored(name)
    return dataflow.build(e.schedule, e.arena)


@pytest.mark.parametrize("name", names())
def test_zoo_dag_is_sound_and_vm_finds_no_fault(name):
    dag = dag_of(name)
    assert dataflow.check(dag) == []
    assert dag.num_tasks == sum(dag.items.values()) and len(dag.counters) == len(dag.order)
    for c in dag.counters:
        assert c.threshold == dag.items[c.group]
    for lists in (dag.task_lists(1), dag.task_lists(3), dag.task_lists(dag.num_tasks + 2)):
        assert sorted(t.index for lst in lists for t in lst) == list(range(dag.num_tasks))
        for lst in lists:  # every block's list follows the global order
            assert [t.index for t in lst] == sorted(t.index for t in lst)
    inputs = get(name).make_inputs(seed=3)
    # ordering (exact, every task) under many interleavings and grid sizes, two launches each (epochs)
    big = dag.num_tasks > 300
    runs = vm.explore(dag, inputs, blocks=(3, 16) if big else (1, 2, 5, 16), seeds=1 if big else 2, values=False,
                      policies=("random", "lifo", "stall") if big else vm.POLICIES)
    assert runs and all(r.ok for r in runs), [str(f) for r in runs for f in r.faults][:5]
    assert all(len(r.records) == 2 * dag.num_tasks for r in runs)
    # values against the reference interpreter, poisoned arena, one interleaving
    if not big:
        r = vm.run(dag, inputs, blocks=3, policy="eager", seed=1, launches=1)
        assert r.ok, [str(f) for f in r.faults]


def test_epochs_wrap_around_32_bits():
    dag = dag_of("tiny_online")
    n = max(c.threshold for c in dag.counters)
    r = vm.run(dag, get("tiny_online").make_inputs(seed=0), blocks=4, epoch=(2**32 // n) - 1, launches=3,
               values=False)
    assert r.ok, [str(f) for f in r.faults]
    assert r.epoch == (2**32 // n) + 2


def _victim(dag, min_tiles: int = 2):
    """A group with a wait on a producer of at least ``min_tiles`` tiles."""
    for g in dag.order:
        for k, w in enumerate(dag.waits[g]):
            if w.threshold >= min_tiles:
                return g, k, w
    raise AssertionError("no wait on a multi-tile producer")


def _caught_by_vm(dag, name: str, kinds: set[str], values: bool = False) -> bool:
    inputs = get(name).make_inputs(seed=0)
    runs = vm.explore(dag, inputs, blocks=(2, 4, 16), seeds=4, launches=1, values=values)
    return any(r.kinds() & kinds for r in runs)


def test_planted_missing_dependency_is_caught():
    dag = dag_of("tiny_online")
    g, k, _ = _victim(dag)
    broken = dag.with_waits({**dag.waits, g: dag.waits[g][:k] + dag.waits[g][k + 1:]})
    assert any(p.startswith("unordered") and g in p for p in dataflow.check(broken))
    assert _caught_by_vm(broken, "tiny_online", {"unwritten-read", "reused-read", "premature-overwrite"})
    assert _caught_by_vm(broken, "tiny_online", {"mismatch", "unwritten-read"}, values=True)


def test_planted_wrong_threshold_is_caught():
    dag = dag_of("tiny_online")
    g, k, w = _victim(dag)
    low = dag.with_waits({**dag.waits, g: tuple(Wait(x.counter, x.threshold - 1) if j == k else x
                                                for j, x in enumerate(dag.waits[g]))})
    assert any("partial wait" in p for p in dataflow.check(low))
    assert _caught_by_vm(low, "tiny_online", {"unwritten-read"})
    high = dag.with_waits({**dag.waits, g: tuple(Wait(x.counter, x.threshold + 1) if j == k else x
                                                 for j, x in enumerate(dag.waits[g]))})
    assert any(p.startswith("deadlock") for p in dataflow.check(high))
    r = vm.run(high, get("tiny_online").make_inputs(seed=0), blocks=3, values=False)
    assert "deadlock" in r.kinds()
    msg = next(f.message for f in r.faults if f.kind == "deadlock")
    assert re.search(r"counter c\d+ of g\d+ stands at \d+, threshold \d+", msg)


def _reuse_fault(name: str):
    """(sound DAG, a plan that reuses a slot the DAG does not know of, the DAG claiming that plan):
    a later value moved onto the bytes of an earlier one whose lifetime has ended (a legal plan),
    while the DAG keeps the waits computed from the original plan (no write-after-read order)."""
    e = explored(name)
    plan, sched = e.arena, e.schedule
    dag = dataflow.build(sched, plan)
    slots = sorted(plan.slots.values(), key=lambda s: (s.first, s.offset))
    for a in slots:
        for b in slots:
            if b.first <= a.last or b.offset == a.offset:
                continue
            moved = dict(plan.slots)
            moved[b.buffer] = type(b)(b.buffer, a.offset, b.nbytes, b.first, b.last, b.kind, b.dtype)
            bad = type(plan)(sched, moved, max(plan.size_bytes, a.offset + b.nbytes + arena_mod.ALIGN),
                             plan.lower_bound_bytes, plan.no_reuse_bytes, plan.in_place, plan.staged)
            if arena_mod.check(bad):
                continue
            broken = dag.with_arena(bad)
            if dataflow.check(broken):
                return dag, bad, broken
    raise AssertionError(f"{name}: no slot reuse left unordered by the original waits")


@pytest.mark.parametrize("name", ["poly_clip_adamw"])  # its plan leaves room to move a slot legally
def test_planted_reused_slot_is_caught(name):
    dag, bad, broken = _reuse_fault(name)
    problems = dataflow.check(broken)
    assert problems and all(p.startswith("unordered WAR") or p.startswith("unordered WAW") for p in problems)
    assert _caught_by_vm(broken, name, {"reused-read", "premature-overwrite"})
    # a DAG built from that plan orders the reuse (a write-after-read wait): sound again
    assert dataflow.check(dataflow.build(dag.schedule, bad)) == []
    assert all(r.ok for r in vm.explore(dataflow.build(dag.schedule, bad), get(name).make_inputs(seed=0),
                                        blocks=(2, 4), seeds=2, launches=1, values=False))


OPTION_SETS = {
    "grid": Options(mode="grid"),
    "no-fusion": Options(mode="grid", fuse_pointwise=False, fuse_epilogues=False, fuse_reductions=False),
    "small-tiles": Options(mode="grid", tile_m=16, tile_n=16, tile_k=8, threads_per_block=128),
}


@settings(max_examples=int(os.environ.get("TKX_HYPOTHESIS_EXAMPLES", 40)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), opt=st.sampled_from(list(OPTION_SETS)), seed=st.integers(0, 2**16),
       blocks=st.integers(1, 9), policy=st.sampled_from(vm.POLICIES))
def test_random_programs_in_the_vm(program, opt, seed, blocks, policy):
    sched = schedule(program, OPTION_SETS[opt])
    plan = arena_mod.plan(sched)
    dag = dataflow.build(sched, plan)
    assert dataflow.check(dag) == []
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(i.value.shape, generator=g) for i in program.inputs]
    r = vm.run(dag, inputs, blocks=blocks, policy=policy, seed=seed, launches=2)
    assert r.ok, [str(f) for f in r.faults]


def test_sync_options_are_validated():
    assert Options(sync="counters").sync == "counters"
    with pytest.raises(OptionsError, match="sync"):
        Options(sync="fences")
    with pytest.raises(OptionsError, match="mode='block'"):
        Options(sync="counters", mode="block")
    info = {n: (a, h) for n, _, a, h in Options.fields_info()}
    assert info["sync"][0] == ("barrier", "counters", "auto") and info["sync"][1]
    assert info["timeline"][0] == (True, False)


def test_barrier_path_unchanged_and_counters_have_no_grid_barrier():
    plain = explored("digits_mlp")
    assert "tkx_wait" not in plain.cuda.text and plain.cuda.sync == "barrier"
    counters = explored("digits_mlp", sync="counters")
    text = counters.cuda.text
    assert counters.cuda.sync == "counters"
    assert "tkx_grid_barrier(sync" not in text.split("===== end of tkx prelude =====")[1]
    dag = counters.cuda.dag
    assert text.count("tkx_task_done(sync,") == len(dag.order)
    assert text.count("if (!tkx_wait(") == sum(len(w) for w in dag.waits.values())
    assert counters.cuda.sync_words == 12 + len(dag.counters)
    assert "tkx_counters_exit(sync);" in text
    # the auto choice records its estimate
    auto = explored("digits_mlp", sync="auto").cuda
    assert auto.sync in ("barrier", "counters") and "µs" in auto.sync_reason


def test_wait_timeout_error_names_task_counter_value_and_threshold():
    from tkx.runtime.status import wait_error

    sched = explored("tiny_online").schedule
    order = [g for s in sched.stages for g in s]
    err = wait_error(5, 2, (3 << 16) | 1, 7, 16, sched)
    text = str(err)
    assert f"task {order[3]} item 5 (block 2)" in text and f"counter c1 of {order[1]}" in text
    assert "stood at 7 of threshold 16" in text and err.code == 4


def test_timeline_from_the_vm_renders():
    dag = dag_of("digits_mlp")
    r = vm.run(dag, get("digits_mlp").make_inputs(seed=0), blocks=4, policy="random", seed=2, values=False)
    tl = Timeline.from_vm(r)
    assert len(tl.spans) == dag.num_tasks and tl.blocks == 4 and 0 < tl.busy() <= 1
    svg = tl.svg()
    assert svg.startswith("<svg") and svg.count("<title>") == dag.num_tasks
    for g in dag.order:
        assert f">{g}</text>" in svg
    html = tl._repr_mimebundle_()["text/html"]
    assert "<svg" in html and html.count("<title>") == dag.num_tasks  # inline: hovering a bar names its task
    assert "http" not in html  # no namespace URL: a report page stays self-contained
    assert Timeline.from_json(tl.to_json()) == tl
    rows = [((s.block << 32) | s.task, int(s.start) + 10, int(s.end) + 10, int(s.wait)) for s in tl.spans]
    back = Timeline.from_records(dag, rows)
    assert {(s.block, s.task, s.group) for s in back.spans} == {(s.block, s.task, s.group) for s in tl.spans}


def test_cost_constants_from_json(tmp_path, monkeypatch):
    from tkx import costs

    path = tmp_path / "costs.json"
    path.write_text('{"device": "test", "constants": {"grid_barrier_us": 9.5, "handoff_us": 0.25}}')
    monkeypatch.setenv("TKX_COSTS", str(path))
    c = costs.constants()
    assert c["grid_barrier_us"] == 9.5 and c["handoff_us"] == 0.25
    assert c["block_barrier_us"] == costs.DEFAULTS["block_barrier_us"]
    path2 = tmp_path / "bad.json"
    path2.write_text("{not json")
    monkeypatch.setenv("TKX_COSTS", str(path2))
    with pytest.raises(ValueError, match="calibrate"):
        costs.constants()


def test_timeline_is_a_stage_with_a_report_section():
    from tkx.render.report import report_html

    ex = get("tiny_online")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, mode="grid")
    tl = exp.timeline
    assert (tl.unit, tl.kind) == ("ns", "predicted")
    assert len(tl.spans) == dataflow.build(exp.schedule, exp.arena, work_items=exp.cuda.work_items).num_tasks
    html = report_html(exp, gpu=False)
    sec = html.split('id="tkx-sec-timeline"', 1)[1].split("</section>", 1)[0]
    assert "<svg" in sec and sec.count("<title>") == len(tl.spans)
