"""Module-and-optimizer steps (``loss.backward(); opt.step(); opt.zero_grad()``) captured with ``state=``:
five steps of the schedule interpreter against eager on a deep copy (loss, parameters, buffers,
gradients, optimizer state), for each optimizer and option, the tutorials' models, an LR scheduler,
train/eval, gradient clipping and accumulation; and what is refused."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from stateful_steps import (
    CNN,
    MLP,
    TransformerLM,
    accumulate_step,
    assert_same_state,
    classify_step,
    lm_step,
    run_both,
    twin,
)

import tkx

STEPS = 5
X, Y = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 3, 1, 2])
BATCHES = [(X + 0.1 * k, Y.roll(k)) for k in range(STEPS)]

OPTIMIZERS = {
    "sgd": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, foreach=fe),
    "sgd-momentum-wd": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=fe),
    "sgd-nesterov": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=fe),
    "adam": lambda ps, fe: torch.optim.Adam(ps, lr=1e-2, foreach=fe),
    "adam-amsgrad": lambda ps, fe: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, foreach=fe),
    "adamw-maximize": lambda ps, fe: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, maximize=True, foreach=fe),
    "rmsprop-momentum-centered": lambda ps, fe: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.9, centered=True,
                                                                    foreach=fe),
    "adagrad": lambda ps, fe: torch.optim.Adagrad(ps, lr=0.1, foreach=fe),
}


@pytest.mark.parametrize("foreach", [False, True], ids=["single-tensor", "foreach"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_eager(name, foreach):
    mine, ref = twin(MLP, lambda ps: OPTIMIZERS[name](ps, foreach))
    exp = tkx.explore(classify_step(*mine), BATCHES[0], state=mine)
    run_both(exp.run, classify_step(*ref), BATCHES)
    assert_same_state(mine, ref)
    assert not exp.recomputed


def test_capture_leaves_state_alone_and_names_it():
    (model, opt), _ = twin(MLP, lambda ps: torch.optim.AdamW(ps, lr=3e-4, weight_decay=0.1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cap = tkx.capture(classify_step(model, opt), BATCHES[0], state=(model, opt))
    assert len(opt.state) == 0 and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    names = cap.input_names
    assert names[:4] == ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    assert "opt.state[fc1.weight].exp_avg" in names and "opt.state[fc2.bias].step" in names
    assert "opt.param_groups[0].lr" in names and names[-2:] == ("x", "y")
    updated = {cap.program.inputs[u.input_index].name for u in cap.program.updates}
    assert {"fc1.weight", "opt.state[fc1.weight].exp_avg_sq", "opt.state[fc1.weight].step"} <= updated
    assert "opt.param_groups[0].lr" not in updated
    assert cap.region_counts()["backward"] > 0 and cap.region_counts()["optimizer"] > 0


@pytest.mark.parametrize("name", ["adam", "adamw-maximize", "rmsprop-momentum-centered", "adagrad"])
def test_state_created_on_another_device_is_moved_to_the_step_device(name):
    """torch.optim keeps its step counts on the CPU (capturable=False) whatever device the parameters
    are on, and creates Adam's and RMSprop's lazily: the captured step's examples are all on the
    parameters' device (here 'meta', standing in for CUDA), the optimizer is left untouched."""
    model = MLP().to("meta")
    opt = OPTIMIZERS[name](model.parameters(), False)
    before = {id(p): dict(st) for p, st in opt.state.items()}
    x, y = torch.empty(6, 8, device="meta"), torch.empty(6, dtype=torch.long, device="meta")
    cap = tkx.capture(classify_step(model, opt), (x, y), state=(model, opt))
    assert "opt.state[fc1.weight].step" in cap.input_names
    stateful = cap.stateful
    assert {stateful.example(s).device.type for s in stateful.slots} == {"meta"}
    assert {id(p): dict(st) for p, st in opt.state.items()} == before


