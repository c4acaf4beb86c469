"""The views of :class:`~tkx.arena.ArenaPlan`: the memory timeline (SVG), the slot table and a
rich table."""

from __future__ import annotations

from typing import Any

from .. import display
from ..arena import ArenaPlan
from ..words import plural
from .base import REGION_COLORS, REGION_FILL, attrs, capped, esc, svg_img
from .stage_common import _input_buffer, _kib, _op_ids, _region, _view


def _label_step(col: float, label_px: float) -> int:
    """Label every n-th stage column (n in 1, 2, 5, 10, 20, 50, ...) so that a label of ``label_px``
    pixels fits in the columns it stands for."""
    n, k = 1, 0
    while n * col < label_px:
        k += 1
        n = (1, 2, 5)[k % 3] * 10 ** (k // 3)
    return n


def _writers_readers(s: Any) -> tuple[dict[str, str], dict[str, list[str]]]:
    writers: dict[str, str] = {}
    readers: dict[str, list[str]] = {}
    for gid in (g for stage in s.stages for g in stage):
        g = s.groups[gid]
        for b in g.stores:
            writers.setdefault(b, gid)
        for b in g.reads:
            readers.setdefault(b, []).append(gid)
    return writers, readers


def _staged_targets(s: Any) -> dict[str, tuple[str, str, int]]:
    """arena buffer -> (copy group, destination input name, stage of the copy)."""
    out = {}
    for gid, c in s.copies.items():
        if c.dst_home.kind == "input":
            out[c.src.buffer] = (gid, s.program.inputs[c.dst_home.index].name, s.stage_of(gid))
    return out


def _in_place_writes(s: Any) -> list[tuple[str, str, int]]:
    """(input name, value, stage) of every in-place update written straight into a user tensor."""
    writers, _ = _writers_readers(s)
    out = []
    for buf, home in s.homes.items():
        if home.kind == "input" and buf in writers:
            out.append((s.program.inputs[home.index].name, buf, s.stage_of(writers[buf])))
    return sorted(out, key=lambda t: (t[2], t[0]))


@display.register(ArenaPlan, "svg")
def arena_svg(a: Any, width: int = 860) -> str:
    """The memory timeline: x = schedule stage, y = byte offset (0 at the bottom); one rectangle
    per slot coloured by the region of the op that produced it; lines at the peak and the lower
    bound; staged commits outlined in orange; in-place writes as ticks in a lane below."""
    s = a.schedule
    nst = max(1, len(s.stages))
    slots = sorted(a.slots.values(), key=lambda x: (x.offset, x.first, x.buffer))
    staged = _staged_targets(s)
    inplace = _in_place_writes(s)
    left, right, top = 64, 12, 28
    plot_h = 300 if slots else 40
    pw = width - left - right
    col = pw / nst
    top_bytes = max(a.size_bytes, a.lower_bound_bytes, 1)

    def y(off: float) -> float:
        return top + plot_h - off / top_bytes * plot_h

    out = [f'<text x="{left}" y="16" font-size="12" font-weight="bold">arena timeline: {esc(_kib(a.size_bytes))} '
           f'peak, lower bound {esc(_kib(a.lower_bound_bytes))}, without reuse {esc(_kib(a.no_reuse_bytes))}'
           f'</text>']
    # stage columns and barriers; labels thinned to every `every`-th stage so that they never overlap
    word = "stage " if col >= 48 else ""
    every = _label_step(col, len(f"{word}{nst - 1}") * 6.5 + 6)
    for k in range(nst):
        x0 = left + k * col
        out.append(f'<rect x="{x0:.1f}" y="{top}" width="{col:.1f}" height="{plot_h}" '
                   f'fill="{"#fafbfc" if k % 2 else "#ffffff"}"><title>stage {k}</title></rect>')
        if k % every == 0:
            out.append(f'<text x="{x0 + col / 2:.1f}" y="{top + plot_h + 13}" text-anchor="middle" '
                       f'fill="#57606a">{word}{k}</text>')
        if k > 0:
            out.append(f'<line x1="{x0:.1f}" y1="{top}" x2="{x0:.1f}" y2="{top + plot_h}" stroke="#b42318" '
                       f'stroke-width="0.8" stroke-dasharray="2,3"/>')
    # y axis
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        off = top_bytes * frac
        out.append(f'<line x1="{left - 4}" y1="{y(off):.1f}" x2="{left}" y2="{y(off):.1f}" stroke="#57606a"/>')
        out.append(f'<text x="{left - 6}" y="{y(off) + 3:.1f}" text-anchor="end" fill="#57606a">'
                   f'{esc(_kib(int(off)))}</text>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#57606a"/>')
    # slots
    for sl in slots:
        x0 = left + sl.first * col + 1.5
        w = (sl.last - sl.first + 1) * col - 3
        y1, y0 = y(sl.offset), y(sl.offset + sl.nbytes)
        h = max(2.0, y1 - y0)
        y0 = y1 - h
        region = _region(s.program, sl.buffer)
        fill = "#fff8c5" if sl.kind == "scratch" else REGION_FILL.get(region, "#eaeef2")
        stroke = REGION_COLORS.get(region, "#8c959f") if sl.kind != "scratch" else "#9a6700"
        extra = ' stroke-dasharray="3,2"' if sl.kind == "scratch" else ""
        sw = "1"
        if sl.buffer in staged:
            stroke, sw = "#d4651a", "2.2"
        out.append(f'<rect class="tkx-slot" x="{x0:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{extra}><title>{esc(sl.buffer)}: '
                   f'{sl.nbytes} B at {sl.offset}, stages {sl.first}..{sl.last}</title></rect>')
        if h >= 11 and w >= 30:
            label = sl.buffer + (f" → {staged[sl.buffer][1]}" if sl.buffer in staged else "")
            size = f" {_kib(sl.nbytes)}" if h >= 24 else ""
            max_chars = int(w / 5.6)
            text = (label + size) if len(label + size) <= max_chars else label[:max(1, max_chars)]
            out.append(f'<text x="{x0 + 3:.1f}" y="{y0 + min(h / 2 + 3.5, 12):.1f}" fill="#24292f">{esc(text)}</text>')
    # peak and lower bound
    out.append(f'<line x1="{left}" y1="{y(a.size_bytes):.1f}" x2="{left + pw}" y2="{y(a.size_bytes):.1f}" '
               f'stroke="#24292f" stroke-width="1.2"/>')
    out.append(f'<text x="{left + pw - 2}" y="{y(a.size_bytes) - 3:.1f}" text-anchor="end" fill="#24292f">'
               f'peak {esc(_kib(a.size_bytes))}</text>')
    lb_y = y(a.lower_bound_bytes)
    out.append(f'<line x1="{left}" y1="{lb_y:.1f}" x2="{left + pw}" y2="{lb_y:.1f}" stroke="#1a7f37" '
               f'stroke-width="1.2" stroke-dasharray="6,3"/>')
    lb_text_y = lb_y + 11 if abs(lb_y - y(a.size_bytes)) < 12 else lb_y - 3
    out.append(f'<text x="{left + pw - 2}" y="{lb_text_y:.1f}" text-anchor="end" fill="#1a7f37">'
               f'lower bound {esc(_kib(a.lower_bound_bytes))}</text>')
    base = top + plot_h + 26
    if inplace:
        out.append(f'<text x="{left}" y="{base + 10}" fill="#57606a">written in place into user tensors '
                   f'(no arena bytes):</text>')
        per_stage: dict[int, int] = {}
        for name, _buf, st in inplace:
            j = per_stage.get(st, 0)
            per_stage[st] = j + 1
            if j >= 12:
                continue
            x0 = left + st * col + 2
            yy = base + 16 + j * 14
            out.append(f'<rect x="{x0:.1f}" y="{yy}" width="{col - 4:.1f}" height="12" fill="#e6f6ec" '
                       f'stroke="#2f855a"/>')
            text = name
            max_chars = int((col - 8) / 5.4)
            out.append(f'<text x="{x0 + 3:.1f}" y="{yy + 9}" fill="#1f5135">{esc(text[:max(1, max_chars)])}</text>')
        lanes = max(per_stage.values())
        base += 16 + min(lanes, 12) * 14 + 6
    # legend
    ly = base + 12
    items = [("#ebf4ff", "#2b6cb0", "forward"), ("#f3ebff", "#805ad5", "backward"),
             ("#e6f6ec", "#2f855a", "optimizer"), ("#fff8c5", "#9a6700", "scratch"),
             ("white", "#d4651a", "staged commit")]
    lx = left
    for fill, stroke, name in items:
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="10" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="{2 if name == "staged commit" else 1}"/>')
        out.append(f'<text x="{lx + 16}" y="{ly}" fill="#24292f">{esc(name)}</text>')
        lx += 28 + 6 * len(name)
    out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 20}" y2="{ly - 4}" stroke="#b42318" '
               f'stroke-dasharray="2,3"/><text x="{lx + 24}" y="{ly}" fill="#24292f">barrier</text>')
    height = ly + 8
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica,Arial,sans-serif" font-size="10">\n'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>')
    return head + "\n" + "\n".join(out) + "\n</svg>"


