"""The view of :class:`~tkx.bench.report.BenchmarkReport`: a bar chart of the median µs per step
of every candidate with its min..max spread (:func:`benchmark_svg`, an SVG drawn here, shown as
an ``<img>``), the table of every candidate and the ratio to the best baseline. It reads
attributes only, so it works on stand-in reports (recorded numbers) without a GPU."""

from __future__ import annotations

import math
from typing import Any

from .. import display
from ..bench.report import BenchmarkReport
from .base import esc, svg_img, view
from .runtime_views import (
    _LOCAL_STYLE,
    BAD_COLOR,
    BASELINE_COLOR,
    BEST_COLOR,
    TKX_COLOR,
    _bundle,
    _kv_table,
    _short,
    _verdict,
    resources_rows,
)


# --------------------------------------------------------------------------------------
# benchmark
# --------------------------------------------------------------------------------------
def _nice_ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        ticks = []
        e = math.floor(math.log10(lo))
        while 10 ** e <= hi * 1.0001:
            for m in (1, 2, 5):
                t = m * 10 ** e
                if lo * 0.9999 <= t <= hi * 1.0001:
                    ticks.append(float(t))
            e += 1
        return ticks
    span = hi - lo
    raw = span / 5 if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _steps_125(v: float, *, down: bool) -> list[float]:
    """The 1-2-5 values (x 10^k) at or below ``v`` (``down``) or at or above it, near ``v``."""
    e = math.floor(math.log10(v))
    cands = [m * 10.0 ** k for k in (e - 1, e, e + 1) for m in (1, 2, 5)]
    return [c for c in cands if (c <= v * 1.0001 if down else c >= v * 0.9999)]


def _tick_label(t: float) -> str:
    if t >= 1000:
        return f"{t / 1000:g}k"
    return f"{t:g}"


def benchmark_svg(report: Any, *, width: int = 720) -> str:
    """A horizontal bar chart: median µs per step per candidate, a whisker from the fastest to
    the slowest repeat, the ratio to the best baseline at the right. A log axis when the
    candidates differ by more than 10x (plain eager next to CUDA graphs always does)."""
    rows = list(getattr(report, "rows", ()))
    best = getattr(report, "best_baseline", None)
    ratios = getattr(report, "ratios", {}) or {}
    timed = [r for r in rows if r.median_us is not None]
    values = [v for r in timed for v in (r.min_us or r.median_us, r.max_us or r.median_us, r.median_us)]
    label_w, right_w, top, row_h, bottom = 170, 190, 34, 26, 30
    plot_w = width - label_w - right_w
    height = top + row_h * max(1, len(rows)) + bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="system-ui, sans-serif" font-size="12">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']
    if not values:
        out.append(f'<text x="10" y="{top}" fill="{BAD_COLOR}">no candidate ran</text></svg>')
        return "".join(out)
    lo, hi = min(values), max(values)
    log = hi / max(lo, 1e-9) > 10
    if log:
        # bars start at a power of ten at least 3x below the fastest value, so every bar is long
        # enough to compare (a log-axis bar measures orders of magnitude above the axis start)
        lo_axis = 10.0 ** math.floor(math.log10(lo))
        if lo / lo_axis < 3:
            lo_axis /= 10
        hi_axis = min((t for t in _steps_125(hi, down=False)), default=hi)

        def x(v: float) -> float:
            return label_w + plot_w * (math.log10(v) - math.log10(lo_axis)) / (
                math.log10(hi_axis) - math.log10(lo_axis))
    else:
        lo_axis = 0.0
        ticks0 = _nice_ticks(0.0, hi, False)
        hi_axis = ticks0[-1] if ticks0 and ticks0[-1] >= hi else hi * 1.1

        def x(v: float) -> float:
            return label_w + plot_w * (v - lo_axis) / (hi_axis - lo_axis)
    scale = "log scale" if log else "linear scale"
    out.append(f'<text x="10" y="14" fill="#24292f"><tspan font-weight="600">µs per training step</tspan>'
               f' (shorter is faster) - bar: median, whisker: fastest..slowest repeat, {scale}</text>')
    axis_y = top + row_h * len(rows) + 4
    for t in _nice_ticks(lo_axis if log else 0.0, hi_axis, log):
        tx = x(t)
        major = not log or abs(math.log10(t) - round(math.log10(t))) < 1e-9
        out.append(f'<line x1="{tx:.1f}" y1="{top - 6}" x2="{tx:.1f}" y2="{axis_y}" '
                   f'stroke="{"#d0d7de" if major else "#eef1f4"}" stroke-width="1"/>')
        out.append(f'<text x="{tx:.1f}" y="{axis_y + 14}" text-anchor="middle" fill="#57606a" '
                   f'font-size="10">{esc(_tick_label(t))}</text>')
    out.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + plot_w}" y2="{axis_y}" stroke="#57606a"/>')
    for i, r in enumerate(rows):
        y = top + i * row_h
        cy = y + row_h / 2
        is_tkx = r.name == "tkx"
        weight = ' font-weight="600"' if is_tkx or r.name == best else ""
        out.append(f'<text x="{label_w - 8}" y="{cy + 4:.1f}" text-anchor="end" fill="#24292f"{weight}>'
                   f'{esc(r.name)}</text>')
        if r.median_us is None:
            note = (r.note or "failed").splitlines()[0][:60]
            out.append(f'<text x="{label_w + 4}" y="{cy + 4:.1f}" fill="{BAD_COLOR}">failed: {esc(note)}</text>')
            continue
        color = TKX_COLOR if is_tkx else BEST_COLOR if r.name == best else BASELINE_COLOR
        if is_tkx and not r.ok:
            color = BAD_COLOR
        x0, xm = label_w, x(r.median_us)
        out.append(f'<rect x="{x0}" y="{y + 5}" width="{max(1.0, xm - x0):.1f}" height="{row_h - 10}" '
                   f'fill="{color}" fill-opacity="0.85"><title>{esc(r.name)}: median {r.median_us:.2f} µs'
                   f'</title></rect>')
        if r.min_us is not None and r.max_us is not None:
            a, b = x(r.min_us), x(r.max_us)
            out.append(f'<line x1="{a:.1f}" y1="{cy:.1f}" x2="{b:.1f}" y2="{cy:.1f}" stroke="#24292f"/>'
                       f'<line x1="{a:.1f}" y1="{cy - 5:.1f}" x2="{a:.1f}" y2="{cy + 5:.1f}" stroke="#24292f"/>'
                       f'<line x1="{b:.1f}" y1="{cy - 5:.1f}" x2="{b:.1f}" y2="{cy + 5:.1f}" stroke="#24292f"/>')
        ratio = ratios.get(r.name)
        label = f"{r.median_us:.1f} µs"
        if r.name == best:
            label += "  best baseline"
        elif ratio is not None:
            label += f"  {ratio:.2f}x"
        if is_tkx and not r.ok:
            label += "  WRONG"
        fill = BAD_COLOR if is_tkx and not r.ok else "#24292f"
        out.append(f'<text x="{label_w + plot_w + 8}" y="{cy + 4:.1f}" fill="{fill}"{weight}>{esc(label)}</text>')
    out.append("</svg>")
    return "".join(out)


