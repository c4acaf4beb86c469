"""Module-and-optimizer training steps as the PyTorch tutorials write them, and the checks that compare
a compiled run of them with eager PyTorch on a deep copy (shared by the CPU and GPU tests)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(nn.Module):
    """conv -> BatchNorm -> ReLU -> max-pool -> linear (the conv has no bias: BatchNorm follows)."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 64) -> None:
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe[: x.size(1)]


class TransformerLM(nn.Module):
    """Embedding, sinusoidal positions, one causal ``nn.TransformerEncoderLayer``, a linear decoder."""

    def __init__(self, vocab: int = 16, d_model: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = PositionalEncoding(d_model)
        self.layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.decoder = nn.Linear(d_model, vocab)
        self.d_model = d_model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        h = self.pos(self.embed(tokens) * math.sqrt(self.d_model))
        return self.decoder(self.layer(h, src_mask=mask, is_causal=True))


def classify_step(model: nn.Module, opt: torch.optim.Optimizer, *, clip: float | None = None) -> Callable:
    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        return loss
    return train_step


def lm_step(model: nn.Module, opt: torch.optim.Optimizer) -> Callable:
    def train_step(tokens, targets):
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return train_step


def accumulate_step(model: nn.Module, opt: torch.optim.Optimizer, micro: int = 2) -> Callable:
    """Gradient accumulation over ``micro`` micro-batches inside one step."""
    def train_step(x, y):
        total = torch.zeros(())
        for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
            loss = F.cross_entropy(model(xb), yb) / micro
            loss.backward()
            total = total + loss.detach()
        opt.step()
        opt.zero_grad()
        return total
    return train_step


def twin(make_model: Callable[[], nn.Module], make_opt: Callable, device: str = "cpu", seed: int = 0):
    """The same model and optimizer twice: ``(model, opt)`` for tkx and a deep copy for eager."""
    torch.manual_seed(seed)
    model = make_model().to(device)
    other = copy.deepcopy(model)
    return (model, make_opt(model.parameters())), (other, make_opt(other.parameters()))


def assert_same_state(a: tuple, b: tuple, *, rtol: float = 1e-4, atol: float = 1e-5,
                      noise: dict[str, tuple[slice, float]] | None = None) -> None:
    """Parameters, buffers, gradients (None or not) and optimizer state of two (model, opt) pairs agree.

    ``noise``: state_dict name -> (the elements whose true gradient is zero, their absolute bound).
    Adam moves such an element by up to a learning rate per step of pure rounding noise (the key
    bias of attention: softmax is invariant to it), in eager as in any other order of summation."""
    (m1, o1), (m2, o2) = a, b
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    for k in s1:
        x, y = s1[k], s2[k]
        if noise and k in noise:
            part, bound = noise[k]
            torch.testing.assert_close(x[part], y[part], rtol=0.0, atol=bound)
            x, y = x.clone(), y.clone()
            x[part] = y[part]
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")
    for (name, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        assert (p1.grad is None) == (p2.grad is None), name
        if p1.grad is not None:
            torch.testing.assert_close(p1.grad, p2.grad, rtol=rtol, atol=atol)
        st1, st2 = o1.state.get(p1, {}), o2.state.get(p2, {})
        assert st1.keys() == st2.keys(), (name, st1.keys(), st2.keys())
        for k in st1:
            assert st1[k].device == st2[k].device, (name, k)
            torch.testing.assert_close(st1[k], st2[k], rtol=rtol, atol=atol,
                                       msg=lambda m, k=k, name=name: f"{name} {k}: {m}")
    for g1, g2 in zip(o1.param_groups, o2.param_groups):
        assert g1["lr"] == g2["lr"]


def run_both(compiled: Callable, eager: Callable, batches: list, *, between: Callable | None = None,
             rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Call the compiled and the eager step on each batch; the losses agree at every step."""
    for i, batch in enumerate(batches):
        got = compiled(*batch)
        want = eager(*batch)
        torch.testing.assert_close(got.detach(), want.detach(), rtol=rtol, atol=atol,
                                   msg=lambda m, i=i: f"step {i}: {m}")
        if between is not None:
            between()
