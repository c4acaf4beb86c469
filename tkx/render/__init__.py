"""The views of every stage, registered into :mod:`tkx.display` (importing this package fills it).

One module per stage: :mod:`~tkx.render.captured`, :mod:`~tkx.render.program`,
:mod:`~tkx.render.passes`, :mod:`~tkx.render.diffs` (program and trace diffs),
:mod:`~tkx.render.schedule`, :mod:`~tkx.render.arena`, :mod:`~tkx.render.cuda`,
:mod:`~tkx.render.stage_diff`, :mod:`~tkx.render.runtime_views` (runner, verification),
:mod:`~tkx.render.bench` (benchmark) and :mod:`~tkx.render.distributed` (the data-parallel plan);
:mod:`~tkx.render.report` writes them all into one HTML file. Shared conventions
(HTML escaping, provenance attributes, graph images, the linking script) are in
:mod:`~tkx.render.base`, re-exported here.

The stages never import this package: they ask :mod:`tkx.display`, which imports it on the
first lookup. Importing it needs no notebook package (graphviz, rich and pygments are imported
inside the functions that draw).
"""

from __future__ import annotations

from . import arena, bench, captured, cuda, diffs, distributed, passes, program, runtime_views, schedule, stage_diff
from .base import (
    DOT_TIMEOUT_S,
    REGION_COLORS,
    REGION_FILL,
    SCRIPT,
    STYLE,
    attrs,
    dot_available,
    dot_escape,
    esc,
    graph_html,
    graph_svg,
    mimebundle,
    run_dot,
    safe_digraph,
    svg_img,
    view,
)

__all__ = ["DOT_TIMEOUT_S", "REGION_COLORS", "REGION_FILL", "SCRIPT", "STYLE", "attrs", "dot_available", "esc",
           "graph_html", "graph_svg", "mimebundle", "svg_img", "view", "dot_escape", "run_dot", "safe_digraph",
           "arena", "bench", "captured", "cuda", "diffs", "distributed", "passes", "program", "runtime_views",
           "schedule", "stage_diff"]
