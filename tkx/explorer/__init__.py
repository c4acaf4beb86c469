"""Jupyter widgets for exploring a compilation (needs ipywidgets and anywidget).

* :class:`Explorer` - controls generated from :meth:`tkx.Options.fields_info`, one tab per
  stage updated (debounced) when a control changes, recomputing only downstream stages; per-tab
  "diff against previous"; a pass stepper and linked views; "Compile & benchmark" on a GPU;
* :class:`PassStepper` - a slider over a pass trace, the program before and after each pass;
* :class:`LinkedView` - IR and CUDA side by side with the arena and schedule: select an op,
  see its CUDA lines, arena block and schedule stage;
* :class:`GraphView` - the hierarchical graph (region -> module -> fusion group -> op): expand on
  click, search, zoom/pan, minimap; tied to a LinkedView it selects ops there;
* :func:`widget` - ``widget(tkx.explore(...))``: an Explorer over an existing exploration.

The logic lives in plain modules (:mod:`~tkx.explorer.core`, :mod:`~tkx.explorer.benchmark`)
so it is tested by setting widget values, without a browser.
"""

from __future__ import annotations

from .graphview import GraphView, graph_data
from .linked import LinkedView, link_data, link_info
from .stepper import PassStepper, side_by_side_html
from .widget import Explorer, widget

__all__ = ["Explorer", "GraphView", "LinkedView", "graph_data", "PassStepper", "link_data", "link_info",
           "side_by_side_html", "widget"]
