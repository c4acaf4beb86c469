"""The streaming GEMV emitter (``gemv_stream``): decode-time matrix-vector products at memory speed.

A decode step multiplies a few activation rows (``M`` = batch, 1-4) by every weight matrix once:
``C[s, l] = sum_k A[s, k] * B[k, l]`` with the weight ``B = W.T`` of an ``nn.Linear`` (``W`` is
``[N_out, K_in]``, contiguous along K). Each weight element is used once per step, so the product is
bound by how fast the weights stream from HBM, and at these sizes (a 512 x 512 bf16 matrix is 512 KB,
under 4 KB per SM) by how many bytes each SM has in flight, not by arithmetic.

What this emitter does differently from :func:`tkx.codegen.gemm.gemv` (split_k mode):

* **work split over output columns and K so every SM streams** (:func:`stream_split`): a work item
  owns ``warps / ksplit x cpw`` consecutive output columns (AMK's tiling by ``(n_off, N_tile)``); the
  ``ksplit`` warps of one column group each sum one contiguous slice of K and the block adds their
  sums in slice order (shared memory), so a 512-column matrix still makes 128 items for 132 SMs;
* **16-byte weight loads** (``ptr_long``: a stored bf16/fp16 weight contiguous along K): each lane
  loads 8 consecutive K elements of a weight row per step (``uint4``, a warp reads 512 contiguous
  bytes), ``unroll`` steps x ``cpw`` columns of loads issued before their FMAs (in flight together);
* **dequantisation in the load path** (any other ``load_b``, e.g. the user's ``q.to(bf16) * scale``
  or int4 nibbles): the chain runs in registers on the loaded bytes, K unrolled up to 16 steps of 32
  elements; ``prefetch`` lists the raw buffers it reads (the int8/int4 rows and their scales) and each
  warp issues ``prefetch.global.L1`` for all the bytes of its columns' rows at the start of the
  work item, so the whole row is in flight at once while the element loads hit the cache;
* **fp32 accumulation then one cast** (in the epilogue), warp-shuffle reduction in a fixed order.

Only the layout where the long operand is contiguous along K is handled (the ``nn.Linear`` weight,
and the K cache read as ``K^T``); :func:`tkx.target.choose_gemm` sends the rest to ``gemv``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..target import SKINNY_MAX, GemmProblem
from .gemm_registry import GemmRequest, register_gemm
from .gemm_tile import GemmCode, GemvLoads, Long8, Prefetch, PtrLong, _align, ceil_div
from .text import block, indent

__all__ = ["gemv", "gemv_stream", "columns_per_warp", "stream_split", "GemvLoads", "Long8", "Prefetch", "PtrLong",
           "UNROLL", "VEC_UNROLL"]

#: Most K steps (of 32 elements per warp) unrolled on the element-load path: loads in flight per lane =
#: UNROLL x columns per warp.
UNROLL = 16
#: Most 16-byte loads one lane keeps in flight on the vector path (``unroll x cpw``) at 256 threads per block
#: (half with 512, a quarter with 1,024: the register budget per thread halves).
VEC_UNROLL = 16
#: Most chain elements one lane computes per column and K pass on the 8-elements-per-lane chain path
#: (``unroll x 8``).
CHAIN_UNROLL = 16
#: Most output columns one warp owns (its accumulators: columns x short side floats).
MAX_CPW = 8
#: Bytes one prefetch covers (a cache line of sm_80 and sm_90).
LINE = 128
#: Most bytes of shared memory the 16-byte path stages the short operand in (float32, ``S x K``) when it has no
#: 16-byte loads of its own (an inlined chain such as SwiGLU's ``silu(gate) * up``, or float32 activations).
STAGE_BYTES = 32 * 1024
#: Most bytes of shared memory the 16-byte path's ``cp.async`` ring and what precedes it take (``Options.gemv_ring``).
RING_BYTES = 192 * 1024

def _pack8(src: str) -> str:
    """C expression: the 8 two-byte elements at ``src`` (any alignment) as one ``uint4``, the same bits."""
    words = ", ".join(f"{src}[{2 * i}] | ((unsigned int){src}[{2 * i + 1}] << 16)" for i in range(4))
    return f"make_uint4({words})"


def columns_per_warp(long_n: int, batch: int, warps: int, blocks: int) -> int:
    """Columns per warp so that ``batch x long_n`` columns fit in one wave of ``blocks`` blocks of ``warps``
    warps (at least 1, at most :data:`MAX_CPW`)."""
    return max(1, min(MAX_CPW, ceil_div(batch * long_n, warps * max(blocks, 1))))


def stream_split(long_n: int, batch: int, steps: int, warps: int, blocks: int) -> tuple[int, int]:
    """``(cpw, ksplit)``: columns per warp and warps sharing one column group over slices of K, for a GEMV
    of ``batch x long_n`` output columns whose K takes ``steps`` warp steps, on ``blocks`` blocks of
    ``warps`` warps. Picks the fewest waves x (per-warp steps ``cpw x ceil(steps / ksplit)`` + one step of
    overhead); ties go to fewer work items, then to the smaller ``ksplit``."""
    best: tuple[float, int, int, int] | None = None
    ks = 1
    while ks <= warps:
        if warps % ks == 0 and ks <= steps:
            for cpw in range(1, MAX_CPW + 1):
                per_item = warps // ks * cpw
                items = batch * ceil_div(long_n, per_item)
                waves = ceil_div(items, max(blocks, 1))
                t = waves * (cpw * ceil_div(steps, ks) + 1)
                key = (t, items, ks, cpw)
                if best is None or key < best:
                    best = key
        ks *= 2
    assert best is not None
    return best[3], best[2]


def _skinny(p: GemmProblem, name: str, threads: int) -> tuple[bool, int, int]:
    """``(small_m, short size, long size)`` of a skinny GEMM; :class:`ValueError` when ``threads`` is not whole
    warps or neither side is at most :data:`~tkx.target.SKINNY_MAX`."""
    if threads % 32:
        raise ValueError("threads must be a multiple of 32")
    small_m = p.m <= p.n
    s_count = p.m if small_m else p.n
    if s_count > SKINNY_MAX:
        raise ValueError(f"{name} needs M <= {SKINNY_MAX} or N <= {SKINNY_MAX}, got {p.m}x{p.n}")
    return small_m, s_count, p.n if small_m else p.m


def _long_index(p: GemmProblem, item: str, per_batch: int, step: str) -> list[str]:
    """The matrix ``bat`` of the batch, ``warp``, ``lane`` and this thread's long index ``l`` (item ``item`` of
    ``per_batch`` per matrix; ``step``: the rest of ``l = item * step``)."""
    return [f"const int bat = {item} / {per_batch};" if p.batch > 1 else "const int bat = 0;",
            "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
            f"const int l = ({item} % {per_batch}) * {step};" if p.batch > 1 else f"const int l = {item} * {step};"]


@register_gemm("gemv")
def gemv(r: GemmRequest) -> GemmCode:
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
    p, load_a, load_b, epilogue, threads, item, smem = (r.problem, r.load_a, r.load_b, r.epilogue, r.threads,
                                                        r.item, r.smem)
    small_m, s_count, long_n = _skinny(p, "gemv", threads)
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
    header = f"constexpr int M = {p.m}, N = {p.n}, K = {p.k};  // {dims}, S = {s_count} short index(es)"
    if long_k_contiguous:
        per_item = warps
        mode = "split_k"
        per_batch = ceil_div(long_n, per_item)
        body = block(
            "// skinny GEMM (split_k): one warp per long index l, lanes split K, shuffle reduction",
            header,
            *_long_index(p, item, per_batch, f"{warps} + warp"),
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
        per_batch = ceil_div(long_n, per_item)
        kc = ceil_div(p.k, warps)
        body = block(
            f"// skinny GEMM (split_l): one thread per long index l, the {warps} warps split K",
            header,
            *_long_index(p, item, per_batch, "32 + lane"),
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


@dataclass(frozen=True)
class _Stream:
    """The work split of one streaming GEMV (:func:`_stream_of`)."""

    small_m: bool
    s_count: int  # short side
    long_n: int  # long side (output columns)
    vec: bool  # 16-byte loads of the long operand
    lane8: bool  # a dequantising chain, 8 K elements per lane and step
    cpw: int  # columns per warp
    ksplit: int  # warps sharing one column group over slices of K
    groups: int  # column groups of one work item
    per_item: int
    per_batch: int
    slice_steps: int
    per_step: int
    staged: bool  # the short operand computed once per item into shared memory (float32 [S][K])
    stage_at: int  # bytes into the workspace: the staged short operand (after the K slices' partial sums)
    ring: int  # 16-byte slots per thread of the cp.async ring (0: loads into registers)
    ring_at: int  # bytes into the workspace: the ring, [slot][thread]

    @property
    def k_lo(self) -> str:
        return f"kslice * {self.slice_steps * self.per_step}"

    @property
    def k_hi(self) -> str:
        return f"min(K, (kslice + 1) * {self.slice_steps * self.per_step})"


def _stream_of(r: GemmRequest) -> _Stream:
    p = r.problem
    small_m, s_count, long_n = _skinny(p, "gemv_stream", r.threads)
    if (p.b_n_contiguous if small_m else not p.a_k_contiguous):
        raise ValueError("gemv_stream needs the long operand contiguous along K (use gemv)")
    warps = r.threads // 32
    vec = r.gemv_loads.ptr_long is not None and p.k % 8 == 0
    # a dequantising chain with K a multiple of 8 (``cheap``: Options.cheap_int_math): each lane computes 8 consecutive
    # K elements per step, so the compiler sees one byte serve both nibbles and one scale serve all 8
    # (the indices' low 3 bits are the constant t) and the activations come in 16-byte loads
    lane8 = not vec and r.cheap and p.k % 8 == 0
    per_step = 256 if vec or lane8 else 32
    steps = ceil_div(p.k, per_step)
    cpw, ksplit = stream_split(long_n, p.batch, steps, warps, r.blocks)
    groups = warps // ksplit
    per_item = groups * cpw
    staged = vec and r.gemv_loads.stage_short and s_count * p.k * 4 <= STAGE_BYTES
    stage_at = _align(4 * warps * cpw * s_count if ksplit > 1 else 0, 16)
    ring_at = _align(stage_at + (4 * s_count * p.k if staged else 0), 16)
    # the ring's slots: as many as Options.gemv_ring asks, as far as RING_BYTES of shared memory holds them
    ring = min(r.gemv_loads.ring, (RING_BYTES - ring_at) // (16 * r.threads)) if vec else 0
    ring = ring if ring >= 2 else 0
    return _Stream(small_m, s_count, long_n, vec, lane8, cpw, ksplit, groups, per_item, ceil_div(long_n, per_item),
                   ceil_div(steps, ksplit), per_step, staged, stage_at, ring, ring_at)


def _short_of(r: GemmRequest, g: _Stream, k: str) -> str:
    return r.load_a("bat", "s", k) if g.small_m else r.load_b("bat", k, "s")


def _long_of(r: GemmRequest, g: _Stream, k: str) -> str:
    return r.load_b("bat", k, "l") if g.small_m else r.load_a("bat", "l", k)


def _short8(r: GemmRequest, g: _Stream) -> list[str]:
    """Lines filling ``a[8]`` with the short operand's elements ``k0 .. k0 + 7`` (one 16-byte load with
    ``ptr_short``)."""
    ld = r.gemv_loads
    if ld.ptr_short is None:
        return ["#pragma unroll", f"for (int t = 0; t < 8; ++t) a[t] = {_short_of(r, g, '(k0 + t)')};"]
    return ["uint4 av = make_uint4(0u, 0u, 0u, 0u);",
            f"const unsigned short* asrc = {ld.ptr_short('bat', 'k0', 's')};",
            f"if ({ld.aligned_short}) av = *reinterpret_cast<const uint4*>(asrc);",
            f"else av = {_pack8('asrc')};",
            *(f"a[{2 * i}] = __uint_as_float(av.{w} << 16); "
              f"a[{2 * i + 1}] = __uint_as_float(av.{w} & 0xffff0000u);" for i, w in enumerate("xyzw"))]


def _fma_per_short(r: GemmRequest, g: _Stream, fma: str) -> str:
    """For each short index ``s``: its 8 elements into ``a[8]`` (:func:`_short8`), then ``fma`` (indented C
    statements adding them into ``sum[c][s]``) for each column ``c`` of the warp."""
    return block(
        "#pragma unroll",
        f"for (int s = 0; s < {g.s_count}; ++s) {{",
        indent(block("float a[8];", *_short8(r, g), "#pragma unroll", f"for (int c = 0; c < {g.cpw}; ++c) {{", fma,
                     "}")),
        "}")


def _vector_loop(r: GemmRequest, g: _Stream) -> tuple[str, int]:
    """The K loop with 16-byte weight loads: ``(loop, unroll)``.

    The loop body has no branch: ptxas schedules loads only within a basic block, so a branch around each
    load (a column past the end, a base that is not 16-byte aligned) would leave one step's ``cpw`` loads in
    flight instead of ``unroll x cpw``. A column past ``long_n`` reads the last row (its sums are never
    stored); a lane's step past the slice's end (only when K is not ``ksplit x slice_steps x 256``) reads the
    slice's first step and adds zeros; the alignment test is made once, outside the loop, and chooses
    between a loop of ``uint4`` loads and the same loop reading two bytes at a time."""
    ld, cpw = r.gemv_loads, g.cpw
    assert ld.ptr_long is not None
    # the loads in flight take 4 registers each: VEC_UNROLL at 256 threads per block (255 registers a thread),
    # fewer with more threads (512 threads get 128 registers; 16 loads spilled there, 8 do not)
    unroll = max(1, min(g.slice_steps, VEC_UNROLL * 256 // max(r.threads, 256) // cpw))
    exact = r.problem.k == g.ksplit * g.slice_steps * 256
    words = [f"raw[c].{w}" for w in "xyzw"]
    zero = "make_uint4(0u, 0u, 0u, 0u)"

    kr = "k0" if exact else "kr"
    keep = (lambda v: v) if exact else (lambda v: f"kin ? {v} : {zero}")

    def short_lines(vector: bool) -> list[str]:
        """Lines filling ``a[8]`` with short index ``s``'s elements of this lane's step (``k0`` / ``kr``)."""
        aload = (lambda src: f"*reinterpret_cast<const uint4*>({src})") if vector else _pack8
        a_src = ld.ptr_short("bat", kr, "s") if ld.ptr_short is not None else None
        zero4 = "make_float4(0.0f, 0.0f, 0.0f, 0.0f)"
        pick = (lambda v: v) if exact else (lambda v: f"kin ? {v} : {zero4}")
        halves = ["a[0] = lo.x; a[1] = lo.y; a[2] = lo.z; a[3] = lo.w;",
                  "a[4] = hi.x; a[5] = hi.y; a[6] = hi.z; a[7] = hi.w;"]
        if g.staged:  # two 16-byte shared-memory loads of the values the block computed for this item
            return [f"const float4 lo = {pick(f'*reinterpret_cast<const float4*>(act + s * K + {kr})')};",
                    f"const float4 hi = {pick(f'*reinterpret_cast<const float4*>(act + s * K + {kr} + 4)')};",
                    *halves]
        if a_src is not None and ld.short_f32:  # float32 activations: two 16-byte loads
            f4 = (lambda src: f"*reinterpret_cast<const float4*>({src})") if vector else \
                (lambda src: f"make_float4(({src})[0], ({src})[1], ({src})[2], ({src})[3])")
            return [f"const float4 lo = {pick(f4(a_src))};", f"const float4 hi = {pick(f4(f'{a_src} + 4'))};",
                    *halves]
        if a_src is not None:
            return [f"const uint4 av = {keep(aload(a_src))};",
                    *(f"a[{2 * i}] = __uint_as_float(av.{w} << 16); "
                      f"a[{2 * i + 1}] = __uint_as_float(av.{w} & 0xffff0000u);" for i, w in enumerate("xyzw"))]
        return ["#pragma unroll", "for (int t = 0; t < 8; ++t) a[t] = "
                + (f"{_short_of(r, g, '(k0 + t)')};" if exact else f"kin ? {_short_of(r, g, '(kr + t)')} : 0.0f;")]

    def loop(vector: bool) -> str:
        wload = (lambda src: f"__ldg(reinterpret_cast<const uint4*>({src}))") if vector else _pack8
        kin = [] if exact else [f"const bool kin = k0 < {g.k_hi};  // this lane's step lies in the slice",
                                f"const int kr = kin ? k0 : {g.k_lo} + lane * 8;  // else read a step that exists"]
        fma = indent(block(*(
            f"sum[c][s] = fmaf(a[{2 * i}], __uint_as_float({w} << 16), sum[c][s]);\n"
            f"sum[c][s] = fmaf(a[{2 * i + 1}], __uint_as_float({w} & 0xffff0000u), sum[c][s]);"
            for i, w in enumerate(words))))
        short = short_lines(vector)
        return block(
            f"#pragma unroll {unroll}",
            f"for (int j = 0; j < {g.slice_steps}; ++j) {{",
            indent(block(
                f"const int k0 = {g.k_lo} + lane * 8 + j * 256;",
                *kin,
                f"uint4 raw[{cpw}];  // 8 weight elements per column: the loads of {unroll} steps in flight, "
                "then the FMAs",
                "#pragma unroll",
                f"for (int c = 0; c < {cpw}; ++c) {{",
                f"    const int l = min(l0 + c, {g.long_n - 1});  // past the end: the last row, never stored",
                f"    raw[c] = {keep(wload(ld.ptr_long('bat', kr, 'l')))};",
                "}",
                "#pragma unroll",
                f"for (int s = 0; s < {g.s_count}; ++s) {{",
                indent(block("float a[8];", *short, "#pragma unroll", f"for (int c = 0; c < {cpw}; ++c) {{", fma,
                             "}")),
                "}")),
            "}")

    test = ld.aligned if ld.ptr_short is None else f"({ld.aligned}) && ({ld.aligned_short})"
    fast = _ring_loop(r, g, exact, short_lines) if g.ring else loop(True)
    return block(f"if ({test}) {{  // 16-byte aligned bases: uint4 loads",
                 indent(fast), "} else {  // the same bits, two bytes at a time", indent(loop(False)), "}"), \
        unroll


def _ring_loop(r: GemmRequest, g: _Stream, exact: bool, short_lines: Any) -> str:
    """The 16-byte loop through a ring of ``g.ring`` shared-memory slots per thread (``Options.gemv_ring``):
    each lane's loads go ``cp.async`` (global -> shared, 16 bytes, L2 only) in the order (step, column); the
    lane waits for the oldest (``cp.async.wait_group``, one group per load), reads it, adds it in and issues
    the load ``ring`` places on into the slot it freed. ``ring`` loads stay in flight all the time and hold no
    register, where the register loop issues ``unroll x cpw`` loads, waits for all of them and adds them in.
    Every lane reads only the slots it filled, so no block barrier is needed. A step past the slice's end
    fills zeros (source size 0)."""
    ld, cpw, d = r.gemv_loads, g.cpw, g.ring
    assert ld.ptr_long is not None
    total = g.slice_steps * cpw  # loads per lane

    def issue(t: str) -> list[str]:
        k0 = f"{g.k_lo} + lane * 8 + ({t} / {cpw}) * 256"
        kin = "true" if exact else f"({k0}) < {g.k_hi}"
        src = ld.ptr_long("bat", f"(({kin}) ? ({k0}) : {g.k_lo})", f"min(l0 + ({t}) % {cpw}, {g.long_n - 1})")
        return [f"if ({t} < {total}) asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: "
                f"\"r\"(ring_s + (unsigned)((({t}) % {d}) * {16 * r.threads})), \"l\"({src}), "
                f"\"r\"(({kin}) ? 16 : 0) : \"memory\");",
                'asm volatile("cp.async.commit_group;" ::: "memory");']
    words = [f"raw.{w}" for w in "xyzw"]
    fma = block(*(f"sum[c][s] = fmaf(a[{2 * i}], __uint_as_float({w} << 16), sum[c][s]);\n"
                  f"sum[c][s] = fmaf(a[{2 * i + 1}], __uint_as_float({w} & 0xffff0000u), sum[c][s]);"
                  for i, w in enumerate(words)))
    kin = [] if exact else [f"const bool kin = k0 < {g.k_hi};",
                            f"const int kr = kin ? k0 : {g.k_lo} + lane * 8;"]
    return block(
        f"const uint4* ring = reinterpret_cast<const uint4*>(tkx_smem + {g.ring_at}) + threadIdx.x;  "
        f"// this thread's {d} slots, {r.threads} apart",
        "const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);",
        "#pragma unroll",
        f"for (int t = 0; t < {d}; ++t) {{  // the first {d} loads in flight",
        indent(block(*issue("t"))),
        "}",
        f"for (int j = 0; j < {g.slice_steps}; ++j) {{",
        indent(block(
            f"const int k0 = {g.k_lo} + lane * 8 + j * 256;",
            *kin,
            "#pragma unroll",
            f"for (int c = 0; c < {cpw}; ++c) {{",
            indent(block(
                f"const int t = j * {cpw} + c;",
                f'asm volatile("cp.async.wait_group {d - 1};" ::: "memory");  // load t has landed',
                f"const uint4 raw = ring[(t % {d}) * {r.threads}];",
                "#pragma unroll",
                f"for (int s = 0; s < {g.s_count}; ++s) {{",
                indent(block("float a[8];", *short_lines(True), fma)),
                "}",
                f"{{  // the slot is read (its value is in raw, used above): load t + {d} into it",
                indent(block(*issue(f"t + {d}"))),
                "}")),
            "}")),
        "}",
        'asm volatile("cp.async.wait_group 0;" ::: "memory");  // nothing of this item left in flight')


def _chain_loop(r: GemmRequest, g: _Stream) -> tuple[str, int]:
    """The K loop of a dequantising chain, 8 consecutive K elements per lane: ``(loop, unroll)``."""
    cpw, long8 = g.cpw, r.gemv_loads.long8
    unroll = max(1, min(g.slice_steps, CHAIN_UNROLL // (8 * cpw)))
    loop = block(
        f"#pragma unroll {unroll}",
        f"for (int k8 = kslice * {g.slice_steps * 32} + lane; "
        f"k8 < min({r.problem.k // 8}, (kslice + 1) * {g.slice_steps * 32}); k8 += 32) {{",
        indent(block(
            "const int k0 = k8 * 8;  // 8 consecutive K elements; the low 3 bits of k0 + t are t",
            f"float elem[{cpw}][8];  // the chain's loads first (all in flight), then the FMAs",
            "#pragma unroll",
            f"for (int c = 0; c < {cpw}; ++c) {{",
            "    const int l = l0 + c;",
            "    #pragma unroll",
            f"    for (int t = 0; t < 8; ++t) elem[c][t] = l < {g.long_n} ? "
            f"{long8('bat', 'k0', 'l', 't') if long8 is not None else _long_of(r, g, '(k0 + t)')} : 0.0f;",
            "}",
            _fma_per_short(r, g, block("    #pragma unroll",
                                       "    for (int t = 0; t < 8; ++t) sum[c][s] = fmaf(a[t], elem[c][t], "
                                       "sum[c][s]);")))),
        "}")
    return loop, unroll


def _element_loop(r: GemmRequest, g: _Stream) -> tuple[str, int]:
    """The K loop of element loads, one K element per lane and step: ``(loop, unroll)``."""
    cpw = g.cpw
    unroll = min(UNROLL, g.slice_steps)
    loop = block(
        f"#pragma unroll {unroll}",
        f"for (int k = {g.k_lo} + lane; k < {g.k_hi}; k += 32) {{",
        indent(block(
            f"float elem[{cpw}];  // the long operand's loads first (all in flight), then the FMAs",
            "#pragma unroll",
            f"for (int c = 0; c < {cpw}; ++c) {{",
            "    const int l = l0 + c;",
            f"    elem[c] = l < {g.long_n} ? {_long_of(r, g, 'k')} : 0.0f;",
            "}",
            "#pragma unroll",
            f"for (int s = 0; s < {g.s_count}; ++s) {{",
            f"    const float a_s = {_short_of(r, g, 'k')};",
            "    #pragma unroll",
            f"    for (int c = 0; c < {cpw}; ++c) sum[c][s] = fmaf(a_s, elem[c], sum[c][s]);",
            "}")),
        "}")
    return loop, unroll


def _prefetch_rows(g: _Stream, prefetch: tuple[Prefetch, ...]) -> list[str]:
    """``prefetch.global.L1`` of the raw bytes of this K slice of the columns' rows (element-load paths)."""
    if not prefetch or g.vec:
        return []
    fetch = ["#pragma unroll",
             f"for (int c = 0; c < {g.cpw}; ++c) {{  // the raw bytes of this K slice of the columns' rows, at once",
             "    const int l = l0 + c;",
             f"    if (l < {g.long_n}) {{"]
    for pf in prefetch:  # the slice's bytes [lo, lo + n): a line each lane, the last byte at most
        n = ceil_div(pf.span, g.ksplit)
        lo = f"({pf.row_stride}LL * l + {pf.start} + {g.k_lo} * {pf.span}LL / K)"
        fetch += [f"        for (int x = lane; x <= {(n - 1) // LINE + 1}; x += 32) "
                  'asm volatile("prefetch.global.L1 [%0];" :: '
                  f'"l"(reinterpret_cast<const unsigned char*>({pf.pointer}) + {lo} + min(x * {LINE}, {n - 1})));']
    return fetch + ["    }", "}"]


