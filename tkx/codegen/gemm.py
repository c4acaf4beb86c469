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

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..options import Options
from ..target import SKINNY_MAX, GemmProblem, choose_gemm, cluster_pairs
from . import epilogue_vector as ev
from .text import block, indent

LoadA = Callable[[str, str, str], str]  # (batch, row, k) -> float C expression
PtrA = Callable[[str, str, str], str]  # (batch, row, k) -> C pointer to that element in memory
PtrB = Callable[[str, str, str], str]  # (batch, k, col) -> C pointer to that element in memory
LoadB = Callable[[str, str, str], str]  # (batch, k, col) -> float C expression
TmaMap = Callable[[int, int], "int | None"]  # (box inner, box outer) elements -> tensor map index, or None
Epilogue = Callable[[str, str, str, str], str]  # (batch, row, col, acc) -> C statements

VARIANTS = ("simt", "wmma_bf16", "wmma_f16", "wmma_tf32", "wgmma_bf16", "wgmma_f16", "wgmma_tf32", "gemv")

#: Alignment of each array carved from the shared workspace (WMMA needs 32 bytes).
SMEM_ALIGN = 128


@dataclass(frozen=True)
class GemmCode:
    """One GEMM work item's code and what the caller must provide for it.

    ``work_items``: how many items (``item`` in ``[0, work_items)``); ``shared_bytes``: bytes
    of the shared workspace it uses; ``tensor_cores``: the kernel must include the WMMA
    headers (:func:`tkx.codegen.cuda_prelude.prelude` with ``tensor_cores=True``);
    ``params``: the decisions (tile, micro-tile, warp layout ...), for reports.
    """

    variant: str
    code: str
    work_items: int
    shared_bytes: int
    threads: int
    tensor_cores: bool
    params: dict
    #: The code copies operands with the bulk tensor copy engine: the kernel needs the TMA helpers
    #: (:func:`tkx.codegen.cuda_prelude.prelude` with ``tma=True``) and the ``tmaps`` parameter.
    tma: bool = False
    #: CTAs per thread-block cluster the code needs (2: items 2p, 2p + 1 run in the two CTAs of one
    #: cluster, :func:`_wgmma_pipelined`); 1: no cluster.
    cluster: int = 1

    def __str__(self) -> str:
        return self.code


@dataclass(frozen=True)
class SplitFinal:
    """The split-K final run by the last slice of each tile (``Options.split_k_final="last-slice"``).

    With it, a split-K wgmma work item first hands its fp32 slice of the tile to ``epilogue`` (the
    caller's slice store into the scratch), then bumps the tile's arrival counter; the item that
    arrives last resets the counter and runs ``final`` with ``acc`` = the sum of the tile's slices
    in slice order. ``scratch``: C pointer (``float*``) to the ``[split, batch, m, n]`` slices;
    ``counters``: C pointer (``unsigned int*``) to the GEMM's per-tile arrival counters (zero
    before the first launch, left at zero by every launch); ``final``: the GEMM's own epilogue."""

    scratch: str
    counters: str
    final: Epilogue


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _align(n: int, to: int = SMEM_ALIGN) -> int:
    return _ceil(n, to) * to


def work_loop(body: str, work_items: int, *, item: str = "item", note: str = "") -> str:
    """A grid-stride loop over ``work_items`` that runs ``body`` with ``item`` set.

    Block-uniform: every thread of a block sees the same ``item``.
    """
    head = f"for (int {item} = blockIdx.x; {item} < {work_items}; {item} += gridDim.x) {{"
    if note:
        head += f"  // {note}"
    return f"{head}\n{indent(body)}\n}}"


def _tile_header(p: GemmProblem, tm: int, tn: int, item: str, what: str, split: int = 1,
                 tk: int = 1, k_range: bool = False, pairs: bool = False) -> list[str]:
    """Which tile (and, with ``split > 1``, which slice of K) work item ``item`` computes: defines
    ``bat row0 col0`` and ``ks_split k_beg k_end`` (the item's K range, whole ``tk`` steps).
    ``pairs``: tiles ``2q`` and ``2q + 1`` are the row blocks ``2r``, ``2r + 1`` of one column block
    (the two CTAs of a cluster, ``tkx_rank`` = the tile's parity = this CTA's rank, checked)."""
    tiles_n = _ceil(p.n, tn)
    per_batch = _ceil(p.m, tm) * tiles_n
    lines = [f"// {what}",
             f"constexpr int M = {p.m}, N = {p.n}, K = {p.k};  // C[M x N] = A[M x K] @ B[K x N]"]
    it = item
    if split > 1:
        ks = _ceil(_ceil(p.k, tk), split) * tk
        lines += [f"const int ks_split = {item} / {p.batch * per_batch};  // split-K: this item's slice of K "
                  f"(of {split})",
                  f"const int k_beg = ks_split * {ks}, k_end = min(K, k_beg + {ks});"]
        it = f"({item} % {p.batch * per_batch})"
        lines += [f"const int tkx_tile = {it};  // the output tile (its arrival counter, with a last-slice final)"]
        it = "tkx_tile"
    elif k_range:
        lines += ["constexpr int ks_split = 0, k_beg = 0, k_end = K;  // the whole of K"]
    if p.batch > 1:
        lines += [f"const int bat = {it} / {per_batch};  // which matrix of the batch of {p.batch}",
                  f"const int tile = {it} % {per_batch};"]
    else:
        lines += ["const int bat = 0;", f"const int tile = {it};"]
    if pairs:
        return lines + [
            "const int tkx_pair = tile >> 1, tkx_rank = tile & 1;  // 2-CTA cluster: this pair of tiles, "
            "this CTA's half",
            "{  // the pair's two items run in the two CTAs of one cluster (rank = item parity)",
            "    unsigned tkx_cta;",
            '    asm volatile("mov.u32 %0, %%cluster_ctarank;\\n" : "=r"(tkx_cta));',
            "    if (tkx_cta != (unsigned)tkx_rank) __trap();",
            "}",
            f"const int row0 = ((tkx_pair / {tiles_n}) * 2 + tkx_rank) * {tm};  // this tile's first row of C",
            f"const int col0 = (tkx_pair % {tiles_n}) * {tn};  // and first column (the pair's)"]
    lines += [f"const int row0 = (tile / {tiles_n}) * {tm};  // this tile's first row of C",
              f"const int col0 = (tile % {tiles_n}) * {tn};  // and first column"]
    return lines


def _guard(*conds: tuple[str, bool]) -> str:
    """``a && b`` of the conditions that are needed (``"true"`` when none)."""
    needed = [c for c, need in conds if need]
    return " && ".join(needed) if needed else ""


def _when(cond: str, expr: str, otherwise: str = "0.0f") -> str:
    return f"({cond}) ? {expr} : {otherwise}" if cond else expr


def _epilogue_block(epilogue: Epilogue, acc_expr: str, row_guard: bool, col_guard: bool) -> str:
    """``if (row < M && col < N) { const float acc = ...; <epilogue> }``."""
    body = block(f"const float acc = {acc_expr};", epilogue("bat", "row", "col", "acc"))
    cond = _guard(("row < M", row_guard), ("col < N", col_guard))
    return f"if ({cond}) {{\n{indent(body)}\n}}" if cond else f"{{\n{indent(body)}\n}}"


@dataclass(frozen=True)
class _Stage:
    """How one operand tile is copied global -> registers -> shared memory.

    The tile is ``rows x cols`` (A: TM x TK, B: TK x TN). ``fast`` is the tile index that
    consecutive threads take (the one contiguous in global memory, for coalescing).
    """

    name: str  # "a" or "b"
    rows: int
    cols: int
    fast: str  # "row" or "col"
    threads: int

    @property
    def per_thread(self) -> int:
        return self.rows * self.cols // self.threads

    @property
    def _fast_size(self) -> int:
        return self.cols if self.fast == "col" else self.rows

    def setup(self) -> str:
        """This thread's first tile element, computed once (so the unrolled loads below differ
        only by constant offsets and the compiler folds them into the addresses)."""
        n = self._fast_size
        if self.threads % n == 0:
            fast, slow = ("c", "r") if self.fast == "col" else ("r", "c")
            first = f"{self.name}_{slow}0 = threadIdx.x / {n}, {self.name}_{fast}0 = threadIdx.x % {n}"
            return f"const int {first};  // first {self.name.upper()} tile element this thread copies"
        return ""

    def coords(self) -> str:
        """``r`` and ``c`` of the ``l``-th tile element this thread copies."""
        n = self._fast_size
        if self.threads % n == 0:
            step = self.threads // n
            if self.fast == "col":
                return f"const int r = {self.name}_r0 + l * {step}, c = {self.name}_c0;"
            return f"const int r = {self.name}_r0, c = {self.name}_c0 + l * {step};"
        if self.fast == "col":
            return f"const int e = threadIdx.x + l * {self.threads}, r = e / {n}, c = e % {n};"
        return f"const int e = threadIdx.x + l * {self.threads}, r = e % {n}, c = e / {n};"


def _check_staging(stage: _Stage) -> None:
    if (stage.rows * stage.cols) % stage.threads:
        raise ValueError(f"a {stage.rows}x{stage.cols} operand tile does not split evenly over "
                         f"{stage.threads} threads; choose tiles with rows*cols a multiple of threads")


def _fetch_and_stash(p: GemmProblem, sa: _Stage, sb: _Stage, load_a: LoadA, load_b: LoadB,
                     a_slot: str, b_slot: str, convert: Callable[[str], str],
                     m_guard: bool, n_guard: bool, k_guard: bool) -> list[str]:
    """The two lambdas shared by the tiled variants: ``fetch(k0)`` loads the k-tile at ``k0``
    into registers, ``stash()`` writes those registers to the shared tiles."""
    a_cond = _guard(("row < M", m_guard), ("k < K", k_guard))
    b_cond = _guard(("k < K", k_guard), ("col < N", n_guard))
    fetch = block(
        "auto fetch = [&](int k0) {  // global -> registers: the k-tile starting at k0",
        "    #pragma unroll",
        f"    for (int l = 0; l < {sa.per_thread}; ++l) {{",
        f"        {sa.coords()}  // A tile element (r, c)",
        "        const int row = row0 + r, k = k0 + c;",
        f"        a_next[l] = {_when(a_cond, load_a('bat', 'row', 'k'))};",
        "    }",
        "    #pragma unroll",
        f"    for (int l = 0; l < {sb.per_thread}; ++l) {{",
        f"        {sb.coords()}  // B tile element (r, c)",
        "        const int k = k0 + r, col = col0 + c;",
        f"        b_next[l] = {_when(b_cond, load_b('bat', 'k', 'col'))};",
        "    }",
        "};",
    )
    stash = block(
        "auto stash = [&]() {  // registers -> shared tiles",
        "    #pragma unroll",
        f"    for (int l = 0; l < {sa.per_thread}; ++l) {{",
        f"        {sa.coords()}",
        f"        {a_slot} = {convert('a_next[l]')};",
        "    }",
        "    #pragma unroll",
        f"    for (int l = 0; l < {sb.per_thread}; ++l) {{",
        f"        {sb.coords()}",
        f"        {b_slot} = {convert('b_next[l]')};",
        "    }",
        "};",
    )
    return [sa.setup(), sb.setup(),
            f"float a_next[{sa.per_thread}], b_next[{sb.per_thread}];  // next k-tile, staged in registers",
            fetch, stash]


def _k_loop(tk: int, compute: str) -> list[str]:
    return [
        "fetch(0);",
        "for (int k0 = 0; k0 < K; k0 += TK) {",
        "    stash();",
        "    __syncthreads();",
        "    if (k0 + TK < K) fetch(k0 + TK);  // next tile's global loads overlap this tile's math",
        indent(compute),
        "    __syncthreads();  // all warps are done with this tile",
        "}",
    ]


# --------------------------------------------------------------------------------------
# (a) SIMT fp32
# --------------------------------------------------------------------------------------
def _micro_tile(tm: int, tn: int, threads: int) -> tuple[int, int]:
    per_thread = tm * tn // threads
    if per_thread * threads != tm * tn or per_thread == 0:
        raise ValueError(f"a {tm}x{tn} tile does not split evenly over {threads} threads")
    rn = 1 << int(math.log2(math.isqrt(per_thread)) if per_thread > 1 else 0)
    rm = per_thread // rn
    if tm % rm or tn % rn or rm * rn != per_thread:
        raise ValueError(f"no RM x RN micro-tile for a {tm}x{tn} tile on {threads} threads")
    return rm, rn


