"""Finding the GPU, its architecture, and making PyTorch's CUDA context current for cuda-core.

Nothing here imports ``cuda.core`` at module import time, so ``import tkx`` works on machines
without CUDA; :func:`require_cuda` raises :class:`NoDeviceError` (a :class:`tkx.TkxError`)
explaining what does work without a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import TkxError

#: What a user can do on a machine without a GPU (quoted in :class:`NoDeviceError`).
WITHOUT_GPU = (
    "Without a GPU tkx still captures the step, runs passes, schedules, plans the arena and "
    "generates the CUDA source (tkx.explore(step, inputs).cuda), and NVRTC compiles it for any "
    "architecture to report registers and spills (tkx.runtime.compile_cubin(source, 'sm_90')). "
    "Running the kernel, verify(), capture_graph() and tkx.bench need an NVIDIA GPU (sm_80 or newer)."
)


class NoDeviceError(TkxError):
    """There is no usable CUDA GPU (or the inputs are not on one)."""


class CudaCoreMissingError(TkxError):
    """``cuda.core`` (NVIDIA's cuda-core package) is needed to load and launch kernels."""


def require_cuda(device: Any = None) -> torch.device:
    """The CUDA device to run on; raises :class:`NoDeviceError` naming why there is none.

    ``device`` may be ``None`` (PyTorch's current CUDA device), an index, a string or a
    :class:`torch.device`. Devices older than sm_80 are rejected.
    """
    if not torch.cuda.is_available():
        build = getattr(torch.version, "cuda", None)
        why = (f"torch {torch.__version__} was built without CUDA" if not build else
               f"torch {torch.__version__} (CUDA {build}) sees no GPU or no driver")
        raise NoDeviceError(f"no CUDA device: {why}. {WITHOUT_GPU}")
    if device is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type != "cuda":
            raise NoDeviceError(f"no CUDA device: asked to run on {dev}. {WITHOUT_GPU}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise NoDeviceError(f"no CUDA device {dev}: only {torch.cuda.device_count()} visible")
    major, minor = torch.cuda.get_device_capability(dev)
    if major < 8:
        raise NoDeviceError(f"{torch.cuda.get_device_name(dev)} is sm_{major}{minor}; tkx kernels need sm_80 "
                            f"or newer. {WITHOUT_GPU}")
    return dev


def device_of(tensors: Iterable[Any], default: Any = None) -> torch.device:
    """The CUDA device of the first CUDA tensor in ``tensors``, else ``default``
    (see :func:`require_cuda`)."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return require_cuda(t.device)
    return require_cuda(default)


def arch_of(device: torch.device) -> str:
    """``"sm_90"`` for an H100/H200: the device's own architecture."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def kernel_arch(device: torch.device) -> str:
    """The architecture tkx compiles kernels for on ``device``: ``"sm_90a"`` on compute capability
    9.0 (H100/H200: its wgmma instructions), the device's own (:func:`arch_of`) elsewhere."""
    arch = arch_of(device)
    return "sm_90a" if arch == "sm_90" else arch


def sm_count(device: torch.device) -> int:
    """Number of streaming multiprocessors of ``device``."""
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def cuda_core() -> Any:
    """The ``cuda.core`` module (``cuda.core.experimental`` on cuda-core < 0.4)."""
    try:
        import cuda.core as core

        if hasattr(core, "ObjectCode") and hasattr(core, "launch"):
            return core
    except ImportError:
        core = None
    try:
        import cuda.core.experimental as core  # older cuda-core releases

        return core
    except ImportError:
        raise CudaCoreMissingError(
            "loading and launching kernels needs NVIDIA's cuda-core: pip install cuda-core cuda-bindings "
            "(or use Options(backend='torch-extension'), which needs nvcc and ninja)") from None


_local = threading.local()


def make_current(device: torch.device) -> None:
    """Make PyTorch's primary context of ``device`` current on this thread for cuda-core.

    PyTorch and cuda-core share the device's primary context; the driver keeps the current
    context per thread, so this is done once per thread and device.
    """
    done: set[int] = getattr(_local, "done", None) or set()
    index = device.index
    if index in done:
        return
    torch.cuda.init()
    with torch.cuda.device(index):
        torch.empty(1, device=device)  # the runtime creates and binds the primary context
        cuda_core().Device(index).set_current()
    done.add(index)
    _local.done = done
