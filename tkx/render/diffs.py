"""Drawing the IR-side diffs (:class:`~tkx.passes.diff.ProgramDiff`, :class:`~tkx.passes.diff.TraceDiff`):
the changed ops side by side, and both programs in one graph. The diffs are computed in
:mod:`tkx.passes.diff`; this module only draws them."""

from __future__ import annotations

from typing import Any

from .. import display
from ..ir import Op, Program
from ..passes.diff import ProgramDiff, TraceDiff, _op_code, _sink_rows
from ..printer import Namer
from .base import attrs, esc, view
from .graphs import _emit, _GNode, _GSpec, _program_spec
from .ir_common import _STATUS_CLASS, _STATUS_MARK, COLLAPSE_ABOVE, _details, _op_ids, _style


def side_by_side(d: ProgramDiff, context: int) -> str:
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
    # fixed layout: before and after share the width equally and long lines wrap inside their column
    cols = '<colgroup><col style="width:1.6em"><col><col style="width:1.2em"><col style="width:1.6em"><col></colgroup>'
    return f'<table class="tkx-side">{cols}{"".join(rows)}</table>{legend}'


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




@display.register(ProgramDiff, "html")
def program_diff_html(d: ProgramDiff, context: int = 1) -> str:
    """The view of a program diff: title (its summary's first part), the changed ops side by side."""
    return view("ir tkx-diff", d.summary().split(";")[0], _style() + side_by_side(d, context), str(d))


@display.register(ProgramDiff, "graph")
def program_diff_graph(d: ProgramDiff, **kw: Any) -> Any:
    return diff_graph(d.before, d.after, **kw)


@display.register(TraceDiff, "html")
def trace_diff_html(d: TraceDiff) -> str:
    header, *body = d.rows()
    head = "".join(f"<th>{esc(c)}</th>" for c in header)
    trs = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in body)
    out = d.output
    return view("ir tkx-tracediff", repr(d)[6:-1], _style() + f"<table><tr>{head}</tr>{trs}</table>"
                + _details(esc(out.summary()), side_by_side(out, 1), True), str(d))
