"""Capture: a static functional training step -> FX graph -> :class:`tkx.ir.Program`.

``tkx.capture(step_fn, example_inputs)`` traces ``step_fn(*example_inputs)`` with
``make_fx(functionalize(...), tracing_mode="fake")`` and the curated decomposition table
(:mod:`tkx.capture.decompositions`), labels every FX node ``forward``/``backward``/
``optimizer``, keeps the user's source line on each, and lowers the graph to the IR.

Capture never touches the user's real tensors: tracing runs on fake tensors.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_flatten_with_path, tree_unflatten

from .. import display
from .. import random as _random
from ..errors import SourceLine, TkxError, UnsupportedError
from ..ir import Program, validate
from .decompositions import decomposition_table
from .lower import TORCH_DTYPES, Lowering
from .modules import attribute
from .trace import SourceTagMode, TorchStateGuard, node_tag, user_frame, user_frame_of_traceback

__all__ = ["capture", "CapturedGraph", "FxNodeInfo"]


@dataclass(frozen=True)
class FxNodeInfo:
    """One FX node as tkx sees it: name, aten target, region, the user's line, the ``nn.Module``
    it came from (``module``: dotted path, ``module_type``: class name; see :class:`tkx.ir.Op`)."""

    name: str
    op: str
    target: str
    region: str | None
    source: SourceLine | None
    shape: tuple[int, ...] | None
    dtype: str | None
    args: tuple[str, ...]
    module: str | None = None
    module_type: str | None = None
    #: Every argument as written in the graph, scalars and keywords too (``("addmm", "0.5")``).
    arguments: tuple[str, ...] = ()


@dataclass(frozen=True)
class CapturedGraph(display.Views):
    """The traced step: an FX ``GraphModule`` on fake tensors plus tkx's labels.

    Attributes: ``graph_module`` (``torch.fx.GraphModule``), ``nodes`` (one
    :class:`FxNodeInfo` per FX node, in graph order), ``input_names`` / ``output_names``
    (pytree paths), ``loss_index`` (flat output index of the loss, or ``None``),
    ``program`` (the lowered, validated :class:`tkx.ir.Program`).
    """

    name: str
    graph_module: torch.fx.GraphModule = field(repr=False)
    nodes: tuple[FxNodeInfo, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    loss_index: int | None
    program: Program = field(repr=False)
    in_tree: Any = field(repr=False, compare=False)
    out_tree: Any = field(repr=False, compare=False)
    #: the :class:`~tkx.capture.stateful.StatefulStep` of a step captured with ``state=`` (else ``None``)
    stateful: Any = field(default=None, repr=False, compare=False)

    def lower(self) -> Program:
        """The IR of this step (lowered at capture time, so errors surface early)."""
        return self.program

    def region_counts(self) -> dict[str, int]:
        counts = {"forward": 0, "backward": 0, "optimizer": 0}
        for n in self.nodes:
            if n.region:
                counts[n.region] += 1
        return counts

    def __repr__(self) -> str:
        c = self.region_counts()
        return (f"<tkx.CapturedGraph {self.name}: {len(self.nodes)} FX nodes "
                f"(forward {c['forward']}, backward {c['backward']}, optimizer {c['optimizer']})>")

    # -- views, looked up in tkx.display (the printer and tkx.render register them) --
    def __str__(self) -> str:
        return display.text(self)

    def graph(self, **kw: Any) -> Any:
        """The FX graph as a ``graphviz.Digraph`` (``collapse``/``expand`` as for
        :meth:`tkx.ir.Program.graph`)."""
        return display.graph(self, **kw)

    def diff(self, other: Any) -> Any:
        """The :class:`~tkx.passes.diff.ProgramDiff` of the two lowered programs
        (``other``: a CapturedGraph or a Program)."""
        return display.diff(self, other)


def _arg_text(a: Any) -> str:
    """One FX argument as the captured graph's text shows it: a node by name, a scalar, list or dtype as
    written (``0.5``, ``[1, -1]``, ``float32``)."""
    if isinstance(a, torch.fx.Node):
        return a.name
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_arg_text(x) for x in a) + "]"
    if isinstance(a, torch.dtype):
        return str(a).removeprefix("torch.")
    if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
        return str(a)
    return repr(a)


def _arg_names(step_fn: Callable, n: int) -> list[str]:
    given = getattr(step_fn, "__tkx_arg_names__", None)  # the lifted state's names (tkx.capture.stateful)
    if given is not None:
        return list(given[:n]) + [f"arg{i}" for i in range(len(given), n)]
    try:
        params = [p.name for p in inspect.signature(step_fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(n)]


def _bad_call(step_fn: Callable, example_inputs: Sequence[Any], e: TypeError) -> tuple[str, str] | None:
    """(what, fix) when ``step_fn(*example_inputs)`` fails because the arguments do not match
    ``step_fn``'s parameters (not a TypeError from inside the step); ``None`` otherwise."""
    try:
        sig = inspect.signature(step_fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*example_inputs)
        return None
    except TypeError:
        pass
    names = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    call = ", ".join(("*" if p.kind == p.VAR_POSITIONAL else "") + p.name for p in sig.parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL))
    tup = ", ".join(names) + ("," if len(names) == 1 else "")
    fn = getattr(step_fn, "__name__", "step_fn")
    return (f"step_fn(*example_inputs) raised TypeError: {e}",
            f"pass example_inputs as a tuple matching step_fn's parameters: {fn}({call}) -> example_inputs=({tup})")


