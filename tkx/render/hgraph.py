"""Hierarchical graph views: region -> module -> fusion group -> op, collapsed to a readable first view.

:func:`program_hgraph` (IR ops) and :func:`captured_hgraph` (FX nodes) build a plain dict that
the front end (``widgets/hgraph.js``, laid out by the vendored dagre) draws as an SVG with
expand/collapse on click, search, zoom/pan and a minimap. The same dict feeds the exported report
(:func:`hgraph_html`, the scripts inlined once per page by :func:`hgraph_script`) and the JupyterLab
widget (:class:`tkx.explorer.GraphView`).

The dict::

    {"title": str, "ops": int,                       # ops (or FX nodes) in the graph
     "nodes": [{"id", "p" (parent id, "" at the top), "t" ("c" cluster | "op" | "in" | "out"),
                "l" (label; lines split by "\\n"), "k" (data-tkx-key), "i" (data-tkx-ids),
                "s" (lower-case search text), "r" (region), "n" (ops inside), "lv" (level),
                leaves also "m" (module path) and "g" (fusion group id)}],
     "edges": [[leaf id, leaf id], ...],           # between leaves; the view merges them per drawn pair
     "open": [cluster id, ...]}                    # expanded in the first view

The first view expands clusters breadth first while at most :data:`FIRST_VIEW_NODES` boxes are
drawn. Module paths come from ``op.module`` / ``node.module`` (``"blocks.1.attn"``, recorded by the
capture: :mod:`tkx.capture.modules`); ops outside every module sit directly under their region. A
cluster of more than :data:`CHUNK_ABOVE` children is split into runs of consecutive children so no
expansion draws a wall of boxes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..words import plural
from .base import REGION_COLORS, esc

__all__ = ["FIRST_VIEW_NODES", "CHUNK_ABOVE", "program_hgraph", "captured_hgraph", "hgraph_html",
           "hgraph_script", "module_of"]

#: The first view draws at most this many boxes (collapsed clusters and single ops).
FIRST_VIEW_NODES = 40
#: A cluster with more children than this is split into runs of consecutive children.
CHUNK_ABOVE = 24
#: Children per run when a cluster is split.
CHUNK_SIZE = 16
#: The licence line kept with the vendored layout library wherever it is inlined.
DAGRE_NOTICE = "/*! @dagrejs/dagre 3.1.3 | MIT licence | Copyright (c) 2012-2014 Chris Pettitt */\n"
#: Regions in drawing order.
REGIONS = ("forward", "backward", "optimizer")


def module_of(item: Any) -> tuple[str, str]:
    """``(dotted module path, module class name)`` recorded on an IR op or FX node, or ``("", "")``.

    Reads ``item.module`` (the dotted path; ``""``, the root module, and ``None`` give no level)
    and ``item.module_type`` (the class name, ``None`` when only parameter names told the path)."""
    m = getattr(item, "module", None)
    if not m:
        return "", ""
    cls = getattr(item, "module_type", None) or getattr(item, "module_class", None) or ""
    return str(m), str(cls)


@dataclass
class _Leaf:
    id: str
    label: str
    kind: str                   # "op" | "in" | "out"
    key: str = ""
    ids: str = ""
    search: str = ""
    region: str = ""
    module: str = ""
    module_cls: str = ""
    group: str = ""


@dataclass
class _Cluster:
    id: str
    label: str
    level: str                  # "region" | "module" | "group" | "chunk" | "ends"
    region: str = ""
    key: str = ""
    ids: str = ""
    search: str = ""
    children: list[Any] = field(default_factory=list)
    index: dict[str, _Cluster] = field(default_factory=dict)

    def child(self, cid: str, label: str, level: str, **kw: Any) -> _Cluster:
        c = self.index.get(cid)
        if c is None:
            c = _Cluster(cid, label, level, **kw)
            self.index[cid] = c
            self.children.append(c)
        return c


def _count(node: Any) -> int:
    return sum(_count(c) for c in node.children) if isinstance(node, _Cluster) else 1


def _tidy(c: _Cluster) -> Any:
    """Children tidied bottom up: a group of one op is the op; a cluster whose only child is a
    cluster is that child (labelled with the deeper path); long child lists are split in runs."""
    kids = [_tidy(k) if isinstance(k, _Cluster) else k for k in c.children]
    kids = [k for k in kids if not (isinstance(k, _Cluster) and not k.children)]
    if len(kids) > CHUNK_ABOVE:
        runs = []
        for start in range(0, len(kids), CHUNK_SIZE):
            part = kids[start:start + CHUNK_SIZE]
            n = sum(_count(k) for k in part)
            first, last = _first_line(part[0]), _first_line(part[-1])
            label = f"{first} .. {last}\n{plural(n, 'op')}" if len(part) > 1 else f"{first}\n{plural(n, 'op')}"
            run = _Cluster(f"{c.id}/run{start // CHUNK_SIZE}", label, "chunk", region=c.region)
            run.children = part
            runs.append(run)
        kids = runs
    c.children = kids
    if c.level in ("module", "group") and len(kids) == 1:
        only = kids[0]
        if isinstance(only, _Cluster) and c.level == "module" and only.level == "module":
            return only
        if not isinstance(only, _Cluster) and c.level == "group":
            return only
    return c


def _first_line(node: Any) -> str:
    return node.label.split("\n", 1)[0]


def _hierarchy(title: str, leaves: list[_Leaf], edges: Iterable[tuple[str, str]],
               group_kind: dict[str, str], classes: dict[str, Any]) -> dict[str, Any]:
    root = _Cluster("", title, "root")
    ins = [x for x in leaves if x.kind == "in"]
    outs = [x for x in leaves if x.kind == "out"]
    ops = [x for x in leaves if x.kind == "op"]
    n_region = {r: sum(1 for x in ops if x.region == r) for r in {x.region for x in ops}}
    if ins:
        root.child("inputs", f"inputs\n{plural(len(ins), 'value')}", "ends").children.extend(ins)
    order = {r: i for i, r in enumerate(REGIONS)}
    for x in sorted(ops, key=lambda x: order.get(x.region, len(REGIONS))):   # stable: graph order kept
        region = x.region or "ops"
        node = root.child(region, f"{region}\n{plural(n_region.get(x.region, 0), 'op')}", "region", region=x.region,
                          search=region)
        if x.module:
            parts = x.module.split(".")
            for d in range(1, len(parts) + 1):
                path = ".".join(parts[:d])
                cls = classes.get(path) or (x.module_cls if d == len(parts) else "") or ""
                node = node.child(f"{node.id}/{path}", f"{path} · {cls}" if cls else path, "module",
                                  region=x.region, key=f"mod:{path}", ids=f"mod:{path}",
                                  search=f"{path} {cls}".lower())
        if x.group:
            kind = group_kind.get(x.group, "")
            node = node.child(f"{node.id}/{x.group}", f"{x.group}" + (f" ({kind})" if kind else ""), "group",
                              region=x.region, key=f"grp:{x.group}", ids=f"grp:{x.group}", search=x.group.lower())
        node.children.append(x)
    if outs:
        root.child("outputs", f"outputs\n{plural(len(outs), 'value')}", "ends").children.extend(outs)
    for i, c in enumerate(root.children):
        root.children[i] = _tidy(c)

    nodes: list[dict[str, Any]] = []

    def walk(node: Any, parent: str) -> None:
        if isinstance(node, _Cluster):
            n = _count(node)
            label = node.label
            if node.level in ("module", "group"):
                label += f"\n{plural(n, 'op')}"
            nodes.append({"id": node.id, "p": parent, "t": "c", "l": label, "k": node.key, "i": node.ids,
                          "s": node.search, "r": node.region, "n": n, "lv": node.level})
            for k in node.children:
                walk(k, node.id)
        else:
            nodes.append({"id": node.id, "p": parent, "t": node.kind, "l": node.label, "k": node.key,
                          "i": node.ids, "s": node.search, "r": node.region, "n": 1, "lv": "op",
                          "m": node.module, "g": node.group})

    for c in root.children:
        walk(c, "")
    return {"title": title, "ops": len(ops), "nodes": nodes, "edges": [list(e) for e in dict.fromkeys(edges)],
            "open": first_view(nodes)}


def first_view(nodes: list[dict[str, Any]], limit: int = FIRST_VIEW_NODES) -> list[str]:
    """Cluster ids to expand, breadth first, while at most ``limit`` boxes are drawn (inputs,
    outputs and runs of consecutive ops stay closed)."""
    kids: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        kids.setdefault(n["p"], []).append(n)
    shown = len(kids.get("", []))
    frontier = [n for n in kids.get("", []) if n["t"] == "c"]
    opened: list[str] = []
    while frontier:
        nxt = []
        for c in frontier:
            more = len(kids.get(c["id"], [])) - 1
            if c["lv"] not in ("ends", "chunk") and shown + more <= limit:   # runs stay closed: a row of
                # consecutive ops reads worse than the region's next level
                shown += more
                opened.append(c["id"])
                nxt += [k for k in kids.get(c["id"], []) if k["t"] == "c"]
        frontier = nxt
    return opened


def _groups(schedule: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(op id -> group id, group id -> kind) of a FusedSchedule (empty without one)."""
    if schedule is None:
        return {}, {}
    of: dict[str, str] = {}
    for g in schedule.groups_in_order():
        for op_id in g.ops:
            of.setdefault(op_id, g.id)
    return of, {g.id: g.kind for g in schedule.groups.values()}


