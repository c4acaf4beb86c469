"""Indexed writes into a big in-place buffer (issue 16, the KV-cache append): ``x[idx] = v``,
``index_copy_``, ``index_put_`` and ``scatter_`` lower to one IR ``scatter`` op; when it updates an input
in place, the schedule writes only the indexed slice (a loop over the values, not over the tensor).

Every case goes through the reference interpreter, the schedule interpreter (both against eager) and
the NVRTC compile (no spills), and checks that the group is a slice write of ``values.numel`` points.
"""

from __future__ import annotations

import re

import pytest
import torch
from pipeline import check_step

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.runtime.status import describe_status
from tkx.schedule.interpreter import run as run_schedule

BF16 = torch.bfloat16
B, H, S, D = 2, 3, 16, 8
g = torch.Generator().manual_seed(4)


def rnd(*shape, dtype=BF16):
    return torch.randn(*shape, generator=g).to(dtype)


def append_dim2(cache, k, pos):  # [B, H, S, D], the decode step's form
    cache[:, :, pos.view(1)] = k.unsqueeze(2)
    return (cache.float() * 2).sum(-1)


def append_dim1(cache, k, pos):  # [B, S, H, D]: the position on dim 1
    cache[:, pos.view(1)] = k.unsqueeze(1)
    return cache.float().sum(1)


def append_batch_of_positions(cache, k, idx):  # three positions at once: [B, H, 3, D] values
    cache[:, :, idx] = k
    return cache.float().amax(2)


def append_index_copy(cache, k, pos):
    cache.index_copy_(2, pos.view(1), k.unsqueeze(2))
    return cache.float().mean(2)


def append_index_put_dim0(table, rows, idx):  # x.index_put_((idx,), v): whole rows of a table
    table.index_put_((idx,), rows)
    return table.float().sum(0)


def append_scatter(cache, k, pos):  # scatter_ along dim 2 with the position broadcast
    cache.scatter_(2, pos.view(1, 1, 1, 1).expand(B, H, 1, D), k.unsqueeze(2))
    return cache.float().sum(2)


def append_two_indices(cache, k, h_idx, pos):  # x[:, h, p] = v with two index tensors (dims 1 and 2 merged)
    cache[:, h_idx, pos.view(1)] = k
    return cache.float().sum(0)


CASES = {
    "dim2": (append_dim2, lambda: (rnd(B, H, S, D), rnd(B, H, D), torch.tensor(5)), B * H * D),
    "dim1": (append_dim1, lambda: (rnd(B, S, H, D), rnd(B, H, D), torch.tensor(-1)), B * H * D),
    "batch_of_positions": (append_batch_of_positions,
                           lambda: (rnd(B, H, S, D), rnd(B, H, 3, D), torch.tensor([0, 7, 15])), B * H * 3 * D),
    "index_copy": (append_index_copy, lambda: (rnd(B, H, S, D), rnd(B, H, D), torch.tensor(9)), B * H * D),
    "index_put_dim0": (append_index_put_dim0, lambda: (rnd(S, D, dtype=torch.float32), rnd(2, D, dtype=torch.float32),
                                                       torch.tensor([3, 11])), 2 * D),
    "scatter": (append_scatter, lambda: (rnd(B, H, S, D), rnd(B, H, D), torch.tensor(12)), B * H * D),
    "two_indices": (append_two_indices, lambda: (rnd(B, H, S, D), rnd(B, 2, D), torch.tensor([2, 0]),
                                                 torch.tensor(4)), B * 2 * D),
}