def test_cnn_batchnorm_sgd_and_train_eval():
    mine, ref = twin(CNN, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 1])) for _ in range(STEPS)]
    exp = tkx.explore(classify_step(*mine), batches[0], state=mine)
    run_both(exp.run, classify_step(*ref), batches[:3])
    assert_same_state(mine, ref)
    assert int(mine[0].bn.num_batches_tracked) == 3
    for m in (mine[0], ref[0]):
        m.eval()
    run_both(exp.run, classify_step(*ref), batches[3:])  # eval: running statistics, no update of them
    assert exp.recomputed and "eval()" in exp.recomputed[-1]
    assert_same_state(mine, ref)
    assert int(mine[0].bn.num_batches_tracked) == 3


def test_transformer_lm_adam():
    mine, ref = twin(TransformerLM, lambda ps: torch.optim.Adam(ps, lr=1e-2))
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 16, (2, 8), generator=g), torch.randint(0, 16, (2, 8), generator=g))
               for _ in range(STEPS)]
    exp = tkx.explore(lm_step(*mine), batches[0], state=mine)
    run_both(exp.run, lm_step(*ref), batches)
    # the key bias has a zero true gradient: Adam moves it by rounding noise, at most lr per step
    assert_same_state(mine, ref, noise={"layer.self_attn.in_proj_bias": (slice(16, 32), 2 * 1e-2 * STEPS)})


def test_lr_scheduler_between_calls_needs_no_new_capture():
    mine, ref = twin(MLP, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1))
    scheds = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) for _, opt in (mine, ref)]
    exp = tkx.explore(classify_step(*mine), BATCHES[0], state=mine)
    run_both(exp.run, classify_step(*ref), BATCHES, between=lambda: [s.step() for s in scheds])
    assert mine[1].param_groups[0]["lr"] == pytest.approx(1e-2 / 2 ** STEPS)
    assert_same_state(mine, ref)
    assert not exp.recomputed


def test_clip_grad_norm():
    mine, ref = twin(MLP, lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.5))
    exp = tkx.explore(classify_step(*mine, clip=0.05), BATCHES[0], state=mine)
    run_both(exp.run, classify_step(*ref, clip=0.05), BATCHES)
    assert_same_state(mine, ref)


def test_gradient_accumulation_over_micro_batches():
    mine, ref = twin(MLP, lambda ps: torch.optim.Adam(ps, lr=1e-2))
    exp = tkx.explore(accumulate_step(*mine), BATCHES[0], state=mine)
    run_both(exp.run, accumulate_step(*ref), BATCHES)
    assert_same_state(mine, ref)


def test_gradients_kept_between_calls():
    """zero_grad(set_to_none=False) before backward: the gradients are lifted, the first call's
    missing ones start at zero, and they are left behind as eager leaves them."""
    def make(model, opt):
        def step(x, y):
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return step
    mine, ref = twin(MLP, lambda ps: torch.optim.SGD(ps, lr=0.1))
    exp = tkx.explore(make(*mine), BATCHES[0], state=mine)
    assert "fc1.weight.grad" in exp.captured.input_names
    run_both(exp.run, make(*ref), BATCHES[:3])
    assert_same_state(mine, ref)


def test_verify_on_the_cpu_prints_a_table(capsys):
    mine, _ = twin(CNN, lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    g = torch.Generator().manual_seed(4)
    batch = (torch.randn(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 1]))
    exp = tkx.explore(classify_step(*mine), batch, state=mine)
    before = {k: v.clone() for k, v in mine[0].state_dict().items()}
    result = exp.verify()
    assert result.passed
    kinds = {c.kind for c in result.comparisons}
    assert {"update (reference)", "update (schedule)", "output (schedule)"} <= kinds
    out = capsys.readouterr().out
    assert "bn.running_mean" in out and "vs fp64" in out
    assert all(torch.equal(before[k], v) for k, v in mine[0].state_dict().items())
    assert len(mine[1].state) == 0


