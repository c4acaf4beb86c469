"""Split-K's last-slice final: the last work item of a tile to arrive adds the tile's fp32 slices in
slice order and runs the epilogue (``Options.split_k_final="last-slice"``)."""

from __future__ import annotations

from ..target import GemmProblem
from .gemm_epilogue import WGMMA_EPILOGUE_BATCH, _batch_coords, _batched_epilogue, _cs_of, _cs_swizzle
from .gemm_tile import SplitFinal, _guard
from .text import block, indent

#: Loads of split-K slices one thread has in flight per pass of a last-slice final (elements per pass =
#: this // split_k, at most :data:`WGMMA_EPILOGUE_BATCH`).
SPLIT_FINAL_LOADS = 32


def _split_final_params(sf: SplitFinal | None, split: int) -> dict:
    return {} if sf is None or split <= 1 else {"split_final": "last-slice"}


def _split_final_code(sf: SplitFinal | None, p: GemmProblem, split: int, tm: int, tn: int, ldc: int,
                      threads: int, m_guard: bool, n_guard: bool, vector: bool = True) -> list[str]:
    """After the slice stores of a split-K item: the tile's arrival, and for the last slice to arrive
    the sum of the tile's slices in slice order (``((0 + s0) + s1) + ...``: the bits of the separate
    final phase) through ``sf.final``. Its own slice is read back from the shared C tile (the same
    fp32 values it stored). Empty without ``sf``.

    Ordering: ``__syncthreads`` (every thread's slice stores precede thread 0's fence), then thread 0's
    ``__threadfence`` and acquire-release add on the counter (a release of the block's slice; for
    the last arrival an acquire of every other slice's, whose releases it reads); the last one
    stores 0 (the counter is re-armed for the next launch or graph replay: no other item of this
    launch touches it again), fences, and the block reads the slices after a second
    ``__syncthreads``."""
    if sf is None or split <= 1:
        return []
    total = p.batch * p.m * p.n
    fb = max(1, min(WGMMA_EPILOGUE_BATCH, SPLIT_FINAL_LOADS // split))
    while fb > 1 and (tm * tn) % (threads * fb):
        fb //= 2

    def summed(x: str, row: str, col: str, local: str) -> str:
        lin = f"tkx_sk{x}lin"  # a name no epilogue declares (theirs are renamed tkxE<u>_<name>)
        terms = "0.0f"
        for sl in range(split):
            # __ldcg: at L2, where the other blocks' slices are (this SM's L1 may hold no stale line)
            terms = f"({terms} + (ks_split == {sl} ? {local} : __ldcg({sf.scratch} + {sl * total}LL + {lin})))"
        return block(f"const long long {lin} = (((long long)bat * M + {row}) * N + {col});",
                     f"const float {x}acc = {terms};  // slices in slice order")

    batched = None if (m_guard or n_guard) else _batched_epilogue(sf.final, fb)
    if batched is not None:
        comp, stores = batched
        coords = _batch_coords(fb, threads, tn, lambda x: summed(x, f"{x}row", f"{x}col",
                                                                 _cs_of(f"{x}e", tn, ldc, _cs_swizzle(tn, vector))))
        loop = [f"#pragma unroll 1  // {fb} elements per thread and pass, {split} slice loads each",
                f"for (int e = threadIdx.x; e < {tm * tn}; e += {threads * fb}) {{",
                indent(block(*coords, *comp, *stores)), "}"]
    else:
        cond = _guard(("row < M", m_guard), ("col < N", n_guard))
        inner = block(summed("", "row", "col", _cs_of("e", tn, ldc, _cs_swizzle(tn, vector))),
                      sf.final("bat", "row", "col", "acc"))
        loop = ["#pragma unroll 1  // kept rolled: the epilogue's code appears once",
                f"for (int e = threadIdx.x; e < {tm * tn}; e += {threads}) {{",
                f"    const int row = row0 + e / {tn}, col = col0 + e % {tn};",
                indent(f"if ({cond}) {{\n{indent(inner)}\n}}" if cond else inner), "}"]
    return [
        "__syncthreads();  // every thread's slice stores are done",
        "{  // split-K: this slice has arrived; the last of the tile's slices adds them and runs the epilogue",
        indent(block(
            "__shared__ int tkx_last_slice;",
            "if (threadIdx.x == 0) {",
            "    __threadfence();  // the block's slice (ordered before by __syncthreads) at GPU scope",
            f"    const unsigned int arrived = tkx_atom_add_acq_rel({sf.counters} + tkx_tile, 1u);",
            f"    tkx_last_slice = arrived == {split - 1}u;",
            "    if (tkx_last_slice) {",
            f"        tkx_st_relaxed({sf.counters} + tkx_tile, 0u);  // re-armed for the next launch",
            "        __threadfence();  // the other slices' stores, acquired above, before the block reads them",
            "    }",
            "}",
            "__syncthreads();",
            "if (tkx_last_slice) {  // block-uniform",
            indent(block(*loop)),
            "}",
        )),
        "}",
    ]
