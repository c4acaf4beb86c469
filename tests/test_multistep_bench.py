"""scripts/multistep-bench without a GPU (--dry-run): it writes the JSON the results page is rendered from,
with tkx's and the baseline's µs per step and the equality with eager per example and K."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from script_module import load_script  # noqa: E402


def test_dry_run_writes_the_results_json_and_its_page(tmp_path):
    bench = load_script("multistep-bench", "tkx_multistep_bench_script")
    out = tmp_path / "multistep-h200.json"
    assert bench.main(["--dry-run", "--examples", "linear_regression", "--ks", "1,3", "--rows", "2",
                       "--out", str(out), "--commit", "abc1234"]) == 0
    run = json.loads(out.read_text())
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
    assert row["judged_by"] in ("float32 tolerance", "float64") and row["state_diff_to_float64"] >= 0
