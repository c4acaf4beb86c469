"""Gantt charts of :class:`tkx.dataflow.timeline.Timeline`, measured and predicted alike.

Rows are blocks, bars are tasks coloured by group (hover shows group, item, task, start, end, wait);
waits show as grey bars before a task, barriers as gaps, the critical path (when known) with a black
outline. A timeline with more than :data:`MAX_BARS` tasks or :data:`MAX_ROWS` blocks is drawn one row
per group instead (a bar from the group's first start to its last end, shaded by how busy its blocks
were, labelled with its task count): every task is counted, none is dropped. :func:`timeline_html`
adds the µs of every group; :func:`comparison_html` draws a prediction and a measurement on one time
scale with the error of each group.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from ..words import plural

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
#: Above this many tasks (or :data:`MAX_ROWS` blocks) a chart draws one row per group.
MAX_BARS = 4000
MAX_ROWS = 64
#: Above this many rows the time axis is drawn above the rows too.
TOP_AXIS_ROWS = 40


def _colours(*tls: Any) -> dict[str, str]:
    """Group -> colour in the order groups first appear (in the first timeline, then the next): two
    timelines of one kernel drawn with one mapping show each group in the same colour."""
    groups: list[str] = []
    for tl in tls:
        for s in sorted(tl.spans, key=lambda s: (s.start, s.block)):
            if s.group not in groups:
                groups.append(s.group)
    return {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}


def _fmt(x: float, unit: str) -> str:
    """A time in the chart's words: ns become µs."""
    if unit == "ns":
        us = x / 1e3
        return f"{us:.3g} µs" if us < 100 else f"{us:.0f} µs"
    return f"{x:g} {unit}"


def _ticks(span: float) -> list[float]:
    """About six round tick positions in ``[0, span]``."""
    if span <= 0:
        return [0.0]
    raw = span / 6
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [k * step for k in range(int(span / step) + 1)]


def aggregated(tl: Any) -> bool:
    """Whether ``tl`` is drawn one row per group (too many tasks or blocks for one bar each)."""
    return len(tl.spans) > MAX_BARS or tl.blocks > MAX_ROWS


def timeline_svg(tl: Any, width: int = 900, row: int = 14, span: float | None = None,
                 colours: dict[str, str] | None = None) -> str:
    """SVG text of ``tl`` (deterministic: colours follow the groups' first appearance). ``span``: the
    time the axis covers (default the makespan), so that two timelines can share one scale; ``colours``:
    a group -> colour mapping to share with another chart (default: this timeline's own)."""
    colour = colours if colours is not None else _colours(tl)
    groups = [g for g in colour if any(s.group == g for s in tl.spans)] if colours is not None else list(colour)
    critical = set(tl.critical)
    agg = aggregated(tl)
    rows = len(groups) if agg else max(tl.blocks, 1)
    # a chart taller than a screen repeats the time axis above its rows, so its first screen has a scale
    top_axis = rows > TOP_AXIS_ROWS
    left, top = 70, 34 if top_axis else 22
    span = span or tl.makespan or 1.0
    scale = (width - left - 10) / span
    legend_rows = 0 if agg else (len(groups) + 5) // 6
    axis_y = top + row * rows + 12
    height = axis_y + 12 + 16 * legend_rows + 6
    kind = getattr(tl, "kind", "")
    label = {"predicted": "predicted", "measured": "measured"}.get(kind, "")
    head = (f"{escape(tl.name)}: {label + ' - ' if label else ''}{plural(len(tl.spans), 'task')} on "
            f"{plural(tl.blocks, 'block')}, "
            f"makespan {_fmt(tl.makespan, tl.unit)}" + (" (one row per group)" if agg else "")
            + (", critical path outlined" if critical else ""))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="10" data-tkx-timeline="{escape(kind)}">',
           f'<text x="4" y="12" font-weight="bold">{head}</text>']
    if agg:
        out += _group_rows(tl, groups, colour, critical, left, top, row, scale)
    else:
        out += _block_rows(tl, colour, critical, left, top, row, scale)
    for t in _ticks(span):
        x = left + t * scale
        out.append(f'<line x1="{x:.2f}" y1="{top}" x2="{x:.2f}" y2="{axis_y - 9}" stroke="#d0d7de" '
                   f'stroke-width="0.5"/><text x="{x:.2f}" y="{axis_y}" text-anchor="middle">{_fmt(t, tl.unit)}</text>')
        if top_axis:
            out.append(f'<text x="{x:.2f}" y="{top - 4}" text-anchor="middle">{_fmt(t, tl.unit)}</text>')
    y0 = axis_y + 16
    for i, g in enumerate(groups if not agg else ()):
        x, y = left + (i % 6) * 130, y0 + 16 * (i // 6)
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour[g]}"/>'
                   f'<text x="{x + 14}" y="{y}">{escape(g)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _block_rows(tl: Any, colour: dict[str, str], critical: set[int], left: int, top: int, row: int,
                scale: float) -> list[str]:
    out = [f'<text x="4" y="{top + b * row + row - 4}">block {b}</text>' for b in range(tl.blocks)]
    for s in tl.spans:
        y = top + s.block * row + 1
        if s.wait > 0:
            out.append(f'<rect x="{left + (s.start - s.wait) * scale:.2f}" y="{y}" width="{s.wait * scale:.2f}" '
                       f'height="{row - 2}" fill="#dddddd"/>')
        edge = ' stroke="#000" stroke-width="1.2"' if s.task in critical else ""
        out.append(f'<rect x="{left + s.start * scale:.2f}" y="{y}" width="{max((s.end - s.start) * scale, 0.5):.2f}" '
                   f'height="{row - 2}" fill="{colour[s.group]}"{edge}><title>{escape(s.group)} item {s.item} '
                   f'(task {s.task}): {s.start:g}..{s.end:g} {tl.unit}, waited {s.wait:g}'
                   f'{", on the critical path" if s.task in critical else ""}</title></rect>')
    return out


