"""A transformer training step written with ``nn.Module`` and ``torch.func.functional_call``, several
hundred IR ops: the size of step the hierarchical graph views are built for.

``tiny_gpt_step(blocks)`` returns ``(step, example_inputs)``; the capture attributes its ops to
``blocks.<i>.attn``, ``blocks.<i>.mlp.0`` ... (:mod:`tkx.capture.modules`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
        return self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(d), Attention(d, heads), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, d: int = 32, heads: int = 2, blocks: int = 2, classes: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(blocks))
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tiny_gpt_step(blocks: int = 2) -> tuple[Any, tuple[Any, ...]]:
    """(step, example inputs): cross-entropy of a ``TinyGPT`` over ``[2, 8, 32]`` and one SGD update."""
    torch.manual_seed(0)
    model = TinyGPT(blocks=blocks)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    def step(params, x, y):
        grads, loss = torch.func.grad_and_value(lambda p: F.cross_entropy(
            torch.func.functional_call(model, p, (x,)).reshape(-1, 8), y.reshape(-1)))(params)
        return loss, {k: params[k] - 0.1 * grads[k] for k in params}

    return step, (params, torch.randn(2, 8, 32), torch.randint(0, 8, (2, 8)))
