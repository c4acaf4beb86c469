"""``tkx.training_loop`` on the CPU with steps and arguments as users write them: results equal a
hand-written eager loop, or one clear tkx error is raised, the user's tensors are kept and the next call
works."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import tkx


def _linear(w, x, y):
    loss = ((x @ w - y) ** 2).mean()
    return loss, w - 0.1 * 2 * x.t() @ (x @ w - y) / y.numel()


def _data(rows=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 1, generator=g), torch.randn(rows, 6, 8, generator=g), torch.randn(rows, 6, 1, generator=g)


def _eager(step, w, X, Y, rows):
    losses = []
    for r in rows:
        out = step(w, X[r], Y[r])
        losses.append(out[0])
        w = out[1]
    return torch.stack(losses), w


def test_outputs_after_the_new_state_are_results_and_the_state_still_trains():
    def step(w, x, y):
        loss, new_w = _linear(w, x, y)
        return loss, new_w, (x @ w - y).abs().max()  # a per-step metric after the new state

    w0, X, Y = _data()
    w = w0.clone()
    result = tkx.training_loop(step, (w, X[0], Y[0]), (X, Y), steps=6, progress=False)
    losses, w_ref = _eager(step, w0, X, Y, [k % 4 for k in range(6)])
    torch.testing.assert_close(result.losses, losses)
    torch.testing.assert_close(w, w_ref)


@pytest.mark.parametrize("order, match", [
    (torch.tensor([1.0, 0.0]), "int64"),
    (torch.tensor([[1, 0]]), "1-D"),
    ([1, 0], "list"),
    (torch.tensor([0, 4]), "outside"),
    (torch.tensor([], dtype=torch.int64), "empty"),
])
def test_an_order_that_is_not_rows_is_refused_before_any_step(order, match):
    w0, X, Y = _data()
    w = w0.clone()
    with pytest.raises(tkx.TkxError, match=match):
        tkx.training_loop(_linear, (w, X[0], Y[0]), (X, Y), steps=3, order=order, progress=False)
    assert torch.equal(w, w0)
    with pytest.raises(tkx.TkxError, match=match):
        tkx.eager_training_loop(_linear, (w, X[0], Y[0]), (X, Y), steps=3, order=order)


def test_an_order_with_repeats_follows_it():
    w0, X, Y = _data()
    w = w0.clone()
    order = torch.tensor([1, 1, 3])
    result = tkx.training_loop(_linear, (w, X[0], Y[0]), (X, Y), steps=5, order=order, progress=False)
    losses, w_ref = _eager(_linear, w0, X, Y, [1, 1, 3, 1, 1])
    torch.testing.assert_close(result.losses, losses)
    torch.testing.assert_close(w, w_ref)


@pytest.mark.parametrize("steps", [2.5, -1, "3", True])
def test_steps_must_be_a_whole_count(steps):
    w0, X, Y = _data()
    with pytest.raises(tkx.OptionsError, match="whole number"):
        tkx.training_loop(_linear, (w0.clone(), X[0], Y[0]), (X, Y), steps=steps, progress=False)


def test_zero_steps_keep_the_state_and_give_no_losses_of_the_loss_dtype():
    w0, X, Y = _data()
    w = w0.clone()
    result = tkx.training_loop(_linear, (w, X[0], Y[0]), (X, Y), steps=0, progress=False)
    assert result.steps == 0 and not result.stopped and result.losses.shape == (0,)
    assert result.losses.dtype == torch.float32 and torch.equal(w, w0)


def test_a_list_of_batches_instead_of_a_dataset_is_refused():
    w0, X, Y = _data()
    with pytest.raises(tkx.UnsupportedError, match="torch.stack"):
        tkx.training_loop(_linear, (w0.clone(), X[0], Y[0]), (list(X), list(Y)), steps=2, progress=False)


class _Net(torch.nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.p = dropout

    def forward(self, x):
        if self.p:
            x = torch.nn.functional.dropout(x, self.p, self.training)
        return self.fc(x)


def _module_step(dropout: float = 0.0):
    """``(step, (net, opt), X, Y)``: a classifier step with torch.optim as users write it."""
    net = _Net(dropout)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, (net, opt), torch.randn(3, 6, 8), torch.randint(0, 4, (3, 6))


def test_dropout_is_refused_at_the_users_line():
    step, state, X, Y = _module_step(dropout=0.5)
    with pytest.raises(tkx.UnsupportedError, match="random") as info:
        tkx.training_loop(step, (X[0], Y[0]), (X, Y), steps=2, state=state, progress=False)
    assert info.value.source is not None and "dropout" in info.value.source.code, info.value
    assert "eval()" in info.value.hint


def test_a_failing_step_says_which_step_and_the_next_call_works():
    step, state, X, Y = _module_step()
    bad = Y.clone()
    bad[2, 1] = 9
    with pytest.raises(tkx.KernelError) as info:
        tkx.training_loop(step, (X[0], Y[0]), (X, bad), steps=3, state=state, progress=False)
    assert any("step 2" in note for note in getattr(info.value, "__notes__", []))
    result = tkx.training_loop(step, (X[0], Y[0]), (X, Y), steps=3, state=state, progress=False)
    assert result.steps == 3 and torch.isfinite(result.losses).all()


def test_ctrl_c_on_the_cpu_stops_at_a_step_boundary(monkeypatch):
    import tkx.schedule.interpreter as interpreter

    w0, X, Y = _data()
    w = w0.clone()
    calls = []
    real = interpreter.run

    def interrupted_in_step_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the second step runs
        return real(*args, **kwargs)

    monkeypatch.setattr(interpreter, "run", interrupted_in_step_two)
    result = tkx.training_loop(_linear, (w, X[0], Y[0]), (X, Y), steps=5, progress=False)
    assert result.stopped and result.steps == 2
    losses, w_ref = _eager(_linear, w0, X, Y, [0, 1])
    torch.testing.assert_close(result.losses, losses)
    torch.testing.assert_close(w, w_ref)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_timeout_on_the_cpu_stops_and_keeps_the_steps_done():
    w0, X, Y = _data()
    w = w0.clone()
    result = tkx.training_loop(_linear, (w, X[0], Y[0]), (X, Y), steps=4, timeout=0, progress=False)
    assert result.stopped and result.steps == 1
    torch.testing.assert_close(w, _eager(_linear, w0, X, Y, [0])[1])


def test_a_cpu_loop_run_again_with_first_none_goes_on_through_the_data():
    w0, X, Y = _data(rows=4)
    w = w0.clone()
    loop = tkx.TrainingLoop(_linear, (w, X[0], Y[0]), (X, Y))
    a = loop.run(3, progress=False)
    b = loop.run(3, progress=False, first=None)
    losses, w_ref = _eager(_linear, w0, X, Y, [0, 1, 2, 3, 0, 1])
    torch.testing.assert_close(torch.cat([a.losses, b.losses]), losses)
    torch.testing.assert_close(w, w_ref)


def test_the_cpu_loop_refuses_what_the_loop_kernel_refuses():
    def in_place_and_returned(w, x, y):
        loss = ((x @ w - y) ** 2).mean()
        w.sub_(0.1 * 2 * x.t() @ (x @ w - y) / y.numel())
        return loss, w

    def normalises_its_batch(w, x, y):
        x.div_(2)
        loss = ((x @ w - y) ** 2).mean()
        return loss, w - 0.1 * 2 * x.t() @ (x @ w - y) / y.numel()

    w0, X, Y = _data()
    with pytest.raises(tkx.UnsupportedError, match="carry=False"):
        tkx.training_loop(in_place_and_returned, (w0.clone(), X[0], Y[0]), (X, Y), steps=2, progress=False)
    w = w0.clone()
    result = tkx.training_loop(in_place_and_returned, (w, X[0], Y[0]), (X, Y), steps=2, carry=False, progress=False)
    losses, w_ref = _eager(in_place_and_returned, w0.clone(), X, Y, [0, 1])
    torch.testing.assert_close(result.losses, losses)
    torch.testing.assert_close(w, w_ref)
    before = X.clone()
    with pytest.raises(tkx.UnsupportedError, match="read-only"):
        tkx.training_loop(normalises_its_batch, (w0.clone(), X[0].clone(), Y[0]), (X, Y), steps=2, progress=False)
    assert torch.equal(X, before)
    with pytest.raises(tkx.UnsupportedError, match="timeline"):
        tkx.training_loop(_linear, (w0.clone(), X[0], Y[0]), (X, Y), steps=2, timeline=True, progress=False)


def test_wait_false_on_the_cpu_gives_a_run_to_wait_for_as_on_the_gpu():
    w0, X, Y = _data()
    w = w0.clone()
    run = tkx.training_loop(_linear, (w, X[0], Y[0]), (X, Y), steps=3, wait=False, progress=False)
    result = run.wait()
    assert not run.running() and run.poll().done == 3 and run.poll().finished
    losses, w_ref = _eager(_linear, w0, X, Y, [0, 1, 2])
    torch.testing.assert_close(result.losses, losses)
    torch.testing.assert_close(w, w_ref)


def test_state_that_is_a_dataset_row_is_refused_before_any_step():
    def step(w, x):
        loss = ((x - w) ** 2).mean()
        w.add_(0.1 * (x - w))
        return loss

    D = torch.randn(3, 6, 8)
    before = D.clone()
    with pytest.raises(tkx.UnsupportedError, match="batches\\[0\\]"):
        tkx.training_loop(step, (D[1], D[0].clone()), (D,), steps=3, progress=False)
    assert torch.equal(D, before)
    w = D[1].clone()  # the fix the hint gives
    result = tkx.training_loop(step, (w, D[0].clone()), (D,), steps=3, progress=False)
    assert result.steps == 3 and torch.equal(D, before)


def test_first_must_be_a_whole_count_and_rows_are_made_one_step_at_a_time():
    from tkx.loop import _rows

    w0, X, Y = _data()
    loop = tkx.TrainingLoop(_linear, (w0.clone(), X[0], Y[0]), (X, Y))
    with pytest.raises(tkx.OptionsError, match="first"):
        loop.run(2, first=-1, progress=False)
    rows = _rows(None, X, 10**15)  # a long CPU loop does not list its rows up front
    assert [next(rows) for _ in range(6)] == [0, 1, 2, 3, 0, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_outputs_after_the_state_and_first_none_match_eager():
    def step(w, x, y):
        loss, new_w = _linear(w, x, y)
        return loss, new_w, (x @ w - y).abs().max()

    w0, X, Y = (t.cuda() for t in _data())
    w = w0.clone()
    loop = tkx.TrainingLoop(step, (w, X[0], Y[0]), (X, Y))
    a = loop.run(3, progress=False)
    b = loop.run(4, progress=False, first=None)
    losses, w_ref = _eager(step, w0, X, Y, [0, 1, 2, 3, 0, 1, 2])
    torch.testing.assert_close(torch.cat([a.losses, b.losses]), losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(tkx.TkxError, match="int64"):
        loop.run(2, order=torch.tensor([1.0, 0.0], device="cuda"), progress=False)
    assert loop.run(1, progress=False).steps == 1  # the next call works


def test_the_cpu_loop_publishes_the_latest_loss_to_its_display(monkeypatch):
    from tkx.runtime import live

    seen = []

    class Recorder(live.NoDisplay):
        def update(self, snap):
            seen.append(snap)

        def close(self, snap, note="", losses=None):
            seen.append(snap)

    monkeypatch.setattr(live, "progress_display", lambda *args, **kwargs: Recorder())
    w0, X, Y = _data()
    result = tkx.training_loop(_linear, (w0.clone(), X[0], Y[0]), (X, Y), steps=3, progress="terminal")
    assert [s.done for s in seen] == [1, 2, 3, 3] and seen[-1].finished
    assert [s.loss for s in seen[:3]] == pytest.approx(result.losses.tolist())


def _two_matrices(p, x, y):
    return ((x @ p["a"] @ p["b"] - y) ** 2).mean()


def test_new_state_returned_as_a_dict_in_another_key_order_lands_by_key():
    def step(p, x, y):  # the new state's keys in another order than the argument's
        return _two_matrices(p, x, y), {"b": p["b"] * 0.9, "a": p["a"] * 0.5}

    g = torch.Generator().manual_seed(1)
    P = {"a": torch.randn(8, 8, generator=g), "b": torch.randn(8, 8, generator=g)}
    X, Y = torch.randn(3, 6, 8, generator=g), torch.randn(3, 6, 8, generator=g)
    mine, ref, eager_ref = ({k: v.clone() for k, v in P.items()} for _ in range(3))
    result = tkx.training_loop(step, (mine, X[0], Y[0]), (X, Y), steps=4, progress=False)
    losses = []
    for k in range(4):
        loss, ref = step(ref, X[k % 3], Y[k % 3])
        losses.append(loss)
    torch.testing.assert_close(result.losses, torch.stack(losses))
    for k in P:
        torch.testing.assert_close(mine[k], ref[k])
    expected = tkx.eager_training_loop(step, (eager_ref, X[0], Y[0]), (X, Y), steps=4)
    torch.testing.assert_close(expected, torch.stack(losses))
    for k in P:
        torch.testing.assert_close(eager_ref[k], ref[k])


def test_new_state_under_other_keys_is_refused():
    def step(p, x, y):
        return _two_matrices(p, x, y), {"first": p["a"] * 0.5, "second": p["b"] * 0.9}

    X, Y = torch.randn(3, 6, 8), torch.randn(3, 6, 8)
    with pytest.raises(tkx.UnsupportedError, match="keys"):
        tkx.TrainingLoop(step, ({"a": torch.randn(8, 8), "b": torch.randn(8, 8)}, X[0], Y[0]), (X, Y))


@pytest.mark.parametrize("loss", ["1", 1.0, -1])
def test_a_loss_index_that_is_not_an_output_index_is_refused(loss):
    def step(w, x, y):
        new_w, value = _linear(w, x, y)[::-1]
        return new_w, value

    w0, X, Y = _data()
    with pytest.raises(tkx.UnsupportedError, match="flat index"):
        tkx.training_loop(step, (w0.clone(), X[0], Y[0]), (X, Y), steps=2, loss=loss, progress=False)