def test_noise_dominated_value_passes_arbitration_and_a_real_error_does_not():
    from tkx.runtime.verify import compare
    exact = torch.zeros(16, dtype=torch.float64)
    eager = torch.full((16,), 1e-3)
    noisy = torch.full((16,), -3e-3)      # as far from float64 as eager, in the other direction
    assert compare("b", "update", "float32", 0, noisy, eager, noisy, exact, 1e-5).ok
    wrong = torch.full((16,), 1.0)
    assert not compare("b", "update", "float32", 0, wrong, eager, wrong, exact, 1e-5).ok
    accurate_eager = torch.full((16,), 1e-9)  # eager is accurate: no noise excuse
    assert not compare("b", "update", "float32", 0, noisy, accurate_eager, noisy, exact, 1e-5).ok


def test_refusals_name_state_and_functional_call():
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(tkx.UnsupportedError) as e:
        tkx.capture(classify_step(model, opt), BATCHES[0])
    assert e.value.kind == "not-functional" and "state=" in str(e.value) and "functional_call" in str(e.value)
    assert "stateful_steps.py" in str(e.value.source)  # the line running the module
    fused = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    with pytest.raises(tkx.UnsupportedError, match="fused") as e:
        tkx.capture(classify_step(model, fused), BATCHES[0], state=(model, fused))
    assert e.value.kind == "state-not-liftable"
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(tkx.UnsupportedError, match="StepLR") as e:
        tkx.capture(classify_step(model, opt), BATCHES[0], state=(model, opt, sched))
    assert "leave LR schedulers out" in str(e.value)
    dampened = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
    with pytest.raises(tkx.UnsupportedError, match="momentum_buffer"):
        tkx.capture(classify_step(model, dampened), BATCHES[0], state=(model, dampened))
    # a failed capture breaks nothing: the next one works
    assert tkx.capture(classify_step(model, opt), BATCHES[0], state=(model, opt)).program.inputs


def test_stateful_runner_keeps_one_variant_per_train_eval_setting():
    """StatefulRunner's bookkeeping on the CPU, the kernel's part played by the schedule interpreter."""
    from tkx.runtime.stateful import StatefulRunner
    from tkx.schedule.interpreter import run as run_schedule

    mine, ref = twin(CNN, lambda ps: torch.optim.Adam(ps, lr=1e-2))
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 1])) for _ in range(STEPS)]
    built = []

    def make(inputs):
        exp = tkx.explore(classify_step(*mine), inputs, state=mine)
        built.append(exp)
        return (lambda *args, check=True: run_schedule(exp.schedule, exp.arena, args, update_inputs=True)
                .output_tree()), exp.captured.stateful

    runner = StatefulRunner(make, batches[0])
    for k, (x, y) in enumerate(batches):
        for m in (mine[0], ref[0]):
            m.train(k % 2 == 0)
        run_both(runner, classify_step(*ref), [(x, y)])
    assert len(built) == 2 and len(runner.variants) == 2
    assert_same_state(mine, ref)


def test_plain_tensor_attribute_is_named():
    class Scaled(MLP):
        def __init__(self):
            super().__init__()
            self.scale = torch.ones(4)  # not registered: neither a parameter nor a buffer

        def forward(self, x):
            return super().forward(x) * self.scale
    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(tkx.UnsupportedError, match="'scale' is neither a parameter nor a buffer") as e:
        tkx.capture(classify_step(model, opt), BATCHES[0], state=(model, opt))
    assert "register_buffer" in str(e.value)


def test_verify_on_the_cpu_for_a_functional_step(capsys):
    def step(w, x, y):
        loss, g = None, None
        g, loss = torch.func.grad_and_value(lambda w: F.cross_entropy(x @ w, y))(w)
        w.sub_(0.1 * g)
        return loss
    exp = tkx.explore(step, (torch.randn(8, 4), X, Y))
    result = exp.verify()
    assert result.passed and {"output (schedule)", "update (reference)"} <= {c.kind for c in result.comparisons}
    assert "w" in capsys.readouterr().out


