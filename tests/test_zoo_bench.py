"""scripts/zoo-bench on the CPU: the dry run writes docs/results' format (per example tkx, best torch.compile,
graph of kernels and speed of light) and its page; the published row is computed from the candidates."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from script_module import load_script  # noqa: E402

KEYS = ("tkx_us", "best_torch_compile_us", "graph_of_kernels_us", "sol_us")


def _script():
    return load_script("zoo-bench", "tkx_zoo_bench_script")


def test_dry_run_writes_the_results_json_and_its_page(tmp_path):
    mod = _script()
    out = tmp_path / "out"
    rc = mod.main(["--dry-run", "--no-torch-compile", "--examples", "linear_regression", "--workers", "1",
                   "--repeats", "1", "--out", str(out), "--cache", str(tmp_path / "cache"), "--commit", "abc1234"])
    assert rc == 0
    run = json.loads((out / "zoo-h200.json").read_text())
    for key in ("date", "machine", "torch", "commit", "command"):
        assert isinstance(run[key], str) and run[key]
    assert run["benchmark"] == "zoo-h200" and run["commit"] == "abc1234" and run["complete"] and run["dry_run"]
    row = run["results"]["linear_regression"]
    assert all(k in row for k in KEYS)
    assert row["tkx_us"] > 0 and row["graph_of_kernels_us"] > 0 and row["sol_us"] > 0
    assert row["kernels"] >= 2 and row["errors"] == {} and row["best_torch_compile_us"] is None
    page = (out / "zoo-h200.md").read_text()
    assert "| linear_regression |" in page and "graph of kernels µs" in page and "SOL fraction" in page
    assert "`abc1234`" in page


def test_row_from_candidates():
    mod = _script()
    cands = {"eager": {"us": 900.0}, "eager+cudagraph": {"us": 40.0}, "inductor": {"us": 20.0},
             "inductor-max-autotune": {"us": 16.0},
             "tkx:auto": {"us": 8.0, "verified": True, "mode": "grid", "sync": "barrier", "stages": 4},
             "tkx:graph-of-kernels": {"us": 12.0, "verified": True, "kernels": 5},
             "tkx:barrier-block": {"us": None, "error": "KernelLoadError: boom"}}
    row = mod.example_row({"candidates": cands, "sol_us": 2.0}, ["inductor", "inductor-max-autotune"])
    assert row["tkx_us"] == 8.0 and row["best_torch_compile_us"] == 16.0
    assert row["best_torch_compile"] == "inductor-max-autotune" and row["graph_of_kernels_us"] == 12.0
    assert row["sol_fraction"] == pytest.approx(0.25) and row["tkx_over_best_torch_compile"] == pytest.approx(0.5)
    assert row["one_kernel_saves_us"] == pytest.approx(4.0) and row["kernels"] == 5
    assert row["errors"] == {"tkx:barrier-block": "KernelLoadError: boom"}
    cands["tkx:auto"]["verified"] = False  # wrong numbers are never published as a time
    assert mod.example_row({"candidates": cands}, ["inductor"])["tkx_us"] is None
