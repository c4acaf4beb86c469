"""The cost model against the committed measurements: with the shipped constants (tkx/data/costs.json) the
choice sync="auto", mode="auto" makes for every zoo example costs at most 3% more than the best forced
choice measured on the H200 (docs/results/zoo.json), and the shipped fixed costs are what
``scripts/calibrate --from-zoo`` fits to that data and the per-task traces (docs/results/traces/)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tkx import costs, examples

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from script_module import load_script  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@pytest.fixture(scope="module")
def fitted():
    cal = load_script("calibrate", "tkx_calibrate_fit")
    times = cal.zoo_times(json.loads((RESULTS / "zoo.json").read_text()))
    return cal, times, cal.structures(times)


def test_every_zoo_example_has_measured_choices(fitted):
    _, times, _ = fitted
    assert set(times) == set(examples.names())
    assert all({"barrier-grid", "counters-grid"} <= set(m) for m in times.values())


@pytest.mark.parametrize("name", examples.names())
def test_auto_picks_within_3_percent_of_the_best_measured_choice(fitted, name):
    _, times, structs = fitted
    measured, choice = times[name], structs[name][3]
    best = min(measured, key=measured.get)
    assert choice in measured, f"{name}: auto picks {choice}, which was not measured ({sorted(measured)})"
    assert measured[choice] <= 1.03 * measured[best], \
        f"{name}: auto picks {choice} ({measured[choice]:.2f} µs), the best is {best} ({measured[best]:.2f} µs)"


def test_the_shipped_fixed_costs_are_the_fit_of_the_committed_data(fitted):
    cal, times, structs = fitted
    constants, record = cal.fit(structs, times, costs.constants(), RESULTS / "traces")
    assert record["misses"] == 0 and record["task_us_from"].endswith("tiny tasks of the traces")
    shipped = costs.constants()
    for key in ("task_us", "group_us", "publish_us"):
        assert constants[key] == pytest.approx(shipped[key], abs=1e-4), key
    assert abs(record["mean_log_error"]) < 0.1  # no longer predicting whole steps 13-29% short


def test_a_tiny_task_costs_its_fixed_cost():
    c = costs.constants()
    assert costs.item_us(0, 4, 1, c) == pytest.approx(c["task_us"] + 4 / c["sm_bytes_per_us"])
    assert c["task_us"] >= 0.3  # measured tiny tasks take 0.4-1 µs, not 0.05-0.1


def test_zoo_bench_json_is_read_too(fitted):
    cal = fitted[0]
    run = {"results": {"x": {"tkx_us": 9.0, "mode": "grid", "sync": "barrier",
                             "forced_us": {"barrier-grid": 9.5, "barrier-block": None, "counters-grid": 12.0}},
                       "y": {"tkx_us": 5.0, "mode": "block", "sync": "auto", "forced_us": {}}}}
    assert cal.zoo_times(run) == {"x": {"barrier-grid": 9.5, "counters-grid": 12.0}, "y": {"barrier-block": 5.0}}
