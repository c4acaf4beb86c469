"""The curated decomposition table used by :func:`tkx.capture`.

Most entries come straight from :mod:`torch._decomp`; they rewrite composite losses,
activations, normalisations, norms, splits and the backward of slicing into the primitive
set of the op table (:mod:`tkx.ops`). tkx's own entries:

* ``nll_loss_forward``/``nll_loss_backward`` with a one-hot mask (``iota == target``), the
  target checked first (``tkx::check_index``: a class outside ``[0, C)`` that is not
  ``ignore_index`` raises, as eager does); with every target ignored the gradient is zero
  (eager's behaviour), not NaN;
* ``max.dim``/``min.dim``/``argmax``/``argmin`` as two reductions (the extreme value, then
  the first index holding it; NaN counts as the maximum, as in torch);
* ``var``/``var_mean``/``std`` with ``correction``, ``_foreach_norm``, ``any``/``all``,
  ``pow.Scalar`` with a positive constant base;
* ``F.scaled_dot_product_attention`` without dropout becomes the ``tkx::attention`` composite
  (:mod:`tkx.capture.attention`; the scheduler expands it to :func:`attention_math` or fuses it);
* ``F.one_hot`` (a composite op that torch decomposes before any table sees it) is replaced
  at the ``__torch_function__`` level (:data:`FUNCTION_OVERRIDES`) by a version that checks
  its labels.

Add your own with :func:`register_decomposition` (a notebook cell can), e.g. for an op that
lowering rejects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import get_decompositions

from .attention import sdpa_composite
from . import composites
from .convolution import (avg_pool1d_math, avg_pool2d_math, conv1d_math, conv2d_math, conv_transpose1d_math,
                          conv_transpose2d_math, max_pool1d_math, max_pool2d_math)
from .convolution import refuse as _refuse

aten = torch.ops.aten

#: Composite ops decomposed by torch's own rules (``torch._decomp``).
TORCH_DECOMPOSED = [
    aten._log_softmax, aten._log_softmax_backward_data,
    aten._softmax, aten._softmax_backward_data,
    aten.mse_loss, aten.mse_loss_backward,
    aten.gelu, aten.gelu_backward,
    aten.silu, aten.silu_backward,
    aten.sigmoid_backward, aten.tanh_backward,
    aten.native_layer_norm, aten.native_layer_norm_backward,
    aten.threshold_backward,
    aten.addcmul, aten.addcdiv, aten.lerp,
    aten.hardtanh, aten.hardtanh_backward,
    aten.leaky_relu, aten.leaky_relu_backward,
    aten.softplus, aten.softplus_backward,
    aten.elu, aten.elu_backward,
    aten.rsub, aten.square, aten.clamp_min, aten.clamp_max,
    aten.l1_loss, aten.smooth_l1_loss, aten.smooth_l1_loss_backward,
    aten.huber_loss, aten.huber_loss_backward,
    aten.binary_cross_entropy_with_logits,
    aten.logsumexp,
    # splitting, stacking and the backward of views
    aten.stack, aten.split.Tensor, aten.split_with_sizes, aten.unbind.int,
    aten.slice_backward, aten.select_backward, aten.diagonal_backward, aten.select_scatter,
    # norms, masks, losses, products
    aten.linalg_vector_norm, aten.norm.ScalarOpt_dim, aten.tril, aten.triu,
    aten._fused_rms_norm, aten._fused_rms_norm_backward,  # F.rms_norm on CUDA (torch 2.11)
    aten.binary_cross_entropy, aten.binary_cross_entropy_backward,
    aten._unsafe_index, aten.isposinf, aten.isneginf,
    aten.dot, aten.mv, aten.addmv, aten.baddbmm, aten.nan_to_num, aten.logit, aten.frac,
    aten.rad2deg, aten.deg2rad, aten.logaddexp, aten.hypot, aten.clamp.Tensor, aten.aminmax,
    aten.hardswish, aten.hardswish_backward, aten.hardsigmoid, aten.hardsigmoid_backward, aten.mish,
    aten.log_sigmoid_forward, aten.log_sigmoid_backward, aten.index_add,
    # layout shuffles
    aten.roll, aten.repeat, aten.constant_pad_nd, aten.narrow_copy,
    # BatchNorm: batch statistics in training (the running stats updated by functionalization's copy_),
    # running statistics in eval, and the backward
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit_functional, aten._batch_norm_with_update,
    aten._batch_norm_with_update_functional, aten._batch_norm_no_update, aten.native_batch_norm_backward,
    aten.batch_norm_backward,
    # cuDNN's BatchNorm, which batch norm reaches under autograd on CUDA (as native_batch_norm, and its backward)
    aten.cudnn_batch_norm, aten.cudnn_batch_norm_backward,
    # GroupNorm (nn.GroupNorm, F.group_norm) and its backward
    aten.native_group_norm, aten.native_group_norm_backward,
    # recurrent layers (nn.LSTM, nn.GRU: cells of matmuls and pointwise math; GRU's gates by unsafe_split)
    aten.gru.input, aten.unsafe_split, aten.unsafe_split_with_sizes,
    # parametrizations and activations written in Python by torch
    aten._prelu_kernel, aten._prelu_kernel_backward, aten.mish_backward,
    # constants, padding, resampling and patches (gathers and masks)
    aten.eye, aten.reflection_pad2d, aten.reflection_pad2d_backward, aten.replication_pad2d,
    aten.upsample_nearest2d, aten._upsample_nearest_exact2d, aten.upsample_bilinear2d,
    aten._adaptive_avg_pool2d, aten.im2col, aten.col2im,
    aten._unsafe_masked_index, aten._unsafe_masked_index_put_accumulate, aten.upsample_bicubic2d,
    aten.pixel_shuffle, aten.pixel_unshuffle, aten.glu, aten.glu_backward, aten.vdot,
]

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


@torch.library.custom_op("tkx::check_index", mutates_args=())
def check_index(x: torch.Tensor, lo: int, hi: int, ignore: int | None, what: str) -> torch.Tensor:
    """``x`` itself after checking ``lo <= x < hi`` (or ``x == ignore``) for every element.

    Lowered to the IR op ``index_check``: the kernel sets its error word, both interpreters
    raise :class:`tkx.errors.KernelError`. In eager it raises ``IndexError``.
    """
    bad = (x < lo) | (x >= hi)
    if ignore is not None:
        bad &= x != ignore
    if bool(bad.any()):
        raise IndexError(f"{what}: index {int(x[bad].reshape(-1)[0])} is out of range [{lo}, {hi})")
    return x.clone()


@check_index.register_fake
def _check_index_fake(x, lo, hi, ignore, what):
    return torch.empty_like(x)


@torch.library.custom_op("tkx::order_key", mutates_args=())
def order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys of float ``x`` ordered as ``torch.max`` compares (see :func:`tkx.ops.order_key`).

    Lowered to the IR op ``order_key``; argmax, ``max.dim`` and ``max_pool2d`` pack it with the
    position so that one exact integer ``amax`` gives the first maximum.
    """
    from ..ops import order_key as keys
    return keys(x)


