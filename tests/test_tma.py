"""The TMA (bulk tensor copy) wgmma pipeline and the batched GEMM epilogue, checked without a GPU.

``Options(gemm_copy="tma")``: every pipelined wgmma GEMM copies its operand tiles with
``cp.async.bulk.tensor.2d`` completing on mbarriers, the launch contract lists one tensor map per
operand box (buffer, extents, stride, box, 128-byte swizzle) and the kernel takes them through a
``tmaps`` parameter; the kernel compiles for sm_90a without spills. The default (``"auto"``) takes
TMA too; ``gemm_copy="cp.async"`` keeps cp.async and no tensor maps. The runtime's argument
packing and the map cache are checked with a fake encoder. Also: the pipeline's one MMA group in
flight, the float2 C tile, and the planner's 128x256 tiles for directly copied operands.
"""

from __future__ import annotations

import pytest
import torch

import tkx
from tkx.codegen import abi
from tkx.codegen import gemm as G
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get
from tkx.options import Options
from tkx.runtime import tma as rtma
from tkx.runtime.runner import pack_args


def _cuda(name: str, **opts):
    ex = get(name)
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0, "cpu"), options=Options(arch="sm_90a", **opts),
                      loss=ex.loss_output)
    return exp.cuda


@pytest.fixture(scope="module")
def small_tma():
    return _cuda("small", gemm_copy="tma")


def test_tma_kernel_text_and_contract(small_tma):
    src = small_tma
    text = src.text
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in text
    assert "mbarrier.arrive.expect_tx" in text and "mbarrier.try_wait.parity" in text
    assert "cp.async.cg.shared.global" not in text  # every pipelined GEMM of small takes TMA
    maps = src.launch.tensor_maps
    assert maps, "no tensor maps in the launch contract"
    assert [p.role for p in src.launch.params][-1] == "tensormaps"
    assert "const unsigned char* __restrict__ tmaps" in text
    gemms = [g for g in src.schedule.groups.values() if g.kind in ("gemm", "gemm_partial")
             and g.plan.impl.startswith("wgmma") and not (g.kind == "gemm" and g.plan.split_k > 1)]
    assert gemms and all(src.notes[g.id].get("copies") == "tma" for g in gemms), \
        {g.id: src.notes[g.id] for g in gemms}
    for m in maps:
        assert m.role in ("input", "output", "arena") and m.dtype == "bfloat16" and m.swizzle == 128
        assert m.stride_bytes % 16 == 0 and m.offset_bytes % 16 == 0
        assert m.box[0] * 2 == 128 and m.box[1] <= 256, m  # one 128-byte swizzle row inner
        assert m.stride_bytes >= m.dims[0] * 2
        if m.role == "input":
            shape = src.schedule.program.inputs[m.index].value.shape
            assert sorted(m.dims) == sorted(shape[-2:]), (m, shape)
    # the maps are distinct (one per buffer view and box), indices in the text exist
    assert len(set(maps)) == len(maps)
    assert f"tmaps + {(len(maps) - 1) * 128})" in text


def test_cp_async_on_request_and_tma_by_default():
    src = _cuda("small", gemm_copy="cp.async")
    assert not src.launch.tensor_maps
    assert "tmaps" not in [p.name for p in src.launch.params]
    assert "cp.async.bulk.tensor" not in src.text and "cp.async.cg.shared.global" in src.text
    auto = _cuda("small")  # gemm_copy="auto": the copy engine wherever it applies (measured faster on the H200)
    assert auto.launch.tensor_maps and "cp.async.bulk.tensor" in auto.text
    assert auto.text == _cuda("small", gemm_copy="tma").text


@pytest.mark.parametrize("copy", ["cp.async", "tma"])
def test_pipeline_keeps_one_mma_group_in_flight(copy):
    """Each k-tile's MMAs are issued before the wait for the previous k-tile's (wait_group 1); the
    stage refilled after the barrier is the one k-tile kt - 2 used, so S - 2 k-tiles are copied ahead."""
    src = _cuda("medium", gemm_copy=copy)
    g0 = src.notes["g0"]
    assert g0["mma_in_flight"] == 1 and g0["stages"] == 8, g0
    text = src.text[src.text.index("stage 0: g0"):src.text.index("stage 1:")]
    loop = text[text.index("for (int kt = 0"):]
    loop = loop[:loop.index("wgmma.wait_group.sync.aligned 0")]
    assert "wgmma.wait_group.sync.aligned 1" in loop
    assert loop.index("wgmma.commit_group") < loop.index("issue((kt + 6) % 8, k0 + 6 * TK)") \
        < loop.index("wgmma.wait_group.sync.aligned 1")
    assert "prologue: the first 6 k-tiles in flight" in text
    if copy == "cp.async":  # k-tile kt landed: the groups committed after it (kt + 1 .. kt + 5) may still fly
        assert 'cp.async.wait_group 5;' in loop


