"""Former home of the back-end stage views (kept so 0.1 imports keep working).

The views now live one module per stage: :mod:`tkx.render.schedule`, :mod:`tkx.render.arena`,
:mod:`tkx.render.cuda`, :mod:`tkx.render.stage_diff`; the diffs are data in
:mod:`tkx.schedule.diff`, :mod:`tkx.arena.diff` and :mod:`tkx.codegen.diff`.
"""

from __future__ import annotations

from ..arena.diff import arena_diff
from ..codegen.diff import cuda_diff
from ..diff import StageDiff
from ..schedule.diff import schedule_diff
from .arena import arena_html, arena_rich, arena_svg
from .base import esc
from .cuda import compile_reports, cuda_html, highlight_lines
from .schedule import describe_params, group_tokens, schedule_graph, schedule_html, schedule_rich
from .stage_common import _kib

__all__ = ["StageDiff", "arena_diff", "arena_html", "arena_rich", "arena_svg", "compile_reports", "cuda_diff",
           "cuda_html", "describe_params", "esc", "group_tokens", "highlight_lines", "schedule_diff",
           "schedule_graph", "schedule_html", "schedule_rich", "_kib"]
