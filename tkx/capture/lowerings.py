"""Lowerings of aten ops that are not one IR op each: the registry and its built-in entries.

:data:`LOWERINGS` maps an aten overload (or a whole overload packet) to a function
``fn(lowering, node) -> value`` that emits IR ops through the :class:`~tkx.capture.lower.Lowering`
it is given (``emit``, ``pointwise``, ``tensor``, ``broadcast``, ``fail``...). Ops that lower
one to one come from the op table (:func:`tkx.ops.lowerings`) instead; the rest of
``Lowering.lower_call`` holds only true special cases.

A notebook cell can add its own::

    @tkx.register_lowering(torch.ops.aten.softshrink.default)
    def softshrink(L, node):  # x - clamp(x, -lambd, lambd)
        x, lambd = L.tensor(node.args[0]), float(node.args[1] if len(node.args) > 1 else 0.5)
        clamped = L.emit("clamp", (x,), x.shape, x.dtype, {"min": -lambd, "max": lambd})
        return L.emit("sub", (x, clamped), x.shape, x.dtype)

Built-in entries here: indexed reads (``gather``, ``index.Tensor``, ``index_select``,
``embedding``), indexed writes (``index_put``, ``scatter``, ``scatter_add``), writing into part
of a buffer (``cat``, ``slice_scatter``) and ``tkx::check_index``.

Indexed writes are deterministic: ``index_put(accumulate=True)``/``scatter_add`` are a sum over
the written positions in a fixed order (one reduction: ``out[v] = base[v] + sum_j [index[j] == v]
* values[j]``), with no atomics, so a kernel gives the same bits on every run; their cost is
``O(rows x positions)``, fine for tables up to a few thousand rows.

``x[idx] = v`` (``index_put`` without accumulation, on one dim or several adjacent ones, merged),
``x.index_copy_(dim, idx, v)`` and ``x.scatter_(dim, index, src)`` lower to one IR ``scatter`` op:
``out[e with e[dim] = index[e]] = values[e]`` over the elements ``e`` of the values (for ``index_put``
the index is a broadcast view of the 1-D index list). Where several elements name one position the
*last* along ``dim`` wins (the largest ``j``, as a sequential loop would; torch leaves the order
undefined). When the base is an input the step updates in place and nothing else reads its old
value, the scheduler writes only the indexed slice into the input (a KV-cache append at ``pos``
touches ``B x H x D`` elements, not the whole cache); otherwise the group computes every element
of the result (``O(elements x index length)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .. import random as _random  # noqa: F401 (registers torch.ops.tkx.philox_uniform)
from ..dtypes import INT_DTYPES
from ..ir import TensorSpec, contiguous_strides
from . import decompositions  # noqa: F401 (registers torch.ops.tkx.check_index)

aten = torch.ops.aten

Lower = Callable[[Any, torch.fx.Node], Any]
#: aten overload or overload packet -> lowering function.
LOWERINGS: dict[Any, Lower] = {}
#: The entries added by :func:`register_lowering` (kept apart so they can be removed).
USER_LOWERINGS: dict[Any, Lower] = {}


def _register(table: dict[Any, Lower], *targets: Any) -> Callable[[Lower], Lower]:
    def wrap(fn: Lower) -> Lower:
        for t in targets:
            table[t] = fn
        return fn
    return wrap


def register_lowering(*targets: Any) -> Callable[[Lower], Lower]:
    """Decorator: lower the aten ``targets`` (overloads or packets) with ``fn(lowering, node)``.

    User lowerings win over the built-in ones and the op table; later captures use them.
    :func:`unregister_lowering` removes them.
    """
    return _register(USER_LOWERINGS, *targets)


def unregister_lowering(*targets: Any) -> None:
    """Remove lowerings added with :func:`register_lowering` (missing ones are ignored)."""
    for t in targets:
        USER_LOWERINGS.pop(t, None)


def find(target: Any) -> Lower | None:
    """The lowering of an FX node's target: a user one, then a built-in one; by overload, then packet."""
    packet = getattr(target, "_overloadpacket", None)
    for table in (USER_LOWERINGS, LOWERINGS):
        for key in (target, packet):
            if key is not None and key in table:
                return table[key]
    return None


