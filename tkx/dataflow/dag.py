"""The task DAG of a fused schedule: what replaces grid barriers with counters.

``build(schedule, arena) -> TaskDAG``. A **task** is one work item of one group (a GEMM tile,
a block of reduction rows, a chunk of a pointwise loop). The tasks of a group are *sibling
tiles*: they write disjoint parts of the group's stores and share one **counter**, which
each task bumps by one after its tile is written (a release); the counter's **threshold** is
the number of sibling tiles. A task of a later group waits (an acquire) until every counter
it depends on has reached its threshold, then runs.

Dependencies come from memory, not from stages: two groups conflict when the byte ranges
one writes overlap the ranges the other reads or writes (read-after-write, write-after-read,
write-after-write), with arena ranges taken from the :class:`~tkx.arena.ArenaPlan` - so the
reuse of a slot by a later value is ordered after the last read of the value it replaces.
The program order is the schedule's stage order (the order the barrier schedule proves
sound); a later group depends on an earlier one it conflicts with. Waits implied by others
(A before B before C makes C's wait on A redundant) are dropped.

Every block runs its tasks in one global topological order (stage by stage, the same
grid-stride assignment as the barrier kernel), and a task waits only on counters of groups
earlier in that order; so with every block resident, the lowest unfinished task can always
run: no interleaving deadlocks.

Memory is described by :class:`Region` ``(space, lo, hi)``: ``space`` is ``"arena"`` (byte
offsets), ``"in<k>"`` or ``"out<k>"`` (a whole user tensor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..arena import ArenaPlan
from ..errors import TkxError
from ..schedule.model import FusedSchedule, Group, Home

__all__ = ["Region", "Counter", "Wait", "Edge", "Task", "TaskDAG", "build", "footprints"]

WHOLE = 1 << 62  # hi of a region covering a whole user tensor


@dataclass(frozen=True, order=True)
class Region:
    """A byte range ``[lo, hi)`` of memory ``space`` (``"arena"``, ``"in<k>"``, ``"out<k>"``);
    ``buffer`` names the value (or user tensor) it holds."""

    space: str
    lo: int
    hi: int
    buffer: str = field(default="", compare=False)

    def overlaps(self, other: Region) -> bool:
        return self.space == other.space and self.lo < other.hi and other.lo < self.hi

    def __str__(self) -> str:
        if self.space == "arena":
            return f"{self.buffer} (arena bytes {self.lo}..{self.hi})"
        return f"{self.buffer} ({self.space})"


@dataclass(frozen=True)
class Counter:
    """Counter ``index``: bumped once by each of the ``threshold`` tasks of ``group``."""

    index: int
    group: str
    threshold: int
    regions: tuple[Region, ...] = ()


@dataclass(frozen=True)
class Wait:
    """Wait until counter ``counter`` reaches ``threshold`` (per launch)."""

    counter: int
    threshold: int

    def text(self, counters: Sequence[Counter]) -> str:
        """``"g3 >= 4"``: the group whose counter it waits on (``counters`` indexed by counter) and the count."""
        return f"{counters[self.counter].group} >= {self.threshold}"


@dataclass(frozen=True)
class Edge:
    """``consumer`` must follow ``producer``: ``kind`` is ``"RAW"``, ``"WAR"`` or ``"WAW"``,
    ``what`` names the memory (e.g. ``"h (arena bytes 0..512)"``)."""

    producer: str
    consumer: str
    kind: str
    what: str

    def __str__(self) -> str:
        return f"{self.kind} {self.producer} -> {self.consumer}: {self.what}"


@dataclass(frozen=True)
class Task:
    """Task number ``index`` (its place in the global order): work item ``item`` of ``group``."""

    index: int
    group: str
    item: int


@dataclass(frozen=True)
class TaskDAG:
    """Tasks, counters and waits of one schedule.

    * ``order``: group ids in the global topological order (stage by stage);
    * ``items``: group id -> number of tasks (work items);
    * ``counters``: one :class:`Counter` per group, ``counter_of``: group id -> counter index;
    * ``waits``: group id -> the :class:`Wait` records each of its tasks performs first;
    * ``edges``: every ordering the memory requires (before dropping implied waits);
    * ``stage_of``: group id -> its stage (tasks of one stage share a grid-stride loop);
    * ``arena``: the plan whose byte ranges were used;
    * ``unfenced``: groups whose tasks bump their counter without a release fence first (the
      bump may become visible before the tile's stores: a planted fault; empty as built);
    * ``skips``: ``(block, group)`` pairs: that block runs the group's tasks without their waits
      (a barrier or wait skipped by one block: a planted fault; empty as built);
    * ``epoch_step``: how far the epoch advances per launch (1: the kernel's exit count raises it
      once; 0: a replay reuses the last launch's epoch, a planted fault).
    """

    schedule: FusedSchedule = field(repr=False, compare=False)
    arena: ArenaPlan = field(repr=False, compare=False)
    order: tuple[str, ...]
    items: Mapping[str, int]
    counters: tuple[Counter, ...]
    counter_of: Mapping[str, int]
    waits: Mapping[str, tuple[Wait, ...]]
    edges: tuple[Edge, ...]
    stage_of: Mapping[str, int]
    unfenced: frozenset[str] = frozenset()
    skips: frozenset[tuple[int, str]] = frozenset()
    epoch_step: int = 1

    @property
    def tasks(self) -> list[Task]:
        """All tasks in the global order."""
        out, k = [], 0
        for g in self.order:
            for item in range(self.items[g]):
                out.append(Task(k, g, item))
                k += 1
        return out

    @property
    def num_tasks(self) -> int:
        return sum(self.items.values())

    def task_lists(self, blocks: int, rotations: Mapping[int, int] | None = None) -> list[list[Task]]:
        """The tasks each of ``blocks`` blocks runs, in order: per stage, the stage's tasks
        (its groups' items concatenated) dealt round-robin, as the kernel's grid-stride loops do
        (``rotations``: stage -> the block that gets the stage's first task, 0 in the kernel;
        other values model other assignments). Each list is a subsequence of the global order."""
        if blocks < 1:
            raise TkxError(f"a grid has at least one block, got {blocks}")
        lists: list[list[Task]] = [[] for _ in range(blocks)]
        stages: dict[int, list[Task]] = {}
        for t in self.tasks:
            stages.setdefault(self.stage_of[t.group], []).append(t)
        for si in sorted(stages):
            first = (rotations or {}).get(si, 0)
            for w, t in enumerate(stages[si]):
                lists[(w + first) % blocks].append(t)
        return lists

    def predecessors(self, gid: str) -> list[str]:
        return [self.counters[w.counter].group for w in self.waits[gid]]

    def with_waits(self, waits: Mapping[str, tuple[Wait, ...]]) -> TaskDAG:
        """A copy with other waits (for planting faults in tests)."""
        return replace(self, waits=dict(waits))

    def with_faults(self, *, unfenced: frozenset[str] | None = None,
                    skips: frozenset[tuple[int, str]] | None = None, epoch_step: int | None = None) -> TaskDAG:
        """A copy with planted protocol faults (see the class text); ``None`` keeps a field."""
        return replace(self, unfenced=self.unfenced if unfenced is None else frozenset(unfenced),
                       skips=self.skips if skips is None else frozenset(skips),
                       epoch_step=self.epoch_step if epoch_step is None else int(epoch_step))

    def with_arena(self, arena: ArenaPlan) -> TaskDAG:
        """A copy that keeps the waits but claims another arena plan (a planted reuse fault)."""
        return replace(self, arena=arena)

    def __str__(self) -> str:
        lines = [f"task DAG of {self.schedule.program.name}: {self.num_tasks} tasks in {len(self.order)} groups, "
                 f"{len(self.counters)} counters, {sum(len(w) for w in self.waits.values())} waits "
                 f"({len(self.edges)} memory orderings)"]
        for g in self.order:
            deps = ", ".join(w.text(self.counters) for w in self.waits[g]) or "none"
            lines.append(f"  {g:<6} {self.items[g]:>5} tasks  counter c{self.counter_of[g]}  waits: {deps}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<tkx.TaskDAG {self.schedule.program.name}: {self.num_tasks} tasks, {len(self.order)} groups, "
                f"{sum(len(w) for w in self.waits.values())} waits>")


def _home_region(s: FusedSchedule, arena: ArenaPlan, buf: str, home: Home) -> Region:
    if home.kind == "arena":
        slot = arena.slots[buf]
        return Region("arena", slot.offset, slot.offset + max(slot.nbytes, 1), buf)
    name = (s.program.outputs[home.index].name if home.kind == "output" else s.program.inputs[home.index].name)
    return Region(f"{'out' if home.kind == 'output' else 'in'}{home.index}", 0, WHOLE, name)


def _buffer_region(s: FusedSchedule, arena: ArenaPlan, buf: str, inputs: Mapping[str, int]) -> Region:
    if buf in inputs:
        k = inputs[buf]
        return Region(f"in{k}", 0, WHOLE, s.program.inputs[k].name)
    if buf in s.scratch:
        slot = arena.slots[buf]
        return Region("arena", slot.offset, slot.offset + max(slot.nbytes, 1), buf)
    home = s.homes.get(buf)
    if home is None:
        raise TkxError(f"task DAG: {buf} is read from memory but has no home")
    return _home_region(s, arena, buf, home)


def footprints(s: FusedSchedule, arena: ArenaPlan) -> dict[str, tuple[tuple[Region, ...], tuple[Region, ...]]]:
    """group id -> (regions it reads, regions it writes), from the schedule and ``arena``."""
    inputs = {i.value.buffer: k for k, i in enumerate(s.program.inputs)}
    copies = s.copies
    out: dict[str, tuple[tuple[Region, ...], tuple[Region, ...]]] = {}
    for gid, g in s.groups.items():
        reads = set(g.reads)
        partials = (g.params or {}).get("partials")
        if isinstance(partials, str) and g.kind not in ("reduction_partial", "attention_partial"):
            reads.add(partials)
        writes: list[Region] = []
        if g.kind == "copy":
            c = copies[gid]
            reads.add(c.src.buffer)
            writes.append(_home_region(s, arena, c.src.buffer, c.dst_home))
        for b in g.stores:
            if b in s.scratch:
                writes.append(_buffer_region(s, arena, b, inputs))
            else:
                writes.append(_home_region(s, arena, b, s.homes[b]))
        rs = tuple(sorted(_buffer_region(s, arena, b, inputs) for b in reads))
        out[gid] = (rs, tuple(sorted(writes)))
    return out


def _conflicts(a: tuple[tuple[Region, ...], tuple[Region, ...]],
               b: tuple[tuple[Region, ...], tuple[Region, ...]]) -> list[tuple[str, Region]]:
    """(kind, region) for each way later group ``b`` conflicts with earlier group ``a``."""
    (ra, wa), (rb, wb) = a, b
    out = []
    for x in wa:
        for y in rb:
            if x.overlaps(y):
                out.append(("RAW", y))
        for y in wb:
            if x.overlaps(y):
                out.append(("WAW", y))
    for x in ra:
        for y in wb:
            if x.overlaps(y):
                out.append(("WAR", y))
    return out


def hazards(s: FusedSchedule, arena: ArenaPlan, order: tuple[str, ...]) -> list[Edge]:
    """Every ordering memory requires between groups of ``order`` (earlier -> later)."""
    fp = footprints(s, arena)
    edges = []
    for j, b in enumerate(order):
        for a in order[:j]:
            seen = set()
            for kind, r in _conflicts(fp[a], fp[b]):
                key = (kind, str(r))
                if key not in seen:
                    seen.add(key)
                    edges.append(Edge(a, b, kind, str(r)))
    return edges


def build(s: FusedSchedule, arena: ArenaPlan, *, work_items: Mapping[str, int] | None = None,
          reduce: bool = True) -> TaskDAG:
    """The :class:`TaskDAG` of ``s`` with arena byte ranges from ``arena``.

    ``work_items``: group id -> number of tasks (default: each group's ``work_items``; the
    code generator passes the counts its emitters chose). ``reduce``: drop waits implied by
    others (transitive reduction). Groups of one stage must not conflict (the barrier
    schedule guarantees it; :func:`tkx.dataflow.check.check` reports it otherwise).
    """
    order = tuple(g for stage in s.stages for g in stage)
    stage_of = {g: i for i, stage in enumerate(s.stages) for g in stage}
    items = {g: max(1, int((work_items or {}).get(g, s.groups[g].work_items))) for g in order}
    edges = hazards(s, arena, order)
    preds: dict[str, set[str]] = {g: set() for g in order}
    for e in edges:
        if stage_of[e.producer] < stage_of[e.consumer]:
            preds[e.consumer].add(e.producer)
    if reduce:
        position = {g: i for i, g in enumerate(order)}
        ancestors: dict[str, set[str]] = {}
        for g in order:
            anc = set()
            for p in preds[g]:
                anc |= {p} | ancestors[p]
            ancestors[g] = anc
        for g in order:
            implied = set()
            for p in preds[g]:
                implied |= ancestors[p]
            preds[g] = {p for p in preds[g] if p not in implied}
            assert all(position[p] < position[g] for p in preds[g])
    fp = footprints(s, arena)
    counters = tuple(Counter(i, g, items[g], fp[g][1]) for i, g in enumerate(order))
    counter_of = {c.group: c.index for c in counters}
    waits = {g: tuple(Wait(counter_of[p], items[p]) for p in sorted(preds[g], key=order.index)) for g in order}
    return TaskDAG(s, arena, order, items, counters, counter_of, waits, tuple(edges), stage_of)


def group_of_task(dag: TaskDAG, task: int) -> tuple[Group, int]:
    """(group, item) of global task number ``task``."""
    k = task
    for g in dag.order:
        if k < dag.items[g]:
            return dag.schedule.groups[g], k
        k -= dag.items[g]
    raise TkxError(f"no task {task}: the DAG has {dag.num_tasks}")


def describe_stuck_wait(dag: TaskDAG, task: int, counter: int, value: int, block: int = -1) -> str:
    """A sentence for a wait that timed out: the task, the counter, its value and its threshold."""
    g, item = group_of_task(dag, task)
    c = dag.counters[counter] if 0 <= counter < len(dag.counters) else None
    what = (f"counter c{counter} of {c.group} ({c.threshold} tasks) stood at {value} of threshold {c.threshold}"
            if c else f"counter c{counter} stood at {value}")
    blk = f" on block {block}" if block >= 0 else ""
    return f"task {task} ({g.id} item {item}){blk} waited too long: {what}"

