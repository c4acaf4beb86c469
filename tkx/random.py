"""Random numbers inside a compiled step: dropout, ``bernoulli``, ``rand``, ``randn`` from Philox-4x32-10.

A step that draws random numbers needs no wrapper::

    def step(params, x, y):
        loss, grads = torch.func.grad_and_value(loss_fn)(params, x, y)   # F.dropout inside loss_fn
        ...

``F.dropout`` (and ``nn.Dropout``), ``F.dropout1d/2d/3d`` (whole channels),
``torch.rand``/``randn``/``rand_like``/``randn_like``, ``torch.bernoulli`` (and ``x.bernoulli_(p)``),
``F.scaled_dot_product_attention(dropout_p=...)`` and ``nn.MultiheadAttention``'s dropout, anywhere in
the step (also inside a function under ``torch.func.grad``), draw from Philox-4x32-10
keyed by a **Philox state** (int64 ``[2]``: seed, offset) instead of torch's generator: element ``i`` of the
``n``-th number drawn (counted in elements, in program order) is a pure function of (seed, offset, n + i).
Capture makes the state an **implicit input** of the step (``program.rng_input``, named ``rng_state`` in
the views) that the caller does not pass: every run (the kernel, both interpreters, ``exp.run``) draws a
fresh state from torch's default generator (:func:`next_state`), as Inductor seeds its random ops on every
call. So ``torch.manual_seed(s)`` before a run reproduces it, and consecutive runs draw fresh numbers.
A step captured with ``state=`` (``loss.backward()``, ``opt.step()``) is traced with autograd under the
same block, so its random ops (``nn.Dropout``, attention dropout) draw exactly as the eager step does
inside :func:`drawing`.

An explicit state still works: inside ``with tkx.random.philox(state):`` (``state`` an input of the step,
from :func:`philox_state`) draws are keyed by ``state``, and leaving the block advances its offset by one
in place (``state[1] += 1``), so the same state gives the same numbers. Put that block around the
``torch.func.grad`` call, not inside the differentiated function: functorch refuses in-place writes to
captured tensors there (:func:`philox` then raises ``ValueError`` saying so).

Eager PyTorch runs the same code through :func:`tkx.philox.philox_uniform` (a bit-exact torch implementation)
inside :func:`drawing` (``verify()`` runs the eager step so, with the state the kernel got), so eager,
both interpreters and the CUDA kernel (``tkx_philox_uniform``) give the same uniforms bit for bit: a
masked value differs only by ordinary float rounding. Against torch's own stream (the step run eagerly
without :func:`drawing`), which no counter-based generator can reproduce, compare statistics instead:
the keep rate ``1 - p`` of dropout, the mean (1/2) and variance (1/12) of ``rand``, the mean (0) and
variance (1) of ``randn``; ``tests/test_models.py`` and ``tests/test_random_implicit.py`` do.

``randn`` is Box-Muller on two words of one Philox block: ``sqrt(-2 log(1 - u0)) * cos(2 pi u1)``
(``1 - u0`` lies in ``(0, 1]``, so the log is finite). Dropout keeps an element when ``u < 1 - p``
(probability ``1 - p``) and scales kept values by ``1 / (1 - p)``, as ``F.dropout``: the same mask as
``bernoulli_(1 - p)``, which is what autograd records for dropout traced outside :func:`drawing`, so a
graph traced so and replayed inside :func:`drawing` drops the elements the eager step drops.

Limits: a state must be an int64 tensor of shape ``[2]``; anything else raises ``ValueError``. Other
random ops (``randint``, ``normal_``, ``uniform_``, ``multinomial``, ``randperm``, ``F.alpha_dropout``...)
raise :class:`~tkx.errors.UnsupportedError` (``random-op``) at capture.
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


#: Channel dropout functions -> the number of spatial dims after the channel.
_CHANNEL_DROPOUT = {F.dropout1d: 1, F.dropout2d: 2, F.dropout3d: 3}


def _argument(args: tuple, kwargs: dict, position: int, name: str, default: Any) -> Any:
    """Argument ``name`` of a torch function call, given at ``position`` or by keyword."""
    return args[position] if len(args) > position else kwargs.get(name, default)


class _Philox(TorchFunctionMode):
    """Replaces torch's random functions by Philox draws keyed by ``state`` (see the module docstring)."""

    #: True while a generator writes out ``F.multi_head_attention_forward`` (see ``__torch_function__``)
    in_attention = False

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
        """``x`` with each element kept when its uniform is ``< 1 - p`` and scaled by ``1 / (1 - p)``."""
        if p == 0.0:
            return x
        if p == 1.0:
            return x * 0.0
        keep = (self.uniform(x.shape) < 1.0 - p).to(x.dtype)
        return x * keep * (1.0 / (1.0 - p))

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105, C901
        kwargs = dict(kwargs or {})
        if func in (F.dropout, torch.dropout):
            x = args[0]
            p = kwargs.pop("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.pop("training", args[2] if len(args) > 2 else (func is not torch.dropout))
            if not training:
                return x
            if kwargs.pop("inplace", args[3] if len(args) > 3 else False):
                return x.copy_(self.dropout(x, p))
            return self.dropout(x, p)
        if func in _CHANNEL_DROPOUT:  # F.dropout1d/2d/3d: whole channels, one draw per (sample, channel)
            x, p = args[0], _argument(args, kwargs, 1, "p", 0.5)
            if not _argument(args, kwargs, 2, "training", True) or p == 0.0:
                return x
            lead = 2 if x.dim() == _CHANNEL_DROPOUT[func] + 2 else 1  # [N, C, ...] or unbatched [C, ...]
            keep = (self.uniform(x.shape[:lead]) < 1.0 - p).to(x.dtype)
            keep = keep.reshape(*x.shape[:lead], *[1] * (x.dim() - lead))
            y = x * keep * (1.0 / (1.0 - p)) if p < 1.0 else x * 0.0
            return x.copy_(y) if _argument(args, kwargs, 3, "inplace", False) else y
        if func is F.scaled_dot_product_attention and _argument(args, kwargs, 4, "dropout_p", 0.0) > 0.0:
            from .capture.decompositions import attention_math
            return attention_math(*args, **kwargs, dropout=self.dropout)
        if func is F.multi_head_attention_forward and _argument(args, kwargs, 10, "dropout_p", 0.0) > 0.0 \
                and _argument(args, kwargs, 13, "training", True) and not _Philox.in_attention:
            # nn.MultiheadAttention's dropout from Philox; an outer generator (the implicit one around a
            # tkx.random.philox block) passes the nested call through, so the innermost block draws
            from .capture.decompositions import multi_head_attention_math
            _Philox.in_attention = True
            try:
                return multi_head_attention_math(*args, **kwargs, dropout=self.dropout)
            finally:
                _Philox.in_attention = False
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
            return u.to(dtype=dtype, device=kwargs.pop("device", None) or x.device)
        if func in (torch.bernoulli, torch.Tensor.bernoulli):
            p_arg = args[0]
            prob = kwargs.pop("p", args[1] if len(args) > 1 else None)
            u = self.uniform(p_arg.shape).to(p_arg.device)  # drawn on the state's device, compared on p's
            if prob is None:
                return (u < p_arg).to(p_arg.dtype)
            return (u < prob).to(p_arg.dtype)
        if func is torch.Tensor.bernoulli_:  # x.bernoulli_(p=0.5): in place, p a float or a tensor
            x = args[0]
            prob = _argument(args, kwargs, 1, "p", 0.5)
            if kwargs.get("generator") is not None:
                raise ValueError("tkx.random.philox: bernoulli_ with generator= inside the block; drop it")
            return x.copy_((self.uniform(x.shape) < prob).to(x.dtype))
        if func in _ATEN_DRAWS:  # a graph traced earlier (the stateful step's autograd trace) replayed
            return self.aten_draw(func, args, kwargs)
        return func(*args, **kwargs)

    def aten_draw(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The aten-level random ops (``bernoulli``, ``native_dropout``, ``rand``/``randn`` and their
        ``_like`` forms) drawn from Philox, as the torch functions above are."""
        aten = torch.ops.aten
        if func in (aten.bernoulli.p, aten.bernoulli.default, aten.bernoulli_.float, aten.bernoulli_.Tensor):
            x = args[0]
            # bernoulli_.float's p defaults to 0.5, and a traced graph leaves a default argument out
            # (dropout(p=0.5) becomes ``empty_like(x).bernoulli_()``); only bernoulli.default reads x
            prob = _argument(args, kwargs, 1, "p", None if func is aten.bernoulli.default else 0.5)
            u = self.uniform(x.shape).to(x.device)
            draw = (u < (x if prob is None else prob)).to(x.dtype)
            return x.copy_(draw) if func in (aten.bernoulli_.float, aten.bernoulli_.Tensor) else draw
        if func is aten.native_dropout.default:
            x, p, train = args[0], float(args[1]), args[2] if len(args) > 2 else kwargs.get("train")
            if train is False or p == 0.0:
                return x.clone(), torch.ones_like(x, dtype=torch.bool)
            keep = self.uniform(x.shape).to(x.device) < 1.0 - p
            return x * keep.to(x.dtype) * (1.0 / (1.0 - p) if p < 1.0 else 0.0), keep
        like = func in (aten.rand_like.default, aten.randn_like.default)
        shape = args[0].shape if like else args[0]
        dtype = kwargs.get("dtype") or (args[0].dtype if like else torch.get_default_dtype())
        u = self.uniform(shape) if func in (aten.rand.default, aten.rand_like.default) else self.normal(shape)
        device = kwargs.get("device") or (args[0].device if like else None)
        u = u.to(dtype)
        return u if device is None else u.to(device)


_ATEN_DRAWS = frozenset({torch.ops.aten.bernoulli.p, torch.ops.aten.bernoulli.default,
                         torch.ops.aten.bernoulli_.float, torch.ops.aten.bernoulli_.Tensor,
                         torch.ops.aten.native_dropout.default, torch.ops.aten.rand.default,
                         torch.ops.aten.randn.default, torch.ops.aten.rand_like.default,
                         torch.ops.aten.randn_like.default})


@contextlib.contextmanager
def philox(state: torch.Tensor) -> Iterator[None]:
    """Draw torch's random functions from Philox-4x32-10 keyed by ``state`` (int64 ``[seed, offset]``)
    inside the block; the offset advances by one, in place, when the block ends. Raises ``ValueError``
    for a state that is not an int64 tensor of shape ``[2]``. See the module docstring."""
    _check_state(state)
    with _Philox(state):
        yield
    try:
        state.copy_(state + torch.arange(2, dtype=torch.int64, device=state.device))  # [seed, offset + 1]
    except RuntimeError as e:
        if "functorch" not in str(e) and "captured" not in str(e) and "mutat" not in str(e):
            raise
        raise ValueError("tkx.random.philox(state) inside a function differentiated by torch.func (grad, vjp...): "
                         "the offset cannot advance in place there. Drop the block (random ops in a step draw "
                         "from an implicit Philox state without it), or put it around the torch.func.grad call"
                         ) from None


@contextlib.contextmanager
def drawing(state: torch.Tensor) -> Iterator[None]:
    """Draw torch's random functions from Philox keyed by ``state`` (int64 ``[seed, offset]``) inside the
    block, without advancing it. Capture traces every step inside it with the implicit state input;
    run a step eagerly inside it with the state a compiled run got (``flat[program.rng_input]``) and eager
    draws the same numbers. Raises ``ValueError`` for a state that is not an int64 tensor of shape ``[2]``."""
    _check_state(state)
    with _Philox(state):
        yield


def active_state() -> torch.Tensor | None:
    """The Philox state of the innermost :func:`drawing` or :func:`philox` block around the caller, or
    ``None`` outside every such block."""
    from torch.overrides import _get_current_function_mode_stack
    modes = [m for m in _get_current_function_mode_stack() if isinstance(m, _Philox)]
    return modes[-1].state if modes else None


#: The name of the implicit Philox state input in a captured step (``program.rng_input``).
IMPLICIT_NAME = "rng_state"


def next_state(device: Any = None) -> torch.Tensor:
    """A fresh implicit Philox state (int64 ``[seed, offset]`` on ``device``), both words drawn from torch's
    default (CPU) generator: ``torch.manual_seed(s)`` reproduces the sequence of states, whatever the
    device the step runs on."""
    words = torch.randint(0, 2**62, (2,), dtype=torch.int64, generator=torch.default_generator)
    return words if device is None else words.to(device)


def with_state(program: Any, flat: list[Any]) -> list[Any]:
    """``flat`` (the step's own input leaves) with a :func:`next_state` appended when ``program`` draws
    random numbers (``program.rng_input``) and ``flat`` lacks it; else ``flat`` as it is."""
    index = getattr(program, "rng_input", None)
    if index is None or len(flat) != index:
        return flat
    device = next((t.device for t in flat if isinstance(t, torch.Tensor)), None)
    return [*flat, next_state(device)]


__all__ = ["philox", "philox_state", "drawing", "active_state", "next_state", "with_state", "IMPLICIT_NAME"]
