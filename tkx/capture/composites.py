"""Torch functions whose own kernels tkx cannot lower, written with ops it can, for tracing.

:mod:`tkx.capture.decompositions` swaps these in (its ``FUNCTION_OVERRIDES`` and decomposition
table): autograd then differentiates the ops written here, so no backward kernel of the original
(``upsample_nearest2d_backward``, ``_weight_norm_interface_backward``) is needed.

* ``F.interpolate`` with ``mode="nearest"``, ``"nearest-exact"``, ``"bilinear"`` or ``"bicubic"`` on
  ``[N, C, H, W]``: torch's own decompositions (index gathers, and weighted sums of gathers).
* ``torch._weight_norm`` (``nn.utils.parametrizations.weight_norm``): ``v * (g / ||v||)``, the norm over
  every dimension but ``dim``.
* ``nn.LSTM``, ``nn.GRU``, ``nn.RNN``: cells of matmuls and pointwise math, with oneDNN's and cuDNN's
  fused layers (``mkldnn_rnn_layer``, chosen on the CPU when the input needs no gradient; ``_cudnn_rnn``)
  off while they trace.
* ``F.adaptive_avg_pool2d`` for any output size: torch's decomposition (masked gathered windows).
* ``scatter_reduce`` with ``"sum"``/``"mean"``: scatter-adds.
* Integer division rounding toward zero (``torch.div(a, b, rounding_mode="trunc")`` on integers, as
  ``adaptive_avg_pool2d``'s decomposition computes its window bounds): floor division corrected
  where the signs differ and the division is inexact.
"""

from __future__ import annotations

from typing import Any

import contextlib
from collections.abc import Callable, Iterator

import torch

aten = torch.ops.aten

_F = torch.nn.functional
_INTERPOLATE = _F.interpolate
_ADAPTIVE_AVG_POOL2D = _F.adaptive_avg_pool2d


def _torch_decomposition(op: torch._ops.OpOverload) -> Any:
    from torch._decomp import decomposition_table
    return decomposition_table[op]


def upsample_nearest2d(input: torch.Tensor, output_size: Any, scale_factors: Any) -> torch.Tensor:
    """``torch._C._nn.upsample_nearest2d`` (``F.interpolate(mode="nearest")``): ``[N, C, H, W]`` ->
    ``[N, C, OH, OW]`` by index gathers."""
    return _torch_decomposition(aten.upsample_nearest2d.vec)(input, output_size, scale_factors)


def upsample_nearest_exact2d(input: torch.Tensor, output_size: Any, scale_factors: Any) -> torch.Tensor:
    """``torch._C._nn._upsample_nearest_exact2d`` (``mode="nearest-exact"``), as :func:`upsample_nearest2d`."""
    return _torch_decomposition(aten._upsample_nearest_exact2d.vec)(input, output_size, scale_factors)


def upsample_bicubic2d(input: torch.Tensor, output_size: Any, align_corners: bool, scale_factors: Any
                       ) -> torch.Tensor:
    """``torch._C._nn.upsample_bicubic2d`` (``mode="bicubic"``): each output a weighted sum of 16
    gathered inputs."""
    return _torch_decomposition(aten.upsample_bicubic2d.vec)(input, output_size, align_corners, scale_factors)


def upsample_bilinear2d(input: torch.Tensor, output_size: Any, align_corners: bool, scale_factors: Any
                        ) -> torch.Tensor:
    """``torch._C._nn.upsample_bilinear2d`` (``mode="bilinear"``): ``[N, C, H, W]`` -> ``[N, C, OH, OW]``,
    each output a weighted sum of four gathered inputs."""
    return _torch_decomposition(aten.upsample_bilinear2d.vec)(input, output_size, align_corners, scale_factors)


@contextlib.contextmanager
def _nn_swapped(swaps: dict[str, Callable]) -> Iterator[None]:
    """``torch._C._nn.NAME`` replaced by ``swaps[NAME]`` inside the block: ``torch.nn.functional``
    calls them below the level tkx intercepts (a call inside an intercepted function is not seen)."""
    saved = {name: getattr(torch._C._nn, name) for name in swaps}
    try:
        for name, fn in swaps.items():
            setattr(torch._C._nn, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch._C._nn, name, fn)


