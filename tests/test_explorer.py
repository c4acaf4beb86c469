"""The explorer widgets, driven from Python by setting ``.value`` (no browser, no GPU).

Benchmarks here use ``fake_bench``: a stand-in for :func:`tkx.bench.compare` that returns
made-up numbers marked FAKE; the real benchmark needs a GPU (tests/test_gpu.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

import ipywidgets as W  # noqa: E402
import torch  # noqa: E402

import tkx  # noqa: E402
from tkx.bench.report import BenchmarkReport, Row  # noqa: E402
from tkx.explorer import Explorer, LinkedView, PassStepper, link_info, side_by_side_html, widget  # noqa: E402
from tkx.explorer.assets import read_asset  # noqa: E402
from tkx.explorer.benchmark import PhaseTracker, history_html  # noqa: E402
from tkx.explorer.core import Debouncer, Shown, restart_from, stage_diff  # noqa: E402
from tkx.explorer.widget import STAGE_TABS  # noqa: E402
from tkx.options import Options  # noqa: E402


# -- helpers ------------------------------------------------------------------------------------
class ManualScheduler:
    """A debounce scheduler the test fires by hand."""

    class Handle:
        def __init__(self, cb):
            self.cb, self.cancelled = cb, False

        def cancel(self):
            self.cancelled = True

    def __init__(self):
        self.handles = []

    def __call__(self, delay, cb):
        h = self.Handle(cb)
        self.handles.append(h)
        return h

    @property
    def live(self):
        return [h for h in self.handles if not h.cancelled]

    def fire(self):
        for h in self.live:
            h.cancelled = True
            h.cb()


def make_fake_bench(tkx_us=30.0, seen=None, explorer_ref=None, fail=None):
    """FAKE benchmark: made-up numbers in the shape of tkx.bench.compare's report, logging the same lines."""

    def fake_bench(step_fn, example_inputs, *, options=None, make_inputs=None, name=None, loss=None, log=None):
        if explorer_ref:
            seen.append(("button disabled while running", explorer_ref[0].bench_button.disabled))
        log(f"[{name}] building the megakernel")
        log(f"[{name}] FAKE resources")
        log(f"[{name}] verifying against eager and the reference interpreter")
        if fail:
            raise RuntimeError(fail)
        log(f"[{name}] FAKE verification passed")
        rows = []
        for cand, us in (("eager", 1300.0), ("eager+cudagraph", 45.0), ("inductor", 24.0),
                         ("inductor-max-autotune", 20.0), ("tkx", tkx_us), ("tkx graph of kernels", 40.0)):
            log(f"[{name}] timing {cand}")
            rows.append(Row.measured(cand, [us] * 7, 100, note="FAKE"))
            log(f"[{name}]   {cand}: {us:.1f} µs/step")
        return BenchmarkReport(f"FAKE {name}", tuple(rows), {"passed": True}, {}, {}, {"speed_of_light_us": 3.0},
                               {"fake": True, "device": "FAKE (no GPU)", "options": repr(options)})

    fake_bench.fake = True
    return fake_bench


@pytest.fixture(scope="module")
def digits():
    ex = tkx.examples.get("digits_mlp")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output)
    exp.stages("cuda")
    return exp


def fresh(exp):
    """A copy sharing captured/program/passes but scheduling anew (sees rules registered since)."""
    return restart_from(exp, "schedule")


def html_of(out: W.Output) -> str:
    return "".join(o["data"].get("text/html", "") for o in out.outputs)


def text_of(out: W.Output) -> str:
    return "".join(o["data"].get("text/plain", "") for o in out.outputs)


# -- controls -----------------------------------------------------------------------------------------
def test_controls_come_from_fields_info(digits):
    e = Explorer(digits, debounce_s=0)
    for name, _default, _allowed, help_text in Options.fields_info():
        if name in ("passes", "rules"):  # shown as per-pass / per-rule toggles instead
            assert name not in e.controls
            continue
        c = e.controls[name]
        tip = c.number.tooltip if hasattr(c, "number") else c.tooltip  # optional ints: on the children
        assert help_text in tip
        assert c.value == getattr(digits.options, name)
    assert isinstance(e.controls["fuse_pointwise"], W.Checkbox)
    assert isinstance(e.controls["tile_m"], W.Dropdown)
    assert list(dict(e.controls["split_k"].options).values()) == ["auto", "off", 2, 4, 8, 16]
    assert isinstance(e.controls["blocks_per_sm"], W.BoundedIntText)
    assert (e.controls["blocks_per_sm"].min, e.controls["blocks_per_sm"].max) == (1, 8)
    assert e.controls["max_blocks"].value is None  # "None (no cap)" + IntText
    assert set(e.pass_toggles) >= set(tkx.passes.registry.DEFAULT_PIPELINE)
    assert all(cb.value for cb in e.pass_toggles.values() if "(user)" not in cb.description)
    assert e.message.value == ""
    assert tkx.explorer.widget is widget and isinstance(widget(digits), Explorer)
    assert tkx.Explorer is Explorer and tkx.PassStepper is PassStepper


