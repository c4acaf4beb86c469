"""Capture: a static functional training step -> FX graph -> :class:`tkx.ir.Program`.

``tkx.capture(step_fn, example_inputs)`` traces ``step_fn(*example_inputs)`` with
``make_fx(functionalize(...), tracing_mode="fake")`` and the curated decomposition table
(:mod:`tkx.capture.decompositions`), labels every FX node ``forward``/``backward``/
``optimizer``, keeps the user's source line on each, and lowers the graph to the IR.

Capture never touches the user's real tensors: tracing runs on fake tensors.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_flatten_with_path, tree_unflatten

from .. import display
from ..errors import SourceLine, TkxError, UnsupportedError
from ..ir import Program, validate
from .decompositions import decomposition_table
from .lower import TORCH_DTYPES, Lowering
from .trace import SourceTagMode, node_tag, user_frame, user_frame_of_traceback

__all__ = ["capture", "CapturedGraph", "FxNodeInfo"]


@dataclass(frozen=True)
class FxNodeInfo:
    """One FX node as tkx sees it: name, aten target, region, the user's line."""

    name: str
    op: str
    target: str
    region: str | None
    source: SourceLine | None
    shape: tuple[int, ...] | None
    dtype: str | None
    args: tuple[str, ...]


@dataclass(frozen=True)
class CapturedGraph:
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

    def __rich__(self) -> Any:
        return display.rich(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)

    def graph(self, **kw: Any) -> Any:
        """The FX graph as a ``graphviz.Digraph`` (``collapse``/``expand`` as for
        :meth:`tkx.ir.Program.graph`)."""
        return display.graph(self, **kw)

    def diff(self, other: Any) -> Any:
        """The :class:`~tkx.passes.diff.ProgramDiff` of the two lowered programs
        (``other``: a CapturedGraph or a Program)."""
        return display.diff(self, other)


def _arg_names(step_fn: Callable, n: int) -> list[str]:
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


def _check_inputs(example_inputs: Sequence[Any], names: list[str]) -> tuple[list[torch.Tensor], list[str], Any]:
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
    seen: dict[tuple, str] = {}
    for t, name in zip(flat, flat_names):
        if t.numel() == 0:
            continue
        key = (t.untyped_storage().data_ptr(), t.device)
        if key in seen:
            raise UnsupportedError("bad-input", f"inputs {seen[key]} and {name} share memory",
                                   hint="pass distinct tensors (clone one of them)")
        seen[key] = name
    return flat, flat_names, in_tree


def _label_regions(gm: torch.fx.GraphModule, loss_node: torch.fx.Node | None) -> dict[str, str]:
    """forward: ancestors of the loss; backward: made by autograd; optimizer: the rest."""
    forward: set[torch.fx.Node] = set()
    if loss_node is not None:
        stack = [loss_node]
        while stack:
            n = stack.pop()
            if n in forward or n.op == "placeholder":
                continue
            forward.add(n)
            stack.extend(n.all_input_nodes)
    regions = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node_tag(node).get("backward"):
            regions[node.name] = "backward"
        elif node in forward:
            regions[node.name] = "forward"
        else:
            regions[node.name] = "optimizer"
    return regions


