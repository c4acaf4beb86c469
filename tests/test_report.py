"""The HTML export (``tkx.report``, ``tkx tour --html``) and the runtime views (runner,
verification, benchmark) on stand-in data: no GPU needed."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tkx
from tkx.bench.report import BenchmarkReport, Row
from tkx.render import bench as bench_views
from tkx.render import report as report_mod
from tkx.render import runtime_views
from tkx.runtime import Comparison, Resources, Verification

ROOT = Path(__file__).resolve().parents[1]
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
        "wbr"}
URL_ATTRS = {"src", "href", "action", "data", "poster", "srcset", "formaction", "background", "xlink:href"}


class Checker(HTMLParser):
    """Collects what the tests look at and checks that every element is closed in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.raw_blocks: list[str] = []  # <style> and <script> content
        self._raw: str | None = None

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        self.tags.append((tag, d))
        if "id" in d:
            self.ids.append(d["id"] or "")
        for k, v in attrs:
            if k in URL_ATTRS and v is not None:
                self.urls.append((tag, k, v))
        if tag in ("style", "script"):
            self._raw = ""
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}> "
                               f"at {self.getpos()}")
            if tag in self.stack:
                while self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()
        if tag in ("style", "script") and self._raw is not None:
            self.raw_blocks.append(self._raw)
            self._raw = None

    def handle_data(self, data):
        if self._raw is not None:
            self._raw += data


def parse(text: str) -> Checker:
    c = Checker()
    c.feed(text)
    c.close()
    return c


@pytest.fixture(scope="module")
def digits_export(tmp_path_factory):
    ex = tkx.examples.get("digits_mlp")
    d = tmp_path_factory.mktemp("report")
    paths = []
    for k in range(2):
        p = d / f"digits_{k}.html"
        got = tkx.report(ex.step_fn, ex.example_inputs, p, name=ex.name, loss=ex.loss_output,
                         description=ex.description)
        assert got == str(p)
        paths.append(p)
    return paths


def test_export_parses_balanced(digits_export):
    text = digits_export[0].read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    c = parse(text)
    assert c.errors == []
    assert c.stack == [], f"unclosed elements: {c.stack}"
    assert len(c.ids) == len(set(c.ids)), "duplicate element ids"


def test_export_has_every_stage(digits_export):
    text = digits_export[0].read_text(encoding="utf-8")
    c = parse(text)
    for sid, title, _ in report_mod.SECTIONS:
        assert f"tkx-sec-{sid}" in c.ids, sid
        assert f'href="#tkx-sec-{sid}"' in text  # the table of contents
        assert title in text
    assert "tkx report: digits_mlp" in text
    assert f"<td>{tkx.__version__}</td>" in text and f"<td>{torch.__version__}</td>" in text
    # every stage with a notebook view is shown through it (a .tkx-view box per section)
    for sid in ("captured", "program", "passes", "optimized", "schedule", "arena", "cuda"):
        sec = text.split(f'id="tkx-sec-{sid}"', 1)[1].split("</section>", 1)[0]
        assert "tkx-view" in sec or "<table" in sec or "<pre" in sec, sid
    # the linking script is on the page, guarded so it runs once
    assert "window.__tkxLinked" in text and "window.__tkxReport" in text


def test_export_fetches_nothing(digits_export):
    text = digits_export[0].read_text(encoding="utf-8")
    c = parse(text)
    for tag, attr, value in c.urls:
        assert value.startswith(("#", "data:")), (tag, attr, value[:80])
    assert not any(tag == "link" for tag, _ in c.tags)
    assert not any(tag == "script" and "src" in a for tag, a in c.tags)
    for block in c.raw_blocks:
        assert "http://" not in block and "https://" not in block
        assert "@import" not in block and "url(" not in block
    # outside the text a reader sees, no http(s) at all (tags, attributes, styles, scripts)
    markup = re.sub(r">[^<]*<", "><", text)
    assert "http://" not in markup and "https://" not in markup
    # images are data URIs of SVG that reference nothing outside themselves
    for tag, attrs in c.tags:
        src = attrs.get("src") or ""
        if tag == "img" and src.startswith("data:image/svg+xml;base64,"):
            svg = base64.b64decode(src.split(",", 1)[1]).decode("utf-8")
            assert not re.search(r'href="(https?:)?//', svg)


def test_export_has_no_addresses(digits_export):
    text = digits_export[0].read_text(encoding="utf-8")
    assert not re.search(r"\bat 0x[0-9a-fA-F]+", text)
    assert not re.search(r"\b0x[0-9a-fA-F]{9,}\b", text), "a 64-bit hex value looks like an address"
    assert "object at" not in text


def test_export_is_deterministic(digits_export):
    a, b = (p.read_bytes() for p in digits_export)
    assert a == b


