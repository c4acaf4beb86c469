"""HTML views of what exists only on a GPU: the compiled runner and its verification
(the benchmark's view is :mod:`tkx.render.bench`).

* :func:`runner_html` - a :class:`~tkx.runtime.CompiledRunner`: launch, registers, shared and
  local memory, spills, occupancy, arena, compile time and cache hit, the last verification;
* :func:`verification_html` - a :class:`~tkx.runtime.Verification`: verdict, worst error per
  value against eager and the reference interpreter, every comparison;

These functions read attributes only, so they work on stand-in objects (recorded numbers) on a
machine without a GPU; the stage classes call them from thin ``_repr_mimebundle_`` methods.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from .. import display
from ..runtime.runner import CompiledRunner
from ..runtime.verify import Verification
from ..words import plural
from .base import esc, mimebundle, view

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
# The benchmark's view is in tkx.render.bench.
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