builtin = lambda *targets: _register(LOWERINGS, *targets)  # noqa: E731


# -- helpers ---------------------------------------------------------------------------------


def _dim(d: int, ndim: int) -> int:
    return d % max(ndim, 1)


def _strided(x: TensorSpec, shape: tuple[int, ...], strides: list[int]) -> TensorSpec:
    return TensorSpec(tuple(shape), x.dtype, tuple(strides), x.buffer, x.offset)


def _dense(L: Any, x: TensorSpec, base: str) -> TensorSpec:
    """``x`` itself when it is a dense view, else a dense copy of it."""
    return x if x.is_dense else L.emit("cast", (x,), x.shape, x.dtype, base=base)


def _index_tensor(L: Any, idx: TensorSpec, what: str) -> TensorSpec:
    """``idx`` if it holds integers; a floating-point index is refused, as eager refuses it (tkx would
    otherwise truncate 2.7 to row 2 where torch raises)."""
    if idx.dtype not in INT_DTYPES:
        raise L.fail("bad-input", f"{what} with a {idx.dtype} index tensor: torch expects int64 (or int32) "
                     "indices and raises here", "make the index an integer tensor: idx.long(), or "
                     "torch.tensor([...], dtype=torch.long)")
    return idx


def _flat_index(L: Any, idx: TensorSpec, base: str) -> TensorSpec:
    """A 1-D view of index tensor ``idx`` (a dense copy first when its layout needs one)."""
    n = idx.numel
    if idx.ndim == 1:
        return idx
    d = _dense(L, idx, base)
    return TensorSpec((n,), d.dtype, (1,), d.buffer, d.offset)


def _checked(L: Any, idx: TensorSpec, n: int, *, wrap: bool, what: str) -> TensorSpec:
    """``idx`` checked against the size ``n`` (``[-n, n)`` and wrapped when ``wrap``, else ``[0, n)``)."""
    lo = -n if wrap else 0
    checked = L.emit("index_check", (idx,), idx.shape, idx.dtype, {"lo": lo, "hi": n, "ignore": None, "what": what},
                     base=f"{L.node.name}_check")
    if not wrap:
        return checked
    neg = L.emit("lt", (checked, 0), idx.shape, "bool", base=f"{L.node.name}_neg")
    plus = L.emit("add", (checked, n), idx.shape, idx.dtype, base=f"{L.node.name}_wrap")
    return L.emit("where", (neg, plus, checked), idx.shape, idx.dtype, base=f"{L.node.name}_idx")


def _index_along(L: Any, x: TensorSpec, pos: int, flat: TensorSpec, *, wrap: bool, what: str,
                 dtype: str | None = None) -> TensorSpec:
    """``out[a, j, e] = x[a, flat[j], e]`` (``a`` = dims before ``pos``): one ``gather``, dense output."""
    out_shape = x.shape[:pos] + (flat.numel,) + x.shape[pos + 1:]
    strides = [0] * len(out_shape)
    strides[pos] = flat.strides[0]
    index = _strided(flat, out_shape, strides)
    return L.emit("gather", (x, index), out_shape, dtype or x.dtype, {"dim": pos, "wrap": wrap, "what": what})


# -- indexed reads -----------------------------------------------------------------------------


@builtin(aten.gather.default)
def gather(L: Any, node: torch.fx.Node) -> TensorSpec:
    src, dim, index = L.tensor(node.args[0]), node.args[1], _index_tensor(L, L.tensor(node.args[2]), "gather")
    d = _dim(dim, src.ndim)
    shape = L.meta_shape(node)
    return L.emit("gather", (src, index), shape, src.dtype, {"dim": d, "wrap": False, "what": "gather"})


@builtin(aten.index_select.default)
def index_select(L: Any, node: torch.fx.Node) -> TensorSpec:
    x, dim, index = L.tensor(node.args[0]), node.args[1], _index_tensor(L, L.tensor(node.args[2]), "index_select")
    d = _dim(dim, x.ndim)
    flat = index if index.ndim == 1 else TensorSpec((1,), index.dtype, (1,), index.buffer, index.offset)
    return _index_along(L, x, d, flat, wrap=False, what="index_select")


