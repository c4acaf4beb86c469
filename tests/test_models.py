"""Transformer and CNN pieces through every CPU stage (issue 15): attention (SDPA lowered to
its math and hand-written), multi-head attention through reshape/transpose/bmm, RMSNorm,
RoPE, SwiGLU, BatchNorm, mixed precision, and the in-step random numbers (Philox)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tkx

from pipeline import check_step

g = torch.Generator().manual_seed(0)


def f(*shape):
    return torch.randn(*shape, generator=g)


def _grad_step(loss):
    """step(q, k, v) -> (loss, dq, dk, dv): the attention's forward and backward."""
    def step(q, k, v):
        grads, value = torch.func.grad_and_value(loss, argnums=(0, 1, 2))(q, k, v)
        return (value, *grads)
    return step


def _qkv(*shape):
    return f(*shape), f(*shape), f(*shape)


# -- attention -------------------------------------------------------------------------------


def test_sdpa_causal_forward_and_backward():
    step = _grad_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum())
    exp = check_step(step, _qkv(2, 2, 8, 16))
    kinds = [op.kind for op in exp.program.ops]
    assert "bmm" in kinds and "amax" in kinds and "exp" in kinds


@pytest.mark.parametrize("mask", ["bool", "additive"])
def test_sdpa_with_a_mask_and_a_scale(mask):
    m = f(8, 8) > 0 if mask == "bool" else f(2, 1, 8, 8)
    if mask == "bool":
        m[:, 0] = True  # every query keeps a key (a row with none is NaN in eager too)

    def loss(q, k, v, m):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3) * v).sum()

    def step(q, k, v, m):
        grads, value = torch.func.grad_and_value(loss, argnums=(0, 1, 2))(q, k, v, m)
        return (value, *grads)

    check_step(step, (*_qkv(2, 2, 8, 16), m))


def test_sdpa_refuses_enable_gqa_with_the_line():
    def step(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.explore(step, _qkv(1, 2, 4, 8)).program
    assert "enable_gqa" in str(info.value) and "test_models.py" in str(info.value)


def _hand_attention(q, k, v):
    t = q.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = torch.tril(torch.ones(t, t, dtype=torch.bool))
    s = torch.where(keep, s, float("-inf"))
    return s.softmax(-1) @ v


def test_hand_written_attention_matches_sdpa_and_eager():
    step = _grad_step(lambda q, k, v: _hand_attention(q, k, v).square().sum())
    exp = check_step(step, _qkv(8, 16))
    assert "mm" in {op.kind for op in exp.program.ops}


def test_multi_head_attention_through_reshape_transpose_bmm():
    heads, d = 4, 8

    def loss(x, w_qkv, w_o):
        b, t, c = x.shape
        q, k, v = (x @ w_qkv).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, heads, d).transpose(1, 2) for z in (q, k, v))
        y = _hand_attention(q, k, v).transpose(1, 2).reshape(b, t, c)
        return (y @ w_o).square().mean()

    def step(x, w_qkv, w_o):
        grads, value = torch.func.grad_and_value(loss, argnums=(1, 2))(x, w_qkv, w_o)
        return (value, *grads)

    c = heads * d
    exp = check_step(step, (f(2, 8, c), f(c, 3 * c) / c**0.5, f(c, c) / c**0.5))
    assert {"bmm", "mm"} & {op.kind for op in exp.program.ops}


# -- normalisation and the Llama pieces -------------------------------------------------------


def _bn_step(training):
    def step(w, b, running_mean, running_var, x):
        def loss(w, b):
            y = F.batch_norm(x, running_mean, running_var, w, b, training=training, momentum=0.1, eps=1e-5)
            ramp = torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape) / y.numel()
            return (y * ramp).sin().sum()
        (gw, gb), value = torch.func.grad_and_value(loss, argnums=(0, 1))(w, b)
        return value, gw, gb
    return step


@pytest.mark.parametrize("shape", [(16, 4), (4, 3, 5, 5)], ids=["1d", "2d"])
def test_batch_norm_training_updates_running_stats_in_place_as_eager(shape):
    c = shape[1]
    inputs = (f(c) + 1, f(c), f(c), torch.rand(c, generator=g) + 0.5, f(*shape) * 2 + 1)
    exp = check_step(_bn_step(True), inputs)  # compares the running stats after the step with eager's
    assert sorted(u.input_index for u in exp.program.updates) == [2, 3]
    # and eager's nn.BatchNorm module agrees with what the reference interpreter wrote in place
    module = (torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d)(c)
    with torch.no_grad():
        module.weight.copy_(inputs[0]), module.bias.copy_(inputs[1])
        module.running_mean.copy_(inputs[2]), module.running_var.copy_(inputs[3])
        module.train()(inputs[4])
    mine = [t.clone() for t in inputs]
    tkx.reference.run(exp.optimized, mine, update_inputs=True)
    torch.testing.assert_close(mine[2], module.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine[3], module.running_var, rtol=1e-5, atol=1e-6)


def test_batch_norm_eval_uses_running_stats():
    exp = check_step(_bn_step(False), (f(4) + 1, f(4), f(4), torch.rand(4, generator=g) + 0.5, f(16, 4)))
    assert not exp.program.updates


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x, positions):
    """x: [B, H, T, D]; positions: int64 [T]. Rotations by theta_i = pos / 10000^(2i/D)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def swiglu(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


def test_rms_norm_rope_and_swiglu():
    def step(x, w, positions, w_gate, w_up, w_down):
        def loss(w, w_gate, w_up, w_down):
            h = rms_norm(x, w)
            r = rope(h.reshape(2, 8, 2, 8).transpose(1, 2), positions).transpose(1, 2).reshape(2, 8, 16)
            return swiglu(r, w_gate, w_up, w_down).square().mean()
        grads, value = torch.func.grad_and_value(loss, argnums=(0, 1, 2, 3))(w, w_gate, w_up, w_down)
        return (value, *grads)

    exp = check_step(step, (f(2, 8, 16), f(16) + 1, torch.arange(8), f(16, 24) / 4, f(16, 24) / 4, f(24, 16) / 5))
    kinds = {op.kind for op in exp.program.ops}
    assert {"sin", "cos", "cat", "rsqrt"} <= kinds
