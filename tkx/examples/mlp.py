"""The four MLP workloads of DESIGN.md's measured anchors.

Step (functional): ``pred = relu(x @ w1 + b1) @ w2 + b2``, ``loss = mse_loss(pred, y)``, gradients from
``torch.func.grad_and_value`` over ``{w1, b1, w2, b2}``, SGD with ``lr = 1e-2``; returns
``(loss, new_params)``. Every tensor has the workload's dtype:

===========  =====  ====  ======  ===  =====
name         batch  in    hidden  out  dtype
===========  =====  ====  ======  ===  =====
tiny_online  1      64    128     1    fp32
online       8      256   512     16   fp32
small        64     512   1024    128  bf16
medium       256    1024  4096    1024 bf16
===========  =====  ====  ======  ===  =====
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._base import Example, randn, seeded_generator

LR = 1e-2


@dataclass(frozen=True)
class MLPShape:
    batch: int
    d_in: int
    hidden: int
    d_out: int
    dtype: torch.dtype


MLP_WORKLOADS: dict[str, MLPShape] = {
    "tiny_online": MLPShape(1, 64, 128, 1, torch.float32),
    "online": MLPShape(8, 256, 512, 16, torch.float32),
    "small": MLPShape(64, 512, 1024, 128, torch.bfloat16),
    "medium": MLPShape(256, 1024, 4096, 1024, torch.bfloat16),
}


def mlp_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    pred = torch.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
    return F.mse_loss(pred, y)


def mlp_sgd_step(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """One SGD step of the two-layer ReLU MLP; returns ``(loss, new_params)`` and mutates nothing."""
    grads, loss = torch.func.grad_and_value(mlp_loss)(params, x, y)
    new_params = {k: p - LR * grads[k] for k, p in params.items()}
    return loss, new_params


def make_mlp_inputs(shape: MLPShape, seed: int = 0, device="cpu") -> tuple:
    """``(params, x, y)`` for ``shape``: ``w1: (in, hidden)``, ``b1: (hidden,)``, ``w2: (hidden, out)``,
    ``b2: (out,)``, ``x: (batch, in)``, ``y: (batch, out)``, all of ``shape.dtype``.

    Weights are ``randn / sqrt(fan_in)``; biases ``0.1 * randn`` (non-zero, so a dropped bias shows up
    when a compiled step is checked against eager); ``x`` and ``y`` are ``randn``.
    """
    gen = seeded_generator(seed)
    s, dt = shape, shape.dtype
    params = {
        "w1": randn(gen, s.d_in, s.hidden, scale=1 / math.sqrt(s.d_in), dtype=dt, device=device),
        "b1": randn(gen, s.hidden, scale=0.1, dtype=dt, device=device),
        "w2": randn(gen, s.hidden, s.d_out, scale=1 / math.sqrt(s.hidden), dtype=dt, device=device),
        "b2": randn(gen, s.d_out, scale=0.1, dtype=dt, device=device),
    }
    x = randn(gen, s.batch, s.d_in, dtype=dt, device=device)
    y = randn(gen, s.batch, s.d_out, dtype=dt, device=device)
    return params, x, y


def _inputs_maker(name: str, shape: MLPShape):
    def make_inputs(seed: int = 0, device="cpu") -> tuple:
        return make_mlp_inputs(shape, seed, device)

    make_inputs.__name__ = make_inputs.__qualname__ = f"make_{name}_inputs"
    make_inputs.__doc__ = (
        f"``(params, x, y)`` for the {name} MLP: batch {shape.batch}, in {shape.d_in}, hidden "
        f"{shape.hidden}, out {shape.d_out}, {str(shape.dtype).removeprefix('torch.')}."
    )
    return make_inputs


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


EXAMPLES = [
    Example(
        name=name,
        description=(
            f"MLP relu(x @ w1 + b1) @ w2 + b2, MSE loss, SGD (lr 1e-2), functional: "
            f"step(params, x, y) -> (loss, new_params). batch {s.batch}, in {s.d_in}, hidden {s.hidden}, "
            f"out {s.d_out}, all tensors {_dtype_name(s.dtype)}."
        ),
        step_fn=mlp_sgd_step,
        make_inputs=_inputs_maker(name, s),
        loss_output=0,
    )
    for name, s in MLP_WORKLOADS.items()
]
