"""The plain-Python half of the explorer: no widgets here, so all of it is testable directly.

* :class:`Debouncer` - run a callback once after a burst of triggers (injectable scheduler,
  :meth:`~Debouncer.flush` to run the pending call now);
* :class:`Session` - the current good :class:`~tkx.Exploration`, the previous one, and
  :meth:`~Session.update`, which applies option changes through ``Exploration.with_options``
  (so only downstream stages are recomputed) and reports what it recomputed and how long
  it took, or the error - keeping the last good state;
* pass and fusion-rule toggles (:func:`user_passes`, :func:`user_rules`,
  :func:`pipeline_order`, :func:`scoped_rules`);
* :class:`Shown` - a display wrapper that uses an object's ``_repr_mimebundle_`` and never
  lets a broken view put a traceback in a cell; :func:`stage_diff`; :func:`error_text`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import html
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from .. import pipeline
from ..explore import STAGES, Exploration
from ..options import Options

#: Stages the explorer computes on every update (``runner`` needs a GPU and is computed on demand).
CPU_STAGES = pipeline.CPU_STAGES

#: Whether :class:`tkx.Options` has a ``rules`` field (per-exploration user fusion rules). Until
#: it does, rule toggles go through :func:`scoped_rules` (see its docstring).
HAS_RULES_OPTION = any(f.name == "rules" for f in dataclasses.fields(Options))


# --------------------------------------------------------------------------------------------
# messages
# --------------------------------------------------------------------------------------------
def error_text(exc: BaseException) -> str:
    """The exception's own message, readable, without a traceback (``KeyError`` unquoted)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and type(exc).__str__ is KeyError.__str__:
        msg = str(exc.args[0])
    else:
        msg = str(exc).strip()
    return msg or type(exc).__name__


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type (``True`` is not ``1``)."""
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------------------------
# debouncing
# --------------------------------------------------------------------------------------------
class Handle(Protocol):
    def cancel(self) -> Any: ...


#: ``scheduler(delay_s, callback) -> handle`` with ``handle.cancel()``.
Scheduler = Callable[[float, Callable[[], None]], Handle]


def default_scheduler(delay_s: float, callback: Callable[[], None]) -> Handle:
    """``loop.call_later`` on the running asyncio loop (a Jupyter kernel has one: the callback
    then runs on the kernel's thread, between messages), else a daemon ``threading.Timer``."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        timer = threading.Timer(delay_s, callback)
        timer.daemon = True
        timer.start()
        return timer
    return loop.call_later(delay_s, callback)


class Debouncer:
    """Call ``fn`` once, ``delay_s`` after the last of a burst of :meth:`trigger` calls.

    ``delay_s <= 0`` calls ``fn`` at once on every trigger. ``scheduler`` defaults to
    :func:`default_scheduler`; tests pass a fake one and fire it by hand, or call
    :meth:`flush`. ``fn`` exceptions propagate from :meth:`flush` and synchronous triggers.
    """

    def __init__(self, fn: Callable[[], Any], delay_s: float = 0.3, scheduler: Scheduler | None = None) -> None:
        self.fn = fn
        self.delay_s = float(delay_s)
        self.scheduler = scheduler or default_scheduler
        self._handle: Handle | None = None
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        return self._handle is not None

    def trigger(self) -> None:
        if self.delay_s <= 0:
            self.fn()
            return
        with self._lock:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self.scheduler(self.delay_s, self._fire)

    def _fire(self) -> None:
        with self._lock:
            if self._handle is None:  # flushed or cancelled meanwhile
                return
            self._handle = None
        self.fn()

    def cancel(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = None

    def flush(self) -> bool:
        """Run the pending call now; ``False`` if nothing was pending."""
        with self._lock:
            if self._handle is None:
                return False
            self._handle.cancel()
            self._handle = None
        self.fn()
        return True


# --------------------------------------------------------------------------------------------
# user passes and fusion rules
# --------------------------------------------------------------------------------------------
def user_passes() -> list[str]:
    """Names of registered passes that are not built in, in registration order."""
    from ..passes.registry import pass_info, pass_names

    return [n for n in pass_names() if not pass_info(n).builtin]


def builtin_passes() -> list[str]:
    from ..passes.registry import pass_info, pass_names

    return [n for n in pass_names() if pass_info(n).builtin]


def pass_description(name: str) -> str:
    from ..passes.registry import pass_info

    try:
        return pass_info(name).description or name
    except KeyError:
        return name


def user_rules() -> list[Any]:
    """The registered user fusion rules (:class:`~tkx.schedule.rules.FusionRule`), in the order asked."""
    from ..schedule.rules import BUILTIN_RULES, active_rules

    builtin = {r.name for r in BUILTIN_RULES}
    return [r for r in active_rules() if r.name not in builtin]


def pipeline_order(initial: tuple[str, ...] | None) -> list[str]:
    """Every registered pass in the order it would run when enabled: ``initial`` (or the
    default pipeline), then the other registered passes inserted before the final ``dce``."""
    from ..passes.registry import default_pipeline, pass_names

    order = list(initial if initial is not None else default_pipeline())
    for name in pass_names():
        if name not in order:
            cut = order.index("dce") if "dce" in order else len(order)
            order.insert(cut, name)
    return order


def pipeline_for(enabled: set[str] | frozenset[str], order: list[str]) -> tuple[str, ...] | None:
    """The ``passes`` option for the ``enabled`` passes: ``None`` when that is the default pipeline."""
    from ..passes.registry import default_pipeline

    chosen = tuple(n for n in order if n in enabled)
    return None if chosen == default_pipeline() else chosen


_RULES_LOCK = threading.RLock()


@contextmanager
def scoped_rules(disabled: frozenset[str] | set[str]) -> Iterator[None]:
    """While inside, the registered user fusion rules named in ``disabled`` are not asked.

    A stop-gap until :class:`tkx.Options` carries the enabled rules (``HAS_RULES_OPTION``):
    it narrows ``tkx.schedule.rules``' registry for the duration (under a lock) and restores it,
    order included. Only the explorer's own schedule computations run inside it, so a
    benchmark started from the explorer uses every registered rule.
    """
    if not disabled:
        yield
        return
    from ..schedule import rules as rules_mod

    registry = rules_mod._USER_RULES
    with _RULES_LOCK:
        saved = dict(registry)
        registry.clear()
        registry.update({k: v for k, v in saved.items() if k not in disabled})
        try:
            yield
        finally:
            registry.clear()
            registry.update(saved)


def restart_from(ex: Exploration, stage: str) -> Exploration:
    """A copy of ``ex`` keeping only the stages before ``stage`` (for changes that are not
    options, such as a user fusion rule switched off)."""
    keep = {k: v for k, v in ex._cache.items() if STAGES.index(k) < STAGES.index(stage)}
    return ex._derive(ex.options, keep)


# --------------------------------------------------------------------------------------------
# the session: current / previous good state and updates
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Update:
    """What one update did: the option ``changed`` (name -> new value; ``"rules"`` for a
    fusion-rule toggle), the stages ``recomputed`` (pipeline order), the wall time ``ms``,
    per-stage ``stage_ms``, and ``error`` (the message) with ``failed_stage`` when it failed."""

    changed: dict[str, Any]
    recomputed: list[str]
    ms: float
    stage_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None
    failed_stage: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Session:
    """The current good :class:`~tkx.Exploration` and the one before it.

    :meth:`update` derives a new exploration, computes its stages up to ``upto`` and - only if
    all of them succeed - makes it current. On an invalid option or a failing stage the current
    state is kept and the :class:`Update` carries the message.
    """

    def __init__(self, exploration: Exploration, *, upto: str = "cuda",
                 disabled_rules: frozenset[str] = frozenset()) -> None:
        self.current = exploration
        self.previous: Exploration | None = None
        self.upto = upto
        self.disabled_rules = frozenset(disabled_rules)
        self.lock = threading.RLock()
        #: The message of the last failed update or start (``None`` when the last one succeeded).
        self.error: str | None = None
        #: (message, stage) when the current exploration itself failed to compute (at start).
        self.broken: tuple[str, str | None] | None = None

    def compute(self, ex: Exploration, disabled: frozenset[str] = frozenset()
                ) -> tuple[list[str], dict[str, float], str | None, str | None]:
        """Compute ``ex``'s stages up to ``upto`` with the user rules in ``disabled`` off:
        (stages computed now, ms per stage, error message, failed stage)."""
        done: list[str] = []
        ms: dict[str, float] = {}
        stage = None
        try:
            with scoped_rules(frozenset() if HAS_RULES_OPTION else disabled):
                for stage in STAGES[: STAGES.index(self.upto) + 1]:
                    fresh = stage not in ex._cache
                    t0 = time.perf_counter()
                    getattr(ex, stage)
                    if fresh:
                        done.append(stage)
                        ms[stage] = round((time.perf_counter() - t0) * 1e3, 3)
        except Exception as exc:  # a failing stage is shown in the widget, never raised
            return done, ms, error_text(exc), stage
        return done, ms, None, None

    def start(self) -> Update:
        """Compute the current exploration's stages (the first display)."""
        with self.lock:
            t0 = time.perf_counter()
            done, ms, err, failed = self.compute(self.current, self.disabled_rules)
            self.error = err
            self.broken = (err, failed) if err else None
            return Update({}, done, round((time.perf_counter() - t0) * 1e3, 3), ms, err, failed)

    def update(self, desired: dict[str, Any], disabled_rules: frozenset[str] | None = None, *,
               force_from: str | None = None) -> Update:
        """Apply ``desired`` option values (all or some fields) and the set of disabled user rules;
        ``force_from`` recomputes from that stage on even without a change (registries re-read)."""
        with self.lock:
            cur = self.current
            disabled = self.disabled_rules if disabled_rules is None else frozenset(disabled_rules)
            changes = {k: v for k, v in desired.items() if not same(getattr(cur.options, k, None), v)}
            rules_changed = disabled != self.disabled_rules
            if HAS_RULES_OPTION and rules_changed:
                names = [r.name for r in user_rules()]
                enabled = tuple(n for n in names if n not in disabled)
                changes["rules"] = None if len(enabled) == len(names) else enabled
            shown = dict(changes)
            if rules_changed:
                shown["rules"] = {"disabled": sorted(disabled)}
            if force_from:
                shown["recompute"] = f"from {force_from}"
            if not shown:  # back to the current options: its own state (and error, if it never computed)
                self.error = self.broken[0] if self.broken else None
                return Update({}, [], 0.0, {}, *(self.broken or (None, None)))
            t0 = time.perf_counter()
            try:
                new = cur.with_options(**changes) if changes else cur
            except Exception as exc:  # OptionsError: a bad value or combination
                self.error = error_text(exc)
                return Update(shown, [], round((time.perf_counter() - t0) * 1e3, 3), {}, self.error, "options")
            if force_from:
                new = restart_from(new, force_from)
            if rules_changed and not HAS_RULES_OPTION:
                new = restart_from(new, "schedule")
            done, ms, err, failed = self.compute(new, disabled)
            total = round((time.perf_counter() - t0) * 1e3, 3)
            if err is not None:
                self.error = err
                return Update(shown, done, total, ms, err, failed)
            self.previous, self.current = cur, new
            self.disabled_rules = disabled
            self.error = self.broken = None
            return Update(shown, done, total, ms)


# --------------------------------------------------------------------------------------------
# display
# --------------------------------------------------------------------------------------------
_PRE = ('<pre style="font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;'
        'line-height:1.35;margin:0;white-space:pre;overflow:auto">{}</pre>')


def pre_html(text: str) -> str:
    return _PRE.format(html.escape(text))


def note_html(text: str, kind: str = "note") -> str:
    """A one-line coloured note (``kind``: note, error, ok, warn)."""
    colors = {"note": ("#57606a", "#f6f8fa"), "error": ("#a40e26", "#ffebe9"), "ok": ("#1a7f37", "#dafbe1"),
              "warn": ("#7d4e00", "#fff8c5")}
    fg, bg = colors.get(kind, colors["note"])
    return (f'<div class="tkx-explorer-{kind}" style="color:{fg};background:{bg};padding:4px 8px;'
            f'border-radius:4px;white-space:pre-wrap;font-family:system-ui,sans-serif;font-size:13px">'
            f'{html.escape(text)}</div>')


class Note:
    """Display object for a one-line note: text/plain is the text, text/html :func:`note_html`."""

    def __init__(self, text: str, kind: str = "note") -> None:
        self.text, self.kind = text, kind

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": note_html(self.text, self.kind)}

    def __repr__(self) -> str:
        return self.text


class Shown:
    """Displays ``obj`` through its own ``_repr_mimebundle_`` (or ``_repr_html_``), falling
    back to ``str(obj)`` in a ``<pre>``; a view that raises shows the text and a one-line note
    instead of a traceback. ``header`` (HTML) goes above the view."""

    def __init__(self, obj: Any, header: str = "") -> None:
        self.obj = obj
        self.header = header

    def bundle(self) -> dict[str, Any]:
        obj, note = self.obj, ""
        if isinstance(obj, str):
            return {"text/plain": obj, "text/html": self.header + pre_html(obj)}
        try:
            data: Any = None
            if hasattr(obj, "_repr_mimebundle_"):
                data = obj._repr_mimebundle_()
                if isinstance(data, tuple):
                    data = data[0]
            elif hasattr(obj, "_repr_html_"):
                h = obj._repr_html_()
                data = {"text/html": h} if h else None
            if data:
                data = dict(data)
                data.setdefault("text/plain", _safe_str(obj, repr))
                if self.header and "text/html" in data:
                    data["text/html"] = self.header + data["text/html"]
                return data
        except Exception as exc:  # never a traceback in the widget
            note = f"(the HTML view of {type(obj).__name__} failed: {error_text(exc)}; showing its text)"
        text = _safe_str(obj, str)
        body = (note_html(note, "warn") if note else "") + pre_html(text)
        return {"text/plain": text, "text/html": self.header + body}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return self.bundle()

    def __repr__(self) -> str:
        return _safe_str(self.obj, repr)


def _safe_str(obj: Any, fn: Callable[[Any], str]) -> str:
    try:
        return fn(obj)
    except Exception as exc:
        return f"<{type(obj).__name__}: str() failed: {error_text(exc)}>"


def stage_diff(previous: Any, current: Any) -> Any:
    """What changed from ``previous`` to ``current``: ``previous.diff(current)`` when the
    stage has ``diff``, else a unified diff of their ``str()`` (a string)."""
    if previous is current:
        return "unchanged: the last update reused this stage"
    if hasattr(previous, "diff"):
        try:
            return previous.diff(current)
        except Exception as exc:
            head = f"({type(previous).__name__}.diff failed: {error_text(exc)}; text diff instead)\n"
            return head + text_diff(previous, current)
    return text_diff(previous, current)


def text_diff(previous: Any, current: Any, context: int = 2) -> str:
    a = _safe_str(previous, str).splitlines()
    b = _safe_str(current, str).splitlines()
    lines = list(difflib.unified_diff(a, b, "previous", "current", n=context, lineterm=""))
    return "\n".join(lines) if lines else "no textual difference"


def options_label(options: Options, disabled_rules: frozenset[str] | set[str] = frozenset()) -> str:
    """A short configuration label: changed fields and disabled rules, or ``defaults``."""
    parts = [f"{k}={v!r}" for k, v in options.changed().items()]
    parts += [f"rule {n} off" for n in sorted(disabled_rules)]
    return ", ".join(parts) or "defaults"
