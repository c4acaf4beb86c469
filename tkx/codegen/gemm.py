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

Variants (:func:`choose_variant` picks one and says why):

========== ======================================================================
simt       fp32 tiles in shared memory, each thread an RM x RN register micro-tile,
           one ``fmaf`` per k (exact fp32, fixed summation order)
wmma_bf16  tensor cores, 16x16x16 bf16 fragments, fp32 accumulators (sm_80+)
wmma_f16   the same with fp16 operands
wmma_tf32  tensor cores on fp32 data rounded to tf32, 16x16x8 (``fp32_math="tf32"``)
gemv       M <= 4 or N <= 4: no tiles, K split across lanes (shuffle reduction) or
           across warps (shared-memory reduction), whichever reads memory coalesced
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
from .gemm_simt import simt_gemm
from .gemm_tile import (
    VARIANTS,
    Epilogue,
    GemmCode,
    LoadA,
    LoadB,
    PtrA,
    PtrB,
    SplitFinal,
    TmaMap,
    work_loop,
)
from .gemm_tma import _wgmma_pipelined
from .gemm_wgmma import (
    _WGMMA,
    DEFAULT_KNOBS,
    SWIZZLE_ROW,
    WGMMA_C_PAD,
    WGMMA_CLUSTER_SLACK,
    WGMMA_MAX_STAGES,
    WGMMA_STAGES,
    WgmmaKnobs,
    tensormap_prefetch,
    wgmma_staged,
    wgmma_stages,
)
from .gemm_wmma import _WMMA, wmma_gemm
from .gemv import gemv

#: The GEMM emitters' public names (the emitter modules hold the code: :mod:`~tkx.codegen.gemm_simt`,
#: :mod:`~tkx.codegen.gemm_wmma`, :mod:`~tkx.codegen.gemm_wgmma`, :mod:`~tkx.codegen.gemm_tma`,
#: :mod:`~tkx.codegen.gemv`; shared pieces in :mod:`~tkx.codegen.gemm_tile`, :mod:`~tkx.codegen.gemm_epilogue`
#: and :mod:`~tkx.codegen.gemm_split_k`).
__all__ = [
    "VARIANTS", "GemmCode", "GemmProblem", "SplitFinal", "WgmmaKnobs", "Epilogue", "LoadA", "LoadB", "PtrA", "PtrB",
    "TmaMap", "choose_variant", "emit_gemm", "simt_gemm", "wmma_gemm", "wgmma_gemm", "gemv", "work_loop",
    "wgmma_stages", "tensormap_prefetch", "WGMMA_STAGES", "WGMMA_MAX_STAGES", "WGMMA_C_PAD", "WGMMA_CLUSTER_SLACK",
    "WGMMA_EPILOGUE_BATCH", "WGMMA_EPILOGUE_EARLY_REGS", "WGMMA_EPILOGUE_VECTOR_REGS",
    "_batched_epilogue", "_cs_at", "_cs_swizzle",
]


