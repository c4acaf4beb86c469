"""The runtime: compile generated CUDA, run it on PyTorch's stream, check it, capture it in graphs.

::

    runner = tkx.runtime.build(step_fn, example_inputs, tkx.Options())
    loss, new_params = runner(params, x, y)          # called like step_fn
    report = runner.verify(make_inputs=ex.make_inputs)  # vs eager and the reference interpreter
    graph = runner.capture_graph(params, x, y)       # one launch in a torch.cuda.CUDAGraph
    graph.replay(); graph.check_status()
    runner.resources                                 # registers, smem, spills, occupancy, grid

Pieces (every GPU-related import is lazy: ``import tkx.runtime`` works without CUDA):

* :func:`compile_cubin` - NVRTC, on-disk cache keyed by SHA-256 of source, arch, flags and
  versions (:func:`cache_dir`, :func:`clear_cache`); needs no GPU;
* :func:`compile` - the device's own arch, loaded with ``cuda.core`` (:class:`CompiledKernel`)
  or built as a torch extension (``Options(backend="torch-extension")``);
* :class:`CompiledRunner` / :func:`build` - the callable step; :class:`GraphRunner`;
* :class:`GraphOfKernels` - the same step as one kernel per fused group (no grid barriers), to see
  what the single kernel buys;
* :class:`Verification` - what :meth:`CompiledRunner.verify` returns.

Errors: :class:`NoDeviceError` (no GPU), :class:`InputMismatchError` (arguments that do not
fit), :class:`KernelError` (the kernel reported an error, e.g. a grid barrier timeout),
:class:`KernelLoadError` (resources: not one block fits), all :class:`tkx.TkxError`.
"""

from __future__ import annotations

from ..pipeline import build, lower  # the pipeline table makes every stage up to the runner
from .backends import compile
from .cache import cache_dir, cache_key, clear_cache
from .device import CudaCoreMissingError, NoDeviceError
from .graph_of_kernels import GraphOfKernels, KernelSequence
from .inputs import InputMismatchError
from .kernel import Binary, CompiledKernel, KernelLoadError, Resources, compile_cubin
from .runner import CompiledRunner, GraphRunner, pack_args
from .status import KernelError
from .verify import Comparison, Verification, VerificationError, relative_error

__all__ = [
    "Binary", "CompiledKernel", "CompiledRunner", "Comparison", "CudaCoreMissingError", "GraphOfKernels",
    "GraphRunner", "InputMismatchError", "KernelError", "KernelLoadError", "KernelSequence", "NoDeviceError",
    "Resources", "Verification", "VerificationError", "build", "cache_dir", "cache_key", "clear_cache", "compile",
    "compile_cubin", "lower", "pack_args", "relative_error",
]
