"""View algebra used by the passes: canonical forms and composition of views.

A :class:`~tkx.ir.TensorSpec` is a strided window onto a root buffer. Two helpers make
rewrites safe:

* :func:`canonical_view` gives one spelling to views that address the same elements in
  the same order, so that passes comparing operands with ``==`` (CSE) see them as equal.
* :func:`compose` answers "a user reads op ``O``'s dense result through view ``U``; ``O``'s
  result is the same as value ``R``; which single view of ``R``'s buffer does the user
  read?". It returns ``None`` when no strided view expresses it (then a pass must keep
  ``O``).
"""

from __future__ import annotations

import math

from ..ir import TensorSpec, contiguous_strides


def equivalent_to_root(spec: TensorSpec, root: TensorSpec) -> bool:
    """``spec`` addresses exactly the elements of ``root``, in the same order.

    Strides of size-1 dimensions do not matter (they are never multiplied by a non-zero
    index).
    """
    return (spec.shape == root.shape and spec.offset == root.offset and spec.dtype == root.dtype
            and all(d == 1 or s == r for d, s, r in zip(spec.shape, spec.strides, root.strides)))


def normalize_unit_strides(spec: TensorSpec) -> TensorSpec:
    """Give every size-1 dimension the contiguous stride of ``spec``'s own shape.

    The rule (one of two sensible ones, the other being "stride 0") is chosen so that a
    contiguous read spelled with odd size-1 strides becomes exactly
    ``TensorSpec.dense(...)``'s strides, which is how op outputs are written.
    Empty views are returned unchanged.
    """
    if spec.numel == 0 or 1 not in spec.shape:
        return spec
    contig = contiguous_strides(spec.shape)
    strides = tuple(c if d == 1 else s for d, s, c in zip(spec.shape, spec.strides, contig))
    if strides == spec.strides:
        return spec
    return TensorSpec(spec.shape, spec.dtype, strides, spec.buffer, spec.offset)


def canonical_view(spec: TensorSpec, root: TensorSpec | None) -> TensorSpec:
    """The canonical spelling of ``spec``: the root itself when equivalent to it, else
    :func:`normalize_unit_strides`."""
    if root is not None and equivalent_to_root(spec, root):
        return root
    return normalize_unit_strides(spec)


def transposed(spec: TensorSpec) -> TensorSpec:
    """The 2-D transpose of ``spec`` (metadata only), canonically spelled."""
    return normalize_unit_strides(
        TensorSpec(spec.shape[::-1], spec.dtype, spec.strides[::-1], spec.buffer, spec.offset))


def _digits(flat: int, shape: tuple[int, ...], contig: tuple[int, ...]) -> list[int]:
    return [(flat // c) % d for d, c in zip(shape, contig)]


def compose(use: TensorSpec, value: TensorSpec) -> TensorSpec | None:
    """Re-express ``use`` (a view of a dense buffer shaped like ``value``) as a view of
    ``value``'s buffer, or ``None`` when no strided view can.

    The dense buffer is row-major with ``value.shape``; element ``f`` of it is the element
    of ``value`` whose row-major index is ``f``. ``use`` reads the flat positions
    ``use.offset + sum(i_k * use.strides[k])``. Decomposing each into ``value``'s index
    digits, the composition is a strided view exactly when those digits are affine in
    ``(i_k)`` and stay in range over the whole index box; that is checked per digit in
    ``O(ndim**2)``, without enumerating elements. The result has ``use``'s shape and
    ``value``'s dtype and buffer.
    """
    shape = value.shape
    numel = math.prod(shape)
    if use.numel == 0:
        return TensorSpec(use.shape, value.dtype, contiguous_strides(use.shape), value.buffer, value.offset)
    if use.extent > numel:
        return None
    contig = contiguous_strides(shape)
    # Fast path: value is laid out row-major itself (possibly at an offset).
    if all(d == 1 or s == c for d, s, c in zip(shape, value.strides, contig)):
        return normalize_unit_strides(
            TensorSpec(use.shape, value.dtype, use.strides, value.buffer, value.offset + use.offset))
    # Fast path: the use reads the whole dense buffer in order.
    if use.shape == shape and use.offset == 0 and all(
            d == 1 or s == c for d, s, c in zip(shape, use.strides, contig)):
        return value
    start = _digits(use.offset, shape, contig)
    deltas: list[list[int] | None] = []
    for n, s in zip(use.shape, use.strides):
        if n == 1:
            deltas.append(None)
            continue
        if use.offset + s >= numel:
            return None
        step = _digits(use.offset + s, shape, contig)
        deltas.append([b - a for a, b in zip(start, step)])
    for j, size in enumerate(shape):
        lo = hi = start[j]
        for n, delta in zip(use.shape, deltas):
            if delta is None:
                continue
            span = (n - 1) * delta[j]
            lo += min(0, span)
            hi += max(0, span)
        if lo < 0 or hi >= size:
            return None
    offset = value.offset + sum(a * s for a, s in zip(start, value.strides))
    strides = []
    for delta in deltas:
        if delta is None:
            strides.append(0)
            continue
        stride = sum(a * s for a, s in zip(delta, value.strides))
        if stride < 0:
            return None
        strides.append(stride)
    return normalize_unit_strides(TensorSpec(use.shape, value.dtype, tuple(strides), value.buffer, offset))