def wgmma_gemm(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, variant: str = "wgmma_bf16",
               tile_m: int = 128, tile_n: int = 128, tile_k: int = 64, threads: int = 256, item: str = "item",
               smem: str = "tkx_smem", ptr_a: PtrA | None = None, ptr_b: PtrB | None = None,
               split: int = 1, shared_budget: int | None = None, tma_a: TmaMap | None = None,
               tma_b: TmaMap | None = None, split_final: SplitFinal | None = None,
               epilogue_reads: tuple[tuple[str, int], ...] = (), cluster: int = 1,
               knobs: WgmmaKnobs = DEFAULT_KNOBS) -> GemmCode:
    """(e) Hopper warpgroup MMA (``wgmma.mma_async``, sm_90a only), fp32 accumulators in registers.

    The block's ``threads / 128`` warpgroups are arranged WGM x WGN over the ``tile_m x tile_n``
    tile; each owns a 64 x (tile_n / WGN) block of C and issues one m64nNk16 (bf16/fp16) or
    m64nNk8 (tf32) instruction per K step. Operand tiles are fetched from global memory into
    registers through the load callbacks (any view, transposed or computed on the fly), converted,
    and stored K-major into shared memory in the 128-byte swizzle layout that the tensor cores read
    through matrix descriptors: row r (an M index of A, an N index of B) is 128 bytes of K, and
    16-byte chunk c of row r sits at chunk ``c ^ (r % 8)``. ``tile_k`` is one swizzle row (64 bf16
    or 32 tf32). Two shared stages: the next K tile's global loads and its store into the other
    stage overlap the asynchronous MMAs of this one. After the K loop every warpgroup writes its
    accumulators to a padded fp32 tile in shared memory (reusing the operand bytes) and the whole
    block runs the epilogue per element, consecutive threads on consecutive columns (with
    ``knobs.epilogue_vector``: runs of 8 or 4 columns per thread, 16-byte point reads and stores).
    """
    if variant not in _WGMMA:
        raise ValueError(f"unknown wgmma variant {variant!r}; one of {sorted(_WGMMA)}")
    elem, fk, ptx_type, conv, ebytes = _WGMMA[variant]
    tm, tn, tk = tile_m, tile_n, tile_k
    if threads % 128:
        raise ValueError(f"{variant} needs whole warpgroups (threads a multiple of 128), got {threads}")
    if tk * ebytes != SWIZZLE_ROW:
        raise ValueError(f"{variant} stages K in rows of {SWIZZLE_ROW} bytes: tile_k must be "
                         f"{SWIZZLE_ROW // ebytes}, got {tk}")
    groups = threads // 128
    if tm % 64 or (tm // 64) > groups or groups % (tm // 64):
        raise ValueError(f"{variant}: tile_m={tm} must be 64 x a divisor of the {groups} warpgroup(s)")
    wgm = tm // 64
    wgn = groups // wgm
    wn = tn // wgn
    if tn % wgn or wn % 8 or not 8 <= wn <= 256:
        raise ValueError(f"{variant}: tile_n={tn} over {wgn} warpgroup column(s) must give 8 to 256 "
                         "columns each, a multiple of 8")
    piped = _wgmma_pipelined(p, load_a, load_b, epilogue, variant=variant, tm=tm, tn=tn, tk=tk, threads=threads,
                             item=item, smem=smem, ptr_a=ptr_a, ptr_b=ptr_b, split=split,
                             shared_budget=shared_budget, tma_a=tma_a, tma_b=tma_b, split_final=split_final,
                             epilogue_reads=epilogue_reads, cluster=cluster, knobs=knobs)
    if piped is not None:
        return piped
    return wgmma_staged(p, load_a, load_b, epilogue, variant=variant, tm=tm, tn=tn, wn=wn, threads=threads,
                        item=item, smem=smem, ptr_a=ptr_a, ptr_b=ptr_b, split=split, split_final=split_final,
                        knobs=knobs)


def choose_variant(p: GemmProblem, *, fp32_math: str = "simt", tensor_cores: bool = True,
                   arch: str = "sm_80") -> tuple[str, str]:
    """The variant for ``p`` and a sentence saying why (:func:`tkx.target.choose_gemm`)."""
    if not tensor_cores and min(p.m, p.n) > SKINNY_MAX:
        return "simt", f"{p.dtype} operands but tensor cores are off: fp32 SIMT on widened values"
    plan = choose_gemm(p, Options(fp32_math=fp32_math), arch)
    return plan.impl, plan.why


def emit_gemm(variant: str, p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *,
              tile_m: int = 64, tile_n: int = 64, tile_k: int = 32, threads: int = 256,
              item: str = "item", smem: str = "tkx_smem", ptr_a: PtrA | None = None,
              ptr_b: PtrB | None = None, split: int = 1, shared_budget: int | None = None,
              tma_a: TmaMap | None = None, tma_b: TmaMap | None = None,
              split_final: SplitFinal | None = None, epilogue_reads: tuple[tuple[str, int], ...] = (),
              cluster: int = 1, knobs: WgmmaKnobs = DEFAULT_KNOBS) -> GemmCode:
    """Dispatch to the emitter of ``variant`` (one of :data:`VARIANTS`); ``ptr_a``/``ptr_b``
    (pointers to operand elements in memory, for 16-byte staging) are used by the wgmma variants;
    ``split > 1`` (wgmma only) makes work item ``s * tiles + t`` compute tile ``t`` over the s-th slice
    of K, and its epilogue sees the C variable ``ks_split`` (the slice); ``shared_budget`` (bytes of
    shared memory a block may use) sizes the pipelined wgmma's stages (:func:`wgmma_stages`);
    ``tma_a``/``tma_b`` make it copy operands with the bulk tensor copy engine (:func:`_wgmma_pipelined`);
    ``split_final`` (with ``split > 1``): the last slice of each tile adds the slices and runs
    ``split_final.final`` (:class:`SplitFinal`), ``epilogue`` being the slice store; ``epilogue_reads``:
    ``(C pointer, element bytes)`` of buffers the epilogue reads at the output's index (element (row, col)
    at ``pointer + row * N + col``), prefetched into L2 with ``knobs.epilogue_prefetch``; ``cluster=2``
    (wgmma with TMA): items in pairs of a 2-CTA cluster with the B tile multicast (``GemmCode.cluster``
    says whether it applied, ``notes["cluster"]`` why not); ``knobs``: the wgmma variants' switches
    (:class:`WgmmaKnobs`)."""
    if cluster != 1 and variant not in _WGMMA:
        raise ValueError(f"2-CTA clusters are implemented by the wgmma variants, not {variant}")
    if split > 1 and variant not in _WGMMA:
        raise ValueError(f"split-K is implemented by the wgmma variants, not {variant}")
    if split_final is not None and split <= 1:
        raise ValueError("a last-slice split-K final needs split > 1")
    if variant == "simt":
        return simt_gemm(p, load_a, load_b, epilogue, tile_m=tile_m, tile_n=tile_n, tile_k=tile_k,
                         threads=threads, item=item, smem=smem)
    if variant in _WGMMA:
        return wgmma_gemm(p, load_a, load_b, epilogue, variant=variant, tile_m=tile_m, tile_n=tile_n,
                          tile_k=tile_k, threads=threads, item=item, smem=smem, ptr_a=ptr_a, ptr_b=ptr_b,
                          split=split, shared_budget=shared_budget, tma_a=tma_a, tma_b=tma_b,
                          split_final=split_final, epilogue_reads=epilogue_reads, cluster=cluster, knobs=knobs)
    if variant in _WMMA:
        return wmma_gemm(p, load_a, load_b, epilogue, variant=variant, tile_m=tile_m, tile_n=tile_n,
                         tile_k=tile_k, threads=threads, item=item, smem=smem)
    if variant == "gemv":
        return gemv(p, load_a, load_b, epilogue, threads=threads, item=item, smem=smem)
    raise ValueError(f"unknown GEMM variant {variant!r}; one of {VARIANTS}")