def test_optional_int_control_round_trips(digits):
    e = Explorer(digits, debounce_s=0)
    c = e.controls["max_blocks"]
    c.value = 64
    assert e.exploration.options.max_blocks == 64 and not c.number.disabled
    c.none_box.value = True
    assert c.value is None and e.exploration.options.max_blocks is None


def test_tile_m_recomputes_only_downstream_stages(digits):
    e = Explorer(digits, debounce_s=0)
    e.controls["tile_m"].value = 32
    u = e.last_update
    assert u["changed"] == {"tile_m": 32}
    assert u["recomputed"] == ["schedule", "arena", "cuda"]
    assert u["error"] is None
    ex = e.exploration
    assert ex.options.tile_m == 32
    assert ex.captured is digits.captured and ex.program is digits.program and ex.passes is digits.passes
    assert ex.schedule is not digits.schedule
    assert e.previous is digits
    print(f"\ndigits_mlp tile_m 64->32: recomputed {u['recomputed']} in {u['ms']:.1f} ms "
          f"(per stage {u['stage_ms']}), widget bookkeeping {u['render_ms']:.1f} ms")


def test_pass_toggle_recomputes_from_passes(digits):
    e = Explorer(digits, debounce_s=0)
    e.pass_toggles["cse"].value = False
    u = e.last_update
    assert u["recomputed"] == ["passes", "schedule", "arena", "cuda"]
    assert "cse" not in e.exploration.options.passes
    assert "cse" not in e.exploration.passes.names
    e.pass_toggles["cse"].value = True
    assert e.exploration.options.passes is None  # back to the default pipeline


def test_stage_tabs_render_their_objects_lazily(digits):
    e = Explorer(digits, debounce_s=0)
    assert e.selected_tab == "graph" and e.outputs["graph"].outputs
    assert "schedule" in e.stale and not e.outputs["schedule"].outputs
    e.select_tab("schedule")
    assert "schedule" not in e.stale
    assert text_of(e.outputs["schedule"]).startswith(repr(digits.schedule)[:20])
    e.render_all()
    assert not e.stale
    before = e.outputs["schedule"].outputs
    e.controls["tile_n"].value = 32
    assert e.outputs["schedule"].outputs is not before  # the visible tab is redrawn at once
    # recomputed (runner: always; the predicted timeline: computed when shown), drawn when opened
    assert e.stale == {"arena", "CUDA", "runner", "timeline"}
    e.render_all()
    assert not e.stale
    for title in ("graph", "IR", "passes", "schedule", "arena", "CUDA", "runner", "benchmark"):
        assert e.outputs[title].outputs, title
        assert "Traceback" not in html_of(e.outputs[title])


def test_debounce_two_quick_changes_make_one_update(digits):
    sched = ManualScheduler()
    e = Explorer(digits, debounce_s=0.3, scheduler=sched)
    e.controls["tile_m"].value = 32
    e.controls["tile_n"].value = 32
    assert e.update_count == 0 and e.pending
    assert len(sched.handles) == 2 and len(sched.live) == 1  # the first timer was cancelled
    sched.fire()
    assert e.update_count == 1
    assert e.last_update["changed"] == {"tile_m": 32, "tile_n": 32}
    assert e.last_update["recomputed"] == ["schedule", "arena", "cuda"]
    # flush() applies pending changes now
    e.controls["tile_k"].value = 16
    assert e.flush() and e.update_count == 2 and not e.pending
    assert e.exploration.options.tile_k == 16
    assert not e.flush()


def test_debounce_with_the_default_timer(digits):
    e = Explorer(digits, debounce_s=0.05)  # no asyncio loop under pytest: a threading.Timer
    e.controls["tile_m"].value = 32
    e.controls["tile_m"].value = 16
    deadline = time.time() + 10
    while e.update_count == 0 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    assert e.update_count == 1 and e.exploration.options.tile_m == 16


