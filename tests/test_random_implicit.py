"""Random ops in a step without a wrapper: dropout, ``rand``/``randn``/``bernoulli``, also inside a
function under ``torch.func.grad``, drawn from Philox keyed by an implicit state input that every run
draws from torch's generator (``program.rng_input``).

Checked: the state is an input in the views; one ``torch.manual_seed`` reproduces a run and consecutive
runs differ; the keep probability of dropout; the reference interpreter, the schedule interpreter and
eager inside :func:`tkx.random.drawing` agree for one seed; the kernel compiles (NVRTC) and, on the GPU,
gives the interpreters' numbers for the same seed; ``verify()`` compares eager with the kernel's numbers;
an explicit ``tkx.random.philox`` block keeps working, and one inside ``grad`` gets a clear error.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.schedule.interpreter import run as run_schedule

g = torch.Generator().manual_seed(21)
P = 0.3


def f(*shape):
    return torch.randn(*shape, generator=g)


def _loss(w, x):
    h = F.dropout(torch.tanh(x @ w), p=P)  # inside the differentiated function
    return h.square().mean()


def step(w, x):
    grads, loss = torch.func.grad_and_value(_loss)(w, x)
    # on the inputs' device, as eager needs them to be for a step on the GPU
    noise = (torch.rand(4, 5, device=x.device) + torch.randn(4, 5, device=x.device)
             + torch.bernoulli(torch.full((4, 5), 0.5, device=x.device)))
    return loss, w - 0.1 * grads, noise


INPUTS = (f(16, 32), f(64, 16))


@pytest.fixture(scope="module")
def exp():
    return tkx.explore(step, INPUTS)


def test_the_state_is_an_implicit_input_shown_in_the_views(exp):
    program = exp.program
    assert program.rng_input == 2 and program.inputs[2].name == tkx.random.IMPLICIT_NAME
    assert program.inputs[2].value.dtype == "int64" and program.inputs[2].value.shape == (2,)
    assert "rng_state" in str(program)
    assert "philox" in {op.kind for op in program.ops}


def test_a_step_without_random_ops_has_no_state():
    program = tkx.explore(lambda w, x: (x @ w).sum(), INPUTS).program
    assert program.rng_input is None and len(program.inputs) == 2


def _outputs(run):
    return [t.clone() for t in run().outputs]


def test_one_seed_reproduces_a_run_and_consecutive_runs_differ(exp):
    torch.manual_seed(3)
    a = _outputs(lambda: tkx.reference.run(exp.optimized, INPUTS))
    b = _outputs(lambda: tkx.reference.run(exp.optimized, INPUTS))
    torch.manual_seed(3)
    c = _outputs(lambda: tkx.reference.run(exp.optimized, INPUTS))
    assert all(torch.equal(x, y) for x, y in zip(a, c))
    assert not torch.equal(a[2], b[2]) and not torch.equal(a[0], b[0])


def test_both_interpreters_and_eager_agree_for_one_seed(exp):
    torch.manual_seed(7)
    ref = _outputs(lambda: tkx.reference.run(exp.optimized, INPUTS))
    torch.manual_seed(7)
    sched = _outputs(lambda: run_schedule(exp.schedule, exp.arena, INPUTS))
    torch.manual_seed(7)
    with tkx.random.drawing(tkx.random.next_state()):
        eager = step(*INPUTS)
    for a, b, c in zip(ref, sched, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_the_keep_probability_of_dropout():
    n = 1 << 16

    def drop(x):
        return F.dropout(x, p=P)

    exp = tkx.explore(drop, (torch.ones(n),))
    torch.manual_seed(0)
    kept = tkx.reference.run(exp.optimized, (torch.ones(n),)).outputs[0]
    assert torch.all((kept == 0) | torch.isclose(kept, torch.tensor(1 / (1 - P))))
    assert abs(float((kept != 0).float().mean()) - (1 - P)) < 0.01
    u = tkx.reference.run(tkx.explore(lambda x: torch.rand_like(x), (torch.ones(n),)).optimized,
                          (torch.ones(n),)).outputs[0]
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.01


def test_nn_dropout_follows_train_and_eval():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    def forward(params, x):
        return torch.func.functional_call(model, params, (x,))

    x = f(4, 8)
    assert tkx.explore(forward, (params, x)).program.rng_input is not None
    model.eval()
    try:
        assert tkx.explore(forward, (params, x)).program.rng_input is None
    finally:
        model.train()


def test_an_explicit_block_keeps_working():
    def explicit(w, x, state):
        with tkx.random.philox(state):
            grads, loss = torch.func.grad_and_value(_loss)(w, x)
        return loss, grads

    exp = tkx.explore(explicit, (*INPUTS, tkx.random.philox_state(4)))
    assert exp.program.rng_input is None  # every draw keyed by the user's state
    state = tkx.random.philox_state(4)
    out = tkx.reference.run(exp.optimized, (*INPUTS, state.clone()), update_inputs=False)
    want = explicit(*INPUTS, state.clone())
    for a, b in zip(out.outputs, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_an_explicit_block_inside_grad_says_what_to_do():
    def inside(w, x, state):
        def loss(w):
            with tkx.random.philox(state):
                return _loss(w, x)
        return torch.func.grad(loss)(w)

    with pytest.raises((ValueError, tkx.UnsupportedError), match="Drop the block"):
        inside(*INPUTS, tkx.random.philox_state(1))


def test_draws_follow_the_device_they_are_made_for():
    """With the state on CUDA (fake tensors: no GPU needed), rand/randn with device=, the _like forms and
    bernoulli of a probability tensor give tensors on that device; bernoulli of a CPU probability
    tensor compares on the CPU, as eager's bernoulli returns a tensor on its input's device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        state = tkx.random.philox_state(3, device="cuda")
        x = torch.empty(4, 5, device="cuda")
        with tkx.random.drawing(state):
            drawn = [torch.rand(4, 5, device=x.device), torch.randn(4, 5, device=x.device),
                     torch.bernoulli(torch.full((4, 5), 0.5, device=x.device)), torch.rand_like(x),
                     torch.randn_like(x), torch.bernoulli(x, 0.3), x.bernoulli(),
                     torch.bernoulli(torch.full((4, 5), 0.5))]
    assert [t.device.type for t in drawn] == ["cuda"] * 7 + ["cpu"]
    assert all(t.shape == (4, 5) for t in drawn)


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC")
def test_the_kernel_compiles(exp):
    assert exp.cuda.check("sm_90").spill_bytes == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_kernel_gives_the_interpreters_numbers_for_one_seed(exp):
    cuda = tuple(t.cuda() for t in INPUTS)
    runner = tkx.runtime.build(step, cuda)
    torch.manual_seed(11)
    got = [t.cpu() for t in runner(*cuda)]
    torch.manual_seed(11)
    want = _outputs(lambda: tkx.reference.run(exp.optimized, INPUTS))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert runner.verify(strict=True).passed


