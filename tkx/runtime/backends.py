"""Choosing a back end: :func:`compile` loads a :class:`~tkx.codegen.CudaSource` on a device.

Two back ends share one launch contract (:class:`~tkx.codegen.abi.LaunchContract`):
``"nvrtc"`` (:class:`~tkx.runtime.kernel.CompiledKernel`, cubin cached on disk) and
``"torch-extension"`` (:class:`~tkx.runtime.extension.ExtensionKernel`, built with nvcc).
This module sits above both, so neither imports the other's loader.
"""

from __future__ import annotations

from typing import Any

from ..errors import TkxError
from .device import kernel_arch, require_cuda
from .kernel import CompiledKernel, compile_cubin, launch_contract

#: The back ends by name (``Options.backend``).
BACKENDS = ("nvrtc", "torch-extension")


def compile(source: Any, device: Any = None, *, cache: bool | str = True, backend: str | None = None) -> Any:
    """Compile ``source`` for ``device``'s own architecture and load it.

    ``backend`` defaults to the source's ``launch.config.backend``: ``"nvrtc"`` gives a
    :class:`~tkx.runtime.kernel.CompiledKernel` (cubin cached on disk, see
    :func:`~tkx.runtime.compile_cubin`), ``"torch-extension"`` an
    :class:`~tkx.runtime.extension.ExtensionKernel` built with nvcc through
    ``torch.utils.cpp_extension``. Raises :class:`~tkx.runtime.device.NoDeviceError` without a
    GPU, :class:`~tkx.runtime.kernel.KernelLoadError` if the kernel cannot run as generated,
    :class:`tkx.TkxError` for an unknown back end.
    """
    dev = require_cuda(device)
    backend = backend or launch_contract(source).config.backend
    if backend == "torch-extension":
        from .extension import ExtensionKernel

        return ExtensionKernel.build(source, dev, cache=cache)
    if backend != "nvrtc":
        raise TkxError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    binary = compile_cubin(source, kernel_arch(dev), cache=cache)  # sm_90a on Hopper (wgmma)
    return CompiledKernel(source, binary, dev)
