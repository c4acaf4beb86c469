"""The views of :class:`~tkx.schedule.model.FusedSchedule`: stages, barriers and groups as
HTML, the fusion decisions, the graph (one cluster per group) and a rich table."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from .. import display
from ..schedule.model import FusedSchedule
from ..schedule.text import describe_group, format_schedule, group_modules, module_note
from ..target.gemm import has_tiles
from ..words import plural
from .base import REGION_COLORS, REGION_FILL, attrs, capped, esc, graph_html, safe_digraph
from .stage_common import _dst_text, _home_text, _op_ids, _ref_tokens, _region, _shape, _view


def group_tokens(s: Any, gid: str) -> list[str]:
    """Provenance ids of a schedule group: its ops, inlined ops, stores, buffers and stage."""
    g = s.groups[gid]
    ops = _op_ids(s.program)
    toks = [f"op:{o}" for o in (*g.ops, *g.inlined, *g.stores) if o in ops]
    toks += [f"buf:{b}" for b in (*g.stores, *g.reads)]
    if g.kind == "copy":
        toks.append(f"op:{g.anchor}")
    toks.append(f"stage:{s.stage_of(gid)}")
    toks += [f"mod:{m}" for m in group_modules(s, g)]
    return toks


def _module_chip(s: Any, g: Any) -> str:
    """The module(s) a group's ops came from, before what it computes (every path in the tooltip)."""
    note = module_note(s, g)
    if not note:
        return ""
    mods = group_modules(s, g)
    return (f'<span class="tkx-dim" style="color:#8250df" {attrs(None, [f"mod:{m}" for m in mods])} '
            f'title="{esc("nn.Module " + ", ".join(m or "(root)" for m in mods))}">{esc(note)}</span> ')


def _kind_prefix(op: Any) -> str:
    """``"sum "`` for op ``sum_3`` (shown next to its id), nothing when the id is the kind."""
    return "" if op.id == op.kind else f"{op.kind} "


def describe_params(s: Any, g: Any) -> tuple[str, str]:
    """(what the group computes and how, why the emitter variant was chosen)."""
    p = g.params
    if g.kind == "copy":
        task = s.copies[g.id]
        return f"copy {task.src.buffer} → {_dst_text(s, task.dst_home)} ({p.get('numel', task.src.numel)} elements)", ""
    anchor = s.program.op(g.anchor)
    why = str(p.get("why", ""))
    if g.kind == "gemm":
        batch = f"[{p['batch']}×] " if p.get("batch", 1) > 1 else ""
        head = f"{_kind_prefix(anchor)}{batch}{p['m']}×{p['k']} @ {p['k']}×{p['n']} · {p['impl']}"
        if has_tiles(str(p["impl"])):
            head += f" tile {p['tile_m']}×{p['tile_n']}×{p['tile_k']}"
        if p.get("split_k", 1) > 1:
            head += f" split-k {p['split_k']}" + (" (last slice adds)" if p.get("split_final") == "last-slice" else "")
        return head, why
    if g.kind in ("reduction", "reduction_partial"):
        head = (f"{'partial ' if g.kind == 'reduction_partial' else ''}{_kind_prefix(anchor)}"
                f"{p['rows']} row{'s' if p['rows'] != 1 else ''} × {p['size']}")
        head += f" · {p['strategy']}"
        if "parts" in p:
            head += f" ({p['parts']} parts{'' if g.kind == 'reduction_partial' else ', final'})"
        return head, why
    if g.kind in ("attention", "attention_partial"):
        head = (f"fused {_kind_prefix(anchor)}[{p['batch']}×] {p['q_len']}×{p['head_dim']} over {p['kv_len']} keys"
                f" · {p['impl']} tiles {p['tile_q']}×{p['tile_k']}" + (" · causal" if p["causal"] else "")
                + (f" · {p['mask']} mask" if p["mask"] != "none" else ""))
        if p["impl"] == "flash_decode":
            head += " · phase 1 (KV tiles)" if g.kind == "attention_partial" else " · phase 2 (combine)"
        return head, why
    return f"pointwise over {_shape(anchor.out.shape)}", why


def _chip(op: str, program: Any, gid: str, inlined: bool = False, label: str | None = None) -> str:
    region = _region(program, op)
    cls = f"tkx-chip tkx-region-{region}" + (" tkx-inl" if inlined else "")
    return f'<span class="{cls}" {attrs(f"op:{op}", [f"grp:{gid}"])}>{esc(label or op)}</span>'


