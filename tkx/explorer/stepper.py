"""``PassStepper``: step through a pass trace with a slider, the program before and after each pass.

The view of a step is the :class:`~tkx.passes.trace.PassStep`'s own HTML when it has one,
else :func:`side_by_side_html`: both listings, added ops green (``+``), removed red (``-``),
changed yellow (``~``).
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from .core import Note, Shown

_COLORS = {"+": "#dafbe1", "-": "#ffebe9", "~": "#fff8c5"}


def trace_of(source: Any) -> Any:
    """The :class:`~tkx.PassTrace` of an Exploration, a PassTrace, or a Program (default pipeline)."""
    from ..ir import Program
    from ..passes import PassTrace, run_passes

    if isinstance(source, PassTrace):
        return source
    if isinstance(source, Program):
        return run_passes(source)
    passes = getattr(source, "passes", None)
    if isinstance(passes, PassTrace):
        return passes
    raise TypeError(f"PassStepper needs a tkx.Exploration, a PassTrace or a Program, not {type(source).__name__}")


def marked_lines(program: Any, marks: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(mark, op id, text)`` per printed line of ``program``; ``mark`` is ``marks[op id]`` or ``" "``."""
    from ..printer import program_lines

    ops = iter(program.ops)
    out = []
    for kind, text, _region in program_lines(program):
        op_id = next(ops).id if kind == "op" else ""
        out.append((marks.get(op_id, " ") if op_id else " ", op_id, text))
    return out


def _column(title: str, rows: list[tuple[str, str, str]]) -> str:
    body = []
    for mark, op_id, text in rows:
        style = f"background:{_COLORS[mark]}" if mark in _COLORS else ""
        gutter = f"{mark} {op_id:<12}" if op_id else " " * 14
        body.append(f'<div class="tkx-step-line" data-op="{html.escape(op_id)}" data-mark="{html.escape(mark)}" '
                    f'style="white-space:pre-wrap;overflow-wrap:anywhere;{style}">{html.escape(gutter + text)}</div>')
    return ('<div style="flex:1 1 50%;min-width:0;overflow:auto;border:1px solid #d0d7de;border-radius:6px;'
            'max-height:480px"><div style="font-family:system-ui,sans-serif;font-weight:600;padding:2px 6px;'
            f'background:#f6f8fa">{html.escape(title)}</div>{"".join(body)}</div>')


def side_by_side_html(step: Any) -> str:
    """Before | after listings of one :class:`~tkx.passes.trace.PassStep`, changed ops marked."""
    before = marked_lines(step.before, {**{i: "-" for i in step.removed}, **{i: "~" for i in step.changed}})
    after = marked_lines(step.after, {**{i: "+" for i in step.added}, **{i: "~" for i in step.changed}})
    head = (f'<div style="font-family:system-ui,sans-serif;margin:4px 0">{html.escape(step.summary())}'
            + ("" if step.modified else " - <b>this pass changed nothing</b>") + "</div>")
    legend = ('<div style="font-family:system-ui,sans-serif;font-size:12px;margin-bottom:4px">'
              f'<span style="background:{_COLORS["+"]}">+ added</span> &nbsp;'
              f'<span style="background:{_COLORS["-"]}">- removed</span> &nbsp;'
              f'<span style="background:{_COLORS["~"]}">~ changed</span></div>')
    return (f'<div class="tkx-stepper" style="font-family:ui-monospace,SFMono-Regular,Menlo,monospace;'
            f'font-size:12px">{head}{legend}<div style="display:flex;gap:8px">'
            f'{_column(f"before {step.name}", before)}{_column(f"after {step.name}", after)}</div></div>')


class SideBySide:
    """Display object for :func:`side_by_side_html` (text: the step's unified diff)."""

    def __init__(self, step: Any) -> None:
        self.step = step

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        text = self.step.summary() + "\n" + (self.step.diff_text() or "(no change)")
        return {"text/plain": text, "text/html": side_by_side_html(self.step)}


class PassStepper(W.VBox):
    """An ``IntSlider`` over the passes of a trace; shows the selected pass before and after.

    ``PassStepper(exploration_or_trace_or_program, view="auto")``: ``view="auto"`` uses the
    PassStep's own HTML when it has one, ``"side_by_side"`` always :func:`side_by_side_html`.
    Read :attr:`step` for the selected :class:`~tkx.passes.trace.PassStep`.
    """

    def __init__(self, source: Any, *, view: str = "auto", **kwargs: Any) -> None:
        self.view = view
        self.slider = W.IntSlider(value=0, min=0, max=0, description="pass", continuous_update=True,
                                  layout=W.Layout(width="60%"))
        self.label = W.HTML()
        self.output = W.Output()
        super().__init__([W.HBox([self.slider, self.label]), self.output], **kwargs)
        self.trace = None
        self.set_source(source)
        self.slider.observe(self._on_slide, names="value")

    def set_source(self, source: Any) -> None:
        """Step through another trace (keeps the position when the same pass exists)."""
        trace = trace_of(source)
        old = self.step.name if self.trace is not None and len(self.trace) else None
        self.trace = trace
        n = len(trace)
        names = list(trace.names)
        index = names.index(old) if old in names else min(self.slider.value, max(0, n - 1))
        with self.slider.hold_trait_notifications():
            self.slider.max = max(0, n - 1)
            self.slider.disabled = n == 0
            self.slider.value = index
        self._show(index)

    @property
    def index(self) -> int:
        return int(self.slider.value)

    @property
    def step(self) -> Any:
        """The selected :class:`~tkx.passes.trace.PassStep` (``None`` for an empty trace)."""
        return self.trace.steps[self.index] if self.trace is not None and len(self.trace) else None

    def _on_slide(self, change: dict[str, Any]) -> None:
        self._show(change["new"])

    def _show(self, index: int) -> None:
        out = self.output
        if self.trace is None or not len(self.trace):
            self.label.value = "no passes ran"
            with out.hold_sync():
                out.outputs = ()
                out.append_display_data(Note("the pass pipeline is empty: nothing to step through"))
            return
        step = self.trace.steps[index]
        self.label.value = (f"<b>{index + 1}/{len(self.trace)}: {html.escape(step.name)}</b> "
                            f"{html.escape(step.summary().split(': ', 1)[-1])}")
        own = self.view == "auto" and hasattr(type(step), "_repr_mimebundle_")
        with out.hold_sync():
            out.outputs = ()
            out.append_display_data(Shown(step) if own else SideBySide(step))
