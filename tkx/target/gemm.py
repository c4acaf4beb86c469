"""GEMM specs: :class:`GemmProblem`, the typed :class:`GemmPlan`, one :class:`GemmEmitter` per code
variant (``supports`` / ``plan`` / ``cost`` / ``registers``; each implemented by one codegen module, see
:data:`GEMM_EMITTERS`), :func:`choose_gemm`, and the split-K and 2-CTA cluster decisions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..dtypes import DTYPE_BYTES
from ..ir import TensorSpec
from .facts import (
    ARCHES,
    EPILOGUE_BATCH,
    SM_COUNT,
    Capabilities,
    Cost,
    Plan,
    _pow2_at_least,
    ceil_div,
    register_budget,
)


# --------------------------------------------------------------------------------------
# GEMM
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmProblem:
    """``C[batch, m, n] = A[batch, m, k] @ B[batch, k, n]`` and the operands' memory order.

    ``dtype`` is the operands' dtype (``torch.mm`` needs both the same). ``a_k_contiguous``
    says consecutive k of a row of A are adjacent in memory (A row-major), otherwise
    consecutive rows are (A is a transposed view); ``b_n_contiguous`` likewise for B.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "float32"
    a_k_contiguous: bool = True
    b_n_contiguous: bool = True
    #: Both operands are stored buffers (not recomputed inline) whose 8-element vectors are 16-byte
    #: aligned, so a wgmma GEMM copies them global -> shared with cp.async or TMA (no staging registers).
    direct: bool = False

    @staticmethod
    def from_views(a: TensorSpec, b: TensorSpec) -> GemmProblem:
        """The problem of ``a @ b`` for 2-D (mm) or 3-D (bmm) views, memory order read from strides."""
        if a.ndim != b.ndim or a.ndim not in (2, 3):
            raise ValueError(f"mm/bmm operands must both be 2-D or 3-D, got {a.shape} and {b.shape}")
        batch = a.shape[0] if a.ndim == 3 else 1
        m, k = a.shape[-2:]
        n = b.shape[-1]
        a_k = _last_index_fast(a.shape[-2:], a.strides[-2:])
        b_n = _last_index_fast(b.shape[-2:], b.strides[-2:])
        return GemmProblem(m, n, k, batch, a.dtype, bool(a_k), bool(b_n))

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch


def _last_index_fast(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the last index of a 2-D view is the one to walk with consecutive threads."""
    rows, cols = shape
    if rows == 1:
        return True
    if cols == 1:
        return False
    return strides[1] <= strides[0]


@dataclass(frozen=True, eq=False)
class GemmPlan(Plan):
    """How one GEMM group is computed.

    ``impl``: the emitter (:data:`GEMM_EMITTERS`), ``why``: the reason it was chosen (and
    why the ones before it were not); ``m, n, k, batch`` the sizes; ``tile_m x tile_n`` the
    output tile of one work item, ``tile_k`` the depth staged per step; ``split_k``: how
    many slices of K are computed by separate work items (1: none); ``adjusted``: what the
    planner changed from the options and why (empty when nothing); ``partials``: with split-K,
    the fp32 scratch buffer ``[split_k, batch, m, n]`` the slices are written to and then added in
    slice order; ``split_final``: who adds them: ``"stage"`` (the ``gemm_partial`` group writes the
    slices, the ``gemm`` group of the next stage adds them and runs the epilogue) or
    ``"last-slice"`` (one ``gemm`` group: each work item writes its slice and bumps its tile's
    arrival counter; the item that arrives last adds the slices in slice order and runs the
    epilogue, ``Options.split_k_final``); ``None`` without split-K.
    """

    impl: str
    why: str
    m: int
    n: int
    k: int
    batch: int
    tile_m: int
    tile_n: int
    tile_k: int
    dtype: str = "float32"
    a_k_contiguous: bool = True
    b_n_contiguous: bool = True
    threads: int = 256
    split_k: int = 1
    adjusted: str = ""
    partials: str | None = None
    split_final: str | None = None
    #: CTAs per thread-block cluster (2: work items in pairs sharing the B tile by TMA multicast,
    #: ``Options.gemm_cluster``); ``None``: no cluster (the default).
    cluster: int | None = None

    @property
    def tiles(self) -> int:
        """Output tiles (``batch x ceil(m / tile_m) x ceil(n / tile_n)``): the arrival counters of a
        ``"last-slice"`` split-K GEMM."""
        return self.batch * ceil_div(self.m, self.tile_m) * ceil_div(self.n, self.tile_n)

    @property
    def problem(self) -> GemmProblem:
        return GemmProblem(self.m, self.n, self.k, self.batch, self.dtype, self.a_k_contiguous, self.b_n_contiguous)


SKINNY_MAX = 4


class GemmEmitter:
    """The spec of one GEMM variant. Subclasses override :meth:`supports` and :meth:`_tiles`.

    ``codegen``: the module below :mod:`tkx.codegen` whose ``@register_gemm(name)`` function writes the
    variant's code (:mod:`tkx.codegen.gemm_registry`); ``clusters``: the code runs items in 2-CTA clusters;
    ``tiled``: the code computes output tiles of ``tile_m x tile_n x tile_k`` (the plan's tiles mean something,
    and the emitter stands in for the tensor-core emitters that declined: :func:`choose_gemm` says why they
    did); ``streaming``: the code spreads the output's columns over the whole grid and reads its long operand
    through the kernel's vector and prefetch loads (the request carries ``blocks``, ``cheap`` and
    ``gemv_loads`` instead of tiles and staging pointers)."""

    name = ""
    capabilities = Capabilities(ARCHES, "registers", (1, 1, 1))
    summary = ""
    codegen = ""
    clusters = False
    tiled = True
    streaming = False

    def supports(self, p: GemmProblem, options: Any, arch: str) -> str | None:
        """``None`` when this emitter can compute ``p`` under ``options`` for ``arch``, else why not."""
        if arch not in self.capabilities.arches:
            return f"{self.name} needs {' or '.join(self.capabilities.arches)} (generating for {arch})"
        return self._supports(p, options)

    def _supports(self, p: GemmProblem, options: Any) -> str | None:
        return None

    def reason(self, p: GemmProblem, options: Any) -> str:
        """Why this emitter was chosen for ``p`` (the start of ``GemmPlan.why``)."""
        return f"{self.name}: {self.summary}"

    def plan(self, p: GemmProblem, options: Any, why: str) -> GemmPlan:
        """Tiles for ``p`` that fit this emitter, the thread count and the register budget;
        every change from ``options`` is recorded in ``GemmPlan.adjusted``."""
        threads = options.threads_per_block
        tm, tn, tk, notes = self._tiles(p, options, threads)
        plan = GemmPlan(self.name, why, p.m, p.n, p.k, p.batch, tm, tn, tk, p.dtype, p.a_k_contiguous,
                        p.b_n_contiguous, threads, 1, "; ".join(notes))
        return _plan_split_k(plan, options, self)

    def _tiles(self, p: GemmProblem, options: Any, threads: int) -> tuple[int, int, int, list[str]]:
        return options.tile_m, options.tile_n, options.tile_k, []

    def items(self, plan: GemmPlan) -> int:
        return plan.batch * ceil_div(plan.m, plan.tile_m) * ceil_div(plan.n, plan.tile_n) * plan.split_k

    def cost(self, plan: GemmPlan, phase: str = "one") -> Cost:
        """Cost of the GEMM (``phase="one"``), of its split-K slices (``"partial"``), of adding
        the slices and the epilogue (``"final"``) or of both in one group (``"fused"``: the
        ``"last-slice"`` split-K final, one item per tile and slice)."""
        if phase == "final":
            outs = plan.m * plan.n * plan.batch
            per = plan.threads * EPILOGUE_BATCH
            items = outs // per if outs % per == 0 else ceil_div(outs, plan.threads)  # as codegen batches them
            return Cost(items, outs * plan.split_k, outs * plan.split_k * 4)
        flops = 2 * plan.m * plan.n * plan.k * plan.batch
        # the operands at their own dtype (a bf16 decode weight is 2 bytes an element); partials are fp32
        nbytes = (plan.m * plan.k + plan.k * plan.n) * plan.batch * DTYPE_BYTES.get(plan.dtype, 4)
        if plan.split_k > 1:
            nbytes += plan.m * plan.n * plan.batch * plan.split_k * 4  # fp32 partials written
        if phase == "fused":
            nbytes += plan.m * plan.n * plan.batch * plan.split_k * 4  # the last slice reads them back
        return Cost(self.items(plan), flops, nbytes)  # FLOPs as they are: the rate is the code's (tkx.costs)

    def registers(self, plan: GemmPlan) -> int:
        """Estimated registers per thread of this plan (accumulators, staged operands, addresses)."""
        acc = plan.tile_m * plan.tile_n // plan.threads
        staged = (plan.tile_m * plan.tile_k + plan.tile_k * plan.tile_n) // plan.threads
        return acc + staged + 48


#: Most operand elements one thread stages in registers per K step (beyond it ptxas spills in big kernels).
MAX_STAGED_PER_THREAD = 32


def _fit_tiles(p: GemmProblem, options: Any, threads: int, *, multiple: tuple[int, int, int],
               name: str, regs: Any) -> tuple[int, int, int, list[str]]:
    """Tile sizes from the options, shrunk to the problem, grown until every thread has work and
    staging splits evenly, and with the reduction depth cut until the register estimate fits
    the budget of ``blocks_per_sm`` resident blocks. Each change is one note."""
    notes: list[str] = []
    mm, mn, mk = multiple
    tm = min(options.tile_m, _pow2_at_least(p.m, max(16, mm)))
    tn = min(options.tile_n, _pow2_at_least(p.n, max(16, mn)))
    tk = options.tile_k
    if tk % mk:
        notes.append(f"tile_k={tk} raised to {mk}: {name} steps through K {mk} at a time")
        tk = mk
    need = 256 * (threads // 32) if name.startswith("wmma") else threads
    while tm * tn < need:
        if tm <= tn:
            tm *= 2
        else:
            tn *= 2
    while (tm * tk) % threads or (tk * tn) % threads:
        notes.append(f"tile_k={tk} raised to {2 * tk}: a {tm}x{tk} operand tile must split evenly over "
                     f"{threads} threads")
        tk *= 2
    budget = register_budget(threads, options.blocks_per_sm)

    def staged(tk: int) -> int:
        return (tm * tk + tk * tn) // threads

    def shrink(why: str) -> bool:
        nonlocal tm, tn
        if tm * tn // 2 < need:
            return False
        if tn >= tm and tn // 2 >= max(16, mn) and (tk * tn // 2) % threads == 0:
            new = (tm, tn // 2)
        elif tm // 2 >= max(16, mm) and (tm // 2 * tk) % threads == 0:
            new = (tm // 2, tn)
        else:
            return False
        notes.append(f"tile {tm}x{tn} lowered to {new[0]}x{new[1]}: {why} (budget {budget} registers per thread "
                     f"for {threads} threads, blocks_per_sm={options.blocks_per_sm})")
        tm, tn = new
        return True

    # accumulators first: at most half of what the budget leaves beside the kernel's other registers
    while tm * tn // threads > (budget - 64) // 2 and shrink(f"{tm * tn // threads} accumulators per thread"):
        pass
    while (regs(tm, tn, tk) > budget or staged(tk) > MAX_STAGED_PER_THREAD) and tk > mk \
            and (tm * tk // 2) % threads == 0 and (tk // 2 * tn) % threads == 0:
        notes.append(f"tile_k={tk} lowered to {tk // 2}: {tm}x{tn}x{tk} tiles stage {staged(tk)} operand elements "
                     f"and need about {regs(tm, tn, tk)} registers per thread (budget {budget} for "
                     f"blocks_per_sm={options.blocks_per_sm}, at most {MAX_STAGED_PER_THREAD} staged)")
        tk //= 2
    while regs(tm, tn, tk) > budget and shrink(f"about {regs(tm, tn, tk)} registers per thread"):
        pass
    return tm, tn, tk, notes


class _Simt(GemmEmitter):
    name = "simt"
    codegen = "gemm_simt"
    capabilities = Capabilities(ARCHES, "registers -> shared (fp32)", (1, 1, 1))
    summary = "fp32 tiles in shared memory, each thread an RM x RN register micro-tile"

    def reason(self, p, options):
        if p.dtype in ("bfloat16", "float16"):
            return f"{p.dtype} operands: fp32 SIMT on widened values"
        return f"{p.dtype} operands with fp32_math='{options.fp32_math}': exact fp32 SIMT tiles"

    def _tiles(self, p, options, threads):
        def regs(tm, tn, tk):
            return tm * tn // threads + 2 * (tm * tk + tk * tn) // threads + 72
        return _fit_tiles(p, options, threads, multiple=(1, 1, 1), name=self.name, regs=regs)


class _Wmma(GemmEmitter):
    codegen = "gemm_wmma"
    capabilities = Capabilities(ARCHES, "registers -> shared (converted)", (16, 16, 16), "wmma")

    def __init__(self, name: str, dtype: str, fk: int, summary: str) -> None:
        self.name, self.dtype, self.fk, self.summary = name, dtype, fk, summary
        self.capabilities = Capabilities(ARCHES, "registers -> shared (converted)", (16, 16, fk), "wmma")

    def _supports(self, p, options):
        if p.dtype != self.dtype:
            return f"{self.name} takes {self.dtype} operands, not {p.dtype}"
        if self.dtype == "float32" and options.fp32_math != "tf32":
            return f"{self.name} needs fp32_math='tf32' (fp32_math='{options.fp32_math}')"
        if options.threads_per_block % 32:
            return f"{self.name} needs whole warps"
        return None

    def reason(self, p, options):
        if p.dtype == "float32":
            return "fp32 operands with fp32_math='tf32': tensor cores on tf32-rounded inputs"
        return f"{p.dtype} operands: tensor cores with fp32 accumulation"

    def _tiles(self, p, options, threads):
        def regs(tm, tn, tk):
            # accumulator fragments, operand fragments, the staged operands (and their conversions)
            return 2 * tm * tn // threads + 2 * (tm * tk + tk * tn) // threads + 64
        return _fit_tiles(p, options, threads, multiple=(16, 16, self.fk), name=self.name, regs=regs)


class _Wgmma(GemmEmitter):
    """Hopper warpgroup MMA: each warpgroup (128 threads) owns 64 rows of the tile; B and A are
    read by the tensor cores from 128-byte-swizzled shared memory through matrix descriptors."""

    codegen = "gemm_tma"
    clusters = True

    def __init__(self, name: str, dtype: str, fk: int, summary: str) -> None:
        self.name, self.dtype, self.fk, self.summary = name, dtype, fk, summary
        self.capabilities = Capabilities(("sm_90a",), "registers -> swizzled shared (converted)",
                                         (64, 8, fk), "wgmma")

    def _supports(self, p, options):
        if p.dtype != self.dtype:
            return f"{self.name} takes {self.dtype} operands, not {p.dtype}"
        if self.dtype == "float32" and options.fp32_math != "tf32":
            return f"{self.name} needs fp32_math='tf32' (fp32_math='{options.fp32_math}')"
        if options.threads_per_block % 128 or options.threads_per_block > 512:
            return f"{self.name} needs 1 to 4 whole warpgroups (threads_per_block 128, 256 or 512)"
        if p.m < 32 or p.n < 32:
            return f"{self.name} tiles are 64 rows by at least 32 columns; {p.m}x{p.n} would be mostly empty"
        macs = p.batch * p.m * p.n * p.k
        if macs < options.wgmma_min_macs:
            return (f"{self.name}: a tiny GEMM ({p.batch}x{p.m}x{p.n}x{p.k} = {macs:,} MACs < "
                    f"wgmma_min_macs = {options.wgmma_min_macs:,}): a 64-row wgmma tile's fixed cost per work "
                    "item (shared C tile, mbarriers, swizzled staging) exceeds its math")
        if self._best(p, options, options.threads_per_block) is None:
            return (f"{self.name}: no tile of {options.threads_per_block} threads fits "
                    f"{register_budget(options.threads_per_block, options.blocks_per_sm)} registers per thread "
                    f"(threads_per_block={options.threads_per_block}, blocks_per_sm={options.blocks_per_sm})")
        return None

    def reason(self, p, options):
        return f"{p.dtype} operands on sm_90a: warpgroup MMA (wgmma) with fp32 accumulation"

    def _tiles(self, p, options, threads):
        best = self._best(p, options, threads)
        if best is None:
            raise AssertionError("supports() admitted a wgmma problem with no tile that fits")
        tk = 128 // (4 if self.dtype == "float32" else 2)
        _, tm, tn, wgm, wgn, tiles = best
        note = (f"tile {tm}x{tn}x{tk} for {self.name}: {wgm}x{wgn} warpgroup(s) of 64x{tn // wgn}, {tiles} tiles "
                f"on {SM_COUNT} SMs, K in steps of one 128-byte swizzle row")
        return tm, tn, tk, [note]

    def _best(self, p, options, threads):
        """(time, tm, tn, wgm, wgn, tiles) of the quickest tile that fits the register budget, or None."""
        groups = threads // 128
        tk = 128 // (4 if self.dtype == "float32" else 2)  # one 128-byte swizzle row of K
        budget = register_budget(threads, options.blocks_per_sm)
        best = None
        for wgm in (d for d in range(1, groups + 1) if groups % d == 0):
            wgn = groups // wgm
            # a row-major B (N-major tiles) is staged in whole 64-column swizzle atoms
            widths = (64, 128) if p.b_n_contiguous and self.dtype != "float32" and p.n >= 64 else (32, 64, 128)
            if self._direct(p) and wgn == 1 and p.n >= 256:
                # one warpgroup column of m64n256: no staging registers beside the 128 accumulators.
                # Measured on the H200 (K = 256 weight gradients, TMA): 128x256 tiles (one wave) 9.8 µs
                # against 11.3 µs for 128x128 (two waves)
                widths = (*widths, 256)
            for wn in widths:
                tm, tn = 64 * wgm, wgn * wn
                if self._regs(tm, tn, tk, threads, self._direct(p)) > budget or (tm * tk) % threads \
                        or (tk * tn) % threads:
                    continue
                tiles = p.batch * ceil_div(p.m, tm) * ceil_div(p.n, tn)
                waves = ceil_div(tiles, SM_COUNT)
                # a wave's time: the tile's MMAs plus its operand traffic (per K step, in MMA units). Tried
                # on the H200 against a model of chip-wide L2 traffic that chose 128x128 tiles for medium's
                # 256x4096x1024 GEMMs: 16.0 µs per tile against 11.9 µs for this model's 64x128 (one SM's
                # operand stream, ~33 GB/s with cp.async, bounds these GEMMs, not the chip's L2)
                t = waves * (tm * tn + 48 * (tm + tn))
                if best is None or t < best[0] or (t == best[0] and tm * tn > best[1] * best[2]):
                    best = (t, tm, tn, wgm, wgn, tiles)
        return best

    def plan(self, p, options, why):
        return _plan_cluster(super().plan(p, options, why), p, options, self)

    def _direct(self, p):
        """Whether codegen will copy the operands with cp.async / TMA: 2-byte operands, stored and
        aligned (:attr:`GemmProblem.direct`), whole 8-element vectors along K and along an MN-major
        operand's M or N."""
        return (p.direct and self.dtype in ("bfloat16", "float16") and p.k % 8 == 0
                and (p.a_k_contiguous or p.m % 8 == 0) and (not p.b_n_contiguous or p.n % 8 == 0))

    def _regs(self, tm, tn, tk, threads, direct=False):
        if direct and tm * tn // threads > 64:
            # accumulators, the copy issue's addresses and the epilogue (measured: 154 registers for
            # 128x256 with TMA, 196 with cp.async)
            return tm * tn // threads + 72
        return tm * tn // threads + 2 * (tm * tk + tk * tn) // threads + 40

    def registers(self, plan):
        return self._regs(plan.tile_m, plan.tile_n, plan.tile_k, plan.threads)


