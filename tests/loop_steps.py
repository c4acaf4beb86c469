"""Training loops of the zoo's steps and of a module-and-optimizer step, and the checks that compare
``tkx.training_loop`` with the same steps run eagerly one by one (shared by the CPU and GPU tests)."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

import tkx
from tkx import examples


def clone_tree(tree):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def zoo_loop(name: str, rows: int = 4, device: str = "cpu"):
    """``(step, state args, datasets, loss index)`` of zoo example ``name``: the datasets stack the batch
    arguments of ``make_inputs(seed)`` for ``rows`` seeds (the trailing two arguments are x and y)."""
    ex = examples.get(name)
    sets = [ex.make_inputs(seed, device=device) for seed in range(rows)]
    first = sets[0]
    state, batch = first[:-2], first[-2:]
    datasets = tuple(torch.stack([s[len(state) + b] for s in sets]) for b in range(len(batch)))
    return ex.step_fn, tuple(state), datasets, ex.loss_output


def compare_zoo(name: str, steps: int, *, rows: int = 4, device: str = "cpu", order=None, rtol=1e-5, atol=1e-6):
    """Run ``steps`` steps of zoo example ``name`` with tkx.training_loop and eagerly (on copies); assert the
    losses and the final state agree. Returns the tkx result."""
    step, state, datasets, loss = zoo_loop(name, rows, device)
    mine, ref = clone_tree(state), clone_tree(state)
    result = tkx.training_loop(step, (*mine, *(d[0] for d in datasets)), datasets, steps=steps, order=order,
                               loss=loss, progress=False)
    expected = tkx.eager_training_loop(step, (*ref, *(d[0] for d in datasets)), datasets, steps=steps,
                                       order=order, loss=loss)
    assert result.steps == steps and not result.stopped
    torch.testing.assert_close(result.losses.float(), expected.float(), rtol=rtol, atol=atol)
    for a, b in zip(tree_flatten(mine)[0], tree_flatten(ref)[0]):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    return result
