"""Convolution and pooling written with gathers and matmuls (``F.conv2d``, ``F.max_pool2d``, ``F.avg_pool2d``).

:mod:`tkx.capture.decompositions` swaps these in for the torch functions while tracing (its
``FUNCTION_OVERRIDES``): im2col by two ``index_select`` gathers of the padded input, then one matmul
(a batched one over the groups of a grouped convolution); pooling reduces the gathered windows.
Autograd differentiates the gathers (a deterministic scatter-add) and the matmuls. Shapes follow
``torch.nn.functional``: ``[N, C, H, W]`` (or ``[C, H, W]``) in, ``[N, C', OH, OW]`` out.
"""

from __future__ import annotations

from typing import Any

import torch


def refuse(what: str, hint: str) -> None:
    """Raise :class:`~tkx.errors.UnsupportedError` from inside an override, naming the user's line
    (the tag that the tracing mode set before calling the override)."""
    from torch.fx import traceback as fx_traceback

    from ..errors import UnsupportedError

    tag = (fx_traceback.current_meta.get("custom") or {}).get("tkx", {})
    raise UnsupportedError("unsupported-op", what, source=tag.get("source"), hint=hint)


def _pair(v: Any, what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(a, int) for a in v):
        return int(v[0]), int(v[1])
    if isinstance(v, (tuple, list)) and len(v) == 1 and isinstance(v[0], int):
        return int(v[0]), int(v[0])
    refuse(f"{what}={v!r}", f"give {what} as an int or a pair of ints")
    raise AssertionError  # unreachable


def _pad2d(x: torch.Tensor, top: int, bottom: int, left: int, right: int, value: float) -> torch.Tensor:
    """``x [..., H, W]`` padded with ``value`` by concatenation (no pad op needed)."""
    if top or bottom:
        parts = [x.new_full((*x.shape[:-2], top, x.shape[-1]), value)] if top else []
        parts += [x] + ([x.new_full((*x.shape[:-2], bottom, x.shape[-1]), value)] if bottom else [])
        x = torch.cat(parts, dim=-2)
    if left or right:
        parts = [x.new_full((*x.shape[:-1], left), value)] if left else []
        parts += [x] + ([x.new_full((*x.shape[:-1], right), value)] if right else [])
        x = torch.cat(parts, dim=-1)
    return x


def _windows(x: torch.Tensor, k: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]
             ) -> torch.Tensor:
    """im2col by two gathers: padded ``x [N, C, H, W]`` -> ``[N, C, OH, KH, OW, KW]`` with
    ``out[n, c, i, a, j, b] = x[n, c, i * sh + a * dh, j * sw + b * dw]``."""
    n, c, h, w = x.shape
    oh = (h - dilation[0] * (k[0] - 1) - 1) // stride[0] + 1
    ow = (w - dilation[1] * (k[1] - 1) - 1) // stride[1] + 1
    if oh <= 0 or ow <= 0:
        refuse(f"a window of {k} (dilation {dilation}) larger than the padded input {list(x.shape[-2:])}",
                "use a smaller kernel or more padding")
    rows = (torch.arange(oh, device=x.device) * stride[0])[:, None] + (torch.arange(k[0], device=x.device)
                                                                      * dilation[0])[None, :]
    cols = (torch.arange(ow, device=x.device) * stride[1])[:, None] + (torch.arange(k[1], device=x.device)
                                                                      * dilation[1])[None, :]
    y = torch.index_select(x, 2, rows.reshape(-1))
    y = torch.index_select(y, 3, cols.reshape(-1))
    return y.reshape(n, c, oh, k[0], ow, k[1])