def _decision_table(s: Any) -> str:
    ops = _op_ids(s.program)
    by_kind: dict[str, list[Any]] = {}
    for d in s.decisions:
        by_kind.setdefault(d.kind, []).append(d)
    parts = [f'<div class="tkx-sub">Fusion decisions ({len(s.decisions)}: '
             f'{sum(d.fused for d in s.decisions)} fused, {sum(not d.fused for d in s.decisions)} not fused)</div>',
             '<div class="tkx-why">inline: producer recomputed inside its consumer · epilogue: pointwise consumer '
             'applied to a GEMM/reduction result · loop: pointwise ops sharing one loop · in-place: state update '
             'written into the user tensor · attention: one fused FlashAttention group or the math. '
             'Not fused first.</div>']
    for kind, ds in by_kind.items():
        nf = sum(not d.fused for d in ds)
        rows = []
        for d in sorted(ds, key=lambda d: d.fused):  # stable: not fused first, then decision order
            mark = '<span class="tkx-ok">✓ fused</span>' if d.fused else '<span class="tkx-no">✗ not fused</span>'
            ptoks, ctoks = _ref_tokens(s.program, d.producer, ops), _ref_tokens(s.program, d.consumer, ops)
            rows.append(
                f'<tr class="{"tkx-fused" if d.fused else "tkx-notfused"}" {attrs(None, ptoks + ctoks)}>'
                f'<td>{mark}</td>'
                f'<td {attrs(ptoks[0] if ptoks else None, ptoks)}>{esc(d.producer)}</td>'
                f'<td>→</td><td {attrs(ctoks[0] if ctoks else None, ctoks)}>{esc(d.consumer)}</td>'
                f'<td>{esc(d.rule)}</td><td>{esc(d.code)}</td>'
                f'<td style="white-space:normal">{esc(d.reason)}</td></tr>')
        parts.append(f'<details{" open" if nf else ""}><summary>{esc(kind)}: {plural(len(ds), "candidate")}, '
                     f'{nf} not fused</summary><table><tr><th></th><th>producer</th><th></th><th>consumer</th>'
                     f'<th>rule</th><th>code</th><th>reason</th></tr>{"".join(rows)}</table></details>')
    return "".join(parts)


def _barrier_tokens(hazards: Iterable[str], ops: set[str]) -> list[str]:
    toks: list[str] = []
    for h in hazards:
        m = re.match(r"\s*\w+\s+([^:]+):\s*(\S+)\s*->\s*(\S+)", h)
        if m:
            buf, a, b = m.groups()
            toks += [f"buf:{buf}"] + ([f"op:{buf}"] if buf in ops else []) + [f"grp:{a}", f"grp:{b}"]
    return list(dict.fromkeys(toks))


