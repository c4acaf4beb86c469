"""The op table: one row per IR primitive, read by every stage.

Each :class:`OpDef` row says everything tkx knows about one primitive: its family and arity,
the aten overloads that lower to it one to one, the torch function both interpreters use
(:func:`tkx.reference.evaluate` and the schedule interpreter call the same one), the C
expression the code generator emits, the flags the passes and fusion rules read
(commutative, cost class, boolean result, exact on integers), how its output dtype is
chosen, and for reductions the identity, the fold and the combine of partial results.

Adding a pointwise op is one row here (``atan`` was added so)::

    OpDef(Kind.ATAN, "pointwise", 1, "arctangent", ("atan.default",), torch.atan,
          lambda a, e: f"atanf({a})", cost=_F),

plus its member of :class:`Kind` (``ATAN = "atan"``), so that a typo in a kind fails at import;
``tests/test_op_table.py`` then asks for a probe step using it. Every consumer
looks rows up with :func:`row`, which raises :class:`UnknownKindError` for a kind the table
does not have; nothing falls back to a default.

Families:

============ ==========================================================================
pointwise    one output element from the operands' elements at the same point
reduction    ``out[row] = fold_r x[row, r]`` over ``attrs['dims']``
matmul       ``mm``/``bmm``/``addmm``: GEMM groups
generator    no tensor operand (``fill``, ``iota``)
index        reads operands at computed coordinates (``gather``, ``cat``,
             ``slice_scatter``, ``scatter``): never a register read of another op's value
attention    scaled dot-product attention composites (``attention``, ``attention_backward``):
             the scheduler expands them to their math or emits one fused group each
============ ==========================================================================

C expressions (``c``) take the operands as C expressions already converted to the op's
compute type (``float``, or ``long long`` when :func:`compute_type` says ``int``) and an
:class:`Emit` context, and return an expression of that type. Integer values (int32/int64)
live in ``long long`` registers; booleans are ``0.0f``/``1.0f`` floats; every float value is
an fp32 register rounded to its IR dtype after each op (as eager PyTorch rounds each op).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import indexing, philox
from .dtypes import FLOAT_DTYPES, INT_DTYPES, TORCH, int_literal, literal
from .errors import TkxError


class Kind(str, enum.Enum):
    """Every IR op kind. A ``str`` enum: ``Kind.EXP == "exp"``, and ``Kind.EPX`` fails at import."""

    # pointwise, unary
    NEG = "neg"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG1P = "log1p"
    SIN = "sin"
    COS = "cos"
    ATAN = "atan"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    ABS = "abs"
    SIGN = "sign"
    ERF = "erf"
    RECIPROCAL = "reciprocal"
    FLOOR = "floor"
    CEIL = "ceil"
    TRUNC = "trunc"
    ROUND = "round"
    ISNAN = "isnan"
    ISINF = "isinf"
    LOGICAL_NOT = "logical_not"
    CAST = "cast"
    CLAMP = "clamp"
    INDEX_CHECK = "index_check"
    ORDER_KEY = "order_key"
    # pointwise, binary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    FLOOR_DIVIDE = "floor_divide"
    REMAINDER = "remainder"
    FMOD = "fmod"
    POW = "pow"
    XLOGY = "xlogy"
    MAXIMUM = "maximum"
    FMAX = "fmax"
    FMIN = "fmin"
    MINIMUM = "minimum"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    # pointwise, ternary
    WHERE = "where"
    # reductions
    SUM = "sum"
    MEAN = "mean"
    AMAX = "amax"
    AMIN = "amin"
    # matmul
    MM = "mm"
    BMM = "bmm"
    ADDMM = "addmm"
    # generators
    FILL = "fill"
    IOTA = "iota"
    # index
    GATHER = "gather"
    CAT = "cat"
    SLICE_SCATTER = "slice_scatter"
    SCATTER = "scatter"
    # random numbers (counter-based: a pure function of seed, offset and counter)
    PHILOX = "philox"
    # attention composites (expanded to their math or fused by the scheduler)
    ATTENTION = "attention"
    ATTENTION_BACKWARD = "attention_backward"

    def __str__(self) -> str:  # print as the plain name in messages and the IR
        return self.value

    __hash__ = str.__hash__  # Kind.EXP and "exp" are the same dict key


class UnknownKindError(TkxError, KeyError):
    """An op kind that the op table has no row for (a stage met an op it cannot handle)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Emit:
    """What a C expression builder knows besides its operands.

    ``op`` is the IR op (attrs, dtypes); ``integer`` is True when the op computes in
    ``long long`` registers; ``exact`` asks for separately rounded float arithmetic
    (``__fadd_rn``...); ``scalars`` are the op's Python-scalar operands by position.
    """

    op: Any
    integer: bool = False
    exact: bool = False
    scalars: Mapping[int, Any] = field(default_factory=dict)

    def lit(self, x: Any) -> str:
        """A C literal of ``x`` in this op's compute type."""
        return int_literal(x) if self.integer else literal(x)


