"""How two CUDA sources differ, as data (a :class:`~tkx.diff.StageDiff`): a unified diff of the
kernel text with line counts, launch, shared and arena bytes."""

from __future__ import annotations

import difflib
from typing import Any

from .. import display
from ..diff import StageDiff
from ..diff import arrow as _arrow
from .source import CudaSource


@display.register(CudaSource, "diff")
def cuda_diff(a: Any, b: Any, context: int = 2, limit: int = 4000) -> StageDiff:
    """A unified diff of the kernel text with line counts."""
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
