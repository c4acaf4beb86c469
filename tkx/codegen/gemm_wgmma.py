"""Hopper warpgroup MMA (sm_90a): the instruction table, the 128-byte swizzle, the pipeline depth, the
switches (:class:`WgmmaKnobs`) and the register-staged wgmma emitter used when operands are not copied
directly (:func:`wgmma_staged`). The cp.async / TMA pipelined variant is :mod:`tkx.codegen.gemm_tma`.
Specs: ``tkx.target`` ``wgmma_bf16``, ``wgmma_f16``, ``wgmma_tf32``."""

from __future__ import annotations

from ..target import GemmProblem
from .gemm_epilogue import _vector_tile, _wgmma_store_c
from .gemm_split_k import _split_final_code, _split_final_params
from .gemm_tile import (  # noqa: F401 - DEFAULT_KNOBS and WgmmaKnobs: the module's names
    DEFAULT_KNOBS,
    Epilogue,
    GemmCode,
    LoadA,
    LoadB,
    PtrA,
    PtrB,
    SplitFinal,
    WgmmaKnobs,
    _fetch_and_stash,
    _guard,
    _operand_stages,
    _tile_header,
    _tile_items,
)
from .text import block, indent

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


#: 2-CTA clusters (``Options.gemm_cluster``): k-tiles between a CTA's release of a stage (its
#: warpgroups are done with it) and the refill that waits for both CTAs' releases; each costs one k-tile
#: in flight. 0 puts the wait for the partner right after this CTA's own release. Measured on the H200
#: (cluster-scope handshake): medium's 256x4096x1024 GEMM 15.2 / 14.4 / 14.3 µs with slack
#: 0 / 1 / 2 (unpaired 8.7): the wait is not what makes the paired kernel slow.
WGMMA_CLUSTER_SLACK = 1


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


def wgmma_staged(p: GemmProblem, load_a: LoadA, load_b: LoadB, epilogue: Epilogue, *, variant: str, tm: int,
                 tn: int, wn: int, threads: int, item: str, smem: str, ptr_a: PtrA | None, ptr_b: PtrB | None,
                 split: int, split_final: SplitFinal | None, knobs: WgmmaKnobs) -> GemmCode:
    """The wgmma GEMM with operand tiles staged through registers (any view, converted on the fly) into two
    swizzled shared stages: the body of :func:`tkx.codegen.gemm.wgmma_gemm` when the pipelined copies
    (:func:`tkx.codegen.gemm_tma.wgmma_pipelined`) do not apply. ``wn``: columns per warpgroup."""
    elem, fk, ptx_type, conv, ebytes = _WGMMA[variant]
    tk = SWIZZLE_ROW // ebytes
    wgm = tm // 64
    wgn = threads // 128 // wgm
    sa, sb = _operand_stages(p, tm, tn, tk, threads)
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
    items = _tile_items(p, tm, tn, split)
    params = {"tile": (tm, tn, tk), "warpgroups": (wgm, wgn), "instruction": f"m64n{wn}k{fk}",
              "swizzle": "128B", "stages": 2, "vector_loads": vec is not None, "split_k": split,
              **(vtile.params() if vtile is not None else {}),
              **_split_final_params(split_final, split)}
    return GemmCode(variant, "{\n" + indent(body) + "\n}", items, shared, threads, True, params)


# --------------------------------------------------------------------------------------
# Choosing
# --------------------------------------------------------------------------------------
