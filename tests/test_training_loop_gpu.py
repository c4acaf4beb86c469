"""``tkx.training_loop`` on the GPU: K steps in one launch equal K eager steps; the step counter the kernel
publishes to mapped host memory advances while the launch is in flight; a stop request ends the loop at a
step boundary with the state of an uninterrupted run of as many steps; CUDA-graph replays go on through
the data. Run with ``pytest -m gpu``."""

from __future__ import annotations

import time

import loop_steps as ls
import pytest
import stateful_steps as ss
import torch
from torch.utils._pytree import tree_flatten

import tkx

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: Upper bound on waiting for the first published progress (the kernel publishes every 0.2 ms).
FIRST_PROGRESS_S = 60.0


@pytest.mark.parametrize("name", ["linear_regression", "tiny_online", "digits_mlp", "gpt_block"])
def test_k_steps_equal_eager(name):
    # bf16 gpt_block: a few bf16 steps apart per step (fp32 inside fused groups), so fewer steps
    tol = dict(rtol=2e-2, atol=2e-2) if name == "gpt_block" else dict(rtol=1e-4, atol=1e-5)
    result = ls.compare_zoo(name, steps=5 if name == "gpt_block" else 20, device="cuda", **tol)
    assert result.device.startswith("cuda")


def test_permutation_order():
    order = torch.tensor([3, 1, 2, 0, 1], dtype=torch.int64, device="cuda")
    ls.compare_zoo("digits_mlp", steps=12, device="cuda", order=order, rtol=1e-4, atol=1e-5)


def test_stateful_module_and_optimizer():
    mine, ref = ss.twin(ss.MLP, lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.1), "cuda")
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(4, 6, 8, generator=g).cuda(), torch.randint(0, 4, (4, 6), generator=g).cuda()
    result = tkx.training_loop(ss.classify_step(*mine), (X[0], Y[0]), (X, Y), steps=9, state=mine, progress=False)
    expected = tkx.eager_training_loop(ss.classify_step(*ref), (X[0], Y[0]), (X, Y), steps=9, state=True)
    torch.testing.assert_close(result.losses, expected, rtol=1e-4, atol=1e-5)
    ss.assert_same_state(mine, ref)


def _loop(name: str = "linear_regression"):
    step, state, datasets, loss = ls.zoo_loop(name, device="cuda")
    args = (*ls.clone_tree(state), *(d[0] for d in datasets))
    return tkx.TrainingLoop(step, args, datasets, loss=loss), state


def _wait_for_progress(run) -> int:
    start = time.perf_counter()
    while run.poll().done == 0 and run.running() and time.perf_counter() - start < FIRST_PROGRESS_S:
        time.sleep(0.001)
    return run.poll().done


def test_live_counter_advances_and_stop_flag_ends_the_loop():
    loop, initial = _loop()
    steps = 20_000_000  # far more than run before the stop request arrives
    run = loop.run(steps, wait=False, progress=False, timeout=120)
    first = _wait_for_progress(run)
    assert first > 0, "the kernel published no progress"
    later = first
    start = time.perf_counter()
    while later == first and run.running() and time.perf_counter() - start < FIRST_PROGRESS_S:
        time.sleep(0.001)
        later = run.poll().done
    assert later > first  # the counter advances while the launch is in flight
    run.stop()
    result = run.wait()
    assert result.stopped and 0 < result.steps < steps
    assert result.losses.shape == (result.steps,) and bool(torch.isfinite(result.losses).all())
    assert run.poll().finished and run.poll().done == result.steps
    # the state is that of an uninterrupted run of as many steps
    again, _ = _loop()
    for a, b in zip(tree_flatten(again.inputs[:1])[0], tree_flatten(initial)[0]):
        a.copy_(b)
    for a, b in zip(tree_flatten(loop.inputs[:1])[0], tree_flatten(initial)[0]):
        assert not torch.equal(a, b)
    if result.steps <= 2_000_000:
        check = again.run(result.steps, progress=False)
        torch.testing.assert_close(check.losses, result.losses, rtol=0, atol=0)
        for a, b in zip(tree_flatten(again.inputs[:1])[0], tree_flatten(loop.inputs[:1])[0]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_graph_replays_continue_through_the_data():
    loop, initial = _loop()
    direct, _ = _loop()
    graph = loop.capture_graph(3)
    first = graph.replay().clone()
    second = graph.replay().clone()
    graph.check_status()
    assert graph.steps_run == 3
    expected = direct.run(6, progress=False).losses  # 4 dataset rows: the second replay reads rows 3, 0, 1
    torch.testing.assert_close(torch.cat([first, second]), expected, rtol=0, atol=0)
    for a, b in zip(tree_flatten(loop.inputs[:1])[0], tree_flatten(direct.inputs[:1])[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_terminal_progress_while_in_flight():
    loop, _ = _loop()
    result = loop.run(5000, progress="terminal")
    assert result.steps == 5000 and not result.stopped
    snap = loop.runner.live.read()
    assert snap.finished and snap.done == 5000 and snap.loss == float(result.losses[-1])