def conv2d_math(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                padding: Any = 0, dilation: Any = 1, groups: int = 1) -> torch.Tensor:
    """``F.conv2d`` as im2col (two index gathers of the zero-padded input) and one matmul.

    ``input [N, C, H, W]`` (or ``[C, H, W]``), ``weight [O, C / groups, KH, KW]``, ``bias [O]`` ->
    ``[N, O, OH, OW]``. Autograd differentiates the gathers (grad input: a deterministic
    scatter-add) and the matmul (grad weight). ``padding`` may be ints, a pair, ``"valid"`` or
    ``"same"``. ``groups > 1`` (grouped and depthwise convolution): one batched matmul over the
    groups, group ``g`` reading input channels ``g C / groups ..`` and writing output channels
    ``g O / groups ..``, as ``F.conv2d``. Channels that ``groups`` does not divide raise
    :class:`~tkx.errors.UnsupportedError`.
    """
    if groups < 1 or input.shape[-3] % groups or weight.shape[0] % groups:
        refuse(f"conv2d with groups={groups}: {input.shape[-3]} input and {weight.shape[0]} output channels",
               "make groups divide both channel counts (torch refuses it too)")
    if input.dim() == 3:
        return conv2d_math(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    k = (weight.shape[2], weight.shape[3])
    s, d = _pair(stride, "stride"), _pair(dilation, "dilation")
    if padding == "valid":
        pads = (0, 0, 0, 0)
    elif padding == "same":
        th, tw = d[0] * (k[0] - 1), d[1] * (k[1] - 1)
        pads = (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    else:
        ph, pw = _pair(padding, "padding")
        pads = (ph, ph, pw, pw)
    xp = _pad2d(input, *pads, 0.0)
    win = _windows(xp, k, s, d)                                     # [N, C, OH, KH, OW, KW]
    n, c, oh, _, ow, _ = win.shape
    o = weight.shape[0]
    if groups == 1:
        cols = win.permute(0, 2, 4, 1, 3, 5).reshape(n * oh * ow, c * k[0] * k[1])
        out = cols @ weight.reshape(o, -1).t()                          # [N*OH*OW, O]
    else:
        g = groups
        cols = win.reshape(n, g, c // g, oh, k[0], ow, k[1]).permute(1, 0, 3, 5, 2, 4, 6)
        cols = cols.reshape(g, n * oh * ow, (c // g) * k[0] * k[1])
        out = torch.bmm(cols, weight.reshape(g, o // g, -1).transpose(1, 2))  # [G, N*OH*OW, O/G]
        out = out.permute(1, 0, 2).reshape(n * oh * ow, o)
    if bias is not None:
        out = out + bias
    return out.reshape(n, oh, ow, o).permute(0, 3, 1, 2)


def _ceil_extra(size: int, k: int, s: int, p: int, d: int) -> int:
    """Rows past the padded input that ``ceil_mode=True`` adds on the far side: torch rounds the
    window count up but drops a last window that would start in the right-hand padding."""
    span = size + 2 * p - d * (k - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + p:
        out -= 1
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))


def _pool_windows(x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                  ceil_mode: bool, pad_value: float, what: str, ceil_value: float | None = None
                  ) -> torch.Tensor:
    """``[N, C, OH, OW, KH * KW]`` windows of ``x [N, C, H, W]``, padded with ``pad_value``; with
    ``ceil_mode`` the windows that run past the padded input see ``ceil_value`` there (default
    ``pad_value``)."""
    k = _pair(kernel_size, "kernel_size")
    s = k if stride is None or stride == [] or stride == () else _pair(stride, "stride")
    p, d = _pair(padding, "padding"), _pair(dilation, "dilation")
    xp = _pad2d(x, p[0], p[0], p[1], p[1], pad_value)
    if ceil_mode:
        eh = _ceil_extra(x.shape[-2], k[0], s[0], p[0], d[0])
        ew = _ceil_extra(x.shape[-1], k[1], s[1], p[1], d[1])
        xp = _pad2d(xp, 0, eh, 0, ew, pad_value if ceil_value is None else ceil_value)
    win = _windows(xp, k, s, d)
    n, c, oh, kh, ow, kw = win.shape
    return win.permute(0, 1, 2, 4, 3, 5).reshape(n, c, oh, ow, kh * kw)


def max_pool2d_math(input: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                    dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """``F.max_pool2d`` as a max over gathered windows (``-inf`` padding). The gradient goes to the
    first maximum of each window in row-major window order, as eager's. ``return_indices=True``
    returns flat indices into each ``H x W`` plane, as eager. ``ceil_mode=True`` rounds the window
    count up as torch does (the extra windows see ``-inf`` past the input)."""
    squeeze = input.dim() == 3
    x = input.unsqueeze(0) if squeeze else input
    win = _pool_windows(x, kernel_size, stride, padding, dilation, ceil_mode, float("-inf"), "max_pool2d")
    values, arg = win.max(dim=-1)
    if squeeze:
        values = values.squeeze(0)
    if not return_indices:
        return values
    k = _pair(kernel_size, "kernel_size")
    s = k if stride is None or stride == [] or stride == () else _pair(stride, "stride")
    p, d = _pair(padding, "padding"), _pair(dilation, "dilation")
    oh, ow = arg.shape[-2], arg.shape[-1]
    row = (torch.arange(oh, device=x.device) * s[0] - p[0])[:, None] + (arg // k[1]) * d[0]
    col = (torch.arange(ow, device=x.device) * s[1] - p[1])[None, :] + (arg % k[1]) * d[1]
    idx = row * x.shape[-1] + col
    return values, (idx.squeeze(0) if squeeze else idx)


def avg_pool2d_math(input: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                    ceil_mode: bool = False, count_include_pad: bool = True,
                    divisor_override: int | None = None) -> torch.Tensor:
    """``F.avg_pool2d`` as a mean over gathered windows: the zero padding counted (the default), or with
    ``count_include_pad=False`` the sum divided by the number of the window's elements inside the input
    (the same windows gathered from a plane of ones, a constant of the step); ``divisor_override``
    divides by that number instead. ``ceil_mode=True`` rounds the window count up as torch does; a
    window running past the padded input divides by its elements inside it, as eager."""
    squeeze = input.dim() == 3
    x = input.unsqueeze(0) if squeeze else input
    win = _pool_windows(x, kernel_size, stride, padding, 1, ceil_mode, 0.0, "avg_pool2d")
    if divisor_override:
        out = win.sum(-1) / divisor_override
    elif (count_include_pad or _pair(padding, "padding") == (0, 0)) and not ceil_mode:
        out = win.mean(-1)
    else:
        # the divisor of each window: its elements inside the input (count_include_pad=False), or inside
        # the padded input (a ceil_mode window is not charged for what runs past it), as eager counts
        ones = torch.ones(x.shape[-2:], dtype=x.dtype, device=x.device).expand(1, 1, *x.shape[-2:])
        count = _pool_windows(ones, kernel_size, stride, padding, 1, ceil_mode, float(count_include_pad),
                              "avg_pool2d", ceil_value=0.0).sum(-1)
        out = win.sum(-1) / count
    return out.squeeze(0) if squeeze else out


def _single(v: Any, what: str) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 1 and isinstance(v[0], int):
        return int(v[0])
    refuse(f"{what}={v!r}", f"give {what} as an int")
    raise AssertionError  # unreachable


def conv1d_math(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                padding: Any = 0, dilation: Any = 1, groups: int = 1) -> torch.Tensor:
    """``F.conv1d`` (``nn.Conv1d``) as :func:`conv2d_math` over a height of one: ``input [N, C, L]`` (or
    ``[C, L]``), ``weight [O, C / groups, K]``, ``bias [O]`` -> ``[N, O, OL]``; ``padding`` may be an
    int, ``"valid"`` or ``"same"``."""
    pad = padding if isinstance(padding, str) else (0, _single(padding, "padding"))
    out = conv2d_math(input.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, _single(stride, "stride")), pad,
                      (1, _single(dilation, "dilation")), groups)
    return out.squeeze(-2)


def _stride1d(kernel_size: Any, stride: Any) -> int:
    return _single(kernel_size, "kernel_size") if stride is None or stride == [] or stride == () \
        else _single(stride, "stride")


def max_pool1d_math(input: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                    dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """``F.max_pool1d`` (``nn.MaxPool1d``) as :func:`max_pool2d_math` over a height of one:
    ``[N, C, L]`` (or ``[C, L]``) -> ``[N, C, OL]``; ``return_indices=True`` also gives indices into
    ``L``, as eager."""
    out = max_pool2d_math(input.unsqueeze(-2), (1, _single(kernel_size, "kernel_size")),
                          (1, _stride1d(kernel_size, stride)), (0, _single(padding, "padding")),
                          (1, _single(dilation, "dilation")), ceil_mode, return_indices)
    if return_indices:
        return out[0].squeeze(-2), out[1].squeeze(-2)
    return out.squeeze(-2)


def avg_pool1d_math(input: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                    ceil_mode: bool = False, count_include_pad: bool = True) -> torch.Tensor:
    """``F.avg_pool1d`` (``nn.AvgPool1d``) as :func:`avg_pool2d_math` over a height of one:
    ``[N, C, L]`` (or ``[C, L]``) -> ``[N, C, OL]``."""
    return avg_pool2d_math(input.unsqueeze(-2), (1, _single(kernel_size, "kernel_size")),
                           (1, _stride1d(kernel_size, stride)), (0, _single(padding, "padding")),
                           ceil_mode, count_include_pad).squeeze(-2)


def _spread(x: torch.Tensor, dim: int, s: int) -> torch.Tensor:
    """``s - 1`` zeros between neighbours along ``dim`` (size ``L`` -> ``(L - 1) s + 1``), by concatenation."""
    if s == 1:
        return x
    zeros = torch.zeros_like(x.unsqueeze(dim + 1)).expand(*x.shape[:dim + 1], s - 1, *x.shape[dim + 1:])
    y = torch.cat([x.unsqueeze(dim + 1), zeros], dim=dim + 1).flatten(dim, dim + 1)
    return y.narrow(dim, 0, (x.shape[dim] - 1) * s + 1)


def _pad_or_crop(x: torch.Tensor, dim: int, before: int, after: int) -> torch.Tensor:
    if before < 0:
        x, before = x.narrow(dim, -before, x.shape[dim] + before), 0
    if after < 0:
        x, after = x.narrow(dim, 0, x.shape[dim] + after), 0
    if before or after:
        shape = list(x.shape)
        parts = []
        if before:
            parts.append(x.new_zeros(shape[:dim] + [before] + shape[dim + 1:]))
        parts.append(x)
        if after:
            parts.append(x.new_zeros(shape[:dim] + [after] + shape[dim + 1:]))
        x = torch.cat(parts, dim=dim)
    return x


def conv_transpose2d_math(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                          stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                          dilation: Any = 1) -> torch.Tensor:
    """``F.conv_transpose2d`` (``nn.ConvTranspose2d``) as a convolution: the input spread by the stride
    (zeros between its elements), padded by ``dilation (k - 1) - padding`` (cropped where that is
    negative) plus ``output_padding`` at the end, convolved by :func:`conv2d_math` with the kernel
    flipped and its two channel axes swapped per group. ``input [N, C, H, W]`` (or ``[C, H, W]``),
    ``weight [C, O / groups, KH, KW]``, ``bias [O]`` -> ``[N, O, (H - 1) s - 2 p + d (KH - 1) + op + 1, ...]``."""
    if input.dim() == 3:
        return conv_transpose2d_math(input.unsqueeze(0), weight, bias, stride, padding, output_padding, groups,
                                     dilation).squeeze(0)
    if groups < 1 or input.shape[1] % groups or weight.shape[0] != input.shape[1]:
        refuse(f"conv_transpose2d with groups={groups}: {input.shape[1]} input channels and a weight of "
               f"{list(weight.shape)}", "give a weight [C, O / groups, KH, KW] whose C groups divides (torch refuses "
                                        "it too)")
    s, p = _pair(stride, "stride"), _pair(padding, "padding")
    op, d = _pair(output_padding, "output_padding"), _pair(dilation, "dilation")
    k = (weight.shape[2], weight.shape[3])
    x = _spread(_spread(input, 2, s[0]), 3, s[1])
    for dim, i in ((2, 0), (3, 1)):
        edge = d[i] * (k[i] - 1) - p[i]
        x = _pad_or_crop(x, dim, edge, edge + op[i])
    c, og = weight.shape[0], weight.shape[1]
    w = weight.flip(2, 3).reshape(groups, c // groups, og, *k).transpose(1, 2).reshape(groups * og, c // groups, *k)
    return conv2d_math(x, w, bias, 1, 0, d, groups)


def conv_transpose1d_math(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                          stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                          dilation: Any = 1) -> torch.Tensor:
    """``F.conv_transpose1d`` as :func:`conv_transpose2d_math` over a height of one: ``[N, C, L]`` ->
    ``[N, O, OL]``."""
    return conv_transpose2d_math(input.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, _single(stride, "stride")),
                                 (0, _single(padding, "padding")), (0, _single(output_padding, "output_padding")),
                                 groups, (1, _single(dilation, "dilation"))).squeeze(-2)
