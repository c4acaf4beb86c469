"""The source map of a generated kernel, built from where the emitter put each piece.

``source_map(...) -> (op_lines, group_lines, function_lines)``: the kernel's assembly
(:func:`tkx.codegen.kernel.generate`) knows the line where each group's code starts in the kernel, where
each section and each outlined device function begins; within a group's or a function's own lines, the
ops are found from the comment every emitter writes after the statement computing or storing one
(:func:`tkx.codegen.outline.op_lines_of`).
"""

from __future__ import annotations

from typing import Any

from .outline import Body, op_lines_of

__all__ = ["source_map"]


def source_map(lines: list[str], s: Any, ops: dict, bounds: list[tuple[int, str | None]], *,
               functions: tuple[int, int] | None, outlined: dict[str, tuple[str, Body]],
               pieces: list[tuple[str, str, list[str]]], outlined_at: int | None
               ) -> tuple[dict[str, list[int]], dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """``lines``: the text's lines; ``bounds``: 1-based kernel lines where a group's code starts (its id)
    or a stage, barrier or the kernel ends (``None``); ``functions``: the (first, last) lines of the
    ``tkx_v_`` functions; ``pieces``: the outlined functions (name, text, the groups calling it) in
    order from line ``outlined_at``. Returns op id -> lines, group id -> (first, last) of its code in the
    kernel, group id -> (first, last) of the device function holding its body (outlined groups)."""
    op_lines: dict[str, list[int]] = {}

    def scan(first: int, text: str) -> None:
        for op, nos in op_lines_of(text, ops).items():
            op_lines.setdefault(op, []).extend(first + n for n in nos)

    if functions is not None:
        first, last = functions
        scan(first, "\n".join(lines[first - 1:last]))
        for no in range(first, last + 1):
            line = lines[no - 1]
            if line.lstrip().startswith("__device__ __forceinline__ float tkx_v_"):
                op_lines.setdefault(line.split("tkx_v_", 1)[1].split("(", 1)[0], []).append(no)
    group_lines: dict[str, tuple[int, int]] = {}
    for (no, gid), (nxt, _) in zip(bounds, bounds[1:]):
        if gid is not None:
            group_lines[gid] = (no, nxt - 1)
            scan(no, "\n".join(lines[no - 1:nxt - 1]))
    function_lines: dict[str, tuple[int, int]] = {}
    at = outlined_at
    for _, text, users in pieces:
        for gid in users:
            function_lines[gid] = (at, at + text.count("\n"))
            scan(at + 2, outlined[gid][1].text)  # the body starts below the comment and the signature
        at += text.count("\n") + 2  # the pieces are one blank line apart
    # The loop skeleton of a group (tile loops, the GEMM's k-loop, a reduction's accumulation) carries no
    # op comment: its code lines belong to the group's anchor op, so lines_of("mm") is the whole GEMM.
    claimed = {no for nos in op_lines.values() for no in nos}
    for gid, (first, last) in group_lines.items():
        anchor = s.groups[gid].anchor
        if anchor not in ops:
            continue
        ranges = [(first + 1, last)] + ([function_lines[gid]] if gid in function_lines else [])
        own = [no for a, b in ranges for no in range(a, b + 1)
               if no not in claimed and lines[no - 1].strip().replace("else", "").strip("{} ")
               and not lines[no - 1].lstrip().startswith("//")]
        op_lines[anchor] = sorted(set(op_lines.get(anchor, [])) | set(own))
    return op_lines, group_lines, function_lines
