"""The built-in passes: dce, cse, canonicalize_views, simplify, transpose_gemm.

Every pass is pure (returns a new :class:`~tkx.ir.Program`, or the same object when it
changes nothing), keeps op ids stable, and carries ``source``/``fx_node``/``region`` over
to the ops it rewrites. Each is checked against the reference interpreter on the whole
example zoo in ``tests/test_passes.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import ops
from ..ir import POINTWISE, Op, Operand, Program, TensorSpec
from ..reference import TORCH, evaluate
from .registry import register_pass
from .sweep import Sweep
from .views import canonical_view, compose, normalize_unit_strides, transposed

# -- dce ---------------------------------------------------------------------------------------


@register_pass("dce", _builtin=True)
def dce(program: Program) -> Program:
    """Dead-code elimination: drop ops whose result no output or state update needs.

    Every IR op is pure, so an op is live exactly when an output, a state-update value
    or a live op reads its buffer. Other passes leave such ops behind on purpose (they
    forward values instead of deleting their producers); this pass sweeps them up.
    """
    live = {s.buffer for s in program.sinks()}
    kept = []
    for op in reversed(program.ops):
        if op.id in live:
            kept.append(op)
            live.update(x.buffer for x in op.tensor_inputs)
    if len(kept) == len(program.ops):
        return program
    return program.replace(ops=tuple(reversed(kept)))


# -- cse ---------------------------------------------------------------------------------------

#: Ops whose two operands may be swapped without changing a single bit of the result
#: (IEEE addition and multiplication are commutative; comparisons with eq/ne are symmetric).
#: Only applied when both operands are tensors of one dtype, so promotion is not involved.
COMMUTATIVE = ops.COMMUTATIVE  # the op table's commutative flag


def freeze(v: Any) -> Any:
    """A hashable key for an attribute or scalar that tells ``1``, ``1.0``, ``True`` and
    ``0.0``/``-0.0`` apart (they compare equal in Python but are different operands)."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v)
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, (tuple, list)):
        return ("t", tuple(freeze(x) for x in v))
    if isinstance(v, Mapping):
        return ("d", tuple(sorted((str(k), freeze(x)) for k, x in v.items())))
    if isinstance(v, TensorSpec):
        return ("v", v)
    return ("o", type(v).__name__, repr(v))


@register_pass("cse", _builtin=True)
def cse(program: Program) -> Program:
    """Common-subexpression elimination: compute each distinct value once.

    Two ops are the same computation when they have the same kind, the same operands
    (tensor operands compared as canonical views, so the same elements in the same order;
    scalars compared with their type), the same attrs and the same output shape and dtype.
    Every op of the IR is deterministic, including the generators ``fill``/``iota``, so all
    of them qualify. Later duplicates are forwarded to the first occurrence, which keeps its
    id; reads of a duplicate become reads of the first. Lowering re-emits the same masks and
    constants in the forward and the backward pass (cross-entropy's ``ne``/``iota``, the
    ``sub`` of the MSE gradient), which is what this removes.
    """
    table: dict[Any, str] = {}

    def key_of(sweep: Sweep, op: Op) -> Any:
        ins: list[Any] = []
        for x in op.inputs:
            if isinstance(x, TensorSpec):
                ins.append(("v", canonical_view(x, sweep.roots.get(x.buffer))))
            else:
                ins.append(freeze(x))
        if (op.kind in COMMUTATIVE and len(op.inputs) == 2
                and all(isinstance(x, TensorSpec) for x in op.inputs)
                and op.inputs[0].dtype == op.inputs[1].dtype):
            ins.sort(key=lambda k: (k[1].buffer, k[1].shape, k[1].strides, k[1].offset))
        return (op.kind, tuple(ins), freeze(dict(op.attrs)), op.out.shape, op.out.dtype)

    def visit(sweep: Sweep, op: Op) -> Op | TensorSpec:
        key = key_of(sweep, op)
        first = table.get(key)
        if first is None:
            table[key] = op.id
            return op
        return TensorSpec.dense(first, op.out.shape, op.out.dtype)

    return Sweep(program).run(visit)


# -- canonicalize_views ------------------------------------------------------------------------


def _full_dense(sweep: Sweep, x: TensorSpec) -> bool:
    root = sweep.roots.get(x.buffer)
    return x.is_dense and root is not None and x.numel == root.numel


