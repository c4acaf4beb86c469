"""The Explorer's benchmark tab: "Compile & benchmark" in a background thread, a history table.

A mixin of :class:`~tkx.explorer.Explorer` (it reads the Explorer's session, headline and
render methods); the numbers and rows come from :mod:`tkx.explorer.benchmark`.
"""

from __future__ import annotations

import dataclasses
import html
import threading
from typing import Any

import ipywidgets as W

from ..explore import Exploration
from . import benchmark as B
from .core import HAS_RULES_OPTION, Note, Shown, error_text, note_html, options_label, stage_diff, user_rules
from .headline import headline, headline_html


class BenchmarkTab:
    """The benchmark tab's widgets and worker (mixed into :class:`~tkx.explorer.Explorer`)."""

    bench_fn: Any
    session: Any
    history: list[dict[str, Any]]
    last_report: Any
    previous_report: Any
    baseline_rows: tuple[Any, ...]
    _bench_thread: threading.Thread | None

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
        from ..bench.report import BASELINES, TKX_ROWS

        tracker = B.PhaseTracker(len(BASELINES) + len(TKX_ROWS))
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
            self.headline.value = headline_html(self.headline_text)
            self.progress.value, self.progress.bar_style, self.progress.description = 1.0, "success", "done"
        self.history.append(row)
        self.history_table.value = B.history_html(self.history)
        self.chart.value = B.chart_html(self.history)
        self._render("benchmark")
        self.bench_button.disabled = self._bench_reason() is not None