@builtin(aten.embedding.default)
def embedding(L: Any, node: torch.fx.Node) -> TensorSpec:
    weight, indices = L.tensor(node.args[0]), _index_tensor(L, L.tensor(node.args[1]), "embedding")
    flat = _flat_index(L, indices, f"{node.name}_idx")
    out = _index_along(L, weight, 0, flat, wrap=False, what="embedding")
    shape = indices.shape + weight.shape[1:]
    return TensorSpec.dense(out.buffer, shape, out.dtype) if out.shape != shape else out


def _tensor_indices(L: Any, node: torch.fx.Node) -> tuple[int, list[TensorSpec]]:
    """(position of the first indexed dim, the index tensors) of ``x[..., idx0, idx1, ...]``."""
    raw = list(node.args[1])
    positions = [k for k, t in enumerate(raw) if t is not None]
    if not positions:
        raise L.fail("unsupported-op", "indexing with only None", "use unsqueeze")
    if positions != list(range(positions[0], positions[-1] + 1)):
        raise L.fail("unsupported-op", "integer-array indexing of dims that are not next to each other",
                     "index adjacent dims (x[:, i, j]), or permute the tensor first")
    tensors = [L.tensor(raw[k]) for k in positions]
    for t in tensors:
        if t.dtype == "bool":
            raise L.fail("dynamic-shape", "indexing with a boolean mask has a data-dependent output shape",
                         "use torch.where(mask, x, 0) (or multiply by the mask) so shapes stay static")
        _index_tensor(L, t, "x[idx] indexing")
    return positions[0], tensors


def _merged_index(L: Any, x: TensorSpec, pos: int, tensors: list[TensorSpec], *, wrap: bool,
                  what: str) -> tuple[TensorSpec, TensorSpec, tuple[int, ...]]:
    """(x with the indexed dims merged into one, the flat checked linear index, the index shape)."""
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in tensors]))
    sizes = [x.shape[pos + k] for k in range(len(tensors))]
    lin: TensorSpec | None = None
    for t, n in zip(tensors, sizes):
        t = L.broadcast(t, shape)
        j = _checked(L, t, n, wrap=wrap, what=what)
        if lin is None:
            lin = j
        else:
            scaled = L.emit("mul", (lin, n), shape, "int64", base=f"{L.node.name}_lin")
            lin = L.emit("add", (scaled, j), shape, "int64", base=f"{L.node.name}_lin")
    assert lin is not None
    if len(tensors) > 1:
        dx = _dense(L, x, f"{L.node.name}_src")
        merged = x.shape[:pos] + (math.prod(sizes),) + x.shape[pos + len(tensors):]
        x = TensorSpec(merged, dx.dtype, contiguous_strides(merged), dx.buffer, dx.offset)
    flat = _flat_index(L, lin, f"{L.node.name}_flat") if lin.ndim != 1 else lin
    if lin.ndim == 0:
        flat = TensorSpec((1,), lin.dtype, (1,), lin.buffer, lin.offset)
    return x, flat, shape


