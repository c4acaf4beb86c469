"""The fused attention emitter (FlashAttention scheme, plain CUDA, fp32 shared-memory tiles).

Forward (``flash_fwd``), one work item per (batch, query tile of ``tile_q`` rows): the query tile
is staged once; for each key tile (causal: only the tiles at or left of the diagonal) the block
computes the scaled, masked scores ``S`` into shared memory, then one warp per row updates the
running maximum ``m`` and sum ``l`` (the online softmax) and turns ``S`` into ``exp(S - m)``,
and each thread rescales its accumulator entries by ``exp(m_old - m)`` before adding ``P @ V``.
It writes ``out = acc / l`` and ``lse = m + log(l)`` into the packed float32 root ``[out | lse]``. With a
mask, a row that sees no key has ``l = 0``: its output is 0 (as torch's SDPA; ``lse = -inf``), or NaN for
attention written by hand (``zero_empty_rows=False``, the plain softmax's 0/0, as eager).

Backward (``flash_bwd``), no atomics: work items ``[0, B*KT)`` each own one key tile and loop over
the query tiles (``dv += P^T dO``, ``dk += dS^T Q``), items ``[B*KT, B*KT + B*QT)`` each own one
query tile and loop over the key tiles (``dq += dS K``); ``P = exp(S - lse)`` is recomputed per
tile from q, k and the saved lse, ``dS = P * (dO V^T - rowsum(dO * out))`` (the row sum in the
order of ``dO V^T``, so that a row whose weight is all on one key gets ``dS = 0`` exactly, as eager's
``rowsum(P * dP)``). Both kinds of items sum in a fixed order, so the kernel gives the same bits on
every run. The packed float32 root is ``[dq | dk | dv]``.

Every accumulator entry stays in the register of one thread for the whole loop
(``ceil(tile * dim / threads)`` floats each); the emitter reports the shared bytes it carves from
the block's workspace (``tkx_smem``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..dtypes import literal
from ..target import ATTENTION_EMITTER, AttentionPlan, ceil_div, decode_partials_layout
from .text import block, indent

#: ``(batch, row, col) -> C float expression`` of one operand element.
Loader = Callable[[str, str, str], str]


@dataclass(frozen=True)
class AttentionCode:
    """Code of one work item ``item``, the number of work items and the shared bytes it needs."""

    code: str
    work_items: int
    shared_bytes: int



def _zeros(name: str, n: int) -> list[str]:
    """C lines declaring the fp32 register array ``name[n]`` set to zero."""
    return [f"float {name}[{n}];", "#pragma unroll", f"for (int u = 0; u < {n}; ++u) {name}[u] = 0.0f;"]


def _key_value_tiles(bk: int, e: int, ev: int, lk: int, ld_k: Callable[[str, str, str], str],
                     ld_v: Callable[[str, str, str], str], t: int) -> list[str]:
    """The key tile ``sK`` (``bk x e``) and value tile ``sV`` (``bk x ev``) of batch ``b`` from key ``k0``
    into shared memory (:func:`_stage`)."""
    return [_stage("sK", bk, e, "k0", lk, lambda r, c: ld_k("b", r, c), t),
            _stage("sV", bk, ev, "k0", lk, lambda r, c: ld_v("b", r, c), t)]


def _stage(dst: str, rows: int, cols: int, row0: str, limit: int, load: Callable[[str, str], str], t: int) -> str:
    """Copy ``rows x cols`` elements (rows ``row0 + i`` below ``limit``, zeros beyond) into ``dst``."""
    return (f"for (int t = threadIdx.x; t < {rows * cols}; t += {t}) {{ const int i = t / {cols}, e = t % {cols}; "
            f"const int r = {row0} + i; {dst}[t] = r < {limit} ? {load('r', 'e')} : 0.0f; }}")


def _score(plan: AttentionPlan, ld_mask: Loader | None, qs: str, ks: str) -> list[str]:
    """Statements leaving the scaled, masked score of (row ``r``, key ``c``, tile entries ``i``, ``j``)
    in ``s`` (``-TKX_INF`` where masked or outside)."""
    e = plan.head_dim
    valid = f"r < {plan.q_len} && c < {plan.kv_len}" + (" && c <= r" if plan.causal else "")
    lines = ["float s = -TKX_INF;", f"if ({valid}) {{",
             "    float d = 0.0f;",
             "    #pragma unroll 8",
             f"    for (int e = 0; e < {e}; ++e) d = fmaf({qs}[i * {e} + e], {ks}[j * {e} + e], d);",
             f"    s = d * {literal(plan_scale(plan))};"]
    if plan.mask == "bool":
        assert ld_mask is not None
        lines.append(f"    if ({ld_mask('b', 'r', 'c')} == 0.0f) s = -TKX_INF;")
    elif plan.mask == "additive":
        assert ld_mask is not None
        lines.append(f"    s += {ld_mask('b', 'r', 'c')};")
    lines.append("}")
    return lines


def plan_scale(plan: AttentionPlan) -> float:
    return float(plan.scale)


def _normalise(plan: AttentionPlan, zero_empty_rows: bool, num: str, den: str) -> str:
    """C expression ``num / den``; 0 where ``den`` is 0 (a row whose keys are all masked) when the plan has a
    mask and ``zero_empty_rows`` (without a mask no row is empty and the test is left out)."""
    if plan.mask == "none" or not zero_empty_rows:
        return f"{num} / {den}"
    return f"({den} == 0.0f ? 0.0f : {num} / {den})"


def forward(plan: AttentionPlan, *, threads: int, ld_q: Loader, ld_k: Loader, ld_v: Loader, ld_mask: Loader | None,
            out: str, name: str, zero_empty_rows: bool = True) -> AttentionCode:
    """The forward work item; ``out`` is the float32 pointer of the packed root ``[out | lse]``. A row that sees
    no key is 0 (``zero_empty_rows``) or NaN."""
    t, bq, bk, e, ev = threads, plan.tile_q, plan.tile_k, plan.head_dim, plan.value_dim
    lq, lk, qt = plan.q_len, plan.kv_len, plan.q_tiles
    nacc = ceil_div(bq * ev, t)
    lse_base = plan.batch * lq * ev
    kend = f"min({lk}, q0 + {bq})" if plan.causal else f"{lk}"
    score = _score(plan, ld_mask, "sQ", "sK")
    normalised = _normalise(plan, zero_empty_rows, "acc[u]", f"sL[t / {ev}]")
    body = block(
        "float* sQ = reinterpret_cast<float*>(tkx_smem);",
        f"float* sK = sQ + {bq * e};",
        f"float* sV = sK + {bk * e};",
        f"float* sS = sV + {bk * ev};",
        f"float* sM = sS + {bq * bk};  // running row maximum",
        f"float* sL = sM + {bq};  // running row sum of exp(s - m)",
        f"float* sA = sL + {bq};  // this tile's rescale factor exp(m_old - m_new)",
        f"const int b = item / {qt}, q0 = (item % {qt}) * {bq};",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        _stage("sQ", bq, e, "q0", lq, lambda r, c: ld_q("b", r, c), t),
        f"for (int i = threadIdx.x; i < {bq}; i += {t}) {{ sM[i] = -TKX_INF; sL[i] = 0.0f; }}",
        *_zeros("acc", nacc),
        f"const int kend = {kend};",
        f"for (int k0 = 0; k0 < kend; k0 += {bk}) {{",
        indent(block(
            "__syncthreads();  // the previous tile's readers are done",
            *_key_value_tiles(bk, e, ev, lk, ld_k, ld_v, t),
            "__syncthreads();",
            f"for (int t = threadIdx.x; t < {bq * bk}; t += {t}) {{",
            indent(block(f"const int i = t / {bk}, j = t % {bk}, r = q0 + i, c = k0 + j;", *score, "sS[t] = s;")),
            "}",
            "__syncthreads();",
            f"for (int i = warp; i < {bq}; i += {t // 32}) {{  // online softmax, one warp per row",
            indent(block(
                "float mx = -TKX_INF;",
                f"for (int j = lane; j < {bk}; j += 32) mx = fmaxf(mx, sS[i * {bk} + j]);",
                "mx = tkx_warp_max(mx);",
                "const float m_old = sM[i], m_new = fmaxf(m_old, mx);",
                "float sum = 0.0f;",
                f"for (int j = lane; j < {bk}; j += 32) {{",
                f"    const float p = m_new == -TKX_INF ? 0.0f : expf(sS[i * {bk} + j] - m_new);",
                f"    sS[i * {bk} + j] = p; sum += p;",
                "}",
                "sum = tkx_warp_sum(sum);",
                "if (lane == 0) {",
                "    const float a = m_new == -TKX_INF ? 1.0f : expf(m_old - m_new);",
                "    sA[i] = a; sL[i] = sL[i] * a + sum; sM[i] = m_new;",
                "}")),
            "}",
            "__syncthreads();",
            "#pragma unroll",
            f"for (int u = 0; u < {nacc}; ++u) {{",
            indent(block(
                f"const int t = threadIdx.x + u * {t};",
                f"if (t < {bq * ev}) {{",
                f"    const int i = t / {ev}, e = t % {ev};",
                "    float o = acc[u] * sA[i];",
                "    #pragma unroll 8",
                f"    for (int j = 0; j < {bk}; ++j) o = fmaf(sS[i * {bk} + j], sV[j * {ev} + e], o);",
                "    acc[u] = o;",
                "}")),
            "}")),
        "}",
        "__syncthreads();",
        "#pragma unroll",
        f"for (int u = 0; u < {nacc}; ++u) {{",
        f"    const int t = threadIdx.x + u * {t};",
        f"    if (t < {bq * ev} && q0 + t / {ev} < {lq})",
        f"        {out}[((long long)b * {lq} + q0 + t / {ev}) * {ev} + t % {ev}] = {normalised};",
        "}",
        f"for (int i = threadIdx.x; i < {bq}; i += {t})",
        f"    if (q0 + i < {lq}) {out}[{lse_base}LL + (long long)b * {lq} + q0 + i] = sM[i] + logf(sL[i]);",
        "__syncthreads();  // the next work item reuses the workspace")
    code = f"{{  // {name}: fused attention forward, query tile {bq} x key tiles of {bk}\n" + indent(body) + "\n}"
    smem = ATTENTION_EMITTER.shared_floats(plan) * 4
    return AttentionCode(code, plan.batch * qt, smem)


def backward(plan: AttentionPlan, *, threads: int, ld_q: Loader, ld_k: Loader, ld_v: Loader, ld_mask: Loader | None,
             ld_out: Loader, ld_lse: Callable[[str, str], str], ld_dout: Loader, grads: str,
             name: str) -> AttentionCode:
    """The backward work items; ``grads`` is the float32 pointer of the packed root ``[dq | dk | dv]``."""
    t, bq, bk, e, ev = threads, plan.tile_q, plan.tile_k, plan.head_dim, plan.value_dim
    lq, lk, qt, kt, nb = plan.q_len, plan.kv_len, plan.q_tiles, plan.k_tiles, plan.batch
    scale = literal(plan_scale(plan))
    dk_base, dv_base = nb * lq * e, nb * lq * e + nb * lk * e
    score = _score(plan, ld_mask, "sQ", "sK")
    prob = block(*score, "const float p = (s == -TKX_INF || sLse[i] == -TKX_INF) ? 0.0f : expf(s - sLse[i]);")

    def rows_of_q(q0: str) -> str:
        """Stage q, dO, lse and delta = rowsum(dO * out) of the query tile starting at ``q0``. One thread
        sums a row in the order of the ``dO V^T`` loop below, so where ``out`` is one value row (one key
        takes all the weight) delta equals that key's ``dp`` bit for bit and ``dS`` is exactly 0, as in eager."""
        return block(
            _stage("sQ", bq, e, q0, lq, lambda r, c: ld_q("b", r, c), t),
            _stage("sDO", bq, ev, q0, lq, lambda r, c: ld_dout("b", r, c), t),
            "__syncthreads();",
            f"for (int i = threadIdx.x; i < {bq}; i += {t}) {{",
            f"    const int r = {q0} + i;",
            "    float d = 0.0f;",
            f"    if (r < {lq}) for (int e = 0; e < {ev}; ++e) "
            f"d = fmaf(sDO[i * {ev} + e], {ld_out('b', 'r', 'e')}, d);",
            f"    sDelta[i] = d; sLse[i] = r < {lq} ? {ld_lse('b', 'r')} : 0.0f;",
            "}")

    nk, nv, nq = ceil_div(bk * e, t), ceil_div(bk * ev, t), ceil_div(bq * e, t)
    carve = block(
        "float* sK = reinterpret_cast<float*>(tkx_smem);",
        f"float* sV = sK + {bk * e};",
        f"float* sQ = sV + {bk * ev};",
        f"float* sDO = sQ + {bq * e};",
        f"float* sP = sDO + {bq * ev};",
        f"float* sDS = sP + {bq * bk};",
        f"float* sLse = sDS + {bq * bk};",
        f"float* sDelta = sLse + {bq};")
    qstart = f"(k0 / {bq}) * {bq}" if plan.causal else "0"
    key_items = block(
        f"const int b = item / {kt}, k0 = (item % {kt}) * {bk};",
        *_key_value_tiles(bk, e, ev, lk, ld_k, ld_v, t),
        f"float dk[{nk}], dv[{nv}];",
        "#pragma unroll",
        f"for (int u = 0; u < {nk}; ++u) dk[u] = 0.0f;",
        "#pragma unroll",
        f"for (int u = 0; u < {nv}; ++u) dv[u] = 0.0f;",
        f"for (int q0 = {qstart}; q0 < {lq}; q0 += {bq}) {{  // every query tile, in order",
        indent(block(
            "__syncthreads();",
            rows_of_q("q0"),
            "__syncthreads();",
            f"for (int t = threadIdx.x; t < {bq * bk}; t += {t}) {{",
            indent(block(f"const int i = t / {bk}, j = t % {bk}, r = q0 + i, c = k0 + j;", prob, "sP[t] = p;")),
            "}",
            "__syncthreads();",
            f"for (int t = threadIdx.x; t < {bq * bk}; t += {t}) {{  // dS = P * (dO V^T - delta)",
            f"    const int i = t / {bk}, j = t % {bk};",
            "    float dp = 0.0f;",
            "    #pragma unroll 8",
            f"    for (int e = 0; e < {ev}; ++e) dp = fmaf(sDO[i * {ev} + e], sV[j * {ev} + e], dp);",
            "    sDS[t] = sP[t] * (dp - sDelta[i]);",
            "}",
            "#pragma unroll",
            f"for (int u = 0; u < {nv}; ++u) {{  // dv += P^T dO",
            f"    const int t = threadIdx.x + u * {t};",
            f"    if (t < {bk * ev}) {{ const int j = t / {ev}, e = t % {ev}; float a = dv[u];",
            f"        for (int i = 0; i < {bq}; ++i) a = fmaf(sP[i * {bk} + j], sDO[i * {ev} + e], a); dv[u] = a; }}",
            "}",
            "__syncthreads();",
            "#pragma unroll",
            f"for (int u = 0; u < {nk}; ++u) {{  // dk += dS^T Q",
            f"    const int t = threadIdx.x + u * {t};",
            f"    if (t < {bk * e}) {{ const int j = t / {e}, e = t % {e}; float a = dk[u];",
            f"        for (int i = 0; i < {bq}; ++i) a = fmaf(sDS[i * {bk} + j], sQ[i * {e} + e], a); dk[u] = a; }}",
            "}")),
        "}",
        "#pragma unroll",
        f"for (int u = 0; u < {nk}; ++u) {{ const int t = threadIdx.x + u * {t};",
        f"    if (t < {bk * e} && k0 + t / {e} < {lk}) "
        f"{grads}[{dk_base}LL + ((long long)b * {lk} + k0 + t / {e}) * {e} + t % {e}] = dk[u] * {scale}; }}",
        "#pragma unroll",
        f"for (int u = 0; u < {nv}; ++u) {{ const int t = threadIdx.x + u * {t};",
        f"    if (t < {bk * ev} && k0 + t / {ev} < {lk}) "
        f"{grads}[{dv_base}LL + ((long long)b * {lk} + k0 + t / {ev}) * {ev} + t % {ev}] = dv[u]; }}")
    kend = f"min({lk}, q0 + {bq})" if plan.causal else f"{lk}"
    query_items = block(
        f"const int b = (item - {nb * kt}) / {qt}, q0 = ((item - {nb * kt}) % {qt}) * {bq};",
        rows_of_q("q0"),
        *_zeros("dq", nq),
        f"for (int k0 = 0; k0 < {kend}; k0 += {bk}) {{  // every key tile, in order",
        indent(block(
            "__syncthreads();",
            *_key_value_tiles(bk, e, ev, lk, ld_k, ld_v, t),
            "__syncthreads();",
            f"for (int t = threadIdx.x; t < {bq * bk}; t += {t}) {{",
            indent(block(f"const int i = t / {bk}, j = t % {bk}, r = q0 + i, c = k0 + j;", prob,
                         "float dp = 0.0f;",
                         "#pragma unroll 8",
                         f"for (int e = 0; e < {ev}; ++e) dp = fmaf(sDO[i * {ev} + e], sV[j * {ev} + e], dp);",
                         "sDS[t] = p * (dp - sDelta[i]);")),
            "}",
            "__syncthreads();",
            "#pragma unroll",
            f"for (int u = 0; u < {nq}; ++u) {{  // dq += dS K",
            f"    const int t = threadIdx.x + u * {t};",
            f"    if (t < {bq * e}) {{ const int i = t / {e}, e = t % {e}; float a = dq[u];",
            f"        for (int j = 0; j < {bk}; ++j) a = fmaf(sDS[i * {bk} + j], sK[j * {e} + e], a); dq[u] = a; }}",
            "}")),
        "}",
        "#pragma unroll",
        f"for (int u = 0; u < {nq}; ++u) {{ const int t = threadIdx.x + u * {t};",
        f"    if (t < {bq * e} && q0 + t / {e} < {lq}) "
        f"{grads}[((long long)b * {lq} + q0 + t / {e}) * {e} + t % {e}] = dq[u] * {scale}; }}")
    body = block(carve,
                 f"if (item < {nb * kt}) {{  // dk, dv of one key tile",
                 indent(key_items),
                 "} else {  // dq of one query tile",
                 indent(query_items),
                 "}",
                 "__syncthreads();  // the next work item reuses the workspace")
    code = (f"{{  // {name}: fused attention backward, tiles {bq} x {bk}, probabilities recomputed from lse\n"
            + indent(body) + "\n}")
    return AttentionCode(code, nb * (kt + qt), ATTENTION_EMITTER.shared_floats(plan) * 4)


