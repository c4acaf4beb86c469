"""``tkx.training_loop`` on the CPU: K steps through the schedule interpreter equal K eager steps (losses
and final state) for functional, in-place and module-and-optimizer steps; the loop kernel's CUDA compiles
with NVRTC for sm_80 and sm_90 without spills; datasets that do not fit the step are refused."""

from __future__ import annotations

import loop_steps as ls
import pytest
import stateful_steps as ss
import torch

import tkx
from tkx.runtime import live


@pytest.mark.parametrize("name", ["linear_regression", "tiny_online", "digits_mlp"])
def test_k_steps_equal_eager(name):
    result = ls.compare_zoo(name, steps=6)
    assert result.losses.shape == (6,)


def test_permutation_order():
    order = torch.tensor([2, 0, 3], dtype=torch.int64)
    ls.compare_zoo("linear_regression", steps=7, order=order)


def test_stateful_module_and_optimizer():
    mine, ref = ss.twin(ss.MLP, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(3, 6, 8, generator=g), torch.randint(0, 4, (3, 6), generator=g)
    result = tkx.training_loop(ss.classify_step(*mine), (X[0], Y[0]), (X, Y), steps=5, state=mine, progress=False)
    expected = tkx.eager_training_loop(ss.classify_step(*ref), (X[0], Y[0]), (X, Y), steps=5, state=True)
    torch.testing.assert_close(result.losses, expected, rtol=1e-5, atol=1e-6)
    ss.assert_same_state(mine, ref)


@pytest.mark.parametrize("name", ["linear_regression", "tiny_online", "digits_mlp"])
def test_loop_kernel_compiles_without_spills(name):
    from tkx.codegen.nvrtc import compile_cuda

    step, state, datasets, loss = ls.zoo_loop(name)
    loop = tkx.TrainingLoop(step, (*state, *(d[0] for d in datasets)), datasets, loss=loss)
    source = loop.cuda()
    assert "for (unsigned long long tkx_k = 0; tkx_k < tkx_steps; ++tkx_k)" in source.text
    assert "st.release.sys" in source.text
    roles = [p.role for p in source.launch.params]
    assert roles[-4:] == ["losses", "loop", "live", "order"]
    for arch in ("sm_80", "sm_90"):
        report = compile_cuda(source.text, arch)
        assert report.spill_bytes == 0, (arch, report.spill_bytes)


def test_stateful_loop_kernel_compiles_without_spills():
    from tkx.codegen.nvrtc import compile_cuda

    mine, _ = ss.twin(ss.MLP, lambda ps: torch.optim.AdamW(ps, lr=3e-3))
    X, Y = torch.randn(3, 6, 8), torch.randint(0, 4, (3, 6))
    source = tkx.TrainingLoop(ss.classify_step(*mine), (X[0], Y[0]), (X, Y), state=mine).cuda()
    for arch in ("sm_80", "sm_90"):
        assert compile_cuda(source.text, arch).spill_bytes == 0


def test_functional_state_is_swapped_and_copied_back():
    step, state, datasets, loss = ls.zoo_loop("linear_regression")
    text = tkx.TrainingLoop(step, (*state, *(d[0] for d in datasets)), datasets, loss=loss).cuda().text
    assert "tkx_odd ? tkx_arg_out1 : tkx_arg_in0" in text
    assert "if (tkx_done & 1ULL)" in text


def test_refuses_datasets_that_do_not_fit():
    step, state, datasets, loss = ls.zoo_loop("linear_regression")
    x0, y0 = datasets[0][0], datasets[1][0]
    with pytest.raises(tkx.UnsupportedError, match="batches\\[1\\]"):
        tkx.TrainingLoop(step, (*state, x0, y0), (datasets[0], datasets[1][:, :5]), loss=loss)
    with pytest.raises(tkx.UnsupportedError, match="rows"):
        tkx.TrainingLoop(step, (*state, x0, y0), (datasets[0], datasets[1][:2]), loss=loss)


def test_refuses_outputs_that_are_not_state():
    def step(params, x, y):
        loss = ((x @ params["w"] - y) ** 2).mean()
        return loss, loss * 2
    params = {"w": torch.randn(8, 1)}
    X, Y = torch.randn(3, 4, 8), torch.randn(3, 4, 1)
    with pytest.raises(tkx.UnsupportedError, match="carry=False"):
        tkx.TrainingLoop(step, (params, X[0], Y[0]), (X, Y))
    result = tkx.training_loop(step, (params, X[0], Y[0]), (X, Y), steps=2, carry=False, progress=False)
    assert result.steps == 2


def test_refuses_random_steps():
    def step(w, x, y):
        w.sub_(0.1 * x.mean())
        return ((torch.nn.functional.dropout(x, 0.5) @ w - y) ** 2).mean()
    X, Y = torch.randn(3, 4, 8), torch.randn(3, 4, 1)
    with pytest.raises(tkx.UnsupportedError, match="random"):
        tkx.TrainingLoop(step, (torch.randn(8, 1), X[0], Y[0]), (X, Y))


def test_host_words_and_curve():
    words = live.HostWords()
    words.clear()
    snap = words.read()
    assert snap.done == 0 and not snap.finished and snap.loss != snap.loss  # NaN before any publication
    words.words[0], words.words[1] = 7, 0x3F800000
    assert words.read().done == 7 and words.read().loss == 1.0
    words.request_stop()
    assert words.stop_requested
    svg = live.curve_svg([(1, 2.0), (2, 1.0), (3, float("nan"))], 3)
    assert svg.count("<polyline") == 1 and "max 2" in svg and "log scale" not in svg
    # a loss falling over three decades is drawn on a log axis: the middle decade sits mid-height
    svg = live.curve_svg([(0, 1.0), (1, 0.1 ** 1.5), (2, 1e-3)], 2, width=100, height=112)
    ys = [float(p.split(",")[1]) for p in svg.split('points="')[1].split('"')[0].split()]
    assert "log scale" in svg and ys == pytest.approx([6.0, 56.0, 106.0])
    assert isinstance(live.progress_display(False, 3, "t"), live.NoDisplay)
    with pytest.raises(ValueError):
        live.progress_display("bogus", 3, "t")


def test_terminal_display_draws():
    display = live.progress_display("terminal", 4, "linear")
    display.update(live.Snapshot(2, 0.5, False))
    display.close(live.Snapshot(4, 0.25, True), "done", [1.0, 0.5, 0.4, 0.25])
    assert display._progress.tasks[0].completed == 4


def test_notebook_display_stop_button_and_curve():
    pytest.importorskip("ipywidgets")
    stopped = []
    display = live.NotebookDisplay(10, "digits", lambda: stopped.append(True))
    display.update(live.Snapshot(3, 1.5, False))
    assert display.bar.value == 3 and "loss 1.5" in display.label.value
    display.button.click()
    assert stopped == [True]
    display.close(live.Snapshot(10, 0.5, True), "done", [float(i) for i in range(2000)])
    assert display.button.disabled and len(display.points) <= 2 * live.CURVE_POINTS
    assert "<polyline" in display.curve.value


def test_loop_kernel_arguments_follow_the_parameter_roles():
    from tkx.errors import TkxError
    from tkx.runtime.runner import pack_args

    step, state, datasets, loss = ls.zoo_loop("linear_regression")
    params = tkx.TrainingLoop(step, (*state, *(d[0] for d in datasets)), datasets, loss=loss).cuda().launch.params
    ins, outs = [100, 101, 102, 103], [200, 201, 202]
    loop = {"losses": 300, "loop": 301, "live": 302, "order": 0}
    args = dict(zip((p.name for p in params), pack_args(params, ins, outs, 400, 500, 516, loop=loop)))
    assert args["tkx_arg_in0"] == 100 and args["tkx_arg_in2"] == 102 and args["tkx_arg_out1"] == 201
    assert "out0" not in args  # the loss output is the losses vector
    assert (args["tkx_losses"], args["tkx_loop"], args["tkx_live"], args["tkx_order"]) == (300, 301, 302, 0)
    assert (args["arena"], args["sync"], args["status"]) == (400, 500, 516)
    with pytest.raises(TkxError, match="losses"):
        pack_args(params, ins, outs, 400, 500, 516)
