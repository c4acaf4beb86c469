"""The host side of a training loop in flight, without a GPU: a thread stands in for the kernel (it
publishes its step count and loss to the live words as the kernel does and honours the stop word), and
:class:`tkx.runtime.loop.LoopRun` follows it: the display sees the progress, a timeout asks for a stop and
gets the steps done so far, an error the kernel reports is raised, and the run can be watched from a thread."""

from __future__ import annotations

import struct
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from tkx.codegen.loop import LOOP_RAN
from tkx.runtime import live
from tkx.runtime import loop as rloop
from tkx.runtime.status import KernelError

#: The stand-in kernel gives up after this many seconds whatever happens (no test can hang).
KERNEL_LIMIT_S = 30.0


class StandInKernel:
    """Runs ``steps`` steps of ``step_s`` seconds in a thread, publishing like the loop kernel."""

    def __init__(self, runner, losses: torch.Tensor, steps: int, step_s: float = 0.0005, status: int = 0) -> None:
        self.runner, self.losses, self.steps, self.step_s, self.status = runner, losses, steps, step_s, status
        self.finished = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        words, start, done = self.runner.live, time.perf_counter(), 0
        for k in range(self.steps):
            time.sleep(self.step_s)
            self.losses[k] = 1.0 / (k + 1)
            done = k + 1
            words.words[1] = struct.unpack("<I", struct.pack("<f", 1.0 / (k + 1)))[0]
            words.words[0] = done
            if words.stop_requested or time.perf_counter() - start > KERNEL_LIMIT_S:
                break
        self.runner.runner._words[4] = self.status
        self.runner.loop_words[LOOP_RAN] = done
        words.words[3] = 1
        self.finished = True

    def query(self) -> bool:  # the CUDA event recorded after the launch
        return self.finished


class Recorder:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.closed = None

    def update(self, snap) -> None:
        self.seen.append(snap.done)

    def close(self, snap, note: str = "", losses=None) -> None:
        self.closed = (snap.done, note)


def _run(monkeypatch, steps: int, *, timeout=None, status: int = 0, display=None, step_s: float = 0.0005):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(rloop, "POLL_SECONDS", 0.005)
    runner = SimpleNamespace(
        live=live.HostWords(), device=torch.device("cpu"), loop_words=torch.zeros(8, dtype=torch.int64),
        spec=SimpleNamespace(carry=()), _lock=threading.Lock(),
        runner=SimpleNamespace(_words=torch.zeros(8, dtype=torch.int32), schedule=None, _mutated=[],
                               launch_description=lambda: "stand-in"))
    runner.live.clear()
    runner._lock.acquire()
    losses = torch.full((steps,), float("nan"))
    kernel = StandInKernel(runner, losses, steps, step_s, status)
    return rloop.LoopRun(runner, [], {}, steps, losses, None, kernel, display or live.NoDisplay(),
                         time.perf_counter(), timeout), kernel


def test_the_display_follows_and_the_result_has_every_loss(monkeypatch):
    rec = Recorder()
    run, _ = _run(monkeypatch, 200, display=rec)
    result = run.wait()
    assert result.steps == 200 and not result.stopped and result.losses.shape == (200,)
    assert rec.seen == sorted(rec.seen) and rec.closed == (200, "done")
    assert not run.loop._lock.locked()


def test_a_timeout_asks_for_a_stop_and_keeps_the_steps_done(monkeypatch):
    run, kernel = _run(monkeypatch, 10**6, timeout=0.1)
    result = run.wait()
    assert result.stopped and 0 < result.steps < 10**6 and kernel.runner.live.stop_requested
    assert float(result.losses[-1]) == pytest.approx(1.0 / result.steps)


def test_a_kernel_error_is_raised_and_the_loop_freed(monkeypatch):
    run, _ = _run(monkeypatch, 20, status=1)
    with pytest.raises(KernelError, match="error 1"):
        run.wait()
    assert not run.loop._lock.locked()


