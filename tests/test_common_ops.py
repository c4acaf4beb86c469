"""Common ops a training step meets, each through every CPU stage against eager (and NVRTC where
available): cross-entropy on ``[B, C, T]`` logits, grouped and depthwise ``conv2d``,
``avg_pool2d(count_include_pad=False)``, ``max_pool2d``/``avg_pool2d`` with ``ceil_mode=True``, ``fmax``/``fmin``, ``hardsigmoid``/``hardswish``, ``round``,
``nan_to_num``, writing into a slice inside a differentiated function; ``nn.LSTM``/``nn.GRU``,
``F.interpolate`` (nearest, nearest-exact, bilinear), ``adaptive_avg_pool2d`` to any size, ``weight_norm``,
PReLU and Mish, reflection padding, ``F.unfold``, integer division rounding toward zero, ``scatter_reduce`` (sum, mean), ``conv1d``,
``conv_transpose2d``/``conv_transpose1d`` and 1-d pooling, ``pixel_shuffle``, ``glu``, bicubic interpolation; and ``spectral_norm`` in a stateful step
(its power-iteration buffers updated as eager updates them)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tkx
from pipeline import check_step

g = torch.Generator().manual_seed(11)


def f(*shape):
    return torch.randn(*shape, generator=g)


def _grad_step(loss, argnums=0):
    def step(*args):
        grads, value = torch.func.grad_and_value(loss, argnums=argnums)(*args)
        return value, grads
    return step


def _slice_write(x):
    y = x * 1.5
    y[:, 0] = x[:, 1] * 2.0      # an in-place write into a slice, then differentiated
    y[1, 2:] = 0.5               # a number written into a slice
    return y.square().sum()


def _module_step(module, *inputs_of):
    """A gradient step over ``module``'s parameters (``functional_call``): returns the loss and gradients."""
    names = [n for n, _ in module.named_parameters()]

    def loss(params, x):
        out = torch.func.functional_call(module, dict(zip(names, params)), (x,))
        out = out[0] if isinstance(out, tuple) else out
        return out.square().mean()

    def step(params, x):
        grads, value = torch.func.grad_and_value(loss)(params, x)
        return value, grads
    return step, lambda: ([p.detach().clone() for p in module.parameters()], *(m() for m in inputs_of))


torch.manual_seed(5)
_LSTM = _module_step(torch.nn.LSTM(4, 3, num_layers=2, batch_first=True), lambda: f(2, 5, 4))
_GRU = _module_step(torch.nn.GRU(4, 3, batch_first=False), lambda: f(5, 2, 4))
_WN = _module_step(torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3)), lambda: f(6, 4))
_PRELU = _module_step(torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.PReLU(5), torch.nn.Mish()), lambda: f(6, 4))


def _fill_col(x):
    y = x.clone()
    y[:, 0] = 1.0
    return y


def _bct_labels():
    y = torch.randint(0, 5, (2, 7), generator=g)
    y[0, 3] = -100               # ignore_index
    return y


