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
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:  # capture and schedule once; other world sizes only re-bucket
            step_fn, make_inputs, _, _ = WORKLOADS[name]
            cache[key] = td.plan(step_fn, make_inputs(0), world_size=world, **kw)
        return cache[key].with_world_size(world)
    return get_plan


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_data_parallel_equals_one_process_on_the_concatenated_batch(plans, name, world):
    step_fn, make_inputs, batches, functional = WORKLOADS[name]
    plan = plans(name, world, bucket_bytes=8 * 1024)
    assert len(plan.buckets) > 1  # several buckets, so the order and the split-back are exercised
    results = td.spawn(rank_worker, world, (plan, name))
    want_losses, want_state = train(step_fn, make_inputs(0)[: -2], batches(world), functional)
    for losses, state, timings in results:
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


def test_a_plan_for_more_ranks_reuses_the_schedules(plans):
    p2 = plans("digits_mlp", 2, bucket_bytes=8 * 1024)
    p4 = p2.with_world_size(4)
    assert p4.a.schedule is p2.a.schedule and p4.world_size == 4
    assert [b.members for b in p4.buckets] == [b.members for b in p2.buckets]
    assert p4.ring_bytes_per_rank == sum((2 * 3 * b.nbytes + 3) // 4 for b in p4.buckets)
    assert p2.ring_bytes_per_rank == p2.bytes_per_step  # 2 (N - 1) / N = 1 on two ranks
    assert p2.with_world_size(1).ring_bytes_per_rank == 0


# -- the split --------------------------------------------------------------------------------------
def test_split_cuts_digits_at_its_four_gradients_and_a_plus_b_is_the_step():
    ex = get("digits_mlp")
    cg = tkx.capture(ex.step_fn, ex.example_inputs)
    s = td.split_at_gradients(cg.program, loss_index=cg.loss_index)
    assert sorted(c.name for c in s.gradients) == [f"grad of params['{k}']" for k in ("b1", "b2", "w1", "w2")]
    assert {c.kind for c in s.cut} == {"gradient", "loss"} and all(c.reduce == "average" for c in s.cut)
    assert s.batch_args == (2, 3)
    names = [cg.program.inputs[i].name for i in s.replicated_inputs]
    assert len(names) == 8 and all(n.startswith(("params", "momentum_buf")) for n in names)
    a, b = s.forward_backward, s.update
    assert a.updates == () and not any(i.mutated for i in a.inputs)  # A writes nothing in place
    assert b.updates == cg.program.updates and {op.region for op in b.ops} == {"optimizer"}
    assert {op.region for op in a.ops} <= {"forward", "backward", "optimizer"}
    # A then B computes what the whole step computes (one rank: nothing to average)
    flat = tree_flatten(ex.make_inputs(0))[0]
    whole = tkx.reference.run(cg.program, flat)
    cut = tkx.reference.run(a, flat).outputs
    after = tkx.reference.run(b, flat + list(cut))
    assert torch.equal(after.outputs[0], whole.outputs[0])
    for i, v in whole.updates.items():
        assert torch.equal(after.updates[i], v)


def test_values_the_backward_saves_outside_the_loss_ancestry_stay_in_a():
    # gpt_block's layer norms save a cast of rstd for the backward: not an ancestor of the loss, read
    # only by the backward; capture labels it forward, and A (forward + backward) holds no optimizer op
    ex = get("gpt_block")
    cg = tkx.capture(ex.step_fn, ex.example_inputs)
    s = td.split_at_gradients(cg.program, loss_index=cg.loss_index)
    assert {c.kind for c in s.cut} == {"gradient", "loss"}
    assert len(s.gradients) == 15 and all(c.dtype == "float32" for c in s.gradients)
    assert {op.region for op in s.forward_backward.ops} == {"forward", "backward"}
    assert {op.region for op in s.update.ops} == {"optimizer"}


@pytest.mark.parametrize("name, batch", [("q_learning", ("obs", "actions", "rewards", "next_obs", "dones")),
                                         ("poly_clip_adamw", ("x", "y"))])
def test_zoo_steps_split_with_their_batch_found_and_every_gradient_named(name, batch):
    import inspect

    ex = get(name)
    cg = tkx.capture(ex.step_fn, ex.example_inputs)
    s = td.split_at_gradients(cg.program, loss_index=cg.loss_index)
    params = list(inspect.signature(ex.step_fn).parameters)
    # q_learning's target network is read only by the forward pass, yet it is replicated state, not batch
    assert tuple(params[a] for a in s.batch_args) == batch
    assert {c.kind for c in s.cut} == {"gradient", "loss"}
    # poly_clip_adamw updates p * (1 - lr * wd) - lr * update: the parameter is found one op back
    assert sorted(c.name for c in s.gradients) == sorted(f"grad of params['{k}']" for k in ex.example_inputs[0])


def no_gradient_step(w, x):
    w.sub_(0.1 * x.mean(0))
    return (w * x).sum()


def unused_gradient_step(w, x):
    g, loss = torch.func.grad_and_value(lambda w: (w * x).sum())(w)
    w.sub_(0.1)
    return loss


@pytest.mark.parametrize("step, words", [(no_gradient_step, "computes no gradient"),
                                         (unused_gradient_step, "no gradient boundary")])
def test_a_step_without_a_gradient_boundary_is_refused(step, words):
    with pytest.raises(td.DistributedError, match=words) as e:
        td.plan(step, (torch.randn(4), torch.randn(3, 4)))
    assert e.value.kind == "no-gradient" and "torch.func.grad_and_value" in str(e.value)
    assert str(e.value).startswith("tkx cannot run this step data parallel")


def bn_loss(p, x, y):
    h = x @ p["w"]
    mean = h.mean(0)
    var = ((h - mean) ** 2).mean(0)
    return F.mse_loss(((h - mean) * torch.rsqrt(var + 1e-5)) @ p["v"], y), mean


def bn_step(params, running_mean, x, y):
    """Batch-norm-like: the update keeps a running mean of the local batch's feature means."""
    grads, (loss, mean) = torch.func.grad_and_value(bn_loss, has_aux=True)(params, x, y)
    running_mean.mul_(0.9).add_(0.1 * mean)
    for k, p in params.items():
        p.sub_(0.1 * grads[k])
    return loss


def bn_inputs(batch=16):
    g = torch.Generator().manual_seed(0)
    return ({"w": torch.randn(8, 4, generator=g), "v": torch.randn(4, 1, generator=g)}, torch.zeros(4),
            torch.randn(batch, 8, generator=g), torch.randn(batch, 1, generator=g))


def test_batch_statistics_are_refused_with_the_users_line():
    with pytest.raises(td.DistributedError) as e:
        td.plan(bn_step, bn_inputs())
    err = e.value
    assert err.kind == "batch-statistic" and err.source is not None and "mean = h.mean(0)" in err.source.code
    assert "local_values='average'" in err.hint and "SyncBatchNorm" in err.hint


def bn_worker(rank, world, plans_by_mode):
    out = {}
    for mode, plan in plans_by_mode.items():
        params, running, x, y = bn_inputs(16 * world)
        mine = (x.chunk(world)[rank].contiguous(), y.chunk(world)[rank].contiguous())
        step = td.data_parallel(plan)
        step(params, running, *mine)
        out[mode] = (running.clone(), {k: v.clone() for k, v in params.items()})
    return out


def test_batch_statistics_averaged_or_kept_per_rank():
    plans_by_mode = {m: td.plan(bn_step, bn_inputs(), world_size=2, local_values=m) for m in ("average", "local")}
    kinds = {c.name: (c.kind, c.reduce) for c in plans_by_mode["local"].split.cut}
    assert kinds["mean"] == ("batch-statistic", "none") and "kept per rank" in str(plans_by_mode["local"])
    r0, r1 = td.spawn(bn_worker, 2, (plans_by_mode,))
    _, _, x, _ = bn_inputs(32)
    local_means = [(x.chunk(2)[r] @ bn_inputs()[0]["w"]).mean(0) for r in range(2)]
    # averaged: the mean of equal local batches' means is the global batch's mean
    torch.testing.assert_close(r0["average"][0], 0.1 * (x @ bn_inputs()[0]["w"]).mean(0))
    torch.testing.assert_close(r1["average"][0], r0["average"][0])
    # kept: each rank's own
    torch.testing.assert_close(r0["local"][0], 0.1 * local_means[0])
    torch.testing.assert_close(r1["local"][0], 0.1 * local_means[1])
    for mode in ("average", "local"):  # the parameters stay replicated either way
        for k in r0[mode][1]:
            torch.testing.assert_close(r0[mode][1][k], r1[mode][1][k], rtol=0, atol=0)


def test_batch_must_name_per_rank_arguments():
    ex = get("digits_mlp")
    with pytest.raises(td.DistributedError, match="params\\['w1'\\]") as e:
        td.plan(ex.step_fn, ex.example_inputs, batch=(0,))
    assert e.value.kind == "bad-batch"


def test_without_a_process_group_the_error_says_how_to_start_ranks():
    ex = get("digits_mlp")
    with pytest.raises(td.DistributedError, match="torchrun") as e:
        td.data_parallel(ex.step_fn, ex.example_inputs)
    assert "tkx.distributed.spawn" in str(e.value) and e.value.kind == "no-process-group"
    with pytest.raises(td.DistributedError, match="no torchrun environment"):
        td.init()


def _lm_step(p, tok, tgt_flat):
    def lf(p):
        return F.cross_entropy((F.embedding(tok, p["E"]) @ p["W"]).reshape(-1, 11), tgt_flat)
    g, loss = torch.func.grad_and_value(lf)(p)
    return loss, {k: p[k] - 0.1 * g[k] for k in p}


def ambiguous_worker(rank, world, batch):
    torch.manual_seed(0)
    p = {"E": torch.randn(11, 8), "W": torch.randn(8, 11)}
    tok, tgt = torch.randint(0, 11, (2 * 4, 5)), torch.randint(0, 11, (2 * 4 * 5,))
    my_tok, my_tgt = tok.chunk(world)[rank].contiguous(), tgt.chunk(world)[rank].contiguous()
    before = my_tok.clone()
    step = td.data_parallel(_lm_step, (p, my_tok, my_tgt), batch=batch)
    try:
        loss, new = step(p, my_tok, my_tgt)
    except td.DistributedError as e:
        return e.kind, str(e), torch.equal(before, my_tok), None
    return None, float(loss), torch.equal(before, my_tok), new["W"]


def test_an_argument_the_batch_guess_missed_is_checked_not_overwritten():
    """Tokens ``[B, T]`` beside targets flattened to ``[B*T]``: the derived batch is the targets, the tokens are
    taken as replicated; they differ between the ranks, so the first call raises on every rank (kind
    ``ambiguous-batch``, naming them and ``batch=``) and no rank's tokens are overwritten. With ``batch=(1, 2)``
    the step equals eager on the concatenated batch."""
    res = td.spawn(ambiguous_worker, 2, (None,))
    for kind, msg, unchanged, _ in res:
        assert kind == "ambiguous-batch" and "tok (4, 5)" in msg and "batch=" in msg and unchanged
    res = td.spawn(ambiguous_worker, 2, ((1, 2),))
    torch.manual_seed(0)
    p = {"E": torch.randn(11, 8), "W": torch.randn(8, 11)}
    tok, tgt = torch.randint(0, 11, (8, 5)), torch.randint(0, 11, (40,))
    loss, new = _lm_step(p, tok, tgt)
    for kind, got_loss, unchanged, w in res:
        assert kind is None and unchanged
        assert abs(got_loss - float(loss)) < 1e-5
        torch.testing.assert_close(w, new["W"], rtol=1e-5, atol=1e-6)


def mismatch_worker(rank, world, plan):
    try:
        td.data_parallel(plan)
    except td.DistributedError as e:
        return str(e)
    return None


def test_a_plan_for_another_world_size_is_refused(plans):
    msgs = td.spawn(mismatch_worker, 2, (plans("digits_mlp", 4, bucket_bytes=8 * 1024),))
    assert all("the plan is for 4 ranks, the process group has 2" in m and "with_world_size(2)" in m for m in msgs)


# -- the views ----------------------------------------------------------------------------------------
def test_the_plan_shows_where_the_collective_sits_and_the_bytes_per_bucket(plans):
    p = plans("llama_block_fp32", 2, bucket_bytes=8 * 1024)
    text = str(p)
    lines = text.splitlines()
    a_line = next(k for k, line in enumerate(lines) if "[A] forward + backward" in line)
    ar_line = next(k for k, line in enumerate(lines) if "[all-reduce, average over 2]" in line)
    b_line = next(k for k, line in enumerate(lines) if "[B] update" in line)
    assert a_line < ar_line < b_line  # the collective sits between A and B
    assert sum(f"bucket {b.index} " in text for b in p.buckets) == len(p.buckets)
    for b in p.buckets:
        assert f"payload {b.payload_bytes:,} B" in text
        assert b.payload_bytes <= 8 * 1024 or len(b.members) == 1  # the cap holds
        assert all(off * 4 % 256 == 0 for off in b.offsets)
    assert sum(b.payload_bytes for b in p.buckets) == sum(c.nbytes for c in p.split.averaged)
    assert {k for b in p.buckets for k in b.members} == {c.index for c in p.split.averaged}
    assert f"{p.bytes_per_step:,} B" in text
    # the schedule interpreter starts buckets mid-A: some before A's last stage, in stage order
    stages = [b.ready_stage for b in p.buckets]
    assert stages == sorted(stages) and min(stages) < len(p.a.schedule.stages) - 1
    assert "overlaps" in text
    bundle = p._repr_mimebundle_()
    assert bundle["text/plain"].startswith("<tkx.distributed.DistributedPlan llama_step_fp32: 2 ranks")
    html = bundle["text/html"]
    assert "Distributed plan" in html and "all-reduce (average)" in html and "bucket 0" in html
    no_overlap = td.plan(llama_step_fp32, transformer.make_llama_inputs(0), executor="reference")
    assert all(b.ready_stage is None for b in no_overlap.buckets) and "starts after A" in str(no_overlap)


def reference_worker(rank, world, plan):
    step_fn, make_inputs, batches, functional = WORKLOADS["digits_mlp"]
    losses, state = train(td.data_parallel(plan), make_inputs(0)[:-2],
                          [shard(b, rank, world) for b in batches(world)[:2]], functional)
    return losses


def test_the_reference_interpreter_runs_the_same_split(plans):
    p = plans("digits_mlp", 2, executor="reference")
    assert not p.overlap
    got = td.spawn(reference_worker, 2, (p,))
    step_fn, make_inputs, batches, functional = WORKLOADS["digits_mlp"]
    want, _ = train(step_fn, make_inputs(0)[:-2], batches(2)[:2], functional)
    for losses in got:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=1e-5, atol=1e-6)


