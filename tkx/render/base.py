"""Shared rendering conventions for every stage view (HTML, graphviz, the linking script).

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
  elements whose ``data-tkx-ids`` contain its key *and* the elements keyed by one of its own
  ids (links work both ways: a CUDA line ``line:363 op:relu grp:g0 buf:relu`` lights its op,
  its group and its arena slot). Each highlighted element is scrolled into view inside its
  own scrolling box (the CUDA pane, a capped table), never by moving the page. No server: a
  small inline script.
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
.tkx-view .tkx-zoom{position:relative}
.tkx-view .tkx-zoom.tkx-zon{max-height:70vh;overflow:auto;border:1px solid #eaeef2;cursor:grab}
.tkx-view .tkx-zbar{position:sticky;top:0;left:0;z-index:2;background:rgba(255,255,255,.92);padding:2px 0;
  font-family:system-ui,sans-serif}
.tkx-view .tkx-zbar button{font-size:12px;min-width:2.2em;margin-right:3px;cursor:pointer}
.tkx-view .tkx-showall{font-family:system-ui,sans-serif;font-size:12px;margin:2px 0;cursor:pointer}
"""

SCRIPT = """
(function(){if(window.__tkxLinked)return;window.__tkxLinked=true;
function toks(e,a){return (e.getAttribute(a)||'').split(' ').filter(Boolean);}
function scroller(e,stop){for(var p=e.parentElement;p;p=p.parentElement){var cs=getComputedStyle(p);
if(/(auto|scroll)/.test(cs.overflowY+' '+cs.overflowX)&&
(p.scrollHeight>p.clientHeight+1||p.scrollWidth>p.clientWidth+1))return p;
if(p===stop)return null;}return null;}
function reveal(e){var box=e.closest('.tkx-view'),p=scroller(e,box);while(p){
var r=e.getBoundingClientRect(),b=p.getBoundingClientRect();
if(r.top<b.top||r.bottom>b.bottom)p.scrollTop+=r.top-b.top-(p.clientHeight-r.height)/2;
if(r.left<b.left||r.right>b.right)p.scrollLeft+=r.left-b.left-24;
if(p===box)break;p=scroller(p,box);}}
function select(el){var key=el.getAttribute('data-tkx-key'),own=toks(el,'data-tkx-ids');
document.querySelectorAll('.tkx-hl').forEach(function(e){e.classList.remove('tkx-hl');});
var hits=[];document.querySelectorAll('[data-tkx-ids]').forEach(function(e){if(e===el)return;
var k=e.getAttribute('data-tkx-key');
if(toks(e,'data-tkx-ids').indexOf(key)>=0||(k&&own.indexOf(k)>=0)){
e.classList.add('tkx-hl');hits.push(e);}});
el.classList.add('tkx-hl');document.body.setAttribute('data-tkx-selected',key);
var seen=[];hits.forEach(function(e){if(e.closest('details:not([open])'))return;
var p=scroller(e,e.closest('.tkx-view'));if(!p||seen.indexOf(p)>=0)return;seen.push(p);
if(!p.contains(el))reveal(e);});return hits;}
document.addEventListener('click',function(ev){var el=ev.target.closest?ev.target.closest('[data-tkx-key]'):null;
if(el)select(el);});
window.tkxSelect=function(key){var el=document.querySelector('[data-tkx-key="'+key+'"]');
return el?select(el).length:-1;};
document.addEventListener('click',function(ev){var b=ev.target.closest?ev.target.closest('[data-tkx-showall]'):null;
if(!b)return;var t=b.previousElementSibling;if(!t)return;
var cap=t.getAttribute('data-tkx-cap');t.style.maxHeight=t.style.maxHeight?'':cap;
b.textContent=t.style.maxHeight?b.getAttribute('data-tkx-showall'):'show less';});})();
(function(){document.querySelectorAll('[data-tkx-showall]').forEach(function(b){b.style.display='';});
document.querySelectorAll('.tkx-zoom').forEach(function(z){if(z.__tkx)return;z.__tkx=1;
var img=z.querySelector('img'),bar=z.querySelector('.tkx-zbar');if(!img||!bar)return;bar.style.display='';
z.classList.add('tkx-zon');var k=0;
function cur(){return k||(img.clientWidth/(img.naturalWidth||img.clientWidth||1));}
function set(v,cx,cy){var old=cur();k=v;if(v===0){img.style.width='';img.style.maxWidth='100%';}
else{img.style.maxWidth='none';img.style.width=Math.round((img.naturalWidth||img.clientWidth)*v)+'px';}
z.setAttribute('data-tkx-zoom',v===0?'fit':v.toFixed(2));
if(cx!==undefined&&v){var f=v/old;z.scrollLeft=(z.scrollLeft+cx)*f-cx;z.scrollTop=(z.scrollTop+cy)*f-cy;}}
bar.addEventListener('click',function(ev){var b=ev.target.closest('[data-tkx-z]');if(!b)return;ev.stopPropagation();
var w=b.getAttribute('data-tkx-z');if(w==='in')set(cur()*1.25);else if(w==='out')set(Math.max(0.05,cur()/1.25));
else if(w==='fit')set(0);else set(1);});
z.addEventListener('wheel',function(ev){if(!ev.ctrlKey)return;ev.preventDefault();var r=z.getBoundingClientRect();
set(Math.min(8,Math.max(0.05,cur()*(ev.deltaY<0?1.15:1/1.15))),ev.clientX-r.left,ev.clientY-r.top);},{passive:false});
var d=null;img.addEventListener('mousedown',function(ev){d=[ev.clientX,ev.clientY,z.scrollLeft,z.scrollTop];
ev.preventDefault();});
window.addEventListener('mousemove',function(ev){if(!d)return;z.scrollLeft=d[2]-(ev.clientX-d[0]);
z.scrollTop=d[3]-(ev.clientY-d[1]);});window.addEventListener('mouseup',function(){d=null;});});})();
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


def zoomable(img_html: str, what: str = "graph") -> str:
    """``img_html`` in a box that zooms and pans where scripts run (the report, trusted
    notebooks): buttons zoom in/out, "100%" shows the graph at its own size (text legible),
    "fit" fits it to the width; drag pans, Ctrl+wheel zooms. Where scripts do not run
    (untrusted notebooks, GitHub) the buttons stay hidden and the static image fits the width,
    in a box capped at 70% of the window's height that scrolls."""
    bar = ('<div class="tkx-zbar" style="display:none">'
           '<button type="button" data-tkx-z="in" title="zoom in">+</button>'
           '<button type="button" data-tkx-z="out" title="zoom out">&#8722;</button>'
           '<button type="button" data-tkx-z="1" title="the graph at its own size">100%</button>'
           '<button type="button" data-tkx-z="fit" title="fit to the width">fit</button>'
           f'<span class="tkx-dim"> {esc(what)}: drag to pan, Ctrl+wheel to zoom</span></div>')
    # the height cap is an inline style: it holds in untrusted notebooks too (the box scrolls)
    return (f'<div class="tkx-zoom" data-tkx-zoom="fit" style="max-height:70vh;overflow:auto">'
            f'{bar}{img_html}</div>')


