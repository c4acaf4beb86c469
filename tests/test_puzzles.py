"""Megakernel puzzles: every solution passes its check, every blank and every kind of wrong answer
fails with a hint, every poisoned protocol is caught by the static checker and by the task VM."""

from __future__ import annotations

import copy

import pytest

from tkx import dataflow, puzzles
from tkx.dataflow import vm
from tkx.errors import TkxError

NAMES = [p.name for p in puzzles.PUZZLES]


def test_the_set():
    assert len(puzzles.PUZZLES) >= 12 and len(set(NAMES)) == len(NAMES)
    levels = [p.level for p in puzzles.PUZZLES]
    assert levels == sorted(levels) and levels[0] == 1 and levels[-1] > levels[0]
    assert len({type(p) for p in puzzles.PUZZLES}) >= 8
    with pytest.raises(TkxError, match="barriers-1"):
        puzzles.get("barriers-9")
    with pytest.raises(TkxError, match="check takes a puzzle"):
        puzzles.check("barriers-1", [])


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_and_blank_fails(name):
    p = puzzles.get(name)
    d = p.draw()
    assert p.name in str(d) and "text/html" in d._repr_mimebundle_()
    good = puzzles.check(p, p.solution())
    assert good.ok and good.optimal, str(good)
    assert "compiler" in str(good) or not good.score
    bad = puzzles.check(p, p.blank())
    assert not bad.ok and bad.hint and bad.problems, str(bad)
    assert "wrong" in str(bad) and "hint:" in str(bad)


def _wrong(name: str):
    """Wrong answers of each kind a puzzle has: (answer, text the verdict must contain)."""
    p = puzzles.get(name)
    sol = p.solution()
    if isinstance(p, puzzles.Fusion):
        refused = next(k for k, v in sol.items() if v is not True)
        fused = next(k for k, v in sol.items() if v is True)
        yield {**sol, refused: True}, "not fused"
        yield {**sol, fused: "multi-use"}, "the compiler fuses it"
        other = next(r for r in puzzles.rule_names() if r != sol[refused])
        yield {**sol, refused: other}, f"not by {other}"
    elif isinstance(p, puzzles.Barriers):
        for k in range(len(sol)):
            yield sol[:k] + sol[k + 1:], "RAW"
    elif isinstance(p, puzzles.ArenaOffsets):
        a = p.step.arena
        first, second = sorted(a.slots.values(), key=lambda s: (s.first, s.offset))[:2]
        yield {**sol, second.buffer: sol[first.buffer]}, "overlap"
        yield {**sol, first.buffer: sol[first.buffer] + 4}, "aligned"
    elif isinstance(p, puzzles.Thresholds):
        g = next(iter(sol))
        prod = next(iter(sol[g]))
        yield {**sol, g: {prod: sol[g][prod] - 1}}, "partial wait"
        yield {**sol, g: {prod: sol[g][prod] + 1}}, "deadlock"
    elif isinstance(p, puzzles.Waits):
        g = next(x for x in sol if sol[x])
        yield {**sol, g: sol[g][1:]}, "unordered"
    elif isinstance(p, puzzles.TaskOrder):
        yield list(reversed(sol)), "deadlock"
    elif isinstance(p, puzzles.GemmTiles):
        yield {"tile_m": 256, "tile_n": 256, "tile_k": 32}, "registers per thread"
        yield {"tile_m": 16, "tile_n": 16, "tile_k": 8}, "split evenly"
    elif isinstance(p, puzzles.SplitK):
        yield 1, "predicted"
        yield 16, "predicted"
        yield 3, "one of 1, 2, 4, 8, 16"
    elif isinstance(p, puzzles.WeightPrefetch):
        yield {u: "start" for u in sol}, "over budget"
        last = p.units()[-1]
        yield {**sol, last.name: last.consumers[-1]}, "deadlock"
        yield {**sol, last.name: p.dag.order[p.dag.order.index(last.consumers[0]) - 1]}, "predicted"
    else:  # pragma: no cover - a new kind of puzzle needs wrong answers here
        raise AssertionError(f"no wrong answers for {name}")


@pytest.mark.parametrize("name", NAMES)
def test_wrong_answers_fail_with_a_hint(name):
    cases = list(_wrong(name))
    assert cases
    for answer, text in cases:
        v = puzzles.check(puzzles.get(name), answer)
        assert not v.ok and v.hint, (answer, str(v))
        assert text in str(v), (answer, str(v))


def test_answers_of_the_wrong_form_say_what_form():
    p = puzzles.get("arena-1")
    v = puzzles.check(p, {"nope": 0})
    assert not v.ok and "p.blank()" in v.hint
    v = puzzles.check(puzzles.get("barriers-1"), ["x"])
    assert not v.ok and "indices" in str(v)
    t = puzzles.get("thresholds-1")
    g = next(iter(t.blank()))
    v = puzzles.check(t, {**t.solution(), g: {k: "many" for k in t.blank()[g]}})
    assert not v.ok and "form" in str(v) and "p.blank()" in v.hint
    for name, bad in (("waits-1", {"g1": ["g99"]}), ("order-1", ["g0"]), ("split-k-1", True),
                      ("gemm-tiles-1", {"tile_m": 48, "tile_n": 64, "tile_k": 8})):
        v = puzzles.check(puzzles.get(name), bad)
        assert not v.ok and v.hint, (name, str(v))