def test_debouncer_alone():
    calls = []
    d = Debouncer(lambda: calls.append(1), 0)
    d.trigger()
    d.trigger()
    assert calls == [1, 1]  # delay 0: every trigger runs at once


# -- errors ---------------------------------------------------------------------------------------------
def test_bad_combination_shows_the_message_and_keeps_the_old_state(digits):
    e = Explorer(digits, debounce_s=0.3, scheduler=ManualScheduler())
    e.select_tab("schedule")
    e.controls["tile_m"].value = 32
    e.flush()
    good, shown = e.exploration, e.outputs["schedule"].outputs
    e.controls["threads_per_block"].value = 64
    e.controls["tile_m"].value = 128
    e.flush()
    assert "invalid combination tile_m=128" in e.message.value
    assert "Traceback" not in e.message.value and "last good state" in e.message.value
    assert e.last_update["error"] and e.last_update["recomputed"] == []
    assert e.exploration is good and e.outputs["schedule"].outputs is shown
    assert e.controls["tile_m"].value == 128  # the control keeps what the user chose
    e.controls["tile_m"].value = 16  # 16*64/64 = 16 elements per thread: valid again
    e.flush()
    assert e.message.value == "" and e.exploration.options.threads_per_block == 64


def test_failed_stage_shows_the_message_and_keeps_the_old_state(digits):
    @tkx.register_pass("explorer_test_broken", replace=True)
    def broken(program):
        raise ValueError("boom: this user pass is broken on purpose")

    try:
        e = Explorer(digits, debounce_s=0)
        toggle = e.pass_toggles["explorer_test_broken"]
        assert toggle.description.endswith("(user)") and not toggle.value
        assert toggle in e.user_box.children
        good = e.exploration
        toggle.value = True
        assert "boom: this user pass is broken on purpose" in e.message.value
        assert "stage passes failed" in e.message.value and "Traceback" not in e.message.value
        assert e.last_update["failed_stage"] == "passes"
        assert e.exploration is good
        toggle.value = False
        assert e.message.value == ""
    finally:
        tkx.passes.registry.unregister_pass("explorer_test_broken")


def test_a_step_that_cannot_be_captured_is_explained_in_every_tab():
    def step(x):
        return torch.nonzero(x).sum()  # data-dependent shape: tkx refuses it

    e = Explorer(step, (torch.randn(8),), debounce_s=0)
    assert "stage captured failed" in e.message.value and "nonzero" in e.message.value
    e.render_all()
    for title in ("graph", "IR", "CUDA"):
        assert text_of(e.outputs[title]).startswith(f"{dict(STAGE_TABS)[title]}: not available")
        assert "Traceback" not in html_of(e.outputs[title])
    e.controls["tile_m"].value = 32  # still no traceback, still the message
    assert e.last_update["failed_stage"] == "captured" and "nonzero" in e.message.value
    e.controls["tile_m"].value = 64  # back to the start options: still broken, still said
    assert "nonzero" in e.message.value


def test_a_broken_view_shows_text_not_a_traceback():
    class Broken:
        def _repr_mimebundle_(self, include=None, exclude=None):
            raise RuntimeError("renderer exploded")

        def __str__(self):
            return "broken object text"

    b = Shown(Broken()).bundle()
    assert "broken object text" in b["text/html"] and "renderer exploded" in b["text/html"]
    assert "Traceback" not in b["text/html"]


# -- diffs ----------------------------------------------------------------------------------------------
def test_diff_toggle_shows_previous_to_current(digits):
    e = Explorer(digits, debounce_s=0)
    e.select_tab("arena")
    e.diff_toggles["arena"].value = True
    assert "no previous state yet" in text_of(e.outputs["arena"])
    e.controls["tile_m"].value = 32
    out = e.outputs["arena"]
    assert "previous -&gt; current" in html_of(out) or "previous -> current" in html_of(out)
    e.select_tab("IR")
    e.diff_toggles["IR"].value = True
    assert "unchanged" in text_of(e.outputs["IR"])  # the program was reused
    e.diff_toggles["IR"].value = False
    assert text_of(e.outputs["IR"]) == repr(e.exploration.program) or e.outputs["IR"].outputs


