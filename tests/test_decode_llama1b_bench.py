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
    # eager float32 arbitrates the teacher-forced tokens (none differ on this tiny model: nothing to judge)
    assert rec["teacher_forced_judged_by"] == "float32" and rec["teacher_forced_differences"] == []
    assert rec["teacher_forced_factor"] == 3.0 and "float32" in rec["teacher_forced_rule"]
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
    assert f"int8: teacher-forced rule (judged by float32): {rec['teacher_forced_rule']}" in page


def _difference(step: int, token: int, float32_margin: float, noise: float, **extra) -> dict:
    return {"step": step, "sequence": 0, "eager_token": 7, "token": token, "eager_margin": 0.04, "tolerance": 0.01,
            "float32_logits": [5.0, 5.0 - float32_margin], "eager_logits": [5.02, 4.98], "tkx_logits": [4.99, 5.0],
            "eager_noise": noise, "tkx_noise": noise / 2, **extra}


def test_rejudge_applies_the_float32_rule_to_a_record(tmp_path):
    """--rejudge on a record: a near-tie in float32 (margin 0.01 within 3 x a noise of 0.02) is accepted, a
    clear disagreement (margin 0.5) refused, whatever verdict the record held; a record made before the float32
    logits were kept keeps its verdict and says why; the page shows the rule and every margin and allowance."""
    bench, pages = _script("decode-llama1b-bench"), _script("results-pages")
    legacy = {"teacher_forced_ok": False, "teacher_forced": "13 of 16 greedy tokens equal to eager (teacher-forced); "
              "3 differ with eager's logit margin up to 0.04946 (BEYOND the tolerance 0.0078125 x |best logit|)"}
    bf16 = {"batch": 1, "sol_us": 500.0, "failures": {}, "tokens_equal": False, "teacher_forced_ok": True,
            "teacher_forced": "stale", "teacher_forced_differences": [
                _difference(3, 11, 0.01, 0.02, accepted=False), _difference(9, 12, 0.5, 0.02, accepted=True)],
            "tkx_counters": legacy}
    run = {"benchmark": "decode-llama1b", "title": "t", "date": "d", "machine": "m", "torch": "2.11", "commit": "c",
           "command": "x", "timing": "median", "config": "llama_1b", "tokens": 16, "peak_bytes_per_s": 4.8e12,
           "bf16": bf16}
    path = tmp_path / "decode-llama1b-h200.json"
    path.write_text(json.dumps(run))
    assert bench.main(["--rejudge", str(path)]) == 0
    got = json.loads(path.read_text())
    rec = got["bf16"]
    near, clear = rec["teacher_forced_differences"]
    assert near["accepted"] and near["allowance"] == pytest.approx(0.06)  # 3 x the larger noise, eager's
    assert near["float32_margin"] == pytest.approx(0.01)
    assert not clear["accepted"] and clear["float32_margin"] == pytest.approx(0.5)
    assert rec["teacher_forced_ok"] is False and rec["teacher_forced_judged_by"] == "float32"
    assert rec["teacher_forced"].startswith("14 of 16 greedy tokens equal to eager")
    assert "1 of 2 BEYOND the allowance" in rec["teacher_forced"]
    assert rec["tkx_counters"]["teacher_forced_ok"] is False  # legacy: no float32 logits, verdict kept
    assert rec["tkx_counters"]["teacher_forced_rejudged"].startswith("not rejudged")
    assert got["rejudged"]["rule"] == rec["teacher_forced_rule"]
    page = path.with_suffix(".md").read_text()
    assert page == pages.render(got, path.name)
    assert "bf16: teacher-forced rule (judged by float32)" in page
    assert "3, 0: 7 -> 11, 0.01 vs 0.06 accepted; 9, 0: 7 -> 12, 0.5 vs 0.06 REFUSED" in page
    assert "tkx counters, not rejudged" in page and "judged again on" in page
    # only the near-tie: the comparison passes
    bf16["teacher_forced_differences"] = bf16["teacher_forced_differences"][:1]
    path.write_text(json.dumps(run))
    assert bench.main(["--rejudge", str(path)]) == 0
    assert json.loads(path.read_text())["bf16"]["teacher_forced_ok"] is True


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
