"""``F.scaled_dot_product_attention`` captured as composite ops (``tkx::attention``, ``tkx::attention_backward``).

While tracing, SDPA without dropout is replaced by :func:`sdpa_composite`: the custom op
``tkx::attention`` (its autograd formula calls ``tkx::attention_backward``), so the IR keeps
attention as two composites (op table rows ``attention`` and ``attention_backward``) and the
scheduler decides between their math and one fused FlashAttention group each
(``Options(fuse_attention=...)``, :mod:`tkx.schedule.attention`). Everything else (dropout,
``enable_gqa``, ``is_causal`` together with ``attn_mask``) keeps going through
:func:`tkx.capture.decompositions.attention_math`, which says what is supported.

Both custom ops compute in float32 (:mod:`tkx.attention_ref`) and return values in the inputs'
dtype, except the saved ``lse`` (float32, ``[*B, L]``).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import attention_ref as ref


@torch.library.custom_op("tkx::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out ``[*B, L, Ev]`` in q's dtype, lse ``[*B, L]`` float32) of ``softmax(q k^T scale + mask) v``."""
    out, lse = ref.forward(q, k, v, mask, causal, scale)
    return out.to(q.dtype), lse


@attention.register_fake
def _attention_fake(q, k, v, mask, causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("tkx::attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor, causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in the dtypes of q, k, v; probabilities recomputed from q, k and lse."""
    dq, dk, dv = ref.backward(q, k, v, mask, out, lse, dout, causal, scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, mask, out, lse, dout, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _Attention(torch.autograd.Function):
    """Autograd of ``tkx::attention`` (an ``autograd.Function`` with ``setup_context``, which
    ``torch.func.grad`` accepts): the backward is the ``tkx::attention_backward`` composite."""

    @staticmethod
    def forward(q, k, v, mask, causal, scale):
        return torch.ops.tkx.attention(q, k, v, mask, causal, scale)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        q, k, v, mask, causal, scale = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask = mask
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor | None, dlse: torch.Tensor | None) -> tuple:
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        with torch.no_grad():  # no double backward through attention
            dq, dk, dv = torch.ops.tkx.attention_backward(q, k, v, ctx.mask, out, lse, dout.contiguous(),
                                                          ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def _install_functionalize_rule() -> None:
    """Let :class:`_Attention` run under ``torch.func.functionalize`` (capture's outer transform).

    torch has no functionalization rule for ``autograd.Function`` yet ("NYI"); ours is pure (no
    mutation), so unwrapping the functional tensors, running its forward one level down and
    wrapping the results is exact. Every other ``autograd.Function`` keeps torch's own rule.
    """
    from torch._C._functorch import TransformType
    from torch._functorch import autograd_function as af
    from torch._functorch import eager_transforms as et

    table = af.custom_function_call.functorch_table
    previous = table.get(TransformType.Functionalize)
    if getattr(previous, "_tkx", False):
        return

    def rule(interpreter: Any, autograd_function: Any, *operands: Any, **kwargs: Any) -> Any:
        if autograd_function is not _Attention:
            return previous(interpreter, autograd_function, *operands, **kwargs)
        level = interpreter.level()
        unwrapped = et._unwrap_all_tensors_from_functional(
            operands, reapply_views=interpreter.functionalize_add_back_views())
        with interpreter.lower():
            out = autograd_function.forward(*unwrapped)
        return et._wrap_all_tensors_to_functional(out, level)

    rule._tkx = True  # type: ignore[attr-defined]
    table[TransformType.Functionalize] = rule


_install_functionalize_rule()


def sdpa_composite(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> torch.Tensor | None:
    """``F.scaled_dot_product_attention`` as the ``tkx::attention`` composite (``dropout_p=0``).

    Shapes: ``query [..., L, E]``, ``key [..., S, E]``, ``value [..., S, Ev]`` (leading dims
    broadcast) -> ``[..., L, Ev]``. Returns ``None`` for the cases the composite does not cover
    (dropout, GQA, a mask that requires grad, causal together with a mask, fewer than 3 dims):
    the caller then uses :func:`~tkx.capture.decompositions.attention_math`, which raises for the
    unsupported ones.
    """
    plain = (dropout_p == 0.0 and not enable_gqa and not (is_causal and attn_mask is not None)
             and query.dim() >= 3 and key.dim() >= 2 and value.dim() >= 2
             and query.is_floating_point() and key.dtype == query.dtype and value.dtype == query.dtype
             and (attn_mask is None or not attn_mask.requires_grad))
    if not plain:
        return None
    lead = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    q = query.expand(*lead, *query.shape[-2:])
    k = key.expand(*lead, *key.shape[-2:])
    v = value.expand(*lead, *value.shape[-2:])
    mask = None
    if attn_mask is not None:
        mask = attn_mask.expand(*lead, q.shape[-2], k.shape[-2])
        if mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
    s = float(scale) if scale is not None else ref.default_scale(query.shape[-1])
    out, _ = _Attention.apply(q, k, v, mask, bool(is_causal), s)
    return out


__all__ = ["attention", "attention_backward", "sdpa_composite"]
