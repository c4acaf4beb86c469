"""``cnn_digits``: two conv-ReLU-max-pool layers, dropout and a linear head on scikit-learn's 8x8 digits.

``x [64, 1, 8, 8]`` -> conv 3x3 (1 -> 8, padding 1) -> ReLU -> max-pool 2 -> conv 3x3 (8 -> 16, padding 1)
-> ReLU -> max-pool 2 -> flatten ``[64, 64]`` -> dropout(0.25) -> linear 64 -> 10; softmax
cross-entropy; momentum SGD (lr 0.05, momentum 0.9) in place, as ``torch.optim.SGD``.

Dropout draws inside the step from Philox-4x32-10 (:mod:`tkx.random`, the one part of tkx the zoo
uses): ``step(params, momentum_buf, rng, x, y) -> loss`` takes the int64 state ``rng = [seed,
offset]`` and advances its offset by one in place, so eager and the compiled step drop the same
units. Data: :func:`tkx.examples.digits.digits_dataset` (the same split as ``digits_mlp``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..random import philox, philox_state
from ._base import Example, randn, seeded_generator
from .digits import BATCH, CLASSES, digits_batches, have_sklearn

C1, C2, DROP, CNN_LR, CNN_MOMENTUM = 8, 16, 0.25, 0.05, 0.9


def cnn_logits(params, x, *, train: bool = True):
    """``x [N, 64]`` (or ``[N, 1, 8, 8]``) fp32 -> logits ``[N, 10]``; ``train`` applies dropout."""
    h = x.reshape(-1, 1, 8, 8)
    h = F.max_pool2d(F.relu(F.conv2d(h, params["conv1_w"], params["conv1_b"], padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, params["conv2_w"], params["conv2_b"], padding=1)), 2)
    h = F.dropout(h.flatten(1), DROP, training=train)
    return h @ params["fc_w"] + params["fc_b"]


def cnn_loss(params, x, y):
    return F.cross_entropy(cnn_logits(params, x), y)


def cnn_step(params, momentum_buf, rng, x, y):
    """One momentum-SGD step in place on ``params``/``momentum_buf``; dropout from ``rng`` (advanced by one)."""
    with philox(rng):
        grads, loss = torch.func.grad_and_value(cnn_loss)(params, x, y)
    for k, p in params.items():
        buf = momentum_buf[k]
        buf.mul_(CNN_MOMENTUM).add_(grads[k])
        p.add_(buf, alpha=-CNN_LR)
    return loss


@torch.no_grad()
def cnn_accuracy(params, x, y) -> float:
    """Fraction of rows of ``x [N, 64]`` classified as ``y`` (no dropout)."""
    return (cnn_logits(params, x, train=False).argmax(dim=1) == y).float().mean().item()


def init_cnn_params(seed: int = 0, device="cpu"):
    gen = seeded_generator(seed)
    return {
        "conv1_w": randn(gen, C1, 1, 3, 3, scale=1 / 3.0, device=device),
        "conv1_b": torch.zeros(C1, device=device),
        "conv2_w": randn(gen, C2, C1, 3, 3, scale=1 / math.sqrt(9 * C1), device=device),
        "conv2_b": torch.zeros(C2, device=device),
        "fc_w": randn(gen, 4 * C2, CLASSES, scale=1 / math.sqrt(4 * C2), device=device),
        "fc_b": torch.zeros(CLASSES, device=device),
    }


def make_cnn_inputs(seed: int = 0, device="cpu"):
    """``(params, momentum_buf, rng, x, y)``: ``x (64, 64)`` fp32, ``y (64,)`` int64, ``rng`` int64 ``[2]``."""
    params = init_cnn_params(seed, device)
    momentum_buf = {k: torch.zeros_like(p) for k, p in params.items()}
    x, y = next(digits_batches(BATCH, seed=seed, device=device))
    return params, momentum_buf, philox_state(seed, device=device), x, y


EXAMPLE = Example(
    name="cnn_digits",
    description=(
        f"Small CNN on {'scikit-learn' if have_sklearn() else 'SYNTHETIC (no scikit-learn)'} 8x8 digits: "
        f"conv3x3(1->{C1})-ReLU-maxpool2, conv3x3({C1}->{C2})-ReLU-maxpool2, dropout {DROP} (Philox, in the "
        f"step), linear {4 * C2}->{CLASSES}, cross-entropy; momentum SGD (lr {CNN_LR}, momentum {CNN_MOMENTUM}) "
        "in place: step(params, momentum_buf, rng, x, y) -> loss; x (64, 64) fp32, y (64,) int64, "
        "rng int64 [seed, offset]."),
    step_fn=cnn_step,
    make_inputs=make_cnn_inputs,
)