def simt_gemm(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, tile_m: int = 64,
              tile_n: int = 64, tile_k: int = 32, threads: int = 256, item: str = "item",
              smem: str = "tkx_smem") -> GemmCode:
    """(a) fp32 SIMT GEMM: shared tiles ``A[TM x TK]`` and ``B[TK x TN]``, each thread an
    ``RM x RN`` block of accumulators in registers, one ``fmaf`` per k in a fixed order.

    Thread (ty, tx) owns rows ``ty + i*TY`` and columns ``tx + j*TX`` of the tile (interleaved,
    so a warp reads consecutive shared-memory words and stores consecutive columns of C).
    A is kept k-major in shared memory (``As[k][m]``) so the inner loop reads one word per row.
    """
    tm, tn, tk = tile_m, tile_n, tile_k
    rm, rn = _micro_tile(tm, tn, threads)
    tx_count, ty_count = tn // rn, tm // rm
    sa = _Stage("a", tm, tk, "col" if p.a_k_contiguous else "row", threads)
    sb = _Stage("b", tk, tn, "col" if p.b_n_contiguous else "row", threads)
    for s in (sa, sb):
        _check_staging(s)
    # pad a shared row by one word when consecutive threads write down a column of it
    pad_a = 1 if sa.fast == "col" else 0
    pad_b = 1 if sb.fast == "row" else 0
    lda, ldb = tm + pad_a, tn + pad_b
    a_bytes = _align(tk * lda * 4)
    shared = a_bytes + _align(tk * ldb * 4)
    m_guard, n_guard, k_guard = p.m % tm != 0, p.n % tn != 0, p.k % tk != 0

    compute = block(
        "#pragma unroll",
        "for (int kk = 0; kk < TK; ++kk) {",
        f"    float a[{rm}], b[{rn}];",
        "    #pragma unroll",
        f"    for (int i = 0; i < {rm}; ++i) a[i] = As[kk * {lda} + ty + i * {ty_count}];",
        "    #pragma unroll",
        f"    for (int j = 0; j < {rn}; ++j) b[j] = Bs[kk * {ldb} + tx + j * {tx_count}];",
        "    #pragma unroll",
        f"    for (int i = 0; i < {rm}; ++i)",
        "        #pragma unroll",
        f"        for (int j = 0; j < {rn}; ++j) sums[i][j] = fmaf(a[i], b[j], sums[i][j]);",
        "}",
    )
    epi = block(
        "#pragma unroll",
        f"for (int i = 0; i < {rm}; ++i) {{",
        f"    const int row = row0 + ty + i * {ty_count};",
        "    #pragma unroll",
        f"    for (int j = 0; j < {rn}; ++j) {{",
        f"        const int col = col0 + tx + j * {tx_count};",
        indent(_epilogue_block(epilogue, "sums[i][j]", m_guard, n_guard), 2),
        "    }",
        "}",
        "__syncthreads();  // staging areas are read before the next work item reuses the workspace",
    )
    body = block(
        _tile_header(p, tm, tn, item, f"SIMT fp32 GEMM, one {tm}x{tn} tile of C; {rm}x{rn} per thread"),
        f"constexpr int TM = {tm}, TN = {tn}, TK = {tk};",
        f"float* As = reinterpret_cast<float*>({smem});  // A tile, k-major: As[k * {lda} + m]",
        f"float* Bs = reinterpret_cast<float*>({smem} + {a_bytes});  // B tile: Bs[k * {ldb} + n]",
        f"const int tx = threadIdx.x % {tx_count}, ty = threadIdx.x / {tx_count};"
        f"  // rows ty + {ty_count}*i, cols tx + {tx_count}*j",
        f"float sums[{rm}][{rn}];  // this thread's accumulators",
        "#pragma unroll",
        f"for (int i = 0; i < {rm}; ++i)",
        "    #pragma unroll",
        f"    for (int j = 0; j < {rn}; ++j) sums[i][j] = 0.0f;",
        _fetch_and_stash(p, sa, sb, load_a, load_b, f"As[c * {lda} + r]", f"Bs[r * {ldb} + c]", lambda v: v,
                         m_guard, n_guard, k_guard),
        _k_loop(tk, compute),
        "// epilogue: each thread hands its accumulators to the caller's code",
        epi,
    )
    items = p.batch * _ceil(p.m, tm) * _ceil(p.n, tn)
    params = {"tile": (tm, tn, tk), "micro_tile": (rm, rn), "thread_grid": (ty_count, tx_count),
              "a_fast": sa.fast, "b_fast": sb.fast}
    return GemmCode("simt", "{\n" + indent(body) + "\n}", items, shared, threads, False, params)


# --------------------------------------------------------------------------------------
# (b, c) tensor cores through WMMA
# --------------------------------------------------------------------------------------
_WMMA = {
    # variant: (C element type, fragment k, precision tag, float -> element conversion, element bytes)
    "wmma_bf16": ("__nv_bfloat16", 16, "__nv_bfloat16", "__float2bfloat16_rn({})", 2),
    "wmma_f16": ("__half", 16, "__half", "__float2half_rn({})", 2),
    "wmma_tf32": ("float", 8, "wmma::precision::tf32", "wmma::__float_to_tf32({})", 4),
}


def _warp_grid(fm: int, fn: int, warps: int) -> tuple[int, int]:
    """Warps arranged WM x WN over an FM x FN grid of fragments, as square per warp as possible."""
    best = None
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if fm % wm or fn % wn:
            continue
        per_m, per_n = fm // wm, fn // wn
        score = (abs(per_m - per_n), -per_m)
        if best is None or score < best[0]:
            best = (score, wm, wn)
    if best is None:
        raise ValueError(f"cannot spread a {fm}x{fn} grid of 16x16 fragments over {warps} warps")
    return best[1], best[2]


def wmma_gemm(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, variant: str = "wmma_bf16",
              tile_m: int = 64, tile_n: int = 64, tile_k: int = 32, threads: int = 256, item: str = "item",
              smem: str = "tkx_smem") -> GemmCode:
    """(b) bf16/fp16 and (c) tf32 tensor-core GEMM through ``nvcuda::wmma``, fp32 accumulators.

    Operand tiles are converted to the fragment type while staged into shared memory (exact
    for bf16/fp16 data; tf32 rounds fp32 data as ``torch.backends.cuda.matmul.allow_tf32``
    does). Each shared tile keeps the operand's memory order (``row_major`` or ``col_major``
    fragments), so transposed views load coalesced. After the k loop each warp passes its
    accumulator fragments, one at a time, through its own 16x16 staging area in shared memory
    (which reuses the operand tiles' bytes) so that the epilogue runs per element (16 lanes on
    consecutive columns, two rows of C per step), without a whole-tile C buffer.
    """
    if variant not in _WMMA:
        raise ValueError(f"unknown tensor-core variant {variant!r}; one of {sorted(_WMMA)}")
    elem, fk, frag_t, conv, ebytes = _WMMA[variant]
    tm, tn, tk = tile_m, tile_n, tile_k
    if tm % 16 or tn % 16 or tk % fk or threads % 32:
        raise ValueError(f"{variant} needs tiles in multiples of 16x16x{fk} and whole warps")
    warps = threads // 32
    fm, fn = tm // 16, tn // 16
    wm, wn = _warp_grid(fm, fn, warps)
    pm, pn = fm // wm, fn // wn  # fragments per warp
    sa = _Stage("a", tm, tk, "col" if p.a_k_contiguous else "row", threads)
    sb = _Stage("b", tk, tn, "col" if p.b_n_contiguous else "row", threads)
    for s in (sa, sb):
        _check_staging(s)
    pad = 16 // ebytes  # keeps rows 16-byte aligned while shifting banks
    # A: row_major As[m][k] when k is contiguous in memory, else col_major As[k][m]; B alike.
    a_row = p.a_k_contiguous
    b_row = p.b_n_contiguous
    lda = (tk if a_row else tm) + pad
    ldb = (tn if b_row else tk) + pad
    ldc = 20  # a warp's 16x16 staging area, rows padded to 20 floats
    a_bytes = _align((tm if a_row else tk) * lda * ebytes)
    b_bytes = _align((tk if b_row else tn) * ldb * ebytes)
    shared = max(a_bytes + b_bytes, _align(warps * 16 * ldc * 4))  # the staging areas reuse As/Bs
    a_slot = f"As[r * {lda} + c]" if a_row else f"As[c * {lda} + r]"
    b_slot = f"Bs[r * {ldb} + c]" if b_row else f"Bs[c * {ldb} + r]"
    a_ptr = f"As + (wr * {pm} + i) * 16 * {lda} + kk" if a_row else f"As + kk * {lda} + (wr * {pm} + i) * 16"
    b_ptr = f"Bs + kk * {ldb} + (wc * {pn} + j) * 16" if b_row else f"Bs + (wc * {pn} + j) * 16 * {ldb} + kk"
    a_layout = "wmma::row_major" if a_row else "wmma::col_major"
    b_layout = "wmma::row_major" if b_row else "wmma::col_major"
    m_guard, n_guard, k_guard = p.m % tm != 0, p.n % tn != 0, p.k % tk != 0

    compute = block(
        "#pragma unroll",
        f"for (int kk = 0; kk < TK; kk += {fk}) {{",
        f"    wmma::fragment<wmma::matrix_a, 16, 16, {fk}, {frag_t}, {a_layout}> a[{pm}];",
        f"    wmma::fragment<wmma::matrix_b, 16, 16, {fk}, {frag_t}, {b_layout}> b[{pn}];",
        "    #pragma unroll",
        f"    for (int i = 0; i < {pm}; ++i) wmma::load_matrix_sync(a[i], {a_ptr}, {lda});",
        "    #pragma unroll",
        f"    for (int j = 0; j < {pn}; ++j) wmma::load_matrix_sync(b[j], {b_ptr}, {ldb});",
        "    #pragma unroll",
        f"    for (int i = 0; i < {pm}; ++i)",
        "        #pragma unroll",
        f"        for (int j = 0; j < {pn}; ++j) wmma::mma_sync(c_frag[i][j], a[i], b[j], c_frag[i][j]);",
        "}",
    )
    frag_epilogue = block(
        f"wmma::store_matrix_sync(Cw, c_frag[i][j], {ldc}, wmma::mem_row_major);",
        "__syncwarp();",
        "#pragma unroll 1  // kept rolled: fewer registers, the fragment loops around it are unrolled",
        "for (int e = lane; e < 256; e += 32) {  // lanes 0-15 and 16-31 take two rows at a time",
        f"    const int row = row0 + (wr * {pm} + i) * 16 + e / 16;",
        f"    const int col = col0 + (wc * {pn} + j) * 16 + e % 16;",
        indent(_epilogue_block(epilogue, f"Cw[(e / 16) * {ldc} + e % 16]", m_guard, n_guard)),
        "}",
        "__syncwarp();  // Cw is read before the next fragment overwrites it",
    )
    epi = block(
        "#pragma unroll",
        f"for (int i = 0; i < {pm}; ++i) {{",
        "    #pragma unroll",
        f"    for (int j = 0; j < {pn}; ++j) {{",
        indent(frag_epilogue, 2),
        "    }",
        "}",
    )
    what = {"wmma_bf16": "bf16", "wmma_f16": "fp16", "wmma_tf32": "tf32"}[variant]
    body = block(
        _tile_header(p, tm, tn, item, f"tensor-core GEMM ({what} WMMA 16x16x{fk}, fp32 accumulate), "
                     f"one {tm}x{tn} tile of C; {wm}x{wn} warps, {pm}x{pn} fragments each"),
        "using namespace nvcuda;",
        f"constexpr int TM = {tm}, TN = {tn}, TK = {tk};",
        f"{elem}* As = reinterpret_cast<{elem}*>({smem});  // A tile, "
        + (f"row-major As[m * {lda} + k]" if a_row else f"col-major As[k * {lda} + m]"),
        f"{elem}* Bs = reinterpret_cast<{elem}*>({smem} + {a_bytes});  // B tile, "
        + (f"row-major Bs[k * {ldb} + n]" if b_row else f"col-major Bs[n * {ldb} + k]"),
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
        f"const int wr = warp / {wn}, wc = warp % {wn};  // this warp's block of fragments",
        f"float* Cw = reinterpret_cast<float*>({smem}) + warp * {16 * ldc};"
        f"  // after the k loop: this warp's staging area, Cw[r * {ldc} + c]",
        f"wmma::fragment<wmma::accumulator, 16, 16, {fk}, float> c_frag[{pm}][{pn}];  // accumulators",
        "#pragma unroll",
        f"for (int i = 0; i < {pm}; ++i)",
        "    #pragma unroll",
        f"    for (int j = 0; j < {pn}; ++j) wmma::fill_fragment(c_frag[i][j], 0.0f);",
        _fetch_and_stash(p, sa, sb, load_a, load_b, a_slot, b_slot, conv.format, m_guard, n_guard, k_guard),
        _k_loop(tk, compute),
        "// epilogue: each fragment goes through the warp's staging area, then element by element",
        epi,
        "__syncthreads();  // every warp is done with its staging area before the next item reuses it",
    )
    items = p.batch * _ceil(p.m, tm) * _ceil(p.n, tn)
    params = {"tile": (tm, tn, tk), "warp_grid": (wm, wn), "fragments_per_warp": (pm, pn),
              "a_layout": a_layout.split("::")[1], "b_layout": b_layout.split("::")[1]}
    return GemmCode(variant, "{\n" + indent(body) + "\n}", items, shared, threads, True, params)


