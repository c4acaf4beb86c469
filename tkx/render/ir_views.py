"""Former home of the IR-side views (kept so 0.1 imports keep working).

The views now live one module per stage: :mod:`tkx.render.captured`, :mod:`tkx.render.program`,
:mod:`tkx.render.passes`, :mod:`tkx.render.diffs`; the diffs are data in :mod:`tkx.passes.diff`.
"""

from __future__ import annotations

from ..passes.diff import ProgramDiff, TraceDiff, captured_diff, program_diff, step_diff, trace_diff
from .captured import captured_graph, captured_html
from .diffs import diff_graph
from .ir_common import COLLAPSE_ABOVE
from .passes import trace_graph, trace_html, trace_rich
from .program import program_graph, program_html

__all__ = [
    "COLLAPSE_ABOVE", "ProgramDiff", "TraceDiff", "captured_graph", "captured_html", "captured_diff",
    "program_graph", "program_html", "program_diff", "trace_graph", "trace_html", "trace_diff", "trace_rich",
    "step_diff", "diff_graph",
]
