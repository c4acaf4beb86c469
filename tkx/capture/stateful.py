"""The stateful step: ``loss.backward(); opt.step(); opt.zero_grad()`` over an ``nn.Module``.

``tkx.capture(step, (x, y), state=(model, opt))`` lifts every tensor the step reads or writes
through ``model`` and ``opt`` into inputs of a functional step, the way ``torch.compile``'s
AOTAutograd does:

* the module's parameters and buffers (BatchNorm's running statistics, its batch counter),
  named by ``state_dict`` (``fc1.weight``, ``bn.running_mean``);
* the gradients the step reads or leaves behind (``fc1.weight.grad``);
* the optimizer's state (``opt.state[fc1.weight].exp_avg``, the step counts) and each parameter
  group's learning rate as a 0-d tensor (``opt.param_groups[0].lr``), so that an LR scheduler
  stepping between calls changes it without a new capture.

The step is traced twice. First with autograd (``make_fx`` on fake tensors; the lifted
parameters require grad, ``loss.backward()`` runs the autograd engine, whose ops are recorded,
and the optimizer runs as under ``torch.compile``: ``capturable`` math, tensor learning rate).
That graph updates its inputs in place; the second trace, the ordinary capture, functionalizes
it (in-place updates become ``copy_`` into the inputs, as for any functional step).

State that the optimizer creates lazily at its first step (Adam's ``exp_avg``, SGD's
momentum buffer) is found by running the step once on fake tensors, then created before every
call exactly as ``torch.optim`` creates it (its own ``_init_group``; zeros for SGD's buffer
without dampening), so that the first compiled call is eager's first step. The compiled step is
specialised on what Python reads: the modules' ``training`` flags and the hyperparameters
other than the learning rate (:meth:`StatefulStep.structure`); callers re-capture when they
change.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import random as _random
from ..errors import UnsupportedError
from .param_groups import SCHEDULER_KEYS, changed_hyperparameter

__all__ = ["StatefulStep", "Slot", "STATE_HINT"]

STATE_HINT = ("pass the module and the optimizer the step uses: tkx.capture(step, (x, y), state=(model, opt)); "
              "or write a functional step (torch.func.functional_call over the parameters, "
              "torch.func.grad_and_value for the gradients) that takes the state as arguments")


@dataclass(eq=False)
class Slot:
    """One lifted tensor: its name, its kind (``parameter``, ``buffer``, ``gradient``, ``optimizer
    state``, ``learning rate``) and how to find the live tensor in the user's objects."""

    name: str
    kind: str
    param: torch.Tensor | None = field(default=None, repr=False)  # the parameter (gradient, state)
    owner: Any = field(default=None, repr=False)  # module (buffer) or optimizer (state, learning rate)
    key: Any = None  # buffer attribute, state key or parameter group index

    def get(self) -> torch.Tensor | None:
        """The live tensor (``None``: not created yet); a learning rate as the group holds it."""
        if self.kind == "parameter":
            return self.param
        if self.kind == "buffer":
            return self.owner.get_buffer(self.key)
        if self.kind == "gradient":
            return self.param.grad
        if self.kind == "optimizer state":
            value = self.owner.state.get(self.param, {}).get(self.key)
            return value if isinstance(value, torch.Tensor) else None
        return self.owner.param_groups[self.key]["lr"]


def _state_objects(state: Any) -> tuple[list[tuple[str, torch.nn.Module]], list[tuple[str, torch.optim.Optimizer]]]:
    """(name, module) and (name, optimizer) pairs of ``state``: one object, a sequence or a dict."""
    if isinstance(state, dict):
        items = list(state.items())
    else:
        objs = list(state) if isinstance(state, (tuple, list)) else [state]
        items = [(None, o) for o in objs]
    seen: set[int] = set()  # the same object named twice (state=(model, model, opt)) is lifted once
    items = [(k, o) for k, o in items if not (id(o) in seen or seen.add(id(o)))]
    modules = [(k, o) for k, o in items if isinstance(o, torch.nn.Module)]
    # a submodule of another listed module is lifted (and named) through that one
    inside = {id(sub) for _, m in modules for sub in m.modules() if sub is not m}
    modules = [(k, m) for k, m in modules if id(m) not in inside]
    optims = [(k, o) for k, o in items if isinstance(o, torch.optim.Optimizer)]
    for k, o in items:
        if not isinstance(o, (torch.nn.Module, torch.optim.Optimizer)):
            what = type(o).__name__
            hint = ("leave LR schedulers out of state=: they change opt.param_groups[i]['lr'] between calls, "
                    "which the compiled step reads as a tensor" if "LR" in what or "Scheduler" in what else
                    "state= takes nn.Module and torch.optim.Optimizer objects; pass tensors as arguments of the step")
            raise UnsupportedError("state-not-liftable", f"state= holds a {what}" + (f" ({k!r})" if k else ""),
                                   hint=hint)
    modules = [(k or ("" if len(modules) == 1 else f"model{i}"), m) for i, (k, m) in enumerate(modules)]
    optims = [(k or ("opt" if len(optims) == 1 else f"opt{i}"), o) for i, (k, o) in enumerate(optims)]
    return modules, optims


