"""The compiled step's call signature: pytree mirroring and input/output checks.

A compiled step is called exactly like the user's ``step_fn``: the positional arguments are
flattened with PyTorch's pytree against ``program.in_tree`` and the flat outputs are put back
into ``program.out_tree``. Every leaf is checked against the layout the kernel was compiled
for (device, dtype, shape, strides); a mismatch raises one :class:`InputMismatchError` naming
the input by its pytree path (``params['w1']``) and what differs.

Everything here is plain PyTorch and runs on CPU tensors (the tests check it without a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_unflatten

from ..errors import TkxError
from ..ir import InputSpec, Program
from ..random import with_state

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
                "int8": torch.int8, "uint8": torch.uint8}
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


class InputMismatchError(TkxError):
    """Arguments that do not match the compiled step.

    ``name``: the pytree path of the first offending input (``params['w1']``), or ``None``
    for a structural mismatch; ``problems``: what differs, one phrase each.
    """

    def __init__(self, message: str, *, name: str | None = None, problems: Sequence[str] = ()) -> None:
        self.name = name
        self.problems = tuple(problems)
        super().__init__(message)


def dtype_name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _children(spec: Any) -> list[Any]:
    children = getattr(spec, "children", None)
    if callable(children):
        return list(children())
    return list(spec.children_specs)


def arg_names(program: Program) -> list[str]:
    """The names of the step's positional arguments (``["params", "x", "y"]``), recovered from
    the input names capture recorded; ``arg{i}`` where an argument has no tensor leaf."""
    tree = program.in_tree
    if tree is None:
        return [i.name for i in program.inputs]
    skeleton = tree_unflatten(list(range(tree.num_leaves)), tree)
    names: dict[int, str] = {}
    for path, leaf in tree_flatten_with_path(skeleton)[0]:
        if not path or not hasattr(path[0], "idx"):
            continue
        suffix = keystr(path[1:])
        full = program.inputs[leaf].name if leaf < len(program.inputs) else ""
        if path[0].idx not in names:
            names[path[0].idx] = full[: len(full) - len(suffix)] if suffix and full.endswith(suffix) else full
    count = len(_children(tree))
    return [names.get(i) or f"arg{i}" for i in range(max(count, len(names)))]


def leaf_names(args: Sequence[Any], names: Sequence[str]) -> list[str]:
    """Pytree names (``params['w1']``) of the leaves of ``args``, given the argument names."""
    out = []
    for path, _ in tree_flatten_with_path(tuple(args))[0]:
        idx = path[0].idx if path and hasattr(path[0], "idx") else 0
        root = names[idx] if idx < len(names) else f"arg{idx}"
        out.append(root + keystr(path[1:]))
    return out


def flatten_args(program: Program, args: Sequence[Any]) -> list[Any]:
    """The flat leaves of ``args`` (the step's positional arguments), in ``program.inputs`` order, with a
    fresh implicit Philox state (:func:`tkx.random.next_state`) where the step draws random numbers.

    Raises :class:`InputMismatchError` listing missing and unexpected leaves by name when the
    pytree structure differs from the one captured.
    """
    flat, tree = tree_flatten(tuple(args))
    expected = program.in_tree
    if expected is None:
        flat = with_state(program, flat)
        if len(flat) != len(program.inputs):
            raise InputMismatchError(f"expected {len(program.inputs)} input tensors, got {len(flat)}")
        return flat
    if tree == expected:
        return with_state(program, flat)  # a step that draws random numbers: a fresh Philox state
    names = arg_names(program)
    want = [i.name for i in program.inputs]
    got = leaf_names(args, names)
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    parts = []
    if len(args) != len(names):
        parts.append(f"the step takes {len(names)} arguments ({', '.join(names)}), got {len(args)}")
    if missing:
        parts.append("missing " + ", ".join(missing))
    if extra:
        parts.append("unexpected " + ", ".join(extra))
    if not parts:
        parts.append(f"the containers differ: expected {expected}, got {tree}")
    raise InputMismatchError("the arguments do not match the compiled step's signature: " + "; ".join(parts),
                             problems=parts)


def describe(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{dtype_name(t.dtype)}{list(t.shape)} strides {tuple(t.stride())} on {t.device}"


def tensor_problems(spec: InputSpec, t: Any, device: torch.device) -> list[str]:
    """What differs between tensor ``t`` and the compiled input ``spec`` (empty when it fits)."""
    v = spec.value
    if not isinstance(t, torch.Tensor):
        return [f"is a {type(t).__name__}, not a tensor"]
    problems = []
    if t.device != device:
        problems.append(f"is on {t.device}, compiled for {device}")
    want_dtype = TORCH_DTYPES.get(v.dtype)
    if t.dtype != want_dtype:
        problems.append(f"has dtype {dtype_name(t.dtype)}, compiled for {v.dtype}")
    if tuple(t.shape) != tuple(v.shape):
        problems.append(f"has shape {tuple(t.shape)}, compiled for {tuple(v.shape)}")
    elif t.numel() > 0:
        got = tuple(t.stride())
        if any(d > 1 and a != b for d, a, b in zip(v.shape, got, v.strides)):
            problems.append(f"has strides {got}, compiled for {tuple(v.strides)} "
                            "(pass a tensor of that layout, e.g. .contiguous())")
    if t.layout != torch.strided:
        problems.append(f"has layout {t.layout}; only dense tensors are supported")
    return problems


def check_inputs(specs: Sequence[InputSpec], flat: Sequence[Any], device: torch.device) -> None:
    """Check every flat input against its compiled spec; raise one :class:`InputMismatchError`
    naming the first offending input, what differs, and how many other inputs differ too.

    Also rejects a mutated input sharing memory with another input (the kernel writes it).
    """
    if len(flat) != len(specs):
        raise InputMismatchError(f"expected {len(specs)} input tensors, got {len(flat)}")
    bad: list[tuple[str, list[str]]] = []
    for spec, t in zip(specs, flat):
        problems = tensor_problems(spec, t, device)
        if problems:
            bad.append((spec.name, problems))
    if bad:
        name, problems = bad[0]
        message = f"input {name} " + " and ".join(problems)
        if len(bad) > 1:
            message += f" (and {len(bad) - 1} more input(s) differ: {', '.join(n for n, _ in bad[1:])})"
        if any(p.startswith(("has shape", "has dtype")) for _, ps in bad for p in ps):
            message += ("; shapes and dtypes are fixed when the step is compiled: build a runner for the new shape "
                        "(tkx.runtime.build with those inputs)")
        raise InputMismatchError(message, name=name, problems=problems)
    storages: dict[int, str] = {}
    for spec, t in zip(specs, flat):
        if t.numel() == 0:
            continue
        ptr = t.untyped_storage().data_ptr()
        other = storages.get(ptr)
        if other is not None and (spec.mutated or any(s.mutated for s in specs if s.name == other)):
            raise InputMismatchError(
                f"inputs {other} and {spec.name} share memory, and the step updates one of them in place; "
                "pass distinct tensors (clone one)", name=spec.name, problems=["shares memory"])
        storages.setdefault(ptr, spec.name)


def allocate_outputs(program: Program, device: torch.device) -> list[torch.Tensor]:
    """Fresh dense output tensors (uninitialised) of the compiled shapes and dtypes."""
    return [torch.empty(o.value.shape, dtype=TORCH_DTYPES[o.value.dtype], device=device)
            for o in program.outputs]


def check_outputs(program: Program, out: Any, device: torch.device,
                  inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Validate preallocated outputs (``out=``, flat list or the output pytree): dense, the
    compiled shapes/dtypes, on ``device``, not sharing memory with an input or each other."""
    flat = list(out) if isinstance(out, (list, tuple)) and len(out) == len(program.outputs) and all(
        isinstance(t, torch.Tensor) for t in out) else tree_flatten(out)[0]
    if len(flat) != len(program.outputs):
        raise InputMismatchError(f"out= has {len(flat)} tensors, the step has {len(program.outputs)} outputs")
    taken = {t.untyped_storage().data_ptr(): f"input {s.name}" for s, t in zip(program.inputs, inputs)
             if isinstance(t, torch.Tensor) and t.numel()}
    for spec, t in zip(program.outputs, flat):
        v = spec.value
        problems = []
        if not isinstance(t, torch.Tensor):
            problems.append(f"is a {type(t).__name__}, not a tensor")
        else:
            if t.device != device:
                problems.append(f"is on {t.device}, compiled for {device}")
            if t.dtype != TORCH_DTYPES[v.dtype]:
                problems.append(f"has dtype {dtype_name(t.dtype)}, compiled for {v.dtype}")
            if tuple(t.shape) != tuple(v.shape):
                problems.append(f"has shape {tuple(t.shape)}, compiled for {tuple(v.shape)}")
            elif not t.is_contiguous():
                problems.append("is not contiguous")
            if t.numel():
                ptr = t.untyped_storage().data_ptr()
                if ptr in taken:
                    problems.append(f"shares memory with {taken[ptr]}")
                taken[ptr] = f"output {spec.name}"
        if problems:
            raise InputMismatchError(f"out= tensor for {spec.name} " + " and ".join(problems), name=spec.name,
                                     problems=problems)
    return flat


def unflatten_outputs(program: Program, flat: Sequence[torch.Tensor]) -> Any:
    """The flat outputs in the step's own output structure."""
    if program.out_tree is None:
        return list(flat)
    return tree_unflatten(list(flat), program.out_tree)
