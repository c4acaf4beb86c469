"""The exported report in a real headless browser: clicking an IR op highlights its CUDA lines.

Playwright for Python drives Debian's ``chromium`` (``apt-get install chromium``); no browser is
ever downloaded (``playwright install`` is never run). Skips when either is missing. A
screenshot of the page after the click is kept under ``test-artifacts/browser/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tkx

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "browser"

# [section, key] of every element keyed op:<id> in the given sections whose op some element of
# the CUDA view carries in data-tkx-ids; plus counts for the error messages.
LINKED_OPS = """(sections) => {
  const cuda = new Set();
  document.querySelectorAll('#tkx-sec-cuda [data-tkx-ids]').forEach(e =>
    e.getAttribute('data-tkx-ids').split(' ').forEach(t => { if (t.startsWith('op:')) cuda.add(t); }));
  const out = [];
  let keyed = 0;
  for (const sec of sections) {
    document.querySelectorAll('#' + sec + ' [data-tkx-key^="op:"]').forEach(e => {
      const key = e.getAttribute('data-tkx-key');
      keyed += 1;
      if (cuda.has(key)) out.push([sec, key]);
    });
  }
  return {ops: out, cudaOps: cuda.size, keyed: keyed};
}"""
IR_SECTIONS = ["tkx-sec-optimized", "tkx-sec-program"]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); no browser is downloaded")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def digits_report(tmp_path_factory) -> Path:
    ex = tkx.examples.get("digits_mlp")
    path = tmp_path_factory.mktemp("browser") / "digits_mlp.html"
    tkx.report(ex.step_fn, ex.example_inputs, path, name=ex.name, loss=ex.loss_output, description=ex.description)
    return path


def click_and_check(browser, report: Path, sections: list[str], shot_name: str) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    requests: list[str] = []
    page.on("request", lambda req: requests.append(req.url))
    try:
        page.goto(report.as_uri())
        page.wait_for_selector("#tkx-sec-cuda")
        found = page.evaluate(LINKED_OPS, sections)
        assert found["keyed"] > 0, f"no element keyed op:<id> (data-tkx-key) in {sections}"
        assert found["cudaOps"] > 0, "no element of the CUDA view carries op:<id> in data-tkx-ids"
        assert found["ops"], f"no op in {sections} has CUDA lines"
        section, key = found["ops"][0]
        row = page.locator(f'#{section} [data-tkx-key="{key}"]').first
        row.scroll_into_view_if_needed()
        row.click()

        page.wait_for_selector("#tkx-sec-cuda .tkx-hl", state="attached", timeout=5000)
        lit = page.locator("#tkx-sec-cuda .tkx-hl")
        assert lit.count() >= 1
        assert key in (lit.first.get_attribute("data-tkx-ids") or "").split()
        assert page.evaluate("document.body.getAttribute('data-tkx-selected')") == key
        assert "tkx-hl" in (row.get_attribute("class") or "")
        assert key in page.inner_text("#tkx-selection")  # the side bar names the selection

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / shot_name
        page.screenshot(path=str(shot))
        print(f"\nscreenshot: {shot} (clicked {key} in #{section})")

        # the side bar's "back to it" returns to the clicked element
        page.click("#tkx-selection [data-tkx-back]")
        page.wait_for_function("(el) => { const r = el.getBoundingClientRect(); "
                               "return r.bottom > 0 && r.top < window.innerHeight; }", arg=row.element_handle())
        assert errors == [], errors
        assert all(u.startswith(("file:", "data:")) for u in requests), requests
    finally:
        page.close()


def test_click_ir_op_highlights_cuda_lines(browser, digits_report):
    """The design's end-to-end link: an IR op row (op:<id>) -> its lines in the CUDA view."""
    click_and_check(browser, digits_report, IR_SECTIONS, "report-digits_mlp-ir-click.png")


