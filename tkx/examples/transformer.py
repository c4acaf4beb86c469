"""Transformer blocks: ``gpt_block`` and ``llama_block`` (one block each, small shapes for CI).

* ``gpt_block``: token and position embeddings, pre-norm causal self-attention through
  ``F.scaled_dot_product_attention(is_causal=True)`` with 2 heads, layer norm, a GELU MLP, a final
  layer norm and an LM head tied to the token embedding; next-token cross-entropy. bf16 compute
  (the fp32 master weights are cast to bf16 inside the loss; logits go back to fp32 for the loss),
  AdamW with a 0-d float step count and global-norm gradient clipping, in place on the fp32
  masters and the moments (as ``torch.optim.AdamW`` after ``clip_grad_norm_``).
* ``llama_block``: RMSNorm, rotary position embeddings (``sin``/``cos`` of the positions,
  ``rotate_half`` with ``torch.cat``), causal attention written by hand (``q @ k^T``, a ``tril``
  mask with ``torch.where``, ``softmax``, ``@ v``), a SwiGLU MLP and an untied LM head; bf16
  compute with fp32 masters, momentum SGD, functional (returns the new parameters and momenta).

Shapes: batch 4, context 8, model width 32, 2 heads of 16, vocabulary 32 (GPT MLP 128, Llama
SwiGLU hidden 64).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._base import Example, randn, seeded_generator

T_BATCH, T_CONTEXT, T_WIDTH, T_HEADS, T_VOCAB = 4, 8, 32, 2, 32
T_HEAD = T_WIDTH // T_HEADS
GPT_MLP, LLAMA_HIDDEN = 4 * T_WIDTH, 64
BETA1, BETA2, LR, EPS, WEIGHT_DECAY, CLIP = 0.9, 0.95, 1e-3, 1e-8, 0.1, 1.0
BF16 = torch.bfloat16


def _tokens(seed: int, device):
    """``(tokens, targets)``: int64 ``[B, T]`` each; targets are the tokens shifted by one."""
    gen = seeded_generator(seed + 1000)
    seq = torch.randint(0, T_VOCAB, (T_BATCH, T_CONTEXT + 1), generator=gen)
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


def _heads(z: torch.Tensor) -> torch.Tensor:
    """``[B, T, C]`` -> ``[B, H, T, D]``."""
    b, t, _ = z.shape
    return z.reshape(b, t, T_HEADS, T_HEAD).transpose(1, 2)


def _merge(z: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, D]`` -> ``[B, T, C]``."""
    b, _, t, _ = z.shape
    return z.transpose(1, 2).reshape(b, t, T_WIDTH)


# -- gpt_block ---------------------------------------------------------------------------------------


def gpt_loss(params, tokens, targets):
    p = {k: v.to(BF16) for k, v in params.items()}  # bf16 compute, fp32 masters
    t = tokens.shape[1]
    x = F.embedding(tokens, p["wte"]) + p["wpe"][:t]
    h = F.layer_norm(x, (T_WIDTH,), p["ln1_w"], p["ln1_b"])
    q, k, v = (h @ p["w_qkv"]).split(T_WIDTH, dim=-1)  # no qkv bias: a key bias's gradient is 0 (pure rounding)
    att = F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v), is_causal=True)
    x = x + _merge(att) @ p["w_proj"] + p["b_proj"]
    h = F.layer_norm(x, (T_WIDTH,), p["ln2_w"], p["ln2_b"])
    x = x + F.gelu(h @ p["w_fc"] + p["b_fc"]) @ p["w_out"] + p["b_out"]
    h = F.layer_norm(x, (T_WIDTH,), p["lnf_w"], p["lnf_b"])
    logits = h @ p["wte"].t()                                     # LM head tied to the embedding
    return F.cross_entropy(logits.float().reshape(-1, T_VOCAB), targets.reshape(-1))