# --------------------------------------------------------------------------------------
# (e) Hopper warpgroup MMA (wgmma, sm_90a)
# --------------------------------------------------------------------------------------
_WGMMA = {
    # variant: (element type, k per instruction, PTX type, float -> element, element bytes)
    "wgmma_bf16": ("__nv_bfloat16", 16, "bf16", "__float2bfloat16_rn({})", 2),
    "wgmma_f16": ("__half", 16, "f16", "__float2half_rn({})", 2),
    "wgmma_tf32": ("float", 8, "tf32", "nvcuda::wmma::__float_to_tf32({})", 4),
}

#: Bytes of one swizzled row of an operand tile (the 128-byte swizzle mode's span).
SWIZZLE_ROW = 128


def _wgmma_asm(n: int, ptx_type: str, fk: int, acc: str) -> str:
    """One ``wgmma.mma_async`` of shape m64 x ``n`` x ``fk``: D[64 x n] += A[64 x fk] B[fk x n],
    both operands read from shared memory through descriptors ``da`` and ``db``."""
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    trans = ", 0, 0" if ptx_type != "tf32" else ""
    outs = ", ".join(f'"+f"({acc}[{i}])' for i in range(regs))
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k{fk}.f32.{ptx_type}.{ptx_type} '
            f'{{{d}}}, %{regs}, %{regs + 1}, p, 1, 1{trans};\\n}}\\n"\n'
            f'    : {outs}\n'
            f'    : "l"(da), "l"(db), "r"(1));')


def _wgmma_vector_staging(p: GemmProblem, tm: int, tn: int, tk: int, threads: int, ebytes: int,
                          ptr_a: PtrA | None, ptr_b: PtrB | None, load_a: LoadA, load_b: LoadB,
                          convert: str, m_guard: bool, n_guard: bool, k_guard: bool) -> str | None:
    """16-byte staging of both operands, or ``None`` when it does not apply.

    Defines ``fetch(k0)``: this thread's 8-element vectors of the k-tile at ``k0`` into ``uint4``
    registers (one 16-byte load each when ``vec_ok``, both operands' addresses being 16-byte
    aligned; else element by element through the load callbacks, packed into the same
    registers), and ``stash_into(As, Bs)``: the vectors into the swizzled stage (one 16-byte store
    when the vector runs along K, else eight 2-byte stores into consecutive tile rows).
    """
    if ptr_a is None or ptr_b is None or ebytes != 2:
        return None
    if not p.a_k_contiguous or p.b_n_contiguous:
        # measured on the H200: a vector along M or N costs eight 2-byte shared stores into eight
        # swizzled rows, slower than the element path; only K-contiguous operands (one 16-byte
        # chunk per vector) gain (256x4096x1024 with B^T: 13.9 us against 30.4 us)
        return None
    per = 16 // ebytes  # elements per vector
    bits = f"__{'bfloat16' if p.dtype == 'bfloat16' else 'half'}_as_ushort"
    # operand: (name, tile rows R, vector along "k" or "r", bound of R, origin, pointer, element)
    ops = [("a", tm, "k" if p.a_k_contiguous else "r", "M", "row0", lambda r, k: ptr_a("bat", r, k),
            lambda r, k: load_a("bat", r, k)),
           ("b", tn, "k" if not p.b_n_contiguous else "r", "N", "col0", lambda r, k: ptr_b("bat", k, r),
            lambda r, k: load_b("bat", k, r))]
    fetch, stash, checks, decls = [], [], [], []
    for name, rows, along, bound, origin, ptr, elem_of in ops:
        count = rows * tk // per
        if count % threads:
            return None
        if along == "k" and p.k % per or along == "r" and (p.m if name == "a" else p.n) % per:
            return None
        n_per = count // threads
        tile = "As" if name == "a" else "Bs"
        guard_r = m_guard if name == "a" else n_guard
        checks.append(f"(((unsigned long long){ptr('0', '0')}) & 15ULL) == 0")
        decls.append(f"uint4 {name}_vec[{n_per}];")
        if along == "k":  # 8 consecutive k of one tile row: one 16-byte swizzle chunk
            vr = tk // per
            coords = f"const int e = threadIdx.x + l * {threads}, r = e / {vr}, c = (e % {vr}) * {per};"
            elem_rc = ("r", "c + {j}")
            store = (f"*reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>({tile}) + r * {SWIZZLE_ROW} + "
                     f"(((c / {per}) ^ (r & 7)) * 16)) = {name}_vec[l];")
        else:  # 8 consecutive tile rows at one k: eight 2-byte stores
            vr = rows // per
            coords = f"const int e = threadIdx.x + l * {threads}, c = e / {vr}, r = (e % {vr}) * {per};"
            elem_rc = ("r + {j}", "c")
            store = block(
                f"const unsigned w[4] = {{{name}_vec[l].x, {name}_vec[l].y, {name}_vec[l].z, {name}_vec[l].w}};",
                "#pragma unroll",
                f"for (int j = 0; j < {per}; ++j)",
                f"    reinterpret_cast<unsigned short*>({tile})[(r + j) * {SWIZZLE_ROW // ebytes} + "
                f"(((c / {per}) ^ ((r + j) & 7)) * {per}) + (c % {per})] = "
                "(unsigned short)(w[j / 2] >> (16 * (j % 2)));")
        cond = _guard((f"{origin} + r < {bound}", guard_r), ("k0 + c < K", k_guard))
        load = f"*reinterpret_cast<const uint4*>({ptr(f'({origin} + r)', '(k0 + c)')})"
        elems = []
        for j in range(per):
            er, ec = (x.format(j=j) for x in elem_rc)
            x = elem_of(f"({origin} + {er})", f"(k0 + {ec})")
            elems.append(f"{bits}({convert.format(x)})")
        words = ", ".join(f"(unsigned){elems[2 * w]} | ((unsigned){elems[2 * w + 1]} << 16)" for w in range(4))
        fetch += ["    #pragma unroll",
                  f"    for (int l = 0; l < {n_per}; ++l) {{",
                  f"        {coords}",
                  f"        if (!({cond or 'true'})) {name}_vec[l] = make_uint4(0u, 0u, 0u, 0u);",
                  f"        else if (vec_ok) {name}_vec[l] = {load};",
                  f"        else {name}_vec[l] = make_uint4({words});",
                  "    }"]
        stash += ["    #pragma unroll",
                  f"    for (int l = 0; l < {n_per}; ++l) {{",
                  f"        {coords}",
                  indent(store, 2),
                  "    }"]
    return block(
        *decls,
        f"const bool vec_ok = {' && '.join(checks)};  // both operands 16-byte aligned: 16-byte loads",
        "auto fetch = [&](int k0) {  // global -> registers, 8 elements per vector", *fetch, "};",
        "auto stash_into = [&](void* As, void* Bs) {  // registers -> the swizzled stage", *stash, "};",
    )


#: Shared-memory stages of the pipelined wgmma GEMM (copies of the next STAGES - 1 k-tiles in flight)
#: when no shared-memory budget is given; with one, as many as fit (:func:`wgmma_stages`).
WGMMA_STAGES = 4
#: The most stages a budget buys (beyond this, more copies in flight no longer hide L2 latency).
WGMMA_MAX_STAGES = 8
#: Elements per thread and pass of the wgmma tile epilogue (their loads in flight together). A 128x256
#: tile of an SGD update took 16 passes of 8 (the target's :data:`~tkx.target.EPILOGUE_BATCH`) on 256
#: threads, each waiting one memory latency (on the H200 its items ran 15 µs in medium's step against
#: about 7 µs with a store-only epilogue); 16 halves the passes. Registers (sm_90a, NVRTC, no spills):
#: small 116 -> 134, medium 155 -> 154, mixed_precision 154 -> 178 (32: 168 / 189 / 246). With
#: ``WgmmaKnobs.epilogue_vector`` this is the scalar path: the fallback for misaligned pointers and epilogues without a point access.
WGMMA_EPILOGUE_BATCH = 16
#: A tile that crosses the edge of C (M or N not a multiple of the tile) batches its epilogue too:
#: the elements outside C get clamped coordinates (their loads read an element inside C) and are not
#: stored. Off: such tiles keep the rolled loop, one element per iteration, each waiting a memory
#: latency: mixed_precision's 32-row GEMMs on 64-row tiles with an SGD update (16 serial iterations of
#: ~0.7 µs per work item made that step 1.9x slower than torch.compile on the H200).
WGMMA_GUARDED_BATCH = True
#: 2-CTA clusters (``Options.gemm_cluster``): k-tiles between a CTA's release of a stage (its
#: warpgroups are done with it) and the refill that waits for both CTAs' releases; each costs one k-tile
#: in flight. 0 puts the wait for the partner right after this CTA's own release. Measured on the H200
#: (cluster-scope handshake): medium's 256x4096x1024 GEMM 15.2 / 14.4 / 14.3 µs with slack
#: 0 / 1 / 2 (unpaired 8.7): the wait is not what makes the paired kernel slow.
WGMMA_CLUSTER_SLACK = 1


@dataclass(frozen=True)
class WgmmaKnobs:
    """The :class:`tkx.Options` fields that select variants of the wgmma GEMM's code.

    ``in_flight`` (``wgmma_in_flight``): wgmma groups (one k-tile's MMAs each) a warpgroup leaves in flight
    when it moves to the next k-tile (``wgmma.wait_group`` N): 0 waits for each k-tile's MMAs before the next
    is issued (the tensor cores idle during the barrier, the wait for the next tile and the copy issue); 1
    issues k-tile kt's MMAs and then waits only for k-tile kt - 1's, refilling the stage of k-tile kt - 2
    (one stage fewer holds copies in flight).

    ``epilogue_vector`` (``epilogue_vector``): the batched tile epilogue (and split-K's final phase) in runs
    of V column-adjacent elements per thread (V = 8 with a 2-byte point access, 4 with 4-byte ones only): the
    C tile read as float4, every buffer read at the output's own index (an SGD update's weight, a ReLU mask)
    loaded as one 16-byte vector per run and the outputs stored as 16-byte vectors
    (:mod:`tkx.codegen.epilogue_vector`), behind a block-uniform 16-byte alignment test of the pointers
    whose false branch is the scalar code; the same per-element arithmetic. On by default: measured on the
    H200 (item medians) medium's SGD-update tiles (128x256, 128 elements per thread) 10.69 -> 8.83 µs and
    12.67 -> 10.62 µs, its 64x128 ReLU-mask tiles 7.04 -> 6.18 µs, the step 67.8 -> 60.6 µs; small 24.7 ->
    24.5 µs. Registers (sm_90a, NVRTC, no spills): small 112 -> 157, medium 154 -> 183.

    ``epilogue_prefetch`` (``epilogue_prefetch``, off: not measured faster): at the start of a work item
    without split-K, the block asks L2 to prefetch (``prefetch.global.L2``, one request per 128-byte line)
    the rows of this tile of every buffer the epilogue reads at the output's own index, so the epilogue
    waits an L2 hit instead of a DRAM access. Only for tiles inside the matrix.

    ``cluster_scope`` (``cluster_scope``): memory semantics of a 2-CTA cluster's stage handshake (each CTA's
    release of a stage and the wait for both): ``"cluster"`` (``.release.cluster`` / ``.acquire.cluster``,
    verified on the H200, +0.3 µs per k-tile) or ``"cta"`` (the instructions' defaults, as CUTLASS's
    cluster pipelines use: the hazard is write-after-read, the partner's MMA reads being complete at its
    ``wgmma.wait_group`` before it arrives).

    ``cluster_multicast`` (``cluster_multicast``): ``False`` makes each CTA of a pair copy the whole B tile
    itself (no multicast), keeping the pairing and the handshake, to separate the multicast's cost from
    the synchronisation's.
    """

    in_flight: int = 1
    epilogue_vector: bool = True
    epilogue_prefetch: bool = False
    cluster_scope: str = "cluster"
    cluster_multicast: bool = True

    @staticmethod
    def of(options: Options) -> WgmmaKnobs:
        """The knobs of ``options`` (a :class:`tkx.Options`)."""
        return WgmmaKnobs(options.wgmma_in_flight, options.epilogue_vector, options.epilogue_prefetch,
                          options.cluster_scope, options.cluster_multicast)


