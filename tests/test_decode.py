"""AMK's decode step in tkx (issue 16).

1. Per instruction, as AMK's verifier does: each AMK instruction kind written as a user writes it in
   PyTorch, compiled by tkx (capture, passes, schedule, arena) and run by both CPU interpreters, is
   compared with a torch reference that follows AMK's conventions: ``nn.Linear`` layout ``[N_out, K_in]``
   (``x @ W.T``), fp32 accumulation then one cast to the output dtype, GEMV/GEMM tiles by output column
   range ``(n_off, N_tile)`` assembled from disjoint tiles, int8 / packed-int4 weights with group-wise
   scales (AMK's storage convention), flash-decoding partials ``[acc | m | l]`` and their combine.
2. The whole decode step (``tkx.examples.decode``, bf16 / int8 / int4 weights): 20 greedy tokens through
   the reference interpreter, the schedule interpreter and the task VM equal eager's, with the K/V caches
   updated in place; the kernel compiles with NVRTC; dequantisation runs in the GEMV's operand load.
3. On a GPU: the same 20 tokens from the compiled kernel (``@pytest.mark.gpu``).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

import tkx
from tkx import dataflow
from tkx.codegen.nvrtc import nvrtc_available
from tkx.dataflow import vm
from tkx.examples import decode as D
from tkx.schedule.interpreter import run as run_schedule

BF16 = torch.bfloat16
g = torch.Generator().manual_seed(16)


def rnd(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def clone(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def tkx_run(step, inputs, exact=True, **options):
    """Outputs (flat) of ``step`` through tkx's reference interpreter and its schedule interpreter;
    the two must agree with each other exactly (``exact=False``: within one rounding of the output dtype,
    for a schedule that sums in another order than the composite's reference, as flash-decoding's KV
    tiles) and with eager within bf16 rounding. Returns ``(outputs, exploration)``; in-place updates are
    applied to ``inputs``."""
    exp = tkx.explore(step, inputs, **options)
    eager_in = clone(inputs)
    eager, _ = tree_flatten(step(*eager_in))
    got = []
    for run in (lambda x: tkx.reference.run(exp.optimized, x, update_inputs=True),
                lambda x: run_schedule(exp.schedule, exp.arena, x, update_inputs=True)):
        mine = clone(inputs)
        res = run(mine)
        got.append((res.outputs, mine))
    (ref_out, ref_in), (sch_out, sch_in) = got
    for a, b, e in zip(ref_out, sch_out, eager):
        assert a.dtype == e.dtype and a.shape == e.shape
        if exact:
            assert torch.equal(a, b), "the two interpreters disagree"
        else:
            close(b, a, "schedule interpreter vs reference interpreter", rel=8e-3)
        close(a, e, "tkx vs eager")
    for k, (a, b) in enumerate(zip(ref_in, sch_in)):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f"input {k}: the interpreters updated it differently"
            inputs[k].copy_(a)
    return ref_out, exp


def close(got, want, what, rel=None):
    if want.dtype in (torch.int64, torch.int32):
        assert torch.equal(got, want), f"{what}: {got} vs {want}"
        return
    rel = rel if rel is not None else (1e-5 if want.dtype == torch.float32 else 1.6e-2)
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    assert err <= rel * max(scale, 1e-6), f"{what}: max abs error {err:.3g} (scale {scale:.3g})"


# -- AMK's reference conventions, written for these tests ------------------------------------------


def f32(t):
    return t.float()


def tiles(n: int, n_tile: int):
    return [(off, min(n_tile, n - off)) for off in range(0, n, n_tile)]


def amk_linear(x, w, bias=None, n_tile=32, out_dtype=BF16):
    """Column-tiled GEMV: each tile ``out[:, off:off+nt] = fp32(x) @ fp32(W[off:off+nt]).T (+ bias)``, cast."""
    out = torch.empty(*x.shape[:-1], w.shape[0], dtype=out_dtype)
    for off, nt in tiles(w.shape[0], n_tile):
        acc = f32(x) @ f32(w[off:off + nt]).t()
        if bias is not None:
            acc = acc + f32(bias[off:off + nt])
        out[..., off:off + nt] = acc.to(out_dtype)
    return out


def amk_unpack(qw, quant, k):
    """Integer weight ``[N, K]`` (fp32) from AMK's storage: int8 as is, int4 nibbles low-first minus 8."""
    if quant == "int4":
        p = qw.to(torch.int32)
        q = torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1).reshape(qw.shape[0], -1)[:, :k]
        return q.float() - 8.0
    return qw[:, :k].float()


def amk_dequant(qw, scales, quant, group, k):
    return amk_unpack(qw, quant, k) * f32(scales).repeat_interleave(group, dim=-1)[:, :k]


# -- per instruction kind ----------------------------------------------------------------------------


def test_copy_and_cast():
    x = rnd(4, 64, dtype=BF16)
    (out,), _ = tkx_run(lambda x: x.float() * 1.0, [x])
    close(out, f32(x), "COPY")


def test_embed():
    table, ids = rnd(96, 32, dtype=BF16), torch.tensor([3, 95, 0, 3])
    (out,), _ = tkx_run(lambda t, i: F.embedding(i, t), [table, ids])
    assert torch.equal(out, table.index_select(0, ids))


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_norms(norm):
    x, w, b = rnd(4, 128, dtype=BF16), rnd(128, dtype=BF16), rnd(128, dtype=BF16)
    if norm == "rmsnorm":
        (out,), _ = tkx_run(lambda x, w: D.rms_norm(x, w, 1e-6), [x, w])
        want = (f32(x) * torch.rsqrt(f32(x).pow(2).mean(-1, keepdim=True) + 1e-6) * f32(w)).to(BF16)
    else:
        (out,), _ = tkx_run(lambda x, w, b: F.layer_norm(x.float(), (128,), w.float(), b.float()).to(BF16), [x, w, b])
        want = F.layer_norm(f32(x), (128,), f32(w), f32(b), 1e-5).to(BF16)
    close(out, want, norm)