def interpolate(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``F.interpolate`` with its 2-d nearest, nearest-exact, bilinear and bicubic kernels written as gathers
    (:func:`upsample_nearest2d`, :func:`upsample_bilinear2d`); other modes reach their own ops."""
    with _nn_swapped({"upsample_nearest2d": upsample_nearest2d, "_upsample_nearest_exact2d": upsample_nearest_exact2d,
                      "upsample_bilinear2d": upsample_bilinear2d, "upsample_bicubic2d": upsample_bicubic2d}):
        return _INTERPOLATE(*args, **kwargs)


def adaptive_avg_pool2d(input: torch.Tensor, output_size: Any) -> torch.Tensor:
    """``F.adaptive_avg_pool2d``: ``[N, C, H, W]`` (or ``[C, H, W]``) -> ``[..., OH, OW]``, torch's
    decomposition (windows of varying size, gathered and masked, summed and divided by their size),
    whatever sizes the output divides."""
    def pool(x: torch.Tensor, size: Any) -> torch.Tensor:
        size = (size, size) if isinstance(size, int) else tuple(size)
        return _torch_decomposition(aten._adaptive_avg_pool2d.default)(x, size)
    with _nn_swapped({"adaptive_avg_pool2d": pool}):
        return _ADAPTIVE_AVG_POOL2D(input, output_size)


def weight_norm(v: torch.Tensor, g: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``torch._weight_norm``: ``v * (g / ||v||)``, the 2-norm of ``v`` over every dimension but ``dim``
    (kept as size 1, the shape of ``g``); ``dim=-1`` normalises by the norm of the whole tensor."""
    if dim == -1:
        return v * (g / torch.linalg.vector_norm(v))
    dim = dim % v.dim()
    others = [d for d in range(v.dim()) if d != dim]
    return v * (g / torch.linalg.vector_norm(v, dim=others, keepdim=True))


def _unfused_rnn(fn: Callable) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        mkldnn, cudnn = torch._C._get_mkldnn_enabled(), torch._C._get_cudnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        torch._C._set_cudnn_enabled(False)
        try:
            return fn(*args, **kwargs)
        finally:
            torch._C._set_mkldnn_enabled(mkldnn)
            torch._C._set_cudnn_enabled(cudnn)
    run.__doc__ = (f"``torch.{fn.__name__}`` with oneDNN's and cuDNN's fused layers (``mkldnn_rnn_layer``, "
                   "``_cudnn_rnn``) off while it traces: torch then writes the cells with matmuls and pointwise math.")
    return run


#: ``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``, ``torch.rnn_relu`` (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``)
#: without the fused library layers.
RNN_OVERRIDES: dict[Callable, Callable] = {f: _unfused_rnn(f) for f in (torch.lstm, torch.gru, torch.rnn_tanh,
                                                                         torch.rnn_relu)}


def div_mode(a: Any, b: Any, *, rounding_mode: str | None = None) -> Any:
    """``aten.div.Tensor_mode``: integer division rounding toward zero as floor division plus one where
    the quotient is inexact and negative; every other case is left to the op (``NotImplemented``)."""
    ints = [x for x in (a, b) if isinstance(x, torch.Tensor)]
    if rounding_mode != "trunc" or not ints or any(x.is_floating_point() or x.is_complex() for x in ints) \
            or isinstance(a, float) or isinstance(b, float):
        return NotImplemented
    q = torch.div(a, b, rounding_mode="floor")
    inexact = (q * b) != a
    negative = (a < 0) != (b < 0)
    return torch.where(inexact & negative, q + 1, q)


def scatter_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *,
                   include_self: bool = True) -> Any:
    """``aten.scatter_reduce.two`` with ``reduce="sum"`` (or ``"mean"`` on floats) as deterministic
    scatter-adds (``include_self=False``: the positions any index reaches start from zero, as eager);
    ``"amax"``, ``"amin"``, ``"prod"`` and an integer mean are left to the op (``NotImplemented``)."""
    if reduce not in ("sum", "mean") or (reduce == "mean" and not x.is_floating_point()):
        return NotImplemented
    hits = torch.zeros_like(x).scatter_add(dim, index, torch.ones_like(src))
    base = x if include_self else torch.where(hits > 0, torch.zeros_like(x), x)
    out = base.scatter_add(dim, index, src)
    if reduce == "mean":
        count = hits + 1 if include_self else hits
        out = torch.where(count > 0, out / count.clamp(min=1), out)
    return out
