"""Views of a :class:`~tkx.distributed.planner.DistributedPlan`: the split step, where the collective sits,
the bytes each bucket moves per step.

The text (``str(plan)``) and the HTML tell the same story in the same order: the batch and the replicated
inputs, program A (forward + backward) with its stages, the all-reduce buckets (members, dtype, payload,
ring bytes per rank, the stage of A after which each starts), program B (the update), and the values
kept per rank.
"""

from __future__ import annotations

from typing import Any

from .. import display
from ..distributed.planner import ALIGN_BYTES, DistributedPlan
from ..words import plural
from .base import esc, view
from .runtime_views import fmt_bytes

_EXECUTOR = {"schedule": "the schedule interpreter (what the kernels will do, stage by stage)",
             "reference": "the reference interpreter", "compiled": "the compiled kernels (one per program)"}


def _names(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items) - n} more)" if len(items) > n else "")


def _args_text(p: DistributedPlan, indices: tuple[int, ...]) -> str:
    """Replicated inputs grouped by argument: ``params (4 tensors), momentum_buf (4 tensors)``."""
    groups: dict[str, int] = {}
    for i in indices:
        name = p.split.program.inputs[i].name
        root = name.split("[", 1)[0]
        groups[root] = groups.get(root, 0) + 1
    return ", ".join(f"{k} ({plural(v, 'tensor')})" if v > 1 else k for k, v in groups.items()) or "none"


def _start(p: DistributedPlan, b: Any) -> str:
    stages = len(p.a.schedule.stages)
    if b.ready_stage is None or b.ready_stage >= stages - 1:
        return "after A"
    later = stages - 1 - b.ready_stage
    return f"after A's stage {b.ready_stage + 1}/{stages} (overlaps {plural(later, 'stage')})"


def _program_line(label: str, prog: Any, sched: Any) -> str:
    return (f"{label} {prog.name}: {plural(len(prog.ops), 'op')}, {plural(len(sched.stages), 'stage')}, "
            f"{plural(sched.num_barriers, 'barrier')}")


def format_plan(p: DistributedPlan) -> str:
    s = p.split
    grads = s.gradients
    lines = [f"tkx.distributed plan: {p.name}, data parallel on {plural(p.world_size, 'rank')} ({p.backend}), "
             f"run by {_EXECUTOR.get(p.executor, p.executor)}",
             f"  batch (per rank):  {_names(p.input_text(s.batch_inputs)) or 'none'}",
             f"  replicated:        {_args_text(p, s.replicated_inputs)} (broadcast from rank 0 at the first call)",
             "  " + _program_line("[A] forward + backward", p.a.program, p.a.schedule),
             f"        -> {plural(len(grads), 'gradient')} ({fmt_bytes(sum(c.nbytes for c in grads))})",
             f"  [all-reduce, average over {p.world_size}] {plural(len(p.buckets), 'bucket')} "
             f"(bucket_bytes {fmt_bytes(p.bucket_bytes)}): {fmt_bytes(p.bytes_per_step)} per step, each rank sends "
             f"{fmt_bytes(p.ring_bytes_per_rank)} (ring: 2(N-1)/N x bytes; each value padded to {ALIGN_BYTES} B)"]
    for b in p.buckets:
        members = [s.cut[k].name for k in b.members]
        lines.append(f"      bucket {b.index}  {b.dtype:<8} {fmt_bytes(b.nbytes):>20} (payload {b.payload_bytes:,} B)  "
                     f"sends {fmt_bytes(b.ring_bytes_per_rank)}  starts {_start(p, b)}: {_names(members, 4)}")
    lines.append("  " + _program_line("[B] update", p.b.program, p.b.schedule)
                 + f", reads {plural(len(s.averaged), 'averaged value')}")
    kept = [c for c in s.cut if c.reduce == "none"]
    if kept:
        lines.append(f"  kept per rank (not reduced): {_names([f'{c.name} ({c.kind})' for c in kept])}")
    return "\n".join(lines)


def plan_html(p: DistributedPlan) -> str:
    s = p.split
    grads = s.gradients
    head = (f'<div class="tkx-dim">data parallel on {esc(plural(p.world_size, "rank"))} ({esc(p.backend)}), run by '
            f'{esc(_EXECUTOR.get(p.executor, p.executor))}; batch per rank: '
            f'{esc(_names(p.input_text(s.batch_inputs)) or "none")}; replicated: '
            f'{esc(_args_text(p, s.replicated_inputs))}</div>')
    rows = [("A", "forward + backward", _program_line("", p.a.program, p.a.schedule).strip(),
             f"{plural(len(grads), 'gradient')}, {fmt_bytes(sum(c.nbytes for c in grads))}")]
    for b in p.buckets:
        members = [s.cut[k].name for k in b.members]
        rows.append((f"bucket {b.index}", f"all-reduce (average), {b.dtype}", _names(members, 8),
                     f"{fmt_bytes(b.nbytes)} (payload {b.payload_bytes:,} B); each rank sends "
                     f"{fmt_bytes(b.ring_bytes_per_rank)}; starts {_start(p, b)}"))
    rows.append(("B", "update", _program_line("", p.b.program, p.b.schedule).strip(),
                 f"reads {plural(len(s.averaged), 'averaged value')}"))
    body = "".join(f"<tr><th>{esc(a)}</th><td>{esc(b)}</td><td>{esc(c)}</td><td>{esc(d)}</td></tr>"
                   for a, b, c, d in rows)
    kept = [c for c in s.cut if c.reduce == "none"]
    foot = (f'<div class="tkx-dim">kept per rank: {esc(_names([f"{c.name} ({c.kind})" for c in kept]))}</div>'
            if kept else "")
    total = (f'<div>{esc(fmt_bytes(p.bytes_per_step))} all-reduced per step; each rank sends '
             f'{esc(fmt_bytes(p.ring_bytes_per_rank))} (ring all-reduce: 2(N-1)/N x bytes; each value starts at a '
             f'multiple of {ALIGN_BYTES} B)</div>')
    table = ("<table><thead><tr><th>where</th><th>what</th><th>holds</th><th>moves / reads</th></tr></thead>"
             f"<tbody>{body}</tbody></table>")
    return view("distributed", f"Distributed plan: {p.name}", head + table + total + foot, format_plan(p))


display.register(DistributedPlan, "text")(format_plan)
display.register(DistributedPlan, "html")(plan_html)