def test_stage_diff_falls_back_to_a_text_diff():
    class Plain:
        def __init__(self, text):
            self.text = text

        def __str__(self):
            return self.text

    d = stage_diff(Plain("a\nb\nc"), Plain("a\nB\nc"))
    assert "-b" in d and "+B" in d


# -- user passes and rules ------------------------------------------------------------------------------------
def test_user_fusion_rule_is_a_toggle(digits):
    @tkx.fusion_rule("explorer-test-keep-exp", kinds=("inline",), replace=True)
    def keep_exp(c):
        """keep exp materialised"""
        if c.producer.kind == "exp":
            return tkx.keep("user", "not fused: the explorer test keeps exp")
        return None

    try:
        e = Explorer(fresh(digits), debounce_s=0)
        toggle = e.rule_toggles["explorer-test-keep-exp"]
        assert toggle.value and toggle in e.user_box.children
        rules_used = {d.rule for d in e.exploration.schedule.decisions}
        assert "explorer-test-keep-exp" in rules_used
        toggle.value = False
        u = e.last_update
        assert u["recomputed"] == ["schedule", "arena", "cuda"]
        assert u["changed"] == {"rules": {"disabled": ["explorer-test-keep-exp"]}}
        assert "explorer-test-keep-exp" not in {d.rule for d in e.exploration.schedule.decisions}
        # the switch is local to this explorer: the registry is intact
        from tkx.schedule.rules import active_rules

        assert "explorer-test-keep-exp" in [r.name for r in active_rules()]
        toggle.value = True
        assert "explorer-test-keep-exp" in {d.rule for d in e.exploration.schedule.decisions}
    finally:
        tkx.schedule.remove_fusion_rule("explorer-test-keep-exp")


def test_passes_registered_later_appear_after_refresh(digits):
    e = Explorer(digits, debounce_s=0)

    @tkx.register_pass("explorer_test_identity", replace=True)
    def identity(program):
        return program

    try:
        assert "explorer_test_identity" not in e.pass_toggles
        e.refresh()
        assert not e.pass_toggles["explorer_test_identity"].value
        e.pass_toggles["explorer_test_identity"].value = True
        names = e.exploration.passes.names
        assert "explorer_test_identity" in names and names.index("explorer_test_identity") < names.index("dce")
    finally:
        tkx.passes.registry.unregister_pass("explorer_test_identity")


# -- benchmark --------------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU state")
def test_benchmark_button_is_disabled_without_a_gpu(digits):
    e = Explorer(digits, debounce_s=0)
    assert e.bench_button.disabled
    assert "no CUDA GPU" in e.bench_button.tooltip and "torch.cuda.is_available() is False" in e.bench_button.tooltip
    assert "Benchmark disabled" in e.bench_note.value
    assert e.benchmark() is None and e.history == []
    e.select_tab("runner")
    assert "no CUDA GPU" in html_of(e.outputs["runner"])
    # everything else still works
    e.controls["tile_m"].value = 32
    assert e.last_update["recomputed"] == ["schedule", "arena", "cuda"]


def test_benchmark_history_with_a_fake_bench(digits):
    seen: list = []
    ref: list = []
    e = Explorer(digits, debounce_s=0, bench_fn=make_fake_bench(30.0, seen, ref))
    ref.append(e)
    phases = []
    e.progress.observe(lambda c: phases.append(c["new"]), names="description")
    assert not e.bench_button.disabled and "FAKE" in e.bench_note.value
    e.bench_button.click()
    assert e.wait_benchmark(30)
    assert seen == [("button disabled while running", True)]
    assert not e.bench_button.disabled and e.progress.value == 1.0
    assert [p for p in dict.fromkeys(phases)] == ["compile", "verify", "warm-up", "timing", "done"]
    (row,) = e.history
    assert row["fake"] and row["config"] == "defaults" and row["tkx_us"] == 30.0
    assert row["compile_name"] == "inductor-max-autotune" and row["ratio"] == pytest.approx(1.5)
    assert row["correct"] == "verified"
    assert row["graph_of_kernels_us"] == 40.0 and row["sol_fraction"] == pytest.approx(0.1)
    assert "FAKE" in e.history_table.value and "1.50x" in e.history_table.value
    assert "graph of kernels" in e.history_table.value and ">40.0<" in e.history_table.value
    assert "FAKE #1 defaults" in e.chart.value
    e.select_tab("benchmark")
    assert "FAKE" in text_of(e.outputs["benchmark"])
    e.controls["tile_m"].value = 32
    e.bench_fn = make_fake_bench(10.0)
    e.benchmark(wait=True)
    assert [r["config"] for r in e.history] == ["defaults", "tile_m=32"]
    assert e.history[1]["ratio"] == pytest.approx(0.5)
    assert e.history_table.value.count('class="tkx-explorer-row"') == 2