CASES = {
    "cross-entropy-BCT": (_grad_step(lambda x, y: F.cross_entropy(x, y)), lambda: (f(2, 5, 7), _bct_labels())),
    "cross-entropy-BCT-none-weight": (
        _grad_step(lambda x, y, w: F.cross_entropy(x, y, weight=w, reduction="none").square().sum()),
        lambda: (f(2, 5, 7), torch.randint(0, 5, (2, 7), generator=g), f(5).abs())),
    "cross-entropy-BCHW-sum": (_grad_step(lambda x, y: F.cross_entropy(x, y, reduction="sum")),
                               lambda: (f(2, 4, 3, 3), torch.randint(0, 4, (2, 3, 3), generator=g))),
    "conv2d-groups": (_grad_step(lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2).square().sum(),
                                 argnums=(0, 1, 2)), lambda: (f(2, 4, 6, 6), f(6, 2, 3, 3), f(6))),
    "conv2d-depthwise-stride": (_grad_step(lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=4).sin().sum(),
                                           argnums=(0, 1)), lambda: (f(2, 4, 7, 7), f(8, 1, 3, 3))),
    "avg_pool2d-exclude-pad": (
        _grad_step(lambda x: F.avg_pool2d(x, 3, 2, padding=1, count_include_pad=False).square().sum()),
        lambda: (f(2, 3, 7, 7),)),
    # ceil_mode=True: 7 -> 4 windows of 2 by stride 2 (the last one half outside); 8 -> 3 of 3 by stride 3
    "max_pool2d-ceil": (_grad_step(lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True).square().sum()),
                        lambda: (f(2, 3, 7, 7),)),
    "max_pool2d-ceil-pad-dilation-indices": (
        lambda x: F.max_pool2d(x, 3, 3, padding=1, dilation=2, ceil_mode=True, return_indices=True),
        lambda: (f(2, 2, 9, 8),)),
    "max_pool2d-ceil-module-stride": (
        _grad_step(lambda x: torch.nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)(x).sin().sum()),
        lambda: (f(2, 3, 8, 6),)),
    "avg_pool2d-ceil": (_grad_step(lambda x: F.avg_pool2d(x, 3, 3, ceil_mode=True).square().sum()),
                        lambda: (f(2, 3, 8, 7),)),
    "avg_pool2d-ceil-pad-exclude": (
        _grad_step(lambda x: (F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True).square().sum()
                              + F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False).sum())),
        lambda: (f(2, 3, 8, 8),)),
    "lstm-two-layers": _LSTM,
    "gru-seq-first": _GRU,
    "weight-norm": _WN,
    "prelu-mish": _PRELU,
    "interpolate-nearest-bilinear": (
        _grad_step(lambda x: (F.interpolate(x, scale_factor=2, mode="nearest").square().sum()
                              + F.interpolate(x, size=(5, 7), mode="bilinear").sin().sum()
                              + F.interpolate(x, size=(4, 9), mode="nearest-exact").sum()
                              + F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True).sum())),
        lambda: (f(2, 3, 4, 6),)),
    "adaptive-avg-pool-uneven": (
        _grad_step(lambda x: F.adaptive_avg_pool2d(x, 3).square().sum() + F.adaptive_avg_pool2d(x, (2, None)).sum()),
        lambda: (f(2, 3, 7, 5),)),
    "reflection-pad-unfold": (
        _grad_step(lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect").square().sum() + F.unfold(x, 2, stride=1).sin().sum()),
        lambda: (f(2, 3, 5, 4),)),
    "conv1d-pool1d": (
        _grad_step(lambda x, w, b: (F.max_pool1d(F.conv1d(x, w, b, padding="same", dilation=2), 3, 2, ceil_mode=True)
                                    .square().sum()
                                    + F.avg_pool1d(F.conv1d(x, w[:, :2], stride=2, padding=1, groups=2), 2,
                                                   padding=1, count_include_pad=False).sum()), argnums=(0, 1, 2)),
        lambda: (f(2, 4, 9), f(6, 4, 3), f(6))),
    "conv-transpose2d-stride-groups": (
        _grad_step(lambda x, w, b: (F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1).square().sum()
                                    + F.conv_transpose2d(x, w[:, :2], stride=3, padding=2, groups=2, dilation=2).sum()),
                   argnums=(0, 1, 2)),
        lambda: (f(2, 4, 5, 4), f(4, 3, 3, 3), f(3))),
    "conv-transpose1d": (_grad_step(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1).sin().sum(),
                                    argnums=(0, 1)), lambda: (f(2, 4, 7), f(4, 5, 3))),
    "max-pool1d-indices": (lambda x: F.max_pool1d(x, 3, 2, padding=1, return_indices=True), lambda: (f(2, 3, 8),)),
    "pixel-shuffle-glu-bicubic": (
        _grad_step(lambda x: (F.glu(F.pixel_unshuffle(F.pixel_shuffle(x, 2), 2), 1).square().sum()
                              + F.interpolate(x, size=(5, 7), mode="bicubic").sin().sum())),
        lambda: (f(2, 8, 3, 4),)),
    "scatter-reduce-sum-mean": (
        _grad_step(lambda x, s, i: (x.scatter_reduce(1, i, s, "sum").square().sum()
                                    + x.scatter_reduce(1, i, s, "sum", include_self=False).sin().sum()
                                    + x.scatter_reduce(1, i, s, "mean").square().sum()
                                    + x.scatter_reduce(1, i, s, "mean", include_self=False).sum()), argnums=(0, 1)),
        lambda: (f(3, 6), f(3, 5), torch.randint(0, 6, (3, 5), generator=g))),
    "int-div-trunc": (lambda a, b: (torch.div(a, b, rounding_mode="trunc"), torch.div(a, 3, rounding_mode="trunc")),
                      lambda: (torch.tensor([7, -7, 6, -6, 0, 5, -1]), torch.tensor([2, 2, -4, 3, 5, -5, 3]))),
    "fmax-fmin": (_grad_step(lambda x, y: torch.fmax(x, y).square().sum() + torch.fmin(x, y).sum(), argnums=(0, 1)),
                  lambda: (f(6), f(6))),
    "hardsigmoid-hardswish": (_grad_step(lambda x: (F.hardsigmoid(x) * F.hardswish(x)).sum()),
                              lambda: (f(4, 8) * 4,)),
    "round": (lambda x: (torch.round(x), torch.round(x, decimals=2), torch.round(x * 100, decimals=-1)),
              lambda: (f(4, 5) * 4,)),
    "nan_to_num": (lambda x: (torch.nan_to_num(x.log()), torch.nan_to_num(x.log(), nan=0.5, posinf=9.0, neginf=-9.0)),
                   lambda: (torch.tensor([1.0, 0.0, -1.0, float("inf"), 2.0]),)),
    "slice-write-under-grad": (_grad_step(_slice_write), lambda: (f(3, 4),)),
    "number-into-a-slice": (lambda x: _fill_col(x) * 2.0,
                            lambda: (f(3, 4),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_common_op_against_eager(case):
    step, make = CASES[case]
    check_step(step, make(), nvrtc=False, rtol=1e-4, atol=1e-5)


def test_grouped_conv_kernel_compiles():
    step, make = CASES["conv2d-groups"]
    check_step(step, make())  # NVRTC for sm_80 and sm_90 where available


def test_slice_write_into_a_transposed_tensor_under_grad():
    """A write into a row of a transposed (not row-major) value inside grad compiles and matches eager."""
    def loss(x):
        y = (x * 1.5).t()
        y[0] = x[:, 0] * 2.0
        return y.square().sum()

    check_step(_grad_step(loss), (f(3, 4),), nvrtc=False)


@pytest.mark.parametrize("size, k, s, p, d", [(7, 2, 2, 0, 1), (8, 3, 2, 1, 1), (6, 3, 3, 1, 2), (5, 2, 3, 0, 1)])
def test_ceil_mode_pooling_has_eagers_shape_and_gradient(size, k, s, p, d):
    """The windows ceil_mode adds (torch drops one that would start in the right-hand padding) give
    eager's output shape, values and gradient, in float64 on the capture's math."""
    from tkx.capture.convolution import avg_pool2d_math, max_pool2d_math

    x = torch.randn(2, 2, size, size + 1, dtype=torch.float64, generator=g).requires_grad_()
    pairs = [(F.max_pool2d(x, k, s, p, d, ceil_mode=True), max_pool2d_math(x, k, s, p, d, ceil_mode=True))]
    if d == 1:
        pairs += [(F.avg_pool2d(x, k, s, p, ceil_mode=True, count_include_pad=c),
                   avg_pool2d_math(x, k, s, p, ceil_mode=True, count_include_pad=c)) for c in (True, False)]
    for want, got in pairs:
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
        up = torch.randn(want.shape, dtype=torch.float64, generator=g)
        torch.testing.assert_close(torch.autograd.grad(got, x, up)[0], torch.autograd.grad(want, x, up)[0])


def test_spectral_norm_in_a_stateful_step_updates_its_buffers_as_eager():
    """nn.utils.parametrizations.spectral_norm: the power iteration's ``_u``/``_v`` buffers are updated in
    place in training (lifted state); five steps match eager on a deep copy, buffers included."""
    import copy

    import tkx
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(6, 5)),
                                torch.nn.Tanh(), torch.nn.Linear(5, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_model, ref_opt = copy.deepcopy((model, opt))

    def make(m, o):
        def train_step(x, y):
            loss = F.mse_loss(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            return loss
        return train_step

    batches = [(f(8, 6), f(8, 2)) for _ in range(5)]
    exp = tkx.explore(make(model, opt), batches[0], state=(model, opt))
    assert any(n.endswith("._u") for n in exp.captured.input_names)
    for x, y in batches:
        torch.testing.assert_close(exp.run(x, y).detach(), make(ref_model, ref_opt)(x, y).detach())
    for (name, a), (_, b) in zip(model.state_dict().items(), ref_model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_fused_rms_norm_decomposes_with_its_backward():
    """``F.rms_norm`` on CUDA (torch 2.11) records ``aten._fused_rms_norm``; its forward and backward decompose
    (refused on the H200 before: found by the family fuzzer's GPU campaign)."""
    def step(w, x):
        def loss(w):
            y, _ = torch.ops.aten._fused_rms_norm(x, [8], w, 1e-6)
            return (y * y.tanh()).sum()
        g, value = torch.func.grad_and_value(loss)(w)
        return value, w - 0.1 * g

    w, x = torch.randn(8), torch.randn(4, 8)
    exp = tkx.explore(step, (w, x))
    assert exp.program.ops and not [op.kind for op in exp.program.ops if "rms" in op.kind]
    got = tkx.reference.run(exp.optimized, (w, x)).outputs
    for g, want in zip(got, step(w, x)):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
