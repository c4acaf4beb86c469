"""The hierarchical graph views of the exported report in a real headless browser, at the size of real
steps: the zoo's largest examples and an ``nn.Module`` transformer step of several hundred IR ops.

For the FX graph, the IR and the IR after the passes: the first view draws at most
:data:`~tkx.render.hgraph.FIRST_VIEW_NODES` boxes with labels of at least 11 px on screen; clicking a
collapsed box expands it; searching a module path brings that module into view; clicking an op lights
its CUDA lines (the page's linked views). One browser per module; Debian's chromium via Playwright, as
in ``test_browser.py`` (skips without either).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from graph_steps import tiny_gpt_step
from test_browser import browser  # noqa: F401 - the module-scoped browser fixture, one per module

import tkx
from tkx.render.hgraph import FIRST_VIEW_NODES
from tkx.render.report import write_report

pytestmark = pytest.mark.browser

SECTIONS = ("captured", "program", "optimized")
# Per graph view: boxes drawn, the smallest label size on screen (font size x zoom), open clusters.
MEASURE = """(el) => {
  const texts = Array.from(el.querySelectorAll('.tkx-gn text'));
  const px = texts.map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
  return {boxes: el.querySelectorAll('.tkx-gn').length, open: el.querySelectorAll('.tkx-gc').length,
          minPx: px.length ? Math.min(...px) : 0, labels: texts.length,
          zoom: parseFloat(el.getAttribute('data-tkx-hg-zoom'))};
}"""
# The id of the first collapsed box (not the inputs/outputs) drawn wholly inside the view's box.
IN_VIEW_BOX = """(el) => {
  const stage = el.querySelector('.tkx-hg-stage').getBoundingClientRect();
  const box = Array.from(el.querySelectorAll('.tkx-gn.tkx-hg-c:not(.tkx-hg-lv-ends)')).find(g => {
    const r = g.getBoundingClientRect();
    return r.left >= stage.left && r.right <= stage.right - 190 && r.top >= stage.top && r.bottom <= stage.bottom;
  });
  return box ? box.getAttribute('data-id') : null;
}"""


def _report(tmp_path_factory, name: str) -> Path:
    path = tmp_path_factory.mktemp("graphs") / f"{name}.html"
    if name == "tiny_gpt":
        step, inputs = tiny_gpt_step(blocks=2)
        ex = tkx.explore(step, inputs, name="tiny_gpt")
        assert len(ex.program.ops) >= 250, f"the nn.Module step has only {len(ex.program.ops)} IR ops"
    else:
        e = tkx.examples.get(name)
        ex = tkx.explore(e.step_fn, e.example_inputs, name=e.name, loss=e.loss_output)
    write_report(ex, path, gpu=False)
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = _report(tmp_path_factory, name)
        return made[name]
    return get


def _open(browser, path: Path):  # noqa: F811 - the fixture imported above
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda req: requests.append(req.url))
    page.goto(path.as_uri())
    page.wait_for_selector("#tkx-sec-optimized .tkx-hg-on")
    return page, errors, requests


EXAMPLES = ["gpt_block", "tiny_gpt",
            pytest.param("cnn_digits", marks=pytest.mark.slow), pytest.param("llama_block", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", EXAMPLES)
def test_first_view_is_readable_and_expands_on_click(browser, reports, name):  # noqa: F811
    page, errors, requests = _open(browser, reports(name))
    try:
        for sec in SECTIONS:
            hg = page.locator(f"#tkx-sec-{sec} .tkx-hg").first
            m = hg.evaluate(MEASURE)
            assert 3 <= m["boxes"] <= FIRST_VIEW_NODES, (sec, m)
            assert m["minPx"] >= 11, f"{name} {sec}: labels drawn at {m['minPx']:.1f} px (zoom {m['zoom']})"
        # expand a collapsed box of the IR after the passes by clicking it: more boxes, it is now open
        hg = page.locator("#tkx-sec-optimized .tkx-hg").first
        hg.scroll_into_view_if_needed()
        before = hg.evaluate(MEASURE)
        cid = hg.evaluate(IN_VIEW_BOX)
        assert cid, "no collapsed box in the first view"
        hg.locator(f'.tkx-gn[data-id="{cid}"]').click()
        after = hg.evaluate(MEASURE)
        assert hg.locator(f'.tkx-gc[data-id="{cid}"]').count() == 1, f"{cid} did not open"
        assert after["boxes"] > before["boxes"] - 1 and after["open"] == before["open"] + 1, (before, after)
        # its title collapses it again
        hg.locator(f'.tkx-gc[data-id="{cid}"] [data-hg-toggle]').click()
        assert hg.locator(f'.tkx-gn[data-id="{cid}"]').count() == 1
        assert errors == [], errors
        assert all(u.startswith(("file:", "data:")) for u in requests), requests  # nothing fetched
    finally:
        page.close()


def test_search_a_module_path_then_click_its_op(browser, reports):  # noqa: F811
    """Find blocks.1.attn, see it drawn and marked, expand it, click one of its ops: the op's CUDA
    lines light up in the CUDA section (the report's linked views) and the side bar names its module,
    fusion group, arena slot, CUDA lines and the predicted µs of its group."""
    page, errors, _ = _open(browser, reports("tiny_gpt"))
    try:
        hg = page.locator("#tkx-sec-optimized .tkx-hg").first
        hg.scroll_into_view_if_needed()
        hg.locator(".tkx-hg-search").fill("blocks.1.attn")
        hg.locator(".tkx-hg-search").press("Enter")
        found = hg.locator(".tkx-hg-found")
        assert found.count() == 1
        fid = found.get_attribute("data-id")
        assert fid.endswith("blocks.1.attn"), fid
        assert "match" in hg.locator(".tkx-hg-hits").inner_text() or "of" in hg.locator(".tkx-hg-hits").inner_text()
        found.click()                               # a collapsed module: expands
        assert hg.locator(f'.tkx-gc[data-id="{fid}"]').count() == 1
        # open what is inside until an op of the module is drawn, then click it
        for _ in range(4):
            ops = hg.locator('.tkx-gn.tkx-hg-op[data-tkx-module="blocks.1.attn"]')
            if ops.count():
                break
            hg.locator(f'.tkx-gn.tkx-hg-c[data-id^="{fid}/"]').first.click()
        key = hg.locator('.tkx-gn.tkx-hg-op[data-tkx-module="blocks.1.attn"]').first.get_attribute("data-tkx-key")
        hg.locator(".tkx-hg-search").fill(key[3:])     # its op id: centred in the view
        hg.locator(".tkx-hg-search").press("Enter")
        op = hg.locator(f'.tkx-gn[data-tkx-key="{key}"]')
        op.click()
        assert page.evaluate("document.body.getAttribute('data-tkx-selected')") == key
        lit = page.locator("#tkx-sec-cuda .tkx-hl")
        assert lit.count() >= 1, f"clicking {key} in the graph lit no CUDA line"
        assert "tkx-hl" in (op.get_attribute("class") or "")
        # the side bar says what the op is: its module, fusion group, arena slot, CUDA lines, predicted µs
        side = page.inner_text("#tkx-selection")
        assert "module blocks.1.attn · Attention" in side, side
        assert re.search(r"fusion group g\d+ \(\w+\), stage \d+", side), side
        assert "arena slot " in side and re.search(r"CUDA lines \d+: \d+", side), side
        assert re.search(r"predicted \d+\.\d\d µs for group g\d+", side), side
        assert errors == [], errors
    finally:
        page.close()


def test_search_by_op_id_and_aten_name(browser, reports):  # noqa: F811
    page, errors, _ = _open(browser, reports("gpt_block"))
    try:
        hg = page.locator("#tkx-sec-captured .tkx-hg").first
        hg.scroll_into_view_if_needed()
        search = hg.locator(".tkx-hg-search")
        search.fill("aten.mm.default")              # an aten op name: several FX nodes
        search.press("Enter")
        assert hg.locator(".tkx-hg-found").count() == 1
        assert "of" in hg.locator(".tkx-hg-hits").inner_text()
        hg2 = page.locator("#tkx-sec-optimized .tkx-hg").first
        op_key = page.evaluate("() => document.querySelector('#tkx-sec-optimized .tkx-ir [data-tkx-key^=\"op:\"]')"
                               ".getAttribute('data-tkx-key')")
        hg2.scroll_into_view_if_needed()
        hg2.locator(".tkx-hg-search").fill(op_key[3:])     # an op id
        hg2.locator(".tkx-hg-search").press("Enter")
        found = hg2.locator(".tkx-hg-found")
        assert found.count() == 1 and found.get_attribute("data-tkx-key") == op_key
        assert errors == [], errors
    finally:
        page.close()
