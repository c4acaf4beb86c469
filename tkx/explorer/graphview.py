"""``GraphView``: the hierarchical graph (region -> module -> fusion group -> op) as a JupyterLab widget.

The same view as the exported report's (:mod:`tkx.render.hgraph` builds the data,
``widgets/hgraph.js`` draws it with the vendored dagre layout): expand/collapse on click, search
by op id, aten op or module path, zoom/pan and a minimap. Clicking an op sets ``selected``
(``"op:<id>"`` or ``"fx:<node>"``); :meth:`GraphView.link` ties it to a
:class:`~tkx.explorer.LinkedView`, which lights the op's schedule group, arena slot and CUDA lines,
and lights here the ops the linked view selects.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from ..render.base import REGION_COLORS
from ..render.hgraph import DAGRE_NOTICE, captured_hgraph, program_hgraph
from .assets import read_asset


def graph_data(source: Any, which: str = "optimized") -> dict[str, Any]:
    """The graph of an :class:`~tkx.Exploration` stage: ``which`` is ``"optimized"`` (the IR after
    the passes, grouped by fusion group), ``"program"`` or ``"captured"`` (the FX graph); or of a
    :class:`~tkx.ir.Program` / :class:`~tkx.capture.CapturedGraph` given directly. Raises
    ``ValueError`` for another ``which``."""
    if which not in ("optimized", "program", "captured"):
        raise ValueError(f"which must be 'optimized', 'program' or 'captured', not {which!r}")
    if hasattr(source, "_cache"):   # an Exploration: its schedule groups the ops
        schedule = source.schedule
        obj = getattr(source, which)
    else:
        schedule, obj = None, source
    if hasattr(obj, "graph_module"):
        return captured_hgraph(obj, schedule)
    return program_hgraph(obj, schedule)


class GraphView(anywidget.AnyWidget):
    """The hierarchical graph of a program or FX graph, collapsed to a readable first view.

    ``GraphView(exploration, which="optimized")`` (see :func:`graph_data`). ``selected``: the key
    of the clicked op; ``highlight``: keys lit from outside (``["op:mm", "grp:g3"]``).
    """

    _esm = DAGRE_NOTICE + read_asset("vendor/dagre.min.js") + "\n" + read_asset("hgraph.js") + "\n" + \
        read_asset("hgraph-widget.js")
    _css = read_asset("hgraph.css")

    data = traitlets.Dict().tag(sync=True)
    colors = traitlets.Dict(dict(REGION_COLORS)).tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    highlight = traitlets.List(traitlets.Unicode()).tag(sync=True)

    def __init__(self, source: Any, which: str = "optimized", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.which = which
        self.data = graph_data(source, which)
        self._linked: Any = None

    def set_source(self, source: Any) -> None:
        """Show another exploration's graph (collapsed again to the first view)."""
        self.data = graph_data(source, self.which)

    def link(self, linked: Any) -> None:
        """Tie this view to a :class:`~tkx.explorer.LinkedView`: an op clicked here is selected
        there (its group, arena slot and CUDA lines light up); the ops lit there are lit here."""
        self._linked = linked
        linked.observe(self._from_linked, names="highlight")

    @traitlets.observe("selected")
    def _on_selected(self, change: dict[str, Any]) -> None:
        key = change["new"]
        if self._linked is not None and key.startswith("op:"):
            self._linked.selected = key[3:]
        elif self._linked is None:
            self.highlight = [key] if key else []

    def _from_linked(self, change: dict[str, Any]) -> None:
        info = change["new"] or {}
        keys = [f"op:{o}" for o in info.get("ops") or ([info["op"]] if info.get("op") else [])]
        keys += [f"grp:{g}" for g in info.get("groups", [])]
        self.highlight = keys