def slice_group(exp):
    groups = [grp for grp in exp.schedule.groups.values() if grp.plan.get("slice_write")]
    assert len(groups) == 1, exp.schedule
    return groups[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_slice_write_matches_eager_and_covers_only_the_values(name):
    step, make, points = CASES[name]
    exp = check_step(step, make(), rtol=1e-2, atol=1e-2)  # both interpreters vs eager, NVRTC without spills
    assert "scatter" in {op.kind for op in exp.optimized.ops}
    grp = slice_group(exp)
    assert grp.plan["numel"] == points and grp.work_items == 1
    assert exp.schedule.homes[grp.anchor].kind == "input"
    decision = next(d for d in exp.schedule.decisions if d.kind == "in-place" and d.producer == grp.anchor)
    assert decision.fused and decision.code == "slice-write", decision
    assert "(only the indexed slice)" in exp.cuda.text
    assert "masked write in place" not in exp.cuda.text


def test_duplicate_positions_keep_the_last_write_in_every_stage():
    """torch leaves the order of duplicate writes undefined; tkx keeps the last (the largest j) everywhere."""
    def step(cache, k, idx):
        cache[:, :, idx] = k
        return cache.float().sum()

    cache, k, idx = rnd(B, H, S, D), rnd(B, H, 4, D), torch.tensor([2, 9, 2, -7])  # 2 twice, -7 is 9
    want = cache.clone()
    for j, p in enumerate(idx.tolist()):  # a sequential loop: the last write wins
        want[:, :, p] = k[:, :, j]
    exp = tkx.explore(step, (cache.clone(), k, idx))
    for run in (lambda x: tkx.reference.run(exp.optimized, x, update_inputs=True),
                lambda x: run_schedule(exp.schedule, exp.arena, x, update_inputs=True)):
        mine = [cache.clone(), k, idx]
        run(mine)
        assert torch.equal(mine[0], want)
    assert slice_group(exp).plan["numel"] == B * H * 4 * D
    assert "tkx_last = false" in exp.cuda.text  # the kernel skips a value a later one overwrites


def test_a_fresh_buffer_or_a_read_of_the_old_value_computes_the_whole_result():
    """No slice write where the untouched positions are not already in place: a new tensor, or values read
    from the old cache (a staged commit)."""
    def fresh(k, pos):
        buf = torch.zeros(B, H, S, D, dtype=BF16, device=k.device)
        buf[:, :, pos.view(1)] = k.unsqueeze(2)
        return buf

    def reads_old(cache, pos):
        cache[:, :, pos.view(1)] = cache[:, :, :1] * 2
        return cache.float().sum()

    for step, inputs in ((fresh, (rnd(B, H, D), torch.tensor(3))),
                         (reads_old, (rnd(B, H, S, D), torch.tensor(6)))):
        exp = check_step(step, inputs, rtol=1e-2, atol=1e-2)
        assert not any(grp.plan.get("slice_write") for grp in exp.schedule.groups.values())
        scat = next(op for op in exp.optimized.ops if op.kind == "scatter")
        assert exp.schedule.group_of(scat.id).work_items >= B * H * S * D // 256


def test_a_bad_position_is_one_index_error_naming_the_users_line():
    step, make, _ = CASES["dim2"]
    cache, k, _ = make()
    exp = tkx.explore(step, (cache, k, torch.tensor(5)))
    with pytest.raises(IndexError):
        step(cache.clone(), k, torch.tensor(S))  # eager refuses it too
    for run in (lambda x: tkx.reference.run(exp.optimized, x),
                lambda x: run_schedule(exp.schedule, exp.arena, x)):
        with pytest.raises(tkx.KernelError) as info:
            run([cache.clone(), k, torch.tensor(S)])
        assert info.value.code == 3 and "index_put x[idx] = v" in str(info.value)
        assert "test_decode_append.py" in str(info.value)
    # the kernel: an out-of-range position sets the index error (and writes nothing); the runtime names the op
    group = exp.cuda.text[exp.cuda.text.index("tkx_j < 0"):]
    number = int(re.search(r"tkx_fail\(status, TKX_ERR_INDEX, (\d+)\)", group).group(1))
    err = describe_status(3, number, 0, exp.schedule)
    assert "index_put x[idx] = v" in str(err) and "test_decode_append.py" in str(err)


def test_decode_step_appends_write_only_their_slice():
    from tkx.examples import decode as D

    ex = D.get("decode_tiny")
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0), name="decode_tiny")
    cfg = ex.config
    slices = [grp for grp in exp.schedule.groups.values() if grp.plan.get("slice_write")]
    assert len(slices) == 2 * cfg.layers  # one K and one V append per layer
    assert all(grp.plan["numel"] == cfg.batch * cfg.heads * cfg.head_dim for grp in slices)
    if nvrtc_available():
        assert exp.cuda.check("sm_90").spill_bytes == 0


# -- fewer, coarser work items and fewer stages ------------------------------------------------------