@display.register(FusedSchedule, "html")
def schedule_html(s: Any, graph: bool = True) -> str:
    """The schedule as HTML: header, stages and barriers, groups, every fusion decision."""
    ops = _op_ids(s.program)
    nf = sum(not d.fused for d in s.decisions)
    barrier_kind = "__syncthreads" if s.mode == "block" else "grid barrier"
    head = (
        '<table class="tkx-kv">'
        f'<tr><td>mode</td><td><b>{esc(s.mode)}</b> — {esc(s.mode_reason)}</td></tr>'
        f'<tr><td>grid</td><td>{s.blocks} block{"s" if s.blocks != 1 else ""} × {s.threads} threads</td></tr>'
        f'<tr><td>stages</td><td>{plural(len(s.stages), "stage")}, {plural(len(s.groups), "group")}, '
        f'{plural(s.num_barriers, "barrier")} ({esc(barrier_kind)})</td></tr>'
        f'<tr><td>decisions</td><td>{plural(len(s.decisions), "fusion candidate")}, {nf} not fused</td></tr></table>')
    rows = ['<tr><th>group</th><th>kind</th><th>computes</th><th>items</th><th>epilogue / loop</th>'
            '<th>inlined</th><th>stores → home</th></tr>']
    for i, stage in enumerate(s.stages):
        if i > 0:
            b = s.barriers[i - 1]
            rows.append(f'<tr class="tkx-barrier-row" {attrs(None, _barrier_tokens(b.hazards, ops))}>'
                        f'<td colspan="7">━━ barrier before stage {i} ({esc(b.kind)}): '
                        f'{esc("; ".join(b.hazards))}</td></tr>')
        side = "1 group" if len(stage) == 1 else f"{len(stage)} groups side by side"
        rows.append(f'<tr class="tkx-stage-row"><td colspan="7" {attrs(f"stage:{i}")}>stage {i} '
                    f'<span class="tkx-dim">({side})</span>'
                    '</td></tr>')
        for gid in stage:
            g = s.groups[gid]
            what, why = describe_params(s, g)
            region = _region(s.program, g.anchor)
            color = REGION_COLORS.get(region, "#57606a")
            anchor = _chip(g.anchor, s.program, gid) if g.anchor in ops and g.kind != "copy" else ""
            epi = "".join(_chip(o, s.program, gid) for o in g.ops[1:])
            inl = "".join(_chip(o, s.program, gid, inlined=True) for o in g.inlined)
            stores = "<br>".join(
                (_chip(b, s.program, gid) if b in ops else
                 f'<span class="tkx-chip" {attrs(f"buf:{b}", [f"grp:{gid}"])}>{esc(b)}</span>')
                + f' → {esc(_home_text(s, b))}' for b in g.stores)
            if g.kind == "copy":
                stores = esc(_dst_text(s, s.copies[gid].dst_home)) + " (staged commit)"
            rows.append(
                f'<tr class="tkx-grp" {attrs(f"grp:{gid}", group_tokens(s, gid))}>'
                f'<td class="tkx-nowrap" style="border-left:3px solid {color};padding-left:4px"><b>{esc(gid)}</b></td>'
                f'<td class="tkx-nowrap">{esc(g.kind)}</td>'
                f'<td style="min-width:24em">{_module_chip(s, g)}{anchor} {esc(what)}'
                + (f'<div class="tkx-why">{esc(why)}</div>' if why else "") + '</td>'
                f'<td class="tkx-nowrap">{g.work_items}</td><td>{epi}</td><td>{inl}</td>'
                f'<td class="tkx-nowrap">{stores}</td></tr>')
    legend = ('<div class="tkx-why">colours: <span class="tkx-region-forward">forward</span> · '
              '<span class="tkx-region-backward">backward</span> · <span class="tkx-region-optimizer">optimizer'
              '</span>; dashed = inlined (recomputed in registers, never stored). Groups in one stage run '
              'concurrently on the grid; a barrier separates stages. items = independent work items (tiles, '
              'row blocks) spread over the blocks. Hazards: RAW = a group reads what an earlier stage wrote; '
              'WAR = a write must wait until earlier reads are done.</div>')
    stages = capped(f'<table>{"".join(rows)}</table>', len(rows), "rows")
    body = head + '<div class="tkx-sub">Stages</div>' + legend + stages + _decision_table(s)
    if graph:
        try:
            g_html = graph_html(schedule_graph(s), alt=f"schedule graph of {s.program.name}")
        except Exception as exc:  # the graphviz package missing or broken: the table is enough
            g_html = f'<div class="tkx-dim">no graph: {esc(type(exc).__name__)}: {esc(exc)}</div>'
        body += (f'<details><summary>graph: one box per group, blue edges = values read from memory, '
                 f'red = barriers</summary>{g_html}</details>')
    return _view("schedule", f"FusedSchedule {s.program.name}", body, str(s))


def _node_id(gid: str, op: str) -> str:
    return re.sub(r"\W", "_", f"{gid}__{op}")


#: ``collapse="auto"`` draws every op up to this many op nodes in all groups ...
OPS_SHOWN_MAX = 30
#: ... one node per group up to this many groups, and one node per stage above it.
GROUPS_SHOWN_MAX = 24


def _collapse_levels(s: Any, collapse: str, expand: Sequence[Any]) -> dict[str, str]:
    """group id -> how it is drawn: ``"ops"`` (a cluster of its ops), ``"group"`` (one node) or
    ``"stage"`` (folded into its stage's one node). ``expand`` names groups or stage indices
    drawn op by op whatever ``collapse`` says."""
    if collapse not in ("auto", "none", "group", "stage"):
        raise ValueError(f"collapse={collapse!r}: use 'auto', 'none' (every op), 'group' (one node per group) "
                         "or 'stage' (one node per stage)")
    if collapse == "auto":
        n_ops = sum(len(set(g.ops) | set(g.inlined)) for g in s.groups.values())
        collapse = "none" if n_ops <= OPS_SHOWN_MAX else "group" if len(s.groups) <= GROUPS_SHOWN_MAX else "stage"
    level = {"none": "ops", "group": "group", "stage": "stage"}[collapse]
    wanted = {str(x) for x in expand}
    out = {}
    for i, stage in enumerate(s.stages):
        for gid in stage:
            out[gid] = "ops" if (gid in wanted or str(i) in wanted) else level
    return out


