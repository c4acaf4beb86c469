"""``Explorer``: option controls, one tab per stage, a pass stepper, linked views and a benchmark.

A thin ipywidgets layer over :class:`~tkx.explorer.core.Session` (updates) and
:mod:`tkx.explorer.benchmark` (history rows): every control is generated from
:meth:`tkx.Options.fields_info`; a change is debounced, then applied with
``Exploration.with_options`` so only the stages downstream of it are recomputed
(:attr:`Explorer.last_update` says which, and how long it took).
"""

from __future__ import annotations

import dataclasses
import html
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W
import traitlets

from .. import display, pipeline
from ..explore import Exploration
from ..options import Options
from . import benchmark as B
from .core import (
    CPU_STAGES,
    HAS_RULES_OPTION,
    Debouncer,
    Note,
    Scheduler,
    Session,
    Shown,
    builtin_passes,
    error_text,
    note_html,
    options_label,
    pass_description,
    pipeline_for,
    pipeline_order,
    stage_diff,
    user_passes,
    user_rules,
)
from .headline import Facts, facts_of, failure_headline, headline

#: (tab title, stage attribute) in display order; ``benchmark`` is not a stage of the exploration.
#: The stage tabs come from the pipeline table (:data:`tkx.pipeline.STAGES`, rows with a ``tab``).
STAGE_TABS = tuple((s.tab, s.name) for s in pipeline.STAGES if s.tab) + (("benchmark", "benchmark"),)
#: Tabs after the stage tabs.
EXTRA_TABS = ("pass stepper", "linked views")

#: Option fields that are sequences, handled by the pass / rule toggles instead of one control.
SEQUENCE_FIELDS = ("passes", "rules")


class OptionalIntText(W.HBox):
    """An integer or ``None``: a "none" checkbox next to an ``IntText``. ``value`` is the result."""

    value = traitlets.Any(None, allow_none=True)

    def __init__(self, value: int | None, *, description: str, none_label: str, lo: int, tooltip: str) -> None:
        self.none_box = W.Checkbox(value=value is None, description=none_label, indent=False, tooltip=tooltip,
                                   layout=W.Layout(width="auto"))
        self.number = W.IntText(value=lo if value is None else value, description=description, tooltip=tooltip,
                                disabled=value is None, style={"description_width": "initial"},
                                layout=W.Layout(width="190px"))
        super().__init__([self.number, self.none_box])
        self.value = value
        # No tooltip on the box itself: JupyterLab's box view reads a `description` it does not
        # have and fails to render (the two children carry the tooltip).
        self.description = description
        self.none_box.observe(self._from_children, names="value")
        self.number.observe(self._from_children, names="value")
        self.observe(self._to_children, names="value")

    def _from_children(self, _change: Any = None) -> None:
        self.number.disabled = self.none_box.value
        self.value = None if self.none_box.value else int(self.number.value)

    def _to_children(self, change: dict[str, Any]) -> None:
        new = change["new"]
        with self.hold_trait_notifications():
            self.none_box.value = new is None
            if new is not None:
                self.number.value = int(new)
            self.number.disabled = new is None


def _label(v: Any) -> str:
    return "None" if v is None else str(v)


def make_control(name: str, value: Any, allowed: Any, help_text: str, none_ok: bool = False) -> W.Widget | None:
    """The control of one :class:`tkx.Options` field (``None`` for fields with no single value)."""
    tip = f"{name}: {help_text}"
    style = {"description_width": "initial"}
    if name in SEQUENCE_FIELDS or allowed is None:
        return None
    if isinstance(allowed, tuple) and allowed and allowed[0] == "range":
        lo, hi = allowed[1], allowed[2]
        if none_ok:
            return OptionalIntText(value, description=name, none_label="None (no cap)", lo=lo, tooltip=tip)
        if hi is None:
            return W.IntText(value=value, description=name, tooltip=tip, style=style, layout=W.Layout(width="230px"))
        return W.BoundedIntText(value=value, min=lo, max=hi, description=name, tooltip=tip, style=style,
                                layout=W.Layout(width="230px"))
    if len(allowed) == 2 and all(isinstance(a, bool) for a in allowed):
        return W.Checkbox(value=bool(value), description=name, tooltip=tip, indent=False, style=style)
    return W.Dropdown(options=[(_label(a), a) for a in allowed], value=value, description=name, tooltip=tip,
                      style=style, layout=W.Layout(width="230px"))