def capture(step_fn: Callable[..., Any], example_inputs: Sequence[Any], *, loss: int | None = None,
            name: str | None = None) -> CapturedGraph:
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
        parameters (``bad-call``) and mismatched devices.
    """

    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    name = name or getattr(step_fn, "__name__", "step")
    arg_names = _arg_names(step_fn, len(example_inputs))
    try:
        flat, flat_names, in_tree = _check_inputs(example_inputs, arg_names)
    except UnsupportedError as e:  # point at the user's capture call
        raise UnsupportedError(e.kind, e.what, source=user_frame(sys._getframe(1)), hint=e.hint) from None
    out_tree_box: list[Any] = []

    def flat_step(*leaves: torch.Tensor) -> list[torch.Tensor]:
        args = tree_unflatten(list(leaves), in_tree)
        with SourceTagMode():
            out = step_fn(*args)
        out_flat, out_tree = tree_flatten(out)
        out_tree_box.append(out_tree)
        return out_flat

    from torch.func import functionalize
    try:
        with fx_traceback.preserve_node_meta():
            gm = make_fx(functionalize(flat_step, remove="mutations"),
                         decomposition_table=decomposition_table(), tracing_mode="fake")(*flat)
    except UnsupportedError:
        raise
    except DynamicOutputShapeException as e:
        raise UnsupportedError("dynamic-shape", f"an op with a data-dependent output shape ({e.func})",
                               op=str(e.func), source=user_frame_of_traceback(e.__traceback__),
                               hint="keep shapes static: use masks with torch.where instead of "
                                    "boolean indexing / nonzero") from None
    except DataDependentOutputException as e:
        raise UnsupportedError("data-dependent-control-flow",
                               "the step branches on (or reads) the value of a tensor",
                               op=str(getattr(e, "func", None)) if getattr(e, "func", None) else None,
                               source=user_frame_of_traceback(e.__traceback__),
                               hint="replace Python if/while on tensor values with torch.where, "
                                    "or pass the decision in as a static Python value") from None
    except TkxError:
        raise
    except Exception as e:  # anything else torch raised while tracing the user's code
        if isinstance(e, TypeError) and (bad := _bad_call(step_fn, example_inputs, e)) is not None:
            raise UnsupportedError("bad-call", bad[0], source=user_frame(sys._getframe(1)), hint=bad[1]) from None
        src = user_frame_of_traceback(e.__traceback__)
        if "convert all Tensors to FakeTensors" in str(e):
            raise UnsupportedError(
                "closed-over-tensor", "the step reads a tensor it did not receive as an input",
                op=str(e).split("Found in ")[-1].split("(")[0] if "Found in " in str(e) else None,
                source=src,
                hint="pass every tensor as an argument of the step (closed-over tensors would be "
                     "baked in as constants); Python floats are fine") from None
        kind = "data-dependent-control-flow" if "data-dependent" in str(e).lower() or \
            "GuardOnDataDependent" in type(e).__name__ else "unsupported-op"
        raise UnsupportedError(kind, f"tracing failed: {type(e).__name__}: {str(e).splitlines()[0]}",
                               source=src,
                               hint="tkx traces static functional steps; see the message above") from e

    out_tree = out_tree_box[-1]
    out_paths = [p for p, _ in tree_flatten_with_path(tree_unflatten([0] * out_tree.num_leaves, out_tree))[0]]
    from torch.utils._pytree import keystr
    output_names = ["out" + keystr(p) for p in out_paths]

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
    elif not 0 <= loss_index < len(out_args):
        raise UnsupportedError("bad-input", f"loss={loss} but the step has {len(out_args)} outputs",
                               hint="pass the flat index of the loss among the outputs")
    loss_node = out_args[loss_index] if loss_index is not None else None
    if not isinstance(loss_node, torch.fx.Node):
        loss_node = None
    regions = _label_regions(gm, loss_node)

    program = Lowering(gm, flat_names, output_names, regions, name).run()
    program = program.replace(in_tree=in_tree, out_tree=out_tree)
    validate(program)

    infos = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        is_t = isinstance(val, torch.Tensor)
        infos.append(FxNodeInfo(
            name=node.name, op=node.op,
            target=str(node.target) if node.op == "call_function" else node.op,
            region=regions.get(node.name), source=node_tag(node).get("source"),
            shape=tuple(int(d) for d in val.shape) if is_t else None,
            dtype=TORCH_DTYPES.get(val.dtype) if is_t else None,
            args=tuple(a.name for a in node.all_input_nodes)))
    return CapturedGraph(name, gm, tuple(infos), tuple(flat_names), tuple(output_names),
                         loss_index, program, in_tree, out_tree)