@builtin(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(L: Any, node: torch.fx.Node) -> TensorSpec:
    """``x[idx]``: integer-array indexing has the static shape ``idx.shape + x.shape[1:]``."""
    x = L.tensor(node.args[0])
    pos, tensors = _tensor_indices(L, node)
    merged, flat, shape = _merged_index(L, x, pos, tensors, wrap=True, what="indexing x[idx]")
    out = _index_along(L, merged, pos, flat, wrap=False, what="indexing x[idx]")
    final = L.meta_shape(node)
    return TensorSpec.dense(out.buffer, final, out.dtype) if out.shape != final else out


# -- indexed writes (deterministic: a reduction over the written positions) -------------------


def _hits(L: Any, flat: TensorSpec, shape: tuple[int, ...], pos: int) -> TensorSpec:
    """bool[shape + (N,)]: ``flat[j] == coordinate pos`` (the one-hot of the written rows)."""
    big = shape + (flat.numel,)
    strides = [0] * len(big)
    strides[-1] = flat.strides[0]
    jv = _strided(flat, big, strides)
    rows = L.emit("iota", (), big, flat.dtype, {"start": 0, "step": 1, "dim": pos}, base=f"{L.node.name}_rows")
    return L.emit("eq", (jv, rows), big, "bool", base=f"{L.node.name}_hit")


def _scatter_sum(L: Any, base: TensorSpec, hit: TensorSpec, vals: TensorSpec, dtype: str) -> TensorSpec:
    big = hit.shape
    picked = L.emit("where", (hit, vals, 0 if dtype in INT_DTYPES else 0.0), big, dtype, base=f"{L.node.name}_pick")
    acc = "float32" if dtype in ("bfloat16", "float16") else dtype
    total = L.emit("sum", (picked,), big[:-1], acc, {"dims": (len(big) - 1,), "keepdim": False},
                   base=f"{L.node.name}_sum")
    return L.emit("add", (base, total), base.shape, dtype)


def _scatter_op(L: Any, base: TensorSpec, index: TensorSpec, values: TensorSpec, dim: int, what: str) -> TensorSpec:
    """One IR ``scatter``: ``base`` with ``values[e]`` written at ``e[dim] = index[e]`` (last write wins)."""
    assert index.shape == values.shape, (index.shape, values.shape)
    return L.emit("scatter", (base, index, values), base.shape, base.dtype, {"dim": dim, "what": what})


@builtin(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(L: Any, node: torch.fx.Node) -> TensorSpec:
    """``x[idx] = v`` / ``x[idx] += v`` (``accumulate``), deterministic (see the module docstring)."""
    x = L.tensor(node.args[0])
    accumulate = bool(node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False))
    pos, tensors = _tensor_indices(L, node)
    what = "index_put x[idx] = v"
    merged, flat, ishape = _merged_index(L, x, pos, tensors, wrap=True, what=what)
    dense_x = merged
    n = flat.numel
    # values broadcast to x[idx]'s shape, then seen as [A..., N, E...]
    vshape = x.shape[:pos] + ishape + x.shape[pos + len(tensors):]
    values = L.operand(node.args[2])
    if not isinstance(values, TensorSpec):
        values = L.emit("fill", (), (), x.dtype, {"value": values}, base=f"{node.name}_v")
    if values.dtype != x.dtype:
        values = L.emit("cast", (values,), values.shape, x.dtype, base=f"{node.name}_vcast")
    values = L.broadcast(values, vshape)
    vdense = _dense(L, values, f"{node.name}_vals") if len(ishape) != 1 else values
    if len(ishape) != 1:
        vflat_shape = x.shape[:pos] + (n,) + x.shape[pos + len(tensors):]
        vdense = TensorSpec(vflat_shape, vdense.dtype, contiguous_strides(vflat_shape), vdense.buffer, vdense.offset)
    if accumulate:
        hit = _hits(L, flat, dense_x.shape, pos)
        big = dense_x.shape + (n,)
        strides = list(vdense.strides[:pos]) + [0] + list(vdense.strides[pos + 1:]) + [vdense.strides[pos]]
        vals = _strided(vdense, big, strides)
        out = _scatter_sum(L, dense_x, hit, vals, x.dtype)
    else:
        istrides = [0] * vdense.ndim
        istrides[pos] = flat.strides[0]
        out = _scatter_op(L, dense_x, _strided(flat, vdense.shape, istrides), vdense, pos, what)
    return TensorSpec.dense(out.buffer, x.shape, x.dtype) if out.shape != x.shape else out


@builtin(aten.index_copy.default)
def index_copy(L: Any, node: torch.fx.Node) -> TensorSpec:
    """``x.index_copy_(dim, index, source)``: ``x[..., index[j], ...] = source[..., j, ...]`` along ``dim``."""
    x, dim, src = L.tensor(node.args[0]), node.args[1], L.tensor(node.args[3])
    index = _index_tensor(L, L.tensor(node.args[2]), "index_copy")
    d = _dim(dim, x.ndim)
    what = "index_copy"
    flat = index if index.ndim == 1 else TensorSpec((1,), index.dtype, (1,), index.buffer, index.offset)
    checked = _checked(L, flat, x.shape[d], wrap=False, what=what)
    vshape = x.shape[:d] + (flat.numel,) + x.shape[d + 1:]
    if src.dtype != x.dtype:
        src = L.emit("cast", (src,), src.shape, x.dtype, base=f"{node.name}_src")
    if src.shape != vshape:  # a 0-d index with a source of x's rank minus one
        src = TensorSpec(vshape, src.dtype, src.strides[:d] + (0,) + src.strides[d:], src.buffer, src.offset) \
            if src.ndim == x.ndim - 1 else L.broadcast(src, vshape)
    istrides = [0] * len(vshape)
    istrides[d] = checked.strides[0]
    return _scatter_op(L, x, _strided(checked, vshape, istrides), src, d, what)


def _scatter_index(L: Any, node: torch.fx.Node) -> tuple[TensorSpec, int, TensorSpec, TensorSpec]:
    """(x, dim, index, the range-checked index) of ``x.scatter*(dim, index, ...)``; the index must
    cover every dim of ``x`` but ``dim``."""
    x, dim, index = L.tensor(node.args[0]), node.args[1], _index_tensor(L, L.tensor(node.args[2]), "scatter")
    d = _dim(dim, x.ndim)
    for k in range(x.ndim):
        if k != d and index.shape[k] != x.shape[k]:
            raise L.fail("unsupported-op", f"scatter with an index of shape {list(index.shape)} into "
                         f"{list(x.shape)}: tkx needs the index to cover every dim but {d}",
                         "expand the index to the output's shape in the other dims")
    checked = L.emit("index_check", (index,), index.shape, index.dtype,
                     {"lo": 0, "hi": x.shape[d], "ignore": None, "what": "scatter"}, base=f"{node.name}_check")
    return x, d, index, checked


def _scatter_common(L: Any, node: torch.fx.Node) -> tuple[TensorSpec, int, TensorSpec, TensorSpec]:
    x, d, index, checked = _scatter_index(L, node)
    big = x.shape + (index.shape[d],)
    strides = list(checked.strides)
    strides[d] = 0
    strides.append(checked.strides[d])
    iv = _strided(checked, big, strides)
    rows = L.emit("iota", (), big, index.dtype, {"start": 0, "step": 1, "dim": d}, base=f"{node.name}_rows")
    hit = L.emit("eq", (iv, rows), big, "bool", base=f"{node.name}_hit")
    return x, d, index, hit


def _src_view(src: TensorSpec, x: TensorSpec, d: int, index: TensorSpec) -> TensorSpec:
    big = x.shape + (index.shape[d],)
    strides = list(src.strides)
    strides[d] = 0
    strides.append(src.strides[d])
    return _strided(src, big, strides)


@builtin(aten.scatter_add.default)
def scatter_add(L: Any, node: torch.fx.Node) -> TensorSpec:
    x, d, index, hit = _scatter_common(L, node)
    src = L.tensor(node.args[3])
    if src.dtype != x.dtype:
        src = L.emit("cast", (src,), src.shape, x.dtype, base=f"{node.name}_src")
    return _scatter_sum(L, x, hit, _src_view(src, x, d, index), x.dtype)


@builtin(aten.scatter.src, aten.scatter.value)
def scatter(L: Any, node: torch.fx.Node) -> TensorSpec:
    if node.kwargs.get("reduce") is not None:
        raise L.fail("unsupported-op", "scatter with reduce=", "use scatter_add (reduce='add') or index_put")
    x, d, index, checked = _scatter_index(L, node)
    src = node.args[3]
    if isinstance(src, torch.fx.Node):
        s = L.tensor(src)
        if s.dtype != x.dtype:
            s = L.emit("cast", (s,), s.shape, x.dtype, base=f"{node.name}_src")
        values = TensorSpec(index.shape, s.dtype, s.strides, s.buffer, s.offset)  # src's leading part
    else:
        fill = L.emit("fill", (), (), x.dtype, {"value": src}, base=f"{node.name}_v")
        values = L.broadcast(fill, index.shape)
    return _scatter_op(L, x, checked, values, d, "scatter")


# -- writing into part of a buffer ----------------------------------------------------------------


@builtin(aten.cat.default)
def cat(L: Any, node: torch.fx.Node) -> TensorSpec:
    shape, dtype = L.meta_shape(node), L.meta_dtype(node)
    d = _dim(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0), len(shape))
    parts = []
    for t in node.args[0]:
        spec = L.tensor(t)
        if spec.numel == 0 and spec.ndim == 1:
            continue  # torch's legacy empty tensors take no part
        if spec.dtype != dtype:
            spec = L.emit("cast", (spec,), spec.shape, dtype, base=f"{node.name}_part")
        parts.append(spec)
    if len(parts) == 1:
        return parts[0]
    return L.emit("cat", tuple(parts), shape, dtype, {"dim": d})