# -- the GPU path: the two programs become two kernels -----------------------------------------------------
def test_both_programs_compile_to_kernels_with_nvrtc(plans):
    from tkx.codegen import generate
    from tkx.codegen.nvrtc import nvrtc_available

    ok, why = nvrtc_available()
    if not ok:
        pytest.skip(f"NVRTC unavailable: {why}")
    p = plans("digits_mlp", 2, bucket_bytes=8 * 1024)
    for sched, arena in ((p.a.schedule, p.a.arena), (p.b.schedule, p.b.arena)):
        report = generate(sched, arena).check("sm_90")
        assert report.registers > 0 and report.spill_bytes == 0


class InterpretedRunner:
    """Stands in for a CompiledRunner on CPU: ``run_flat`` through the schedule interpreter, writing the
    in-place updates into the inputs as the kernel does."""

    def __init__(self, sched, arena):
        self.sched, self.arena = sched, arena

    def run_flat(self, flat):
        from tkx.schedule import interpreter
        return list(interpreter.run(self.sched, self.arena, flat, update_inputs=True).outputs)


def compiled_path_worker(rank, world, plan):
    step = td.data_parallel(plan)
    step._compiled = lambda device: (InterpretedRunner(plan.a.schedule, plan.a.arena),
                                     InterpretedRunner(plan.b.schedule, plan.b.arena))
    step_fn, make_inputs, batches, functional = WORKLOADS["llama_block_fp32"]
    losses, state = train(step, make_inputs(0)[:-2], [shard(b, rank, world) for b in batches(world)[:2]],
                          functional)
    return losses, state


