"""The pass registry and the pass runner.

A pass is a pure function ``Program -> Program`` registered under a name. Built-in passes
live in :mod:`tkx.passes.builtin`; a user registers one from a notebook cell::

    @tkx.passes.register_pass("fold_my_thing")
    def fold_my_thing(program):
        ...
        return program.replace(ops=new_ops)

and sees it in ``run_passes(program, [..., "fold_my_thing"])`` like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, overload

from ..errors import TkxError
from ..ir import IRValidationError, Program, validate
from ..watchdog import user_code
from .trace import PassStep, PassTrace

PassFn = Callable[[Program], Program]

#: The built-in pipeline, in order. See :func:`default_pipeline` for the one in effect.
DEFAULT_PIPELINE: tuple[str, ...] = ("canonicalize_views", "simplify", "cse", "transpose_gemm", "dce")


class PassError(TkxError):
    """A pass failed: it raised, returned something else than a Program, or broke the IR."""


class UnknownPassError(TkxError, KeyError):
    """No pass is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class PassInfo:
    """A registered pass: name, function, one-line description, default-pipeline member?"""

    name: str
    fn: PassFn
    description: str
    default: bool = False
    builtin: bool = False


_REGISTRY: dict[str, PassInfo] = {}
_USER_DEFAULTS: list[str] = []
_BUILTINS: dict[str, PassInfo] = {}


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ").strip()


@overload
def register_pass(name: PassFn) -> PassFn: ...
@overload
def register_pass(name: str | None = None, *, default: bool = False, description: str = "",
                  replace: bool = False) -> Callable[[PassFn], PassFn]: ...


def register_pass(name: Any = None, *, default: bool = False, description: str = "",
                  replace: bool = False, _builtin: bool = False) -> Any:
    """Register a pass ``Program -> Program`` under ``name`` (default: the function's name).

    Usable as ``@register_pass``, ``@register_pass()`` or ``@register_pass("name")``.
    ``default=True`` adds it to :func:`default_pipeline` (user passes run after the
    built-in rewrites, before the final ``dce``). ``description`` defaults to the first
    paragraph of the docstring. Registering a taken name raises :class:`PassError` unless
    ``replace=True`` (handy when re-running a notebook cell). Returns the function
    unchanged, so it stays callable directly.
    """
    if callable(name) and not isinstance(name, str):
        return register_pass(None, default=default, description=description, replace=replace)(name)

    def decorate(fn: PassFn) -> PassFn:
        if not callable(fn):
            raise PassError(f"register_pass expects a function Program -> Program, got {type(fn).__name__}")
        key = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(key, str) or not key:
            raise PassError("a pass needs a name: @register_pass('my_pass')")
        old = _REGISTRY.get(key)
        if old is not None and not replace:
            raise PassError(f"a pass named {key!r} is already registered; pass replace=True to replace it, "
                            f"or unregister_pass({key!r}) first")
        info = PassInfo(key, fn, description or _first_line(fn.__doc__), default, _builtin)
        _REGISTRY[key] = info
        if _builtin:
            _BUILTINS[key] = info
        if key in _USER_DEFAULTS:
            _USER_DEFAULTS.remove(key)
        if default and key not in DEFAULT_PIPELINE:
            _USER_DEFAULTS.append(key)
        return fn

    return decorate


def registry_fingerprint() -> tuple[tuple[str, int, bool], ...]:
    """A value that changes whenever a pass is registered, replaced or removed: ``(name, id(fn),
    default)`` per pass. :class:`tkx.Exploration` compares it to recompute stale pass traces."""
    return tuple((k, id(v.fn), k in _USER_DEFAULTS) for k, v in _REGISTRY.items())


def unregister_pass(name: str, *, missing_ok: bool = False) -> None:
    """Remove a user pass (and its default-pipeline membership); unknown names raise
    :class:`UnknownPassError` unless ``missing_ok=True`` (handy when re-running a notebook cell).

    Built-in passes cannot be removed; unregistering a user pass that replaced a built-in
    (``replace=True``) restores the built-in.
    """
    if name not in _REGISTRY:
        if missing_ok:
            return
        raise UnknownPassError(_unknown(name))
    if _REGISTRY[name].builtin:
        raise PassError(f"{name!r} is a built-in pass and cannot be unregistered; "
                        "run a pipeline without it instead: run_passes(program, [...])")
    if name in _BUILTINS:
        _REGISTRY[name] = _BUILTINS[name]
    else:
        del _REGISTRY[name]
    if name in _USER_DEFAULTS:
        _USER_DEFAULTS.remove(name)


