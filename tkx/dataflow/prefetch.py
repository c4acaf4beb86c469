"""Weight prefetch in a decode step: which layer's weight loads are issued when, under a byte budget.

A decode step is bound by reading its weights. A *prefetch unit* is the set of weights one part of a
layer reads (``l0.attn``: the q/k/v/o projections of layer 0; ``l0.mlp``: its gate/up/down projections;
``head``: the LM head), with the groups that read them (its *consumers*). A :class:`PrefetchPlan` gives
each unit an issue point: ``None`` (not prefetched: its GEMVs stream the weights themselves),
``"start"`` (at kernel entry) or a group id ``X`` (issued once every task of ``X`` has ended, a wait
on ``X``'s counter: the load overlaps whatever runs after ``X``). A prefetched unit's bytes are
streamed by ``streams`` SMs (``sm_bytes_per_us`` each, :func:`tkx.costs.constants`); its consumers
wait until they have landed and then read no weight bytes from memory. Its bytes stay held from the
issue until its last consumer task ends; the bytes held at once may not exceed ``budget`` bytes.

* :func:`simulate`: one launch of the task DAG with the prefetches (counter semantics, each block
  running its task list in order, :meth:`TaskDAG.task_lists`): task times, the peak bytes held,
  deadlock. ``jitter`` scales every task and load time by a seeded random factor: an adversarial
  interleaving; ``jitter=0`` is the cost model's prediction (tasks timed by
  :func:`tkx.dataflow.cost.task_us`, as :func:`tkx.dataflow.vm.run_timed`).
* :func:`static_problems`: what holds for every interleaving: an issue point after a consumer
  (deadlock) and sets of units that may be held at once over the budget.
* :func:`plan`: the compiler's choice: the issue points that minimise the predicted µs while every
  interleaving keeps within the budget (coordinate descent from "nothing prefetched").
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from ..errors import TkxError
from .dag import TaskDAG

__all__ = ["PrefetchUnit", "PrefetchRun", "units", "simulate", "static_problems", "plan", "predicted_us"]

START = "start"
_LINEAR = re.compile(r"^params\['l(\d+)\.(wq|wk|wv|wo|w_gate|w_up|w_down)'\]$")
_PART = {"wq": "attn", "wk": "attn", "wv": "attn", "wo": "attn", "w_gate": "mlp", "w_up": "mlp", "w_down": "mlp"}


@dataclass(frozen=True)
class PrefetchUnit:
    """Weights loaded together: ``name`` (e.g. ``"l0.attn"``), ``buffers`` (program input buffers),
    ``nbytes`` (their bytes), ``consumers`` (the groups reading them, in task order) and ``read``
    (group -> the bytes of these weights it reads)."""

    name: str
    buffers: tuple[str, ...]
    nbytes: int
    consumers: tuple[str, ...]
    read: Mapping[str, int] = field(repr=False)


def units(dag: TaskDAG) -> tuple[PrefetchUnit, ...]:
    """The prefetch units of a decode step's task DAG: per layer its attention and MLP projections,
    and the LM head (inputs named ``params['l<i>.<w>']`` and ``params['head']``, read by GEMM groups);
    units in the order of their first consumer."""
    s = dag.schedule
    name_of: dict[str, str] = {}
    nbytes: dict[str, int] = {}
    for inp in s.program.inputs:
        m = _LINEAR.match(inp.name)
        unit = f"l{m.group(1)}.{_PART[m.group(2)]}" if m else ("head" if inp.name == "params['head']" else None)
        if unit:
            name_of[inp.value.buffer] = unit
            nbytes[inp.value.buffer] = inp.value.nbytes
    found: dict[str, dict[str, Any]] = {}
    for g in dag.order:
        grp = s.groups[g]
        if not grp.kind.startswith("gemm"):
            continue
        for b in grp.reads:
            if b in name_of:
                u = found.setdefault(name_of[b], {"buffers": [], "consumers": [], "read": {}})
                if b not in u["buffers"]:
                    u["buffers"].append(b)
                if g not in u["consumers"]:
                    u["consumers"].append(g)
                u["read"][g] = u["read"].get(g, 0) + nbytes[b]
    return tuple(PrefetchUnit(n, tuple(u["buffers"]), sum(nbytes[b] for b in u["buffers"]), tuple(u["consumers"]),
                              dict(u["read"])) for n, u in found.items())


@dataclass(frozen=True)
class PrefetchRun:
    """One simulated launch: ``makespan`` (µs; ``inf`` when deadlocked), ``peak_bytes`` held at once and
    the units then held (``peak_units``), ``deadlock`` (a sentence, "" when none), ``landed`` (unit ->
    µs its bytes landed) and ``stalled`` (unit -> µs its first consumer waited for the load)."""

    makespan: float
    peak_bytes: int
    peak_units: tuple[str, ...]
    deadlock: str = ""
    landed: Mapping[str, float] = field(default_factory=dict)
    stalled: Mapping[str, float] = field(default_factory=dict)


def _ancestors(dag: TaskDAG) -> dict[str, set[str]]:
    """Group -> the groups it waits on, directly or through others (counter waits with full thresholds)."""
    anc: dict[str, set[str]] = {}
    for g in dag.order:
        a: set[str] = set()
        for w in dag.waits[g]:
            p = dag.counters[w.counter].group
            a |= {p} | anc[p]
        anc[g] = a
    return anc


def _check_plan(dag: TaskDAG, us: Sequence[PrefetchUnit], issue: Mapping[str, Any]) -> None:
    names = {u.name for u in us}
    unknown = set(issue) - names
    if unknown:
        raise TkxError(f"no prefetch unit {sorted(unknown)}; the units are {sorted(names)}")
    for u, x in issue.items():
        if x is not None and x != START and x not in dag.items:
            raise TkxError(f"{u}: issue point {x!r} is neither None, {START!r} nor a group of {list(dag.order)}")


def simulate(dag: TaskDAG, issue: Mapping[str, Any], *, blocks: int, streams: int = 8, jitter: float = 0.0,
             seed: int = 0, rotate: bool = False) -> PrefetchRun:
    """One launch of ``dag`` on ``blocks`` blocks with the prefetches ``issue`` (unit -> None, ``"start"``
    or a group id): task times from the cost model, each multiplied by a factor drawn from
    ``[1/(1+jitter), 1+jitter]`` (seeded; ``jitter=0``: the prediction). ``rotate``: each stage's first
    task goes to another block (another deal of tasks to blocks). Raises :class:`TkxError` for an unknown
    unit or group, or fewer than one stream."""
    from .. import costs
    from .cost import task_us

    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise TkxError(f"a load is streamed by at least one SM: streams must be an int >= 1, got {streams!r}")
    us = units(dag)
    _check_plan(dag, us, issue)
    c = costs.constants()
    rng = random.Random(seed)

    def factor() -> float:
        return rng.uniform(1.0 / (1.0 + jitter), 1.0 + jitter) if jitter else 1.0

    fetched = {u.name: u for u in us if issue.get(u.name) is not None}
    saved = {g: 0 for g in dag.order}
    for u in fetched.values():
        for g, nb in u.read.items():
            saved[g] += nb
    base = {g: task_us(dag, g, c) for g in dag.order}
    light = {g: _task_us_without(dag, g, saved[g], c) for g in dag.order}
    rotations = {si: rng.randrange(blocks) for si in set(dag.stage_of.values())} if rotate else None
    lists = dag.task_lists(blocks, rotations)
    pos = [0] * blocks
    free = [0.0] * blocks
    done: dict[str, list[float]] = {g: [] for g in dag.order}
    landed: dict[str, float] = {}
    waiting_for: dict[str, list[str]] = {}
    for u in fetched.values():
        for g in u.consumers:
            waiting_for.setdefault(g, []).append(u.name)
    load_us = {n: u.nbytes / (streams * c["sm_bytes_per_us"]) * factor() for n, u in fetched.items()}
    stalled: dict[str, float] = {}
    first_start: dict[str, float] = {}
    last_end: dict[str, float] = {}

    def group_end(g: str) -> float | None:
        return max(done[g]) if len(done[g]) == dag.items[g] else None

    def land(n: str) -> float | None:
        if n not in landed:
            x = issue[n]
            t = 0.0 if x == START else group_end(x)
            if t is None:
                return None
            landed[n] = t + (c["handoff_us"] if x != START else 0.0) + load_us[n]
        return landed[n]

    remaining = sum(len(x) for x in lists)
    while remaining:
        progressed = False
        for b in range(blocks):
            while pos[b] < len(lists[b]):
                t = lists[b][pos[b]]
                deps = [group_end(dag.counters[w.counter].group) for w in dag.waits[t.group]]
                loads = [land(n) for n in waiting_for.get(t.group, ())]
                if any(d is None for d in deps) or any(x is None for x in loads):
                    break
                ready = max([free[b]] + [d + c["handoff_us"] for d in deps])
                start = max([ready] + loads)
                for n, x in zip(waiting_for.get(t.group, ()), loads):
                    if x > ready:
                        stalled[n] = max(stalled.get(n, 0.0), x - ready)
                dur = (light[t.group] if saved[t.group] else base[t.group]) + c["wait_us"] * len(dag.waits[t.group])
                end = start + dur * factor()
                done[t.group].append(end)
                first_start[t.group] = min(first_start.get(t.group, start), start)
                last_end[t.group] = max(last_end.get(t.group, end), end)
                free[b] = end
                pos[b] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = sorted({lists[b][pos[b]].group for b in range(blocks) if pos[b] < len(lists[b])},
                           key=dag.order.index)
            why = [f"{g} waits for the load of {n}, issued after {issue[n]}" for g in stuck
                   for n in waiting_for.get(g, ()) if n not in landed]
            return PrefetchRun(float("inf"), 0, (), "deadlock: " + ("; ".join(why) or
                                                                   f"{', '.join(stuck)} cannot start"), landed, stalled)
    held = []
    for n, u in fetched.items():
        x = issue[n]
        t0 = 0.0 if x == START else group_end(x)
        held.append((t0, max(last_end[g] for g in u.consumers), n, u.nbytes))
    peak, peak_units = 0, ()
    for t0, _, _, _ in held:  # the bytes held just after each issue (a release at the same instant counts first)
        now = [(n, nb) for a, z, n, nb in held if a <= t0 < z]
        if sum(nb for _, nb in now) > peak:
            peak, peak_units = sum(nb for _, nb in now), tuple(n for n, _ in now)
    makespan = max((e for ends in done.values() for e in ends), default=0.0)
    return PrefetchRun(makespan, peak, peak_units, "", landed, stalled)


def _task_us_without(dag: TaskDAG, gid: str, saved: int, c: dict[str, float]) -> float:
    """:func:`tkx.dataflow.cost.task_us` of group ``gid`` with ``saved`` of its bytes not read from memory."""
    from .. import costs

    g = dag.schedule.groups[gid]
    n = max(dag.items[gid], 1)
    return costs.item_us(g.flops, max(g.bytes - saved, 0), n, c, costs.group_impl(g))


def static_problems(dag: TaskDAG, issue: Mapping[str, Any], budget: int) -> list[str]:
    """Faults every interleaving may show, as sentences: an issue point that is a consumer of its unit or
    comes after one in the task order (a block can reach the consumer first and wait for a load that waits
    for it: deadlock), and a set of units that may be held at once (no unit's issue waits for the release of
    another) whose bytes exceed ``budget``."""
    us = units(dag)
    _check_plan(dag, us, issue)
    pos = {g: i for i, g in enumerate(dag.order)}
    anc = _ancestors(dag)
    out = []
    fetched = [u for u in us if issue.get(u.name) is not None]
    for u in fetched:
        x = issue[u.name]
        if x != START and pos[x] >= pos[u.consumers[0]]:
            out.append(f"deadlock: {u.name} is issued after {x}, which does not come before its first reader "
                       f"{u.consumers[0]}")

    def apart(a: PrefetchUnit, b: PrefetchUnit) -> bool:  # a's release is ordered before b's issue
        x = issue[b.name]
        return x != START and set(a.consumers) <= anc[x] | {x}

    for k in range(len(fetched), 0, -1):  # k = 1: one unit alone over the budget
        for group in combinations(fetched, k):
            total = sum(u.nbytes for u in group)
            if total > budget and all(not apart(a, b) and not apart(b, a) for a, b in combinations(group, 2)):
                held = f"{group[0].name} alone holds" if k == 1 else \
                    f"{', '.join(u.name for u in group)} may be held at once,"
                out.append(f"over budget: {held} {total} bytes > {budget}")
                return out
    return out


def predicted_us(dag: TaskDAG, issue: Mapping[str, Any], *, blocks: int, streams: int = 8) -> float:
    """The predicted µs of one launch with the prefetches ``issue`` (:func:`simulate` without jitter)."""
    return simulate(dag, issue, blocks=blocks, streams=streams).makespan


def plan(dag: TaskDAG, budget: int, *, blocks: int, streams: int = 8, rounds: int = 2) -> dict[str, Any]:
    """The compiler's prefetch plan: unit -> issue point (None, ``"start"`` or a group id) minimising the
    predicted µs (:func:`predicted_us`) with no static problem (:func:`static_problems`) under ``budget``
    bytes. Coordinate descent from nothing prefetched: each unit in turn takes its best issue point given
    the others (ties go to the latest point: the fewest bytes held), ``rounds`` times over."""
    us = units(dag)
    pos = {g: i for i, g in enumerate(dag.order)}
    best = {u.name: None for u in us}
    best_us = predicted_us(dag, best, blocks=blocks, streams=streams)
    for _ in range(rounds):
        for u in us:
            options = [None, START] + [g for g in dag.order if pos[g] < pos[u.consumers[0]]]
            for x in reversed(options):
                trial = {**best, u.name: x}
                if static_problems(dag, trial, budget):
                    continue
                t = predicted_us(dag, trial, blocks=blocks, streams=streams)
                if t < best_us - 1e-9:
                    best, best_us = trial, t
    return best
