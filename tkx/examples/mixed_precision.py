"""``mixed_precision``: fp32 master weights, bf16 forward, fp32 loss.

``pred = relu(xb @ w1.bf16 + b1.bf16) @ w2.bf16 + b2.bf16`` with ``xb = x.to(bf16)``, then
``loss = mse_loss(pred.float(), y)``. Gradients are taken with respect to the fp32 masters (so they flow
back through the casts) and SGD (lr 1e-2) updates the masters in fp32.

``step(params, x, y) -> (loss, new_params)``: ``params = {w1: (128, 256), b1: (256,), w2: (256, 32),
b2: (32,)}`` fp32, ``x: (32, 128)`` fp32, ``y: (32, 32)`` fp32; the loss is fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._base import Example, randn, seeded_generator

BATCH, IN, HIDDEN, OUT = 32, 128, 256, 32
LR = 1e-2
LOW = torch.bfloat16


def mixed_precision_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w1, b1 = params["w1"].to(LOW), params["b1"].to(LOW)
    w2, b2 = params["w2"].to(LOW), params["b2"].to(LOW)
    pred = torch.relu(x.to(LOW) @ w1 + b1) @ w2 + b2
    return F.mse_loss(pred.float(), y)


def mixed_precision_step(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """One SGD step on the fp32 masters; returns ``(loss, new_params)`` and mutates nothing."""
    grads, loss = torch.func.grad_and_value(mixed_precision_loss)(params, x, y)
    new_params = {k: p - LR * grads[k] for k, p in params.items()}
    return loss, new_params


def make_mixed_precision_inputs(seed: int = 0, device="cpu") -> tuple:
    """``(params, x, y)``, all fp32: weights ``randn / sqrt(fan_in)``, biases ``0.1 * randn``,
    ``x: (32, 128)`` and ``y: (32, 32)`` ``randn``."""
    gen = seeded_generator(seed)
    params = {
        "w1": randn(gen, IN, HIDDEN, scale=1 / math.sqrt(IN), device=device),
        "b1": randn(gen, HIDDEN, scale=0.1, device=device),
        "w2": randn(gen, HIDDEN, OUT, scale=1 / math.sqrt(HIDDEN), device=device),
        "b2": randn(gen, OUT, scale=0.1, device=device),
    }
    x = randn(gen, BATCH, IN, device=device)
    y = randn(gen, BATCH, OUT, device=device)
    return params, x, y


EXAMPLE = Example(
    name="mixed_precision",
    description=(
        "MLP 128-256-32 with fp32 master weights cast to bf16 for the forward, loss in fp32 "
        "(mse_loss(pred.float(), y)), gradients w.r.t. the fp32 masters, SGD (lr 1e-2) in fp32, functional: "
        "step(params, x, y) -> (loss, new_params). x: (32, 128) fp32, y: (32, 32) fp32."
    ),
    step_fn=mixed_precision_step,
    make_inputs=make_mixed_precision_inputs,
    loss_output=0,
)