#: Tables with more rows than this are capped in height (scrolling inside their box) with a
#: "show all" button where scripts run.
CAP_ROWS = 40
CAP_HEIGHT = "420px"


def capped(table_html: str, rows: int, what: str = "rows") -> str:
    """``table_html`` capped at :data:`CAP_HEIGHT` (it scrolls inside its own box) when it has
    more than :data:`CAP_ROWS` rows, with a "show all N rows" toggle where scripts run. The cap
    is an inline style, so it holds in untrusted notebooks too."""
    if rows <= CAP_ROWS:
        return table_html
    label = f"show all {rows} {what}"
    return (f'<div class="tkx-cap" data-tkx-cap="{CAP_HEIGHT}" style="max-height:{CAP_HEIGHT};overflow:auto">'
            f'{table_html}</div><button type="button" class="tkx-showall" data-tkx-showall="{esc(label)}" '
            f'style="display:none">{esc(label)}</button>')


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
    """The graph as a zoomable ``<img>``, or - without ``dot``, or when dot fails or times out -
    a one-line notice (with dot's own error text) and the DOT source."""
    svg, why = run_dot(graph)
    if svg is not None:
        return zoomable(svg_img(svg, alt), alt)
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


def dot_id(name: str) -> str:
    """A graph name made a plain DOT identifier: a step named ``<lambda>``, ``<map>`` or ``a\\`` would
    otherwise be read as an HTML string or an unterminated quoted string. Letters, digits, ``_``, ``.``
    and ``-`` are kept, anything else becomes ``_`` (the name is the SVG's title, never a label)."""
    return re.sub(r"[^\w.\-]", "_", name) or "graph"


def safe_digraph(**kwargs: Any) -> Any:
    """A new :class:`SafeDigraph <_graph_class>` (``graphviz.Digraph`` arguments; ``name`` made a plain
    identifier by :func:`dot_id`)."""
    if not _SAFE:
        _SAFE.append(_graph_class())
    if isinstance(kwargs.get("name"), str):
        kwargs["name"] = dot_id(kwargs["name"])
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
