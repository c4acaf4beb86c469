"""The Llama-3.2-1B-shaped decode configurations (``tkx.examples.decode``): grouped-query attention, an LM
head tied to the embedding, rope theta 500,000 and a cache filled before the first step.

``llama_1b_tiny`` runs the same code path as ``llama_1b`` at CPU-test size through both interpreters;
the full ``llama_1b`` is explored on ``meta`` tensors (shapes only: nothing allocated) up to the CUDA
source, as the views show it.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten

import tkx
from tkx.examples import decode as D
from tkx.schedule.interpreter import run as run_schedule

TOKENS = 6


def test_llama_1b_has_the_published_shapes():
    cfg = D.CONFIGS["llama_1b"]
    # Llama-3.2-1B's model card: 1.24 B parameters (1.23 B with the embedding counted once)
    assert 1.23e9 < cfg.parameter_count() < 1.25e9
    assert (cfg.heads, cfg.kv, cfg.head_dim) == (32, 8, 64) and cfg.tied_head
    assert cfg.linear_shapes()["wk"] == (512, 2048) and cfg.linear_shapes()["w_down"] == (2048, 8192)
    # what one step reads: bf16 weights (the tied head read once) and the K/V cache up to its length
    assert D.weight_bytes(cfg) == pytest.approx(2 * cfg.parameter_count(), rel=1e-3)
    assert D.cache_bytes(cfg) == 2 * 2 * 16 * 1 * 8 * 2048 * 64


def test_llama_1b_tiny_is_the_same_code_path():
    tiny, full = D.CONFIGS["llama_1b_tiny"], D.CONFIGS["llama_1b"]
    assert tiny.kv < tiny.heads and tiny.tied_head and tiny.theta == full.theta and 0 < tiny.prefill < tiny.cache
    params, kc, vc, tokens, pos = D.get("llama_1b_tiny").make_inputs(0)
    assert "head" not in params and kc[0].shape == (tiny.batch, tiny.kv, tiny.cache, tiny.head_dim)
    assert int(pos) == tiny.prefill
    assert kc[0][:, :, :tiny.prefill].abs().sum() > 0 and kc[0][:, :, tiny.prefill:].abs().sum() == 0


def test_grouped_query_attention_matches_repeated_heads():
    """The grouped form (G query heads as G rows over one K/V head's cache) equals attention with each
    K/V head repeated G times, as ``repeat_interleave`` writes it."""
    ex = D.get("llama_1b_tiny")
    cfg = ex.config
    params, kc, vc, tokens, pos = ex.make_inputs(0)
    _, logits = D.make_decode_step(cfg, return_logits=True)(params, kc, vc, tokens, pos)
    g = cfg.heads // cfg.kv
    wide = D.DecodeConfig(**{**cfg.__dict__, "kv_heads": None})
    p2 = dict(params)
    for layer in range(cfg.layers):
        for name in ("wk", "wv"):
            w = params[f"l{layer}.{name}"].view(cfg.kv, cfg.head_dim, cfg.width)
            p2[f"l{layer}.{name}"] = w.repeat_interleave(g, 0).reshape(-1, cfg.width)
    _, kc2, vc2, _, _ = ex.make_inputs(0)
    kc2 = tuple(c.repeat_interleave(g, 1) for c in kc2)
    vc2 = tuple(c.repeat_interleave(g, 1) for c in vc2)
    _, logits2 = D.make_decode_step(wide, return_logits=True)(p2, kc2, vc2, tokens, pos)
    torch.testing.assert_close(logits, logits2, rtol=2e-2, atol=2e-2)


def _clone(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


@pytest.mark.parametrize("name", ["llama_1b_tiny", "llama_1b_tiny_int8"])
def test_llama_1b_tiny_greedy_tokens_through_both_interpreters(name):
    ex = D.get(name)
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0), name=name)
    want = D.generate(ex.step_fn, ex.make_inputs(0), TOKENS)
    for run in (lambda x: tkx.reference.run(exp.optimized, x, update_inputs=True),
                lambda x: run_schedule(exp.schedule, exp.arena, x, update_inputs=True)):
        flat, _ = tree_flatten(ex.make_inputs(0))
        got = []
        for _ in range(TOKENS):
            mine = _clone(flat)
            res = run(mine)
            for u in exp.optimized.updates:
                flat[u.input_index] = mine[u.input_index]
            got.append(res.outputs[0])
            flat[-2], flat[-1] = res.outputs[0], flat[-1] + 1
        assert torch.equal(torch.stack(got), want)


@pytest.mark.slow
def test_llama_1b_explores_on_meta_tensors_up_to_the_cuda_source():
    ex = D.get("llama_1b")
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0, device="meta"), name="llama_1b")
    layers = ex.config.layers
    assert sum(op.kind == "mm" for op in exp.optimized.ops) >= 7 * layers + 1
    assert len(exp.optimized.updates) == 2 * layers          # the caches, updated in place
    assert "__global__" in exp.cuda.text and exp.schedule.groups


@pytest.mark.slow
def test_llama_1b_kernel_emits_each_layer_body_once_and_compiles_without_spills():
    """The 16 layers share their group bodies (Options.outline='auto'): one device function per distinct body,
    so NVRTC compiles a 4,000-line kernel in about 30 s where the inline one took minutes."""
    from tkx.codegen.nvrtc import nvrtc_available

    ex = D.get("llama_1b")
    src = tkx.explore(ex.step_fn, ex.make_inputs(0, device="meta"), name="llama_1b").cuda
    functions = src.text.count("__device__ __noinline__")
    assert set(src.function_lines) == set(src.schedule.groups) and functions < 40
    assert src.num_lines < 6000
    if nvrtc_available():
        report = src.check("sm_90")
        assert report.spill_bytes == 0, report.summary()


def test_llama_1b_tiny_greedy_tokens_vary():
    """The embedding drawn with Llama's initialiser range (std 0.02): the tied head no longer hands the input
    token back (with std 1.0 every greedy token was the first one), so equal tokens say something."""
    ex = D.get("llama_1b_tiny")
    assert ex.config.embed_std == D.CONFIGS["llama_1b"].embed_std == 0.02
    tokens = D.generate(ex.step_fn, ex.make_inputs(0), 8).flatten().tolist()
    assert len(set(tokens)) >= 4, tokens


def test_logits_errors_measure_against_float32():
    """``logits_errors``: eager bf16 sits about bf16's rounding away from the float32 model (and a step that is
    eager itself errs exactly as much); logits scaled by 1.1 err by 0.1 more or less that."""
    ex = D.get("llama_1b_tiny_int8")
    eager = D.make_decode_step(ex.config, ex.quant, return_logits=True)
    same = D.logits_errors(eager, ex, 3)
    assert same.compiled == same.eager and all(1e-4 < e < 0.05 for e in same.eager)

    def scaled(*args):
        tokens, logits = eager(*args)
        return tokens, logits * 1.1

    off = D.logits_errors(scaled, ex, 3)
    assert all(abs(e - 0.1) < 0.02 for e in off.compiled) and "at most" in str(off)
    # the float32 reference reads the dequantised weights widened, the caches widened
    params, kc, vc, tokens, pos = D.float32_inputs(ex, ex.make_inputs(0))
    assert params["l0.wq"].dtype == kc[0].dtype == torch.float32 and "l0.wq.q" not in params
