"""Shared rendering conventions for every stage object (HTML, graphviz, the linking script).

Conventions (see ``shared/research/jupyter-and-style.md``):

* ``_repr_mimebundle_`` returns ``text/plain`` (the one-line repr) and ``text/html``;
* graphs go into HTML as ``<img>`` of a base64 SVG data URI (JupyterLab strips inline
  ``<svg>`` from untrusted notebooks); without the ``dot`` binary a one-line notice and the
  DOT source are shown instead - never a traceback;
* every HTML view carries a hidden plain-text fallback (xarray's trick): where a viewer strips
  styles (GitHub), a reader still sees the text; it is hidden by an inline style too, which
  JupyterLab keeps in untrusted notebooks (it strips only ``<style>`` and ``<script>``);
* the view's own rules are doubled in specificity (``.tkx-view.tkx-view td``) so JupyterLab's
  right-aligned, striped table defaults do not win;
* output is deterministic: ids are stable names (op ids, group ids, line numbers), never
  ``id()`` or addresses;
* **provenance**: an element that stands for something carries ``data-tkx-key`` (what it is,
  e.g. ``op:mm_1``) and ``data-tkx-ids`` (everything it belongs to, e.g. ``op:mm_1 grp:g3
  fx:mm src:model.py:12``). Clicking an element highlights, in every view on the page, the
  elements whose ``data-tkx-ids`` contain its key. No server: a small inline script.
"""

from __future__ import annotations

import base64
import html
import re
import shutil
from functools import lru_cache
from typing import Any

#: Seconds Graphviz may spend on one layout before the view falls back to the DOT text.
DOT_TIMEOUT_S = 20

REGION_COLORS = {"forward": "#2b6cb0", "backward": "#805ad5", "optimizer": "#2f855a"}
REGION_FILL = {"forward": "#ebf4ff", "backward": "#f3ebff", "optimizer": "#e6f6ec"}

STYLE = """
.tkx-view{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;line-height:1.35;
  border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;margin:4px 0;max-width:100%;overflow:auto}
.tkx-view .tkx-title{font-weight:600;margin-bottom:6px;font-family:system-ui,sans-serif;font-size:13px}
.tkx-view .tkx-fallback{display:none}
.tkx-view table{border-collapse:collapse}
.tkx-view td,.tkx-view th{padding:1px 8px 1px 0;text-align:left;vertical-align:top;white-space:pre}
.tkx-view th{border-bottom:1px solid #d0d7de;font-family:system-ui,sans-serif}
.tkx-view [data-tkx-key]{cursor:pointer}
.tkx-view .tkx-hl{background:#fff3b0 !important;outline:1px solid #e0b000}
.tkx-view .tkx-dim{color:#6e7781}
.tkx-view.tkx-view td,.tkx-view.tkx-view th{text-align:left}
.tkx-view.tkx-view tbody tr,.tkx-view.tkx-view tbody tr:hover{background:none}
.tkx-view.tkx-view table{font-size:inherit}
.tkx-region-forward{color:#2b6cb0}.tkx-region-backward{color:#805ad5}.tkx-region-optimizer{color:#2f855a}
.tkx-view details>summary{cursor:pointer;font-family:system-ui,sans-serif}
"""

SCRIPT = """
(function(){if(window.__tkxLinked)return;window.__tkxLinked=true;
document.addEventListener('click',function(ev){var el=ev.target.closest?ev.target.closest('[data-tkx-key]'):null;
if(!el)return;var key=el.getAttribute('data-tkx-key');
document.querySelectorAll('.tkx-hl').forEach(function(e){e.classList.remove('tkx-hl');});
var hits=[];document.querySelectorAll('[data-tkx-ids]').forEach(function(e){
var ids=(e.getAttribute('data-tkx-ids')||'').split(' ');
if(ids.indexOf(key)>=0){e.classList.add('tkx-hl');hits.push(e);}});
el.classList.add('tkx-hl');document.body.setAttribute('data-tkx-selected',key);
var seen=[];hits.forEach(function(e){var box=e.closest('.tkx-view');
if(box&&box!==el.closest('.tkx-view')&&seen.indexOf(box)<0){seen.push(box);
var r=e.getBoundingClientRect(),b=box.getBoundingClientRect();
if(box.scrollHeight>box.clientHeight){box.scrollTop+=r.top-b.top-box.clientHeight/2;}}});});})();
"""


def esc(text: Any) -> str:
    """HTML-escape ``text``."""
    return html.escape(str(text), quote=True)


def attrs(key: str | None = None, ids: list[str] | tuple[str, ...] | None = None) -> str:
    """The provenance attributes of an element (see the module docstring)."""
    parts = []
    if key:
        parts.append(f'data-tkx-key="{esc(key)}"')
    tokens = list(dict.fromkeys(([key] if key else []) + list(ids or [])))
    if tokens:
        parts.append(f'data-tkx-ids="{esc(" ".join(tokens))}"')
    return " ".join(parts)


@lru_cache(maxsize=1)
def dot_available() -> bool:
    """Whether Graphviz's ``dot`` binary is on PATH (probed once)."""
    return shutil.which("dot") is not None


def svg_img(svg: str | bytes, alt: str = "graph") -> str:
    """An ``<img>`` showing ``svg`` through a base64 data URI (survives untrusted notebooks)."""
    data = svg.encode() if isinstance(svg, str) else svg
    b64 = base64.b64encode(data).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/svg+xml;base64,{b64}" style="max-width:100%"/>'


DOT_INSTALL_HINT = "apt-get install graphviz, or conda install graphviz"