@register_pass("canonicalize_views", _builtin=True)
def canonicalize_views(program: Program) -> Program:
    """Give every view one spelling, and drop casts that copy a value to itself.

    * A view that addresses its whole root in order is replaced by the root value itself.
    * Otherwise, every size-1 dimension gets the contiguous stride of the view's own shape
      (its stride is never multiplied by a non-zero index, so any value is correct; this
      rule makes a contiguous view equal to ``TensorSpec.dense`` of its shape, and the
      printer then shows it as ``reshape(...)``). Equal views are thus ``==``, which CSE
      relies on.
    * A ``cast`` whose operand already has the output dtype and is a dense view of all of
      its root (a plain copy, e.g. from ``clone()`` or ``contiguous()``) is forwarded:
      readers read the root directly. An output or state update keeps the copy when the
      root is an input updated in place (it would see the new value) and a state update
      keeps it unless the forwarded value is dense.
    """

    def canon(sweep: Sweep, x: Operand) -> Operand:
        return canonical_view(x, sweep.roots.get(x.buffer)) if isinstance(x, TensorSpec) else x

    def visit(sweep: Sweep, op: Op) -> Op | TensorSpec:
        ins = tuple(canon(sweep, x) for x in op.inputs)
        if any(a != b for a, b in zip(ins, op.inputs)):
            op = op.replace(inputs=ins)
        if op.kind == "cast":
            x = op.inputs[0]
            if isinstance(x, TensorSpec) and x.dtype == op.out.dtype and _full_dense(sweep, x):
                return x
        return op

    sweep = Sweep(program)
    return sweep.run(visit, sink_hook=lambda s: canonical_view(s, sweep.roots.get(s.buffer)))


# -- simplify ----------------------------------------------------------------------------------

#: dtype -> dtypes it converts to without changing any value (a lossless cast).
LOSSLESS = {
    "bool": frozenset({"bool", "int32", "int64", "float16", "bfloat16", "float32"}),
    "int32": frozenset({"int32", "int64"}),
    "int8": frozenset({"int8", "int32", "int64", "float16", "bfloat16", "float32"}),
    "uint8": frozenset({"uint8", "int32", "int64", "float16", "bfloat16", "float32"}),
    "int64": frozenset({"int64"}),
    "float16": frozenset({"float16", "float32"}),
    "bfloat16": frozenset({"bfloat16", "float32"}),
    "float32": frozenset({"float32"}),
}


def fill_value(op: Op) -> Any:
    """The value every element of a ``fill`` op holds, rounded to its dtype (as torch stores it)."""
    return torch.tensor(op.attr("value"), dtype=TORCH[op.out.dtype]).item()


def fold_constant(sweep: Sweep, op: Op) -> Any:
    """The value of pointwise ``op`` when all its tensor operands are fills, else ``None``.

    Computed by the reference interpreter's own ``evaluate`` on 0-d tensors of the operand
    dtypes (0-d against 0-d promotes like the broadcast views would), then rounded to the
    output dtype, so the folded constant is the value the reference would compute.
    """
    args: list[Any] = []
    for x in op.inputs:
        if isinstance(x, TensorSpec):
            p = sweep.producer(x)
            if p is None or p.kind != "fill":
                return None
            args.append(torch.tensor(p.attr("value"), dtype=TORCH[p.out.dtype]))
        else:
            args.append(x)
    try:
        with torch.no_grad():
            r = evaluate(op, args, torch.device("cpu"))
            return r.to(TORCH[op.out.dtype]).reshape(()).item()
    except Exception:  # an op torch rejects on these operands: leave it for the runtime
        return None


def const_of(sweep: Sweep, x: Operand) -> Any:
    """The constant ``x`` holds everywhere (a Python number, or a fill read through any view)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return x
    p = sweep.producer(x)
    if p is not None and p.kind == "fill":
        return fill_value(p)
    return None


def _identity(sweep: Sweep, op: Op) -> TensorSpec | None:
    """``x*1, 1*x, x+0, 0+x, x-0, x/1 -> x`` when ``x`` already has the result's dtype and shape."""
    if op.kind not in ("mul", "add", "sub", "div"):
        return None
    a, b = op.inputs
    neutral = 1 if op.kind in ("mul", "div") else 0
    candidates = [(a, b)]
    if op.kind in ("mul", "add"):
        candidates.append((b, a))
    for x, c in candidates:
        if (isinstance(x, TensorSpec) and x.dtype == op.out.dtype and x.shape == op.out.shape
                and const_of(sweep, c) == neutral):
            return x
    return None


