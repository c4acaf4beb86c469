"""docs/results/ and scripts/: one generated page per benchmark, and maintained tools only.

Each page of docs/results/ is what ``scripts/results-pages`` renders from the JSON beside it (dated, naming
the machine, torch and the tkx commit); every file in scripts/ answers ``--help`` and has its line in
scripts/README.md.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
PAGES = {"zoo", "gemm", "decode", "fuzzing", "training"}
#: Pages named for the machine they were measured on: file stem -> the benchmark its JSON holds.
MACHINE_PAGES = {"multistep-h200": "multistep", "zoo-h200": "zoo-h200", "decode-llama1b-h200": "decode-llama1b",
                 "fuzzing-gpu": "fuzzing", "decode-profile-h200": "decode-profile"}
PAGES |= {stem for stem in MACHINE_PAGES if (RESULTS / f"{stem}.json").is_file()}
#: Raw data the notebooks and tests read (notebooks 06 and 09, tests/test_report.py).
NOTEBOOK_DATA = {"h200.json", "decode-h200.json", "decode-timeline-h200.json"}


@pytest.fixture(scope="module")
def results_pages():
    loader = importlib.machinery.SourceFileLoader("results_pages", str(REPO / "scripts" / "results-pages"))
    spec = importlib.util.spec_from_loader("results_pages", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_results_hold_one_page_per_benchmark_and_its_json():
    names = {p.name for p in RESULTS.iterdir() if p.is_file()}
    assert names == {f"{n}.{ext}" for n in PAGES for ext in ("json", "md")} | NOTEBOOK_DATA


def test_every_page_is_what_its_json_renders(results_pages):
    pages = results_pages.pages()
    assert {p.stem for p in pages} == PAGES
    stale = [p.name for p, text in pages.items() if p.read_text(encoding="utf-8") != text]
    assert stale == [], f"run scripts/results-pages: {stale} differ from what their JSON renders"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_run_is_dated_and_names_machine_torch_and_commit(name, results_pages):
    run = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    assert run["benchmark"] == MACHINE_PAGES.get(name, name)
    for key in ("date", "machine", "torch", "commit", "command"):
        assert isinstance(run[key], str) and run[key], key
    page = results_pages.render(run)
    assert run["date"] in page and run["machine"] in page and f"torch {run['torch']}" in page
    assert f"`{run['commit']}`" in page and "|---|" in page


def test_a_changed_number_makes_the_page_stale(results_pages, tmp_path, monkeypatch):
    run = json.loads((RESULTS / "fuzzing.json").read_text(encoding="utf-8"))
    run["results"]["programs"] += 1
    (tmp_path / "fuzzing.json").write_text(json.dumps(run))
    (tmp_path / "fuzzing.md").write_text((RESULTS / "fuzzing.md").read_text(encoding="utf-8"))
    monkeypatch.setattr(results_pages, "RESULTS", tmp_path)
    assert results_pages.main(["--check"]) == 1
    assert results_pages.main([]) == 0 and results_pages.main(["--check"]) == 0
    assert f"{run['results']['programs']} random training steps" in (tmp_path / "fuzzing.md").read_text()


def test_every_script_is_documented_and_answers_help():
    readme = (REPO / "scripts" / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p for p in (REPO / "scripts").iterdir() if p.is_file() and p.name != "README.md")
    undocumented = [p.name for p in scripts if f"`{p.name}" not in readme]
    assert undocumented == [], f"scripts without a line in scripts/README.md: {undocumented}"
    no_help = [p.name for p in scripts if "--help" not in p.read_text(encoding="utf-8")
               and "argparse" not in p.read_text(encoding="utf-8")]
    assert no_help == [], f"scripts that do not answer --help: {no_help}"
    named = {w.split("`")[0].split()[0] for w in readme.split("- `")[1:]}
    missing = sorted(n for n in named if not (REPO / "scripts" / n).exists())
    assert missing == [], f"scripts/README.md names scripts that are not there: {missing}"


def test_the_zoo_page_shows_where_the_time_goes(results_pages):
    run = json.loads((RESULTS / "zoo-h200.json").read_text(encoding="utf-8"))
    assert "## Where the time goes" not in results_pages.render(run) or all(
        "where_the_time_goes" in r for r in run["results"].values())
    row = next(iter(run["results"].values()))
    row["where_the_time_goes"] = {"source": "measured timeline", "step_us": 20.0, "critical_path_us": 18.0,
                                  "gemm_us": 12.0, "other_us": 3.0, "sync_us": 2.5, "idle_us": 0.5,
                                  "outside_us": 2.0, "fractions": {"gemm_us": 0.6, "other_us": 0.15,
                                                                   "sync_us": 0.125, "idle_us": 0.025,
                                                                   "outside_us": 0.1}}
    row["what_would_close"] = "GEMM-bound: GEMM groups are 60% of the step"
    page = results_pages.render(run)
    assert "## Where the time goes" in page and "measured timeline" in page
    assert "| 20.0 | 12.0 (60%) | 3.0 (15%) | 2.5 (12%) | 0.5 (2%) | 2.0 (10%) | GEMM-bound: GEMM groups are 60%" in page


def test_a_continued_campaign_names_each_part(results_pages):
    """A fuzzing campaign resumed at another commit or machine lists its parts (scripts/fuzz-campaign
    --resume writes them under "segments"); one part alone adds no table."""
    run = json.loads((RESULTS / "fuzzing.json").read_text(encoding="utf-8"))
    res = run["results"]
    res["segments"] = [
        {"commit": "aaaaaaa", "machine": "x86_64 vm (2 CPUs)", "torch": "2.13.0+cpu", "programs": 3,
         "seconds": 10.0, "command": None},
        {"commit": "bbbbbbb", "machine": "NVIDIA H200 (132 SMs), host of 16 CPUs", "torch": "2.11.0+cu130",
         "programs": res["programs"] - 3, "seconds": 20.0, "command": "scripts/fuzz-campaign --resume --out X"}]
    page = results_pages.render(run)
    assert "ran in 2 parts" in page
    assert "| 2 | `bbbbbbb` | NVIDIA H200 (132 SMs), host of 16 CPUs | 2.11.0+cu130 |" in page
    res["segments"] = res["segments"][:1]
    assert "parts" not in results_pages.render(run)