def run_dot(graph: Any) -> tuple[str | None, str | None]:
    """``(svg, None)``, or ``(None, why)`` when ``dot`` is missing, too slow or fails (``why``
    then quotes dot's own error text). SVG comments are dropped (they name the Graphviz
    version), so the output is deterministic for one Graphviz build."""
    if not dot_available():
        return None, f"Graphviz's dot is not installed ({DOT_INSTALL_HINT})"
    import subprocess

    try:  # a huge uncollapsed graph can take minutes in dot: give up rather than hang the cell
        done = subprocess.run(["dot", "-Tsvg"], input=graph.source.encode(), capture_output=True,
                              timeout=DOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"Graphviz took longer than {DOT_TIMEOUT_S} s to lay this graph out"
    except OSError as e:
        return None, f"Graphviz's dot could not run: {e}"
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", errors="replace").strip() or f"exit status {done.returncode}"
        return None, "Graphviz's dot failed: " + " | ".join(err.splitlines()[:3])
    return re.sub(r"<!--.*?-->\s*", "", done.stdout.decode("utf-8"), flags=re.S), None


def graph_svg(graph: Any) -> str | None:
    """SVG text of a ``graphviz`` graph, or ``None`` without ``dot`` (or when it fails; see
    :func:`run_dot` for why)."""
    return run_dot(graph)[0]


def graph_html(graph: Any, alt: str = "graph") -> str:
    """The graph as an ``<img>``, or - without ``dot``, or when dot fails or times out - a
    one-line notice (with dot's own error text) and the DOT source."""
    svg, why = run_dot(graph)
    if svg is not None:
        return svg_img(svg, alt)
    return (f'<div class="tkx-dim">{esc(why)}: showing the DOT source.</div>'
            f'<details><summary>DOT source</summary><pre>{esc(graph.source)}</pre></details>')


def dot_escape(text: Any) -> Any:
    """``text`` made safe as a Graphviz label or tooltip: backslashes lose their escape
    meaning (a source line ending in a line-continuation ``\\``, a name like ``a\\``) and a
    string that looks like ``<...>`` is not taken for an HTML label (``<lambda> <map>``).
    Non-strings pass through."""
    if not isinstance(text, str):
        return text
    import graphviz
    return graphviz.escape(text)


_ESCAPED = ("label", "tooltip", "xlabel", "headlabel", "taillabel", "URL", "comment")


def _escaped(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: (dot_escape(v) if k in _ESCAPED else v) for k, v in attrs.items()}


def _graph_class() -> type:
    import graphviz

    class SafeDigraph(graphviz.Digraph):
        """A ``graphviz.Digraph`` that escapes every label and tooltip it is given (see
        :func:`dot_escape`) and that displays without ``dot``: then (or when dot fails) a
        notebook shows a note, the DOT source and how to install Graphviz instead of raising
        ``ExecutableNotFound``."""

        def node(self, name: str, label: str | None = None, _attributes: Any = None, **attrs: Any) -> None:
            super().node(name, dot_escape(label), _attributes=_attributes, **_escaped(attrs))

        def edge(self, tail_name: str, head_name: str, label: str | None = None, _attributes: Any = None,
                 **attrs: Any) -> None:
            super().edge(tail_name, head_name, dot_escape(label), _attributes=_attributes, **_escaped(attrs))

        def attr(self, kw: str | None = None, _attributes: Any = None, **attrs: Any) -> None:
            super().attr(kw, _attributes=_attributes, **_escaped(attrs))

        def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kw: Any) -> dict[str, str]:
            if dot_available():
                try:  # graphviz's own display, unchanged, wherever dot works
                    return super()._repr_mimebundle_(include, exclude, **kw)
                except Exception:  # ExecutableNotFound, CalledProcessError: say why below
                    pass
            why = run_dot(self)[1] or "Graphviz's dot could not lay this graph out"
            bundle = {"text/plain": f"{why}.\nDOT source of graph {self.name}:\n{self.source}",
                      "text/html": (f'<div class="tkx-dim">{esc(why)}: showing the DOT source.</div>'
                                    f'<pre>{esc(self.source)}</pre>')}
            if include:
                bundle = {k: v for k, v in bundle.items() if k in include}
            if exclude:
                bundle = {k: v for k, v in bundle.items() if k not in exclude}
            return bundle

    return SafeDigraph


_SAFE: list[type] = []


def safe_digraph(**kwargs: Any) -> Any:
    """A new :class:`SafeDigraph <_graph_class>` (``graphviz.Digraph`` arguments)."""
    if not _SAFE:
        _SAFE.append(_graph_class())
    return _SAFE[0](**kwargs)


def view(kind: str, title: str, body: str, text: str) -> str:
    """One self-contained HTML view: styles, title, body, hidden text fallback, linking script."""
    return (f'<div class="tkx-view tkx-{esc(kind)}"><style>{STYLE}</style>'
            f'<div class="tkx-title">{esc(title)}</div>{body}'
            f'<pre class="tkx-fallback" style="display:none">{esc(text)}</pre><script>{SCRIPT}</script></div>')


def mimebundle(obj: Any, html_text: str, include: Any = None, exclude: Any = None) -> dict[str, str]:
    """``{"text/plain": repr(obj), "text/html": html_text}`` filtered by include/exclude."""
    bundle = {"text/plain": repr(obj), "text/html": html_text}
    if include:
        bundle = {k: v for k, v in bundle.items() if k in include}
    if exclude:
        bundle = {k: v for k, v in bundle.items() if k not in exclude}
    return bundle
