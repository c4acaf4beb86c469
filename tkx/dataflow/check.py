"""The static checker of a task DAG: every read is ordered after its writes, every reuse after its reads.

``check(dag) -> list[str]`` (empty when sound) recomputes the memory hazards between groups
from the schedule and the arena plan the DAG claims (:func:`tkx.dataflow.dag.hazards`) and
proves each one ordered by the waits alone, independent of grid size and interleaving:

* a wait on counter ``c`` of group ``A`` with threshold ``n_A`` (the number of ``A``'s tasks,
  each bumping ``c`` once after its tile is written) orders every task of ``A`` before the
  waiting task; a smaller threshold orders nothing (some tile may still be running), a
  larger one can never be met (a deadlock);
* orderings compose (``A -> B -> C`` orders ``A`` before ``C``);
* a wait on a group later in the global order could deadlock (a block could wait on a task
  queued behind the wait in its own list) and is reported;
* a wait on the counter of a group that bumps it without a release fence (``dag.unfenced``)
  orders nothing (the bump may be seen before the stores); a block that skips a group's waits
  (``dag.skips``) leaves that group's hazards unordered; an epoch that does not advance per
  launch (``dag.epoch_step != 1``) lets a replay's waits be met by the previous launch's bumps.
"""

from __future__ import annotations

from .dag import TaskDAG, hazards


def check(dag: TaskDAG) -> list[str]:
    """Problems of ``dag`` (empty when every hazard is ordered and no wait can deadlock)."""
    problems: list[str] = []
    position = {g: i for i, g in enumerate(dag.order)}
    full: dict[str, set[str]] = {g: set() for g in dag.order}
    bumpers = {c.index: c.group for c in dag.counters}
    for g in dag.order:
        for w in dag.waits.get(g, ()):
            if w.counter not in bumpers:
                problems.append(f"{g} waits on counter c{w.counter}, which no group bumps")
                continue
            p = bumpers[w.counter]
            n = dag.items[p]
            if position[p] >= position[g]:
                problems.append(f"deadlock: {g} waits on counter c{w.counter} of {p}, which is not earlier "
                                f"in the global task order")
            elif w.threshold > n:
                problems.append(f"deadlock: {g} waits for counter c{w.counter} of {p} to reach {w.threshold}, "
                                f"but only {n} tasks bump it")
            elif w.threshold < n:
                problems.append(f"partial wait: {g} waits for counter c{w.counter} of {p} to reach only "
                                f"{w.threshold} of its {n} tasks (orders none of them)")
            elif p in dag.unfenced:
                problems.append(f"missing release fence: {p} bumps counter c{w.counter} without a fence, so "
                                f"{g}'s wait on it may succeed before {p}'s stores are visible")
            else:
                full[g].add(p)
    for b, g in sorted(dag.skips):
        if dag.waits.get(g):
            problems.append(f"block {b} skips the waits of {g}: its tasks of {g} are ordered after nothing")
            full[g] = set()
    if dag.epoch_step != 1 and any(dag.waits.values()):
        problems.append(f"the epoch advances by {dag.epoch_step} per launch (not 1): in a replay every counter "
                        "already stands at its threshold from the previous launch, so the waits order nothing")
        full = {g: set() for g in dag.order}
    ancestors: dict[str, set[str]] = {}
    for g in dag.order:
        anc: set[str] = set()
        for p in full[g]:
            if p in ancestors:
                anc |= {p} | ancestors[p]
        ancestors[g] = anc
    for e in hazards(dag.schedule, dag.arena, dag.order):
        if e.producer not in ancestors[e.consumer]:
            problems.append(f"unordered {e.kind}: {e.consumer} may run before {e.producer} is done with {e.what}")
    return problems