@display.register(BenchmarkReport, "html")
def benchmark_html(report: Any) -> str:
    """The view of a :class:`~tkx.bench.report.BenchmarkReport`: chart, table, details."""
    header, *body = report.table_rows()
    best = getattr(report, "best_baseline", None)
    num = ' class="tkx-rt-num"'
    ths = "".join(f"<th{num if 0 < i < 5 else ''}>{esc(h)}</th>" for i, h in enumerate(header))
    trs = []
    for r in body:
        style = ""
        if r[0] == "tkx":
            style = ' style="font-weight:600"'
        if r[1] == "-":
            style = ' class="tkx-rt-bad"'
        r = (*r[:5], (r[5].splitlines() or [""])[0])  # a failure's first line; the rest is in the report
        tds = "".join(f"<td{num if 0 < i < 5 else ''}>{esc(c)}</td>" for i, c in enumerate(r))
        trs.append(f"<tr{style}>{tds}</tr>")
    table = f"<table><tr>{ths}</tr>{''.join(trs)}</table>"
    ratio_note = (f'<div class="tkx-dim">"x best baseline" = median / the median of {esc(best)}, the fastest '
                  "baseline: below 1 the megakernel is faster.</div>" if best else "")
    parts = [_LOCAL_STYLE, f"<div>{_verdict(getattr(report, 'verified', None), 'verified', 'WRONG RESULTS')}"
             f"{esc(report.headline())}</div>",
             svg_img(benchmark_svg(report), alt=f"benchmark chart of {report.name}"), table, ratio_note]
    res = getattr(report, "resources", None)
    if res:
        parts.append("<details><summary>kernel resources</summary>"
                     + _kv_table(resources_rows(res, timings=True)) + "</details>")
    extra = [("compile", getattr(report, "compile", None)), ("schedule", getattr(report, "schedule", None)),
             ("verification", getattr(report, "verification", None)), ("run", getattr(report, "meta", None))]
    for title, data in extra:
        if data:
            rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(_short(v))}</td></tr>" for k, v in data.items())
            parts.append(f'<details><summary>{esc(title)}</summary><table class="tkx-rt-kv">{rows}</table></details>')
    return view("bench", f"BenchmarkReport {report.name}", "".join(parts), str(report))


@display.register(BenchmarkReport, "plain")
def benchmark_plain(report: Any) -> str:
    return str(report)


def benchmark_bundle(report: Any, include: Any = None, exclude: Any = None) -> dict[str, str]:
    """``_repr_mimebundle_`` of :class:`~tkx.bench.report.BenchmarkReport` (text/plain: the table)."""
    return _bundle(report, benchmark_html(report), include, exclude, text=str(report))

