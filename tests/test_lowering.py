"""Lowering: backward lines, messages per family, user lowerings/decompositions, index errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pipeline import check_step
from torch.func import grad_and_value, jvp, vmap

import tkx
from tkx.schedule.interpreter import run as run_schedule


def test_backward_ops_carry_the_line_of_the_forward_op_they_differentiate():
    def step(w, x, y):
        def loss_fn(w):
            h = torch.tanh(x @ w)  # LINE-TANH
            return ((h - y) ** 2).mean()  # LINE-LOSS
        g, loss = grad_and_value(loss_fn)(w)
        return loss, w - 0.1 * g

    program = tkx.explore(step, (torch.randn(4, 2), torch.randn(8, 4), torch.randn(8, 2))).program
    backward = [op for op in program.ops if op.region == "backward"]
    codes = {op.source.code for op in backward}
    assert any("LINE-TANH" in c for c in codes) and any("LINE-LOSS" in c for c in codes)
    mm_grad = next(op for op in backward if op.kind == "mm")
    assert "LINE-TANH" in mm_grad.source.code  # the weight gradient belongs to x @ w


def test_slice_backward_points_at_the_slice():
    def step(w, x):
        def loss_fn(w):
            h = x @ w
            a = h[:, :2]  # THE-SLICE
            return (a * a).sum()
        g, loss = grad_and_value(loss_fn)(w)
        return loss, w - 0.1 * g

    exp = check_step(step, (torch.randn(3, 5), torch.randn(4, 3)))
    scatter = next(op for op in exp.program.ops if op.kind == "slice_scatter")
    assert "THE-SLICE" in scatter.source.code


def test_batch_norm_without_running_stats_compiles():
    def step(w, x):
        def loss_fn(w):
            return F.batch_norm(x @ w, None, None, training=True).pow(2).mean()
        g, loss = grad_and_value(loss_fn)(w)
        return loss, w - 0.1 * g

    exp = check_step(step, (torch.randn(4, 3), torch.randn(8, 4)))
    assert "mean" in {op.kind for op in exp.program.ops}


def test_forward_mode_compiles():
    """jvp's internal ops (symbolic zero tangents, size checks) are gone at capture."""
    def step(w, x):
        out, tangent = jvp(lambda w: (x @ w).sum(), (w,), (torch.ones_like(w),))
        return out, tangent

    exp = check_step(step, (torch.randn(4, 3), torch.randn(8, 4)), nvrtc=False)
    internal = ("is_same_size", "_has_same_storage_numel", "_efficientzerotensor")
    assert not [n.target for n in exp.captured.nodes if any(name in n.target for name in internal)]


def test_vmap_cross_entropy_now_compiles():
    def step(w, x, y):
        def one_loss(w, xi, yi):
            return F.cross_entropy((xi @ w).unsqueeze(0), yi.unsqueeze(0))
        per_example = vmap(torch.func.grad(one_loss), in_dims=(None, 0, 0))(w, x, y)
        return w - 0.1 * per_example.mean(0)

    check_step(step, (torch.randn(8, 4), torch.randn(16, 8), torch.randint(0, 4, (16,))))


def test_user_lowering_and_decomposition_from_a_notebook_cell():
    aten = torch.ops.aten

    def step(x):
        return F.softshrink(x, 0.5) * 2

    with pytest.raises(tkx.UnsupportedError, match="softshrink"):
        _ = tkx.explore(step, (torch.randn(5),)).program

    @tkx.register_decomposition(aten.softshrink)
    def softshrink(x, lambd=0.5):
        return x - torch.clamp(x, -lambd, lambd)

    try:
        check_step(step, (torch.randn(5) * 4,))
    finally:
        tkx.unregister_decomposition(aten.softshrink)

    @tkx.register_lowering(aten.softshrink.default)
    def lower_softshrink(L, node):
        x, lambd = L.tensor(node.args[0]), float(node.args[1] if len(node.args) > 1 else 0.5)
        c = L.emit("clamp", (x,), x.shape, x.dtype, {"min": -lambd, "max": lambd}, base=f"{node.name}_c")
        return L.emit("sub", (x, c), x.shape, x.dtype)

    try:
        exp = check_step(step, (torch.randn(5) * 4,))
        assert any(op.kind == "clamp" for op in exp.program.ops)
    finally:
        tkx.unregister_lowering(aten.softshrink.default)


# -- out-of-range indices and labels: both interpreters raise what eager raises ---------------------

def _ce(w, x, y):
    return F.cross_entropy(x @ w, y)


def _one_hot(w, x, y):
    return (F.one_hot(y, 4).float() * (x @ w)).sum()


def _gather(w, x, y):
    return (x @ w).gather(1, y.unsqueeze(1)).sum()


def _embedding(w, x, y):
    return F.embedding(y, w.t()).sum()


def _index(w, x, y):
    return (x @ w)[torch.arange(8), y].sum()


@pytest.mark.parametrize("step", [_ce, _one_hot, _gather, _embedding, _index], ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("bad", [4, -5])
def test_out_of_range_labels_raise_in_both_interpreters(step, bad):
    w, x = torch.randn(3, 4), torch.randn(8, 3)
    good = torch.randint(0, 4, (8,))
    exp = tkx.explore(step, (w, x, good))
    y = good.clone()
    y[3] = bad
    with pytest.raises((IndexError, RuntimeError)):
        step(w, x, y)  # eager refuses it too
    for run in (lambda: tkx.reference.run(exp.optimized, (w, x, y)),
                lambda: run_schedule(exp.schedule, exp.arena, (w, x, y))):
        with pytest.raises(tkx.KernelError) as info:
            run()
        assert info.value.code == 3 and info.value.op is not None
        assert "test_lowering.py" in str(info.value)  # the user's line
    check_step(step, (w, x, good))  # in range: matches eager


def test_ignore_index_is_not_an_error_and_all_ignored_gives_zero_gradients():
    def step(w, x, y):
        g, loss = grad_and_value(_ce)(w, x, y)
        return loss, w - 0.1 * g

    w, x = torch.randn(3, 4), torch.randn(8, 3)
    y = torch.randint(0, 4, (8,))
    y[2] = -100
    check_step(step, (w, x, y))
    exp = tkx.explore(step, (w, x, y))
    out = tkx.reference.run(exp.optimized, (w, x, torch.full((8,), -100))).outputs
    assert torch.isnan(out[0]) and torch.equal(out[1], w)  # eager: NaN loss, weights unchanged


def test_kernel_error_word_is_in_the_generated_code():
    exp = tkx.explore(_ce, (torch.randn(3, 4), torch.randn(8, 3), torch.randint(0, 4, (8,))))
    assert "TKX_ERR_INDEX" in exp.cuda.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("step", [_ce, _one_hot, _gather, _embedding, _index], ids=lambda f: f.__name__[1:])
def test_out_of_range_labels_raise_kernel_error_on_the_gpu(step):
    """The kernel sets its error word; the runtime names the op and the user's line; the next call works."""
    w, x = torch.randn(3, 4, device="cuda"), torch.randn(8, 3, device="cuda")
    good = torch.randint(0, 4, (8,), device="cuda")
    runner = tkx.runtime.build(step, (w, x, good))
    bad = good.clone()
    bad[5] = 7
    with pytest.raises(tkx.KernelError) as info:
        runner(w, x, bad)
    assert info.value.code == 3 and "test_lowering.py" in str(info.value)
    torch.testing.assert_close(runner(w, x, good), step(w, x, good), rtol=1e-5, atol=1e-5)