def test_the_kernel_path_moves_the_same_values(plans):
    """The executor="compiled" branch (two kernels, all-reduces after A) with the kernels replaced by the
    schedule interpreter: the data flow between them is what runs on GPUs."""
    import dataclasses

    p = dataclasses.replace(plans("llama_block_fp32", 2, bucket_bytes=8 * 1024), executor="compiled",
                            overlap=False).with_bucket_bytes(8 * 1024)
    assert all(b.ready_stage is None for b in p.buckets)
    results = td.spawn(compiled_path_worker, 2, (p,))
    step_fn, make_inputs, batches, functional = WORKLOADS["llama_block_fp32"]
    want_losses, want_state = train(step_fn, make_inputs(0)[:-2], batches(2)[:2], functional)
    for losses, state in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
        for g, w in zip(tree_flatten(state)[0], tree_flatten(want_state)[0]):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def gpu_worker(rank, world, name):
    step_fn, make_inputs, batches, functional = WORKLOADS[name]
    dev = torch.device("cuda", rank)
    state = tree_map(lambda t: t.to(dev), make_inputs(0)[:-2])
    mine = [tuple(t.to(dev) for t in shard(b, rank, world)) for b in batches(world)]
    step = td.data_parallel(step_fn, (*state, *mine[0]))
    assert step.plan.executor == "compiled" and step.plan.backend == "nccl"
    losses, state = train(step, state, mine, functional)
    return losses, tree_map(lambda t: t.cpu(), state)