@dataclass(frozen=True)
class Reduction:
    """What a reduction row adds: C identity and fold, warp/block helpers, torch combine.

    ``identity`` maps ``"float"``/``"int"`` to the accumulator's initial C value; ``fold``
    is a C statement template over ``{acc}`` and ``{x}``; ``warp``/``block`` name the
    prelude's cross-lane and cross-warp helpers (overloaded for ``float`` and
    ``long long``); ``partial_kind`` is the reduction that folds partial results
    (``mean`` is summed, then divided once: ``divide=True``); ``combine`` is the torch
    function that folds partial results in the schedule interpreter; ``empty`` the value a
    chunk with no elements contributes.
    """

    identity: Mapping[str, str]
    fold: str
    warp: str
    block: str
    partial_kind: str
    combine: Callable[[torch.Tensor, int], torch.Tensor]
    empty: float
    divide: bool = False


@dataclass(frozen=True)
class OpDef:
    """One row of the op table (see the module docstring).

    ``kind``/``family``/``arity`` (``None`` = variadic)/``doc``; ``aten``: overload names
    (``"exp.default"``) that lower to this op with the node's operands in order; ``ref``:
    torch implementation ``ref(op, args, device) -> Tensor`` or a plain torch function of
    the operands; ``c``: C expression builder ``c(*operands, e: Emit) -> str`` (pointwise
    only); ``commutative``; ``cost``: ``"cheap"`` or ``"transcendental"`` (fusion rules
    recompute only cheap producers); ``boolean``: the result is 0/1; ``int_exact``: the op
    is computed exactly in integer registers when its operands are integers (otherwise an
    integer result is refused at lowering); ``dtype``: ``"promote"`` (torch's promotion,
    taken from the FX node), ``"bool"``, ``"float"`` (true division), ``"int64"`` (``order_key``); ``reduction``: the
    :class:`Reduction` of a reduction row; ``ref_takes_op``: ``ref`` is called as
    ``ref(op, args, device)`` (it needs attrs or the output dtype); ``statements``: the code
    generator emits the op as C statements of its own (index ops, ``index_check``), not from ``c``.
    """

    kind: Kind
    family: str
    arity: int | None
    doc: str
    aten: tuple[str, ...] = ()
    ref: Callable[..., torch.Tensor] | None = None
    c: Callable[..., str] | None = None
    commutative: bool = False
    cost: str = "cheap"
    boolean: bool = False
    int_exact: bool = False
    dtype: str = "promote"
    reduction: Reduction | None = None
    ref_takes_op: bool = False
    statements: bool = False

    @property
    def name(self) -> str:
        return self.kind.value

    @property
    def transcendental(self) -> bool:
        return self.cost == "transcendental"

    @property
    def reads_at_point(self) -> bool:
        """Are the operands read at the point being computed? (False for index ops: they read
        at computed coordinates, so the scheduler never gives them a register operand.)"""
        return self.family != "index"


# -- C expression helpers ------------------------------------------------------------------


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


def paren(a: str) -> str:
    """``a`` wrapped in parentheses unless it is a plain name, number, call or indexing."""
    simple = a.replace("_", "").replace(".", "").replace("[", "").replace("]", "").isalnum()
    return a if simple or _is_call(a) else f"({a})"


def _binary(symbol: str, intrinsic: str) -> Callable[..., str]:
    def emit(a: str, b: str, e: Emit) -> str:
        if e.exact and not e.integer:
            return f"{intrinsic}({a}, {b})"
        return f"{paren(a)} {symbol} {paren(b)}"
    return emit


def _compare(symbol: str) -> Callable[..., str]:
    return lambda a, b, e: f"({paren(a)} {symbol} {paren(b)} ? 1.0f : 0.0f)"


def _truth(a: str, e: Emit) -> str:
    return f"{paren(a)} != 0" if e.integer else f"{paren(a)} != 0.0f"


def _logical(symbol: str) -> Callable[..., str]:
    return lambda a, b, e: f"(({_truth(a, e)}) {symbol} ({_truth(b, e)}) ? 1.0f : 0.0f)"


