"""The display registry: how a stage object finds its views without importing them.

Stage objects (``Program``, ``FusedSchedule``, ``CudaSource`` ...) keep the Jupyter and rich
protocols (``_repr_mimebundle_``, ``__rich__``) and the methods ``graph()`` and ``diff()``, and
forward them here; the views register themselves here. So the stages sit below their views:
``tkx.ir`` imports this module and nothing of ``tkx.render``, and the renderers import the
stages (to draw them) but the stages never import the renderers. The model is xarray's
``Dataset._repr_html_`` forwarding to ``formatting_html``.

A view is registered for a class and a *kind*::

    @display.register(FusedSchedule, "html")
    def schedule_html(s): ...

Kinds used by tkx:

* ``"html"``: ``f(obj, **kw) -> str``, the HTML view (``_repr_mimebundle_``'s ``text/html``);
* ``"plain"``: ``f(obj) -> str``, the ``text/plain`` of the bundle (default: ``repr(obj)``);
* ``"text"``: ``f(obj) -> str``, ``str(obj)`` (the printers);
* ``"rich"``: ``f(obj)``, a rich renderable (``__rich__``);
* ``"graph"``: ``f(obj, **kw) -> graphviz.Digraph``; ``"svg"``: ``f(obj) -> str`` (SVG text);
* ``"diff"``: ``f(obj, other, **kw)``, the diff *data* (computed in the stage packages; the
  result is an object with views of its own);
* ``"widget"``: ``f(obj, **kw)``, an interactive widget (``tkx.explorer``).

Lookups walk the object's class hierarchy (a view of a base class serves its subclasses). The
registry is filled by the modules of :data:`PROVIDERS`, imported by name the first time a view
of that kind is looked up (as entry points are): this module imports nothing of tkx, so the
core imports without graphviz, rich or ipywidgets, and each provider is loaded only when asked.
"""

from __future__ import annotations

import html
import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["register", "lookup", "registered", "mimebundle", "html_of", "rich", "graph", "diff", "text",
           "widget", "PROVIDERS", "ViewNotFound"]

#: kind -> the modules that register views of that kind (imported on the first lookup).
PROVIDERS: dict[str, tuple[str, ...]] = {
    "html": ("tkx.render",), "plain": ("tkx.render",), "text": ("tkx.render",),
    "rich": ("tkx.render",), "graph": ("tkx.render",), "svg": ("tkx.render",),
    # the diffs are data, computed in the stage packages; tkx.render draws them
    "diff": ("tkx.passes.diff", "tkx.schedule.diff", "tkx.arena.diff", "tkx.codegen.diff"),
    "widget": ("tkx.explorer",),
}

_VIEWS: dict[tuple[type, str], Callable[..., Any]] = {}
_LOADED: set[str] = set()


class ViewNotFound(LookupError):
    """No view of this kind is registered for the object's class (or any base class)."""


def register(cls: type, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``f`` as the ``kind`` view of ``cls`` (replacing an earlier one)."""
    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        _VIEWS[(cls, kind)] = f
        return f
    return deco


def _load(kind: str) -> None:
    for name in PROVIDERS.get(kind, ()):
        if name not in _LOADED:
            _LOADED.add(name)
            importlib.import_module(name)


def lookup(obj: Any, kind: str) -> Callable[..., Any]:
    """The ``kind`` view of ``obj``'s class; :class:`ViewNotFound` naming both if none."""
    _load(kind)
    for cls in type(obj).__mro__:
        f = _VIEWS.get((cls, kind))
        if f is not None:
            return f
    raise ViewNotFound(f"no {kind!r} view is registered for {type(obj).__name__}")


def registered(kind: str | None = None) -> dict[tuple[str, str], str]:
    """``{(class name, kind): view function name}`` of every registered view (for docs, tests)."""
    for k in PROVIDERS if kind is None else (kind,):
        if k != "widget":
            _load(k)
    return {(c.__name__, k): f"{f.__module__}.{f.__qualname__}" for (c, k), f in _VIEWS.items()
            if kind is None or k == kind}


def html_of(obj: Any, **kw: Any) -> str:
    """The HTML view of ``obj`` (raises what the view raises)."""
    return lookup(obj, "html")(obj, **kw)


def _failure_html(obj: Any, exc: BaseException) -> str:
    try:
        fallback = str(obj)
    except Exception:
        fallback = repr(obj)
    return (f'<div class="tkx-view"><div class="tkx-dim">tkx could not render this view '
            f'({html.escape(type(exc).__name__)}: {html.escape(str(exc))}); showing the text.</div>'
            f'<pre>{html.escape(fallback)}</pre></div>')


def mimebundle(obj: Any, include: Any = None, exclude: Any = None) -> dict[str, str]:
    """``{"text/plain": ..., "text/html": ...}`` of ``obj`` filtered by include/exclude.

    Never raises: a notebook cell must not show a traceback, so a failing view gives the
    object's text and a one-line note naming the error instead."""
    want = {"text/plain", "text/html"}
    if include:
        want &= set(include)
    if exclude:
        want -= set(exclude)
    bundle: dict[str, str] = {}
    if "text/plain" in want:
        try:
            bundle["text/plain"] = _view_or(obj, "plain", repr)
        except Exception:
            bundle["text/plain"] = repr(obj)
    if "text/html" in want:
        try:
            bundle["text/html"] = html_of(obj)
        except Exception as exc:  # a rendering bug must never put a traceback into a cell
            bundle["text/html"] = _failure_html(obj, exc)
    return {k: bundle[k] for k in ("text/plain", "text/html") if k in bundle}


def _view_or(obj: Any, kind: str, fallback: Callable[[Any], Any]) -> Any:
    """The registered ``kind`` view of ``obj`` applied to it; ``fallback(obj)`` when none is registered."""
    try:
        f = lookup(obj, kind)
    except ViewNotFound:
        return fallback(obj)
    return f(obj)


def rich(obj: Any) -> Any:
    """A rich renderable of ``obj`` (``__rich__``); its text when no rich view is registered."""
    return _view_or(obj, "rich", str)


def graph(obj: Any, *args: Any, **kw: Any) -> Any:
    """``obj.graph(...)``: a ``graphviz.Digraph``; :class:`ViewNotFound` if the stage has none."""
    return lookup(obj, "graph")(obj, *args, **kw)


def diff(obj: Any, other: Any, **kw: Any) -> Any:
    """``obj.diff(other)``: the diff data of two objects of one stage."""
    return lookup(obj, "diff")(obj, other, **kw)


def text(obj: Any) -> str:
    """``str(obj)`` from its printer; ``repr(obj)`` when none is registered."""
    return _view_or(obj, "text", repr)


class Views:
    """Base of the stage objects: shown through their registered views in a rich console
    (``__rich__``) and in a notebook (``_repr_mimebundle_``)."""

    __slots__ = ()

    def __rich__(self) -> Any:
        return rich(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return mimebundle(self, include, exclude)


def widget(obj: Any, **kw: Any) -> Any:
    """An interactive widget over ``obj`` (needs ipywidgets; :mod:`tkx.explorer` registers it)."""
    return lookup(obj, "widget")(obj, **kw)