def _unknown(name: str) -> str:
    return f"no pass named {name!r}; registered passes: {', '.join(pass_names())}"


def get_pass(name: str) -> PassFn:
    """The function registered as ``name``; :class:`UnknownPassError` (a ``KeyError``) otherwise."""
    try:
        return _REGISTRY[name].fn
    except KeyError:
        raise UnknownPassError(_unknown(name)) from None


def pass_info(name: str) -> PassInfo:
    """The :class:`PassInfo` of ``name`` (description, default membership)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPassError(_unknown(name)) from None


def pass_names() -> tuple[str, ...]:
    """Registered pass names: built-ins in pipeline order first, then the rest as registered."""
    builtin = [n for n in DEFAULT_PIPELINE if n in _REGISTRY]
    return tuple(builtin + [n for n in _REGISTRY if n not in builtin])


def default_pipeline() -> tuple[str, ...]:
    """:data:`DEFAULT_PIPELINE` plus user passes registered with ``default=True``
    (inserted before the final ``dce`` so their dead code is cleaned up)."""
    base = list(DEFAULT_PIPELINE)
    if not _USER_DEFAULTS:
        return tuple(base)
    cut = base.index("dce") if "dce" in base else len(base)
    return tuple(base[:cut] + _USER_DEFAULTS + base[cut:])


def _check_contract(name: str, before: Program, after: Any) -> None:
    if not isinstance(after, Program):
        raise PassError(f"pass {name!r} returned {type(after).__name__}, not a Program")
    try:
        validate(after)
    except IRValidationError as e:
        raise PassError(f"pass {name!r} produced an invalid program: {e}") from e
    if after.inputs != before.inputs:
        raise PassError(f"pass {name!r} changed the program inputs (a pass may only rewrite ops, "
                        "outputs' views and state-update values)")
    sig_a = [(o.name, o.value.shape, o.value.dtype) for o in before.outputs]
    sig_b = [(o.name, o.value.shape, o.value.dtype) for o in after.outputs]
    if sig_a != sig_b:
        raise PassError(f"pass {name!r} changed the program outputs' names, shapes or dtypes")
    if [u.input_index for u in before.updates] != [u.input_index for u in after.updates]:
        raise PassError(f"pass {name!r} added or dropped in-place state updates")


def _program_hint(x: Any) -> str:
    """Where the Program is in ``x`` (an Exploration, a PassTrace, a captured graph, ...)."""
    kind = type(x).__name__
    if kind == "Exploration":
        return "pass exp.program (or use exp.passes)"
    if kind == "PassTrace":
        return "pass trace.output (the program after its passes)"
    if isinstance(getattr(x, "program", None), Program):
        return f"pass its .program ({kind}.program)"
    return "capture one first: tkx.capture(step_fn, example_inputs).program"


def run_passes(program: Program, passes: Iterable[str | PassFn] | None = None) -> PassTrace:
    """Run ``passes`` (names or functions; the default pipeline when ``None``) in order.

    After every pass the result is validated (:func:`tkx.ir.validate`) and checked to keep
    the program's signature; a pass that breaks either raises :class:`PassError` naming
    it. Each pass is timed with ``time.perf_counter``. Returns a :class:`PassTrace`.
    """
    if not isinstance(program, Program):
        raise PassError(f"run_passes expects a tkx Program, got {type(program).__name__}: {_program_hint(program)}")
    if isinstance(passes, str):
        passes = (passes,)
    chosen = default_pipeline() if passes is None else tuple(passes)
    fns: list[tuple[str, PassFn]] = []
    for p in chosen:
        if isinstance(p, str):
            fns.append((p, get_pass(p)))
        elif callable(p):
            fns.append((getattr(p, "__name__", "pass"), p))
        else:
            raise PassError(f"passes must be names or functions, got {type(p).__name__}")
    steps = []
    current = program
    for name, fn in fns:
        start = time.perf_counter()
        try:
            with user_code(f"pass {name!r}"):
                after = fn(current)
        except TkxError:
            raise
        except Exception as e:
            raise PassError(f"pass {name!r} raised {type(e).__name__}: {e}") from e
        ms = (time.perf_counter() - start) * 1e3
        _check_contract(name, current, after)
        steps.append(PassStep(name, current, after, ms))
        current = after
    return PassTrace(program, tuple(steps))
