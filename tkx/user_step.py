"""Your own step from the command line: ``tkx report FILE.py:STEP --inputs FILE.py:MAKE_INPUTS``.

:func:`load_function` imports a function from a Python file by path (the file runs as a module
of its own, with its folder on ``sys.path`` so its own imports work); :func:`parse_options`
turns ``k=v`` strings into :class:`tkx.Options` fields; :func:`report_command` puts them
together and writes the report. Every mistake is one sentence naming what was given and what
to do instead (:class:`UserStepError`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import TkxError

__all__ = ["UserStepError", "load_function", "load_state", "parse_options", "report_command"]


class UserStepError(TkxError):
    """A ``FILE.py:FUNCTION`` that cannot be loaded, or an ``--option`` that is not ``k=v``."""


def _split(spec: str, what: str) -> tuple[Path, str]:
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise UserStepError(f"{what} {spec!r} is not FILE.py:FUNCTION (for example model.py:train_step)")
    return Path(path), name


def load_function(spec: str, what: str = "the step") -> Callable[..., Any]:
    """The function ``NAME`` of ``FILE.py`` for ``spec = "FILE.py:NAME"``.

    Raises :class:`UserStepError` when the file does not exist, is not Python, fails to import
    (its error is quoted) or has no callable ``NAME`` (its functions are listed)."""
    path, name = _split(spec, what)
    if not path.is_file():
        raise UserStepError(f"{what}: no file {str(path)!r} (from {spec!r}); give the path of a .py file")
    if path.suffix != ".py":
        raise UserStepError(f"{what}: {str(path)!r} is not a .py file")
    resolved = path.resolve()
    module_name = "tkx_user_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec_obj = importlib.util.spec_from_file_location(module_name, resolved)
        assert spec_obj is not None and spec_obj.loader is not None
        module = importlib.util.module_from_spec(spec_obj)
        folder = str(resolved.parent)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            sys.modules[module_name] = module
            spec_obj.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise UserStepError(f"{what}: importing {str(path)!r} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            if added:
                sys.path.remove(folder)
    fn = getattr(module, name, None)
    if not callable(fn):
        functions = sorted(k for k, v in vars(module).items()
                           if callable(v) and getattr(v, "__module__", None) == module_name and not k.startswith("_"))
        has = f"its functions: {', '.join(functions)}" if functions else "it defines no function"
        raise UserStepError(f"{what}: {str(path)!r} has no function {name!r} ({has})")
    return fn


def load_state(spec: str) -> Any:
    """``FILE.py:NAME`` -> the object bound to NAME in FILE: the modules and optimizers of a stateful
    step (a tuple such as ``(model, opt)``), or a function returning them (then called). The file is
    imported once, shared with the step's ``FILE.py:STEP``. Raises :class:`UserStepError`."""
    import torch

    path, name = _split(spec, "--state")
    try:
        obj = load_function(spec, "--state")  # imports the file (once); NAME may be a plain object
    except UserStepError:
        module = sys.modules.get("tkx_user_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12])
        obj = getattr(module, name, None) if module is not None else None
        if obj is None:
            raise
    if callable(obj) and not isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
        obj = obj()
    return obj


def _value(field: str, text: str) -> Any:
    if field in ("passes", "rules"):
        if text in ("None", ""):
            return None
        return tuple(x.strip() for x in text.split(",") if x.strip())
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a plain word: mode=grid, backend=nvrtc


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``["mode=grid", "tile_m=32", "passes=dce,cse"]`` -> ``{"mode": "grid", "tile_m": 32,
    "passes": ("dce", "cse")}``. Values are Python literals (``32``, ``True``, ``None``) or
    plain words; ``passes`` and ``rules`` take comma-separated names. The values are checked
    by :class:`tkx.Options` (:class:`tkx.OptionsError` names the field and what is allowed);
    a pair without ``=`` raises :class:`UserStepError`."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise UserStepError(f"--option {pair!r} is not K=V (for example --option mode=grid)")
        out[key.strip()] = _value(key.strip(), text.strip())
    return out


def report_command(step: str, inputs: str, output: str | None, options: Sequence[str], *,
                   loss: int | None = None, error: Callable[[str], Any] | None = None,
                   trace: str | None = None, state: str | None = None) -> int:
    """What ``tkx report`` does: load the step and its inputs, write the report, print its path;
    ``trace``: also write the task VM's predicted timeline there as a Chrome / Perfetto trace
    (:meth:`tkx.dataflow.timeline.Timeline.to_chrome_trace`); ``state``: ``FILE.py:NAME`` of the
    step's modules and optimizers (a tuple, or a function returning it).

    Returns 0; a mistake in the arguments goes to ``error`` (argparse's, which exits with code 2)
    or raises; a step tkx cannot compile raises its :class:`tkx.TkxError` (the message names the
    op and the source line)."""
    from .explore import explore
    from .options import Options
    from .render.report import write_report

    try:
        step_fn = load_function(step, "the step")
        make_inputs = load_function(inputs, "--inputs")
        opts = Options.make(**parse_options(options))
    except TkxError as exc:
        if error is None:
            raise
        error(str(exc))
        return 2
    state_objs = None
    if state is not None:
        try:
            state_objs = load_state(state)
        except TkxError as exc:
            if error is None:
                raise
            error(str(exc))
            return 2
    try:
        example = make_inputs()
    except Exception as exc:
        msg = f"--inputs: {inputs} raised {type(exc).__name__}: {exc}"
        if error is None:
            raise UserStepError(msg) from exc
        error(msg)
        return 2
    if not isinstance(example, (tuple, list)):
        example = (example,)
    path_part, _, name = step.rpartition(":")
    out = output or f"{Path(path_part).stem}-{name}.html"
    from rich.console import Console

    from .render.cuda import compile_table

    exp = explore(step_fn, example, name=name, loss=loss, options=opts, state=state_objs)
    written = write_report(exp, out)
    Console(soft_wrap=True).print(compile_table(exp.cuda))
    print(f"tkx report of {name} ({Path(path_part).name}): {os.fspath(written)}")
    if trace:
        print(f"tkx report: the predicted timeline (task VM) as a trace for Perfetto: "
              f"{exp.timeline.to_chrome_trace(trace)}")
    return 0
