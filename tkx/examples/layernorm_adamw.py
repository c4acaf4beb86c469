"""``layernorm_gelu_adamw``: a transformer-style block trained with AdamW written in place.

Block: ``x -> layer_norm(weight, bias) -> linear(64 -> 128) -> gelu(tanh) -> linear(128 -> 64)``, MSE
loss against ``y``. AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2) follows
``torch.optim.AdamW``'s single-tensor code; the bias corrections use two 0-d fp32 tensors holding
``beta1**t`` and ``beta2**t``, multiplied in place each step, so no ``pow`` with a tensor exponent appears.

``step(params, m, v, beta1_power, beta2_power, x, y) -> loss``, all fp32:
``params = {ln_w: (64,), ln_b: (64,), w1: (64, 128), b1: (128,), w2: (128, 64), b2: (64,)}``, ``m`` and
``v`` the same shapes, ``beta1_power`` and ``beta2_power`` shape ``()``, ``x, y: (16, 64)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._base import Example, randn, seeded_generator

BATCH, DIM, HIDDEN = 16, 64, 128
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.999, 1e-8, 1e-2
LN_EPS = 1e-5


def block_forward(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = F.layer_norm(x, (DIM,), params["ln_w"], params["ln_b"], eps=LN_EPS)
    h = F.gelu(h @ params["w1"] + params["b1"], approximate="tanh")
    return h @ params["w2"] + params["b2"]


def block_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(block_forward(params, x), y)


def adamw_step(
    params: dict[str, torch.Tensor],
    m: dict[str, torch.Tensor],
    v: dict[str, torch.Tensor],
    beta1_power: torch.Tensor,
    beta2_power: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """One AdamW step; updates ``params``, ``m``, ``v``, ``beta1_power`` and ``beta2_power`` in place."""
    grads, loss = torch.func.grad_and_value(block_loss)(params, x, y)
    beta1_power.mul_(BETA1)
    beta2_power.mul_(BETA2)
    bias_correction1 = 1 - beta1_power
    bias_correction2 = 1 - beta2_power
    for k, p in params.items():
        g = grads[k]
        p.mul_(1 - LR * WEIGHT_DECAY)
        m[k].mul_(BETA1).add_(g, alpha=1 - BETA1)
        v[k].mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
        denom = v[k].sqrt() / bias_correction2.sqrt() + EPS
        p.sub_((LR / bias_correction1) * m[k] / denom)
    return loss


def make_adamw_inputs(seed: int = 0, device="cpu") -> tuple:
    """``(params, m, v, beta1_power, beta2_power, x, y)``: seeded fp32 parameters (layer-norm weight
    ``1 + 0.1 * randn``, linear weights ``randn / sqrt(fan_in)``, biases ``0.1 * randn``), zero ``m`` and
    ``v``, ``beta1_power = beta2_power = 1.0`` (t = 0), ``x`` and ``y`` ``randn (16, 64)``."""
    gen = seeded_generator(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return randn(gen, *shape, scale=scale, device=device)

    params = {
        "ln_w": 1 + r(DIM, scale=0.1),
        "ln_b": r(DIM, scale=0.1),
        "w1": r(DIM, HIDDEN, scale=1 / math.sqrt(DIM)),
        "b1": r(HIDDEN, scale=0.1),
        "w2": r(HIDDEN, DIM, scale=1 / math.sqrt(HIDDEN)),
        "b2": r(DIM, scale=0.1),
    }
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    beta1_power = torch.ones((), dtype=torch.float32, device=device)
    beta2_power = torch.ones((), dtype=torch.float32, device=device)
    x, y = r(BATCH, DIM), r(BATCH, DIM)
    return params, m, v, beta1_power, beta2_power, x, y


EXAMPLE = Example(
    name="layernorm_gelu_adamw",
    description=(
        "Block layer_norm -> linear (64->128) -> gelu (tanh) -> linear (128->64), MSE loss, AdamW "
        "(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 1e-2) in place with m, v per parameter and "
        "0-d beta1**t, beta2**t tensors: step(params, m, v, beta1_power, beta2_power, x, y) -> loss. "
        "fp32; x, y: (16, 64)."
    ),
    step_fn=adamw_step,
    make_inputs=make_adamw_inputs,
    loss_output=0,
)
