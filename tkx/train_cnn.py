"""Train ``cnn_digits`` with tkx and with eager PyTorch, side by side (losses and test accuracy).

``python -m tkx.train_cnn [--steps 300] [--out cnn.json] [--backend kernel|interpreter] [--device cpu|cuda]``.
Both loops start from the same weights and the same Philox state and see the same batches, so they
drop the same units; the report gives both loss curves, their largest difference, both test
accuracies and the wall-clock µs per step of each loop (including Python: for a feel, the benchmark
times CUDA-graph replays properly).

``backend="kernel"`` (the default on a GPU) runs the compiled megakernel; ``backend="interpreter"``
runs tkx's schedule interpreter (:func:`tkx.schedule.interpreter.run`: the same groups, stages and
arena as the kernel, computed with torch), which works on a CPU: ``--device cpu --steps 3`` is the
smoke test CI runs.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

from .train_report import compare_losses, print_and_write

BACKENDS = ("kernel", "interpreter")


def _compiled_step(backend: str, inputs: tuple, options: Any) -> tuple[Callable[..., Any], float, dict[str, Any]]:
    """``(step(params, buf, rng, x, y) -> loss, compile seconds, facts)`` for ``backend``."""
    import tkx
    from tkx.examples.cnn import cnn_step

    t0 = time.perf_counter()
    if backend == "kernel":
        runner = tkx.runtime.build(cnn_step, inputs, options, name="cnn_digits")
        facts = {"mode": runner.source.mode, "stages": len(runner.source.schedule.stages)}

        def step(*args: Any) -> Any:
            return runner(*args, check=False)
        step.check_status = runner.check_status  # type: ignore[attr-defined]
        return step, time.perf_counter() - t0, facts
    from tkx.schedule.interpreter import run as run_schedule

    exp = tkx.explore(cnn_step, inputs, options=options, name="cnn_digits")
    schedule, arena = exp.schedule, exp.arena
    facts = {"mode": "schedule interpreter", "stages": len(schedule.stages)}

    def step(*args: Any) -> Any:
        return run_schedule(schedule, arena, args, update_inputs=True).outputs[0]
    return step, time.perf_counter() - t0, facts


def train(steps: int = 300, batch: int = 64, seed: int = 0, *, device: str | None = None,
          backend: str | None = None, options: Any = None) -> dict[str, Any]:
    """Train ``cnn_digits`` for ``steps`` momentum-SGD steps with eager and with tkx; a JSON-ready dict.

    ``device``: ``"cuda"`` when a GPU is there, else ``"cpu"``; ``backend``: ``"kernel"`` on CUDA,
    ``"interpreter"`` on the CPU. ``batch`` must be the example's 64 (the step is compiled for it).
    Keys: ``eager_loss``/``tkx_loss`` (one float per step), ``max_abs_loss_diff`` (and its step),
    ``test_accuracy_eager``/``test_accuracy_tkx`` (fraction of the 297 test digits, no dropout),
    ``wall_us_per_step_*`` (µs), ``compile_seconds``. Raises :class:`tkx.TkxError` for the kernel
    backend without a GPU or an unknown backend.
    """
    import torch

    import tkx
    from tkx.examples import digits
    from tkx.examples.cnn import cnn_accuracy, cnn_step, make_cnn_inputs

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    backend = backend or ("kernel" if dev.type == "cuda" else "interpreter")
    if backend not in BACKENDS:
        raise tkx.TkxError(f"train_cnn: unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "kernel" and dev.type != "cuda":
        raise tkx.TkxError("train_cnn: the kernel backend needs a CUDA GPU; use backend='interpreter' on a CPU")
    if dev.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False  # eager's conv2d in full fp32, as tkx computes it
        torch.backends.cuda.matmul.allow_tf32 = False
    params_e, buf_e, rng_e, _, _ = make_cnn_inputs(seed, device=dev)
    params_k = {k: v.clone() for k, v in params_e.items()}
    buf_k = {k: v.clone() for k, v in buf_e.items()}
    rng_k = rng_e.clone()
    x_train = digits.digits_dataset(dev)[0]
    per_epoch = x_train.shape[0] // batch
    batches = [(xb.contiguous(), yb.contiguous()) for xb, yb in itertools.islice(
        digits.digits_batches(batch, seed, epochs=-(-steps // per_epoch), device=dev), steps)]
    step_k, compile_s, facts = _compiled_step(backend, (params_k, buf_k, rng_k, *batches[0]), options)

    def timed(fn: Callable[..., Any], params: Any, buf: Any, rng: Any) -> tuple[list[float], float]:
        losses = []
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for xb, yb in batches:
            losses.append(fn(params, buf, rng, xb, yb))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return [float(v) for v in losses], (time.perf_counter() - t0) / len(batches) * 1e6

    le, eager_us = timed(cnn_step, params_e, buf_e, rng_e)
    lk, tkx_us = timed(step_k, params_k, buf_k, rng_k)
    if hasattr(step_k, "check_status"):
        step_k.check_status()
    _, _, x_test, y_test = digits.digits_dataset(dev)
    return {
        "example": "cnn_digits", "backend": backend, "device": str(dev), **facts,
        "steps": len(batches), "batch": batch, "data": digits.digits_source(),
        "compile_seconds": compile_s,
        **compare_losses(le, lk, "tkx"),
        "test_accuracy_eager": cnn_accuracy(params_e, x_test, y_test),
        "test_accuracy_tkx": cnn_accuracy(params_k, x_test, y_test),
        "rng_offsets_agree": bool(torch.equal(rng_e, rng_k)),
        "wall_us_per_step_eager": eager_us, "wall_us_per_step_tkx": tkx_us,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default=None, help="cuda (default when there is a GPU) or cpu")
    ap.add_argument("--backend", default=None, choices=BACKENDS,
                    help="kernel (default on CUDA) or interpreter (default on the CPU)")
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    return print_and_write(train(args.steps, device=args.device, backend=args.backend), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