def _check_against_one_process(results, name, world):
    step_fn, make_inputs, batches, functional = WORKLOADS[name]
    want_losses, want_state = train(step_fn, make_inputs(0)[:-2], batches(world), functional)
    for losses, state in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
        for g, w in zip(tree_flatten(state)[0], tree_flatten(want_state)[0]):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_nccl_compiled_kernels_on_one_gpu(name):
    """World size 1 on NCCL: the compiled A and B kernels with the collective in between."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    results = td.spawn(gpu_worker, 1, (name,), backend="nccl", start_method="spawn")
    _check_against_one_process(results, name, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_nccl_data_parallel_equals_one_process(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs (this machine has {torch.cuda.device_count()})")
    results = td.spawn(gpu_worker, world, ("digits_mlp",), backend="nccl", start_method="spawn")
    _check_against_one_process(results, "digits_mlp", world)


@pytest.mark.slow
def test_torchrun_starts_the_ranks(tmp_path):
    """``python -m torch.distributed.run --nproc_per_node 2 scripts/distributed_digits.py --check``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(root / "scripts" / "distributed_digits.py"), "--steps", "3", "--check"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data parallel on 2 ranks (gloo)" in r.stdout
    assert "rank 1 step 2 loss" in r.stdout and "(OK)" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", tkx.examples.names())
def test_every_zoo_step_splits_at_its_gradients(name):
    ex = get(name)
    cg = tkx.capture(ex.step_fn, ex.example_inputs)
    s = td.split_at_gradients(cg.program, loss_index=cg.loss_index)
    assert {c.kind for c in s.cut} == {"gradient", "loss"} and s.batch_args
    assert all(c.name.startswith("grad of ") for c in s.gradients), [c.name for c in s.gradients]
    assert s.forward_backward.updates == () and s.update.updates == cg.program.updates
