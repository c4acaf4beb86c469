"""The example zoo: shapes, determinism, eager training behaviour, and optimizer semantics."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves

import tkx.examples as E
from tkx.examples import digits as D
from tkx.examples import layernorm_adamw as LA
from tkx.examples import mixed_precision as MP
from tkx.examples.mlp import MLP_WORKLOADS, mlp_loss

NAMES = [
    "linear_regression",
    "tiny_online",
    "online",
    "small",
    "medium",
    "digits_mlp",
    "layernorm_gelu_adamw",
    "mixed_precision",
    "char_lm",
    "q_learning",
    "glu_mlp",
    "poly_clip_adamw",
    "gpt_block",
    "llama_block",
    "cnn_digits",
]
IN_PLACE = {"digits_mlp", "layernorm_gelu_adamw", "char_lm", "q_learning", "gpt_block", "cnn_digits"}
FUNCTIONAL = [n for n in NAMES if n not in IN_PLACE]


def clone_tree(tree):
    return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def trees_equal(a, b) -> bool:
    la, lb = tree_leaves(a), tree_leaves(b)
    return len(la) == len(lb) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(la, lb)
    )


# --- registry ---------------------------------------------------------------------------------------


def test_registry_names_and_get():
    assert E.names() == NAMES
    assert [ex.name for ex in E.all_examples()] == NAMES
    for name in NAMES:
        ex = E.get(name)
        assert ex.name == name
        assert ex.loss_output == 0
        assert ex.description


def test_get_unknown_raises_keyerror_listing_names():
    with pytest.raises(KeyError) as info:
        E.get("no_such_example")
    message = str(info.value)
    assert "no_such_example" in message
    for name in NAMES:
        assert name in message


def test_example_is_frozen():
    ex = E.get("online")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.name = "other"  # type: ignore[misc]


def test_examples_import_nothing_else_from_tkx():
    for path in Path(E.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "tkx" for a in node.names), path
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    assert (node.module or "").split(".")[0] != "tkx", (path, node.module)
                elif node.level == 2 and node.module == "random":
                    pass  # tkx.random: in-step dropout (it needs only tkx.ops)
                else:
                    assert node.level == 1, (path, "relative import leaves tkx.examples")


# --- inputs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_inputs_deterministic_fresh_and_seed_dependent(name):
    ex = E.get(name)
    a, b, c = ex.make_inputs(0), ex.make_inputs(0), ex.make_inputs(1)
    assert isinstance(a, tuple)
    assert trees_equal(a, b)
    assert trees_equal(a, ex.example_inputs)
    assert not trees_equal(a, c)
    assert not trees_equal(a[0], c[0])  # parameters differ across seeds
    # fresh storage on every call, so in-place steps cannot leak into the next call
    ptrs_a = {t.untyped_storage().data_ptr() for t in tree_leaves(a)}
    ptrs_b = {t.untyped_storage().data_ptr() for t in tree_leaves(b)}
    assert not ptrs_a & ptrs_b
    assert all(isinstance(t, torch.Tensor) and not t.requires_grad for t in tree_leaves(a))
    assert all(t.is_contiguous() and t.storage_offset() == 0 for t in tree_leaves(a))


@pytest.mark.parametrize("name", list(MLP_WORKLOADS))
def test_mlp_workload_shapes_and_dtypes(name):
    s = MLP_WORKLOADS[name]
    params, x, y = E.get(name).make_inputs(0)
    assert list(params) == ["w1", "b1", "w2", "b2"]
    assert params["w1"].shape == (s.d_in, s.hidden)
    assert params["b1"].shape == (s.hidden,)
    assert params["w2"].shape == (s.hidden, s.d_out)
    assert params["b2"].shape == (s.d_out,)
    assert x.shape == (s.batch, s.d_in) and y.shape == (s.batch, s.d_out)
    assert all(t.dtype == s.dtype for t in (*params.values(), x, y))


def test_mlp_workloads_match_design_table():
    table = {(n, s.batch, s.d_in, s.hidden, s.d_out, s.dtype) for n, s in MLP_WORKLOADS.items()}
    assert table == {
        ("tiny_online", 1, 64, 128, 1, torch.float32),
        ("online", 8, 256, 512, 16, torch.float32),
        ("small", 64, 512, 1024, 128, torch.bfloat16),
        ("medium", 256, 1024, 4096, 1024, torch.bfloat16),
    }


def test_other_input_shapes_and_dtypes():
    params, x, y = E.get("linear_regression").make_inputs(0)
    assert params["w"].shape == (8, 1) and params["b"].shape == (1,)
    assert x.shape == (32, 8) and y.shape == (32, 1)

    params, buf, x, y = E.get("digits_mlp").make_inputs(0)
    assert {k: tuple(v.shape) for k, v in params.items()} == {
        "w1": (64, 128),
        "b1": (128,),
        "w2": (128, 10),
        "b2": (10,),
    }
    assert all(torch.count_nonzero(b) == 0 and b.shape == params[k].shape for k, b in buf.items())
    assert x.shape == (64, 64) and x.dtype == torch.float32
    assert y.shape == (64,) and y.dtype == torch.int64

    params, m, v, b1p, b2p, x, y = E.get("layernorm_gelu_adamw").make_inputs(0)
    assert {k: tuple(t.shape) for k, t in params.items()} == {
        "ln_w": (64,),
        "ln_b": (64,),
        "w1": (64, 128),
        "b1": (128,),
        "w2": (128, 64),
        "b2": (64,),
    }
    assert b1p.shape == () and b2p.shape == () and b1p.item() == 1.0 and b2p.item() == 1.0
    assert x.shape == (16, 64) and y.shape == (16, 64)
    assert all(t.dtype == torch.float32 for t in tree_leaves((params, m, v, b1p, b2p, x, y)))

    params, x, y = E.get("mixed_precision").make_inputs(0)
    assert {k: tuple(t.shape) for k, t in params.items()} == {
        "w1": (128, 256),
        "b1": (256,),
        "w2": (256, 32),
        "b2": (32,),
    }
    assert x.shape == (32, 128) and y.shape == (32, 32)
    assert all(t.dtype == torch.float32 for t in tree_leaves((params, x, y)))


# --- eager training ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_five_eager_steps_finite_and_loss_falls(name):
    losses = E.eager_losses(E.get(name), steps=5)
    assert all(math.isfinite(v) for v in losses), losses
    if name == "medium":
        # bf16 parameters with lr 1e-2: the loss (about 1.5, bf16 spacing there 2**-7) does not move
        # visibly in 5 steps, because most weight updates round away. It must not rise, though.
        assert losses[4] <= losses[0], losses
    else:
        assert losses[4] < losses[0], losses


def test_medium_makes_progress_measured_in_fp32():
    ex = E.get("medium")
    params, x, y = ex.make_inputs(0)

    def fp32_loss(p):
        return mlp_loss({k: t.float() for k, t in p.items()}, x.float(), y.float()).item()

    before = fp32_loss(params)
    new = params
    for _ in range(4):
        _, new = ex.step_fn(new, x, y)
    assert fp32_loss(new) < before
    assert any(not torch.equal(new[k], params[k]) for k in params)


@pytest.mark.parametrize("name", NAMES)
def test_loss_output_indexes_a_scalar_loss(name):
    ex = E.get(name)
    args = ex.make_inputs(0)
    expected_dtype = args[0]["w1"].dtype if name in MLP_WORKLOADS else torch.float32
    out = ex.step_fn(*args)
    loss = tree_leaves(out)[ex.loss_output]
    assert loss.shape == () and loss.dtype == expected_dtype


@pytest.mark.parametrize("name", FUNCTIONAL)
def test_functional_steps_mutate_nothing(name):
    ex = E.get(name)
    args = ex.make_inputs(0)
    saved = clone_tree(args)
    out = ex.step_fn(*args)
    new_params = out[1]
    assert trees_equal(args, saved)
    assert list(new_params) == list(args[0])
    for k, p in args[0].items():
        assert new_params[k].shape == p.shape and new_params[k].dtype == p.dtype
    assert any(not torch.equal(new_params[k], args[0][k]) for k in new_params)


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_in_place_steps_update_their_arguments(name):
    ex = E.get(name)
    args = ex.make_inputs(0)
    saved = clone_tree(args)
    ptrs = [t.data_ptr() for t in tree_leaves(args)]
    loss = ex.step_fn(*args)
    assert isinstance(loss, torch.Tensor) and loss.shape == ()
    assert [t.data_ptr() for t in tree_leaves(args)] == ptrs
    assert not trees_equal(args[0], saved[0])  # parameters changed in place
    assert trees_equal(args[-2:], saved[-2:])  # x and y untouched


# --- optimizer semantics against torch.optim and autograd ------------------------------------------


@pytest.mark.parametrize("name", ["linear_regression", "tiny_online", "online"])
def test_functional_sgd_matches_torch_optim(name):
    ex = E.get(name)
    params, x, y = ex.make_inputs(0)
    loss_fn = E.linear.linear_loss if name == "linear_regression" else mlp_loss
    lr = E.linear.LR if name == "linear_regression" else E.mlp.LR
    torch_params = {k: p.clone().requires_grad_(True) for k, p in params.items()}
    opt = torch.optim.SGD(list(torch_params.values()), lr=lr)
    for _ in range(3):
        loss, params = ex.step_fn(params, x, y)
        opt.zero_grad()
        ref = loss_fn(torch_params, x, y)
        ref.backward()
        opt.step()
        torch.testing.assert_close(loss, ref.detach())
    for k in params:
        torch.testing.assert_close(params[k], torch_params[k].detach())


def test_digits_momentum_sgd_matches_torch_optim():
    ex = E.get("digits_mlp")
    params, buf, x, y = ex.make_inputs(0)
    torch_params = {k: p.clone().requires_grad_(True) for k, p in params.items()}
    opt = torch.optim.SGD(list(torch_params.values()), lr=D.LR, momentum=D.MOMENTUM)
    for _ in range(3):
        loss = ex.step_fn(params, buf, x, y)
        opt.zero_grad()
        ref = D.digits_loss(torch_params, x, y)
        ref.backward()
        opt.step()
        torch.testing.assert_close(loss, ref.detach())
    for k in params:
        torch.testing.assert_close(params[k], torch_params[k].detach())
        torch.testing.assert_close(buf[k], opt.state[torch_params[k]]["momentum_buffer"])


def test_adamw_matches_torch_optim():
    ex = E.get("layernorm_gelu_adamw")
    params, m, v, b1p, b2p, x, y = ex.make_inputs(0)
    torch_params = {k: p.clone().requires_grad_(True) for k, p in params.items()}
    opt = torch.optim.AdamW(
        list(torch_params.values()),
        lr=LA.LR,
        betas=(LA.BETA1, LA.BETA2),
        eps=LA.EPS,
        weight_decay=LA.WEIGHT_DECAY,
        foreach=False,
    )
    steps = 3
    for _ in range(steps):
        loss = ex.step_fn(params, m, v, b1p, b2p, x, y)
        opt.zero_grad()
        ref = LA.block_loss(torch_params, x, y)
        ref.backward()
        opt.step()
        torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(b1p, torch.tensor(LA.BETA1**steps))
    torch.testing.assert_close(b2p, torch.tensor(LA.BETA2**steps))
    for k in params:
        torch.testing.assert_close(params[k], torch_params[k].detach())
        torch.testing.assert_close(m[k], opt.state[torch_params[k]]["exp_avg"])
        torch.testing.assert_close(v[k], opt.state[torch_params[k]]["exp_avg_sq"])


def test_mixed_precision_runs_forward_in_bf16_with_fp32_masters():
    ex = E.get("mixed_precision")
    params, x, y = ex.make_inputs(0)
    loss, new_params = ex.step_fn(params, x, y)
    assert loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in new_params.values())
    # the bf16 forward differs from an fp32 one, but only by bf16 rounding
    fp32 = F.mse_loss(torch.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"], y)
    assert loss.item() != fp32.item()
    torch.testing.assert_close(loss, fp32, rtol=2e-2, atol=0.0)
    # gradients reach the fp32 masters through the casts: compare with autograd
    masters = {k: p.clone().requires_grad_(True) for k, p in params.items()}
    MP.mixed_precision_loss(masters, x, y).backward()
    for k, p in params.items():
        torch.testing.assert_close(new_params[k], (p - MP.LR * masters[k].grad).detach())


# --- digits data --------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_sklearn", [True, False])
def test_digits_dataset_split_and_ranges(use_sklearn):
    x_train, y_train, x_test, y_test = E.digits_dataset(use_sklearn=use_sklearn)
    assert x_train.shape == (1500, 64) and x_test.shape == (297, 64)
    assert y_train.shape == (1500,) and y_test.shape == (297,)
    assert x_train.dtype == torch.float32 and y_train.dtype == torch.int64
    assert 0.0 <= x_train.min().item() and x_train.max().item() == 1.0
    assert set(torch.cat([y_train, y_test]).tolist()) == set(range(10))
    again = E.digits_dataset(use_sklearn=use_sklearn)
    assert all(torch.equal(a, b) for a, b in zip((x_train, y_train, x_test, y_test), again))


def test_digits_uses_sklearn_when_installed():
    pytest.importorskip("sklearn")
    assert E.digits_source() == "sklearn"
    assert "scikit-learn's bundled 8x8 digits" in E.get("digits_mlp").description


def test_digits_description_flags_synthetic_data(monkeypatch):
    monkeypatch.setattr(D, "have_sklearn", lambda: False)
    assert D.digits_source() == "synthetic"
    assert "SYNTHETIC" in D._description()


def test_digits_batches_full_deterministic_and_shuffled():
    batches = list(E.digits_batches(batch=64, seed=0))
    assert len(batches) == 1500 // 64
    assert all(x.shape == (64, 64) and y.shape == (64,) for x, y in batches)
    again = list(E.digits_batches(batch=64, seed=0))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))
    other = next(E.digits_batches(batch=64, seed=1))
    assert not torch.equal(batches[0][0], other[0])
    assert len(list(E.digits_batches(batch=64, seed=0, epochs=2))) == 2 * (1500 // 64)


def test_digits_training_reaches_useful_test_accuracy():
    params, buf, _, _ = E.get("digits_mlp").make_inputs(0)
    _, _, x_test, y_test = E.digits_dataset()
    before = E.accuracy(params, x_test, y_test)
    for x, y in E.digits_batches(seed=0, epochs=2):
        D.digits_step(params, buf, x, y)
    after = E.accuracy(params, x_test, y_test)
    assert before < 0.3
    assert after > 0.8, after


def test_everyday_adam_matches_torch_optim_adam():
    """char_lm's hand-written Adam (0-d tensor step count) is torch.optim.Adam."""
    ex = E.get("char_lm")
    params, m, v, t, tokens, targets = ex.make_inputs(0)
    torch_params = {k: p.clone().requires_grad_(True) for k, p in params.items()}
    opt = torch.optim.Adam(list(torch_params.values()), lr=E.everyday.ADAM_LR, eps=E.everyday.ADAM_EPS)
    for _ in range(3):
        loss = ex.step_fn(params, m, v, t, tokens, targets)
        opt.zero_grad()
        ref = E.everyday.char_lm_loss(torch_params, tokens, targets)
        ref.backward()
        opt.step()
        torch.testing.assert_close(loss, ref.detach())
    assert t.item() == 3.0
    for k in params:
        torch.testing.assert_close(params[k], torch_params[k].detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["char_lm", "q_learning", "glu_mlp", "poly_clip_adamw"])
def test_everyday_steps_learn(name):
    losses = E.eager_losses(E.get(name), steps=30)
    assert losses[-1] < losses[0], losses
