"""The streaming GEMV emitter (``gemv_stream``): decode-time matrix-vector products at memory speed.

A decode step multiplies a few activation rows (``M`` = batch, 1-4) by every weight matrix once:
``C[s, l] = sum_k A[s, k] * B[k, l]`` with the weight ``B = W.T`` of an ``nn.Linear`` (``W`` is
``[N_out, K_in]``, contiguous along K). Each weight element is used once per step, so the product is
bound by how fast the weights stream from HBM, and at these sizes (a 512 x 512 bf16 matrix is 512 KB,
under 4 KB per SM) by how many loads each SM has in flight, not by arithmetic.

What this emitter does differently from :func:`tkx.codegen.gemm.gemv` (split_k mode):

* **work split by output column range** so one pass over the grid covers the matrix: work item
  ``item`` owns ``warps x cpw`` consecutive output columns (``cpw`` columns per warp, chosen by the
  plan so the items fit in one wave of the grid), AMK's tiling by ``(n_off, N_tile)``;
* **many loads in flight**: the K loop (a compile-time constant) is unrolled up to 16 steps and each
  step issues the loads of all ``cpw`` columns before their FMAs, so a lane has ``16 x cpw`` loads
  outstanding; a warp's loads of one step read ``32`` consecutive K elements of a weight row
  (coalesced);
* **any operand load**: the weight element is whatever ``load_b`` returns, so a dequantisation chain
  (``q.to(bf16) * scale``, int4 nibbles) runs in registers on the loaded bytes (the prologue);
* **fp32 accumulation then one cast** (in the epilogue), warp-shuffle reduction in a fixed order.

Only the layout where the long operand is contiguous along K is handled (the ``nn.Linear`` weight,
and the K cache read as ``K^T``); :func:`tkx.target.choose_gemm` sends the rest to ``gemv``.
"""

from __future__ import annotations

from ..target import SKINNY_MAX, GemmProblem
from .gemm import Epilogue, GemmCode, LoadA, LoadB
from .text import block, indent

__all__ = ["gemv_stream", "columns_per_warp", "UNROLL"]

#: Most K steps (of 32 elements per warp) unrolled: loads in flight per lane = UNROLL x columns per warp.
UNROLL = 16
#: Most output columns one warp owns (its accumulators: columns x short side floats).
MAX_CPW = 8


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def columns_per_warp(long_n: int, batch: int, warps: int, blocks: int) -> int:
    """Columns per warp so that ``batch x long_n`` columns fit in one wave of ``blocks`` blocks of ``warps``
    warps (at least 1, at most :data:`MAX_CPW`)."""
    return max(1, min(MAX_CPW, _ceil(batch * long_n, warps * max(blocks, 1))))


def gemv_stream(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, threads: int = 256,
                blocks: int = 132, item: str = "item") -> GemmCode:
    """C block for one work item of the streaming GEMV of ``p`` (see the module text).

    ``blocks``: the grid size the columns are spread over. Raises :class:`ValueError` if neither side
    is skinny (``min(M, N) > SKINNY_MAX``), if the long operand is not contiguous along K, or if
    ``threads`` is not a multiple of 32.
    """
    if threads % 32:
        raise ValueError("threads must be a multiple of 32")
    small_m = p.m <= p.n
    s_count = p.m if small_m else p.n
    if s_count > SKINNY_MAX:
        raise ValueError(f"gemv_stream needs M <= {SKINNY_MAX} or N <= {SKINNY_MAX}, got {p.m}x{p.n}")
    long_n = p.n if small_m else p.m
    if (p.b_n_contiguous if small_m else not p.a_k_contiguous):
        raise ValueError("gemv_stream needs the long operand contiguous along K (use gemv)")
    warps = threads // 32
    cpw = columns_per_warp(long_n, p.batch, warps, blocks)
    per_item = warps * cpw
    per_batch = _ceil(long_n, per_item)
    steps = _ceil(p.k, 32)
    unroll = min(UNROLL, steps)
    if small_m:
        short_of, long_of = load_a("bat", "s", "k"), load_b("bat", "k", "l")
        row, col, dims = "s", "l", "C[s, l] = sum_k A[s, k] * B[k, l]"
    else:
        short_of, long_of = load_b("bat", "k", "s"), load_a("bat", "l", "k")
        row, col, dims = "l", "s", "C[l, s] = sum_k A[l, k] * B[k, s]"
    out = block(f"const int l = l0 + c, row = {row}, col = {col};", "const float acc = sum[c][s];",
                epilogue("bat", "row", "col", "acc"))
    body = block(
        f"// streaming GEMV: {dims}; {cpw} column(s) per warp, {per_item} per work item, K unrolled by {unroll}",
        f"constexpr int M = {p.m}, N = {p.n}, K = {p.k};",
        f"const int bat = {item} / {per_batch};" if p.batch > 1 else "const int bat = 0;",
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
        f"const int l0 = ({item} % {per_batch}) * {per_item} + warp * {cpw};" if p.batch > 1
        else f"const int l0 = {item} * {per_item} + warp * {cpw};",
        f"if (l0 < {long_n}) {{  // the whole warp takes the same branch",
        f"    float sum[{cpw}][{s_count}];",
        "    #pragma unroll",
        f"    for (int c = 0; c < {cpw}; ++c) {{",
        "        #pragma unroll",
        f"        for (int s = 0; s < {s_count}; ++s) sum[c][s] = 0.0f;",
        "    }",
        f"    #pragma unroll {unroll}",
        "    for (int k = lane; k < K; k += 32) {",
        f"        float elem[{cpw}];  // the long operand's loads first (all in flight), then the FMAs",
        "        #pragma unroll",
        f"        for (int c = 0; c < {cpw}; ++c) {{",
        "            const int l = l0 + c;",
        f"            elem[c] = l < {long_n} ? {long_of} : 0.0f;",
        "        }",
        "        #pragma unroll",
        f"        for (int s = 0; s < {s_count}; ++s) {{",
        f"            const float a_s = {short_of};",
        "            #pragma unroll",
        f"            for (int c = 0; c < {cpw}; ++c) sum[c][s] = fmaf(a_s, elem[c], sum[c][s]);",
        "        }",
        "    }",
        "    #pragma unroll",
        f"    for (int c = 0; c < {cpw}; ++c) {{",
        "        #pragma unroll",
        f"        for (int s = 0; s < {s_count}; ++s) sum[c][s] = tkx_warp_sum(sum[c][s]);",
        "    }",
        "    if (lane == 0) {",
        "        #pragma unroll 1",
        f"        for (int c = 0; c < {cpw}; ++c) {{",
        f"            if (l0 + c >= {long_n}) break;",
        "            #pragma unroll",
        f"            for (int s = 0; s < {s_count}; ++s) {{",
        indent(out, 4),
        "            }",
        "        }",
        "    }",
        "}",
    )
    params = {"mode": "stream", "short": "m" if small_m else "n", "short_size": s_count, "per_item": per_item,
              "columns_per_warp": cpw, "unroll": unroll}
    return GemmCode("gemv_stream", "{\n" + indent(body) + "\n}", p.batch * per_batch, 0, threads, False, params)
