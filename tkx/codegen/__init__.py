"""CUDA code generation: the building blocks of tkx's megakernel.

Modules, in the order a kernel is put together:

* :mod:`~tkx.codegen.cuda_prelude` - the fixed device code every kernel starts with (dtype
  loads/stores/rounding, NaN-propagating min/max, grid and block barriers, reductions);
* :mod:`~tkx.codegen.ops` - the C expression of every pointwise IR op;
* :mod:`~tkx.codegen.gemm` - GEMM work items (SIMT fp32, WMMA bf16/fp16/tf32, GEMV);
* :mod:`~tkx.codegen.reduce` - reduction work items (thread/warp/block per row, two-phase);
* :mod:`~tkx.codegen.nvrtc` - compile with NVRTC and read the register/spill report;
* :mod:`~tkx.codegen.text` - indentation helpers for tidy generated code.
"""

from __future__ import annotations

from .kernel import generate
from .nvrtc import CompileReport, CudaCompileError, compile_cuda
from .source import CudaSource

__all__ = ["generate", "CudaSource", "CompileReport", "CudaCompileError", "compile_cuda"]