def test_fractional_and_infinite_numbers_are_wrong_answers_not_rounded_or_crashes():
    """1.5 is not a barrier index and 16.5 not a threshold (int() would round them into a correct answer);
    inf is a wrong answer, not an OverflowError."""
    p = puzzles.get("barriers-1")
    cut = p.solution()[0]
    for answer in ([cut + 0.5], [float("inf")], [float("nan")]):
        v = puzzles.check(p, answer)
        assert not v.ok and "whole group indices" in v.problems[0], (answer, v)
    assert puzzles.check(p, [float(cut)]).ok
    t = puzzles.get("thresholds-1")
    answer = copy.deepcopy(t.solution())
    g = next(iter(answer))
    h = next(iter(answer[g]))
    answer[g][h] += 0.5
    v = puzzles.check(t, answer)
    assert not v.ok and "whole number" in v.problems[0], v


def test_a_correct_answer_can_be_worse_than_the_compiler():
    p = puzzles.get("arena-2")
    a = p.step.arena
    offsets, at = {}, 0
    for b in sorted(a.slots):  # no reuse at all: correct, bigger
        offsets[b] = at
        at += -(-a.slots[b].nbytes // a.alignment) * a.alignment
    v = puzzles.check(p, offsets)
    assert v.ok and not v.optimal and v.score["arena bytes"][0] > v.score["arena bytes"][1]
    sol = puzzles.get("barriers-2").solution()
    flat = sum(len(s) for s in puzzles.get("barriers-2").step.schedule.stages)
    extra = sorted(set(sol) | {i for i in range(1, flat)})  # a barrier before every group
    v = puzzles.check(puzzles.get("barriers-2"), extra)
    assert v.ok and not v.optimal


def test_solutions_come_from_the_compiler():
    p = puzzles.get("thresholds-1")
    dag = p.step.dag()
    assert p.solution() == {g: {dag.counters[w.counter].group: w.threshold for w in dag.waits[g]}
                            for g in dag.order if dag.waits[g]}
    assert len(puzzles.get("barriers-2").solution()) == puzzles.get("barriers-2").step.schedule.num_barriers
    assert puzzles.get("arena-2").solution() == puzzles.get("arena-2").step.arena.offsets


@pytest.mark.parametrize("q", puzzles.POISONS, ids=[q.name for q in puzzles.POISONS])
def test_poison_caught_by_checker_and_vm(q):
    assert dataflow.check(q.sound()) == []
    assert q.caught_by_checker(), q.checker_problems()
    assert q.caught_by_vm()
    assert q.first_vm_fault()


def test_the_poisons():
    names = {q.name for q in puzzles.POISONS}
    assert len(names) >= 6
    assert {"missing-release-fence", "threshold-off-by-one", "slot-reused-early", "epoch-not-advanced",
            "wait-on-wrong-counter", "barrier-skipped-by-one-block"} <= names
    with pytest.raises(TkxError, match="missing-release-fence"):
        puzzles.poison("nope")


def test_the_sound_protocols_pass_the_same_vm_runs():
    """The VM runs that catch the poisons find nothing in the sound DAGs (and the barrier protocol)."""
    for q in puzzles.POISONS[:2]:
        sound = copy.copy(q)
        object.__setattr__(sound, "plant", lambda d: d)
        assert not sound.caught_by_vm() and not sound.caught_by_checker()
    dag = puzzles.poison("barrier-skipped-by-one-block").sound()
    bar = puzzles.barrier_dag(dag)
    assert dataflow.check(bar) == []
    st = puzzles.step("tiny_online")
    assert all(vm.run(bar, list(st.inputs), blocks=b, policy="random", seed=s, values=False, launches=2).ok
               for b in (2, 3) for s in range(3))


def test_planted_protocol_faults_in_the_vm():
    st = puzzles.step("tiny_online")
    dag = st.dag()
    r = vm.run(dag.with_faults(epoch_step=0), list(st.inputs), blocks=3, policy="random", seed=0, launches=1,
               values=False)
    assert r.ok  # one launch: the epoch does not matter yet
    assert r.epoch == 1
    r = vm.run(dag.with_faults(epoch_step=0), list(st.inputs), blocks=3, policy="eager", seed=0, launches=2,
               values=True)
    assert {"unwritten-read", "mismatch"} & r.kinds()


def test_a_poisoned_dag_reaches_the_generated_kernel(monkeypatch):
    """What the GPU test runs (tests/test_puzzles_gpu.py): the counters kernel generated from the poisoned
    DAG waits for one tile more than its producer has."""
    import tkx.dataflow
    import tkx.runtime
    from tkx.examples import get
    from tkx.options import Options

    q = puzzles.poison("threshold-one-too-high")
    original = tkx.dataflow.build
    monkeypatch.setattr(tkx.dataflow, "build", lambda *a, **k: q.plant(original(*a, **k)))
    ex = get(q.example)
    src = tkx.runtime.lower(ex.step_fn, ex.make_inputs(0), Options(mode="grid", sync="counters"), name=q.example)
    dag = src.dag
    assert src.sync == "counters" and any(p.startswith("deadlock") for p in dataflow.check(dag))
    g = next(g for g in dag.order for w in dag.waits[g] if w.threshold > dag.items[dag.counters[w.counter].group])
    w = next(w for w in dag.waits[g] if w.threshold > dag.items[dag.counters[w.counter].group])
    producer = dag.counters[w.counter].group
    assert f", {w.counter}, {w.threshold}u, " in src.text and f"wait for {producer} ({w.threshold} tiles)" in src.text


def test_a_stalled_wait_is_explained_by_the_poisoned_threshold():
    """The message the GPU test checks: the kernel names the first wait to reach the spin limit, the
    poisoned one or one on a group it holds up (tests/test_puzzles_gpu.py); an unrelated or inconsistent
    wait is rejected."""
    from types import SimpleNamespace

    from stalled_wait import check_stalled_wait, downstream

    from tkx.runtime.status import wait_error

    dag = puzzles.poison("threshold-one-too-high").broken()
    pos = {g: i for i, g in enumerate(dag.order)}
    schedule = SimpleNamespace(stages=[list(dag.order)])
    g, w = next((g, w) for g in dag.order for w in dag.waits[g]
                if w.threshold > dag.items[dag.counters[w.counter].group])

    def message(task, counter, value, threshold):
        return str(wait_error(0, 2, (pos[task] << 16) | counter, value, threshold, schedule))

    producer = dag.counters[w.counter].group
    assert check_stalled_wait(dag, message(g, w.counter, dag.items[producer], w.threshold)) == "poisoned"
    held = next(t for t in dag.order if t != g and any(dag.counters[v.counter].group == g for v in dag.waits[t]))
    v = next(v for v in dag.waits[held] if dag.counters[v.counter].group == g)
    assert check_stalled_wait(dag, message(held, v.counter, 0, v.threshold)) == "downstream"
    assert producer not in downstream(dag, g)
    for bad in (message(held, v.counter, v.threshold, v.threshold),  # a met wait
                message(held, v.counter, 0, v.threshold + 1),  # a threshold the DAG does not have
                message(g, w.counter, dag.items[producer] + 1, w.threshold)):  # more tiles than the producer has
        with pytest.raises(AssertionError):
            check_stalled_wait(dag, bad)


def test_weight_prefetch_model():
    """The prefetch timeline without prefetches is the cost model's counters timeline (run_timed); the
    compiler's plan overlaps a load with the previous unit's readers and keeps within the budget in every
    adversarial run; the budget decides: with room for one unit only, no two units overlap."""
    from tkx import costs
    from tkx.dataflow import prefetch
    from tkx.dataflow.cost import task_us

    p = puzzles.get("prefetch-1")
    dag, blocks = p.dag, p.blocks
    c = costs.constants()
    timed = vm.run_timed(dag, blocks=blocks, task_us={g: task_us(dag, g, c) for g in dag.order}, sync="counters",
                         handoff_us=c["handoff_us"], wait_us=c["wait_us"])
    assert prefetch.predicted_us(dag, p.blank(), blocks=blocks) == pytest.approx(max(t.end for t in timed))
    names = [u.name for u in p.units()]
    assert names == ["l0.attn", "l0.mlp", "l1.attn", "l1.mlp", "head"]
    sol = p.solution()
    run = prefetch.simulate(dag, sol, blocks=blocks, streams=p.streams)
    assert len(run.peak_units) >= 2 and run.peak_bytes <= p.budget  # an overlap, within the budget
    assert not p.adversarial_problems(sol)
    assert run.makespan < prefetch.predicted_us(dag, p.blank(), blocks=blocks)
    small = max(u.nbytes for u in p.units())
    tight = prefetch.plan(dag, small, blocks=blocks, streams=p.streams)
    assert prefetch.simulate(dag, tight, blocks=blocks, streams=p.streams).peak_bytes <= small
    assert not prefetch.static_problems(dag, tight, small)
    assert prefetch.static_problems(dag, sol, small)  # the plan of the larger budget is over the smaller one
    with pytest.raises(TkxError, match="no prefetch unit"):
        prefetch.simulate(dag, {"l9.mlp": "start"}, blocks=2)


def test_weight_prefetch_over_budget_overlap_is_named():
    """Two MLP units issued together (96 KiB over an 80 KiB budget) are named by the static check and the
    adversarial runs, whatever the predicted µs."""
    p = puzzles.get("prefetch-1")
    sol = p.solution()
    order = p.dag.order
    # issue l1.mlp as soon as l0.mlp's loads are issued: both MLP units may be held at once (96 KiB)
    answer = {**sol, "l1.mlp": sol["l0.mlp"] or order[0]}
    v = puzzles.check(p, answer)
    assert not v.ok and "l0.mlp" in str(v) and "l1.mlp" in str(v) and "budget" in v.hint
