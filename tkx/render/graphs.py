"""IR graphs: a neutral node list, then DOT, optionally collapsed by region.

Shared by the captured graph, the program and the program diff views.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ir import Program
from ..printer import Namer, type_str
from .base import REGION_COLORS, REGION_FILL, safe_digraph
from .ir_common import _STATUS_FILL, _STATUS_LINE, COLLAPSE_ABOVE, GROUP_ENDS_ABOVE, _edge_view

if TYPE_CHECKING:
    import graphviz

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


def _digraph(name: str) -> Any:
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