def program_hgraph(program: Any, schedule: Any = None) -> dict[str, Any]:
    """The hierarchical graph of a :class:`~tkx.ir.Program`; with ``schedule`` (a
    :class:`~tkx.schedule.FusedSchedule` of this program or of its optimized form) ops are
    grouped by their fusion group. Op nodes are keyed ``op:<id>`` like every other view."""
    from ..printer import type_str
    from .ir_common import _op_ids

    group_of, group_kind = _groups(schedule)
    leaves: list[_Leaf] = []
    home: dict[str, str] = {}
    for i, inp in enumerate(program.inputs):
        buf = inp.value.buffer
        home[buf] = f"i{i}"
        leaves.append(_Leaf(f"i{i}", f"{inp.name}\n{type_str(inp.value)}", "in", key=f"buf:{buf}", ids=f"buf:{buf}",
                            search=f"{inp.name} {buf}".lower()))
    for op in program.ops:
        path, cls = module_of(op)
        home[op.id] = f"o:{op.id}"
        grp = group_of.get(op.id, "")
        ids = _op_ids(op)
        where = f"  {op.source.short()}" if op.source is not None else ""
        leaves.append(_Leaf(f"o:{op.id}", f"{op.id} {op.kind}\n{type_str(op.out)}", "op", key=f"op:{op.id}",
                            ids=" ".join(ids),
                            search=f"{op.id} {op.kind} {path} {cls} {op.fx_node or ''}{where}".lower(),
                            region=op.region, module=path, module_cls=cls, group=grp))
    edges = []
    for op in program.ops:
        for x in op.tensor_inputs:
            if x.buffer in home:
                edges.append((home[x.buffer], f"o:{op.id}"))
    for i, o in enumerate(program.outputs):
        leaves.append(_Leaf(f"out{i}", f"{o.name}\n{type_str(o.value)}", "out", key=f"out:{i}", search=o.name.lower()))
        if o.value.buffer in home:
            edges.append((home[o.value.buffer], f"out{i}"))
    for i, u in enumerate(program.updates):
        target = program.inputs[u.input_index]
        leaves.append(_Leaf(f"upd{i}", f"{target.name} <-\n{type_str(u.value)}", "out", key=f"upd:{u.input_index}",
                            search=target.name.lower()))
        if u.value.buffer in home:
            edges.append((home[u.value.buffer], f"upd{i}"))
    return _hierarchy(f"program {program.name}", leaves, edges, group_kind, dict(getattr(program, "modules", {})))


