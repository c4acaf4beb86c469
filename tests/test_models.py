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