def test_pipeline_without_mma_in_flight_is_the_serial_one():
    src = _cuda("medium", gemm_copy="cp.async", wgmma_in_flight=0)
    text = src.text[src.text.index("stage 0: g0"):src.text.index("stage 1:")]
    assert "wgmma.wait_group.sync.aligned 1" not in text and src.notes["g0"]["mma_in_flight"] == 0
    assert "cp.async.wait_group 6;" in text and "issue((kt + 7) % 8, k0 + 7 * TK)" in text


def test_accumulators_reach_shared_memory_as_float2():
    text = _cuda("medium").text
    at = G._cs_at("r", "c", 128 + G.WGMMA_C_PAD, G._cs_swizzle(128))  # column bit 2 ^= bit 5 with the vector epilogue
    assert f"Cs[{at}]) = make_float2(d[j], d[j + 1]);" in text


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
def test_tma_kernel_compiles_for_sm90a_without_spills(small_tma):
    from tkx.runtime.kernel import compile_cubin

    b = compile_cubin(small_tma, "sm_90a", cache=False)
    assert b.report.spill_store_bytes == 0 and b.report.spill_load_bytes == 0, b.report
    assert b.report.stack_bytes == 0


def test_stage_count_follows_the_shared_budget():
    assert G.wgmma_stages(24576, 16, None) == G.WGMMA_STAGES
    assert G.wgmma_stages(24576, 16, 227 * 1024) == 8  # 8 x 24 KiB fit in 227 KiB
    assert G.wgmma_stages(32768, 16, 227 * 1024) == 7
    assert G.wgmma_stages(32768, 3, 227 * 1024) == 4  # K has 3 steps: all in flight, no more
    assert G.wgmma_stages(32768, 16, 100 * 1024) == 3
    assert G.wgmma_stages(65536, 16, 64 * 1024) == 2  # never fewer than double buffering


def test_batched_epilogue_moves_loads_before_stores():
    def epi(bat, row, col, acc):
        return "\n".join([f"const long long tkx_e = ((long long){row} * 64 + {col});",
                          f"const float v_mm = {acc};  // mm: mm",
                          "const float v_add = v_mm + tkx_ld_bf16(in1, tkx_e);  // add: add",
                          "tkx_st_bf16(out0, tkx_e, v_add);  // store add -> output[0]"])
    comp, stores = G._batched_epilogue(epi, 4)
    assert len(comp) == 12 and len(stores) == 4
    assert all(s.startswith("tkx_st_bf16(out0, tkxE") for s in stores)
    assert "tkxE3_v_add = tkxE3_v_mm + tkx_ld_bf16(in1, tkxE3_tkx_e)" in comp[-1]
    assert comp[1].endswith("// mm: mm") and "//" not in comp[4]  # element 0 keeps the op comments
    # a statement that is not a declaration or a store: keep the rolled loop
    assert G._batched_epilogue(lambda b, r, c, a: f"if ({r} < 3) x[{c}] = {a};", 4) is None


def test_batched_epilogue_in_the_tile_code():
    p = G.GemmProblem(256, 256, 128, dtype="bfloat16")

    def ld(b, r, c):
        return f"tkx_ld_bf16(A, {r} * 128 + {c})"

    def epi(b, r, c, acc):
        return f"const long long tkx_e = ((long long){r} * 256 + {c});\ntkx_st_f32(C, tkx_e, {acc});"
    code = G.emit_gemm("wgmma_bf16", p, ld, ld, epi, tile=(128, 128, 64),
                       ptr_a=lambda b, r, k: f"(A + {r} * 128 + {k})", ptr_b=lambda b, k, c: f"(B + {k} * 256 + {c})")
    assert f"{G.WGMMA_EPILOGUE_BATCH} elements per thread and pass" in code.code
    ragged = G.GemmProblem(200, 256, 128, dtype="bfloat16")  # row guards: clamped rows, stores only inside C
    code = G.emit_gemm("wgmma_bf16", ragged, ld, ld, epi, tile=(128, 128, 64),
                       ptr_a=lambda b, r, k: f"(A + {r} * 128 + {k})", ptr_b=lambda b, k, c: f"(B + {k} * 256 + {c})")
    assert f"{G.WGMMA_EPILOGUE_BATCH} elements per thread and pass" in code.code and "kept rolled" not in code.code
    assert "const bool tkxE0_in = row0 + tkxE0_e / 128 < M;" in code.code
    assert "tkxE0_row = min(row0 + tkxE0_e / 128, M - 1)" in code.code and "min(col0" not in code.code
    assert "if (tkxE3_in) tkx_st_f32(C, tkxE3_tkx_e, tkxE3_acc);" in code.code
    both = G.GemmProblem(200, 250, 128, dtype="bfloat16")  # rows and columns cross the edge
    code = G.emit_gemm("wgmma_bf16", both, ld, ld, epi, tile=(128, 128, 64))
    assert "const bool tkxE0_in = row0 + tkxE0_e / 128 < M && col0 + tkxE0_e % 128 < N;" in code.code


