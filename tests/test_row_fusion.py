"""Row-persistent multi-reduction fusion (tkx/schedule/rows.py): softmax, log-softmax, cross-entropy and
layer norm over a row that fits in registers are ONE group; both CPU interpreters agree with eager,
the kernel compiles without spills, and every join is a recorded decision."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pipeline import check_step

import tkx
from tkx.codegen.nvrtc import nvrtc_available


def _f(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _row_groups(exp):
    return [g for g in exp.schedule.groups.values() if g.params.get("strategy") == "row"]


def _reductions(g, exp):
    return [o for o in g.ops if exp.schedule.op(o).family == "reduction"]


def softmax_step(x):
    return torch.softmax(x, dim=-1)


def log_softmax_step(x):
    return torch.log_softmax(x, dim=-1)


def layer_norm_step(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def ce_step(w, x, y):
    return torch.func.grad_and_value(lambda w: F.cross_entropy(x @ w, y))(w)


@pytest.mark.parametrize("shape", [(8, 10), (4, 3, 40), (16, 200)])
def test_softmax_is_one_group(shape):
    exp = check_step(softmax_step, (_f(*shape),))
    s = exp.schedule
    rows = _row_groups(exp)
    assert len(rows) == 1 and len(s.stages) == 1, str(s)
    assert {s.op(o).kind for o in _reductions(rows[0], exp)} == {"amax", "sum"}
    joins = [d for d in s.decisions if d.kind == "row" and d.fused]
    assert joins and all(d.rule == "row-fits" for d in joins)
    assert "joins the row pass of" in joins[0].sentence


def test_fewer_stages_than_without_row_fusion():
    x = _f(8, 10)
    on = tkx.explore(log_softmax_step, (x,)).schedule
    off = tkx.explore(log_softmax_step, (x,), fuse_rows=False).schedule
    assert len(on.stages) < len(off.stages), (str(on), str(off))
    assert not [g for g in off.groups.values() if g.params.get("strategy") == "row"]
    assert any(d.kind == "row" and not d.fused and d.code == "option-off" for d in off.decisions)


def test_log_softmax_and_layer_norm_through_every_stage():
    exp = check_step(log_softmax_step, (_f(6, 33),))
    assert len(_row_groups(exp)) == 1 and len(exp.schedule.stages) == 1
    exp = check_step(layer_norm_step, (_f(12, 64), _f(64, seed=1), _f(64, seed=2)), rtol=1e-4, atol=1e-5)
    (g,) = _row_groups(exp)
    assert len(_reductions(g, exp)) >= 2, str(exp.schedule)  # mean and variance in one pass each
    assert len(exp.schedule.stages) == 1, str(exp.schedule)


def test_cross_entropy_step_forward_and_backward():
    labels = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(3))
    w, x, y = _f(16, 10) / 4, _f(32, 16, seed=1), labels
    exp = check_step(ce_step, (w, x, y))
    groups = _row_groups(exp)
    kinds = [exp.schedule.op(o).kind for o in _reductions(groups[0], exp)]
    assert kinds[:2] == ["amax", "sum"], kinds  # max and sum of exp in one pass each
    # the picked log-prob's sum and the backward's sum over the same rows share a row group too
    assert sum(len(_reductions(g, exp)) for g in groups) >= 4, str(exp.schedule)
    off = tkx.explore(ce_step, (w, x, y), fuse_rows=False).schedule
    assert len(exp.schedule.stages) < len(off.stages)


def test_softmax_over_a_leading_dim_is_not_row_fused():
    # rows adjacent in memory: a warp per row would read strided; the ordinary strategies stay
    exp = check_step(lambda x: torch.softmax(x, dim=0), (_f(10, 64),))
    assert not _row_groups(exp)


@pytest.mark.parametrize("shape", [(16, 2048), (2, 8192)])
def test_a_row_too_long_for_registers_stays_apart(shape):
    """16 rows of 2048: one warp per row holds at most 512; 2 rows of 8192: a block of 256 holds 4096."""
    exp = check_step(softmax_step, (_f(*shape),), rtol=1e-4, atol=1e-6, nvrtc=False)
    assert not _row_groups(exp)
    row = [d for d in exp.schedule.decisions if d.kind == "row"]
    assert row and all(not d.fused and d.code == "row-too-long" and str(shape[1]) in d.reason for d in row)


def test_transposed_input_row():
    # the row read through a transposed view: loads at the view's strides, still one group
    exp = check_step(lambda x: torch.softmax(x.t(), dim=-1), (_f(24, 6),))
    assert len(_row_groups(exp)) == 1


def test_a_user_rule_can_refuse_the_row_join():
    @tkx.fusion_rule("no-rows", kinds=("row",), replace=True)
    def no_rows(c):
        return tkx.keep("user", "not fused: keep the passes apart")

    try:
        exp = check_step(softmax_step, (_f(8, 10),), nvrtc=False)
        assert not _row_groups(exp)
        assert any(d.rule == "no-rows" and not d.fused for d in exp.schedule.decisions)
    finally:
        tkx.schedule.remove_fusion_rule("no-rows")


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC")
def test_row_group_compiles_for_sm_90a_without_spills():
    exp = tkx.explore(layer_norm_step, (_f(12, 256), _f(256, seed=1), _f(256, seed=2)))
    assert _row_groups(exp)
    text = exp.cuda.text
    assert "row-persistent" in text and "tkx_rc0[k]" in text  # the row stays in registers
    for arch in ("sm_80", "sm_90", "sm_90a"):
        report = exp.cuda.check(arch)
        assert report.spill_bytes == 0, f"{arch}: {report}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fuse_rows", [True, False])
def test_row_fusion_verifies_on_the_gpu(fuse_rows):
    def make(seed=0, device="cuda"):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(16, 10, generator=g).div(4).to(device), torch.randn(64, 16, generator=g).to(device),
                torch.randint(0, 10, (64,), generator=g).to(device))

    runner = tkx.runtime.build(ce_step, make(0), tkx.Options(fuse_rows=fuse_rows))
    assert runner.verify(make_inputs=make).passed


def rms_norm_step(x, w):
    """RMSNorm as a decode step writes it: float32 statistics of a bf16 row, the result back in bf16."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    return h.to(x.dtype) * w


