"""Views of the back-end stages: :class:`~tkx.schedule.model.FusedSchedule`,
:class:`~tkx.arena.ArenaPlan` and :class:`~tkx.codegen.source.CudaSource`.

Each stage object forwards to this module (imported lazily):

* ``schedule_html`` / ``schedule_graph`` / ``schedule_rich`` / ``schedule_diff``;
* ``arena_html`` / ``arena_svg`` / ``arena_rich`` / ``arena_diff``;
* ``cuda_html`` / ``cuda_diff``;
* ``bundle(obj, make_html, ...)``: a ``_repr_mimebundle_`` that never raises.

Provenance tokens (see :mod:`tkx.render`): ``grp:<group>``, ``op:<ir op>``, ``buf:<buffer>``,
``line:<cuda line>``, ``stage:<n>``. A schedule group carries the ops it computes, inlines and
stores, the buffers it reads and writes and its stage; an arena row carries its buffer, the op
that produced it and the groups that write and read it; a CUDA line carries the ops and groups
it implements. Clicking any of them highlights the others on the page.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import REGION_COLORS, REGION_FILL, attrs, esc, graph_html, mimebundle, svg_img, view

# --------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------
STAGE_STYLE = """
.tkx-view .tkx-sub{font-family:system-ui,sans-serif;font-weight:600;margin:10px 0 4px}
.tkx-view .tkx-stage-row td{background:#f6f8fa;font-family:system-ui,sans-serif;font-weight:600;
  border-top:1px solid #d0d7de;padding-top:3px}
.tkx-view .tkx-barrier-row td{color:#b42318;white-space:normal;padding:2px 0 2px 18px;font-size:11px}
.tkx-view .tkx-grp td{border-top:1px dotted #e5e7eb;white-space:normal}
.tkx-view .tkx-grp td.tkx-nowrap{white-space:nowrap}
.tkx-view .tkx-chip{display:inline-block;padding:0 3px;margin:0 2px 1px 0;border-radius:3px;background:#f0f3f6;
  white-space:nowrap}
.tkx-view .tkx-chip.tkx-inl{border:1px dashed #8c959f;background:none}
.tkx-view .tkx-why{color:#6e7781;font-size:11px;font-family:system-ui,sans-serif}
.tkx-view .tkx-ok{color:#1a7f37}.tkx-view .tkx-no{color:#b42318;font-weight:600}
.tkx-view tr.tkx-fused td{color:#57606a}
.tkx-view .tkx-kv td:first-child{color:#57606a;font-family:system-ui,sans-serif}
.tkx-view .tkx-src{white-space:pre;font-size:12px;line-height:1.3}
.tkx-view .tkx-scroll{max-height:640px;overflow:auto;border:1px solid #eaeef2}
.tkx-view .tkx-src>div{padding-right:8px}
.tkx-view .tkx-src .tkx-ln{display:inline-block;width:4.5em;color:#8c959f;text-align:right;padding-right:6px;
  user-select:none}
.tkx-view .tkx-src .tkx-gut{display:inline-block;width:4em;color:#8250df;user-select:none}
.tkx-view .tkx-src .tkx-opl{background:#f6f8fa}
.tkx-view .tkx-add{color:#1a7f37;background:#e6ffec}.tkx-view .tkx-del{color:#b42318;background:#ffebe9}
.tkx-view .tkx-hunk{color:#8250df}
.tkx-view .tkx-volatile{}
"""

#: Highlighting the kernel text takes a fraction of a second for ~1000 lines; an NVRTC check ~1 s
#: per architecture. Reports are cached by (source hash, arch, exact) so a re-display is instant.
_COMPILE_CACHE: dict[tuple[str, str, bool], Any] = {}


def _view(kind: str, title: str, body: str, text: str) -> str:
    return view(kind, title, f"<style>{STAGE_STYLE}</style>{body}", text)


def _kib(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} B"


def _shape(shape: Sequence[int]) -> str:
    return "×".join(map(str, shape)) or "scalar"


def _is_op(program: Any, name: str) -> bool:
    try:
        program.op(name)
        return True
    except (KeyError, ValueError, LookupError):
        return False


def _op_ids(program: Any) -> set[str]:
    return {o.id for o in program.ops}


def _region(program: Any, op_id: str) -> str:
    try:
        return program.op(op_id).region
    except Exception:
        return ""


def bundle(obj: Any, make_html: Callable[[], str], include: Any = None, exclude: Any = None) -> dict[str, str]:
    """``_repr_mimebundle_`` that never raises: on an error the HTML is the text rendering
    and a one-line note naming the error (a notebook cell must not show a traceback)."""
    try:
        html_text = make_html()
    except Exception as exc:  # pragma: no cover - exercised by tests through monkeypatching
        try:
            text = str(obj)
        except Exception:
            text = repr(obj)
        html_text = (f'<div class="tkx-view"><div class="tkx-dim">tkx could not render this view '
                     f'({esc(type(exc).__name__)}: {esc(exc)}); showing text.</div><pre>{esc(text)}</pre></div>')
    return mimebundle(obj, html_text, include, exclude)


def _home_text(s: Any, buf: str) -> str:
    """Where a stored value lives, in user terms (``arena``, ``out``, ``params['w1'] (in place)``)."""
    home = s.homes.get(buf)
    if home is None:
        return "scratch" if buf in s.scratch else "arena"
    if home.kind == "input":
        return f"{s.program.inputs[home.index].name} (in place)"
    if home.kind == "output":
        return f"output {s.program.outputs[home.index].name}"
    return str(home)


def _dst_text(s: Any, home: Any) -> str:
    if home.kind == "input":
        return s.program.inputs[home.index].name
    if home.kind == "output":
        return f"output {s.program.outputs[home.index].name}"
    return str(home)


def _input_buffer(program: Any, name: str) -> str | None:
    for i in program.inputs:
        if i.name == name:
            return i.value.buffer
    return None


def _ref_tokens(program: Any, name: str, ops: set[str]) -> list[str]:
    """Provenance tokens of a decision's producer/consumer (an op id or an input name)."""
    if name in ops:
        return [f"op:{name}"]
    buf = _input_buffer(program, name)
    return [f"buf:{buf}"] if buf else []


# --------------------------------------------------------------------------------------
# FusedSchedule
# --------------------------------------------------------------------------------------
def group_tokens(s: Any, gid: str) -> list[str]:
    """Provenance ids of a schedule group: its ops, inlined ops, stores, buffers and stage."""
    g = s.groups[gid]
    ops = _op_ids(s.program)
    toks = [f"op:{o}" for o in (*g.ops, *g.inlined, *g.stores) if o in ops]
    toks += [f"buf:{b}" for b in (*g.stores, *g.reads)]
    if g.kind == "copy":
        toks.append(f"op:{g.anchor}")
    toks.append(f"stage:{s.stage_of(gid)}")
    return toks


def _kind_prefix(op: Any) -> str:
    """``"sum "`` for op ``sum_3`` (shown next to its id), nothing when the id is the kind."""
    return "" if op.id == op.kind else f"{op.kind} "


def describe_params(s: Any, g: Any) -> tuple[str, str]:
    """(what the group computes and how, why the emitter variant was chosen)."""
    p = g.params
    if g.kind == "copy":
        task = next(c for c in s.copies if c.group == g.id)
        return f"copy {task.src.buffer} → {_dst_text(s, task.dst_home)} ({p.get('numel', task.src.numel)} elements)", ""
    anchor = s.program.op(g.anchor)
    why = str(p.get("why", ""))
    if g.kind == "gemm":
        batch = f"[{p['batch']}×] " if p.get("batch", 1) > 1 else ""
        head = f"{_kind_prefix(anchor)}{batch}{p['m']}×{p['k']} @ {p['k']}×{p['n']} · {p['impl']}"
        if p["impl"] != "gemv":
            head += f" tile {p['tile_m']}×{p['tile_n']}×{p['tile_k']}"
        if p.get("split_k", 1) > 1:
            head += f" split-k {p['split_k']}"
        return head, why
    if g.kind in ("reduction", "reduction_partial"):
        head = (f"{'partial ' if g.kind == 'reduction_partial' else ''}{_kind_prefix(anchor)}"
                f"{p['rows']} row{'s' if p['rows'] != 1 else ''} × {p['size']}")
        head += f" · {p['strategy']}"
        if "parts" in p:
            head += f" ({p['parts']} parts{'' if g.kind == 'reduction_partial' else ', final'})"
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
             'written into the user tensor. Not fused first.</div>']
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
        parts.append(f'<details{" open" if nf else ""}><summary>{esc(kind)}: {len(ds)} candidates, '
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


def schedule_html(s: Any, graph: bool = True) -> str:
    """The schedule as HTML: header, stages and barriers, groups, every fusion decision."""
    ops = _op_ids(s.program)
    nf = sum(not d.fused for d in s.decisions)
    barrier_kind = "__syncthreads" if s.mode == "block" else "grid barrier"
    head = (
        '<table class="tkx-kv">'
        f'<tr><td>mode</td><td><b>{esc(s.mode)}</b> — {esc(s.mode_reason)}</td></tr>'
        f'<tr><td>grid</td><td>{s.blocks} block{"s" if s.blocks != 1 else ""} × {s.threads} threads</td></tr>'
        f'<tr><td>stages</td><td>{len(s.stages)} stages, {len(s.groups)} groups, '
        f'{s.num_barriers} barriers ({esc(barrier_kind)})</td></tr>'
        f'<tr><td>decisions</td><td>{len(s.decisions)} fusion candidates, {nf} not fused</td></tr></table>')
    rows = ['<tr><th>group</th><th>kind</th><th>computes</th><th>items</th><th>epilogue / loop</th>'
            '<th>inlined</th><th>stores → home</th></tr>']
    for i, stage in enumerate(s.stages):
        if i > 0:
            b = s.barriers[i - 1]
            rows.append(f'<tr class="tkx-barrier-row" {attrs(None, _barrier_tokens(b.hazards, ops))}>'
                        f'<td colspan="7">━━ barrier before stage {i} ({esc(b.kind)}): '
                        f'{esc("; ".join(b.hazards))}</td></tr>')
        rows.append(f'<tr class="tkx-stage-row"><td colspan="7" {attrs(f"stage:{i}")}>stage {i} '
                    f'<span class="tkx-dim">({len(stage)} group{"s" if len(stage) != 1 else ""} side by side)</span>'
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
                stores = esc(_dst_text(s, next(c for c in s.copies if c.group == gid).dst_home)) + " (staged commit)"
            rows.append(
                f'<tr class="tkx-grp" {attrs(f"grp:{gid}", group_tokens(s, gid))}>'
                f'<td class="tkx-nowrap" style="border-left:3px solid {color};padding-left:4px"><b>{esc(gid)}</b></td>'
                f'<td class="tkx-nowrap">{esc(g.kind)}</td>'
                f'<td style="min-width:24em">{anchor} {esc(what)}'
                + (f'<div class="tkx-why">{esc(why)}</div>' if why else "") + '</td>'
                f'<td class="tkx-nowrap">{g.work_items}</td><td>{epi}</td><td>{inl}</td>'
                f'<td class="tkx-nowrap">{stores}</td></tr>')
    legend = ('<div class="tkx-why">colours: <span class="tkx-region-forward">forward</span> · '
              '<span class="tkx-region-backward">backward</span> · <span class="tkx-region-optimizer">optimizer'
              '</span>; dashed = inlined (recomputed in registers, never stored). Groups in one stage run '
              'concurrently on the grid; a barrier separates stages. items = independent work items (tiles, '
              'row blocks) spread over the blocks. Hazards: RAW = a group reads what an earlier stage wrote; '
              'WAR = a write must wait until earlier reads are done.</div>')
    body = (head + '<div class="tkx-sub">Stages</div>' + legend + f'<table>{"".join(rows)}</table>'
            + _decision_table(s))
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


def schedule_graph(s: Any) -> Any:
    """A ``graphviz.Digraph``: one cluster per group (inlined ops dashed), stage labels and
    barrier separators on the left, memory reads between groups labelled with the buffer."""
    from . import safe_digraph

    program = s.program
    ops = _op_ids(program)
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
    for gid in (g for stage in s.stages for g in stage):
        g = s.groups[gid]
        nodes: dict[str, str] = {}
        region = _region(program, g.anchor)
        with dot.subgraph(name="cluster_" + re.sub(r"\W", "_", gid)) as c:
            c.attr(label=f"{gid} · {g.kind} · stage {s.stage_of(gid)}", style="rounded",
                   color=REGION_COLORS.get(region, "#8c959f"), fontcolor="#24292f", labeljust="l")
            if g.kind == "copy":
                task = next(t for t in s.copies if t.group == gid)
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
            if g.kind == "reduction_partial":
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
            if target:
                dot.edge(writer[b], target, label=b, color="#0969da", fontcolor="#0969da", penwidth="1.3")
    # stage labels and barrier separators: a chain of plain nodes, each above its stage's groups
    prev = None
    for i, stage in enumerate(s.stages):
        if i > 0:
            b = s.barriers[i - 1]
            bn = f"barrier_{i}"
            dot.node(bn, f"━━ barrier ({b.kind}) ━━\n{len(b.hazards)} hazard{'s' if len(b.hazards) != 1 else ''}",
                     shape="plaintext", style="", fontcolor="#b42318", fontsize="10")
            for gid in s.stages[i - 1]:
                for n in exits[gid]:
                    dot.edge(n, bn, style="invis", weight="0")
            if prev:
                dot.edge(prev, bn, style="invis")
            prev = bn
        sn = f"stage_{i}"
        dot.node(sn, f"stage {i}", shape="plaintext", style="", fontcolor="#57606a", fontsize="11")
        if prev:
            dot.edge(prev, sn, style="invis")
        for gid in stage:
            for n in entries[gid]:
                dot.edge(sn, n, style="invis", weight="0")
        prev = sn
    return dot


def schedule_rich(s: Any) -> Any:
    from rich.table import Table

    from ..schedule.text import describe_group

    t = Table(title=f"FusedSchedule {s.program.name}", caption=f"mode {s.mode}: {s.mode_reason}; "
              f"{s.blocks} block(s) × {s.threads} threads", show_lines=False, expand=False)
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
            t.add_row(str(i), gid, g.kind, describe_group(s, g))
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


# --------------------------------------------------------------------------------------
# ArenaPlan
# --------------------------------------------------------------------------------------
def _writers_readers(s: Any) -> tuple[dict[str, str], dict[str, list[str]]]:
    writers: dict[str, str] = {}
    readers: dict[str, list[str]] = {}
    for gid in (g for stage in s.stages for g in stage):
        g = s.groups[gid]
        for b in g.stores:
            writers.setdefault(b, gid)
        for b in g.reads:
            readers.setdefault(b, []).append(gid)
    return writers, readers


def _staged_targets(s: Any) -> dict[str, tuple[str, str, int]]:
    """arena buffer -> (copy group, destination input name, stage of the copy)."""
    out = {}
    for c in s.copies:
        if c.dst_home.kind == "input":
            out[c.src.buffer] = (c.group, s.program.inputs[c.dst_home.index].name, s.stage_of(c.group))
    return out


def _in_place_writes(s: Any) -> list[tuple[str, str, int]]:
    """(input name, value, stage) of every in-place update written straight into a user tensor."""
    writers, _ = _writers_readers(s)
    out = []
    for buf, home in s.homes.items():
        if home.kind == "input" and buf in writers:
            out.append((s.program.inputs[home.index].name, buf, s.stage_of(writers[buf])))
    return sorted(out, key=lambda t: (t[2], t[0]))


def arena_svg(a: Any, width: int = 860) -> str:
    """The memory timeline: x = schedule stage, y = byte offset (0 at the bottom); one rectangle
    per slot coloured by the region of the op that produced it; lines at the peak and the lower
    bound; staged commits outlined in orange; in-place writes as ticks in a lane below."""
    s = a.schedule
    nst = max(1, len(s.stages))
    slots = sorted(a.slots.values(), key=lambda x: (x.offset, x.first, x.buffer))
    staged = _staged_targets(s)
    inplace = _in_place_writes(s)
    left, right, top = 64, 12, 28
    plot_h = 300 if slots else 40
    pw = width - left - right
    col = pw / nst
    top_bytes = max(a.size_bytes, a.lower_bound_bytes, 1)

    def y(off: float) -> float:
        return top + plot_h - off / top_bytes * plot_h

    out = [f'<text x="{left}" y="16" font-size="12" font-weight="bold">arena timeline: {esc(_kib(a.size_bytes))} '
           f'peak, lower bound {esc(_kib(a.lower_bound_bytes))}, without reuse {esc(_kib(a.no_reuse_bytes))}'
           f'</text>']
    # stage columns and barriers
    for k in range(nst):
        x0 = left + k * col
        out.append(f'<rect x="{x0:.1f}" y="{top}" width="{col:.1f}" height="{plot_h}" '
                   f'fill="{"#fafbfc" if k % 2 else "#ffffff"}"/>')
        out.append(f'<text x="{x0 + col / 2:.1f}" y="{top + plot_h + 13}" text-anchor="middle" fill="#57606a">'
                   f'stage {k}</text>')
        if k > 0:
            out.append(f'<line x1="{x0:.1f}" y1="{top}" x2="{x0:.1f}" y2="{top + plot_h}" stroke="#b42318" '
                       f'stroke-width="0.8" stroke-dasharray="2,3"/>')
    # y axis
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        off = top_bytes * frac
        out.append(f'<line x1="{left - 4}" y1="{y(off):.1f}" x2="{left}" y2="{y(off):.1f}" stroke="#57606a"/>')
        out.append(f'<text x="{left - 6}" y="{y(off) + 3:.1f}" text-anchor="end" fill="#57606a">'
                   f'{esc(_kib(int(off)))}</text>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#57606a"/>')
    # slots
    for sl in slots:
        x0 = left + sl.first * col + 1.5
        w = (sl.last - sl.first + 1) * col - 3
        y1, y0 = y(sl.offset), y(sl.offset + sl.nbytes)
        h = max(2.0, y1 - y0)
        y0 = y1 - h
        region = _region(s.program, sl.buffer)
        fill = "#fff8c5" if sl.kind == "scratch" else REGION_FILL.get(region, "#eaeef2")
        stroke = REGION_COLORS.get(region, "#8c959f") if sl.kind != "scratch" else "#9a6700"
        extra = ' stroke-dasharray="3,2"' if sl.kind == "scratch" else ""
        sw = "1"
        if sl.buffer in staged:
            stroke, sw = "#d4651a", "2.2"
        out.append(f'<rect class="tkx-slot" x="{x0:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{extra}><title>{esc(sl.buffer)}: '
                   f'{sl.nbytes} B at {sl.offset}, stages {sl.first}..{sl.last}</title></rect>')
        if h >= 11 and w >= 30:
            label = sl.buffer + (f" → {staged[sl.buffer][1]}" if sl.buffer in staged else "")
            size = f" {_kib(sl.nbytes)}" if h >= 24 else ""
            max_chars = int(w / 5.6)
            text = (label + size) if len(label + size) <= max_chars else label[:max(1, max_chars)]
            out.append(f'<text x="{x0 + 3:.1f}" y="{y0 + min(h / 2 + 3.5, 12):.1f}" fill="#24292f">{esc(text)}</text>')
    # peak and lower bound
    out.append(f'<line x1="{left}" y1="{y(a.size_bytes):.1f}" x2="{left + pw}" y2="{y(a.size_bytes):.1f}" '
               f'stroke="#24292f" stroke-width="1.2"/>')
    out.append(f'<text x="{left + pw - 2}" y="{y(a.size_bytes) - 3:.1f}" text-anchor="end" fill="#24292f">'
               f'peak {esc(_kib(a.size_bytes))}</text>')
    lb_y = y(a.lower_bound_bytes)
    out.append(f'<line x1="{left}" y1="{lb_y:.1f}" x2="{left + pw}" y2="{lb_y:.1f}" stroke="#1a7f37" '
               f'stroke-width="1.2" stroke-dasharray="6,3"/>')
    lb_text_y = lb_y + 11 if abs(lb_y - y(a.size_bytes)) < 12 else lb_y - 3
    out.append(f'<text x="{left + pw - 2}" y="{lb_text_y:.1f}" text-anchor="end" fill="#1a7f37">'
               f'lower bound {esc(_kib(a.lower_bound_bytes))}</text>')
    base = top + plot_h + 26
    if inplace:
        out.append(f'<text x="{left}" y="{base + 10}" fill="#57606a">written in place into user tensors '
                   f'(no arena bytes):</text>')
        per_stage: dict[int, int] = {}
        for name, _buf, st in inplace:
            j = per_stage.get(st, 0)
            per_stage[st] = j + 1
            if j >= 12:
                continue
            x0 = left + st * col + 2
            yy = base + 16 + j * 14
            out.append(f'<rect x="{x0:.1f}" y="{yy}" width="{col - 4:.1f}" height="12" fill="#e6f6ec" '
                       f'stroke="#2f855a"/>')
            text = name
            max_chars = int((col - 8) / 5.4)
            out.append(f'<text x="{x0 + 3:.1f}" y="{yy + 9}" fill="#1f5135">{esc(text[:max(1, max_chars)])}</text>')
        lanes = max(per_stage.values())
        base += 16 + min(lanes, 12) * 14 + 6
    # legend
    ly = base + 12
    items = [("#ebf4ff", "#2b6cb0", "forward"), ("#f3ebff", "#805ad5", "backward"),
             ("#e6f6ec", "#2f855a", "optimizer"), ("#fff8c5", "#9a6700", "scratch"),
             ("white", "#d4651a", "staged commit")]
    lx = left
    for fill, stroke, name in items:
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="10" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="{2 if name == "staged commit" else 1}"/>')
        out.append(f'<text x="{lx + 16}" y="{ly}" fill="#24292f">{esc(name)}</text>')
        lx += 28 + 6 * len(name)
    out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 20}" y2="{ly - 4}" stroke="#b42318" '
               f'stroke-dasharray="2,3"/><text x="{lx + 24}" y="{ly}" fill="#24292f">barrier</text>')
    height = ly + 8
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica,Arial,sans-serif" font-size="10">\n'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>')
    return head + "\n" + "\n".join(out) + "\n</svg>"


def arena_html(a: Any) -> str:
    """The arena as HTML: summary, the timeline (an ``<img>`` of an SVG) and the slot table."""
    s = a.schedule
    ops = _op_ids(s.program)
    writers, readers = _writers_readers(s)
    staged = _staged_targets(s)
    reuse = 1 - a.size_bytes / a.no_reuse_bytes if a.no_reuse_bytes else 0.0
    head = (
        '<table class="tkx-kv">'
        f'<tr><td>size</td><td><b>{esc(_kib(a.size_bytes))}</b> ({a.size_bytes} B) for {len(a.slots)} values, '
        f'{a.alignment}-byte aligned</td></tr>'
        f'<tr><td>lower bound</td><td>{esc(_kib(a.lower_bound_bytes))} (most bytes live in any one stage; '
        f'{"reached" if a.size_bytes <= a.lower_bound_bytes else f"{a.size_bytes - a.lower_bound_bytes} B above"})'
        '</td></tr>'
        f'<tr><td>without reuse</td><td>{esc(_kib(a.no_reuse_bytes))} (reuse saves {reuse:.0%})</td></tr>'
        f'<tr><td>in place</td><td style="white-space:normal">{esc(", ".join(a.in_place) or "—")} '
        '<span class="tkx-why">(state updates written straight into the user tensor: last read proven)</span></td></tr>'
        f'<tr><td>staged</td><td style="white-space:normal">{esc(", ".join(a.staged) or "—")} '
        '<span class="tkx-why">(new value kept in the arena, copied after the old one\'s last read)</span></td></tr>'
        '</table>')
    img = svg_img(arena_svg(a), alt="arena timeline") if a.slots or a.in_place else \
        '<div class="tkx-dim">no arena values: everything lives in registers or user tensors</div>'
    rows = ['<tr><th>buffer</th><th>kind</th><th>dtype</th><th style="text-align:right">offset</th>'
            '<th style="text-align:right">bytes</th><th>stages</th><th>written by</th><th>read by</th><th></th></tr>']
    for sl in sorted(a.slots.values(), key=lambda x: (x.offset, x.first, x.buffer)):
        b = sl.buffer
        w = writers.get(b)
        rs = list(dict.fromkeys(readers.get(b, [])))
        ids = ([f"op:{b}"] if b in ops else []) + ([f"grp:{w}"] if w else []) + [f"grp:{r}" for r in rs]
        ids += [f"stage:{k}" for k in range(sl.first, sl.last + 1)]
        note = f"staged commit → {staged[b][1]} by {staged[b][0]}" if b in staged else ""
        region = _region(s.program, b)
        rows.append(f'<tr {attrs(f"buf:{b}", ids)}><td class="tkx-region-{region}">{esc(b)}</td>'
                    f'<td>{esc(sl.kind)}</td><td>{esc(sl.dtype)}</td><td style="text-align:right">{sl.offset}</td>'
                    f'<td style="text-align:right">{sl.nbytes}</td><td>{sl.first}..{sl.last}</td>'
                    f'<td>{esc(w or "")}</td><td>{esc(", ".join(rs))}</td><td>{esc(note)}</td></tr>')
    inplace = _in_place_writes(s)
    if inplace:
        rows.append('<tr><td colspan="9" class="tkx-dim" style="padding-top:6px">written in place into user '
                    'tensors (no arena bytes):</td></tr>')
        for name, buf, st in inplace:
            w = writers.get(buf)
            ids = [f"op:{buf}"] + ([f"grp:{w}"] if w else []) + [f"stage:{st}"]
            ib = _input_buffer(s.program, name)
            rows.append(f'<tr {attrs(f"buf:{ib}" if ib else None, ids)}><td>{esc(name)}</td><td>in place</td>'
                        f'<td></td><td></td><td></td><td>{st}</td><td>{esc(w or "")}</td><td></td>'
                        f'<td>← {esc(buf)}</td></tr>')
    body = head + img + f'<div class="tkx-sub">Slots</div><table>{"".join(rows)}</table>'
    return _view("arena", "ArenaPlan", body, str(a))


def arena_rich(a: Any) -> Any:
    from rich.table import Table

    t = Table(title=f"ArenaPlan: {_kib(a.size_bytes)} for {len(a.slots)} values",
              caption=f"lower bound {_kib(a.lower_bound_bytes)}, without reuse {_kib(a.no_reuse_bytes)}"
              + (f"; in place: {', '.join(a.in_place)}" if a.in_place else "")
              + (f"; staged: {', '.join(a.staged)}" if a.staged else ""))
    for col, just in (("buffer", "left"), ("kind", "left"), ("offset", "right"), ("bytes", "right"),
                      ("stages", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for sl in sorted(a.slots.values(), key=lambda x: (x.offset, x.first, x.buffer)):
        t.add_row(sl.buffer, sl.kind, str(sl.offset), str(sl.nbytes), f"{sl.first}..{sl.last}")
    return t


# --------------------------------------------------------------------------------------
# CudaSource
# --------------------------------------------------------------------------------------
def highlight_lines(text: str) -> list[str]:
    """The source as HTML, one string per line (one pygments pass, inline styles)."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import CudaLexer
    except ImportError:  # pragma: no cover
        return [esc(x) for x in text.split("\n")]
    out = highlight(text, CudaLexer(), HtmlFormatter(noclasses=True, nowrap=True, style="default"))
    lines = out.split("\n")
    n = text.count("\n") + 1
    if len(lines) > n:
        lines = lines[:n]
    lines += [""] * (n - len(lines))
    return lines


#: Source lines the CUDA view renders at once (a huge kernel is shown in pages; see
#: :meth:`tkx.codegen.CudaSource.page`). Above it the view also checks one architecture only.
CUDA_VIEW_LINES = 2000


def compile_reports(c: Any, arches: Sequence[str] = ("sm_90", "sm_80")) -> tuple[str, list[Any]]:
    """``(note, reports)``: NVRTC reports for ``arches`` (cached by source hash), or a note why not.
    A report that failed is the :class:`~tkx.codegen.nvrtc.CudaCompileError` itself.

    Kernels longer than :data:`CUDA_VIEW_LINES` are checked for the first architecture only, and
    through the on-disk compile cache (:func:`tkx.runtime.kernel.compile_cubin`), so a kernel the
    runtime has compiled, or an earlier render, is never compiled again just to be shown."""
    from ..codegen.nvrtc import nvrtc_available

    ok, why = nvrtc_available()
    if not ok:
        return f"no NVRTC check: {why}", []
    exact = bool(getattr(c.options, "exact", False))
    digest = hashlib.sha256(c.text.encode()).hexdigest()
    reports = []
    if c.num_lines > CUDA_VIEW_LINES:
        arch = arches[0]
        key = (digest, arch, exact)
        if key not in _COMPILE_CACHE:
            cached = _disk_cached_report(c, arch, exact)
            if cached is None:  # a long kernel takes a while in NVRTC: never compile just to render
                return (f"not compiled for the view: a kernel of {c.num_lines} lines; cuda.check('{arch}') "
                        f"(or running it) compiles it, and the view then shows the report"), []
            _COMPILE_CACHE[key] = cached
        return f"{why}; {arch}, from the compile cache", [_COMPILE_CACHE[key]]
    for arch in arches:
        key = (digest, arch, exact)
        if key not in _COMPILE_CACHE:
            try:
                _COMPILE_CACHE[key] = c.check(arch)
            except Exception as exc:
                _COMPILE_CACHE[key] = exc
        reports.append(_COMPILE_CACHE[key])
    return why, reports


def remember_report(c: Any, arch: str, report: Any) -> None:
    """Keep a report :meth:`tkx.codegen.CudaSource.check` made, for the view of ``c``."""
    exact = bool(getattr(c.options, "exact", False))
    _COMPILE_CACHE[(hashlib.sha256(c.text.encode()).hexdigest(), arch, exact)] = report


def _disk_cached_report(c: Any, arch: str, exact: bool) -> Any:
    """The NVRTC report of ``c`` for ``arch`` from the on-disk compile cache, or ``None``."""
    try:
        from ..runtime import cache as disk
        from ..runtime.kernel import _report_from_json, nvrtc_cache_key

        key, _ = nvrtc_cache_key(c.text, arch, exact=exact)
        hit = disk.load_entry(key)
        return _report_from_json(hit[1]["report"], hit[0]) if hit is not None else None
    except Exception:  # a damaged entry or no NVRTC: nothing cached to show
        return None


def _report_table(note: str, reports: list[Any]) -> str:
    if not reports:
        return f'<div class="tkx-dim">{esc(note)}</div>'
    rows = ['<tr><th>arch</th><th style="text-align:right">registers</th><th style="text-align:right">spills</th>'
            '<th style="text-align:right">shared</th><th style="text-align:right">stack</th>'
            '<th style="text-align:right">compile</th></tr>']
    errors = []
    for r in reports:
        if isinstance(r, Exception):
            arch = getattr(r, "arch", "?")
            rows.append(f'<tr><td>{esc(arch)}</td><td colspan="5" class="tkx-no">failed to compile</td></tr>')
            errors.append(f"<pre>{esc(r)}</pre>")
            continue
        spill = f'<span class="tkx-no">{r.spill_bytes} B</span>' if r.spill_bytes else "0 B"
        rows.append(f'<tr><td>{esc(r.arch)}</td><td style="text-align:right">{r.registers}</td>'
                    f'<td style="text-align:right">{spill}</td><td style="text-align:right">{r.shared_bytes} B</td>'
                    f'<td style="text-align:right">{r.stack_bytes} B</td><td style="text-align:right">'
                    f'<span class="tkx-volatile">{r.compile_seconds:.2f} s</span></td></tr>')
    return (f'<div class="tkx-sub">NVRTC check <span class="tkx-dim">({esc(note)}; ptxas report, no GPU '
            f'needed)</span></div><table>{"".join(rows)}</table>' + "".join(errors))


def cuda_html(c: Any, check: bool = True, start: int = 1, limit: int | None = None) -> str:
    """The kernel as HTML: launch summary, NVRTC report, group index, highlighted source with
    one element per line carrying its ops and groups; the prelude folded in ``<details>``.

    At most ``limit`` (default :data:`CUDA_VIEW_LINES`) source lines after the prelude are
    rendered, from line ``start``; a longer kernel ends with a "show more" note naming the
    call that renders the next piece (``c.page(n)``), so the view stays small and fast."""
    limit = CUDA_VIEW_LINES if limit is None else int(limit)
    all_text = c.text.split("\n")
    n_lines = len(all_text)
    prelude_end = 0
    for i, line in enumerate(all_text, start=1):
        if line.startswith("#define TKX_POINTERS"):
            prelude_end = i - 1
            break
    first = max(int(start), prelude_end + 1)
    last = min(n_lines, first + limit - 1)
    if prelude_end == 0 and first == 1 and last == n_lines:
        lines = highlight_lines(c.text)
    else:  # highlight only what is shown: the prelude and this piece
        shown = highlight_lines("\n".join(all_text[:prelude_end])) if prelude_end else []
        lines = shown + [""] * (first - 1 - len(shown)) + highlight_lines("\n".join(all_text[first - 1:last]))
    ops_at: dict[int, list[str]] = {}
    for op, nums in c.op_lines.items():
        for k in nums:
            ops_at.setdefault(k, []).append(op)
    grp_at: dict[int, list[str]] = {}
    first_of: dict[int, str] = {}
    for gid, (a, b) in c.group_lines.items():
        for k in range(a, b + 1):
            grp_at.setdefault(k, []).append(gid)
        first_of.setdefault(a, gid)

    def row(k: int) -> str:
        code = lines[k - 1]
        ids = [f"op:{o}" for o in sorted(ops_at.get(k, ()))] + [f"grp:{g}" for g in grp_at.get(k, ())]
        gut = first_of.get(k)
        gutter = (f'<span class="tkx-gut" {attrs(f"grp:{gut}")}>{esc(gut)}</span>' if gut else
                  f'<span class="tkx-gut">{"│" if k in grp_at else ""}</span>')
        cls = ' class="tkx-opl"' if k in ops_at else ""
        return f'<div{cls} {attrs(f"line:{k}", ids)}><span class="tkx-ln">{k}</span>{gutter}{code}</div>'

    pre = "".join(row(k) for k in range(1, prelude_end + 1))
    main = "".join(row(k) for k in range(first, last + 1))
    if first > prelude_end + 1 or last < n_lines:
        page = (first - prelude_end - 1) // max(limit, 1) + 1
        pages = -(-(n_lines - prelude_end) // max(limit, 1))
        more = (f"; the next piece: <code>cuda.page({page + 1})</code>" if last < n_lines else "")
        main += (f'<div class="tkx-dim tkx-more">showing lines {first}–{last} of {n_lines} (page {page} of '
                 f'{pages}){more}; <code>cuda.text</code> holds it all</div>')
    if check:
        note, reports = compile_reports(c)
        report = _report_table(note, reports)
    else:
        report = ""
    mode = "one block, __syncthreads" if c.mode == "block" else "cooperative grid, grid barriers"
    head = (
        '<table class="tkx-kv">'
        f'<tr><td>kernel</td><td><b>{esc(c.kernel_name)}</b>, {c.num_lines} lines</td></tr>'
        f'<tr><td>launch</td><td>{c.blocks} block{"s" if c.blocks != 1 else ""} × {c.threads} threads '
        f'({esc(mode)})</td></tr>'
        f'<tr><td>memory</td><td>shared {esc(_kib(c.shared_bytes))} per block, arena {esc(_kib(c.arena_bytes))}'
        f'</td></tr>'
        f'<tr><td>GEMMs</td><td>{"tensor cores (WMMA)" if c.tensor_cores else "SIMT / GEMV"}</td></tr></table>')
    sched = c.schedule
    order = [g for st in sched.stages for g in st] if sched is not None else list(c.group_lines)
    chips = []
    for gid in order:
        if gid not in c.group_lines:
            continue
        a, b = c.group_lines[gid]
        g = sched.groups[gid] if sched is not None else None
        label = f"{gid} {g.kind} {g.anchor}" if g is not None else gid
        chips.append(f'<span class="tkx-chip" {attrs(f"grp:{gid}")}>{esc(label)} '
                     f'<span class="tkx-dim">{a}–{b}</span></span>')
    index = ('<div class="tkx-sub">Groups → lines <span class="tkx-dim">(click to highlight)</span></div>'
             f'<div style="white-space:normal">{" ".join(chips)}</div>') if chips else ""
    prelude = (f'<details><summary>prelude: lines 1–{prelude_end} (types, math helpers, barrier; same for every '
               f'kernel)</summary><div class="tkx-src">{pre}</div></details>') if prelude_end else ""
    src = (f'<div class="tkx-sub">Source <span class="tkx-dim">(grey background: a line that computes or stores '
           f'an IR op; left gutter: the schedule group)</span></div>{prelude}'
           f'<div class="tkx-src tkx-scroll">{main}</div>')
    plain = repr(c)
    return _view("cuda", f"CudaSource {c.kernel_name}", head + report + index + src, plain)


# --------------------------------------------------------------------------------------
# Diffs
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageDiff:
    """What changed between two objects of one stage.

    ``title``; ``summary``: "what: before -> after" lines; ``sections``: (heading, lines) pairs;
    the stage-specific fields (``groups_added`` ... for schedules, ``moved`` ... for arenas,
    ``unified`` for sources) hold the same information as data. Falsy when nothing changed.
    """

    title: str
    summary: tuple[str, ...]
    sections: tuple[tuple[str, tuple[str, ...]], ...]
    changed: bool
    data: dict[str, Any] = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return self.changed

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("data", {})
        if name in data:
            return data[name]
        raise AttributeError(name)

    def __str__(self) -> str:
        out = [self.title] + [f"  {x}" for x in self.summary]
        for head, lines in self.sections:
            if lines:
                out.append(f"  {head}:")
                out += [f"    {x}" for x in lines]
        if not self.changed:
            out.append("  (no change)")
        return "\n".join(out)

    def __repr__(self) -> str:
        n = sum(len(lines) for _, lines in self.sections)
        return f"<tkx.StageDiff {self.title}: {n} change{'s' if n != 1 else ''}>"

    def _html(self) -> str:
        parts = [f'<div>{"<br>".join(esc(x) for x in self.summary)}</div>']
        for head, lines in self.sections:
            if not lines:
                continue
            if head == "unified diff":
                body = []
                for ln in lines:
                    cls = ("tkx-hunk" if ln.startswith("@@") else "tkx-add" if ln.startswith("+")
                           else "tkx-del" if ln.startswith("-") else "")
                    body.append(f'<div class="{cls}">{esc(ln) or " "}</div>')
                parts.append(f'<div class="tkx-sub">{esc(head)}</div><div class="tkx-src">{"".join(body)}</div>')
                continue
            items = []
            for ln in lines:
                cls = "tkx-add" if ln.startswith("+") else "tkx-del" if ln.startswith("-") else ""
                items.append(f'<div class="{cls}">{esc(ln)}</div>')
            parts.append(f'<div class="tkx-sub">{esc(head)} ({len(lines)})</div><div>{"".join(items)}</div>')
        if not self.changed:
            parts.append('<div class="tkx-dim">no change</div>')
        return _view("diff", self.title, "".join(parts), str(self))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return bundle(self, self._html, include, exclude)

    def __rich__(self) -> Any:
        from rich.text import Text

        t = Text()
        for line in str(self).split("\n"):
            style = "green" if line.strip().startswith("+") else "red" if line.strip().startswith("-") else ""
            t.append(line + "\n", style=style)
        return t


def _arrow(what: str, a: Any, b: Any) -> str:
    return f"{what}: {a} -> {b}" if a != b else f"{what}: {a} (same)"


def _group_sig(s: Any, g: Any) -> dict[str, Any]:
    params = {k: v for k, v in g.params.items() if k != "why"}
    return {"kind": g.kind, "stage": s.stage_of(g.id), "ops": g.ops, "inlined": g.inlined, "stores": g.stores,
            "work_items": g.work_items, "params": params}


def schedule_diff(a: Any, b: Any) -> StageDiff:
    """Groups added/removed/changed (matched by anchor op), decisions flipped, counts."""
    from ..schedule.model import FusedSchedule

    if not isinstance(b, FusedSchedule):
        raise TypeError(f"can only diff a FusedSchedule against a FusedSchedule, not {type(b).__name__}")

    def by_anchor(s: Any) -> dict[str, Any]:
        out = {}
        for g in s.groups_in_order():
            key = g.anchor if g.kind != "copy" else f"copy:{g.anchor}"
            out[key] = g
        return out

    ga, gb = by_anchor(a), by_anchor(b)
    added = [f"+ {g.id} {g.kind} {g.anchor}: {', '.join(g.ops) or g.anchor}" for k, g in gb.items() if k not in ga]
    removed = [f"- {g.id} {g.kind} {g.anchor}: {', '.join(g.ops) or g.anchor}" for k, g in ga.items() if k not in gb]
    changed, moved = [], []
    for k, g in ga.items():
        if k not in gb:
            continue
        h = gb[k]
        sa, sb = _group_sig(a, g), _group_sig(b, h)
        if sa == sb:
            continue
        what = []
        for f in ("kind", "stage", "ops", "inlined", "stores", "work_items", "params"):
            if sa[f] != sb[f]:
                x, y = sa[f], sb[f]
                if isinstance(x, tuple):
                    x, y = ",".join(x) or "-", ",".join(y) or "-"
                elif isinstance(x, dict):
                    keys = [q for q in sorted(set(x) | set(y)) if x.get(q) != y.get(q)]
                    x, y = (",".join(f"{q}={d.get(q)}" for q in keys) for d in (x, y))
                what.append(f"{f} {x} -> {y}")
        gid = g.id if g.id == h.id else f"{g.id}->{h.id}"
        if len(what) == 1 and what[0].startswith("stage "):
            moved.append(f"{gid} ({k}): {what[0]}")
        else:
            changed.append(f"{gid} ({k}): " + "; ".join(what))
    da = {(d.kind, d.producer, d.consumer): d for d in a.decisions}
    db = {(d.kind, d.producer, d.consumer): d for d in b.decisions}
    flipped = []
    for key, d in da.items():
        e = db.get(key)
        if e is not None and e.fused != d.fused:
            flipped.append(f"{'+' if e.fused else '-'} {d.kind} {d.producer} -> {d.consumer}: "
                           f"{'not fused' if not d.fused else 'fused'} -> {'fused' if e.fused else 'not fused'}"
                           f" ({e.rule}/{e.code}: {e.reason})")
    new = [f"+ {d.kind} {d.producer} -> {d.consumer}: {'fused' if d.fused else 'not fused'} ({d.reason})"
           for k, d in db.items() if k not in da]
    gone = [f"- {d.kind} {d.producer} -> {d.consumer}: {'fused' if d.fused else 'not fused'} ({d.reason})"
            for k, d in da.items() if k not in db]
    summary = (
        _arrow("groups", len(a.groups), len(b.groups)), _arrow("stages", len(a.stages), len(b.stages)),
        _arrow("barriers", a.num_barriers, b.num_barriers), _arrow("mode", a.mode, b.mode),
        _arrow("grid", f"{a.blocks}x{a.threads}", f"{b.blocks}x{b.threads}"),
        _arrow("not fused", len(a.why_not_fused()), len(b.why_not_fused())))
    sections = (("groups added", tuple(added)), ("groups removed", tuple(removed)),
                ("groups changed", tuple(changed)), ("groups moved to another stage", tuple(moved)),
                ("decisions flipped", tuple(flipped)),
                ("decisions new", tuple(new)), ("decisions gone", tuple(gone)))
    is_changed = bool(added or removed or changed or moved or flipped or new or gone) or any(
        "(same)" not in x for x in summary)
    return StageDiff(f"schedule diff {a.program.name}", summary, sections, is_changed, {
        "groups_added": tuple(added), "groups_removed": tuple(removed), "groups_changed": tuple(changed),
        "groups_moved": tuple(moved),
        "decisions_flipped": tuple(flipped), "decisions_new": tuple(new), "decisions_gone": tuple(gone)})


def arena_diff(a: Any, b: Any) -> StageDiff:
    """Size, lower bound and slot changes (added, removed, moved, resized, lifetime)."""
    from ..arena import ArenaPlan

    if not isinstance(b, ArenaPlan):
        raise TypeError(f"can only diff an ArenaPlan against an ArenaPlan, not {type(b).__name__}")
    summary = (_arrow("size", a.size_bytes, b.size_bytes), _arrow("lower bound", a.lower_bound_bytes,
                                                                    b.lower_bound_bytes),
               _arrow("without reuse", a.no_reuse_bytes, b.no_reuse_bytes), _arrow("slots", len(a.slots), len(b.slots)))
    added = [f"+ {k} @{s.offset} {s.nbytes} B stages {s.first}..{s.last}" for k, s in b.slots.items()
             if k not in a.slots]
    removed = [f"- {k} @{s.offset} {s.nbytes} B stages {s.first}..{s.last}" for k, s in a.slots.items()
               if k not in b.slots]
    moved = []
    for k, s in a.slots.items():
        t = b.slots.get(k)
        if t is None:
            continue
        what = []
        if s.offset != t.offset:
            what.append(f"offset {s.offset} -> {t.offset}")
        if s.nbytes != t.nbytes:
            what.append(f"bytes {s.nbytes} -> {t.nbytes}")
        if (s.first, s.last) != (t.first, t.last):
            what.append(f"stages {s.first}..{s.last} -> {t.first}..{t.last}")
        if what:
            moved.append(f"{k}: " + "; ".join(what))
    state = []
    for name in a.in_place:
        if name not in b.in_place:
            state.append(f"- in place {name}")
    for name in b.in_place:
        if name not in a.in_place:
            state.append(f"+ in place {name}")
    for name in a.staged:
        if name not in b.staged:
            state.append(f"- staged {name}")
    for name in b.staged:
        if name not in a.staged:
            state.append(f"+ staged {name}")
    sections = (("slots added", tuple(added)), ("slots removed", tuple(removed)), ("slots moved", tuple(moved)),
                ("state updates", tuple(state)))
    is_changed = bool(added or removed or moved or state) or any("(same)" not in x for x in summary)
    return StageDiff("arena diff", summary, sections, is_changed, {
        "slots_added": tuple(added), "slots_removed": tuple(removed), "moved": tuple(moved), "state": tuple(state)})


def cuda_diff(a: Any, b: Any, context: int = 2, limit: int = 4000) -> StageDiff:
    """A unified diff of the kernel text with line counts."""
    from ..codegen.source import CudaSource

    if not isinstance(b, CudaSource):
        raise TypeError(f"can only diff a CudaSource against a CudaSource, not {type(b).__name__}")
    la, lb = a.text.split("\n"), b.text.split("\n")
    unified = list(difflib.unified_diff(la, lb, "before", "after", n=context, lineterm=""))
    plus = sum(1 for x in unified if x.startswith("+") and not x.startswith("+++"))
    minus = sum(1 for x in unified if x.startswith("-") and not x.startswith("---"))
    summary = (_arrow("lines", a.num_lines, b.num_lines), f"+{plus} -{minus} lines",
               _arrow("launch", f"{a.blocks}x{a.threads} {a.mode}", f"{b.blocks}x{b.threads} {b.mode}"),
               _arrow("shared bytes", a.shared_bytes, b.shared_bytes), _arrow("arena bytes", a.arena_bytes,
                                                                                b.arena_bytes))
    shown = unified[:limit] + ([f"... {len(unified) - limit} more diff lines"] if len(unified) > limit else [])
    return StageDiff(f"cuda diff {a.kernel_name}", summary, (("unified diff", tuple(shown)),), bool(unified) or any(
        "(same)" not in x for x in summary), {"unified": tuple(unified), "added": plus, "removed": minus})