__all__ = ["AttentionCode", "forward", "backward"]


# -- flash-decoding (``flash_decode``): a few query rows over a long KV cache, split over KV tiles --------

#: ``(batch, row, col) -> C pointer (const unsigned short*)`` to a bf16 element whose 8-element run starting
#: there is 16-byte aligned whenever the buffer's base is; ``None`` where the operand cannot be read so.
VecPointer = Callable[[str, str, str], str] | None

#: Elements per vector load (16 bytes of bf16).
VEC = 8
#: Key rows of one thread whose loads are issued together (in flight) before their arithmetic.
DECODE_IN_FLIGHT = 8
#: Load K and V together (one round trip) when one pass of ``DECODE_IN_FLIGHT`` rows per lane covers the
#: KV tile with 16-byte loads; ``False``: K rows first (masked keys not read), V rows after the softmax.
DECODE_ONE_TRIP = True


@dataclass(frozen=True)
class DecodeLayout:
    """How a flash-decoding work item maps threads to keys: ``lanes`` lanes per key row (each owns one
    8-element segment of the row), ``rows_per_pass`` key rows per block-wide pass, ``passes`` per tile,
    ``chunk`` passes whose loads are issued before their FMAs."""

    lanes: int
    rows_per_pass: int
    passes: int
    chunk: int