@display.register(FusedSchedule, "graph")
def schedule_graph(s: Any, *, collapse: str = "auto", expand: Sequence[Any] = ()) -> Any:
    """A ``graphviz.Digraph``: one cluster per group (inlined ops dashed), stage labels and
    barrier separators on the left, memory reads between groups labelled with the buffer.

    ``collapse``: ``"none"`` draws every op, ``"group"`` one node per group, ``"stage"`` one node
    per stage (its groups listed); ``"auto"`` (default) picks by size (:data:`OPS_SHOWN_MAX`,
    :data:`GROUPS_SHOWN_MAX`) so a big schedule stays readable. ``expand``: group ids or stage
    indices drawn op by op anyway (``s.graph(expand=(2, "g7"))``). Raises :class:`ValueError`
    for another ``collapse``."""
    program = s.program
    ops = _op_ids(program)
    levels = _collapse_levels(s, collapse, expand)
    dot = safe_digraph(name=f"schedule_{program.name}", graph_attr={
        "rankdir": "TB", "compound": "true", "fontname": "Helvetica", "fontsize": "11",
        "nodesep": "0.25", "ranksep": "0.35", "newrank": "true"},
        node_attr={"fontname": "Helvetica", "fontsize": "10", "shape": "box", "style": "rounded,filled",
                   "height": "0.3"},
        edge_attr={"fontname": "Helvetica", "fontsize": "9", "color": "#57606a"})
    writer: dict[str, str] = {}  # buffer -> node that stores it
    entries: dict[str, list[str]] = {}  # gid -> nodes with no in-group producer
    exits: dict[str, list[str]] = {}  # gid -> nodes with no in-group consumer
    members: dict[str, dict[str, str]] = {}  # gid -> op -> node
    folded: dict[int, str] = {}  # stage index -> its one node (collapse="stage")
    for gid in (g for stage in s.stages for g in stage):
        g = s.groups[gid]
        nodes: dict[str, str] = {}
        region = _region(program, g.anchor)
        level = levels[gid]
        if level != "ops":
            what = sorted(set(g.ops) | set(g.inlined) | ({g.anchor} if g.kind == "copy" else set()))
            if level == "group":
                n = _node_id(gid, "group")
                more = f"\n{len(what)} ops: {_few(what)}" if len(what) > 1 else ""
                dot.node(n, f"{gid} · {g.kind} · stage {s.stage_of(gid)}\n{g.anchor}{more}",
                         fillcolor=REGION_FILL.get(region, "#f6f8fa"), color=REGION_COLORS.get(region, "#57606a"))
            else:
                i = s.stage_of(gid)
                n = folded.get(i)
                if n is None:
                    n = folded[i] = f"stage_node_{i}"
                    lines = [f"{x} · {s.groups[x].kind} · {s.groups[x].anchor}" for x in s.stages[i]]
                    dot.node(n, f"stage {i}: {plural(len(lines), 'group')}\n" + "\n".join(lines[:8])
                             + (f"\n... {len(lines) - 8} more" if len(lines) > 8 else ""),
                             fillcolor="#f6f8fa", color="#57606a", shape="box")
            for o in (*what, *g.stores):
                nodes[o] = n
            for b in g.stores:
                writer[b] = n
            members[gid] = nodes
            entries[gid] = exits[gid] = [n]
            continue
        with dot.subgraph(name="cluster_" + re.sub(r"\W", "_", gid)) as c:
            c.attr(label=f"{gid} · {g.kind} · stage {s.stage_of(gid)}", style="rounded",
                   color=REGION_COLORS.get(region, "#8c959f"), fontcolor="#24292f", labeljust="l")
            if g.kind == "copy":
                task = s.copies[gid]
                n = _node_id(gid, "copy")
                c.node(n, f"copy {task.src.buffer}\n→ {_dst_text(s, task.dst_home)}", fillcolor="#fff8c5")
                nodes[g.anchor] = n
            for o in (*g.inlined, *g.ops):
                inl = o in g.inlined and o not in g.ops
                n = _node_id(gid, o)
                kind = program.op(o).kind if o in ops else o
                label = o if kind == o else f"{o}\n{kind}"
                fill = "white" if inl else REGION_FILL.get(_region(program, o), "#f6f8fa")
                style = "rounded,dashed,filled" if inl else "rounded,filled"
                pen = "2" if o in g.stores else "1"
                c.node(n, label, style=style, fillcolor=fill, penwidth=pen,
                       color=REGION_COLORS.get(_region(program, o), "#57606a"))
                nodes[o] = n
            if g.kind in ("reduction_partial", "attention_partial"):
                for b in g.stores:
                    if b not in ops:
                        n = _node_id(gid, b)
                        c.node(n, f"{b}\n(scratch)", shape="note", style="filled", fillcolor="#fff8c5")
                        nodes[b] = n
                        if g.anchor in nodes:
                            c.edge(nodes[g.anchor], n)
        # edges inside the group
        has_in, has_out = set(), set()
        for o, n in nodes.items():
            if o not in ops:
                continue
            for t in program.op(o).tensor_inputs:
                if t.buffer in nodes and t.buffer != o:
                    dot.edge(nodes[t.buffer], n)
                    has_in.add(n)
                    has_out.add(nodes[t.buffer])
        for b in g.stores:
            if b in nodes:
                writer[b] = nodes[b]
        members[gid] = nodes
        entries[gid] = [n for n in nodes.values() if n not in has_in] or list(nodes.values())[:1]
        exits[gid] = [n for n in nodes.values() if n not in has_out] or list(nodes.values())[-1:]
    # memory reads between groups
    reads: dict[tuple[str, str], list[str]] = {}
    for gid in (g for stage in s.stages for g in stage):
        g = s.groups[gid]
        nodes = members[gid]
        for b in g.reads:
            if b not in writer or writer[b] in nodes.values():
                continue
            target = None
            for o, n in nodes.items():
                if o in ops and any(t.buffer == b for t in program.op(o).tensor_inputs):
                    target = n
                    break
            target = target or (entries[gid][0] if entries[gid] else None)
            if target and target != writer[b]:
                reads.setdefault((writer[b], target), []).append(b)
    for (src, dst), bufs in reads.items():  # one edge per pair of nodes, naming what it carries
        label = ", ".join(dict.fromkeys(bufs)) if len(set(bufs)) <= 3 else f"{len(set(bufs))} values"
        dot.edge(src, dst, label=label, color="#0969da", fontcolor="#0969da", penwidth="1.3")
    # stage labels and barrier separators: a chain of plain nodes, each above its stage's groups
    prev = None
    for i, stage in enumerate(s.stages):
        if i > 0:
            b = s.barriers[i - 1]
            bn = f"barrier_{i}"
            dot.node(bn, f"━━ barrier ({b.kind}) ━━\n{len(b.hazards)} hazard{'s' if len(b.hazards) != 1 else ''}",
                     shape="plaintext", style="", fontcolor="#b42318", fontsize="10")
            for n in dict.fromkeys(n for gid in s.stages[i - 1] for n in exits[gid]):
                dot.edge(n, bn, style="invis", weight="0")
            if prev:
                dot.edge(prev, bn, style="invis")
            prev = bn
        sn = f"stage_{i}"
        dot.node(sn, f"stage {i}", shape="plaintext", style="", fontcolor="#57606a", fontsize="11")
        if prev:
            dot.edge(prev, sn, style="invis")
        for n in dict.fromkeys(n for gid in stage for n in entries[gid]):
            dot.edge(sn, n, style="invis", weight="0")
        prev = sn
    return dot