def test_a_failing_benchmark_is_a_row_not_a_crash(digits):
    e = Explorer(digits, debounce_s=0, bench_fn=make_fake_bench(fail="FAKE device lost"))
    e.benchmark(wait=True)
    (row,) = e.history
    assert row["correct"] == "failed" and row["error"] == "FAKE device lost"
    assert e.progress.bar_style == "danger" and not e.bench_button.disabled
    assert "FAKE device lost" in e.history_table.value


def test_phase_tracker_reads_compare_log_lines():
    t = PhaseTracker(2)
    assert t.feed("[x] building the megakernel")[0] == "compile"
    assert t.feed("[x] verifying against eager")[0] == "verify"
    phase, frac1, text = t.feed("[x] timing eager")
    assert phase == "warm-up" and "eager" in text
    phase, frac2, _ = t.feed("[x]   eager: 1.0 µs/step")
    assert phase == "timing" and frac2 > frac1
    assert "No benchmark yet" in history_html([])


# -- pass stepper and linked views ------------------------------------------------------------------------
def test_pass_stepper_slider_changes_the_shown_step(digits):
    s = PassStepper(digits)
    trace = digits.passes
    assert s.slider.max == len(trace) - 1 and s.step is trace.steps[0]
    first = s.output.outputs
    s.slider.value = 2
    assert s.step is trace.steps[2] and s.output.outputs is not first
    assert trace.steps[2].name in s.label.value
    assert trace.steps[2].name in text_of(s.output) or trace.steps[2].name in html_of(s.output)
    side = PassStepper(digits, view="side_by_side")
    cse = trace["cse"]
    side.slider.value = trace.names.index("cse")
    h = html_of(side.output)
    assert f"before {cse.name}" in h and f"after {cse.name}" in h
    assert h.count('data-mark="-"') == len(cse.removed) and h.count('data-mark="~"') == 2 * len(cse.changed)
    assert side_by_side_html(cse) in h
    assert PassStepper(digits.program).trace.names == trace.names


def test_linked_view_selection_highlights_lines_block_and_stage(digits):
    v = LinkedView(digits)
    ops = [r["op"] for r in v.data["ir_rows"] if r["op"]]
    assert ops == [op.id for op in digits.optimized.ops]
    assert len(v.data["cuda_lines"]) == digits.cuda.text.count("\n") + 1
    sched, arena, cuda = digits.schedule, digits.arena, digits.cuda
    stored = next(b for b in arena.slots if b in cuda.op_lines)
    v.selected = stored  # what a click does in the browser
    assert v.highlighted_lines == sorted(cuda.op_lines[stored])
    group = sched.group_of(stored).id
    assert v.highlight["group"] == group and v.highlight["stage"] == sched.stage_of(group)
    assert v.highlight["arena"]["offset"] == arena.slots[stored].offset
    inlined = next(iter(sched.inlined), None)
    if inlined is not None:
        info = link_info(digits, inlined)
        assert info["arena"] is None and info["home"].startswith("registers")
    v.selected = ""
    assert v.highlighted_lines == []
    v.set_source(digits.with_options(tile_m=32))
    assert v.data["cuda_lines"]


def test_linked_view_links_both_ways(digits):
    """A CUDA line selects its ops, group and arena slots; an arena slot its op and lines."""
    cuda, sched = digits.cuda, digits.schedule
    buf, lines = next((b, n) for b, n in cuda.arena_lines.items() if b in cuda.op_lines)
    n = next(k for k in lines if any(k in v for v in cuda.op_lines.values())
             and any(a <= k <= b for a, b in cuda.group_lines.values()))
    v = LinkedView(digits)
    v.selected = f"line:{n}"
    hl = v.highlight
    assert hl["cuda_lines"] == [n] and buf in hl["slots"] and hl["ops"]
    assert all(n in cuda.op_lines[o] for o in hl["ops"])
    a, b = cuda.group_lines[hl["group"]]
    assert a <= n <= b and hl["stage"] == sched.stage_of(hl["group"])
    assert hl["text"].startswith(f"CUDA line {n}: op ")
    v.selected = f"slot:{buf}"
    hl = v.highlight
    assert hl["ops"] == [buf] and hl["cuda_lines"] == sorted(cuda.arena_lines[buf]) and n in hl["cuda_lines"]
    assert hl["arena"]["buffer"] == buf and "1 CUDA line" not in hl["text"] or len(hl["cuda_lines"]) == 1
    assert link_info(digits, "slot:nope")["text"].startswith("nope: not an arena slot (the slots: ")
    assert link_info(digits, "line:x")["text"] == "line:x: not a CUDA line (use line:<number>)"


