"""Random small IR programs for property tests (a hypothesis strategy).

Programs mix pointwise ops with broadcasting, reductions, GEMMs through transposed views,
several outputs, views of values as outputs, and in-place updates of inputs, over a few
small shapes, so that scheduling, arena reuse and in-place commits are all exercised.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tkx import ops
from tkx.ir import InputSpec, Op, OutputSpec, Program, StateUpdate, TensorSpec, validate

M, K, N = 4, 6, 5
SHAPES = [(M, K), (K, N), (M, N), (N,), (M,)]
#: Ops that need a restricted domain (positive operands, nonzero divisors) or attributes: left out of
#: random programs, which feed any float to any op.
_DOMAIN = {"log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "cast", "clamp", "index_check", "div", "pow",
           "floor_divide", "remainder", "fmod", "xlogy", "exp2", "expm1"}
#: Drawn from the op table: float-valued pointwise rows with a C expression.
UNARY = sorted(k for k, r in ops.OPS.items() if r.family == "pointwise" and r.arity == 1 and r.c is not None
               and not r.boolean and k not in _DOMAIN)
BINARY = sorted(k for k, r in ops.OPS.items() if r.family == "pointwise" and r.arity == 2 and r.c is not None
                and not r.boolean and k not in _DOMAIN)


def _bcast(x: TensorSpec, shape: tuple[int, ...]) -> TensorSpec:
    pad = len(shape) - len(x.shape)
    strides = [0] * pad + [0 if d == 1 and n != 1 else s for d, n, s in zip(x.shape, shape[pad:], x.strides)]
    return TensorSpec(shape, x.dtype, tuple(strides), x.buffer, x.offset)


def _transpose(x: TensorSpec) -> TensorSpec:
    return TensorSpec(x.shape[::-1], x.dtype, x.strides[::-1], x.buffer, x.offset)


@st.composite
def programs(draw, max_ops: int = 12) -> Program:
    inputs = [InputSpec(f"x{i}", TensorSpec.dense(f"in{i}", s, "float32")) for i, s in enumerate(SHAPES)]
    values: list[TensorSpec] = [i.value for i in inputs]
    ops: list[Op] = []

    def pick(shape: tuple[int, ...] | None = None) -> TensorSpec | None:
        cands = [v for v in values if shape is None or v.shape == shape]
        return draw(st.sampled_from(cands)) if cands else None

    n_ops = draw(st.integers(2, max_ops))
    for k in range(n_ops):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "mm", "where"]))
        oid = f"v{k}"
        if kind == "unary":
            x = pick()
            op = Op(oid, draw(st.sampled_from(UNARY)), (x,), TensorSpec.dense(oid, x.shape, "float32"))
        elif kind in ("binary", "where"):
            x = pick()
            if x.ndim == 2 and draw(st.booleans()):
                row = [v for v in values if v.shape == (x.shape[1],)]
                y = _bcast(draw(st.sampled_from(row)), x.shape) if row else pick(x.shape)
            else:
                y = pick(x.shape)
            if draw(st.booleans()) and kind == "binary":
                y = draw(st.sampled_from([0.5, 2.0, -1.0]))
            if kind == "where":
                cond_id = f"v{k}c"
                cond = Op(cond_id, "gt", (x, 0.0), TensorSpec.dense(cond_id, x.shape, "bool"))
                ops.append(cond)
                op = Op(oid, "where", (cond.out, x, y if isinstance(y, TensorSpec) else 1.0),
                        TensorSpec.dense(oid, x.shape, "float32"))
            else:
                op = Op(oid, draw(st.sampled_from(BINARY)), (x, y), TensorSpec.dense(oid, x.shape, "float32"))
        elif kind == "reduce":
            x = pick()
            if x.ndim == 2:
                dim = draw(st.sampled_from([0, 1]))
                keep = draw(st.booleans())
                shape = tuple(1 if i == dim else d for i, d in enumerate(x.shape)) if keep else \
                    tuple(d for i, d in enumerate(x.shape) if i != dim)
                dims = (dim,)
            else:
                keep, shape, dims = False, (), tuple(range(x.ndim))
            op = Op(oid, draw(st.sampled_from(["sum", "amax", "mean"])), (x,),
                    TensorSpec.dense(oid, shape, "float32"), {"dims": dims, "keepdim": keep})
        else:
            a = pick((M, K)) or inputs[0].value
            b = pick((K, N))
            if b is None or draw(st.booleans()):
                cands = [v for v in values if v.shape == (N, K)] or [_transpose(inputs[1].value)]
                b = draw(st.sampled_from(cands))
                b = _transpose(b) if b.shape == (N, K) else b
            op = Op(oid, "mm", (a, b), TensorSpec.dense(oid, (M, N), "float32"))
        ops.append(op)
        values.append(op.out)
    made = [o for o in ops if o.out.dtype == "float32"]
    outs = draw(st.lists(st.sampled_from(made), min_size=1, max_size=3, unique_by=lambda o: o.id))
    outputs = [OutputSpec(f"out{i}", o.out) for i, o in enumerate(outs)]
    if draw(st.booleans()):
        src = outs[0].out
        if src.ndim == 2:
            outputs.append(OutputSpec("out_t", _transpose(src)))
    updates = []
    for i, inp in enumerate(inputs):
        same = [o for o in made if o.out.shape == inp.value.shape]
        if same and draw(st.booleans()):
            updates.append(StateUpdate(i, draw(st.sampled_from(same)).out))
            inputs[i] = InputSpec(inp.name, inp.value, mutated=True)
    program = Program(tuple(inputs), tuple(ops), tuple(outputs), tuple(updates), name="random")
    return validate(program)
