"""Benchmark plumbing for the explorer, with no widgets: GPU check, progress phases, history rows.

The explorer calls ``bench_fn(step_fn, example_inputs, options=..., make_inputs=..., name=...,
loss=..., log=...)`` - :func:`tkx.bench.compare` by default - in a background thread, turns
its ``log`` lines into progress phases with :class:`PhaseTracker` and appends one
:func:`history_row` per run to a table (:func:`history_html`) and a bar chart
(:func:`chart_html`).
"""

from __future__ import annotations

import html
import re
from typing import Any

#: Progress phases, in order (warm-up and timing alternate, once per candidate).
PHASES = ("compile", "verify", "warm-up", "timing")
#: Share of the progress bar used by compile and verify; candidates share the rest.
TIMING_START = 0.35

#: Names of torch.compile rows in a :class:`~tkx.bench.report.BenchmarkReport`.
COMPILE_ROWS = ("inductor", "inductor-max-autotune")


def gpu_reason() -> str | None:
    """Why the default benchmark cannot run here (``None`` when a CUDA GPU is available)."""
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a dependency
        return f"torch cannot be imported: {exc}"
    if torch.cuda.is_available():
        return None
    built = "built without CUDA" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (f"no CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__}, {built}). "
            "Compiling, verifying and timing the kernel need an NVIDIA GPU (sm_80 or newer); "
            "every other tab works on the CPU.")


class PhaseTracker:
    """Turns :func:`tkx.bench.compare`'s log lines into ``(phase, fraction, text)``.

    ``building`` -> compile, ``verifying`` -> verify, ``timing <candidate>`` -> warm-up of that
    candidate (warm-up calls and CUDA-graph capture come first), ``<candidate>: N µs/step``
    or ``failed`` -> timing of it done. ``candidates``: how many are timed (baselines + tkx).
    """

    def __init__(self, candidates: int = 6) -> None:
        self.candidates = max(1, candidates)
        self.timed = 0
        self.phase = "compile"
        self.fraction = 0.0

    def feed(self, line: str) -> tuple[str, float, str]:
        text = re.sub(r"^\[[^\]]*\]\s*", "", line.strip())
        span = 1.0 - TIMING_START
        if text.startswith("building"):
            self.phase, self.fraction = "compile", 0.05
        elif text.startswith("verifying"):
            self.phase, self.fraction = "verify", 0.25
        elif text.startswith("timing "):
            self.phase = "warm-up"
            self.fraction = TIMING_START + span * (self.timed + 0.3) / self.candidates
            text = f"warm-up and timing of {text[len('timing '):]}"
        elif re.search(r"µs/step$|us/step$| failed: ", text):
            self.timed += 1
            self.phase = "timing"
            self.fraction = TIMING_START + span * self.timed / self.candidates
        elif self.phase == "compile":
            self.fraction = max(self.fraction, 0.2)  # the resources line after the build
        self.fraction = min(self.fraction, 0.99)
        return self.phase, self.fraction, text


def best_compile_row(report: Any) -> Any:
    """The fastest torch.compile row that ran (``None`` if none did)."""
    rows = [r for r in getattr(report, "rows", ()) if r.name in COMPILE_ROWS and r.ok and r.median_us is not None]
    return min(rows, key=lambda r: r.median_us) if rows else None


def history_row(report: Any, config: str, *, fake: bool = False) -> dict[str, Any]:
    """One results-table row for a finished benchmark: ``config``, ``tkx_us``, the best
    torch.compile candidate (``compile_name``/``compile_us``), ``ratio`` (tkx / best
    torch.compile), ``graph_of_kernels_us`` (the same groups as one kernel each in a CUDA graph,
    ``None`` when not timed), ``sol_fraction`` (speed-of-light µs / tkx µs, ``None`` when unknown),
    ``correct`` (verified / WRONG RESULTS / not verified), ``device`` and ``fake`` (a stand-in
    benchmark, marked in the table)."""
    best = best_compile_row(report)
    mine = getattr(report, "megakernel_us", None)
    ratio = mine / best.median_us if mine is not None and best is not None and best.median_us else None
    verified = getattr(report, "verified", None)
    meta = getattr(report, "meta", {}) or {}
    return {
        "config": config,
        "tkx_us": mine,
        "compile_name": best.name if best is not None else None,
        "compile_us": best.median_us if best is not None else None,
        "ratio": ratio,
        "graph_of_kernels_us": getattr(report, "graph_of_kernels_us", None),
        "sol_fraction": getattr(report, "sol_fraction", None),
        "correct": {True: "verified", False: "WRONG RESULTS", None: "not verified"}[verified],
        "device": str(meta.get("device", "")),
        "fake": bool(fake or meta.get("fake")),
        "error": None,
    }


