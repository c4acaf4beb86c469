"""What selecting an op shows: its module, fusion group and stage, arena slot, CUDA lines and the
predicted µs of its group, as plain data shared by the exported report's side bar and the Explorer's
linked views (:func:`tkx.explorer.link_info`).

* :func:`group_times_us`: group id -> predicted µs, from a predicted :class:`~tkx.dataflow.timeline.Timeline`
  (the cost model driving the task VM: first start to last end of the group's tasks);
* :func:`op_facts`: one op's facts (a dict, see there);
* :func:`selection_facts`: per clickable key of the report (``op:<id>``, ``grp:<id>``), the rows the
  side bar lists under the selection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def group_times_us(timeline: Any) -> dict[str, float]:
    """Group id -> predicted µs of that group (its tasks' first start to last end) in ``timeline``, a
    :class:`~tkx.dataflow.timeline.Timeline` in ns; ``{}`` for one in VM events (no time)."""
    if getattr(timeline, "unit", "") != "ns":
        return {}
    return {g: t.duration / 1e3 for g, t in timeline.groups().items()}


def predicted_group_times(source: Any) -> dict[str, float]:
    """:func:`group_times_us` of the predicted timeline of ``source``: an :class:`~tkx.Exploration` (its
    cached ``timeline`` stage) or a :class:`~tkx.codegen.CudaSource`. ``{}`` when it cannot be predicted
    (the reason is not an error of the selection, so it is not raised)."""
    try:
        if hasattr(source, "_cache"):
            return group_times_us(source.timeline)
        from ..dataflow.timeline import predicted_timeline
        cuda = source if hasattr(source, "op_lines") else source.cuda
        return group_times_us(predicted_timeline(cuda))
    except Exception:  # a schedule the task VM cannot time: the selection still shows the rest
        return {}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def line_ranges(lines: list[int], most: int = 4) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"`` (at most ``most`` ranges, then ``"..."``)."""
    runs: list[list[int]] = []
    for n in sorted(lines):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    parts = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:most]]
    return ", ".join(parts) + (", ..." if len(runs) > most else "")


def op_facts(schedule: Any, arena: Any, cuda: Any, op_id: str,
             group_us: Mapping[str, float] | None = None) -> dict[str, Any] | None:
    """The facts of op ``op_id`` of ``schedule.program`` (``None`` when it is no op of it): ``op``,
    ``kind``, ``region``, ``module`` and ``module_type`` (``""`` outside every module), ``cuda_lines``
    (1-based, sorted), ``slot`` (its arena :class:`~tkx.arena.Slot` or ``None``), ``home`` (where its value
    lives, in words), ``group`` (the group that stores, computes or first inlines it; ``""`` for none),
    ``group_kind``, ``stage`` (-1 for none), ``groups`` (every group computing or inlining it),
    ``predicted_us`` (``group_us[group]``: µs, or ``None``) and ``text`` (one line saying all of it)."""
    try:
        op = schedule.program.op(op_id)
    except Exception:
        op = None
    if op is None:
        return None
    lines = sorted(cuda.op_lines.get(op_id, ()))
    slot = arena.slots.get(op_id)
    home = schedule.homes.get(op_id)
    if home is not None:
        where = str(home) if home.kind != "arena" else (f"arena bytes {slot.offset}..{slot.end}" if slot else "arena")
    elif op_id in schedule.inlined:
        where = "registers (inlined where read)"
    else:
        where = "registers (inside its group)"
    groups = [g.id for g in schedule.groups_in_order() if op_id in g.ops or op_id in g.inlined]
    try:
        group = schedule.group_of(op_id).id  # stores it, computes it, or (first in stage order) inlines it
    except KeyError:  # computed by no group: then `groups` is empty too
        group = ""
    stage = schedule.stage_of(group) if group else -1
    predicted = group_us.get(group) if group and group_us else None
    module = op.module or ""
    where_from = f", module {module}" + (f" ({op.module_type})" if op.module_type else "") if module else ""
    text = (f"{op_id} ({op.kind}, {op.region}{where_from}): group {group or '-'}, "
            f"stage {stage if stage >= 0 else '-'}"
            + (f", predicted {predicted:.2f} µs" if predicted is not None else "")
            + (f"; arena slot bytes {slot.offset}..{slot.end}" if slot is not None else f"; value in {where}")
            + f"; {_plural(len(lines), 'CUDA line')}"
            + (f" ({line_ranges(lines)})" if lines else ""))
    return {"op": op_id, "kind": op.kind, "region": op.region, "module": module, "module_type": op.module_type or "",
            "cuda_lines": lines, "slot": slot, "home": where, "group": group,
            "group_kind": schedule.groups[group].kind if group else "", "stage": stage, "groups": groups,
            "predicted_us": predicted, "text": text}


def _op_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    slot = f["slot"]
    rows = [("op", f"{f['op']} ({f['kind']}, {f['region']})")]
    if f["module"]:
        rows.append(("module", f["module"] + (f" · {f['module_type']}" if f["module_type"] else "")))
    if f["group"]:
        rows.append(("fusion group", f"{f['group']} ({f['group_kind']}), stage {f['stage']}"))
    else:
        rows.append(("fusion group", "none (computed by no group)"))
    if slot is not None:
        rows.append(("arena slot", f"bytes {slot.offset}..{slot.end} ({slot.nbytes} B), live stages "
                                   f"{slot.first}..{slot.last}"))
    else:
        rows.append(("arena slot", f"none: the value lives in {f['home']}"))
    lines = f["cuda_lines"]
    rows.append(("CUDA lines", f"{len(lines)}: {line_ranges(lines)}" if lines else "none of its own"))
    if f["predicted_us"] is not None:
        rows.append(("predicted", f"{f['predicted_us']:.2f} µs for group {f['group']} (cost model, no GPU)"))
    return rows


def selection_facts(schedule: Any, arena: Any, cuda: Any, group_us: Mapping[str, float]) -> dict[str, list[list[str]]]:
    """Per clickable key of the report, ``[[label, value], ...]`` the side bar lists when it is
    selected: for each op of the scheduled program (``op:<id>``) its module, fusion group and stage,
    arena slot, CUDA lines and predicted µs (:func:`op_facts`); for each group (``grp:<id>``) its kind,
    stage, ops, CUDA lines and predicted µs."""
    out: dict[str, list[list[str]]] = {}
    for op in schedule.program.ops:
        f = op_facts(schedule, arena, cuda, op.id, group_us)
        if f is not None:
            out[f"op:{op.id}"] = [list(r) for r in _op_rows(f)]
    for g in schedule.groups_in_order():
        rows = [["fusion group", f"{g.id} ({g.kind}), stage {schedule.stage_of(g.id)}"],
                ["ops", f"{len(g.ops)}" + (f" (+{len(g.inlined)} inlined)" if g.inlined else "")]]
        span = cuda.group_lines.get(g.id)
        if span:
            rows.append(["CUDA lines", f"{span[0]}-{span[1]}"])
        if g.id in group_us:
            rows.append(["predicted", f"{group_us[g.id]:.2f} µs (cost model, no GPU)"])
        out[f"grp:{g.id}"] = rows
    return out
