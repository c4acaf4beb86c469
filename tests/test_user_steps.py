"""Steps written the way users write them (beyond the zoo and patterns.md), through every CPU stage."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pipeline import check_step
from torch.func import grad_and_value

import tkx


def sgd(loss_fn):
    def step(w, x, y):
        g, loss = grad_and_value(loss_fn)(w, x, y)
        return loss, w - 0.1 * g
    return step


CASES = {
    "accuracy": lambda w, x, y: ((x @ w).argmax(1) == y).float().mean(),
    "soft_targets": sgd(lambda w, x, y: F.cross_entropy(x @ w, F.one_hot(y, 5).float() * 0.9 + 0.02)),
    "label_smoothing": sgd(lambda w, x, y: F.cross_entropy(x @ w, y, label_smoothing=0.1)),
    "abs_loss": sgd(lambda w, x, y: (x @ w).abs().mean()),
    "amax_loss": sgd(lambda w, x, y: (x @ w).amax(1).sum()),
    "repeat": sgd(lambda w, x, y: (x @ w).repeat(2, 1).pow(2).mean()),
    "flip": sgd(lambda w, x, y: ((x @ w).flip(0) - (x @ w)).pow(2).mean()),
    "roll": sgd(lambda w, x, y: (torch.roll(x @ w, 1, 0) * (x @ w)).mean()),
    "masked_mean": sgd(lambda w, x, y: ((x @ w) * (y > 2).unsqueeze(1)).sum() / (y > 2).sum().clamp(min=1)),
    "logsumexp": sgd(lambda w, x, y: torch.logsumexp(x @ w, 1).mean()),
    "row_norms": sgd(lambda w, x, y: (x @ w).norm(dim=1).mean()),
    "l1_and_inf_norms": sgd(lambda w, x, y: torch.linalg.vector_norm(x @ w, ord=1)
                            + torch.linalg.vector_norm(x @ w, ord=float("inf"))),
    "var_std": sgd(lambda w, x, y: (x @ w).var(0).sum() + (x @ w).std(1, correction=0).sum()),
    "bce": sgd(lambda w, x, y: F.binary_cross_entropy(torch.sigmoid(x @ w),
                                                      (y > 2).float().unsqueeze(1).expand(8, 5))),
    "kl_div": sgd(lambda w, x, y: F.kl_div(F.log_softmax(x @ w, 1), F.softmax(x @ w.flip(1), 1),
                                           reduction="batchmean")),
    "max_min_all": sgd(lambda w, x, y: (x @ w).max() - 2 * (x @ w).min()),
    "min_max_dim": sgd(lambda w, x, y: (x @ w).min(1).values.sum() + (x @ w).max(0)[0].sum()),
    "dot_mv": sgd(lambda w, x, y: torch.dot(x[0], w[:, 0]) + torch.mv(w.t(), x[1]).sum()),
    "triu": sgd(lambda w, x, y: torch.triu(x @ w @ w.t()).sum()),
    "isfinite_all_any": lambda w, x, y: (torch.isfinite(x @ w).all() & (x > 5).any()).float() + w.sum(),
    "unbind_stack": sgd(lambda w, x, y: torch.stack(list((x @ w).unbind(1))[::-1], 1).pow(2).mean()),
    "sin_cos_features": sgd(lambda w, x, y: (torch.cat([torch.sin(x), torch.cos(x)], 1)
                                             @ torch.cat([w, w], 0)).pow(2).mean()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_user_step(name):
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(4, 5, generator=g), torch.randn(8, 4, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    check_step(CASES[name], (w, x, y))


def test_index_put_in_place_on_an_input():
    def step(table, idx, v):
        table[idx] += v  # x[idx] = x[idx] + v: with a duplicate index the last write wins, as in eager
        return table.sum()

    check_step(step, (torch.randn(6, 3), torch.tensor([1, 4, 1]), torch.randn(3, 3)))


@pytest.mark.parametrize(("op", "text"), [("topk", "topk"), ("cumsum", "scan")])
def test_ops_without_a_primitive_say_so(op, text):
    def step(w, x):
        h = x @ w
        out = h.topk(2, dim=1).values if op == "topk" else h.cumsum(1)
        return out.sum()

    with pytest.raises(tkx.UnsupportedError, match=text) as info:
        _ = tkx.explore(step, (torch.randn(4, 5), torch.randn(8, 4))).program
    assert "test_user_steps.py" in str(info.value)


def test_nn_parameters_updated_in_place_under_no_grad():
    """Weights passed straight from a model (``nn.Parameter``, requires_grad) and updated with ``sub_`` under
    ``torch.no_grad()``: capture traces them like any tensor, the reference and the schedule interpreter update
    the Parameters in place like eager does (a leaf that requires grad refuses an in-place op outside no_grad)."""
    from torch.func import grad

    from tkx.schedule.interpreter import run as run_schedule

    def step(w, b, x, y):
        gw, gb = grad(lambda w, b: F.mse_loss(x @ w.t() + b, y), argnums=(0, 1))(w, b)
        with torch.no_grad():
            w.sub_(0.1 * gw)
            b.sub_(0.1 * gb)

    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3)
    x, y = torch.randn(5, 6), torch.randn(5, 3)

    def params():
        return torch.nn.Parameter(lin.weight.detach().clone()), torch.nn.Parameter(lin.bias.detach().clone())

    want = params()
    step(*want, x, y)
    exp = tkx.explore(step, (*params(), x, y))
    assert len(exp.program.updates) == 2
    for run in (lambda a: tkx.reference.run(exp.program, a, update_inputs=True),
                lambda a: run_schedule(exp.schedule, exp.arena, a, update_inputs=True)):
        got = params()
        run((*got, x, y))
        assert all(isinstance(t, torch.nn.Parameter) and t.requires_grad for t in got)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_weights(reduction):
    """``F.cross_entropy(logits, y, weight=w)`` (an ignored target among them): the mean divides by the total
    weight of the rows not ignored, as torch does; the gradient follows."""
    def step(w, x, y, cw):
        def loss_fn(w):
            loss = F.cross_entropy(x @ w, y, weight=cw, reduction=reduction)
            return loss.sum() if reduction == "none" else loss
        g, loss = grad_and_value(loss_fn)(w)
        return loss, w - 0.1 * g

    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 5, (8,), generator=g)
    y[2] = -100
    check_step(step, (torch.randn(4, 5, generator=g), torch.randn(8, 4, generator=g), y,
                      torch.rand(5, generator=g) + 0.5))
