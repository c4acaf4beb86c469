"""How two fused schedules differ, as data (a :class:`~tkx.diff.StageDiff`): groups added,
removed, changed or moved (matched by anchor op), decisions flipped, and the counts."""

from __future__ import annotations

from typing import Any

from .. import display
from ..diff import StageDiff
from ..diff import arrow as _arrow
from .model import FusedSchedule


def _group_sig(s: Any, g: Any) -> dict[str, Any]:
    params = {k: v for k, v in g.params.items() if k != "why"}
    return {"kind": g.kind, "stage": s.stage_of(g.id), "ops": g.ops, "inlined": g.inlined, "stores": g.stores,
            "work_items": g.work_items, "params": params}


@display.register(FusedSchedule, "diff")
def schedule_diff(a: Any, b: Any) -> StageDiff:
    """Groups added/removed/changed (matched by anchor op), decisions flipped, counts."""
    if not isinstance(b, FusedSchedule):
        raise TypeError(f"can only diff a FusedSchedule against a FusedSchedule, not {type(b).__name__}")

    def by_anchor(s: Any) -> dict[str, Any]:
        out = {}
        for g in s.groups_in_order():
            key = g.anchor if g.kind != "copy" else f"copy:{g.anchor}"
            out[key] = g
        return out

    ga, gb = by_anchor(a), by_anchor(b)
    added = [f"+ {g.id} {g.kind} {g.anchor}: {', '.join(g.ops) or g.anchor}" for k, g in gb.items() if k not in ga]
    removed = [f"- {g.id} {g.kind} {g.anchor}: {', '.join(g.ops) or g.anchor}" for k, g in ga.items() if k not in gb]
    changed, moved = [], []
    for k, g in ga.items():
        if k not in gb:
            continue
        h = gb[k]
        sa, sb = _group_sig(a, g), _group_sig(b, h)
        if sa == sb:
            continue
        what = []
        for f in ("kind", "stage", "ops", "inlined", "stores", "work_items", "params"):
            if sa[f] != sb[f]:
                x, y = sa[f], sb[f]
                if isinstance(x, tuple):
                    x, y = ",".join(x) or "-", ",".join(y) or "-"
                elif isinstance(x, dict):
                    keys = [q for q in sorted(set(x) | set(y)) if x.get(q) != y.get(q)]
                    x, y = (",".join(f"{q}={d.get(q)}" for q in keys) for d in (x, y))
                what.append(f"{f} {x} -> {y}")
        gid = g.id if g.id == h.id else f"{g.id}->{h.id}"
        if len(what) == 1 and what[0].startswith("stage "):
            moved.append(f"{gid} ({k}): {what[0]}")
        else:
            changed.append(f"{gid} ({k}): " + "; ".join(what))
    da = {(d.kind, d.producer, d.consumer): d for d in a.decisions}
    db = {(d.kind, d.producer, d.consumer): d for d in b.decisions}
    flipped = []
    for key, d in da.items():
        e = db.get(key)
        if e is not None and e.fused != d.fused:
            flipped.append(f"{'+' if e.fused else '-'} {d.kind} {d.producer} -> {d.consumer}: "
                           f"{'not fused' if not d.fused else 'fused'} -> {'fused' if e.fused else 'not fused'}"
                           f" ({e.rule}/{e.code}: {e.reason})")
    new = [f"+ {d.kind} {d.producer} -> {d.consumer}: {'fused' if d.fused else 'not fused'} ({d.reason})"
           for k, d in db.items() if k not in da]
    gone = [f"- {d.kind} {d.producer} -> {d.consumer}: {'fused' if d.fused else 'not fused'} ({d.reason})"
            for k, d in da.items() if k not in db]
    summary = (
        _arrow("groups", len(a.groups), len(b.groups)), _arrow("stages", len(a.stages), len(b.stages)),
        _arrow("barriers", a.num_barriers, b.num_barriers), _arrow("mode", a.mode, b.mode),
        _arrow("grid", f"{a.blocks}x{a.threads}", f"{b.blocks}x{b.threads}"),
        _arrow("not fused", len(a.why_not_fused()), len(b.why_not_fused())))
    sections = (("groups added", tuple(added)), ("groups removed", tuple(removed)),
                ("groups changed", tuple(changed)), ("groups moved to another stage", tuple(moved)),
                ("decisions flipped", tuple(flipped)),
                ("decisions new", tuple(new)), ("decisions gone", tuple(gone)))
    is_changed = bool(added or removed or changed or moved or flipped or new or gone) or any(
        "(same)" not in x for x in summary)
    return StageDiff(f"schedule diff {a.program.name}", summary, sections, is_changed, {
        "groups_added": tuple(added), "groups_removed": tuple(removed), "groups_changed": tuple(changed),
        "groups_moved": tuple(moved),
        "decisions_flipped": tuple(flipped), "decisions_new": tuple(new), "decisions_gone": tuple(gone)})