@pytest.mark.parametrize("bias", [False, True])
def test_gemv_tile_fp_weights_by_column_range(bias):
    """GEMV_TILE / GEMM_TILE on bf16 weights in nn.Linear layout: tkx's one GEMV equals the AMK tiles
    assembled over disjoint column ranges (fp32 accumulation, one cast)."""
    x, w, b = rnd(2, 256, dtype=BF16), rnd(96, 256, dtype=BF16, scale=0.1), rnd(96, dtype=BF16)
    step = (lambda x, w, b: F.linear(x, w, b)) if bias else (lambda x, w: F.linear(x, w))
    (out,), exp = tkx_run(step, [x, w, b] if bias else [x, w])
    close(out, amk_linear(x, w, b if bias else None), "GEMV_TILE")
    impls = {grp.plan["impl"] for grp in exp.schedule.groups.values() if grp.kind == "gemm"}
    assert impls == {"gemv"}


def test_gemm_tile_many_rows():
    x, w = rnd(32, 64, dtype=BF16), rnd(48, 64, dtype=BF16, scale=0.1)
    (out,), _ = tkx_run(lambda x, w: F.linear(x, w), [x, w])
    close(out, amk_linear(x, w, n_tile=16), "GEMM_TILE")


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantised_gemv_tile_dequantises_in_the_operand_load(quant):
    """GEMV_TILE with weight-only int8 / int4 (group-wise scales): the user's ``q.to(bf16) * scale``
    runs inside the GEMV's operand load (no bf16 weight is stored), and the result equals AMK's
    dequantise-the-tile's-rows-then-matvec reference."""
    n, k, group = 64, 256, 64
    w = rnd(n, k, scale=0.1)
    qw, s = (D.quantize_int8 if quant == "int8" else D.quantize_int4)(w, group)
    x = rnd(3, k, dtype=BF16)
    (out,), exp = tkx_run(lambda x, qw, s: F.linear(x, D.dequantize(qw, s, quant, group)), [x, qw, s])
    want = torch.cat([(f32(x) @ amk_dequant(qw[o:o + t], s[o:o + t], quant, group, k).t())
                      for o, t in tiles(n, 16)], dim=-1)
    close(out, want.to(BF16), f"GEMV_TILE {quant}")
    groups = exp.schedule.groups.values()
    assert [grp.kind for grp in groups] == ["gemm"], [grp.kind for grp in groups]
    assert any(d.code == "gemv-operand" and d.fused for d in exp.schedule.decisions)
    if nvrtc_available():
        assert exp.cuda.check("sm_90").spill_bytes == 0


@pytest.mark.parametrize("quant", ["bf16", "int4"])
def test_streaming_gemv_is_chosen_for_decode_sized_weights_and_compiles(quant):
    """A weight of decode size (long side >= 256) gets the streaming GEMV (tkx/codegen/gemv.py): columns
    split over the grid in one wave, K unrolled; its kernel compiles without spills, and the interpreters
    give AMK's column-tiled result."""
    n, k, group = 512, 512, 128
    w = rnd(n, k, scale=0.1)
    x = rnd(4, k, dtype=BF16)
    if quant == "bf16":
        wb = w.to(BF16)
        (out,), exp = tkx_run(lambda x, w: F.linear(x, w), [x, wb], arch="sm_90a")
        want = amk_linear(x, wb, n_tile=64)
    else:
        qw, s = D.quantize_int4(w, group)
        (out,), exp = tkx_run(lambda x, qw, s: F.linear(x, D.dequantize(qw, s, "int4", group)), [x, qw, s],
                              arch="sm_90a")
        want = (f32(x) @ amk_dequant(qw, s, "int4", group, k).t()).to(BF16)
    close(out, want, f"streaming GEMV {quant}")
    (grp,) = [grp for grp in exp.schedule.groups.values() if grp.kind == "gemm"]
    assert grp.plan["impl"] == "gemv_stream"
    assert "contiguous along K" in grp.plan["why"]
    from tkx.codegen.gemv import columns_per_warp
    assert columns_per_warp(512, 1, 8, 132) == 1 and columns_per_warp(4096, 1, 8, 132) == 4
    assert columns_per_warp(10**6, 1, 8, 132) == 8
    note = exp.cuda.notes[grp.id]
    # bf16 weights: 16-byte loads; int4: the chain's loads, with its raw rows (nibbles and scales) prefetched
    assert note["vector_loads"] is (quant == "bf16") and note["prefetched"] == (2 if quant == "int4" else 0), note
    # 512 columns over 132 SMs (the attention projections' shape): 4 columns per item, K in 2 slices -> 128 items
    assert (note["per_item"], note["k_slices"]) == (4, 2) and exp.cuda.launch.config.blocks >= 128
    if nvrtc_available():
        assert "streaming GEMV" in exp.cuda.text
        assert exp.cuda.check("sm_90a").spill_bytes == 0


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_streaming_gemv_prefetches_the_weight_rows_of_later_items_to_l2(ahead):
    """``Options.gemv_prefetch``: at the start of a work item the block asks L2 for the weight rows of its items
    1..ahead rounds on (the first round), then of the item ``ahead`` rounds on: every 128-byte line of their
    rows once (8192 columns x K 2048: per item 8 rows of 32 lines); the sums are untouched."""
    n, k = 8192, 2048
    x, w = rnd(1, k, dtype=BF16), rnd(n, k, scale=0.02).to(BF16)
    exp = tkx.explore(lambda x, w: F.linear(x, w), [x, w], arch="sm_90a", gemv_prefetch=ahead)
    (grp,) = [g for g in exp.schedule.groups.values() if g.kind == "gemm"]
    note = exp.cuda.notes[grp.id]
    assert note["l2_ahead"] == ahead
    text = exp.cuda.text
    if not ahead:
        assert "prefetch.global.L2" not in text
        return
    per_item, lines = note["per_item"], k * 2 // 128
    assert f"for (int d = first; d <= {ahead}; ++d)" in text
    assert f"const int first = item < (int)gridDim.x ? 1 : {ahead};" in text
    assert f"for (int x = threadIdx.x; x < {per_item * lines}; x += blockDim.x)" in text
    assert f"const int nl = nitem * {per_item} + x / {lines};" in text
    assert f"(x % {lines}) * 64 + nl * {k}" in text  # a line of 64 bf16 elements of weight row nl
    if nvrtc_available():
        assert exp.cuda.check("sm_90a").spill_bytes == 0


