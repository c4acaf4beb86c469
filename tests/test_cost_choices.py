"""The cost model against the committed measurements: with the shipped constants (tkx/data/costs.json) the
choice sync="auto", mode="auto" makes for every zoo example costs at most 3% more than the best forced
choice measured on the H200 (the run the shipped fit names: docs/results/zoo.json, or a ``zoo-bench --forced``
run such as docs/results/zoo-h200.json), and the shipped fixed costs are what ``scripts/calibrate --from-zoo``
fits to that data and the per-task traces it names (docs/results/traces/)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tkx import costs, examples

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from script_module import load_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: The shipped fit's record: the measured run and the traces it was fitted to (paths from the repository root).
FIT = json.loads(costs.SHIPPED.read_text()).get("fit", {})
SOURCE = ROOT / FIT.get("source", "docs/results/zoo.json")
TRACES = ROOT / (FIT.get("traces") or "docs/results/traces")


@pytest.fixture(scope="module")
def fitted():
    cal = load_script("calibrate", "tkx_calibrate_fit")
    run = json.loads(SOURCE.read_text())
    times = cal.zoo_times(run)
    return cal, times, cal.structures(times, run.get("arch") or cal.MEASURED_ARCH)


def test_every_zoo_example_has_measured_choices(fitted):
    _, times, _ = fitted
    assert set(times) == set(examples.names())
    assert all(len(m) >= 2 and "barrier-grid" in m for m in times.values())


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
    constants, record = cal.fit(structs, times, costs.constants(), TRACES)
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


def test_tensor_core_groups_run_at_the_tensor_rate():
    c = costs.constants()
    assert costs.flops_per_us("simt", c) == costs.flops_per_us(None, c) == c["sm_flops_per_us"]
    assert costs.flops_per_us("wgmma_bf16", c) == pytest.approx(989.4e6 / 132)  # H200 dense bf16 over 132 SMs
    assert costs.flops_per_us("wgmma_tf32", c) == pytest.approx(costs.flops_per_us("wgmma_bf16", c) / 2)
    assert costs.flops_per_us("wmma_bf16", c) < costs.flops_per_us("wgmma_bf16", c)
    assert costs.flops_per_us("wgmma_bf16", c) > 20 * c["sm_flops_per_us"]
    # a GEMM's work at the tensor rate: 2 * 64 * 128 * 1024 FLOPs in one item, no bytes
    flops = 2 * 64 * 128 * 1024
    assert costs.item_us(flops, 0, 1, c, "wgmma_bf16") == pytest.approx(c["task_us"] + flops / (989.4e6 / 132))


def test_a_split_k_stage_final_adds_on_cuda_cores():
    import tkx

    ex = examples.get("small")
    s = tkx.explore(ex.step_fn, ex.example_inputs, arch="sm_90a", split_k=4).schedule
    kinds = {g.kind: costs.group_impl(g) for g in s.groups.values() if g.kind in ("gemm", "gemm_partial")
             and getattr(g.plan, "partials", None) and g.plan.split_final != "last-slice"}
    assert kinds == {"gemm_partial": "wgmma_bf16", "gemm": None}
    assert all(costs.group_impl(g) is None for g in s.groups.values() if g.kind.startswith("reduction"))


def test_a_grid_barrier_costs_the_same_on_any_grid():
    from tkx.dataflow.cost import barrier_us

    c = costs.constants()
    assert barrier_us(8, "grid", c) == barrier_us(132, "grid", c) == c["grid_barrier_us"]
    assert barrier_us(132, "block", c) == c["block_barrier_us"]
