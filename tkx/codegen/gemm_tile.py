"""The pieces every GEMM emitter shares: the callback types, :class:`GemmCode` (what an emitter
returns), :class:`SplitFinal`, the grid-stride work loop, the tile header and the register-staged
operand copies (:class:`_Stage`) of the SIMT, wmma and register-staged wgmma emitters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..options import Options
from ..target import GemmProblem, ceil_div
from .text import block, indent

LoadA = Callable[[str, str, str], str]  # (batch, row, k) -> float C expression


PtrA = Callable[[str, str, str], str]  # (batch, row, k) -> C pointer to that element in memory


PtrB = Callable[[str, str, str], str]  # (batch, k, col) -> C pointer to that element in memory


LoadB = Callable[[str, str, str], str]  # (batch, k, col) -> float C expression


TmaMap = Callable[[int, int], "int | None"]  # (box inner, box outer) elements -> tensor map index, or None


Epilogue = Callable[[str, str, str, str], str]  # (batch, row, col, acc) -> C statements


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


#: The switches' defaults (``Options()``).
DEFAULT_KNOBS = WgmmaKnobs()


@dataclass(frozen=True)
class Prefetch:
    """A raw buffer the long operand's load reads: the bytes of column ``l`` lie in
    ``[pointer + (row_stride * l + start), + span)`` (bytes)."""

    pointer: str
    row_stride: int
    start: int
    span: int


#: ``(batch, k, l) -> C pointer`` (``const unsigned short*``) to the long operand's element (k, l).
PtrLong = Callable[[str, str, str], str]
#: ``(batch, k0, l, t) -> C float``: the long operand's element (k0 + t, l), k0 a multiple of 8, 0 <= t < 8.
Long8 = Callable[[str, str, str, str], str]


@dataclass(frozen=True)
class GemvLoads:
    """How the streaming GEMV (:mod:`tkx.codegen.gemv`) reads its operands beyond the load callbacks.

    ``ptr_long``: a pointer to the long operand's 2-byte element ``(batch, k, l)`` for 16-byte loads (used
    when K is a multiple of 8; ``aligned`` is the run-time C test that the buffer's base is 16-byte aligned,
    else the same bits are read two bytes at a time); ``ptr_short`` / ``aligned_short``: the same for the
    short operand's element ``(batch, k, s)``; ``prefetch``: raw buffers of the element-load path to prefetch
    per column; ``long8``: the long operand's element ``(k0 + t, l)`` for ``k0`` a multiple of 8 (the chain
    path with 8 elements per lane); ``ahead``: rounds of the block's grid-stride loop whose long-operand rows
    (16-byte path) are prefetched to L2 at the start of an item (``Options.gemv_prefetch``, 0: none);
    ``short_f32``: ``ptr_short`` points to float32 elements (two 16-byte loads per 8), not bfloat16;
    ``stage_short``: the short operand is an inlined chain, computed once per work item into shared memory
    by the 16-byte path (when it fits, :data:`tkx.codegen.gemv.STAGE_BYTES`); ``ring``: 16-byte slots per
    thread of the 16-byte path's ``cp.async`` ring (``Options.gemv_ring``, 0: loads into registers)."""

    ptr_long: PtrLong | None = None
    aligned: str = "false"
    ptr_short: PtrLong | None = None
    aligned_short: str = "false"
    prefetch: tuple[Prefetch, ...] = ()
    long8: Long8 | None = None
    ahead: int = 0
    short_f32: bool = False
    stage_short: bool = False
    ring: int = 0


def _align(n: int, to: int = SMEM_ALIGN) -> int:
    return ceil_div(n, to) * to


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
    tiles_n = ceil_div(p.n, tn)
    per_batch = ceil_div(p.m, tm) * tiles_n
    lines = [f"// {what}",
             f"constexpr int M = {p.m}, N = {p.n}, K = {p.k};  // C[M x N] = A[M x K] @ B[K x N]"]
    it = item
    if split > 1:
        ks = ceil_div(ceil_div(p.k, tk), split) * tk
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


def _tile_items(p: GemmProblem, tm: int, tn: int, split: int = 1) -> int:
    """Work items of a tiled GEMM: one per ``tm x tn`` output tile of each matrix (and slice of K)."""
    return p.batch * ceil_div(p.m, tm) * ceil_div(p.n, tn) * split


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


def _operand_stages(p: GemmProblem, tm: int, tn: int, tk: int, threads: int) -> tuple[_Stage, _Stage]:
    """The register-staged copies of the ``tm x tk`` A tile and the ``tk x tn`` B tile, consecutive threads
    along each operand's contiguous index; :class:`ValueError` when a tile does not split over ``threads``."""
    sa = _Stage("a", tm, tk, "col" if p.a_k_contiguous else "row", threads)
    sb = _Stage("b", tk, tn, "col" if p.b_n_contiguous else "row", threads)
    for s in (sa, sb):
        _check_staging(s)
    return sa, sb


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


def _staged_k_loop(p: GemmProblem, sa: _Stage, sb: _Stage, load_a: LoadA, load_b: LoadB, a_slot: str, b_slot: str,
                   convert: Callable[[str], str], m_guard: bool, n_guard: bool, k_guard: bool,
                   compute: str) -> list[str]:
    """The register-staged main loop of the SIMT and wmma emitters: :func:`_fetch_and_stash`, then the k loop
    that stashes a k-tile, starts the next one's global loads and runs ``compute`` on the shared tiles."""
    return _fetch_and_stash(p, sa, sb, load_a, load_b, a_slot, b_slot, convert, m_guard, n_guard, k_guard) + [
        "fetch(0);",
        "for (int k0 = 0; k0 < K; k0 += TK) {",
        "    stash();",
        "    __syncthreads();",
        "    if (k0 + TK < K) fetch(k0 + TK);  // next tile's global loads overlap this tile's math",
        indent(compute),
        "    __syncthreads();  // all warps are done with this tile",
        "}",
    ]