def _prefetch_ahead(r: GemmRequest, g: _Stream) -> list[str]:
    """``prefetch.global.L2`` of the long operand's rows of the work items ``1 .. ahead`` rounds of this block's
    grid-stride loop ahead (16-byte path): the first round asks for all of them, every later one for the item
    ``ahead`` rounds on. An item's rows are ``per_item`` weight rows of K elements; the block's threads share
    their 128-byte lines. The weights do not depend on the step's values, so HBM streams the next items while
    this one waits for its loads, reduces and stores (a hint: the loads read the same bytes either way)."""
    ld, p = r.gemv_loads, r.problem
    if not g.vec or ld.ptr_long is None or ld.ahead <= 0:
        return []
    per_line = LINE // 2  # 2-byte elements per line
    lines = ceil_div(p.k, per_line)  # lines of one row
    total = p.batch * g.per_batch
    rows = g.per_item * lines
    nbat = f"const int nbat = nitem / {g.per_batch}; " if p.batch > 1 else ""
    nl = f"(nitem % {g.per_batch}) * {g.per_item} + x / {lines}" if p.batch > 1 else \
        f"nitem * {g.per_item} + x / {lines}"
    src = ld.ptr_long("nbat" if p.batch > 1 else "0", f"(x % {lines}) * {per_line}", "nl")
    return [f"{{  // L2 prefetch of the weight rows of this block's items up to {ld.ahead} round(s) ahead",
            f"    const int first = {r.item} < (int)gridDim.x ? 1 : {ld.ahead};",
            f"    for (int d = first; d <= {ld.ahead}; ++d) {{",
            f"        const int nitem = {r.item} + d * (int)gridDim.x;",
            f"        if (nitem >= {total}) break;",
            f"        for (int x = threadIdx.x; x < {rows}; x += blockDim.x) {{",
            f"            {nbat}const int nl = {nl};",
            f"            if (nl < {g.long_n}) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"({src}));",
            "        }",
            "    }",
            "}"]


