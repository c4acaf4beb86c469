"""``digits_mlp``: a 64-128-10 classifier on scikit-learn's bundled 8x8 digits.

The data ship inside scikit-learn (``sklearn.datasets.load_digits``, no download): 1797 images of
8x8 pixels with values 0..16, scaled here to [0, 1]. The split is fixed: the first 1500 images train,
the remaining 297 test. Without scikit-learn (``pip install 'tkx[examples]'``), a synthetic stand-in
of the same shapes is generated (ten noisy 8x8 prototypes) and the example's description says so.

The step updates its inputs in place, the way ``torch.optim.SGD(momentum=0.9)`` does::

    buf.mul_(momentum).add_(grad)
    param.add_(buf, alpha=-lr)

``step(params, momentum_buf, x, y) -> loss`` with ``params = {w1: (64, 128), b1: (128,), w2: (128, 10),
b2: (10,)}`` (fp32), ``momentum_buf`` the same shapes, ``x: (64, 64)`` fp32 and ``y: (64,)`` int64.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ._base import Example, randn, seeded_generator

BATCH, IN, HIDDEN, CLASSES = 64, 64, 128, 10
LR, MOMENTUM = 0.1, 0.9
N_TRAIN = 1500
N_SYNTHETIC = 1797  # as many images as the real data set


def have_sklearn() -> bool:
    return importlib.util.find_spec("sklearn") is not None


def synthetic_digits(n: int = N_SYNTHETIC, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stand-in for ``load_digits``: ``(images (n, 64) float64 in 0..16, labels (n,) int64)``.

    Ten random 8x8 prototypes (one per class) plus noise, rounded and clipped to 0..16 like the real data.
    Learnable, but it is not handwriting.
    """
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 17, size=(CLASSES, IN)).astype(np.float64)
    labels = rng.permutation(np.arange(n) % CLASSES).astype(np.int64)
    images = np.clip(np.rint(prototypes[labels] + rng.normal(0.0, 3.0, size=(n, IN))), 0, 16)
    return images, labels


@functools.lru_cache(maxsize=2)
def _digits_arrays(use_sklearn: bool = True) -> tuple[np.ndarray, np.ndarray, str]:
    """``(pixels (1797, 64) float32 in [0, 1], labels (1797,) int64, source)``, read once per process."""
    if use_sklearn and have_sklearn():
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images, labels, source = bunch.data, bunch.target, "sklearn"
    else:
        images, labels = synthetic_digits()
        source = "synthetic"
    pixels = (np.asarray(images, dtype=np.float32) / 16.0).reshape(-1, IN)
    return pixels, np.asarray(labels, dtype=np.int64), source


def digits_source() -> str:
    """``"sklearn"`` for the real data set, ``"synthetic"`` for the stand-in."""
    return "sklearn" if have_sklearn() else "synthetic"


def digits_dataset(device="cpu", *, use_sklearn: bool = True):
    """``(x_train (1500, 64) fp32, y_train (1500,) int64, x_test (297, 64) fp32, y_test (297,) int64)``.

    Pixels are scaled to [0, 1]. Fresh tensors on every call. ``use_sklearn=False`` forces the synthetic
    stand-in (which has the same shapes).
    """
    pixels, labels, _ = _digits_arrays(use_sklearn)
    x = torch.tensor(pixels, device=device)
    y = torch.tensor(labels, device=device)
    # clones, so each split owns its storage (no views with offsets into a shared buffer)
    return x[:N_TRAIN].clone(), y[:N_TRAIN].clone(), x[N_TRAIN:].clone(), y[N_TRAIN:].clone()


def digits_batches(
    batch: int = BATCH, seed: int = 0, epochs: int = 1, device="cpu"
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled training batches ``(x (batch, 64) fp32, y (batch,) int64)``, reshuffled every epoch.

    Only full batches are yielded (the last partial one of each epoch is dropped): a compiled step has
    static shapes. The order depends on ``seed`` alone.
    """
    x_train, y_train, _, _ = digits_dataset(device)
    gen = seeded_generator(seed)
    for _ in range(epochs):
        order = torch.randperm(x_train.shape[0], generator=gen).to(device)
        for start in range(0, x_train.shape[0] - batch + 1, batch):
            idx = order[start : start + batch]
            yield x_train[idx], y_train[idx]


def digits_logits(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``relu(x @ w1 + b1) @ w2 + b2``: logits ``(batch, 10)``."""
    return torch.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def digits_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(digits_logits(params, x), y)


def digits_step(
    params: dict[str, torch.Tensor], momentum_buf: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """One momentum-SGD step (lr 0.1, momentum 0.9), updating ``params`` and ``momentum_buf`` in place."""
    grads, loss = torch.func.grad_and_value(digits_loss)(params, x, y)
    for k, p in params.items():
        buf = momentum_buf[k]
        buf.mul_(MOMENTUM).add_(grads[k])
        p.add_(buf, alpha=-LR)
    return loss


@torch.no_grad()
def accuracy(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows of ``x`` whose arg-max logit equals ``y``."""
    return (digits_logits(params, x).argmax(dim=1) == y).float().mean().item()


def init_digits_params(seed: int = 0, device="cpu") -> dict[str, torch.Tensor]:
    """fp32 ``{w1: (64, 128), b1: (128,), w2: (128, 10), b2: (10,)}``; weights ``randn / sqrt(fan_in)``,
    biases ``0.1 * randn``."""
    gen = seeded_generator(seed)
    return {
        "w1": randn(gen, IN, HIDDEN, scale=1 / math.sqrt(IN), device=device),
        "b1": randn(gen, HIDDEN, scale=0.1, device=device),
        "w2": randn(gen, HIDDEN, CLASSES, scale=1 / math.sqrt(HIDDEN), device=device),
        "b2": randn(gen, CLASSES, scale=0.1, device=device),
    }


def make_digits_inputs(seed: int = 0, device="cpu") -> tuple:
    """``(params, momentum_buf, x, y)``: seeded parameters, zero momentum buffers, and the first batch
    of ``digits_batches(64, seed)``: ``x (64, 64)`` fp32, ``y (64,)`` int64."""
    params = init_digits_params(seed, device)
    momentum_buf = {k: torch.zeros_like(p) for k, p in params.items()}
    x, y = next(digits_batches(BATCH, seed=seed, device=device))
    return params, momentum_buf, x, y


def _description() -> str:
    data = (
        "scikit-learn's bundled 8x8 digits (1797 images, first 1500 train)"
        if have_sklearn()
        else "SYNTHETIC 8x8 'digits' (scikit-learn is not installed, so ten noisy prototypes stand in; "
        "pip install 'tkx[examples]' for the real data)"
    )
    return (
        f"64-128-10 ReLU classifier on {data}, pixels / 16, softmax cross-entropy, momentum SGD "
        "(lr 0.1, momentum 0.9) updating params and momentum buffers in place: "
        "step(params, momentum_buf, x, y) -> loss. x: (64, 64) fp32, y: (64,) int64, params fp32 "
        "{w1: (64, 128), b1: (128,), w2: (128, 10), b2: (10,)}."
    )


EXAMPLE = Example(
    name="digits_mlp",
    description=_description(),
    step_fn=digits_step,
    make_inputs=make_digits_inputs,
    loss_output=0,
)
