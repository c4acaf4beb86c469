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

from dataclasses import dataclass, replace
from typing import Any

import torch

from .. import attention_ref as ref


@torch.library.custom_op("tkx::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
              scale: float, empty_rows: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out ``[*B, L, Ev]`` in q's dtype, lse ``[*B, L]`` float32) of ``softmax(q k^T scale + mask) v``; a row
    that sees no key is 0 (``empty_rows="zero"``, SDPA) or NaN (``"nan"``, attention written by hand)."""
    out, lse = ref.forward(q, k, v, mask, causal, scale, empty_rows)
    return out.to(q.dtype), lse


@attention.register_fake
def _attention_fake(q, k, v, mask, causal, scale, empty_rows):
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
    def forward(q, k, v, mask, causal, scale, empty_rows):
        return torch.ops.tkx.attention(q, k, v, mask, causal, scale, empty_rows)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        q, k, v, mask, causal, scale, _ = inputs
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
        return dq, dk, dv, None, None, None, None


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


try:
    _install_functionalize_rule()
    #: False where this torch has no room for the rule (its functorch internals moved): SDPA then lowers to
    #: its math at capture, as before the composite existed, and no attention decision appears.
    COMPOSITE_AVAILABLE = True
except (ImportError, AttributeError, TypeError):  # pragma: no cover - depends on torch's internals
    COMPOSITE_AVAILABLE = False


def sdpa_composite(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False, *, empty_rows: str = "zero") -> torch.Tensor | None:
    """``F.scaled_dot_product_attention`` as the ``tkx::attention`` composite (``dropout_p=0``).

    Shapes: ``query [..., L, E]``, ``key [..., S, E]``, ``value [..., S, Ev]`` (leading dims
    broadcast) -> ``[..., L, Ev]``. A query row whose keys are all masked gives zeros (SDPA's
    behaviour) or, with ``empty_rows="nan"``, NaN (a plain softmax's, for attention written by
    hand); see :mod:`tkx.attention_ref`. Returns ``None`` for the cases the composite does not cover
    (dropout, GQA, a mask that requires grad, causal together with a mask, fewer than 3 dims):
    the caller then uses :func:`~tkx.capture.decompositions.attention_math`, which raises for the
    unsupported ones.
    """
    plain = (dropout_p == 0.0 and not enable_gqa and not (is_causal and attn_mask is not None)
             and query.dim() >= 3 and key.dim() >= 2 and value.dim() >= 2
             and query.is_floating_point() and key.dtype == query.dtype and value.dtype == query.dtype
             and (attn_mask is None or not attn_mask.requires_grad))
    if not plain or not COMPOSITE_AVAILABLE:
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
    out, _ = _Attention.apply(q, k, v, mask, bool(is_causal), s, empty_rows)
    return out


@dataclass
class _Scores:
    """What is known about a tensor on the way from ``q @ k^T`` to ``softmax(...) @ v``."""

    q: torch.Tensor
    kt: torch.Tensor          # k transposed, as the user multiplied it
    scale: float = 1.0
    keep: torch.Tensor | None = None      # boolean mask: keep where True
    additive: torch.Tensor | None = None  # added to the scores
    probs: bool = False                   # softmax taken over the last dim


def _is_neg_inf(x: Any) -> bool:
    return isinstance(x, float) and x == float("-inf")


class HandWrittenAttention:
    """Recognises attention written by hand while tracing and captures it as the composite.

    Followed through the torch functions the step calls (``SourceTagMode`` asks :meth:`before` and
    :meth:`after` about each): ``scores = q @ k^T`` (``matmul``), optionally ``* c`` or ``/ c`` with a
    Python number (before any mask), a boolean mask (``torch.where(keep, scores, -inf)``,
    ``torch.where(m, -inf, scores)``, ``scores.masked_fill(m, -inf)``) and/or an additive one
    (``scores + mask``), dtype casts (``.float()``, ``.to(dtype)``), ``softmax(dim=-1)``, casts, then
    ``probs @ v``. That last matmul returns :func:`sdpa_composite` of ``(q, k, v)`` instead, so the
    scheduler may fuse it (the traced scores and softmax are then dead code, and autograd differentiates
    the composite). The composite computes in float32 and rounds once at the end, where the hand-written
    bf16/fp16 chain rounds after every op (the FlashAttention numerics: within the dtype's rounding of
    eager). Anything else on the way (dropout, a ``finfo.min`` fill, another reader's change) simply stops
    the recognition: the attention then compiles as written.
    """

    def __init__(self) -> None:
        self.known: dict[int, tuple[torch.Tensor, _Scores]] = {}

    def _get(self, x: Any) -> _Scores | None:
        hit = self.known.get(id(x)) if isinstance(x, torch.Tensor) else None
        return hit[1] if hit is not None and hit[0] is x else None

    def _put(self, result: Any, info: _Scores) -> None:
        if isinstance(result, torch.Tensor):
            self.known[id(result)] = (result, info)

    def before(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The composite's output when ``func(*args)`` is ``probs @ v`` of recognised attention."""
        if getattr(func, "__name__", "") != "matmul" or len(args) != 2 or kwargs:
            return None
        info, v = self._get(args[0]), args[1]
        if info is None or not info.probs or not isinstance(v, torch.Tensor):
            return None
        q, k = info.q, info.kt.transpose(-2, -1)
        if not (q.dtype == k.dtype == v.dtype == args[0].dtype) or (
                info.keep is not None and info.additive is not None):
            return None
        mask = info.keep if info.keep is not None else info.additive
        if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
            return None
        try:  # a row masked whole is NaN in eager's softmax: the composite keeps that
            return sdpa_composite(q, k, v, attn_mask=mask, scale=info.scale, empty_rows="nan")
        except RuntimeError:  # shapes that do not broadcast as attention: compile as written
            return None

    def after(self, func: Any, args: tuple, kwargs: dict, result: Any) -> None:
        """Follow ``result = func(*args, **kwargs)`` along the attention pattern."""
        name = getattr(func, "__name__", "")
        if not isinstance(result, torch.Tensor) or not result.is_floating_point():
            return
        if name == "matmul" and len(args) == 2 and not kwargs and all(isinstance(a, torch.Tensor) for a in args):
            a, b = args
            if a.dim() >= 3 and b.dim() >= 2 and a.is_floating_point():
                self._put(result, _Scores(a, b))
            return
        x = args[0] if args else None
        info = self._get(x)
        if name in ("where",) and len(args) == 3:
            cond, a, b = args
            for scores, other, keep_when in ((a, b, True), (b, a, False)):
                si = self._get(scores)
                if si is not None and not si.probs and si.keep is None and _is_neg_inf(other) \
                        and isinstance(cond, torch.Tensor) and cond.dtype == torch.bool \
                        and result.shape == scores.shape:
                    self._put(result, replace(si, keep=cond if keep_when else cond.logical_not()))
                    return
            return
        if info is None:
            return
        if result.shape != x.shape:
            return
        if name in ("float", "double", "half", "bfloat16", "to", "type_as", "contiguous"):
            self._put(result, info)
            return
        if info.probs:
            return
        rest = [a for a in args[1:]] + list(kwargs.values())
        if name in ("div", "mul", "__truediv__", "__mul__", "__rmul__") and len(rest) == 1 \
                and isinstance(rest[0], (int, float)) and not isinstance(rest[0], bool) and rest[0] != 0 \
                and info.keep is None and info.additive is None:
            c = float(rest[0])
            self._put(result, replace(info, scale=info.scale / c if name in ("div", "__truediv__") else info.scale * c))
            return
        if name == "masked_fill" and len(rest) == 2 and isinstance(rest[0], torch.Tensor) and _is_neg_inf(rest[1]) \
                and rest[0].dtype == torch.bool and info.keep is None:
            self._put(result, replace(info, keep=rest[0].logical_not()))
            return
        if name in ("add", "__add__") and len(rest) == 1 and isinstance(rest[0], torch.Tensor) \
                and info.additive is None:
            self._put(result, replace(info, additive=rest[0]))
            return
        if name == "softmax":
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if dim is not None and int(dim) % x.dim() == x.dim() - 1:
                self._put(result, replace(info, probs=True))


__all__ = ["attention", "attention_backward", "sdpa_composite", "HandWrittenAttention"]
