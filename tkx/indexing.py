"""Torch references of the index family (``index_check``, ``gather``, ``cat``, ``slice_scatter``, ``scatter``).

The op table (:mod:`tkx.ops`) points its index rows here; both interpreters (:func:`tkx.reference.evaluate`
and the schedule interpreter) run them through :func:`tkx.ops.evaluate`. Each reference takes
``(op, args, device)``: the IR op (attrs, dtypes), its operands as tensors and the device. An index outside
its dimension raises the :class:`~tkx.errors.KernelError` of :func:`index_error`, the same error the
runtime decodes from the kernel's error word.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .errors import ERR_INDEX, KernelError


def index_error(op: Any, what: str, found_by: str = "the interpreter running the step") -> KernelError:
    """The error an out-of-range index raises, in both interpreters and (decoded, ``found_by="the kernel"``)
    from the kernel's error word."""
    where = f" ({op.source})" if getattr(op, "source", None) is not None else ""
    return KernelError(
        f"an index out of range in {op.attr('what', op.kind)} (tkx error code {ERR_INDEX}, found by "
        f"{found_by}) "
        f"(op {op.id}){where}: {what}",
        code=ERR_INDEX, stage=-1, block=-1, op=op.id, source=getattr(op, "source", None))


def index_check(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    x = args[0]
    lo, hi, ignore = op.attr("lo"), op.attr("hi"), op.attr("ignore")
    bad = (x < lo) | (x >= hi)
    if ignore is not None:
        bad &= x != ignore
    if bool(bad.any()):
        v = int(x[bad].reshape(-1)[0])
        raise index_error(op, f"value {v} is outside [{lo}, {hi})" +
                          (f" and is not ignore_index {ignore}" if ignore is not None else ""))
    return x.clone()


def gather(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    src, idx = args
    dim = op.attr("dim")
    n = src.shape[dim]
    j = idx.long()
    if op.attr("wrap", False):
        j = torch.where(j < 0, j + n, j)
    bad = (j < 0) | (j >= n)
    if bool(bad.any()):
        raise index_error(op, f"index {int(idx[bad].reshape(-1)[0])} is out of bounds for a dimension of size {n}")
    shape = list(src.shape)
    shape[dim] = idx.shape[dim]
    return torch.gather(src.expand(*src.shape), dim, j.expand(*idx.shape).contiguous())


def cat(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    return torch.cat([a for a in args], dim=op.attr("dim"))


def slice_scatter(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    base, src = args
    return torch.slice_scatter(base.contiguous(), src, op.attr("dim"), op.attr("start"), op.attr("end"),
                               op.attr("step"))


def scatter_writes(op: Any, base_shape: tuple[int, ...], index: torch.Tensor, values: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The writes of a ``scatter`` op: ``(flat positions in the dense base [M] int64, values [M])``, one per
    written position (the *last* write along ``attrs['dim']`` where several elements name the same position).

    ``index`` and ``values`` have the same shape ``V`` (``V[k] == base_shape[k]`` for ``k != dim``). Raises the
    :func:`index_error` of ``op`` for an index outside ``[0, base_shape[dim])``. Both interpreters use it: the
    reference on a copy of the base, the schedule interpreter in place (only the written slice changes)."""
    dim = op.attr("dim")
    n = base_shape[dim]
    j = index.long().expand(values.shape)
    bad = (j < 0) | (j >= n)
    if bool(bad.any()):
        raise index_error(op, f"index {int(j[bad].reshape(-1)[0])} is out of bounds for a dimension of size {n} "
                              f"(dim {dim} of {list(base_shape)})")
    strides = [1] * len(base_shape)
    for k in range(len(base_shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * base_shape[k + 1]
    pos = torch.zeros(values.shape, dtype=torch.int64, device=values.device)
    for k, size in enumerate(values.shape):
        coord = j if k == dim else torch.arange(size, device=values.device).view(
            [size if q == k else 1 for q in range(values.ndim)])
        pos = pos + coord * strides[k]
    order = torch.arange(values.shape[dim], device=values.device).view(
        [values.shape[dim] if q == dim else 1 for q in range(values.ndim)]).expand(values.shape).reshape(-1)
    pos = pos.reshape(-1)
    last = torch.full((max(math.prod(base_shape), 1),), -1, dtype=torch.int64, device=values.device)
    last = last.scatter_reduce(0, pos, order, "amax")
    keep = last[pos] == order  # unique positions: the write is deterministic
    return pos[keep], values.reshape(-1)[keep]


def scatter(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    base, index, values = args
    out = base.contiguous().clone()
    pos, vals = scatter_writes(op, tuple(base.shape), index, values)
    out.view(-1)[pos] = vals.to(out.dtype)
    return out


__all__ = ["index_error", "index_check", "gather", "cat", "slice_scatter", "scatter_writes", "scatter"]