class _Gemv(GemmEmitter):
    name = "gemv"
    codegen = "gemv"
    capabilities = Capabilities(ARCHES, "registers (no tiles)", (1, 1, 1))
    summary = "M <= 4 or N <= 4: no tiles, K split across lanes or warps"
    tiled = False

    def _supports(self, p, options):
        if min(p.m, p.n) > SKINNY_MAX:
            return f"gemv is for M or N <= {SKINNY_MAX}"
        return None

    def reason(self, p, options):
        side = "M" if p.m <= p.n else "N"
        return f"{side} = {min(p.m, p.n)} <= {SKINNY_MAX}: skinny, tiles would be mostly empty"

    def plan(self, p, options, why):
        threads = options.threads_per_block
        return GemmPlan(self.name, why, p.m, p.n, p.k, p.batch, min(options.tile_m, _pow2_at_least(p.m, 16)),
                        min(options.tile_n, _pow2_at_least(p.n, 16)), options.tile_k,
                        p.dtype, p.a_k_contiguous, p.b_n_contiguous, threads)

    def items(self, plan):
        # the cost model's estimate: one output element per warp
        return ceil_div(plan.m * plan.n * plan.batch, plan.threads // 32)

    def registers(self, plan):
        return 40


#: Smallest long side and K a streaming GEMV is chosen for (below it the plain gemv's fewer
#: instructions win, and the small programs of the tests keep their schedules).
STREAM_MIN_LONG, STREAM_MIN_K = 256, 64


class _GemvStream(_Gemv):
    """Decode GEMVs (:mod:`tkx.codegen.gemv`): the long operand contiguous along K (an ``nn.Linear``
    weight), columns split over the whole grid, K unrolled so many loads are in flight."""

    name = "gemv_stream"
    capabilities = Capabilities(ARCHES, "registers (no tiles; loads unrolled over K)", (1, 1, 1))
    summary = "M <= 4 or N <= 4, long operand contiguous along K: columns over the grid, many loads in flight"
    streaming = True

    def _supports(self, p, options):
        why = super()._supports(p, options)
        if why:
            return why
        small_m = p.m <= p.n
        long_n = p.n if small_m else p.m
        if (p.b_n_contiguous if small_m else not p.a_k_contiguous):
            return "gemv_stream needs the long operand contiguous along K"
        if long_n < STREAM_MIN_LONG or p.k < STREAM_MIN_K:
            return f"gemv_stream is for a long side >= {STREAM_MIN_LONG} and K >= {STREAM_MIN_K}"
        return None

    def reason(self, p, options):
        side = "M" if p.m <= p.n else "N"
        return (f"{side} = {min(p.m, p.n)} <= {SKINNY_MAX} and the long operand is contiguous along K: a streaming "
                "GEMV (columns over the grid, loads unrolled)")


#: Every GEMM emitter, in the order :func:`choose_gemm` asks them.
GEMM_EMITTERS: tuple[GemmEmitter, ...] = (
    _GemvStream(),
    _Gemv(),
    _Wgmma("wgmma_bf16", "bfloat16", 16, "Hopper wgmma m64nNk16 on bf16, fp32 accumulators (sm_90a)"),
    _Wgmma("wgmma_f16", "float16", 16, "Hopper wgmma m64nNk16 on fp16, fp32 accumulators (sm_90a)"),
    _Wgmma("wgmma_tf32", "float32", 8, "Hopper wgmma m64nNk8 on tf32-rounded fp32 (sm_90a)"),
    _Wmma("wmma_bf16", "bfloat16", 16, "tensor cores, 16x16x16 bf16 fragments, fp32 accumulators"),
    _Wmma("wmma_f16", "float16", 16, "tensor cores, 16x16x16 fp16 fragments, fp32 accumulators"),
    _Wmma("wmma_tf32", "float32", 8, "tensor cores on fp32 rounded to tf32, 16x16x8"),
    _Simt(),
)


def gemm_emitter(name: str) -> GemmEmitter:
    """The registered GEMM emitter called ``name``; ``KeyError`` if none is."""
    for e in GEMM_EMITTERS:
        if e.name == name:
            return e
    raise KeyError(f"no GEMM emitter {name!r}; registered: {', '.join(e.name for e in GEMM_EMITTERS)}")


def has_tiles(variant: str) -> bool:
    """Whether the plans of ``variant`` have meaningful tiles (:attr:`GemmEmitter.tiled`); ``True`` for a
    name without a spec row."""
    try:
        return gemm_emitter(variant).tiled
    except KeyError:
        return True


def choose_gemm(p: GemmProblem, options: Any, arch: str = "sm_80") -> GemmPlan:
    """The plan of the first registered emitter that supports ``p`` under ``options`` for ``arch``.

    ``GemmPlan.why`` says why it was chosen; where a tensor-core emitter for the same dtype
    declined, its reason is appended. Never raises: :class:`_Simt` supports everything.
    """
    declined: list[str] = []
    for e in GEMM_EMITTERS:
        reason = e.supports(p, options, arch)
        if reason is None:
            why = e.reason(p, options)
            if declined and e.tiled:
                why += " (" + "; ".join(dict.fromkeys(declined)) + ")"
            return e.plan(p, options, why)
        # say why a tensor-core emitter for these operands declined (not the other dtypes' ones)
        if getattr(e, "dtype", None) == p.dtype and not (p.dtype == "float32" and options.fp32_math != "tf32") \
                and arch in e.capabilities.arches:
            declined.append(reason)
    raise AssertionError("the SIMT emitter supports every GEMM")  # pragma: no cover


#: Emitters whose code generation implements split-K (partial tiles reduced in a fixed order).
SPLIT_K_EMITTERS: frozenset[str] = frozenset({"wgmma_bf16", "wgmma_f16", "wgmma_tf32"})


#: ``split_k="auto"`` splits a GEMM whose tiles x 2 fit the SMs only when K has at least
#: :data:`SPLIT_K_FIRST_STEPS` steps of ``tile_k`` (a split adds a final stage and a grid barrier, about
#: 1.6 µs on the H200, which the K steps it takes off each item must outweigh: ~0.3-0.45 µs per step of a
#: 64x128 tile), then doubles the split while the tiles x slices still fit the SMs and each slice keeps at
#: least ``Options.split_k_min_steps`` steps (default 2). Measured on the H200 (whole steps, CUDA-graph
#: replays): a split-K item's time is mostly fixed (a 4-step 64x128 slice
#: takes 3.5 µs, 2.9 µs of it without any copies), so more, shorter slices win while they fit one wave:
#: small's 64x128x1024 GEMM (16 steps) split 1 / 2 / 4 / 8 / 16 ways: 25.3 / 24.0 / 22.5 / 21.8 / 21.9 µs
#: per step; its 64x1024x512 (8 steps) 1 / 2 / 4 / 8 ways: 22.2 / 22.5 / 22.3 / 22.3 (break-even); both at
#: 2 steps per slice 21.6; medium's 256x1024x4096 (32 tiles) keeps 4 ways (2: 71.8, 8 = two waves: 72.1,
#: 4: 66.7).
SPLIT_K_FIRST_STEPS = 8


def _plan_split_k(plan: GemmPlan, options: Any, e: GemmEmitter) -> GemmPlan:
    """Split-K: ``options.split_k`` as an integer forces it (cut to what K allows), ``"auto"``
    splits when the output tiles cannot fill the grid and K has at least :data:`SPLIT_K_FIRST_STEPS`
    steps, doubling while the slices fit the SMs and keep ``options.split_k_min_steps`` steps each;
    ``"off"`` never."""
    sk = options.split_k
    if e.name not in SPLIT_K_EMITTERS:
        if isinstance(sk, int) and sk > 1:
            note = f"split_k={sk} not applied: {e.name} computes each tile's whole K"
            return dataclasses.replace(plan, adjusted="; ".join(x for x in (plan.adjusted, note) if x))
        return plan
    tiles = e.items(plan)
    steps = ceil_div(plan.k, plan.tile_k)
    if sk == "off":
        return plan
    if sk == "auto":
        want = 1
        while (tiles * want * 2 <= SM_COUNT and steps // (want * 2) >= options.split_k_min_steps
               and steps >= SPLIT_K_FIRST_STEPS):
            want *= 2
        if want == 1:
            return plan
        why = (f"split-K {want}: {tiles} output tile(s) cannot fill {SM_COUNT} SMs and K = {plan.k} "
               f"is {steps} steps deep ({ceil_div(steps, want)} per slice)")
        return dataclasses.replace(plan, split_k=want, why=plan.why + "; " + why)
    want = int(sk)
    if want > steps:
        note = (f"split_k={sk} cut to {steps}: K = {plan.k} has only {steps} steps of {plan.tile_k}")
        want = steps
        plan = dataclasses.replace(plan, adjusted="; ".join(x for x in (plan.adjusted, note) if x))
    if want <= 1:
        return plan
    return dataclasses.replace(plan, split_k=want, why=plan.why + f"; split-K {want} (split_k={sk} requested)")


#: ``Options.gemm_cluster`` (default ``"off"``: not measured faster on the H200): a wgmma GEMM whose operands
#: are copied with TMA, whose items pair up (:func:`cluster_pairs`) and whose items are at least
#: :data:`CLUSTER_MIN_K_STEPS` k-tiles deep (``"on"``; any depth with ``"all"``) runs in 2-CTA thread-block
#: clusters: items ``2p`` and ``2p + 1`` are the row blocks ``2r``, ``2r + 1`` of one column block, each CTA
#: copies one half of the B tile with ``.multicast::cluster`` into both CTAs' shared memory
#: (``GemmPlan.cluster = 2``, the reason in ``GemmPlan.why``). The kernel is then launched in clusters of 2
#: (every block of the grid). Why: medium's 256-row GEMMs (64x128 tiles, 4 row blocks) are bound by the
#: operand stream through L2 (48 MiB of L2 -> SM traffic for 8.5 MiB of operands); pairing halves B's share.
#: Fewest k-tiles per work item for ``gemm_cluster="on"`` to pair a GEMM's items (short K: the operand
#: stream is not what bounds it, and each item pays two cluster barriers).
CLUSTER_MIN_K_STEPS = 8


def cluster_pairs(p: GemmProblem, tm: int, tn: int, split: int, b_kmajor: bool) -> str | None:
    """``None`` when the TMA wgmma GEMM of ``p`` with ``tm x tn`` tiles can run its items in pairs of
    2-CTA clusters, else why not: one matrix (no batch), an even number of row blocks (the pair's tiles
    share a column block), and a B tile that halves into whole copy boxes (K-major: ``tn / 2`` rows, a
    multiple of 8 so each half starts on a swizzle atom; N-major: an even number of 64-column boxes)."""
    if p.batch != 1:
        return f"a batch of {p.batch} matrices"
    tiles_m = ceil_div(p.m, tm)
    if tiles_m % 2:
        return f"{tiles_m} row block(s) of {tm}: pairs need an even number"
    if b_kmajor and (tn // 2) % 8:
        return f"a K-major B tile of {tn} rows does not halve into swizzle atoms of 8 rows"
    if not b_kmajor and (tn % 64 or (tn // 64) % 2):
        return f"an N-major B tile of {tn} columns is not an even number of 64-column boxes"
    return None


def _plan_cluster(plan: GemmPlan, p: GemmProblem, options: Any, e: GemmEmitter) -> GemmPlan:
    """``plan`` with ``cluster=2`` and the reason appended to ``why`` when ``options.gemm_cluster`` is on and
    the GEMM qualifies (TMA copies, pairs, K deep enough); else ``plan`` unchanged."""
    if options.gemm_cluster == "off" or options.gemm_copy == "cp.async" or not e._direct(p):
        return plan
    if p.batch != 1 or plan.threads % 128 or options.mode == "block":
        return plan
    steps = ceil_div(ceil_div(plan.k, plan.tile_k), plan.split_k)
    if options.gemm_cluster == "on" and steps < CLUSTER_MIN_K_STEPS:
        return plan
    if cluster_pairs(p, plan.tile_m, plan.tile_n, plan.split_k, not p.b_n_contiguous) is not None:
        return plan
    tiles_m = ceil_div(plan.m, plan.tile_m)
    why = (f"2-CTA clusters: the {tiles_m} row blocks read each {plan.tile_k * plan.tile_n}-element B k-tile; "
           f"pairs of row blocks share it by TMA multicast (B through L2 once per pair, {steps} k-tiles per item)")
    return dataclasses.replace(plan, cluster=2, why=plan.why + "; " + why)


def program_work(program: Any) -> tuple[int, int]:
    """``(FLOPs, bytes)`` a step must at least do: 2 m n k per matrix product, and its inputs read
    plus its outputs and in-place updates written once (the speed-of-light workload)."""
    flops = 0
    for op in program.ops:
        if op.family == "matmul":
            a, b = (op.inputs[1], op.inputs[2]) if op.kind == "addmm" else (op.inputs[0], op.inputs[1])
            flops += GemmProblem.from_views(a, b).flops
    nbytes = sum(i.value.nbytes for i in program.inputs) + sum(o.value.nbytes for o in program.outputs)
    nbytes += sum(program.inputs[u.input_index].value.nbytes for u in program.updates)
    return flops, nbytes
