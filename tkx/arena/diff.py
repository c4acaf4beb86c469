"""How two arena plans differ, as data (a :class:`~tkx.diff.StageDiff`): size, lower bound,
slots added, removed or moved, state updates."""

from __future__ import annotations

from typing import Any

from .. import display
from ..diff import StageDiff
from ..diff import arrow as _arrow
from . import ArenaPlan


@display.register(ArenaPlan, "diff")
def arena_diff(a: Any, b: Any) -> StageDiff:
    """Size, lower bound and slot changes (added, removed, moved, resized, lifetime)."""
    if not isinstance(b, ArenaPlan):
        raise TypeError(f"can only diff an ArenaPlan against an ArenaPlan, not {type(b).__name__}")
    summary = (_arrow("size", a.size_bytes, b.size_bytes), _arrow("lower bound", a.lower_bound_bytes,
                                                                    b.lower_bound_bytes),
               _arrow("without reuse", a.no_reuse_bytes, b.no_reuse_bytes), _arrow("slots", len(a.slots), len(b.slots)))
    added = [f"+ {k} @{s.offset} {s.nbytes} B stages {s.first}..{s.last}" for k, s in b.slots.items()
             if k not in a.slots]
    removed = [f"- {k} @{s.offset} {s.nbytes} B stages {s.first}..{s.last}" for k, s in a.slots.items()
               if k not in b.slots]
    moved = []
    for k, s in a.slots.items():
        t = b.slots.get(k)
        if t is None:
            continue
        what = []
        if s.offset != t.offset:
            what.append(f"offset {s.offset} -> {t.offset}")
        if s.nbytes != t.nbytes:
            what.append(f"bytes {s.nbytes} -> {t.nbytes}")
        if (s.first, s.last) != (t.first, t.last):
            what.append(f"stages {s.first}..{s.last} -> {t.first}..{t.last}")
        if what:
            moved.append(f"{k}: " + "; ".join(what))
    state: list[str] = []
    for label, old, new in (("in place", a.in_place, b.in_place), ("staged", a.staged, b.staged)):
        state += [f"- {label} {name}" for name in old if name not in new]
        state += [f"+ {label} {name}" for name in new if name not in old]
    sections = (("slots added", tuple(added)), ("slots removed", tuple(removed)), ("slots moved", tuple(moved)),
                ("state updates", tuple(state)))
    is_changed = bool(added or removed or moved or state) or any("(same)" not in x for x in summary)
    return StageDiff("arena diff", summary, sections, is_changed, {
        "slots_added": tuple(added), "slots_removed": tuple(removed), "moved": tuple(moved), "state": tuple(state)})

