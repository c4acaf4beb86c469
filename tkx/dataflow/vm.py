"""A CPU task VM with the kernel's exact counter semantics.

``run(dag, inputs, blocks=..., policy=..., seed=...) -> VMRun`` executes every block's task
list (:meth:`TaskDAG.task_lists`) as the counters kernel does, one event at a time, under an
interleaving chosen by ``policy``:

* a block at task ``t`` may **start** it once every :class:`~tkx.dataflow.dag.Wait` of ``t``'s
  group is met: ``(int32)(counter - base) >= threshold`` with 32-bit wrap-around, where
  ``base = epoch * threshold`` (counters are never reset; each launch raises the epoch);
* a running task may **finish** at any later event; finishing bumps its group's counter by one;
* after the last block finishes, the epoch advances (the kernel's exit count does this) by
  ``dag.epoch_step``.

Planted protocol faults (:meth:`TaskDAG.with_faults`): a task of an ``unfenced`` group bumps its
counter when it starts (without a release fence the bump may overtake the tile's stores: the
VM takes the adversary's side); a block of a ``skips`` pair starts that group's tasks without
waiting.

Policies: ``"random"`` (uniform over enabled events), ``"eager"`` (start whatever can start,
finish a random running task only when nothing can: tasks overlap as much as possible),
``"serial"`` (one block runs until it must wait, lowest first), ``"reverse"`` (highest block
first, starts before finishes), ``"round_robin"``, ``"lifo"`` (start the lowest task that can start; when
nothing can, finish the task started last: the oldest running task finishes last, the
adversary of a missing write-after-read order), ``"stall"`` (block ``seed % blocks`` is slow: its
running task finishes only when nothing else can happen).

Every access is checked against the program order (the schedule's stage order, which the
barrier kernel proves sound), per task and exactly: a task starting while a group that
writes what it reads has unfinished tiles is a **read of unwritten memory**; a task reading
bytes that a later group has begun to overwrite is a **read of reused memory**; a task
overwriting bytes an earlier group still reads or writes is a **premature overwrite**. A
state in which no event is enabled before every block is done is a **deadlock** (each stuck
block's task, counter, value and threshold are reported).

Values: a group is computed by the schedule interpreter's machinery when its last task
finishes (reading memory as it is then; a "last-slice" split-K group's per-tile arrival counters
live across launches, as the kernel's sync words do, and must be back at 0 after each); from its
first task's start until then the bytes it writes are poisoned (all bits set: NaN for floats), so
premature readers see garbage. The outputs and updates of each launch are compared with :func:`tkx.reference.run`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import TkxError
from ..reference import flatten_inputs, in_captured_layout
from ..schedule.interpreter import ScheduleError, _Machine
from .dag import Region, Task, TaskDAG, footprints

__all__ = ["VMRun", "Fault", "run", "run_timed", "TimedTask", "POLICIES"]

POLICIES = ("random", "eager", "lifo", "stall", "serial", "reverse", "round_robin")
MASK = 0xFFFFFFFF


class VMError(TkxError):
    """A VM run found a fault (raised by :meth:`VMRun.raise_if_faulty`)."""


@dataclass(frozen=True)
class Fault:
    """One problem found: ``kind`` in ``"deadlock"``, ``"unwritten-read"``, ``"reused-read"``,
    ``"premature-overwrite"``, ``"mismatch"``, ``"interpreter"``; ``message`` a sentence."""

    kind: str
    message: str
    launch: int = 0

    def __str__(self) -> str:
        return f"[launch {self.launch}] {self.kind}: {self.message}"


@dataclass(frozen=True)
class TaskRecord:
    """One executed task: ``block``, ``task`` (global number), ``group``, ``item``, logical
    times ``ready`` (the block reached it), ``start`` and ``end`` (VM event numbers), ``launch``."""

    block: int
    task: int
    group: str
    item: int
    ready: int
    start: int
    end: int
    launch: int


@dataclass
class VMRun:
    """What one VM run did: ``faults``, the executed ``records``, the ``outputs`` and
    ``updates`` of each launch, the final ``counters`` and ``epoch``."""

    dag: TaskDAG
    blocks: int
    policy: str
    seed: int
    faults: list[Fault] = field(default_factory=list)
    records: list[TaskRecord] = field(default_factory=list)
    outputs: list[list[torch.Tensor]] = field(default_factory=list)
    updates: list[dict[int, torch.Tensor]] = field(default_factory=list)
    counters: list[int] = field(default_factory=list)
    epoch: int = 0
    #: group id -> the per-tile arrival counters of each "last-slice" split-K group after the last launch
    #: (sync words that persist across launches: all 0 when every launch reset them)
    splitk_counters: dict[str, list[int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.faults

    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults}

    def raise_if_faulty(self) -> None:
        if self.faults:
            head = f"task VM ({self.blocks} blocks, {self.policy}, seed {self.seed}) found {len(self.faults)} faults"
            raise VMError(head + ":\n  " + "\n  ".join(str(f) for f in self.faults[:10]))

    def __repr__(self) -> str:
        return (f"<tkx.VMRun {self.dag.schedule.program.name}: {self.blocks} blocks, {self.policy}/{self.seed}, "
                f"{len(self.records)} tasks, {len(self.faults)} faults>")


def _met(value: int, base: int, threshold: int) -> bool:
    diff = (value - base) & MASK
    if diff >= 1 << 31:
        diff -= 1 << 32
    return diff >= threshold


def _rel(value: int, base: int) -> int:
    diff = (value - base) & MASK
    return diff - (1 << 32) if diff >= 1 << 31 else diff


def _poison(m: _Machine, r: Region) -> None:
    if r.space == "arena":
        m.arena[r.lo:min(r.hi, m.arena.numel())] = 255
        return
    k = int(r.space[3:] if r.space.startswith("out") else r.space[2:])
    t = m.outputs[k] if r.space.startswith("out") else m.inputs[k]
    t.fill_(float("nan") if t.is_floating_point() else -1)


def _pick_event(policy: str, rng: random.Random, seed: int, blocks: int, starts: list[int], fins: list[int],
                next_index: Any, began: Any, rr: list[int]) -> tuple[str, int]:
    """The next event of the VM under ``policy``: ``("s", b)`` starts block ``b``'s next task (one of
    ``starts``), ``("f", b)`` finishes its running one (one of ``fins``). ``next_index(b)``: the global number
    of ``b``'s next task; ``began(b)``: the clock its running task started at; ``rr``: the round-robin
    position (updated)."""
    if policy == "random":
        return rng.choice([("s", b) for b in starts] + [("f", b) for b in fins])
    if policy == "eager":
        return ("s", rng.choice(starts)) if starts else ("f", rng.choice(fins))
    if policy == "stall":
        victim = seed % blocks
        others = [("s", b) for b in starts] + [("f", b) for b in fins if b != victim]
        return rng.choice(others) if others else ("f", victim)
    if policy == "lifo":
        return ("s", min(starts, key=next_index)) if starts else ("f", max(fins, key=began))
    if policy == "serial":
        b = min(starts + fins)
    elif policy == "reverse":
        return ("s", max(starts)) if starts else ("f", max(fins))
    else:  # round_robin
        cands = sorted(set(starts + fins))
        b = next((x for x in cands if x >= rr[0]), cands[0])
        rr[0] = b + 1
    return ("s", b) if b in starts else ("f", b)


def _deadlock_fault(dag: TaskDAG, t: Task, b: int, counters: list[int], base_epoch: int, fault: Any) -> None:
    """Report block ``b`` stuck at task ``t``: the first counter it waits on that stands below its threshold
    (or a wait on a counter that does not exist)."""
    for w in dag.waits[t.group]:
        if 0 <= w.counter < len(dag.counters):
            c = dag.counters[w.counter]
            value = _rel(counters[w.counter], base_epoch * c.threshold)
            if value < w.threshold:
                fault("deadlock", f"block {b} is stuck at task {t.index} ({t.group} item {t.item}): "
                      f"counter c{w.counter} of {c.group} stands at {value}, threshold {w.threshold}")
                return
    fault("deadlock", f"block {b} is stuck at task {t.index} ({t.group}) waiting on a counter that does not exist")


def run(dag: TaskDAG, inputs: Sequence[Any], *, blocks: int = 4, policy: str = "random", seed: int = 0,
        launches: int = 2, epoch: int = 0, reference: Any = None, rtol: float = 1e-5,
        values: bool = True, rotate: bool = False) -> VMRun:
    """Run ``dag`` on ``blocks`` blocks for ``launches`` launches (see the module text).

    ``inputs``: the step's inputs (flat tensors or pytrees; each launch starts from copies).
    ``epoch``: the epoch the counters start at (counters hold ``epoch * threshold``), to test
    wrap-around. ``rotate``: deal each stage's tasks from a seeded random first block (the
    kernel starts at block 0; any rotation keeps every list in the global order, so the
    proofs must hold for it too). ``values=False`` checks the ordering only (no computing:
    fast). ``reference``: an :class:`tkx.reference.Execution` to compare with (computed
    with :func:`tkx.reference.run` when ``None``). Returns a :class:`VMRun`; never raises for a
    fault (see :meth:`VMRun.raise_if_faulty`). Raises :class:`TkxError` for an unknown policy.
    """
    if policy not in POLICIES:
        raise TkxError(f"unknown VM policy {policy!r}; use one of {', '.join(POLICIES)}")
    from ..reference import run as reference_run

    s = dag.schedule
    flat = flatten_inputs(s.program, inputs)
    if reference is None and values:
        reference = reference_run(s.program, flat)
    rng = random.Random(seed)
    stages = sorted(set(dag.stage_of.values()))
    lists = dag.task_lists(blocks, {si: rng.randrange(blocks) for si in stages} if rotate else None)
    fp = footprints(s, dag.arena)
    counters = [(epoch * c.threshold) & MASK for c in dag.counters]
    raw_prev, war_later, over_prev = _conflict_tables(dag, fp)
    out = VMRun(dag, blocks, policy, seed)
    splitk: dict[str, list[int]] = {}  # "last-slice" split-K tile counters: sync words, kept across launches
    clock = 0
    def one_launch(launch: int) -> bool:
        nonlocal clock
        base_epoch = epoch + launch * dag.epoch_step
        copies = [in_captured_layout(t, spec.value, copy=True) for spec, t in zip(s.program.inputs, flat)]
        m = _Machine(s, dag.arena, copies, splitk, seed)
        started = {g: 0 for g in dag.order}
        finished = {g: 0 for g in dag.order}
        pc = [0] * blocks
        running: list[tuple[Task, int, int] | None] = [None] * blocks
        ready_at = [clock] * blocks
        faults: list[Fault] = []

        def fault(kind: str, msg: str) -> None:
            if len(faults) < 50:
                faults.append(Fault(kind, msg, launch))

        def can_start(b: int) -> bool:
            if running[b] is not None or pc[b] >= len(lists[b]):
                return False
            t = lists[b][pc[b]]
            if (b, t.group) in dag.skips:
                return True
            for w in dag.waits[t.group]:
                c = dag.counters[w.counter] if 0 <= w.counter < len(dag.counters) else None
                if c is None or not _met(counters[w.counter], base_epoch * c.threshold, w.threshold):
                    return False
            return True

        def start(b: int) -> None:
            nonlocal clock
            t = lists[b][pc[b]]
            g = t.group
            reads, writes = fp[g]
            for a, r in raw_prev[g]:
                if finished[a] < dag.items[a]:
                    fault("unwritten-read", f"task {t.index} ({g} item {t.item}, block {b}) reads {r} while "
                          f"{a} has written {finished[a]} of {dag.items[a]} tiles")
            for a, r in war_later[g]:
                if started[a] > 0:
                    fault("reused-read", f"task {t.index} ({g} item {t.item}, block {b}) reads {r} after "
                          f"{a} began overwriting it")
            for a, w in over_prev[g]:
                if finished[a] < dag.items[a]:
                    fault("premature-overwrite", f"task {t.index} ({g} item {t.item}, block {b}) overwrites "
                          f"{w} while {a} ({finished[a]} of {dag.items[a]} tiles done) still uses it")
            if started[g] == 0 and values:
                for w in writes:
                    if not any(w.overlaps(r) for r in reads):
                        _poison(m, w)
            started[g] += 1
            if g in dag.unfenced:  # the bump overtakes the stores
                c = dag.counter_of[g]
                counters[c] = (counters[c] + 1) & MASK
            clock += 1
            running[b] = (t, ready_at[b], clock)

        def finish(b: int) -> None:
            nonlocal clock
            t, ready, begin = running[b]  # type: ignore[misc]
            g = t.group
            finished[g] += 1
            if finished[g] == dag.items[g] and values:
                try:
                    m.run_group(s.groups[g])
                except ScheduleError as e:
                    fault("unwritten-read", f"{g}: {e}")
                except Exception as e:  # noqa: BLE001 - a poisoned value may break an op; record it
                    fault("interpreter", f"{g}: {type(e).__name__}: {e}")
            if g not in dag.unfenced:
                c = dag.counter_of[g]
                counters[c] = (counters[c] + 1) & MASK
            clock += 1
            out.records.append(TaskRecord(b, t.index, g, t.item, ready, begin, clock, launch))
            running[b] = None
            pc[b] += 1
            ready_at[b] = clock

        rr = [0]
        while True:
            starts = [b for b in range(blocks) if can_start(b)]
            fins = [b for b in range(blocks) if running[b] is not None]
            if not starts and not fins:
                break
            ev = _pick_event(policy, rng, seed, blocks, starts, fins, lambda b: lists[b][pc[b]].index,
                             lambda b: running[b][2], rr)  # type: ignore[index]
            (start if ev[0] == "s" else finish)(ev[1])
        stuck = [b for b in range(blocks) if pc[b] < len(lists[b])]
        if stuck:
            for b in stuck[:8]:
                _deadlock_fault(dag, lists[b][pc[b]], b, counters, base_epoch, fault)
            out.faults.extend(faults)
            return False
        ups = {u.input_index: m.inputs[u.input_index] for u in s.program.updates}
        out.outputs.append(m.outputs)
        out.updates.append(ups)
        if values:
            _compare(reference, m.outputs, ups, faults, rtol, launch)
        out.faults.extend(faults)
        return True

    for launch in range(launches):
        if not one_launch(launch):
            break
    out.counters = counters
    out.splitk_counters = splitk
    out.epoch = epoch + len(out.outputs)
    return out


@dataclass(frozen=True)
class TimedTask:
    """One task of a timed run: ``block``, ``task`` (global number), ``group``, ``item``, and times in µs:
    ``ready`` (its block reached it), ``start``, ``end``; ``cause``: the task whose end set ``start``
    (the block's previous task, or the last task of the group or stage it waited for; -1 for none)."""

    block: int
    task: int
    group: str
    item: int
    ready: float
    start: float
    end: float
    cause: int


def run_timed(dag: TaskDAG, *, blocks: int, task_us: Mapping[str, float], sync: str = "barrier",
              barrier_us: float = 0.0, handoff_us: float = 0.0, wait_us: float = 0.0) -> list[TimedTask]:
    """One launch of ``dag`` on ``blocks`` blocks with each task of group ``g`` taking ``task_us[g]`` µs.

    Every block runs its task list (:meth:`TaskDAG.task_lists`, the kernel's grid-stride deal) in
    order. ``sync="barrier"``: a stage's tasks start once every task of the earlier stages has ended
    and the barrier (``barrier_us``) has passed. ``sync="counters"``: a task starts once each counter
    it waits on has reached its threshold (every task of that group ended) plus ``handoff_us``, and
    pays ``wait_us`` per wait. Tasks are timed in the global order, which every wait respects, so
    each start is exact for the model. Returns the tasks in global order. Raises :class:`TkxError`
    for another ``sync``."""
    if sync not in ("barrier", "counters"):
        raise TkxError(f"unknown sync {sync!r} for a timed run; use 'barrier' or 'counters'")
    owner = {t.index: b for b, tasks in enumerate(dag.task_lists(blocks)) for t in tasks}
    free = [0.0] * blocks
    last_on = [-1] * blocks
    group_end: dict[str, tuple[float, int]] = {}  # group -> (latest end, that task)
    latest = (0.0, -1)  # latest end of every task timed so far
    release, stage = (0.0, -1), None
    out: list[TimedTask] = []
    k = 0
    for g in dag.order:
        if sync == "barrier" and dag.stage_of[g] != stage:
            if stage is not None:  # the barrier before this stage
                release = (max(latest[0], release[0]) + barrier_us, latest[1])
            stage = dag.stage_of[g]
        waits = dag.waits[g] if sync == "counters" else ()
        deps = [group_end[dag.counters[w.counter].group] for w in waits]
        dep = max(((t + handoff_us, cause) for t, cause in deps), default=(0.0, -1))
        if sync == "barrier":
            dep = release
        dur = task_us[g] + wait_us * len(waits)
        for item in range(dag.items[g]):
            b = owner[k]
            ready = free[b]
            start, cause = (dep[0], dep[1]) if dep[0] > ready else (ready, last_on[b])
            end = start + dur
            out.append(TimedTask(b, k, g, item, ready, start, end, cause))
            free[b], last_on[b] = end, k
            if end >= group_end.get(g, (-1.0, -1))[0]:
                group_end[g] = (end, k)
            if end >= latest[0]:
                latest = (end, k)
            k += 1
    return out


def critical_path(tasks: Sequence[TimedTask]) -> list[int]:
    """The task numbers on the critical path of a timed run: from the task that ends last back through
    each task's ``cause``, in time order."""
    if not tasks:
        return []
    by_index = {t.task: t for t in tasks}
    t = max(tasks, key=lambda t: (t.end, -t.task))
    path = []
    while t is not None:
        path.append(t.task)
        t = by_index.get(t.cause)
    return path[::-1]


def _conflict_tables(dag: TaskDAG, fp: dict) -> tuple[dict, dict, dict]:
    """Per group, from the program order: earlier writers of what it reads, later writers of what
    it reads, earlier readers or writers of what it writes (each with the region concerned)."""
    position = {g: i for i, g in enumerate(dag.order)}
    raw_prev: dict[str, list] = {g: [] for g in dag.order}
    war_later: dict[str, list] = {g: [] for g in dag.order}
    over_prev: dict[str, list] = {g: [] for g in dag.order}
    for g in dag.order:
        reads, writes = fp[g]
        for a in dag.order:
            if a == g:
                continue
            for r in reads:
                if any(w.overlaps(r) for w in fp[a][1]):
                    (raw_prev if position[a] < position[g] else war_later)[g].append((a, r))
            if position[a] < position[g]:
                for w in writes:
                    if any(x.overlaps(w) for x in fp[a][0] + fp[a][1]):
                        over_prev[g].append((a, w))
    return raw_prev, war_later, over_prev


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> bool:
    if got.shape != want.shape:
        return False
    g, w = got.double(), want.double()
    if not torch.equal(g.isnan(), w.isnan()):
        return False
    fin = torch.isfinite(w)
    if not torch.equal(g[~fin & ~w.isnan()], w[~fin & ~w.isnan()]):
        return False
    g, w = g[fin], w[fin]
    if g.numel() == 0:
        return True
    return (g - w).norm().item() <= rtol * max(w.norm().item(), 1e-30) + 1e-30


def _compare(ref: Any, outputs: list[torch.Tensor], updates: dict[int, torch.Tensor], faults: list[Fault],
             rtol: float, launch: int) -> None:
    for k, (a, b) in enumerate(zip(outputs, ref.outputs)):
        if not _close(a, b, rtol):
            faults.append(Fault("mismatch", f"output {k} differs from the reference interpreter", launch))
    for k, want in ref.updates.items():
        if k not in updates or not _close(updates[k], want, rtol):
            faults.append(Fault("mismatch", f"the update of input {k} differs from the reference interpreter",
                                launch))


def explore(dag: TaskDAG, inputs: Sequence[Any], *, blocks: Sequence[int] = (1, 2, 3, 5), seeds: int = 4,
            policies: Sequence[str] = POLICIES, launches: int = 2, epoch: int = 0,
            values: bool = True) -> list[VMRun]:
    """Run the VM over every grid size in ``blocks``, every policy, and ``seeds`` seeds of the
    randomised policies (each with the kernel's task assignment and a rotated one); returns
    the runs (check ``all(r.ok for r in runs)``)."""
    from ..reference import run as reference_run

    flat = flatten_inputs(dag.schedule.program, inputs)
    ref = reference_run(dag.schedule.program, flat) if values else None
    runs = []
    for b in blocks:
        for p in policies:
            n = min(b, 2 * seeds) if p == "stall" else seeds if p in ("random", "eager", "lifo") else 1
            for sd in range(n):
                for rot in ((False, True) if p in ("random", "eager", "lifo", "stall") and b > 1 else (False,)):
                    runs.append(run(dag, flat, blocks=b, policy=p, seed=sd, launches=launches, epoch=epoch,
                                    reference=ref, values=values, rotate=rot))
    return runs
