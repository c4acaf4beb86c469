"""The views of :class:`~tkx.passes.PassTrace` and :class:`~tkx.passes.trace.PassStep`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import display
from ..passes.diff import step_diff
from ..passes.trace import PassStep, PassTrace
from ..words import plural
from .base import attrs, esc, view
from .diffs import diff_graph, side_by_side
from .graphs import _digraph
from .ir_common import MAX_IDS_IN_CELL, _details, _style

if TYPE_CHECKING:
    import graphviz

def _id_cell(ids: Sequence[str], sign: str, cls: str) -> str:
    if not ids:
        return f'<td class="tkx-dim">{sign}0</td>'
    toks = " ".join(f'<span class="tkx-tok {cls}" {attrs(f"op:{i}")}>{esc(i)}</span>' for i in ids[:MAX_IDS_IN_CELL])
    more = f' <span class="tkx-dim">... {len(ids) - MAX_IDS_IN_CELL} more</span>' if len(ids) > MAX_IDS_IN_CELL else ""
    return f"<td><b>{sign}{len(ids)}</b> {toks}{more}</td>"


@display.register(PassTrace, "html")
def trace_html(trace: PassTrace) -> str:
    """One row per pass (time, added/removed/changed op ids) and, per pass that changed
    something, its changed ops side by side."""
    head = ("<tr><th>pass</th><th>ms</th><th>ops</th><th>+added</th><th>-removed</th><th>~changed</th></tr>")
    rows = [head]
    details = []
    for k, s in enumerate(trace.steps):
        quiet = "" if s.modified else ' class="tkx-quiet"'
        rows.append(f'<tr{quiet}><td><b>{esc(s.name)}</b></td>'
                    f'<td class="tkx-ms">{s.ms:.2f}</td><td>{len(s.before.ops)} -&gt; {len(s.after.ops)}</td>'
                    f'{_id_cell(s.added, "+", "tkx-add")}{_id_cell(s.removed, "-", "tkx-rem")}'
                    f'{_id_cell(s.changed, "~", "tkx-chg")}</tr>')
        if s.modified:
            d = step_diff(s)
            details.append(_details(f"{k + 1}. {esc(s.name)}: {esc(d.summary().split(';')[0].split(': ', 1)[1])}",
                                    side_by_side(d, 0), True))
    none = "" if details else '<div class="tkx-dim">no pass changed the program</div>'
    summary = (f'<div class="tkx-sum">input <b>{len(trace.input.ops)}</b> ops, output <b>{len(trace.output.ops)}</b>'
               f' ops. Click an op id to find it in the program views on this page.</div>')
    body = _style() + summary + f'<table>{"".join(rows)}</table>' + "".join(details) + none
    title = f"PassTrace of {trace.input.name}: {plural(len(trace.steps), 'pass')}, {trace.ms:.2f} ms"
    return view("ir tkx-trace", title, body, str(trace))



@display.register(PassTrace, "plain")
def trace_plain(trace: PassTrace) -> str:
    return str(trace)


@display.register(PassStep, "html")
def step_html(step: PassStep) -> str:
    d = step_diff(step)
    return view("ir tkx-step", step.summary(), _style() + side_by_side(d, 1), str(d))


@display.register(PassStep, "graph")
def step_graph(step: PassStep, **kw: Any) -> Any:
    return diff_graph(step.before, step.after, **kw)


@display.register(PassTrace, "graph")
def trace_graph(trace: PassTrace, step: int | str | None = None, **kw: Any) -> graphviz.Digraph:
    """Without ``step``: the pipeline, one node per pass with its op delta. With ``step``
    (position or pass name): :func:`diff_graph` of that pass."""
    if step is not None:
        s = trace[step]
        return diff_graph(s.before, s.after, **kw)
    g = _digraph(f"passes_{trace.input.name}")
    g.attr(rankdir="LR", label=f"passes on {trace.input.name}", labelloc="t", labeljust="l")
    g.node("input", f"input\n{len(trace.input.ops)} ops", shape="invhouse", style="filled", fillcolor="#f6f8fa")
    prev = "input"
    for k, s in enumerate(trace.steps):
        nid = f"p{k}"
        delta = f"+{len(s.added)} -{len(s.removed)} ~{len(s.changed)}" if s.modified else "no change"
        g.node(nid, f"{s.name}\n{delta}", shape="box", style="rounded,filled",
               fillcolor="#fff1c2" if s.modified else "#f6f8fa", color="#9a6700" if s.modified else "#8c959f")
        g.edge(prev, nid, label=f"{len(s.before.ops)}")
        prev = nid
    g.node("output", f"output\n{len(trace.output.ops)} ops", shape="house", style="filled", fillcolor="#fff8e1")
    g.edge(prev, "output", label=f"{len(trace.output.ops)}")
    return g


@display.register(PassTrace, "rich")
def trace_rich(trace: PassTrace) -> Any:
    from rich.table import Table

    header, *body = trace.rows()
    table = Table(title=str(trace).splitlines()[0], title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for s, r in zip(trace.steps, body):
        table.add_row(*r, style=None if s.modified else "dim")
    return table

