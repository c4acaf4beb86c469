"""Every kind of bad input raises one tkx.UnsupportedError naming the op and the user's line."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad_and_value

import tkx

W = torch.randn(4, 3)


def _line_of(fn, needle: str) -> int:
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if needle in text)


def step_unsupported_op(w, x):
    return torch.cumsum(x @ w, dim=0).sum()  # MARK


def step_dynamic_shape(w, x):
    y = x @ w
    return y[y > 0].sum()  # MARK


def step_data_dependent(w, x):
    y = x @ w
    if y.sum() > 0:  # MARK
        return y.sum()
    return -y.sum()


def step_closed_over(w, x):
    return (x @ W).sum() + w.sum()  # MARK


def step_random(w, x):
    return (torch.randint_like(x, 3) * x @ w).sum()  # MARK


def step_plain(w, x):
    def loss(w):
        return (x @ w).pow(2).mean()
    g, v = grad_and_value(loss)(w)
    return v, w - 0.1 * g


CASES = [
    (step_unsupported_op, "unsupported-op", "cumsum"),
    (step_dynamic_shape, "dynamic-shape", None),
    (step_data_dependent, "data-dependent-control-flow", None),
    (step_closed_over, "closed-over-tensor", None),
    (step_random, "random-op", None),
]


@pytest.mark.parametrize("fn,kind,op", CASES, ids=[c[1] for c in CASES])
def test_tracing_errors_name_op_and_line(fn, kind, op):
    w, x = torch.randn(4, 3), torch.randn(2, 4)
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(fn, (w, x))
    err = info.value
    assert err.kind == kind
    assert err.source is not None, str(err)
    assert err.source.line == _line_of(fn, "# MARK"), str(err)
    assert f"test_errors.py:{err.source.line}" in str(err)
    assert "fix:" in str(err)
    if op:
        assert op in str(err)


def _capture_line() -> int:
    import inspect
    return inspect.currentframe().f_back.f_lineno + 1


@pytest.mark.parametrize("inputs,kind", [
    ((), "bad-input"),
    ((torch.randn(4, 3), 0.1), "bad-input"),
    ((torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)), "unsupported-dtype"),
    ((torch.randn(4, 3), torch.randn(2, 4, device="meta")), "device-mismatch"),
], ids=["empty", "non-tensor", "float64", "devices"])
def test_input_errors_point_at_the_capture_call(inputs, kind):
    with pytest.raises(tkx.UnsupportedError) as info:
        line = _capture_line()
        tkx.capture(step_plain, inputs)
    assert info.value.kind == kind
    assert info.value.source is not None and info.value.source.line == line, str(info.value)


def test_shared_memory_inputs_rejected_only_when_one_is_updated():
    """Inputs that share memory are fine while the step only reads them (``x, y = data[:, :3], data[:, 3:]``,
    one tensor passed twice); updating one in place is refused at the capture call."""
    from tkx.schedule.interpreter import run as run_schedule

    w = torch.randn(4, 3)
    step = lambda a, b: (a + b).sum()  # noqa: E731
    exp = tkx.explore(step, (w, w))
    assert torch.allclose(run_schedule(exp.schedule, exp.arena, (w, w)).outputs[0], step(w, w))
    data = torch.randn(5, 7)
    x, y = data[:, :3], data[:, 3:]
    step2 = lambda x, y: (x.sum(1) * y.sum(1)).mean()  # noqa: E731
    exp = tkx.explore(step2, (x, y))
    assert torch.allclose(tkx.reference.run(exp.program, (x, y)).outputs[0], step2(x, y))

    def update(a, b):
        a.mul_(2.0)
        return b.sum()
    with pytest.raises(tkx.UnsupportedError, match="share memory and the step updates a in place") as info:
        line = _capture_line()
        tkx.capture(update, (w, w[1:]))
    assert info.value.kind == "bad-input" and info.value.source.line == line


def test_error_is_one_readable_message():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_random, (torch.randn(4, 3), torch.randn(2, 4)))
    text = str(info.value)
    assert text.startswith("tkx cannot compile this step (random-op)")
    assert "Traceback" not in text


def test_example_inputs_of_the_wrong_shape_get_one_bad_input_error_at_the_users_line(capfd):
    """x of 8 x 15 where the step multiplies by a 16 x 32 weight: one tkx error naming the line, no FakeTensor log."""
    def step(params, x):
        def loss_fn(p):
            return (x @ p["w"]).square().mean()  # the line the error names
        grads, loss = grad_and_value(loss_fn)(params)
        return loss, {k: v - 0.1 * grads[k] for k, v in params.items()}

    with pytest.raises(tkx.UnsupportedError) as info:
        _ = tkx.explore(step, ({"w": torch.randn(16, 32)}, torch.randn(8, 15))).captured
    e = info.value
    assert e.kind == "bad-input" and "[8, 15]" in str(e) and "shapes of example_inputs" in str(e)
    assert e.source is not None and "the line the error names" in e.source.code
    assert "failed while attempting to run meta" not in capfd.readouterr().err
    assert tkx.explore(step, ({"w": torch.randn(16, 32)}, torch.randn(8, 16))).captured is not None  # next call works


def test_a_float_index_tensor_is_refused_as_eager_refuses_it():
    """torch raises for a float index; tkx must not truncate 2.7 to row 2 (found by a fresh-user trial)."""
    def select(x, pos):
        return torch.index_select(x, 0, pos).sum()  # index_select of a float index

    def write(cache, v, pos):
        cache[:, pos] = v  # an in-place cache write at a float position
        return cache.sum()

    for step, args in ((select, (torch.randn(8, 4), torch.tensor([2.7]))),
                       (write, (torch.zeros(2, 8), torch.ones(2, 1), torch.tensor([2.7])))):
        with pytest.raises(tkx.UnsupportedError) as info:
            tkx.capture(step, args)
        e = info.value
        assert e.kind == "bad-input" and "float32 index tensor" in str(e) and "idx.long()" in str(e)
        assert e.source is not None and "float" in e.source.code
    ok = tkx.capture(select, (torch.randn(8, 4), torch.tensor([2]))).lower()
    x = torch.randn(8, 4)
    assert torch.equal(tkx.reference.run(ok, [x, torch.tensor([2])]).outputs[0], x[2].sum())


@pytest.mark.parametrize("which", ["layer_norm", "einsum"])
def test_shape_errors_of_torch_ops_are_bad_input(which):
    import torch.nn.functional as F

    def ln(x, w, b):
        return F.layer_norm(x, (24,), w, b).sum()  # the failing line

    def es(a, b):
        return torch.einsum("ij,jk->ik", a, b).sum()  # the failing line

    step, args = {"layer_norm": (ln, (torch.randn(4, 25), torch.ones(24), torch.zeros(24))),
                  "einsum": (es, (torch.randn(3, 4), torch.randn(5, 6)))}[which]
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step, args)
    assert info.value.kind == "bad-input" and "the failing line" in info.value.source.code


def test_a_branch_on_a_tensor_value_says_to_use_torch_where():
    def step(x):
        y = x * 2
        if y.sum() > 0:  # a Python branch on a tensor
            return y.sum()
        return (-y).sum()

    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step, (torch.randn(3),))
    text = str(info.value)
    assert info.value.kind == "data-dependent-control-flow" and "torch.where" in text
    assert "GuardOnDataDependent" not in text and "a Python branch" in info.value.source.code


def test_a_step_that_only_updates_in_place_may_return_nothing():
    def step(w, x):
        g, _ = grad_and_value(lambda w: (x @ w).square().mean())(w)
        w.sub_(0.1 * g)  # no return statement

    w, x = torch.randn(4, 3), torch.randn(5, 4)
    program = tkx.capture(step, (w, x)).lower()
    assert program.outputs == () and len(program.updates) == 1
    want = w.clone()
    step(want, x)
    got = w.clone()
    tkx.reference.run(program, [got, x], update_inputs=True)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("arch, words", [("sm_70", "8.0 or newer"), ("bogus", "not a GPU architecture")])
def test_an_architecture_nvrtc_or_tkx_cannot_target_is_named(arch, words):
    from tkx.codegen import nvrtc as nv
    if not nv.nvrtc_available()[0]:
        pytest.skip("NVRTC unavailable")
    src = tkx.explore(lambda x: (x * 2).sum(), (torch.randn(4),)).cuda
    with pytest.raises(nv.CudaCompileError, match=words) as info:
        src.check(arch)
    assert "headers" not in str(info.value)


def test_inputs_of_another_structure_name_the_missing_leaf():
    def step(p, x):
        return (x @ p["w"] + p["g"]).sum()

    program = tkx.capture(step, ({"w": torch.randn(3, 2), "g": torch.randn(2)}, torch.randn(4, 3))).lower()
    with pytest.raises(tkx.TkxError) as info:
        tkx.reference.run(program, ({"w": torch.randn(3, 2)}, torch.randn(4, 3)))
    assert str(info.value) == "inputs do not match the captured signature: missing args[0]['g']"


def test_scatter_with_a_float_index_is_refused_too():
    def step(x, idx, src):
        return x.scatter(0, idx, src).sum()  # scatter of a float index

    with pytest.raises(tkx.UnsupportedError, match="index tensor") as info:
        tkx.capture(step, (torch.zeros(4, 2), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2)))
    assert info.value.kind == "bad-input" and "idx.long()" in str(info.value)


def test_a_later_call_with_another_dtype_or_shape_says_what_to_pass():
    def step(p, x):
        return (x @ p["w"]).sum()

    program = tkx.capture(step, ({"w": torch.randn(3, 2)}, torch.randn(4, 3))).lower()
    with pytest.raises(tkx.TkxError, match=r"expected float32\[4, 3\], got float64\[4, 3\]; dtypes are fixed .* "
                                           r"pass float32 \(e\.g\. `\.to\(torch\.float32\)`\)"):
        tkx.reference.run(program, ({"w": torch.randn(3, 2)}, torch.randn(4, 3).double()))
    with pytest.raises(tkx.TkxError, match=r"got float32\[5, 3\]; shapes are fixed .* pass the captured shape"):
        tkx.reference.run(program, ({"w": torch.randn(3, 2)}, torch.randn(5, 3)))
    with pytest.raises(tkx.TkxError, match=r"missing args\[1\] \(x\)$"):
        tkx.reference.run(program, ({"w": torch.randn(3, 2)},))


def test_bad_input_in_a_stateful_step_is_one_error_without_torchs_log(caplog):
    """A module step whose example inputs do not fit its layers is one bad-input error naming the line; torch's
    FakeTensor ERROR log of the failed meta kernel (about 20 lines with a traceback) is held back."""
    import logging

    from stateful_steps import classify_step
    model = torch.nn.Sequential(torch.nn.Linear(20, 4))
    opt = torch.optim.AdamW(model.parameters())
    train_step = classify_step(model, opt)
    x, y = torch.randn(32, 21), torch.randint(0, 4, (32,))
    with caplog.at_level(logging.ERROR, logger="torch._subclasses.fake_tensor"):
        exp = tkx.explore(train_step, (x, y), state=(model, opt))
        with pytest.raises(tkx.UnsupportedError, match="bad-input") as info:
            exp.run(x, y)
    assert "train_step" in str(info.value) or "test_errors.py" in str(info.value)
    assert [r for r in caplog.records if r.name.startswith("torch._subclasses")] == []