def _group_rows(tl: Any, groups: list[str], colour: dict[str, str], critical: set[int], left: int, top: int,
                row: int, scale: float) -> list[str]:
    times = tl.groups()
    on_path = {s.group for s in tl.spans if s.task in critical}
    out = []
    for i, g in enumerate(groups):
        gt = times[g]
        y = top + i * row + 1
        lanes = max(1, min(tl.blocks, gt.tasks))
        busy = gt.busy / (gt.duration * lanes) if gt.duration > 0 else 1.0
        edge = ' stroke="#000" stroke-width="1.2"' if g in on_path else ""
        out.append(f'<text x="4" y="{y + row - 5}">{escape(g)} ×{gt.tasks}</text>'
                   f'<rect x="{left + gt.start * scale:.2f}" y="{y}" width="{max(gt.duration * scale, 0.5):.2f}" '
                   f'height="{row - 2}" fill="{colour[g]}" fill-opacity="{0.35 + 0.65 * min(busy, 1.0):.2f}"{edge}>'
                   f'<title>{escape(g)}: {gt.tasks} tasks, {_fmt(gt.start, tl.unit)}..{_fmt(gt.end, tl.unit)}, '
                   f'{100 * min(busy, 1.0):.0f}% busy{", on the critical path" if g in on_path else ""}'
                   f'</title></rect>')
    return out


def _group_table(tl: Any) -> str:
    times = tl.groups()
    rows = "".join(f"<tr><td>{escape(g)}</td><td>{t.tasks}</td><td>{_fmt(t.start, tl.unit)}</td>"
                   f"<td>{_fmt(t.duration, tl.unit)}</td></tr>" for g, t in times.items())
    what = "µs" if tl.unit == "ns" else tl.unit
    return (f"<details><summary>{len(times)} groups: {what} of each (first start to last end)</summary>"
            f'<table style="font-size:12px"><tr><th>group</th><th>tasks</th><th>start</th><th>duration</th></tr>'
            f"{rows}</table></details>")


def _inline(svg: str) -> str:
    # HTML needs no namespace URL, and a page that names no URL stays self-contained
    return svg.replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)


def timeline_html(tl: Any, extra: str = "") -> str:
    """The chart inline (hovering a bar shows its task), its summary and the time of every group;
    ``extra``: HTML appended to the summary line (a download link)."""
    note = f' <span style="color:#57606a">({escape(tl.note)})</span>' if getattr(tl, "note", "") else ""
    return (f'<div class="tkx-timeline" style="overflow:auto;max-height:70vh">'
            f"<p>{escape(repr(tl).strip('<>'))}{note}{extra}</p>{_inline(timeline_svg(tl))}{_group_table(tl)}</div>")


def comparison_html(cmp: Any) -> str:
    """A predicted and a measured timeline on one time scale, one above the other, and per group the
    predicted and measured µs with the prediction's error."""
    p, m = cmp.predicted, cmp.measured
    span = max(p.makespan, m.makespan, 1.0)
    shared = _colours(p, m)
    rows = []
    for g, pu, mu, err in cmp.rows():
        cell = f"{100 * err:+.0f}%" if err is not None else "-"
        rows.append(f"<tr><td>{escape(g)}</td><td>{'-' if pu is None else f'{pu:.3g}'}</td>"
                    f"<td>{'-' if mu is None else f'{mu:.3g}'}</td><td>{cell}</td></tr>")
    err = cmp.makespan_error
    head = (f"<p><b>predicted vs measured</b>: makespan {_fmt(p.makespan, 'ns')} predicted, "
            f"{_fmt(m.makespan, 'ns')} measured" + (f" ({100 * err:+.0f}%)" if err is not None else "") + "</p>")
    table = ('<table style="font-size:12px"><tr><th>group</th><th>predicted µs</th><th>measured µs</th>'
             f'<th>error</th></tr>{"".join(rows)}</table>')
    return (f'<div class="tkx-timeline-compare" style="overflow:auto;max-height:80vh">{head}'
            f"{_inline(timeline_svg(p, span=span, colours=shared))}"
            f"{_inline(timeline_svg(m, span=span, colours=shared))}{table}</div>")