def test_timings_are_opt_in():
    ex = tkx.examples.get("linear_regression")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output)
    quiet = report_mod.report_html(exp)
    loud = report_mod.report_html(exp, timings=True)
    assert "left out so the file is deterministic" in quiet
    assert "left out so the file is deterministic" not in loud
    untimed = report_mod.untimed_trace(exp.passes)
    assert format(untimed.steps[0].ms, ".2f") == "-" and f"{untimed.ms:.2f}" == "-"
    assert all(s.ms == t.ms for s, t in zip(exp.passes.steps, exp.passes.steps))  # original untouched
    assert str(untimed).splitlines()[0].endswith("- ms")


def test_stage_html_fallbacks():
    class Plain:
        def __str__(self):
            return "plain <text> & more"

    class Broken:
        def _repr_mimebundle_(self, include=None, exclude=None):
            raise RuntimeError("boom")

        def __str__(self):
            return "broken but readable"

    html_plain = report_mod.stage_html(Plain(), "x", "Plain")
    assert "<pre>plain &lt;text&gt; &amp; more</pre>" in html_plain and "tkx-view" in html_plain
    html_broken = report_mod.stage_html(Broken(), "x", "Broken")
    assert "broken but readable" in html_broken and "RuntimeError: boom" in html_broken
    assert parse(html_broken).stack == []


