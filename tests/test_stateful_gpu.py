"""Module-and-optimizer steps through the kernel: ``tkx.runtime.build(step, batch, state=(model, opt))``
against eager PyTorch on a deep copy over five steps (loss, parameters, buffers, gradients, optimizer
state), on the GPU's default foreach path and the single-tensor one. Run with ``pytest -m gpu``."""

from __future__ import annotations

import pytest
import stateful_steps as ss
import torch

import tkx
import tkx.runtime

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS = 5


def _batches(shape: tuple[int, ...], classes: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g).cuda(), torch.randint(0, classes, (shape[0],), generator=g).cuda())
            for _ in range(STEPS)]


@pytest.mark.parametrize("foreach", [None, False], ids=["default", "single-tensor"])
def test_mlp_adamw_through_the_kernel(foreach):
    mine, ref = ss.twin(ss.MLP, lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.1, foreach=foreach), "cuda")
    batches = _batches((6, 8), 4)
    runner = tkx.runtime.build(ss.classify_step(*mine), batches[0], state=mine)
    ss.run_both(runner, ss.classify_step(*ref), batches)
    ss.assert_same_state(mine, ref)
    assert mine[1].state[next(mine[0].parameters())]["step"].device.type == "cpu"  # as eager keeps it
    assert runner.verify().passed


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
    lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9, centered=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.05),
    lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True, maximize=True),
], ids=["sgd-nesterov", "rmsprop-centered", "adagrad", "adam-amsgrad-maximize"])
def test_cnn_batchnorm_through_the_kernel(make_opt):
    mine, ref = ss.twin(ss.CNN, make_opt, "cuda")
    batches = [(x.reshape(4, 1, 8, 8), y) for x, y in _batches((4, 64), 3, seed=1)]
    runner = tkx.runtime.build(ss.classify_step(*mine), batches[0], state=mine)
    ss.run_both(runner, ss.classify_step(*ref), batches[:3])
    for m in (mine[0], ref[0]):
        m.eval()
    ss.run_both(runner, ss.classify_step(*ref), batches[3:])
    assert len(runner.variants) == 2  # train and eval
    ss.assert_same_state(mine, ref)


def test_transformer_lm_adam_through_the_kernel():
    mine, ref = ss.twin(ss.TransformerLM, lambda ps: torch.optim.Adam(ps, lr=1e-2), "cuda")
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 16, (2, 8), generator=g).cuda(), torch.randint(0, 16, (2, 8), generator=g).cuda())
               for _ in range(STEPS)]
    runner = tkx.runtime.build(ss.lm_step(*mine), batches[0], state=mine)
    ss.run_both(runner, ss.lm_step(*ref), batches)
    ss.assert_same_state(mine, ref, noise={"layer.self_attn.in_proj_bias": (slice(16, 32), 2 * 1e-2 * STEPS)})


def test_scheduler_clip_and_accumulation_through_the_kernel():
    mine, ref = ss.twin(ss.MLP, lambda ps: torch.optim.AdamW(ps, lr=1e-2), "cuda")
    scheds = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) for _, opt in (mine, ref)]
    batches = _batches((6, 8), 4, seed=2)
    runner = tkx.runtime.build(ss.classify_step(*mine, clip=0.05), batches[0], state=mine)
    ss.run_both(runner, ss.classify_step(*ref, clip=0.05), batches, between=lambda: [s.step() for s in scheds])
    assert len(runner.variants) == 1
    ss.assert_same_state(mine, ref)
    runner = tkx.runtime.build(ss.accumulate_step(*mine), batches[0], state=mine)
    ss.run_both(runner, ss.accumulate_step(*ref), batches)
    ss.assert_same_state(mine, ref)


def test_dropout_draws_fresh_masks_through_the_kernel():
    """nn.Dropout in a module step: every call draws a fresh Philox state from torch's generator (lr 0:
    only the mask changes the loss), torch.manual_seed reproduces a call, eager under the same state agrees,
    and verify compares with eager float32 on the same numbers."""
    from tkx.random import drawing, next_state
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(32, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    x, y = _batches((6, 8), 4)[0]
    runner = tkx.runtime.build(step, (x, y), state=(model, opt))
    assert len({runner(x, y).item() for _ in range(3)}) == 3
    torch.manual_seed(5)
    first = runner(x, y).item()
    torch.manual_seed(5)
    assert runner(x, y).item() == first
    torch.manual_seed(5)
    with torch.no_grad(), drawing(next_state("cuda")):
        eager = torch.nn.functional.cross_entropy(model(x), y).item()
    assert first == pytest.approx(eager, rel=1e-5)
    result = runner.verify()
    assert result.passed and all(c.vs_eager is None or c.vs_eager < 1e-5 for c in result.comparisons)
