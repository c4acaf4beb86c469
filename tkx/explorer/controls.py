"""The Explorer's option controls, generated from :meth:`tkx.Options.fields_info`, and their panel.

:func:`make_control` makes one control per field (checkbox, dropdown, integer box, or an integer
with a "None" checkbox); :func:`options_panel` lays them out grouped by
:data:`tkx.options.OPTION_GROUPS` (fusion, tiling, launch, numerics, compilation), each with its
help sentence under it, inside an accordion that starts collapsed so the first screen shows
what the compiler did before the knobs.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import traitlets

from ..options import OPTION_GROUPS, Options, option_group

__all__ = ["OptionalIntText", "make_control", "help_html", "options_panel", "panel_title", "SEQUENCE_FIELDS"]

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



def help_html(help_text: str, allowed: Any) -> str:
    """The visible help under a control: its sentence from ``Options.fields_info`` and, for a
    range, the bounds."""
    extra = ""
    if isinstance(allowed, tuple) and len(allowed) == 3 and allowed[0] == "range":
        _, lo, hi = allowed
        extra = f" ({lo} or more)" if hi is None else f" ({lo} to {hi})"
    return (f'<div style="font-family:system-ui,sans-serif;font-size:11px;line-height:1.25;color:#57606a;'
            f'max-width:300px;white-space:normal">{html.escape(help_text)}{html.escape(extra)}</div>')



def options_panel(options: Options, on_change: Callable[[Any], None],
                  extra: list[W.Widget]) -> tuple[W.Accordion, dict[str, W.Widget], dict[str, W.HTML]]:
    """(the collapsed accordion, option name -> control, option name -> its help widget).

    One titled grid per group of :data:`~tkx.options.OPTION_GROUPS` (a field in none of them goes
    under "compilation"), then ``extra`` (the pass and rule toggles). ``on_change`` observes every
    control's ``value``."""
    controls: dict[str, W.Widget] = {}
    helps: dict[str, W.HTML] = {}
    cells: dict[str, list[W.Widget]] = {g: [] for g in OPTION_GROUPS}
    for fname, _default, allowed, help_text in Options.fields_info():
        c = make_control(fname, getattr(options, fname), allowed, help_text, _none_ok(fname))
        if c is None:
            continue
        controls[fname] = c
        c.observe(on_change, names="value")
        helps[fname] = W.HTML(help_html(help_text, allowed))
        cells[option_group(fname)].append(W.VBox([c, helps[fname]], layout=W.Layout(margin="0 0 4px 0")))
    sections: list[W.Widget] = []
    for group, members in cells.items():
        if not members:
            continue
        sections.append(W.HTML(f'<div class="tkx-opt-group" style="font-family:system-ui,sans-serif;'
                               f'font-weight:600;margin:6px 0 2px">{html.escape(group)}</div>'))
        sections.append(W.GridBox(members, layout=W.Layout(grid_template_columns="repeat(3, minmax(230px, 1fr))",
                                                           grid_gap="2px 12px")))
    body = W.VBox(sections + extra)
    panel = W.Accordion(children=[body], titles=(panel_title(options),), selected_index=None)
    return panel, controls, helps


def panel_title(options: Options) -> str:
    """The options panel's title: its groups and how many options differ from their defaults."""
    changed = options.changed() if hasattr(options, "changed") else {}
    return (f"options: {', '.join(OPTION_GROUPS)}" +
            (f" ({len(changed)} changed: {', '.join(changed)})" if changed else " (all defaults)"))
