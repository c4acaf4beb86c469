"""scripts/decode-profile on the CPU: its per-stage tables from the cost model's predicted timeline of the
tiny decode step (the GPU run reads the kernel's measured timeline through the same code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_predicted_profile_accounts_for_the_whole_step(tmp_path):
    out = tmp_path / "profile.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "decode-profile"), "--predicted", "--config",
                        "decode_tiny", "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(out.read_text())
    assert {"date", "machine", "torch", "commit", "command", "title"} <= set(record)
    rec = record["results"]
    stages = rec["stages"]
    assert rec["timeline"] == "predicted" and stages
    # the stage spans and the gaps between them tile the step: first start 0, last end the makespan
    assert stages[0]["start_us"] == 0.0
    assert abs(stages[-1]["end_us"] - rec["makespan_us"]) < 1e-6
    assert abs(rec["stage_spans_us"] + rec["gaps_us"] - rec["makespan_us"]) < 1e-6
    assert abs(sum(s["span_us"] + s["gap_after_us"] for s in stages) - rec["makespan_us"]) < 1e-6
    # every weight GEMV of the step is in a stage, and the bytes add up per kind
    assert any("gemm" in s["kinds"] for s in stages)
    assert sum(k["bytes"] for k in rec["by_kind"].values()) == rec["bytes"]
    assert "the 20 longest stages" in r.stdout
    # its page, as scripts/results-pages writes it beside a committed record
    import importlib.machinery
    pages = importlib.machinery.SourceFileLoader("results_pages", str(REPO / "scripts" / "results-pages")).load_module()
    page = pages.render(record, out.name)
    assert page.startswith("# Where the decode_tiny decode step's time goes") and "| kind | stages |" in page
    assert f"{rec['makespan_us']:.1f} µs" in page and "The longest stages:" in page
