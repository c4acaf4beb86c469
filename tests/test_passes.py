"""Passes: golden before/after programs, the registry and trace, and reference-preservation on the zoo."""

from __future__ import annotations

import functools
import random
import textwrap

import pytest
import torch
from torch.utils._pytree import tree_leaves

import tkx
import tkx.passes as P
from tkx.ir import (
    InputSpec,
    IRValidationError,
    Op,
    OutputSpec,
    Program,
    StateUpdate,
    TensorSpec,
    contiguous_strides,
    validate,
)
from tkx.printer import format_program
from tkx.reference import TORCH, run

# --- building programs by hand -------------------------------------------------------------------


def V(buf: str, shape, dtype: str = "float32", strides=None, offset: int = 0) -> TensorSpec:
    shape = tuple(shape)
    return TensorSpec(shape, dtype, tuple(strides) if strides is not None else contiguous_strides(shape),
                      buf, offset)


def T(buf: str, m: int, n: int, dtype: str = "float32") -> TensorSpec:
    """The transposed read of a dense (m, n) buffer."""
    return V(buf, (n, m), dtype, strides=(1, n))


def op_(id: str, kind: str, inputs, shape, dtype: str = "float32", region: str = "forward", **attrs) -> Op:
    return Op(id, kind, tuple(inputs), TensorSpec.dense(id, tuple(shape), dtype), attrs, region)


def prog(inputs, ops, outputs, updates=()) -> Program:
    """inputs: (name, shape, dtype, mutated); input i's buffer is ``in{i}``."""
    ins = tuple(InputSpec(n, TensorSpec.dense(f"in{i}", tuple(s), d), mutated=m)
                for i, (n, s, d, m) in enumerate(inputs))
    return validate(Program(ins, tuple(ops), tuple(OutputSpec(n, v) for n, v in outputs),
                            tuple(StateUpdate(i, v) for i, v in updates), name="t"))


