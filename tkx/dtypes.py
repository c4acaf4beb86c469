"""The dtypes of the IR: sizes, torch equivalents, and exact scalar rounding and C literals.

A low layer (it imports nothing from tkx but nothing at all from the stages): the IR, the op
table, both interpreters and the code generator read it.
"""

from __future__ import annotations

import math
import struct

import torch

#: dtypes a value may have, with their size in bytes.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1,
    "int8": 1, "uint8": 1,  # weight-only quantised weights (int8, packed int4)
}
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
INT_DTYPES = ("int64", "int32", "int8", "uint8")
#: Short names used by the printer (JAX style).
DTYPE_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64",
               "int32": "i32", "bool": "bool", "int8": "i8", "uint8": "u8"}
#: IR dtype -> torch dtype.
TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
         "int64": torch.int64, "int32": torch.int32, "bool": torch.bool, "int8": torch.int8,
         "uint8": torch.uint8}


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


def int_literal(x: int | float | bool) -> str:
    """A C ``long long`` literal of the integer ``x`` (``-3`` -> ``-3LL``; the int64 minimum spelled safely)."""
    v = int(x)
    if v == -(2**63):
        return "TKX_INT64_MIN"
    return f"{v}LL"