def test_cli_state_argument_loads_the_objects(tmp_path):
    from tkx.cli import _parser
    from tkx.user_step import UserStepError, load_function, load_state

    path = tmp_path / "mystep.py"
    path.write_text("import torch\nmodel = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                    "state = (model, opt)\ndef make_state():\n    return {'model': model, 'opt': opt}\n"
                    "def step(x):\n    return model(x).sum()\n")
    step = load_function(f"{path}:step")
    model, opt = load_state(f"{path}:state")
    assert isinstance(model, torch.nn.Linear) and isinstance(opt, torch.optim.SGD)
    assert step.__globals__["model"] is model  # one import of the file, shared with the step
    assert set(load_state(f"{path}:make_state")) == {"model", "opt"}
    with pytest.raises(UserStepError):
        load_state(f"{path}:nothing")
    args = _parser().parse_args(["report", f"{path}:step", "--inputs", f"{path}:step", "--state", f"{path}:state"])
    assert args.state == f"{path}:state"


# -- random numbers in a module step: nn.Dropout ----------------------------------------------------
def _dropout_step(lr: float):
    """An MLP with nn.Dropout(0.5) and SGD: p = 0.5 is bernoulli's default, which a trace leaves out."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return model, opt, classify_step(model, opt)


def _eager_loss_with(model, x, y, seed: int) -> float:
    """The loss of ``model`` in eager PyTorch with the random numbers a run after manual_seed(seed) draws."""
    from tkx.random import drawing, next_state
    torch.manual_seed(seed)
    with torch.no_grad(), drawing(next_state()):
        return F.cross_entropy(model(x), y).item()


def test_dropout_draws_fresh_masks_on_every_run_of_a_module_step():
    model, opt, step = _dropout_step(lr=0.0)  # the weights never change: only the mask changes the loss
    x, y = BATCHES[0]
    exp = tkx.explore(step, (x, y), state=(model, opt))
    losses = [exp.run(x, y).item() for _ in range(4)]
    assert len(set(losses)) == 4
    with torch.no_grad():
        model.eval()
        no_dropout = F.cross_entropy(model(x), y).item()
        model.train()
    seeded = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        seeded.append(exp.run(x, y).item())
    assert seeded[0] == seeded[1] != seeded[2]  # torch.manual_seed reproduces a run
    for seed in (7, 8):  # eager under the same Philox state: the same mask
        torch.manual_seed(seed)
        got = exp.run(x, y).item()
        assert got != pytest.approx(no_dropout, abs=1e-3)
        assert got == pytest.approx(_eager_loss_with(model, x, y, seed), rel=1e-6)


def test_stateful_runner_draws_a_fresh_mask_on_every_call():
    """StatefulRunner.__call__ on the CPU, the kernel's part played by the schedule interpreter."""
    from tkx.runtime.stateful import StatefulRunner
    from tkx.schedule.interpreter import run as run_schedule

    model, opt, step = _dropout_step(lr=0.0)
    x, y = BATCHES[1]

    def make(inputs):
        exp = tkx.explore(step, inputs, state=(model, opt))
        return (lambda *args, check=True: run_schedule(exp.schedule, exp.arena, args, update_inputs=True)
                .output_tree()), exp.captured.stateful

    runner = StatefulRunner(make, (x, y))
    assert len({runner(x, y).item() for _ in range(3)}) == 3
    torch.manual_seed(11)
    got = runner(x, y).item()
    assert got == pytest.approx(_eager_loss_with(model, x, y, 11), rel=1e-6)


def test_verify_of_a_dropout_step_compares_with_eager_float32_on_the_same_numbers():
    model, opt, step = _dropout_step(lr=0.1)
    x, y = BATCHES[2]
    exp = tkx.explore(step, (x, y), state=(model, opt))
    result = exp.verify(show=False)
    assert result.passed
    names = {c.name for c in result.comparisons}
    assert {"out", "0.weight", "3.bias"} <= names
    # eager float32 ran with tkx's random numbers: it agrees without the float64 arbitration
    assert all(c.vs_eager is not None and c.vs_eager < 1e-5 for c in result.comparisons)