def _few(names: Sequence[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names)})" if len(names) > n else "")


@display.register(FusedSchedule, "rich")
def schedule_rich(s: Any) -> Any:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"FusedSchedule {s.program.name}", caption=f"mode {s.mode}: {s.mode_reason}; "
              f"{plural(s.blocks, 'block')} × {s.threads} threads", show_lines=False, expand=False)
    t.add_column("stage", style="dim")
    t.add_column("group", style="bold")
    t.add_column("kind")
    t.add_column("what")
    for i, stage in enumerate(s.stages):
        if i > 0:
            b = s.barriers[i - 1]
            t.add_section()
            t.add_row("", "", f"[red]{b.kind}[/red]", f"[red]{'; '.join(b.hazards)}[/red]")
            t.add_section()
        for gid in stage:
            g = s.groups[gid]
            note = module_note(s, g)
            mod = f" [magenta]{escape(note)}[/magenta]" if note else ""
            t.add_row(str(i), gid, g.kind, describe_group(s, g) + mod)
    nf = s.why_not_fused()
    if not nf:
        return t
    from rich.console import Group as RichGroup

    d = Table(title="not fused", show_header=True)
    for col in ("kind", "producer -> consumer", "rule/code", "reason"):
        d.add_column(col)
    for x in nf:
        d.add_row(x.kind, f"{x.producer} -> {x.consumer}", f"{x.rule}/{x.code}", x.reason)
    return RichGroup(t, d)



display.register(FusedSchedule, "text")(format_schedule)
