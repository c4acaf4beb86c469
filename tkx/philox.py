"""Philox-4x32-10 in int64 torch arithmetic, bit-exact with the kernel's ``tkx_philox_uniform``.

Eager PyTorch (through ``torch.ops.tkx.philox_uniform``, see :mod:`tkx.random`), both interpreters (the
``philox`` row of :mod:`tkx.ops`) and the CUDA prelude draw the same uniforms from the same
(seed, offset, counter). Known-answer vectors of Random123 check :func:`philox4x32_10`
(``tests/test_models.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from .dtypes import TORCH

#: Philox-4x32-10 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_M32 = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of ``a * b`` for ``0 <= a, b < 2**32``, exactly, in int64 tensors
    (16-bit limbs, so that no intermediate product leaves the int64 range)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
    lo = ((mid & 0xFFFF) << 16) | (ll & 0xFFFF)
    hi = hh + (lh >> 16) + (hl >> 16) + (mid >> 16)
    return hi, lo


def philox4x32_10(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32-10 (the generator of cuRAND and of PyTorch's CUDA RNG), bit-exact in int64 torch
    arithmetic: four 32-bit counter words and two 32-bit key words (int64 tensors holding values in
    ``[0, 2**32)``, broadcastable) -> four 32-bit output words. Ten rounds; the key is bumped by the
    Weyl constants between rounds."""
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) & _M32 for c in counter)
    k0, k1 = (torch.as_tensor(k, dtype=torch.int64) & _M32 for k in key)
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _M32, (k1 + PHILOX_W1) & _M32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox_uniform(seed: torch.Tensor, offset: torch.Tensor, counter: torch.Tensor, word: int) -> torch.Tensor:
    """float32 uniform in ``[0, 1)`` (multiples of 2**-24) from word ``word`` of Philox-4x32-10 with
    key = the two 32-bit halves of ``seed`` and counter = (``counter`` low, high, ``offset`` low,
    high); int64 tensors, broadcast together. The kernel's ``tkx_philox_uniform`` is the same."""
    seed, offset, counter = (torch.as_tensor(t, dtype=torch.int64) for t in (seed, offset, counter))
    words = philox4x32_10((counter & _M32, (counter >> 32) & _M32, offset & _M32, (offset >> 32) & _M32),
                          (seed & _M32, (seed >> 32) & _M32))
    return (words[word] >> 8).to(torch.float32) * (2.0 ** -24)


def reference(op: Any, args: list[Any], device: torch.device) -> torch.Tensor:
    seed, offset, counter = (a if isinstance(a, torch.Tensor) else torch.tensor(a, device=device) for a in args)
    shape = torch.broadcast_shapes(seed.shape, offset.shape, counter.shape)
    return philox_uniform(seed, offset, counter, int(op.attr("word", 0))).expand(shape).to(TORCH[op.out.dtype])


__all__ = ["philox4x32_10", "philox_uniform", "reference", "PHILOX_M0", "PHILOX_M1", "PHILOX_W0", "PHILOX_W1"]
