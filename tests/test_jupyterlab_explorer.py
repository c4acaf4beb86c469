"""The ``tkx.Explorer`` widget works in a real JupyterLab: ``tests/notebooks/explorer.ipynb``.

Reuses the server and browser fixtures of ``tests/test_jupyterlab.py`` (JupyterLab on localhost
with Galata's settings, Debian's ``chromium`` through Playwright). The notebook builds
``tkx.Explorer`` for ``digits_mlp`` with ``debounce_s=0.2``; the test runs all cells from the Run
menu, waits for the widget (option controls and stage tabs), opens the schedule tab, clicks the
``fuse_epilogues`` checkbox in the page and checks that the kernel recomputed the schedule: the view
changes and its decision table says ``fuse_epilogues is off``.

Fails (rather than skips) with the page's text when the widget front-end is missing ("Error
displaying widget", a model not found, or only the text/plain repr shown). Skips like
test_jupyterlab.py without jupyterlab, playwright or ``/usr/bin/chromium``. Screenshots:
``test-artifacts/jupyterlab/explorer-before.png``, ``explorer-after.png`` and ``explorer-headline.png``
(the one-line headline of what the change moved, and the controls' help).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_jupyterlab import NOTEBOOK_STATE, _run_all_from_menu, _screenshot, browser, lab  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = Path(__file__).resolve().parent / "notebooks" / "explorer.ipynb"
RUN_ALL_S = 60
UPDATE_S = 30

# What the Explorer cell's output area shows: rendered widget, a widget error, or a plain repr.
WIDGET_STATE = """() => {
  const cells = document.querySelectorAll('.jp-Notebook .jp-CodeCell');
  const cell = cells[cells.length - 1];
  const area = cell && cell.querySelector('.jp-OutputArea');
  if (!area) return {state: 'none', text: ''};
  const text = area.innerText || '';
  if (/Error displaying widget|model not found|Could not create|Failed to load model class/i.test(text))
    return {state: 'error', text: text.slice(0, 2000)};
  const tabs = Array.from(area.querySelectorAll('.lm-TabBar-tab')).map(t => t.innerText.trim());
  const boxes = area.querySelectorAll('.widget-checkbox').length;
  if (tabs.length && boxes) return {state: 'ready', tabs: tabs, checkboxes: boxes, text: ''};
  return {state: 'pending', text: text.slice(0, 2000)};
}"""

# The text of the schedule tab's view (the stage's .tkx-view inside the selected tab page).
SCHEDULE_TEXT = """() => {
  const v = document.querySelector('.jp-OutputArea .tkx-schedule');
  return v ? v.innerText : null;
}"""


def _broken_children(page) -> list[str]:
    """Child widgets the front-end replaced by its error widget ("Click to show javascript error."):
    each one's error text (shown by clicking it) and the control it sits next to."""
    found = []
    errs = page.locator(".jp-OutputArea .jupyter-widgets-error-widget")
    for i in range(errs.count()):
        e = errs.nth(i)
        prev = e.evaluate("(e) => { const p = e.previousElementSibling; return p ? p.innerText.trim() : ''; }")
        e.click()
        page.wait_for_timeout(200)
        found.append(f"after {prev!r}: {e.inner_text().strip()[:600]!r}")
    return found


def _headline_shot(page, headline) -> Path:
    """A screenshot of the Explorer's top (title, controls with their help, the headline)."""
    from test_jupyterlab import ARTIFACTS

    h = headline.bounding_box()
    top = max(0, h["y"] + h["height"] - 700)
    clip = {"x": 0, "y": top, "width": 1400, "height": h["y"] + h["height"] + 8 - top}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "explorer-headline.png"
    page.screenshot(path=str(path), clip=clip)
    return path


def _cells_done(page) -> dict:
    page.wait_for_function(f"""() => {{ const s = ({NOTEBOOK_STATE})();
        if (!s || s.kernel !== 'idle') return false;
        return s.cells.some(c => c.outputs.some(o => o.type === 'error')) || s.cells.every(c => c.count !== null);
    }}""", timeout=RUN_ALL_S * 1000, polling=250)
    return page.evaluate(NOTEBOOK_STATE)


