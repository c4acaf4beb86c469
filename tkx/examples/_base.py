"""The `Example` record shared by every workload in the zoo (pure PyTorch, no tkx imports)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch


@dataclass(frozen=True)
class Example:
    """A static functional training step and a way to make its inputs.

    Attributes:
        name: registry key, e.g. ``"digits_mlp"``.
        description: one paragraph with the shapes, dtypes and optimizer.
        step_fn: the training step. Its positional arguments are pytrees (dicts, tuples) of tensors.
            Two conventions occur in the zoo: *functional* steps take the parameter dict first and
            return ``(loss, new_params)``; *in-place* steps mutate their parameter and optimizer-state
            tensors (as ``torch.optim`` does) and return ``loss``.
        make_inputs: ``make_inputs(seed: int = 0, device="cpu") -> tuple``: a fresh tuple of positional
            arguments for ``step_fn``. The same seed gives the same values; nothing is shared between
            calls, so in-place steps may mutate what it returns.
        loss_output: index of the loss in the flattened output pytree of ``step_fn`` (0 in the zoo).
    """

    name: str
    description: str
    step_fn: Callable[..., Any]
    make_inputs: Callable[..., tuple]
    loss_output: int = 0

    @property
    def example_inputs(self) -> tuple:
        """``make_inputs(0)`` on the CPU: a fresh tuple on every access."""
        return self.make_inputs(0)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``; values are drawn on the CPU and then moved, so a seed
    means the same numbers on every device."""
    return torch.Generator(device="cpu").manual_seed(int(seed))


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0, dtype=torch.float32, device="cpu"):
    """``scale * randn(shape)`` drawn in fp32 from ``gen``, then cast to ``dtype`` and moved to ``device``
    (drawn on ``gen``'s device; on ``meta`` nothing is drawn: shapes only)."""
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    t = torch.randn(shape, generator=gen, dtype=torch.float32, device=gen.device) * scale
    return t.to(device=device, dtype=dtype)


T = TypeVar("T")


def named(registry: Mapping[str, T], name: str, what: str) -> T:
    """``registry[name]``; ``KeyError`` saying there is no ``what`` of that name and naming the available
    ones otherwise."""
    try:
        return registry[name]
    except KeyError:
        raise KeyError(f"no {what} named {name!r}; available: {', '.join(registry)}") from None
