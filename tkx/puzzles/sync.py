"""Puzzles on synchronisation and memory: grid barriers, arena offsets, counter thresholds,
the waits of a task DAG and the per-block task order.

Each answer is run for real: a barrier placement or an arena layout through the schedule
interpreter (poisoned arena) and the task VM; thresholds, waits and orders through the static
checker (:func:`tkx.dataflow.check`) and the task VM under random interleavings.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from .core import Drawing, Puzzle, PuzzleError, interpreter_faults, replace_schedule, vm_faults, whole

__all__ = ["Barriers", "ArenaOffsets", "Thresholds", "Waits", "TaskOrder"]


def _flat(s: Any) -> list[str]:
    return [g for stage in s.stages for g in stage]


def _group_line(s: Any, g: str) -> str:
    grp = s.groups[g]
    return (f"{g:<5} {grp.kind:<18} reads {', '.join(grp.reads) or '-'}; "
            f"stores {', '.join(grp.stores) or '-'}")


class Barriers(Puzzle):
    """Place the fewest grid barriers: the groups run in the listed order; a barrier before
    group ``i`` (an index of that list) makes every block finish everything before ``i``.
    Answer: a sorted list of indices."""

    topic = "grid barriers"
    question = "Before which groups (indices of the list) must a grid barrier stand? Use as few as you can."

    def draw(self) -> Drawing:
        s = self.step.schedule
        lines = [f"{i:>3}  {_group_line(s, g)}" for i, g in enumerate(_flat(s))]
        return Drawing(f"{self.name}: {self.question}", "\n".join(lines), self.step.program)

    def blank(self) -> list[int]:
        return []

    def solution(self) -> list[int]:
        s = self.step.schedule
        out, k = [], 0
        for stage in s.stages[:-1]:
            k += len(stage)
            out.append(k)
        return out

    def stages_of(self, answer: Any) -> list[list[str]]:
        flat = _flat(self.step.schedule)
        try:
            cuts = sorted({whole(i, 'a barrier index') for i in answer})
        except (TypeError, ValueError, PuzzleError):
            raise PuzzleError(f"an answer is a list of whole group indices 1..{len(flat) - 1}, "
                              f"got {answer!r}") from None
        if any(not 0 < i < len(flat) for i in cuts):
            raise PuzzleError(f"barrier indices must lie in 1..{len(flat) - 1}, got {cuts}")
        bounds = [0, *cuts, len(flat)]
        return [flat[a:b] for a, b in zip(bounds, bounds[1:])]

    def judge(self, answer: Any) -> Any:
        from ..arena import plan
        from ..schedule.check import check_hazards

        st = self.step
        sched = replace_schedule(st.schedule, self.stages_of(answer))
        arena = plan(sched)
        problems = check_hazards(sched, arena)
        problems += interpreter_faults(st, sched, arena)
        if not problems:
            problems += vm_faults(st, st.dag(sched, arena))
        hint = ("a group that reads a value must sit after a barrier that follows the value's writer; "
                "look for the first 'reads' whose writer is in the same stretch")
        if problems and problems[0].startswith("RAW"):
            hint = f"{problems[0]}: put a barrier between them"
        return self.verdict(problems, {"barriers": (sched.num_barriers, st.schedule.num_barriers)}, hint)


class ArenaOffsets(Puzzle):
    """Assign each arena value a byte offset (a multiple of the alignment) so that values live
    in a common stage never share bytes; reuse bytes of values whose lifetimes end. Answer:
    ``{buffer: offset}``."""

    topic = "arena reuse"
    question = "Give every value a byte offset: live values must not overlap; reuse what you can."

    def draw(self) -> Drawing:
        a = self.step.arena
        lines = [f"alignment {a.alignment} bytes; stages 0..{len(a.schedule.stages) - 1}; "
                 f"lower bound {a.lower_bound_bytes} B, without reuse {a.no_reuse_bytes} B",
                 f"{'value':<16} {'bytes':>8}  live in stages"]
        for sl in sorted(a.slots.values(), key=lambda x: (x.first, x.buffer)):
            lines.append(f"{sl.buffer:<16} {sl.nbytes:>8}  {sl.first}..{sl.last}")
        return Drawing(f"{self.name}: {self.question}", "\n".join(lines))

    def blank(self) -> dict[str, int]:
        return {b: 0 for b in sorted(self.step.arena.slots)}

    def solution(self) -> dict[str, int]:
        return dict(sorted(self.step.arena.offsets.items()))

    def plan_of(self, answer: Any) -> Any:
        a = self.step.arena
        if not isinstance(answer, dict) or set(answer) != set(a.slots):
            raise PuzzleError(f"an answer maps every value {sorted(a.slots)} to an offset")
        slots = {}
        for b, sl in a.slots.items():
            off = answer[b]
            if not isinstance(off, int) or off < 0:
                raise PuzzleError(f"the offset of {b} must be a non-negative int, got {off!r}")
            slots[b] = dataclasses.replace(sl, offset=off)
        size = max((s.offset + s.nbytes for s in slots.values()), default=0)
        size = -(-size // a.alignment) * a.alignment
        return dataclasses.replace(a, slots=slots, size_bytes=size)

    def judge(self, answer: Any) -> Any:
        from ..arena import check as check_arena

        st = self.step
        plan = self.plan_of(answer)
        problems = check_arena(plan)
        problems += interpreter_faults(st, st.schedule, plan)
        if not problems:
            problems += vm_faults(st, st.dag(st.schedule, plan))
        hint = ("two values whose stage ranges intersect need disjoint bytes [offset, offset + bytes); "
                "a value may take the bytes of one whose last stage is before its first")
        return self.verdict(problems, {"arena bytes": (plan.size_bytes, st.arena.size_bytes)}, hint)


class _DagPuzzle(Puzzle):
    @property
    def dag(self) -> Any:
        return self.step.dag()

    def _tasks_text(self) -> list[str]:
        d, s = self.dag, self.step.schedule
        return [f"{g:<5} {d.items[g]:>4} tasks, counter c{d.counter_of[g]}; {_group_line(s, g)[6:]}" for g in d.order]

    def run_dag(self, dag: Any, score: dict, hint: str) -> Any:
        from .. import dataflow

        problems = dataflow.check(dag)
        problems += vm_faults(self.step, dag)
        return self.verdict(problems, score, hint)


class Thresholds(_DagPuzzle):
    """Write the counter thresholds: each task bumps its group's counter once after its tile is
    written; a waiting task proceeds when the counter reaches the threshold. Answer:
    ``{group: {producer group: threshold}}`` for the waits shown."""

    topic = "counter thresholds"
    question = "What threshold must each wait use?"

    def draw(self) -> Drawing:
        d = self.dag
        lines = self._tasks_text() + ["waits:"]
        for g in d.order:
            for w in d.waits[g]:
                lines.append(f"  {g} waits until counter c{w.counter} ({d.counters[w.counter].group}) >= ?")
        return Drawing(f"{self.name}: {self.question}", "\n".join(lines))

    def blank(self) -> dict[str, dict[str, int]]:
        d = self.dag
        return {g: {d.counters[w.counter].group: 0 for w in d.waits[g]} for g in d.order if d.waits[g]}

    def solution(self) -> dict[str, dict[str, int]]:
        d = self.dag
        return {g: {d.counters[w.counter].group: w.threshold for w in d.waits[g]} for g in d.order if d.waits[g]}

    def judge(self, answer: Any) -> Any:
        from ..dataflow.dag import Wait

        d = self.dag
        if not isinstance(answer, dict) or set(answer) != set(self.blank()):
            raise PuzzleError(f"an answer has the keys of p.blank(): {sorted(self.blank())}")
        waits = dict(d.waits)
        for g, per in answer.items():
            if not isinstance(per, dict) or set(per) != {d.counters[w.counter].group for w in d.waits[g]}:
                raise PuzzleError(f"{g}: give a threshold for each of {self.blank()[g]}")
            waits[g] = tuple(Wait(d.counter_of[p], whole(n, f'the threshold of {g} on {p}')) for p, n in per.items())
        hint = "a counter is bumped once per task of its group: a full wait's threshold is that group's task count"
        return self.run_dag(d.with_waits(waits), {}, hint)


class Waits(_DagPuzzle):
    """Choose which counters each group waits on (each wait's threshold is the producer's task
    count): every memory hazard must be ordered, with as few waits as possible. Answer:
    ``{group: [producer groups]}``."""

    topic = "task DAG waits"
    question = "Which groups must each group wait for? Every hazard ordered, as few waits as possible."

    def draw(self) -> Drawing:
        return Drawing(f"{self.name}: {self.question}", "\n".join(self._tasks_text()) +
                       f"\narena: {', '.join(f'{b}@{o}' for b, o in sorted(self.step.arena.offsets.items()))}")

    def blank(self) -> dict[str, list[str]]:
        return {g: [] for g in self.dag.order}

    def solution(self) -> dict[str, list[str]]:
        d = self.dag
        return {g: [d.counters[w.counter].group for w in d.waits[g]] for g in d.order}

    def judge(self, answer: Any) -> Any:
        from ..dataflow.dag import Wait

        d = self.dag
        if not isinstance(answer, dict) or not set(answer) <= set(d.order):
            raise PuzzleError(f"an answer maps groups of {list(d.order)} to lists of groups")
        waits = {g: () for g in d.order}
        for g, ps in answer.items():
            bad = [p for p in ps if p not in d.counter_of]
            if bad:
                raise PuzzleError(f"{g} waits on unknown groups {bad}")
            waits[g] = tuple(Wait(d.counter_of[p], d.items[p]) for p in ps)
        n = sum(len(w) for w in waits.values())
        hint = ("a group must wait for every earlier group that writes what it reads (RAW), reads what it "
                "overwrites (WAR: arena reuse!) or writes the same bytes (WAW); waits compose, so drop implied ones")
        return self.run_dag(d.with_waits(waits), {"waits": (n, sum(len(w) for w in d.waits.values()))}, hint)


class TaskOrder(_DagPuzzle):
    """Order the groups: every block runs its tasks in this one order (each group's tasks dealt
    round-robin over the blocks). A task that waits on a group queued behind it in some block's
    list can deadlock. Answer: a list of every group id."""

    topic = "deadlock-free task order"
    question = "In which order must every block run the groups so that no interleaving deadlocks?"

    def shuffled(self) -> list[str]:
        order = list(self.dag.order)
        random.Random(7).shuffle(order)
        return order

    def draw(self) -> Drawing:
        d = self.dag
        lines = [f"{g:<5} {d.items[g]:>4} tasks; waits for "
                 + (", ".join(w.text(d.counters) for w in d.waits[g]) or "nothing")
                 for g in self.shuffled()]
        return Drawing(f"{self.name}: {self.question}", "\n".join(lines))

    def blank(self) -> list[str]:
        return self.shuffled()

    def solution(self) -> list[str]:
        return list(self.dag.order)

    def judge(self, answer: Any) -> Any:
        d = self.dag
        if not isinstance(answer, (list, tuple)) or sorted(answer) != sorted(d.order):
            raise PuzzleError(f"an answer lists every group once: {sorted(d.order)}")
        order = tuple(answer)
        dag = dataclasses.replace(d, order=order, stage_of={g: i for i, g in enumerate(order)})
        hint = "a group may only wait on groups before it: order the groups topologically (producers first)"
        from .. import dataflow

        problems = [p for p in dataflow.check(dag) if p.startswith("deadlock")]
        problems += vm_faults(self.step, dag)
        return self.verdict(problems, {}, hint)