def test_verify_of_a_dropout_step_sees_eager_on_other_numbers(monkeypatch):
    """The check above can fail: eager run on torch's own stream (not tkx's numbers) is far off."""
    import contextlib

    import tkx.runtime.verify_cpu as verify_cpu
    model, opt, step = _dropout_step(lr=0.1)
    x, y = BATCHES[2]
    exp = tkx.explore(step, (x, y), state=(model, opt))
    monkeypatch.setattr(verify_cpu, "drawing", lambda state: contextlib.nullcontext())
    result = exp.verify(show=False)
    assert max(c.vs_eager for c in result.comparisons) > 1e-2


@pytest.mark.parametrize("change", ["scheduler", "assign-lr", "assign-momentum"])
def test_a_step_that_changes_a_param_group_is_refused_with_the_line(change):
    """A scheduler's step() or a hyperparameter assignment inside the step would be dropped by the compiled
    step (the groups are read before each call): one error naming the group, the key and the user's line,
    and the optimizer keeps its own group dicts and values."""
    (model, opt), _ = twin(MLP, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    group = opt.param_groups[0]

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if change == "scheduler":
            sched.step()  # the line the error names
        elif change == "assign-lr":
            opt.param_groups[0]["lr"] = opt.param_groups[0]["lr"] * 0.5  # the line the error names
        else:
            opt.param_groups[0]["momentum"] = 0.5  # the line the error names
        return loss

    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(train_step, BATCHES[0], state=(model, opt))
    key = "momentum" if change == "assign-momentum" else "lr"
    assert f"opt.param_groups[0][{key!r}]" in str(info.value)
    assert info.value.source is not None and "the line the error names" in info.value.source.code
    assert opt.param_groups[0] is group and group["lr"] == 0.1 and group["momentum"] == 0.9
    assert len(opt.state) == 0 and all(p.grad is None for p in model.parameters())


def test_an_optimizer_the_step_uses_but_state_does_not_name_is_refused():
    """state=model alone while the step calls opt.step(): the unlisted optimizer would step the user's own
    parameters, whose gradients the lifted step never sets (no update at all); one error at its line."""
    (model, opt), _ = twin(MLP, lambda ps: torch.optim.SGD(ps, lr=0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(classify_step(model, opt), BATCHES[0], state=model)
    assert "SGD that state= does not name" in str(info.value) and info.value.source is not None
    assert "opt.step()" in info.value.source.code
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and len(opt.state) == 0
    exp = tkx.explore(classify_step(model, opt), BATCHES[0], state=(model, opt))  # the next call works
    exp.run(*BATCHES[0])
    assert not torch.equal(before["fc1.weight"], model.fc1.weight)


def test_verify_after_a_train_eval_switch_captures_again_as_run_does():
    """exp.verify() after model.eval() compared the train-mode program with eager in eval mode (a false
    FAIL); it now captures the step again first, as exp.run does."""
    from stateful_steps import CNN  # BatchNorm: train and eval differ
    (model, opt), _ = twin(CNN, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 1, 2, 0])
    exp = tkx.explore(classify_step(model, opt), (x, y), state=(model, opt))
    assert exp.verify(show=False).passed
    model.eval()
    assert exp.verify(show=False).passed
    assert exp.recomputed and "eval" in exp.recomputed[0]


@pytest.mark.parametrize("extra", ["itself", "submodule"])
def test_a_module_named_twice_or_with_its_submodule_is_lifted_once(extra):
    """state=(model, model, opt) or (model, model.fc1, opt) failed with an internal KeyError; the repeated
    module is lifted once, through the outer one (names stay the state_dict's)."""
    mine, ref = twin(MLP, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    model, opt = mine
    again = model if extra == "itself" else model.fc1
    exp = tkx.explore(classify_step(*mine), BATCHES[0], state=(model, again, opt))
    assert exp.captured.input_names[:2] == ("fc1.weight", "fc1.bias")
    run_both(exp.run, classify_step(*ref), BATCHES)
    assert_same_state(mine, ref)


def test_attention_dropout_in_a_module_step_verifies_against_eager_on_the_same_numbers():
    """F.scaled_dot_product_attention(dropout_p=...) and nn.MultiheadAttention's dropout in a state= step:
    the autograd trace draws them from Philox as the eager step inside tkx.random.drawing does."""
    class Attend(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.mha = torch.nn.MultiheadAttention(16, 2, dropout=0.2, batch_first=True)
            self.out = torch.nn.Linear(16, 3)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
            h = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3).transpose(1, 2).reshape(2, 6, 16)
            h = h + self.mha(h, h, h, need_weights=False)[0]
            return self.out(h).mean(1)
    torch.manual_seed(0)
    model = Attend()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(2)), torch.tensor([0, 2])
    exp = tkx.explore(classify_step(model, opt), (x, y), state=(model, opt))
    result = exp.verify(show=False)
    assert result.passed and max(c.vs_eager for c in result.comparisons) < 1e-5


def test_a_scheduler_created_after_the_capture_needs_no_new_capture():
    """A scheduler writes its own bookkeeping (``initial_lr``, OneCycleLR's ``max_lr``...) into the
    groups when it is created; no optimizer reads those keys, so the step is not captured again."""
    mine, ref = twin(MLP, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1))
    exp = tkx.explore(classify_step(*mine), BATCHES[0], state=mine)
    exp.run(*BATCHES[0])
    classify_step(*ref)(*BATCHES[0])
    scheds = [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10, cycle_momentum=False)
              for _, opt in (mine, ref)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not "lr_scheduler.step() before optimizer.step()"
        run_both(exp.run, classify_step(*ref), BATCHES[1:], between=lambda: [s.step() for s in scheds])
    assert "initial_lr" in mine[1].param_groups[0] and not exp.recomputed
    assert_same_state(mine, ref)


def test_a_scheduler_cycling_momentum_names_the_changed_key():
    """OneCycleLR's default cycle_momentum=True changes Adam's betas at every step: each step is
    captured again (still eager's numbers), and the reason names the key and the scheduler."""
    mine, ref = twin(MLP, lambda ps: torch.optim.Adam(ps, lr=1e-2))
    scheds = [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10) for _, opt in (mine, ref)]
    exp = tkx.explore(classify_step(*mine), BATCHES[0], state=mine)
    run_both(exp.run, classify_step(*ref), BATCHES[:3], between=lambda: [s.step() for s in scheds])
    assert_same_state(mine, ref)
    assert len(exp.recomputed) == 2
    assert "param_groups[0]['betas']" in exp.recomputed[0] and "cycle_momentum" in exp.recomputed[0]


def test_sparse_adam_is_refused_naming_the_line_and_saying_what_to_use():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Flatten(), torch.nn.Linear(12, 2))
    opt = torch.optim.SparseAdam(list(model[0].parameters()))

    def train_step(x):
        loss = model(x).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
        return loss

    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(train_step, (torch.randint(0, 10, (5, 3)),), state=(model, opt))
    text = str(info.value)
    assert "SparseAdam" in text and "use Adam" in text
    assert "test_stateful.py" in text.split("source:")[1].splitlines()[0]


def test_loss_item_inside_the_step_says_to_call_it_outside():
    (model, opt), _ = twin(MLP, lambda ps: torch.optim.SGD(ps, lr=0.1))

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
        return loss.item()

    with pytest.raises(tkx.UnsupportedError, match="data-dependent") as info:
        tkx.capture(train_step, BATCHES[0], state=(model, opt))
    assert "return loss.item()" in str(info.value) and "outside the step" in str(info.value)
