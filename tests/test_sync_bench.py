"""scripts/sync-bench without a GPU: its variants are valid Options, and the summary table computes the
ratios the issue asks for (auto over the best forced choice, best tkx over the best torch.compile)."""

from __future__ import annotations

import os
import sys

import tkx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from script_module import load_script  # noqa: E402


def _script():
    return load_script("sync-bench", "tkx_sync_bench_script")


def test_variants_are_valid_options():
    mod = _script()
    assert {"barrier-grid", "barrier-block", "counters-grid", "auto"} <= set(mod.VARIANTS)
    for kw in mod.VARIANTS.values():
        tkx.Options(**kw)


def test_summary_ratios_and_failed_candidates():
    mod = _script()
    cands = {"eager": {"us": 50.0}, "eager+cudagraph": {"us": 30.0}, "inductor": {"us": 20.0},
             "inductor-max-autotune": {"us": 16.0}, "tkx:barrier-grid": {"us": 12.0, "verified": True},
             "tkx:barrier-block": {"us": 10.0, "verified": True},
             "tkx:counters-grid": {"us": 8.0, "verified": False},  # wrong results never count as fastest
             "tkx:auto": {"us": 11.0, "verified": True}}
    rows, table = mod.summarize({"x": {"candidates": cands}, "y": {"error": "boom"}})
    r = rows["x"]
    assert r["best_forced_us"] == 10.0 and r["best_compile_us"] == 16.0 and r["best_compile"] == "inductor-max-autotune"
    assert abs(r["auto_over_best_forced"] - 1.1) < 1e-9 and abs(r["best_tkx_over_best_compile"] - 10 / 16) < 1e-9
    assert r["failed"] == ["tkx:counters-grid"]
    assert "| x | 12.0 | 10.0 | - | 11.0 | 10.0 | 16.0 | 1.10 | 0.62 | 30.0 |" in table
    assert "| y | error: boom" in table
