"""Row shapes of row-persistent fusion (:mod:`tkx.schedule.rows`): what a row is, and when a view
broadcasts one value per row over it. Imports only the IR (the fusion rules read it too)."""

from __future__ import annotations

import math

from ..ir import Op, TensorSpec, contiguous_strides

#: Longest row (elements) one warp keeps in registers: 32 lanes x 16 values.
ROW_PER_LANE = 16
MAX_ROW = 32 * ROW_PER_LANE


def row_key(op: Op) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(input shape, reduced dims) of a reduction, or None when it has no reduced dims."""
    x = op.inputs[0]
    if not isinstance(x, TensorSpec):
        return None
    dims = tuple(sorted(d % max(x.ndim, 1) for d in op.attr("dims", ())))
    if not dims:
        return None
    return tuple(x.shape), dims


def is_row_broadcast(view: TensorSpec, root: TensorSpec, shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """Does ``view`` (of the row-shaped value ``root``) give, at every point of ``shape``, the value of
    that point's row (the reduced dims broadcast, the kept dims in order)?"""
    if tuple(view.shape) != tuple(shape) or view.offset != root.offset or not root.is_dense:
        return False
    if root.strides != contiguous_strides(root.shape):
        return False
    kept = [d for d in range(len(shape)) if d not in dims]
    kept_strides = contiguous_strides(tuple(shape[d] for d in kept))
    if math.prod(shape[d] for d in kept) != root.numel:
        return False
    for d, st in zip(kept, kept_strides):
        if shape[d] != 1 and view.strides[d] != st:
            return False
    return all(shape[d] == 1 or view.strides[d] == 0 for d in dims)