@register_pass("simplify", _builtin=True)
def simplify(program: Program) -> Program:
    """Algebraic simplification with exact semantics (the reference result must not move).

    * Fill folding: a pointwise op whose tensor operands are all ``fill`` values (read
      through any view, e.g. broadcasts) becomes a ``fill`` of the constant, computed with
      torch on 0-d tensors of the operand dtypes and rounded to the output dtype (so
      ``cast(fill bf16 1) -> fill f32 1.0``). Chains fold in one sweep.
    * Neutral elements: ``x*1, 1*x, x+0, 0+x, x-0, x/1 -> x`` (the constant may be a Python
      number or a fill), only when ``x`` already has the output dtype and shape, so no cast
      or broadcast is lost. Note ``-0.0 + 0`` is ``+0.0`` while ``x`` is ``-0.0``: the sign
      of a zero is the only thing ``x+0 -> x`` can change.
    * ``neg(neg(x)) -> x``.
    * ``cast(cast(x))`` becomes one cast when the first cast is lossless (the intermediate
      dtype holds every value of the source, e.g. ``bf16 -> f32 -> f16`` is
      ``bf16 -> f16``); ``f32 -> bf16 -> f32`` keeps its rounding. When the single cast
      would be to the source dtype of a dense value, the value itself is used.
    * Not done: ``x*0 -> 0`` (``nan*0`` and ``inf*0`` are NaN, and ``-1*0`` is ``-0.0``).

    Replaced ops are dropped when nothing reads them; their own producers may become dead,
    which ``dce`` removes.
    """

    def visit(sweep: Sweep, op: Op) -> Op | TensorSpec:
        if op.kind not in POINTWISE:
            return op
        value = fold_constant(sweep, op)
        if value is not None:
            return op.replace(kind="fill", inputs=(), attrs={"value": value})
        x = _identity(sweep, op)
        if x is not None:
            return x
        if op.kind in ("neg", "cast") and isinstance(op.inputs[0], TensorSpec):
            inner = sweep.producer(op.inputs[0])
            if inner is None or inner.kind != op.kind or not isinstance(inner.inputs[0], TensorSpec):
                return op
            y = compose(op.inputs[0], inner.inputs[0])
            if y is None:
                return op
            if op.kind == "neg":
                return y if y.dtype == op.out.dtype else op
            src, mid = y.dtype, inner.out.dtype
            if mid not in LOSSLESS[src]:  # the first cast rounds: keep both
                return op
            if src == op.out.dtype and _full_dense(sweep, y):
                return y
            return op.replace(inputs=(y,))
        return op

    return Sweep(program).run(visit)


# -- transpose_gemm ----------------------------------------------------------------------------

GEMMS = ("mm", "addmm")


def _fresh_id(base: str, taken: set[str]) -> str:
    name, k = f"{base}_t", 2
    while name in taken:
        name, k = f"{base}_t{k}", k + 1
    taken.add(name)
    return name


@register_pass("transpose_gemm", _builtin=True)
def transpose_gemm(program: Program) -> Program:
    """Compute ``C = A @ B`` as ``C.T = B.T @ A.T`` when every reader wants ``C.T``.

    When every read of an ``mm``/``addmm`` result ``C`` (shape ``(M,N)``, ``M,N > 1``) by
    ops, outputs and state updates is the transposed view ``C.T``, the GEMM is rewritten
    to produce ``C.T`` densely (operands become ``B.T``, ``A.T``, and ``bias.T`` for
    addmm; both are just views) under a new id ``<id>_t``, and each reader reads the
    dense result. Backward graphs produce such GEMMs (a gradient consumed only
    transposed); the rewrite saves the strided reads of ``C``. The sums are the same
    products in the same K order, only stored transposed.

    GEMMs are visited last to first on the current program, so a chain resolves without
    flip-flopping: rewriting a consumer transposes its operand views, after which the
    producer is rewritten only if all its readers then want the transpose.
    """
    ops = list(program.ops)
    outputs = list(program.outputs)
    updates = list(program.updates)
    taken = {i.value.buffer for i in program.inputs} | {op.id for op in ops}
    changed = False
    for idx in range(len(ops) - 1, -1, -1):
        op = ops[idx]
        if op.kind not in GEMMS or op.out.ndim != 2 or not all(isinstance(x, TensorSpec) for x in op.inputs):
            continue
        m, n = op.out.shape
        if m <= 1 or n <= 1:
            continue
        want = TensorSpec((n, m), op.out.dtype, (1, n), op.id, 0)
        reads = [x for later in ops[idx + 1:] for x in later.tensor_inputs if x.buffer == op.id]
        reads += [s.value for s in (*outputs, *updates) if s.value.buffer == op.id]
        if not reads or any(normalize_unit_strides(x) != want for x in reads):
            continue
        new_id = _fresh_id(op.id, taken)
        result = TensorSpec((m, n), op.out.dtype, (1, m), new_id, 0)

        def fix(x: Any, old: str = op.id, result: TensorSpec = result) -> Any:
            if isinstance(x, TensorSpec) and x.buffer == old:
                c = compose(x, result)
                assert c is not None  # a transposed read of a transposed result is dense
                return c
            return x

        a, b = op.inputs[-2], op.inputs[-1]
        new_inputs = (transposed(b), transposed(a))
        if op.kind == "addmm":
            new_inputs = (transposed(op.inputs[0]), *new_inputs)
        out = TensorSpec.dense(new_id, (n, m), op.out.dtype)
        ops[idx] = op.replace(id=new_id, inputs=new_inputs, out=out)
        for j in range(idx + 1, len(ops)):
            if any(x.buffer == op.id for x in ops[j].tensor_inputs):
                ops[j] = ops[j].replace(inputs=tuple(fix(x) for x in ops[j].inputs))
        outputs = [o.__class__(o.name, fix(o.value)) for o in outputs]
        updates = [u.__class__(u.input_index, fix(u.value)) for u in updates]
        changed = True
    if not changed:
        return program
    return program.replace(ops=tuple(ops), outputs=tuple(outputs), updates=tuple(updates))