@builtin(aten.slice_scatter.default)
def slice_scatter(L: Any, node: torch.fx.Node) -> TensorSpec:
    base, src = L.tensor(node.args[0]), L.tensor(node.args[1])
    args = list(node.args[2:]) + [None] * 4
    dim = _dim(args[0] if args[0] is not None else node.kwargs.get("dim", 0), base.ndim)
    n = base.shape[dim]
    start = args[1] if args[1] is not None else node.kwargs.get("start")
    end = args[2] if args[2] is not None else node.kwargs.get("end")
    step = args[3] if args[3] is not None else node.kwargs.get("step", 1)
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = max(0, min(start, n)), max(0, min(end, n))
    if src.dtype != base.dtype:
        src = L.emit("cast", (src,), src.shape, base.dtype, base=f"{node.name}_src")
    return L.emit("slice_scatter", (base, src), base.shape, base.dtype,
                  {"dim": dim, "start": start, "end": max(end, start), "step": int(step)})


@builtin(aten.flip.default)
def flip(L: Any, node: torch.fx.Node) -> TensorSpec:
    """``x.flip(dims)``: a gather at ``n - 1 - i`` along each flipped dim (a negative stride is no view)."""
    x = L.tensor(node.args[0])
    for d in sorted({_dim(d, x.ndim) for d in node.args[1]}):
        n = x.shape[d]
        rev = L.emit("iota", (), x.shape, "int64", {"start": n - 1, "step": -1, "dim": d}, base=f"{node.name}_rev")
        x = L.emit("gather", (x, rev), x.shape, x.dtype, {"dim": d, "wrap": False, "what": "flip"})
    return x


