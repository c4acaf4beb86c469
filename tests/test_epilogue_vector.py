"""The wgmma tile epilogue in 16-byte vectors (``Options.epilogue_vector``, :mod:`tkx.codegen.epilogue_vector`):
the generated text (no GPU needed). tests/test_epilogue_vector_gpu.py runs it."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad_and_value

import tkx
from tkx.codegen import epilogue_vector as ev
from tkx.codegen import gemm as G
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get
from tkx.options import Options


def linear_step(w, b, x, y):
    """A user-style step: one linear layer with bias and ReLU, squared error, SGD on weight and bias."""
    def loss_fn(w, b):
        return ((x @ w + b).relu() - y).float().pow(2).mean()
    (gw, gb), loss = grad_and_value(loss_fn, argnums=(0, 1))(w, b)
    return loss, w - 0.01 * gw, b - 0.01 * gb


def linear_inputs(seed: int = 0, device: str = "cpu", *, dtype=torch.bfloat16, offset: int = 0):
    """(w [512, 1024], b [1024], x [256, 512], y [256, 1024]) of ``dtype``; ``offset`` > 0 makes ``w`` a view
    starting ``offset`` elements into a larger buffer (2 bytes past a 16-byte boundary for bf16 and 1)."""
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(512 * 1024 + 8, generator=g).to(dtype).to(device)
    w = big[offset:offset + 512 * 1024].view(512, 1024)
    b, x, y = (torch.randn(*s, generator=g).to(dtype).to(device) for s in ((1024,), (256, 512), (256, 1024)))
    return w, b, x, y


def _explore(name: str, **opts):
    ex = get(name)
    return tkx.explore(ex.step_fn, ex.make_inputs(0, "cpu"), options=Options(arch="sm_90a", **opts),
                       loss=ex.loss_output)


@pytest.fixture(scope="module")
def medium():
    return _explore("medium")


def test_sgd_update_takes_vector_loads_and_stores(medium):
    text, notes = medium.cuda.text, medium.cuda.notes
    g4 = notes["g4"]  # 4096x1024x256 TN, 128x256 tiles: w_new = bf16(w - 0.01 * bf16(acc))
    assert g4["tile"] == (128, 256, 64) and g4["epilogue_vector"] == 8
    assert g4["epilogue_per_pass"] == 64 and g4["epilogue_passes"] == 2 and not g4["early_loads"]
    assert "const bool tkx_vec = ((((unsigned long long)(in2) | (unsigned long long)(out3)) & 15ULL) == 0ULL);" in text
    load = "const uint4 tkxL0_0_0 = *reinterpret_cast<const uint4*>((const unsigned short*)(in2) + tkxR0_e + 0);"
    assert load in text
    assert "*reinterpret_cast<uint4*>((unsigned short*)(out3) + tkxR7_e + 0) = make_uint4(" in text
    # the weight's value comes out of the vector, the same arithmetic as the scalar code
    assert ("tkxE1_v_sub_4 = tkx_round_bf16(tkx_bf16_to_float((unsigned short)(tkxL0_0_0.x >> 16)) - tkxE1_v_mul_4);"
            in text)
    # ... and the scalar code is still there for misaligned pointers
    assert "tkx_round_bf16(tkx_ld_bf16(in2, tkxE0_tkx_e) - tkxE0_v_mul_4)" in text
    # the C tile as float4 reads of the swizzled rows
    assert "const float4 tkxC0_1 = *reinterpret_cast<const float4*>(&Cs[tkxR0_r * 264 + ((tkxR0_c + 4) ^" in text


def test_small_tile_issues_its_point_reads_before_the_k_loop(medium):
    g5 = medium.cuda.notes["g5"]  # 256x4096x1024, 64x128 tiles: the ReLU mask read at the output's index
    assert g5["tile"] == (64, 128, 64) and g5["epilogue_per_pass"] == 32 and g5["early_loads"]
    text = medium.cuda.text
    start = text.index("const int item = tkx_w - 128;  // g5")
    body = text[start:text.index("} else if", start)]
    early = body.index("const uint4 tkxL0_3_0 = tkx_vec ? *reinterpret_cast<const uint4*>(")
    assert early < body.index("for (int kt = 0, k0 = k_beg; k0 < k_end; ++kt, k0 += TK)")


def test_split_k_final_phase_is_vectorized(medium):
    g1 = medium.cuda.notes["g1"]
    assert g1["variant"].endswith("split-K final") and g1["epilogue_vector"] == 8
    text = medium.cuda.text
    assert "const float4 tkxS0_1_3 = *reinterpret_cast<const float4*>(" in text
    assert "((((0.0f + tkxS0_0_0.x) + tkxS0_0_1.x) + tkxS0_0_2.x) + tkxS0_0_3.x)" in text  # slice order


def test_small_has_vector_sgd_epilogues():
    e = _explore("small")
    vec = {g: n for g, n in e.cuda.notes.items() if n.get("epilogue_vector")}
    assert vec and "const bool tkx_vec = " in e.cuda.text and "make_uint4((unsigned)tkx_float_to_bf16(" in e.cuda.text


@pytest.mark.parametrize("name", ["small", "medium"])
def test_switch_off_gives_the_scalar_text(name):
    on = _explore(name).cuda.text
    off = _explore(name, epilogue_vector=False)
    assert not any(n.get("epilogue_vector") for n in off.cuda.notes.values())
    text = off.cuda.text
    assert "tkx_vec" not in text and "tkxL0_" not in text and "^ ((((" not in text and text != on


def test_misaligned_view_compiles_with_the_scalar_branch():
    e = tkx.explore(linear_step, linear_inputs(offset=1), options=Options(arch="sm_90a", gemm_copy="cp.async"))
    text = e.cuda.text
    assert "const bool tkx_vec = ((((unsigned long long)(in0) | (unsigned long long)(out1)) & 15ULL) == 0ULL);" in text
    assert "tkx_ld_bf16(in0, tkxE0_tkx_e)" in text  # the false branch: scalar loads of the weight
    if nvrtc_available()[0]:
        assert e.cuda.check("sm_90a").spill_bytes == 0


def test_fp32_weights_take_float4_runs():
    e = tkx.explore(linear_step, linear_inputs(dtype=torch.float32), options=Options(arch="sm_90a", fp32_math="tf32"))
    vec = [n for n in e.cuda.notes.values() if n.get("epilogue_vector") == 4]
    assert vec, e.cuda.notes
    assert "const float4 tkxL0_0_0 = " in e.cuda.text and "make_float4(" in e.cuda.text
    if nvrtc_available()[0]:
        assert e.cuda.check("sm_90a").spill_bytes == 0


def test_accesses_and_elements_per_pass():
    tmpl = "\n".join(["const long long tkx_e = ((long long)row * 64 + col);",
                      "const float v = tkx_ld_bf16(in1, tkx_e) + tkx_ld_f32(in2, (tkx_e % 64)) + acc;",
                      "tkx_st_f32(out0, tkx_e, v);  // store v -> output[0]"])
    acc = ev.vector_accesses(tmpl)
    assert acc.reads == (("in1", "bf16"),) and acc.stores == (("out0", "f32"),)  # the bias by column stays scalar
    assert acc.width == 8 and acc.registers_per_element() == 2.5
    assert ev.elements_per_pass(acc, 128, 128) == 32 and ev.elements_per_pass(acc, 16, 128) == 16
    assert ev.elements_per_pass(acc, 12, 128) == 0  # not a whole run per thread
    assert ev.vector_accesses("const long long tkx_e = row;\nout[tkx_e] = acc;") is None


@pytest.mark.parametrize("tn", [64, 128, 256])
def test_c_tile_swizzle_is_a_permutation_without_bank_conflicts(tn):
    """The generated C-tile index (a C expression that is also Python) maps each row onto itself; the
    vector reads (8 threads, one 8-column run each, the two float4 halves) and the accumulator float2
    writes (a half-warp: 4 rows x 4 column pairs) each touch 32 distinct banks."""
    ldc = tn + G.WGMMA_C_PAD
    at = G._cs_at("r", "c", ldc, G._cs_swizzle(tn))

    def index(r, c):
        return eval(at, {}, {"r": r, "c": c})
    for r in range(3):
        assert sorted(index(r, c) for c in range(tn)) == list(range(r * ldc, r * ldc + tn))
    for first in range(0, tn // 8, 8):  # a quarter-warp's runs of 8 columns in one row, each half
        for h in (0, 4):
            banks = [(index(1, 8 * (first + t) + h) + k) % 32 for t in range(8) for k in range(4)]
            assert len(set(banks)) == 32, (first, h)
    for group in range(0, tn, 8):  # float2 writes: lanes 0-15, rows lane / 4, columns group + 2 (lane % 4)
        banks = [(index(lane // 4, group + 2 * (lane % 4)) + k) % 32 for lane in range(16) for k in range(2)]
        assert len(set(banks)) == 32, group