def _path_name(root: str, path: tuple) -> str:
    from torch.utils._pytree import keystr
    return root + keystr(path)


def _check_inputs(example_inputs: Sequence[Any], names: list[str]) -> tuple[list[torch.Tensor], list[str], Any,
                                                                         list[tuple[int, int]]]:
    """The flat input leaves, their names, the input tree, and the pairs ``(i, j)`` of leaves that share
    memory (allowed while neither is updated in place: :func:`_refuse_updated_aliases` checks after tracing)."""
    leaves_with_path, in_tree = tree_flatten_with_path(tuple(example_inputs))
    if not leaves_with_path:
        raise UnsupportedError("bad-input", "the step has no tensor inputs",
                               hint="pass the parameters and the batch as tensors (pytrees of tensors)")
    flat, flat_names = [], []
    for path, leaf in leaves_with_path:
        name = _path_name(names[path[0].idx], path[1:])
        if not isinstance(leaf, torch.Tensor):
            raise UnsupportedError(
                "bad-input", f"input {name} is a {type(leaf).__name__}, not a tensor",
                hint="make every input leaf a tensor; bake Python constants into the step "
                     "(e.g. a default argument or closure over a float) or pass a 0-d tensor")
        if leaf.layout != torch.strided:
            raise UnsupportedError("bad-input", f"input {name} has layout {leaf.layout}",
                                   hint="pass dense (strided) tensors")
        if leaf.dtype not in TORCH_DTYPES:
            raise UnsupportedError("unsupported-dtype", f"input {name} has dtype {leaf.dtype}",
                                   hint="use float32, bfloat16 or float16 (int64/int32/bool for indices)")
        if leaf.numel() == 0:
            raise UnsupportedError(
                "bad-input", f"input {name} has shape {tuple(leaf.shape)}: no elements",
                hint="pass at least one row (an empty batch leaves the kernel nothing to do and a "
                     "mean over it divides by zero); drop empty tensors from the step")
        flat.append(leaf)
        flat_names.append(name)
    devices = {t.device for t in flat}
    if len(devices) > 1:
        first = flat[0]
        k = next(i for i, t in enumerate(flat) if t.device != first.device)
        raise UnsupportedError(
            "device-mismatch",
            f"inputs on different devices: {flat_names[0]} on {first.device}, "
            f"{flat_names[k]} on {flat[k].device}",
            hint="move every input to one device before capturing")
    seen: dict[tuple, int] = {}
    shared: list[tuple[int, int]] = []
    for k, t in enumerate(flat):
        if t.numel() == 0 or t.device.type == "meta":  # meta tensors have no memory to share
            continue
        key = (t.untyped_storage().data_ptr(), t.device)
        if key in seen:
            shared.append((seen[key], k))
        else:
            seen[key] = k
    return flat, flat_names, in_tree, shared


