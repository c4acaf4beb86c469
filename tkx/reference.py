"""The reference interpreter: runs any :class:`tkx.ir.Program` with PyTorch, op by op.

It is the oracle of every later stage (passes, schedule, arena, generated CUDA): each is
checked by comparing against :func:`run` on the same inputs. It runs on CPU or CUDA,
wherever the input tensors live, and never falls back to anything: an op it does not
know raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import TkxError
from .ir import Op, Operand, Program, TensorSpec

TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
         "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}

_UNARY = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "abs": torch.abs,
    "sign": torch.sign, "erf": torch.erf, "reciprocal": torch.reciprocal,
    "logical_not": torch.logical_not,
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
}
_TENSOR_ONLY = {"maximum", "minimum", "logical_and", "logical_or"}
_REDUCE = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}


@dataclass
class Execution:
    """What :func:`run` returns.

    ``outputs``: the flat outputs (tensors, in ``program.outputs`` order);
    ``updates``: input index -> new value, for every in-place state update;
    ``values``: root buffer name -> tensor, for every op (handy when debugging a stage).
    """

    program: Program
    outputs: list[torch.Tensor]
    updates: dict[int, torch.Tensor]
    values: dict[str, torch.Tensor] = field(repr=False)

    def output_tree(self) -> Any:
        """The outputs in the step's own pytree structure."""
        if self.program.out_tree is None:
            return list(self.outputs)
        return tree_unflatten(list(self.outputs), self.program.out_tree)


def flatten_inputs(program: Program, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """Accept the flat input list or the step's own positional-argument pytrees."""
    inputs = list(inputs)
    if len(inputs) == len(program.inputs) and all(isinstance(t, torch.Tensor) for t in inputs):
        flat = inputs
    else:
        flat, tree = tree_flatten(tuple(inputs))
        if program.in_tree is not None and tree != program.in_tree:
            raise TkxError(f"inputs do not match the captured signature: expected {program.in_tree}, got {tree}")
    if len(flat) != len(program.inputs):
        raise TkxError(f"expected {len(program.inputs)} input tensors, got {len(flat)}")
    for spec, t in zip(program.inputs, flat):
        if not isinstance(t, torch.Tensor):
            raise TkxError(f"input {spec.name}: expected a tensor, got {type(t).__name__}")
        if tuple(t.shape) != spec.value.shape or TORCH[spec.value.dtype] != t.dtype:
            got = f"{t.dtype}{list(t.shape)}".replace("torch.", "")
            raise TkxError(f"input {spec.name}: expected {spec.value.dtype}{list(spec.value.shape)}, got {got}")
    devices = {t.device for t in flat}
    if len(devices) > 1:
        raise TkxError(f"inputs on different devices: {sorted(map(str, devices))}; move them to one device")
    mutated = {i for i, inp in enumerate(program.inputs) if inp.mutated}
    for i in mutated:
        for j, t in enumerate(flat):
            if j != i and flat[i].numel() and t.numel() and \
                    flat[i].untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                raise TkxError(f"input {program.inputs[i].name} is updated in place but shares memory with "
                               f"{program.inputs[j].name}; pass distinct tensors")
    return flat


def in_captured_layout(t: torch.Tensor, spec: TensorSpec, *, copy: bool = False) -> torch.Tensor:
    """``t`` laid out exactly as captured (``spec``'s strides and offset over a storage of
    ``spec.extent`` elements): ``t`` itself when its strides already match (unless ``copy``),
    else a copy. Works for overlapping layouts (stride 0) too: elements are scattered to
    their storage slots instead of copied through an overlapping view."""
    if not copy and (tuple(t.stride()) == spec.strides or t.numel() <= 1):
        return t
    store = torch.empty(max(spec.extent, 1), dtype=t.dtype, device=t.device)
    slots = torch.arange(max(spec.extent, 1), device=t.device).as_strided(spec.shape, spec.strides, spec.offset)
    store[slots.reshape(-1)] = t.reshape(-1)
    return store.as_strided(spec.shape, spec.strides, spec.offset)


def read(env: dict[str, torch.Tensor], spec: TensorSpec) -> torch.Tensor:
    """Materialise the view ``spec`` of its root buffer (no copy)."""
    root = env[spec.buffer]
    return root.as_strided(spec.shape, spec.strides, root.storage_offset() + spec.offset)


def evaluate(op: Op, args: list[Any], device: torch.device) -> torch.Tensor:
    """Compute one op with torch; ``args`` are tensors (views) or Python scalars."""
    kind, dtype = op.kind, TORCH[op.out.dtype]
    if kind in _UNARY:
        return _UNARY[kind](args[0])
    if kind in _BINARY:
        a, b = args
        if not isinstance(a, torch.Tensor):  # scalar first operand: keep torch's promotion
            a = torch.tensor(a, dtype=torch.result_type(a, b) if isinstance(b, torch.Tensor) else dtype,
                             device=device)
        if not isinstance(b, torch.Tensor) and kind in _TENSOR_ONLY:
            b = torch.tensor(b, dtype=torch.result_type(a, b), device=device)
        return _BINARY[kind](a, b)
    if kind == "where":
        cond, a, b = args
        cond = cond.bool() if isinstance(cond, torch.Tensor) else bool(cond)
        a = a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dtype, device=device)
        b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=dtype, device=device)
        return torch.where(cond, a, b)
    if kind == "clamp":
        return torch.clamp(args[0], op.attr("min"), op.attr("max"))
    if kind == "cast":
        return args[0].to(dtype)
    if kind in _REDUCE:
        x = args[0]
        dims, keep = tuple(op.attr("dims", ())), bool(op.attr("keepdim", False))
        if kind in ("sum", "mean"):
            if x.dtype in (torch.bool, torch.int64, torch.int32) and kind == "mean":
                x = x.to(dtype)
            return _REDUCE[kind](x, dim=dims, keepdim=keep, dtype=dtype) if dims else x.to(dtype)
        return _REDUCE[kind](x, dim=dims, keepdim=keep) if dims else x.clone()
    if kind == "mm":
        return torch.mm(args[0], args[1])
    if kind == "bmm":
        return torch.bmm(args[0], args[1])
    if kind == "addmm":
        return torch.addmm(args[0], args[1], args[2], beta=op.attr("beta", 1), alpha=op.attr("alpha", 1))
    if kind == "fill":
        return torch.full(op.out.shape, op.attr("value"), dtype=dtype, device=device)
    if kind == "iota":
        dim, n = op.attr("dim", 0), op.out.shape[op.attr("dim", 0)]
        line = op.attr("start", 0) + op.attr("step", 1) * torch.arange(n, device=device, dtype=torch.float64)
        view = [1] * op.out.ndim
        view[dim] = n
        return line.reshape(view).expand(op.out.shape).to(dtype)
    raise TkxError(f"reference interpreter: unknown op kind {kind!r} ({op.id})")