def captured_hgraph(cg: Any, schedule: Any = None) -> dict[str, Any]:
    """The hierarchical graph of a :class:`~tkx.capture.CapturedGraph` (one leaf per FX node,
    keyed ``fx:<name>``); with ``schedule`` an FX node sits in the fusion group of its first IR op."""
    from .captured import _captured_ids, _node_ids, _node_type
    from .ir_common import _short_target

    group_of, group_kind = _groups(schedule)
    ops_of, buf_of = _captured_ids(cg)
    placeholders = {name: i for i, name in enumerate(n.name for n in cg.nodes if n.op == "placeholder")}
    leaves: list[_Leaf] = []
    names = {n.name for n in cg.nodes}
    for n in cg.nodes:
        ids = _node_ids(n, ops_of, buf_of)
        if n.op == "placeholder":
            what = cg.input_names[placeholders[n.name]]
            leaves.append(_Leaf(f"n:{n.name}", f"{what}\n{_node_type(n)}", "in", key=f"fx:{n.name}", ids=" ".join(ids),
                                search=f"{n.name} {what}".lower()))
        elif n.op == "output":
            leaves.append(_Leaf(f"n:{n.name}", "return", "out", key=f"fx:{n.name}", ids=" ".join(ids),
                                search="output return"))
        else:
            target = _short_target(n.target)
            path, cls = module_of(n)
            grp = next((group_of[i] for i in ops_of.get(n.name, []) if i in group_of), "")
            where = f"  {n.source.short()}" if n.source is not None else ""
            leaves.append(_Leaf(f"n:{n.name}", f"{n.name} {target.split('.')[0]}\n{_node_type(n)}", "op",
                                key=f"fx:{n.name}", ids=" ".join(ids),
                                search=f"{n.name} {target} {n.target} {path} {cls}{where}".lower(),
                                region=n.region or "",
                                module=path, module_cls=cls, group=grp))
    edges = [(f"n:{a}", f"n:{n.name}") for n in cg.nodes for a in n.args if a in names]
    return _hierarchy(f"captured graph {cg.name} (FX, aten ops)", leaves, edges, group_kind,
                      dict(getattr(cg.program, "modules", {})))


