"""The Hopper wgmma GEMMs on an sm_90 GPU: stand-alone tiles against torch, whole examples verified,
and the loaded cubin's SASS holds HGMMA.

Run with ``pytest -m gpu``; skipped without a compute-capability 9.0 GPU.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):  # pragma: no cover
    pytest.skip("needs an sm_90 (Hopper) GPU", allow_module_level=True)
driver = pytest.importorskip("cuda.bindings.driver")

import tkx  # noqa: E402
import tkx.runtime  # noqa: E402
from tkx.codegen import gemm as G  # noqa: E402
from tkx.codegen import nvrtc as nv  # noqa: E402
from tkx.codegen import testing as T  # noqa: E402
from tkx.examples import get  # noqa: E402
from tkx.options import Options  # noqa: E402
from tkx.target import choose_gemm  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _ok(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def run_tile_kernel(variant, p, a, b, bias, tiles):
    """Compile the stand-alone GEMM kernel for sm_90a and run it on (a, b, bias); returns C (fp32)."""
    tm, tn, tk = tiles
    sa = (p.m * p.k, p.k, 1) if p.a_k_contiguous else (p.m * p.k, 1, p.m)
    sb = (p.k * p.n, p.n, 1) if p.b_n_contiguous else (p.k * p.n, 1, p.k)
    k = T.gemm_kernel(variant, p, a_strides=sa, b_strides=sb, tile_m=tm, tile_n=tn, tile_k=tk)
    report = nv.compile_cuda(k.source, "sm_90a")
    assert report.spill_bytes == 0, report.summary()
    torch.zeros(1, device=DEV)
    module = _ok(driver.cuModuleLoadData(report.cubin), "cuModuleLoadData")
    fn = _ok(driver.cuModuleGetFunction(module, k.name.encode()), "cuModuleGetFunction")
    dyn = k.shared_bytes if k.shared_bytes > 48 * 1024 else 0
    if dyn:
        _ok(driver.cuFuncSetAttribute(fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      dyn), "cuFuncSetAttribute")
    c = torch.empty(p.batch, p.m, p.n, device=DEV, dtype=torch.float32)
    args = ((a.data_ptr(), b.data_ptr(), bias.data_ptr(), c.data_ptr()), (ctypes.c_void_p,) * 4)
    stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
    grid = min(k.work_items, 132)
    _ok(driver.cuLaunchKernel(fn, grid, 1, 1, k.threads, 1, 1, dyn, stream, args, 0), "cuLaunchKernel")
    torch.cuda.synchronize()
    return c, report


CASES = [
    G.GemmProblem(256, 4096, 1024, dtype="bfloat16"),
    G.GemmProblem(256, 1024, 4096, dtype="bfloat16"),
    G.GemmProblem(100, 70, 40, dtype="bfloat16", a_k_contiguous=False, b_n_contiguous=False),
    G.GemmProblem(1024, 512, 64, dtype="bfloat16", a_k_contiguous=False),  # a weight gradient: x^T @ dy
    G.GemmProblem(128, 64, 64, batch=2, dtype="float16", b_n_contiguous=False),
    G.GemmProblem(200, 96, 100, dtype="float32"),
]


@pytest.mark.parametrize("p", CASES, ids=lambda p: f"{p.batch}x{p.m}x{p.n}x{p.k}-{p.dtype}-"
                         f"{'k' if p.a_k_contiguous else 'm'}{'n' if p.b_n_contiguous else 'k'}")
def test_wgmma_tile_matches_torch(p):
    plan = choose_gemm(p, Options(fp32_math="tf32", split_k="off", wgmma_min_macs=0), "sm_90a")
    assert plan.impl.startswith("wgmma"), plan.why
    g = torch.Generator(device=DEV).manual_seed(0)
    dt = TORCH[p.dtype]
    a = torch.randn(p.batch, p.m, p.k, device=DEV, generator=g).to(dt)
    b = torch.randn(p.batch, p.k, p.n, device=DEV, generator=g).to(dt)
    a_mem = a if p.a_k_contiguous else a.transpose(1, 2).contiguous()
    b_mem = b if p.b_n_contiguous else b.transpose(1, 2).contiguous()
    bias = torch.randn(p.n, device=DEV, generator=g)
    c, _ = run_tile_kernel(plan.impl, p, a_mem, b_mem, bias, (plan.tile_m, plan.tile_n, plan.tile_k))
    want = torch.relu(torch.bmm(a.double(), b.double()) + bias.double())
    err = ((c.double() - want).abs().max() / want.abs().max()).item()
    assert err < (5e-3 if p.dtype == "float32" else 1e-5), f"{plan.impl} {plan.tile_m}x{plan.tile_n}: {err:.3g}"


@pytest.mark.parametrize("p", [G.GemmProblem(1024, 512, 256, dtype="bfloat16", a_k_contiguous=False, direct=True),
                               G.GemmProblem(200, 768, 320, dtype="bfloat16", direct=True),
                               G.GemmProblem(256, 512, 192, dtype="bfloat16", b_n_contiguous=False, direct=True)],
                         ids=["tn-1024x512x256", "nn-200x768x320-tails", "nt-256x512x192"])
def test_wgmma_128x256_tile_matches_torch(p):
    """The m64n256 tiles the planner gives directly copied operands (cp.async pipeline, one MMA group
    in flight), with row tails and all three operand layouts."""
    g = torch.Generator(device=DEV).manual_seed(1)
    a = torch.randn(1, p.m, p.k, device=DEV, generator=g).to(torch.bfloat16)
    b = torch.randn(1, p.k, p.n, device=DEV, generator=g).to(torch.bfloat16)
    a_mem = a if p.a_k_contiguous else a.transpose(1, 2).contiguous()
    b_mem = b if p.b_n_contiguous else b.transpose(1, 2).contiguous()
    bias = torch.randn(p.n, device=DEV, generator=g)
    c, report = run_tile_kernel("wgmma_bf16", p, a_mem, b_mem, bias, (128, 256, 64))
    want = torch.relu(torch.bmm(a.double(), b.double()) + bias.double())
    err = ((c.double() - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"128x256: {err:.3g} ({report.summary()})"


@pytest.mark.parametrize("split", ["auto", 4])
@pytest.mark.parametrize("name", ["small", "medium", "mixed_precision", "online"])
def test_examples_verify_with_wgmma(name, split):
    ex = get(name)
    # wgmma_min_macs=0: mixed_precision's tiny GEMMs take wgmma too
    options = Options(arch="sm_90a", split_k=split, fp32_math="tf32" if split == 4 else "simt", wgmma_min_macs=0)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), options, name=name, loss=ex.loss_output)
    if split == 4 and name != "online":  # online's tiled GEMMs are fp32 with K = 8 or too narrow for wgmma
        assert any(g.plan.get("split_k", 1) > 1 for g in runner.source.schedule.groups.values()
                   if g.kind in ("gemm", "gemm_partial"))
    gemms = [g for g in runner.source.schedule.groups.values() if g.kind == "gemm"]
    assert gemms and any(g.plan.impl.startswith("wgmma") for g in gemms) or ex.name == "online"
    v = runner.verify(seeds=(0, 1), make_inputs=ex.make_inputs)
    assert v.passed, v.summary()


def test_ragged_sgd_step_verifies_with_the_batched_guarded_epilogue():
    """A user-style step whose GEMMs cross the tile edges (batch 50, 96 -> 130 -> 10, bf16 weights, SGD):
    the epilogue's elements outside C are clamped and not stored; it verifies against eager, and the
    inputs are unchanged."""
    import torch.nn.functional as F

    def loss_fn(params, x, y):
        h = torch.relu(x @ params["w1"] + params["b1"])
        return F.mse_loss(h @ params["w2"] + params["b2"], y)

    def step(params, x, y):
        grads, loss = torch.func.grad_and_value(loss_fn)(params, x, y)
        return loss, {k: p - 0.05 * grads[k] for k, p in params.items()}

    def make_inputs(seed=0, device="cuda"):
        g = torch.Generator(device="cpu").manual_seed(seed)
        rnd = lambda *s: (torch.randn(*s, generator=g) / 4).to(torch.bfloat16).to(device)  # noqa: E731
        return ({"w1": rnd(96, 130), "b1": rnd(130), "w2": rnd(130, 10), "b2": rnd(10)}, rnd(50, 96), rnd(50, 10))

    inputs = make_inputs()
    before = [t.clone() for t in (inputs[1], inputs[2], *inputs[0].values())]
    runner = tkx.runtime.build(step, inputs, Options(arch="sm_90a", wgmma_min_macs=0), name="ragged_sgd", loss=0)
    assert any(g.plan.impl.startswith("wgmma") for g in runner.source.schedule.groups.values() if g.kind == "gemm")
    text = runner.source.text
    assert "tkxE0_in" in text
    v = runner.verify(seeds=(0, 1), make_inputs=make_inputs)
    assert v.passed, v.summary()
    runner(*inputs)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(before, (inputs[1], inputs[2], *inputs[0].values())))


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("name", ["small", "medium"])
def test_last_slice_split_k_matches_the_stage_final_bit_for_bit(name):
    """The split-K final in the last slice of each tile (``Options.split_k_final``) gives the bits of
    the separate final stage in every launch, and leaves every tile arrival counter (sync words 12 on) at 0
    after launches and CUDA-graph replays."""
    ex = get(name)
    results = {}
    for last in (False, True):
        options = Options(arch="sm_90a", split_k=4, split_k_final="last-slice" if last else "stage")
        r = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), options,
                              name=f"{name}_last{int(last)}", loss=ex.loss_output)
        split = [g for g in r.source.schedule.groups.values() if g.kind == "gemm" and g.plan.split_k > 1]
        assert split and all(g.plan.split_final == ("last-slice" if last else "stage") for g in split)
        runs = []
        for _ in range(3):  # every launch from the same inputs
            flat = r.flatten(ex.make_inputs(0, "cuda"))
            outs = r.run_flat(flat)
            runs.append([t.clone() for t in outs] + [flat[u.input_index].clone() for u in r.program.updates])
        torch.cuda.synchronize()
        if last:
            assert r.source.sync_words == 12 + sum(g.plan.tiles for g in split)
            assert int(r._words.cpu()[12:].abs().sum()) == 0, "a tile arrival counter was left set"
            graph = r.capture_graph(*ex.make_inputs(0, "cuda"))
            for _ in range(4):
                graph.replay()
            torch.cuda.synchronize()
            graph.check_status()
            assert int(graph._words.cpu()[12:].abs().sum()) == 0, "a graph replay left a tile counter set"
        for later in runs[1:]:
            assert all(_same_bits(a, b) for a, b in zip(runs[0], later)), "launches differ"
        results[last] = runs[0]
    assert all(_same_bits(a, b) for a, b in zip(results[False], results[True])), \
        "the last-slice final's bits differ from the separate final stage's"


@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump not installed")
def test_loaded_cubin_has_hgmma(tmp_path):
    ex = get("small")
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), Options(), name="small", loss=ex.loss_output)
    assert runner.kernel.binary.arch == "sm_90a"
    path = tmp_path / "small.cubin"
    path.write_bytes(runner.kernel.binary.cubin)
    sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    assert "HGMMA" in sass, "no HGMMA instruction in the bf16 megakernel's SASS"
