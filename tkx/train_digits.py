"""Train ``digits_mlp`` on the GPU with the megakernel and with eager PyTorch, side by side.

``python -m tkx.train_digits [--steps 300] [--out digits.json]``: both start from the same
weights and see the same batches; the report gives both loss curves, their largest
difference, both test accuracies, and the µs per step of each loop (wall clock, including
Python, for a feel; the benchmark times CUDA-graph replays properly).
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

from .train_report import compare_losses, print_and_write


def train(steps: int = 300, batch: int = 64, seed: int = 0, options: Any = None) -> dict[str, Any]:
    """Run both training loops; returns a JSON-ready dict. Raises :class:`tkx.TkxError` without a GPU."""
    import torch

    import tkx
    from tkx.examples import digits

    if not torch.cuda.is_available():
        raise tkx.TkxError("train_digits needs a CUDA GPU (the megakernel runs there)")
    dev = torch.device("cuda")
    ex = tkx.examples.get("digits_mlp")
    x_train, y_train, x_test, y_test = digits.digits_dataset(device=dev)
    params_e, buf_e, _, _ = ex.make_inputs(seed, device=dev)
    params_k = {k: v.clone() for k, v in params_e.items()}
    buf_k = {k: v.clone() for k, v in buf_e.items()}
    per_epoch = x_train.shape[0] // batch
    batches = [(xb.contiguous(), yb.contiguous()) for xb, yb in itertools.islice(
        digits.digits_batches(batch, seed, epochs=-(-steps // per_epoch), device=dev), steps)]
    t0 = time.perf_counter()
    runner = tkx.runtime.build(ex.step_fn, (params_k, buf_k, *batches[0]), options, name="digits_mlp")
    compile_s = time.perf_counter() - t0
    eager_losses, kernel_losses = [], []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for xb, yb in batches:
        eager_losses.append(ex.step_fn(params_e, buf_e, xb, yb))
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - t0) / steps * 1e6
    t0 = time.perf_counter()
    for xb, yb in batches:
        kernel_losses.append(runner(params_k, buf_k, xb, yb, check=False))
    torch.cuda.synchronize()
    kernel_us = (time.perf_counter() - t0) / steps * 1e6
    runner.check_status()
    return {
        "steps": steps, "batch": batch, "data": digits.digits_source(),
        "compile_seconds": compile_s,
        **compare_losses([float(v) for v in eager_losses], [float(v) for v in kernel_losses], "megakernel"),
        "test_accuracy_eager": digits.accuracy(params_e, x_test, y_test),
        "test_accuracy_megakernel": digits.accuracy(params_k, x_test, y_test),
        "wall_us_per_step_eager": eager_us, "wall_us_per_step_megakernel": kernel_us,
        "mode": runner.source.mode if hasattr(runner, "source") else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    return print_and_write(train(args.steps), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