def _freeze(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` is True: ``torch.optim`` then keeps step counts and the
    learning rate as tensors (no ``.item()``) and allows ``capturable`` math on any device."""
    import torch.compiler as tc
    if hasattr(tc, "_is_compiling_flag"):
        old = tc._is_compiling_flag
        tc._is_compiling_flag = True
        try:
            yield
        finally:
            tc._is_compiling_flag = old
        return
    old_fn = tc.is_compiling  # a torch without the flag: the function itself
    tc.is_compiling = lambda: True
    try:
        yield
    finally:
        tc.is_compiling = old_fn


#: In-place ops whose scalar keyword (``alpha=``, ``value=``) torch.optim's single-tensor paths pass the
#: learning rate in: with a tensor there, the op would read it as a Python number.
_SCALED = {torch.Tensor.add_: "alpha", torch.Tensor.sub_: "alpha", torch.Tensor.addcdiv_: "value",
           torch.Tensor.addcmul_: "value", torch._foreach_add_: "alpha", torch._foreach_sub_: "alpha"}


class TensorScalars(torch.overrides.TorchFunctionMode):
    """Rewrite ``p.add_(g, alpha=-lr)`` and ``p.addcdiv_(a, b, value=-lr)`` with a 0-d tensor ``lr``
    as ``p.add_(g * -lr)`` and ``p.add_(a / b * -lr)``: the learning rate stays a tensor input
    (as a scalar keyword it would be read as a number, a data-dependent value)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        key = _SCALED.get(func)
        scale = kwargs.get(key) if key else None
        if not isinstance(scale, torch.Tensor):
            return func(*args, **kwargs)
        del kwargs[key]
        if func is torch._foreach_add_ or func is torch._foreach_sub_:
            self_, other = args[:2]
            return func(self_, torch._foreach_mul(other, scale), **kwargs)
        self_, rest = args[0], args[1:]
        if func is torch.Tensor.addcdiv_:
            return self_.add_(rest[0] / rest[1] * scale)
        if func is torch.Tensor.addcmul_:
            return self_.add_(rest[0] * rest[1] * scale)
        return func(self_, rest[0] * scale, **kwargs)


class StatefulStep:
    """A step over modules and optimizers, seen as a functional step over lifted tensors.

    ``slots`` lists the lifted tensors in input order; ``functional(example_inputs)`` gives the
    function and example arguments tkx's ordinary capture traces; :meth:`prepare` / :meth:`finish`
    bind the live tensors around each compiled call. Raises :class:`tkx.UnsupportedError`
    (``state-not-liftable``) for objects it cannot lift, naming them.
    """

    def __init__(self, step_fn: Callable[..., Any], state: Any) -> None:
        self.step_fn = step_fn
        self.modules, self.optimizers = _state_objects(state)
        self.param_names: dict[int, str] = {}
        for prefix, m in self.modules:
            for n, p in m.named_parameters():
                self.param_names.setdefault(id(p), f"{prefix}.{n}" if prefix else n)
        for oname, opt in self.optimizers:
            if any(g.get("fused") for g in opt.param_groups):
                raise UnsupportedError("state-not-liftable", f"{oname} is a fused {type(opt).__name__} (fused=True)",
                                       hint="use foreach=True or the default: a fused optimizer runs one "
                                            "opaque kernel per step that tkx cannot trace")
            if any(g.get("differentiable") for g in opt.param_groups):
                raise UnsupportedError("state-not-liftable", f"{oname} has differentiable=True",
                                       hint="construct the optimizer without differentiable=True")
            for gi, g in enumerate(opt.param_groups):
                for k, p in enumerate(g["params"]):
                    self.param_names.setdefault(id(p), f"{oname}.param_groups[{gi}].params[{k}]")
        self.params: dict[int, torch.Tensor] = {}
        for _prefix, m in self.modules:
            for p in m.parameters():
                self.params[id(p)] = p
        for _, opt in self.optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    self.params[id(p)] = p
        self.slots: list[Slot] = []
        self.exit_none: set[int] = set()  # parameters whose gradient is None after the step
        self.device: torch.device | None = None
        self.mirrors: dict[str, torch.Tensor] = {}
        self.captured_structure: Any = None
        self.draws = False  # whether the traced step draws random numbers (a trailing Philox state input)
        self.caller: Any = None  # the line that captured the step (named by refusals found after tracing)

    # -- naming and structure ----------------------------------------------------------------------
    def _state_name(self, oname: str, p: torch.Tensor, key: str) -> str:
        return f"{oname}.state[{self.param_names[id(p)]}].{key}"

    def structure(self) -> tuple:
        """What the traced step specialised on: every module's ``training`` flag and each parameter
        group's hyperparameters other than the learning rate (a change needs a new capture)."""
        training = tuple(sub.training for _, m in self.modules for sub in m.modules())
        skip = SCHEDULER_KEYS | {"params", "lr"}
        hypers = tuple(tuple(sorted((k, _freeze(v)) for k, v in g.items() if k not in skip))
                       for _, opt in self.optimizers for g in opt.param_groups)
        return training, hypers

    def unlifted(self) -> list[str]:
        """Gradients and optimizer state present now that the captured step does not lift (a new
        capture lifts them)."""
        lifted = {s.name for s in self.slots}
        out = []
        for pid, p in self.params.items():
            if p.grad is not None and f"{self.param_names[pid]}.grad" not in lifted:
                out.append(f"{self.param_names[pid]}.grad")
        for oname, opt in self.optimizers:
            for p, st in opt.state.items():
                for key, v in st.items():
                    if isinstance(v, torch.Tensor) and self._state_name(oname, p, key) not in lifted:
                        out.append(self._state_name(oname, p, key))
        return out

    # -- binding -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def bind(self, values: dict[str, torch.Tensor], *, trace: bool) -> Iterator[dict[int, torch.Tensor]]:
        """Run the user's objects on ``values`` (slot name -> tensor) instead of their own tensors.

        The lifted parameters require grad (they are leaves of autograd), the modules are
        reparametrized, the optimizers see the lifted parameters, state and learning rates.
        ``trace=True`` also runs the optimizers as under ``torch.compile`` (tensor learning rate,
        ``capturable`` math); else the learning rate is a Python float, as the user's code set it.
        Yields ``id(real parameter) -> its lifted tensor``. Everything is restored on exit.
        """
        from torch.nn.utils.stateless import _reparametrize_module

        live: dict[int, torch.Tensor] = {}
        by_kind = defaultdict(list)
        for s in self.slots:
            by_kind[s.kind].append(s)
        for s in by_kind["parameter"]:
            t = values[s.name]
            if s.param.requires_grad and not t.requires_grad:
                t.requires_grad_(True)
            live[id(s.param)] = t
        for pid, p in self.params.items():
            if pid not in live:
                live[pid] = p
        for s in by_kind["gradient"]:
            live[id(s.param)].grad = values[s.name]
        saved: list[tuple[torch.optim.Optimizer, Any, list[dict]]] = []
        with contextlib.ExitStack() as stack:
            for _prefix, m in self.modules:
                local = {}
                for n, p in m.named_parameters():
                    local[n] = live[id(p)]
                for s in by_kind["buffer"]:
                    if s.owner is m:
                        local[s.key] = values[s.name]
                stack.enter_context(_reparametrize_module(m, local, tie_weights=True))
            try:
                for oname, opt in self.optimizers:
                    saved.append((opt, opt.state, [dict(g) for g in opt.param_groups]))
                    new_state: dict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
                    for p, st in opt.state.items():  # non-tensor entries stay as they are
                        new_state[live[id(p)]] = {k: v for k, v in st.items() if not isinstance(v, torch.Tensor)}
                    for s in by_kind["optimizer state"]:
                        if s.owner is opt:
                            new_state[live[id(s.param)]][s.key] = values[s.name]
                    for gi, g in enumerate(opt.param_groups):
                        g["params"] = [live[id(p)] for p in g["params"]]
                        lr = values.get(f"{oname}.param_groups[{gi}].lr")
                        if lr is not None:
                            g["lr"] = lr if trace else float(lr)
                        if trace and "capturable" in g:
                            g["capturable"] = True
                    opt.state = new_state
                if trace:
                    stack.enter_context(_compiling())
                    stack.enter_context(TensorScalars())
                yield live
            finally:
                for opt, st, groups in saved:
                    opt.state = st
                    for g, old in zip(opt.param_groups, groups):
                        g.clear()
                        g.update(old)

    def current(self, live: dict[int, torch.Tensor]) -> dict[str, torch.Tensor | None]:
        """Inside :meth:`bind`: each slot's tensor now (the step may have replaced it)."""
        out: dict[str, torch.Tensor | None] = {}
        for s in self.slots:
            if s.kind == "parameter":
                out[s.name] = live[id(s.param)]
            elif s.kind == "buffer":
                out[s.name] = s.owner.get_buffer(s.key)
            elif s.kind == "gradient":
                out[s.name] = live[id(s.param)].grad
            elif s.kind == "optimizer state":
                v = s.owner.state.get(live[id(s.param)], {}).get(s.key)
                out[s.name] = v if isinstance(v, torch.Tensor) else None
        return out

    def run_bound(self, values: dict[str, torch.Tensor], args: Sequence[Any], *, trace: bool) -> Any:
        """The user's step on ``values``: every lifted tensor the step replaced (a new gradient,
        a new momentum buffer) is copied into ``values`` (``None`` gradients stay as they are)."""
        with self.bind(values, trace=trace) as live:
            out = self.step_fn(*args)
            now = self.current(live)
        with torch.no_grad():
            for s in self.slots:
                cur, mine = now.get(s.name), values[s.name]
                if cur is not None and cur is not mine:
                    mine.copy_(cur.detach())
        for t in live.values():  # the lifted leaves keep no gradient of their own
            if isinstance(t, torch.Tensor) and t.grad is not None and not isinstance(t, torch.nn.Parameter):
                t.grad = None
        return out

    # -- lifting -----------------------------------------------------------------------------------
    def _base_slots(self) -> list[Slot]:
        """Parameters, buffers, gradients present now, optimizer state present now, learning rates."""
        slots = []
        for pid, p in self.params.items():
            slots.append(Slot(self.param_names[pid], "parameter", p))
        for prefix, m in self.modules:
            for n, b in m.named_buffers():
                slots.append(Slot(f"{prefix}.{n}" if prefix else n, "buffer", b, m, n))
        for pid, p in self.params.items():
            if p.grad is not None:
                slots.append(Slot(f"{self.param_names[pid]}.grad", "gradient", p))
        for oname, opt in self.optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    for key, v in opt.state.get(p, {}).items():
                        if isinstance(v, torch.Tensor):
                            slots.append(Slot(self._state_name(oname, p, key), "optimizer state", p, opt, key))
                        elif isinstance(v, (int, float)) and not isinstance(v, bool):
                            raise UnsupportedError(
                                "state-not-liftable",
                                f"{self._state_name(oname, p, key)} is a Python {type(v).__name__}, not a tensor",
                                hint="tkx lifts optimizer state held in tensors (torch.optim keeps its step counts "
                                     "as tensors); keep counters in tensors")
            for gi in range(len(opt.param_groups)):
                slots.append(Slot(f"{oname}.param_groups[{gi}].lr", "learning rate", None, opt, gi))
        return slots

    def example(self, s: Slot) -> torch.Tensor:
        """The tensor standing for slot ``s`` at capture time, on the step's device (never written)."""
        return self._example(s, self.device)

    def _example(self, s: Slot, device: torch.device) -> torch.Tensor:
        """The tensor that stands for slot ``s`` at capture time (never written)."""
        live = s.get()
        if s.kind == "learning rate":
            return torch.tensor(float(live), dtype=torch.float32, device=device)
        if live is None and s.kind == "gradient":
            return torch.zeros_like(s.param)
        if live is None:  # made as torch.optim makes it (Adam's step count on the CPU), then moved
            live = self._initial_state(s.owner, real=False)[s.param][s.key]
        return live if live.device == device else live.to(device)

    def lift(self, example_inputs: Sequence[Any], caller: Any = None) -> None:
        """Decide the slots: everything present now, plus the gradients and optimizer state the step
        creates (found by running it once on fake tensors)."""
        flat = [t for t in tree_flatten(tuple(example_inputs))[0] if isinstance(t, torch.Tensor)]
        params = list(self.params.values())
        self.device = (flat[0].device if flat else params[0].device if params else torch.device("cpu"))
        self.slots = self._base_slots()
        self.caller = caller
        created, exit_none = self._discover(example_inputs, caller)
        names = {s.name for s in self.slots}
        for pid, p in self.params.items():
            name = f"{self.param_names[pid]}.grad"
            if pid not in exit_none and name not in names and pid in created["grads"]:
                self.slots.append(Slot(name, "gradient", p))
        for oname, opt in self.optimizers:
            for p, key in created[id(opt)]:
                name = self._state_name(oname, p, key)
                if name not in names:
                    self.slots.append(Slot(name, "optimizer state", p, opt, key))
        order = ("parameter", "buffer", "gradient", "optimizer state", "learning rate")
        self.slots.sort(key=lambda s: order.index(s.kind))
        self.exit_none = exit_none
        self.captured_structure = self.structure()

    def _discover(self, example_inputs: Sequence[Any], caller: Any) -> tuple[dict, set[int]]:
        """Run the step once on fake tensors: which gradients exist after it, and which optimizer
        state it creates."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        from . import _tracing_error
        from .trace import TorchStateGuard, quiet_fake_tensor_log

        mode = FakeTensorMode(allow_non_fake_inputs=False)
        values = {s.name: mode.from_tensor(self._example(s, self.device)) for s in self.slots}
        args = tuple(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                     for t in tree_flatten(tuple(example_inputs))[0])
        args = tree_unflatten(list(args), tree_flatten(tuple(example_inputs))[1])
        created: dict[Any, Any] = {id(opt): [] for _, opt in self.optimizers}
        created["grads"] = set()
        exit_none: set[int] = set()
        guard = TorchStateGuard().__enter__()
        watched = _watch_groups(self.optimizers)
        try:
            with quiet_fake_tensor_log(), mode, self.bind(values, trace=True) as live:
                before = [[_group_values(g) for g in opt.param_groups] for _, opt in self.optimizers]
                for g in watched:
                    g.armed = True
                with _LrWrites(watched), _refuse_unlisted_optimizers(self.optimizers):
                    self.step_fn(*args)
                for g in watched:
                    g.armed = False
                self._refuse_group_changes(before)
                real_of = {id(t): self.params[pid] for pid, t in live.items()}
                for pid, t in live.items():
                    if t.grad is None:
                        exit_none.add(pid)
                    else:
                        created["grads"].add(pid)
                for _, opt in self.optimizers:
                    for t, st in opt.state.items():
                        p = real_of[id(t)]
                        for key, v in st.items():
                            if isinstance(v, torch.Tensor):
                                created[id(opt)].append((p, key))
        except BaseException as e:
            _unwatch_groups(self.optimizers)
            error = _tracing_error(e, self.step_fn, example_inputs, caller)
            guard.__exit__(None, None, None)
            if error is None:
                raise
            raise error from None
        _unwatch_groups(self.optimizers)
        guard.__exit__(None, None, None)
        return created, exit_none

    def _refuse_group_changes(self, before: list[list[dict[str, Any]]]) -> None:
        """Raise when the step itself changed a parameter group (an LR scheduler's ``step()`` or an
        assignment such as ``g["lr"] *= 0.5`` inside the step): the compiled step reads the groups
        before each call and would silently drop the change."""
        for (oname, opt), groups in zip(self.optimizers, before):
            if len(opt.param_groups) != len(groups):
                raise UnsupportedError("state-not-liftable", f"the step adds a parameter group to {oname}",
                                       hint="call add_param_group outside the step, then capture it again")
            for gi, (g, old) in enumerate(zip(opt.param_groups, groups)):
                now = _group_values(g)
                for key in sorted(set(old) | set(now), key=lambda k: (k != "lr", str(k))):
                    if old.get(key, _MISSING) == now.get(key, _MISSING):
                        continue
                    where = f"{oname}.param_groups[{gi}][{key!r}]"
                    if key == "lr":
                        hint = ("step the LR scheduler (or set the learning rate) between calls, outside the "
                                "step: every call reads opt.param_groups[i]['lr'] as a tensor input, so no new "
                                "capture is needed")
                    else:
                        hint = ("change it between calls, outside the step: a changed hyperparameter captures "
                                "the step again")
                    raise UnsupportedError(
                        "state-not-liftable",
                        f"the step changes {where} (an LR scheduler's step() or an assignment inside the "
                        f"step), which the compiled step would not carry over to the next call",
                        source=getattr(g, "writes", {}).get(key), hint=hint)

    def _initial_state(self, opt: torch.optim.Optimizer, *, real: bool) -> dict:
        """The optimizer state with everything the step creates lazily created as ``torch.optim``
        creates it at its first step. ``real=False`` leaves ``opt`` untouched (returns new state)."""
        need: dict[int, list[str]] = defaultdict(list)
        for s in self.slots:
            if s.kind == "optimizer state" and s.owner is opt and s.get() is None:
                need[id(s.param)].append(s.key)
        saved_state = opt.state
        state = saved_state if real else defaultdict(dict, {p: dict(st) for p, st in saved_state.items()})
        if not need:
            return state
        saved_grads = {id(p): p.grad for g in opt.param_groups for p in g["params"]}
        opt.state = state
        try:
            with torch.no_grad():
                for g in opt.param_groups:
                    for p in g["params"]:
                        p.grad = torch.zeros_like(p) if id(p) in need else None
                init = getattr(opt, "_init_group", None)
                if init is not None:
                    lists = len(inspect.signature(init).parameters) - 1
                    for g in opt.param_groups:
                        if any(id(p) in need for p in g["params"]):
                            init(g, *[[] for _ in range(lists)])
        finally:
            opt.state = saved_state
            for g in opt.param_groups:
                for p in g["params"]:
                    p.grad = saved_grads[id(p)]
        for g in opt.param_groups:
            for p in g["params"]:
                for key in need.get(id(p), ()):
                    if isinstance(state.get(p, {}).get(key), torch.Tensor):
                        continue
                    if isinstance(opt, torch.optim.SGD) and key == "momentum_buffer" and g.get("dampening", 0) == 0:
                        state[p][key] = torch.zeros_like(p)  # 0 * momentum + grad == clone(grad), eager's first step
                        continue
                    oname = next(n for n, o in self.optimizers if o is opt)
                    if isinstance(opt, torch.optim.SparseAdam):
                        hint = ("SparseAdam needs sparse gradients (nn.Embedding(sparse=True)), which tkx does not "
                                "compute: use Adam (or AdamW) with a dense embedding")
                    else:
                        hint = ("run one eager step (or create the state) before capturing; for SGD with "
                                "dampening the first step copies the gradient into the buffer")
                    raise UnsupportedError(
                        "state-not-liftable",
                        f"{self._state_name(oname, p, key)} is created at the first {type(opt).__name__}.step() "
                        f"in a way tkx cannot reproduce before the step", source=self.caller,
                        hint=hint)
        return state

    # -- the functional step -----------------------------------------------------------------------
    def functional(self, example_inputs: Sequence[Any], caller: Any = None) -> tuple[Callable[..., Any], tuple]:
        """``(fn, args)``: ``fn(*lifted, *example_inputs)`` is the step as a functional one (it runs
        the autograd-traced graph and updates the lifted tensors in place), ``args`` its example
        arguments. ``fn.__tkx_arg_names__`` names its inputs (the slots', then the step's own)."""
        from . import _arg_names
        examples = [self._example(s, self.device) for s in self.slots]
        graph, out_tree = self._trace_autograd(examples, example_inputs, caller)
        n = len(self.slots)

        def step(*args: Any) -> Any:
            user = tree_flatten(tuple(args[n:]))[0]
            rng = []
            if self.draws:  # the state of the enclosing drawing() block (capture's implicit input), else a fresh one
                state = _random.active_state()
                rng = [state if state is not None else _random.next_state(self.device)]
            outs = torch.fx.Interpreter(graph).run(*args[:n], *user, *rng)
            return tree_unflatten(list(outs), out_tree)

        step.__name__ = getattr(self.step_fn, "__name__", "step")
        step.__tkx_arg_names__ = [s.name for s in self.slots] + _arg_names(self.step_fn, len(example_inputs))
        return step, (*examples, *example_inputs)

    def _trace_autograd(self, examples: list[torch.Tensor], example_inputs: Sequence[Any],
                        caller: Any) -> tuple[torch.fx.GraphModule, Any]:
        """The step traced with autograd on fake tensors: in-place updates of the lifted inputs."""
        import traceback

        import torch.fx.traceback as fx_traceback
        from torch.fx.experimental.proxy_tensor import make_fx

        from . import _tracing_error
        from .decompositions import decomposition_table
        from .trace import SourceTagMode, TorchStateGuard, quiet_fake_tensor_log

        user_flat, user_tree = tree_flatten(tuple(example_inputs))
        names = [s.name for s in self.slots]
        n = len(names)
        box: list[Any] = []

        def lifted_step(*leaves: torch.Tensor) -> list[torch.Tensor]:
            *leaves, rng = leaves
            values = dict(zip(names, leaves[:n]))
            args = tree_unflatten(list(leaves[n:]), user_tree)
            tags = SourceTagMode()
            # random ops draw from Philox keyed by the trailing state input, as the eager step does
            # inside drawing(): tkx.random's dropout, not aten's decomposition of it
            with tags, tags.modules, _random.drawing(rng):
                out = self.run_bound(values, args, trace=True)
            flat, tree = tree_flatten(out)
            box.append(tree)
            return flat

        guard = TorchStateGuard().__enter__()
        try:
            with quiet_fake_tensor_log(), fx_traceback.preserve_node_meta():
                gm = make_fx(lifted_step, decomposition_table=decomposition_table(), tracing_mode="fake")(
                    *(t.detach() for t in examples), *(t.detach() if isinstance(t, torch.Tensor) else t
                                                      for t in user_flat), _random.philox_state(device=self.device))
        except BaseException as e:
            error = _tracing_error(e, self.step_fn, example_inputs, caller)
            traceback.clear_frames(e.__traceback__)
            guard.__exit__(None, None, None)
            if error is None:
                raise
            raise error from (e if error.kind in ("unsupported-op", "step-raised", "bad-input") else None)
        guard.__exit__(None, None, None)
        _drop_profiler_nodes(gm)
        rng = [nd for nd in gm.graph.nodes if nd.op == "placeholder"][-1]
        self.draws = bool(rng.users)
        if not self.draws:  # a step that draws no random number: no state input
            gm.graph.erase_node(rng)
            gm.recompile()
        return gm, box[-1]

    # -- around each compiled call -----------------------------------------------------------------
    def stale(self) -> str | None:
        """Why the captured step no longer fits the objects (``None``: it fits): a module switched
        between ``train()`` and ``eval()``, a hyperparameter other than the learning rate changed,
        or a gradient / optimizer state exists that the capture does not lift."""
        training, hypers = self.structure()
        if training != self.captured_structure[0]:
            return "a module switched between train() and eval()"
        if hypers != self.captured_structure[1]:
            return changed_hyperparameter(hypers, self.captured_structure[1])
        extra = self.unlifted()
        if extra:
            return f"{extra[0]} exists but was not there when the step was captured"
        return None

    def prepare(self) -> list[torch.Tensor]:
        """The lifted tensors for one compiled call, in input order: the live tensors themselves
        (the call updates them in place), after creating what the optimizer creates lazily and the
        gradients the step accumulates into (zeros: ``0 + g`` is eager's fresh gradient). Tensors on
        another device (``torch.optim``'s CPU step counts) and learning rates go through device
        copies that :meth:`finish` writes back."""
        for _, opt in self.optimizers:
            self._initial_state(opt, real=True)
        out = []
        for s in self.slots:
            live = s.get()
            if s.kind == "gradient" and live is None:
                with torch.no_grad():
                    s.param.grad = live = torch.zeros_like(s.param)
            if s.kind == "learning rate" or live.device != self.device:
                mirror = self.mirrors.get(s.name)
                if mirror is None:
                    mirror = self.mirrors[s.name] = self._example(s, self.device).clone()
                with torch.no_grad():
                    if isinstance(live, torch.Tensor):
                        mirror.copy_(live)
                    else:
                        mirror.fill_(float(live))
                out.append(mirror)
            else:
                out.append(live.detach())
        return out

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of the lifted tensors as the next call would see them (state the optimizer creates
        lazily made as it would make it, missing gradients as zeros), on the step's device; the
        modules and optimizers are not touched."""
        out = []
        for s in self.slots:
            t = self._example(s, self.device)
            copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            copy.copy_(t.detach())
            out.append(copy)
        return out

    def finish(self) -> None:
        """After a compiled call: device copies written back, gradients the step leaves at ``None``
        set to ``None``, and each optimizer marked as stepped as its ``step()`` marks it (an LR
        scheduler stepped after the call then does not warn that it ran before ``optimizer.step()``)."""
        for _, opt in self.optimizers:
            opt._opt_called = True  # what torch.optim.lr_scheduler's wrapper of opt.step sets
        with torch.no_grad():
            for s in self.slots:
                if s.kind in ("learning rate", "parameter"):
                    continue
                mirror = self.mirrors.get(s.name)
                live = s.get()
                if mirror is not None and isinstance(live, torch.Tensor):
                    live.copy_(mirror)
        for pid in self.exit_none:
            self.params[pid].grad = None

    def eager(self, *args: Any) -> Any:
        """The user's step run eagerly on ``args`` = (lifted tensors, then the step's arguments),
        updating the lifted tensors as eager updates the user's own (the comparison of
        ``verify``)."""
        n = len(self.slots)
        values = dict(zip((s.name for s in self.slots), args[:n]))
        return self.run_bound(values, args[n:], trace=False)


_MISSING = object()


def _group_values(g: dict) -> dict[str, Any]:
    """A parameter group's entries other than ``params``, comparable before and after the step (a tensor
    by identity and version: ``g["lr"] *= 0.5`` on a tensor learning rate changes it in place)."""
    out = {}
    for k, v in g.items():
        if k == "params":
            continue
        out[k] = ("tensor", id(v), v._version) if isinstance(v, torch.Tensor) else _freeze(v)
    return out


class _WatchedGroup(dict):
    """A parameter group that remembers the user's line of the first write to each key while armed."""

    armed = False

    def __init__(self, group: dict) -> None:
        super().__init__(group)
        self.original = group
        self.writes: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        if self.armed and key not in self.writes:
            import sys

            from .trace import user_frame
            self.writes[key] = user_frame(sys._getframe(1))
        super().__setitem__(key, value)


@contextlib.contextmanager
def _refuse_unlisted_optimizers(optimizers: list[tuple[str, torch.optim.Optimizer]]) -> Iterator[None]:
    """Raise at ``opt.step()`` of an optimizer the step uses but ``state=`` does not name: it would
    update the user's own parameters, whose gradients the lifted step never sets (no update at all)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    listed = {id(o) for _, o in optimizers}

    def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(opt) not in listed:
            import sys

            from .trace import user_frame
            raise UnsupportedError("state-not-liftable",
                                   f"the step calls step() of a {type(opt).__name__} that state= does not name",
                                   source=user_frame(sys._getframe(1)),
                                   hint="name every optimizer the step uses: state=(model, opt)")

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class _LrWrites(torch.overrides.TorchFunctionMode):
    """Remembers the user's line of an in-place write to a group's tensor learning rate
    (``torch.optim.lr_scheduler`` does ``group["lr"].fill_(new)`` when the rate is a tensor)."""

    def __init__(self, groups: list[_WatchedGroup]) -> None:
        super().__init__()
        self.groups = groups

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        name = getattr(func, "__name__", "")
        if args and isinstance(args[0], torch.Tensor) and name.endswith("_") and not name.endswith("__"):
            for g in self.groups:
                if g.get("lr") is args[0] and "lr" not in g.writes:
                    import sys

                    from .trace import user_frame
                    g.writes["lr"] = user_frame(sys._getframe(1))
        return func(*args, **(kwargs or {}))


def _watch_groups(optimizers: list[tuple[str, torch.optim.Optimizer]]) -> list[_WatchedGroup]:
    """Put :class:`_WatchedGroup` copies in place of the optimizers' parameter groups (for one trace;
    :func:`_unwatch_groups` puts the user's own dicts back, untouched)."""
    watched = []
    for _, opt in optimizers:
        for i, g in enumerate(opt.param_groups):
            opt.param_groups[i] = _WatchedGroup(g)
            watched.append(opt.param_groups[i])
    return watched


def _unwatch_groups(optimizers: list[tuple[str, torch.optim.Optimizer]]) -> None:
    for _, opt in optimizers:
        opt.param_groups[:] = [g.original if isinstance(g, _WatchedGroup) else g for g in opt.param_groups]


def _drop_profiler_nodes(gm: torch.fx.GraphModule) -> None:
    """Remove the profiler's ``record_function`` enter/exit nodes (``Optimizer.step#...``)."""
    prof = getattr(torch.ops, "profiler", None)
    targets = {getattr(prof, n, None) for n in ("_record_function_enter", "_record_function_enter_new",
                                                "_record_function_exit")} - {None}
    overloads = set()
    for t in targets:
        overloads.update(getattr(t, o) for o in t.overloads())
    nodes = [nd for nd in gm.graph.nodes if nd.op == "call_function" and nd.target in overloads]
    for nd in reversed(nodes):  # the exits (which read the enters' handles) first
        if not nd.users:
            gm.graph.erase_node(nd)
    gm.recompile()
