"""scripts/calibrate without a GPU: every micro-kernel it times compiles with NVRTC (one translation unit),
and the JSON it writes is what tkx.costs reads for the mode and sync choices."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tkx import costs
from tkx.codegen.nvrtc import nvrtc_available

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from script_module import load_script  # noqa: E402


def _script():
    return load_script("calibrate", "tkx_calibrate_script")


def test_micro_kernels_cover_every_measured_constant():
    mk = _script().micro_kernels(132)
    assert {"grid_barrier_132", "grid_barrier_8", "block_barrier", "handoff", "wait", "fma", "copy", "empty"} <= set(mk)
    for name in mk:
        if not name.endswith("_empty") and name not in ("fma", "copy", "empty"):
            assert name + "_empty" in mk, name  # each per-round figure subtracts its empty twin
    src = _script().source(*mk["handoff"][:2], mode="grid")
    assert src.launch.config.mode == "grid" and src.launch.kernel_name == "tkx_step"


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC")
def test_every_micro_kernel_compiles(tmp_path, monkeypatch):
    from tkx.runtime import compile_cubin

    monkeypatch.setenv("TKX_CACHE_DIR", str(tmp_path))
    mod = _script()
    kernels = []
    for i, (body, _, _) in enumerate(mod.micro_kernels(132).values()):
        kernels.append(mod.HEAD.replace("void tkx_step(", f"void tkx_step_{i}(") + "\n" + body + "\n}")
    text = "\n\n".join([mod.PRELUDE, mod.COUNTERS, *kernels]) + "\n"
    binary = compile_cubin(text, "sm_90", cache=False)
    assert binary.cubin and binary.report.spill_bytes == 0


def test_a_calibrated_json_moves_the_mode_choice(tmp_path, monkeypatch):
    import tkx

    ex = tkx.examples.get("digits_mlp")
    path = tmp_path / "costs.json"
    fast_grid = dict(costs.DEFAULTS, grid_barrier_us=0.001, sm_flops_per_us=1e3, sm_bytes_per_us=1e2)
    path.write_text(json.dumps({"device": "test", "constants": fast_grid}))
    monkeypatch.setenv("TKX_COSTS", str(path))
    s = tkx.explore(ex.step_fn, ex.example_inputs).schedule
    assert s.mode == "grid" and "grid is cheaper" in s.mode_reason, s.mode_reason
    assert costs.source() == str(path)
