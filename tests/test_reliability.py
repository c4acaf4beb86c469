"""Issue 17: no wrong number without an error, no poisoned session, errors that point at the
user's line. One regression test per finding (the GPU ones are marked ``gpu``)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.func import grad_and_value, hessian, vmap

import tkx

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _line_of(fn, needle: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if needle in text)


def step_functional(w, x):
    g, v = grad_and_value(lambda w: (x @ w).pow(2).mean())(w)
    return v, w - 0.1 * g


def _wx():
    return torch.randn(3, 3), torch.randn(2, 3)


# -- item 2: in-place update of an input whose elements share memory ----------------------------

def step_update_in_place(w, x):
    g, v = grad_and_value(lambda w: (x @ w).pow(2).mean())(w)
    w.sub_(0.1 * g)  # MARK
    return v


def _overlap_refused(device: str) -> None:
    w = torch.randn(1, 3, device=device).expand(3, 3)
    x = torch.randn(2, 3, device=device)
    with pytest.raises(RuntimeError, match="more than one element"):  # eager refuses it
        step_update_in_place(w, x)
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_update_in_place, (w, x))
    err = info.value
    assert err.kind == "overlapping-write"
    assert "more than one element of w refers to a single memory location" in str(err)
    assert err.source is not None and err.source.line == _line_of(step_update_in_place, "# MARK")
    assert "clone()" in err.hint
    # the same step with a tensor of its own memory compiles
    tkx.capture(step_update_in_place, (w.clone(), x))


def test_in_place_update_of_overlapping_input_refused():
    _overlap_refused("cpu")


def test_overlapping_input_only_read_is_fine():
    w = torch.randn(1, 3).expand(3, 3)
    tkx.capture(step_functional, (w, torch.randn(2, 3)))


@pytest.mark.gpu
@gpu
def test_in_place_update_of_overlapping_input_refused_on_cuda():
    _overlap_refused("cuda")


# -- item 7: a failed capture leaves torch's state as it found it ------------------------------

def test_failed_functorch_capture_does_not_poison_the_session():
    def f(x):
        return x.sin().sum()

    def step(x):
        return vmap(hessian(f))(x).sum()

    before = torch._C._dispatch_tls_local_exclude_set()
    try:
        tkx.capture(step, (torch.randn(3, 4),))
    except tkx.UnsupportedError:
        pass  # torch may or may not trace vmap(hessian(...)); either way the state must survive
    assert str(torch._C._dispatch_tls_local_exclude_set()) == str(before)
    assert torch._C._functorch.peek_interpreter_stack() is None
    assert torch.is_grad_enabled()
    c = tkx.capture(step_functional, _wx())
    assert c.program.ops


def test_guard_undoes_leaked_functorch_state():
    from tkx.capture.trace import TorchStateGuard
    guard = TorchStateGuard().__enter__()
    torch._C._dispatch_tls_set_dispatch_key_excluded(torch._C.DispatchKey.Functionalize, True)
    torch.set_grad_enabled(False)
    undone = guard.restored()
    assert "dispatch keys" in undone and "grad mode" in undone
    assert not torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Functionalize)
    assert torch.is_grad_enabled()
    assert guard.restored(final=True) == []


# -- item 11: imperative training inside the step -----------------------------------------------

def step_backward(w, x):
    loss = (x @ w).pow(2).mean()
    loss.backward()  # MARK
    return loss


def step_requires_grad(w, x):
    w = w.requires_grad_()  # MARK
    return (x @ w).pow(2).mean()


def step_optimizer(w, x):
    g, v = grad_and_value(lambda w: (x @ w).pow(2).mean())(w)
    w.grad = g
    torch.optim.SGD([w], lr=0.1).step()  # MARK
    return v


@pytest.mark.parametrize("fn", [step_backward, step_requires_grad, step_optimizer],
                         ids=["backward", "requires_grad_", "optim.step"])
def test_imperative_training_says_the_step_must_be_functional(fn):
    w, x = _wx()
    if fn is step_backward:
        w.requires_grad_()
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(fn, (w, x))
    err = info.value
    assert err.kind == "not-functional", str(err)
    assert "grad_and_value" in err.hint and "p - lr * grads[k]" in err.hint
    assert err.source is not None and err.source.line == _line_of(fn, "# MARK"), str(err)


# -- item 12: API errors ------------------------------------------------------------------------

def test_step_fn_none_is_a_bad_call():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(None, _wx())
    assert info.value.kind == "bad-call" and "not a function" in str(info.value)
    assert "TypeError" not in str(info.value)


def test_zero_row_batch_refused_at_capture():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_functional, (torch.randn(3, 3), torch.randn(0, 3)))
    assert info.value.kind == "bad-input" and "input x has shape (0, 3)" in str(info.value)
    assert info.value.source is not None and info.value.source.file == __file__


def test_meta_inputs_are_not_told_they_share_memory():
    w, x = torch.randn(3, 3, device="meta"), torch.randn(2, 3, device="meta")
    c = tkx.capture(step_functional, (w, x))
    assert [i.name for i in c.program.inputs] == ["w", "x"]


def step_raises(w, x):
    raise ValueError("my own problem")  # MARK


def test_users_own_exception_is_not_unsupported_op():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_raises, _wx())
    err = info.value
    assert err.kind == "step-raised" and "ValueError: my own problem" in str(err)
    assert err.source.line == _line_of(step_raises, "# MARK")
    assert isinstance(err.__cause__, ValueError)


def test_options_as_a_dict():
    exp = tkx.explore(step_functional, _wx(), options={"fuse_pointwise": False})
    assert exp.options.fuse_pointwise is False
    with pytest.raises(tkx.OptionsError, match="tile_mm"):
        tkx.explore(step_functional, _wx(), options={"tile_mm": 32})
    with pytest.raises(tkx.OptionsError, match="not list"):
        tkx.explore(step_functional, _wx(), options=[1])


def test_loss_pointing_at_a_non_scalar_refused():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_functional, _wx(), loss=1)
    assert "not a 0-d floating-point tensor" in str(info.value) and "(3, 3)" in str(info.value)
    assert tkx.capture(step_functional, _wx(), loss=0).loss_index == 0


# -- item 4: cross-entropy with every target ignored --------------------------------------------

def step_cross_entropy(w, x, y):
    g, v = grad_and_value(lambda w: torch.nn.functional.cross_entropy(x @ w, y))(w)
    return v, w - 0.1 * g


@pytest.mark.parametrize("targets", [[-100, -100], [2, -100]], ids=["all-ignored", "one-ignored"])
def test_cross_entropy_ignored_targets_give_eager_gradients(targets):
    from tkx.schedule import interpreter
    torch.manual_seed(0)
    inputs = (torch.randn(3, 4), torch.randn(2, 3), torch.tensor(targets))
    want_loss, want_w = step_cross_entropy(*inputs)
    exp = tkx.explore(step_cross_entropy, inputs)
    for run in (tkx.reference.run(exp.program, inputs), interpreter.run(exp.schedule, exp.arena, inputs)):
        loss, w = run.outputs
        assert torch.isfinite(w).all(), w
        torch.testing.assert_close(w, want_w)
        assert torch.isnan(loss) == torch.isnan(want_loss)


# -- item 5: the schedule interpreter reads a view of an arena slot at its own offset ------------

def step_sum_of_sums(a, b):
    s = (a * a).sum() + (b * b).sum()
    return s + (s * s).sum()


def step_tiny_clipped_mlp(w1, b1, w2, b2, x, y):
    def loss_fn(p):
        w1, b1, w2, b2 = p
        h = torch.relu(x @ w1 + b1)
        return ((h @ w2 + b2 - y) ** 2).mean()
    g, v = grad_and_value(loss_fn)((w1, b1, w2, b2))
    norm = torch.sqrt(sum((gi * gi).sum() for gi in g))
    scale = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
    return v, w1 - 0.1 * scale * g[0], b1 - 0.1 * scale * g[1], w2 - 0.1 * scale * g[2], b2 - 0.1 * scale * g[3]


@pytest.mark.parametrize("case", ["sum_of_sums", "tiny_clipped_mlp"])
@pytest.mark.parametrize("opts", [dict(fuse_pointwise=False), dict(fuse_pointwise=False, fuse_epilogues=False), {}],
                         ids=["no-pointwise", "no-pointwise-no-epilogue", "default"])
def test_schedule_interpreter_agrees_with_reference_on_views(case, opts):
    from tkx.schedule import interpreter
    from tkx.schedule.check import check_hazards
    torch.manual_seed(0)
    if case == "sum_of_sums":
        fn, inputs = step_sum_of_sums, (torch.randn(3), torch.randn(4))
    else:
        fn = step_tiny_clipped_mlp
        inputs = (torch.randn(1, 1), torch.randn(()), torch.randn(1, 1), torch.randn(()),
                  torch.randn(4, 1), torch.randn(4, 1))
    exp = tkx.explore(fn, inputs, **opts)
    want = fn(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    ref = tkx.reference.run(exp.program, inputs).outputs
    got = interpreter.run(exp.schedule, exp.arena, inputs).outputs
    for w, r, g in zip(want, ref, got):
        torch.testing.assert_close(r, w)
        torch.testing.assert_close(g, w)
    assert check_hazards(exp.schedule, exp.arena) == []


def test_check_hazards_sees_a_view_outside_its_buffer_and_a_short_slot():
    import dataclasses

    from tkx.schedule.check import check_hazards
    exp = tkx.explore(step_sum_of_sums, (torch.randn(3), torch.randn(4)), fuse_pointwise=False)
    sched, arena = exp.schedule, exp.arena
    ops = list(sched.program.ops)
    k = next(i for i, op in enumerate(ops) if op.id == "sum_3")
    bad_in = dataclasses.replace(ops[k].inputs[0], offset=2)
    ops[k] = ops[k].replace(inputs=(bad_in,))
    bad_sched = dataclasses.replace(sched, program=sched.program.replace(ops=tuple(ops)))
    problems = check_hazards(bad_sched, arena)
    assert any("sum_3 reads mul_2 through a view (offset 2" in p for p in problems), problems
    slots = dict(arena.slots)
    slots["mul"] = dataclasses.replace(slots["mul"], nbytes=8)
    problems = check_hazards(sched, dataclasses.replace(arena, slots=slots))
    assert any("arena slot of mul holds 8 B but the value needs 12 B" in p for p in problems), problems
