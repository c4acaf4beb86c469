"""``Explorer``: option controls, one tab per stage, a pass stepper, linked views and a benchmark.

A thin ipywidgets layer over :class:`~tkx.explorer.core.Session` (updates) and
:mod:`tkx.explorer.benchmark` (history rows): every control is generated from
:meth:`tkx.Options.fields_info`; a change is debounced, then applied with
``Exploration.with_options`` so only the stages downstream of it are recomputed
(:attr:`Explorer.last_update` says which, and how long it took).
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W

from .. import display, pipeline
from ..explore import Exploration
from ..options import Options
from .benchtab import BenchmarkTab
from .controls import OptionalIntText, make_control, options_panel, panel_title
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
from .headline import Facts, facts_of, failure_headline, headline, headline_html
from .overview import pipeline_html

#: (tab title, stage attribute) in display order; ``benchmark`` is not a stage of the exploration.
#: The stage tabs come from the pipeline table (:data:`tkx.pipeline.STAGES`, rows with a ``tab``).
STAGE_TABS = tuple((s.tab, s.name) for s in pipeline.STAGES if s.tab) + (("benchmark", "benchmark"),)
#: Tabs after the stage tabs.
EXTRA_TABS = ("pass stepper", "linked views")


class Explorer(BenchmarkTab, W.VBox):
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
        self.pass_toggles: dict[str, W.Checkbox] = {}
        self.rule_toggles: dict[str, W.Checkbox] = {}
        self.passes_box = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.user_box = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.refresh_button = W.Button(description="re-read passes & rules", icon="refresh",
                                       tooltip="show passes and fusion rules registered after this explorer was made",
                                       layout=W.Layout(width="auto"))
        self.refresh_button.on_click(lambda _b: self.refresh())
        self._build_toggles()
        toggles = [W.HBox([W.HTML("<b>passes</b>&nbsp;", layout=W.Layout(width="auto")), self.passes_box]),
                   W.HBox([W.HTML("<b>your passes &amp; rules</b>&nbsp;", layout=W.Layout(width="auto")),
                           self.user_box, self.refresh_button])]
        #: The option controls in a collapsed accordion, grouped (fusion, tiling, launch, numerics,
        #: compilation); ``controls``: option -> widget, ``help``: option -> its help under it.
        self.options_panel, self.controls, self.help = options_panel(ex.options, self._on_change, toggles)
        #: The pipeline table: one row per stage, what the last update did to it and its key figure.
        self.pipeline_table = W.HTML()

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
        #: The hierarchical graph of the IR after the passes (:class:`~tkx.explorer.GraphView`),
        #: above the linked views and tied to them: clicking an op there selects it in both.
        self.graph: Any = None
        self.stepper_box = W.VBox()
        self.linked_box = W.VBox()
        pages += [self.stepper_box, self.linked_box]
        self._tab_titles = [t for t, _ in STAGE_TABS] + list(EXTRA_TABS)
        self.tabs = W.Tab(children=pages, titles=self._tab_titles, selected_index=0)
        self.tabs.observe(self._on_tab, names="selected_index")

        super().__init__([self.title, self.headline, self.message, self.status, self.pipeline_table,
                          self.options_panel, self.tabs])

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
            self.headline.value = headline_html(text, error=True)
            self.status.value = ""
        elif first or upd.changed:
            changed = ", ".join(f"{k}={v!r}" for k, v in upd.changed.items()) or "start"
            reused = [s for s in CPU_STAGES if s not in upd.recomputed and s in ex._cache]
            text = (f"{changed}: recomputed {', '.join(upd.recomputed) or 'nothing'} in {upd.ms:.1f} ms"
                    + (f"; reused {', '.join(reused)}" if reused and not first else ""))
            self.status.value = ('<div style="font-family:system-ui,sans-serif;color:#57606a;font-size:12px">'
                                 f'{html.escape(text)}</div>')
            before = self.facts
            self.facts = self._facts_now()
            self.headline_text = headline(upd.changed, None if first else before, self.facts)
            self.headline.value = headline_html(self.headline_text)
        self.pipeline_table.value = pipeline_html(self.session.current, upd, first=first)
        self.options_panel.set_title(0, panel_title(ex.options))
        if upd.error and not first:
            return  # the previous good state stays on screen
        t0 = time.perf_counter()
        for title, stage in STAGE_TABS:
            if (first or stage in upd.recomputed or self.diff_toggles[title].value or stage == "runner"
                    or stage in CPU_STAGES and stage not in ex._cache):  # computed when its tab shows
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
        if stage not in ex._cache and self.session.error is None:
            try:  # a stage the updates do not compute (the predicted timeline): computed when its tab shows
                getattr(ex, stage)
            except Exception as exc:
                return Note(f"{stage}: not available ({error_text(exc)})", "error")
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
                from .graphview import GraphView
                from .linked import LinkedView

                if self.linked is None:
                    self.linked = LinkedView(ex)
                    self.graph = GraphView(ex)
                    self.graph.link(self.linked)
                    self.linked_box.children = [self.graph, self.linked]
                else:
                    self.linked.set_source(ex)
                    self.graph.set_source(ex)
            except Exception as exc:
                self.linked_box.children = [W.HTML(note_html(f"linked views: {error_text(exc)}", "error"))]


@display.register(Exploration, "widget")
def widget(exploration: Exploration, **kwargs: Any) -> Explorer:
    """``tkx.explore(...).widget()``: an :class:`Explorer` over an existing exploration."""
    return Explorer.from_exploration(exploration, **kwargs)


__all__ = ["Explorer", "OptionalIntText", "STAGE_TABS", "make_control", "widget"]