def test_widget_assets_load():
    js, css = read_asset("linked.js"), read_asset("linked.css")
    assert "export default" in js and "model.save_changes" in js
    assert ".tkx-linked-hl" in css
    assert LinkedView._esm == js


# -- timing and import hygiene ------------------------------------------------------------------------------
def test_recompute_time_after_a_toggle_digits_mlp(digits):
    """Measured, printed, not asserted (run with -s to see it)."""
    e = Explorer(digits, debounce_s=0)
    lines = []
    for what, change in (("fuse_pointwise off", lambda: setattr(e.controls["fuse_pointwise"], "value", False)),
                         ("fuse_pointwise on", lambda: setattr(e.controls["fuse_pointwise"], "value", True)),
                         ("tile_m 64->32", lambda: setattr(e.controls["tile_m"], "value", 32)),
                         ("mode grid", lambda: setattr(e.controls["mode"], "value", "grid")),
                         ("pass cse off", lambda: setattr(e.pass_toggles["cse"], "value", False))):
        t0 = time.perf_counter()
        change()
        wall = (time.perf_counter() - t0) * 1e3
        u = e.last_update
        assert u["error"] is None, u
        lines.append(f"  {what:<20} recomputed {'/'.join(u['recomputed']):<30} {u['ms']:7.1f} ms "
                     f"(control to done incl. redraw of the visible tab: {wall:.1f} ms)")
    for tab in ("schedule", "CUDA"):
        e.select_tab(tab)
        t0 = time.perf_counter()
        e.controls["fuse_pointwise"].value = not e.controls["fuse_pointwise"].value
        wall = (time.perf_counter() - t0) * 1e3
        lines.append(f"  fuse_pointwise toggle with the {tab} tab open: recompute {e.last_update['ms']:.1f} ms, "
                     f"control to redrawn tab {wall:.1f} ms")
    print("\ndigits_mlp recompute after a toggle:\n" + "\n".join(lines))


def test_core_imports_without_ipywidgets():
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('ipywidgets', 'anywidget'):
                    raise ImportError('blocked ' + name)
        sys.meta_path.insert(0, Block())
        import tkx
        ex = tkx.examples.get('linear_regression')
        e = tkx.explore(ex.step_fn, ex.example_inputs)
        e.schedule
        try:
            tkx.Explorer
        except ImportError as err:
            print('lazy:', err)
        print('ok')
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout and "lazy: blocked" in r.stdout


