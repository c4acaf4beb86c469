"""The curated decomposition table used by :func:`tkx.capture`.

Most entries come straight from :mod:`torch._decomp`; they rewrite composite losses,
activations and normalisations (and their backward formulas) into the small primitive set
of :mod:`tkx.ir`. Two entries are tkx's own: ``nll_loss_forward``/``nll_loss_backward``
are expressed with a one-hot mask (``iota == target``) instead of ``gather``/``scatter``,
so class-index targets need no indexed memory access in the generated kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._decomp import get_decompositions

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
]

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _one_hot_mask(target: torch.Tensor, classes: int, ignore_index: int, logp: torch.Tensor):
    """[N, C] float mask with a one where column == target (and target != ignore_index)."""
    cols = torch.arange(classes, device=logp.device, dtype=target.dtype)
    hit = target.unsqueeze(-1) == cols
    valid = (target != ignore_index).unsqueeze(-1)
    return torch.logical_and(hit, valid).to(logp.dtype)


def _nll_loss_forward(self, target, weight, reduction, ignore_index):
    if weight is not None:
        raise NotImplementedError("nll_loss with class weights")
    if self.dim() == 1:
        self, target = self.unsqueeze(0), target.unsqueeze(0)
    if self.dim() != 2:
        raise NotImplementedError("nll_loss on inputs of rank > 2")
    mask = _one_hot_mask(target, self.shape[1], ignore_index, self)
    losses = -(self * mask).sum(dim=1)
    count = (target != ignore_index).to(self.dtype).sum()
    if reduction == _REDUCTION_NONE:
        return losses, count
    if reduction == _REDUCTION_SUM:
        return losses.sum(), count
    return losses.sum() / count, count


def _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    if weight is not None:
        raise NotImplementedError("nll_loss with class weights")
    squeeze = self.dim() == 1
    logp = self.unsqueeze(0) if squeeze else self
    tgt = target.unsqueeze(0) if squeeze else target
    mask = _one_hot_mask(tgt, logp.shape[1], ignore_index, logp)
    if reduction == _REDUCTION_NONE:
        scale = grad_output.reshape(-1, 1)
    elif reduction == _REDUCTION_MEAN:
        scale = grad_output / total_weight
    else:
        scale = grad_output
    grad = -mask * scale
    return grad.squeeze(0) if squeeze else grad


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


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def decomposition_table() -> dict[torch._ops.OpOverload, Callable]:
    """The table passed to ``make_fx``: torch's rules plus tkx's one-hot NLL loss."""
    table = dict(get_decompositions(TORCH_DECOMPOSED))
    table[aten.nll_loss_forward.default] = _nll_loss_forward
    table[aten.nll_loss_backward.default] = _nll_loss_backward
    table[aten.var_mean.correction] = _var_mean
    table[aten.var.correction] = _var
    return table