def test_watched_from_a_thread_then_stopped(monkeypatch):
    run, _ = _run(monkeypatch, 10**6)
    run.in_background()
    start = time.perf_counter()
    while run.poll().done == 0 and time.perf_counter() - start < KERNEL_LIMIT_S:
        time.sleep(0.001)
    run.stop()
    result = run.wait()
    assert result.stopped and result.steps == run.poll().done and run.poll().finished


# --------------------------------------------------------------------------------------
# The CPU loop with wait=False: the steps run in a thread, the notebook's stop button stops them
# --------------------------------------------------------------------------------------
def _cpu_linear(w, x, y):
    loss = ((x @ w - y) ** 2).mean()
    return loss, w - 0.1 * 2 * x.t() @ (x @ w - y) / y.numel()


class HeldStep:
    """Wraps the schedule interpreter: the ``hold``-th step call (1-based) waits until :meth:`release`,
    so a test acts while the loop is certainly mid-run (no timing involved)."""

    def __init__(self, monkeypatch, hold: int) -> None:
        import tkx.schedule.interpreter as interp

        self.hold, self.calls = hold, 0
        self.reached, self.go = threading.Event(), threading.Event()
        self._run = interp.run
        monkeypatch.setattr(interp, "run", self.run)

    def run(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.hold:
            self.reached.set()
            assert self.go.wait(KERNEL_LIMIT_S), "the test never released the held step"
        return self._run(*args, **kwargs)

    def release(self) -> None:
        self.go.set()


def _cpu_problem():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 1, generator=g), torch.randn(4, 6, 8, generator=g), torch.randn(4, 6, 1, generator=g)


def _cpu_eager(w, X, Y, steps):
    losses = []
    for k in range(steps):
        loss, w = _cpu_linear(w, X[k % X.shape[0]], Y[k % Y.shape[0]])
        losses.append(loss)
    return torch.stack(losses), w


def test_cpu_wait_false_returns_while_the_steps_run_and_stop_keeps_whole_steps(monkeypatch):
    import tkx

    w0, X, Y = _cpu_problem()
    w = w0.clone()
    held = HeldStep(monkeypatch, hold=3)
    loop = tkx.TrainingLoop(_cpu_linear, (w, X[0], Y[0]), (X, Y))
    run = loop.run(1000, wait=False, progress=False)
    try:
        assert held.reached.wait(KERNEL_LIMIT_S)
        assert run.running() and run.poll().done == 2 and not run.poll().finished
        with pytest.raises(tkx.TkxError, match="still running"):
            loop.run(5, progress=False)
        run.stop()
    finally:
        held.release()
    result = run.wait()
    assert not run.running() and result.stopped and result.steps == 3 and run.poll().finished
    losses, w_ref = _cpu_eager(w0, X, Y, 3)
    torch.testing.assert_close(result.losses, losses)
    torch.testing.assert_close(w, w_ref)
    assert loop.run(2, progress=False).steps == 2  # the next run works once this one has ended


def test_cpu_notebook_stop_button_stops_the_running_loop(monkeypatch):
    pytest.importorskip("ipywidgets")
    import tkx

    shown = []

    class Recorded(live.NotebookDisplay):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            shown.append(self)

    monkeypatch.setattr(live, "NotebookDisplay", Recorded)
    w0, X, Y = _cpu_problem()
    held = HeldStep(monkeypatch, hold=4)
    run = tkx.training_loop(_cpu_linear, (w0.clone(), X[0], Y[0]), (X, Y), steps=1000, progress="notebook",
                            wait=False)
    try:
        assert held.reached.wait(KERNEL_LIMIT_S)
        (display,) = shown
        assert display.bar.value == 3 and display.label.value.startswith("3 / 1000 steps, loss")
        assert len(display.points) == 3 and "<polyline" in display.curve.value
        display.button.click()
    finally:
        held.release()
    result = run.wait()
    assert result.stopped and result.steps == 4
    assert display.bar.value == 4 and display.label.value.endswith("(stopped)") and display.button.disabled
    torch.testing.assert_close(result.losses, _cpu_eager(w0, X, Y, 4)[0])
