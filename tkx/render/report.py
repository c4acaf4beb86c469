"""One self-contained HTML file with every stage of a compilation: :func:`report`.

::

    tkx.report(step, inputs, "digits.html", tile_m=32)     # -> "digits.html"
    tkx tour --example digits_mlp --html digits.html        # the same from the command line

The file holds a header (example, options, versions), a table of contents and one section per
stage of an :class:`~tkx.explore.Exploration` - captured graph, IR, pass trace, IR after the
passes, fused schedule, arena, CUDA source and, on a machine with a GPU, the compiled runner
and its verification. Each section is the stage object's own notebook view
(``_repr_mimebundle_()["text/html"]``), or its text in a ``<pre>`` where it has none, so the
file shows what a notebook shows. Clicking an element that stands for something (an IR op, a
fusion group, a CUDA line) highlights everything linked to it on the whole page (the linking
script of :mod:`tkx.render`), and the side bar says where the matches are.

Nothing is fetched: styles, scripts and graphs (SVG data URIs) are inline, so the file opens
from disk, from a CI artifact or from an e-mail. The output is deterministic: no timestamps,
and durations (pass times, compile times) are left out unless ``timings=True``, so exporting
the same example twice gives byte-identical files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

from .. import pipeline
from .base import dot_available, esc, view
from .hgraph import hgraph_script, hgraph_style

#: (stage id, title, what a first-time reader needs to know about it), from the pipeline table.
SECTIONS = tuple((s.name, s.title, s.about) for s in pipeline.STAGES)

PAGE_STYLE = """
body{margin:0;font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#24292f;
  background:#f6f8fa;font-size:14px;line-height:1.45}
code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
.tkx-r-side{box-sizing:border-box;position:fixed;top:0;left:0;bottom:0;width:230px;overflow:auto;background:#fff;
  border-right:1px solid #d0d7de;padding:14px 12px}
.tkx-r-side .tkx-r-brand{font-size:15px;font-weight:700;margin:0 0 2px}
.tkx-r-side .tkx-r-sub{color:#57606a;font-size:12px;margin-bottom:10px}
.tkx-r-toc ol{margin:0;padding-left:22px}.tkx-r-toc li{margin:3px 0}
.tkx-r-toc a{color:#0969da;text-decoration:none}.tkx-r-toc a:hover{text-decoration:underline}
.tkx-r-toc .tkx-r-none{color:#8c959f}
.tkx-r-sel{margin-top:14px;padding-top:10px;border-top:1px solid #d0d7de;font-size:12px;color:#57606a}
.tkx-r-sel b{color:#24292f}.tkx-r-sel a{color:#0969da;cursor:pointer}
.tkx-r-sel ul{margin:4px 0;padding-left:16px}
.tkx-r-facts{margin:6px 0;color:#24292f}.tkx-r-facts div{margin:2px 0;overflow-wrap:anywhere}
.tkx-r-main{margin-left:230px;padding:14px 28px 40px}
.tkx-r-head{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:12px 16px}
.tkx-r-head h1{font-size:20px;margin:0 0 4px}
.tkx-r-head table{border-collapse:collapse;margin-top:6px}
.tkx-r-head th{text-align:left;font-weight:normal;color:#57606a;padding:1px 14px 1px 0;vertical-align:top}
.tkx-r-head td{padding:1px 0}
.tkx-r-opts td,.tkx-r-opts th{padding:1px 12px 1px 0;font-size:12px}
.tkx-r-opts .tkx-r-changed{font-weight:600}
.tkx-r-howto{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 10px;margin-top:10px}
section.tkx-r-sec{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:10px 16px;margin:16px 0;
  scroll-margin-top:8px}
section.tkx-r-sec h2{font-size:17px;margin:2px 0 2px}
section.tkx-r-sec h2 .tkx-r-n{color:#8c959f;margin-right:6px}
.tkx-r-about{margin:2px 0 6px;color:#57606a;max-width:900px}
.tkx-r-py{float:right;color:#8c959f;font-weight:normal;font-size:12px;margin-top:4px}
section.tkx-r-sec .tkx-view{max-height:78vh}
section.tkx-r-sec .tkx-view .tkx-scroll{max-height:min(640px,60vh)}
.tkx-r-missing{color:#57606a;font-style:italic}
@media (max-width:900px){.tkx-r-side{position:static;width:auto;border-right:none;border-bottom:1px solid #d0d7de}
  .tkx-r-main{margin-left:0;padding:10px}}
"""

# Lists, in the side bar, where the elements linked to the clicked one are (per section) and
# offers a way back to the clicked element: the shared linking script scrolls to the matches.
PAGE_SCRIPT = """
(function(){if(window.__tkxReport)return;window.__tkxReport=true;var last=null;
function show(el){var box=document.getElementById('tkx-selection');if(!box)return;
var key=el.getAttribute('data-tkx-key');var parts=[];
document.querySelectorAll('section.tkx-r-sec').forEach(function(sec){
var n=sec.querySelectorAll('.tkx-hl').length;if(el.closest('section.tkx-r-sec')===sec&&n>0)n-=1;
if(n>0)parts.push('<li><a data-tkx-go="'+sec.id+'">'+sec.getAttribute('data-tkx-title')+'</a>: '+n+'</li>');});
var rows=fact(key);var table=rows?'<div class="tkx-r-facts">'+rows.map(function(r){
return '<div><b>'+safe(r[0])+'</b> '+safe(r[1])+'</div>';}).join('')+'</div>':'';
box.innerHTML='<b>selected</b> <code>'+safe(key)+'</code> <a data-tkx-back="1">(back to it)</a>'+table+
(parts.length?'<div>linked on this page:</div><ul>'+parts.join('')+'</ul>':
'<div>nothing else on the page is linked to it</div>');}
function safe(s){return String(s).replace(/[&<>"]/g,function(c){
return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
var facts=null;function fact(key){if(facts===null){var s=document.getElementById('tkx-facts');
try{facts=s?JSON.parse(s.textContent):{};}catch(e){facts={};}}return facts[key];}
document.addEventListener('click',function(ev){var t=ev.target;if(!t.closest)return;
var go=t.closest('[data-tkx-go]');if(go){var sec=document.getElementById(go.getAttribute('data-tkx-go'));
var hit=sec&&sec.querySelector('.tkx-hl');if(hit)hit.scrollIntoView({block:'center'});return;}
if(t.closest('[data-tkx-back]')){if(last)last.scrollIntoView({block:'center'});return;}
var el=t.closest('[data-tkx-key]');if(el&&!el.closest('.tkx-r-side')){last=el;show(el);}});})();
"""


class _Untimed(float):
    """A duration left out of a deterministic export: prints as ``-`` whatever the format."""

    def __new__(cls) -> _Untimed:
        return super().__new__(cls, 0.0)

    def __format__(self, spec: str) -> str:
        return "-"

    def __repr__(self) -> str:
        return "-"

    __str__ = __repr__

    def _same(self, *args: Any) -> _Untimed:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _same


def untimed_trace(trace: Any) -> Any:
    """A copy of a :class:`~tkx.passes.PassTrace` whose pass times print as ``-``."""
    try:
        steps = tuple(dataclasses.replace(s, ms=_Untimed()) for s in trace.steps)
        return dataclasses.replace(trace, steps=steps)
    except (TypeError, AttributeError, ValueError):
        return trace


def stage_html(obj: Any, kind: str, title: str) -> str:
    """The HTML view of one stage object: its own ``_repr_mimebundle_`` (or ``_repr_html_``)
    where it has one, else its text in a ``<pre>``. A view that raises is shown as its text
    plus a one-line notice (a report is still written)."""
    problem = ""
    for method in ("_repr_mimebundle_", "_repr_html_"):
        fn = getattr(obj, method, None)
        if fn is None:
            continue
        try:
            data = fn()
            if isinstance(data, tuple):  # (data, metadata)
                data = data[0]
            html_text = data.get("text/html") if isinstance(data, dict) else data
            if isinstance(html_text, str) and html_text:
                return html_text
        except Exception as exc:  # a broken view must not lose the whole report
            problem = f"{type(obj).__name__}.{method} failed: {type(exc).__name__}: {exc}"
            break
    text = str(obj)
    notice = f'<div class="tkx-dim">{esc(problem)}</div>' if problem else ""
    return view(kind, title, f"{notice}<pre>{esc(text)}</pre>", "")


def _whole_kernel(cuda: Any, title: str) -> str:
    """The CUDA view with every line of the kernel (:func:`tkx.render.cuda.cuda_html` ``whole=True``)."""
    try:
        from .cuda import cuda_html
        return cuda_html(cuda, whole=True)
    except Exception:  # a broken view must not lose the report: the plain view, or the text
        return stage_html(cuda, "cuda", title)


def _versions(gpu_name: str | None) -> list[tuple[str, str]]:
    import torch

    import tkx

    rows = [("tkx", getattr(tkx, "__version__", "unknown")), ("torch", torch.__version__),
            ("python", platform.python_version())]
    rows.append(("graphs", "Graphviz dot: SVG images" if dot_available()
                 else "Graphviz dot not installed: DOT source shown instead"))
    rows.append(("GPU", gpu_name or "none (the runner section needs one)"))
    return rows


def _options_html(options: Any) -> str:
    changed = options.changed() if hasattr(options, "changed") else {}
    rows = []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        cls = ' class="tkx-r-changed"' if f.name in changed else ""
        rows.append(f"<tr{cls}><th>{esc(f.name)}</th><td><code>{esc(repr(value))}</code></td>"
                    f'<td class="tkx-dim">{esc(f.metadata.get("help", ""))}</td></tr>')
    summary = (f"<code>{esc(repr(options))}</code>" if changed else "<code>Options()</code>: all defaults")
    return (f"{summary}<details><summary>all {len(rows)} options (changed ones in bold)</summary>"
            f'<table class="tkx-r-opts">{"".join(rows)}</table></details>')


def _gpu_part(exp: Any, *, gpu: bool | None, make_inputs: Callable[..., Any] | None, timings: bool,
              runner: Any, verification: Any) -> tuple[str | None, str]:
    """(GPU name or None, HTML of the runner section's view)."""
    from .runtime_views import runner_html

    if runner is None:
        if gpu is False:
            return None, '<div class="tkx-r-missing">left out (gpu=False)</div>'
        try:
            import torch

            available = torch.cuda.is_available()
        except Exception:  # pragma: no cover - a broken torch install
            available = False
        if not available:
            return None, ('<div class="tkx-r-missing">No CUDA GPU on the machine that wrote this report: '
                          "compiling for the device, running, verifying against eager PyTorch and timing "
                          "need one. Every section above ran on the CPU.</div>")
        try:
            from ..runtime import CompiledRunner

            runner = CompiledRunner(exp.cuda, step_fn=exp.step_fn)
            verification = runner.verify(make_inputs=make_inputs)
        except Exception as exc:  # the report is still written, with the reason
            first = (str(exc).splitlines() or [""])[0]
            return None, (f'<div class="tkx-r-missing">The GPU part failed: {esc(type(exc).__name__)}: '
                          f"{esc(first)}</div>")
    name = None
    try:
        import torch

        name = torch.cuda.get_device_name(getattr(runner, "device", None))
    except Exception:
        name = "a CUDA GPU"
    return name, runner_html(runner, timings=timings, verification=verification)


#: Sections that open on the hierarchical graph (:mod:`tkx.render.hgraph`), with how to build it.
GRAPH_SECTIONS = {"captured": "captured_hgraph", "program": "program_hgraph", "optimized": "program_hgraph"}


def graph_view(sid: str, stages: dict[str, Any]) -> str:
    """The hierarchical graph of section ``sid`` ('' for a section without one; a graph that
    cannot be built is one line saying why, and the rest of the section is kept)."""
    from . import hgraph

    if sid not in GRAPH_SECTIONS:
        return ""
    what = "FX graph" if sid == "captured" else "dataflow graph"
    try:
        data = getattr(hgraph, GRAPH_SECTIONS[sid])(stages[sid], stages.get("schedule"))
    except Exception as exc:  # a broken graph must not lose the section
        return f'<div class="tkx-r-missing">{esc(what)}: not drawn ({esc(type(exc).__name__)}: {esc(exc)})</div>'
    return hgraph.hgraph_html(data, what)


def report_html(exploration: Any, *, description: str | None = None, timings: bool = False,
                gpu: bool | None = None, make_inputs: Callable[..., Any] | None = None,
                runner: Any = None, verification: Any = None) -> str:
    """The report of an :class:`~tkx.explore.Exploration` as one HTML document (a string).

    ``timings``: keep durations (pass times, stage times, compile times); off by default so
    the output is deterministic. ``gpu``: ``None`` adds the runner section when CUDA is
    available, ``False`` never. ``runner``/``verification``: an already compiled runner and
    its check to show instead of compiling again. ``make_inputs(seed)``: inputs for the
    verification (random ones shaped like the example's otherwise).
    """
    exp = exploration
    stages: dict[str, Any] = {}
    for sid, _, _ in SECTIONS:
        if sid == "runner":
            continue
        obj = getattr(exp, sid)
        if sid == "passes" and not timings:
            obj = untimed_trace(obj)
        stages[sid] = obj
    gpu_name, runner_view = _gpu_part(exp, gpu=gpu, make_inputs=make_inputs, timings=timings,
                                      runner=runner, verification=verification)

    sections, toc = [], []
    for i, (sid, title, about) in enumerate(SECTIONS, 1):
        anchor = f"tkx-sec-{sid}"
        if sid == "runner":
            body, present = runner_view, gpu_name is not None
        elif sid == "cuda":  # every line of the kernel, with its line, group and module index
            body, present = _whole_kernel(stages[sid], title), True
        else:
            body, present = graph_view(sid, stages) + stage_html(stages[sid], sid, title), True
        ms = exp.timings.get(sid) if timings else None
        took = f" <span class=\"tkx-dim\">({ms:.1f} ms)</span>" if ms is not None else ""
        none = "" if present else ' class="tkx-r-none"'
        toc.append(f'<li><a href="#{anchor}"{none}>{esc(title)}</a></li>')
        sections.append(
            f'<section class="tkx-r-sec" id="{anchor}" data-tkx-stage="{sid}" data-tkx-title="{esc(title)}">'
            f'<h2><span class="tkx-r-n">{i}</span>{esc(title)}{took}'
            f'<code class="tkx-r-py" title="the same object in Python">ex.{sid}</code></h2>'
            f'<p class="tkx-r-about">{esc(about)}</p>{body}</section>')

    name = getattr(exp, "name", "step")
    head_rows = [("example", f"<b>{esc(name)}</b>" + (f" - {esc(description)}" if description else "")),
                 ("options", _options_html(exp.options)),
                 ("in Python", "<code>ex = tkx.explore(step_fn, example_inputs, **options)</code>: "
                               "each section below is one attribute of <code>ex</code>, shown as a notebook "
                               "shows it")]
    head_rows += [(k, esc(v)) for k, v in _versions(gpu_name)]
    if not timings:
        head_rows.append(("durations", "left out so the file is deterministic (<code>timings=True</code> keeps "
                                       "them)"))
    head_table = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in head_rows)
    howto = ('<div class="tkx-r-howto"><b>How to read it.</b> Sections follow the compiler, top to bottom. '
             "Click an op, a fusion group, a buffer or a CUDA line: everything linked to it on this page "
             "(the FX node it came from, its group, its place in the arena, the CUDA lines that compute it; "
             "for a CUDA line, its ops, group and arena slot) turns yellow, each box scrolls to it, and the "
             "side bar says what an op is (module, fusion group, arena slot, CUDA lines, predicted µs of its "
             "group) and lists where the rest is. Graphs zoom and pan: + / &#8722; / 100% / fit, drag to pan, "
             "Ctrl+wheel to zoom.</div>")
    header = (f'<header class="tkx-r-head"><h1>tkx report: {esc(name)}</h1>'
              f"<table>{head_table}</table>{howto}</header>")
    side = ('<nav class="tkx-r-side"><div class="tkx-r-brand">tkx report</div>'
            f'<div class="tkx-r-sub">{esc(name)}</div>'
            f'<div class="tkx-r-toc"><ol>{"".join(toc)}</ol></div>'
            '<div class="tkx-r-sel" id="tkx-selection">Click an op, group or line to see what it links to.</div>'
            "</nav>")
    return ("<!DOCTYPE html>\n"
            '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<meta name="generator" content="tkx {esc(_versions(None)[0][1])}">\n'
            f"<title>tkx report: {esc(name)}</title>\n<style>{PAGE_STYLE}{hgraph_style()}</style>\n</head>\n"
            "<body>\n"
            f"{side}\n<main class=\"tkx-r-main\">\n{header}\n" + "\n".join(sections) +
            f"\n</main>\n{_facts_json(stages)}<script>{PAGE_SCRIPT}</script>\n<script>{hgraph_script()}</script>"
            "\n</body>\n</html>\n")


def _facts_json(stages: dict[str, Any]) -> str:
    """The side bar's facts per op and group (:func:`tkx.render.selection.selection_facts`: module,
    fusion group, arena slot, CUDA lines, predicted µs) as a JSON data block; ``""`` when they cannot
    be had (the page still links, without them)."""
    from .selection import group_times_us, selection_facts

    try:
        cuda = stages["cuda"]
        try:
            times = group_times_us(stages["timeline"])
        except Exception:  # no predicted timeline: the facts without the predicted µs
            times = {}
        facts = selection_facts(cuda.schedule, cuda.arena, cuda, times)
    except Exception:
        return ""
    text = json.dumps(facts, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="tkx-facts">{text}</script>\n'


def write_report(exploration: Any, path: str | os.PathLike[str], **kwargs: Any) -> str:
    """Write :func:`report_html` of ``exploration`` to ``path`` (UTF-8; parent folders are
    created) and return the path."""
    text = report_html(exploration, **kwargs)
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return path


def report(step_fn: Callable[..., Any], example_inputs: Sequence[Any], path: str | os.PathLike[str], *,
           name: str | None = None, loss: int | None = None, description: str | None = None,
           make_inputs: Callable[..., Any] | None = None, timings: bool = False, gpu: bool | None = None,
           state: Any = None, **options: Any) -> str:
    """Compile ``step_fn`` for ``example_inputs`` under ``options`` and write every stage to ONE
    self-contained HTML file at ``path``; returns ``path``.

    ``options`` are :class:`tkx.Options` fields (an invalid one raises
    :class:`tkx.OptionsError`); ``name``/``loss``/``state`` as for :func:`tkx.explore`. See
    :func:`report_html` for ``description``, ``make_inputs``, ``timings`` and ``gpu``.
    Raises whatever a stage raises (e.g. :class:`tkx.UnsupportedError` from capture).
    """
    from ..explore import explore

    exp = explore(step_fn, example_inputs, name=name, loss=loss, state=state, **options)
    return write_report(exp, path, description=description, make_inputs=make_inputs, timings=timings, gpu=gpu)
