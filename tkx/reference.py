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
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_unflatten

from . import ops
from .dtypes import TORCH
from .errors import TkxError
from .ir import Op, Operand, Program, TensorSpec
from .random import with_state


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


def _tree_difference(expected: Any, got: Any, names: Sequence[str] = ()) -> str:
    """The leaves one pytree structure has and the other lacks, by path (``[0]['w2']``), in a line; a missing
    leaf also by its input name (``names``: the captured inputs' names in leaf order) where that differs."""
    def paths(spec: Any) -> list[str]:
        skeleton = tree_unflatten([0] * spec.num_leaves, spec)
        return [keystr(p) for p, _ in tree_flatten_with_path(skeleton)[0]]

    def named(i: int, path: str) -> str:
        name = names[i] if i < len(names) else ""
        tail = path[path.index("]") + 1:] if "]" in path else ""  # the path inside the argument
        return f"args{path}" + (f" ({name})" if name and not (tail and name.endswith(tail)) else "")
    want, have = paths(expected), paths(got)
    missing = [named(i, p) for i, p in enumerate(want) if p not in have]
    extra = [p for p in have if p not in want]
    parts = ([f"missing {', '.join(missing[:8])}"] if missing else []) + \
            ([f"unexpected {', '.join('args' + p for p in extra[:8])}"] if extra else [])
    return "; ".join(parts) or ("the containers differ (a tuple where a list was captured, or dict keys in "
                                "another order)")


def flatten_inputs(program: Program, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """Accept the flat input list or the step's own positional-argument pytrees; a step that draws random
    numbers gets a fresh implicit Philox state (:func:`tkx.random.next_state`) unless the flat list has it."""
    inputs = list(inputs)
    if len(inputs) == len(program.inputs) and all(isinstance(t, torch.Tensor) for t in inputs):
        flat = inputs
    else:
        flat, tree = tree_flatten(tuple(inputs))
        if program.in_tree is not None and tree != program.in_tree:
            raise TkxError("inputs do not match the captured signature: "
                           + _tree_difference(program.in_tree, tree, [i.name for i in program.inputs]))
        flat = with_state(program, flat)
    if len(flat) != len(program.inputs):
        raise TkxError(f"expected {len(program.inputs)} input tensors, got {len(flat)}")
    for spec, t in zip(program.inputs, flat):
        if not isinstance(t, torch.Tensor):
            raise TkxError(f"input {spec.name}: expected a tensor, got {type(t).__name__}")
        if tuple(t.shape) != spec.value.shape or TORCH[spec.value.dtype] != t.dtype:
            got = f"{t.dtype}{list(t.shape)}".replace("torch.", "")
            want = f"{spec.value.dtype}{list(spec.value.shape)}"
            if tuple(t.shape) == spec.value.shape:
                raise TkxError(f"input {spec.name}: expected {want}, got {got}; dtypes are fixed when the step is "
                               f"captured: pass {spec.value.dtype} (e.g. `.to(torch.{spec.value.dtype})`), or capture "
                               f"it again (tkx.explore / tkx.runtime.build) with {got.split('[')[0]} inputs")
            raise TkxError(f"input {spec.name}: expected {want}, got {got}; shapes are fixed when the step is "
                           "captured: pass the captured shape, or capture it again (tkx.explore / "
                           "tkx.runtime.build) with inputs of the new shape")
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
    """Compute one op with torch; ``args`` are tensors (views) or Python scalars.

    The op table's row for ``op.kind`` does the work (:func:`tkx.ops.evaluate`); a kind
    without a row raises :class:`tkx.ops.UnknownKindError`, an index out of range
    :class:`tkx.errors.KernelError` (the same error the kernel reports)."""
    return ops.evaluate(op, args, device)


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
        with torch.no_grad():  # an input may be an nn.Parameter (requires_grad)
            for i, v in staged.items():
                flat[i].copy_(v)
        updates = {i: flat[i] for i in staged}
    return Execution(program, outputs, updates, env)
