"""A CPU check of the element reads the kernel emits: does the index each read computes name the element
the IR says it reads?

Every pointwise value in the kernel reads its operands through
:meth:`tkx.codegen.kernel_values.ValueEmitter.element`: a load ``tkx_ld_<t>(ptr, INDEX)`` from the
operand's home, or a call ``tkx_v_<op>(TKX_ARGS, INDEX)`` of an inlined value. :func:`check_reads` asks
the emitter for each operand of each op at the linear index ``i``, evaluates ``INDEX`` for every ``i`` with
torch integer tensors, and compares it with where the element lives: element ``i`` (row-major) of the view
``x`` of its root is storage element ``as_strided(x.shape, x.strides, x.offset)[i]``. An op's value is
stored row-major, and a program input keeps the caller's strides (a transposed parameter has strides
``(1, rows)``), so both read the same map. A kernel that read a transposed input as if it were row-major
fails here without a GPU.

Imports only torch, the IR and the emitter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..arena import ArenaPlan
from ..ir import TensorSpec
from ..schedule.model import FusedSchedule

__all__ = ["ReadCheck", "check_reads"]

#: Largest view (elements) whose index map is evaluated.
MAX_ELEMENTS = 1 << 22
#: ``name(first, INDEX)``: a load or a call of an inlined value's device function (no comma in ``first``).
_READ = re.compile(r"(tkx_ld_\w+|tkx_v_\w+)\(([^,]*), (.*)\)")
#: What an index expression may hold once casts and ``LL`` suffixes are gone: ``i``, integers, arithmetic.
_INDEX = re.compile(r"[\si0-9+\-*/%()<>&|]*")


@dataclass
class ReadCheck:
    """``checked``: reads whose index map was evaluated; ``problems``: one line per read whose index names
    another element than the IR's view (op, operand, the first wrong ``i``, the index read and the one
    wanted); ``skipped``: reads not evaluated (a register, a form this check does not parse, a huge view)."""

    checked: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)


def _index_map(text: str, n: int) -> torch.Tensor | None:
    """The values of C index expression ``text`` for ``i = 0 .. n-1`` (``None``: not a form read here)."""
    expr = re.sub(r"\(\s*(?:long long|int|unsigned)\s*\)", "", text)
    expr = re.sub(r"(\d+)(?:LL|ULL|u|U)\b", r"\1", expr)
    if not _INDEX.fullmatch(expr):
        return None
    expr = expr.replace("/", "//")  # non-negative indices: C's truncation is floor division
    i = torch.arange(n, dtype=torch.int64)
    value = eval(expr, {"__builtins__": {}}, {"i": i})  # noqa: S307 - digits, i and arithmetic only
    return torch.as_tensor(value, dtype=torch.int64).expand(n)


def _storage_map(x: TensorSpec) -> torch.Tensor:
    """Storage index of each element (row-major) of view ``x`` of its root buffer."""
    return torch.arange(max(x.extent, 1), dtype=torch.int64).as_strided(x.shape, x.strides, x.offset).reshape(-1)


def check_reads(s: FusedSchedule, arena: ArenaPlan) -> ReadCheck:
    """Evaluate the index of every element read (:meth:`ValueEmitter.element`) of every op operand of
    ``s.program`` that lives in memory or is an inlined value, against the operand's view. Raises
    whatever the emitter raises for an operand it cannot read (a codegen bug)."""
    from .kernel import _Emitter

    em = _Emitter(s, arena)
    for op_id in s.inlined:  # only the index of a call is checked here: its device function is not built
        em.plan.functions[f"tkx_v_{op_id}"] = ""
    inputs = {i.value.buffer for i in s.program.inputs}
    readable = inputs | set(s.inlined) | set(s.homes) | set(s.scratch)
    out = ReadCheck()
    for op in s.program.ops:
        for k, x in enumerate(op.inputs):
            if not isinstance(x, TensorSpec) or x.numel == 0:
                continue
            if x.buffer not in readable or x.numel > MAX_ELEMENTS:
                out.skipped += 1
                continue
            m = _READ.fullmatch(em.element(x, "i", None, None, {}, None))
            got = _index_map(m.group(3), x.numel) if m else None
            if got is None:
                out.skipped += 1
                continue
            out.checked += 1
            want = _storage_map(x)
            bad = (got != want).nonzero()
            if len(bad):
                j = int(bad[0])
                out.problems.append(
                    f"{op.id} reads operand {k} ({x.buffer}, shape {list(x.shape)}, strides {list(x.strides)}) "
                    f"at element {int(got[j])} for i={j}, the view's element is {int(want[j])} "
                    f"({int(len(bad))} of {x.numel} wrong)")
    return out
