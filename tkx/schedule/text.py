"""Plain-text rendering of a :class:`FusedSchedule` (deterministic; used by ``__str__``)."""

from __future__ import annotations

from typing import Any

from ..target.gemm import has_tiles
from ..words import plural

#: :class:`~tkx.schedule.model.FusedSchedule` and :class:`~tkx.schedule.model.Group` (not imported:
#: the model's ``__str__`` calls this module, so it must not import the model back).
FusedSchedule = Group = Any


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def group_modules(s: FusedSchedule, g: Group) -> list[str]:
    """The ``nn.Module`` paths of a group's ops (anchor first, then the rest in op order; the root
    module as ``""``); empty when none came from a module."""
    by_id = {op.id: op for op in s.program.ops}
    found = [by_id[o].module for o in (g.anchor, *g.ops, *g.inlined) if o in by_id and by_id[o].module is not None]
    return list(dict.fromkeys(found))


def module_note(s: FusedSchedule, g: Group) -> str:
    """``"[blocks.1.attn]"`` (``"[blocks.1.attn +2]"`` when the group spans more modules); ``""`` when none."""
    mods = group_modules(s, g)
    if not mods:
        return ""
    first = mods[0] or (s.program.modules.get("", None) or "root")
    return f"[{first}{f' +{len(mods) - 1}' if len(mods) > 1 else ''}]"


def describe_group(s: FusedSchedule, g: Group) -> str:
    """One line saying what a group computes and how."""
    p = g.params
    if g.kind == "copy":
        task = s.copies[g.id]
        return f"copy {task.src.buffer} -> {task.dst_home} ({p.get('numel')} elements)"
    anchor = s.program.op(g.anchor)
    if g.kind in ("gemm", "gemm_partial"):
        head = (f"{anchor.kind} {anchor.id} [{p['batch']}x] {p['m']}x{p['k']} @ {p['k']}x{p['n']}"
                if p["batch"] > 1 else f"{anchor.kind} {anchor.id} {p['m']}x{p['k']} @ {p['k']}x{p['n']}")
        head += f"  {p['impl']}"
        if has_tiles(str(p["impl"])):
            head += f" tile {p['tile_m']}x{p['tile_n']}x{p['tile_k']}"
        if p.get("split_k", 1) > 1:
            head += (f" split-K {p['split_k']} slices" if g.kind == "gemm_partial"
                     else f" split-K {p['split_k']} slices, the last of a tile adds them"
                     if p.get("split_final") == "last-slice" else f" (adds {p['split_k']} split-K slices)")
    elif g.kind in ("reduction", "reduction_partial"):
        what = "partial " if g.kind == "reduction_partial" else ""
        head = (f"{what}{anchor.kind} {anchor.id} {plural(p['rows'], 'row')} x {p['size']}  {p['strategy']}"
                + (f" ({p['parts']} parts)" if "parts" in p else "")
                + ("" if g.kind == "reduction_partial" or "parts" not in p else " final"))
    elif g.kind in ("attention", "attention_partial"):
        head = (f"fused {anchor.kind} {anchor.id} [{p['batch']}x] {p['q_len']}x{p['head_dim']} over {p['kv_len']} keys"
                f"  {p['impl']} tiles {p['tile_q']}x{p['tile_k']}" + (" causal" if p["causal"] else "")
                + (f" {p['mask']} mask" if p["mask"] != "none" else ""))
        if p["impl"] == "flash_decode":
            head += (f" phase 1: {-(-p['kv_len'] // p['tile_k'])} KV tiles" if g.kind == "attention_partial"
                     else " phase 2: combine")
    else:
        head = f"pointwise {anchor.id} {_shape(anchor.out.shape)}"
        if p.get("slice_write"):
            head += f" (slice write of {p['numel']} values in place)"
        if p.get("per_thread"):
            head += f", {p['per_thread']} per thread"
    parts = [head, plural(g.work_items, "item")]
    extra = [o for o in g.ops[1:]] if g.kind != "pointwise" else list(g.ops[1:])
    if extra:
        parts.append(("epilogue " if g.kind != "pointwise" else "+ loop ") + ", ".join(extra))
    if g.inlined:
        parts.append("inlined " + ", ".join(g.inlined))
    stores = [f"{b}->{s.homes[b]}" if b in s.homes else f"{b}->arena" for b in g.stores]
    parts.append("stores " + ", ".join(stores))
    return "; ".join(parts)


def format_schedule(s: FusedSchedule) -> str:
    lines = [f"schedule {s.program.name}: {plural(len(s.groups), 'group')} in {plural(len(s.stages), 'stage')}, "
             f"{plural(s.num_barriers, 'barrier')} ({'__syncthreads' if s.mode == 'block' else 'grid barriers'}), "
             f"{plural(s.blocks, 'block')} x {s.threads} threads",
             f"  mode: {s.mode_reason}"]
    for i, stage in enumerate(s.stages):
        if i > 0:
            b = s.barriers[i - 1]
            lines.append(f"  -- barrier ({b.kind}): {'; '.join(b.hazards[:3])}"
                         + (f" (+{len(b.hazards) - 3} more)" if len(b.hazards) > 3 else ""))
        lines.append(f"  stage {i}:")
        for gid in stage:
            note = module_note(s, s.groups[gid])
            lines.append(f"    {gid:<5} {describe_group(s, s.groups[gid])}" + (f"  {note}" if note else ""))
    not_fused = s.why_not_fused()
    if not_fused:
        lines.append("  not fused:")
        for d in not_fused:
            lines.append(f"    {d.kind:<9} {d.producer} -> {d.consumer}: {d.reason} [{d.rule}/{d.code}]")
    return "\n".join(lines)