def test_pack_args_passes_the_tensor_maps():
    params = [abi.Param("in0", "const float*", "input", 0), abi.Param("arena", "unsigned char*", "arena"),
              abi.Param("tmaps", "const unsigned char*", "tensormaps")]
    assert pack_args(params, [10], [], 20, 30, 40, tensormaps=50) == [10, 20, 50]
    with pytest.raises(tkx.TkxError, match="tensor maps"):
        pack_args(params, [10], [], 20, 30, 40)


def test_tensor_map_cache_encodes_once_per_address_set(monkeypatch):
    specs = (abi.TensorMapSpec("input", 0, 0, "bfloat16", (64, 128), 128, (64, 64)),
             abi.TensorMapSpec("arena", -1, 4096, "bfloat16", (128, 64), 256, (64, 64)))
    calls = []

    def fake_encode(spec, base):
        calls.append((spec, base))
        return bytes([len(calls)]) * rtma.MAP_BYTES
    monkeypatch.setattr(rtma, "encode", fake_encode)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    maps = rtma.TensorMaps(specs, torch.device("cpu"))
    first = maps.buffer([1 << 20], [], 1 << 30)
    assert first.numel() == 256 and [b for _, b in calls] == [1 << 20, 1 << 30]
    again = maps.buffer([1 << 20], [], 1 << 30)
    assert again is first and maps.encodes == 1
    maps.buffer([1 << 21], [], 1 << 30)
    assert maps.encodes == 2


def test_misaligned_operand_is_refused_with_advice():
    spec = abi.TensorMapSpec("input", 0, 2, "bfloat16", (64, 64), 128, (64, 64))
    with pytest.raises(rtma.TensorMapError, match="gemm_copy='cp.async'"):
        rtma.encode(spec, 1 << 20)


def test_wgmma_declines_when_no_tile_fits_the_registers():
    from tkx.target import GemmProblem, choose_gemm

    plan = choose_gemm(GemmProblem(256, 4096, 1024, dtype="bfloat16"), Options(threads_per_block=512), "sm_90a")
    assert not plan.impl.startswith("wgmma") and "no tile of 512 threads fits" in plan.why


def test_planner_takes_128x256_tiles_only_for_directly_copied_operands():
    from tkx.target import GemmProblem, choose_gemm

    # a K = 256 weight gradient (A transposed): 128 tiles of 128x256 are one wave on 132 SMs
    direct = choose_gemm(GemmProblem(4096, 1024, 256, dtype="bfloat16", a_k_contiguous=False, direct=True),
                         Options(), "sm_90a")
    assert (direct.tile_m, direct.tile_n) == (128, 256), direct
    # operands recomputed inline are staged through registers: no room beside 128 accumulators
    staged = choose_gemm(GemmProblem(4096, 1024, 256, dtype="bfloat16", a_k_contiguous=False), Options(), "sm_90a")
    assert (staged.tile_m, staged.tile_n) == (128, 128), staged
    # K not a multiple of 8: no 16-byte vectors, no copy engine
    odd = choose_gemm(GemmProblem(4096, 1024, 250, dtype="bfloat16", a_k_contiguous=False, direct=True),
                      Options(), "sm_90a")
    assert odd.tile_n <= 128
    # medium: the weight gradients take 128x256, the 256-row products keep 64x128 on 128 SMs
    sched = tkx.explore(get("medium").step_fn, get("medium").make_inputs(0, "cpu"), options=Options(arch="sm_90a"),
                        loss=get("medium").loss_output).schedule
    tiles = {g.id: (g.plan.tile_m, g.plan.tile_n) for g in sched.groups.values() if g.kind == "gemm"}
    assert tiles["g4"] == tiles["g7"] == (128, 256) and tiles["g0"] == tiles["g5"] == (64, 128), tiles


def test_an_operand_cast_inline_keeps_register_sized_tiles():
    """A cast recomputed in the operand load (rule cheap-operand) is staged through registers, so the
    schedule does not call the operands direct and the tile stays at 128 columns; stored operands of the
    same GEMM take 128x256 and the copy engine."""
    x, w = torch.randn(256, 4096), torch.randn(256, 1024).to(torch.bfloat16)
    plans = {}
    for name, step in (("cast", lambda x, w: x.to(torch.bfloat16).t() @ w),
                       ("stored", lambda x, w: x.t() @ w)):
        xin = x if name == "cast" else x.to(torch.bfloat16)
        exp = tkx.explore(step, (xin, w), options=Options(arch="sm_90a"))
        (g,) = [g for g in exp.schedule.groups.values() if g.kind == "gemm"]
        plans[name] = ((g.plan.tile_m, g.plan.tile_n), exp.cuda.notes[g.id].get("copies"), bool(exp.schedule.inlined))
    assert plans["cast"] == ((128, 128), None, True), plans  # register-staged: no copies note
    assert plans["stored"] == ((128, 256), "tma", False), plans
