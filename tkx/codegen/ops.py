"""The per-op C expression table: how each pointwise IR op is computed in fp32.

:data:`POINTWISE_EXPR` maps every pointwise kind of :data:`tkx.ir.OPS` to a function that
takes the operands as C expressions (already floats) and returns the op's value as an fp32 C
expression. :func:`expr` looks the op up and formats scalar operands; :func:`value` also
rounds the result to the op's output dtype, which is what the code generator stores in a
register (every op rounds its output, as eager PyTorch does).

Choices that keep results within 1e-5 (relative) of eager PyTorch:

* precise CUDA math functions (``expf``, ``logf``, ``tanhf``, ``erff``), never the
  ``__expf``-style intrinsics; true division and ``sqrtf`` are IEEE-rounded by NVRTC's
  defaults (``-prec-div=true -prec-sqrt=true``);
* ``pow`` with the scalar exponents ATen special-cases (0.5, 2, 3, -0.5, -1, -2) is written
  the way ATen computes it (``sqrtf``, ``x * x`` ...), otherwise ``powf``; like ATen, a scalar
  exponent is first rounded to the base's dtype (for bf16, 1.7 becomes 1.703125);
* ``maximum``/``minimum``/``clamp`` propagate NaN (``tkx_max``/``tkx_min`` from the prelude);
* comparisons and logical ops give ``1.0f``/``0.0f``; a nonzero (or NaN) float is true;
* in ``exact`` mode add/sub/mul/div use ``__fadd_rn``-style intrinsics, which the compiler
  never fuses into a multiply-add, so each op rounds separately as in eager.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ..ir import OPS, POINTWISE, Op, TensorSpec
from .cuda_prelude import round_to

Arg = str  # a C expression of type float


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (as torch rounds a Python scalar for fp32 math)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # beyond float32's range: it becomes infinity
        return math.copysign(math.inf, x)


def round_scalar(x: float, dtype: str) -> float:
    """``x`` rounded to ``dtype`` (nearest, ties to even), as a Python float."""
    v = f32(float(x))
    if dtype == "bfloat16" and math.isfinite(v):
        bits = struct.unpack("I", struct.pack("f", v))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("f", struct.pack("I", bits))[0]
    if dtype == "float16" and math.isfinite(v):
        try:
            return struct.unpack("e", struct.pack("e", v))[0]
        except OverflowError:
            return math.copysign(math.inf, v)
    return v


def literal(x: float | int | bool) -> str:
    """A C float literal that parses to exactly ``float32(x)``, as short as possible.

    ``True`` -> ``1.0f``, ``0.1`` -> ``0.1f``, ``1e-5`` -> ``1e-05f``, infinities and NaN
    -> ``TKX_INF`` / ``-TKX_INF`` / ``TKX_NAN`` (the prelude's macros).
    """
    v = f32(float(x))
    if math.isnan(v):
        return "TKX_NAN"
    if math.isinf(v):
        return "TKX_INF" if v > 0 else "-TKX_INF"
    if v.is_integer() and abs(v) < 1e16:
        return f"{int(v)}.0f" if v or math.copysign(1, v) > 0 else "-0.0f"
    for digits in range(1, 10):  # the shortest decimal that round-trips through float32
        text = f"{v:.{digits}g}"
        if f32(float(text)) == v:
            break
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return text + "f"


def _is_call(a: str) -> bool:
    """True for ``name(...)`` where the first ``(`` closes at the very end."""
    head, _, _ = a.partition("(")
    if not head or not head.replace("_", "").replace("::", "").isalnum() or not a.endswith(")"):
        return False
    depth = 0
    for i, ch in enumerate(a):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and ch == ")":
            return i == len(a) - 1
    return False


def _paren(a: str) -> str:
    """``a`` wrapped in parentheses unless it is a plain name, number, call or indexing."""
    simple = a.replace("_", "").replace(".", "").replace("[", "").replace("]", "").isalnum()
    return a if simple or _is_call(a) else f"({a})"


def _binary(symbol: str, intrinsic: str) -> Callable[..., str]:
    def emit(a: Arg, b: Arg, *, exact: bool = False, **_: Any) -> str:
        return f"{intrinsic}({a}, {b})" if exact else f"{_paren(a)} {symbol} {_paren(b)}"
    return emit


def _compare(symbol: str) -> Callable[..., str]:
    return lambda a, b, **_: f"({_paren(a)} {symbol} {_paren(b)} ? 1.0f : 0.0f)"


def _pow(a: Arg, b: Arg, *, exponent: float | None = None, **_: Any) -> str:
    """``a ** b``; ``exponent`` is the scalar exponent when known at compile time."""
    x = _paren(a)
    special = {
        0.0: "1.0f", 1.0: a, 0.5: f"sqrtf({a})", 2.0: f"{x} * {x}", 3.0: f"{x} * {x} * {x}",
        -0.5: f"1.0f / sqrtf({a})", -1.0: f"1.0f / {x}", -2.0: f"1.0f / ({x} * {x})",
    }
    if exponent is not None and float(exponent) in special:
        return special[float(exponent)]
    return f"powf({a}, {b})"


def _clamp(a: Arg, *, lo: str | None = None, hi: str | None = None, **_: Any) -> str:
    out = a
    if lo is not None:
        out = f"tkx_max({out}, {lo})"
    if hi is not None:
        out = f"tkx_min({out}, {hi})"
    return out


#: kind -> function(*operand_exprs, exact=..., **op_specific) -> fp32 C expression.
POINTWISE_EXPR: dict[str, Callable[..., str]] = {
    # unary
    "neg": lambda a, **_: f"-{_paren(a)}",
    "exp": lambda a, **_: f"expf({a})",
    "log": lambda a, **_: f"logf({a})",
    "tanh": lambda a, **_: f"tanhf({a})",
    "sigmoid": lambda a, **_: f"1.0f / (1.0f + expf(-{_paren(a)}))",
    "sqrt": lambda a, **_: f"sqrtf({a})",
    "rsqrt": lambda a, **_: f"1.0f / sqrtf({a})",
    "abs": lambda a, **_: f"fabsf({a})",
    "sign": lambda a, **_: f"(float)((0.0f < {_paren(a)}) - ({_paren(a)} < 0.0f))",  # sign(NaN) = 0, as torch
    "erf": lambda a, **_: f"erff({a})",
    "reciprocal": lambda a, **_: f"1.0f / {_paren(a)}",
    "logical_not": lambda a, **_: f"({_paren(a)} == 0.0f ? 1.0f : 0.0f)",
    "cast": lambda a, **_: a,  # the conversion is the rounding to the output dtype
    "clamp": _clamp,
    # binary
    "add": _binary("+", "__fadd_rn"),
    "sub": _binary("-", "__fsub_rn"),
    "mul": _binary("*", "__fmul_rn"),
    "div": _binary("/", "__fdiv_rn"),
    "pow": _pow,
    "maximum": lambda a, b, **_: f"tkx_max({a}, {b})",
    "minimum": lambda a, b, **_: f"tkx_min({a}, {b})",
    "eq": _compare("=="),
    "ne": _compare("!="),
    "lt": _compare("<"),
    "le": _compare("<="),
    "gt": _compare(">"),
    "ge": _compare(">="),
    "logical_and": lambda a, b, **_: f"({_paren(a)} != 0.0f && {_paren(b)} != 0.0f ? 1.0f : 0.0f)",
    "logical_or": lambda a, b, **_: f"({_paren(a)} != 0.0f || {_paren(b)} != 0.0f ? 1.0f : 0.0f)",
    # ternary
    "where": lambda c, a, b, **_: f"({_paren(c)} != 0.0f ? {a} : {b})",
}

#: Kinds whose result is a float whatever their operands (their output is 0/1 in any dtype).
BOOLEAN_RESULT = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"})


def _operand(x: str | float | int | bool) -> str:
    return x if isinstance(x, str) else literal(x)


def expr(op: Op, operands: Sequence[str | float | int | bool], *, exact: bool = False) -> str:
    """The fp32 C expression computing pointwise ``op`` from its operands.

    ``operands`` has one entry per ``op.inputs``: a C expression (a float) for a tensor
    operand, or the Python scalar itself (formatted with :func:`literal`). Scalars that are
    still in ``op.inputs`` may also be passed as their C text. The result is *not* rounded
    to ``op.out.dtype``; :func:`value` does that.
    """
    if op.kind not in POINTWISE_EXPR:
        family = OPS[op.kind].family if op.kind in OPS else "unknown"
        raise KeyError(f"no C expression for {family} op kind {op.kind!r}")
    if len(operands) != len(op.inputs):
        raise ValueError(f"{op.id} ({op.kind}) has {len(op.inputs)} operands, "
                         f"got {len(operands)} expressions")
    args = [_operand(x) for x in operands]
    extra: dict[str, Any] = {"exact": exact}
    if op.kind == "pow":
        scalar = op.inputs[1] if not isinstance(op.inputs[1], TensorSpec) else None
        if scalar is None and not isinstance(operands[1], str):
            scalar = operands[1]
        if scalar is not None:
            # ATen converts a scalar exponent to the tensor's dtype (bf16: 1.7 -> 1.703125)
            scalar = round_scalar(float(scalar), op.inputs[0].dtype) if isinstance(op.inputs[0], TensorSpec) \
                else float(scalar)
            args[1] = literal(scalar)
        extra["exponent"] = scalar
    if op.kind == "clamp":
        lo, hi = op.attr("min"), op.attr("max")
        extra["lo"] = None if lo is None else literal(lo)
        extra["hi"] = None if hi is None else literal(hi)
    return POINTWISE_EXPR[op.kind](*args, **extra)


def value(op: Op, operands: Sequence[str | float | int | bool], *, exact: bool = False) -> str:
    """:func:`expr` rounded to ``op.out.dtype`` (the value eager PyTorch would store)."""
    return round_to(op.out.dtype, expr(op, operands, exact=exact))


def missing_kinds() -> list[str]:
    """Pointwise kinds of :data:`tkx.ir.OPS` with no entry here (empty when the table is complete)."""
    return sorted(k for k in POINTWISE if k not in POINTWISE_EXPR)
