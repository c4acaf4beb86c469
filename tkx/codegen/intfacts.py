"""Integer facts the kernel generator proves at generation time, for cheap index and dequant arithmetic.

An inlined dequantisation chain (``q.to(bf16) * scale``, int4 nibbles ``byte // 16**j % 16 - 8``) runs
once per weight element inside a GEMV's operand load, so every integer operation in it counts. Two facts
make it cheap without changing a single result:

* :func:`index_fits_32` -- every element index the kernel's device functions compute (views of stored
  or inlined buffers) lies in ``[0, 2**31)``: the functions then take a 32-bit ``int`` index known to be
  non-negative (``__builtin_assume``), so ``i / 512`` and ``i % 4`` become shifts and masks instead of
  64-bit divisions;
* :func:`power_of_two_shifts` -- the divisor of an integer ``floor_divide`` / ``remainder`` only takes
  positive powers of two (a literal ``16``, or a tensor such as ``16**j`` computed from ``arange`` alone,
  evaluated here with torch): then ``floor(a / 2**s) == a >> s`` (an arithmetic shift is floor division
  for negative ``a`` too) and ``a - floor(a / 2**s) * 2**s == a & (2**s - 1)`` (two's complement), exactly
  torch's semantics (:data:`tkx.ops.ROWS`, Python's ``//`` and ``%``) for every ``a``.

:data:`CHEAP_DEQUANT` switches both off (the generic 64-bit forms, ``tkx_ifloordiv``/``tkx_iremainder``).
Imports only torch, the IR and the op table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from .. import ops as optable
from ..ir import Op, TensorSpec, contiguous_strides

__all__ = ["CHEAP_DEQUANT", "index_fits_32", "power_of_two_shifts", "shift_table", "INT32_LIMIT", "MAX_EVALUATED",
           "TABLE_BITS"]

#: Cheap integer arithmetic in the generated CUDA (32-bit device-function indices where the sizes allow,
#: shifts/masks for integer ``//`` and ``%`` by powers of two). ``False``: the generic 64-bit forms.
CHEAP_DEQUANT = True
#: Indices below this fit a signed 32-bit ``int``.
INT32_LIMIT = 1 << 31
#: Largest index-only value (elements) evaluated on the CPU to learn its divisor values.
MAX_EVALUATED = 1 << 16
#: Bits per entry of a shift table packed into one 64-bit constant (shifts 0..63): 10 entries at most.
TABLE_BITS = 6


def index_fits_32(specs: Iterable[TensorSpec]) -> bool:
    """True when every element index of every view in ``specs`` (each view's root index
    ``offset + sum(coord * stride)`` and its row-major linear index) is below ``2**31``: the largest
    root index of a view is ``offset + sum((size - 1) * stride)`` (strides are non-negative), so
    bounding each view's extent and element count bounds every partial sum of an index expression."""
    for s in specs:
        top = s.offset + sum((n - 1) * st for n, st in zip(s.shape, s.strides) if n > 0)
        if top >= INT32_LIMIT or s.numel >= INT32_LIMIT or s.extent >= INT32_LIMIT:
            return False
    return True


def _index_only_value(buf: str, ops: Mapping[str, Op], cache: dict[str, torch.Tensor | None]) -> torch.Tensor | None:
    """The value of op ``buf`` computed with torch when it depends on no stored data (only ``iota``,
    ``fill`` and scalars, through pointwise ops), else ``None``."""
    if buf in cache:
        return cache[buf]
    cache[buf] = None  # a DAG: no cycles, but keep a failed lookup cheap
    op = ops.get(buf)
    if op is None or op.out.numel > MAX_EVALUATED or op.out.offset != 0 \
            or op.out.strides != contiguous_strides(op.out.shape):
        return None  # the value's storage is its row-major elements (what the views' strides index)
    r = optable.row(op.kind)
    if r.family != "pointwise" and op.kind not in ("iota", "fill"):
        return None
    args: list[object] = []
    for x in op.inputs:
        if isinstance(x, TensorSpec):
            root = _index_only_value(x.buffer, ops, cache)
            if root is None:
                return None
            args.append(root.reshape(-1).as_strided(x.shape, x.strides, x.offset))
        else:
            args.append(x)
    try:
        value = optable.evaluate(op, args, torch.device("cpu"))
    except Exception:  # a kind without a CPU reference here: no fact
        return None
    value = value.reshape(op.out.shape).contiguous()
    cache[buf] = value
    return value


def _shift_of(values: Iterable[int]) -> set[int] | None:
    shifts = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v & (v - 1):
            return None
        shifts.add(v.bit_length() - 1)
    return shifts


def power_of_two_shifts(divisor: object, ops: Mapping[str, Op],
                        cache: dict[str, torch.Tensor | None]) -> set[int] | None:
    """The shifts ``s`` (divisor ``2**s``) an integer divisor takes, when it only takes positive powers of
    two: a Python ``int`` scalar, or a view of an index-only op (:func:`_index_only_value`); else ``None``."""
    if not isinstance(divisor, TensorSpec):
        return _shift_of([divisor]) if isinstance(divisor, int) else None
    root = _index_only_value(divisor.buffer, ops, cache)
    if root is None or root.dtype.is_floating_point or root.dtype == torch.bool:
        return None
    view = root.reshape(-1).as_strided(divisor.shape, divisor.strides, divisor.offset)
    return _shift_of(int(v) for v in torch.unique(view).tolist())


def shift_table(divisor: TensorSpec, ops: Mapping[str, Op], cache: dict[str, torch.Tensor | None]) -> int | None:
    """The shifts of an index-only divisor's root buffer (elements not powers of two get 0: the view
    does not read them, :func:`power_of_two_shifts` checked it) packed :data:`TABLE_BITS` bits per root
    element into one 64-bit constant, when the root has at most ``64 // TABLE_BITS`` elements (e.g.
    ``16**arange(2)``: ``0 | 4 << 6``); else ``None``. Element ``r``'s shift is ``(table >> (6 * r)) & 63``."""
    root = _index_only_value(divisor.buffer, ops, cache)
    if root is None or root.numel() > 64 // TABLE_BITS:
        return None
    table = 0
    for r, v in enumerate(int(x) for x in root.reshape(-1).tolist()):
        if v > 0 and not v & (v - 1):
            table |= (v.bit_length() - 1) << (TABLE_BITS * r)
    return table
