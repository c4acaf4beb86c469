"""Scaled dot-product attention written out in torch: the meaning of the IR's attention composites.

The IR keeps ``F.scaled_dot_product_attention`` as two composite ops (rows ``attention`` and
``attention_backward`` of :mod:`tkx.ops`); both CPU interpreters evaluate them with the
functions here, the scheduler either expands them to this math (:mod:`tkx.schedule.attention`)
or emits one fused FlashAttention group for each (:mod:`tkx.codegen.attention`).

Shapes: ``q [*B, L, E]``, ``k [*B, S, E]``, ``v [*B, S, Ev]``, ``mask`` broadcast to ``[*B, L, S]``
(``bool``: keep where True; float: added to the scores) or ``None``; ``causal`` keeps key ``j``
for query ``i`` when ``j <= i`` (top-left aligned, as torch). All arithmetic in float32.

Packed layouts (one float32 root buffer per composite, read through views):

* forward: ``[out (prod(B)*L*Ev) | lse (prod(B)*L)]``; ``lse[i] = log(sum_j exp(s[i, j]))``
  (``-inf`` for a row with every key masked);
* backward: ``[dq (prod(B)*L*E) | dk (prod(B)*S*E) | dv (prod(B)*S*Ev)]``.

A query row that sees no key (every key masked: left padding under a causal mask, a key-padding mask
of an all-padding sequence) gives an output of zeros and zero gradients, as
``F.scaled_dot_product_attention``'s default and math backends do in torch 2.13 (a "safe" softmax,
``aten._safe_softmax``). ``empty_rows="nan"`` keeps the plain softmax's 0/0 instead: attention
written by hand (``softmax(scores) @ v``) is NaN in eager PyTorch there, and so in tkx. Only a mask can
empty a row (the causal triangle is top-left aligned, so query 0 always sees key 0).
"""

from __future__ import annotations

import math

import torch


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float32 (float64 stays float64: the verifier's float64 run of the reference)."""
    return t if t.dtype == torch.float64 else t.float()


def scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float) -> torch.Tensor:
    """``q @ k^T * scale`` with the masks applied (float32, ``[*B, L, S]``)."""
    s = (_wide(q) @ _wide(k).transpose(-2, -1)) * scale
    if causal:
        n_q, n_k = s.shape[-2], s.shape[-1]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            s = s.masked_fill(~mask, float("-inf"))
        else:
            s = s + _wide(mask)
    return s


def _shift(lse: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """What the probabilities subtract from the scores: ``lse``, and ``+inf`` on a row whose ``lse`` is
    ``-inf`` (every key masked) so that ``exp(s - shift)`` is 0 there instead of ``exp(-inf + inf) = NaN``.
    Without a mask no row is empty and ``lse`` is returned as it is."""
    if mask is None:
        return lse
    return torch.where(lse == float("-inf"), float("inf"), lse)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
            scale: float, empty_rows: str = "zero") -> tuple[torch.Tensor, torch.Tensor]:
    """(out ``[*B, L, Ev]``, lse ``[*B, L]``), both float32. A row that sees no key: out 0 (``empty_rows=
    "zero"``, torch's SDPA) or NaN (``"nan"``, the plain softmax of attention written by hand); lse ``-inf``."""
    s = scores(q, k, mask, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - (_shift(lse, mask) if empty_rows == "zero" else lse).unsqueeze(-1))
    return p @ _wide(v), lse


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, out: torch.Tensor,
             lse: torch.Tensor, dout: torch.Tensor, causal: bool, scale: float
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in float32, the probabilities recomputed from ``q``, ``k`` and ``lse``; a row that sees
    no key has probabilities 0 and contributes nothing (dq 0 on that row).

    The softmax backward ``dS = P * (dP - rowsum(P * dP))`` is eager's form (``_softmax_backward_data``):
    where one key takes all the weight (``P`` is 1 there and 0 elsewhere - a single key, or scores far
    apart) ``dS`` is exactly 0. FlashAttention's ``rowsum(dO * out)`` equals ``rowsum(P * dP)`` in exact
    arithmetic only, and its rounding there is a nonzero gradient that Adam scales to a full step. ``out``
    is unused (kept for the composite's signature)."""
    del out
    s = scores(q, k, mask, causal, scale)
    p = torch.exp(s - _shift(_wide(lse), mask).unsqueeze(-1))
    do = _wide(dout)
    dv = p.transpose(-2, -1) @ do
    dp = do @ _wide(v).transpose(-2, -1)
    d = (p * dp).sum(dim=-1, keepdim=True)
    ds = p * (dp - d)
    dq = (ds @ _wide(k)) * scale
    dk = (ds.transpose(-2, -1) @ _wide(q)) * scale
    return dq, dk, dv


def default_scale(head_dim: int) -> float:
    """``1 / sqrt(E)``, SDPA's default."""
    return 1.0 / math.sqrt(head_dim)


def packed_forward(q, k, v, mask, causal: bool, scale: float, empty_rows: str = "zero") -> torch.Tensor:
    """The forward composite's float32 root buffer ``[out | lse]`` (flat)."""
    out, lse = forward(q, k, v, mask, causal, scale, empty_rows)
    return torch.cat([out.reshape(-1), lse.reshape(-1)])


def packed_backward(q, k, v, mask, out, lse, dout, causal: bool, scale: float) -> torch.Tensor:
    """The backward composite's float32 root buffer ``[dq | dk | dv]`` (flat)."""
    return torch.cat([t.reshape(-1) for t in backward(q, k, v, mask, out, lse, dout, causal, scale)])


__all__ = ["scores", "forward", "backward", "default_scale", "packed_forward", "packed_backward"]
