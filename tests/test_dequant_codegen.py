"""Cheap inlined dequant chains in the generated CUDA (``Options.cheap_int_math``, :mod:`tkx.codegen.intfacts`).

The int8 / int4 weight-only GEMVs dequantise in the streaming GEMV's operand load (``q.to(bf16) * scale``,
int4 ``byte // 16**j % 16 - 8``). Checked here on the CPU: the generated source uses the cheap forms (32-bit
non-negative indices, shifts and masks instead of 64-bit ``floor_divide``/``remainder``, 8 consecutive K
elements per lane with the index written ``base | t``), the switch restores the generic forms, the results
stay exact (interpreters against eager), and the kernels compile without spills. On a GPU: integer ``//``
and ``%`` by powers of two give torch's floor semantics for negative dividends too.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import tkx
from tkx.codegen import intfacts
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import decode as D
from tkx.ir import TensorSpec
from tkx.schedule.interpreter import run as run_schedule

BF16 = torch.bfloat16


def _gemv(quant: str, n: int = 512, k: int = 512, group: int = 128):
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(4, k, generator=gen).to(BF16)
    qw, s = (D.quantize_int8 if quant == "int8" else D.quantize_int4)(w, group)

    def step(x, qw, s):
        return F.linear(x, D.dequantize(qw, s, quant, group))
    return step, [x, qw, s]


def _exact(step, inputs, exp):
    """Both interpreters give eager's bf16 result bit for bit."""
    want = step(*inputs)
    ref = tkx.reference.run(exp.optimized, list(inputs)).outputs[0]
    sch = run_schedule(exp.schedule, exp.arena, list(inputs)).outputs[0]
    assert torch.equal(ref, sch), "the two interpreters disagree"
    # eager dequantises to a bf16 weight and multiplies in bf16; tkx sums in fp32 then rounds once
    torch.testing.assert_close(ref.float(), want.float(), rtol=2e-2, atol=2e-2)


def _chain_functions(text: str) -> str:
    """The device functions (the inlined chain) of a generated kernel."""
    return "\n".join(re.findall(r"__device__ __forceinline__ \w[\w ]* tkx_v_\w+\(TKX_POINTERS, [^)]*\) \{.*?\n\}",
                                text, flags=re.S))


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_dequant_chain_uses_32_bit_indices_shifts_and_8_elements_per_lane(quant):
    step, inputs = _gemv(quant)
    exp = tkx.explore(step, inputs, arch="sm_90a")
    assert exp.options.cheap_int_math  # the default
    text = exp.cuda.text
    funcs = _chain_functions(text)
    assert funcs and "long long i)" not in funcs and "(TKX_POINTERS, int i)" in funcs
    assert "__builtin_assume(i >= 0)" in funcs
    # no 64-bit integer division left in the chain: the int4 nibble // 16**j is a shift by a table of shifts,
    # % 16 a mask
    assert "tkx_ifloordiv" not in funcs and "tkx_iremainder" not in funcs
    if quant == "int4":
        assert ">> (int)((0x100ULL >> (6 * ((i % 2)))) & 63ULL)" in funcs, funcs
        assert "& ((1LL << 4) - 1LL)" in funcs
    # q.to(bf16) is not rounded: the integer is proved within [-256, 256] (int4: [-8, 7] by interval arithmetic)
    assert re.search(r"const float v_\w+ = \(float\)\(\(int\)\(.+\)\);  // \w+: cast", funcs), funcs
    ops = {op.id: op for op in exp.schedule.program.ops}
    (cast,) = [op for op in ops.values() if op.kind == "cast" and op.out.dtype == "bfloat16"
               and isinstance(op.inputs[0], TensorSpec) and op.inputs[0].dtype != "bfloat16"]
    assert intfacts.int_range(cast.inputs[0], ops, {}) == ((-8, 7) if quant == "int4" else (-128, 127))
    # the streaming GEMV's chain path: 8 consecutive K elements per lane, the index written base | t
    (grp,) = [g for g in exp.schedule.groups.values() if g.kind == "gemm"]
    note = exp.cuda.notes[grp.id]
    assert note["variant"] == "gemv_stream" and note["lane_elements"] == 8 and not note["vector_loads"], note
    assert re.search(r"elem\[c\]\[t\] = l < 512 \? tkx_v_\w+\(TKX_ARGS, \(\(k0 \+ l \* 512\) \| t\)\)", text)
    assert "8 chain elements per lane" in text
    _exact(step, inputs, exp)
    if nvrtc_available():
        for arch in ("sm_80", "sm_90", "sm_90a"):
            assert exp.cuda.check(arch).spill_bytes == 0, arch


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_cheap_dequant_switch_restores_the_generic_forms(quant):
    step, inputs = _gemv(quant)
    exp = tkx.explore(step, inputs, arch="sm_90a", cheap_int_math=False)
    funcs = _chain_functions(exp.cuda.text)
    assert "(TKX_POINTERS, long long i)" in funcs and "__builtin_assume" not in exp.cuda.text
    assert ("tkx_ifloordiv" in funcs) == (quant == "int4")
    (grp,) = [g for g in exp.schedule.groups.values() if g.kind == "gemm"]
    assert exp.cuda.notes[grp.id]["lane_elements"] == 1
    _exact(step, inputs, exp)


