"""GEMM emitters: C code for ONE work item (one output tile) of ``C = A @ B``.

Every emitter takes

* a :class:`GemmProblem` (sizes, batch, operand dtype, which index of each operand is
  contiguous in memory - that decides how threads walk the operands so loads coalesce);
* ``load_a(batch, row, k)`` and ``load_b(batch, k, col)``: callbacks that get the *names* of
  C index variables and return a C expression for that element **as a float**. Any view
  works (transposes, strides, offsets, even a pointwise producer computed on the fly);
* ``epilogue(batch, row, col, acc)``: a callback returning C statements that consume the fp32
  accumulator ``acc`` of output element (row, col): add a bias, apply an activation, store.

and returns a :class:`GemmCode` whose ``code`` is a brace-enclosed C block that computes the
work item whose index is in the C variable ``item`` (``0 <= item < work_items``). The caller
puts it in a grid-stride loop (:func:`work_loop`) that other groups of the same stage share.
The block synchronises the whole thread block (``__syncthreads``) so ``item`` must be the
same for every thread of a block, which a grid-stride loop over ``blockIdx.x`` guarantees.

Shared memory: emitters declare no ``__shared__`` array. They carve the block's one shared
workspace (a pointer named by ``smem``, 128-byte aligned, see
:func:`tkx.codegen.cuda_prelude.shared_workspace`) and report the bytes they need in
``GemmCode.shared_bytes``; the kernel sizes the workspace with the largest need. Every block
ends with ``__syncthreads()`` so the next work item may reuse the workspace.

Each emitter is one module registered on its :mod:`tkx.target` spec row
(:mod:`tkx.codegen.gemm_registry` says what adding one touches); :func:`emit_gemm` dispatches through that
registry. Variants (:func:`choose_variant` picks one and says why):

========== ======================================================================
simt       fp32 tiles in shared memory, each thread an RM x RN register micro-tile,
           one ``fmaf`` per k (exact fp32, fixed summation order)
wmma_bf16  tensor cores, 16x16x16 bf16 fragments, fp32 accumulators (sm_80+)
wmma_f16   the same with fp16 operands
wmma_tf32  tensor cores on fp32 data rounded to tf32, 16x16x8 (``fp32_math="tf32"``)
wgmma_*    Hopper warpgroup MMA (sm_90a), operands copied by cp.async / TMA or staged
gemv       M <= 4 or N <= 4: no tiles, K split across lanes (shuffle reduction) or
           across warps (shared-memory reduction), whichever reads memory coalesced
gemv_stream  decode GEMVs: columns over the whole grid, many loads in flight
========== ======================================================================

Names the emitted block defines (callbacks must not use them for their own variables):
``M N K TM TN TK bat tile row0 col0 row col k kk k0 r c e l s w elem acc sums c_frag a b a_next b_next
fetch stash As Bs Cw warp lane wr wc sum part``, and the vector epilogue's ``tkx_vec`` and names prefixed
``tkxE<u>_ tkxR<j>_ tkxL tkxC tkxS`` (:mod:`tkx.codegen.epilogue_vector`); in 2-CTA clusters also ``tkx_pair
tkx_rank tkx_cta ebar0 tma_mc release wait_empty``."""

from __future__ import annotations

from ..options import Options
from ..target import SKINNY_MAX, GemmProblem, choose_gemm
from .gemm_epilogue import (
    WGMMA_EPILOGUE_BATCH,
    WGMMA_EPILOGUE_EARLY_REGS,
    WGMMA_EPILOGUE_VECTOR_REGS,
    _batched_epilogue,
    _cs_at,
    _cs_swizzle,
)
from .gemm_registry import GemmRequest, emit, register_gemm, variants
from .gemm_simt import simt_gemm
from .gemm_tile import Epilogue, GemmCode, LoadA, LoadB, PtrA, PtrB, SplitFinal, TmaMap, WgmmaKnobs, work_loop
from .gemm_tma import wgmma_gemm
from .gemm_wgmma import (
    WGMMA_C_PAD,
    WGMMA_CLUSTER_SLACK,
    WGMMA_MAX_STAGES,
    WGMMA_STAGES,
    tensormap_prefetch,
    wgmma_stages,
)
from .gemm_wmma import wmma_gemm
from .gemv import gemv, gemv_stream

#: The GEMM emitters' public names (the emitter modules hold the code: :mod:`~tkx.codegen.gemm_simt`,
#: :mod:`~tkx.codegen.gemm_wmma`, :mod:`~tkx.codegen.gemm_wgmma`, :mod:`~tkx.codegen.gemm_tma`,
#: :mod:`~tkx.codegen.gemv`; the registry in :mod:`~tkx.codegen.gemm_registry`; shared pieces in
#: :mod:`~tkx.codegen.gemm_tile`, :mod:`~tkx.codegen.gemm_epilogue` and :mod:`~tkx.codegen.gemm_split_k`).
__all__ = [
    "GemmCode", "GemmProblem", "GemmRequest", "SplitFinal", "WgmmaKnobs", "Epilogue", "LoadA", "LoadB", "PtrA",
    "PtrB", "TmaMap", "choose_variant", "emit", "emit_gemm", "register_gemm", "variants", "simt_gemm",
    "wmma_gemm", "wgmma_gemm", "gemv", "gemv_stream", "work_loop",
    "wgmma_stages", "tensormap_prefetch", "WGMMA_STAGES", "WGMMA_MAX_STAGES", "WGMMA_C_PAD", "WGMMA_CLUSTER_SLACK",
    "WGMMA_EPILOGUE_BATCH", "WGMMA_EPILOGUE_EARLY_REGS", "WGMMA_EPILOGUE_VECTOR_REGS",
    "_batched_epilogue", "_cs_at", "_cs_swizzle",
]


def choose_variant(p: GemmProblem, *, fp32_math: str = "simt", tensor_cores: bool = True,
                   arch: str = "sm_80") -> tuple[str, str]:
    """The variant for ``p`` and a sentence saying why (:func:`tkx.target.choose_gemm`)."""
    if not tensor_cores and min(p.m, p.n) > SKINNY_MAX:
        return "simt", f"{p.dtype} operands but tensor cores are off: fp32 SIMT on widened values"
    plan = choose_gemm(p, Options(fp32_math=fp32_math), arch)
    return plan.impl, plan.why


def emit_gemm(variant: str, p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue,
              **decisions: object) -> GemmCode:
    """The code of one work item of ``p`` by the emitter of ``variant`` (one of :func:`variants`):
    ``emit(GemmRequest(variant, p, load_a, load_b, epilogue, **decisions))``. ``decisions`` are fields of
    :class:`GemmRequest` (``tile``, ``split``, ``tma_a``, ``cluster``, ``knobs`` ...); an unknown one
    raises :class:`TypeError`, an unknown variant or one that does not implement the decisions
    :class:`ValueError` (:func:`tkx.codegen.gemm_registry.emit`)."""
    return emit(GemmRequest(variant, p, load_a, load_b, epilogue, **decisions))  # type: ignore[arg-type]
