"""The example zoo: static functional training steps in plain PyTorch, ready for ``tkx.capture``.

Each entry is an :class:`Example` (name, description, ``step_fn``, ``make_inputs``, ``loss_output``).
Gradients come from ``torch.func.grad_and_value``; optimizers are written out by hand.

=====================  ==========================================  ============================  ==========
name                   step signature                              shapes (batch, in, hid, out)  dtype
=====================  ==========================================  ============================  ==========
linear_regression      step(params, x, y) -> (loss, new_params)    32, 8, -, 1                   fp32
tiny_online            step(params, x, y) -> (loss, new_params)    1, 64, 128, 1                 fp32
online                 step(params, x, y) -> (loss, new_params)    8, 256, 512, 16               fp32
small                  step(params, x, y) -> (loss, new_params)    64, 512, 1024, 128            bf16
medium                 step(params, x, y) -> (loss, new_params)    256, 1024, 4096, 1024         bf16
digits_mlp             step(params, momentum_buf, x, y) -> loss    64, 64, 128, 10               fp32/int64
layernorm_gelu_adamw   step(params, m, v, beta1_power,             16, 64, 128, 64               fp32
                       beta2_power, x, y) -> loss
mixed_precision        step(params, x, y) -> (loss, new_params)    32, 128, 256, 32              fp32+bf16
char_lm                step(params, m, v, t, tokens, targets)      32x8 tokens, 16, 128, 31      fp32/int64
                       -> loss
q_learning             step(params, m, v, t, target_params, obs,   32, 6, 64, 3                  fp32/int64
                       actions, rewards, next_obs, dones) -> loss
glu_mlp                step(params, velocity, x, y)                64, 16, 2x32, 4               fp32
                       -> (loss, new_params, new_velocity)
poly_clip_adamw        step(params, m, v, t, x, y)                 64, 8x3, 32, 1                fp32
                       -> (loss, new_params, new_m, new_v, t)
gpt_block              step(params, m, v, t, tokens, targets)      4x8 tokens, 32, 2x16, 32      bf16/fp32
                       -> loss
llama_block            step(params, momenta, tokens, targets)      4x8 tokens, 32, 2x16, 32      bf16/fp32
                       -> (loss, new_params, new_momenta)
cnn_digits             step(params, momentum_buf, rng, x, y)       64, 1x8x8, conv 8/16, 10      fp32/int64
                       -> loss
=====================  ==========================================  ============================  ==========

Inference lives apart: :mod:`tkx.examples.decode` holds AMK's decode step (a Llama-style model, bf16 /
int8 / int4 weights, in-place K/V caches, greedy ``argmax``) with its own registry (``decode.get``), since
its step returns tokens rather than a loss.

Functional steps (``-> (loss, new_params)``) mutate nothing; in-place steps (``-> loss``) update their
parameter and optimizer-state arguments the way ``torch.optim`` does. This package imports nothing from
the rest of tkx but :mod:`tkx.random` (``cnn_digits`` draws its dropout in the step).
"""

from __future__ import annotations

from torch.utils._pytree import tree_leaves

from . import cnn, digits, everyday, layernorm_adamw, linear, mixed_precision, mlp, transformer
from ._base import Example, named
from .digits import accuracy, digits_batches, digits_dataset, digits_logits, digits_source

__all__ = [
    "Example",
    "accuracy",
    "all_examples",
    "digits_batches",
    "digits_dataset",
    "digits_logits",
    "digits_source",
    "eager_losses",
    "get",
    "names",
]

_REGISTRY: dict[str, Example] = {
    ex.name: ex
    for ex in [
        linear.EXAMPLE,
        *mlp.EXAMPLES,
        digits.EXAMPLE,
        layernorm_adamw.EXAMPLE,
        mixed_precision.EXAMPLE,
        *everyday.EXAMPLES,
        *transformer.EXAMPLES,
        cnn.EXAMPLE,
    ]
}


def names() -> list[str]:
    """Registered example names, smallest workloads first."""
    return list(_REGISTRY)


def get(name: str) -> Example:
    """The example called ``name``; ``KeyError`` naming the available ones otherwise."""
    return named(_REGISTRY, name, "example")


def all_examples() -> list[Example]:
    """Every registered example, in the order of :func:`names`."""
    return list(_REGISTRY.values())


def eager_losses(example: Example, steps: int = 5, seed: int = 0, device="cpu") -> list[float]:
    """Run ``steps`` eager training steps from ``make_inputs(seed, device)`` and return the losses.

    A functional step returns ``(loss, *new_state)``: its new state replaces the first ``len(new_state)``
    arguments for the next step (``(loss, new_params)`` replaces the parameters); an in-place step
    updates its own arguments, which are simply passed again.
    """
    args = example.make_inputs(seed, device)
    losses = []
    for _ in range(steps):
        out = example.step_fn(*args)
        losses.append(float(tree_leaves(out)[example.loss_output]))
        if isinstance(out, tuple):
            args = (*out[1:], *args[len(out) - 1:])
    return losses
