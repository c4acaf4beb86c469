"""The pipelined wgmma GEMM: operands copied global -> shared by ``cp.async`` or by the bulk tensor copy
engine (TMA, completing on mbarriers), optionally in 2-CTA clusters sharing the B tile by multicast."""

from __future__ import annotations

from collections.abc import Callable

from ..target import GemmProblem, cluster_pairs
from .gemm_epilogue import WGMMA_EPILOGUE_BATCH, _epilogue_prefetch, _vector_tile, _wgmma_store_c
from .gemm_split_k import _split_final_code, _split_final_params
from .gemm_tile import (
    Epilogue,
    GemmCode,
    LoadA,
    LoadB,
    PtrA,
    PtrB,
    SplitFinal,
    TmaMap,
    _align,
    _guard,
    _tile_header,
    ceil_div,
)
from .gemm_wgmma import (
    _WGMMA,
    DEFAULT_KNOBS,
    SWIZZLE_ROW,
    WGMMA_C_PAD,
    WGMMA_CLUSTER_SLACK,
    WGMMA_MAX_STAGES,
    WgmmaKnobs,
    wgmma_stages,
)
from .text import block, indent


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
                     knobs: WgmmaKnobs = DEFAULT_KNOBS) -> GemmCode | None:
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
    k_steps = ceil_div(ceil_div(p.k, tk), split)
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
    items = p.batch * ceil_div(p.m, tm) * ceil_div(p.n, tn) * split
    params = {"tile": (tm, tn, tk), "warpgroups": (wgm, wgn), "instruction": f"m64n{wn}k{fk}",
              **({"epilogue_prefetch": len(epilogue_reads)} if prefetch else {}),
              "epilogue_batch": WGMMA_EPILOGUE_BATCH, **(vec.params() if vec is not None else {}),
              "swizzle": "128B", "stages": stages, "copies": "tma" if use_tma else "cp.async", "layouts": layouts,
              "split_k": split, "mma_in_flight": lag, **_split_final_params(split_final, split),
              **({"cluster": 2 if paired else f"1 ({unpaired})"} if cluster != 1 else {})}
    return GemmCode(variant, "{\n" + indent(body) + "\n}", items, shared, threads, True, params, use_tma,
                    cluster=2 if paired else 1)