@display.register(ArenaPlan, "html")
def arena_html(a: Any) -> str:
    """The arena as HTML: summary, the timeline (an ``<img>`` of an SVG) and the slot table."""
    s = a.schedule
    ops = _op_ids(s.program)
    writers, readers = _writers_readers(s)
    staged = _staged_targets(s)
    reuse = 1 - a.size_bytes / a.no_reuse_bytes if a.no_reuse_bytes else 0.0
    head = (
        '<table class="tkx-kv">'
        f'<tr><td>size</td><td><b>{esc(_kib(a.size_bytes))}</b> ({a.size_bytes} B) for '
        f'{plural(len(a.slots), "value")}, '
        f'{a.alignment}-byte aligned</td></tr>'
        f'<tr><td>lower bound</td><td>{esc(_kib(a.lower_bound_bytes))} (most bytes live in any one stage; '
        f'{"reached" if a.size_bytes <= a.lower_bound_bytes else f"{a.size_bytes - a.lower_bound_bytes} B above"})'
        '</td></tr>'
        f'<tr><td>without reuse</td><td>{esc(_kib(a.no_reuse_bytes))} (reuse saves {reuse:.0%})</td></tr>'
        f'<tr><td>in place</td><td style="white-space:normal">{esc(", ".join(a.in_place) or "—")} '
        '<span class="tkx-why">(state updates written straight into the user tensor: last read proven)</span></td></tr>'
        f'<tr><td>staged</td><td style="white-space:normal">{esc(", ".join(a.staged) or "—")} '
        '<span class="tkx-why">(new value kept in the arena, copied after the old one\'s last read)</span></td></tr>'
        '</table>')
    img = svg_img(arena_svg(a), alt="arena timeline") if a.slots or a.in_place else \
        '<div class="tkx-dim">no arena values: everything lives in registers or user tensors</div>'
    rows = ['<tr><th>buffer</th><th>kind</th><th>dtype</th><th style="text-align:right">offset</th>'
            '<th style="text-align:right">bytes</th><th>stages</th><th>written by</th><th>read by</th><th></th></tr>']
    for sl in sorted(a.slots.values(), key=lambda x: (x.offset, x.first, x.buffer)):
        b = sl.buffer
        w = writers.get(b)
        rs = list(dict.fromkeys(readers.get(b, [])))
        ids = ([f"op:{b}"] if b in ops else []) + ([f"grp:{w}"] if w else []) + [f"grp:{r}" for r in rs]
        ids += [f"stage:{k}" for k in range(sl.first, sl.last + 1)]
        note = f"staged commit → {staged[b][1]} by {staged[b][0]}" if b in staged else ""
        region = _region(s.program, b)
        rows.append(f'<tr {attrs(f"buf:{b}", ids)}><td class="tkx-region-{region}">{esc(b)}</td>'
                    f'<td>{esc(sl.kind)}</td><td>{esc(sl.dtype)}</td><td style="text-align:right">{sl.offset}</td>'
                    f'<td style="text-align:right">{sl.nbytes}</td><td>{sl.first}..{sl.last}</td>'
                    f'<td>{esc(w or "")}</td><td>{esc(", ".join(rs))}</td><td>{esc(note)}</td></tr>')
    inplace = _in_place_writes(s)
    if inplace:
        rows.append('<tr><td colspan="9" class="tkx-dim" style="padding-top:6px">written in place into user '
                    'tensors (no arena bytes):</td></tr>')
        for name, buf, st in inplace:
            w = writers.get(buf)
            ids = [f"op:{buf}"] + ([f"grp:{w}"] if w else []) + [f"stage:{st}"]
            ib = _input_buffer(s.program, name)
            rows.append(f'<tr {attrs(f"buf:{ib}" if ib else None, ids)}><td>{esc(name)}</td><td>in place</td>'
                        f'<td></td><td></td><td></td><td>{st}</td><td>{esc(w or "")}</td><td></td>'
                        f'<td>← {esc(buf)}</td></tr>')
    slots = capped(f'<table>{"".join(rows)}</table>', len(rows) - 1, "slots")
    body = head + img + '<div class="tkx-sub">Slots</div>' + slots
    return _view("arena", "ArenaPlan", body, str(a))


@display.register(ArenaPlan, "rich")
def arena_rich(a: Any) -> Any:
    from rich.table import Table

    t = Table(title=f"ArenaPlan: {_kib(a.size_bytes)} for {plural(len(a.slots), 'value')}",
              caption=f"lower bound {_kib(a.lower_bound_bytes)}, without reuse {_kib(a.no_reuse_bytes)}"
              + (f"; in place: {', '.join(a.in_place)}" if a.in_place else "")
              + (f"; staged: {', '.join(a.staged)}" if a.staged else ""))
    for col, just in (("buffer", "left"), ("kind", "left"), ("offset", "right"), ("bytes", "right"),
                      ("stages", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for sl in sorted(a.slots.values(), key=lambda x: (x.offset, x.first, x.buffer)):
        t.add_row(sl.buffer, sl.kind, str(sl.offset), str(sl.nbytes), f"{sl.first}..{sl.last}")
    return t