def clip_and_adamw_in_place(params, grads, m, v, t):
    """``clip_grad_norm_(max_norm=CLIP)`` then ``torch.optim.AdamW``'s update, in place (0-d float ``t``)."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    scale = torch.clamp(CLIP / (norm + 1e-6), max=1.0)
    t.add_(1)
    c1, c2 = 1 - BETA1 ** t, 1 - BETA2 ** t
    for k, p in params.items():
        g = grads[k] * scale
        p.mul_(1 - LR * WEIGHT_DECAY)
        m[k].mul_(BETA1).add_((1 - BETA1) * g)
        v[k].mul_(BETA2).add_((1 - BETA2) * g * g)
        p.sub_(LR * (m[k] / c1) / ((v[k] / c2).sqrt() + EPS))


def gpt_block_step(params, m, v, t, tokens, targets):
    """One clipped AdamW step, in place on ``params``, ``m``, ``v`` and ``t``; returns the loss."""
    grads, loss = torch.func.grad_and_value(gpt_loss)(params, tokens, targets)
    clip_and_adamw_in_place(params, grads, m, v, t)
    return loss


def make_gpt_inputs(seed: int = 0, device="cpu"):
    gen = seeded_generator(seed)
    c = T_WIDTH
    params = {
        "wte": randn(gen, T_VOCAB, c, scale=0.3, device=device),
        "wpe": randn(gen, T_CONTEXT, c, scale=0.1, device=device),
        "ln1_w": torch.ones(c, device=device), "ln1_b": torch.zeros(c, device=device),
        "w_qkv": randn(gen, c, 3 * c, scale=1 / math.sqrt(c), device=device),
        "w_proj": randn(gen, c, c, scale=1 / math.sqrt(c), device=device), "b_proj": torch.zeros(c, device=device),
        "ln2_w": torch.ones(c, device=device), "ln2_b": torch.zeros(c, device=device),
        "w_fc": randn(gen, c, GPT_MLP, scale=1 / math.sqrt(c), device=device),
        "b_fc": torch.zeros(GPT_MLP, device=device),
        "w_out": randn(gen, GPT_MLP, c, scale=1 / math.sqrt(GPT_MLP), device=device),
        "b_out": torch.zeros(c, device=device),
        "lnf_w": torch.ones(c, device=device), "lnf_b": torch.zeros(c, device=device),
    }
    # a step in the middle of training (t = 100, second moments 1e-4): AdamW's very first step is
    # lr * sign(g), so a gradient that is zero up to rounding would move a weight by +-lr at random
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.full_like(p, 1e-4) for k, p in params.items()}
    tokens, targets = _tokens(seed, device)
    return params, m, v, torch.full((), 100.0, device=device), tokens, targets


GPT_BLOCK = Example(
    name="gpt_block",
    description=(
        f"One GPT block on {T_BATCH}x{T_CONTEXT} int64 tokens (vocabulary {T_VOCAB}): token + position "
        f"embeddings, layer norm, causal F.scaled_dot_product_attention ({T_HEADS} heads of {T_HEAD}), GELU MLP "
        f"{T_WIDTH}-{GPT_MLP}-{T_WIDTH}, final layer norm, LM head tied to the embedding, cross-entropy; bf16 "
        "compute on fp32 master weights; global-norm clipping to 1 and AdamW (0-d float step count, resumed at "
        "t = 100), in place."),
    step_fn=gpt_block_step,
    make_inputs=make_gpt_inputs,
)


# -- llama_block -------------------------------------------------------------------------------------

MOMENTUM, SGD_LR = 0.9, 0.05


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * w`` over the last dim, computed in fp32 and cast back."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embeddings of ``x [B, H, T, D]`` at int64 ``positions [T]`` (base 10000)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    angles = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))
    scores = torch.where(keep, scores, float("-inf"))
    return scores.float().softmax(-1).to(q.dtype) @ v


def llama_loss(params, tokens, targets):
    p = {k: w.to(BF16) for k, w in params.items()}
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    x = F.embedding(tokens, p["embed"])
    h = rms_norm(x, p["attn_norm"])
    q, k, v = (_heads(h @ p[name]) for name in ("wq", "wk", "wv"))
    att = causal_attention(rope(q, positions), rope(k, positions), v)
    x = x + _merge(att) @ p["wo"]
    h = rms_norm(x, p["mlp_norm"])
    x = x + (F.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]        # SwiGLU
    logits = rms_norm(x, p["final_norm"]) @ p["head"]
    return F.cross_entropy(logits.float().reshape(-1, T_VOCAB), targets.reshape(-1))


def llama_block_step(params, momenta, tokens, targets):
    """Momentum SGD (torch.optim.SGD(momentum=0.9)), functional: ``(loss, new_params, new_momenta)``."""
    grads, loss = torch.func.grad_and_value(llama_loss)(params, tokens, targets)
    new_m = {k: MOMENTUM * momenta[k] + grads[k] for k in params}
    new_p = {k: params[k] - SGD_LR * new_m[k] for k in params}
    return loss, new_p, new_m


def make_llama_inputs(seed: int = 0, device="cpu"):
    gen = seeded_generator(seed)
    c, hid = T_WIDTH, LLAMA_HIDDEN
    params = {
        "embed": randn(gen, T_VOCAB, c, scale=0.3, device=device),
        "attn_norm": torch.ones(c, device=device),
        "wq": randn(gen, c, c, scale=1 / math.sqrt(c), device=device),
        "wk": randn(gen, c, c, scale=1 / math.sqrt(c), device=device),
        "wv": randn(gen, c, c, scale=1 / math.sqrt(c), device=device),
        "wo": randn(gen, c, c, scale=1 / math.sqrt(c), device=device),
        "mlp_norm": torch.ones(c, device=device),
        "w_gate": randn(gen, c, hid, scale=1 / math.sqrt(c), device=device),
        "w_up": randn(gen, c, hid, scale=1 / math.sqrt(c), device=device),
        "w_down": randn(gen, hid, c, scale=1 / math.sqrt(hid), device=device),
        "final_norm": torch.ones(c, device=device),
        "head": randn(gen, c, T_VOCAB, scale=1 / math.sqrt(c), device=device),
    }
    momenta = {k: torch.zeros_like(p) for k, p in params.items()}
    tokens, targets = _tokens(seed, device)
    return params, momenta, tokens, targets


LLAMA_BLOCK = Example(
    name="llama_block",
    description=(
        f"One Llama block on {T_BATCH}x{T_CONTEXT} int64 tokens (vocabulary {T_VOCAB}): RMSNorm, rotary position "
        f"embeddings (sin/cos, rotate_half with cat), hand-written causal attention ({T_HEADS} heads of {T_HEAD}; "
        f"tril mask, softmax), SwiGLU MLP {T_WIDTH}-{LLAMA_HIDDEN}-{T_WIDTH}, untied LM head, cross-entropy; bf16 "
        "compute on fp32 master weights; momentum SGD (0.9), functional."),
    step_fn=llama_block_step,
    make_inputs=make_llama_inputs,
)

EXAMPLES = [GPT_BLOCK, LLAMA_BLOCK]