def decode_layout(plan: AttentionPlan, threads: int) -> DecodeLayout:
    segs = ceil_div(max(plan.head_dim, plan.value_dim), VEC)
    lanes = 1
    while lanes < segs:
        lanes *= 2
    rows_per_pass = (threads // 32) * (32 // lanes)
    passes = ceil_div(plan.tile_k, rows_per_pass)
    return DecodeLayout(lanes, rows_per_pass, passes, min(passes, DECODE_IN_FLIGHT))


def _fetch(name: str, chunk: int, dim: int, live: str, row: str, ld: Loader, vec: VecPointer,
           aligned: str) -> tuple[list[str], Callable[[str, int], str]]:
    """Declarations and loads of ``chunk`` key rows (``row`` and ``live`` in terms of ``u``) of this lane's
    segment ``seg`` (elements ``seg * 8 ..``) into registers, and ``elem(u, t)``: element ``t`` as float."""
    if vec is not None:
        lines = [f"uint4 {name}[{chunk}];",
                 "#pragma unroll",
                 f"for (int u = 0; u < {chunk}; ++u) {{",
                 f"    const int c = {row};",
                 f"    {name}[u] = make_uint4(0u, 0u, 0u, 0u);",
                 f"    if (({live}) && seg * 8 < {dim}) {{",
                 f"        const unsigned short* src = {vec('b', 'c', 'seg * 8')};",
                 f"        if ({aligned}) {name}[u] = *reinterpret_cast<const uint4*>(src);  // 16-byte load",
                 "        else {  // a base that is not 16-byte aligned: the same bits, two bytes at a time",
                 "            unsigned int w[4];",
                 "            #pragma unroll",
                 "            for (int t = 0; t < 4; ++t) w[t] = (unsigned int)src[2 * t] "
                 "| ((unsigned int)src[2 * t + 1] << 16);",
                 f"            {name}[u] = make_uint4(w[0], w[1], w[2], w[3]);",
                 "        }",
                 "    }",
                 "}"]

        def elem(u: str, t: int) -> str:
            word = f"{name}[{u}].{'xyzw'[t // 2]}"
            return f"__uint_as_float({word} << 16)" if t % 2 == 0 else f"__uint_as_float({word} & 0xffff0000u)"
        return lines, elem
    lines = [f"float {name}[{chunk}][{VEC}];",
             "#pragma unroll",
             f"for (int u = 0; u < {chunk}; ++u) {{",
             f"    const int c = {row};",
             "    #pragma unroll",
             f"    for (int t = 0; t < {VEC}; ++t) {{",
             "        const int e = seg * 8 + t;",
             f"        {name}[u][t] = ({live}) && e < {dim} ? {ld('b', 'c', 'e')} : 0.0f;",
             "    }",
             "}"]
    return lines, lambda u, t: f"{name}[{u}][{t}]"


def _keep(plan: AttentionPlan, ld_mask: Loader | None, r: str, c: str) -> str:
    """C condition: key ``c`` counts for query row ``r`` (inside the cache, causal and boolean masks)."""
    conds = [f"{c} < {plan.kv_len}"]
    if plan.causal:
        conds.append(f"{c} <= {r}")
    if plan.mask == "bool":
        assert ld_mask is not None
        conds.append(f"{ld_mask('b', r, c)} != 0.0f")
    return " && ".join(conds)


def decode_partial(plan: AttentionPlan, *, threads: int, ld_q: Loader, ld_k: Loader, ld_v: Loader,
                   ld_mask: Loader | None, vec_k: VecPointer, vec_v: VecPointer, aligned_k: str, aligned_v: str,
                   partials: str, name: str) -> AttentionCode:
    """Phase 1 of flash-decoding: work item ``item`` = (batch ``b``, KV tile ``kt``) writes the tile's
    partials ``acc``, ``m``, ``l`` of every query row into ``partials`` (float32, the layout of
    :func:`tkx.target.decode_partials_layout`).

    Each key row is read by ``lanes`` lanes, one 8-element segment each (one 16-byte load when
    ``vec_*`` gives a pointer and ``aligned_*`` holds at run time), ``chunk`` rows per lane in flight.
    When one pass covers the tile with 16-byte loads (the decode configuration: 256 keys, 8 rows per lane),
    K and V are loaded together in one round trip and the mask applies to the scores (an H200 run showed
    the kernel latency-bound: skipping masked rows saved no time); otherwise a key that no query row keeps
    is not read, nor a value row whose probability is 0 for every row. Scores go to shared memory, one warp per query
    row takes the tile's maximum ``m`` and ``l = sum exp(s - m)``, and ``acc = sum_j p_j v_j`` is
    reduced over the lanes of a segment (shuffles) and then over the warps in a fixed order.
    """
    lay = decode_layout(plan, threads)
    t, lq, bk, e, ev = threads, plan.tile_q, plan.tile_k, plan.head_dim, plan.value_dim
    warps, kt = t // 32, plan.k_tiles
    m_off, l_off, _ = decode_partials_layout(plan.batch, kt, lq, ev)
    scale = literal(plan_scale(plan))
    row = f"k0 + j0 + (it + u) * {lay.rows_per_pass}"
    inside = f"(it + u) < {lay.passes} && j0 + (it + u) * {lay.rows_per_pass} < {bk}"
    # one pass (every row of a lane in flight at once) with 16-byte loads: K and V are loaded together, in one
    # round trip, and the mask applies to the scores; otherwise K rows no query keeps and V rows of
    # probability 0 are not read (each chunk of rows waits for the mask, then for the softmax)
    single = DECODE_ONE_TRIP and lay.passes <= lay.chunk and vec_k is not None and vec_v is not None
    if single:
        k_live = v_live = f"{inside} && c < {plan.kv_len}"
    else:
        k_live = f"{inside} && (" + " || ".join(f"({_keep(plan, ld_mask, str(r), 'c')})" for r in range(lq)) + ")"
        v_live = f"{inside} && (" + " || ".join(f"sS[{r * bk} + j0 + (it + u) * {lay.rows_per_pass}] != 0.0f"
                                                for r in range(lq)) + ")"
    k_lines, k_elem = _fetch("kraw", lay.chunk, e, k_live, row, ld_k, vec_k, aligned_k)
    v_lines, v_elem = _fetch("vraw", lay.chunk, ev, v_live, row, ld_v, vec_v, aligned_v)
    shuffle_seg = [f"for (int o = {lay.lanes // 2}; o > 0; o >>= 1) d[r] += __shfl_xor_sync(0xffffffffu, d[r], o);"] \
        if lay.lanes > 1 else []
    score = [f"float s = ({_keep(plan, ld_mask, 'r', 'c')}) ? d[r] * {scale} : -TKX_INF;"]
    if plan.mask == "additive":
        assert ld_mask is not None
        score.append(f"if (s != -TKX_INF) s += {ld_mask('b', 'r', 'c')};")
    acc_lanes = [f"for (int o = {lay.lanes}; o < 32; o <<= 1) "
                 "acc[r][x] += __shfl_xor_sync(0xffffffffu, acc[r][x], o);"] if lay.lanes < 32 else []
    body = block(
        "float* sS = reinterpret_cast<float*>(tkx_smem);  // the tile's scores, then probabilities",
        f"float* sAcc = sS + {lq * bk};  // each warp's sum of p v per query row",
        f"float* sM = sAcc + {warps * lq * ev};",
        f"float* sL = sM + {lq};",
        f"const int b = item / {kt}, k0 = (item % {kt}) * {bk};",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        f"const int seg = lane % {lay.lanes}, j0 = warp * {32 // lay.lanes} + lane / {lay.lanes};",
        f"float qv[{lq}][{VEC}];  // this lane's segment of every query row",
        "#pragma unroll",
        f"for (int r = 0; r < {lq}; ++r) {{",
        "    #pragma unroll",
        f"    for (int x = 0; x < {VEC}; ++x) {{ const int c = seg * 8 + x; "
        f"qv[r][x] = c < {e} ? {ld_q('b', 'r', 'c')} : 0.0f; }}",
        "}",
        f"// scores: {lay.lanes} lanes per key row, {lay.rows_per_pass} rows per pass, "
        f"{lay.chunk} rows per lane in flight"
        + (" (K and V together)" if single else ""),
        *(["const int it = 0;  // one pass: every row of this lane", *k_lines, *v_lines] if single else
          [f"for (int it = 0; it < {lay.passes}; it += {lay.chunk}) {{"]),
        (lambda inner: inner if single else indent(inner))(block(
            *([] if single else k_lines),
            "#pragma unroll",
            f"for (int u = 0; u < {lay.chunk}; ++u) {{",
            indent(block(
                f"const int j = j0 + (it + u) * {lay.rows_per_pass}, c = k0 + j;",
                f"const float kf[{VEC}] = {{{', '.join(k_elem('u', x) for x in range(VEC))}}};",
                f"float d[{lq}];",
                "#pragma unroll",
                f"for (int r = 0; r < {lq}; ++r) {{",
                "    d[r] = 0.0f;",
                "    #pragma unroll",
                f"    for (int x = 0; x < {VEC}; ++x) d[r] = fmaf(qv[r][x], kf[x], d[r]);",
                *(indent(x) for x in shuffle_seg),
                "}",
                f"if (seg == 0 && (it + u) < {lay.passes} && j < {bk}) {{",
                "    #pragma unroll",
                f"    for (int r = 0; r < {lq}; ++r) {{",
                *(indent(x, 2) for x in score),
                f"        sS[r * {bk} + j] = s;",
                "    }",
                "}")),
            "}")),
        *([] if single else ["}"]),
        "__syncthreads();",
        f"for (int r = warp; r < {lq}; r += {warps}) {{  // the tile's maximum and sum, one warp per query row",
        indent(block(
            "float mx = -TKX_INF;",
            f"for (int j = lane; j < {bk}; j += 32) mx = fmaxf(mx, sS[r * {bk} + j]);",
            "mx = tkx_warp_max(mx);",
            "float sum = 0.0f;",
            f"for (int j = lane; j < {bk}; j += 32) {{",
            f"    const float p = mx == -TKX_INF ? 0.0f : expf(sS[r * {bk} + j] - mx);",
            f"    sS[r * {bk} + j] = p; sum += p;",
            "}",
            "sum = tkx_warp_sum(sum);",
            "if (lane == 0) { sM[r] = mx; sL[r] = sum; }")),
        "}",
        "__syncthreads();",
        f"float acc[{lq}][{VEC}];",
        "#pragma unroll",
        f"for (int r = 0; r < {lq}; ++r) {{",
        "    #pragma unroll",
        f"    for (int x = 0; x < {VEC}; ++x) acc[r][x] = 0.0f;",
        "}",
        *([] if single else [f"for (int it = 0; it < {lay.passes}; it += {lay.chunk}) {{  // acc += p v"]),
        (lambda inner: inner if single else indent(inner))(block(
            *([] if single else v_lines),
            "#pragma unroll",
            f"for (int u = 0; u < {lay.chunk}; ++u) {{",
            indent(block(
                f"const int j = j0 + (it + u) * {lay.rows_per_pass};",
                f"const float vf[{VEC}] = {{{', '.join(v_elem('u', x) for x in range(VEC))}}};",
                f"if ((it + u) < {lay.passes} && j < {bk}) {{",
                "    #pragma unroll",
                f"    for (int r = 0; r < {lq}; ++r) {{",
                f"        const float p = sS[r * {bk} + j];",
                "        #pragma unroll",
                f"        for (int x = 0; x < {VEC}; ++x) acc[r][x] = fmaf(p, vf[x], acc[r][x]);",
                "    }",
                "}")),
            "}")),
        *([] if single else ["}"]),
        "#pragma unroll",
        f"for (int r = 0; r < {lq}; ++r) {{  // over the key rows of the warp (lanes with the same segment)",
        "    #pragma unroll",
        f"    for (int x = 0; x < {VEC}; ++x) {{",
        *(indent(x, 2) for x in acc_lanes),
        "        const int c = seg * 8 + x;",
        f"        if (lane < {lay.lanes} && c < {ev}) sAcc[(warp * {lq} + r) * {ev} + c] = acc[r][x];",
        "    }",
        "}",
        "__syncthreads();",
        f"for (int i = threadIdx.x; i < {lq * ev}; i += {t}) {{  // over the warps, in order",
        "    float a = 0.0f;",
        f"    for (int w = 0; w < {warps}; ++w) a += sAcc[w * {lq * ev} + i];",
        f"    {partials}[(long long)item * {lq * ev} + i] = a;",
        "}",
        f"for (int r = threadIdx.x; r < {lq}; r += {t}) {{",
        f"    {partials}[{m_off}LL + (long long)item * {lq} + r] = sM[r];",
        f"    {partials}[{l_off}LL + (long long)item * {lq} + r] = sL[r];",
        "}",
        "__syncthreads();  // the next work item reuses the workspace")
    code = (f"{{  // {name}: flash-decoding phase 1 of 2, {lq} query row(s) x KV tile {bk} of {plan.kv_len} keys "
            f"({kt} tiles)\n" + indent(body) + "\n}")
    return AttentionCode(code, plan.batch * kt, ATTENTION_EMITTER.shared_floats(plan, threads) * 4)


def decode_combine(plan: AttentionPlan, *, threads: int, partials: str, out: str, name: str,
                   zero_empty_rows: bool = True) -> AttentionCode:
    """Phase 2 of flash-decoding: one warp per (batch, query row) merges the ``k_tiles`` partials with the
    online-softmax weights ``w_p = exp(m_p - M)``, ``M = max_p m_p`` (0 for a tile with every key masked):
    ``out = sum_p w_p acc_p / sum_p w_p l_p`` and ``lse = M + log(sum_p w_p l_p)``, in tile order, into the
    packed float32 root ``[out | lse]``; a row whose keys are all masked is 0 (``zero_empty_rows``) or NaN."""
    t, lq, ev, kt = threads, plan.tile_q, plan.value_dim, plan.k_tiles
    warps, rows = t // 32, plan.batch * plan.tile_q
    m_off, l_off, _ = decode_partials_layout(plan.batch, kt, lq, ev)
    lse_base = plan.batch * lq * ev
    weight = (f"const float mp = {partials}[{m_off}LL + ((long long)b * {kt} + p) * {lq} + r]; "
              "const float w = mp == -TKX_INF ? 0.0f : expf(mp - mx);")
    body = block(
        "const int lane = threadIdx.x & 31;",
        f"const int row = item * {warps} + (threadIdx.x >> 5);",
        f"if (row < {rows}) {{  // the whole warp takes the same branch",
        indent(block(
            f"const int b = row / {lq}, r = row % {lq};",
            "float mx = -TKX_INF;",
            f"for (int p = lane; p < {kt}; p += 32) "
            f"mx = fmaxf(mx, {partials}[{m_off}LL + ((long long)b * {kt} + p) * {lq} + r]);",
            "mx = tkx_warp_max(mx);",
            "float den = 0.0f;",
            f"for (int p = lane; p < {kt}; p += 32) {{ {weight} "
            f"den = fmaf(w, {partials}[{l_off}LL + ((long long)b * {kt} + p) * {lq} + r], den); }}",
            "den = tkx_warp_sum(den);",
            f"for (int e = lane; e < {ev}; e += 32) {{",
            "    float num = 0.0f;",
            f"    for (int p = 0; p < {kt}; ++p) {{  // tile order",
            f"        {weight}",
            f"        num = fmaf(w, {partials}[(((long long)b * {kt} + p) * {lq} + r) * {ev} + e], num);",
            "    }",
            f"    {out}[(long long)row * {ev} + e] = {_normalise(plan, zero_empty_rows, 'num', 'den')};",
            "}",
            f"if (lane == 0) {out}[{lse_base}LL + row] = mx + logf(den);")),
        "}")
    code = (f"{{  // {name}: flash-decoding phase 2 of 2, combine {kt} KV tile partials of each of {rows} "
            f"query row(s)\n" + indent(body) + "\n}")
    return AttentionCode(code, ceil_div(rows, warps), 0)


__all__ += ["decode_partial", "decode_combine", "decode_layout", "DecodeLayout"]
