"""Forward-mode differentiation (``torch.func.jvp``, ``jacfwd``, ``hessian``, Hessian-vector products
written with ``jvp``) and the scatters that ``jacrev``/``jacfwd`` write their bases with
(``diagonal_scatter``, ``select_scatter``, ``slice_scatter``): each through every CPU stage against eager."""

from __future__ import annotations

import pytest
import torch
from pipeline import check_step
from torch.func import grad, hessian, jacfwd, jacrev, jvp

g = torch.Generator().manual_seed(7)


def f(*shape):
    return torch.randn(*shape, generator=g)


def _loss(w, x):
    return torch.tanh(x @ w).square().sum()


def _vector_fn(x):
    return torch.sin(x) * x.sum()


CASES = {
    "jvp": (lambda w, x, v: jvp(lambda w: _loss(w, x), (w,), (v,)), lambda: (f(4, 3), f(5, 4), f(4, 3))),
    "hvp-jvp-of-grad": (lambda w, x, v: jvp(grad(lambda w: _loss(w, x)), (w,), (v,))[1],
                        lambda: (f(4, 3), f(5, 4), f(4, 3))),
    "jacfwd": (lambda x: jacfwd(_vector_fn)(x), lambda: (f(4),)),
    "jacrev": (lambda x: jacrev(_vector_fn)(x), lambda: (f(4),)),
    "hessian": (lambda x: hessian(lambda x: torch.tanh(x).pow(3).sum() * x.sum())(x), lambda: (f(4),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_mode_against_eager(case):
    fn, make = CASES[case]
    check_step(fn, make(), nvrtc=False, rtol=1e-4, atol=1e-5)


def test_hessian_vector_product_of_a_training_loss_in_a_step():
    """A step that returns the loss, its gradient and a Hessian-vector product (the jvp of the gradient)."""
    def step(w, x, v):
        g_w, loss = torch.func.grad_and_value(lambda w: _loss(w, x))(w)
        _, hv = jvp(grad(lambda w: _loss(w, x)), (w,), (v,))
        return loss, g_w, hv, w - 0.1 * g_w

    exp = check_step(step, (f(4, 3), f(5, 4), f(4, 3)), nvrtc=False)
    assert {"bmm", "mm"} & {op.kind for op in exp.program.ops}


SCATTERS = {
    "diagonal_scatter": (lambda x, y: torch.diagonal_scatter(x, y, 1).sin(), lambda: (f(4, 4), f(3))),
    "diagonal_scatter-dims": (lambda x, y: torch.diagonal_scatter(x, y, -1, 0, 2).cos(), lambda: (f(3, 2, 4), f(2, 2))),
    "select_scatter": (lambda x, y: torch.select_scatter(x, y, 0, 1).sin(), lambda: (f(3, 4), f(4))),
    "slice_scatter": (lambda x, y: torch.slice_scatter(x, y, 1, 0, 4, 2).sin(), lambda: (f(3, 4), f(3, 2))),
}


@pytest.mark.parametrize("case", sorted(SCATTERS))
def test_scatters_against_eager(case):
    fn, make = SCATTERS[case]
    check_step(fn, make(), nvrtc=False)


def test_scatters_are_differentiable():
    def loss(x, y):
        return (torch.diagonal_scatter(x, y * 2.0).exp() + torch.select_scatter(x, y, 1, 0)).sum()

    def step(x, y):
        return torch.func.grad_and_value(loss, argnums=(0, 1))(x, y)

    check_step(step, (f(4, 4), f(4)), nvrtc=False)
