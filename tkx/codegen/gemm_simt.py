"""The fp32 SIMT GEMM emitter: tiles in shared memory, each thread an RM x RN register micro-tile, one
``fmaf`` per k (exact fp32, fixed summation order). Spec: ``tkx.target`` ``simt``."""

from __future__ import annotations

import math

from .gemm_registry import GemmRequest, register_gemm
from .gemm_tile import GemmCode, _align, _epilogue_block, _operand_stages, _staged_k_loop, _tile_header, _tile_items
from .text import block, indent


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


@register_gemm("simt")
def simt_gemm(r: GemmRequest) -> GemmCode:
    """(a) fp32 SIMT GEMM: shared tiles ``A[TM x TK]`` and ``B[TK x TN]``, each thread an
    ``RM x RN`` block of accumulators in registers, one ``fmaf`` per k in a fixed order.

    Thread (ty, tx) owns rows ``ty + i*TY`` and columns ``tx + j*TX`` of the tile (interleaved,
    so a warp reads consecutive shared-memory words and stores consecutive columns of C).
    A is kept k-major in shared memory (``As[k][m]``) so the inner loop reads one word per row.
    """
    p, epilogue, threads, item, smem = r.problem, r.epilogue, r.threads, r.item, r.smem
    tm, tn, tk = r.tile
    rm, rn = _micro_tile(tm, tn, threads)
    tx_count, ty_count = tn // rn, tm // rm
    sa, sb = _operand_stages(p, tm, tn, tk, threads)
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
        _staged_k_loop(p, sa, sb, r.load_a, r.load_b, f"As[c * {lda} + r]", f"Bs[r * {ldb} + c]", lambda v: v,
                         m_guard, n_guard, k_guard, compute),
        "// epilogue: each thread hands its accumulators to the caller's code",
        epi,
    )
    items = _tile_items(p, tm, tn)
    params = {"tile": (tm, tn, tk), "micro_tile": (rm, rn), "thread_grid": (ty_count, tx_count),
              "a_fast": sa.fast, "b_fast": sb.fast}
    return GemmCode("simt", "{\n" + indent(body) + "\n}", items, shared, threads, False, params)