@pytest.mark.parametrize("rows,size,per_row", [(1, 2048, 256), (2, 2048, 256), (4, 2048, 256), (1, 256, 256),
                                               (1, 128, 32), (8, 512, 32), (64, 512, 32)])
def test_a_few_long_rows_take_a_block_each(rows, size, per_row):
    """A batch-1 (or batch-4) RMSNorm over d = 2048 is one row per block, every thread holding 8 of its
    elements, folded by a block reduction; many rows, or a short one, keep one warp per row."""
    x = _f(rows, size).to(torch.bfloat16)
    w = (1 + 0.1 * _f(size, seed=1)).to(torch.bfloat16)
    exp = check_step(rms_norm_step, (x, w), rtol=1e-2, atol=1e-2, nvrtc=False)
    (g,) = _row_groups(exp)
    assert g.plan.row_threads == per_row and g.work_items == (rows if per_row > 32 else -(-rows // 8))
    text = exp.cuda.text
    if per_row > 32:
        assert "one block of 256 threads per row" in text and "tkx_block_sum(acc_" in text
        assert "const int r = lane + 256 * k;" in text and f"for (int k = 0; k < {size // 256}; ++k)" in text
    else:
        assert "one warp per row" in text and "tkx_warp_sum(acc_" in text


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC")
def test_a_block_per_row_compiles_without_spills():
    exp = tkx.explore(rms_norm_step, (_f(1, 2048).to(torch.bfloat16), _f(2048, seed=1).to(torch.bfloat16)))
    assert _row_groups(exp)[0].plan.row_threads == 256
    for arch in ("sm_80", "sm_90a"):
        report = exp.cuda.check(arch)
        assert report.spill_bytes == 0, f"{arch}: {report}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 3])
def test_a_block_per_row_verifies_on_the_gpu(rows):
    def make(seed=0, device="cuda"):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(rows, 2048, generator=g).to(torch.bfloat16).to(device),
                (1 + 0.1 * torch.randn(2048, generator=g)).to(torch.bfloat16).to(device))

    runner = tkx.runtime.build(rms_norm_step, make(0))
    assert runner.verify(make_inputs=make).passed
