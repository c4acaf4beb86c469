"""The op table (tkx/ops.py) drives every stage: tests parametrised over its rows.

For every row there is a probe: a small step written with plain torch that lowers to that
kind. Each probe goes through lowering (the kind must appear in the program), the reference
interpreter and the schedule interpreter (both against eager), code generation and the NVRTC
compile for sm_80 and sm_90; on a GPU (``-m gpu``) the kernel is verified against eager too.
A new row without a probe fails ``test_every_row_has_a_probe``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pipeline import check_step

import tkx
from tkx import ops
from tkx.codegen import ops as cops

g = torch.Generator().manual_seed(0)


def f(*shape):
    return torch.randn(*shape, generator=g)


def pos(*shape):
    return torch.rand(*shape, generator=g) + 0.1


def ints(hi, *shape, lo=0):
    return torch.randint(lo, hi, shape, generator=g)


def _one(fn):
    return lambda x: fn(x)


#: kind -> (step, inputs). Each step returns tensors computed with the op.
PROBES = {
    "neg": (lambda x: -x, lambda: (f(5, 3),)),
    "exp": (torch.exp, lambda: (f(5, 3),)),
    "exp2": (torch.exp2, lambda: (f(5, 3),)),
    "expm1": (torch.expm1, lambda: (f(5, 3) * 1e-3,)),
    "log": (torch.log, lambda: (pos(5, 3),)),
    "log2": (torch.log2, lambda: (pos(5, 3),)),
    "log1p": (torch.log1p, lambda: (pos(5, 3) * 1e-3,)),
    "sin": (torch.sin, lambda: (f(5, 3) * 3,)),
    "cos": (torch.cos, lambda: (f(5, 3) * 3,)),
    "atan": (torch.atan, lambda: (f(5, 3) * 3,)),
    "tanh": (torch.tanh, lambda: (f(5, 3),)),
    "sigmoid": (torch.sigmoid, lambda: (f(5, 3),)),
    "sqrt": (torch.sqrt, lambda: (pos(5, 3),)),
    "rsqrt": (torch.rsqrt, lambda: (pos(5, 3),)),
    "abs": (lambda x, i: (x.abs(), i.abs()), lambda: (f(5, 3), ints(5, 7, lo=-5))),
    "sign": (lambda x: torch.sign(x), lambda: (torch.tensor([-2.0, 0.0, 3.0, float("nan")]),)),
    "erf": (torch.erf, lambda: (f(5, 3),)),
    "reciprocal": (torch.reciprocal, lambda: (pos(5, 3),)),
    "floor": (torch.floor, lambda: (f(5, 3) * 4,)),
    "ceil": (torch.ceil, lambda: (f(5, 3) * 4,)),
    "trunc": (torch.trunc, lambda: (f(5, 3) * 4,)),
    "round": (lambda x, i: (torch.round(x), torch.round(i)),
              lambda: (torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -3.7]), ints(5, 4, lo=-5))),
    "isnan": (lambda x: torch.isnan(x / x), lambda: (torch.tensor([0.0, 1.0, -2.0]),)),
    "isinf": (lambda x: torch.isinf(1.0 / x), lambda: (torch.tensor([0.0, 1.0, -2.0]),)),
    "logical_not": (lambda x: torch.logical_not(x > 0), lambda: (f(5, 3),)),
    "cast": (lambda x, i: (x.to(torch.bfloat16), i.to(torch.float32), (x * 3).to(torch.int64)),
             lambda: (f(5, 3), ints(100, 4))),
    "clamp": (lambda x: torch.clamp(x, -0.5, 0.5), lambda: (f(5, 3),)),
    "index_check": (lambda y: F.one_hot(y, 4), lambda: (ints(4, 6),)),
    "order_key": (lambda x: (x.argmax(1), x.min(0), x.to(torch.bfloat16).max(1)),
                  lambda: (torch.tensor([[0.0, -0.0, -1.0, 0.0], [2.0, float("nan"), 3.0, float("nan")],
                                         [-float("inf"), -3.5, -3.5, 1e-40], [5.0, float("inf"), 5.0, -2.0]]),)),
    "add": (lambda x, y, i: (x + y, i + 3), lambda: (f(5, 3), f(3), ints(9, 4))),
    "sub": (lambda x, y, i: (x - y, i - 7), lambda: (f(5, 3), f(5, 1), ints(9, 4))),
    "mul": (lambda x, y, i: (x * y, i * i), lambda: (f(5, 3), f(5, 3), ints(9, 4, lo=-9))),
    "div": (lambda x, y, i: (x / y, i / 4), lambda: (f(5, 3), pos(5, 3), ints(9, 4))),
    "floor_divide": (lambda x, i, j: (x // 0.7, i // j), lambda: (f(5, 3), ints(20, 6, lo=-20), ints(5, 6, lo=1))),
    "remainder": (lambda x, i: (x % 0.7, i % 3, torch.remainder(i, -3)), lambda: (f(5, 3), ints(20, 6, lo=-20))),
    "fmod": (lambda x, i: (torch.fmod(x, 0.7), torch.fmod(i, 3)), lambda: (f(5, 3), ints(20, 6, lo=-20))),
    "pow": (lambda x, t: (x ** 3.5, 0.9 ** t, x ** x), lambda: (pos(5, 3), torch.tensor(7.0))),
    "xlogy": (lambda x, y: torch.xlogy(x, y), lambda: (torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0.0, 2.0, 3.0]))),
    "maximum": (lambda x, y: torch.maximum(x, y), lambda: (f(5, 3), f(5, 3))),
    "minimum": (lambda x, y: torch.minimum(x, y), lambda: (f(5, 3), f(5, 3))),
    "fmax": (lambda x, y: torch.fmax(x, y), lambda: (torch.tensor([1.0, float("nan"), float("nan"), -2.0]),
                                                     torch.tensor([float("nan"), 3.0, float("nan"), 0.5]))),
    "fmin": (lambda x, y: torch.fmin(x, y), lambda: (torch.tensor([1.0, float("nan"), float("nan"), -2.0]),
                                                     torch.tensor([float("nan"), 3.0, float("nan"), 0.5]))),
    "eq": (lambda i, j: i == j, lambda: (ints(3, 8), ints(3, 8))),
    "ne": (lambda x, y: x != y, lambda: (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]))),
    "lt": (lambda x, y: x < y, lambda: (f(5, 3), f(5, 3))),
    "le": (lambda i: i <= 4, lambda: (ints(9, 8),)),
    "gt": (lambda x, y: x > y, lambda: (f(5, 3), f(5, 3))),
    "ge": (lambda x: x >= 0.1, lambda: (f(5, 3),)),
    "logical_and": (lambda x, y: (x > 0) & (y > 0), lambda: (f(5, 3), f(5, 3))),
    "logical_or": (lambda x, y: (x > 0) | (y > 0), lambda: (f(5, 3), f(5, 3))),
    "logical_xor": (lambda x, y: (x > 0) ^ (y > 0), lambda: (f(5, 3), f(5, 3))),
    "where": (lambda x, i: (torch.where(x > 0, x, 0.5), torch.where(i > 2, i, -i)), lambda: (f(5, 3), ints(5, 6))),
    "sum": (lambda x, i: (x.sum(1), (i > 1).sum(), i.sum(0)), lambda: (f(5, 3), ints(5, 6, 2))),
    "mean": (lambda x: x.mean(0), lambda: (f(5, 3),)),
    "amax": (lambda x, i: (x.amax(1), i.amax()), lambda: (f(5, 3), ints(50, 7))),
    "amin": (lambda x, i: (x.amin(0), i.argmin()), lambda: (f(5, 3), ints(50, 7))),
    "mm": (lambda a, b: a @ b, lambda: (f(5, 4), f(4, 3))),
    "bmm": (lambda a, b: torch.bmm(a, b), lambda: (f(2, 5, 4), f(2, 4, 3))),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b), lambda: (f(3), f(5, 4), f(4, 3))),
    "fill": (lambda x: (x, torch.full((3, 2), 2.5, device=x.device)), lambda: (f(2),)),
    "iota": (lambda x: (x, torch.arange(5, device=x.device), torch.arange(1.0, 3.0, 0.5, device=x.device)),
             lambda: (f(2),)),
    "gather": (lambda x, i: (x.gather(1, i), x[i[:, 0]]), lambda: (f(5, 3), ints(3, 5, 2))),
    "cat": (lambda x, y: (torch.cat([x, y], 0), torch.stack([x, x], 1)), lambda: (f(2, 3), f(4, 3))),
    "slice_scatter": (lambda x, y: torch.slice_scatter(x, y, 1, 1, 5, 2), lambda: (f(4, 6), f(4, 2))),
    "scatter": (lambda c, v, p: _put(c, v, p), lambda: (f(4, 6, 3), f(4, 3), torch.tensor([2]))),
    "philox": (lambda x, s: _draw(x, s), lambda: (f(5, 3), tkx.random.philox_state(3))),
    "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                  lambda: (f(2, 5, 8), f(2, 7, 8), f(2, 7, 4))),
    "attention_backward": (lambda q, k, v, m: torch.func.grad(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m).square().sum(),
        argnums=(0, 1, 2))(q, k, v),
        lambda: (f(2, 5, 8), f(2, 7, 8), f(2, 7, 4), f(5, 7))),
}


def _put(cache, v, p):
    cache[:, p] = v.unsqueeze(1)  # in place into an input: only the slice is written
    fresh = torch.zeros(4, 6, 3, device=v.device).scatter(2, torch.zeros(4, 6, 1, dtype=torch.int64,
                                                                          device=v.device), cache[..., :1])
    return cache * 2, fresh


def _draw(x, state):
    with tkx.random.philox(state):
        return torch.rand_like(x), F.dropout(x, 0.5), torch.randn(2, 3)


def test_every_row_has_a_probe():
    assert sorted(PROBES) == sorted(ops.OPS)


def test_kinds_are_a_str_enum():
    assert ops.Kind.EXP == "exp" and {"exp": 1}[ops.Kind.EXP] == 1
    with pytest.raises(AttributeError):
        ops.Kind.EPX  # noqa: B018  (a typo fails)
    with pytest.raises(ops.UnknownKindError, match="no row for kind 'prod'"):
        ops.row("prod")


def test_every_consumer_refuses_an_unknown_kind():
    from tkx.ir import Op, TensorSpec
    op = Op("p", "prod", (TensorSpec.dense("x", (3,), "float32"),), TensorSpec.dense("p", (3,), "float32"))
    with pytest.raises(ops.UnknownKindError):
        tkx.reference.evaluate(op, [torch.ones(3)], torch.device("cpu"))
    with pytest.raises(ops.UnknownKindError):
        cops.expr(op, ["x"])
    with pytest.raises(ops.UnknownKindError):
        ops.compute_type(op)


@pytest.mark.parametrize("kind", sorted(PROBES))
def test_probe_lowers_and_matches_eager_through_every_cpu_stage(kind):
    step, make = PROBES[kind]
    exp = check_step(step, make())
    assert kind in {op.kind for op in exp.program.ops}, f"{kind} does not appear in the lowered program"


def test_flags_come_from_the_table():
    from tkx.passes.builtin import COMMUTATIVE
    from tkx.schedule.rules import TRANSCENDENTAL
    assert COMMUTATIVE == {k for k, r in ops.OPS.items() if r.commutative}
    assert TRANSCENDENTAL == {k for k, r in ops.OPS.items() if r.transcendental}
    assert {"sin", "cos", "exp", "log"} <= TRANSCENDENTAL and "add" not in TRANSCENDENTAL


def test_integer_ops_compute_in_long_long_registers():
    def step(c, i):
        return c + 1, (i * 5) // 3, i.amax()

    big = torch.tensor(2**40 + 1)  # far beyond float32's exact integers
    exp = check_step(step, (big, ints(100, 9)))
    text = exp.cuda.text
    assert "const long long v_" in text and "tkx_ifloordiv" in text


def test_integer_reduction_stays_in_one_phase():
    def step(i):
        return (i > 3).sum()

    exp = check_step(step, (ints(9, 1 << 15),))
    group = next(g for g in exp.schedule.groups.values() if g.kind == "reduction")
    assert "partials" not in group.params


def test_integer_ops_that_are_not_exact_are_refused_at_lowering_with_the_line():
    def step(i):
        return i ** 2

    with pytest.raises(tkx.UnsupportedError) as info:
        _ = tkx.explore(step, (ints(9, 4),)).program
    assert info.value.kind == "integer-arithmetic" and "test_op_table.py" in str(info.value)


def test_table_rows_for_the_docs():
    rows = ops.table_rows()
    assert len(rows) == len(ops.ROWS) and {"kind", "family", "arity", "flags", "doc"} <= set(rows[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", sorted(PROBES))
def test_probe_kernel_matches_eager_on_the_gpu(kind):
    from torch.utils._pytree import tree_map

    step, make = PROBES[kind]
    inputs = make()
    runner = tkx.runtime.build(step, tree_map(lambda t: t.cuda(), inputs))
    result = runner.verify(make_inputs=lambda seed, device="cuda": tree_map(lambda t: t.to(device), inputs),
                           strict=True)
    assert result.passed


def test_rows_emitted_as_statements_have_an_emitter():
    from tkx.codegen.kernel import SPECIAL_POINTWISE
    assert {k for k, r in ops.OPS.items() if r.statements} == set(SPECIAL_POINTWISE)
    assert cops.missing_kinds() == []


def test_integer_reduction_result_stays_in_long_long():
    def step(i):
        return i.sum(), i.amax(1)

    big = torch.full((3, 4), 2**40 + 3)
    exp = check_step(step, (big,))
    assert "const float v_sum" not in exp.cuda.text and "const long long v_sum" in exp.cuda.text