@pytest.mark.parametrize("drop", ["dropout2d", "dropout1d-unbatched", "inplace"])
def test_channel_and_in_place_dropout(drop):
    def step(x):
        if drop == "dropout2d":
            return F.dropout2d(x, 0.5) * 1.0
        if drop == "dropout1d-unbatched":
            return F.dropout1d(x[0, :, :, 0], 0.5) * 1.0
        return F.dropout(x * 1.0, 0.5, inplace=True)

    x = f(4, 6, 3, 3)
    exp = tkx.explore(step, (x,))
    torch.manual_seed(2)
    got = tkx.reference.run(exp.optimized, (x,)).outputs[0]
    torch.manual_seed(2)
    with tkx.random.drawing(tkx.random.next_state()):
        want = step(x)
    torch.testing.assert_close(got, want)
    if drop == "dropout2d":  # a whole channel is kept or dropped
        per_channel = (got != 0).flatten(2).float()
        assert torch.all((per_channel.mean(-1) == 0) | (per_channel.mean(-1) == 1))


def test_verify_runs_eager_with_the_kernels_random_numbers():
    """verify() on the CPU (the schedule interpreter in the kernel's place): eager draws the same numbers
    as the run it is compared with, inside tkx.random.drawing with that run's state."""
    from test_models import InterpreterRunner

    from tkx.runtime import verify as V

    result = V.verify(InterpreterRunner(step, INPUTS), seeds=(0, 1))
    assert result.passed, result.summary()
    assert {c.name for c in result.comparisons} >= {"out[0]", "out[1]", "out[2]"}