def tensormap_prefetch(maps: int, tmaps: str = "tmaps", *, on: bool = False) -> str:
    """C statement for kernel entry: every one of the ``maps`` 128-byte tensor maps at ``tmaps`` prefetched
    into the descriptor cache (warp 0, one map per lane and pass); empty without maps or when not ``on``
    (``Options.tensormap_prefetch``).

    Off by default: measured slower on the H200 (CUDA-graph replays) - small 22.20 µs off / 22.52 on,
    medium 66.08 / 66.65: the maps are not what a work item waits for (a 4-k-tile item without its copies
    still takes 2.9 of its 3.5 µs); the per-item prefetch just before a map's first copy stays either way."""
    if not maps or not on:
        return ""
    return (f"for (int m = threadIdx.x; m < {maps} && threadIdx.x < 32; m += 32)  // the {maps} tensor map(s) "
            "into the descriptor cache before any item's first copy\n"
            f'    asm volatile("prefetch.tensormap [%0];\\n" :: "l"({tmaps} + 128 * m) : "memory");')


#: fp32 words a row of the shared C tile is padded by: the accumulators are written as float2 (two
#: adjacent columns), and a half-warp's 16 float2 (4 rows x 4 column pairs) then hit 32 distinct banks.
WGMMA_C_PAD = 8
#: Register estimate of one vectorized pass (:meth:`~tkx.codegen.epilogue_vector.VectorAccesses.registers_per_element`
#: x elements): an SGD update (2 per element) takes 64 elements per pass, a 64x128 tile on 256 threads its
#: 32 in one pass.
WGMMA_EPILOGUE_VECTOR_REGS = 128
#: A vectorized tile epilogue of one pass whose point-read vectors take at most this many registers per
#: thread (64x128 tile, one bf16 read: 16) issues those loads at the start of the work item, before the
#: k-loop, so their latency hides behind the operand copies (not with split-K). 0: never. Measured on the
#: H200 (item medians): small's 2.30 -> 2.18 µs and 1.60 -> 1.47 µs, medium's 6.37 -> 6.18 µs against the
#: vector epilogue without them.
WGMMA_EPILOGUE_EARLY_REGS = 16


def wgmma_stages(stage_bytes: int, k_steps: int, shared_budget: int | None, mma_in_flight: int = 0) -> int:
    """Stages of the cp.async pipeline: :data:`WGMMA_STAGES` without a budget, else as many
    ``stage_bytes`` stages as ``shared_budget`` bytes hold (less the 1024-byte alignment slack), at
    most :data:`WGMMA_MAX_STAGES` and at most ``1 + mma_in_flight`` more than the K steps (all of K
    in flight; each wgmma group left in flight holds one stage), at least 2.

    Measured on the H200 (medium's 256x4096x1024 GEMM, 64x128 tiles on 128 SMs, 8 stages, TMA): the
    kernel without its MMAs takes 8.4 µs per call of its 8.9 µs and without its copies 6.6 µs: the
    operand stream (48 MiB through L2 for 8.5 MiB of operands) bounds it, not the copies' latency."""
    if shared_budget is None:
        return WGMMA_STAGES
    fit = (shared_budget - 1024) // stage_bytes
    return max(2, min(WGMMA_MAX_STAGES, fit, k_steps + 1 + mma_in_flight))


def _cluster_pipeline(*, tm: int, tn: int, stages: int, stage_bytes: int, a_bytes: int, ahead: int, freed: str,
                      lag: int, a_kmajor: bool, b_kmajor: bool, atom_stride: int, bar_offset: int, tmaps: str,
                      map_a: int, map_b: int, a_boxes: list[str], mma_issue: tuple[str, ...],
                      mma_step: tuple[str, ...],
                      knobs: WgmmaKnobs) -> tuple[list[str], tuple[str, ...], str, list[str]]:
    """The TMA pipeline of :func:`_wgmma_pipelined` for a pair of items in a 2-CTA cluster:
    ``(issue_fn, refill, k_loop, copy_setup)``. ``map_b`` is the map of one CTA's half of the B tile
    (K-major: a box of TK x TN / 2; N-major: the 64-column box map, half the boxes each)."""
    half = tn // 2
    if b_kmajor:  # rows [rank * TN / 2, (rank + 1) * TN / 2) of the K-major B tile
        b_boxes = [f"tma_mc(stage + {a_bytes} + tkx_rank * {half * SWIZZLE_ROW}, tma_b, k0, col0 + tkx_rank * {half}, "
                   "bar);"]
        whole = [f"tkx_tma2d(stage + {a_bytes + h * half * SWIZZLE_ROW}, tma_b, k0, col0 + {h * half}, bar);"
                 for h in range(2)]
    else:  # 64-column boxes [rank * n / 2, (rank + 1) * n / 2)
        nb = tn // 64 // 2
        b_boxes = [f"tma_mc(stage + {a_bytes} + (tkx_rank * {nb} + {j}) * {atom_stride}, tma_b, "
                   f"col0 + (tkx_rank * {nb} + {j}) * 64, k0, bar);" for j in range(nb)]
        whole = [f"tkx_tma2d(stage + {a_bytes + j * atom_stride}, tma_b, col0 + {j * 64}, k0, bar);"
                 for j in range(2 * nb)]
    if not knobs.cluster_multicast:  # ablation: each CTA copies the whole B tile itself (the pairing kept)
        b_boxes = whole
    # the stage handshake's memory semantics: "cta" (mbarrier.arrive's default .release.cta, try_wait's default
    # .acquire.cta: the hazard is the partner's MMA reads, complete at its wgmma.wait_group, before this CTA's
    # copy engine overwrites them) or "cluster" (.release.cluster / .acquire.cluster, cluster-scope fences)
    arrive_sem = ".release.cluster" if knobs.cluster_scope == "cluster" else ""
    wait_sem = ".acquire.cluster" if knobs.cluster_scope == "cluster" else ""
    issue_fn = [
        "auto tma_mc = [](unsigned dst, unsigned long long map, int x, int y, unsigned bar) {  // into both CTAs",
        '    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes'
        '.multicast::cluster "',
        '                 "[%0], [%1, {%2, %3}], [%4], %5;\\n" :: "r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar), '
        '"h"((unsigned short)3) : "memory");',
        "};",
        "auto issue = [&](int s, int k0) {  // thread 0: A of the k-tile at k0 -> stage s, and this CTA's half of B",
        f"    const unsigned stage = stage0 + s * {stage_bytes}, bar = bar0 + 8 * s;  // -> stage s of both CTAs",
        '    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n" :: "r"(bar), '
        f'"r"({stage_bytes}) : "memory");  // A + both halves of B',
        *("    " + x for x in a_boxes),
        *("    " + x for x in b_boxes),
        "};",
        "auto release = [&](int s) {  // thread 0: this CTA is done with stage s: arrive here and at the partner",
        "    const unsigned e = ebar0 + 8 * s;",
        "    unsigned r;",
        '    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\\n" : "=r"(r) : "r"(e), "r"(tkx_rank ^ 1));',
        f'    asm volatile("mbarrier.arrive{arrive_sem}.shared::cta.b64 _, [%0];\\n" :: "r"(e) : "memory");',
        f'    asm volatile("mbarrier.arrive{arrive_sem}.shared::cluster.b64 _, [%0];\\n" :: "r"(r) : "memory");',
        "};",
        "auto wait_empty = [&](int s, unsigned parity) {  // both CTAs are done with stage s",
        "    unsigned done = 0;",
        "    do {",
        f'        asm volatile("{{\\n.reg .pred p;\\nmbarrier.try_wait.parity{wait_sem}.shared::cta.b64 p, '
        '[%1], %2;\\n"',
        '                     "selp.u32 %0, 1, 0, p;\\n}\\n" : "=r"(done) : "r"(ebar0 + 8 * s), "r"(parity) : '
        '"memory");',
        "    } while (!done);",
        "};",
    ]
    # k-tile kt - 1 - lag is done (the barrier above): release its stage now, but refill (wait for both CTAs'
    # releases) the stage released WGMMA_CLUSTER_SLACK k-tiles earlier, so the partner has that long to
    # release it too and the wait is off the critical path
    go = max(1, ahead - WGMMA_CLUSTER_SLACK)  # k-tiles in flight ahead of the one consumed
    refill = (
        "    if (threadIdx.x == 0) {",
        f"        const int u = kt - {lag + 1};  // k-tile {freed}: this CTA's warpgroups are done with it",
        f"        if (u >= 0 && k_beg + (u + {stages}) * TK < k_end) release(u % {stages});  // its stage is refilled",
        f"        if (k0 + {go} * TK < k_end) {{  // refill stage (kt + {go}) % {stages}",
        f"            const int t = kt + {go}, s = t % {stages};",
        f"            if (t >= {stages}) wait_empty(s, ((t / {stages}) - 1) & 1);  // both CTAs released k-tile "
        f"t - {stages}",
        f"            issue(s, k0 + {go} * TK);",
        "        }",
        "    }",
    )
    k_loop = block(
        "if (threadIdx.x == 0) {  // this item's mbarriers (every fill and remote arrival of the last item was "
        "waited for)",
        '    asm volatile("prefetch.tensormap [%0];\\n" :: "l"(tma_a) : "memory");  // the maps into the '
        "descriptor cache",
        '    asm volatile("prefetch.tensormap [%0];\\n" :: "l"(tma_b) : "memory");',
        "    #pragma unroll 1",
        f"    for (int s = 0; s < {stages}; ++s) {{",
        '        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n" :: "r"(bar0 + 8 * s) : "memory");  // full',
        '        asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;\\n" :: "r"(ebar0 + 8 * s) : "memory");  '
        "// empty: both CTAs",
        "    }",
        '    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");',
        "}",
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // generic use before -> copy engine',
        "// both CTAs: mbarriers initialised and the previous item (its C tile) done before any copy lands",
        'asm volatile("barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;\\n" ::: '
        '"memory");',
        "if (threadIdx.x == 0) {",
        "    #pragma unroll 1",
        f"    for (int s = 0; s < {go}; ++s)  // prologue: the first {go} k-tiles in flight",
        "        if (k_beg + s * TK < k_end) issue(s, k_beg + s * TK);",
        "}",
        "#pragma unroll 1",
        "for (int kt = 0, k0 = k_beg; k0 < k_end; ++kt, k0 += TK) {",
        f"    tkx_mbar_wait(bar0 + 8 * (kt % {stages}), (kt / {stages}) & 1);  // k-tile kt has landed (A + B)",
        f"    __syncthreads();  // every warpgroup is done with k-tile {freed}: this CTA may release its stage",
        *((*refill, *mma_step) if lag == 0 else (*mma_issue, *refill, *mma_step)),
        "__syncthreads();  // every warpgroup's MMAs are done before the C tile reuses the stages",
    )
    copy_setup = [
        f"const unsigned bar0 = stage0 + {bar_offset};  // {stages} full mbarriers of 8 bytes, past the stages and C",
        f"const unsigned ebar0 = bar0 + {8 * stages};  // then {stages} empty mbarriers (arrivals of both CTAs)",
        f"const unsigned long long tma_a = (unsigned long long)({tmaps} + {map_a * 128}), "
        f"tma_b = (unsigned long long)({tmaps} + {map_b * 128});  // tensor maps {map_a}, {map_b} (B: one half)",
    ]
    return issue_fn, refill, k_loop, copy_setup