def _refuse_updated_aliases(gm: torch.fx.GraphModule, shared: list[tuple[int, int]], names: list[str],
                            caller: SourceLine | None) -> None:
    """Inputs may share memory (``x, y = data[:, :8], data[:, 8:]``, parameters that are views of one flat
    buffer) as long as the step updates neither in place; else ``bad-input``: the kernel would write one
    while reading the other (the runtime checks the same at every call)."""
    if not shared:
        return
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: k for k, n in enumerate(placeholders)}
    updated = {index[n.args[0]] for n in gm.graph.nodes
               if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in index}
    for i, j in shared:
        if i in updated or j in updated:
            which = names[i] if i in updated else names[j]
            raise UnsupportedError("bad-input", f"inputs {names[i]} and {names[j]} share memory and the step "
                                                f"updates {which} in place",
                                   source=caller, hint="pass distinct tensors (clone one of them)")


def _tracing_error(e: BaseException, step_fn: Callable, example_inputs: Sequence[Any],
                   caller: SourceLine | None) -> TkxError | None:
    """The tkx error for an exception raised while tracing ``step_fn`` (``None``: re-raise it)."""
    if isinstance(e, TkxError):
        return None if not isinstance(e, UnsupportedError) or e.source is not None else e
    if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit
        return None
    if isinstance(e, DynamicOutputShapeException):
        return UnsupportedError("dynamic-shape", f"an op with a data-dependent output shape ({e.func})",
                                op=str(e.func), source=user_frame_of_traceback(e.__traceback__),
                                hint="keep shapes static: use masks with torch.where instead of "
                                     "boolean indexing / nonzero")
    if isinstance(e, DataDependentOutputException):
        return UnsupportedError("data-dependent-control-flow",
                                "the step branches on (or reads) the value of a tensor",
                                op=str(getattr(e, "func", None)) if getattr(e, "func", None) else None,
                                source=user_frame_of_traceback(e.__traceback__),
                                hint="replace Python if/while on tensor values with torch.where, or make the "
                                     "decision a Python value the step closes over (a default argument or a "
                                     "closure); to log a value (loss.item(), float(loss)), return the tensor "
                                     "and call .item() on it outside the step")
    if isinstance(e, TypeError) and (bad := _bad_call(step_fn, example_inputs, e)) is not None:
        return UnsupportedError("bad-call", bad[0], source=caller, hint=bad[1])
    src = user_frame_of_traceback(e.__traceback__)
    if (imperative := _imperative_training(e)) is not None:
        return UnsupportedError("not-functional", imperative, source=src, hint=FUNCTIONAL_HINT)
    if "convert all Tensors to FakeTensors" in str(e) and (module := _module_of(e)) is not None:
        return UnsupportedError(
            "not-functional", f"the step runs an nn.Module ({module}) whose tensors are not inputs of the step",
            op=str(e).split("Found in ")[-1].split("(")[0] if "Found in " in str(e) else None,
            source=src, hint=("register a tensor attribute with module.register_buffer(name, tensor) so that "
                              "state= lifts it; " if "neither a parameter" in module else "") + FUNCTIONAL_HINT)
    if "convert all Tensors to FakeTensors" in str(e):
        return UnsupportedError(
            "closed-over-tensor", "the step reads a tensor it did not receive as an input",
            op=str(e).split("Found in ")[-1].split("(")[0] if "Found in " in str(e) else None,
            source=src,
            hint="pass every tensor as an argument of the step (closed-over tensors would be "
                 "baked in as constants); Python floats are fine")
    if "GuardOnDataDependent" in type(e).__name__ and "extract specialized integer" in str(e):
        return UnsupportedError("data-dependent-control-flow",
                                "a tensor's value is used as a Python integer (an index or a size): indexing "
                                "with a 0-d integer tensor (x[:, pos] = v), .item() or int(t)",
                                source=src,
                                hint="keep an index a tensor with one element: x[:, pos.view(1)] = v.unsqueeze(1) "
                                     "(or x.index_copy_(1, pos.view(1), v.unsqueeze(1))) writes only that slice; "
                                     "sizes must be Python ints")
    if "data-dependent" in str(e).lower() or "GuardOnDataDependent" in type(e).__name__:
        return UnsupportedError("data-dependent-control-flow",
                                "the step branches on a tensor's value (a Python if/while, bool(), float() or a "
                                "comparison of a tensor used as a Python value): a traced step has one static path",
                                source=src,
                                hint="compute both sides and pick with torch.where(cond, a, b) (or multiply by "
                                     "the condition), or pass the decision in as a Python value")
    if isinstance(e, (RuntimeError, IndexError)) and _INDEX_DTYPE_ERROR.search(str(e)):
        return UnsupportedError("bad-input", f"an index tensor that does not hold integers: {_first_line(e)}",
                                source=src, hint="make the index an integer tensor: idx.long(), or "
                                                 "torch.tensor([...], dtype=torch.long)")
    if isinstance(e, RuntimeError) and _SHAPE_ERROR.search(str(e)):
        return UnsupportedError("bad-input", f"the example inputs' shapes do not fit the step: {_first_line(e)}",
                                source=src, hint="check the shapes of example_inputs against what the step expects "
                                                 "at this line (tkx traces the step with exactly these shapes)")
    if _raised_by_user_code(e):
        return UnsupportedError("step-raised",
                                f"the step itself raised {type(e).__name__}: {_first_line(e)}",
                                source=src, hint="fix the step so that step_fn(*example_inputs) runs in eager "
                                                 "PyTorch; the original exception is chained below")
    return UnsupportedError("unsupported-op",
                            f"tracing failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                            source=src, hint="tkx traces static functional steps; see the message above")


#: PyTorch's shape-check messages (matmul, broadcasting, views, cat, losses): the example inputs do not fit.
_SHAPE_ERROR = re.compile(r"must have same reduction dim|shapes cannot be multiplied|size of tensor a .* must match"
                          r"|is invalid for input of size|Sizes of tensors must match|Expected input batch_size"
                          r"|size mismatch|must match the size of tensor|to be of same shape as normalized_shape"
                          r"|expected input with shape|does not broadcast|do not broadcast", re.IGNORECASE)


#: PyTorch's messages for an index tensor of a float (or other non-integer) dtype.
_INDEX_DTYPE_ERROR = re.compile(r"Expected dtype int(32|64)(/int(32|64))? for index|tensors used as indices must be",
                                re.IGNORECASE)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


FUNCTIONAL_HINT = ("name the modules and optimizers the step uses: tkx.capture(step, inputs, state=(model, opt)) "
                   "(the same state= in tkx.explore, tkx.runtime.build, tkx.report and `tkx report --state`) lifts "
                   "their parameters, buffers, gradients and optimizer state into inputs; or make the step "
                   "functional, e.g.\n"
                   "            def loss_fn(p): return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)\n"
                   "            grads, loss = torch.func.grad_and_value(loss_fn)(params)\n"
                   "            new_params = {k: p - lr * grads[k] for k, p in params.items()}\n"
                   "            return loss, new_params")


def _module_of(e: BaseException) -> str | None:
    """The ``nn.Module`` whose code read the closed-over tensor, if any: its class name, and the name of
    a plain tensor attribute it holds (neither a parameter nor a buffer) when it has one."""
    found = None
    for frame, _ in traceback.walk_tb(e.__traceback__):
        obj = frame.f_locals.get("self")
        if isinstance(obj, torch.nn.Module):
            found = obj
    if found is None:
        return None
    plain = [k for k, v in vars(found).items() if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]
    name = type(found).__name__
    return f"{name}, whose tensor attribute {plain[0]!r} is neither a parameter nor a buffer" if plain else name


_IMPERATIVE_MARKS = ("backward", "requires_grad_", "autograd.functional", "_record_function_enter",
                     "torch.optim", "optimizer", ".grad ", ".grad=")


def _imperative_training(e: BaseException) -> str | None:
    """What the step did that is imperative training (``loss.backward()``, ``opt.step()``,
    ``requires_grad_()``, assigning ``.grad``), read from the traceback's user frames; ``None``
    when the failure is something else."""
    for frame, _ in traceback.walk_tb(e.__traceback__):
        code = frame.f_code
        fname = code.co_filename
        if "torch" + os.sep + "optim" + os.sep in fname:
            return "the step calls a torch.optim optimizer's step()"
        if fname.endswith(os.sep.join(("torch", "_tensor.py"))) and code.co_name == "backward":
            return "the step calls loss.backward()"
        if fname.endswith(os.sep.join(("autograd", "__init__.py"))) and code.co_name == "backward":
            return "the step calls torch.autograd.backward()"
    text = str(e)
    if "requires_grad_()" in text:
        return "the step calls requires_grad_() on a tensor"
    return None


def _raised_by_user_code(e: BaseException) -> bool:
    """True when the innermost frame of the traceback is the user's own code (a ``raise`` or
    a plain Python error in the step), not torch's."""
    from .trace import is_user_file
    last = None
    for frame, _ in traceback.walk_tb(e.__traceback__):
        last = frame
    return last is not None and is_user_file(last.f_code.co_filename)


def _implicit_rng_input(gm: torch.fx.GraphModule, names: list[str]) -> list[str]:
    """The name of the implicit Philox state input (the last placeholder, :mod:`tkx.random`) in a list,
    or ``[]`` after removing the placeholder when the step draws no random number."""
    rng = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    if not rng.users:
        gm.graph.erase_node(rng)
        gm.recompile()
        return []
    name = _random.IMPLICIT_NAME
    while name in names:
        name = "_" + name
    return [name]


def _refuse_imperative_optimizer(gm: torch.fx.GraphModule) -> None:
    """A ``torch.optim`` optimizer's ``step()`` traced through: it leaves profiler
    ``record_function`` nodes named ``Optimizer.step#...``; refuse it as not functional."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and "record_function" in str(node.target):
            label = next((a for a in node.args if isinstance(a, str)), "")
            if label.startswith("Optimizer."):
                raise UnsupportedError("not-functional",
                                       f"the step calls a torch.optim optimizer ({label.split('#')[0]})",
                                       node=node.name, source=node_tag(node).get("source"),
                                       hint=FUNCTIONAL_HINT)


def _refuse_overlapping_writes(gm: torch.fx.GraphModule, flat: list[torch.Tensor], names: list[str]) -> None:
    """Refuse an in-place update of an input in which several elements share one memory
    location (an ``expand``-ed or stride-0 tensor): eager PyTorch refuses it, and on the GPU the
    stores into the shared addresses would race."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders)}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0] in index:
            i = index[node.args[0]]
            t = flat[i]
            if t.device.type != "meta" and torch._debug_has_internal_overlap(t) == 1:
                raise UnsupportedError(
                    "overlapping-write",
                    f"the step updates input {names[i]} in place, but more than one element of {names[i]} "
                    f"refers to a single memory location (shape {tuple(t.shape)}, strides {tuple(t.stride())}, "
                    f"e.g. made by expand()); the writes would race, and eager PyTorch refuses it too",
                    op=str(node.target), node=node.name, source=_mutation_source(gm, node),
                    hint=f"pass {names[i]}.clone() (or .contiguous()) so that every element has its own memory")


def _mutation_source(gm: torch.fx.GraphModule, copy_node: torch.fx.Node) -> SourceLine | None:
    """The user's line of an in-place update: the copy_ node's own tag, or that of the value it writes."""
    src = node_tag(copy_node).get("source")
    if src is None and len(copy_node.args) > 1 and isinstance(copy_node.args[1], torch.fx.Node):
        src = node_tag(copy_node.args[1]).get("source")
    return src


def _capture_stateful(step_fn: Callable[..., Any], example_inputs: Sequence[Any], state: Any, loss: int | None,
                      name: str, caller: SourceLine | None) -> CapturedGraph:
    """:func:`capture` with ``state=``: the step lifted into a functional one, then captured."""
    import dataclasses

    from .stateful import StatefulStep
    try:
        stateful = StatefulStep(step_fn, state)
        stateful.lift(example_inputs, caller)
    except UnsupportedError as e:
        if e.source is not None:
            raise
        raise UnsupportedError(e.kind, e.what, source=caller, hint=e.hint) from None
    fn, args = stateful.functional(example_inputs, caller)
    return dataclasses.replace(capture(fn, args, loss=loss, name=name), stateful=stateful)


def _label_regions(gm: torch.fx.GraphModule, loss_node: torch.fx.Node | None) -> dict[str, str]:
    """The region of every FX node: ``backward`` (made by autograd), ``forward`` (the loss's
    ancestors, and values computed from the inputs that only the forward or the backward reads,
    such as a cast of a norm's rstd saved for the backward, and dead values that read no gradient)
    or ``optimizer`` (everything that reads a gradient, and the values that only such nodes or the
    step's outputs read, e.g. a step counter)."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    forward: set[torch.fx.Node] = set()
    if loss_node is not None:
        stack = [loss_node]
        while stack:
            n = stack.pop()
            if n in forward or n.op == "placeholder":
                continue
            forward.add(n)
            stack.extend(n.all_input_nodes)
    regions: dict[str, str] = {}
    for node in nodes:  # topological order: a node reading a gradient or an update value is the optimizer's
        if node_tag(node).get("backward"):
            regions[node.name] = "backward"
        elif node in forward:
            regions[node.name] = "forward"
        elif any(regions.get(i.name) in ("backward", "optimizer") for i in node.all_input_nodes):
            regions[node.name] = "optimizer"
    for node in reversed(nodes):  # the rest by who reads them: the optimizer, else forward or backward
        if node.name in regions:
            continue
        readers = {regions[u.name] for u in node.users if u.name in regions}
        schema = getattr(node.target, "_schema", None)
        # dead, e.g. math a recognised composite replaced (an in-place write such as copy_ has no users either)
        dead = not node.users and not (schema is not None and schema.is_mutable)
        regions[node.name] = "forward" if dead or readers and "optimizer" not in readers else "optimizer"
    return regions


def _find_loss(gm: torch.fx.GraphModule, loss: int | None, output_names: list[str], caller: Any
               ) -> tuple[int | None, torch.fx.Node | None]:
    """``(flat index, FX node)`` of the loss among the traced outputs: ``loss`` when given (checked: a 0-d
    floating-point tensor the step computes), else the first 0-d floating-point output (``None`` when there is
    none). Raises :class:`UnsupportedError` ``bad-input`` naming the user's frame ``caller``."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_args = out_node.args[0]
    out_args = list(out_args) if isinstance(out_args, (list, tuple)) else [out_args]
    loss_index = loss
    if loss_index is None:
        for i, a in enumerate(out_args):
            val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
            if isinstance(val, torch.Tensor) and val.dim() == 0 and val.is_floating_point():
                loss_index = i
                break
    elif isinstance(loss_index, bool) or not isinstance(loss_index, int) or not 0 <= loss_index < len(out_args):
        raise UnsupportedError("bad-input", f"loss={loss} but the step has {len(out_args)} outputs",
                               hint="pass the flat index of the loss among the outputs")
    loss_node = out_args[loss_index] if loss_index is not None else None
    if not isinstance(loss_node, torch.fx.Node):
        loss_node = None
    if loss is not None:
        val = loss_node.meta.get("val") if loss_node is not None else None
        if not (isinstance(val, torch.Tensor) and val.dim() == 0 and val.is_floating_point()):
            what = (f"shape {tuple(val.shape)}, dtype {val.dtype}" if isinstance(val, torch.Tensor)
                    else "not a tensor computed by the step")
            raise UnsupportedError(
                "bad-input", f"loss={loss} points at output {output_names[loss_index]}, which is "
                             f"not a 0-d floating-point tensor ({what})",
                source=user_frame(caller),
                hint="pass the flat index of the scalar loss among the outputs (or reduce it with .sum()/.mean())")
    return loss_index, loss_node


def _node_infos(gm: torch.fx.GraphModule, regions: dict, modules: dict) -> tuple[FxNodeInfo, ...]:
    """What the views show of each traced FX node: its op, target, region, source line, module, shape, dtype
    and arguments."""
    infos = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        is_t = isinstance(val, torch.Tensor)
        infos.append(FxNodeInfo(
            name=node.name, op=node.op,
            target=str(node.target) if node.op == "call_function" else node.op,
            region=regions.get(node.name), source=node_tag(node).get("source"),
            module=modules.get(node.name, (None, None))[0], module_type=modules.get(node.name, (None, None))[1],
            shape=tuple(int(d) for d in val.shape) if is_t else None,
            dtype=TORCH_DTYPES.get(val.dtype) if is_t else None,
            args=tuple(a.name for a in node.all_input_nodes),
            arguments=tuple(_arg_text(a) for a in node.args) + tuple(f"{k}={_arg_text(v)}"
                                                                       for k, v in node.kwargs.items())))
    return tuple(infos)


def capture(step_fn: Callable[..., Any], example_inputs: Sequence[Any], *, loss: int | None = None,
            name: str | None = None, state: Any = None) -> CapturedGraph:
    """Trace ``step_fn(*example_inputs)`` and lower it to the tkx IR.

    Parameters
    ----------
    step_fn
        A static functional training step. It may use ``torch.func.grad_and_value``, return
        pytrees of tensors and update inputs in place (``p.sub_(lr * g)``).
    example_inputs
        The positional arguments (a sequence of pytrees of tensors). Only their shapes,
        strides, dtypes and device are used; they are never modified.
    loss
        Flat index of the loss among the flattened outputs; by default the first 0-d
        floating-point output. The loss's ancestors form the ``forward`` region.
    name
        A name for the program (defaults to ``step_fn.__name__``).
    state
        The ``nn.Module`` and ``torch.optim.Optimizer`` objects a step that calls
        ``loss.backward()`` and ``opt.step()`` works on (one object, a tuple or a dict of them):
        their parameters, buffers, gradients, optimizer state and learning rates become inputs
        updated in place, named as in ``state_dict`` (:mod:`tkx.capture.stateful`).

    Returns
    -------
    CapturedGraph
        ``.lower()`` gives the :class:`tkx.ir.Program`.

    Raises
    ------
    tkx.UnsupportedError
        Naming the op, FX node and source line, for unsupported ops, dynamic shapes,
        data-dependent control flow, closed-over tensors, random ops, unsupported dtypes,
        empty or non-tensor inputs, example inputs that do not match ``step_fn``'s
        parameters (``bad-call``) and mismatched devices; ``not-functional`` for a step running
        an ``nn.Module`` or a ``torch.optim`` optimizer without ``state=``; ``state-not-liftable``
        for what ``state=`` cannot lift (a fused optimizer, an LR scheduler in ``state=``,
        optimizer state held in Python numbers), naming the object.
    """

    if not callable(step_fn):
        raise UnsupportedError("bad-call", f"step_fn is {type(step_fn).__name__}, not a function",
                               source=user_frame(sys._getframe(1)),
                               hint="pass the training step itself: tkx.capture(step, example_inputs)")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    name = name or getattr(step_fn, "__name__", "step")
    if state is not None:
        return _capture_stateful(step_fn, example_inputs, state, loss, name, user_frame(sys._getframe(1)))
    arg_names = _arg_names(step_fn, len(example_inputs))
    try:
        flat, flat_names, in_tree, shared = _check_inputs(example_inputs, arg_names)
    except UnsupportedError as e:  # point at the user's capture call
        raise UnsupportedError(e.kind, e.what, source=user_frame(sys._getframe(1)), hint=e.hint) from None
    out_tree_box: list[Any] = []
    rng_example = _random.philox_state(device=flat[0].device)  # the implicit Philox state (tkx.random)
    tag_mode = SourceTagMode()

    def flat_step(*leaves: torch.Tensor) -> list[torch.Tensor]:
        *leaves, rng = leaves
        args = tree_unflatten(list(leaves), in_tree)
        with tag_mode, tag_mode.modules, _random.drawing(rng):
            out = step_fn(*args)
        if out is None:  # a step that only updates its inputs in place: no outputs (the runner returns ())
            out = ()
        out_flat, out_tree = tree_flatten(out)
        out_tree_box.append(out_tree)
        return out_flat

    from torch.func import functionalize
    guard = TorchStateGuard().__enter__()
    # FakeTensor logs a failed meta kernel at ERROR level before raising; the exception itself becomes
    # tkx's one error below, so the log line (and its traceback) is held back while tracing.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    fake_level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with fx_traceback.preserve_node_meta():
            # detached: an nn.Parameter (requires_grad) updated in place under torch.no_grad() traces like
            # any tensor (autograd would refuse the in-place update of a leaf that requires grad)
            gm = make_fx(functionalize(flat_step, remove="mutations"),
                         decomposition_table=decomposition_table(), tracing_mode="fake")(*(t.detach() for t in flat),
                                                                                          rng_example)
    except BaseException as e:
        error = _tracing_error(e, step_fn, example_inputs, user_frame(sys._getframe(1)))
        # Frames of the failed trace hold torch's C++ guard objects (functorch layers, excluded
        # dispatch keys); freeing them later would restore a half-traced state and poison every
        # later capture. Free them now, then put torch's state back as it was on entry.
        traceback.clear_frames(e.__traceback__)
        guard.__exit__(None, None, None)
        fake_log.setLevel(fake_level)
        if error is None:
            raise
        raise error from (e if error.kind in ("unsupported-op", "step-raised", "bad-input") else None)
    guard.__exit__(None, None, None)
    fake_log.setLevel(fake_level)
    flat_names = flat_names + _implicit_rng_input(gm, flat_names)
    _refuse_updated_aliases(gm, shared, flat_names, user_frame(sys._getframe(1)))
    out_tree = out_tree_box[-1]
    out_paths = [p for p, _ in tree_flatten_with_path(tree_unflatten([0] * out_tree.num_leaves, out_tree))[0]]
    from torch.utils._pytree import keystr
    output_names = ["out" + keystr(p) for p in out_paths]

    loss_index, loss_node = _find_loss(gm, loss, output_names, sys._getframe(1))
    _refuse_imperative_optimizer(gm)
    _refuse_overlapping_writes(gm, flat, flat_names)
    regions = _label_regions(gm, loss_node)
    modules = attribute(gm, regions, flat_names, output_names, {n.name: node_tag(n) for n in gm.graph.nodes})
    known = dict(tag_mode.modules.seen)
    for path, kind in modules.values():
        known.setdefault(path, kind)

    program = Lowering(gm, flat_names, output_names, regions, name, modules).run()
    program = program.replace(in_tree=in_tree, out_tree=out_tree, modules=known,
                              rng_input=len(flat) if len(flat_names) > len(flat) else None)
    validate(program)

    infos = _node_infos(gm, regions, modules)
    return CapturedGraph(name, gm, infos, tuple(flat_names), tuple(output_names),
                         loss_index, program, in_tree, out_tree)
