"""scripts/decode-llama1b-bench without a GPU: ``--dry-run`` takes llama_1b_tiny through everything but the
timing (the outlined kernel source of both tkx variants, grid barriers and counters, and their NVRTC compiles;
tokens and logits through the schedule interpreter against eager's and eager float32's; the counters protocol
through the task VM; the JSON and its results page)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(REPO / "scripts" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_dry_run_writes_the_record_and_its_page(tmp_path):
    bench = _script("decode-llama1b-bench")
    assert bench.main(["--dry-run", "--out", str(tmp_path), "--tokens", "2", "--formats", "int8"]) == 0
    run = json.loads((tmp_path / "decode-llama1b-dry-run.json").read_text())
    assert run["benchmark"] == "decode-llama1b" and run["config"] == "llama_1b_tiny" and run["tokens"] == 2
    for key in ("date", "machine", "torch", "commit", "command"):
        assert isinstance(run[key], str) and run[key]
    rec = run["int8"]
    assert rec["tokens_equal"] is True and rec["teacher_forced_ok"] is True
    assert len(rec["eager_tokens"][0]) == 2 and rec["tkx_tokens"] == rec["eager_tokens"]
    errors = rec["logits_rel_error"]
    assert len(errors["tkx"]) == len(errors["eager_bf16"]) == 2
    # the interpreter rounds as eager bf16 does: both about bf16's rounding away from float32, nowhere near 1
    assert all(0 < e < 0.05 for e in errors["tkx"] + errors["eager_bf16"])
    counters = rec["tkx_counters"]
    assert counters["tkx_sync"].startswith("counters") and counters["task_vm_ok"], counters["task_vm"]
    assert " 0 faults" in counters["task_vm"]
    for key in ("tkx_us", "tkx_counters_us", "torch_compile_us", "torch_compile_max_autotune_us", "eager_graph_us",
                "graph_of_kernels_us"):
        assert rec[key] is None  # nothing timed without a GPU
    assert "not measured" in rec["graph_of_kernels_note"]
    assert rec["sol_us"] == pytest.approx((rec["weight_bytes"] + rec["kv_bytes_read"]) / 4.8e12 * 1e6)
    if "tkx_resources" in rec:  # NVRTC installed: both outlined kernels compiled without spills
        assert " 0 B spills" in rec["tkx_resources"] and " 0 B spills" in counters["tkx_resources"]
    page = (tmp_path / "decode-llama1b-dry-run.md").read_text()
    assert page == _script("results-pages").render(run, "decode-llama1b-dry-run.json")
    assert "| int8 |" in page and run["commit"] in page
    assert "logits' relative error against eager float32, tkx barriers: max" in page and "task VM" in page


def test_unknown_tkx_variant_is_refused(tmp_path):
    bench = _script("decode-llama1b-bench")
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--out", str(tmp_path), "--tkx-variants", "barrier,fences"])


def test_a_timed_record_renders_ratios():
    pages = _script("results-pages")
    rec = {"batch": 1, "tkx_us": 600.0, "tkx_counters_us": 550.0, "eager_graph_us": 900.0, "torch_compile_us": 700.0,
           "torch_compile_max_autotune_us": 650.0, "graph_of_kernels_us": None, "sol_us": 520.0,
           "tokens_equal": True, "teacher_forced_ok": True, "teacher_forced": "all equal", "failures": {}}
    run = {"benchmark": "decode-llama1b", "title": "t", "date": "d", "machine": "m", "torch": "2.11", "commit": "c",
           "command": "x", "timing": "median", "config": "llama_1b", "tokens": 32, "peak_bytes_per_s": 4.8e12,
           "bf16": rec}
    row = next(line for line in pages.render(run).splitlines() if line.startswith("| bf16 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # tkx's best variant (counters here) makes the ratios
    assert cells[1] == "600.0" and cells[2] == "550.0" and cells[8] == "0.95" and cells[9] == "1818"
    assert cells[10] == "0.85"
