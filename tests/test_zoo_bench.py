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
                   "--repeats", "1", "--out", str(out), "--cache", str(tmp_path / "cache"), "--commit", "abc1234",
                   "--forced"])
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
    # --forced: every forced choice has a time (a kernel identical to auto's takes auto's), the split_k ones too
    assert set(row["forced_us"]) == {*mod.FORCED, *mod.SPLIT_K} and all(v > 0 for v in row["forced_us"].values())
    assert all(why == "same kernel as tkx:auto" for why in row["forced_skipped"].values())
    assert row["forced_us"]["barrier-grid"] == row["tkx_us"] and "barrier-grid" in row["forced_skipped"]
    # where the time goes, from the (dry run: predicted) timeline written as the trace calibrate reads
    b = row["where_the_time_goes"]
    parts = ("gemm_us", "other_us", "sync_us", "idle_us")
    assert b["source"] == "predicted timeline" and sum(b[k] for k in parts) == pytest.approx(b["critical_path_us"],
                                                                                           abs=0.01)
    assert b["gemm_us"] > 0 and b["sync_us"] > 0 and row["what_would_close"].split(":")[0].endswith("-bound")
    assert row["trace"] == "traces/trace-linear_regression.json.gz" and (out / row["trace"]).is_file()
    assert "## Where the time goes" in page and row["what_would_close"] in page
    cal = load_script("calibrate", "tkx_calibrate_zoo_bench")
    times = cal.zoo_times(run)["linear_regression"]
    assert set(times) == set(mod.FORCED)  # the split_k choices are reported, not fitted
    assert set(cal.split_k_times(run)["linear_regression"]["measured_us"]) == {"auto", *mod.SPLIT_K}
    structs = cal.structures(["linear_regression"], run["arch"])
    task, used = cal.task_us_from_traces(out / "traces", structs, __import__("tkx").costs.constants())
    assert used > 0 and task > 0


def test_close_leaves_out_what_the_model_predicts_far_slower():
    from tkx.bench import zoo

    warmed = [{"kind": "graph", "name": "x", "what": "auto", "ok": True, "hash": "a", "predicted_us": 10.0},
              {"kind": "tkx", "name": "x", "what": "barrier-grid", "ok": True, "hash": "a", "predicted_us": 10.0},
              {"kind": "tkx", "name": "x", "what": "barrier-block", "ok": True, "hash": "b", "predicted_us": 40.0},
              {"kind": "tkx", "name": "x", "what": "counters-grid", "ok": True, "hash": "c", "predicted_us": 12.0},
              {"kind": "tkx", "name": "x", "what": "split_k-2", "ok": False, "error": "boom"}]
    variants = dict.fromkeys(("auto", "barrier-grid", "barrier-block", "counters-grid", "split_k-2"), {})
    assert zoo.forced_to_time(warmed, ["x"], variants, "auto") == {"x": {"barrier-grid": "same kernel as tkx:auto"}}
    skip = zoo.forced_to_time(warmed, ["x"], variants, "auto", close=1.5)["x"]
    assert set(skip) == {"barrier-grid", "barrier-block"} and "--close" in skip["barrier-block"]


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
