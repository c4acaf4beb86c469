"""The vectorized wgmma tile epilogue (``Options.epilogue_vector``) on an sm_90 GPU: the same bits as the
scalar epilogue, and verified against eager, for small, medium, a step whose weight is a view 2 bytes past a
16-byte boundary (the runtime alignment test takes the scalar branch) and an fp32 weight + bias step (float4
runs, tf32 wgmma).

Run with ``pytest -m gpu``; skipped without a compute-capability 9.0 GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):  # pragma: no cover
    pytest.skip("needs an sm_90 (Hopper) GPU", allow_module_level=True)

from test_epilogue_vector import linear_inputs, linear_step  # noqa: E402

import tkx  # noqa: E402
import tkx.runtime  # noqa: E402
from tkx.examples import get  # noqa: E402
from tkx.options import Options  # noqa: E402

pytestmark = pytest.mark.gpu


def _case(name):
    if name in ("small", "medium"):
        ex = get(name)
        return ex.step_fn, ex.make_inputs, Options(arch="sm_90a"), ex.loss_output
    if name == "misaligned":
        def make(seed=0, device="cuda"):
            return linear_inputs(seed, device, offset=1)
        return linear_step, make, Options(arch="sm_90a", gemm_copy="cp.async"), None
    def make32(seed=0, device="cuda"):
        return linear_inputs(seed, device, dtype=torch.float32)
    return linear_step, make32, Options(arch="sm_90a", fp32_math="tf32"), None


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("name", ["small", "medium", "misaligned", "fp32_bias"])
def test_vector_epilogue_has_the_scalar_bits_and_verifies(name):
    step, make, options, loss = _case(name)
    results = {}
    for on in (False, True):
        r = tkx.runtime.build(step, make(0, "cuda"), options.replace(epilogue_vector=on), name=f"{name}_vec{int(on)}",
                              loss=loss)
        vec = [g for g, n in r.source.notes.items() if n.get("epilogue_vector")]
        assert bool(vec) == on, r.source.notes
        flat = r.flatten(make(0, "cuda"))
        if name == "misaligned":  # the weight really is 2 bytes past a 16-byte boundary
            assert flat[0].data_ptr() % 16 == 2
        outs = r.run_flat(flat)
        torch.cuda.synchronize()
        results[on] = [t.clone() for t in outs] + [flat[u.input_index].clone() for u in r.program.updates]
        if on:
            v = r.verify(seeds=(0, 1), make_inputs=make)
            assert v.passed, v.summary()
    assert len(results[True]) == len(results[False])
    for i, (a, b) in enumerate(zip(results[False], results[True])):
        assert _same_bits(a, b), f"{name}: output/update {i} differs from the scalar epilogue's bits"
