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
        assert toc.count() == 8
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "report-digits_mlp-top.png"
        page.screenshot(path=str(shot))
        print(f"\nscreenshot: {shot}")
    finally:
        page.close()
