"""Timing on the GPU: CUDA events around batches of steps, and CUDA-graph capture of a callable.

:func:`time_steps` calls ``fns[i % len(fns)]()`` (each enqueues one training step on the
current stream: a graph replay or an eager call) in batches between two CUDA events. The
batch size is chosen from a calibration run so a sample lasts about ``target_us``. With
``queue_ahead=True`` a short ``torch.cuda._sleep`` kernel runs before each batch so the CPU
has enqueued the batch before the GPU reaches it: samples then measure the GPU, not the
CPU's launch rate (plain eager is timed without it, as its CPU cost is part of what it costs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Clock assumed for ``torch.cuda._sleep`` when the device does not report one (kHz).
DEFAULT_CLOCK_KHZ = 1_980_000


def _sleep_cycles(device: torch.device, microseconds: float) -> int:
    props = torch.cuda.get_device_properties(device)
    khz = getattr(props, "clock_rate", None) or DEFAULT_CLOCK_KHZ
    return int(microseconds * khz / 1000)


def time_steps(fns: Sequence[Callable[[], Any]], device: torch.device, *, repeats: int = 9, warmup: int = 3,
               target_us: float = 2000.0, queue_ahead: bool = True,
               max_steps: int = 2000) -> tuple[list[float], int]:
    """``(samples, steps_per_sample)``: µs per step for each of ``repeats`` samples.

    Each sample times a batch of steps cycling through ``fns`` (so several input sets are
    rotated); the batch holds a multiple of ``len(fns)`` steps.
    """
    n = len(fns)
    if n == 0:
        raise ValueError("nothing to time")
    for _ in range(max(0, warmup)):
        for f in fns:
            f()
    torch.cuda.synchronize(device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    calibration = max(2 * n, 4)
    cpu0 = time.perf_counter()
    start.record()
    for i in range(calibration):
        fns[i % n]()
    end.record()
    cpu_us = (time.perf_counter() - cpu0) * 1e6 / calibration
    end.synchronize()
    gpu_us = start.elapsed_time(end) * 1e3 / calibration
    steps = int(min(max_steps, max(n, math.ceil(target_us / max(gpu_us, 0.5)))))
    steps = int(math.ceil(steps / n) * n)
    samples = []
    for _ in range(repeats):
        if queue_ahead:
            try:
                torch.cuda._sleep(_sleep_cycles(device, min(50_000.0, 1.5 * cpu_us * steps + 20.0)))
            except (AttributeError, RuntimeError):  # pragma: no cover - private API missing
                pass
        start.record()
        for i in range(steps):
            fns[i % n]()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / steps)
    return samples, steps


def capture(fn: Callable[[], Any], device: torch.device, *,
            warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture one call of ``fn`` in a CUDA graph after ``warmup`` calls on a side stream.

    Returns ``(graph, output)``; keep the output alive as long as the graph (it lives in the
    graph's memory pool and is overwritten by each replay).
    """
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    current.wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize(device)
    return graph, out
