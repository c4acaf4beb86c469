"""Each composite op the foundation issue names captures into primitives and matches eager (values and grads)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad_and_value

import tkx

X = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
W = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
T_IDX = torch.tensor([0, 3, 1, 2, 3, 0])
T_1HOT = F.one_hot(T_IDX, 4).float()
T_REG = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))

# (loss of logits z and a target t, the target tensor)
LOSSES = {
    "log_softmax": (lambda z, t: (F.log_softmax(z, dim=1) * t).sum(), T_1HOT),
    "softmax": (lambda z, t: (F.softmax(z, dim=1) * t).sum(), T_REG),
    "nll_loss": (lambda z, t: F.nll_loss(F.log_softmax(z, dim=1), t), T_IDX),
    "cross_entropy_index": (lambda z, t: F.cross_entropy(z, t), T_IDX),
    "cross_entropy_one_hot": (lambda z, t: F.cross_entropy(z, t), T_1HOT),
    "mse_loss": (lambda z, t: F.mse_loss(z, t), T_REG),
    "gelu_tanh": (lambda z, t: (F.gelu(z, approximate="tanh") * t).mean(), T_REG),
    "gelu_erf": (lambda z, t: (F.gelu(z) * t).mean(), T_REG),
    "silu": (lambda z, t: (F.silu(z) * t).sum(), T_REG),
    "sigmoid": (lambda z, t: (torch.sigmoid(z) * t).sum(), T_REG),
    "tanh": (lambda z, t: (torch.tanh(z) * t).sum(), T_REG),
    "relu_threshold_backward": (lambda z, t: (torch.relu(z) * t).sum(), T_REG),
    "layer_norm": (lambda z, t: (F.layer_norm(z, (4,), torch.full((4,), 1.5), torch.full((4,), 0.1)) * t).sum(),
                   T_REG),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_composite_matches_eager(name):
    loss_of, target = LOSSES[name]

    def step(w, x, t):
        g, v = grad_and_value(lambda w: loss_of(x @ w, t))(w)
        return v, g

    program = tkx.capture(step, (W, X, target)).lower()
    assert all(op.kind in tkx.ir.OPS for op in program.ops)
    out = tkx.reference.run(program, (W, X, target)).outputs
    v, g = step(W, X, target)
    assert torch.allclose(out[0], v, rtol=1e-5, atol=1e-6), name
    assert torch.allclose(out[1], g, rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_step(dtype):
    w, x, t = W.to(dtype), X.to(dtype), T_REG.to(dtype)

    def step(w, x, t):
        g, v = grad_and_value(lambda w: F.mse_loss(torch.relu(x @ w), t))(w)
        return v, w - 0.1 * g

    program = tkx.capture(step, (w, x, t)).lower()
    assert {op.out.dtype for op in program.ops} & {"bfloat16", "float16"}
    out = tkx.reference.run(program, (w, x, t)).outputs
    v, nw = step(w, x, t)
    assert (out[0].float() - v.float()).abs().max() <= 2e-2 * v.float().abs().max()
    assert ((out[1].float() - nw.float()).norm() / nw.float().norm()) <= 2e-2
