"""The views of :class:`~tkx.ir.Program`: the listing (HTML, one row per op) and the graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import display
from ..ir import Program
from ..printer import Namer, _attrs, format_program, rich_program, type_str
from .base import REGION_COLORS, attrs, capped, esc, view
from .graphs import _emit, _program_spec
from .ir_common import (
    COLLAPSE_ABOVE,
    OPEN_GRAPH_MAX,
    _buf_key,
    _graph_block,
    _op_ids,
    _operands,
    _ref,
    _region_counts,
    _src_cell,
    _style,
)

if TYPE_CHECKING:
    import graphviz

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
            f'{_src_cell(op.source, prev, op.module, op.module_type)}</tr>')
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



@display.register(Program, "html")
def program_html(program: Program, *, graph: bool = True) -> str:
    """The program listing as an HTML view (one row per op) plus, optionally, its graph."""
    namer = Namer(program)
    summary = (f'<div class="tkx-sum"><b>{len(program.ops)}</b> ops '
               f'({_region_counts(o.region for o in program.ops)}), <b>{len(program.inputs)}</b> inputs, '
               f'<b>{len(program.outputs)}</b> outputs, <b>{len(program.updates)}</b> in-place updates. '
               f'A value is named after its op id (<code>%relu</code>) or input buffer (<code>%in0</code>): '
               f'the ids the schedule, arena and CUDA views use; passes never rename them.</div>')
    rows = _program_rows(program, namer)
    table = capped(f'<table>{"".join(rows)}</table>', len(rows), "rows")
    body = _style() + summary + table
    if graph:
        collapsed = len(program.ops) > COLLAPSE_ABOVE
        what = (f"dataflow graph, collapsed by region ({len(program.ops)} ops): "
                f"program.graph(expand=('optimizer',)) opens one region" if collapsed else "dataflow graph")
        body += _graph_block(lambda: program_graph(program), what, len(program.ops) <= OPEN_GRAPH_MAX)
    title = f"Program {program.name}"
    return view("ir tkx-program", title, body, format_program(program))



@display.register(Program, "graph")
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



display.register(Program, "text")(format_program)
display.register(Program, "rich")(rich_program)
