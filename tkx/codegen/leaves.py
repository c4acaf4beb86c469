"""Which raw bytes an inlined operand chain reads, found by running its index maps on the CPU.

A GEMV whose weight is dequantised in its operand load (``q.to(bf16) * scale``, int4 nibbles) computes
each weight element from a chain of inlined pointwise ops over views of stored buffers (the "leaves":
the int8 / packed uint8 rows, the bf16 scales). :func:`column_spans` follows the chain's views with
integer index tensors (``arange(extent).as_strided(view)``, broadcast like the ops broadcast) and
reports, for each leaf, where the elements of output column ``l`` lie when that is an affine row of
memory: ``[row_stride * l + start, + span)`` elements. The streaming GEMV prefetches those bytes
(:class:`tkx.codegen.gemv.Prefetch`). Imports only torch and the IR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..ir import Op, TensorSpec

__all__ = ["LeafSpan", "column_spans"]

#: Largest operand (elements) whose index maps are computed (a 4096 x 4096 weight: 128 MB of int64 maps).
MAX_ELEMENTS = 1 << 24
#: Spans already found, by the chain's structure (:func:`_structure`): a model's layers repeat the same chain
#: over their own buffers, and the index maps of a large weight take seconds to build.
_SPANS: dict[tuple, list[tuple[int, int, int, int]]] = {}


@dataclass(frozen=True)
class LeafSpan:
    """Column ``l`` of the operand reads elements ``[row_stride * l + start, row_stride * l + start + span)``
    of the stored buffer ``buffer`` (in its own elements, as the kernel indexes it)."""

    buffer: str
    row_stride: int
    start: int
    span: int


def _index_map(spec: TensorSpec, shape: tuple[int, ...]) -> torch.Tensor:
    """For each element of ``shape`` (``spec`` broadcast to it), the root element ``spec`` reads there."""
    base = torch.arange(max(spec.extent, 1), dtype=torch.int64)
    return base.as_strided(spec.shape, spec.strides, spec.offset).expand(shape)


def _leaf_maps(view: TensorSpec, ops: Mapping[str, Op], inlined: set[str]) -> dict[str, torch.Tensor] | None:
    """leaf buffer -> index map over ``view.shape`` (element of the leaf each operand element reads);
    ``None`` when the chain has an op that does not read its operands at its own point."""
    from .. import ops as optable

    out: dict[str, torch.Tensor] = {}
    stack = [(view.buffer, _index_map(view, view.shape))]
    while stack:
        buf, idx = stack.pop()
        if buf not in inlined:
            if buf in out and not torch.equal(out[buf], idx):
                return None  # read through two different views: not one row per column
            out[buf] = idx
            continue
        op = ops[buf]
        if not optable.row(op.kind).reads_at_point:
            return None
        for x in op.tensor_inputs:
            inner = _index_map(x, op.out.shape).reshape(-1)
            stack.append((x.buffer, inner[idx.reshape(-1)].reshape(idx.shape)))
    return out


def _structure(view: TensorSpec, ops: Mapping[str, Op], inlined: set[str]) -> tuple[tuple, list[str]]:
    """``(key, buffers)``: the chain behind ``view`` with its buffers numbered by first visit (every op's kind,
    shape and operand views; which buffers are leaves), and the buffers in that order. Two chains of equal
    key have the same index maps, buffer for buffer."""
    names: dict[str, int] = {}

    def num(buf: str) -> int:
        return names.setdefault(buf, len(names))

    def spec(x: TensorSpec) -> tuple:
        return num(x.buffer), tuple(x.shape), tuple(x.strides), x.offset, x.extent

    key: list[tuple] = [spec(view)]
    stack, seen = [view.buffer], set()
    while stack:
        buf = stack.pop()
        if buf not in inlined or buf in seen:
            key.append(("leaf" if buf not in inlined else "again", num(buf)))
            continue
        seen.add(buf)
        op = ops[buf]
        key.append((num(buf), op.kind, tuple(op.out.shape), tuple(spec(x) for x in op.tensor_inputs)))
        stack.extend(x.buffer for x in op.tensor_inputs)
    return tuple(key), list(names)


def column_spans(view: TensorSpec, ops: Mapping[str, Op], inlined: set[str], k_dim: int) -> list[LeafSpan]:
    """The leaves of the inlined chain behind ``view`` (a 2-D operand, ``k_dim`` its reduction dim) whose
    elements for each output column form one contiguous range at an affine position; leaves that do not
    are left out (their loads simply are not prefetched)."""
    if view.ndim != 2 or view.numel > MAX_ELEMENTS or view.buffer not in inlined:
        return []
    key, buffers = _structure(view, ops, inlined)
    if (key, k_dim) not in _SPANS:
        number = {b: i for i, b in enumerate(buffers)}
        if len(_SPANS) > 256:
            _SPANS.clear()
        _SPANS[key, k_dim] = [(number[sp.buffer], sp.row_stride, sp.start, sp.span)
                              for sp in _column_spans(view, ops, inlined, k_dim)]
    spans = [LeafSpan(buffers[i], stride, start, span) for i, stride, start, span in _SPANS[key, k_dim]]
    return sorted(spans, key=lambda s: s.buffer)


def _column_spans(view: TensorSpec, ops: Mapping[str, Op], inlined: set[str], k_dim: int) -> list[LeafSpan]:
    """:func:`column_spans` computed from the index maps."""
    maps = _leaf_maps(view, ops, inlined)
    if maps is None:
        return []
    spans = []
    for buf, idx in maps.items():
        cols = idx if k_dim == 0 else idx.t()             # [K, L]
        lo, hi = cols.amin(0), cols.amax(0)
        if cols.shape[1] < 2:
            continue
        stride = int(lo[1] - lo[0])
        n = torch.arange(cols.shape[1], dtype=torch.int64)
        span = int(hi[0] - lo[0]) + 1
        if not torch.equal(lo, lo[0] + stride * n) or not torch.equal(hi - lo + 1, torch.full_like(lo, span)):
            continue
        spans.append(LeafSpan(buf, stride, int(lo[0]), span))
    return sorted(spans, key=lambda s: s.buffer)