def _wgmma_pipelined(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, variant: str,
                     tm: int, tn: int, tk: int, threads: int, item: str, smem: str, ptr_a: PtrA | None,
                     ptr_b: PtrB | None, split: int = 1, shared_budget: int | None = None,
                     tma_a: TmaMap | None = None, tma_b: TmaMap | None = None,
                     tmaps: str = "tmaps", split_final: SplitFinal | None = None,
                     epilogue_reads: tuple[tuple[str, int], ...] = (), cluster: int = 1,
                     knobs: WgmmaKnobs = WgmmaKnobs()) -> GemmCode | None:
    """The wgmma GEMM with operands copied global -> shared by ``cp.async`` (16 bytes at a time, no
    registers), :func:`wgmma_stages` stages deep; ``None`` when it does not apply (see :func:`wgmma_gemm`).
    Each warpgroup leaves ``knobs.in_flight`` k-tiles' MMAs in flight (``wgmma.wait_group``)
    while it waits for the next k-tile and issues the copies into the stage freed before them.

    Each operand tile keeps the memory order of its operand: K-major (A row-major, B given as
    B^T) or MN-major (A transposed, B row-major; the MMA reads it with its transpose flag), both
    in the 128-byte swizzle. K-major: tile row r (an M or N index) is 128 bytes of K, 16-byte chunk
    c at chunk ``c ^ (r % 8)``. MN-major: atoms of 64 M/N indices x 8 k (1024 bytes), k-row kr of
    an atom is 128 bytes of M/N with chunk c at ``c ^ (kr % 8)``; atoms run along K first.

    With ``tma_a`` and ``tma_b`` (callbacks registering a tensor map of the operand for a box of
    (inner, outer) elements and returning its index, or ``None``), thread 0 copies each k-tile with
    the bulk tensor copy engine instead (``cp.async.bulk.tensor.2d``, one request per operand
    box, the engine writing the 128-byte swizzle itself and zero-filling outside the matrix), each
    stage completing on its own ``mbarrier`` (``expect_tx`` of the stage's bytes; consumers wait
    on the phase parity of the fill). The maps are read from the kernel parameter ``tmaps``.
    """
    elem, fk, ptx_type, conv, ebytes = _WGMMA[variant]
    if ptr_a is None or ptr_b is None or ebytes != 2 or tk * ebytes != SWIZZLE_ROW:
        return None
    per = 8
    groups = threads // 128
    wgm = tm // 64
    wgn = groups // wgm
    wn = tn // wgn
    a_kmajor, b_kmajor = p.a_k_contiguous, not p.b_n_contiguous
    if (a_kmajor or b_kmajor) and p.k % per:
        return None
    if not a_kmajor and p.m % per or not b_kmajor and (p.n % per or wn % 64):
        return None
    if (tm * tk // per) % threads or (tn * tk // per) % threads:
        return None
    a_bytes, b_bytes = tm * SWIZZLE_ROW, tn * SWIZZLE_ROW
    stage_bytes = a_bytes + b_bytes
    a_kmajor_, b_kmajor_ = p.a_k_contiguous, not p.b_n_contiguous
    map_a = map_b = None
    if cluster not in (1, 2):
        raise ValueError(f"cluster={cluster}: the wgmma GEMM pairs items in clusters of 2 CTAs or none (1)")
    tma_ok = tma_a is not None and tma_b is not None and p.batch == 1
    unpaired = None if cluster == 1 else (cluster_pairs(p, tm, tn, split, b_kmajor_) if tma_ok else
                                          "its operands are not copied with TMA")
    paired = cluster == 2 and unpaired is None
    if tma_ok:
        # boxes (inner, outer): a K-major tile is one box of TK x rows; an MN-major one a box of 64 x TK
        # per 64 rows (one swizzle atom column each); in a 2-CTA cluster a K-major B is copied in halves
        map_a = tma_a(tk, tm) if a_kmajor_ else tma_a(64, tk)
        map_b = tma_b(tk, tn // 2 if paired else tn) if b_kmajor_ else tma_b(64, tk)
    use_tma = map_a is not None and map_b is not None
    k_steps = _ceil(_ceil(p.k, tk), split)
    ldc = tn + WGMMA_C_PAD
    bar_room = (16 if paired else 8) * WGMMA_MAX_STAGES if use_tma else 0
    stages = wgmma_stages(stage_bytes, k_steps, None if shared_budget is None else shared_budget - bar_room,
                          knobs.in_flight)
    lag = max(0, min(knobs.in_flight, stages - 2))  # wgmma groups left in flight (each holds a stage)
    ahead = stages - 1 - lag  # k-tiles whose copies are issued before the first is consumed
    bar_offset = _align(max(stages * stage_bytes, tm * ldc * 4), 8)
    shared = bar_offset + bar_room + 1024
    m_guard, n_guard, k_guard = p.m % tm != 0, p.n % tn != 0, p.k % tk != 0
    bits = f"__{'bfloat16' if p.dtype == 'bfloat16' else 'half'}_as_ushort"
    atom_stride = (tk // 8) * 1024  # bytes between MN atoms of an MN-major tile

    def operand_issue(name: str, rows: int, kmajor: bool, bound: str, origin: str, guard_r: bool,
                      ptr: Callable[[str, str], str], elem_of: Callable[[str, str], str], region: int) -> str:
        n_per = rows * tk // per // threads
        if kmajor:
            coords = f"const int e = threadIdx.x + l * {threads}, r = e / {tk // per}, c = (e % {tk // per}) * {per};"
            offset = "r * 128 + ((((c >> 3) ^ (r & 7))) << 4)"
            elems = [elem_of(f"({origin} + r)", f"(k0 + c + {j})") for j in range(per)]
        else:
            coords = (f"const int e = threadIdx.x + l * {threads}, c = e / {rows // per}, "
                      f"r = (e % {rows // per}) * {per};")
            offset = (f"(r >> 6) * {atom_stride} + (c >> 3) * 1024 + (c & 7) * 128 + "
                      "((((r >> 3) & 7) ^ (c & 7)) << 4)")
            elems = [elem_of(f"({origin} + r + {j})", "(k0 + c)") for j in range(per)]
        cond = _guard((f"{origin} + r < {bound}", guard_r), ("k0 + c < K", k_guard)) or "true"
        packed = [f"{bits}({conv.format(x)})" for x in elems]
        words = ", ".join(f"(unsigned){packed[2 * w]} | ((unsigned){packed[2 * w + 1]} << 16)" for w in range(4))
        return block(
            "#pragma unroll",
            f"for (int l = 0; l < {n_per}; ++l) {{  // {name.upper()}: {n_per} vector(s) of 8 per thread, "
            + ("K-major" if kmajor else "MN-major"),
            f"    {coords}",
            f"    const bool in = {cond};",
            f"    const unsigned dst = stage + {region} + {offset};",
            "    if (vec_ok) {",
            f"        const void* src = in ? (const void*){ptr(f'({origin} + r)', '(k0 + c)')} : "
            f"(const void*){ptr('0', '0')};",
            '        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(dst), "l"(src), '
            '"r"(in ? 16 : 0) : "memory");',
            "    } else {",
            f"        const uint4 v = in ? make_uint4({words}) : make_uint4(0u, 0u, 0u, 0u);",
            '        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\\n" :: "r"(dst), "r"(v.x), "r"(v.y), '
            '"r"(v.z), "r"(v.w) : "memory");',
            "    }",
            "}",
        )

    issue_a = operand_issue("a", tm, a_kmajor, "M", "row0", m_guard, lambda r, k: ptr_a("bat", r, k),
                            lambda r, k: load_a("bat", r, k), 0)
    issue_b = operand_issue("b", tn, b_kmajor, "N", "col0", n_guard, lambda r, k: ptr_b("bat", k, r),
                            lambda r, k: load_b("bat", k, r), a_bytes)
    checks = " && ".join(f"(((unsigned long long){q}) & 15ULL) == 0" for q in (ptr_a("bat", "0", "0"),
                                                                            ptr_b("bat", "0", "0")))

    def desc_expr(kmajor: bool) -> str:
        lbo, sbo = (16, 1024) if kmajor else (atom_stride, 1024)
        return (f"(((unsigned long long)(a) & 0x3FFFFULL) >> 4) | ({lbo >> 4}ULL << 16) | ({sbo >> 4}ULL << 32) "
                "| (1ULL << 62)")

    a_step, b_step = (32 if a_kmajor else 2048), (32 if b_kmajor else 2048)
    a_wg = "wr * 64 * 128" if a_kmajor else f"wr * {atom_stride}"
    b_wg = f"wc * {wn} * 128" if b_kmajor else f"wc * {wn // 64 * atom_stride}"
    ksteps = tk // fk
    acc_regs = wn // 2
    regs = acc_regs
    dlist = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    mma = (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
           f'wgmma.mma_async.sync.aligned.m64n{wn}k{fk}.f32.{ptx_type}.{ptx_type} '
           f'{{{dlist}}}, %{regs}, %{regs + 1}, p, 1, 1, {0 if a_kmajor else 1}, {0 if b_kmajor else 1};\\n}}\\n"\n'
           f'    : {outs}\n'
           f'    : "l"(da), "l"(db), "r"(1));')
    # one landed k-tile through the tensor cores, and the end of the k loop (cp.async and TMA pipelines alike)
    mma_issue = (
        f"    const unsigned st = stage0 + (kt % {stages}) * {stage_bytes};",
        '    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");',
        "    #pragma unroll",
        f"    for (int ks = 0; ks < {ksteps}; ++ks) {{",
        f"        const unsigned long long da = desc(st + {a_wg} + ks * {a_step}, {int(a_kmajor)});",
        f"        const unsigned long long db = desc(st + {a_bytes} + {b_wg} + ks * {b_step}, {int(b_kmajor)});",
        indent(mma, 2),
        "    }",
        '    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");',
    )
    acc_fence = ("#pragma unroll  // the accumulators are final only after the wait",
                 f'for (int i = 0; i < {acc_regs}; ++i) asm volatile("" : "+f"(d[i]) :: "memory");')
    if lag == 0:
        mma_step = (*mma_issue, '    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");',
                    *("    " + x.split("  //")[0] for x in acc_fence), "}")
    else:
        # k-tile kt's MMAs are issued before the wait for k-tile kt - 1's: the tensor cores always have a
        # queued group while the warps pass the barrier, wait for the next tile and issue its copies
        mma_step = (f'    asm volatile("wgmma.wait_group.sync.aligned {lag};\\n" ::: "memory");  '
                    f"// k-tile kt - {lag}'s MMAs are done: its stage is free after the next barrier",
                    "}",
                    'asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");', *acc_fence)
    freed = "kt - 1" if lag == 0 else f"kt - {lag + 1}"
    cp_refill = (f"    if (k0 + {ahead} * TK < k_end) issue((kt + {ahead}) % {stages}, k0 + {ahead} * TK);"
                 f"  // into the stage k-tile {freed} used",
                 '    asm volatile("cp.async.commit_group;\\n" ::: "memory");')
    k_loop = block(
        "#pragma unroll 1",
        f"for (int s = 0; s < {ahead}; ++s) {{  // prologue: the first {ahead} k-tiles in flight",
        "    if (k_beg + s * TK < k_end) issue(s, k_beg + s * TK);",
        '    asm volatile("cp.async.commit_group;\\n" ::: "memory");',
        "}",
        "#pragma unroll 1",
        "for (int kt = 0, k0 = k_beg; k0 < k_end; ++kt, k0 += TK) {",
        f'    asm volatile("cp.async.wait_group {ahead - 1};\\n" ::: "memory");  // k-tile kt has landed',
        '    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // generic/copy writes -> MMA reads',
        f"    __syncthreads();  // ... for every thread; and every warpgroup is done with k-tile {freed}",
        *((*cp_refill, *mma_step) if lag == 0 else (*mma_issue, *cp_refill, *mma_step)),
        'asm volatile("cp.async.wait_group 0;\\n" ::: "memory");',
        "__syncthreads();  // every warpgroup's MMAs are done before the C tile reuses the stages",
    )
    if use_tma:
        def tma_boxes(name: str, rows: int, kmajor: bool, origin: str, region: int) -> list[str]:
            if kmajor:  # one box: TK (inner, K) x rows (outer)
                return [f"tkx_tma2d(stage + {region}, tma_{name}, k0, {origin}, bar);"]
            return [f"tkx_tma2d(stage + {region + j * atom_stride}, tma_{name}, {origin} + {64 * j}, k0, bar);"
                    for j in range(rows // 64)]
        issue_fn = [
            "auto issue = [&](int s, int k0) {  // thread 0: the k-tile at k0 -> stage s, completing on mbarrier s",
            f"    const unsigned stage = stage0 + s * {stage_bytes}, bar = bar0 + 8 * s;",
            '    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n" :: "r"(bar), '
            f'"r"({stage_bytes}) : "memory");',
            *("    " + x for x in tma_boxes("a", tm, a_kmajor, "row0", 0)),
            *("    " + x for x in tma_boxes("b", tn, b_kmajor, "col0", a_bytes)),
            "};",
        ]
        tma_refill = (f"    if (threadIdx.x == 0 && k0 + {ahead} * TK < k_end) issue((kt + {ahead}) % {stages}, "
                      f"k0 + {ahead} * TK);",)
        k_loop = block(
            "if (threadIdx.x == 0) {  // this item's mbarriers (every fill of the last item was waited for)",
            '    asm volatile("prefetch.tensormap [%0];\\n" :: "l"(tma_a) : "memory");  // the maps into the '
            "descriptor cache",
            '    asm volatile("prefetch.tensormap [%0];\\n" :: "l"(tma_b) : "memory");',
            "    #pragma unroll 1",
            f"    for (int s = 0; s < {stages}; ++s) "
            'asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n" :: "r"(bar0 + 8 * s) : "memory");',
            '    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");',
            "}",
            'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // generic use before -> copy engine',
            "__syncthreads();",
            "if (threadIdx.x == 0) {",
            "    #pragma unroll 1",
            f"    for (int s = 0; s < {ahead}; ++s)  // prologue: the first {ahead} k-tiles in flight",
            "        if (k_beg + s * TK < k_end) issue(s, k_beg + s * TK);",
            "}",
            "#pragma unroll 1",
            "for (int kt = 0, k0 = k_beg; k0 < k_end; ++kt, k0 += TK) {",
            f"    tkx_mbar_wait(bar0 + 8 * (kt % {stages}), (kt / {stages}) & 1);  // k-tile kt has landed",
            f"    __syncthreads();  // every warpgroup is done with k-tile {freed}: its stage may be refilled",
            *((*tma_refill, *mma_step) if lag == 0 else (*mma_issue, *tma_refill, *mma_step)),
            "__syncthreads();  // every warpgroup's MMAs are done before the C tile reuses the stages",
        )
        copy_setup = [
            f"const unsigned bar0 = stage0 + {bar_offset};  // {stages} mbarriers of 8 bytes, past the stages and C",
            f"const unsigned long long tma_a = (unsigned long long)({tmaps} + {map_a * 128}), "
            f"tma_b = (unsigned long long)({tmaps} + {map_b * 128});  // tensor maps {map_a}, {map_b}",
        ]
        if paired:
            issue_fn, tma_refill, k_loop, copy_setup = _cluster_pipeline(
                tm=tm, tn=tn, stages=stages, stage_bytes=stage_bytes, a_bytes=a_bytes, ahead=ahead, freed=freed,
                lag=lag, a_kmajor=a_kmajor, b_kmajor=b_kmajor, atom_stride=atom_stride, bar_offset=bar_offset,
                tmaps=tmaps, map_a=map_a, map_b=map_b, a_boxes=tma_boxes("a", tm, a_kmajor, "row0", 0),
                mma_issue=mma_issue, mma_step=mma_step, knobs=knobs)
    else:
        issue_fn = [
            "auto issue = [&](int s, int k0) {  // the k-tile at k0 -> stage s",
            f"    const unsigned stage = stage0 + s * {stage_bytes};",
            indent(issue_a),
            indent(issue_b),
            "};",
        ]
        copy_setup = [f"const bool vec_ok = {checks};  // 16-byte aligned operands: cp.async, else element loads"]
    swz = knobs.epilogue_vector
    vec = _vector_tile(epilogue, tm, tn, threads, ldc, m_guard, n_guard, split == 1, swz)
    epi = _wgmma_store_c("ws", acc_regs, wn, ldc, tm, tn, threads, epilogue, m_guard, n_guard,
                         _split_final_code(split_final, p, split, tm, tn, ldc, threads, m_guard, n_guard, swz), vec,
                         vector=swz)
    prefetch = (_epilogue_prefetch(epilogue_reads if split == 1 else (), p, tm, tn, threads, m_guard or n_guard)
                if knobs.epilogue_prefetch else [])
    early = vec.early_lines() if vec is not None else []
    what = {"wgmma_bf16": "bf16", "wgmma_f16": "fp16"}[variant]
    layouts = f"A {'K' if a_kmajor else 'M'}-major, B {'K' if b_kmajor else 'N'}-major"
    copies = "TMA (cp.async.bulk.tensor) + mbarriers" if use_tma else "cp.async"
    body = block(
        _tile_header(p, tm, tn, item, f"tensor-core GEMM ({what} wgmma m64n{wn}k{fk}, fp32 accumulate), one "
                     f"{tm}x{tn} tile of C; {wgm}x{wgn} warpgroups of 64x{wn}; {copies}, {stages} stages, "
                     f"{layouts}" + ("; 2-CTA cluster, B multicast" if paired else ""), split, tk, True,
                     pairs=paired),
        f"constexpr int TM = {tm}, TN = {tn}, TK = {tk};",
        f"unsigned char* ws = {smem} + ((1024u - ((unsigned)__cvta_generic_to_shared({smem}) & 1023u)) & 1023u);"
        "  // swizzle atoms start on 1024 bytes",
        "const unsigned stage0 = (unsigned)__cvta_generic_to_shared(ws);  // stage s: A tile then B tile, "
        f"{stage_bytes} bytes",
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
        f"const int wr = (warp / 4) / {wgn}, wc = (warp / 4) % {wgn};  // this warpgroup's block of C",
        *copy_setup,
        "auto desc = [](unsigned a, int kmajor) -> unsigned long long {  // wgmma shared-memory descriptor",
        f"    return kmajor ? ({desc_expr(True)}) : ({desc_expr(False)});",
        "};",
        *issue_fn,
        f"float d[{acc_regs}];  // accumulators of this thread (m64n{wn} fragment)",
        "#pragma unroll",
        f"for (int j = 0; j < {acc_regs}; ++j) d[j] = 0.0f;",
        *prefetch,
        *early,
        k_loop,
        "// epilogue: accumulators -> shared C tile -> per element",
        epi,
    )
    items = p.batch * _ceil(p.m, tm) * _ceil(p.n, tn) * split
    params = {"tile": (tm, tn, tk), "warpgroups": (wgm, wgn), "instruction": f"m64n{wn}k{fk}",
              **({"epilogue_prefetch": len(epilogue_reads)} if prefetch else {}),
              "epilogue_batch": WGMMA_EPILOGUE_BATCH, **(vec.params() if vec is not None else {}),
              "swizzle": "128B", "stages": stages, "copies": "tma" if use_tma else "cp.async", "layouts": layouts,
              "split_k": split, "mma_in_flight": lag, **_split_final_params(split_final, split),
              **({"cluster": 2 if paired else f"1 ({unpaired})"} if cluster != 1 else {})}
    return GemmCode(variant, "{\n" + indent(body) + "\n}", items, shared, threads, True, params, use_tma,
                    cluster=2 if paired else 1)


def wgmma_gemm(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, variant: str = "wgmma_bf16",
               tile_m: int = 128, tile_n: int = 128, tile_k: int = 64, threads: int = 256, item: str = "item",
               smem: str = "tkx_smem", ptr_a: PtrA | None = None, ptr_b: PtrB | None = None,
               split: int = 1, shared_budget: int | None = None, tma_a: TmaMap | None = None,
               tma_b: TmaMap | None = None, split_final: SplitFinal | None = None,
               epilogue_reads: tuple[tuple[str, int], ...] = (), cluster: int = 1,
               knobs: WgmmaKnobs = WgmmaKnobs()) -> GemmCode:
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
    sa = _Stage("a", tm, tk, "col" if p.a_k_contiguous else "row", threads)
    sb = _Stage("b", tk, tn, "col" if p.b_n_contiguous else "row", threads)
    for s in (sa, sb):
        _check_staging(s)
    row_elems = SWIZZLE_ROW // ebytes  # elements of one swizzled row (= tk)
    chunk_elems = 16 // ebytes
    a_bytes = tm * SWIZZLE_ROW
    b_bytes = tn * SWIZZLE_ROW
    stage_bytes = a_bytes + b_bytes
    ldc = tn + WGMMA_C_PAD  # fp32 staging rows, padded against bank conflicts
    c_bytes = tm * ldc * 4
    shared = max(2 * stage_bytes, c_bytes) + 1024  # + the shift that 1024-aligns the swizzle atoms

    def slot(base: str, row: str, k: str) -> str:
        # element (row, k) of a K-major tile in the 128-byte swizzle: row * 128 B, chunk ^ (row % 8)
        return (f"{base}[({row}) * {row_elems} + ((((k_) / {chunk_elems}) ^ (({row}) & 7)) * {chunk_elems}) "
                f"+ ((k_) % {chunk_elems})]").replace("k_", k)

    a_slot = slot("As", "r", "c")   # A tile element (r = m, c = k)
    b_slot = slot("Bs", "c", "r")   # B tile element (r = k, c = n), stored as row n
    m_guard, n_guard, k_guard = p.m % tm != 0, p.n % tn != 0, p.k % tk != 0
    ksteps = tk // fk
    acc_regs = wn // 2
    mma = _wgmma_asm(wn, ptx_type, fk, "d")
    # descriptor: start address >> 4 (bits 0-13), leading byte offset 16 >> 4 (bits 16-29, unused in
    # swizzled K-major), stride byte offset 1024 >> 4 between 8-row groups (bits 32-45), 128-byte swizzle
    # (mode 1, bits 62-63)
    desc_fn = block(
        "auto desc = [](const void* p) -> unsigned long long {  // wgmma shared-memory matrix descriptor",
        "    const unsigned long long a = (unsigned long long)__cvta_generic_to_shared(p);",
        "    return ((a & 0x3FFFFULL) >> 4) | (1ULL << 16) | ((1024ULL >> 4) << 32) | (1ULL << 62);",
        "};",
    )
    compute = block(
        f"{elem}* As = stage_base + buf * {stage_bytes // ebytes};",
        f"{elem}* Bs = As + {a_bytes // ebytes};",
        'asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");',
        "#pragma unroll",
        f"for (int ks = 0; ks < {ksteps}; ++ks) {{  // {ksteps} MMAs of k{fk}: advance 32 bytes in the swizzled row",
        f"    const unsigned long long da = desc(As + wr * {64 * row_elems} + ks * {fk});",
        f"    const unsigned long long db = desc(Bs + wc * {wn * row_elems} + ks * {fk});",
        indent(mma),
        "}",
        'asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");',
    )
    fence_acc = block("#pragma unroll  // the accumulators are final only after the wait",
                      f'for (int i = 0; i < {acc_regs}; ++i) asm volatile("" : "+f"(d[i]) :: "memory");')
    k_loop = block(
        "int buf = 0;",
        "fetch(k_beg);",
        "stash_to(0);",
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // generic stores -> tensor-core reads',
        "__syncthreads();",
        "for (int k0 = k_beg; k0 < k_end; k0 += TK) {",
        "    const bool more = k0 + TK < k_end;",
        "    if (more) fetch(k0 + TK);  // the next tile's global loads are in flight during the MMAs",
        indent(compute),
        "    if (more) stash_to(buf ^ 1);  // the other stage was last read by the MMAs waited for below",
        '    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");',
        indent(fence_acc),
        '    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");',
        "    __syncthreads();",
        "    buf ^= 1;",
        "}",
    )
    swz = knobs.epilogue_vector
    vtile = _vector_tile(epilogue, tm, tn, threads, ldc, m_guard, n_guard, False, swz)
    epi = _wgmma_store_c("stage_base", acc_regs, wn, ldc, tm, tn, threads, epilogue, m_guard, n_guard,
                         _split_final_code(split_final, p, split, tm, tn, ldc, threads, m_guard, n_guard, swz),
                         vtile, vector=swz)
    stash_fn = block(
        "auto stash_to = [&](int b) {  // registers -> stage b, K-major, 128-byte swizzle",
        f"    {elem}* As = stage_base + b * {stage_bytes // ebytes};",
        f"    {elem}* Bs = As + {a_bytes // ebytes};",
        "    stash_into(As, Bs);",
        "};",
    )
    fetch_lines = _fetch_and_stash(p, sa, sb, load_a, load_b, a_slot, b_slot, conv.format, m_guard, n_guard,
                                   k_guard)
    # make the shared stash take the stage's pointers
    fetch_lines[-1] = fetch_lines[-1].replace("auto stash = [&]() {",
                                              f"auto stash_into = [&]({elem}* As, {elem}* Bs) {{")
    vec = _wgmma_vector_staging(p, tm, tn, tk, threads, ebytes, ptr_a, ptr_b, load_a, load_b, conv,
                                m_guard, n_guard, k_guard)
    if vec is not None:
        fetch_lines = [vec]
    what = {"wgmma_bf16": "bf16", "wgmma_f16": "fp16", "wgmma_tf32": "tf32"}[variant]
    body = block(
        _tile_header(p, tm, tn, item, f"tensor-core GEMM ({what} wgmma m64n{wn}k{fk}, fp32 accumulate), one "
                     f"{tm}x{tn} tile of C; {wgm}x{wgn} warpgroups of 64x{wn}", split, tk, True),
        f"constexpr int TM = {tm}, TN = {tn}, TK = {tk};",
        f"unsigned char* ws = {smem} + ((1024u - ((unsigned)__cvta_generic_to_shared({smem}) & 1023u)) & 1023u);"
        "  // swizzle atoms start on 1024 bytes",
        f"{elem}* stage_base = reinterpret_cast<{elem}*>(ws);  // stage s: A tile then B tile, "
        f"{stage_bytes} bytes",
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
        f"const int wr = (warp / 4) / {wgn}, wc = (warp / 4) % {wgn};  // this warpgroup's block of C",
        desc_fn,
        f"float d[{acc_regs}];  // accumulators of this thread (m64n{wn} fragment)",
        "#pragma unroll",
        f"for (int j = 0; j < {acc_regs}; ++j) d[j] = 0.0f;",
        fetch_lines,
        stash_fn,
        k_loop,
        "// epilogue: accumulators -> shared C tile -> per element",
        epi,
    )
    items = p.batch * _ceil(p.m, tm) * _ceil(p.n, tn) * split
    params = {"tile": (tm, tn, tk), "warpgroups": (wgm, wgn), "instruction": f"m64n{wn}k{fk}",
              "swizzle": "128B", "stages": 2, "vector_loads": vec is not None, "split_k": split,
              **(vtile.params() if vtile is not None else {}),
              **_split_final_params(split_final, split)}
    return GemmCode(variant, "{\n" + indent(body) + "\n}", items, shared, threads, True, params)


# --------------------------------------------------------------------------------------
# (d) GEMV / skinny
# --------------------------------------------------------------------------------------


def gemv(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, threads: int = 256,
         item: str = "item", smem: str = "tkx_smem") -> GemmCode:
    """(d) skinny GEMM for ``M <= 4`` or ``N <= 4``: every output of the short side at once.

    With S the short and L the long output dimension, each output column (row) needs one
    dot product of length K per short index. Two ways to walk memory, chosen by the long
    operand's memory order:

    * ``split_k`` (long operand contiguous along K): one warp per long index, the 32 lanes
      take every 32nd k, S accumulators per lane, then a shuffle reduction; a work item is
      one long index per warp.
    * ``split_l`` (long operand contiguous along L): one thread per long index, so a warp
      reads 32 adjacent elements; the block's warps split K and add their partial sums in
      shared memory; a work item is 32 long indices.
    """
    if threads % 32:
        raise ValueError("threads must be a multiple of 32")
    small_m = p.m <= p.n
    s_count = p.m if small_m else p.n
    if s_count > SKINNY_MAX:
        raise ValueError(f"gemv needs M <= {SKINNY_MAX} or N <= {SKINNY_MAX}, got {p.m}x{p.n}")
    long_n = p.n if small_m else p.m
    long_k_contiguous = (not p.b_n_contiguous) if small_m else p.a_k_contiguous
    warps = threads // 32
    # the long index is `l`, the short one `s`; A/B elements and the output in those terms
    if small_m:
        a_of, b_of = load_a("bat", "s", "k"), load_b("bat", "k", "l")
        row, col, dims = "s", "l", "C[s, l] = sum_k A[s, k] * B[k, l]"
        long_load, short_load = b_of, a_of
    else:
        a_of, b_of = load_a("bat", "l", "k"), load_b("bat", "k", "s")
        row, col, dims = "l", "s", "C[l, s] = sum_k A[l, k] * B[k, s]"
        long_load, short_load = a_of, b_of
    out = block(f"const int row = {row}, col = {col};", "const float acc = sum[s];",
                epilogue("bat", "row", "col", "acc"))
    out_total = block(f"const int row = {row}, col = {col};", "const float acc = total;",
                      epilogue("bat", "row", "col", "acc"))
    header = [f"constexpr int M = {p.m}, N = {p.n}, K = {p.k};  // {dims}, S = {s_count} short index(es)"]
    if long_k_contiguous:
        per_item = warps
        mode = "split_k"
        per_batch = _ceil(long_n, per_item)
        body = block(
            "// skinny GEMM (split_k): one warp per long index l, lanes split K, shuffle reduction",
            header,
            f"const int bat = {item} / {per_batch};" if p.batch > 1 else "const int bat = 0;",
            "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
            f"const int l = ({item} % {per_batch}) * {warps} + warp;" if p.batch > 1
            else f"const int l = {item} * {warps} + warp;",
            f"if (l < {long_n}) {{  // the whole warp takes the same branch",
            f"    float sum[{s_count}];",
            "    #pragma unroll",
            f"    for (int s = 0; s < {s_count}; ++s) sum[s] = 0.0f;",
            "    #pragma unroll 4",
            "    for (int k = lane; k < K; k += 32) {",
            f"        const float elem = {long_load};",
            "        #pragma unroll",
            f"        for (int s = 0; s < {s_count}; ++s) sum[s] = fmaf({short_load}, elem, sum[s]);",
            "    }",
            "    #pragma unroll",
            f"    for (int s = 0; s < {s_count}; ++s) sum[s] = tkx_warp_sum(sum[s]);",
            "    if (lane == 0) {",
            "        #pragma unroll",
            f"        for (int s = 0; s < {s_count}; ++s) {{",
            indent(out, 3),
            "        }",
            "    }",
            "}",
        )
        shared = 0
    else:
        per_item = 32
        mode = "split_l"
        per_batch = _ceil(long_n, per_item)
        kc = _ceil(p.k, warps)
        body = block(
            f"// skinny GEMM (split_l): one thread per long index l, the {warps} warps split K",
            header,
            f"const int bat = {item} / {per_batch};" if p.batch > 1 else "const int bat = 0;",
            "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
            f"const int l = ({item} % {per_batch}) * 32 + lane;" if p.batch > 1
            else f"const int l = {item} * 32 + lane;",
            f"const int k_begin = warp * {kc}, k_end = min(K, k_begin + {kc});  // this warp's share of K",
            f"float sum[{s_count}];",
            "#pragma unroll",
            f"for (int s = 0; s < {s_count}; ++s) sum[s] = 0.0f;",
            f"if (l < {long_n}) {{",
            "    #pragma unroll 4",
            "    for (int k = k_begin; k < k_end; ++k) {",
            f"        const float elem = {long_load};",
            "        #pragma unroll",
            f"        for (int s = 0; s < {s_count}; ++s) sum[s] = fmaf({short_load}, elem, sum[s]);",
            "    }",
            "}",
            f"float* part = reinterpret_cast<float*>({smem});  // partials: part[(warp * S + s) * 32 + lane]",
            "#pragma unroll",
            f"for (int s = 0; s < {s_count}; ++s) part[(warp * {s_count} + s) * 32 + lane] = sum[s];",
            "__syncthreads();",
            f"for (int s = threadIdx.x / 32; s < {s_count}; s += {warps}) {{  // warp s, lane: add the warps' "
            "partials in order",
            "    float total = 0.0f;",
            "    #pragma unroll",
            f"    for (int w = 0; w < {warps}; ++w) total += part[(w * {s_count} + s) * 32 + lane];",
            f"    if (l < {long_n}) {{",
            indent(out_total, 2),
            "    }",
            "}",
            "__syncthreads();  // part[] is read before the next work item reuses the workspace",
        )
        shared = _align(warps * s_count * 32 * 4)
    items = p.batch * per_batch
    params = {"mode": mode, "short": "m" if small_m else "n", "short_size": s_count, "per_item": per_item}
    return GemmCode("gemv", "{\n" + indent(body) + "\n}", items, shared, threads, False, params)


# --------------------------------------------------------------------------------------
# Choosing
# --------------------------------------------------------------------------------------
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
              cluster: int = 1, knobs: WgmmaKnobs = WgmmaKnobs()) -> GemmCode:
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



_DECL = re.compile(r"^\s*(?:const\s+)?(?:float|double|int|unsigned|bool|long long|unsigned long long)\s+(\w+)\s*=.*;")
_STORE = re.compile(r"^\s*tkx_st_\w+\(.*\);")


def _batch_coords(batch: int, threads: int, tn: int, acc: Callable[[str], str], *, m_guard: bool = False,
                  n_guard: bool = False) -> list[str]:
    """Per element ``u`` of a thread's batch (names prefixed ``tkxE{u}_``, see :func:`_batched_epilogue`):
    its position ``e`` in the C tile, its row and column, then ``acc(prefix)``: the statement(s) leaving
    its accumulator in ``{prefix}acc``. With a guard (a tile that may cross the edge of C), ``{prefix}in``
    says whether the element is inside C and its row/column are clamped to the last one inside: every
    load of the element's epilogue then reads a valid address (the value of an element inside C), and
    the caller stores only where ``{prefix}in`` holds (``_batched_epilogue(..., guarded=True)``)."""
    lines = []
    for u in range(batch):
        x = f"tkxE{u}_"
        lines.append(f"const int {x}e = e + {u * threads};")
        if m_guard or n_guard:
            r, c = f"row0 + {x}e / {tn}", f"col0 + {x}e % {tn}"
            conds = " && ".join(t for t, on in ((f"{r} < M", m_guard), (f"{c} < N", n_guard)) if on)
            lines += [f"const bool {x}in = {conds};  // inside C: stored",
                      f"const int {x}row = {f'min({r}, M - 1)' if m_guard else r}, "
                      f"{x}col = {f'min({c}, N - 1)' if n_guard else c};  // clamped: loads stay inside"]
        else:
            lines.append(f"const int {x}row = row0 + {x}e / {tn}, {x}col = col0 + {x}e % {tn};")
        lines.append(acc(x))
    return lines


def _batched_epilogue(epilogue: Epilogue, batch: int, *, batch_index: bool = False,
                      guarded: bool = False) -> tuple[list[str], list[str]] | None:
    """The epilogue of ``batch`` elements as (computations, stores): element ``u``'s statements
    with its names prefixed ``tkxE<u>_`` (``row col acc`` and every value it declares), every
    computation (and so every global load) before any store, so one thread has ``batch``
    independent loads in flight instead of one (the rolled per-element loop waited a full memory
    latency per element: 16-25 µs per 128x128 tile of an SGD update on the H200).

    Elements of one tile are distinct output positions and threads already run them in any order,
    so moving a load of element u' before the store of element u changes nothing the rolled loop
    guarantees. ``None`` when a statement is not a plain declaration or a store (then the caller
    keeps the rolled loop). ``batch_index``: each element has its own ``bat`` too (else the
    elements share the caller's ``bat``: one tile). ``guarded``: element u's stores run only where
    ``tkxE<u>_in`` holds (:func:`_batch_coords` with a guard declares it)."""
    lines = [ln for ln in epilogue("bat", "row", "col", "acc").splitlines() if ln.strip()]
    names = ["row", "col", "acc"] + (["bat"] if batch_index else [])
    comp, stores = [], []
    for ln in lines:
        code, _, note = ln.partition("//")
        code = code.strip()
        if not code:
            continue
        m = _DECL.match(code)
        if m:
            names.append(m.group(1))
            comp.append((code, note.strip()))
        elif _STORE.match(code):
            stores.append((code, note.strip()))
        else:
            return None
    if not stores:
        return None
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True)) + r")\b")
    out_c, out_s = [], []
    for u in range(batch):
        def ren(line: tuple[str, str], u: int = u) -> str:
            text = pattern.sub(lambda mm: f"tkxE{u}_{mm.group(1)}", line[0])
            return f"{text}  // {line[1]}" if u == 0 and line[1] else text  # element 0 keeps the op's comment
        out_c += [ren(x) for x in comp]
        out_s += [f"if (tkxE{u}_in) {ren(x)}" if guarded else ren(x) for x in stores]
    return out_c, out_s


def _epilogue_prefetch(reads: tuple[tuple[str, int], ...], p: GemmProblem, tm: int, tn: int, threads: int,
                       guarded: bool) -> list[str]:
    """L2 prefetches (``WgmmaKnobs.epilogue_prefetch``) of this tile's rows of each ``(pointer, element
    bytes)`` in ``reads`` (element (row, col) at ``pointer + row * N + col``); empty for a guarded tile."""
    if not reads or guarded or p.batch > 1:
        return []
    lines = []
    for ptr, esize in reads:
        span = tn * esize
        per_row = _ceil(span, 128) + 1  # the row's bytes may start inside a line
        lines += [
            f"for (int q = threadIdx.x; q < {tm * per_row}; q += {threads}) {{  // L2 prefetch: the epilogue "
            f"reads this tile of {ptr}",
            f"    const char* line = reinterpret_cast<const char*>({ptr}) + ((long long)(row0 + q / {per_row}) * N "
            f"+ col0) * {esize} + min((q % {per_row}) * 128, {span - 1});",
            '    asm volatile("prefetch.global.L2 [%0];" :: "l"(line));',
            "}"]
    return ["// the epilogue's reads of this tile into L2 while the k-loop runs (gemm.WGMMA_EPILOGUE_PREFETCH)",
            *lines]


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


def _cs_swizzle(tn: int, vector: bool = True) -> bool:
    """With the vectorized epilogue (``vector``, ``WgmmaKnobs.epilogue_vector``), a C tile of at least 64
    columns has column bit 2 XORed with bit 5
    (16-byte chunk k at chunk ``k ^ ((k >> 3) & 1)``): the vectorized epilogue's float4 reads of 8-column
    runs (8 threads at 32-byte steps of one row) then hit 32 distinct banks instead of 16; the float2
    accumulator writes and the scalar reads stay conflict-free (a permutation inside 8 columns)."""
    return vector and tn >= 64


def _cs_at(r: str, c: str, ldc: int, swz: bool) -> str:
    """Index of C tile element (r, c) in ``Cs`` (rows of ``ldc`` floats, :func:`_cs_swizzle`)."""
    return f"{r} * {ldc} + (({c}) ^ (((({c}) >> 5) & 1) << 2))" if swz else f"{r} * {ldc} + {c}"


def _cs_of(e: str, tn: int, ldc: int, swz: bool) -> str:
    """``Cs[...]`` of C tile element number ``e`` (row-major, ``tn`` columns)."""
    if not swz:
        return f"Cs[({e} / {tn}) * {ldc} + {e} % {tn}]"
    return f"Cs[{_cs_at(f'({e} / {tn})', f'{e} % {tn}', ldc, True)}]"


@dataclass(frozen=True)
class _VectorTile:
    """A vectorized tile epilogue (``WgmmaKnobs.epilogue_vector``): ``per_pass`` elements per thread and
    pass in runs of ``acc.width``; ``early``: one pass whose point reads are issued before the k-loop."""

    acc: ev.VectorAccesses
    per_pass: int
    early: bool
    tm: int
    tn: int
    threads: int
    ldc: int
    swz: bool

    @property
    def runs(self) -> int:
        return self.per_pass // self.acc.width

    def params(self) -> dict:
        return {"epilogue_vector": self.acc.width, "epilogue_per_pass": self.per_pass,
                "epilogue_passes": self.tm * self.tn // (self.threads * self.per_pass),
                "early_loads": self.early}

    def run_coords(self, start: str) -> list[str]:
        """Run j of this thread's pass (``start``: its first run's number in the tile): its tile row and
        column ``tkxR<j>_r/_c``, matrix coordinates ``tkxR<j>_row/_col`` and linear index ``tkxR<j>_e``."""
        v, per_row = self.acc.width, self.tn // self.acc.width
        lines = []
        for j in range(self.runs):
            x = f"tkxR{j}_"
            lines += [f"const int {x}q = {start} + {j * self.threads};",
                      f"const int {x}r = {x}q / {per_row}, {x}c = ({x}q % {per_row}) * {v};",
                      f"const int {x}row = row0 + {x}r, {x}col = col0 + {x}c;",
                      ev.run_index(self.acc, j, False)]
        return lines

    def early_lines(self) -> list[str]:
        """With ``early``: the alignment test, the run coordinates and the point-read vectors, placed before
        the k-loop. Sound because a point-read buffer is either written by no group of this stage (the
        schedule's hazard rules, :func:`tkx.schedule.check.check_hazards`: its writer ran in an earlier
        stage (RAW), an input overwritten in place is overwritten in a later stage than every other reader
        (WAR), and no arena slot sharing its bytes is live in this stage) or it is this group's own output
        updated in place, whose elements of this tile only this thread writes, after the read."""
        if not self.early:
            return []
        return ["// the epilogue's point reads of this tile, before the k-loop (gemm.WGMMA_EPILOGUE_EARLY_REGS):",
                "// the same elements this thread updates after it; no group of the stage writes them",
                f"const bool tkx_vec = {ev.aligned_test(self.acc)};  // 16-byte aligned: vector epilogue",
                *self.run_coords("threadIdx.x"), *ev.vector_loads(self.acc, self.runs, "tkx_vec")]

    def body(self, epilogue: Epilogue) -> list[str] | None:
        """The vector pass(es) (inside ``if (tkx_vec)``), or ``None`` when the epilogue does not batch."""
        batched = _batched_epilogue(epilogue, self.per_pass)
        if batched is None:
            return None
        v = self.acc.width
        comp, stores = ev.vectorize(self.acc, *batched, self.runs)
        per = []
        for j in range(self.runs):
            x = f"tkxR{j}_"
            for h in range(v // 4):
                at = _cs_at(f"{x}r", f"{x}c + {4 * h}" if h else f"{x}c", self.ldc, self.swz)
                per.append(f"const float4 tkxC{j}_{h} = *reinterpret_cast<const float4*>(&Cs[{at}]);")
            for i in range(v):
                u = j * v + i
                per += [f"const int tkxE{u}_row = {x}row, tkxE{u}_col = {x}col + {i};",
                        f"const float tkxE{u}_acc = tkxC{j}_{i // 4}.{'xyzw'[i % 4]};"]
        if self.early:
            return [*per, *comp, *stores]
        total_runs = self.tm * self.tn // v
        note = (f"{self.per_pass} elements per thread and pass in runs of {v} columns: 16-byte point reads "
                "and stores")
        return [f"#pragma unroll 1  // {note}",
                f"for (int e = threadIdx.x; e < {total_runs}; e += {self.threads * self.runs}) {{",
                indent(block(*self.run_coords("e"), *ev.vector_loads(self.acc, self.runs), *per, *comp, *stores)),
                "}"]


def _vector_tile(epilogue: Epilogue, tm: int, tn: int, threads: int, ldc: int, m_guard: bool, n_guard: bool,
                 allow_early: bool, vector: bool = True) -> _VectorTile | None:
    """The vectorized epilogue of a guard-free tile, or ``None`` (switch off, no point access, a tile
    that does not split into runs)."""
    if not vector or m_guard or n_guard:
        return None
    acc = ev.vector_accesses(epilogue("bat", "row", "col", "acc"))
    if acc is None or tn % acc.width or (tm * tn) % (threads * acc.width):
        return None
    per_thread = tm * tn // threads
    per_pass = ev.elements_per_pass(acc, per_thread, WGMMA_EPILOGUE_VECTOR_REGS)
    if not per_pass:
        return None
    early = (allow_early and per_pass == per_thread and bool(acc.reads)
             and acc.read_registers(per_pass) <= WGMMA_EPILOGUE_EARLY_REGS)
    return _VectorTile(acc, per_pass, early, tm, tn, threads, ldc, _cs_swizzle(tn, vector))


def _wgmma_store_c(base: str, acc_regs: int, wn: int, ldc: int, tm: int, tn: int, threads: int,
                   epilogue: Epilogue, m_guard: bool, n_guard: bool, after: list[str] | None = None,
                   vec: _VectorTile | None = None, *, vector: bool = True) -> str:
    """The wgmma epilogue: each warpgroup's accumulator fragment of m64nN (register j of lane l in
    warp w is row 16 w + l / 4 + 8 ((j / 2) % 2), column 8 (j / 4) + 2 (l % 4) + j % 2) is written
    to an fp32 C tile in shared memory at ``base``, then the block applies the epilogue per element:
    :data:`WGMMA_EPILOGUE_BATCH` elements per thread and pass (halved until the tile holds a whole pass;
    :func:`_batched_epilogue`); a tile crossing the edge of C clamps the coordinates of the elements
    outside (their loads stay inside C) and stores only the elements inside
    (:data:`WGMMA_GUARDED_BATCH`; off: one element per iteration). With ``vec`` (:func:`_vector_tile`,
    tiles inside C): the vector passes of :class:`_VectorTile` when every pointer is 16-byte aligned
    (runtime test), the scalar batched passes otherwise."""
    swz = _cs_swizzle(tn, vector)
    head = [
        f"float* Cs = reinterpret_cast<float*>({base});  // the C tile, fp32, rows padded"
        + (", column bit 2 ^= bit 5" if swz else ""),
        "#pragma unroll",
        f"for (int j = 0; j < {acc_regs}; j += 2) {{  // registers j, j + 1: adjacent columns of one row",
        "    const int r = wr * 64 + (warp % 4) * 16 + lane / 4 + 8 * ((j / 2) % 2);",
        f"    const int c = wc * {wn} + 8 * (j / 4) + 2 * (lane % 4);",
        f"    *reinterpret_cast<float2*>(&Cs[{_cs_at('r', 'c', ldc, swz)}]) = make_float2(d[j], d[j + 1]);",
        "}",
        "__syncthreads();",
    ]
    ub = WGMMA_EPILOGUE_BATCH
    while ub > 1 and (tm * tn) % (threads * ub):  # a small tile: fewer per pass, still batched
        ub //= 2
    guarded = m_guard or n_guard
    batched = None if (tm * tn) % (threads * ub) or (guarded and not WGMMA_GUARDED_BATCH) else \
        _batched_epilogue(epilogue, ub, guarded=guarded)
    if batched is not None:
        comp, stores = batched
        coords = _batch_coords(ub, threads, tn,
                               lambda x: f"const float {x}acc = {_cs_of(f'{x}e', tn, ldc, swz)};",
                               m_guard=m_guard, n_guard=n_guard)
        loop = [
            f"#pragma unroll 1  // {ub} elements per thread and pass: their loads in flight together, then the stores",
            f"for (int e = threadIdx.x; e < {tm * tn}; e += {threads * ub}) {{",
            indent(block(*coords, *comp, *stores)),
            "}",
        ]
        vbody = vec.body(epilogue) if vec is not None else None
        if vbody is not None:
            test = [] if vec.early else [f"const bool tkx_vec = {ev.aligned_test(vec.acc)};  // 16-byte aligned "
                                         "pointers: vector epilogue, else the scalar one"]
            loop = [*test, "if (tkx_vec) {  // block-uniform", indent(block(*vbody)),
                    "} else {", indent(block(*loop)), "}"]
    else:
        loop = [
            "#pragma unroll 1  // kept rolled: the epilogue's code appears once",
            f"for (int e = threadIdx.x; e < {tm * tn}; e += {threads}) {{",
            f"    const int row = row0 + e / {tn}, col = col0 + e % {tn};",
            indent(_epilogue_block(epilogue, _cs_of("e", tn, ldc, swz), m_guard, n_guard)),
            "}",
        ]
    return block(*head, *loop, *(after or ()),
                 "__syncthreads();  // Cs is read before the next work item reuses the workspace")
