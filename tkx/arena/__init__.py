"""The arena planner: one workspace for every value the kernel stores outside user tensors.

``plan(schedule) -> ArenaPlan``. Each arena value (and each scratch buffer of a two-phase
reduction) is live from the stage that writes it to the last stage that reads it. Two
values may share bytes only when their live intervals are disjoint *as stages*: the barrier
between the last read of one and the first write of the other is what makes the reuse
safe (no write-after-read or write-after-write hazard inside a stage).

Offsets are chosen best-fit (the smallest gap that fits among the values live at the same
time), aligned to :data:`ALIGN` bytes so every dtype and 16-byte vector access is aligned.
The plan reports its size against two yardsticks: the lower bound (the most bytes live in
any one stage) and the size with no reuse at all.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import display
from ..errors import TkxError
from ..schedule.model import FusedSchedule
from ..words import plural

#: Byte alignment of every slot (a 128-byte line keeps each value on its own cache lines).
ALIGN = 128


class StageIndexError(TkxError, IndexError):
    """A stage index outside ``0..len(schedule.stages) - 1``."""


@dataclass(frozen=True)
class Slot:
    """One value's place in the arena: byte ``offset`` and ``nbytes``, live stages
    ``first``..``last`` (inclusive), ``kind`` ``"value"`` or ``"scratch"``, its dtype."""

    buffer: str
    offset: int
    nbytes: int
    first: int
    last: int
    kind: str
    dtype: str

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def overlaps_in_time(self, other: Slot) -> bool:
        return not (self.last < other.first or other.last < self.first)

    def overlaps_in_space(self, other: Slot) -> bool:
        return self.offset < other.end and other.offset < self.end


@dataclass(frozen=True)
class ArenaPlan:
    """Where every arena value lives.

    ``slots``: buffer -> :class:`Slot`; ``size_bytes``: the arena size; ``lower_bound_bytes``:
    the most (aligned) bytes live in any one stage - no plan can be smaller;
    ``no_reuse_bytes``: the size if nothing were reused; ``in_place``: input names updated in
    place, ``staged``: input names updated through a staged commit.
    """

    schedule: FusedSchedule = field(repr=False, compare=False)
    slots: Mapping[str, Slot]
    size_bytes: int
    lower_bound_bytes: int
    no_reuse_bytes: int
    in_place: tuple[str, ...]
    staged: tuple[str, ...]
    alignment: int = ALIGN

    @property
    def offsets(self) -> dict[str, int]:
        """buffer -> byte offset in the arena."""
        return {b: s.offset for b, s in self.slots.items()}

    def offset(self, buffer: str) -> int:
        return self.slots[buffer].offset

    def live_at(self, stage: int) -> list[Slot]:
        """The slots live in stage ``stage`` (``0..len(schedule.stages) - 1``; another index raises
        :class:`StageIndexError`, an ``IndexError``)."""
        n = len(self.schedule.stages)
        where = f"arena plan of {self.schedule.program.name}"
        if isinstance(stage, str) and stage in self.schedule.groups:
            raise StageIndexError(f"live_at takes a stage index, got group id {stage!r}; "
                                  f"use plan.live_at(plan.schedule.stage_of({stage!r}))")
        try:
            stage = operator.index(stage)
        except TypeError:
            raise StageIndexError(f"live_at takes a stage index (an int in 0..{n - 1}), got {stage!r}") from None
        if not 0 <= stage < n:
            raise StageIndexError(f"no stage {stage} in the {where}: it has {n} stages, 0..{n - 1}")
        return [s for s in self.slots.values() if s.first <= stage <= s.last]

    def __str__(self) -> str:
        def kib(n: int) -> str:
            return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"
        lines = [f"arena: {kib(self.size_bytes)} for {plural(len(self.slots), 'value')} "
                 f"(lower bound {kib(self.lower_bound_bytes)}, without reuse {kib(self.no_reuse_bytes)}), "
                 f"{self.alignment}-byte aligned"]
        if self.in_place:
            lines.append(f"  written in place (last read proven): {', '.join(self.in_place)}")
        if self.staged:
            lines.append(f"  staged commits (copied after the last read): {', '.join(self.staged)}")
        lines.append(f"  {'value':<22} {'offset':>10} {'bytes':>10}  stages")
        for s in sorted(self.slots.values(), key=lambda s: (s.offset, s.first)):
            lines.append(f"  {s.buffer:<22} {s.offset:>10} {s.nbytes:>10}  {s.first}..{s.last}"
                         + ("  (scratch)" if s.kind == "scratch" else ""))
        return "\n".join(lines)

    # -- views, looked up in tkx.display (tkx.render registers them) ----------------------
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)

    def svg(self) -> str:
        """The memory timeline as SVG text (x = stage, y = byte offset)."""
        return display.lookup(self, "svg")(self)

    def diff(self, other: ArenaPlan) -> Any:
        """A :class:`~tkx.diff.StageDiff` (computed in :mod:`tkx.arena.diff`): size, lower bound
        and slot changes (added, removed, moved)."""
        return display.diff(self, other)

    def __rich__(self) -> Any:
        return display.rich(self)

    def __repr__(self) -> str:
        return (f"<tkx.ArenaPlan {plural(len(self.slots), 'slot')}, {self.size_bytes} B "
                f"(lower bound {self.lower_bound_bytes} B, no reuse {self.no_reuse_bytes} B)>")


def _aligned(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


def live_intervals(schedule: FusedSchedule) -> dict[str, tuple[int, int, int, str, str]]:
    """buffer -> (first stage, last stage, bytes, kind, dtype) for every arena value."""
    stage_of = {gid: i for i, stage in enumerate(schedule.stages) for gid in stage}
    out: dict[str, tuple[int, int, int, str, str]] = {}
    writers: dict[str, int] = {}
    for gid, grp in schedule.groups.items():
        for s in grp.stores:
            writers[s] = stage_of[gid]
    last: dict[str, int] = {}
    for gid, grp in schedule.groups.items():
        for b in grp.reads:
            last[b] = max(last.get(b, -1), stage_of[gid])
    for buf, home in schedule.homes.items():
        if home.kind != "arena":
            continue
        op = schedule.program.op(buf)
        first = writers[buf]
        out[buf] = (first, max(last.get(buf, first), first), op.out.nbytes, "value", op.out.dtype)
    for buf, nbytes in schedule.scratch.items():
        first = writers[buf]
        out[buf] = (first, max(last.get(buf, first), first), nbytes, "scratch", "float32")
    return out


def plan(schedule: FusedSchedule, options: Any = None) -> ArenaPlan:
    """Place every arena value of ``schedule`` (best fit, :data:`ALIGN`-byte aligned)."""
    intervals = live_intervals(schedule)
    order = sorted(intervals, key=lambda b: (intervals[b][0], -intervals[b][2], b))
    placed: list[Slot] = []
    for buf in order:
        first, last, nbytes, kind, dtype = intervals[buf]
        size = _aligned(nbytes)
        busy = sorted((s for s in placed if not (s.last < first or last < s.first)), key=lambda s: s.offset)
        best, best_gap, cursor = None, None, 0
        for s in busy:
            gap = s.offset - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, _aligned(s.end) if s.end % ALIGN else s.end)
        offset = best if best is not None else cursor
        placed.append(Slot(buf, offset, nbytes, first, last, kind, dtype))
    slots = {s.buffer: s for s in placed}
    size = max((_aligned(s.end) for s in placed), default=0)
    nstages = len(schedule.stages)
    lower = max((sum(_aligned(s.nbytes) for s in placed if s.first <= k <= s.last) for k in range(nstages)),
                default=0)
    no_reuse = sum(_aligned(s.nbytes) for s in placed)
    names = [i.name for i in schedule.program.inputs]
    in_place = tuple(names[h.index] for h in schedule.homes.values() if h.kind == "input")
    staged = tuple(names[c.dst_home.index] for c in schedule.copies.values() if c.dst_home.kind == "input")
    return ArenaPlan(schedule, slots, size, lower, no_reuse, in_place, staged)


def check(plan_: ArenaPlan) -> list[str]:
    """Problems with a plan (empty when sound): overlapping live values, misalignment."""
    problems = []
    slots = list(plan_.slots.values())
    for i, a in enumerate(slots):
        if a.offset % plan_.alignment:
            problems.append(f"{a.buffer} is not {plan_.alignment}-byte aligned")
        if a.end > plan_.size_bytes:
            problems.append(f"{a.buffer} ends past the arena")
        for b in slots[i + 1:]:
            if a.overlaps_in_time(b) and a.overlaps_in_space(b):
                problems.append(f"{a.buffer} and {b.buffer} are live together and overlap")
    return problems