def test_a_big_pointwise_loop_gives_each_thread_several_points():
    from tkx.target import POINTWISE_MAX_PER_THREAD, SM_COUNT

    def step(x, y):
        return torch.sigmoid(x) * y + 1.0

    n = 256 * 4 * SM_COUNT * 6 + 77  # six times the one-point-per-thread limit, and a ragged tail
    x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
    exp = check_step(step, (x, y))
    grp = next(grp for grp in exp.schedule.groups.values() if grp.kind == "pointwise")
    per = grp.plan["per_thread"]
    assert 1 < per <= POINTWISE_MAX_PER_THREAD and grp.work_items == -(-n // (256 * per))
    assert f"{per} points per thread" in exp.cuda.text
    small = tkx.explore(step, (x[:1000], y[:1000])).schedule
    assert all("per_thread" not in grp.plan for grp in small.groups.values())  # a small loop keeps one point


def test_swiglu_gate_and_up_gemvs_share_a_stage_in_the_decode_step():
    from tkx.examples import decode as D

    ex = D.get("decode_tiny")
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0), name="decode_tiny")
    s = exp.schedule
    stage_of = {gid: k for k, st in enumerate(s.stages) for gid in st}
    gemms = [grp for grp in s.groups.values() if grp.kind == "gemm"]
    w = {op.id: op for op in exp.optimized.ops}
    # per layer: q/k/v share a stage, gate/up share one: 3 + 1 + 2 + 1 stages of GEMMs, not 3 + 1 + 3 + 1
    sharing = {}
    for grp in gemms:
        sharing.setdefault(stage_of[grp.id], []).append(grp.anchor)
    pairs = [a for a in sharing.values() if len(a) == 2]
    assert len(pairs) == ex.config.layers, sharing
    sib = [d for d in s.decisions if d.code == "sibling-gemms"]
    short = [d for d in s.decisions if d.code == "gemv-short-operand"]
    assert len(sib) == len(short) == ex.config.layers and all(d.fused for d in short) and not any(d.fused for d in sib)
    for d in short:  # the SwiGLU product is computed in the down projection's operand load, never stored
        down = s.group_of(d.consumer)
        assert d.producer in s.inlined and d.producer in down.inlined
        assert w[d.consumer].kind == "mm"
        # every warp of the GEMV reads its short operand again: only the product is recomputed there, the
        # sigmoid is computed once in the gate GEMV's epilogue loop
        assert {w[m].kind for m in down.inlined} == {"mul"}
    assert any("sigmoid" in {w[m].kind for m in grp.inlined} for grp in gemms)
    assert len(s.stages) == 21  # 23 without the rule (flash-decoding: partial + combine stages per layer)

    @tkx.fusion_rule("plain-epilogues", kinds=("epilogue",), replace=True)
    def plain(c):  # a user rule asked before the built-ins: the old schedule, for an A/B timing
        return tkx.fuse("legal", "fused: every epilogue")

    try:
        old = tkx.explore(ex.step_fn, ex.make_inputs(0), name="decode_tiny").schedule
        assert len(old.stages) == 23 and not [d for d in old.decisions if d.code == "gemv-short-operand"]
    finally:
        from tkx.schedule import remove_fusion_rule
        remove_fusion_rule("plain-epilogues")


def test_sibling_rule_leaves_wide_gemms_alone():
    """Only a skinny consumer (a GEMV) takes the product into its operand load: a training-sized SwiGLU keeps
    the epilogue."""
    import torch.nn.functional as F

    def mlp(x, wg, wu, wd):
        return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)

    args = (torch.randn(64, 32, generator=g), torch.randn(48, 32, generator=g), torch.randn(48, 32, generator=g),
            torch.randn(32, 48, generator=g))
    wide = check_step(mlp, args)
    assert not [d for d in wide.schedule.decisions if d.code in ("sibling-gemms", "gemv-short-operand")]
    skinny = check_step(mlp, (args[0][:2],) + args[1:])
    assert [d for d in skinny.schedule.decisions if d.code == "gemv-short-operand"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_slice_write_and_coarse_items_on_the_gpu():
    for step, make, _ in (CASES["dim2"], CASES["batch_of_positions"], CASES["scatter"]):
        inputs = [t.cuda() for t in make()]
        runner = tkx.runtime.build(step, inputs)
        assert runner.verify(make_inputs=lambda seed, device="cuda", make=make: [t.to(device) for t in make()],
                             strict=True).passed

    def big(x, y):
        return torch.sigmoid(x) * y + 1.0

    x = torch.randn(256 * 4 * 132 * 6 + 77, device="cuda")
    runner = tkx.runtime.build(big, (x, x.clone()))
    assert runner.verify(make_inputs=lambda seed, device="cuda": (torch.randn(x.numel(), device=device),
                                                                  torch.randn(x.numel(), device=device)),
                         strict=True).passed


def test_a_zero_d_position_as_an_index_says_to_keep_it_a_tensor():
    def step(cache, k, pos):
        cache[:, :, pos] = k  # torch turns a 0-d integer tensor index into a Python int (data-dependent)
        return cache.sum()

    with pytest.raises(tkx.UnsupportedError) as info:
        _ = tkx.explore(step, (rnd(B, H, S, D), rnd(B, H, D), torch.tensor(5))).program
    text = str(info.value)
    assert info.value.kind == "data-dependent-control-flow" and "pos.view(1)" in text
    assert "test_decode_append.py" in text and "cache[:, :, pos] = k" in text
