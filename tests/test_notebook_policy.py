"""The teaching notebooks follow one output policy (scripts/store-notebook-outputs.py writes it, nbval
compares it): kernelspec metadata everywhere; outputs stored only where ``pytest --nbval`` compares them;
GPU cells tagged ``nbval-skip``; and the sanitize file masks timings without masking results."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LAX = {"06_run_and_benchmark.ipynb"}
SANITIZE = ROOT / "notebooks" / "sanitize.cfg"


def _cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _patterns() -> list[tuple[str, str]]:
    # nbval's own reader: the pairs it will apply
    from nbval.plugin import get_sanitize_patterns
    return get_sanitize_patterns(SANITIZE.read_text())


def _sanitize(text: str) -> str:
    for regex, replace in _patterns():
        text = re.sub(regex, replace, text)
    return text


def test_notebooks_numbered_in_order_without_gaps():
    assert len(NOTEBOOKS) >= 9  # 00-08 at least (08: dataflow synchronisation)
    assert [p.stem[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(len(NOTEBOOKS))]


def test_every_notebook_is_listed_in_the_readme_and_the_docs():
    table = (ROOT / "notebooks" / "README.md").read_text()
    toctree = (ROOT / "docs" / "index.md").read_text()
    for path in NOTEBOOKS:
        assert f"| `{path.stem}` |" in table, f"{path.name} is missing from notebooks/README.md's table"
        assert f"\nnotebooks/{path.stem}\n" in toctree, f"{path.name} is missing from docs/index.md's toctree"


def test_the_makefile_treats_exactly_the_lax_notebooks_as_lax():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^LAX_NOTEBOOKS := (.*)$", makefile, re.M).group(1).split() == \
        [f"notebooks/{n}" for n in sorted(LAX)]
    assert "--nbval-sanitize-with notebooks/sanitize.cfg" in makefile


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_kernelspec_and_language_metadata(path):
    meta = json.loads(path.read_text())["metadata"]
    assert meta["kernelspec"]["name"] == "python3" and meta["kernelspec"]["language"] == "python"
    assert meta["language_info"]["name"] == "python"
    assert "widgets" not in meta, "widget state is stored: re-run scripts/store-notebook-outputs.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_outputs_are_stored_only_where_nbval_compares_them(path):
    compared = 0
    for i, cell in enumerate(_cells(path)):
        tags = cell["metadata"].get("tags", [])
        where = f"{path.name} code cell {i}"
        if path.name in LAX or "nbval-skip" in tags or "nbval-ignore-output" in tags:
            assert cell["outputs"] == [], f"{where}: stored outputs that nbval never compares"
            continue
        for out in cell["outputs"]:
            assert out["output_type"] != "error", f"{where}: a stored error"
            if out["output_type"] in ("display_data", "execute_result"):
                assert set(out["data"]) == {"text/plain"}, \
                    f"{where}: stores {sorted(out['data'])}; rich views belong in cells tagged nbval-ignore-output"
        if cell["outputs"]:
            assert cell["execution_count"] is not None, f"{where}: nbval reads outputs without a count as unrun"
            compared += 1
    if path.name not in LAX:
        assert compared >= 4, f"{path.name}: only {compared} cells have compared outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_gpu_cells_are_tagged_and_say_why_they_skip(path):
    for i, cell in enumerate(_cells(path)):
        src = "".join(cell["source"])
        uses_gpu = re.search(r'device="cuda"|\.cuda\(\)|tkx\.bench\.compare|\.runner\b|\.verify\(', src)
        if uses_gpu:
            tags = cell["metadata"].get("tags", [])
            assert "nbval-skip" in tags, f"{path.name} code cell {i} needs a GPU but is not tagged nbval-skip"
            assert "torch.cuda.is_available()" in src and "print(" in src, \
                f"{path.name} code cell {i}: a GPU cell should print why it skips on a CPU"


def test_sanitize_masks_timings_and_versions_but_not_results():
    cases = {
        "PassTrace of digits_mlp: 61 -> 55 ops in 5 passes, 1.25 ms": "in 5 passes, <ms> ms",
        "sm_90: 215 regs, 0 B spills, 16640 B smem, 0 B stack, 0.74 s":
            "sm_90: <n> regs, 0 B spills, 16640 B smem, 0 B stack, <s> s",
        " 'schedule': 21.6,": " 'schedule': <ms>,",
        "# 2681535232.py:3  pred": "# <cell>.py:3  pred",
        "<object at 0x7f3a2b4c5d60>": "<object at 0x<addr>>",
        "torch 2.13.0+cpu | NVRTC 13.0": "torch <version> | NVRTC <version>",
    }
    for raw, want in cases.items():
        assert want in _sanitize(raw), (raw, _sanitize(raw))
    # A pass table's ms column is masked whatever its width; the counts beside it are not.
    narrow = "  pass   ms  +added\n  cse  0.44       0\n"
    wide = "  pass     ms  +added\n  cse  12.44       0\n"
    assert _sanitize(narrow) == _sanitize(wide)
    assert _sanitize("  cse  0.44       0\n") != _sanitize("  cse  0.44       1\n")
    for kept in ("6 barriers", "correct: 13 backward nodes", "76928 B", "estimated 7.8 µs", "0 B spills",
                 "lines (361,)", "%12: f32[64,128] = maximum %11, 0.0"):
        assert _sanitize(kept) == kept


def test_nbval_fails_when_a_stored_output_changes(tmp_path):
    """The comparison can fail: change one stored result in a copy of 01 and nbval must flag that cell."""
    pytest.importorskip("nbval")
    nb = json.loads((ROOT / "notebooks" / "01_capture.ipynb").read_text())
    changed = None
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        text = "".join("".join(o.get("text", [])) for o in cell["outputs"])
        if "correct: 13 backward nodes" in text:
            for o in cell["outputs"]:
                o["text"] = [t.replace("13 backward", "12 backward") for t in o["text"]]
            changed = i
    assert changed is not None, "01_capture no longer prints 'correct: 13 backward nodes'"
    copy = tmp_path / "01_capture.ipynb"
    copy.write_text(json.dumps(nb))
    shutil.copy(SANITIZE, tmp_path / "sanitize.cfg")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(copy), "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", str(tmp_path / "sanitize.cfg"), "-x", f"--rootdir={tmp_path}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert f"01_capture.ipynb::Cell {changed}" in proc.stdout, proc.stdout[-3000:]
    assert "12 backward nodes" in proc.stdout and "13 backward nodes" in proc.stdout