def _sum_loops(g: _Stream, statement: str) -> str:
    """``statement`` for every column ``c`` and short index ``s`` of this warp (both loops unrolled)."""
    return block(
        "#pragma unroll",
        f"for (int c = 0; c < {g.cpw}; ++c) {{",
        "    #pragma unroll",
        f"    for (int s = 0; s < {g.s_count}; ++s) {statement}",
        "}")


def _slice_reduction(g: _Stream, store: str) -> list[str]:
    """With K split over ``ksplit`` warps: each warp's sums to shared memory, then the first slice's lanes 0
    add them in slice order and store."""
    slots, cpw, s_count = g.groups * g.cpw * g.s_count, g.cpw, g.s_count
    return [
        "if (lane == 0) {",
        "    #pragma unroll",
        f"    for (int c = 0; c < {cpw}; ++c) {{",
        "        #pragma unroll",
        f"        for (int s = 0; s < {s_count}; ++s) red[kslice * {slots} + (group * {cpw} + c) * {s_count} + s] "
        "= sum[c][s];",
        "    }",
        "}",
        "__syncthreads();",
        f"if (kslice == 0 && lane == 0 && l0 < {g.long_n}) {{  // the slices added in order",
        "    #pragma unroll",
        f"    for (int c = 0; c < {cpw}; ++c) {{",
        "        #pragma unroll",
        f"        for (int s = 0; s < {s_count}; ++s) {{",
        "            float v = 0.0f;",
        f"            for (int j = 0; j < {g.ksplit}; ++j) "
        f"v += red[j * {slots} + (group * {cpw} + c) * {s_count} + s];",
        "            sum[c][s] = v;",
        "        }",
        "    }",
        indent(store),
        "}",
        "__syncthreads();  // the next work item reuses the workspace"]