def test_dropout_in_a_stateful_module_step():
    """nn.Dropout inside a module trained with loss.backward() and torch.optim (state=): the autograd trace
    runs under tkx.random.drawing, so its draws are tkx's dropout as in eager; exp.verify() (eager with the
    same numbers) passes and one seed reproduces a step."""
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    x, y = f(32, 8), torch.randint(0, 4, (32,), generator=g)
    exp = tkx.explore(train_step, (x, y), state=(model, opt))
    assert exp.program.rng_input is not None
    assert exp.verify(show=False).passed
    saved = copy.deepcopy(model.state_dict())
    torch.manual_seed(5)
    a = exp.run(x, y)
    model.load_state_dict(saved)
    torch.manual_seed(5)
    assert torch.equal(a, exp.run(x, y))


def test_aten_bernoulli_without_p_draws_with_its_default_one_half():
    """A traced ``bernoulli_(x)`` leaves out p = 0.5 (the schema default): it is not x's own values."""
    from tkx.random import drawing, philox_state
    state = philox_state(3)
    x = torch.full((4096,), float("nan"))
    with drawing(state):
        default = torch.ops.aten.bernoulli_.float(x.clone())
    with drawing(state):
        half = torch.ops.aten.bernoulli.p(x, 0.5)
    assert torch.equal(default, half)
    assert 0.45 < default.mean().item() < 0.55


def test_dropout_half_in_a_stateful_step_keeps_half():
    """Dropout(0.5) in a stateful step: the autograd trace writes it as ``empty_like(x).bernoulli_()``, its
    p left at the default 0.5; the replayed draw keeps about half the elements (not none), as eager does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 256), torch.nn.Dropout(0.5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x):
        out = model(x)
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
        return out.detach()

    x = f(8, 6)
    exp = tkx.explore(train_step, (x,), state=(model, opt))
    kept = (exp.run(x) != 0).float().mean().item()
    assert 0.4 < kept < 0.6, kept


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_verify_of_a_stateful_dropout_step_matches_eager_draw_for_draw(p):
    """Eager inside tkx.random.drawing (what verify runs) and the stateful step's autograd-traced graph
    (dropout recorded as bernoulli_(1 - p)) drop the same elements: verify agrees with eager directly,
    not only through the float64 arbitration."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Dropout(p), torch.nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x):
        out = model(x)
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
        return out.detach()

    exp = tkx.explore(train_step, (f(8, 6),), state=(model, opt))
    result = exp.verify(show=False)
    assert result.passed, result.summary()
    assert max(c.vs_eager for c in result.comparisons) < 1e-5, result.summary()


def test_in_place_bernoulli_draws_from_philox():
    """``x.bernoulli_(p)`` (how hand-written dropout masks are often made) draws from Philox like
    ``torch.bernoulli`` instead of being refused; eager in verify draws the same numbers."""
    def step(w, x):
        mask = torch.empty_like(x).bernoulli_(0.2)
        return (x * mask @ w).square().mean(), mask

    inputs = (f(16, 4), f(256, 16))
    exp = tkx.explore(step, inputs)
    kept = exp.run(*inputs)[1].mean().item()
    assert 0.15 < kept < 0.25, kept
    result = exp.verify(show=False)
    assert result.passed and max(c.vs_eager for c in result.comparisons) < 1e-5, result.summary()
