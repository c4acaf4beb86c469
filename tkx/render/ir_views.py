"""Views of the IR-side stages: :class:`~tkx.capture.CapturedGraph`, :class:`~tkx.ir.Program`
and :class:`~tkx.passes.PassTrace`.

For each of them this module builds

* an HTML view (through :func:`tkx.render.view`): a table with one row per FX node / IR op,
  every row carrying provenance attributes (``op:``, ``fx:``, ``src:``, ``buf:`` tokens) so
  that clicking it highlights the same thing in every other view on the page;
* a ``graphviz.Digraph`` (``.graph()``): nodes coloured by region, shapes in the labels,
  views (``.T``, ``bcast``) on the edges. Programs above :data:`COLLAPSE_ABOVE` ops are
  collapsed by default into one summary node per region; ``graph(collapse="none")`` or
  ``graph(expand=("backward",))`` shows the ops;
* a diff (``.diff(other)``): :class:`ProgramDiff` (added/removed/changed op ids, a unified
  diff of the printed text, a side-by-side HTML view) and, for two pass traces,
  :class:`TraceDiff`.

The stage classes call into this module lazily (``tkx.ir`` imports neither graphviz nor
this module), and every ``_repr_mimebundle_`` here is guarded: a rendering bug shows the
plain text and a one-line note, never a traceback in a notebook cell.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ir import Op, Program, TensorSpec
from ..printer import Namer, _attrs, format_program, type_str
from . import REGION_COLORS, REGION_FILL, attrs, esc, graph_html, mimebundle, view

if TYPE_CHECKING:
    import graphviz

    from ..capture import CapturedGraph
    from ..passes.trace import PassStep, PassTrace

__all__ = [
    "COLLAPSE_ABOVE", "ProgramDiff", "TraceDiff",
    "captured_graph", "captured_html", "captured_mimebundle", "captured_diff",
    "program_graph", "program_html", "program_mimebundle", "program_diff",
    "trace_graph", "trace_html", "trace_mimebundle", "trace_diff", "trace_rich", "step_diff", "step_mimebundle",
    "diff_graph",
]

#: Above this many ops (or FX nodes) ``graph()`` collapses each region into one summary node.
COLLAPSE_ABOVE = 150
#: Above this many inputs (or outputs) a collapsed graph draws them as one node.
GROUP_ENDS_ABOVE = 40
#: Graphs open in the HTML views when they have at most this many ops.
OPEN_GRAPH_MAX = 30
#: At most this many ids are listed in one cell of a pass-trace row.
MAX_IDS_IN_CELL = 12
#: Source code in a table cell is cut to this many characters (the full line is its tooltip).
MAX_CODE = 60

CSS = """
.tkx-ir table{margin:2px 0 6px 0}
.tkx-ir td.tkx-n{color:#57606a;text-align:right}
.tkx-ir tr.tkx-reg td{font-weight:600;padding-top:5px;font-family:system-ui,sans-serif}
.tkx-ir tr.tkx-sec td{font-weight:600;padding-top:5px;font-family:system-ui,sans-serif;color:#24292f}
.tkx-ir td.tkx-src{color:#6e7781}
.tkx-ir td.tkx-b{border-left:3px solid transparent;padding-left:4px}
.tkx-ir .tkx-sum{font-family:system-ui,sans-serif;margin:0 0 4px 0;color:#24292f}
.tkx-ir .tkx-sum b{font-weight:600}
.tkx-ir .tkx-add{background:#dafbe1}.tkx-ir .tkx-rem{background:#ffebe9}.tkx-ir .tkx-chg{background:#fff1c2}
.tkx-ir td.tkx-mark{font-weight:700;text-align:center;padding:1px 4px}
.tkx-ir table.tkx-side td{padding-right:14px}
.tkx-ir table.tkx-side td.tkx-gap{border-left:1px solid #d0d7de;padding:0 4px}
.tkx-ir .tkx-skip td{color:#8c959f;font-style:italic;font-family:system-ui,sans-serif}
.tkx-ir .tkx-id{color:#8c959f}
.tkx-ir span.tkx-tok{margin-right:6px}
.tkx-ir tr.tkx-quiet td{color:#8c959f}
.tkx-ir details{margin:4px 0}
.tkx-ir details>summary{margin:2px 0}
"""

_STATUS_CLASS = {"added": "tkx-add", "removed": "tkx-rem", "changed": "tkx-chg", "moved": "tkx-chg"}
_STATUS_MARK = {"added": "+", "removed": "-", "changed": "~", "moved": "~"}
_STATUS_FILL = {"added": "#dafbe1", "removed": "#ffebe9", "changed": "#fff1c2"}
_STATUS_LINE = {"added": "#1a7f37", "removed": "#cf222e", "changed": "#9a6700"}


# == small helpers ==================================================================================

def _guard(obj: Any, build: Callable[[], str], text: Callable[[], str], include: Any, exclude: Any,
           plain: str | None = None) -> dict[str, str]:
    """A mimebundle whose HTML comes from ``build()``; if that raises, the text and a note."""
    try:
        body = build()
    except Exception as e:  # a rendering bug must never put a traceback into a cell
        try:
            fallback = text()
        except Exception:
            fallback = repr(obj)
        body = (f'<div class="tkx-view"><div class="tkx-dim">tkx could not render this view '
                f'({esc(type(e).__name__)}: {esc(e)}); showing the text.</div><pre>{esc(fallback)}</pre></div>')
    bundle = mimebundle(obj, body, include, exclude)
    if plain is not None and "text/plain" in bundle:
        bundle["text/plain"] = plain
    return bundle


def _style() -> str:
    return f"<style>{CSS}</style>"


def _region_span(region: str | None, text: str | None = None) -> str:
    if not region:
        return esc(text or "")
    return f'<span style="color:{REGION_COLORS.get(region, "#24292f")}">{esc(text or region)}</span>'


def _region_counts(regions: Iterable[str | None]) -> str:
    counts = Counter(r for r in regions if r)
    return ", ".join(_region_span(r, f"{r} {counts[r]}") for r in REGION_COLORS if counts[r])


def _src_cell(source: Any, prev: Any) -> str:
    """``file.py:LINE  code``; the code only where it differs from the row above."""
    if source is None:
        return '<td class="tkx-src"></td>'
    code = source.code if (prev is None or (prev.file, prev.line) != (source.file, source.line)) else ""
    if len(code) > MAX_CODE:
        code = code[:MAX_CODE - 3] + "..."
    text = f"{source.short()}  {code}" if code else source.short()
    return f'<td class="tkx-src" title="{esc(str(source))}">{esc(text)}</td>'


def _ref(key: str, text: str) -> str:
    """A clickable reference to ``key`` (highlights what ``key`` names; is not itself a target)."""
    return f'<span data-tkx-key="{esc(key)}">{esc(text)}</span>'


def _buf_key(buf: str, op_ids: set[str]) -> str:
    return f"op:{buf}" if buf in op_ids else f"buf:{buf}"


def _operands(op: Op, namer: Namer, op_ids: set[str]) -> str:
    parts = []
    for x in op.inputs:
        text = namer.operand(x)
        parts.append(_ref(_buf_key(x.buffer, op_ids), text) if isinstance(x, TensorSpec) else esc(text))
    return ", ".join(parts)


def _op_ids(op: Op) -> list[str]:
    ids = [f"buf:{op.id}"]
    if op.fx_node:
        ids.append(f"fx:{op.fx_node}")
    if op.source is not None:
        ids.append(f"src:{op.source.short()}")
    return ids


def _edge_view(x: TensorSpec, namer: Namer) -> str:
    """The view a read goes through, for an edge label: '', '.T', 'bcast 64x10', 'reshape 10'."""
    text = namer.operand(x)
    name = namer.names.get(x.buffer, "")
    if text == name:
        return ""
    if text.endswith(".T"):
        return ".T"
    for kind in ("bcast", "reshape"):
        if text.startswith(kind + "("):
            return f"{kind} {text.split('-> ', 1)[-1].rstrip(')')}"
    return "view"


def _short_target(target: str) -> str:
    return target.replace("aten.", "").replace(".default", "")


# == Program: HTML ==================================================================================

def _program_rows(program: Program, namer: Namer) -> list[str]:
    op_ids = {op.id for op in program.ops}
    rows = ['<tr><th>name</th><th>type</th><th>op</th><th>operands</th><th>attributes</th><th>source</th></tr>',
            f'<tr class="tkx-sec"><td colspan="6">inputs ({len(program.inputs)})</td></tr>']
    for inp in program.inputs:
        buf = inp.value.buffer
        mark = "updated in place" if inp.mutated else ""
        rows.append(f'<tr {attrs(f"buf:{buf}")}><td class="tkx-n tkx-b">{esc(namer.names[buf])}</td>'
                    f'<td>{esc(type_str(inp.value))}</td><td class="tkx-dim">input</td>'
                    f'<td>{esc(inp.name)}</td><td class="tkx-dim">{mark}</td><td></td></tr>')
    region, prev = None, None
    for op in program.ops:
        if op.region != region:
            region = op.region
            n = sum(1 for o in program.ops if o.region == region)
            color = REGION_COLORS.get(region, "#24292f")
            rows.append(f'<tr class="tkx-reg"><td colspan="6" style="color:{color}">{esc(region)}'
                        f' <span class="tkx-dim">({n} ops)</span></td></tr>')
        border = REGION_COLORS.get(op.region, "#d0d7de")
        rows.append(
            f'<tr {attrs(f"op:{op.id}", _op_ids(op))}>'
            f'<td class="tkx-n tkx-b" style="border-left-color:{border}">{esc(namer.names[op.id])}</td>'
            f'<td>{esc(type_str(op.out))}</td><td><b>{esc(op.kind)}</b></td>'
            f'<td>{_operands(op, namer, op_ids)}</td><td class="tkx-dim">{esc(_attrs(op).strip())}</td>'
            f'{_src_cell(op.source, prev)}</tr>')
        prev = op.source
    rows.append(f'<tr class="tkx-sec"><td colspan="6">outputs ({len(program.outputs)})</td></tr>')
    for i, o in enumerate(program.outputs):
        rows.append(f'<tr {attrs(f"out:{i}", [_buf_key(o.value.buffer, op_ids)])}>'
                    f'<td class="tkx-n tkx-b">{_ref(_buf_key(o.value.buffer, op_ids), namer.operand(o.value))}</td>'
                    f'<td>{esc(type_str(o.value))}</td><td class="tkx-dim">output</td>'
                    f'<td>{esc(o.name)}</td><td></td><td></td></tr>')
    if program.updates:
        rows.append(f'<tr class="tkx-sec"><td colspan="6">in-place updates ({len(program.updates)})</td></tr>')
        for u in program.updates:
            target = program.inputs[u.input_index]
            key = _buf_key(u.value.buffer, op_ids)
            rows.append(f'<tr {attrs(f"upd:{u.input_index}", [key, f"buf:{target.value.buffer}"])}>'
                        f'<td class="tkx-n tkx-b">{_ref(key, namer.operand(u.value))}</td>'
                        f'<td>{esc(type_str(u.value))}</td><td class="tkx-dim">writes</td>'
                        f'<td>{_ref(f"buf:{target.value.buffer}", namer.names[target.value.buffer])} '
                        f'{esc(target.name)}</td><td></td><td></td></tr>')
    return rows


def _details(summary: str, body: str, open_: bool) -> str:
    return f'<details{" open" if open_ else ""}><summary>{summary}</summary>{body}</details>'


def _graph_block(build: Callable[[], Any], what: str, open_: bool) -> str:
    try:
        g = build()
        img = graph_html(g, alt=what)
    except ImportError:
        return '<div class="tkx-dim">Install the <code>graphviz</code> Python package to see the graph.</div>'
    except Exception as e:  # e.g. dot failing on a graph: keep the table, say why the graph is missing
        return f'<div class="tkx-dim">tkx could not draw the graph ({esc(type(e).__name__)}: {esc(e)}).</div>'
    return _details(esc(what), img, open_)


def program_html(program: Program, *, graph: bool = True) -> str:
    """The program listing as an HTML view (one row per op) plus, optionally, its graph."""
    namer = Namer(program)
    summary = (f'<div class="tkx-sum"><b>{len(program.ops)}</b> ops '
               f'({_region_counts(o.region for o in program.ops)}), <b>{len(program.inputs)}</b> inputs, '
               f'<b>{len(program.outputs)}</b> outputs, <b>{len(program.updates)}</b> in-place updates. '
               f'A value is named after its op id (<code>%relu</code>) or input buffer (<code>%in0</code>): '
               f'the ids the schedule, arena and CUDA views use; passes never rename them.</div>')
    table = f'<table>{"".join(_program_rows(program, namer))}</table>'
    body = _style() + summary + table
    if graph:
        collapsed = len(program.ops) > COLLAPSE_ABOVE
        what = (f"dataflow graph, collapsed by region ({len(program.ops)} ops): "
                f"program.graph(expand=('optimizer',)) opens one region" if collapsed else "dataflow graph")
        body += _graph_block(lambda: program_graph(program), what, len(program.ops) <= OPEN_GRAPH_MAX)
    title = f"Program {program.name}"
    return view("ir tkx-program", title, body, format_program(program))


def program_mimebundle(program: Program, include: Any = None, exclude: Any = None) -> dict[str, str]:
    return _guard(program, lambda: program_html(program), lambda: format_program(program), include, exclude)


# == graphs: a neutral node list, then DOT (optionally collapsed by region) ==========================

@dataclass
class _GNode:
    id: str                  # DOT id: no ':' (graphviz reads 'a:b' as node a, port b)
    label: str
    role: str                # "input" | "op" | "output" | "update"
    region: str | None = None
    kind: str = ""
    tooltip: str = ""
    status: str = ""         # diff graphs: "added" | "removed" | "changed" | ""
    ref: str = ""            # the op id (program graphs) or FX node name it stands for


@dataclass
class _GSpec:
    name: str
    nodes: list[_GNode] = field(default_factory=list)
    edges: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._seen: set[tuple[str, str, str]] = set()

    def edge(self, src: str, dst: str, label: str = "") -> None:
        """Add an edge once (an op reading one value twice through one view draws one edge)."""
        e = (src, dst, label)
        if e not in self._seen:
            self._seen.add(e)
            self.edges.append(e)


def _digraph(name: str) -> graphviz.Digraph:
    from . import safe_digraph

    g = safe_digraph(name=name)
    g.attr(rankdir="TB", nodesep="0.25", ranksep="0.35", fontname="Helvetica", fontsize="11")
    g.attr("node", fontname="Menlo,DejaVu Sans Mono,monospace", fontsize="10", margin="0.08,0.03", height="0.3")
    g.attr("edge", fontname="Helvetica", fontsize="9", color="#57606a", arrowsize="0.6")
    return g


def _node_attrs(n: _GNode) -> dict[str, str]:
    color = REGION_COLORS.get(n.region or "", "#57606a")
    fill = REGION_FILL.get(n.region or "", "#f6f8fa")
    a = {"label": n.label, "tooltip": n.tooltip or n.label, "color": color, "fillcolor": fill}
    if n.role == "input":
        a.update(shape="invhouse", style="filled", fillcolor="#f6f8fa", color="#57606a")
    elif n.role == "output":
        a.update(shape="house", style="filled,bold", fillcolor="#fff8e1", color="#9a6700")
    elif n.role == "update":
        a.update(shape="house", style="filled,dashed", fillcolor="#fff8e1", color="#9a6700")
    else:
        a.update(shape="box", style="rounded,filled")
    if n.status:
        a.update(fillcolor=_STATUS_FILL[n.status], color=_STATUS_LINE[n.status], penwidth="2")
        if n.status == "removed":
            a["style"] = a["style"] + ",dashed"
    return a


def _summary_label(region: str, nodes: list[_GNode]) -> str:
    kinds = Counter(n.kind for n in nodes).most_common()
    lines, line = [], []
    for kind, k in kinds[:9]:
        line.append(f"{kind} {k}")
        if len(line) == 3:
            lines.append("  ".join(line))
            line = []
    if line:
        lines.append("  ".join(line))
    if len(kinds) > 9:
        lines.append(f"... {len(kinds) - 9} more kinds")
    return f"{region}: {len(nodes)} ops\n" + "\n".join(lines)


def _emit(spec: _GSpec, collapse: str, expand: Sequence[str], what: str) -> graphviz.Digraph:
    if collapse not in ("auto", "region", "none"):
        raise ValueError(f"collapse must be 'auto', 'region' or 'none', not {collapse!r}")
    ops = [n for n in spec.nodes if n.role == "op"]
    if collapse == "auto":
        collapse = "region" if len(ops) > COLLAPSE_ABOVE else "none"
    unknown = set(expand) - {n.region for n in ops}
    if unknown:
        raise ValueError(f"expand names unknown regions {sorted(unknown)}; "
                         f"this graph has {sorted({n.region or '' for n in ops})}")
    rep: dict[str, str] = {n.id: n.id for n in spec.nodes}
    shown: list[_GNode] = []
    summaries: dict[str, list[_GNode]] = {}
    if collapse == "region":
        for n in ops:
            if n.region not in expand:
                summaries.setdefault(n.region or "ops", []).append(n)
                rep[n.id] = f"region_{n.region or 'ops'}"
        for role, label in (("input", "inputs"), ("output", "outputs"), ("update", "in-place updates")):
            ends = [n for n in spec.nodes if n.role == role]
            if len(ends) > GROUP_ENDS_ABOVE:
                for n in ends:
                    rep[n.id] = f"all_{role}s"
                shown.append(_GNode(f"all_{role}s", f"{len(ends)} {label}", role))
    shown = [n for n in spec.nodes if rep[n.id] == n.id] + shown

    g = _digraph(spec.name)
    g.attr(label=what, labelloc="t", labeljust="l")
    by_region: dict[str | None, list[_GNode]] = {}
    for n in shown:
        by_region.setdefault(n.region if n.role == "op" else None, []).append(n)
    for n in by_region.pop(None, []):
        g.node(n.id, **_node_attrs(n))
    for region, members in by_region.items():
        with g.subgraph(name=f"cluster_{region}") as c:
            c.attr(label=region or "", color=REGION_COLORS.get(region or "", "#d0d7de"), style="rounded",
                   fontcolor=REGION_COLORS.get(region or "", "#24292f"))
            for n in members:
                c.node(n.id, **_node_attrs(n))
    for region, members in summaries.items():
        with g.subgraph(name=f"cluster_{region}") as c:
            c.attr(label="", color=REGION_COLORS.get(region, "#d0d7de"), style="rounded")
            c.node(f"region_{region}", label=_summary_label(region, members), shape="box3d", style="filled",
                   fillcolor=REGION_FILL.get(region, "#f6f8fa"), color=REGION_COLORS.get(region, "#57606a"),
                   fontcolor=REGION_COLORS.get(region, "#24292f"),
                   tooltip=f"{region}: {len(members)} ops; graph(expand=('{region}',)) shows them")

    agg: dict[tuple[str, str], list[str]] = {}
    for src, dst, label in spec.edges:
        rs, rd = rep[src], rep[dst]
        if rs != rd:
            agg.setdefault((rs, rd), []).append(label)
    for (rs, rd), labels in agg.items():
        if rs in rep and rd in rep and rep[rs] == rs and rep[rd] == rd:   # two drawn nodes: keep each view
            for label in labels:
                g.edge(rs, rd, label=label)
        else:                                                            # into or out of a summary
            g.edge(rs, rd, label=str(len(labels)) if len(labels) > 1 else "",
                   penwidth=f"{min(1 + len(labels) / 8, 4):.2f}")
    return g


def _program_spec(program: Program) -> _GSpec:
    namer = Namer(program)
    spec = _GSpec(program.name)
    ids: dict[str, str] = {}
    for i, inp in enumerate(program.inputs):
        ids[inp.value.buffer] = f"in{i}"
        name = namer.names[inp.value.buffer]
        spec.nodes.append(_GNode(f"in{i}", f"{name} {inp.name}\n{type_str(inp.value)}", "input",
                                 tooltip=f"input {inp.name}" + (" (updated in place)" if inp.mutated else "")))
    for k, op in enumerate(program.ops):
        ids[op.id] = f"op{k}"
        tip = f"op:{op.id}" + (f"  {op.source}" if op.source else "")
        spec.nodes.append(_GNode(f"op{k}", f"{namer.names[op.id]} {op.kind}\n{type_str(op.out)}", "op",
                                 op.region, op.kind, tip, ref=op.id))
    for k, op in enumerate(program.ops):
        for x in op.tensor_inputs:
            spec.edge(ids[x.buffer], f"op{k}", _edge_view(x, namer))
    for i, o in enumerate(program.outputs):
        spec.nodes.append(_GNode(f"out{i}", f"{o.name}\n{type_str(o.value)}", "output", tooltip=f"output {o.name}"))
        spec.edge(ids[o.value.buffer], f"out{i}", _edge_view(o.value, namer))
    for i, u in enumerate(program.updates):
        target = program.inputs[u.input_index]
        spec.nodes.append(_GNode(f"upd{i}", f"{target.name} <-\n{type_str(u.value)}", "update",
                                 tooltip=f"in-place update of {target.name}"))
        spec.edge(ids[u.value.buffer], f"upd{i}", _edge_view(u.value, namer))
    return spec


def program_graph(program: Program, *, collapse: str = "auto", expand: Sequence[str] = ()) -> graphviz.Digraph:
    """The dataflow graph of ``program`` as a ``graphviz.Digraph``.

    Ops are rounded boxes filled by region (forward/backward/optimizer), inputs point
    down (``invhouse``), outputs and in-place updates point up (``house``; updates
    dashed). An edge label shows the view a read goes through (``.T``, ``bcast 64x10``,
    ``reshape 10``, ``view``).

    ``collapse``: ``"auto"`` (default) collapses when the program has more than
    :data:`COLLAPSE_ABOVE` ops, ``"region"`` always, ``"none"`` never. Collapsed, each
    region is one summary node (op counts by kind; edge labels count the reads between
    regions) and more than :data:`GROUP_ENDS_ABOVE` inputs/outputs become one node.
    ``expand``: regions to show op by op even when collapsing, e.g. ``("optimizer",)``.
    """
    return _emit(_program_spec(program), collapse, tuple(expand), f"program {program.name}")


# == CapturedGraph ==================================================================================

def _captured_ids(cg: CapturedGraph) -> tuple[dict[str, list[str]], dict[str, str]]:
    ops_of: dict[str, list[str]] = {}
    for op in cg.program.ops:
        if op.fx_node:
            ops_of.setdefault(op.fx_node, []).append(op.id)
    placeholders = [n.name for n in cg.nodes if n.op == "placeholder"]
    buf_of = {name: inp.value.buffer for name, inp in zip(placeholders, cg.program.inputs)}
    return ops_of, buf_of


def _node_type(n: Any) -> str:
    if n.shape is None:
        return ""
    from ..ir import DTYPE_SHORT
    return f"{DTYPE_SHORT.get(n.dtype or '', n.dtype)}[{','.join(map(str, n.shape))}]"


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
        ids = [f"op:{i}" for i in ops_of.get(n.name, [])]
        if n.source is not None:
            ids.append(f"src:{n.source.short()}")
        if n.name in buf_of:
            ids.append(f"buf:{buf_of[n.name]}")
        args = ", ".join(_ref(f"fx:{a}", a) if a in names else esc(a) for a in n.args)
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
                    f'<td class="tkx-id">{op_refs}</td>{_src_cell(n.source, prev)}</tr>')
        prev = n.source
    no_ops = sum(1 for n in cg.nodes if n.op == "call_function" and n.name not in ops_of)
    summary = (f'<div class="tkx-sum"><b>{len(cg.nodes)}</b> FX nodes '
               f'({_region_counts(n.region for n in cg.nodes)}); lowered to <b>{len(cg.program.ops)}</b> IR ops. '
               + (f'{no_ops} nodes produce no IR op: views such as <code>t</code> and <code>view</code> are '
                  f'metadata on the values that read them.' if no_ops else '') + '</div>')
    body = _style() + summary + f"<table>{''.join(rows)}</table>"
    if graph:
        n_fx = sum(1 for n in cg.nodes if n.op == "call_function")
        what = "FX graph" + (" (collapsed by region)" if n_fx > COLLAPSE_ABOVE else "")
        body += _graph_block(lambda: captured_graph(cg), what, n_fx <= OPEN_GRAPH_MAX)
    return view("ir tkx-captured", f"CapturedGraph {cg.name}", body, format_captured(cg))


def captured_mimebundle(cg: CapturedGraph, include: Any = None, exclude: Any = None) -> dict[str, str]:
    from ..printer import format_captured
    return _guard(cg, lambda: captured_html(cg), lambda: format_captured(cg), include, exclude)


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


def captured_diff(a: CapturedGraph, b: Any) -> ProgramDiff:
    """The diff of two captured graphs' lowered programs."""
    other = getattr(b, "program", b)
    return program_diff(a.program, other)


# == diffs ==========================================================================================

def _op_code(op: Op, namer: Namer) -> str:
    args = ", ".join(namer.operand(x) for x in op.inputs)
    return f"{namer.names[op.id]}: {type_str(op.out)} = {op.kind}{(' ' + args) if args else ''}{_attrs(op)}"


def _sink_rows(before: Program, after: Program) -> list[tuple[str, str, str]]:
    """(status, left text, right text) for outputs and updates whose value differs."""
    na, nb = Namer(before), Namer(after)
    rows = []
    for oa, ob in zip(before.outputs, after.outputs):
        if oa.value != ob.value:
            rows.append(("changed", f"{oa.name} = {na.operand(oa.value)}", f"{ob.name} = {nb.operand(ob.value)}"))
    ua = {u.input_index: u for u in before.updates}
    for ub in after.updates:
        u = ua.get(ub.input_index)
        if u is None or u.value != ub.value:
            name = after.inputs[ub.input_index].name
            left = f"{name} <- {na.operand(u.value)}" if u is not None else ""
            rows.append(("changed" if u is not None else "added", left, f"{name} <- {nb.operand(ub.value)}"))
    return rows


@dataclass(frozen=True)
class ProgramDiff:
    """What differs between two programs (before/after a pass, or under two option sets).

    ``added``/``removed``/``changed``: op ids (see :func:`tkx.passes.op_delta`: an op is
    *changed* when its id is in both but its kind, operands, attrs, output or region
    differ). ``str(diff)`` is a one-line summary followed by a unified diff of the printed
    programs (values are named after their op ids, so only the ops that differ show up);
    in a notebook it shows the changed ops side by side. ``.graph()`` draws both programs
    in one graph, added ops green, removed red (dashed), changed yellow.
    """

    before: Program = field(repr=False)
    after: Program = field(repr=False)
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    title: str = "diff"

    @property
    def empty(self) -> bool:
        """True when the programs print the same (no op, output or update differs)."""
        return not (self.added or self.removed or self.changed or _sink_rows(self.before, self.after))

    @property
    def ids(self) -> tuple[str, ...]:
        """Every op id involved: added, removed and changed."""
        return self.added + self.removed + self.changed

    def summary(self) -> str:
        parts = [f"{self.title}: {len(self.before.ops)} -> {len(self.after.ops)} ops, "
                 f"+{len(self.added)} -{len(self.removed)} ~{len(self.changed)}"]
        for sign, ids in (("added", self.added), ("removed", self.removed), ("changed", self.changed)):
            if ids:
                parts.append(f"{sign}: {' '.join(ids)}")
        sinks = _sink_rows(self.before, self.after)
        if sinks:
            parts.append(f"{len(sinks)} outputs/updates read other values")
        return "; ".join(parts)

    def text(self, context: int = 1) -> str:
        a = format_program(self.before).splitlines()
        b = format_program(self.after).splitlines()
        return "\n".join(difflib.unified_diff(a, b, "before", "after", n=context, lineterm=""))

    def __str__(self) -> str:
        body = self.text()
        return self.summary() + "\n" + (body if body else "(the programs print the same)")

    def __repr__(self) -> str:
        return (f"<tkx.ProgramDiff {self.title}: +{len(self.added)} -{len(self.removed)} "
                f"~{len(self.changed)}>")

    def rows(self, context: int = 0) -> list[Any]:
        """Aligned side-by-side rows ``(status before, op before, status after, op after)``,
        ``("skip", n)`` for ``n`` unchanged ops. A status is ``added``/``removed``/``changed``,
        ``moved`` (same id, other position), ``same`` (context rows) or ``""`` (no op)."""
        return _aligned(self.before, self.after, set(self.added), set(self.removed), context)

    def html(self, context: int = 0) -> str:
        return _side_by_side(self, context)

    def graph(self, **kw: Any) -> graphviz.Digraph:
        return diff_graph(self.before, self.after, **kw)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return _guard(self, lambda: view("ir tkx-diff", self.summary().split(";")[0],
                                         _style() + _side_by_side(self, 1), str(self)),
                      lambda: str(self), include, exclude)


def program_diff(before: Program, after: Any, title: str = "diff") -> ProgramDiff:
    """:class:`ProgramDiff` of ``before`` against ``after`` (a Program, or anything with ``.program``)."""
    from ..passes.trace import op_delta

    other = after if isinstance(after, Program) else getattr(after, "program", None)
    if not isinstance(other, Program):
        raise TypeError(f"diff expects a Program (or a CapturedGraph), got {type(after).__name__}")
    added, removed, changed = op_delta(before, other)
    return ProgramDiff(before, other, added, removed, changed, title)


Row = tuple[str, "Op | None", str, "Op | None"]


def _aligned(before: Program, after: Program, added: set[str], removed: set[str], context: int) -> list[Any]:
    """Rows ``(status before, op before, status after, op after)`` aligned on op ids, and
    ``("skip", n)`` for runs of ``n`` unchanged ops beyond ``context`` rows of a change."""
    a_ops, b_ops = list(before.ops), list(after.ops)
    sm = difflib.SequenceMatcher(a=[o.id for o in a_ops], b=[o.id for o in b_ops], autojunk=False)
    full: list[Row] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for x, y in zip(a_ops[i1:i2], b_ops[j1:j2]):
                st = "changed" if x != y else "same"
                full.append((st, x, st, y))
            continue
        left, right = a_ops[i1:i2], b_ops[j1:j2]
        for k in range(max(len(left), len(right))):   # a replaced block: removed | added, row by row
            lx = left[k] if k < len(left) else None
            ry = right[k] if k < len(right) else None
            full.append(("" if lx is None else "removed" if lx.id in removed else "moved", lx,
                         "" if ry is None else "added" if ry.id in added else "moved", ry))
    keep = [False] * len(full)
    for i, row in enumerate(full):
        if row[0] != "same":
            for j in range(max(0, i - context), min(len(full), i + context + 1)):
                keep[j] = True
    out: list[Any] = []
    skipped = 0
    for row, k in zip(full, keep):
        if k:
            if skipped:
                out.append(("skip", skipped))
                skipped = 0
            out.append(row)
        else:
            skipped += 1
    if skipped:
        out.append(("skip", skipped))
    return out


def _side_by_side(d: ProgramDiff, context: int) -> str:
    na, nb = Namer(d.before), Namer(d.after)
    lines = d.rows(context)
    sinks = _sink_rows(d.before, d.after)
    if all(r[0] == "skip" for r in lines) and not sinks:
        return '<div class="tkx-dim">no op differs</div>'

    def cell(status: str, op: Op | None, namer: Namer) -> str:
        if op is None:
            return '<td></td><td></td>'
        cls = _STATUS_CLASS.get(status, "")
        return (f'<td class="tkx-mark {cls}">{_STATUS_MARK.get(status, "")}</td>'
                f'<td class="{cls}" {attrs(f"op:{op.id}", _op_ids(op))}>{esc(_op_code(op, namer))}</td>')

    rows = [f'<tr><th></th><th>before ({len(d.before.ops)} ops)</th><th class="tkx-gap"></th><th></th>'
            f'<th>after ({len(d.after.ops)} ops)</th></tr>']
    for r in lines:
        if r[0] == "skip":
            rows.append(f'<tr class="tkx-skip"><td></td><td>... {r[1]} unchanged ops</td>'
                        f'<td class="tkx-gap"></td><td></td><td>...</td></tr>')
        else:
            rows.append(f'<tr>{cell(r[0], r[1], na)}<td class="tkx-gap"></td>{cell(r[2], r[3], nb)}</tr>')
    for status, left, right in sinks:
        cls = _STATUS_CLASS[status]
        rows.append(f'<tr><td class="tkx-mark {cls}">~</td><td class="{cls}">{esc(left)}</td><td class="tkx-gap"></td>'
                    f'<td class="tkx-mark {cls}">~</td><td class="{cls}">{esc(right)}</td></tr>')
    legend = ('<div class="tkx-dim"><span class="tkx-add">&nbsp;+ added&nbsp;</span> '
              '<span class="tkx-rem">&nbsp;- removed&nbsp;</span> '
              '<span class="tkx-chg">&nbsp;~ changed&nbsp;</span> &nbsp;values are named after their op ids, '
              'which passes never rename.</div>')
    return f'<table class="tkx-side">{"".join(rows)}</table>{legend}'


def diff_graph(before: Program, after: Program, *, context: int = 1, max_ops: int = COLLAPSE_ABOVE) -> Any:
    """One graph of both programs: the ops of ``after`` with added ones green and changed
    ones yellow, plus the ops of ``before`` that are gone, red and dashed.

    Above ``max_ops`` ops only the differing ops and their neighbours within ``context``
    edges are drawn."""
    from ..passes.trace import op_delta

    added, removed, changed = op_delta(before, after)
    status = {**{i: "added" for i in added}, **{i: "removed" for i in removed}, **{i: "changed" for i in changed}}
    spec_a, spec_b = _program_spec(before), _program_spec(after)
    spec = _GSpec(after.name)

    def nid(n: _GNode) -> str:      # ops by op id (shared by both programs), the rest by position
        return f"o_{n.ref}" if n.role == "op" else n.id

    for n in spec_b.nodes:
        spec.nodes.append(_GNode(nid(n), n.label, n.role, n.region, n.kind, n.tooltip, status.get(n.ref, ""), n.ref))
    for n in spec_a.nodes:
        if n.role == "op" and n.ref in status and status[n.ref] == "removed":
            label = f"{n.ref} {n.kind} (removed)\n{n.label.split(chr(10), 1)[-1]}"
            spec.nodes.append(_GNode(nid(n), label, "op", n.region, n.kind, n.tooltip, "removed", n.ref))
    by_b = {n.id: nid(n) for n in spec_b.nodes}
    by_a = {n.id: nid(n) for n in spec_a.nodes}
    for src, dst, label in spec_b.edges:
        spec.edge(by_b[src], by_b[dst], label)
    known = {n.id for n in spec.nodes}
    for src, dst, label in spec_a.edges:    # edges into removed ops, from whatever still exists
        s, d = by_a[src], by_a[dst]
        if d in known and status.get(d[2:]) == "removed" and s in known:
            spec.edge(s, d, label)
    if sum(1 for n in spec.nodes if n.role == "op") > max_ops:
        keep = {f"o_{i}" for i in status}
        frontier = set(keep)
        for _ in range(context):
            frontier = {d for s, d, _ in spec.edges if s in frontier} | {s for s, d, _ in spec.edges if d in frontier}
            keep |= frontier
        spec.nodes = [n for n in spec.nodes if n.id in keep]
        spec.edges = [e for e in spec.edges if e[0] in keep and e[1] in keep]
    return _emit(spec, "none", (), f"{before.name}: +{len(added)} -{len(removed)} ~{len(changed)}")


# == PassTrace ======================================================================================

def _id_cell(ids: Sequence[str], sign: str, cls: str) -> str:
    if not ids:
        return f'<td class="tkx-dim">{sign}0</td>'
    toks = " ".join(f'<span class="tkx-tok {cls}" {attrs(f"op:{i}")}>{esc(i)}</span>' for i in ids[:MAX_IDS_IN_CELL])
    more = f' <span class="tkx-dim">... {len(ids) - MAX_IDS_IN_CELL} more</span>' if len(ids) > MAX_IDS_IN_CELL else ""
    return f"<td><b>{sign}{len(ids)}</b> {toks}{more}</td>"


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
                                    _side_by_side(d, 0), True))
    none = "" if details else '<div class="tkx-dim">no pass changed the program</div>'
    summary = (f'<div class="tkx-sum">input <b>{len(trace.input.ops)}</b> ops, output <b>{len(trace.output.ops)}</b>'
               f' ops. Click an op id to find it in the program views on this page.</div>')
    body = _style() + summary + f'<table>{"".join(rows)}</table>' + "".join(details) + none
    title = f"PassTrace of {trace.input.name}: {len(trace.steps)} passes, {trace.ms:.2f} ms"
    return view("ir tkx-trace", title, body, str(trace))


def trace_mimebundle(trace: PassTrace, include: Any = None, exclude: Any = None) -> dict[str, str]:
    return _guard(trace, lambda: trace_html(trace), lambda: str(trace), include, exclude, plain=str(trace))


def step_diff(step: PassStep) -> ProgramDiff:
    """The :class:`ProgramDiff` of one pass (its recorded ids, titled with the pass name)."""
    return ProgramDiff(step.before, step.after, step.added, step.removed, step.changed, step.name)


def step_mimebundle(step: PassStep, include: Any = None, exclude: Any = None) -> dict[str, str]:
    d = step_diff(step)
    return _guard(step, lambda: view("ir tkx-step", step.summary(), _style() + _side_by_side(d, 1), str(d)),
                  lambda: str(d), include, exclude)


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


def trace_rich(trace: PassTrace) -> Any:
    from rich.table import Table

    header, *body = trace.rows()
    table = Table(title=str(trace).splitlines()[0], title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for s, r in zip(trace.steps, body):
        table.add_row(*r, style=None if s.modified else "dim")
    return table


@dataclass(frozen=True)
class TraceDiff:
    """Two pass traces compared step by step (same position; a name mismatch is flagged),
    plus the :class:`ProgramDiff` of their outputs."""

    a: PassTrace = field(repr=False)
    b: PassTrace = field(repr=False)

    def rows(self) -> list[tuple[str, ...]]:
        """(step, pass a, pass b, ops a, ops b, delta a, delta b, verdict), header first."""
        out: list[tuple[str, ...]] = [("#", "pass a", "pass b", "ops a", "ops b", "delta a", "delta b", "verdict")]
        n = max(len(self.a.steps), len(self.b.steps))
        for k in range(n):
            sa = self.a.steps[k] if k < len(self.a.steps) else None
            sb = self.b.steps[k] if k < len(self.b.steps) else None

            def cols(s: Any) -> tuple[str, str, str]:
                if s is None:
                    return "-", "-", "-"
                return s.name, str(len(s.after.ops)), f"+{len(s.added)} -{len(s.removed)} ~{len(s.changed)}"

            na, oa, da = cols(sa)
            nb, ob, db = cols(sb)
            if sa is None or sb is None:
                verdict = "only in " + ("b" if sa is None else "a")
            elif sa.name != sb.name:
                verdict = "different passes"
            elif sa.after == sb.after:
                verdict = "same result"
            else:
                verdict = "results differ"
            out.append((str(k + 1), na, nb, oa, ob, da, db, verdict))
        return out

    @property
    def output(self) -> ProgramDiff:
        return program_diff(self.a.output, self.b.output, title="outputs")

    @property
    def same(self) -> bool:
        return self.a.names == self.b.names and self.a.output == self.b.output

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"TraceDiff of {self.a.input.name}: {len(self.a.steps)} vs {len(self.b.steps)} passes"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(str(self.output))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<tkx.TraceDiff {len(self.a.steps)} vs {len(self.b.steps)} passes: "
                f"{'same output' if self.a.output == self.b.output else 'outputs differ'}>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        def build() -> str:
            header, *body = self.rows()
            head = "".join(f"<th>{esc(c)}</th>" for c in header)
            trs = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in body)
            out = self.output
            return view("ir tkx-tracediff", repr(self)[6:-1], _style() + f"<table><tr>{head}</tr>{trs}</table>"
                        + _details(esc(out.summary()), _side_by_side(out, 1), True), str(self))
        return _guard(self, build, lambda: str(self), include, exclude)


def trace_diff(a: PassTrace, b: Any) -> TraceDiff:
    from ..passes.trace import PassTrace

    if not isinstance(b, PassTrace):
        raise TypeError(f"PassTrace.diff expects another PassTrace, got {type(b).__name__}")
    return TraceDiff(a, b)
