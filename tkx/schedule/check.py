"""Static hazard checks of a schedule and its arena plan (no execution needed).

:func:`check_hazards` returns a list of problems (empty when sound):

* read-after-write: every value a group reads from memory is stored by a group of an
  earlier stage (or is a program input);
* write-after-read on user tensors: a group (or commit copy) that overwrites an input in
  place runs in a later stage than every other reader of the old value;
* arena reuse: no two arena slots that share bytes are live in a common stage;
* every output is written exactly once;
* views: every read of a stored value (a view with its own offset and strides) stays inside
  the memory of its root buffer, and an arena value's slot holds the whole root buffer.
"""

from __future__ import annotations

from ..arena import ArenaPlan
from ..arena import check as check_arena
from ..dtypes import DTYPE_BYTES
from .model import FusedSchedule


def check_hazards(s: FusedSchedule, arena: ArenaPlan | None = None) -> list[str]:
    problems: list[str] = []
    stage = {gid: i for i, st in enumerate(s.stages) for gid in st}
    inputs = {i.value.buffer: k for k, i in enumerate(s.program.inputs)}
    writer: dict[str, str] = {}
    for gid, g in s.groups.items():
        for b in g.stores:
            if b in writer:
                problems.append(f"{b} is stored by both {writer[b]} and {gid}")
            writer[b] = gid
    for gid, g in s.groups.items():
        for b in g.reads:
            if b in inputs:
                continue
            w = writer.get(b)
            if w is None:
                problems.append(f"{gid} reads {b}, which no group stores")
            elif stage[w] >= stage[gid]:
                problems.append(f"RAW {b}: {gid} (stage {stage[gid]}) reads it, {w} writes it in stage {stage[w]}")
    # In-place writes of user inputs: direct homes and commit copies.
    overwrites: list[tuple[int, str]] = [(h.index, writer[b]) for b, h in s.homes.items() if h.kind == "input"]
    overwrites += [(c.dst_home.index, gid) for gid, c in s.copies.items() if c.dst_home.kind == "input"]
    for idx, wgid in overwrites:
        buf = s.program.inputs[idx].value.buffer
        for gid, g in s.groups.items():
            if gid != wgid and buf in g.reads and stage[gid] >= stage[wgid]:
                problems.append(f"WAR {s.program.inputs[idx].name}: {gid} (stage {stage[gid]}) reads the old "
                                f"value, {wgid} overwrites it in stage {stage[wgid]}")
    written = [h.index for h in s.homes.values() if h.kind == "output"]
    written += [c.dst_home.index for c in s.copies.values() if c.dst_home.kind == "output"]
    for k in range(len(s.program.outputs)):
        n = written.count(k)
        if n != 1:
            problems.append(f"output {s.program.outputs[k].name} is written {n} times")
    problems.extend(_check_views(s, arena))
    if arena is not None:
        problems.extend(check_arena(arena))
        for b, h in s.homes.items():
            if h.kind == "arena" and b not in arena.slots:
                problems.append(f"{b} lives in the arena but has no slot")
    return problems


def _check_views(s: FusedSchedule, arena: ArenaPlan | None) -> list[str]:
    """Every operand read through memory (a view: offset + strides into its root buffer) must
    address elements ``0 .. numel-1`` of that root; an arena slot must hold the whole root."""
    problems: list[str] = []
    ops = {op.id: op for op in s.program.ops}
    roots = {i.value.buffer: i.value for i in s.program.inputs}
    roots.update({b: op.out for b, op in ops.items()})
    for op in s.program.ops:
        for x in op.inputs:
            if not hasattr(x, "buffer") or x.buffer not in roots or 0 in x.shape:
                continue
            root = roots[x.buffer]
            lo = x.offset + sum((d - 1) * st for d, st in zip(x.shape, x.strides) if st < 0)
            hi = x.offset + sum((d - 1) * st for d, st in zip(x.shape, x.strides) if st > 0)
            extent = _extent(root)
            if lo < 0 or hi >= extent:
                problems.append(f"{op.id} reads {x.buffer} through a view (offset {x.offset}, strides "
                                f"{tuple(x.strides)}, shape {tuple(x.shape)}) that reaches elements "
                                f"{lo}..{hi} outside its {extent} elements")
    if arena is not None:
        for b, slot in arena.slots.items():
            if b in ops and slot.kind == "value":
                need = _extent(ops[b].out) * DTYPE_BYTES.get(ops[b].out.dtype, 4)
                if slot.nbytes < need:
                    problems.append(f"arena slot of {b} holds {slot.nbytes} B but the value needs {need} B")
    return problems


def _extent(spec) -> int:
    """Elements of memory a root tensor spans (1 + its largest address)."""
    if 0 in spec.shape:
        return 0
    return spec.offset + 1 + sum((d - 1) * abs(st) for d, st in zip(spec.shape, spec.strides))
