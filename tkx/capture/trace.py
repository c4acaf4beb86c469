"""Tracing a training step into an FX graph on fake tensors.

``make_fx(functionalize(step), tracing_mode="fake")`` with the curated decomposition table.
While tracing, a small ``TorchFunctionMode`` tags every FX node with the user's source line
and whether it was made while autograd ran the backward pass (inside
``torch.autograd.grad``, which ``torch.func.grad`` calls). The tags travel in
``node.meta["custom"]`` through ``torch.fx.traceback.preserve_node_meta``.
"""

from __future__ import annotations

import contextlib
import linecache
import logging
import os
import sys
import sysconfig
import traceback
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch.overrides import TorchFunctionMode

from ..errors import SourceLine
from .attention import HandWrittenAttention
from .decompositions import FUNCTION_OVERRIDES
from .modules import ModuleStack

_SKIP_DIRS = (os.path.dirname(os.path.realpath(torch.__file__)) + os.sep,) + tuple(
    os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")
)
TAG = "tkx"


def is_user_file(filename: str) -> bool:
    """False for frames inside torch, tkx itself or the Python standard library."""
    if filename.startswith("<"):
        # Generated code (torch's "<string>" lambdas, "<frozen ...>") is never the user's,
        # but classic IPython cells are.
        return filename.startswith("<ipython-input")
    real = os.path.realpath(filename) if not filename.startswith("<") else filename
    tkx_dir = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
    if real.startswith(tkx_dir) and os.sep + "examples" + os.sep not in real[len(tkx_dir) - 1:]:
        return False
    return not any(real.startswith(d) for d in _SKIP_DIRS)


def _source_of(filename: str, lineno: int, function: str) -> SourceLine:
    code = linecache.getline(filename, lineno).strip()
    return SourceLine(filename, lineno, code, function)


#: Frames that replay a traced graph (``torch.fx.Interpreter.run``): below them the nodes' own tags
#: name the user's line, and the frames above (the caller of ``tkx.capture``) are not the step.
_REPLAY_CODES = {torch.fx.Interpreter.run.__code__}
#: The torch functions that run autograd's backward pass.
BACKWARD_FUNCTIONS = (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward)


def user_frame(start: FrameType | None) -> SourceLine | None:
    """The innermost user frame at or above ``start`` (``None`` inside a graph replay)."""
    found = _frame_or_replay(start)
    return None if found is REPLAY else found


#: What :func:`_frame_or_replay` returns inside a graph replay.
REPLAY = object()


