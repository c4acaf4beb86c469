"""Random numbers inside a compiled step: dropout, ``bernoulli``, ``rand``, ``randn`` from Philox-4x32-10.

A step that draws random numbers takes a **Philox state** (int64 tensor ``[2]``: seed, offset) as one of
its inputs and draws inside ``with tkx.random.philox(state):``::

    state = tkx.random.philox_state(seed=0)

    def step(params, x, y, state):
        with tkx.random.philox(state):
            loss, grads = torch.func.grad_and_value(loss_fn)(params, x, y)   # F.dropout inside
        ...

Inside the block, ``F.dropout`` (and ``nn.Dropout``), ``torch.rand``/``randn``/``rand_like``/``randn_like``,
``torch.bernoulli``, ``F.scaled_dot_product_attention(dropout_p=...)`` draw from Philox-4x32-10 instead of
torch's generator: element ``i`` of the ``n``-th number drawn in the block (counted in elements, in program
order) is a pure function of (seed, offset, n + i). Leaving the block advances the offset by one in place
(``state[1] += 1``), so consecutive steps draw fresh numbers and the same state gives the same numbers.

Eager PyTorch runs the same code through :func:`tkx.philox.philox_uniform` (a bit-exact torch implementation),
so eager, both interpreters and the CUDA kernel (``tkx_philox_uniform``) give the same uniforms bit for
bit: a masked value differs only by ordinary float rounding. Against torch's own stream (the same step
without the block), which no counter-based generator can reproduce, compare statistics instead: the keep
rate ``1 - p`` of dropout, the mean (1/2) and variance (1/12) of ``rand``, the mean (0) and variance (1) of
``randn``; ``tests/test_models.py`` does.

``randn`` is Box-Muller on two words of one Philox block: ``sqrt(-2 log(1 - u0)) * cos(2 pi u1)``
(``1 - u0`` lies in ``(0, 1]``, so the log is finite). Dropout keeps an element when ``u >= p``
(probability ``1 - p``) and scales kept values by ``1 / (1 - p)``, as ``F.dropout``.

Limits: advance the offset outside ``torch.func.grad`` (put the block around the ``grad`` call, not inside
the loss function): functorch refuses in-place writes to captured tensors. The state must be an int64
tensor of shape ``[2]``; anything else raises ``ValueError``. Random ops outside the block raise
:class:`~tkx.errors.UnsupportedError` (``random-op``) at capture.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .philox import philox_uniform


@torch.library.custom_op("tkx::philox_uniform", mutates_args=())
def _uniform_op(state: torch.Tensor, size: Sequence[int], base: int, word: int) -> torch.Tensor:
    """float32 ``[size]`` uniforms in ``[0, 1)``: word ``word`` of Philox blocks ``base .. base + numel``."""
    n = math.prod(size)
    counter = base + torch.arange(n, dtype=torch.int64, device=state.device)
    return philox_uniform(state[0], state[1], counter, word).reshape(tuple(size))


@_uniform_op.register_fake
def _uniform_fake(state, size, base, word):
    return state.new_empty(tuple(size), dtype=torch.float32)


def philox_state(seed: int = 0, offset: int = 0, device: Any = None) -> torch.Tensor:
    """A Philox state: ``torch.tensor([seed, offset], dtype=torch.int64)`` on ``device``."""
    return torch.tensor([int(seed), int(offset)], dtype=torch.int64, device=device)


def _check_state(state: Any) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.int64 or tuple(state.shape) != (2,):
        got = (f"{state.dtype} tensor of shape {list(state.shape)}" if isinstance(state, torch.Tensor)
               else type(state).__name__)
        raise ValueError(f"tkx.random.philox needs an int64 tensor of shape [2] (seed, offset), got {got}; "
                         "make one with tkx.random.philox_state(seed)")


class _Philox(TorchFunctionMode):
    """Replaces torch's random functions by Philox draws keyed by ``state`` (see the module docstring)."""

    def __init__(self, state: torch.Tensor) -> None:
        super().__init__()
        self.state = state
        self.drawn = 0  # elements drawn so far in this block: the counter base of the next draw

    def uniform(self, shape: Sequence[int], word: int = 0, *, advance: bool = True) -> torch.Tensor:
        shape = [int(d) for d in shape]
        u = torch.ops.tkx.philox_uniform(self.state, shape, self.drawn, word)
        if advance:
            self.drawn += math.prod(shape)
        return u

    def normal(self, shape: Sequence[int]) -> torch.Tensor:
        u0 = self.uniform(shape, 0, advance=False)
        u1 = self.uniform(shape, 1)
        return torch.sqrt(-2.0 * torch.log(1.0 - u0)) * torch.cos((2.0 * math.pi) * u1)

    def dropout(self, x: torch.Tensor, p: float) -> torch.Tensor:
        """``x`` with each element kept when its uniform is ``>= p`` and scaled by ``1 / (1 - p)``."""
        if p == 0.0:
            return x
        if p == 1.0:
            return x * 0.0
        keep = (self.uniform(x.shape) >= p).to(x.dtype)
        return x * keep * (1.0 / (1.0 - p))

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105, C901
        kwargs = dict(kwargs or {})
        if func in (F.dropout, torch.dropout):
            x = args[0]
            p = kwargs.pop("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.pop("training", args[2] if len(args) > 2 else (func is not torch.dropout))
            if kwargs.pop("inplace", args[3] if len(args) > 3 else False):
                raise ValueError("tkx.random.philox: F.dropout(inplace=True) is not supported; use inplace=False")
            return self.dropout(x, p) if training else x
        if func is F.scaled_dot_product_attention:
            from .capture.decompositions import attention_math
            return attention_math(*args, **kwargs, dropout=self.dropout)
        if func is F.multi_head_attention_forward:  # nn.MultiheadAttention: its SDPA's dropout from Philox too
            from .capture.decompositions import multi_head_attention_math
            return multi_head_attention_math(*args, **kwargs, dropout=self.dropout)
        if func in (torch.rand, torch.randn):
            size = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)) else args
            if kwargs.pop("generator", None) is not None:
                raise ValueError("tkx.random.philox: torch.rand/randn with generator= inside the block; drop it")
            dtype = kwargs.pop("dtype", None) or torch.get_default_dtype()
            device = kwargs.pop("device", None)
            u = self.uniform(size) if func is torch.rand else self.normal(size)
            u = u.to(dtype)
            return u if device is None else u.to(device)
        if func in (torch.rand_like, torch.randn_like):
            x = args[0]
            dtype = kwargs.pop("dtype", None) or x.dtype
            u = self.uniform(x.shape) if func is torch.rand_like else self.normal(x.shape)
            return u.to(dtype)
        if func in (torch.bernoulli, torch.Tensor.bernoulli):
            p_arg = args[0]
            prob = kwargs.pop("p", args[1] if len(args) > 1 else None)
            u = self.uniform(p_arg.shape)
            if prob is None:
                return (u < p_arg).to(p_arg.dtype)
            return (u < prob).to(p_arg.dtype)
        return func(*args, **kwargs)


@contextlib.contextmanager
def philox(state: torch.Tensor) -> Iterator[None]:
    """Draw torch's random functions from Philox-4x32-10 keyed by ``state`` (int64 ``[seed, offset]``)
    inside the block; the offset advances by one, in place, when the block ends. Raises ``ValueError``
    for a state that is not an int64 tensor of shape ``[2]``. See the module docstring."""
    _check_state(state)
    with _Philox(state):
        yield
    state.copy_(state + torch.arange(2, dtype=torch.int64, device=state.device))  # [seed, offset + 1]


__all__ = ["philox", "philox_state"]
