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

``Options(cheap_int_math=False)`` switches both off (the generic 64-bit forms, ``tkx_ifloordiv`` /
``tkx_iremainder``), with the unrounded small-integer casts and the streaming GEMV's 8-elements-per-lane
chain path. On by default: measured on the H200 (decode step, median of 9 CUDA-graph replays, 20 greedy
tokens of 4 sequences equal to eager both ways) int8 318.6 -> 238.0 µs, int4 459.7 -> 224.9 µs.
Imports only torch, the IR and the op table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from .. import ops as optable
from ..ir import Op, TensorSpec, contiguous_strides

__all__ = ["index_fits_32", "power_of_two_shifts", "shift_table", "int_range", "exact_in_half",
           "INT32_LIMIT", "MAX_EVALUATED", "TABLE_BITS"]

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
    # a broadcast dimension (stride 0) repeats the same elements: one index of it holds every value the
    # view takes (a divisor broadcast over a weight matrix would otherwise be millions of elements to sort)
    shape = [1 if st == 0 else n for n, st in zip(divisor.shape, divisor.strides)]
    view = root.reshape(-1).as_strided(shape, divisor.strides, divisor.offset)
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


_DTYPE_RANGE = {"int8": (-(1 << 7), (1 << 7) - 1), "uint8": (0, 255), "int16": (-(1 << 15), (1 << 15) - 1),
                "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1), "bool": (0, 1)}


def int_range(x: object, ops: Mapping[str, Op], cache: dict[str, tuple[int, int] | None]) -> tuple[int, int] | None:
    """Bounds ``(lo, hi)`` of an integer operand's values (a Python int, or a view of a program input or an op),
    by interval arithmetic over the ops that made it (casts, ``+``/``-``/``*`` by a scalar, ``//`` and ``%`` by
    positive powers of two, ``iota``, ``fill``); a stored input gives its dtype's range; ``None`` for floats."""
    if isinstance(x, bool):
        return (int(x), int(x))
    if isinstance(x, int):
        return (x, x)
    if not isinstance(x, TensorSpec) or x.dtype not in _DTYPE_RANGE:
        return None
    full = _DTYPE_RANGE[x.dtype]
    if x.buffer in cache:
        got = cache[x.buffer]
        return got if got is not None else full
    cache[x.buffer] = None
    op = ops.get(x.buffer)
    got = _op_range(op, ops, cache) if op is not None else None
    if got is not None and not (full[0] <= got[0] and got[1] <= full[1]):
        got = None  # it wraps in the dtype: no bound but the dtype's
    cache[x.buffer] = got
    return got if got is not None else full


def _op_range(op: Op, ops: Mapping[str, Op], cache: dict) -> tuple[int, int] | None:
    if op.kind == "fill" and isinstance(op.attr("value"), int):
        v = int(op.attr("value"))
        return (v, v)
    if op.kind == "iota":
        n = op.out.shape[op.attr("dim", 0)] if op.out.shape else 1
        a, b = int(op.attr("start", 0)), int(op.attr("start", 0)) + int(op.attr("step", 1)) * (max(n, 1) - 1)
        return (min(a, b), max(a, b))
    ins = [int_range(v, ops, cache) for v in op.inputs]
    if any(r is None for r in ins):
        return None
    if op.kind == "cast" and len(ins) == 1:
        return ins[0]
    if op.kind in ("add", "sub", "mul") and len(ins) == 2:
        (a0, a1), (b0, b1) = ins  # type: ignore[misc]
        if op.kind == "add":
            return (a0 + b0, a1 + b1)
        if op.kind == "sub":
            return (a0 - b1, a1 - b0)
        prods = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
        return (min(prods), max(prods))
    if op.kind in ("floor_divide", "remainder") and len(ins) == 2:
        shifts = power_of_two_shifts(op.inputs[1], ops, {})
        if not shifts:
            return None
        lo, hi = ins[0]  # type: ignore[misc]
        if op.kind == "remainder":
            return (0, (1 << max(shifts)) - 1)
        outs = [v >> s for v in (lo, hi) for s in (min(shifts), max(shifts))]
        return (min(outs), max(outs))
    return None


def exact_in_half(x: object, ops: Mapping[str, Op], cache: dict) -> bool:
    """True when integer operand ``x`` provably lies in ``[-256, 256]``, where bf16 and f16 hold every integer."""
    r = int_range(x, ops, cache)
    return r is not None and -256 <= r[0] and r[1] <= 256