def test_power_of_two_facts():
    ops: dict = {}
    cache: dict = {}
    assert intfacts.power_of_two_shifts(16, ops, cache) == {4}
    assert intfacts.power_of_two_shifts(1, ops, cache) == {0}
    for bad in (12, 0, -16, 16.0, True):
        assert intfacts.power_of_two_shifts(bad, ops, cache) is None, bad
    small = TensorSpec((4, 8), "int32", (8, 1), "x")
    assert intfacts.index_fits_32([small])
    assert not intfacts.index_fits_32([TensorSpec((1 << 16, 1 << 15), "bfloat16", (1 << 15, 1), "x")])


def _int_steps():
    """Integer // and % by powers of two (literal and arange-made divisors) over negative dividends."""
    def by_literal(x):
        return torch.floor_divide(x, 16) + (x % 8) * 1000

    def by_tensor(x):
        d = 1 + 3 * torch.arange(2, dtype=torch.int32, device=x.device)  # 1, 4 (as int4's 16**j)
        return (x.unsqueeze(-1) // d) * 100 + x.unsqueeze(-1) % d
    def by_long_tensor(x):  # a divisor of 12 elements: its shift found per element (__ffsll), not from a table
        d = 1 + 15 * (torch.arange(12, dtype=torch.int32, device=x.device) % 2)
        return (x.unsqueeze(-1) // d) * 100 + x.unsqueeze(-1) % d
    x = torch.arange(-70, 71, 5, dtype=torch.int32)[:28].reshape(2, -1)
    return (by_literal, by_tensor, by_long_tensor), x


@pytest.mark.parametrize("which", [0, 1, 2])
def test_integer_floor_divide_and_remainder_by_powers_of_two(which):
    steps, x = _int_steps()
    step = steps[which]
    exp = tkx.explore(step, [x])
    ref = tkx.reference.run(exp.optimized, [x]).outputs[0]
    assert torch.equal(ref, step(x))
    assert torch.equal(run_schedule(exp.schedule, exp.arena, [x]).outputs[0], ref)
    text = exp.cuda.text.split("end of tkx prelude")[1]  # the prelude defines the generic helpers
    assert "tkx_ifloordiv(" not in text and "tkx_iremainder(" not in text
    assert " >> " in text
    assert ("__ffsll" in text) == (which == 2)
    if nvrtc_available():
        assert exp.cuda.check("sm_90").spill_bytes == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("which", [0, 1, 2])
def test_integer_floor_divide_and_remainder_by_powers_of_two_on_the_gpu(which):
    steps, x = _int_steps()
    step = steps[which]
    runner = tkx.runtime.build(step, (x.cuda(),))
    assert torch.equal(runner(x.cuda()).cpu(), step(x))
