"""``linear_regression``: the smallest step in the zoo.

Shapes (fp32): ``params = {"w": (8, 1), "b": (1,)}``, ``x: (32, 8)``, ``y: (32, 1)``.
``step(params, x, y) -> (loss, new_params)`` with plain SGD, ``lr = 0.1``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._base import Example, randn, seeded_generator

BATCH, IN, OUT = 32, 8, 1
LR = 0.1


def linear_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    pred = x @ params["w"] + params["b"]
    return F.mse_loss(pred, y)


def linear_regression_step(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """One SGD step on ``mse(x @ w + b, y)``; returns ``(loss, new_params)`` and mutates nothing."""
    grads, loss = torch.func.grad_and_value(linear_loss)(params, x, y)
    new_params = {k: p - LR * grads[k] for k, p in params.items()}
    return loss, new_params


def make_linear_regression_inputs(seed: int = 0, device="cpu") -> tuple:
    """``(params, x, y)``: params ``{"w": (8, 1), "b": (1,)}``, ``x: (32, 8)``, ``y: (32, 1)``, all fp32.

    ``y`` comes from a hidden linear teacher plus a little noise, so the loss can fall towards the
    noise floor.
    """
    gen = seeded_generator(seed)
    params = {
        "w": randn(gen, IN, OUT, scale=1 / math.sqrt(IN), device=device),
        "b": randn(gen, OUT, scale=0.1, device=device),
    }
    x = randn(gen, BATCH, IN, device=device)
    w_true = randn(gen, IN, OUT, device=device)
    b_true = randn(gen, OUT, device=device)
    y = x @ w_true + b_true + randn(gen, BATCH, OUT, scale=0.01, device=device)
    return params, x, y


EXAMPLE = Example(
    name="linear_regression",
    description=(
        "Linear regression y = x @ w + b with MSE loss and SGD (lr 0.1), functional: "
        "step(params, x, y) -> (loss, new_params). fp32; params {w: (8, 1), b: (1,)}, "
        "x: (32, 8), y: (32, 1) from a hidden linear teacher plus noise."
    ),
    step_fn=linear_regression_step,
    make_inputs=make_linear_regression_inputs,
    loss_output=0,
)
