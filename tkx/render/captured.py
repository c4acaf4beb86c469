"""The views of :class:`~tkx.capture.CapturedGraph`: one row per FX node, and the FX graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import display
from ..capture import CapturedGraph
from ..printer import format_captured, rich_captured
from .base import REGION_COLORS, attrs, capped, esc, view
from .graphs import _emit, _GNode, _GSpec
from .ir_common import (
    COLLAPSE_ABOVE,
    OPEN_GRAPH_MAX,
    _graph_block,
    _ref,
    _region_counts,
    _region_span,
    _short_target,
    _src_cell,
    _style,
)

if TYPE_CHECKING:
    import graphviz

def _captured_ids(cg: CapturedGraph) -> tuple[dict[str, list[str]], dict[str, str]]:
    ops_of: dict[str, list[str]] = {}
    for op in cg.program.ops:
        if op.fx_node:
            ops_of.setdefault(op.fx_node, []).append(op.id)
    placeholders = [n.name for n in cg.nodes if n.op == "placeholder"]
    buf_of = {name: inp.value.buffer for name, inp in zip(placeholders, cg.program.inputs)}
    return ops_of, buf_of


def _node_ids(n: Any, ops_of: dict[str, list[str]], buf_of: dict[str, str]) -> list[str]:
    """The cross-link ids of FX node ``n``: its IR ops, its source line and the buffer of an input."""
    ids = [f"op:{i}" for i in ops_of.get(n.name, [])]
    if n.source is not None:
        ids.append(f"src:{n.source.short()}")
    if n.name in buf_of:
        ids.append(f"buf:{buf_of[n.name]}")
    return ids


def _node_type(n: Any) -> str:
    if n.shape is None:
        return ""
    from ..ir import DTYPE_SHORT
    return f"{DTYPE_SHORT.get(n.dtype or '', n.dtype)}[{','.join(map(str, n.shape))}]"


@display.register(CapturedGraph, "html")
def captured_html(cg: CapturedGraph, *, graph: bool = True) -> str:
    """The FX graph as an HTML table (one row per FX node) plus, optionally, its graph."""
    from ..printer import format_captured

    ops_of, buf_of = _captured_ids(cg)
    names = {n.name for n in cg.nodes}
    placeholders = {name: i for i, name in enumerate(n.name for n in cg.nodes if n.op == "placeholder")}
    head = ("<tr><th>node</th><th>aten op</th><th>type</th><th>region</th><th>args</th>"
            "<th>IR ops</th><th>source</th></tr>")
    rows, prev = [head], None
    for n in cg.nodes:
        ids = _node_ids(n, ops_of, buf_of)
        if n.module is not None:
            ids.append(f"mod:{n.module}")
        args = ", ".join(_ref(f"fx:{a}", a) if a in names else esc(a) for a in (n.arguments or n.args))
        op_refs = " ".join(_ref(f"op:{i}", i) for i in ops_of.get(n.name, []))
        if n.op == "placeholder":
            target = "input"
            what = esc(cg.input_names[placeholders[n.name]])
            rows.append(f'<tr {attrs(f"fx:{n.name}", ids)}><td class="tkx-b">{esc(n.name)}</td>'
                        f'<td class="tkx-dim">{target}</td>'
                        f'<td>{esc(_node_type(n))}</td><td></td><td>{what}</td><td></td><td></td></tr>')
            continue
        if n.op == "output":
            rows.append(f'<tr {attrs(f"fx:{n.name}", ids)}><td class="tkx-b">{esc(n.name)}</td>'
                        f'<td class="tkx-dim">return</td>'
                        f'<td></td><td></td><td>{args}</td><td></td><td></td></tr>')
            continue
        border = REGION_COLORS.get(n.region or "", "#d0d7de")
        rows.append(f'<tr {attrs(f"fx:{n.name}", ids)}>'
                    f'<td class="tkx-b" style="border-left-color:{border}">{esc(n.name)}</td>'
                    f'<td><b>{esc(_short_target(n.target))}</b></td><td>{esc(_node_type(n))}</td>'
                    f'<td>{_region_span(n.region)}</td><td>{args}</td>'
                    f'<td class="tkx-id">{op_refs}</td>{_src_cell(n.source, prev, n.module, n.module_type)}</tr>')
        prev = n.source
    no_ops = sum(1 for n in cg.nodes if n.op == "call_function" and n.name not in ops_of)
    summary = (f'<div class="tkx-sum"><b>{len(cg.nodes)}</b> FX nodes '
               f'({_region_counts(n.region for n in cg.nodes)}); lowered to <b>{len(cg.program.ops)}</b> IR ops. '
               + (f'{no_ops} nodes produce no IR op: views such as <code>t</code> and <code>view</code> are '
                  f'metadata on the values that read them.' if no_ops else '') + '</div>')
    body = _style() + summary + capped(f"<table>{''.join(rows)}</table>", len(rows), "rows")
    if graph:
        n_fx = sum(1 for n in cg.nodes if n.op == "call_function")
        what = "FX graph" + (" (collapsed by region)" if n_fx > COLLAPSE_ABOVE else "")
        body += _graph_block(lambda: captured_graph(cg), what, n_fx <= OPEN_GRAPH_MAX)
    return view("ir tkx-captured", f"CapturedGraph {cg.name}", body, format_captured(cg))



@display.register(CapturedGraph, "graph")
def captured_graph(cg: CapturedGraph, *, collapse: str = "auto", expand: Sequence[str] = ()) -> graphviz.Digraph:
    """The FX graph as a ``graphviz.Digraph``: aten ops coloured by region, shapes in labels,
    inputs as ``invhouse``, the return as ``house``. ``collapse``/``expand`` as in
    :func:`program_graph`."""
    spec = _GSpec(cg.name)
    placeholders = {name: i for i, name in enumerate(n.name for n in cg.nodes if n.op == "placeholder")}
    ids = {n.name: f"n{k}" for k, n in enumerate(cg.nodes)}
    for n in cg.nodes:
        if n.op == "placeholder":
            spec.nodes.append(_GNode(ids[n.name], f"{n.name} {cg.input_names[placeholders[n.name]]}\n"
                                     f"{_node_type(n)}", "input", tooltip=f"fx:{n.name}"))
        elif n.op == "output":
            spec.nodes.append(_GNode(ids[n.name], "return", "output", tooltip="output"))
        else:
            target = _short_target(n.target)
            base = target.split(".")[0]
            tip = f"fx:{n.name} = {target}" + (f"  {n.source}" if n.source else "")
            line = n.name if n.name.rstrip("0123456789").rstrip("_") == base else f"{n.name} = {base}"
            spec.nodes.append(_GNode(ids[n.name], f"{line}\n{_node_type(n)}", "op", n.region, base, tip))
    for n in cg.nodes:
        for a in n.args:
            if a in ids:
                spec.edge(ids[a], ids[n.name])
    return _emit(spec, collapse, tuple(expand), f"captured graph {cg.name} (FX, aten ops)")



display.register(CapturedGraph, "text")(format_captured)
display.register(CapturedGraph, "rich")(rich_captured)