def test_click_any_op_highlights_cuda_lines(browser, digits_report):
    """The same from whichever stage view keys ops (e.g. the schedule's op chips)."""
    sections = ["tkx-sec-captured", *IR_SECTIONS, "tkx-sec-passes", "tkx-sec-schedule", "tkx-sec-arena"]
    click_and_check(browser, digits_report, sections, "report-digits_mlp-click.png")


def test_report_top_screenshot(browser, digits_report):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(digits_report.as_uri())
        assert page.title() == "tkx report: digits_mlp"
        toc = page.locator(".tkx-r-toc a")
        assert toc.count() == len(tkx.pipeline.STAGES)  # one entry per stage of the pipeline table
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "report-digits_mlp-top.png"
        page.screenshot(path=str(shot))
        print(f"\nscreenshot: {shot}")
    finally:
        page.close()


# -- links both ways, scrolling inside the box, zoom ------------------------------------------------
def _page(browser):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page, errors


def _shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / name
    page.screenshot(path=str(shot))
    print(f"\nscreenshot: {shot}")
    return shot


# The first CUDA line (in the kernel body) that carries an op, a group and an arena slot.
FIRST_LINKED_LINE = """() => {
  for (const e of document.querySelectorAll('#tkx-sec-cuda .tkx-scroll [data-tkx-key^="line:"]')) {
    const ids = e.getAttribute('data-tkx-ids').split(' ');
    const op = ids.find(t => t.startsWith('op:')), grp = ids.find(t => t.startsWith('grp:')),
          buf = ids.find(t => t.startsWith('buf:'));
    if (op && grp && buf) return {line: e.getAttribute('data-tkx-key'), op, grp, buf};
  }
  return null;
}"""

# Whether an element is visible inside its nearest scrolling box and that box on screen.
IN_BOX = """(el) => {
  const box = el.closest('.tkx-scroll'); const r = el.getBoundingClientRect(), b = box.getBoundingClientRect();
  return {inBox: r.top >= b.top - 1 && r.bottom <= b.bottom + 1, boxTop: box.scrollTop};
}"""


def test_click_cuda_line_highlights_its_op_group_and_slot(browser, digits_report):
    page, errors = _page(browser)
    try:
        page.goto(digits_report.as_uri())
        found = page.evaluate(FIRST_LINKED_LINE)
        assert found, "no CUDA line carries an op, a group and an arena slot"
        line = page.locator(f'#tkx-sec-cuda [data-tkx-key="{found["line"]}"]').first
        line.scroll_into_view_if_needed()
        y = page.evaluate("window.scrollY")
        line.click()
        assert page.evaluate("window.scrollY") == y, "the click moved the page"
        # its op (in the IR after the passes), its group (in the schedule) and its slot (in the arena)
        for sec, key in (("tkx-sec-optimized", found["op"]), ("tkx-sec-schedule", found["grp"]),
                         ("tkx-sec-arena", found["buf"])):
            el = page.locator(f'#{sec} [data-tkx-key="{key}"]').first
            assert "tkx-hl" in (el.get_attribute("class") or ""), (sec, key)
        side = page.inner_text("#tkx-selection")
        assert "nothing else on the page is linked" not in side
        for title in ("IR after the passes", "Fused schedule", "Arena"):
            assert title in side, side
        _shot(page, "report-digits_mlp-cuda-line-click.png")
        assert errors == [], errors
    finally:
        page.close()