def _pow(a: str, b: str, e: Emit) -> str:
    """``a ** b``; a scalar exponent known at compile time is written the way ATen computes it."""
    x = paren(a)
    exponent = e.scalars.get(1)
    special = {
        0.0: "1.0f", 1.0: a, 0.5: f"sqrtf({a})", 2.0: f"{x} * {x}", 3.0: f"{x} * {x} * {x}",
        -0.5: f"1.0f / sqrtf({a})", -1.0: f"1.0f / {x}", -2.0: f"1.0f / ({x} * {x})",
    }
    if exponent is not None and float(exponent) in special:
        return special[float(exponent)]
    return f"powf({a}, {b})"


def _clamp(a: str, e: Emit) -> str:
    lo, hi = e.op.attr("min"), e.op.attr("max")
    out = a
    mx, mn = ("tkx_imax", "tkx_imin") if e.integer else ("tkx_max", "tkx_min")
    if lo is not None:
        out = f"{mx}({out}, {e.lit(lo)})"
    if hi is not None:
        out = f"{mn}({out}, {e.lit(hi)})"
    return out


def _int_or_float(int_form: str, float_form: str) -> Callable[..., str]:
    def emit(*args: Any) -> str:
        *ops, e = args
        form = int_form if e.integer else float_form
        return form.format(*ops, *(paren(o) for o in ops))
    return emit


# -- torch references -------------------------------------------------------------------------


def _attention_ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    from . import attention_ref

    q, k, v = args[:3]
    mask = args[3] if op.attr("mask", "none") != "none" else None
    return attention_ref.packed_forward(q, k, v, mask, bool(op.attr("causal")), float(op.attr("scale")),
                                        str(op.attr("empty_rows", "zero")))


def _attention_backward_ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    from . import attention_ref

    q, k, v, out, lse, dout = args[:6]
    mask = args[6] if op.attr("mask", "none") != "none" else None
    return attention_ref.packed_backward(q, k, v, mask, out, lse, dout, bool(op.attr("causal")),
                                         float(op.attr("scale")))


def _tensor_pair(a: Any, b: Any, op: Any, device: torch.device) -> tuple[Any, Any]:
    """Make scalar operands tensors where the torch function needs them (keeping promotion)."""
    dtype = TORCH[op.out.dtype]
    if not isinstance(a, torch.Tensor):
        a = torch.tensor(a, dtype=torch.result_type(a, b) if isinstance(b, torch.Tensor) else dtype, device=device)
    if not isinstance(b, torch.Tensor):
        b = torch.tensor(b, dtype=torch.result_type(a, b), device=device)
    return a, b


def _binary_ref(fn: Callable[..., torch.Tensor], *, tensors: bool = False) -> Callable[..., torch.Tensor]:
    def ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
        a, b = args
        if not isinstance(a, torch.Tensor) or (tensors and not isinstance(b, torch.Tensor)):
            a, b = _tensor_pair(a, b, op, device)
        return fn(a, b)
    return ref