def _none_ok(name: str) -> bool:
    import dataclasses

    for f in dataclasses.fields(Options):
        if f.name == name:
            return bool(f.metadata.get("none_ok"))
    return False


class Explorer(W.VBox):
    """Flip compiler options and watch every stage update; benchmark configurations on a GPU.

    ``Explorer(step_fn, example_inputs, **options)`` or ``Explorer(exploration)``. Keywords:

    * ``name``, ``loss``, ``state``: as for :func:`tkx.explore`; ``make_inputs``: passed to the benchmark;
    * ``debounce_s`` (0.3): control changes within this many seconds make one update (0: each
      change updates at once); ``scheduler``: ``scheduler(delay_s, callback) -> handle`` with
      ``handle.cancel()`` (default: the kernel's asyncio loop, else a thread timer);
      :meth:`flush` applies pending changes now;
    * ``lazy_render`` (True): a tab whose stage changed is re-rendered when it is opened (the
      CUDA view, for one, compiles the kernel with NVRTC to show registers and spills);
      :meth:`render_all` renders them all now;
    * ``bench_fn``: the benchmark (default :func:`tkx.bench.compare`, which needs a GPU: without
      one the button is disabled and says why). A function with ``fake = True`` is shown as FAKE.

    State for code and tests: :attr:`controls` (option -> widget with ``.value``),
    :attr:`pass_toggles`, :attr:`rule_toggles`, :attr:`outputs` (tab -> ``Output``),
    :attr:`diff_toggles`, :attr:`message` (errors), :attr:`last_update`, :attr:`history`,
    :attr:`exploration` (the current good one), :attr:`stepper`, :attr:`linked`.
    """

    def __init__(self, step_fn: Callable[..., Any] | Exploration, example_inputs: Sequence[Any] | None = None, *,
                 name: str | None = None, loss: int | None = None, make_inputs: Callable[..., Any] | None = None,
                 bench_fn: Callable[..., Any] | None = None, debounce_s: float = 0.3,
                 scheduler: Scheduler | None = None, lazy_render: bool = True,
                 registers_in_headline: bool = True, state: Any = None, **options: Any) -> None:
        if isinstance(step_fn, Exploration):
            ex = step_fn.with_options(**options) if options else step_fn
        else:
            if example_inputs is None:
                raise TypeError("Explorer(step_fn, example_inputs, **options) needs example_inputs")
            ex = Exploration(step_fn, example_inputs, Options.make(**options), name=name, loss=loss, state=state)
        self.make_inputs = make_inputs
        self.lazy_render = lazy_render
        #: Tabs whose content is out of date, rendered when opened (or by :meth:`render_all`).
        self.stale: set[str] = set()
        self.bench_fn = bench_fn
        initial_rules = getattr(ex.options, "rules", None) if HAS_RULES_OPTION else None
        off = frozenset() if initial_rules is None else frozenset(
            r.name for r in user_rules() if r.name not in initial_rules)
        self.session = Session(ex, disabled_rules=off)
        self.last_update: dict[str, Any] = {}
        self.update_count = 0
        self.history: list[dict[str, Any]] = []
        self.last_report: Any = None
        self.previous_report: Any = None
        # Baseline rows (eager, CUDA graphs, torch.compile) are timed once per Explorer: they do
        # not depend on tkx's options, and max-autotune alone can take a minute.
        self.baseline_rows: tuple[Any, ...] = ()
        self._bench_thread: threading.Thread | None = None
        self._debouncer = Debouncer(self._apply, debounce_s, scheduler)
        self._pass_order = pipeline_order(ex.options.passes)

        self.title = W.HTML()
        self.controls: dict[str, W.Widget] = {}
        #: Each control's help (from :meth:`tkx.Options.fields_info`), shown under it.
        self.help: dict[str, W.HTML] = {}
        cells = []
        for fname, _default, allowed, help_text in Options.fields_info():
            c = make_control(fname, getattr(ex.options, fname), allowed, help_text, _none_ok(fname))
            if c is not None:
                self.controls[fname] = c
                c.observe(self._on_change, names="value")
                self.help[fname] = W.HTML(help_html(help_text, allowed))
                cells.append(W.VBox([c, self.help[fname]], layout=W.Layout(margin="0 0 4px 0")))
        self.controls_box = W.GridBox(cells,
                                      layout=W.Layout(grid_template_columns="repeat(3, minmax(230px, 1fr))",
                                                      grid_gap="2px 12px"))
        self.pass_toggles: dict[str, W.Checkbox] = {}
        self.rule_toggles: dict[str, W.Checkbox] = {}
        self.passes_box = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.user_box = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.refresh_button = W.Button(description="re-read passes & rules", icon="refresh",
                                       tooltip="show passes and fusion rules registered after this explorer was made",
                                       layout=W.Layout(width="auto"))
        self.refresh_button.on_click(lambda _b: self.refresh())
        self._build_toggles()

        self.message = W.HTML()
        self.status = W.HTML()
        #: The one-line headline of what the last change moved (see :mod:`tkx.explorer.headline`).
        self.headline = W.HTML()
        self.headline_text = ""
        self.facts: Facts | None = None
        self.registers_in_headline = registers_in_headline

        # stage tabs
        self.outputs: dict[str, W.Output] = {}
        self.diff_toggles: dict[str, W.ToggleButton] = {}
        pages = []
        for title, _stage in STAGE_TABS:
            out = W.Output(layout=W.Layout(max_height="640px", overflow="auto"))
            toggle = W.ToggleButton(value=False, description="diff against previous", icon="exchange",
                                    tooltip="show what the last update changed in this stage (previous -> current)",
                                    layout=W.Layout(width="auto"))
            toggle.observe(lambda _c, t=title: self._render(t), names="value")
            self.outputs[title], self.diff_toggles[title] = out, toggle
            if title == "benchmark":
                pages.append(self._build_bench_page(toggle, out))
            else:
                pages.append(W.VBox([toggle, out]))
        self.stepper: Any = None
        self.linked: Any = None
        self.stepper_box = W.VBox()
        self.linked_box = W.VBox()
        pages += [self.stepper_box, self.linked_box]
        self._tab_titles = [t for t, _ in STAGE_TABS] + list(EXTRA_TABS)
        self.tabs = W.Tab(children=pages, titles=self._tab_titles, selected_index=0)
        self.tabs.observe(self._on_tab, names="selected_index")

        super().__init__([self.title, self.controls_box,
                          W.HBox([W.HTML("<b>passes</b>&nbsp;", layout=W.Layout(width="auto")), self.passes_box]),
                          W.HBox([W.HTML("<b>your passes &amp; rules</b>&nbsp;", layout=W.Layout(width="auto")),
                                  self.user_box, self.refresh_button]),
                          self.headline, self.message, self.status, self.tabs])

        upd = self.session.start()
        self.last_update = upd.as_dict()
        self._show_update(upd, first=True)

    def _facts_now(self) -> Facts:
        """The facts of the current state (µs per step from its last benchmark, if any)."""
        ex = self.session.current
        report = self.last_report if getattr(self, "_report_options", None) == ex.options else None
        return facts_of(ex, registers=self.registers_in_headline, report=report)

    @classmethod
    def from_exploration(cls, exploration: Exploration, **kwargs: Any) -> Explorer:
        """An Explorer starting from ``exploration`` (its computed stages are reused)."""
        return cls(exploration, **kwargs)

    # -- state -------------------------------------------------------------------------------
    @property
    def exploration(self) -> Exploration:
        """The current good :class:`~tkx.Exploration` (the one the tabs show)."""
        return self.session.current

    @property
    def previous(self) -> Exploration | None:
        """The exploration before the last successful update (what the diffs compare with)."""
        return self.session.previous

    def desired_options(self) -> dict[str, Any]:
        """The option values the controls ask for (not validated yet)."""
        out = {name: c.value for name, c in self.controls.items()}
        enabled = {n for n, cb in self.pass_toggles.items() if cb.value}
        out["passes"] = pipeline_for(enabled, self._pass_order)
        return out

    def disabled_rules(self) -> frozenset[str]:
        return frozenset(n for n, cb in self.rule_toggles.items() if not cb.value)

    # -- passes and rules ------------------------------------------------------------------------
    def _build_toggles(self) -> None:
        from ..passes.registry import default_pipeline

        current = self.session.current.options.passes
        chosen = set(default_pipeline() if current is None else current)
        old_pass = {n: cb.value for n, cb in self.pass_toggles.items()}
        old_rule = {n: cb.value for n, cb in self.rule_toggles.items()}
        self.pass_toggles, self.rule_toggles = {}, {}
        builtin, users = builtin_passes(), user_passes()
        for n in builtin + users:
            cb = W.Checkbox(value=old_pass.get(n, n in chosen), description=n + (" (user)" if n in users else ""),
                            tooltip=f"pass {n}: {pass_description(n)}", indent=False,
                            layout=W.Layout(width="auto", margin="0 12px 0 0"))
            cb.observe(self._on_change, names="value")
            self.pass_toggles[n] = cb
        for rule in user_rules():
            doc = rule.doc.splitlines()[0] if rule.doc else "user fusion rule"
            on = old_rule.get(rule.name, rule.name not in self.session.disabled_rules)
            cb = W.Checkbox(value=on, description=f"rule {rule.name}",
                            tooltip=f"fusion rule {rule.name} ({', '.join(rule.kinds)}): {doc}", indent=False,
                            layout=W.Layout(width="auto", margin="0 12px 0 0"))
            cb.observe(self._on_change, names="value")
            self.rule_toggles[rule.name] = cb
        self.passes_box.children = [self.pass_toggles[n] for n in builtin]
        user_widgets: list[W.Widget] = [self.pass_toggles[n] for n in users] + list(self.rule_toggles.values())
        if not user_widgets:
            user_widgets = [W.HTML('<span style="color:#57606a">none registered (use @tkx.register_pass or '
                                   '@tkx.fusion_rule, then "re-read")</span>')]
        self.user_box.children = user_widgets

    def refresh(self) -> None:
        """Re-read the pass and fusion-rule registries (new user passes appear switched off unless
        registered with ``default=True``, new user rules switched on) and recompute from the passes."""
        known = set(builtin_passes()) | set(user_passes())
        self._pass_order = pipeline_order(tuple(n for n in self._pass_order if n in known))
        self._build_toggles()
        self._debouncer.cancel()
        self._apply(force_from="passes")

    # -- updates -----------------------------------------------------------------------------------
    def _on_change(self, _change: Any = None) -> None:
        self._debouncer.trigger()

    @property
    def pending(self) -> bool:
        """Whether a debounced update is waiting."""
        return self._debouncer.pending

    def flush(self) -> bool:
        """Apply pending control changes now (``False`` if none were pending)."""
        return self._debouncer.flush()

    def set_options(self, **values: Any) -> None:
        """Set controls from code (one update after the debounce, like clicks in the browser)."""
        for k, v in values.items():
            if k == "passes":
                from ..passes.registry import default_pipeline

                if v is not None:
                    self._pass_order = pipeline_order(tuple(v))
                wanted = set(default_pipeline() if v is None else v)
                for n, cb in self.pass_toggles.items():
                    cb.value = n in wanted
            elif k in self.controls:
                self.controls[k].value = v
            else:
                raise KeyError(f"no control for option {k!r}; controls: {', '.join(self.controls)}")

    def _apply(self, force_from: str | None = None) -> None:
        try:
            upd = self.session.update(self.desired_options(), self.disabled_rules(), force_from=force_from)
        except Exception as exc:  # never a traceback out of a callback
            self.message.value = note_html(f"update failed: {error_text(exc)}", "error")
            return
        self.update_count += 1
        self.last_update = upd.as_dict()
        self._show_update(upd)

    def _show_update(self, upd: Any, *, first: bool = False) -> None:
        """Show an update: on success re-render the recomputed tabs (and every tab showing a
        diff, whose 'previous' moved); on failure only the message changes."""
        ex, disabled = self.session.current, self.session.disabled_rules
        self.title.value = ('<div style="font-family:system-ui,sans-serif;font-size:15px"><b>tkx Explorer</b> '
                            f'{html.escape(ex.name)} &nbsp;<code>{html.escape(options_label(ex.options, disabled))}'
                            '</code></div>')
        if upd.error:
            where = "invalid options" if upd.failed_stage == "options" else f"stage {upd.failed_stage} failed"
            kept = ("" if first or self.session.broken else
                    f"\nShowing the last good state ({options_label(ex.options, disabled)}).")
            self.message.value = note_html(f"{where}: {upd.error}{kept}", "error")
        else:
            self.message.value = ""
        if upd.error and (first or upd.changed):
            text = failure_headline(upd.changed, upd.failed_stage, upd.ms, upd.recomputed, first=first)
            self.headline.value = _headline_html(text, error=True)
            self.status.value = ""
        elif first or upd.changed:
            changed = ", ".join(f"{k}={v!r}" for k, v in upd.changed.items()) or "start"
            reused = [s for s in CPU_STAGES if s not in upd.recomputed]
            text = (f"{changed}: recomputed {', '.join(upd.recomputed) or 'nothing'} in {upd.ms:.1f} ms"
                    + (f"; reused {', '.join(reused)}" if reused and not first else ""))
            self.status.value = ('<div style="font-family:system-ui,sans-serif;color:#57606a;font-size:12px">'
                                 f'{html.escape(text)}</div>')
            before = self.facts
            self.facts = self._facts_now()
            self.headline_text = headline(upd.changed, None if first else before, self.facts)
            self.headline.value = _headline_html(self.headline_text)
        if upd.error and not first:
            return  # the previous good state stays on screen
        t0 = time.perf_counter()
        for title, stage in STAGE_TABS:
            if first or stage in upd.recomputed or self.diff_toggles[title].value or stage == "runner":
                self._invalidate(title)
        self._refresh_extras(list(CPU_STAGES) if first else upd.recomputed)
        self.last_update["render_ms"] = round((time.perf_counter() - t0) * 1e3, 3)

    # -- rendering ---------------------------------------------------------------------------------
    @property
    def selected_tab(self) -> str:
        """Title of the tab on screen."""
        return self._tab_titles[self.tabs.selected_index or 0]

    def select_tab(self, title: str) -> None:
        """Bring tab ``title`` to the front (rendering it if it is stale)."""
        self.tabs.selected_index = self._tab_titles.index(title)

    def _invalidate(self, title: str) -> None:
        """Render ``title`` now if it is on screen (or ``lazy_render`` is off), else when it is opened."""
        if self.lazy_render and title != self.selected_tab:
            self.stale.add(title)
        else:
            self._render(title)

    def render_all(self) -> None:
        """Render every stale tab now (tabs are otherwise rendered when opened)."""
        for title in [t for t, _ in STAGE_TABS if t in self.stale]:
            self._render(title)

    def _render(self, title: str) -> None:
        self.stale.discard(title)
        stage = dict(STAGE_TABS)[title]
        out = self.outputs[title]
        if stage == "benchmark":
            shown = self._bench_display()
        elif stage == "runner":
            shown = self._runner_display()
        else:
            shown = self._stage_display(title, stage)
        with out.hold_sync():
            out.outputs = ()
            out.append_display_data(shown)

    def _stage_display(self, title: str, stage: str) -> Any:
        ex = self.session.current
        if stage not in ex._cache:
            err = self.session.error or "not computed"
            return Note(f"{stage}: not available ({err})", "error")
        obj = ex._cache[stage]
        ms = self.last_update.get("stage_ms", {}).get(stage)
        header = note_html(f"{stage}: recomputed by the last update in {ms:.1f} ms" if ms is not None and
                           self.last_update.get("changed") else f"{stage}: {type(obj).__name__}", "note")
        if self.diff_toggles[title].value:
            prev = self.session.previous
            if prev is None or stage not in prev._cache:
                return Shown("no previous state yet: change an option first", header)
            return Shown(stage_diff(prev._cache[stage], obj),
                         note_html(f"{stage}: previous -> current "
                                   f"({options_label(prev.options)} -> {options_label(ex.options)})"))
        return Shown(obj, header)

    def _runner_display(self) -> Any:
        reason = self._gpu_reason_default()
        if reason:
            return Note(f"runner: {reason}", "warn")
        ex = self.session.current
        if "runner" not in ex._cache and self.selected_tab != "runner":
            return Note("runner: compiled for this GPU when this tab is opened", "note")
        try:
            runner = ex.runner
        except Exception as exc:
            return Note(f"runner: compiling failed: {error_text(exc)}", "error")
        prev = self.session.previous
        if self.diff_toggles["runner"].value and prev is not None and "runner" in prev._cache:
            return Shown(stage_diff(prev._cache["runner"], runner))
        return Shown(runner)

    def _on_tab(self, change: dict[str, Any]) -> None:
        title = self._tab_titles[change["new"] or 0]
        if title in self.stale or title == "runner":
            self._render(title)

    def _refresh_extras(self, recomputed: list[str]) -> None:
        ex = self.session.current
        if "passes" in ex._cache and (self.stepper is None or "passes" in recomputed):
            try:
                from .stepper import PassStepper

                if self.stepper is None:
                    self.stepper = PassStepper(ex)
                    self.stepper_box.children = [self.stepper]
                else:
                    self.stepper.set_source(ex)
            except Exception as exc:
                self.stepper_box.children = [W.HTML(note_html(f"pass stepper: {error_text(exc)}", "error"))]
        if "cuda" in ex._cache and (self.linked is None or "cuda" in recomputed):
            try:
                from .linked import LinkedView

                if self.linked is None:
                    self.linked = LinkedView(ex)
                    self.linked_box.children = [self.linked]
                else:
                    self.linked.set_source(ex)
            except Exception as exc:
                self.linked_box.children = [W.HTML(note_html(f"linked views: {error_text(exc)}", "error"))]

    # -- benchmark --------------------------------------------------------------------------------
    def _gpu_reason_default(self) -> str | None:
        return B.gpu_reason()

    def _bench_reason(self) -> str | None:
        """Why the benchmark button is disabled (``None``: it is enabled)."""
        return None if self.bench_fn is not None else self._gpu_reason_default()

    def _build_bench_page(self, toggle: W.ToggleButton, out: W.Output) -> W.Widget:
        reason = self._bench_reason()
        self.bench_button = W.Button(description="Compile & benchmark", icon="play", button_style="primary",
                                     disabled=reason is not None, layout=W.Layout(width="auto"),
                                     tooltip=reason or "compile this configuration, verify it against eager, "
                                     "then time it against eager and torch.compile (runs in the background)")
        self.bench_button.on_click(lambda _b: self.benchmark())
        self.progress = W.FloatProgress(value=0.0, min=0.0, max=1.0, description="idle",
                                        style={"description_width": "initial"}, layout=W.Layout(width="360px"))
        self.phase = W.HTML()
        fake = getattr(self.bench_fn, "fake", False)
        notes = []
        if reason:
            notes.append(note_html(f"Benchmark disabled: {reason}", "warn"))
        if self.bench_fn is not None:
            label = getattr(self.bench_fn, "__name__", type(self.bench_fn).__name__)
            notes.append(note_html(f"benchmark function: {label}" + (" - FAKE numbers, not a measurement" if fake
                                                                      else " (injected)"), "warn" if fake else "note"))
        if user_rules() and not HAS_RULES_OPTION:
            notes.append(note_html("note: the benchmark compiles with every registered fusion rule; "
                                   "the rule switches above affect only the views", "note"))
        self.bench_note = W.HTML("".join(notes))
        self.history_table = W.HTML(B.history_html([]))
        self.chart = W.HTML("")
        return W.VBox([W.HBox([self.bench_button, self.progress, self.phase]), self.bench_note,
                       self.history_table, self.chart, toggle, out])

    def _bench_display(self) -> Any:
        if self.last_report is None:
            return Note("the latest benchmark report appears here", "note")
        if self.diff_toggles["benchmark"].value:
            if self.previous_report is None:
                return Shown("no previous benchmark yet")
            return Shown(stage_diff(self.previous_report, self.last_report),
                         note_html("benchmark: previous run -> latest run"))
        return Shown(self.last_report)

    @property
    def benchmark_running(self) -> bool:
        return self._bench_thread is not None and self._bench_thread.is_alive()

    def benchmark(self, *, wait: bool = False) -> threading.Thread | None:
        """Benchmark the current configuration in a background thread (the button does this).

        Returns the thread (joined first when ``wait``), or ``None`` when the benchmark is
        disabled or already running.
        """
        if self._bench_reason() is not None or self.benchmark_running:
            return None
        self.flush()
        ex = self.session.current
        config = options_label(ex.options, self.session.disabled_rules)
        self.bench_button.disabled = True
        self.progress.value, self.progress.bar_style, self.progress.description = 0.0, "info", "compile"
        self.phase.value = ""
        thread = threading.Thread(target=self._bench_worker, args=(ex, config), daemon=True,
                                  name="tkx-explorer-benchmark")
        self._bench_thread = thread
        thread.start()
        if wait:
            thread.join()
        return thread

    def wait_benchmark(self, timeout: float | None = None) -> bool:
        """Wait for a running benchmark; ``True`` when none is running afterwards."""
        if self._bench_thread is not None:
            self._bench_thread.join(timeout)
        return not self.benchmark_running

    def _bench_worker(self, ex: Exploration, config: str) -> None:
        from ..bench.report import BASELINES

        tracker = B.PhaseTracker(len(BASELINES) + 1)
        fake = bool(getattr(self.bench_fn, "fake", False))

        def log(line: str) -> None:
            phase, fraction, text = tracker.feed(str(line))
            self.progress.description = phase
            self.progress.value = fraction
            self.phase.value = ('<span style="font-family:system-ui,sans-serif;font-size:12px">'
                                f'{html.escape(text)}</span>')

        fn = self.bench_fn
        default = fn is None
        extra: dict[str, Any] = {}
        if default:
            from ..bench import compare as fn
            if self.baseline_rows:
                extra["baselines"] = ()  # reuse this session's baseline timings
        try:
            report = fn(ex.step_fn, ex.example_inputs, options=ex.options, make_inputs=self.make_inputs,
                        name=ex.name, loss=ex.loss, log=log, **extra)
            if default and extra:
                report = dataclasses.replace(report, rows=tuple(self.baseline_rows) + tuple(
                    r for r in report.rows if r.name == "tkx"))
            elif default:
                self.baseline_rows = tuple(r for r in report.rows if r.name != "tkx" and r.ok)
        except Exception as exc:  # shown in the table, never raised from the thread
            row = B.failed_row(config, error_text(exc), fake=fake)
            self.progress.bar_style, self.progress.description = "danger", "failed"
            self.phase.value = f'<span style="color:#cf222e">{html.escape(error_text(exc))}</span>'
        else:
            row = B.history_row(report, config, fake=fake)
            self.previous_report, self.last_report = self.last_report, report
            before = self.facts
            self._report_options = ex.options
            self.facts = self._facts_now()
            changed = {"benchmark": config} if isinstance(config, str) else {"benchmark": "run"}
            self.headline_text = headline(changed, before, self.facts)
            self.headline.value = _headline_html(self.headline_text)
            self.progress.value, self.progress.bar_style, self.progress.description = 1.0, "success", "done"
        self.history.append(row)
        self.history_table.value = B.history_html(self.history)
        self.chart.value = B.chart_html(self.history)
        self._render("benchmark")
        self.bench_button.disabled = self._bench_reason() is not None