def golden(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def random_inputs(program: Program, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for inp in program.inputs:
        v = inp.value
        if v.dtype in ("int64", "int32"):
            t = torch.randint(-3, 4, v.shape, generator=gen).to(TORCH[v.dtype])
        elif v.dtype == "bool":
            t = torch.randint(0, 2, v.shape, generator=gen).bool()
        else:
            t = torch.randn(v.shape, generator=gen).to(TORCH[v.dtype])
        out.append(t)
    return out


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a-b| / max |b| (NaNs must sit in the same places; 0 for equal tensors)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    if not a.dtype.is_floating_point:
        return 0.0 if torch.equal(a, b) else float("inf")
    a, b = a.double(), b.double()
    nan = torch.isnan(b)
    assert torch.equal(torch.isnan(a), nan), "NaNs moved"
    a, b = a[~nan], b[~nan]
    inf = torch.isinf(b)
    assert torch.equal(a[inf], b[inf]), "infinities changed"
    a, b = a[~inf], b[~inf]
    if a.numel() == 0:
        return 0.0
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2e-2


def assert_same_results(before: Program, after: Program, inputs) -> None:
    r1, r2 = run(before, inputs), run(after, inputs)
    pairs = list(zip(r1.outputs, r2.outputs))
    assert sorted(r1.updates) == sorted(r2.updates)
    pairs += [(r1.updates[i], r2.updates[i]) for i in sorted(r1.updates)]
    for want, got in pairs:
        err = rel_error(got, want)
        assert err <= tolerance(want.dtype), f"relative error {err:.3g} ({want.dtype})"


def run_one(program: Program, name: str) -> P.PassStep:
    trace = P.run_passes(program, [name])
    assert len(trace) == 1 and trace[0].name == name
    return trace[0]


# --- dce -----------------------------------------------------------------------------------------


def test_dce_golden():
    x = V("in0", (4, 8))
    p = prog([("x", (4, 8), "float32", False)], [
        op_("a", "exp", [x], (4, 8)),
        op_("b", "neg", [x], (4, 8)),
        op_("c", "mul", [V("a", (4, 8)), 2.0], (4, 8)),
        op_("d", "sum", [V("b", (4, 8))], (4,), dims=(1,), keepdim=False),
    ], [("out", V("c", (4, 8)))])
    step = run_one(p, "dce")
    assert step.removed == ("b", "d") and step.added == () and step.changed == ()
    assert format_program(step.after) == golden("""
        program t {
          inputs:
            %in0: f32[4,8]                                              # x
          forward:
            %a: f32[4,8] = exp %in0
            %c: f32[4,8] = mul %a, 2.0
          outputs:
            out = %c: f32[4,8]
        }
    """)
    assert_same_results(p, step.after, random_inputs(p))


def test_dce_keeps_state_update_values_and_returns_same_object_when_nothing_is_dead():
    p = prog([("w", (3,), "float32", True)], [
        op_("a", "mul", [V("in0", (3,)), 0.5], (3,)),
    ], [], updates=[(0, V("a", (3,)))])
    assert P.dce(p) is p


# --- cse -----------------------------------------------------------------------------------------


def cse_program() -> Program:
    S = (4, 8)
    x, yb = V("in0", S), V("in1", S, strides=(0, 1))
    return prog([("x", S, "float32", False), ("y", (8,), "float32", False)], [
        op_("f1", "fill", [], (8,), value=1.0),
        op_("f2", "fill", [], (8,), value=1.0),
        op_("f3", "fill", [], S, value=1.0),                   # other shape: not merged
        op_("i1", "iota", [], (8,), "int64", start=0, step=1, dim=0),
        op_("i2", "iota", [], (8,), "int64", start=0, step=1, dim=0),
        op_("a", "add", [x, yb], S),
        op_("b", "add", [yb, x], S),                           # commutative duplicate of a
        op_("c", "mul", [x, 0.0], S),
        op_("d", "mul", [x, -0.0], S),                         # -0.0 is another operand
        op_("e", "mul", [x, 0], S),                            # int 0 is another operand
        op_("e2", "mul", [x, 0], S),
        op_("g", "sub", [V("a", S), V("b", S)], S),
        op_("h", "mul", [V("f1", S, strides=(0, 1)), V("f2", S, strides=(0, 1))], S),
        op_("k", "eq", [V("i1", S, "int64", strides=(0, 1)), V("i2", S, "int64", strides=(0, 1))], S, "bool"),
    ], [("g", V("g", S)), ("c", V("c", S)), ("d", V("d", S)), ("e", V("e2", S)), ("h", V("h", S)),
        ("k", V("k", S, "bool")), ("f3", V("f3", S))])


def test_cse_golden():
    p = cse_program()
    step = run_one(p, "cse")
    assert step.removed == ("f2", "i2", "b", "e2")
    assert step.changed == ("g", "h", "k")
    assert step.added == ()
    assert format_program(step.after) == golden("""
        program t {
          inputs:
            %in0: f32[4,8]                                              # x
            %in1: f32[8]                                                # y
          forward:
            %f1: f32[8] = fill {value=1.0}
            %f3: f32[4,8] = fill {value=1.0}
            %i1: i64[8] = iota {dim=0, start=0, step=1}
            %a: f32[4,8] = add %in0, bcast(%in1 -> 4x8)
            %c: f32[4,8] = mul %in0, 0.0
            %d: f32[4,8] = mul %in0, -0.0
            %e: f32[4,8] = mul %in0, 0
            %g: f32[4,8] = sub %a, %a
            %h: f32[4,8] = mul bcast(%f1 -> 4x8), bcast(%f1 -> 4x8)
            %k: bool[4,8] = eq bcast(%i1 -> 4x8), bcast(%i1 -> 4x8)
          outputs:
            g = %g: f32[4,8]
            c = %c: f32[4,8]
            d = %d: f32[4,8]
            e = %e: f32[4,8]
            h = %h: f32[4,8]
            k = %k: bool[4,8]
            f3 = %f3: f32[4,8]
        }
    """)
    assert_same_results(p, step.after, random_inputs(p))


def test_cse_sees_views_with_different_size1_strides_as_equal():
    x = V("in0", (8,))
    p = prog([("x", (8,), "float32", False)], [
        op_("a", "exp", [V("in0", (1, 8), strides=(8, 1))], (1, 8)),
        op_("b", "exp", [V("in0", (1, 8), strides=(0, 1))], (1, 8)),
        op_("c", "exp", [V("in0", (4,), strides=(2,))], (4,)),
        op_("d", "exp", [V("in0", (4,), strides=(1,))], (4,)),     # another view: kept
        op_("e", "add", [V("a", (1, 8)), V("b", (1, 8))], (1, 8)),
    ], [("e", V("e", (1, 8))), ("c", V("c", (4,))), ("d", V("d", (4,))), ("x", x)])
    step = run_one(p, "cse")
    assert step.removed == ("b",)


# --- canonicalize_views --------------------------------------------------------------------------


def test_canonicalize_views_golden():
    p = prog([("x", (1, 8), "float32", False), ("w", (8,), "float32", True), ("v", (8,), "float32", False)], [
        op_("a", "exp", [V("in0", (1, 8), strides=(0, 1))], (1, 8)),  # the root, oddly spelled -> root
        op_("b", "neg", [V("in1", (1, 8), strides=(0, 1))], (1, 8)),  # unsqueeze: size-1 stride normalised
        op_("c", "cast", [V("a", (8,))], (8,)),                        # self-copy of a full dense view: gone
        op_("d", "mul", [V("c", (8,)), V("c", (8,))], (8,)),
        op_("e", "cast", [V("in1", (8,))], (8,)),                      # copy of an input updated in place
        op_("f", "add", [V("e", (8,)), 1.0], (8,)),
        op_("g", "cast", [V("in2", (2, 4))], (2, 4)),                  # copy of an input that is not updated
        op_("h", "cast", [V("b", (4,), strides=(2,))], (4,)),          # a strided copy stays
    ], [("b", V("b", (1, 8), strides=(1, 1))), ("d", V("d", (8,))), ("e", V("e", (8,))),
        ("g", V("g", (8,))), ("h", V("h", (4,)))], updates=[(1, V("f", (8,)))])
    step = run_one(p, "canonicalize_views")
    assert step.removed == ("c", "g")
    assert step.changed == ("a", "b", "d", "f")
    assert format_program(step.after) == golden("""
        program t {
          inputs:
            %in0: f32[1,8]                                              # x
            %in1: f32[8]                                                # w  (updated in place)
            %in2: f32[8]                                                # v
          forward:
            %a: f32[1,8] = exp %in0
            %b: f32[1,8] = neg reshape(%in1 -> 1x8)
            %d: f32[8] = mul reshape(%a -> 8), reshape(%a -> 8)
            %e: f32[8] = cast %in1
            %f: f32[8] = add %in1, 1.0
            %h: f32[4] = cast view(%b, 4, strides=(2))
          outputs:
            b = %b: f32[1,8]
            d = %d: f32[8]
            e = %e: f32[8]
            g = %in2: f32[8]
            h = %h: f32[4]
          in-place updates:
            w <- %f
        }
    """)
    a = step.after.op("a").inputs[0]
    assert a == step.after.inputs[0].value
    assert step.after.op("b").inputs[0].strides == (8, 1)  # the contiguous stride of shape (1, 8)
    assert_same_results(p, step.after, random_inputs(p))


def test_canonicalize_views_is_idempotent_and_returns_the_same_program():
    p = prog([("x", (4, 8), "float32", False)], [op_("a", "exp", [V("in0", (4, 8))], (4, 8))],
             [("a", V("a", (4, 8)))])
    assert P.canonicalize_views(p) is p


# --- simplify ------------------------------------------------------------------------------------


def simplify_program() -> Program:
    S = (4, 8)
    x, n, h = V("in0", S), V("in1", S, "int64"), V("in2", S, "bfloat16")

    def b(buf: str, dtype: str = "float32") -> TensorSpec:
        return V(buf, S, dtype, strides=(0, 0))

    return prog([("x", S, "float32", False), ("n", S, "int64", False), ("h", S, "bfloat16", False)], [
        op_("one", "fill", [], (), value=1),
        op_("zero", "fill", [], (), value=0.0),
        op_("two", "fill", [], (), "bfloat16", value=2),
        op_("m1", "mul", [x, b("one")], S),                         # x*1 -> x
        op_("m2", "mul", [b("one"), V("m1", S)], S),                # 1*x -> x
        op_("a1", "add", [V("m2", S), 0], S),                       # x+0 -> x
        op_("s1", "sub", [V("a1", S), b("zero")], S),               # x-0 -> x
        op_("d1", "div", [V("s1", S), 1.0], S),                     # x/1 -> x
        op_("mz", "mul", [V("d1", S), b("zero")], S),               # x*0 stays (NaN, inf, -0.0)
        op_("nf", "mul", [n, 1.0], S),                              # int*1.0 is a cast: stays
        op_("n1", "neg", [x], S),
        op_("n2", "neg", [V("n1", S)], S),                          # neg(neg(x)) -> x
        op_("c1", "cast", [x], S, "bfloat16"),
        op_("c2", "cast", [V("c1", S, "bfloat16")], S),             # f32->bf16->f32 keeps its rounding
        op_("c3", "cast", [h], S),
        op_("c4", "cast", [V("c3", S)], S, "float16"),              # bf16->f32->f16 -> bf16->f16
        op_("c5", "cast", [V("c3", S)], S, "bfloat16"),             # bf16->f32->bf16 -> h
        op_("k1", "cast", [V("two", (), "bfloat16")], ()),          # -> fill f32 2.0
        op_("k2", "mul", [V("k1", ()), 0.1], ()),                   # -> fill of 0.1*2 rounded to f32
        op_("k3", "add", [V("two", (), "bfloat16"), 0.1], (), "bfloat16"),  # rounded to bf16
        op_("k4", "div", [V("one", ()), V("zero", ())], ()),        # inf
        op_("r", "add", [V("mz", S), V("n2", S)], S),
    ], [("r", V("r", S)), ("nf", V("nf", S)), ("c2", V("c2", S)), ("c4", V("c4", S, "float16")),
        ("c5", V("c5", S, "bfloat16")), ("k2", V("k2", ())), ("k3", V("k3", (), "bfloat16")),
        ("k4", V("k4", ()))])


def test_simplify_golden():
    p = simplify_program()
    step = run_one(p, "simplify")
    assert step.removed == ("m1", "m2", "a1", "s1", "d1", "n2", "c5")
    assert step.changed == ("mz", "c4", "k1", "k2", "k3", "k4", "r")
    assert format_program(step.after) == golden("""
        program t {
          inputs:
            %in0: f32[4,8]                                              # x
            %in1: i64[4,8]                                              # n
            %in2: bf16[4,8]                                             # h
          forward:
            %one: f32[] = fill {value=1}
            %zero: f32[] = fill {value=0.0}
            %two: bf16[] = fill {value=2}
            %mz: f32[4,8] = mul %in0, bcast(%zero -> 4x8)
            %nf: f32[4,8] = mul %in1, 1.0
            %n1: f32[4,8] = neg %in0
            %c1: bf16[4,8] = cast %in0
            %c2: f32[4,8] = cast %c1
            %c3: f32[4,8] = cast %in2
            %c4: f16[4,8] = cast %in2
            %k1: f32[] = fill {value=2.0}
            %k2: f32[] = fill {value=0.20000000298023224}
            %k3: bf16[] = fill {value=2.09375}
            %k4: f32[] = fill {value=inf}
            %r: f32[4,8] = add %mz, %in0
          outputs:
            r = %r: f32[4,8]
            nf = %nf: f32[4,8]
            c2 = %c2: f32[4,8]
            c4 = %c4: f16[4,8]
            c5 = %in2: bf16[4,8]
            k2 = %k2: f32[]
            k3 = %k3: bf16[]
            k4 = %k4: f32[]
        }
    """)
    inputs = random_inputs(p)
    inputs[0][0, 0] = float("nan")
    inputs[0][0, 1] = float("inf")
    r1, r2 = run(p, inputs), run(step.after, inputs)
    for a, b in zip(r1.outputs, r2.outputs):  # exact, NaN for NaN
        assert torch.equal(torch.nan_to_num(a.double(), 7.0), torch.nan_to_num(b.double(), 7.0))
    # dce then drops what simplify left dead: the fills 1 and 2, neg x, cast h -> f32, fill 2.0
    assert P.run_passes(p, ["simplify", "dce"])["dce"].removed == ("one", "two", "n1", "c3", "k1")


def test_simplify_does_not_drop_a_rounding_or_a_broadcast():
    S = (4, 8)
    p = prog([("x", (8,), "float32", False), ("y", S, "float16", False)], [
        op_("a", "mul", [V("in0", S, strides=(0, 1)), 1.0], S),      # x*1 but broadcast: the op stays
        op_("c1", "cast", [V("in1", S, "float16")], S, "bfloat16"),    # f16 -> bf16 rounds
        op_("c2", "cast", [V("c1", S, "bfloat16")], S),
    ], [("a", V("a", S)), ("c2", V("c2", S))])
    # 'a' is forwarded to the broadcast view for its output (outputs may be any view)
    after = P.simplify(p)
    assert [op.id for op in after.ops] == ["c1", "c2"]
    assert after.outputs[0].value == V("in0", S, strides=(0, 1))
    assert after.op("c2").inputs[0].buffer == "c1"
    assert_same_results(p, after, random_inputs(p))


def test_simplify_keeps_an_update_reading_a_mutated_input_through_the_op():
    p = prog([("w", (3,), "float32", True), ("v", (3,), "float32", True)], [
        op_("a", "mul", [V("in0", (3,)), 1.0], (3,)),
        op_("b", "add", [V("a", (3,)), V("in1", (3,))], (3,)),
    ], [("a", V("a", (3,)))], updates=[(0, V("b", (3,))), (1, V("a", (3,)))])
    after = P.simplify(p)
    # b now reads w directly; the output and v's update still read the copy of w's old value
    assert after.op("b").inputs[0] == V("in0", (3,))
    assert after.outputs[0].value.buffer == "a" and after.updates[1].value.buffer == "a"
    assert_same_results(p, after, random_inputs(p))


# --- transpose_gemm ------------------------------------------------------------------------------


def gemm_program() -> Program:
    A, B = V("in0", (4, 5)), V("in1", (5, 6))
    return prog([("a", (4, 5), "float32", False), ("b", (5, 6), "float32", False),
                 ("c", (6, 3), "float32", False), ("bias", (6,), "float32", False)], [
        op_("mm1", "mm", [A, B], (4, 6)),                                   # read only as mm1.T
        op_("e", "exp", [T("mm1", 4, 6)], (6, 4)),
        op_("mm2", "mm", [A, B], (4, 6), region="backward"),                # chain: mm3 = mm2 @ c, read as .T
        op_("mm3", "mm", [V("mm2", (4, 6)), V("in2", (6, 3))], (4, 3), region="backward"),
        op_("mm4", "addmm", [V("in3", (4, 6), strides=(0, 1)), A, B], (4, 6), region="backward",
          alpha=1, beta=1),
        op_("mm5", "mm", [A, B], (4, 6), region="backward"),                # read both ways: stays
        op_("g", "neg", [T("mm5", 4, 6)], (6, 4), region="backward"),
    ], [("e", V("e", (6, 4))), ("t1", T("mm1", 4, 6)), ("t3", T("mm3", 4, 3)), ("t4", T("mm4", 4, 6)),
        ("g", V("g", (6, 4))), ("mm5", V("mm5", (4, 6)))])


def test_transpose_gemm_golden():
    p = gemm_program()
    step = run_one(p, "transpose_gemm")
    assert step.added == ("mm1_t", "mm2_t", "mm3_t", "mm4_t")
    assert step.removed == ("mm1", "mm2", "mm3", "mm4")
    assert step.changed == ("e",)
    assert format_program(step.after) == golden("""
        program t {
          inputs:
            %in0: f32[4,5]                                              # a
            %in1: f32[5,6]                                              # b
            %in2: f32[6,3]                                              # c
            %in3: f32[6]                                                # bias
          forward:
            %mm1_t: f32[6,4] = mm %in1.T, %in0.T
            %e: f32[6,4] = exp %mm1_t
          backward:
            %mm2_t: f32[6,4] = mm %in1.T, %in0.T
            %mm3_t: f32[3,4] = mm %in2.T, %mm2_t
            %mm4_t: f32[6,4] = addmm bcast(%in3 -> 6x4), %in1.T, %in0.T {alpha=1, beta=1}
            %mm5: f32[4,6] = mm %in0, %in1
            %g: f32[6,4] = neg %mm5.T
          outputs:
            e = %e: f32[6,4]
            t1 = %mm1_t: f32[6,4]
            t3 = %mm3_t: f32[3,4]
            t4 = %mm4_t: f32[6,4]
            g = %g: f32[6,4]
            mm5 = %mm5: f32[4,6]
        }
    """)
    assert step.after.op("mm4_t").inputs[0] == V("in3", (6, 4), strides=(1, 0))
    assert [op.region for op in step.after.ops] == [op.region for op in p.ops]
    # a second run finds nothing: rewritten GEMMs are read densely
    assert P.transpose_gemm(step.after) is step.after
    for seed in range(3):
        assert_same_results(p, step.after, random_inputs(p, seed))


def test_transpose_gemm_skips_vectors_and_unread_results():
    p = prog([("a", (1, 5), "float32", False), ("b", (5, 6), "float32", False)], [
        op_("mm1", "mm", [V("in0", (1, 5)), V("in1", (5, 6))], (1, 6)),
        op_("mm2", "mm", [V("in0", (1, 5)), V("in1", (5, 6))], (1, 6)),
    ], [("t", V("mm1", (6, 1), strides=(1, 6)))])
    assert P.transpose_gemm(p) is p


# --- views ---------------------------------------------------------------------------------------


def _random_view(rng: random.Random, numel: int) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    ndim = rng.randint(0, 3)
    shape = tuple(rng.randint(1, 4) for _ in range(ndim))
    strides = tuple(rng.choice([0, 1, 2, 3, 4, 6, 8, 12]) for _ in range(ndim))
    span = sum((d - 1) * s for d, s in zip(shape, strides))
    if span >= numel:
        return None
    return shape, strides, rng.randint(0, numel - 1 - span)


def test_compose_matches_torch_on_random_views():
    rng = random.Random(0)
    hits = misses = 0
    for _ in range(3000):
        base_shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
        numel = int(torch.tensor(base_shape).prod())
        storage = torch.arange(200, dtype=torch.float64)
        # value R: some view of a storage, with the base shape
        kind = rng.choice(["dense", "transpose", "broadcast", "offset", "strided"])
        strides = list(contiguous_strides(base_shape))
        if kind == "transpose":
            strides = strides[::-1]
        elif kind == "broadcast":
            strides = [s if rng.random() < 0.5 else 0 for s in strides]
        elif kind == "strided":
            strides = [s * rng.choice([1, 2, 3]) for s in strides]
        offset = 5 if kind == "offset" else 0
        R = TensorSpec(base_shape, "float32", tuple(strides), "r", offset)
        dense = storage.as_strided(base_shape, tuple(strides), offset).reshape(-1).clone()  # own storage
        use = _random_view(rng, numel)
        if use is None:
            continue
        shape, ustrides, uoffset = use
        want = dense.as_strided(shape, ustrides, uoffset)
        got = P.compose(TensorSpec(shape, "float32", ustrides, "o", uoffset), R)
        if got is None:
            misses += 1
            continue
        hits += 1
        assert got.buffer == "r" and got.shape == shape
        assert torch.equal(storage.as_strided(got.shape, got.strides, got.offset), want), (R, use, got)
    assert hits > 1000 and misses > 10


# --- registry, runner, trace ---------------------------------------------------------------------


def test_registry_lists_the_builtins_and_the_default_pipeline():
    assert P.DEFAULT_PIPELINE == ("canonicalize_views", "simplify", "cse", "transpose_gemm", "dce")
    assert P.default_pipeline() == P.DEFAULT_PIPELINE
    assert P.pass_names()[:5] == P.DEFAULT_PIPELINE
    for name in P.DEFAULT_PIPELINE:
        fn = P.get_pass(name)
        assert fn.__doc__ and len(fn.__doc__.strip()) > 80, name
        assert P.pass_info(name).description
    with pytest.raises(P.UnknownPassError, match="registered passes: canonicalize_views") as info:
        P.get_pass("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, tkx.TkxError)
    with pytest.raises(P.PassError, match="already registered"):
        P.register_pass("dce")(lambda p: p)
    with pytest.raises(P.PassError, match="built-in"):
        P.unregister_pass("cse")


def test_a_pass_registered_from_a_notebook_cell_shows_up_in_the_trace():
    p = cse_program()

    # what a user types in a cell: turn every x*0.0 into an explicit fill (unsafe, but visible)
    @P.register_pass("zero_products", description="x*0.0 -> fill 0.0")
    def zero_products(program: Program) -> Program:
        ops = []
        for op in program.ops:
            if op.kind == "mul" and op.inputs[1] == 0.0 and type(op.inputs[1]) is float:
                op = op.replace(kind="fill", inputs=(), attrs={"value": 0.0})
            ops.append(op)
        return program.replace(ops=tuple(ops))

    try:
        assert "zero_products" in P.pass_names()
        trace = P.run_passes(p, ["cse", "zero_products", "dce"])
        assert trace.names == ("cse", "zero_products", "dce")
        step = trace["zero_products"]
        assert step.changed == ("c", "d") and step.added == () and step.removed == ()
        assert "zero_products" in str(trace)
        assert "-    %c: f32[4,8] = mul %in0, 0.0" in step.diff_text()
        assert "+    %c: f32[4,8] = fill {value=0.0}" in step.diff_text()
        assert P.pass_info("zero_products").description == "x*0.0 -> fill 0.0"
        # re-running the cell needs replace=True
        with pytest.raises(P.PassError, match="already registered"):
            P.register_pass("zero_products")(zero_products)
        P.register_pass("zero_products", replace=True, default=True)(zero_products)
        assert P.default_pipeline() == ("canonicalize_views", "simplify", "cse", "transpose_gemm",
                                        "zero_products", "dce")
        assert "zero_products" in P.run_passes(p).names
    finally:
        P.unregister_pass("zero_products")
    assert "zero_products" not in P.pass_names()
    assert P.default_pipeline() == P.DEFAULT_PIPELINE


def test_register_pass_without_arguments_uses_the_function_name():
    @P.register_pass
    def my_identity_pass(program: Program) -> Program:
        """Does nothing, on purpose."""
        return program

    try:
        assert P.get_pass("my_identity_pass") is my_identity_pass
        assert P.pass_info("my_identity_pass").description == "Does nothing, on purpose."
        step = P.run_passes(cse_program(), ["my_identity_pass"])[0]
        assert step.after is step.before and not step.modified
        assert (step.added, step.removed, step.changed) == ((), (), ())
        assert step.diff_text() == ""
    finally:
        P.unregister_pass("my_identity_pass")


def test_a_pass_that_breaks_the_ir_is_named():
    p = cse_program()

    def drop_first(program: Program) -> Program:
        return program.replace(ops=program.ops[1:])

    def not_a_program(program: Program):
        return None

    def rename_output(program: Program) -> Program:
        return program.replace(outputs=(OutputSpec("zz", program.outputs[0].value), *program.outputs[1:]))

    def crash(program: Program) -> Program:
        raise ZeroDivisionError("boom")

    with pytest.raises(P.PassError, match="pass 'drop_first' produced an invalid program") as info:
        P.run_passes(p, [drop_first])
    assert isinstance(info.value.__cause__, IRValidationError)
    with pytest.raises(P.PassError, match="'not_a_program' returned NoneType"):
        P.run_passes(p, [not_a_program])
    with pytest.raises(P.PassError, match="'rename_output' changed the program outputs"):
        P.run_passes(p, [rename_output])
    with pytest.raises(P.PassError, match="'crash' raised ZeroDivisionError: boom"):
        P.run_passes(p, ["cse", crash])


def test_pass_trace_api():
    p = cse_program()
    trace = P.run_passes(p)
    assert len(trace) == 5 and trace.input is p and trace.output is trace[-1].after
    assert trace[0].before is p
    assert all(a.after is b.before for a, b in zip(trace.steps, trace.steps[1:]))
    assert trace["cse"] is trace[2]
    with pytest.raises(KeyError, match="it ran: canonicalize_views"):
        trace["nope"]
    r = repr(trace)
    assert "\n" not in r and r.startswith("<tkx.PassTrace 5 passes: 14 -> 8 ops")
    text = str(trace).splitlines()
    assert text[0].startswith("PassTrace of t: 14 -> 8 ops in 5 passes")
    assert text[1].split() == ["pass", "ms", "+added", "-removed", "~changed", "ops"]
    assert text[4].split()[0] == "cse" and text[4].split()[2:] == ["0", "5", "2", "9"]
    assert all(s.ms >= 0 for s in trace)
    assert "\n" not in repr(trace[2]) and "cse" in repr(trace[2])
    bundle = trace._repr_mimebundle_()
    assert "<table>" in bundle["text/html"] and bundle["text/plain"] == str(trace)
    diff = trace["cse"].diff_text()
    assert diff.startswith("--- before cse\n+++ after cse")
    assert P.run_passes(p, []).output is p


def test_passes_are_pure():
    p = simplify_program()
    text = format_program(p)
    snapshot = [(op.id, op.kind, op.inputs, dict(op.attrs)) for op in p.ops]
    P.run_passes(p, P.pass_names()[:5] * 2)
    assert format_program(p) == text
    assert snapshot == [(op.id, op.kind, op.inputs, dict(op.attrs)) for op in p.ops]


# --- the example zoo -----------------------------------------------------------------------------

try:
    import tkx.examples as E

    EXAMPLES = E.names()
except Exception as exc:  # pragma: no cover - the zoo is written by another helper
    E, EXAMPLES, ZOO_ERROR = None, [], f"{type(exc).__name__}: {exc}"


@functools.cache
def captured(name: str) -> Program:
    ex = E.get(name)
    try:
        return tkx.capture(ex.step_fn, ex.make_inputs(0)).lower()
    except tkx.UnsupportedError as exc:
        pytest.skip(f"capture of {name} fails: {str(exc).splitlines()[0]}")


@functools.cache
def reference_result(name: str):
    inputs = tree_leaves(E.get(name).make_inputs(seed=1))
    return inputs, run(captured(name), inputs)


def zoo(params):
    if not EXAMPLES:
        reason = f"tkx.examples not importable: {ZOO_ERROR}"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    return params


PIPELINES = [None, *[(n,) for n in P.DEFAULT_PIPELINE]]


@pytest.mark.parametrize("case", zoo([(n, p) for n in EXAMPLES for p in PIPELINES]),
                         ids=lambda c: f"{c[0]}-{'+'.join(c[1]) if c[1] else 'default'}" if c else "zoo")
def test_passes_preserve_reference_results_on_the_zoo(case):
    name, passes = case
    program = captured(name)
    inputs, want = reference_result(name)
    after = P.run_passes(program, passes).output
    got = run(after, inputs)
    assert len(got.outputs) == len(want.outputs) and sorted(got.updates) == sorted(want.updates)
    pairs = list(zip(got.outputs, want.outputs)) + [(got.updates[i], want.updates[i]) for i in want.updates]
    for g, w in pairs:
        err = rel_error(g, w)
        assert err <= tolerance(w.dtype), f"{name}: relative error {err:.3g} ({w.dtype})"
    # ids are stable and provenance is carried over to every surviving op
    before = {op.id: op for op in program.ops}
    for op in after.ops:
        origin = before.get(op.id) or before[op.id.rsplit("_t", 1)[0]]
        assert (op.source, op.fx_node, op.region) == (origin.source, origin.fx_node, origin.region)


@pytest.mark.parametrize("name", zoo(EXAMPLES))
def test_default_pipeline_reaches_a_fixed_point(name):
    out = P.run_passes(captured(name)).output
    assert len(out.ops) < len(captured(name).ops)
    again = P.run_passes(out)
    assert all(s.after is s.before for s in again), [s.name for s in again if s.after is not s.before]


@pytest.mark.skipif(not EXAMPLES, reason="tkx.examples not importable")
def test_cse_merges_the_duplicated_cross_entropy_masks_of_digits_mlp():
    program = captured("digits_mlp")
    step = run_one(program, "cse")
    assert len(step.after.ops) < len(program.ops)
    kinds = {program.op(i).kind for i in step.removed}
    assert {"ne", "iota", "eq"} <= kinds
    assert sum(op.kind == "iota" for op in step.after.ops) == 1
    assert sum(op.kind == "ne" for op in step.after.ops) == 1


def _gemms_read_only_transposed(program: Program) -> list[str]:
    """Independent check: mm results (both dims > 1) whose every read is the plain transpose."""
    found = []
    for op in program.ops:
        if op.kind not in ("mm", "addmm") or min(op.out.shape) <= 1:
            continue
        m, n = op.out.shape
        reads = [x for o in program.ops for x in o.tensor_inputs if x.buffer == op.id]
        reads += [s for s in program.sinks() if s.buffer == op.id]
        if reads and all(x.shape == (n, m) and x.strides == (1, n) and x.offset == 0 for x in reads):
            found.append(op.id)
    return found


@pytest.mark.parametrize("name", zoo([n for n in ("digits_mlp", "tiny_online") if n in EXAMPLES]))
def test_transpose_gemm_on_captured_mlps(name):
    # Lowered torch.func backward graphs compute weight gradients as x.T @ g, read densely by the
    # optimizer, so no GEMM result is read only transposed and the pass leaves them alone.
    program = P.run_passes(captured(name), ["canonicalize_views", "simplify", "cse"]).output
    step = run_one(program, "transpose_gemm")
    expected = _gemms_read_only_transposed(program)
    assert [i[:-2] for i in step.added] == expected
    assert expected == []
    assert step.after is program