def run(program: Program, inputs: Sequence[Any], *, update_inputs: bool = False) -> Execution:
    """Execute ``program`` on ``inputs`` with PyTorch.

    ``inputs`` is either the flat list of input tensors (``program.inputs`` order) or the
    step's positional arguments as pytrees. Tensors must have the captured shapes and
    dtypes. With ``update_inputs=True`` the in-place state updates are written into the
    input tensors afterwards, exactly as the eager step mutates them; by default inputs are
    left untouched and the new values are returned in :attr:`Execution.updates`.
    """
    flat = flatten_inputs(program, inputs)
    device = flat[0].device
    env: dict[str, torch.Tensor] = {}
    for spec, t in zip(program.inputs, flat):
        env[spec.value.buffer] = in_captured_layout(t, spec.value)
    for op in program.ops:
        args: list[Operand | torch.Tensor] = [read(env, x) if isinstance(x, TensorSpec) else x for x in op.inputs]
        result = evaluate(op, args, device)
        result = result.to(TORCH[op.out.dtype])
        if tuple(result.shape) != op.out.shape:
            result = result.expand(op.out.shape)
        env[op.id] = result.contiguous()
    outputs = [read(env, o.value) for o in program.outputs]
    updates = {u.input_index: read(env, u.value) for u in program.updates}
    if update_inputs:
        # Read every new value before writing any input (outputs may alias inputs).
        staged = {i: v.clone() for i, v in updates.items()}
        outputs = [o.clone() for o in outputs]
        for i, v in staged.items():
            flat[i].copy_(v)
        updates = {i: flat[i] for i in staged}
    return Execution(program, outputs, updates, env)