#: Ops with no tkx primitive yet, with what to say instead of "not supported".
_NO_PRIMITIVE = {
    "cumsum": "a running sum (cumsum) needs a scan, which tkx has no primitive for yet",
    "cumprod": "a running product (cumprod) needs a scan, which tkx has no primitive for yet",
    "topk": "topk selects data-dependent elements, which tkx has no primitive for yet",
    "sort": "sorting has no tkx primitive yet",
    "argsort": "sorting has no tkx primitive yet",
}


def _no_primitive(L: Any, node: torch.fx.Node) -> TensorSpec:
    short = node.target._overloadpacket.__name__
    raise L.fail("unsupported-op", _NO_PRIMITIVE[short],
                 "compute it outside the step and pass it in, or use amax/amin/where for a single extreme value")


for _name in _NO_PRIMITIVE:
    if hasattr(aten, _name):
        LOWERINGS[getattr(aten, _name)] = _no_primitive


@builtin(torch.ops.tkx.check_index.default)
def check_index(L: Any, node: torch.fx.Node) -> TensorSpec:
    x = L.tensor(node.args[0])
    lo, hi, ignore, what = node.args[1:5]
    return L.emit("index_check", (x,), x.shape, x.dtype, {"lo": int(lo), "hi": int(hi),
                                                          "ignore": None if ignore is None else int(ignore),
                                                          "what": str(what)})


@builtin(torch.ops.tkx.order_key.default)
def order_key(L: Any, node: torch.fx.Node) -> TensorSpec:
    x = L.tensor(node.args[0])
    if x.dtype not in ("float32", "bfloat16", "float16"):
        raise L.fail("bad-input", f"tkx::order_key of a {x.dtype} tensor", "pass a floating tensor")
    return L.emit("order_key", (x,), x.shape, "int64", {})


