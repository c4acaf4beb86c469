"""Pointwise C expressions: the op table's ``c`` builders, given typed operands.

:func:`expr` looks ``op.kind`` up in the op table (:mod:`tkx.ops`), converts each operand to
the op's compute type (``float``, or ``long long`` for integer ops: :func:`tkx.ops.compute_type`)
and formats scalar operands; :func:`value` also rounds the result to the op's output dtype,
which is what the code generator keeps in a register (every op rounds its output, as eager
PyTorch does).

Choices that keep results within 1e-5 (relative) of eager PyTorch (each row's ``c`` builder
implements them):

* precise CUDA math functions (``expf``, ``logf``, ``tanhf``, ``erff``, ``sinf``), never the
  ``__expf``-style intrinsics; true division and ``sqrtf`` are IEEE-rounded by NVRTC's
  defaults (``-prec-div=true -prec-sqrt=true``);
* ``pow`` with the scalar exponents ATen special-cases (0.5, 2, 3, -0.5, -1, -2) is written
  the way ATen computes it (``sqrtf``, ``x * x`` ...), otherwise ``powf``; like ATen, a scalar
  exponent is first rounded to the base's dtype (for bf16, 1.7 becomes 1.703125);
* ``maximum``/``minimum``/``clamp`` propagate NaN (``tkx_max``/``tkx_min`` from the prelude);
* comparisons and logical ops give ``1.0f``/``0.0f``; a nonzero (or NaN) float is true;
* integer ops (``add``, ``floor_divide``, ``remainder``, comparisons of integers ...) run in
  ``long long`` and are exact;
* in ``exact`` mode float add/sub/mul/div use ``__fadd_rn``-style intrinsics, which the
  compiler never fuses into a multiply-add, so each op rounds separately as in eager.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import ops as table
from ..dtypes import INT_DTYPES, f32, int_literal, literal, round_scalar  # noqa: F401 (re-exported)
from ..ir import Op, TensorSpec
from .cuda_prelude import round_to

#: Integer dtypes whose ``long long`` registers always hold a 32-bit value (round_to wraps them).
_NARROW_INTS = ("int32", "int16", "int8", "uint8")

#: Operands of these positions are not converted to the compute type (a condition is tested against 0).
_UNCONVERTED = {"where": (0,), "philox": (0, 1, 2), "order_key": (0,)}


def _convert(text: str, src: str, dst: str) -> str:
    if src == dst:
        return text
    return f"(float)({text})" if dst == "float" else f"(long long)({text})"


def expr(op: Op, operands: Sequence[str | float | int | bool], *, exact: bool = False, cheap: bool = True) -> str:
    """The C expression computing pointwise ``op`` from its operands, in its compute type.

    ``operands`` has one entry per ``op.inputs``: a C expression for a tensor operand (of
    type ``long long`` when that operand's dtype is an integer, else ``float``) or the Python
    scalar itself. The result is *not* rounded to ``op.out.dtype``; :func:`value` does that.
    ``cheap`` (``Options.cheap_int_math``): a 1- to 4-byte integer operand of a float op is converted
    through ``int`` (the cheaper conversion, the same float). Raises :class:`tkx.ops.UnknownKindError`
    for a kind without a row and ``KeyError`` for a row without a C expression (an index op, emitted by
    the kernel generator itself).
    """
    r = table.row(op.kind)
    if r.c is None:
        raise KeyError(f"no C expression for {r.family} op kind {op.kind!r} (the kernel generator emits it)")
    if len(operands) != len(op.inputs):
        raise ValueError(f"{op.id} ({op.kind}) has {len(op.inputs)} operands, got {len(operands)} expressions")
    ct = table.compute_type(op)
    integer = ct == "int"
    scalars: dict[int, float | int | bool] = {}
    args: list[str] = []
    keep = _UNCONVERTED.get(op.kind, ())
    for i, (x, spec) in enumerate(zip(operands, op.inputs)):
        if isinstance(x, str):
            src = "int" if isinstance(spec, TensorSpec) and spec.dtype in INT_DTYPES else (
                "int" if integer and not isinstance(spec, TensorSpec) else "float")
            if (cheap and src == "int" and ct == "float" and i not in keep
                    and isinstance(spec, TensorSpec) and spec.dtype in _NARROW_INTS):
                x = f"(int)({x})"  # a 32-bit value: the cheaper int-to-float conversion, the same float
            args.append(x if i in keep else _convert(x, src, ct))
            continue
        if op.kind == "pow" and i == 1 and isinstance(op.inputs[0], TensorSpec):
            # ATen converts a scalar exponent to the tensor's dtype (bf16: 1.7 -> 1.703125)
            x = round_scalar(float(x), op.inputs[0].dtype)
        scalars[i] = x
        args.append(int_literal(x) if integer else literal(x))
    return r.c(*args, table.Emit(op, integer=integer, exact=exact, scalars=scalars))


def value(op: Op, operands: Sequence[str | float | int | bool], *, exact: bool = False,
          exact_cast: bool = False, cheap: bool = True) -> str:
    """:func:`expr` rounded to ``op.out.dtype`` (the value eager PyTorch would store). ``exact_cast``: a
    ``cast`` of an integer the caller proved within ``[-256, 256]`` to bf16/f16 (exact there) is not rounded."""
    text = expr(op, operands, exact=exact, cheap=cheap)
    if exact_cast and op.kind == "cast" and op.out.dtype in ("bfloat16", "float16"):
        return text  # the caller proved the integer exact in the 2-byte float (|x| <= 256): no rounding
    if op.out.dtype in INT_DTYPES and table.compute_type(op) != "int":
        text = f"(long long)({text})"
    return round_to(op.out.dtype, text)


def c_type(dtype: str) -> str:
    """The register type of a value of ``dtype``: ``long long`` for integers, else ``float``."""
    return "long long" if dtype in INT_DTYPES else "float"


def missing_kinds() -> list[str]:
    """Pointwise kinds of the op table with no C expression, except those the kernel generator
    emits itself (empty when the table is complete)."""
    return sorted(k for k in table.POINTWISE if table.OPS[k].c is None and not table.OPS[k].statements)
