"""Regression tests for problems found by adversarial testing (wrong results, unclear errors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.schedule.interpreter import run as run_schedule


def _mutating_step(w, x):
    w.mul_(2)
    return (x @ w).pow(2).mean()


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_in_place_update_of_a_strided_input_is_staged_and_exact(layout):
    base = torch.randn(6, 6)
    w = torch.randn(3, 4).t() if layout == "transposed" else base[1:5, 1:4]
    x = torch.randn(2, 4)
    exp = tkx.explore(_mutating_step, (w, x))
    assert any(d.code == "staged-commit" for d in exp.schedule.decisions)
    w_eager, w_mine = w.clone(), w.clone()
    outside = base.clone()
    want = _mutating_step(w_eager, x)
    if layout == "sliced":  # the kernel's layout is the capture's: run on the real view
        got = run_schedule(exp.schedule, exp.arena, (w, x), update_inputs=True)
        assert torch.allclose(w, w_eager)
        mask = torch.ones_like(base, dtype=torch.bool)
        mask[1:5, 1:4] = False
        assert torch.equal(base[mask], outside[mask])  # nothing outside the view was written
    else:
        got = run_schedule(exp.schedule, exp.arena, (w_mine, x), update_inputs=True)
        assert torch.allclose(w_mine, w_eager)
    assert torch.allclose(got.outputs[0], want)


def test_integer_counters_are_exact():
    """int64 arithmetic runs in integer registers (it used to be refused: fp32 was exact only below 2**24)."""
    def step(w, c):
        c.add_(1)  # an int64 step counter
        return w.sum()

    from pipeline import check_step
    c = torch.tensor(16777217)
    exp = check_step(step, (torch.randn(3), c))
    got = tkx.reference.run(exp.optimized, (torch.randn(3), c.clone()), update_inputs=False).updates
    assert int(next(iter(got.values()))) == 16777218


def test_reference_honours_input_strides():
    def step(w, x):
        return (x @ w).sum()

    w, x = torch.randn(4, 3), torch.randn(2, 4)
    program = tkx.capture(step, (w, x)).lower()
    w_t = w.t().contiguous().t()  # same values, other strides
    assert torch.allclose(tkx.reference.run(program, (w_t, x)).outputs[0], step(w, x))


def test_reference_rejects_aliased_updated_inputs():
    def step(a, b):
        a.mul_(2)
        return (a + b).sum()

    a = torch.randn(3)
    program = tkx.capture(step, (a, a.clone())).lower()
    with pytest.raises(tkx.TkxError, match="shares memory"):
        tkx.reference.run(program, (a, a), update_inputs=True)


def test_exact_and_spin_limit_reach_the_kernel():
    ex = tkx.examples.get("linear_regression")
    exp = tkx.explore(ex.step_fn, ex.example_inputs)
    assert "__fadd_rn" not in exp.cuda.text
    exact = exp.with_options(exact=True, spin_limit=5000)
    assert "__fadd_rn" in exact.cuda.text or "__fmul_rn" in exact.cuda.text
    assert exact.captured is exp.captured  # capture is reused


def test_fusion_rule_errors_name_the_rule():
    ex = tkx.examples.get("linear_regression")
    exp = tkx.explore(ex.step_fn, ex.example_inputs)

    @tkx.fusion_rule(replace=True)
    def broken(c):
        return True

    try:
        with pytest.raises(tkx.TkxError, match="broken"):
            _ = exp.with_options(tile_m=32).schedule
    finally:
        from tkx.schedule import remove_fusion_rule
        remove_fusion_rule("broken")


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
def test_eval_loss_without_grad_compiles():
    def step(logits, y):
        return (F.cross_entropy(logits, y),)

    exp = tkx.explore(step, (torch.randn(8, 5), torch.randint(0, 5, (8,))))
    assert exp.cuda.check("sm_90").spill_bytes == 0


def test_explore_accepts_a_bare_tensor_and_options():
    exp = tkx.explore(lambda x: (x * 2).sum(), torch.randn(3, 5), options=tkx.Options(mode="block"))
    assert exp.program.inputs[0].value.shape == (3, 5) and exp.options.mode == "block"
    with pytest.raises(tkx.OptionsError):
        tkx.explore(lambda x: x.sum(), torch.randn(3), bogus=1)


@pytest.mark.parametrize("pad", [(0, 1), (2, 0, 1, 1), (-1, 2), (1, -2, -1, 1)])
def test_constant_pad_and_its_gradient(pad):
    """F.pad in constant mode (was refused as prims.copy_to naming no line; found by the family fuzzer):
    positive pads concatenate filled blocks, negative ones narrow, the gradient slices."""
    def step(x):
        def loss(x):
            y = F.pad(x, pad, value=0.5)
            return (y.sin() * torch.arange(1.0, y.numel() + 1).reshape(y.shape)).sum()
        g, value = torch.func.grad_and_value(loss)(x)
        return value, g, F.pad(x, pad)

    x = torch.randn(3, 4)
    exp = tkx.explore(step, (x,))
    want = step(x)
    for got in (tkx.reference.run(exp.optimized, (x,)).outputs, run_schedule(exp.schedule, exp.arena, (x,)).outputs):
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    if nvrtc_available():
        exp.cuda.check("sm_90")
