"""Linked views: the IR listing and the CUDA source side by side, the arena and the schedule below.

Click an op (an IR row, a CUDA line, an arena block or a schedule group) and the widget
highlights the CUDA lines that compute it (:attr:`CudaSource.op_lines`), its arena block
(:attr:`ArenaPlan.slots`) and its schedule group and stage (:meth:`FusedSchedule.group_of`,
:meth:`FusedSchedule.stage_of`). The Python side owns the selection: the ``selected`` trait
(an op id) drives ``highlight``, so ``view.selected = "mm"`` does from Python what a click
does in the browser. :func:`link_data` and :func:`link_info` are the plain functions behind it.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from ..render.selection import op_facts, predicted_group_times
from .assets import read_asset


def _stages_of(ex: Any) -> tuple[Any, Any, Any]:
    """(schedule, arena, cuda) of an Exploration or a CudaSource."""
    cuda = getattr(ex, "cuda", None) if not hasattr(ex, "op_lines") else ex
    if cuda is None:
        raise TypeError(f"LinkedView needs a tkx.Exploration or a CudaSource, not {type(ex).__name__}")
    return cuda.schedule, cuda.arena, cuda


def link_data(ex: Any) -> dict[str, Any]:
    """Everything the front end draws: IR rows (``text``, ``op``, ``region``), CUDA lines,
    line -> op map, schedule stages with their groups, arena slots."""
    from ..printer import program_lines

    sched, arena, cuda = _stages_of(ex)
    program = sched.program
    ops = iter(program.ops)
    ir_rows = []
    for kind, text, region in program_lines(program):
        op = next(ops) if kind == "op" else None
        ir_rows.append({"text": text, "op": op.id if op else "", "region": region or "",
                        "module": (op.module or "") if op else ""})
    line_ops: dict[str, str] = {}
    for op_id, lines in cuda.op_lines.items():
        for n in lines:
            line_ops.setdefault(str(n), op_id)
    stages = [{"stage": i, "groups": [{"id": g, "kind": sched.groups[g].kind, "anchor": sched.groups[g].anchor,
                                       "ops": list(sched.groups[g].ops)} for g in stage]}
              for i, stage in enumerate(sched.stages)]
    slots = [{"buffer": s.buffer, "offset": s.offset, "nbytes": s.nbytes, "first": s.first, "last": s.last,
              "kind": s.kind} for s in sorted(arena.slots.values(), key=lambda s: (s.offset, s.first))]
    return {"ir_rows": ir_rows, "cuda_lines": cuda.text.split("\n"), "line_ops": line_ops, "stages": stages,
            "slots": slots, "arena_bytes": int(arena.size_bytes), "num_stages": len(sched.stages),
            "title": f"{program.name}: {_plural(len(program.ops), 'op')}, {_plural(len(sched.groups), 'group')}, "
                     f"{_plural(len(sched.stages), 'stage')}, arena {arena.size_bytes} B, "
                     f"{_plural(cuda.num_lines, 'CUDA line')}"}


def link_info(ex: Any, op_id: str, group_us: dict[str, float] | None = None) -> dict[str, Any]:
    """What selecting ``op_id`` highlights: ``cuda_lines`` (1-based), ``arena`` (its slot as a
    dict, or ``None``), ``home`` (where its value lives), ``group``/``stage`` (the group that
    stores or computes it), ``groups`` (every group computing or inlining it), ``ops`` and
    ``slots`` (every op and arena slot lit), ``module`` (its ``nn.Module`` path, ``""`` for none),
    ``predicted_us`` (the cost model's µs of its group, or ``None``), ``text`` (one line saying
    all of it). ``"line:<n>"`` selects a CUDA line (its ops, group and arena slots) and
    ``"slot:<buffer>"`` an arena slot (its op and lines). ``group_us``: group id -> predicted µs
    (default: from the predicted timeline, :func:`tkx.render.selection.predicted_group_times`)."""
    sched, arena, cuda = _stages_of(ex)
    if not op_id:
        return {"op": "", "cuda_lines": [], "arena": None, "home": "", "group": "", "stage": -1, "groups": [],
                "text": "", "ops": [], "slots": []}
    if op_id.startswith("line:"):
        return _line_info(sched, arena, cuda, op_id)
    if op_id.startswith("slot:"):
        return _slot_info(sched, arena, cuda, op_id[5:])
    if group_us is None:
        group_us = predicted_group_times(ex)
    f = op_facts(sched, arena, cuda, op_id, group_us)
    if f is None:
        return {"op": op_id, "cuda_lines": [], "arena": None, "home": "", "group": "", "stage": -1, "groups": [],
                "text": f"{op_id}: not an op of the scheduled program"}
    slot = f["slot"]
    return {"op": op_id, "cuda_lines": f["cuda_lines"], "arena": None if slot is None else _slot_dict(slot),
            "home": f["home"], "group": f["group"], "stage": f["stage"], "groups": f["groups"],
            "module": f["module"], "predicted_us": f["predicted_us"], "text": f["text"], "ops": [op_id],
            "slots": [slot.buffer] if slot else []}


def _slot_dict(slot: Any) -> dict[str, Any]:
    return {"buffer": slot.buffer, "offset": slot.offset, "nbytes": slot.nbytes, "first": slot.first,
            "last": slot.last, "kind": slot.kind}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _line_info(sched: Any, arena: Any, cuda: Any, key: str) -> dict[str, Any]:
    """What selecting CUDA line ``line:N`` highlights: its ops, its group(s), the arena slots it
    reads or writes."""
    try:
        n = int(key[5:])
    except ValueError:
        return {"op": "", "cuda_lines": [], "arena": None, "home": "", "group": "", "stage": -1, "groups": [],
                "text": f"{key}: not a CUDA line (use line:<number>)", "ops": [], "slots": []}
    ops = sorted(o for o, nums in cuda.op_lines.items() if n in nums)
    groups = [g for g, (a, b) in cuda.group_lines.items() if a <= n <= b]
    slots = sorted(b for b, nums in cuda.arena_lines.items() if n in nums)
    group = groups[0] if groups else ""
    stage = sched.stage_of(group) if group else -1
    text = (f"CUDA line {n}: " + (f"op {', '.join(ops)}" if ops else "no op of its own")
            + (f", group {group} (stage {stage})" if group else ", outside every group (a prelude or helper line)")
            + (f", arena {', '.join(slots)}" if slots else ""))
    slot = _slot_dict(arena.slots[slots[0]]) if slots else None
    return {"op": ops[0] if ops else "", "cuda_lines": [n], "arena": slot, "home": "", "group": group,
            "stage": stage, "groups": groups, "text": text, "ops": ops, "slots": slots}


def _slot_info(sched: Any, arena: Any, cuda: Any, buffer: str) -> dict[str, Any]:
    """What selecting arena slot ``slot:BUF`` highlights: the op that produced it, the CUDA
    lines that read or write it, the groups that write and read it."""
    slot = arena.slots.get(buffer)
    if slot is None:
        return {"op": "", "cuda_lines": [], "arena": None, "home": "", "group": "", "stage": -1, "groups": [],
                "text": f"{buffer}: not an arena slot (the slots: {', '.join(arena.slots) or 'none'})",
                "ops": [], "slots": []}
    ops = [buffer] if any(o.id == buffer for o in sched.program.ops) else []
    lines = sorted(cuda.arena_lines.get(buffer, ()))
    groups = [g.id for g in sched.groups_in_order() if buffer in g.stores or buffer in g.reads]
    group = next((g.id for g in sched.groups_in_order() if buffer in g.stores), groups[0] if groups else "")
    stage = sched.stage_of(group) if group else -1
    text = (f"arena slot {buffer}: bytes {slot.offset}..{slot.offset + slot.nbytes}, stages {slot.first}..{slot.last}"
            f", written by {group or '-'}, {_plural(len(lines), 'CUDA line')}")
    return {"op": ops[0] if ops else "", "cuda_lines": lines, "arena": _slot_dict(slot), "home": "arena",
            "group": group, "stage": stage, "groups": groups, "text": text, "ops": ops, "slots": [buffer]}


class LinkedView(anywidget.AnyWidget):
    """IR | CUDA side by side, arena and schedule below; click anything to see what it links to.

    ``LinkedView(exploration)`` (or a :class:`~tkx.codegen.CudaSource`). Set ``selected`` to an
    op id, ``"line:<n>"`` (a CUDA line: its ops, group and arena slots) or ``"slot:<buffer>"``
    (an arena slot: its op and the CUDA lines that touch it) to select it from Python; read
    ``highlight`` (see :func:`link_info`) or :attr:`highlighted_lines`.
    """

    _esm = read_asset("linked.js")
    _css = read_asset("linked.css")

    data = traitlets.Dict().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    highlight = traitlets.Dict().tag(sync=True)

    def __init__(self, source: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._source = source
        self._group_us: dict[str, float] | None = None  # predicted µs per group, at the first op selected
        self.data = link_data(source)
        self.highlight = link_info(source, self.selected, self._times())

    def set_source(self, source: Any) -> None:
        """Show another exploration (the selection is kept when the op still exists)."""
        self._source = source
        self._group_us = None
        with self.hold_sync():
            self.data = link_data(source)
            self.highlight = link_info(source, self.selected, self._times())

    @traitlets.observe("selected")
    def _on_selected(self, change: dict[str, Any]) -> None:
        self.highlight = link_info(self._source, change["new"], self._times())

    def _times(self) -> dict[str, float] | None:
        """Group id -> predicted µs, computed once per source when an op is first selected (an
        empty selection needs none, so an update of the Explorer does not time the kernel)."""
        if self._group_us is None and self.selected and ":" not in self.selected:
            self._group_us = predicted_group_times(self._source)
        return self._group_us

    @property
    def highlighted_lines(self) -> list[int]:
        """CUDA line numbers (1-based) highlighted for the selected op."""
        return list(self.highlight.get("cuda_lines", []))