def _matmul_ref(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` (torch.mm, torch.bmm, torch.addmm) as the kernels compute it: bf16/fp16 operands
    multiplied with fp32 accumulation, the result rounded once to the operands' dtype. On the CPU
    this runs as an fp32 GEMM: torch's own bf16 GEMM there is a scalar loop on CPUs without
    AVX-512 BF16 (2.1 s for medium's 256x4096x1024 on this project's CI machine, 0.05 s in fp32);
    on CUDA it is torch's own call (cuBLAS accumulates in fp32 already)."""
    def ref(*args: Any, **kwargs: Any) -> torch.Tensor:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        low = tensors and tensors[0].dtype in (torch.bfloat16, torch.float16)
        if not low or tensors[0].device.type != "cpu":
            return fn(*args, **kwargs)
        dtype = tensors[0].dtype
        return fn(*(a.float() if isinstance(a, torch.Tensor) else a for a in args), **kwargs).to(dtype)
    return ref


def _where_ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    cond, a, b = args
    dtype = TORCH[op.out.dtype]
    cond = cond.bool() if isinstance(cond, torch.Tensor) else torch.tensor(bool(cond), device=device)
    a = a.to(dtype) if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dtype, device=device)
    b = b.to(dtype) if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=dtype, device=device)
    return torch.where(cond, a, b)


def _cast_ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    return args[0].to(TORCH[op.out.dtype])


def order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys that order float ``x`` as ``torch.max``/``argmax`` compare it: ``-0.0`` and ``+0.0``
    get one key, every NaN the key ``2**31 - 1`` (above ``+inf``'s ``0x7f800000``); otherwise the
    float32 bits read as an int32, negative values with their magnitude bits flipped, so that
    ``a < b`` exactly when ``key(a) < key(b)``. Keys lie in ``(-2**31, 2**31)``, so
    ``key * 2**32 + position`` fits an int64. ``x`` of any float dtype (converted to float32, exact
    for bf16/fp16)."""
    x = x.to(torch.float32).contiguous()
    x = torch.where(x == 0, torch.zeros_like(x), x)
    bits = x.view(torch.int32).to(torch.int64)
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return torch.where(torch.isnan(x), torch.full_like(key, 2**31 - 1), key)


def _clamp_ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    return torch.clamp(args[0], op.attr("min"), op.attr("max"))


def _reduce_ref(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
        x = args[0]
        dtype = TORCH[op.out.dtype]
        dims, keep = tuple(op.attr("dims", ())), bool(op.attr("keepdim", False))
        if not dims:
            return x.to(dtype).clone()
        if fn in (torch.sum, torch.mean):
            if fn is torch.mean and not x.is_floating_point():
                x = x.to(dtype)
            return fn(x, dim=dims, keepdim=keep, dtype=dtype)
        return fn(x, dim=dims, keepdim=keep).to(dtype)
    return ref


def _fill_ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    return torch.full(op.out.shape, op.attr("value"), dtype=TORCH[op.out.dtype], device=device)


def _iota_ref(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    dim, n = op.attr("dim", 0), op.out.shape[op.attr("dim", 0)]
    start, step = op.attr("start", 0), op.attr("step", 1)
    if op.out.dtype in INT_DTYPES and isinstance(start, int) and isinstance(step, int):
        line = start + step * torch.arange(n, device=device, dtype=torch.int64)
    else:
        line = start + step * torch.arange(n, device=device, dtype=torch.float64)
    view = [1] * op.out.ndim
    view[dim] = n
    return line.reshape(view).expand(op.out.shape).to(TORCH[op.out.dtype])


def _xlogy(a: torch.Tensor, b: Any) -> torch.Tensor:
    return torch.xlogy(a, b)


# -- the table ----------------------------------------------------------------------------------

_SUM = Reduction({"float": "0.0f", "int": "0LL"}, "{acc} += {x};", "tkx_warp_sum", "tkx_block_sum", "sum",
                 lambda t, d: t.sum(dim=d), 0.0)
_MEAN = Reduction({"float": "0.0f", "int": "0LL"}, "{acc} += {x};", "tkx_warp_sum", "tkx_block_sum", "sum",
                  lambda t, d: t.sum(dim=d), 0.0, divide=True)
_AMAX = Reduction({"float": "-TKX_INF", "int": "TKX_INT64_MIN"}, "{acc} = tkx_max({acc}, {x});", "tkx_warp_max",
                  "tkx_block_max", "amax", lambda t, d: t.amax(dim=d), float("-inf"))
_AMIN = Reduction({"float": "TKX_INF", "int": "TKX_INT64_MAX"}, "{acc} = tkx_min({acc}, {x});", "tkx_warp_min",
                  "tkx_block_min", "amin", lambda t, d: t.amin(dim=d), float("inf"))

_F = "transcendental"

ROWS: tuple[OpDef, ...] = (
    # unary pointwise
    OpDef(Kind.NEG, "pointwise", 1, "-x", ("neg.default",), torch.neg, lambda a, e: f"-{paren(a)}", int_exact=True),
    OpDef(Kind.EXP, "pointwise", 1, "e**x", ("exp.default",), torch.exp, lambda a, e: f"expf({a})", cost=_F),
    OpDef(Kind.EXP2, "pointwise", 1, "2**x", ("exp2.default",), torch.exp2, lambda a, e: f"exp2f({a})", cost=_F),
    OpDef(Kind.EXPM1, "pointwise", 1, "e**x - 1 (accurate near 0)", ("expm1.default",), torch.expm1,
          lambda a, e: f"expm1f({a})", cost=_F),
    OpDef(Kind.LOG, "pointwise", 1, "natural logarithm", ("log.default",), torch.log, lambda a, e: f"logf({a})",
          cost=_F),
    OpDef(Kind.LOG2, "pointwise", 1, "base-2 logarithm", ("log2.default",), torch.log2, lambda a, e: f"log2f({a})",
          cost=_F),
    OpDef(Kind.LOG1P, "pointwise", 1, "log(1 + x) (accurate near 0)", ("log1p.default",), torch.log1p,
          lambda a, e: f"log1pf({a})", cost=_F),
    OpDef(Kind.SIN, "pointwise", 1, "sine", ("sin.default",), torch.sin, lambda a, e: f"sinf({a})", cost=_F),
    OpDef(Kind.COS, "pointwise", 1, "cosine", ("cos.default",), torch.cos, lambda a, e: f"cosf({a})", cost=_F),
    OpDef(Kind.ATAN, "pointwise", 1, "arctangent", ("atan.default",), torch.atan, lambda a, e: f"atanf({a})", cost=_F),
    OpDef(Kind.TANH, "pointwise", 1, "hyperbolic tangent", ("tanh.default",), torch.tanh,
          lambda a, e: f"tanhf({a})", cost=_F),
    OpDef(Kind.SIGMOID, "pointwise", 1, "1 / (1 + exp(-x))", ("sigmoid.default",), torch.sigmoid,
          lambda a, e: f"1.0f / (1.0f + expf(-{paren(a)}))", cost=_F),
    OpDef(Kind.SQRT, "pointwise", 1, "square root", ("sqrt.default",), torch.sqrt, lambda a, e: f"sqrtf({a})",
          cost=_F),
    OpDef(Kind.RSQRT, "pointwise", 1, "1 / sqrt(x)", ("rsqrt.default",), torch.rsqrt,
          lambda a, e: f"1.0f / sqrtf({a})", cost=_F),
    OpDef(Kind.ABS, "pointwise", 1, "|x|", ("abs.default",), torch.abs,
          _int_or_float("tkx_iabs({0})", "fabsf({0})"), int_exact=True),
    OpDef(Kind.SIGN, "pointwise", 1, "-1, 0 or 1 (sign(NaN) = 0, as torch)", ("sign.default", "sgn.default"),
          torch.sign, _int_or_float("(long long)((0LL < {1}) - ({1} < 0LL))", "(float)((0.0f < {1}) - ({1} < 0.0f))"),
          int_exact=True),
    OpDef(Kind.ERF, "pointwise", 1, "Gauss error function", ("erf.default",), torch.erf, lambda a, e: f"erff({a})",
          cost=_F),
    OpDef(Kind.RECIPROCAL, "pointwise", 1, "1 / x", ("reciprocal.default",), torch.reciprocal,
          lambda a, e: f"1.0f / {paren(a)}"),
    OpDef(Kind.FLOOR, "pointwise", 1, "round down", ("floor.default",), torch.floor,
          _int_or_float("{0}", "floorf({0})"), int_exact=True),
    OpDef(Kind.CEIL, "pointwise", 1, "round up", ("ceil.default",), torch.ceil, _int_or_float("{0}", "ceilf({0})"),
          int_exact=True),
    OpDef(Kind.TRUNC, "pointwise", 1, "round toward zero", ("trunc.default",), torch.trunc,
          _int_or_float("{0}", "truncf({0})"), int_exact=True),
    OpDef(Kind.ROUND, "pointwise", 1, "round to the nearest integer, halves to even (as torch.round)",
          ("round.default",), torch.round, _int_or_float("{0}", "rintf({0})"), int_exact=True),
    OpDef(Kind.ISNAN, "pointwise", 1, "x is NaN", ("isnan.default",), torch.isnan,
          _int_or_float("0.0f", "({1} != {1} ? 1.0f : 0.0f)"), boolean=True, int_exact=True, dtype="bool"),
    OpDef(Kind.ISINF, "pointwise", 1, "x is +-infinity", ("isinf.default",), torch.isinf,
          _int_or_float("0.0f", "(fabsf({0}) == TKX_INF ? 1.0f : 0.0f)"), boolean=True, int_exact=True, dtype="bool"),
    OpDef(Kind.LOGICAL_NOT, "pointwise", 1, "x == 0", ("logical_not.default",),
          torch.logical_not, lambda a, e: f"({paren(a)} == {e.lit(0)} ? 1.0f : 0.0f)", boolean=True, int_exact=True,
          dtype="bool"),
    OpDef(Kind.CAST, "pointwise", 1, "convert to the output dtype (a plain copy when dtypes agree)", (),
          _cast_ref, lambda a, e: a, int_exact=True, ref_takes_op=True),
    OpDef(Kind.CLAMP, "pointwise", 1, "clamp(x, attrs['min'], attrs['max']); either bound may be None", (),
          _clamp_ref, _clamp, int_exact=True, ref_takes_op=True),
    OpDef(Kind.INDEX_CHECK, "pointwise", 1,
          "x, after checking attrs['lo'] <= x < attrs['hi'] (or x == attrs['ignore']); an index out of range sets "
          "the kernel's error word and the interpreters raise KernelError", (),
          indexing.index_check, None, int_exact=True, ref_takes_op=True, statements=True),
    OpDef(Kind.ORDER_KEY, "pointwise", 1,
          "int64 key ordering float x as torch.max compares it (-0.0 == +0.0, NaN above +inf): the exact "
          "single-pass argmax of max.dim, argmax/argmin and max_pool2d", (), order_key,
          lambda a, e: f"tkx_order_key({a})", int_exact=True, dtype="int64"),
    # binary pointwise
    OpDef(Kind.ADD, "pointwise", 2, "x + y", (), torch.add, _binary("+", "__fadd_rn"), commutative=True,
          int_exact=True),
    OpDef(Kind.SUB, "pointwise", 2, "x - y", (), torch.sub, _binary("-", "__fsub_rn"), int_exact=True),
    OpDef(Kind.MUL, "pointwise", 2, "x * y", ("mul",), torch.mul, _binary("*", "__fmul_rn"),
          commutative=True, int_exact=True),
    OpDef(Kind.DIV, "pointwise", 2, "x / y (true division)", (), torch.div, _binary("/", "__fdiv_rn"),
          dtype="float"),
    OpDef(Kind.FLOOR_DIVIDE, "pointwise", 2, "floor(x / y) (Python's //)", ("floor_divide.default",),
          torch.floor_divide, _int_or_float("tkx_ifloordiv({0}, {1})", "tkx_floordivf({2}, {3})"), int_exact=True),
    OpDef(Kind.REMAINDER, "pointwise", 2, "x - floor(x / y) * y (Python's %, the sign of y)",
          ("remainder",), torch.remainder,
          _int_or_float("tkx_iremainder({0}, {1})", "tkx_remainder({0}, {1})"), int_exact=True),
    OpDef(Kind.FMOD, "pointwise", 2, "C's fmod: the sign of x", ("fmod",), torch.fmod,
          _int_or_float("{2} % {3}", "fmodf({0}, {1})"), int_exact=True),
    OpDef(Kind.POW, "pointwise", 2, "x ** y (either may be a tensor)", (), torch.pow, _pow, cost=_F),
    OpDef(Kind.XLOGY, "pointwise", 2, "x * log(y), 0 where x == 0 (NaN where y is NaN)",
          ("xlogy",), _binary_ref(_xlogy), lambda a, b, e: f"tkx_xlogy({a}, {b})", cost=_F,
          ref_takes_op=True),
    OpDef(Kind.MAXIMUM, "pointwise", 2, "elementwise max (NaN-propagating)", ("maximum.default",),
          _binary_ref(torch.maximum, tensors=True), _int_or_float("tkx_imax({0}, {1})", "tkx_max({0}, {1})"),
          commutative=True, int_exact=True, ref_takes_op=True),
    OpDef(Kind.MINIMUM, "pointwise", 2, "elementwise min (NaN-propagating)", ("minimum.default",),
          _binary_ref(torch.minimum, tensors=True), _int_or_float("tkx_imin({0}, {1})", "tkx_min({0}, {1})"),
          commutative=True, int_exact=True, ref_takes_op=True),
    OpDef(Kind.FMAX, "pointwise", 2, "elementwise max ignoring NaN (NaN only where both are NaN)", ("fmax.default",),
          _binary_ref(torch.fmax, tensors=True), _int_or_float("tkx_imax({0}, {1})", "fmaxf({0}, {1})"),
          commutative=True, int_exact=True, ref_takes_op=True),
    OpDef(Kind.FMIN, "pointwise", 2, "elementwise min ignoring NaN (NaN only where both are NaN)", ("fmin.default",),
          _binary_ref(torch.fmin, tensors=True), _int_or_float("tkx_imin({0}, {1})", "fminf({0}, {1})"),
          commutative=True, int_exact=True, ref_takes_op=True),
    OpDef(Kind.EQ, "pointwise", 2, "x == y", ("eq",), torch.eq, _compare("=="),
          commutative=True, boolean=True, int_exact=True, dtype="bool"),
    OpDef(Kind.NE, "pointwise", 2, "x != y", ("ne",), torch.ne, _compare("!="),
          commutative=True, boolean=True, int_exact=True, dtype="bool"),
    OpDef(Kind.LT, "pointwise", 2, "x < y", ("lt",), torch.lt, _compare("<"), boolean=True,
          int_exact=True, dtype="bool"),
    OpDef(Kind.LE, "pointwise", 2, "x <= y", ("le",), torch.le, _compare("<="), boolean=True,
          int_exact=True, dtype="bool"),
    OpDef(Kind.GT, "pointwise", 2, "x > y", ("gt",), torch.gt, _compare(">"), boolean=True,
          int_exact=True, dtype="bool"),
    OpDef(Kind.GE, "pointwise", 2, "x >= y", ("ge",), torch.ge, _compare(">="), boolean=True,
          int_exact=True, dtype="bool"),
    OpDef(Kind.LOGICAL_AND, "pointwise", 2, "x and y", ("logical_and.default",),
          _binary_ref(torch.logical_and, tensors=True), _logical("&&"), commutative=True, boolean=True,
          int_exact=True, dtype="bool", ref_takes_op=True),
    OpDef(Kind.LOGICAL_OR, "pointwise", 2, "x or y", ("logical_or.default",),
          _binary_ref(torch.logical_or, tensors=True), _logical("||"), commutative=True, boolean=True,
          int_exact=True, dtype="bool", ref_takes_op=True),
    OpDef(Kind.LOGICAL_XOR, "pointwise", 2, "x xor y", ("logical_xor.default",),
          _binary_ref(torch.logical_xor, tensors=True), _logical("!="), commutative=True, boolean=True,
          int_exact=True, dtype="bool", ref_takes_op=True),
    # ternary
    OpDef(Kind.WHERE, "pointwise", 3, "cond ? x : y", (), _where_ref,
          lambda c, a, b, e: f"({paren(c)} != {'0' if e.integer else '0.0f'} ? {a} : {b})", int_exact=True,
          ref_takes_op=True),
    # reductions
    OpDef(Kind.SUM, "reduction", 1, "sum over attrs['dims'] (keepdim in attrs['keepdim'])", (),
          _reduce_ref(torch.sum), reduction=_SUM, int_exact=True, ref_takes_op=True),
    OpDef(Kind.MEAN, "reduction", 1, "mean over attrs['dims']", (), _reduce_ref(torch.mean), reduction=_MEAN,
          ref_takes_op=True),
    OpDef(Kind.AMAX, "reduction", 1, "max over attrs['dims'] (NaN-propagating)", (), _reduce_ref(torch.amax),
          reduction=_AMAX, int_exact=True, ref_takes_op=True),
    OpDef(Kind.AMIN, "reduction", 1, "min over attrs['dims'] (NaN-propagating)", (), _reduce_ref(torch.amin),
          reduction=_AMIN, int_exact=True, ref_takes_op=True),
    # matmul
    OpDef(Kind.MM, "matmul", 2, "[M,K] @ [K,N] -> [M,N]", ("mm.default",), _matmul_ref(torch.mm)),
    OpDef(Kind.BMM, "matmul", 2, "[B,M,K] @ [B,K,N] -> [B,M,N]", ("bmm.default",), _matmul_ref(torch.bmm)),
    OpDef(Kind.ADDMM, "matmul", 3, "beta*bias + alpha*([M,K] @ [K,N]), bias broadcast to [M,N]", (),
          lambda op, args, device: _matmul_ref(torch.addmm)(args[0], args[1], args[2], beta=op.attr("beta", 1),
                                                            alpha=op.attr("alpha", 1)), ref_takes_op=True),
    # generators
    OpDef(Kind.FILL, "generator", 0, "every element equals attrs['value']", (), _fill_ref, int_exact=True,
          ref_takes_op=True),
    OpDef(Kind.IOTA, "generator", 0, "attrs['start'] + attrs['step'] * index along attrs['dim']", (), _iota_ref,
          int_exact=True, ref_takes_op=True),
    # index
    OpDef(Kind.GATHER, "index", 2,
          "out[c] = src[c with c[dim] = index[c]] (torch.gather on broadcast views; attrs 'dim', 'wrap' for "
          "negative indices counted from the end); an index out of range raises KernelError",
          (), indexing.gather, int_exact=True, ref_takes_op=True, statements=True),
    OpDef(Kind.CAT, "index", None, "the operands concatenated along attrs['dim']", (), indexing.cat, int_exact=True,
          ref_takes_op=True, statements=True),
    OpDef(Kind.SLICE_SCATTER, "index", 2,
          "base with src written into base[..., start:end:step, ...] along attrs['dim'] (the backward of slicing "
          "and selecting)", (), indexing.slice_scatter, int_exact=True, ref_takes_op=True, statements=True),
    OpDef(Kind.SCATTER, "index", 3,
          "base with out[e with e[dim] = index[e]] = values[e] for every element e of values (index a view of the "
          "same shape, attrs 'dim'); where several e name one position the last along dim wins (deterministic); an "
          "index out of range raises KernelError. Written in place into base's tensor, only the indexed slice "
          "(a KV-cache append), when base is an input the step updates", (), indexing.scatter, int_exact=True,
          ref_takes_op=True, statements=True),
    # random numbers
    OpDef(Kind.PHILOX, "pointwise", 3,
          "uniform float32 in [0, 1) from word attrs['word'] of Philox-4x32-10: key = seed (int64), counter = "
          "(counter, offset) (int64); the same bits in both interpreters and the kernel (tkx.random)", (),
          philox.reference, lambda s, o, c, e: f"tkx_philox_uniform({s}, {o}, {c}, {int(e.op.attr('word', 0))})",
          cost=_F, dtype="float", ref_takes_op=True),
    # attention composites
    OpDef(Kind.ATTENTION, "attention", None,
          "softmax(q @ k^T * attrs['scale'] + mask) @ v over operands (q [*B,L,E], k [*B,S,E], v [*B,S,Ev], mask "
          "[*B,L,S] when attrs['mask'] is 'bool' or 'additive'), attrs['causal']; a row that sees no key is 0 "
          "(NaN with attrs['empty_rows'] == 'nan'); float32 root [out | lse] (tkx.attention_ref)", (),
          _attention_ref, cost=_F, dtype="float", ref_takes_op=True),
    OpDef(Kind.ATTENTION_BACKWARD, "attention", None,
          "gradients of attention from operands (q, k, v, out, lse, dout[, mask]); the probabilities recomputed "
          "from q, k and lse; float32 root [dq | dk | dv] (tkx.attention_ref)", (), _attention_backward_ref,
          cost=_F, dtype="float", ref_takes_op=True),
)

#: kind -> row.
OPS: dict[str, OpDef] = {r.kind.value: r for r in ROWS}

POINTWISE = frozenset(k for k, r in OPS.items() if r.family == "pointwise")
REDUCTIONS = frozenset(k for k, r in OPS.items() if r.family == "reduction")
INDEX_OPS = frozenset(k for k, r in OPS.items() if r.family == "index")
ATTENTION_OPS = frozenset(k for k, r in OPS.items() if r.family == "attention")
COMMUTATIVE = frozenset(k for k, r in OPS.items() if r.commutative)
TRANSCENDENTAL = frozenset(k for k, r in OPS.items() if r.transcendental)


def row(kind: str) -> OpDef:
    """The table row of ``kind``; raises :class:`UnknownKindError` naming the known kinds."""
    r = OPS.get(str(kind))
    if r is None:
        raise UnknownKindError(f"the op table has no row for kind {str(kind)!r}; known kinds: "
                               f"{', '.join(sorted(OPS))}")
    return r


def compute_type(op: Any) -> str:
    """``"int"`` when ``op`` computes in ``long long`` registers, else ``"float"``.

    Integer results are computed in integers (rows with ``int_exact``); a boolean result is
    computed in integers when every tensor operand is an integer; everything else in fp32.
    """
    r = row(op.kind)
    if op.out.dtype in INT_DTYPES:
        return "int"
    if r.boolean and r.int_exact:
        tensors = [x for x in op.inputs if hasattr(x, "dtype")]
        if tensors and all(x.dtype in INT_DTYPES for x in tensors):
            return "int"
    return "float"


def evaluate(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    """Compute ``op`` with torch from ``args`` (tensors or Python scalars), by its row's ``ref``.

    The reference interpreter and the schedule interpreter both call this. Raises
    :class:`UnknownKindError` for a kind without a row, :class:`KernelError` for an index out
    of range.
    """
    r = row(op.kind)
    if r.ref is None:
        raise UnknownKindError(f"op {op.id}: the row of {op.kind!r} has no torch reference")
    if r.ref_takes_op:
        return r.ref(op, args, device)
    if r.arity == 2:
        return _binary_ref(r.ref)(op, args, device)
    return r.ref(*args)


def lowerings() -> dict[str, str]:
    """aten overload name (``"exp.default"``) -> kind, for every pointwise 1:1 lowering in the table
    (matmul rows name their overloads for the docs; lowering handles their operands itself)."""
    out: dict[str, str] = {}
    for r in ROWS:
        if r.family != "pointwise":
            continue
        for name in r.aten:
            out[name] = r.kind.value
    return out


def table_rows() -> list[dict[str, Any]]:
    """The table as plain records (for notebook 02 and the docs): kind, family, arity, flags."""
    out = []
    for r in ROWS:
        flags = [f for f, on in (("commutative", r.commutative), ("transcendental", r.transcendental),
                                 ("boolean", r.boolean), ("int-exact", r.int_exact)) if on]
        out.append({"kind": r.name, "family": r.family, "arity": "n" if r.arity is None else r.arity,
                    "aten": ", ".join(r.aten), "flags": " ".join(flags), "doc": r.doc})
    return out


__all__ = ["Kind", "OpDef", "Reduction", "Emit", "ROWS", "OPS", "row", "compute_type", "evaluate", "lowerings",
           "table_rows", "UnknownKindError", "POINTWISE", "REDUCTIONS", "INDEX_OPS", "COMMUTATIVE",
           "TRANSCENDENTAL", "INT_DTYPES", "FLOAT_DTYPES", "paren"]