def _json_for_script(data: dict[str, Any]) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</`` can end the element)."""
    return json.dumps(data, separators=(",", ":"), sort_keys=False).replace("</", "<\\/")


def hgraph_html(data: dict[str, Any], what: str) -> str:
    """The placeholder a page script turns into the interactive view (:func:`hgraph_script`);
    where scripts do not run it reads as one line saying so."""
    colors = json.dumps(REGION_COLORS)
    return (f'<div class="tkx-hg" data-tkx-hg-colors="{esc(colors)}" aria-label="{esc(what)}">'
            f'<div class="tkx-hg-wait tkx-dim">{esc(what)}: {data["ops"]} ops (the interactive graph needs '
            f"scripts)</div>"
            f'<script type="application/json" class="tkx-hg-data">{_json_for_script(data)}</script></div>')


def hgraph_script() -> str:
    """The scripts of the interactive view, for a page: vendored dagre, ``hgraph.js`` and a loader
    that draws every ``.tkx-hg`` placeholder on the page."""
    from .assets import read_asset

    loader = ("(function(){document.querySelectorAll('.tkx-hg').forEach(function(el){if(el.__tkxHg)return;"
              "var d=el.querySelector('.tkx-hg-data');if(!d)return;el.__tkxHg=tkxHGraph(el,JSON.parse(d.textContent),"
              "{colors:JSON.parse(el.getAttribute('data-tkx-hg-colors')||'{}')});});})();")
    return (DAGRE_NOTICE + read_asset("vendor/dagre.min.js") + "\n" + read_asset("hgraph.js") + "\n" + loader)


def hgraph_style() -> str:
    """The view's CSS (also inside ``widgets/hgraph.css`` for the widget)."""
    from .assets import read_asset

    return read_asset("hgraph.css")