@builtin(torch.ops.tkx.philox_uniform.default)
def philox_uniform(L: Any, node: torch.fx.Node) -> TensorSpec:
    """``tkx.random``'s draws: one ``philox`` op keyed by the state input (seed, offset) and the counter
    ``base + linear index`` (an int64 ``iota`` seen in the output's shape)."""
    state = L.tensor(node.args[0])
    size, base, word = tuple(int(d) for d in node.args[1]), int(node.args[2]), int(node.args[3])
    if state.dtype != "int64" or state.shape != (2,):
        raise L.fail("bad-input", f"a Philox state of dtype {state.dtype} and shape {list(state.shape)}",
                     "pass an int64 tensor of shape [2] made by tkx.random.philox_state(seed)")
    zeros = (0,) * len(size)
    seed = TensorSpec(size, "int64", zeros, state.buffer, state.offset)
    offset = TensorSpec(size, "int64", zeros, state.buffer, state.offset + state.strides[0])
    n = math.prod(size)
    line = L.emit("iota", (), (n,), "int64", {"start": base, "step": 1, "dim": 0}, base=f"{node.name}_counter")
    counter = TensorSpec(size, "int64", contiguous_strides(size), line.buffer, line.offset)
    return L.emit("philox", (seed, offset, counter), size, "float32", {"word": word})


# -- attention composites (tkx.capture.attention) ------------------------------------------------

from . import attention as _attention  # noqa: E402,F401 (registers torch.ops.tkx.attention*)


def _attention_mask(L: Any, arg: Any) -> tuple[list[TensorSpec], str]:
    if arg is None:
        return [], "none"
    m = L.tensor(arg)
    return [m], "bool" if m.dtype == "bool" else "additive"


def _piece(root: TensorSpec, shape: tuple[int, ...], offset: int) -> TensorSpec:
    return TensorSpec(shape, "float32", contiguous_strides(shape), root.buffer, offset)


def _cast_piece(L: Any, piece: TensorSpec, dtype: str, base: str) -> TensorSpec:
    return piece if dtype == "float32" else L.emit("cast", (piece,), piece.shape, dtype, base=base)


@builtin(torch.ops.tkx.attention.default)
def attention(L: Any, node: torch.fx.Node) -> tuple[TensorSpec, TensorSpec]:
    """One ``attention`` op (a float32 root ``[out | lse]``); out is cast to q's dtype."""
    q, k, v = (L.tensor(a) for a in node.args[:3])
    extra, mask = _attention_mask(L, node.args[3])
    causal, scale = bool(node.args[4]), float(node.args[5])
    lead, n_q, n_v = q.shape[:-2], q.shape[-2], v.shape[-1]
    n_out = math.prod(lead) * n_q * n_v
    attrs = {"causal": causal, "scale": scale, "mask": mask}
    if mask != "none" and node.args[6] == "nan":  # a row masked whole is NaN, as hand-written attention in eager
        attrs["empty_rows"] = "nan"
    root = L.emit("attention", (q, k, v, *extra), (n_out + math.prod(lead) * n_q,), "float32", attrs)
    out = _cast_piece(L, _piece(root, (*lead, n_q, n_v), 0), q.dtype, f"{node.name}_out")
    return out, _piece(root, (*lead, n_q), n_out)


@builtin(torch.ops.tkx.attention_backward.default)
def attention_backward(L: Any, node: torch.fx.Node) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    """One ``attention_backward`` op (a float32 root ``[dq | dk | dv]``), each cast to its input's dtype."""
    q, k, v = (L.tensor(a) for a in node.args[:3])
    extra, mask = _attention_mask(L, node.args[3])
    out, lse, dout = (L.tensor(a) for a in node.args[4:7])
    causal, scale = bool(node.args[7]), float(node.args[8])
    sizes = [q.numel, k.numel, v.numel]
    root = L.emit("attention_backward", (q, k, v, out, lse, dout, *extra), (sum(sizes),), "float32",
                  {"causal": causal, "scale": scale, "mask": mask})
    grads, offset = [], 0
    for name, x, n in (("dq", q, sizes[0]), ("dk", k, sizes[1]), ("dv", v, sizes[2])):
        grads.append(_cast_piece(L, _piece(root, x.shape, offset), x.dtype, f"{node.name}_{name}"))
        offset += n
    return tuple(grads)