@pytest.mark.browser
def test_linked_js_in_headless_chromium(digits):
    """widgets/linked.js with a stand-in anywidget model: a click sets `selected`, `highlight` paints."""
    import os

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        pytest.skip(f"{chromium} is missing (apt-get install chromium); no browser is downloaded")
    from tkx.explorer import link_data

    data = link_data(digits)
    op = next(b for b in digits.arena.slots if b in digits.cuda.op_lines)
    info = link_info(digits, op)
    script = """async ([src, css, data, info, op]) => {
      const style = document.createElement('style'); style.textContent = css; document.head.appendChild(style);
      const state = {data: data, highlight: {}, selected: ''}, handlers = {}, sets = [];
      const model = {get: k => state[k], set: (k, v) => { state[k] = v; sets.push([k, v]); },
                     save_changes() {}, on(ev, f) { (handlers[ev] = handlers[ev] || []).push(f); }, off() {}};
      const el = document.createElement('div'); document.body.appendChild(el);
      const mod = await import(URL.createObjectURL(new Blob([src], {type: 'text/javascript'})));
      mod.default.render({model, el});
      el.querySelector('.tkx-linked-ir [data-op="' + op + '"]').click();
      state.highlight = info;  // what Python answers to `selected`
      handlers['change:highlight'].forEach(f => f());
      return {sets: sets, cuda: el.querySelectorAll('.tkx-linked-cuda .tkx-linked-hl').length,
              ir: el.querySelectorAll('.tkx-linked-ir .tkx-linked-hl').length,
              slot: el.querySelectorAll('.tkx-linked-slot.tkx-linked-hl').length,
              groups: el.querySelectorAll('.tkx-linked-group.tkx-linked-hl').length,
              rows: el.querySelectorAll('.tkx-linked-cuda .tkx-linked-row').length};
    }"""
    args = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=args)
        try:
            page = browser.new_page()
            errors: list = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.set_content("<html><body></body></html>")
            r = page.evaluate(script, [read_asset("linked.js"), read_asset("linked.css"), data, info, op])
        finally:
            browser.close()
    assert not errors
    assert r["sets"] == [["selected", op]]
    assert r["cuda"] == len(info["cuda_lines"]) and r["rows"] == len(data["cuda_lines"])
    assert r["ir"] == 1 and r["slot"] == 1 and r["groups"] == len(info["groups"])
    # and back: a click on a CUDA line selects the line, whose answer lights its op, group and slot
    buf, lines = next((b, n) for b, n in digits.cuda.arena_lines.items() if b in digits.cuda.op_lines)
    n = next(k for k in lines if any(k in v for v in digits.cuda.op_lines.values())
             and any(a <= k <= b for a, b in digits.cuda.group_lines.values()))
    back = script.replace("""el.querySelector('.tkx-linked-ir [data-op="' + op + '"]').click();""",
                          """el.querySelectorAll('.tkx-linked-cuda .tkx-linked-row')[op - 1].click();""")
    line_info = link_info(digits, f"line:{n}")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=args)
        try:
            page = browser.new_page()
            page.set_content("<html><body></body></html>")
            r = page.evaluate(back, [read_asset("linked.js"), read_asset("linked.css"), data, line_info, n])
        finally:
            browser.close()
    assert r["sets"] == [["selected", f"line:{n}"]]
    assert r["cuda"] == 1 and r["ir"] == len(line_info["ops"]) >= 1 and r["slot"] >= 1 and r["groups"] >= 1


def test_prototype_a_fusion_relu_mask_from_the_forward_gemm_tile():
    """The issue's real case: a notebook-cell rule stores the ReLU backward mask from the forward GEMM's
    tile (bias-add + ReLU + mask in one epilogue) instead of recomputing it in the backward; the Explorer
    shows it as a toggle and the schedule diff shows the effect."""
    import tkx
    from tkx import arena as arena_mod
    from tkx.schedule import remove_fusion_rule
    from tkx.schedule.interpreter import run as run_schedule

    ex = tkx.examples.get("digits_mlp")

    @tkx.fusion_rule("relu-mask-in-forward-epilogue", kinds=("inline",), replace=True)
    def relu_mask_in_forward(c):
        if c.producer.kind == "le" and c.producer.region == "backward":
            return tkx.keep("user", "store the ReLU mask from the forward GEMM tile (1 byte) instead of "
                                    "recomputing it from the activations in the backward")
        return None

    try:
        e = Explorer(ex.step_fn, ex.example_inputs, debounce_s=0)
        e.refresh()
        assert "relu-mask-in-forward-epilogue" in e.rule_toggles
        with_rule = e.exploration.schedule
        fwd = next(g for g in with_rule.groups.values()
                   if g.kind == "gemm" and with_rule.op(g.anchor).region == "forward"
                   and any(with_rule.op(o).kind == "le" for o in g.ops))
        assert [with_rule.op(o).kind for o in fwd.ops][:3] == ["mm", "add", "maximum"]
        assert any(with_rule.op(s).kind == "le" for s in fwd.stores)  # the mask is a side output
        e.rule_toggles["relu-mask-in-forward-epilogue"].value = False
        e.flush()
        without = e.exploration.schedule
        assert not any(without.op(s).kind == "le" for g in without.groups.values() for s in g.stores)
        diff = with_rule.diff(without)
        assert diff  # the schedule diff shows the change
        inputs = ex.make_inputs(seed=3)
        ref = tkx.reference.run(with_rule.program, inputs)
        got = run_schedule(with_rule, arena_mod.plan(with_rule), inputs)
        for a, b in zip(got.outputs, ref.outputs):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    finally:
        remove_fusion_rule("relu-mask-in-forward-epilogue")