def test_click_op_scrolls_its_cuda_lines_into_the_cuda_box(browser, digits_report):
    page, errors = _page(browser)
    try:
        page.goto(digits_report.as_uri())
        # an op whose first CUDA line is far below the top of the CUDA box
        key = page.evaluate("""() => {
          const box = document.querySelector('#tkx-sec-cuda .tkx-scroll');
          let best = null, depth = 0;
          document.querySelectorAll('#tkx-sec-optimized [data-tkx-key^="op:"]').forEach(e => {
            const k = e.getAttribute('data-tkx-key');
            const line = [...box.querySelectorAll('[data-tkx-ids]')].find(
                l => l.getAttribute('data-tkx-ids').split(' ').includes(k));
            if (line && line.offsetTop > depth) { depth = line.offsetTop; best = k; }
          });
          return best;
        }""")
        assert key, "no op of the optimized IR has CUDA lines"
        box = page.locator("#tkx-sec-cuda .tkx-scroll")
        assert box.evaluate("b => b.scrollTop") == 0
        row = page.locator(f'#tkx-sec-optimized [data-tkx-key="{key}"]').first
        row.scroll_into_view_if_needed()
        y = page.evaluate("window.scrollY")
        row.click()
        assert page.evaluate("window.scrollY") == y, "the click moved the page"
        lit = page.locator('#tkx-sec-cuda .tkx-scroll [data-tkx-key^="line:"].tkx-hl').first
        where = lit.evaluate(IN_BOX)
        assert where["boxTop"] > 0 and where["inBox"], where
        assert errors == [], errors
    finally:
        page.close()


def test_arena_slot_lights_its_op_and_cuda_lines(browser, digits_report):
    page, errors = _page(browser)
    try:
        page.goto(digits_report.as_uri())
        found = page.evaluate(FIRST_LINKED_LINE)
        slot = page.locator(f'#tkx-sec-arena [data-tkx-key="{found["buf"]}"]').first
        slot.scroll_into_view_if_needed()
        slot.click()
        lines = page.locator('#tkx-sec-cuda .tkx-scroll [data-tkx-key^="line:"].tkx-hl')
        assert lines.count() >= 1
        assert found["buf"] in (lines.first.get_attribute("data-tkx-ids") or "").split()
        op = found["buf"].replace("buf:", "op:")
        # its row of the IR listing, and its box in the section's graph when the first view draws it
        assert page.locator(f'#tkx-sec-optimized .tkx-view [data-tkx-key="{op}"].tkx-hl').count() == 1
        assert page.locator(f'#tkx-sec-optimized .tkx-hg [data-tkx-key="{op}"]:not(.tkx-hl)').count() == 0
        assert errors == [], errors
    finally:
        page.close()


def test_zoom_and_pan_on_the_ir_graph(browser, digits_report):
    page, errors = _page(browser)
    try:
        page.goto(digits_report.as_uri())
        sec = page.locator("#tkx-sec-program")
        details = sec.locator("details:has(.tkx-zoom)").first
        if not details.evaluate("d => d.open"):
            details.locator("summary").first.click()
        zoom = sec.locator(".tkx-zoom").first
        bar = zoom.locator(".tkx-zbar")
        assert bar.is_visible(), "the zoom buttons stay hidden: the script did not run"
        img = zoom.locator("img")
        fit = img.evaluate("i => [i.clientWidth, i.naturalWidth]")
        assert 0 < fit[0] < fit[1], f"the graph is not scaled down to fit: {fit}"
        zoom.scroll_into_view_if_needed()
        y = page.evaluate("window.scrollY")
        bar.locator('[data-tkx-z="1"]').click()  # 100%: the graph at its own size, text legible
        assert img.evaluate("i => i.clientWidth") == fit[1]
        assert zoom.get_attribute("data-tkx-zoom") == "1.00"
        bar.locator('[data-tkx-z="in"]').click()
        assert img.evaluate("i => i.clientWidth") > fit[1]
        # pan: drag the image left, the box scrolls right; the page does not move
        box = img.bounding_box()
        page.mouse.move(box["x"] + 400, box["y"] + 300)
        page.mouse.down()
        page.mouse.move(box["x"] + 100, box["y"] + 200, steps=5)
        page.mouse.up()
        assert zoom.evaluate("z => z.scrollLeft") > 0
        assert page.evaluate("window.scrollY") == y
        _shot(page, "report-digits_mlp-ir-graph-zoomed.png")
        bar.locator('[data-tkx-z="fit"]').click()
        assert img.evaluate("i => i.clientWidth") == fit[0]
        assert errors == [], errors
    finally:
        page.close()
