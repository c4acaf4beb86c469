"""What the IR-side views share: sizes, styles, the provenance helpers of one op or value."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from ..ir import Op, TensorSpec
from ..printer import Namer, module_label
from .base import REGION_COLORS, esc, graph_html

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
.tkx-ir span.tkx-mod{color:#8250df;cursor:pointer}
.tkx-ir td.tkx-b{border-left:3px solid transparent;padding-left:4px}
.tkx-ir .tkx-sum{font-family:system-ui,sans-serif;margin:0 0 4px 0;color:#24292f}
.tkx-ir .tkx-sum b{font-weight:600}
.tkx-ir .tkx-add{background:#dafbe1}.tkx-ir .tkx-rem{background:#ffebe9}.tkx-ir .tkx-chg{background:#fff1c2}
.tkx-ir td.tkx-mark{font-weight:700;text-align:center;padding:1px 4px}
.tkx-ir table.tkx-side td{padding-right:14px}
.tkx-view.tkx-ir table.tkx-side{width:100%;table-layout:fixed}
.tkx-view.tkx-ir table.tkx-side td,.tkx-view.tkx-ir table.tkx-side th{white-space:pre-wrap;overflow-wrap:anywhere}
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



def _style() -> str:
    return f"<style>{CSS}</style>"


def _region_span(region: str | None, text: str | None = None) -> str:
    if not region:
        return esc(text or "")
    return f'<span style="color:{REGION_COLORS.get(region, "#24292f")}">{esc(text or region)}</span>'


def _region_counts(regions: Iterable[str | None]) -> str:
    counts = Counter(r for r in regions if r)
    return ", ".join(_region_span(r, f"{r} {counts[r]}") for r in REGION_COLORS if counts[r])


def _module_span(module: str | None, module_type: str | None) -> str:
    """The module an op came from, before its source line (its class in the tooltip)."""
    label = module_label(module, module_type)
    if not label:
        return ""
    tip = f"nn.Module {label}" + (f" ({module_type})" if module_type else "")
    return f'<span class="tkx-mod" data-tkx-key="{esc(f"mod:{module}")}" title="{esc(tip)}">{esc(label)}</span> '


def _src_cell(source: Any, prev: Any, module: str | None = None, module_type: str | None = None) -> str:
    """``[module] file.py:LINE  code``; the code only where it differs from the row above."""
    mod = _module_span(module, module_type)
    if source is None:
        return f'<td class="tkx-src">{mod}</td>'
    code = source.code if (prev is None or (prev.file, prev.line) != (source.file, source.line)) else ""
    if len(code) > MAX_CODE:
        code = code[:MAX_CODE - 3] + "..."
    text = f"{source.short()}  {code}" if code else source.short()
    return f'<td class="tkx-src" title="{esc(str(source))}">{mod}{esc(text)}</td>'


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
    if op.module is not None:
        ids.append(f"mod:{op.module}")
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

