"""tkx.distributed: data parallel over torch.distributed (gloo on CPU ranks).

The equality tests run N ranks (forked by ``tkx.distributed.spawn``) for 5 steps, each on its slice of a
global batch, and compare the losses and the final parameters and optimizer state with ONE eager process
training on the concatenated batch.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

import tkx
import tkx.distributed as td
from tkx.examples import digits, get, transformer

STEPS = 5


# -- the workloads ------------------------------------------------------------------------------------
def llama_loss_fp32(params, tokens, targets):
    """``llama_block``'s loss computed in fp32 (the example computes in bf16, whose rounding of the
    weight gradients depends on how the batch is split: no data-parallel run equals it in fp32)."""
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    p = params
    x = F.embedding(tokens, p["embed"])
    h = transformer.rms_norm(x, p["attn_norm"])
    q, k, v = (transformer._heads(h @ p[name]) for name in ("wq", "wk", "wv"))
    att = transformer.causal_attention(transformer.rope(q, positions), transformer.rope(k, positions), v)
    x = x + transformer._merge(att) @ p["wo"]
    h = transformer.rms_norm(x, p["mlp_norm"])
    x = x + (F.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
    logits = transformer.rms_norm(x, p["final_norm"]) @ p["head"]
    return F.cross_entropy(logits.reshape(-1, transformer.T_VOCAB), targets.reshape(-1))


def llama_step_fp32(params, momenta, tokens, targets):
    """``llama_block_step`` (momentum SGD, functional) on the fp32 loss."""
    grads, loss = torch.func.grad_and_value(llama_loss_fp32)(params, tokens, targets)
    new_m = {k: transformer.MOMENTUM * momenta[k] + grads[k] for k in params}
    new_p = {k: params[k] - transformer.SGD_LR * new_m[k] for k in params}
    return loss, new_p, new_m


def digits_global_batches(world):
    """STEPS global batches of 64 x world digits (x fp32 [64w, 64], y int64 [64w])."""
    it = digits.digits_batches(64 * world, seed=1)
    return [next(it) for _ in range(STEPS)]


def token_global_batches(world):
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        seq = torch.randint(0, transformer.T_VOCAB, (transformer.T_BATCH * world, transformer.T_CONTEXT + 1),
                            generator=gen)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


WORKLOADS = {
    # name: (step, make_inputs, global batches, functional)
    "digits_mlp": (digits.digits_step, digits.make_digits_inputs, digits_global_batches, False),
    "llama_block_fp32": (llama_step_fp32, transformer.make_llama_inputs, token_global_batches, True),
}


def train(step, state, batches, functional):
    """Run ``step`` over ``batches`` from ``state`` (a tuple of state arguments); losses and final state."""
    losses = []
    for batch in batches:
        out = step(*state, *batch)
        if functional:
            loss, *new = out
            state = tuple(new)
        else:
            loss = out
        losses.append(float(loss))
    return losses, state


def shard(batch, rank, world):
    return tuple(t.chunk(world, dim=0)[rank].contiguous() for t in batch)


def rank_worker(rank, world, plan, name):
    step_fn, make_inputs, batches, functional = WORKLOADS[name]
    state = make_inputs(0)[: -2]
    step = td.data_parallel(plan)
    losses, state = train(step, state, [shard(b, rank, world) for b in batches(world)], functional)
    return losses, tree_map(lambda t: t.clone(), state), step.last_timings


@pytest.fixture(scope="module")
def plans():
    cache = {}

    def get_plan(name, world, **kw):
        key = (name, world, tuple(sorted(kw.items())))
        if key not in cache:
            step_fn, make_inputs, _, _ = WORKLOADS[name]
            cache[key] = td.plan(step_fn, make_inputs(0), world_size=world, **kw)
        return cache[key]
    return get_plan


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_data_parallel_equals_one_process_on_the_concatenated_batch(plans, name, world):
    step_fn, make_inputs, batches, functional = WORKLOADS[name]
    plan = plans(name, world, bucket_bytes=8 * 1024)
    assert len(plan.buckets) > 1  # several buckets, so the order and the split-back are exercised
    results = td.spawn(rank_worker, world, (plan, name))
    want_losses, want_state = train(step_fn, make_inputs(0)[: -2], batches(world), functional)
    for rank, (losses, state, timings) in enumerate(results):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
        got, want = tree_flatten(state)[0], tree_flatten(want_state)[0]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        assert set(timings) == {"a", "wait", "b"}
    # the ranks' losses differ from a single rank's own: the average really happened
    local_loss = float(step_fn(*make_inputs(0)[: -2], *shard(batches(world)[0], 0, world))[0]
                       if functional else step_fn(*make_inputs(0)[: -2], *shard(batches(world)[0], 0, world)))
    assert not math.isclose(local_loss, want_losses[0], rel_tol=1e-4)
