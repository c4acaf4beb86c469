"""The pipelined wgmma GEMM: operands copied global -> shared by ``cp.async`` or by the bulk tensor copy
engine (TMA, completing on mbarriers), optionally in 2-CTA clusters sharing the B tile by multicast."""

from __future__ import annotations

from dataclasses import dataclass

from ..target import cluster_pairs
from .gemm_epilogue import WGMMA_EPILOGUE_BATCH, _epilogue_prefetch, _vector_tile, _wgmma_store_c
from .gemm_registry import GemmRequest, register_gemm
from .gemm_split_k import _split_final_code, _split_final_params
from .gemm_tile import (
    GemmCode,
    _align,
    _guard,
    _tile_header,
    _tile_items,
    ceil_div,
)
from .gemm_wgmma import (
    _WGMMA,
    SWIZZLE_ROW,
    WGMMA_C_PAD,
    WGMMA_CLUSTER_SLACK,
    WGMMA_MAX_STAGES,
    WgmmaKnobs,
    wgmma_staged,
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


@dataclass(frozen=True)
class _Pipeline:
    """The geometry of one pipelined wgmma GEMM (:func:`_pipeline_of`): tiles, warpgroups, operand
    layouts, stage bytes and depth, the copy engine and the 2-CTA pairing."""

    tm: int
    tn: int
    tk: int
    fk: int
    ptx_type: str
    conv: str
    wgm: int
    wgn: int
    wn: int
    a_kmajor: bool
    b_kmajor: bool
    a_bytes: int
    stage_bytes: int
    stages: int
    lag: int  # wgmma groups left in flight (each holds a stage)
    ahead: int  # k-tiles whose copies are issued before the first is consumed
    ldc: int
    bar_offset: int
    bar_room: int
    map_a: int | None
    map_b: int | None
    paired: bool
    unpaired: str | None
    m_guard: bool
    n_guard: bool
    k_guard: bool

    @property
    def use_tma(self) -> bool:
        return self.map_a is not None and self.map_b is not None

    @property
    def atom_stride(self) -> int:
        """Bytes between MN atoms of an MN-major tile."""
        return (self.tk // 8) * 1024

    @property
    def freed(self) -> str:
        """The k-tile whose stage the refill of k-tile ``kt`` reuses."""
        return "kt - 1" if self.lag == 0 else f"kt - {self.lag + 1}"

    @property
    def acc_regs(self) -> int:
        return self.wn // 2


def _pipeline_of(r: GemmRequest) -> _Pipeline | None:
    """The pipeline of ``r``, or ``None`` when direct copies do not apply (see :func:`wgmma_gemm`); registers
    the TMA boxes' tensor maps through ``r.tma_a`` / ``r.tma_b``."""
    p, (tm, tn, tk), threads = r.problem, r.tile, r.threads
    elem, fk, ptx_type, conv, ebytes = _WGMMA[r.variant]
    if r.ptr_a is None or r.ptr_b is None or ebytes != 2 or tk * ebytes != SWIZZLE_ROW:
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
    map_a = map_b = None
    if r.cluster not in (1, 2):
        raise ValueError(f"cluster={r.cluster}: the wgmma GEMM pairs items in clusters of 2 CTAs or none (1)")
    tma_ok = r.tma_a is not None and r.tma_b is not None and p.batch == 1
    unpaired = None if r.cluster == 1 else (cluster_pairs(p, tm, tn, r.split, b_kmajor) if tma_ok else
                                            "its operands are not copied with TMA")
    paired = r.cluster == 2 and unpaired is None
    if tma_ok:
        assert r.tma_a is not None and r.tma_b is not None
        # boxes (inner, outer): a K-major tile is one box of TK x rows; an MN-major one a box of 64 x TK
        # per 64 rows (one swizzle atom column each); in a 2-CTA cluster a K-major B is copied in halves
        map_a = r.tma_a(tk, tm) if a_kmajor else r.tma_a(64, tk)
        map_b = r.tma_b(tk, tn // 2 if paired else tn) if b_kmajor else r.tma_b(64, tk)
    use_tma = map_a is not None and map_b is not None
    k_steps = ceil_div(ceil_div(p.k, tk), r.split)
    ldc = tn + WGMMA_C_PAD
    bar_room = (16 if paired else 8) * WGMMA_MAX_STAGES if use_tma else 0
    stages = wgmma_stages(stage_bytes, k_steps, None if r.shared_budget is None else r.shared_budget - bar_room,
                          r.knobs.in_flight)
    lag = max(0, min(r.knobs.in_flight, stages - 2))
    return _Pipeline(tm, tn, tk, fk, ptx_type, conv, wgm, wgn, wn, a_kmajor, b_kmajor, a_bytes, stage_bytes,
                     stages, lag, stages - 1 - lag, ldc, _align(max(stages * stage_bytes, tm * ldc * 4), 8),
                     bar_room, map_a, map_b, paired, unpaired, p.m % tm != 0, p.n % tn != 0, p.k % tk != 0)


def _cp_async_operand(r: GemmRequest, g: _Pipeline, name: str) -> str:
    """The cp.async copy of operand ``name`` ("a" or "b") of the k-tile at ``k0`` into ``stage``: 16 bytes per
    request when ``vec_ok``, else element loads packed into the same 16-byte stores."""
    per, tk, threads = 8, g.tk, r.threads
    p = r.problem
    bits = f"__{'bfloat16' if p.dtype == 'bfloat16' else 'half'}_as_ushort"
    if name == "a":
        rows, kmajor, bound, origin, guard_r, region = g.tm, g.a_kmajor, "M", "row0", g.m_guard, 0
        ptr, elem_of = (lambda r_, k: r.ptr_a("bat", r_, k)), (lambda r_, k: r.load_a("bat", r_, k))
    else:
        rows, kmajor, bound, origin, guard_r, region = g.tn, g.b_kmajor, "N", "col0", g.n_guard, g.a_bytes
        ptr, elem_of = (lambda r_, k: r.ptr_b("bat", k, r_)), (lambda r_, k: r.load_b("bat", k, r_))
    n_per = rows * tk // per // threads
    if kmajor:
        coords = f"const int e = threadIdx.x + l * {threads}, r = e / {tk // per}, c = (e % {tk // per}) * {per};"
        offset = "r * 128 + ((((c >> 3) ^ (r & 7))) << 4)"
        elems = [elem_of(f"({origin} + r)", f"(k0 + c + {j})") for j in range(per)]
    else:
        coords = (f"const int e = threadIdx.x + l * {threads}, c = e / {rows // per}, "
                  f"r = (e % {rows // per}) * {per};")
        offset = (f"(r >> 6) * {g.atom_stride} + (c >> 3) * 1024 + (c & 7) * 128 + "
                  "((((r >> 3) & 7) ^ (c & 7)) << 4)")
        elems = [elem_of(f"({origin} + r + {j})", "(k0 + c)") for j in range(per)]
    cond = _guard((f"{origin} + r < {bound}", guard_r), ("k0 + c < K", g.k_guard)) or "true"
    packed = [f"{bits}({g.conv.format(x)})" for x in elems]
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


def _mma_step(g: _Pipeline) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(mma_issue, mma_step)``: one landed k-tile through the tensor cores, and the end of the k loop
    (the wait for the MMAs left in flight), shared by the cp.async and TMA pipelines."""
    a_step, b_step = (32 if g.a_kmajor else 2048), (32 if g.b_kmajor else 2048)
    a_wg = "wr * 64 * 128" if g.a_kmajor else f"wr * {g.atom_stride}"
    b_wg = f"wc * {g.wn} * 128" if g.b_kmajor else f"wc * {g.wn // 64 * g.atom_stride}"
    regs = g.acc_regs
    dlist = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    mma = (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
           f'wgmma.mma_async.sync.aligned.m64n{g.wn}k{g.fk}.f32.{g.ptx_type}.{g.ptx_type} '
           f'{{{dlist}}}, %{regs}, %{regs + 1}, p, 1, 1, {0 if g.a_kmajor else 1}, {0 if g.b_kmajor else 1};\\n}}\\n"\n'
           f'    : {outs}\n'
           f'    : "l"(da), "l"(db), "r"(1));')
    mma_issue = (
        f"    const unsigned st = stage0 + (kt % {g.stages}) * {g.stage_bytes};",
        '    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");',
        "    #pragma unroll",
        f"    for (int ks = 0; ks < {g.tk // g.fk}; ++ks) {{",
        f"        const unsigned long long da = desc(st + {a_wg} + ks * {a_step}, {int(g.a_kmajor)});",
        f"        const unsigned long long db = desc(st + {g.a_bytes} + {b_wg} + ks * {b_step}, {int(g.b_kmajor)});",
        indent(mma, 2),
        "    }",
        '    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");',
    )
    acc_fence = ("#pragma unroll  // the accumulators are final only after the wait",
                 f'for (int i = 0; i < {regs}; ++i) asm volatile("" : "+f"(d[i]) :: "memory");')
    if g.lag == 0:
        return mma_issue, (*mma_issue, '    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");',
                           *("    " + x.split("  //")[0] for x in acc_fence), "}")
    # k-tile kt's MMAs are issued before the wait for k-tile kt - 1's: the tensor cores always have a
    # queued group while the warps pass the barrier, wait for the next tile and issue its copies
    return mma_issue, (f'    asm volatile("wgmma.wait_group.sync.aligned {g.lag};\\n" ::: "memory");  '
                       f"// k-tile kt - {g.lag}'s MMAs are done: its stage is free after the next barrier",
                       "}",
                       'asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");', *acc_fence)


def _steps(g: _Pipeline, mma: tuple[tuple[str, ...], tuple[str, ...]], refill: tuple[str, ...]) -> tuple[str, ...]:
    """The body of the k loop after the wait: the refill, then the MMAs (with MMAs left in flight, this
    k-tile's MMAs are issued before the refill)."""
    mma_issue, mma_step = mma
    return (*refill, *mma_step) if g.lag == 0 else (*mma_issue, *refill, *mma_step)


def _cp_async_pipeline(r: GemmRequest, g: _Pipeline, mma: tuple[tuple[str, ...], tuple[str, ...]]
                       ) -> tuple[list[str], str, list[str]]:
    """``(issue_fn, k_loop, copy_setup)`` of the cp.async pipeline: every thread copies its share of each
    k-tile, ``ahead`` k-tiles in flight."""
    ahead, stages = g.ahead, g.stages
    checks = " && ".join(f"(((unsigned long long){q}) & 15ULL) == 0" for q in (r.ptr_a("bat", "0", "0"),
                                                                            r.ptr_b("bat", "0", "0")))
    cp_refill = (f"    if (k0 + {ahead} * TK < k_end) issue((kt + {ahead}) % {stages}, k0 + {ahead} * TK);"
                 f"  // into the stage k-tile {g.freed} used",
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
        f"    __syncthreads();  // ... for every thread; and every warpgroup is done with k-tile {g.freed}",
        *_steps(g, mma, cp_refill),
        'asm volatile("cp.async.wait_group 0;\\n" ::: "memory");',
        "__syncthreads();  // every warpgroup's MMAs are done before the C tile reuses the stages",
    )
    issue_fn = [
        "auto issue = [&](int s, int k0) {  // the k-tile at k0 -> stage s",
        f"    const unsigned stage = stage0 + s * {g.stage_bytes};",
        indent(_cp_async_operand(r, g, "a")),
        indent(_cp_async_operand(r, g, "b")),
        "};",
    ]
    return issue_fn, k_loop, [f"const bool vec_ok = {checks};  // 16-byte aligned operands: cp.async, else "
                              "element loads"]


def _tma_boxes(g: _Pipeline, name: str) -> list[str]:
    """The bulk tensor copies of operand ``name``'s k-tile at ``k0`` into ``stage`` (one box when K-major,
    one per 64 rows when MN-major), completing on ``bar``."""
    rows, kmajor, origin, region = (g.tm, g.a_kmajor, "row0", 0) if name == "a" else \
        (g.tn, g.b_kmajor, "col0", g.a_bytes)
    if kmajor:  # one box: TK (inner, K) x rows (outer)
        return [f"tkx_tma2d(stage + {region}, tma_{name}, k0, {origin}, bar);"]
    return [f"tkx_tma2d(stage + {region + j * g.atom_stride}, tma_{name}, {origin} + {64 * j}, k0, bar);"
            for j in range(rows // 64)]


def _tma_pipeline(r: GemmRequest, g: _Pipeline, mma: tuple[tuple[str, ...], tuple[str, ...]], tmaps: str
                  ) -> tuple[list[str], str, list[str]]:
    """``(issue_fn, k_loop, copy_setup)`` of the TMA pipeline: thread 0 copies each k-tile with the bulk
    tensor copy engine, each stage completing on its own mbarrier (in a 2-CTA cluster,
    :func:`_cluster_pipeline`)."""
    ahead, stages = g.ahead, g.stages
    if g.paired:
        issue_fn, _, k_loop, copy_setup = _cluster_pipeline(
            tm=g.tm, tn=g.tn, stages=stages, stage_bytes=g.stage_bytes, a_bytes=g.a_bytes, ahead=ahead,
            freed=g.freed, lag=g.lag, a_kmajor=g.a_kmajor, b_kmajor=g.b_kmajor, atom_stride=g.atom_stride,
            bar_offset=g.bar_offset, tmaps=tmaps, map_a=g.map_a, map_b=g.map_b, a_boxes=_tma_boxes(g, "a"),
            mma_issue=mma[0], mma_step=mma[1], knobs=r.knobs)
        return issue_fn, k_loop, copy_setup
    issue_fn = [
        "auto issue = [&](int s, int k0) {  // thread 0: the k-tile at k0 -> stage s, completing on mbarrier s",
        f"    const unsigned stage = stage0 + s * {g.stage_bytes}, bar = bar0 + 8 * s;",
        '    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n" :: "r"(bar), '
        f'"r"({g.stage_bytes}) : "memory");',
        *("    " + x for x in _tma_boxes(g, "a")),
        *("    " + x for x in _tma_boxes(g, "b")),
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
        f"    __syncthreads();  // every warpgroup is done with k-tile {g.freed}: its stage may be refilled",
        *_steps(g, mma, tma_refill),
        "__syncthreads();  // every warpgroup's MMAs are done before the C tile reuses the stages",
    )
    copy_setup = [
        f"const unsigned bar0 = stage0 + {g.bar_offset};  // {stages} mbarriers of 8 bytes, past the stages and C",
        f"const unsigned long long tma_a = (unsigned long long)({tmaps} + {g.map_a * 128}), "
        f"tma_b = (unsigned long long)({tmaps} + {g.map_b * 128});  // tensor maps {g.map_a}, {g.map_b}",
    ]
    return issue_fn, k_loop, copy_setup


def _desc_expr(g: _Pipeline, kmajor: bool) -> str:
    """C expression of a wgmma shared-memory matrix descriptor of the tile at address ``a``."""
    lbo, sbo = (16, 1024) if kmajor else (g.atom_stride, 1024)
    return (f"(((unsigned long long)(a) & 0x3FFFFULL) >> 4) | ({lbo >> 4}ULL << 16) | ({sbo >> 4}ULL << 32) "
            "| (1ULL << 62)")


def _wgmma_pipelined(r: GemmRequest, tmaps: str = "tmaps") -> GemmCode | None:
    """The wgmma GEMM with operands copied global -> shared by ``cp.async`` (16 bytes at a time, no
    registers), :func:`wgmma_stages` stages deep; ``None`` when it does not apply (see :func:`wgmma_gemm`).
    Each warpgroup leaves ``knobs.in_flight`` k-tiles' MMAs in flight (``wgmma.wait_group``)
    while it waits for the next k-tile and issues the copies into the stage freed before them.

    Each operand tile keeps the memory order of its operand: K-major (A row-major, B given as
    B^T) or MN-major (A transposed, B row-major; the MMA reads it with its transpose flag), both
    in the 128-byte swizzle. K-major: tile row r (an M or N index) is 128 bytes of K, 16-byte chunk
    c at chunk ``c ^ (r % 8)``. MN-major: atoms of 64 M/N indices x 8 k (1024 bytes), k-row kr of
    an atom is 128 bytes of M/N with chunk c at ``c ^ (kr % 8)``; atoms run along K first.

    With ``r.tma_a`` and ``r.tma_b`` (callbacks registering a tensor map of the operand for a box of
    (inner, outer) elements and returning its index, or ``None``), thread 0 copies each k-tile with
    the bulk tensor copy engine instead (``cp.async.bulk.tensor.2d``, one request per operand
    box, the engine writing the 128-byte swizzle itself and zero-filling outside the matrix), each
    stage completing on its own ``mbarrier`` (``expect_tx`` of the stage's bytes; consumers wait
    on the phase parity of the fill). The maps are read from the kernel parameter ``tmaps``.
    """
    g = _pipeline_of(r)
    if g is None:
        return None
    p, tm, tn, tk, threads, split = r.problem, g.tm, g.tn, g.tk, r.threads, r.split
    mma = _mma_step(g)
    issue_fn, k_loop, copy_setup = _tma_pipeline(r, g, mma, tmaps) if g.use_tma else _cp_async_pipeline(r, g, mma)
    swz = r.knobs.epilogue_vector
    vec = _vector_tile(r.epilogue, tm, tn, threads, g.ldc, g.m_guard, g.n_guard, split == 1, swz)
    epi = _wgmma_store_c("ws", g.acc_regs, g.wn, g.ldc, tm, tn, threads, r.epilogue, g.m_guard, g.n_guard,
                         _split_final_code(r.split_final, p, split, tm, tn, g.ldc, threads, g.m_guard, g.n_guard,
                                           swz), vec, vector=swz)
    prefetch = (_epilogue_prefetch(r.epilogue_reads if split == 1 else (), p, tm, tn, threads,
                                   g.m_guard or g.n_guard) if r.knobs.epilogue_prefetch else [])
    what = {"wgmma_bf16": "bf16", "wgmma_f16": "fp16"}[r.variant]
    layouts = f"A {'K' if g.a_kmajor else 'M'}-major, B {'K' if g.b_kmajor else 'N'}-major"
    copies = "TMA (cp.async.bulk.tensor) + mbarriers" if g.use_tma else "cp.async"
    body = block(
        _tile_header(p, tm, tn, r.item, f"tensor-core GEMM ({what} wgmma m64n{g.wn}k{g.fk}, fp32 accumulate), one "
                     f"{tm}x{tn} tile of C; {g.wgm}x{g.wgn} warpgroups of 64x{g.wn}; {copies}, {g.stages} stages, "
                     f"{layouts}" + ("; 2-CTA cluster, B multicast" if g.paired else ""), split, tk, True,
                     pairs=g.paired),
        f"constexpr int TM = {tm}, TN = {tn}, TK = {tk};",
        f"unsigned char* ws = {r.smem} + ((1024u - ((unsigned)__cvta_generic_to_shared({r.smem}) & 1023u)) & 1023u);"
        "  // swizzle atoms start on 1024 bytes",
        "const unsigned stage0 = (unsigned)__cvta_generic_to_shared(ws);  // stage s: A tile then B tile, "
        f"{g.stage_bytes} bytes",
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;",
        f"const int wr = (warp / 4) / {g.wgn}, wc = (warp / 4) % {g.wgn};  // this warpgroup's block of C",
        *copy_setup,
        "auto desc = [](unsigned a, int kmajor) -> unsigned long long {  // wgmma shared-memory descriptor",
        f"    return kmajor ? ({_desc_expr(g, True)}) : ({_desc_expr(g, False)});",
        "};",
        *issue_fn,
        f"float d[{g.acc_regs}];  // accumulators of this thread (m64n{g.wn} fragment)",
        "#pragma unroll",
        f"for (int j = 0; j < {g.acc_regs}; ++j) d[j] = 0.0f;",
        *prefetch,
        *(vec.early_lines() if vec is not None else []),
        k_loop,
        "// epilogue: accumulators -> shared C tile -> per element",
        epi,
    )
    items = _tile_items(p, tm, tn, split)
    params = {"tile": (tm, tn, tk), "warpgroups": (g.wgm, g.wgn), "instruction": f"m64n{g.wn}k{g.fk}",
              **({"epilogue_prefetch": len(r.epilogue_reads)} if prefetch else {}),
              "epilogue_batch": WGMMA_EPILOGUE_BATCH, **(vec.params() if vec is not None else {}),
              "swizzle": "128B", "stages": g.stages, "copies": "tma" if g.use_tma else "cp.async",
              "layouts": layouts, "split_k": split, "mma_in_flight": g.lag,
              **_split_final_params(r.split_final, split),
              **({"cluster": 2 if g.paired else f"1 ({g.unpaired})"} if r.cluster != 1 else {})}
    return GemmCode(r.variant, "{\n" + indent(body) + "\n}", items, g.bar_offset + g.bar_room + 1024, threads, True,
                    params, g.use_tma, cluster=2 if g.paired else 1)


@register_gemm(*_WGMMA)
def wgmma_gemm(r: GemmRequest) -> GemmCode:
    """(e) Hopper warpgroup MMA (``wgmma.mma_async``, sm_90a only), fp32 accumulators in registers.

    The block's ``threads / 128`` warpgroups are arranged WGM x WGN over the ``tile_m x tile_n``
    tile; each owns a 64 x (tile_n / WGN) block of C and issues one m64nNk16 (bf16/fp16) or
    m64nNk8 (tf32) instruction per K step. With pointers to the operands (``r.ptr_a``, ``r.ptr_b``) of a
    2-byte dtype, the operands are copied global -> shared directly (:func:`_wgmma_pipelined`: cp.async, or
    TMA with ``r.tma_a`` / ``r.tma_b``). Otherwise operand tiles are fetched from global memory into
    registers through the load callbacks (any view, transposed or computed on the fly), converted,
    and stored K-major into shared memory in the 128-byte swizzle layout that the tensor cores read
    through matrix descriptors: row r (an M index of A, an N index of B) is 128 bytes of K, and
    16-byte chunk c of row r sits at chunk ``c ^ (r % 8)``. ``tile_k`` is one swizzle row (64 bf16
    or 32 tf32). Two shared stages: the next K tile's global loads and its store into the other
    stage overlap the asynchronous MMAs of this one (:func:`tkx.codegen.gemm_wgmma.wgmma_staged`). After the
    K loop every warpgroup writes its accumulators to a padded fp32 tile in shared memory (reusing the
    operand bytes) and the whole block runs the epilogue per element, consecutive threads on consecutive
    columns (with ``knobs.epilogue_vector``: runs of 8 or 4 columns per thread, 16-byte point reads and
    stores). Raises :class:`ValueError` for tiles the warpgroups cannot cover.
    """
    variant, threads, (tm, tn, tk) = r.variant, r.threads, r.tile
    if variant not in _WGMMA:
        raise ValueError(f"unknown wgmma variant {variant!r}; one of {sorted(_WGMMA)}")
    ebytes = _WGMMA[variant][4]
    if threads % 128:
        raise ValueError(f"{variant} needs whole warpgroups (threads a multiple of 128), got {threads}")
    if tk * ebytes != SWIZZLE_ROW:
        raise ValueError(f"{variant} stages K in rows of {SWIZZLE_ROW} bytes: tile_k must be "
                         f"{SWIZZLE_ROW // ebytes}, got {tk}")
    groups = threads // 128
    if tm % 64 or (tm // 64) > groups or groups % (tm // 64):
        raise ValueError(f"{variant}: tile_m={tm} must be 64 x a divisor of the {groups} warpgroup(s)")
    wgn = groups // (tm // 64)
    wn = tn // wgn
    if tn % wgn or wn % 8 or not 8 <= wn <= 256:
        raise ValueError(f"{variant}: tile_n={tn} over {wgn} warpgroup column(s) must give 8 to 256 "
                         "columns each, a multiple of 8")
    piped = _wgmma_pipelined(r)
    if piped is not None:
        return piped
    return wgmma_staged(r.problem, r.load_a, r.load_b, r.epilogue, variant=variant, tm=tm, tn=tn, wn=wn,
                        threads=threads, item=r.item, smem=r.smem, ptr_a=r.ptr_a, ptr_b=r.ptr_b, split=r.split,
                        split_final=r.split_final, knobs=r.knobs)
