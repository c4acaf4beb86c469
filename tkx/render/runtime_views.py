"""HTML views of what exists only on a GPU: the compiled runner, its verification, a benchmark.

* :func:`runner_html` - a :class:`~tkx.runtime.CompiledRunner`: launch, registers, shared and
  local memory, spills, occupancy, arena, compile time and cache hit, the last verification;
* :func:`verification_html` - a :class:`~tkx.runtime.Verification`: verdict, worst error per
  value against eager and the reference interpreter, every comparison;
* :func:`benchmark_html` - a :class:`~tkx.bench.report.BenchmarkReport`: a bar chart of the
  median µs per step of every candidate with its min..max spread (:func:`benchmark_svg`, an SVG
  drawn here, shown as an ``<img>``), the table, ratios to the best baseline.

These functions read attributes only, so they work on stand-in objects (recorded numbers) on a
machine without a GPU; the stage classes call them from thin ``_repr_mimebundle_`` methods.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from .. import display
from ..bench.report import BenchmarkReport
from ..runtime.runner import CompiledRunner
from ..runtime.verify import Verification
from ..words import plural
from .base import esc, mimebundle, svg_img, view

OK_COLOR = "#1a7f37"
BAD_COLOR = "#cf222e"
TKX_COLOR = "#2f855a"
BEST_COLOR = "#2b6cb0"
BASELINE_COLOR = "#8c959f"

#: Largest register count per thread on every architecture tkx targets.
MAX_REGISTERS = 255

_LOCAL_STYLE = (
    "<style>.tkx-rt-verdict{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;"
    "font-family:system-ui,sans-serif;font-weight:600;margin-right:6px}"
    ".tkx-rt-kv th{font-weight:normal;color:#57606a;border:none;padding-right:14px}"
    ".tkx-rt-kv td{padding-right:14px}.tkx-rt-num{text-align:right !important}"
    ".tkx-rt-bad{color:" + BAD_COLOR + ";font-weight:600}.tkx-rt-ok{color:" + OK_COLOR + "}"
    ".tkx-rt-h{font-family:system-ui,sans-serif;font-weight:600;margin:10px 0 4px}</style>"
)


# --------------------------------------------------------------------------------------
# small formatting helpers
# --------------------------------------------------------------------------------------
def _get(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name`` or ``obj[name]`` (the resources come as an object or as a dict)."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def fmt_bytes(n: Any) -> str:
    """``1280 B``, ``10,372 B (10.1 KiB)``, ``5,805,184 B (5.5 MiB)``; ``-`` when unknown."""
    if n is None or (isinstance(n, (int, float)) and n < 0):
        return "unknown"
    n = int(n)
    if n < 1024:
        return f"{n} B"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n:,} B ({n / size:.1f} {unit})"
    return f"{n:,} B"  # pragma: no cover


def fmt_error(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    if x == 0:
        return "0"
    return f"{x:.2e}"


def _verdict(passed: bool | None, yes: str = "PASSED", no: str = "FAILED", unknown: str = "not verified") -> str:
    color = {True: OK_COLOR, False: BAD_COLOR, None: BASELINE_COLOR}[passed]
    word = {True: yes, False: no, None: unknown}[passed]
    return f'<span class="tkx-rt-verdict" style="background:{color}">{esc(word)}</span>'


def _kv_table(rows: Iterable[tuple[str, str, str]]) -> str:
    """A three-column table: what, value (HTML), what it means."""
    body = "".join(f'<tr><th>{esc(k)}</th><td>{v}</td><td class="tkx-dim">{esc(note)}</td></tr>'
                   for k, v, note in rows)
    return f'<table class="tkx-rt-kv">{body}</table>'


def _bundle(obj: Any, html_text: str, include: Any, exclude: Any, text: str | None = None) -> dict[str, str]:
    bundle = mimebundle(obj, html_text, include, exclude)
    if text is not None and "text/plain" in bundle:
        bundle["text/plain"] = text
    return bundle


# --------------------------------------------------------------------------------------
# resources and the runner
# --------------------------------------------------------------------------------------
def resources_rows(res: Any, *, timings: bool = True) -> list[tuple[str, str, str]]:
    """(what, value HTML, meaning) rows for a :class:`~tkx.runtime.Resources` (object or dict)."""
    rows: list[tuple[str, str, str]] = []
    grid, block, mode = _get(res, "grid"), _get(res, "block"), _get(res, "mode")
    if grid is not None:
        what = ("one block: stages separated by __syncthreads" if mode == "block"
                else "every block resident at once: stages separated by grid barriers")
        rows.append(("launch", esc(f"{grid} blocks x {block} threads ({mode} mode)"), what))
    regs = _get(res, "registers")
    if regs is not None:
        cls = ' class="tkx-rt-bad"' if regs >= MAX_REGISTERS else ""
        rows.append(("registers", f"<span{cls}>{esc(regs)}</span> / thread",
                     f"at most {MAX_REGISTERS}; more registers per thread, fewer blocks per SM"))
    spill = _get(res, "spill_bytes")
    if spill is not None:
        if spill < 0:
            value = '<span class="tkx-dim">unknown</span>'
        elif spill == 0:
            value = '<span class="tkx-rt-ok">0 B</span>'
        else:
            value = f'<span class="tkx-rt-bad">{esc(fmt_bytes(spill))}</span>'
        rows.append(("spills", value, "registers spilled to local memory (stores + loads); 0 is what you want"))
    local = _get(res, "local_bytes")
    if local is not None:
        rows.append(("local memory", esc(fmt_bytes(local)) + " / thread", "stack and spills"))
    shared = _get(res, "shared_bytes")
    if shared is not None:
        dyn = _get(res, "dynamic_shared_bytes") or 0
        extra = f" + {fmt_bytes(dyn)} dynamic" if dyn else ""
        rows.append(("shared memory", esc(fmt_bytes(shared) + extra) + " / block", "tiles staged for GEMMs"))
    occ = _get(res, "occupancy")
    if occ is not None:
        sms = _get(res, "sm_count")
        on = f" x {sms} SMs" if sms else ""
        rows.append(("occupancy", esc(f"{plural(int(occ), 'block')} / SM{on}"),
                     "how many blocks of this size fit on one SM at once (bounds the grid)"))
    arena = _get(res, "arena_bytes")
    if arena is not None:
        rows.append(("arena", esc(fmt_bytes(arena)), "the one workspace holding every intermediate"))
    backend, arch = _get(res, "backend"), _get(res, "arch")
    if backend or arch:
        rows.append(("binary", esc(" ".join(str(x) for x in (backend, arch) if x)), "compiler and target"))
    if timings:
        cold = _get(res, "compile_seconds")
        if cold is not None:
            hit = _get(res, "cache_hit")
            secs = _get(res, "seconds")
            how = ""
            if hit is not None:
                how = (f" (cache hit: this build took {secs:.3f} s)" if hit and secs is not None
                       else " (cache hit)" if hit else " (compiled now)")
            rows.append(("compile", esc(f"{cold:.2f} s cold{how}"),
                         "binaries are cached on disk by a hash of the source"))
        load = _get(res, "load_seconds")
        if load is not None:
            rows.append(("load", esc(f"{load * 1e3:.1f} ms"), "loading the binary into the driver"))
    return rows


@display.register(CompiledRunner, "html")
def runner_html(runner: Any, *, timings: bool = True, verification: Any = None) -> str:
    """The view of a :class:`~tkx.runtime.CompiledRunner` (duck-typed: ``program.name``,
    ``resources``, optionally ``last_verification``). ``timings=False`` leaves out compile and
    load times (for a deterministic export); ``verification`` overrides the runner's last one."""
    program = getattr(runner, "program", None)
    name = getattr(program, "name", None) or "step"
    res = getattr(runner, "resources", None)
    rows = resources_rows(res, timings=timings) if res is not None else []
    body = _LOCAL_STYLE + _kv_table(rows)
    text_lines = [f"CompiledRunner {name}"] + [f"  {k}: {_strip_tags(v)}" for k, v, _ in rows]
    ver = verification if verification is not None else getattr(runner, "last_verification", None)
    if ver is not None:
        body += '<div class="tkx-rt-h">last verification</div>' + _verification_body(ver)
        text_lines.append(_text_of(ver))
    else:
        body += ('<div class="tkx-dim" style="margin-top:6px">not verified yet: '
                 '<code>runner.verify()</code> compares it with eager PyTorch and the reference interpreter</div>')
    return view("runner", f"CompiledRunner {name}: one cooperative kernel", body, "\n".join(text_lines))