def failed_row(config: str, message: str, *, fake: bool = False) -> dict[str, Any]:
    """A results-table row for a benchmark that raised."""
    return {"config": config, "tkx_us": None, "compile_name": None, "compile_us": None, "ratio": None,
            "graph_of_kernels_us": None, "sol_fraction": None, "correct": "failed", "device": "", "fake": fake,
            "error": message}


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


_TABLE_STYLE = ("font-family:system-ui,sans-serif;font-size:13px;border-collapse:collapse")
_CELL = "padding:2px 10px;border-bottom:1px solid #d0d7de;text-align:{}"


def history_html(rows: list[dict[str, Any]]) -> str:
    """The results table: one row per benchmarked configuration."""
    if not rows:
        return ('<div style="font-family:system-ui,sans-serif;color:#57606a">No benchmark yet: press '
                '<b>Compile &amp; benchmark</b> to time this configuration.</div>')
    head = ["#", "configuration", "tkx µs/step", "best torch.compile", "µs/step", "ratio", "graph of kernels µs/step",
            "speed of light", "correctness", "device"]
    out = [f'<table class="tkx-explorer-history" style="{_TABLE_STYLE}"><tr>']
    out += [f'<th style="{_CELL.format("left")}">{html.escape(h)}</th>' for h in head]
    out.append("</tr>")
    for i, r in enumerate(rows, 1):
        fake = ('<span style="background:#cf222e;color:#fff;border-radius:8px;padding:0 6px;margin-right:4px">'
                'FAKE</span>' if r["fake"] else "")
        color = {"verified": "#1a7f37", "WRONG RESULTS": "#cf222e", "failed": "#cf222e"}.get(r["correct"], "#57606a")
        correct = html.escape(r["correct"]) + (f": {html.escape(r['error'])}" if r.get("error") else "")
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        cells = [(str(i), "right"), (fake + html.escape(r["config"]), "left"), (_us(r["tkx_us"]), "right"),
                 (html.escape(r["compile_name"] or "-"), "left"), (_us(r["compile_us"]), "right"),
                 (ratio, "right"), (_us(r.get("graph_of_kernels_us")), "right"),
                 ("-" if r.get("sol_fraction") is None else f"{r['sol_fraction']:.2f}", "right"),
                 (f'<span style="color:{color}">{correct}</span>', "left"),
                 (html.escape(r["device"]), "left")]
        out.append('<tr class="tkx-explorer-row">' + "".join(
            f'<td style="{_CELL.format(a)}">{c}</td>' for c, a in cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def chart_html(rows: list[dict[str, Any]], width_px: int = 360) -> str:
    """Horizontal bars per configuration: tkx µs/step against the best torch.compile."""
    timed = [r for r in rows if r["tkx_us"] is not None or r["compile_us"] is not None]
    if not timed:
        return ""
    top = max(max(r["tkx_us"] or 0, r["compile_us"] or 0) for r in timed) or 1.0
    out = ['<div class="tkx-explorer-chart" style="font-family:system-ui,sans-serif;font-size:12px;margin-top:6px">'
           '<div style="margin-bottom:4px"><span style="color:#2f855a">■</span> tkx &nbsp; '
           '<span style="color:#2b6cb0">■</span> best torch.compile &nbsp;(µs/step, shorter is faster)</div>']
    for i, r in enumerate(rows, 1):
        if r not in timed:
            continue
        label = ("FAKE " if r["fake"] else "") + f"#{i} {r['config']}"
        out.append(f'<div style="margin:3px 0"><div style="color:#57606a">{html.escape(label)}</div>')
        for value, color in ((r["tkx_us"], "#2f855a"), (r["compile_us"], "#2b6cb0")):
            if value is None:
                continue
            w = max(1, int(width_px * value / top))
            out.append(f'<div style="display:flex;align-items:center;gap:6px"><div style="background:{color};'
                       f'height:10px;width:{w}px"></div><span>{value:.1f}</span></div>')
        out.append("</div>")
    out.append("</div>")
    return "".join(out)
