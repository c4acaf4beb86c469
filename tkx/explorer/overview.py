"""The Explorer's pipeline table: one row per stage, what the last update did to it, its key figure.

Plain functions over an :class:`~tkx.Exploration` and the last :class:`~tkx.explorer.core.Update`,
so the table is tested without a browser. Rows come from :data:`tkx.pipeline.STAGES`.
"""

from __future__ import annotations

import html
from typing import Any

from .. import pipeline
from ..words import plural

__all__ = ["stage_figure", "pipeline_rows", "pipeline_html"]


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def stage_figure(name: str, obj: Any) -> str:
    """The one figure that sums up stage ``name``'s object (``"225 ops"``, ``"13 stages, 12 barriers"``);
    ``""`` for a stage without one."""
    if name == "captured":
        return plural(len(obj.nodes), "FX node")
    if name in ("program", "optimized"):
        return plural(len(obj.ops), "op")
    if name == "passes":
        return plural(len(getattr(obj, "steps", ())), "pass")
    if name == "schedule":
        return (f"{plural(len(obj.groups), 'group')}, {plural(len(obj.stages), 'stage')}, "
                f"{plural(obj.num_barriers, 'barrier')}")
    if name == "arena":
        return f"{_kib(obj.size_bytes)} (lower bound {_kib(obj.lower_bound_bytes)})"
    if name == "cuda":
        return plural(obj.num_lines, "line")
    if name == "timeline":
        tasks = getattr(obj, "tasks", None)
        return plural(len(tasks), "task") if tasks is not None else ""
    return ""


def pipeline_rows(ex: Any, upd: Any, *, first: bool = False) -> list[tuple[str, str, str, str]]:
    """``(stage, title, what the last update did, figure)`` per stage: ``"recomputed (N ms)"``,
    ``"reused"``, ``"failed"``, ``"not computed"`` (the GPU runner, lazily), ``"from ex.passes"`` (a
    stage read off another)."""
    rows = []
    done = set(upd.recomputed or ())
    ms = getattr(upd, "stage_ms", {}) or {}
    for s in pipeline.STAGES:
        obj = ex._cache.get(s.name)
        if s.derived:   # read off another stage (the IR after the passes is the pass trace's output)
            parents = [ex._cache.get(d) for d in s.needs]
            obj = getattr(ex, s.name) if parents and all(p is not None for p in parents) else None
            rows.append((s.name, s.title, f"from {', '.join(f'ex.{d}' for d in s.needs)}" if obj is not None
                         else "not computed", stage_figure(s.name, obj) if obj is not None else ""))
            continue
        if upd.error and s.name == upd.failed_stage:
            state = "failed"
        elif s.name in done or (first and obj is not None):
            state = f"recomputed ({ms[s.name]:.1f} ms)" if s.name in ms else "computed"
        elif obj is not None:
            state = "reused"
        else:
            state = "not computed" + (" (needs a GPU)" if s.gpu else "")
        try:
            figure = stage_figure(s.name, obj) if obj is not None else ""
        except Exception:  # a figure must never break the table
            figure = ""
        rows.append((s.name, s.title, state, figure))
    return rows


def pipeline_html(ex: Any, upd: Any, *, first: bool = False) -> str:
    """The pipeline table as HTML (inline styles: JupyterLab keeps them in untrusted output)."""
    cell = "padding:1px 14px 1px 0;text-align:left;vertical-align:top"
    body = []
    for name, title, state, figure in pipeline_rows(ex, upd, first=first):
        color = {"failed": "#cf222e", "reused": "#57606a", "from": "#57606a"}.get(state.split(" ")[0], "#1a7f37")
        if state.startswith("not"):
            color = "#8c959f"
        body.append(f'<tr><td style="{cell}"><code>ex.{html.escape(name)}</code></td>'
                    f'<td style="{cell}">{html.escape(title)}</td>'
                    f'<td style="{cell};color:{color}">{html.escape(state)}</td>'
                    f'<td style="{cell}">{html.escape(figure)}</td></tr>')
    head = "".join(f'<th style="{cell};border-bottom:1px solid #d0d7de">{h}</th>'
                   for h in ("stage", "what it is", "last update", "figure"))
    return ('<table class="tkx-pipeline" style="font-family:system-ui,sans-serif;font-size:12px;'
            f'border-collapse:collapse;margin:4px 0 6px"><tr>{head}</tr>{"".join(body)}</table>')