def test_explorer_flips_fuse_epilogues_in_jupyterlab(lab, browser):  # noqa: F811 - fixtures imported above
    shutil.copy(NOTEBOOK, lab.root / NOTEBOOK.name)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page_errors: list[str] = []
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?reset")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=30_000)
        page.wait_for_function(f"() => {{ const s = ({NOTEBOOK_STATE})(); return s && s.kernel === 'idle'; }}",
                               timeout=30_000, polling=250)
        ran_by = _run_all_from_menu(page)
        state = _cells_done(page)
        bad = [(c["id"], o["ename"] or o["name"], o["text"][-1500:]) for c in state["cells"] for o in c["outputs"]
               if o["type"] == "error" or (o["type"] == "stream" and o["name"] == "stderr")]
        assert not bad, f"cells with errors: {bad}"
        mimes = [m for o in state["cells"][-1]["outputs"] for m in o["mimes"]]
        assert "application/vnd.jupyter.widget-view+json" in mimes, f"the Explorer cell displayed {mimes}"

        # the widget renders: controls and tabs, or the front-end's error message
        try:
            page.wait_for_function(f"() => ['ready', 'error'].includes(({WIDGET_STATE})().state)",
                                   timeout=20_000, polling=250)
        except Exception:  # noqa: BLE001 - reported below with what the output area shows
            pass
        widget = page.evaluate(WIDGET_STATE)
        if widget["state"] != "ready":
            _screenshot(page, "explorer-broken.png")
        assert widget["state"] != "error", f"the widget front-end failed: {widget['text']}"
        assert widget["state"] == "ready", (f"the Explorer widget did not render (widget extension missing?); "
                                            f"the output area shows: {widget['text']!r}; console: {console_errors}")
        assert "schedule" in widget["tabs"], widget
        broken = _broken_children(page)

        # the first screen: headline and pipeline table on top, the options in a collapsed panel
        assert page.locator(".jp-OutputArea .tkx-pipeline").count() == 1
        assert page.locator(".jp-OutputArea .tkx-headline").first.inner_text().strip()
        panel = page.locator(".jp-OutputArea .jupyter-widget-Collapse-header", has_text="options").first
        assert not page.locator(".jp-OutputArea .widget-checkbox", has_text="fuse_epilogues").first.is_visible()
        panel.click()
        groups = page.locator(".jp-OutputArea .tkx-opt-group").all_inner_texts()
        assert groups[:5] == ["fusion", "tiling", "launch", "numerics", "compilation"], groups

        # open the schedule tab (lazy: the kernel renders it when it is selected)
        page.locator(".jp-OutputArea .lm-TabBar-tab", has_text="schedule").first.click()
        page.wait_for_function(f"() => ({SCHEDULE_TEXT})() !== null", timeout=UPDATE_S * 1000, polling=200)
        before = page.evaluate(SCHEDULE_TEXT)
        box = page.locator(".jp-OutputArea .widget-checkbox").filter(
            has=page.get_by_text("fuse_epilogues", exact=True)).locator("input[type=checkbox]")
        assert box.count() == 1, f"{box.count()} fuse_epilogues checkboxes"
        assert box.is_checked(), "fuse_epilogues should start on"
        shots = _screenshot(page, "explorer-before.png")

        box.scroll_into_view_if_needed()
        box.click()
        assert not box.is_checked()
        # after the 0.2 s debounce the kernel recomputes and re-renders the (selected) schedule tab
        page.wait_for_function(f"(b) => {{ const t = ({SCHEDULE_TEXT})(); return t !== null && t !== b; }}",
                               arg=before, timeout=UPDATE_S * 1000, polling=200)
        page.wait_for_function(f"() => ({SCHEDULE_TEXT})().includes('fuse_epilogues is off')",
                               timeout=5_000, polling=200)
        after = page.evaluate(SCHEDULE_TEXT)
        # the Explorer's status line (an HTML widget): "<changed>: recomputed ... in N ms; reused ..."
        status = page.locator(".jp-OutputArea .widget-html", has_text="recomputed").first.inner_text()
        shots += _screenshot(page, "explorer-after.png")
        # the headline: one line of what the change moved (not "recomputed nothing"), in the page
        headline = page.locator(".jp-OutputArea .tkx-headline").first
        page.wait_for_function("() => { const h = document.querySelector('.jp-OutputArea .tkx-headline');"
                               " return h && h.innerText.startsWith('fuse_epilogues=False: '); }",
                               timeout=UPDATE_S * 1000, polling=200)
        headline_text = headline.inner_text()
        assert "barrier" in headline_text and "recomputed nothing" not in headline_text, headline_text
        headline.scroll_into_view_if_needed()
        shots.append(_headline_shot(page, headline))
        # each control's help is on the page, not only in a tooltip
        area_text = page.locator(".jp-NotebookPanel").first.inner_text()
        for help_text in ("grid-barrier spins before the kernel gives up", "how the kernel is compiled",
                          "resident blocks per SM in the cooperative grid"):
            assert help_text in area_text, help_text
        print(f"\nrun by: {ran_by}; tabs: {widget['tabs']}; checkboxes: {widget['checkboxes']}\n"
              f"status: {status}\nheadline: {headline_text}\n"
              f"schedule text: {len(before)} -> {len(after)} chars\nscreenshots: {', '.join(map(str, shots))}")
        assert "fuse_epilogues is off" not in before
        assert "fuse_epilogues=False" in status, status[-500:]
        # the graph above the linked views: a readable first view; an op clicked there lights its CUDA
        # lines in the linked views
        page.locator(".jp-OutputArea .lm-TabBar-tab", has_text="linked views").first.click()
        page.wait_for_selector(".jp-OutputArea .tkx-hg .tkx-gn", timeout=UPDATE_S * 1000)
        hg = page.locator(".jp-OutputArea .tkx-hg").first
        m = hg.evaluate("""(el) => { const t = Array.from(el.querySelectorAll('.tkx-gn text'));
            const px = t.map(x => parseFloat(getComputedStyle(x).fontSize) * x.getScreenCTM().a);
            return {boxes: el.querySelectorAll('.tkx-gn').length, minPx: Math.min(...px)}; }""")
        assert 1 <= m["boxes"] <= 60 and m["minPx"] >= 11, m
        hg.locator(".tkx-hg-search").fill("mm")
        hg.locator(".tkx-hg-search").press("Enter")
        hg.locator(".tkx-hg-found").click()
        page.wait_for_selector(".jp-OutputArea .tkx-linked .tkx-linked-hl", timeout=UPDATE_S * 1000)
        # the info line names the op's group, its predicted µs (cost model, no GPU), its arena slot, its lines
        info = page.locator(".jp-OutputArea .tkx-linked-info").first.inner_text()
        assert re.match(r"mm \(mm, forward\): group g\d+, stage \d+, predicted \d+\.\d\d µs; (arena slot bytes|value in) .+; "
                        r"\d+ CUDA lines \(\d+", info), info
        shots += _screenshot(page, "explorer-graph.png")
        # a child widget the front-end could not create shows "Click to show javascript error."
        assert not broken, f"widgets inside the Explorer failed to render: {broken}; console: {console_errors}"
        assert not page_errors, page_errors
    finally:
        page.close()