@order_key.register_fake
def _order_key_fake(x):
    return torch.empty(x.shape, dtype=torch.int64, device=x.device)


def checked_one_hot(labels: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``F.one_hot`` whose labels are checked against ``[0, num_classes)`` first."""
    if num_classes < 0:
        raise NotImplementedError("one_hot without num_classes (the class count would depend on the data)")
    labels = torch.ops.tkx.check_index(labels, 0, num_classes, None, "one_hot")
    return (labels.unsqueeze(-1) == torch.arange(num_classes, device=labels.device)).to(torch.int64)



def attention_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False, dropout: Callable | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` written out: ``softmax(q @ k^T * scale + mask) @ v``.

    Shapes: ``query [..., L, E]``, ``key [..., S, E]``, ``value [..., S, Ev]`` -> ``[..., L, Ev]``
    (leading dims broadcast). ``scale`` defaults to ``1 / sqrt(E)``; ``is_causal`` keeps key ``j``
    for query ``i`` when ``j <= i`` (the top-left aligned lower triangle, as torch); a boolean
    ``attn_mask`` keeps the positions where it is True, a float one is added to the scores.
    ``dropout_p > 0`` drops attention probabilities with ``dropout(probs, dropout_p)``, which
    :func:`tkx.random.philox` passes (its in-step Philox generator); without it, it raises
    :class:`~tkx.errors.UnsupportedError`. A query row with every key masked gives zeros and zero
    gradients, as torch 2.13's default and math backends do (their "safe" softmax). ``enable_gqa`` raises
    :class:`~tkx.errors.UnsupportedError`.
    """
    import math

    if enable_gqa:
        _refuse("scaled_dot_product_attention(enable_gqa=True)",
                "repeat the key/value heads with k.repeat_interleave(groups, dim=-3) first")
    if is_causal and attn_mask is not None:
        _refuse("scaled_dot_product_attention with both is_causal=True and attn_mask (torch refuses it too)",
                "fold the causal mask into attn_mask (attn_mask & torch.ones(L, S, dtype=torch.bool).tril())")
    n_q, n_k = query.shape[-2], key.shape[-2]
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = (query @ key.transpose(-2, -1)) * s
    if is_causal:
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    if attn_mask is None:
        probs = torch.softmax(scores, dim=-1)
    else:  # a row that sees no key: softmax of zeros (finite), then 0; no NaN in the forward or the backward
        empty = (scores == float("-inf")).all(dim=-1, keepdim=True)
        probs = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if dropout_p > 0.0:
        if dropout is None:
            _refuse("scaled_dot_product_attention(dropout_p > 0) outside a tkx.random.philox(state) block",
                    "draw the dropout inside `with tkx.random.philox(state):` (see tkx.random), or pass dropout_p=0")
        probs = dropout(probs, dropout_p)
    return probs @ value


def _sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
    """SDPA as the ``tkx::attention`` composite where it covers the call, else as its math."""
    out = sdpa_composite(*args, **kwargs)
    return out if out is not None else attention_math(*args, **kwargs)


def _max_pool2d_dispatch(*args: Any, **kwargs: Any) -> Any:
    return max_pool2d_math(*args, **kwargs)


_MULTI_HEAD_ATTENTION = torch.nn.functional.multi_head_attention_forward
_TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention


def multi_head_attention_math(*args: Any, dropout: Callable | None = None, **kwargs: Any) -> Any:
    """``F.multi_head_attention_forward`` (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``)
    with its inner ``scaled_dot_product_attention`` (``need_weights=False``) written out by
    :func:`attention_math`: torch calls it from Python below the level tkx intercepts, where it would
    reach a fused kernel (``_scaled_dot_product_flash_attention``) that has no tkx lowering. The name
    in ``torch.nn.functional`` is swapped for the call; ``dropout`` (from :func:`tkx.random.philox`)
    draws the attention dropout, and a swap made with it is kept by nested calls."""
    module = torch.nn.functional
    saved = module.scaled_dot_product_attention
    if dropout is not None:
        module.scaled_dot_product_attention = functools.partial(attention_math, dropout=dropout)
    elif saved is _TORCH_SDPA:
        module.scaled_dot_product_attention = attention_math
    try:
        return _MULTI_HEAD_ATTENTION(*args, **kwargs)
    finally:
        module.scaled_dot_product_attention = saved


#: torch functions replaced while tracing (composite ops torch decomposes before any table sees them).
FUNCTION_OVERRIDES: dict[Callable, Callable] = {
    torch.nn.functional.one_hot: checked_one_hot,
    torch.nn.functional.scaled_dot_product_attention: _sdpa,
    torch.nn.functional.multi_head_attention_forward: multi_head_attention_math,
    torch.nn.functional.conv2d: conv2d_math, torch.conv2d: conv2d_math,
    torch.nn.functional.max_pool2d: _max_pool2d_dispatch, torch.max_pool2d: _max_pool2d_dispatch,
    torch.nn.functional.max_pool2d_with_indices: lambda *a, **k: max_pool2d_math(*a, **{**k, "return_indices": True}),
    torch.nn.functional.avg_pool2d: avg_pool2d_math,
    torch.nn.functional.conv1d: conv1d_math,
    torch.nn.functional.conv_transpose2d: conv_transpose2d_math, torch.nn.functional.conv_transpose1d: conv_transpose1d_math,
    torch.nn.functional.max_pool1d: max_pool1d_math, torch.max_pool1d: max_pool1d_math,
    torch.nn.functional.max_pool1d_with_indices: lambda *a, **k: max_pool1d_math(*a, **{**k, "return_indices": True}),
    torch.max_pool1d_with_indices: lambda *a, **k: max_pool1d_math(*a, **{**k, "return_indices": True}),
    torch.nn.functional.avg_pool1d: avg_pool1d_math,
    torch.nn.functional.interpolate: composites.interpolate,
    torch.nn.functional.adaptive_avg_pool2d: composites.adaptive_avg_pool2d,
    torch._weight_norm: composites.weight_norm, **composites.RNN_OVERRIDES,
}


def _one_hot_mask(target: torch.Tensor, classes: int, ignore_index: int, logp: torch.Tensor):
    """[N, C] float mask with a one where column == target (and target != ignore_index)."""
    cols = torch.arange(classes, device=logp.device, dtype=target.dtype)
    hit = target.unsqueeze(-1) == cols
    valid = (target != ignore_index).unsqueeze(-1)
    return torch.logical_and(hit, valid).to(logp.dtype)


def _nll_loss_forward(self, target, weight, reduction, ignore_index):
    """NLL as a one-hot mask: per row ``-w[t] * self[t]`` (``w`` the class weights, 1 without); the mean
    divides by the total weight of the rows not ignored (torch's definition), which is also returned."""
    if self.dim() == 1:
        self, target = self.unsqueeze(0), target.unsqueeze(0)
    if self.dim() != 2:
        raise NotImplementedError("nll_loss on inputs of rank > 2")
    target = torch.ops.tkx.check_index(target, 0, self.shape[1], ignore_index, "nll_loss (cross_entropy) target")
    mask = _one_hot_mask(target, self.shape[1], ignore_index, self)
    if weight is not None:
        mask = mask * weight
    losses = -(self * mask).sum(dim=1)
    count = mask.sum() if weight is not None else (target != ignore_index).to(self.dtype).sum()
    if reduction == _REDUCTION_NONE:
        return losses, count
    if reduction == _REDUCTION_SUM:
        return losses.sum(), count
    return losses.sum() / count, count


def _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    squeeze = self.dim() == 1
    logp = self.unsqueeze(0) if squeeze else self
    tgt = target.unsqueeze(0) if squeeze else target
    # the same check as the forward's, so cse merges the two masks
    tgt = torch.ops.tkx.check_index(tgt, 0, logp.shape[1], ignore_index, "nll_loss (cross_entropy) target")
    mask = _one_hot_mask(tgt, logp.shape[1], ignore_index, logp)
    if weight is not None:
        mask = mask * weight
    if reduction == _REDUCTION_NONE:
        scale = grad_output.reshape(-1, 1)
    elif reduction == _REDUCTION_MEAN:
        # every target ignored: total_weight is 0 and eager's gradient is 0, not 0/0
        scale = grad_output / torch.where(total_weight == 0, torch.ones_like(total_weight), total_weight)
    else:
        scale = grad_output
    grad = -mask * scale
    return grad.squeeze(0) if squeeze else grad


def _nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    """``nll_loss2d`` (cross-entropy on ``[N, C, H, W]``, and on ``[N, C, T]`` which torch reshapes to it):
    the classes moved last, then :func:`_nll_loss_forward` on ``[N*H*W, C]``."""
    c = self.shape[1]
    losses, total = _nll_loss_forward(self.movedim(1, -1).reshape(-1, c), target.reshape(-1), weight, reduction,
                                      ignore_index)
    return (losses.reshape(target.shape) if reduction == _REDUCTION_NONE else losses), total


def _nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    c = self.shape[1]
    g = grad_output.reshape(-1) if reduction == _REDUCTION_NONE else grad_output
    grad = _nll_loss_backward(g, self.movedim(1, -1).reshape(-1, c), target.reshape(-1), weight, reduction,
                              ignore_index, total_weight)
    return grad.reshape(*self.shape[:1], *self.shape[2:], c).movedim(-1, 1)


def _round_decimals(x, *, decimals=0):
    """``torch.round(x, decimals=d)``: ``round(x * 10**d) / 10**d`` (``round(x / 10**-d) * 10**-d`` for
    ``d < 0``), as torch computes it."""
    if decimals >= 0:
        scale = 10.0 ** decimals
        return torch.round(x * scale) / scale
    scale = 10.0 ** -decimals
    return torch.round(x / scale) * scale


def _new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    """A fresh tensor whose values are written before they are read (autograd's ``CopySlices``, the backward
    of an in-place write into a view, makes one and copies the gradient into it): zeros of the dense layout.
    Another layout is refused: the later ``as_strided`` views would read it by its strides."""
    from ..errors import UnsupportedError
    contiguous = []
    step = 1
    for d in reversed(size):
        contiguous.insert(0, step)
        step *= max(int(d), 1)
    if any(int(a) != b for a, b, d in zip(stride, contiguous, size) if int(d) > 1):
        raise UnsupportedError(
            "unsupported-op", f"an in-place write into a view of a tensor with strides {list(stride)} (not "
            "row-major) inside a differentiated function: its backward (autograd's CopySlices) needs a buffer of "
            "that layout", op="aten.new_empty_strided",
            hint="write the slice out of place: y = torch.cat([new_col.unsqueeze(1), y[:, 1:]], 1) or "
                 "torch.where(mask, new, y), or make the tensor contiguous (.contiguous()) before writing into it")
    return torch.zeros(size, dtype=dtype or x.dtype, device=device or x.device)


def _as_strided_scatter(x, src, size, stride, storage_offset=None):
    """``x`` with the strided view ``(size, stride, storage_offset)`` of its storage replaced by ``src``:
    the view's flat positions ``offset + sum_i arange(size_i) * stride_i``, written with one ``index_put``
    into the flattened ``x``. ``x`` must be row-major (a value computed in the step is; autograd's backward
    of an in-place write into a view makes this op)."""
    from ..errors import UnsupportedError
    if not x.is_contiguous() or x.storage_offset() != 0:
        raise UnsupportedError(
            "unsupported-op", f"writing into a strided view of a tensor with strides {list(x.stride())} "
            "(not row-major) inside a differentiated function", op="aten.as_strided_scatter",
            hint="make the tensor contiguous (.contiguous()) before writing into it, or build the result out "
                 "of place with torch.where / torch.cat")
    pos = torch.full((), int(storage_offset or 0), dtype=torch.int64, device=x.device)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = int(n)
        pos = pos + torch.arange(int(n), device=x.device).reshape(shape) * int(st)
    flat = x.reshape(-1).index_put((pos.expand(tuple(size)).reshape(-1),), src.reshape(-1).to(x.dtype))
    return flat.reshape(x.shape)


def _diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    """``x`` with its diagonal ``(offset, dim1, dim2)`` replaced by ``src`` (``jacrev`` and ``jacfwd`` write
    their basis so): the diagonal's view of the row-major ``x`` through :func:`_as_strided_scatter`."""
    x = x.contiguous()
    view = x.diagonal(offset, dim1, dim2)
    return _as_strided_scatter(x, src, view.shape, view.stride(), view.storage_offset())


def _efficient_zero_tensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.func.jvp``'s symbolic zero tangent: an ordinary tensor of zeros."""
    return torch.zeros(size, dtype=dtype, device=device)


def _same_size(a, b):
    """``is_same_size`` (forward-mode AD checks a tangent's shape with it): a Python bool fixed at capture."""
    return tuple(a.shape) == tuple(b.shape)


def _same_storage_numel(a, b):
    """``_has_same_storage_numel`` (forward-mode AD's check of a tangent's storage): fixed at capture."""
    return a.untyped_storage().nbytes() // a.element_size() == b.untyped_storage().nbytes() // b.element_size()


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """var_mean as mean / sum of squared deviations (torch's rule emits prims.var)."""
    dims = list(range(x.dim())) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    n = 1
    for d in dims:
        n *= x.shape[d]
    mean = x.mean(dim=dims, keepdim=True)
    dev = x - mean
    c = 1 if correction is None else correction
    var = (dev * dev).sum(dim=dims, keepdim=keepdim) / max(n - c, 0)
    return var, (mean if keepdim else mean.squeeze(dims))


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    """``native_layer_norm`` -> (out in ``x``'s dtype, mean, 1/std), the statistics over the trailing
    ``len(normalized_shape)`` dims computed and kept in float32 for a bfloat16/float16 ``x``.

    Eager keeps mean and 1/std in float32 on CUDA and for a float32 weight on the CPU (autocast's case);
    torch's reference rounds them to ``x``'s dtype on the CPU, and the backward of a narrow norm then
    cancels into noise (over two elements ``x_hat`` is +-1 and the input's gradient is nearly 0: with
    a rounded mean it came out 17 times the float64 value)."""
    shape = list(normalized_shape)
    if list(x.shape[x.dim() - len(shape):]) != shape or x.dim() < len(shape) or any(
            t is not None and list(t.shape) != shape for t in (weight, bias)):
        # torch's own check (aten/src/ATen/native/layer_norm.cpp), so a wrong shape stays the user's bad input
        raise RuntimeError(f"Given normalized_shape={shape}, expected input with shape [*, "
                           f"{', '.join(map(str, shape))}] and weight/bias of shape {shape}, but got input of "
                           f"size{list(x.shape)}" + "".join(f", {n} of size {list(t.shape)}" for n, t in
                                                           (("weight", weight), ("bias", bias)) if t is not None))
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    xc = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    var, mean = _var_mean(xc, dims, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = (xc - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.to(x.dtype), mean, rstd


#: Batch norm in training -> where its ``training`` argument is (``True``: always in training). Their saved
#: statistics (outputs 1 and 2: the mean and 1/std) stay float32 for a half input.
_BATCH_NORM_TRAINING = {
    aten.native_batch_norm.default: 5, aten._native_batch_norm_legit.default: 5,
    aten._native_batch_norm_legit.no_stats: 3, aten._native_batch_norm_legit_functional.default: 5,
    aten._batch_norm_with_update.default: True, aten._batch_norm_with_update_functional.default: True,
}


def _float32_batch_statistics(torch_rule: Callable, training_at: int | bool) -> Callable:
    """torch's batch-norm rule ``torch_rule``, its saved mean and 1/std kept in float32 for a bfloat16/float16
    input in training.

    Eager keeps them in float32 on CUDA and for a float32 weight on the CPU (autocast's case); torch's rule
    rounds them to the input's dtype on the CPU, and the backward then cancels into noise where the batch
    holds few elements (over two, ``x_hat`` is +-1 and the input's gradient nearly 0: with a rounded mean
    it came out 25 times the float64 value and of the other sign). The statistics are computed as the rule
    computes them before rounding (the same ops: the passes merge the two)."""
    def rule(*args, **kwargs):
        out = torch_rule(*args, **kwargs)
        x = args[0]
        training = training_at if isinstance(training_at, bool) else (
            kwargs["training"] if "training" in kwargs else args[training_at])
        if not training or x.dtype not in (torch.bfloat16, torch.float16) or out[1].dtype == torch.float32:
            return out
        eps = kwargs["eps"] if "eps" in kwargs else args[-1]  # every schema here ends with eps
        dims = [0, *range(2, x.dim())]
        var, mean = torch.var_mean(x.float(), dim=dims, correction=0, keepdim=True)
        stats = (torch.squeeze(mean, dims), torch.squeeze(torch.rsqrt(var + eps), dims))
        return (out[0], *stats, *out[3:])
    return rule


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _std(x, dim=None, *, correction=None, keepdim=False):
    return torch.sqrt(_var(x, dim, correction=correction, keepdim=keepdim))


#: The packed keys of :func:`_extreme_and_index` hold the position in their low 32 bits.
_POSITION_SPAN = 2**32


def _extreme_and_index(x, dim, keepdim, largest: bool):
    """(values, first index holding them) along ``dim``; NaN is the maximum (and the minimum), as in torch."""
    if dim is None:
        flat = x.reshape(-1)
        v, i = _extreme_and_index(flat, 0, False, largest)
        return v, i
    d = dim % max(x.dim(), 1)
    v = torch.amax(x, d, keepdim=True) if largest else torch.amin(x, d, keepdim=True)
    n = x.shape[d]
    shape = [1] * x.dim()
    shape[d] = n
    pos = torch.arange(n, device=x.device).reshape(shape)
    if x.is_floating_point():
        # one exact integer max of (order key, n - 1 - position): the first extreme, NaN first; it reads
        # x once and cannot miss (comparing x with its own max needs the two reads to agree bit for bit)
        key = torch.ops.tkx.order_key(x if largest else -x)
        best = torch.amax(key * _POSITION_SPAN + ((n - 1) - pos), d, keepdim=True)
        idx = (n - 1) - torch.remainder(best, _POSITION_SPAN)
    else:  # integers and booleans compare exactly
        hit = x == v
        idx = torch.amin(torch.where(hit, pos, n), d, keepdim=True)
    if not keepdim:
        v, idx = v.squeeze(d), idx.squeeze(d)
    return v, idx


def _max_dim(x, dim, keepdim=False):
    return _extreme_and_index(x, dim, keepdim, True)


def _min_dim(x, dim, keepdim=False):
    return _extreme_and_index(x, dim, keepdim, False)


def _max_all(x):
    """``x.max()`` (no dim): the maximum over every element, as ``torch.amax`` (NaN propagates alike)."""
    return torch.amax(x, list(range(x.dim()))) if x.dim() else x.clone()


def _min_all(x):
    return torch.amin(x, list(range(x.dim()))) if x.dim() else x.clone()


def _argmax(x, dim=None, keepdim=False):
    return _extreme_and_index(x, dim, keepdim, True)[1]


def _argmin(x, dim=None, keepdim=False):
    return _extreme_and_index(x, dim, keepdim, False)[1]


def _any(x, dim=None, keepdim=False):
    dims = list(range(x.dim())) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    return torch.amax((x != 0).to(torch.int32), dims, keepdim=keepdim).to(torch.bool) if dims else x != 0


def _all(x, dim=None, keepdim=False):
    dims = list(range(x.dim())) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    return torch.amin((x != 0).to(torch.int32), dims, keepdim=keepdim).to(torch.bool) if dims else x != 0


def _embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The gradient of an embedding table: a deterministic scatter-add of the rows' gradients."""
    if scale_grad_by_freq:
        raise NotImplementedError("embedding(scale_grad_by_freq=True)")
    d = grad_output.shape[-1]
    g = grad_output.reshape(-1, d)
    idx = indices.reshape(-1)
    if padding_idx is not None and padding_idx >= 0:
        g = g * (idx != padding_idx).unsqueeze(1).to(g.dtype)
    return g.new_zeros(num_weights, d).index_put((idx,), g, accumulate=True)


def _amp_unscale(grads, found_inf, inv_scale):
    """``torch._amp_foreach_non_finite_check_and_unscale_`` (GradScaler.unscale_): every gradient times
    ``inv_scale``; ``found_inf`` becomes 1.0 when any gradient holds an inf or a NaN."""
    bad = found_inf
    out = []
    for g in grads:
        out.append(g * inv_scale)
        bad = torch.maximum(bad, torch.logical_not(torch.isfinite(g)).any().to(found_inf.dtype))
    return out, bad


def _amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """``torch._amp_update_scale_`` (GradScaler.update): back off and reset the tracker after an inf,
    else count the good step and grow the scale (when the grown scale is finite) every
    ``growth_interval`` good steps."""
    found = found_inf != 0
    good = growth_tracker + 1
    grow = good == growth_interval
    grown = scale * growth_factor
    new_scale = torch.where(found, scale * backoff_factor, torch.where(grow & torch.isfinite(grown), grown, scale))
    new_tracker = torch.where(found | grow, torch.zeros_like(good), good)
    return new_scale, new_tracker


def _constant_pad_nd(x, pad, value=0.0):
    """``F.pad(x, pad, value=value)`` in constant mode: a negative pad narrows the dim, a positive one
    concatenates a block filled with ``value`` (torch's own rule writes into a slice with ``copy_to``).
    ``pad`` lists (before, after) pairs from the last dim backwards, as ``F.pad``."""
    for i in range(len(pad) // 2):
        dim, before, after = x.dim() - 1 - i, pad[2 * i], pad[2 * i + 1]
        if before < 0:
            x = x.narrow(dim, -before, x.shape[dim] + before)
        if after < 0:
            x = x.narrow(dim, 0, x.shape[dim] + after)
        blocks = [x.new_full((*x.shape[:dim], n, *x.shape[dim + 1:]), value) if n > 0 else None
                  for n in (before, 0, after)]
        blocks = [b for b in (blocks[0], x, blocks[2]) if b is not None]
        x = torch.cat(blocks, dim) if len(blocks) > 1 else x.clone()
    return x


def _foreach_norm(tensors, ord=2, dtype=None):
    return [torch.linalg.vector_norm(t, ord) for t in tensors]


def decomposition_table() -> dict[torch._ops.OpOverload, Callable]:
    """The table passed to ``make_fx``: torch's rules plus tkx's one-hot NLL loss."""
    table = dict(get_decompositions(TORCH_DECOMPOSED))
    for op, fn in ((aten.nll_loss_forward.default, _nll_loss_forward),
                   (aten.nll_loss_backward.default, _nll_loss_backward),
                   (aten.nll_loss2d_forward.default, _nll_loss2d_forward),
                   (aten.nll_loss2d_backward.default, _nll_loss2d_backward),
                   (aten.round.decimals, _round_decimals), (aten.new_empty_strided.default, _new_empty_strided),
                   (aten.as_strided_scatter.default, _as_strided_scatter),
                   (aten.diagonal_scatter.default, _diagonal_scatter),
                   (aten._efficientzerotensor.default, _efficient_zero_tensor),
                   (aten.is_same_size.default, _same_size),
                   (aten._has_same_storage_numel.default, _same_storage_numel),
                   (aten.var_mean.correction, _var_mean), (aten.native_layer_norm.default, _native_layer_norm),
                   (aten.var.correction, _var), (aten.std.correction, _std),
                   (aten.max.dim, _max_dim), (aten.min.dim, _min_dim), (aten.max.default, _max_all),
                   (aten.min.default, _min_all), (aten.argmax.default, _argmax),
                   (aten.argmin.default, _argmin), (aten.any.default, _any), (aten.any.dim, _any),
                   (aten.any.dims, _any), (aten.all.default, _all), (aten.all.dim, _all), (aten.all.dims, _all),
                   (aten._foreach_norm.Scalar, _foreach_norm),
                   (aten._amp_foreach_non_finite_check_and_unscale.default, _amp_unscale),
                   (aten._amp_update_scale.default, _amp_update_scale),
                   (aten.embedding_dense_backward.default, _embedding_dense_backward),
                   (aten.constant_pad_nd.default, _constant_pad_nd),
                   (aten.div.Tensor_mode, composites.div_mode), (aten.div.Scalar_mode, composites.div_mode),
                   (aten.scatter_reduce.two, composites.scatter_reduce)):
        table[op] = fn
    for op, training_at in _BATCH_NORM_TRAINING.items():
        table[op] = _float32_batch_statistics(table[op], training_at)
    from .foreach import foreach_decompositions
    table.update({op: fn for op, fn in foreach_decompositions().items() if op not in table})
    table.update(USER_DECOMPOSITIONS)
    return table


#: Decompositions registered with :func:`register_decomposition` (they win over the built-in ones).
USER_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}


def register_decomposition(*ops: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> Callable:
    """Decorator: trace ``ops`` through ``fn`` (written with torch ops tkx supports) from now on.

    ``@tkx.register_decomposition(torch.ops.aten.softshrink.default)`` then
    ``def softshrink(x, lambd=0.5): return x - torch.clamp(x, -lambd, lambd)``. A packet registers every
    overload. Later captures use it; :func:`unregister_decomposition` removes it.
    """
    def wrap(fn: Callable) -> Callable:
        for op in ops:
            for o in _overloads(op):
                USER_DECOMPOSITIONS[o] = fn
        return fn
    return wrap


def unregister_decomposition(*ops: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> None:
    """Remove decompositions added with :func:`register_decomposition` (missing ones are ignored)."""
    for op in ops:
        for o in _overloads(op):
            USER_DECOMPOSITIONS.pop(o, None)


def _overloads(op: Any) -> list[torch._ops.OpOverload]:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]
