"""The wmma GEMM emitters (sm_80+): 16x16x16 bf16/fp16 or 16x16x8 tf32 fragments, fp32 accumulators.
Specs: ``tkx.target`` ``wmma_bf16``, ``wmma_f16``, ``wmma_tf32``."""

from __future__ import annotations

from .gemm_registry import GemmRequest, register_gemm
from .gemm_tile import GemmCode, _align, _epilogue_block, _operand_stages, _staged_k_loop, _tile_header, _tile_items
from .text import block, indent

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


@register_gemm(*_WMMA)
def wmma_gemm(r: GemmRequest) -> GemmCode:
    """(b) bf16/fp16 and (c) tf32 tensor-core GEMM through ``nvcuda::wmma``, fp32 accumulators.

    Operand tiles are converted to the fragment type while staged into shared memory (exact
    for bf16/fp16 data; tf32 rounds fp32 data as ``torch.backends.cuda.matmul.allow_tf32``
    does). Each shared tile keeps the operand's memory order (``row_major`` or ``col_major``
    fragments), so transposed views load coalesced. After the k loop each warp passes its
    accumulator fragments, one at a time, through its own 16x16 staging area in shared memory
    (which reuses the operand tiles' bytes) so that the epilogue runs per element (16 lanes on
    consecutive columns, two rows of C per step), without a whole-tile C buffer.
    """
    variant, p, epilogue, threads, item, smem = r.variant, r.problem, r.epilogue, r.threads, r.item, r.smem
    if variant not in _WMMA:
        raise ValueError(f"unknown tensor-core variant {variant!r}; one of {sorted(_WMMA)}")
    elem, fk, frag_t, conv, ebytes = _WMMA[variant]
    tm, tn, tk = r.tile
    if tm % 16 or tn % 16 or tk % fk or threads % 32:
        raise ValueError(f"{variant} needs tiles in multiples of 16x16x{fk} and whole warps")
    warps = threads // 32
    fm, fn = tm // 16, tn // 16
    wm, wn = _warp_grid(fm, fn, warps)
    pm, pn = fm // wm, fn // wn  # fragments per warp
    sa, sb = _operand_stages(p, tm, tn, tk, threads)
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
        _staged_k_loop(p, sa, sb, r.load_a, r.load_b, a_slot, b_slot, conv.format, m_guard, n_guard, k_guard,
                       compute),
        "// epilogue: each fragment goes through the warp's staging area, then element by element",
        epi,
        "__syncthreads();  // every warp is done with its staging area before the next item reuses it",
    )
    items = _tile_items(p, tm, tn)
    params = {"tile": (tm, tn, tk), "warp_grid": (wm, wn), "fragments_per_warp": (pm, pn),
              "a_layout": a_layout.split("::")[1], "b_layout": b_layout.split("::")[1]}
    return GemmCode(variant, "{\n" + indent(body) + "\n}", items, shared, threads, True, params)