def _frame_or_replay(start: FrameType | None) -> Any:
    """The innermost user frame at or above ``start``, :data:`REPLAY` when a graph replay comes first."""
    f = start
    while f is not None:
        if f.f_code in _REPLAY_CODES:
            return REPLAY
        if is_user_file(f.f_code.co_filename):
            return _source_of(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def user_frame_of_traceback(tb: TracebackType | None) -> SourceLine | None:
    """The innermost user frame in an exception's traceback."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        if is_user_file(frame.f_code.co_filename):
            found = _source_of(frame.f_code.co_filename, lineno, frame.f_code.co_name)
    return found


class SourceTagMode(TorchFunctionMode):
    """Tag FX nodes with the user's line and the autograd backward flag.

    Backward ops get the line of the forward op they differentiate: every forward result's
    ``grad_fn`` is remembered with its line, and while ``torch.autograd.grad`` runs, a pre-hook
    on each of those autograd nodes switches the tag to that line before the node's backward
    formula is traced (ops autograd adds on its own keep the ``grad(...)`` line).

    Forward tags also carry the innermost ``nn.Module`` being called (``module``: path and class, from
    :class:`~tkx.capture.modules.ModuleStack`) and the number of the torch call (``call``); a backward
    node's tag names the call it differentiates (``differentiates_call``) and that call's module.
    """

    def __init__(self) -> None:
        super().__init__()
        self.grad_fn_sources: dict[Any, tuple[SourceLine | None, str, Any, int]] = {}
        self.modules = ModuleStack()
        self.calls = 0
        self.attention = HandWrittenAttention()  # hand-written attention -> the tkx::attention composite

    def _remember(self, result: Any, tag: dict[str, Any]) -> None:
        for t in result if isinstance(result, (tuple, list)) else (result,):
            fn = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
            if fn is not None and fn not in self.grad_fn_sources:
                self.grad_fn_sources[fn] = (tag["source"], tag["torch_fn"], tag.get("module"), tag["call"])

    def _hooks(self) -> list[Any]:
        handles = []
        for fn, (src, name, module, call) in list(self.grad_fn_sources.items()):
            def hook(grad_outputs: Any, src: SourceLine | None = src, name: str = name, module: Any = module,
                     call: int = call) -> None:
                custom = dict(fx_traceback.current_meta.get("custom") or {})
                tag = dict(custom.get(TAG, {}))
                tag.update(module=module, differentiates_call=call)
                if src is not None:
                    tag.update(source=src, backward=True, differentiates=name)
                custom[TAG] = tag
                fx_traceback.current_meta["custom"] = custom
            try:
                handles.append(fn.register_prehook(hook))
            except (AttributeError, RuntimeError):  # a node type without hooks keeps the grad(...) line
                pass
        return handles

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        previous = fx_traceback.current_meta.get("custom")
        prev_tag = (previous or {}).get(TAG, {})
        in_backward = prev_tag.get("backward", False) or func in BACKWARD_FUNCTIONS
        src = _frame_or_replay(sys._getframe(1))
        name = getattr(func, "__name__", str(func))
        if src is REPLAY:  # a node of a traced graph run again: its own tag (line, module, call) holds
            tag = {**prev_tag, "torch_fn": name}
        else:
            tag = {"backward": in_backward, "source": src if src is not None else prev_tag.get("source"),
                   "torch_fn": name}
            if not in_backward:
                self.calls += 1
                tag.update(module=self.modules.current, call=self.calls)
        custom = dict(previous or {})
        custom[TAG] = tag
        fx_traceback.current_meta["custom"] = custom
        handles = self._hooks() if func in BACKWARD_FUNCTIONS else []
        try:
            replaced = None if in_backward else self.attention.before(func, args, kwargs)
            result = replaced if replaced is not None else FUNCTION_OVERRIDES.get(func, func)(*args, **kwargs)
            if not in_backward:
                self.attention.after(func, args, kwargs, result)
                self._remember(result, tag)
            return result
        finally:
            for h in handles:
                h.remove()
            if previous is None:
                fx_traceback.current_meta.pop("custom", None)
            else:
                fx_traceback.current_meta["custom"] = previous


def node_tag(node: torch.fx.Node) -> dict[str, Any]:
    """The tkx tag of an FX node: ``{"backward": bool, "source": SourceLine | None, "module": (path, class) | None,
    ...}`` (see :class:`SourceTagMode`)."""
    custom = node.meta.get("custom") or {}
    return custom.get(TAG, {})


@contextlib.contextmanager
def quiet_fake_tensor_log() -> Any:
    """Hold back FakeTensor's ERROR log of a failed meta kernel (a traceback on stderr) while tracing: the
    exception itself becomes tkx's one error naming the user's line."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


class TorchStateGuard:
    """Leave torch's thread-local tracing state as it was found, whatever happens inside.

    A transform that fails half-way (e.g. a PyTorch INTERNAL ASSERT inside
    ``vmap(hessian(f))``) can leave functorch's dynamic layer stack, the dispatch keys that
    functorch excludes, a torch-function / torch-dispatch mode (fake tensors, the proxy
    tracer) or grad mode behind; every later capture in the process then fails. On exit this
    guard undoes all of them to the state seen on entry.
    """

    def __enter__(self) -> TorchStateGuard:
        C = torch._C
        self._keys_text = self._dispatch_keys()
        self._keys = C._PreserveDispatchKeyGuard()  # restores both TLS key sets on __exit__
        self._keys.__enter__()
        self._depth = C._functorch.get_dynamic_layer_stack_depth()
        self._dispatch_len = C._len_torch_dispatch_stack()
        self._function_len = C._len_torch_function_stack()
        self._grad = torch.is_grad_enabled()
        self._fwd_grad = C._functorch.get_fwd_grad_enabled() if hasattr(C._functorch, "get_fwd_grad_enabled") else None
        return self

    def restored(self, *, final: bool = False) -> list[str]:
        """Restore the state; the names of what had to be undone (empty when nothing leaked).
        Call it again after freeing the frames of a failed trace (see :func:`tkx.capture`);
        ``final=True`` (what ``__exit__`` does) ends the guard."""
        C = torch._C
        undone = []
        if C._functorch.get_dynamic_layer_stack_depth() > self._depth:
            undone.append("functorch layers")
            C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(self._depth)
        while C._len_torch_dispatch_stack() > self._dispatch_len:
            undone.append("dispatch mode")
            C._pop_torch_dispatch_stack()
        while C._len_torch_function_stack() > self._function_len:
            undone.append("function mode")
            C._pop_torch_function_stack()
        if self._dispatch_keys() != self._keys_text:
            undone.append("dispatch keys")
        self._keys.__exit__(None, None, None)
        if not final:
            self._keys = C._PreserveDispatchKeyGuard()
            self._keys.__enter__()
        if torch.is_grad_enabled() != self._grad:
            undone.append("grad mode")
            torch.set_grad_enabled(self._grad)
        if self._fwd_grad is not None and C._functorch.get_fwd_grad_enabled() != self._fwd_grad:
            undone.append("forward grad mode")
            C._functorch.set_fwd_grad_enabled(self._fwd_grad)
        return undone

    @staticmethod
    def _dispatch_keys() -> tuple[str, str]:
        return (str(torch._C._dispatch_tls_local_include_set()), str(torch._C._dispatch_tls_local_exclude_set()))

    def __exit__(self, *exc: Any) -> None:
        self.restored(final=True)
