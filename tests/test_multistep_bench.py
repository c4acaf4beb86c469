"""scripts/multistep-bench without a GPU (--dry-run): it writes the JSON the results page is rendered from,
with tkx's and the baseline's µs per step and the equality with eager per example and K."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from script_module import load_script  # noqa: E402


def _dry_run(tmp_path, ks: str):
    """(the script module, the JSON's path, the run) of a --dry-run on linear_regression at ``ks``."""
    bench = load_script("multistep-bench", "tkx_multistep_bench_script")
    out = tmp_path / "multistep-h200.json"
    assert bench.main(["--dry-run", "--examples", "linear_regression", "--ks", ks, "--rows", "2",
                       "--out", str(out), "--commit", "abc1234"]) == 0
    return bench, out, json.loads(out.read_text())


def test_dry_run_writes_the_results_json_and_its_page(tmp_path):
    _, _, run = _dry_run(tmp_path, "1,3")
    assert run["benchmark"] == "multistep" and run["commit"] == "abc1234" and run["ks"] == [1, 3]
    for k in ("1", "3"):
        row = run["results"]["linear_regression"][k]
        assert row["equal_to_eager"] is True
        assert row["tkx_us_per_step"] > 0 and row["torch_compile_us_per_step"] > 0
    pages = load_script("results-pages", "tkx_results_pages_for_multistep")
    page = pages.render(run)
    # the faster variant equal to eager is shown: on a CPU either may win
    assert "| linear_regression | 3 |" in page and ("| auto |" in page or "| block |" in page)
    assert "abc1234" in page and "| yes |" in page
    assert row["judged_by"] in ("tolerance", "float64") and row["state_diff_to_float64"] >= 0


def test_rejudge_applies_the_rule_to_recorded_distances_without_measuring(tmp_path):
    bench, out, run = _dry_run(tmp_path, "1")
    row = run["results"]["linear_regression"]["1"]
    us = row["tkx_us_per_step"]
    for v in ("auto", "block"):  # as an older rule would have left them: too far, and no float64 judgement
        if f"tkx_{v}_us_per_step" in row:
            row[f"tkx_{v}_equal_to_eager"] = False
            row[f"tkx_{v}_max_rel_state_diff"] = 5e-4  # within float32's 1e-3
    out.write_text(json.dumps(run))
    assert bench.main(["--rejudge", str(out)]) == 0
    again = json.loads(out.read_text())
    row = again["results"]["linear_regression"]["1"]
    assert row["equal_to_eager"] is True and row["tolerance"] == 1e-3 and "rejudged" in again
    assert row["tkx_us_per_step"] == us  # nothing measured again
    # a step far beyond the tolerance and further from float64 than eager stays unequal
    assert bench.judge({"max_rel_loss_diff": 0.1, "max_rel_state_diff": 0.1, "loss_diff_to_float64": 0.1,
                        "state_diff_to_float64": 0.1, "eager_loss_diff_to_float64": 1e-3,
                        "eager_state_diff_to_float64": 1e-3}, 1e-3)["equal_to_eager"] is False