def help_html(help_text: str, allowed: Any) -> str:
    """The visible help under a control: its sentence from ``Options.fields_info`` and, for a
    range, the bounds."""
    extra = ""
    if isinstance(allowed, tuple) and len(allowed) == 3 and allowed[0] == "range":
        _, lo, hi = allowed
        extra = f" ({lo} or more)" if hi is None else f" ({lo} to {hi})"
    return (f'<div style="font-family:system-ui,sans-serif;font-size:11px;line-height:1.25;color:#57606a;'
            f'max-width:300px;white-space:normal">{html.escape(help_text)}{html.escape(extra)}</div>')


def _headline_html(text: str, *, error: bool = False) -> str:
    color = "#cf222e" if error else "#1f2328"
    return (f'<div class="tkx-headline" style="font-family:system-ui,sans-serif;font-size:14px;font-weight:600;'
            f'color:{color};margin:4px 0">{html.escape(text)}</div>')


@display.register(Exploration, "widget")
def widget(exploration: Exploration, **kwargs: Any) -> Explorer:
    """``tkx.explore(...).widget()``: an :class:`Explorer` over an existing exploration."""
    return Explorer.from_exploration(exploration, **kwargs)


__all__ = ["Explorer", "OptionalIntText", "STAGE_TABS", "make_control", "widget"]