def runner_bundle(runner: Any, include: Any = None, exclude: Any = None) -> dict[str, str]:
    """``_repr_mimebundle_`` of :class:`~tkx.runtime.CompiledRunner`."""
    return _bundle(runner, runner_html(runner), include, exclude)


# --------------------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------------------
def _per_value(comparisons: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per value (first-seen order): the worst errors over seeds."""
    rows: dict[str, dict[str, Any]] = {}
    for c in comparisons:
        r = rows.setdefault(c.name, {"name": c.name, "kind": c.kind, "dtype": c.dtype, "eager": None,
                                     "reference": None, "tolerance": c.tolerance, "ok": True, "seeds": 0})
        for side, value in (("eager", c.vs_eager), ("reference", c.vs_reference)):
            if value is not None:
                r[side] = value if r[side] is None else max(r[side], value)
        r["ok"] = r["ok"] and bool(c.ok)
        r["seeds"] += 1
    return list(rows.values())


def _verification_body(ver: Any) -> str:
    comparisons = tuple(getattr(ver, "comparisons", ()))
    seeds = tuple(getattr(ver, "seeds", ()))
    passed = bool(getattr(ver, "passed", False))
    worst = getattr(ver, "worst_comparison", None)
    values = plural(len({c.name for c in comparisons}), "value")
    head = _verdict(passed) + esc(f"{values} x {plural(len(seeds), 'seed')} "
                                  f"(seeds {', '.join(str(s) for s in seeds)})")
    if worst is not None:
        head += esc(f"; worst: {worst.name} ({worst.dtype}) relative error {fmt_error(worst.error)}, "
                    f"tolerance {worst.tolerance:.0e}")
    header = ("value", "kind", "dtype", "vs eager", "vs reference", "tolerance", "")
    trs = []
    for r in _per_value(comparisons):
        status = '<span class="tkx-rt-ok">ok</span>' if r["ok"] else '<span class="tkx-rt-bad">FAIL</span>'
        cls = "" if r["ok"] else ' class="tkx-rt-bad"'
        trs.append(f"<tr{cls}><td>{esc(r['name'])}</td><td>{esc(r['kind'])}</td><td>{esc(r['dtype'])}</td>"
                   f'<td class="tkx-rt-num">{esc(fmt_error(r["eager"]))}</td>'
                   f'<td class="tkx-rt-num">{esc(fmt_error(r["reference"]))}</td>'
                   f'<td class="tkx-rt-num">{r["tolerance"]:.0e}</td><td>{status}</td></tr>')
    table = ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>" + "".join(trs) + "</table>")
    explain = ('<div class="tkx-dim">relative error ||kernel - expected|| / ||expected||, the worst over the seeds; '
               '"update" is a state tensor the step writes in place, "untouched" an input it must not change.</div>')
    notes = "".join(f'<div class="tkx-dim">note: {esc(n)}</div>' for n in getattr(ver, "notes", ()))
    return f"<div>{head}</div>{table}{explain}{notes}"


@display.register(Verification, "html")
def verification_html(ver: Any) -> str:
    """The view of a :class:`~tkx.runtime.Verification`."""
    verdict = "passed" if getattr(ver, "passed", False) else "FAILED"
    return view("verification", f"Verification {verdict}: kernel vs eager PyTorch and the reference interpreter",
                _LOCAL_STYLE + _verification_body(ver), _text_of(ver))


def verification_bundle(ver: Any, include: Any = None, exclude: Any = None) -> dict[str, str]:
    """``_repr_mimebundle_`` of :class:`~tkx.runtime.Verification`."""
    return _bundle(ver, verification_html(ver), include, exclude)


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


# --------------------------------------------------------------------------------------
def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_short(x)}" for k, x in v.items())
    return str(v)


def _text_of(obj: Any) -> str:
    summary = getattr(obj, "summary", None)
    return summary() if callable(summary) else str(obj)


def _strip_tags(s: str) -> str:
    import html as _html
    import re

    return _html.unescape(re.sub(r"<[^>]+>", "", s))
