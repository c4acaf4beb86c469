"""Gantt chart of a :class:`tkx.dataflow.timeline.Timeline`: rows are blocks, bars are tasks
coloured by group (hover shows group, item, task, start, end, wait); waits show as grey bars
before a task, barriers as gaps."""

from __future__ import annotations

from html import escape
from typing import Any

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")


def timeline_svg(tl: Any, width: int = 900, row: int = 14) -> str:
    """SVG text of ``tl`` (deterministic: colours follow the groups' first appearance)."""
    groups: list[str] = []
    for s in sorted(tl.spans, key=lambda s: (s.start, s.block)):
        if s.group not in groups:
            groups.append(s.group)
    colour = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
    left, top = 60, 20
    span = tl.makespan or 1.0
    scale = (width - left - 10) / span
    height = top + row * max(tl.blocks, 1) + 20 + 16 * ((len(groups) + 5) // 6)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="10">',
           f'<text x="4" y="12">{escape(tl.name)}: {len(tl.spans)} tasks, makespan {span:g} {tl.unit}</text>']
    for b in range(tl.blocks):
        out.append(f'<text x="4" y="{top + b * row + row - 4}">block {b}</text>')
    for s in tl.spans:
        y = top + s.block * row + 1
        if s.wait > 0:
            out.append(f'<rect x="{left + (s.start - s.wait) * scale:.2f}" y="{y}" width="{s.wait * scale:.2f}" '
                       f'height="{row - 2}" fill="#dddddd"/>')
        out.append(f'<rect x="{left + s.start * scale:.2f}" y="{y}" width="{max((s.end - s.start) * scale, 0.5):.2f}" '
                   f'height="{row - 2}" fill="{colour[s.group]}"><title>{escape(s.group)} item {s.item} '
                   f'(task {s.task}): {s.start:g}..{s.end:g} {tl.unit}, waited {s.wait:g}</title></rect>')
    y0 = top + row * max(tl.blocks, 1) + 14
    for i, g in enumerate(groups):
        x, y = left + (i % 6) * 130, y0 + 16 * (i // 6)
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour[g]}"/>'
                   f'<text x="{x + 14}" y="{y}">{escape(g)}</text>')
    out.append("</svg>")
    return "\n".join(out)
