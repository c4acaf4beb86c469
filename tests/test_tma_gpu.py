"""The TMA (bulk tensor copy + mbarrier) wgmma pipeline on an sm_90 GPU: one-GEMM steps in every
operand layout (ragged sizes: the copy engine zero-fills outside the matrix) against float64 torch,
the MLP examples (split-K auto and forced) and the transformer blocks verified with
``Options(gemm_copy="tma")``, a CUDA-graph replay that reuses the encoded maps, and the loaded
cubin's SASS holds the TMA load (UTMALDG). The transformer-block cases were added after the H200 run.

Run with ``pytest -m gpu``; skipped without a compute-capability 9.0 GPU.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):  # pragma: no cover
    pytest.skip("needs an sm_90 (Hopper) GPU", allow_module_level=True)

import tkx  # noqa: E402
import tkx.runtime  # noqa: E402
from tkx.examples import get  # noqa: E402
from tkx.options import Options  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
TMA = Options(arch="sm_90a", gemm_copy="tma", split_k="off")

# (m, n, k, A stored transposed, B stored transposed)
SHAPES = [(256, 512, 256, False, False), (200, 136, 192, False, True), (256, 256, 128, True, False),
          (192, 320, 72, True, True), (64, 1024, 512, False, False)]


def _step(a_t: bool, b_t: bool):
    def step(a, b, bias):
        return torch.relu((a.t() if a_t else a) @ (b.t() if b_t else b) + bias)
    return step


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}-{'T' if s[3] else 'N'}"
                         f"{'T' if s[4] else 'N'}")
def test_tma_gemm_step_matches_torch(shape):
    m, n, k, a_t, b_t = shape
    g = torch.Generator(device=DEV).manual_seed(1)
    a = torch.randn((k, m) if a_t else (m, k), device=DEV, generator=g).bfloat16()
    b = torch.randn((n, k) if b_t else (k, n), device=DEV, generator=g).bfloat16()
    bias = torch.randn(n, device=DEV, generator=g).bfloat16()
    step = _step(a_t, b_t)
    runner = tkx.runtime.build(step, (a, b, bias), TMA, name="tma_gemm")
    got = runner(a, b, bias)
    assert runner.tensor_maps is not None and runner.tensor_maps.encodes >= 1, runner.source.notes
    want = step(a.double(), b.double(), bias.double())
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err < 1e-2, f"{shape}: relative error {err:.3g}"
    # fresh inputs: the maps follow the new addresses
    runner(a, b, bias)
    a2, b2 = a.clone() * 0.5, b.clone()
    got2 = runner(a2, b2, bias)
    want2 = step(a2.double(), b2.double(), bias.double())
    assert ((got2.double() - want2).norm() / want2.norm()).item() < 1e-2
    assert runner.tensor_maps.encodes >= 2


@pytest.mark.parametrize("split", ["auto", 4])
@pytest.mark.parametrize("name", ["small", "medium"])
def test_examples_verify_with_tma(name, split):
    ex = get(name)
    options = Options(arch="sm_90a", gemm_copy="tma", split_k=split)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), options, name=name, loss=ex.loss_output)
    assert runner.tensor_maps is not None, "no GEMM of the example took the TMA path"
    v = runner.verify(seeds=(0, 1), make_inputs=ex.make_inputs)
    assert v.passed, v.summary()


@pytest.mark.parametrize("name", ["gpt_block", "llama_block"])
def test_transformer_blocks_verify_with_tma(name):
    """The blocks' tiny GEMMs go to wmma by default (``Options.wgmma_min_macs``); with the threshold at 0 they
    take wgmma with TMA copies, and verify."""
    ex = get(name)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), Options(gemm_copy="tma", wgmma_min_macs=0),
                               name=name,
                               loss=ex.loss_output)
    assert runner.tensor_maps is not None, "no GEMM of the block took the TMA path"
    v = runner.verify(seeds=(0, 1), make_inputs=ex.make_inputs)
    assert v.passed, v.summary()


def test_graph_replay_with_tma_matches_a_plain_call():
    ex = get("small")
    inputs = ex.make_inputs(3, "cuda")
    runner = tkx.runtime.build(ex.step_fn, inputs, Options(gemm_copy="tma"), name="small", loss=ex.loss_output)
    want = runner(*inputs)
    graph = runner.capture_graph(*inputs)
    got = graph.replay()
    torch.cuda.synchronize()
    graph.check_status()
    assert torch.equal(got[0], want[0])
    for k in want[1]:
        assert torch.equal(got[1][k], want[1][k]), k


@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump not installed")
def test_loaded_cubin_has_tma_loads(tmp_path):
    ex = get("small")
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, "cuda"), Options(gemm_copy="tma"), name="small",
                               loss=ex.loss_output)
    path = tmp_path / "small.cubin"
    path.write_bytes(runner.kernel.binary.cubin)
    sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    assert "UTMALDG" in sass and "HGMMA" in sass, "no TMA load or HGMMA in the SASS"