def _stage_short(r: GemmRequest, g: _Stream, at: int) -> list[str]:
    """Lines computing the short operand once per work item into shared memory, ``act[s * K + k]`` (float32,
    ``at`` bytes into the workspace), by every thread of the block: each warp then reads its 8 values per step
    with two 16-byte shared loads instead of evaluating an inlined chain (or 8 float32 loads) per element, as
    many times as the item has warps."""
    total = g.s_count * r.problem.k
    return [f"float* act = reinterpret_cast<float*>(tkx_smem + {at});  // [s][k]: the short operand of this item",
            "__syncthreads();  // the last item's warps are done with act",
            f"for (int i = threadIdx.x; i < {total}; i += blockDim.x) {{",
            "    const int s = i / K, k = i - s * K;",
            f"    act[i] = {_short_of(r, g, 'k')};",
            "}",
            "__syncthreads();"]


@register_gemm("gemv_stream")
def gemv_stream(r: GemmRequest) -> GemmCode:
    """C block for one work item of the streaming GEMV of ``r.problem`` (see the module text).

    ``r.blocks``: the grid size the columns are spread over; ``r.gemv_loads`` (:class:`GemvLoads`): the
    16-byte loads of the long and short operands (used when K is a multiple of 8), the long operand's
    8-element reads of a dequantising chain, the raw buffers to prefetch; ``r.cheap``: 8 chain elements per
    lane. Raises :class:`ValueError` if neither side is skinny (``min(M, N) > SKINNY_MAX``), if the long
    operand is not contiguous along K, or if ``threads`` is not a multiple of 32.
    """
    p, item, ld = r.problem, r.item, r.gemv_loads
    g = _stream_of(r)
    cpw, s_count, long_n, per_batch = g.cpw, g.s_count, g.long_n, g.per_batch
    row, col, dims = ("s", "l", "C[s, l] = sum_k A[s, k] * B[k, l]") if g.small_m else \
        ("l", "s", "C[l, s] = sum_k A[l, k] * B[k, s]")
    zero = block(f"float sum[{cpw}][{s_count}];", _sum_loops(g, "sum[c][s] = 0.0f;"))
    loop, unroll = (_vector_loop if g.vec else _chain_loop if g.lane8 else _element_loop)(r, g)
    fetch = _prefetch_rows(g, ld.prefetch)
    ahead = _prefetch_ahead(r, g)
    out = block(f"const int l = l0 + c, row = {row}, col = {col};", "const float acc = sum[c][s];",
                r.epilogue("bat", "row", "col", "acc"))
    store = block(
        "#pragma unroll",
        f"for (int c = 0; c < {cpw}; ++c) {{  // unrolled: the sums stay in registers",
        f"    if (l0 + c < {long_n}) {{",
        "        #pragma unroll",
        f"        for (int s = 0; s < {s_count}; ++s) {{",
        indent(out, 3),
        "        }",
        "    }",
        "}")
    reduce = _sum_loops(g, "sum[c][s] = tkx_warp_sum(sum[c][s]);")
    head = [f"// streaming GEMV: {dims}; {cpw} column(s) per warp, {g.per_item} per work item, K in {g.ksplit} "
            f"slice(s) of {g.slice_steps} step(s), "
            + ("16-byte weight loads" if g.vec else
               (f"8 chain elements per lane, unrolled by {unroll}" if g.lane8 else
                f"element loads unrolled by {unroll}") + (", raw rows prefetched" if ld.prefetch else "")),
            f"constexpr int M = {p.m}, N = {p.n}, K = {p.k};",
            f"const int bat = {item} / {per_batch};" if p.batch > 1 else "const int bat = 0;",
            "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
            f"const int group = warp % {g.groups}, kslice = warp / {g.groups};",
            (f"const int l0 = ({item} % {per_batch}) * {g.per_item} + group * {cpw};" if p.batch > 1
             else f"const int l0 = {item} * {g.per_item} + group * {cpw};"), *ahead]
    red_bytes = 4 * (r.threads // 32) * cpw * s_count if g.ksplit > 1 else 0
    stage_at = g.stage_at
    ring_bytes = 16 * g.ring * r.threads
    if g.staged:
        head += _stage_short(r, g, stage_at)
    if g.ksplit == 1:
        body = block(*head, f"if (l0 < {long_n}) {{  // the whole warp takes the same branch",
                     indent(block(zero, *fetch, loop, reduce, "if (lane == 0) {", indent(store), "}")), "}")
        shared = g.ring_at + ring_bytes if g.ring else (stage_at + 4 * s_count * p.k if g.staged else 0)
    else:
        body = block(
            *head,
            "float* red = reinterpret_cast<float*>(tkx_smem);  // [kslice][group][c][s]: each warp's sums",
            zero,
            f"if (l0 < {long_n}) {{  // the whole warp takes the same branch",
            indent(block(*fetch, loop)),
            "}",
            reduce,
            *_slice_reduction(g, store))
        shared = g.ring_at + ring_bytes if g.ring else (stage_at + 4 * s_count * p.k if g.staged else red_bytes)
    params = {"mode": "stream", "short": "m" if g.small_m else "n", "short_size": s_count, "per_item": g.per_item,
              "columns_per_warp": cpw, "k_slices": g.ksplit, "unroll": unroll, "vector_loads": g.vec,
              "prefetched": len(ld.prefetch) if not g.vec else 0, "lane_elements": 8 if g.vec or g.lane8 else 1,
              "l2_ahead": ld.ahead if ahead else 0, "staged_short": g.staged, "ring": g.ring}
    return GemmCode("gemv_stream", "{\n" + indent(body) + "\n}", p.batch * per_batch, shared, r.threads, False,
                    params)