def test_tour_html_writes_the_file(tmp_path, capsys):
    from tkx.cli import main

    out = tmp_path / "sub" / "tour.html"
    assert main(["tour", "--example", "linear_regression", "--html", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "tkx report: linear_regression" in text
    assert "tkx-sec-cuda" in text
    assert str(out) in capsys.readouterr().out.replace("\n", "")
    assert parse(text).stack == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only note")
def test_gpu_section_without_gpu(digits_export):
    text = digits_export[0].read_text(encoding="utf-8")
    sec = text.split('id="tkx-sec-runner"', 1)[1].split("</section>", 1)[0]
    assert "No CUDA GPU" in sec
    assert 'class="tkx-r-none"' in text  # greyed out in the table of contents


# --------------------------------------------------------------------------------------
# runtime views on stand-in data (numbers as recorded on an H200)
# --------------------------------------------------------------------------------------
def stand_in_resources(**changes) -> Resources:
    fields = dict(backend="nvrtc", arch="sm_90", registers=80, shared_bytes=10372, dynamic_shared_bytes=0,
                  local_bytes=0, spill_bytes=0, occupancy=3, sm_count=132, grid=132, block=256, mode="grid",
                  arena_bytes=5805184, compile_seconds=0.119, seconds=0.0007, load_seconds=0.002, cache_hit=True)
    fields.update(changes)
    return Resources(**fields)


def stand_in_verification(bad: bool = False) -> Verification:
    comps = []
    for seed in (0, 1):
        comps.append(Comparison("out[0]", "output", "float32", seed, 5.1e-7, 4.0e-7, 1e-5))
        comps.append(Comparison("params['w1']", "update", "float32", seed, 2.9e-8, 3.0e-8, 1e-5))
        comps.append(Comparison("momentum_buf['w1']", "update", "float32", seed,
                                0.5 if bad and seed == 1 else 1e-8, 1e-8, 1e-5))
    return Verification(tuple(comps), (0, 1), ("no step_fn: compared with the reference only",) if bad else ())


def stand_in_runner(verification=None):
    return SimpleNamespace(program=SimpleNamespace(name="medium"), resources=stand_in_resources(),
                           last_verification=verification)


def recorded_benchmark(workload: str = "medium", failed: str | None = None) -> BenchmarkReport:
    data = json.loads((ROOT / "docs" / "results" / "h200.json").read_text())
    w = data[workload]
    rows = []
    for name in (*w["baselines"], "tkx"):
        if name == failed:
            rows.append(Row.failed(name, "RuntimeError: out of memory\nmore"))
        else:
            rows.append(Row.measured(name, w["samples_us"][name], 64))
    ver = {"passed": w["verified"], "worst": w["worst_output"], "worst_error": w["worst_error"]}
    res = stand_in_resources(registers=w["registers"], shared_bytes=w["shared_bytes"], grid=w["grid"],
                             mode=w["mode"], occupancy=w["occupancy"], arena_bytes=w["arena_bytes"]).as_dict()
    return BenchmarkReport(workload, tuple(rows), ver, res, {"cold_s": w["cold_compile_s"]},
                           {"stages": w["stages"], "barriers": w["barriers"]},
                           {"device": w["device"], "torch": w["torch"], "repeats": w["repeats"]})


def test_runner_view():
    runner = stand_in_runner(stand_in_verification())
    bundle = runtime_views.runner_bundle(runner)  # a stand-in runner: the view itself
    html_text = bundle["text/html"]
    assert set(bundle) == {"text/plain", "text/html"}
    for needle in ("132 blocks x 256 threads (grid mode)", "80</span> / thread", "0 B", "3 blocks / SM x 132 SMs",
                   "5,805,184 B (5.5 MiB)", "10,372 B (10.1 KiB)", "cache hit", "PASSED", "momentum_buf"):
        assert needle in html_text, needle
    assert parse(html_text).stack == []
    assert "tkx-fallback" in html_text  # hidden text for stripped styles
    quiet = runtime_views.runner_html(runner, timings=False)
    assert "cache hit" not in quiet and "0.12 s" not in quiet
    unverified = runtime_views.runner_html(stand_in_runner())
    assert "not verified yet" in unverified
    assert runtime_views.runner_bundle(runner, include=["text/html"]).keys() == {"text/html"}


def test_runner_view_flags_spills():
    runner = SimpleNamespace(program=SimpleNamespace(name="x"), resources=stand_in_resources(spill_bytes=96,
                                                                                             registers=255))
    html_text = runtime_views.runner_html(runner)
    assert '<span class="tkx-rt-bad">96 B</span>' in html_text
    assert '<span class="tkx-rt-bad">255</span>' in html_text


def test_verification_view():
    good, bad = stand_in_verification(), stand_in_verification(bad=True)
    g = good._repr_mimebundle_()
    assert g["text/plain"] == repr(good) and "PASSED" in g["text/html"]
    assert g["text/html"].count("<tr") == 1 + 3  # header + one row per value (worst over the seeds)
    b = bad._repr_mimebundle_()["text/html"]
    assert "FAILED" in b and "FAIL</span>" in b and "5.00e-01" in b and "note: no step_fn" in b
    assert parse(b).stack == []


def bench_svg(html_text: str) -> ET.Element:
    src = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', html_text).group(1)
    return ET.fromstring(base64.b64decode(src))


def test_benchmark_view_from_recorded_numbers():
    rep = recorded_benchmark("medium")
    bundle = rep._repr_mimebundle_()
    assert bundle["text/plain"] == str(rep)
    html_text = bundle["text/html"]
    assert parse(html_text).stack == [] and "<svg" not in html_text  # the chart is an <img>
    tkx_row = next(r for r in rep.rows if r.name == "tkx")
    ratio = tkx_row.median_us / rep.best_baseline_us
    assert "verified" in html_text and f"{ratio:.2f} (" not in html_text
    assert "x best baseline" in html_text and "inductor" in html_text
    svg = bench_svg(html_text)
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in svg.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    assert len(bars) == 5
    texts = ["".join(t.itertext()) for t in svg.iter(f"{ns}text")]
    assert "log scale" in texts[0]  # eager is 20x slower than the rest
    assert any(t.startswith(f"{tkx_row.median_us:.1f} µs") and f"{ratio:.2f}x" in t for t in texts)
    assert any("best baseline" in t for t in texts)
    # bars are ordered by the axis: tkx (430 µs) longer than inductor (68 µs)
    width = {r.find(f"{ns}title").text.split(":")[0]: float(r.get("width")) for r in bars}
    assert width["eager"] > width["tkx"] > width["inductor"]


def test_benchmark_view_linear_scale_and_failures():
    rep = recorded_benchmark("online", failed="inductor")
    rep = BenchmarkReport(rep.name, tuple(r for r in rep.rows if r.name != "eager"), rep.verification)
    svg = bench_views.benchmark_svg(rep)
    assert "linear scale" in svg and "failed: RuntimeError: out of memory" in svg and "more" not in svg
    assert bench_views.benchmark_svg(rep) == svg  # deterministic
    wrong = BenchmarkReport("w", (Row.measured("eager", [10, 11, 12], 1),
                                  Row.measured("tkx", [5, 6, 7], 1, ok=False, note="wrong results")),
                            {"passed": False})
    html_text = wrong._repr_mimebundle_()["text/html"]
    assert "WRONG RESULTS" in html_text and "WRONG" in bench_views.benchmark_svg(wrong)
    empty = BenchmarkReport("e", (Row.failed("tkx", "no GPU"),))
    assert "no candidate ran" in bench_views.benchmark_svg(empty)


def test_report_with_a_runner_section():
    """What the export shows on a GPU, with a stand-in runner (the GPU path of the report)."""
    ex = tkx.examples.get("linear_regression")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output)
    text = report_mod.report_html(exp, runner=stand_in_runner(), verification=stand_in_verification())
    sec = text.split('id="tkx-sec-runner"', 1)[1].split("</section>", 1)[0]
    assert "132 blocks x 256 threads" in sec and "PASSED" in sec and "cache hit" not in sec
    assert parse(text).stack == []