def test_streaming_gemv_split_over_columns_and_k_fills_the_sms():
    """stream_split: the decode GEMVs' (columns per warp, K slices) make about one wave of 132 SMs: q/k/v/o
    (512 columns, K 512 in 2 vector steps) 4 columns per item over 2 K slices = 128 items; gate/up (1536
    columns) 12 per item = 128 items; down (K 1536) 2 slices; the head (4096 columns) 32 per item."""
    from tkx.codegen.gemv import stream_split

    def items(n, steps):
        cpw, ks = stream_split(n, 1, steps, 8, 132)
        return cpw, ks, -(-n // (8 // ks * cpw))
    assert items(512, 2) == (1, 2, 128)
    assert items(1536, 2) == (3, 2, 128)
    assert items(512, 6)[1:] == (2, 128)
    assert items(4096, 2)[2] == 128
    assert stream_split(512, 1, 1, 8, 132)[1] == 1  # one K step cannot be split
    for n, steps in ((512, 2), (1536, 2), (512, 48), (4096, 16), (100, 3)):
        cpw, ks = stream_split(n, 1, steps, 8, 132)
        assert 1 <= cpw <= 8 and 8 % ks == 0 and ks <= steps


def test_weight_prefetch_asks_l2_for_the_next_streaming_stages_weights():
    """``Options.weight_prefetch``: at the first stage after a streaming GEMV's stage, the grid asks L2 for the
    stored weights of the next streaming stage (the decode step's q/k/v during the norm before them, wo during
    RoPE and attention, gate/up during the norm before them, the LM head during the final norm), every byte of
    them once; the down projection follows gate/up directly and is not prefetched; off by default; the kernel
    compiles without spills."""
    ex = D.get("decode")
    off = tkx.explore(ex.step_fn, ex.make_inputs(0))
    on = tkx.explore(ex.step_fn, ex.make_inputs(0), weight_prefetch=True)
    assert "weight_prefetch:" not in off.cuda.text
    text = on.cuda.text
    blocks = text.split("// weight_prefetch: stage ")[1:]
    cfg = ex.config
    d, kv = cfg.width, cfg.kv * cfg.head_dim
    qkv, wo, gate_up, head = 2 * (d * d + 2 * d * kv), 2 * d * d, 2 * 2 * d * cfg.hidden, 2 * d * cfg.vocab
    assert len(blocks) == 3 * cfg.layers + 1, len(blocks)
    sizes = sorted({sum(int(n) * 128 for n in re.findall(r"x < (\d+)LL", b.split("\n    }")[0])) for b in blocks})
    assert sizes == sorted({qkv, wo, gate_up, head}), (sizes, qkv, wo, gate_up, head)
    for b in blocks:
        stage = int(b.split("'")[0])
        before = text[:text.index(f"// weight_prefetch: stage {stage}'")]
        here = int(before.rsplit("// ==== stage ", 1)[1].split(":")[0])
        assert here < stage
    if nvrtc_available():
        assert on.cuda.check("sm_90").spill_bytes == 0


def test_gemv_ring_streams_the_weights_through_shared_memory():
    """``Options.gemv_ring``: the 16-byte path's loads go ``cp.async`` into a ring of that many 16-byte slots
    per thread (shared memory after the staged short operand), one commit group per load, the oldest awaited
    with ``cp.async.wait_group ring - 1``; a step past the slice's end (K = 200) fills zeros; the ring shrinks
    to what 192 KB of shared memory holds; the kernel compiles without spills."""
    from tkx.codegen.gemv import RING_BYTES

    x, w = rnd(2, 200, dtype=BF16), rnd(700, 200, scale=0.07).to(BF16)
    (out,), exp = tkx_run(lambda x, w: F.linear(x, w), [x, w], gemv_ring=8)
    (note,) = _gemv_notes(exp).values()
    assert note["ring"] == 8 and note["vector_loads"], note
    text = exp.cuda.text
    assert 'cp.async.wait_group 7;' in text and "cp.async.cg.shared.global" in text
    assert "? 16 : 0" in text  # K = 200 ends inside a step: zero fill
    assert exp.cuda.shared_bytes >= 8 * 16 * 256
    if nvrtc_available():
        assert exp.cuda.check("sm_90").spill_bytes == 0
    big = tkx.explore(lambda x, w: F.linear(x, w), [x, w], gemv_ring=16, threads_per_block=1024)
    (note,) = _gemv_notes(big).values()
    assert 2 <= note["ring"] < 16 and 16 * note["ring"] * 1024 <= RING_BYTES, note


def _gemv_notes(exp):
    return {g.id: exp.cuda.notes[g.id] for g in exp.schedule.groups.values()
            if g.kind == "gemm" and exp.cuda.notes.get(g.id, {}).get("variant") == "gemv_stream"}


def test_streaming_gemv_reads_its_operands_sixteen_bytes_at_a_time():
    """The decode MLP and LM head as users write them: SwiGLU's ``silu(gate) * up`` is computed once per work
    item into shared memory (not per element in every warp) before the down projection streams its weight;
    the LM head's ``F.linear(h.float(), w.float())`` reads the stored bfloat16 weight with 16-byte loads
    (widening is exact) and the float32 activations two 16-byte loads per 8; the loop body has no branch
    (ptxas keeps the loads of several steps in flight only within a basic block); the kernel compiles without
    spills."""
    d, f, v = 256, 1024, 3000
    h = rnd(1, d, dtype=BF16)
    wg, wu, wd, we = (rnd(*s, scale=0.05).to(BF16) for s in ((f, d), (f, d), (d, f), (v, d)))

    def step(h, wg, wu, wd, we):
        x = h + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
        return F.linear(x.float(), we.float())

    (out,), exp = tkx_run(step, [h, wg, wu, wd, we], exact=False)
    notes = _gemv_notes(exp)
    assert len(notes) == 4 and all(n["vector_loads"] for n in notes.values()), notes
    assert sorted(n["staged_short"] for n in notes.values()) == [False, False, False, True], notes
    text = exp.cuda.text
    assert "act[i] = " in text and "reinterpret_cast<const float4*>(act + s * K" in text
    head = text[text.index("N = 3000"):]
    assert "const float4 lo = *reinterpret_cast<const float4*>" in head[:4000]
    loops = [loop for loop in text.split("for (int j = 0; j < ")[1:] if "const int k0 = " in loop.split("\n")[1]]
    assert len(loops) == 8, len(loops)  # 4 GEMVs, each an aligned and an unaligned loop
    for loop in loops:
        body = loop[:loop.index("sum[c][s] = fmaf")]
        assert "if (" not in body, body
    if nvrtc_available():
        assert exp.cuda.check("sm_90").spill_bytes == 0


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_dequantising_chain_reads_one_raw_row_per_output_column(quant):
    """tkx.codegen.leaves.column_spans follows the GEMV operand's inlined dequant chain with index maps:
    output column ``l`` (weight row ``l``) reads bytes ``[l * K / d, (l + 1) * K / d)`` of the int8 (``d`` = 1)
    or packed int4 (``d`` = 2) buffer and scales ``[l * K / G, (l + 1) * K / G)``: what the streaming GEMV
    prefetches."""
    from tkx.codegen.leaves import column_spans

    n, k, group = 64, 256, 64
    qw, sc = (D.quantize_int8 if quant == "int8" else D.quantize_int4)(rnd(n, k), group)
    exp = tkx.explore(lambda x, qw, s: F.linear(x, D.dequantize(qw, s, quant, group)), [rnd(2, k, dtype=BF16), qw, sc])
    sched = exp.schedule
    (grp,) = [grp for grp in sched.groups.values() if grp.kind == "gemm"]
    mm = sched.program.op(grp.anchor)
    ops = {op.id: op for op in sched.program.ops}
    spans = column_spans(mm.inputs[1], ops, set(sched.inlined), 0)
    names = {i.value.buffer: i.name for i in sched.program.inputs}
    got = {names[sp.buffer]: (sp.row_stride, sp.start, sp.span) for sp in spans}
    d = 1 if quant == "int8" else 2
    assert got == {"qw": (k // d, 0, k // d), "s": (k // group, 0, k // group)}, got
    assert column_spans(mm.inputs[0], ops, set(sched.inlined), 1) == []  # a stored input: nothing to follow


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_dequant(quant):
    """DEQUANT on its own: the user's unpack + scale equals AMK's storage convention bit for bit."""
    n, k, group = 16, 64, 32
    qw, s = (D.quantize_int8 if quant == "int8" else D.quantize_int4)(rnd(n, k), group)
    (out,), _ = tkx_run(lambda qw, s: D.dequantize(qw, s, quant, group), [qw, s])
    assert torch.equal(out, amk_dequant(qw, s, quant, group, k).to(BF16))


def test_rope_at_a_position():
    x, pos = rnd(2, 4, 32, dtype=BF16), torch.tensor(37)
    (out,), _ = tkx_run(lambda x, p: D.rope_at(x, p, 10000.0), [x, pos])
    half = 16
    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    c, sn = torch.cos(37.0 * inv), torch.sin(37.0 * inv)
    x1, x2 = f32(x)[..., :half], f32(x)[..., half:]
    want = torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], dim=-1)
    close(out, want.to(BF16), "ROPE", rel=3e-2)  # eager rounds cos/sin to bf16 first


def test_kv_append_in_place_at_a_tensor_position():
    cache, new, pos = rnd(2, 4, 16, 8, dtype=BF16), rnd(2, 4, 8, dtype=BF16), torch.tensor(5)

    def step(cache, new, pos):
        cache[:, :, pos.view(1)] = new.unsqueeze(2)
        return cache.sum()

    inputs = [cache.clone(), new, pos]
    tkx_run(step, inputs)
    want = cache.clone()
    want[:, :, 5] = new
    assert torch.equal(inputs[0], want)


def _attention_inputs(b=2, h=2, s=32, d=16, pos=20):
    return rnd(b, h, d, dtype=BF16), rnd(b, h, s, d, dtype=BF16), rnd(b, h, s, d, dtype=BF16), torch.tensor(pos)


def amk_attention(q, k, v, kv_len):
    scores = torch.einsum("bhd,bhkd->bhk", f32(q), f32(k[:, :, :kv_len])) / math.sqrt(q.shape[-1])
    return torch.einsum("bhk,bhkd->bhd", scores.softmax(-1), f32(v[:, :, :kv_len]))


def test_attention_tile_over_the_cache_with_a_position_mask():
    q, k, v, pos = _attention_inputs()

    def step(q, k, v, pos):
        scores = (q.unsqueeze(2) @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
        scores = torch.where(torch.arange(k.shape[2]) <= pos, scores, float("-inf"))
        return (scores.softmax(-1).to(BF16) @ v).squeeze(2)

    (out,), _ = tkx_run(step, [q, k, v, pos], exact=False)  # flash-decoding: sums over KV tiles
    close(out, amk_attention(q, k, v, 21).to(BF16), "ATTENTION_TILE", rel=3e-2)


def flash_partials(q, k, v, tile):
    """Per KV tile: the un-normalised partials ``acc = sum exp(s - m) v``, ``m``, ``l`` (flash-decoding)."""
    b, h, s, d = k.shape
    scores = (q.float().unsqueeze(2) @ k.float().transpose(-2, -1)).squeeze(2) / math.sqrt(d)   # [B, H, S]
    scores = scores.reshape(b, h, s // tile, tile)
    m = scores.amax(-1)                                                             # [B, H, P]
    e = torch.exp(scores - m.unsqueeze(-1))
    acc = e.unsqueeze(-2) @ v.float().reshape(b, h, s // tile, tile, d)             # [B, H, P, 1, D]
    return acc.squeeze(-2), m, e.sum(-1)


def combine(acc, m, denom):
    big = m.amax(-1, keepdim=True)
    w = torch.exp(m - big)
    return (acc * w.unsqueeze(-1)).sum(-2) / (denom * w).sum(-1, keepdim=True)


def test_attention_partials_and_combine_split_over_kv_tiles():
    """ATTENTION_TILE (PARTIAL_WRITE) + ATTENTION_COMBINE: flash-decoding written in PyTorch, split over
    4 KV tiles, compiles in tkx; its partials and the combined output equal AMK's online-softmax merge."""
    q, k, v, _ = _attention_inputs(s=64)
    (acc, m, denom), _ = tkx_run(lambda q, k, v: flash_partials(q, k, v, 16), [q, k, v])
    (out,), _ = tkx_run(lambda q, k, v: combine(*flash_partials(q, k, v, 16)), [q, k, v])
    parts = []
    for p in range(4):
        sl = slice(16 * p, 16 * p + 16)
        sc = torch.einsum("bhd,bhkd->bhk", f32(q), f32(k[:, :, sl])) / math.sqrt(16)
        mp = sc.amax(-1)
        ep = torch.exp(sc - mp[..., None])
        parts.append((torch.einsum("bhk,bhkd->bhd", ep, f32(v[:, :, sl])), mp, ep.sum(-1)))
    close(m, torch.stack([p[1] for p in parts], -1), "partial m")
    close(denom, torch.stack([p[2] for p in parts], -1), "partial l", rel=1e-4)
    close(acc, torch.stack([p[0] for p in parts], -2), "partial acc", rel=1e-4)
    mm = torch.stack([p[1] for p in parts]).amax(0)
    num = sum(p[0] * torch.exp(p[1] - mm)[..., None] for p in parts)
    den = sum(p[2] * torch.exp(p[1] - mm) for p in parts)
    close(out, num / den[..., None], "ATTENTION_COMBINE", rel=1e-4)
    close(out, amk_attention(q, k, v, 64), "combine vs whole-window attention", rel=1e-4)


def _decode_groups(exp):
    return [grp for grp in exp.schedule.groups.values() if grp.kind in ("attention", "attention_partial")]


def _phases_by_hand(exp, flat):
    """Run the schedule's groups stage by stage on a ``_Machine`` and return it (its arena holds the
    flash-decoding scratch ``[acc | m | l]``)."""
    from tkx.reference import flatten_inputs
    from tkx.schedule.interpreter import _Machine

    m = _Machine(exp.schedule, exp.arena, [x.clone() for x in flatten_inputs(exp.schedule.program, flat)])
    for stage in exp.schedule.stages:
        for gid in stage:
            m.run_group(exp.schedule.groups[gid])
    return m


@pytest.mark.parametrize("pos", [3, 40, 63])
def test_flash_decoding_is_one_partial_group_over_kv_tiles_and_a_combine(pos):
    """ATTENTION_TILE (PARTIAL_WRITE) + ATTENTION_COMBINE as tkx runs them: the decode step's attention (one
    query per (batch, head) over a cache of 64 positions masked to ``<= pos``, written by hand) is captured
    as the composite and scheduled as flash-decoding: a partial group (one work item per (batch x head,
    KV tile)) writing AMK's partials ``acc``, ``m``, ``l`` of each tile, then a combine in the next stage.
    Each phase equals the torch reference of AMK's online-softmax merge; the whole equals attention over the
    first ``pos + 1`` positions."""
    q, k, v, p = _attention_inputs(b=2, h=2, s=64, d=16, pos=pos)

    def step(q, k, v, pos):
        scores = (q.unsqueeze(2) @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
        scores = torch.where(torch.arange(k.shape[2]) <= pos, scores, float("-inf"))
        return (scores.softmax(-1).to(BF16) @ v).squeeze(2)

    (out,), exp = tkx_run(step, [q, k, v, p], exact=False, max_blocks=16)
    close(out, amk_attention(q, k, v, pos + 1).to(BF16), "flash-decoding", rel=3e-2)
    part, comb = sorted(_decode_groups(exp), key=lambda grp: grp.kind, reverse=True)
    assert (part.kind, comb.kind) == ("attention_partial", "attention")
    plan = part.plan
    assert plan["impl"] == "flash_decode" and plan["tile_q"] == 1 and plan["kv_len"] == 64
    tile, tiles = plan["tile_k"], plan.k_tiles
    # 4 (batch x heads) x tiles items on 16 blocks: one wave of the smallest tiles that fit it
    assert (tile, tiles) == (16, 4) and part.work_items == 16
    assert exp.schedule.stage_of(comb.id) == exp.schedule.stage_of(part.id) + 1
    (why,) = [d for d in exp.schedule.decisions if d.kind == "attention"]
    assert why.fused and "flash-decoding" in why.sentence and "4 KV tiles of 16" in why.reason, why.sentence
    # the partials in the scratch, against AMK's per-tile reference over the masked scores
    m = _phases_by_hand(exp, [q, k, v, p])
    got = m.arena_view(plan["partials"], "float32", 4 * tiles * (16 + 2))
    scores = torch.einsum("bhd,bhkd->bhk", f32(q), f32(k)) / 4.0
    scores[..., pos + 1:] = float("-inf")
    accs, ms, ls = [], [], []
    for t in range(tiles):
        sc = scores[..., t * tile:(t + 1) * tile]
        mt = sc.amax(-1)
        e = torch.where(mt[..., None] == float("-inf"), torch.zeros_like(sc), torch.exp(sc - mt[..., None]))
        accs.append(torch.einsum("bhk,bhkd->bhd", e, f32(v[:, :, t * tile:(t + 1) * tile])))
        ms.append(mt)
        ls.append(e.sum(-1))
    n = 4 * tiles
    close(got[:16 * n].reshape(2, 2, tiles, 16), torch.stack(accs, 2), "partial acc", rel=1e-5)
    assert torch.equal(got[16 * n:17 * n].reshape(2, 2, tiles), torch.stack(ms, -1)), "partial m"
    close(got[17 * n:].reshape(2, 2, tiles), torch.stack(ls, -1), "partial l", rel=1e-5)
    assert int((torch.stack(ms, -1) == float("-inf")).sum()) == 4 * (tiles - 1 - pos // tile)  # masked tiles


@pytest.mark.parametrize("form", ["sdpa-bool", "sdpa-additive", "two-queries"])
def test_flash_decoding_from_sdpa_masks_and_several_query_rows(form):
    """The same group from ``F.scaled_dot_product_attention`` with a boolean or an additive mask over the
    cache, and with 2 query rows per (batch, head) (speculative decoding's shape); each against torch."""
    b, h, s, d, pos = 2, 4, 96, 32, 70
    lq = 2 if form == "two-queries" else 1
    q, k, v = rnd(b, h, lq, d, dtype=BF16), rnd(b, h, s, d, dtype=BF16), rnd(b, h, s, d, dtype=BF16)
    keep = (torch.arange(s) <= pos)[None, :]  # [1, S]: the query's positions so far
    mask = keep if form != "sdpa-additive" else torch.where(keep, 0.0, float("-inf")).to(BF16)
    if form == "two-queries":
        mask = torch.arange(s)[None, :] <= torch.tensor([[pos - 1], [pos]])  # [2, S]: each row its prefix
    (out,), exp = tkx_run(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), [q, k, v, mask],
                          exact=False)
    want = F.scaled_dot_product_attention(f32(q), f32(k), f32(v),
                                          attn_mask=mask if mask.dtype == torch.bool else f32(mask))
    close(out, want.to(BF16), f"flash-decoding {form}", rel=3e-2)
    kinds = sorted(grp.kind for grp in _decode_groups(exp))
    assert kinds == ["attention", "attention_partial"], kinds
    (part,) = [grp for grp in _decode_groups(exp) if grp.kind == "attention_partial"]
    assert part.plan["tile_q"] == lq and part.plan["mask"] == ("additive" if form == "sdpa-additive" else "bool")
    if nvrtc_available():
        report = exp.cuda.check("sm_90")
        assert report.spill_bytes == 0, report
        assert "flash-decoding phase 1" in exp.cuda.text and "16-byte load" in exp.cuda.text


def test_decode_split_fills_the_grid_in_one_wave():
    """The KV split of flash-decoding (tkx.target.decode_split): the decode configuration's 4 x 8 heads over
    1024 positions take 4 tiles of 256 (128 items for 132 SMs, one wave); batch 1 takes 16 tiles of 64;
    one block takes the whole cache in one tile."""
    from tkx.target import decode_split
    tile, why = decode_split(32, 1024, 132)
    assert tile == 256 and "128 work items on 132 blocks, 1 wave" in why and "2 waves" in why
    assert decode_split(8, 1024, 132)[0] == 64
    assert decode_split(32, 1024, 1)[0] == 1024
    for batch, kv, blocks in ((32, 1024, 132), (3, 100, 7), (64, 4096, 264), (1, 32, 132)):
        tile, _ = decode_split(batch, kv, blocks)
        assert tile % 16 == 0 and tile < kv + 16
        tiles = -(-kv // tile)
        waves = -(-batch * tiles // blocks)
        # no other split has fewer waves x (tile + 32)
        assert all(waves * (min(tile, kv) + 32) <= -(-batch * -(-kv // t) // blocks) * (min(t, kv) + 32)
                   for t in range(16, kv + 16, 16))


def test_silu_mul_gelu_add_mul_softmax():
    a, b = rnd(4, 64, dtype=BF16), rnd(4, 64, dtype=BF16)
    outs, _ = tkx_run(lambda a, b: (F.silu(a) * b, F.gelu(a.float()).to(BF16), a + b, a * 0.5,
                                    a.float().softmax(-1).to(BF16)), [a, b])
    wants = ((F.silu(f32(a)) * f32(b)).to(BF16), F.gelu(f32(a)).to(BF16), (f32(a) + f32(b)).to(BF16),
             (f32(a) * 0.5).to(BF16), torch.softmax(f32(a), -1).to(BF16))
    for kind, got, want in zip(("SILU_MUL", "GELU", "ADD", "MUL", "SOFTMAX"), outs, wants):
        close(got, want, kind)


def test_sample_argmax_is_an_integer_reduction():
    logits = rnd(4, 300, dtype=BF16)
    logits[1, 7] = logits[1, 200] = 50.0  # a tie: the first index wins, as torch.argmax
    (out,), exp = tkx_run(lambda x: x.argmax(-1), [logits])
    assert out.dtype == torch.int64 and torch.equal(out, torch.argmax(f32(logits), -1))
    assert out[1] == 7


def test_allreduce_shard_sums_the_shards():
    shards = [rnd(2, 64, dtype=BF16) for _ in range(3)]
    (out,), _ = tkx_run(lambda a, b, c: (a.float() + b.float() + c.float()).to(BF16), shards)
    close(out, sum(f32(s) for s in shards).to(BF16), "ALLREDUCE_SHARD")


def test_fused_recipe_rmsnorm_into_gemv():
    """FUSED (a recipe over on-chip scratch): RMSNorm then a GEMV; tkx keeps the normalised row out of
    memory where its rules allow and matches the unfused sequence."""
    x, nw, w = rnd(2, 128, dtype=BF16), rnd(128, dtype=BF16), rnd(64, 128, dtype=BF16, scale=0.1)
    (out,), _ = tkx_run(lambda x, nw, w: F.linear(D.rms_norm(x, nw, 1e-6), w), [x, nw, w])
    h = (f32(x) * torch.rsqrt(f32(x).pow(2).mean(-1, keepdim=True) + 1e-6)).to(BF16)
    h = (f32(h) * f32(nw)).to(BF16)
    close(out, amk_linear(h, w), "FUSED")


# -- the whole decode step ---------------------------------------------------------------------------

TOKENS = 20
_EXPLORED: dict = {}


def explored(name: str):
    if name not in _EXPLORED:
        ex = D.get(name)
        _EXPLORED[name] = (ex, tkx.explore(ex.step_fn, ex.make_inputs(0), name=name, mode="grid", sync="counters"))
    return _EXPLORED[name]


def drive(ex, one_step) -> torch.Tensor:
    """``TOKENS`` greedy tokens: ``one_step(flat_inputs) -> (tokens, {input index: updated tensor})``."""
    flat, _ = tree_flatten(ex.make_inputs(0))
    flat = list(flat)
    out = []
    for _ in range(TOKENS):
        tok, updates = one_step(flat)
        for k, v in updates.items():
            flat[k] = v
        out.append(tok)
        flat[-2], flat[-1] = tok, flat[-1] + 1
    return torch.stack(out)


@pytest.mark.parametrize("name", ["decode_tiny", "decode_tiny_int8", "decode_tiny_int4"])
def test_decode_step_20_greedy_tokens_through_both_interpreters(name):
    ex, exp = explored(name)
    want = D.generate(ex.step_fn, ex.make_inputs(0), TOKENS)
    assert len(set(want.flatten().tolist())) > 3  # not a constant sequence

    def interp(run):
        def one(flat):
            mine = clone(flat)
            res = run(mine)
            return res.outputs[0], {u.input_index: mine[u.input_index] for u in exp.optimized.updates}
        return one

    got_ref = drive(ex, interp(lambda x: tkx.reference.run(exp.optimized, x, update_inputs=True)))
    assert torch.equal(got_ref, want)
    got_sched = drive(ex, interp(lambda x: run_schedule(exp.schedule, exp.arena, x, update_inputs=True)))
    assert torch.equal(got_sched, want)
    # the caches are program inputs updated in place (written back), not outputs
    n, layers = len(exp.optimized.inputs), ex.config.layers
    assert sorted(u.input_index for u in exp.optimized.updates) == list(range(n - 2 - 2 * layers, n - 2))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["decode_tiny", pytest.param("decode_tiny_int8", marks=pytest.mark.full),
                                  pytest.param("decode_tiny_int4", marks=pytest.mark.full)])
def test_decode_step_20_greedy_tokens_through_the_task_vm(name):
    """The counters protocol under random interleavings for 20 tokens (the quantised steps differ only in
    their GEMVs' operand loads, which the interpreters' test checks: their VM runs are in `make test-full`)."""
    ex, exp = explored(name)
    dag = dataflow.build(exp.schedule, exp.arena)
    assert dataflow.check(dag) == []
    want = D.generate(ex.step_fn, ex.make_inputs(0), TOKENS)
    seeds = iter(range(1000))

    def one(flat):
        r = vm.run(dag, flat, blocks=5, policy="random", seed=next(seeds), launches=1)
        assert r.ok, [str(f) for f in r.faults][:3]
        return r.outputs[0][0], r.updates[0]

    assert torch.equal(drive(ex, one), want)


def test_decode_quantised_weights_are_never_stored_as_bf16():
    """In the int8 / int4 steps every projection's dequantisation is computed in its GEMV's operand load:
    no group of the schedule stores a weight-shaped bf16 value."""
    for name in ("decode_tiny_int8", "decode_tiny_int4"):
        ex, exp = explored(name)
        shapes = {tuple(s) for s in ex.config.linear_shapes().values()}
        prog = {op.id: op for op in exp.optimized.ops}
        stored = [op_id for grp in exp.schedule.groups.values() for op_id in grp.stores
                  if op_id in prog and tuple(prog[op_id].out.shape) in shapes]
        assert stored == [], stored
        fused = [d for d in exp.schedule.decisions if d.code == "gemv-operand" and d.fused]
        assert len(fused) >= len(D.LINEARS) * ex.config.layers


def test_decode_kernel_compiles_with_nvrtc():
    if not nvrtc_available():
        pytest.skip("NVRTC is not installed")
    _, exp = explored("decode_tiny_int4")
    report = exp.cuda.check("sm_90")
    assert report.spill_bytes == 0, report


def test_teacher_forced_comparison_accepts_equal_tokens_and_flags_wrong_ones():
    ex = D.get("decode_tiny_int8")
    same = D.compare_greedy(ex.step_fn, ex, 5)
    assert same.equal and same.ok and "all 5 x 2" in str(same)
    with_logits = D.make_decode_step(ex.config, ex.quant, return_logits=True)

    def runner_up(*args):  # a step that is wrong: the second-best token
        return with_logits(*args)[1].topk(2, dim=-1).indices[:, 1]

    wrong = D.compare_greedy(runner_up, ex, 5)
    assert not wrong.equal and len(wrong.differences) == 10
    assert not wrong.ok and "BEYOND" in str(wrong)
    exact_tie = D.GreedyComparison(wrong.tokens, wrong.got, ((0, 0, 1, 2, 0.0),), 2 ** -7, (0.1,))
    assert exact_tie.ok and not exact_tie.equal


def test_float32_arbiter_accepts_a_near_tie_and_refuses_a_clear_disagreement():
    """The rule on synthetic logits: float32 logits ``ref``, eager bf16 and tkx each off by their own noise of
    about 0.01 per logit (so a logit margin's noise is about 0.014 and the allowance about 3 x that)."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(1000, generator=g)
    e = int(ref.argmax())
    near, far, better = (int(i) for i in ref.argsort(descending=True)[1:4])
    ref[near], ref[far], ref[better] = ref[e] - 0.005, ref[e] - 0.5, ref[e] + 0.001  # float32 prefers `better`
    eager = ref + 0.01 * torch.randn(1000, generator=g)
    tkx_ = ref + 0.01 * torch.randn(1000, generator=g)
    tie = D.arbitrate(ref, eager, e, near, tkx_)
    assert tie["accepted"] and tie["float32_margin"] == pytest.approx(0.005, abs=1e-6)
    assert tie["allowance"] == pytest.approx(D.FLOAT32_FACTOR * max(tie["eager_noise"], tie["tkx_noise"]))
    assert 0.01 < tie["eager_noise"] < 0.03 and 0.01 < tie["tkx_noise"] < 0.03  # the step-wide noise: ~0.014
    clear = D.arbitrate(ref, eager, e, far, tkx_)
    assert not clear["accepted"] and clear["float32_margin"] == pytest.approx(0.5, abs=1e-6)
    assert D.arbitrate(ref, eager, e, better)["accepted"]  # float32 itself prefers the other token
    assert D.arbitrate(ref, eager, e, better)["tkx_noise"] is None
    # judging a recorded difference again gives the same verdict; a larger factor can turn a refusal around
    assert D.judge_difference(clear) == clear
    assert D.judge_difference(clear, factor=100.0)["accepted"]


def test_teacher_forced_float32_arbiter_end_to_end():
    """llama_1b_tiny with a step that always answers eager's runner-up token: at step 2 the runner-up is a
    near-tie in float32 (margin 0.004, below 3 x a bf16 margin noise of about 0.0027) and is accepted; at every
    other step float32 prefers eager's token by far more than the noise, and the comparison fails."""
    ex = D.get("llama_1b_tiny")
    with_logits = D.make_decode_step(ex.config, ex.quant, return_logits=True)

    def runner_up(*args):
        return with_logits(*args)[1].topk(2, dim=-1).indices[:, 1]

    cmp = D.compare_greedy(runner_up, ex, 5, logits_step=with_logits)
    assert cmp.judged_by == "float32" and not cmp.ok and len(cmp.differences) == 5
    verdicts = {r["step"]: r["accepted"] for r in cmp.records()}
    assert verdicts == {0: False, 1: False, 2: True, 3: False, 4: False}
    tie = cmp.records()[2]
    assert tie["float32_margin"] <= tie["allowance"] < 0.05 and tie["eager_margin"] < tie["tolerance"]
    assert all(r["float32_margin"] > r["allowance"] for r in cmp.records() if not r["accepted"])
    assert "4 of 5 BEYOND the allowance" in str(cmp)
    # without the arbiter, eager's own margin judges (the rule before float32 arbitrated)
    assert D.compare_greedy(runner_up, ex, 5, factor=None).judged_by == "eager margin"


def test_decode_registry_and_byte_counts():
    assert D.names()[:3] == ["decode", "decode_int8", "decode_int4"]
    with pytest.raises(KeyError, match="decode_int4"):
        D.get("decode_fp8")
    cfg = D.CONFIGS["decode"]
    assert cfg.head_dim == 64 and cfg.width == 512 and cfg.vocab == 4096 and cfg.cache == 1024
    bf16, i8, i4 = (D.weight_bytes(cfg, q) for q in D.QUANTS)
    assert bf16 > i8 > i4 > bf16 // 5
    assert D.cache_bytes(cfg) == 2 * 2 * 4 * cfg.batch * 8 * 1024 * 64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["decode", "decode_int8", "decode_int4"])
def test_decode_kernel_gives_eagers_20_tokens_on_the_gpu(name):
    """20 greedy steps, teacher-forced on eager's tokens: every token equals eager's, or is a near-tie in
    eager float32's logits, within 3 x the bf16 noise of a logit margin (cuBLAS and tkx sum in different orders;
    a 4096-way argmax over bf16 activations meets a near-tie now and then, see docs/decode.md)."""
    ex = D.get(name)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, device="cuda"))
    cmp = D.compare_greedy(runner, ex, TOKENS, device="cuda")
    print(name, cmp)
    assert cmp.ok, str(cmp)
    assert len(cmp.differences) <= 2, str(cmp)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("options", [{"weight_prefetch": True}, {"gemv_ring": 12}])
def test_decode_kernel_at_512_threads_gives_eagers_tokens_on_the_gpu(options):
    """The decode step at 512 threads per block, as the 1B benchmark builds it (the staged SwiGLU product, the
    float32 LM head from the stored bfloat16 embedding), with the L2 prefetch of the next GEMV stage's weights
    or the GEMVs' loads through a ``cp.async`` ring: eager's 20 greedy tokens, teacher-forced as above."""
    ex = D.get("decode")
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, device="cuda"),
                               tkx.Options(threads_per_block=512, **options))
    cmp = D.compare_greedy(runner, ex, TOKENS, device="cuda")
    assert cmp.ok, str(cmp)
    assert len(cmp.differences) <= 2, str(cmp)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flash_decoding_kernel_on_the_gpu():
    """The flash-decoding groups as the compiled kernel runs them (16-byte cache loads, masked keys skipped,
    the combine): the decode shape (4 x 8 heads over 1024 positions of 64) at positions 0 (one key), 5,
    255 (the first tile), 700 and 1023 (every tile), against float32 attention over the first pos + 1 keys."""
    b, h, s, d = 4, 8, 1024, 64
    q, k, v = (rnd(b, h, d, dtype=BF16).cuda(), rnd(b, h, s, d, dtype=BF16).cuda(),
               rnd(b, h, s, d, dtype=BF16).cuda())

    def step(q, k, v, pos):
        scores = (q.unsqueeze(2) @ k.transpose(-2, -1)).float() / math.sqrt(d)
        scores = torch.where(torch.arange(s, device=pos.device) <= pos, scores, float("-inf"))
        return (scores.softmax(-1).to(BF16) @ v).squeeze(2)

    runner = tkx.runtime.build(step, (q, k, v, torch.tensor(0, device="cuda")))
    kinds = sorted(grp.kind for grp in runner.schedule.groups.values() if grp.kind.startswith("attention"))
    assert kinds == ["attention", "attention_partial"], kinds
    for pos in (0, 5, 255, 700, 1023):
        got = runner(q, k, v, torch.tensor(pos, device="cuda"))
        close(got.cpu(), amk_attention(q.cpu(), k.cpu(), v.cpu(), pos + 1).to(BF16), f"flash-decoding pos {pos}",
              rel=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quant,n,k", [("bf16", 1536, 512), ("bf16", 512, 200), ("bf16", 300, 100),
                                       ("bf16_offset", 1000, 264), ("int8", 512, 1536), ("int4", 4096, 512),
                                       ("int4", 512, 512)])
@pytest.mark.parametrize("ring", [0, 8])
def test_streaming_gemv_kernels_on_the_gpu(quant, n, k, ring):
    """The streaming GEMV as compiled: 16-byte loads (bf16; K = 200 ends inside a 256-element step, K = 100
    is not a multiple of 8 and takes the element loads; ``bf16_offset``: a weight view one element into its
    storage, not 16-byte aligned, read two bytes at a time, 1,000 columns ending inside a work item), the
    int8 / int4 dequantising chains with their rows prefetched, K split over warps; ``ring``: the 16-byte loads
    through a ``cp.async`` ring of shared memory (``Options.gemv_ring``); against AMK's fp32-accumulated
    column-tiled reference."""
    group = 128 if k % 128 == 0 else k
    opts = tkx.Options(gemv_ring=ring)
    w, x = rnd(n, k, scale=1 / math.sqrt(k)), rnd(4, k, dtype=BF16)
    if quant == "bf16_offset":
        storage = torch.empty(n * k + 1, dtype=BF16, device="cuda")
        wd = storage[1:].view(n, k)
        wd.copy_(w.to(BF16))
        runner = tkx.runtime.build(lambda x, w: F.linear(x, w), (x.cuda(), wd), opts)
        got, want = runner(x.cuda(), wd), amk_linear(x, w.to(BF16), n_tile=64)
    elif quant == "bf16":
        wb = w.to(BF16)
        runner = tkx.runtime.build(lambda x, w: F.linear(x, w), (x.cuda(), wb.cuda()), opts)
        got, want = runner(x.cuda(), wb.cuda()), amk_linear(x, wb, n_tile=64)
    else:
        qw, sc = (D.quantize_int8 if quant == "int8" else D.quantize_int4)(w, group)
        runner = tkx.runtime.build(lambda x, qw, s: F.linear(x, D.dequantize(qw, s, quant, group)),
                                   (x.cuda(), qw.cuda(), sc.cuda()), opts)
        got = runner(x.cuda(), qw.cuda(), sc.cuda())
        want = (f32(x) @ amk_dequant(qw, sc, quant, group, k).t()).to(BF16)
    close(got.cpu(), want, f"GEMV {quant} {n}x{k}")
