"""A query row that sees no key (every key masked) in ``F.scaled_dot_product_attention``.

tkx specifies what torch 2.13's default and math backends give: an output of zeros on that row and
finite gradients (zero for the row's query). The expectation here is that specification written out in
float64 (:func:`_spec`), not eager, whose answer depends on the torch version and backend. Checked in the
decomposition (dropout path), the composite through both CPU interpreters with the fused group and
without, in the fused kernel's text (NVRTC compile), and on the GPU. Attention written by hand keeps
eager's semantics: the plain softmax of a row of ``-inf`` is NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.schedule.interpreter import run as run_schedule

B, H, L, E = 3, 2, 6, 8
PAD = 2  # left padding of sequence 0


def _masks() -> dict[str, torch.Tensor]:
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    real = torch.ones(B, L, dtype=torch.bool)
    real[0, :PAD] = False                      # sequence 0: two padding tokens on the left
    left_causal = real[:, None, None, :] & causal  # rows 0, 1 of sequence 0 see no key
    padding = torch.ones(B, 1, 1, L, dtype=torch.bool)
    padding[1] = False                          # sequence 1 is padding only: every row is empty
    additive = torch.zeros(B, 1, L, L)
    additive[2, :, 3, :] = float("-inf")       # one row of sequence 2
    return {"left-padding-causal": left_causal, "key-padding": padding, "additive": additive}


def _inputs(mask: torch.Tensor, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, L, E, generator=gen) for _ in range(3))
    return tuple(t.to(device) for t in (q, k, v, mask))


def _loss(attend):
    def loss(q, k, v, m):
        return (attend(q, k, v, m) + 1.0).square().sum()  # d loss / d out = 2 on an empty row, not 0
    return loss


def _step(loss):
    def step(q, k, v, m):
        grads, value = torch.func.grad_and_value(loss, argnums=(0, 1, 2))(q, k, v, m)
        return (value, *grads)
    return step


def _sdpa(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def _spec(q, k, v, m):
    """What tkx specifies, in float64: softmax over the kept keys, 0 on a row that keeps none."""
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.double()
    empty = (s == float("-inf")).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return (p @ v.double()).to(q.dtype)


def _expected(x):
    q, k, v, m = (t.double() if t.is_floating_point() else t for t in x)
    return _step(_loss(_spec))(q, k, v, m)


def _empty_rows(m: torch.Tensor) -> torch.Tensor:
    keep = m if m.dtype == torch.bool else m != float("-inf")
    return ~keep.expand(B, H, L, L).any(-1)


def _check(outputs, x, what: str) -> None:
    want = _expected(x)
    for name, got, exp in zip(("loss", "dq", "dk", "dv"), outputs, want):
        assert torch.isfinite(got).all(), f"{what}: {name} is not finite"
        err = (got.double().cpu() - exp.double().cpu()).abs().max().item()
        assert torch.allclose(got.double().cpu(), exp.double().cpu(), rtol=1e-4, atol=1e-4), \
            f"{what}: {name} differs by {err:.3g}"
    dq = outputs[1]
    assert (dq.cpu()[_empty_rows(x[3].cpu())] == 0).all(), f"{what}: dq of an empty row is not 0"


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("case", sorted(_masks()))
def test_sdpa_row_without_keys_is_zero_in_both_interpreters(case, fuse):
    x = _inputs(_masks()[case])
    assert _empty_rows(x[3]).any()
    exp = tkx.explore(_step(_loss(_sdpa)), x, fuse_attention=fuse)
    assert ("attention" in {op.kind for op in exp.schedule.program.ops}) == fuse
    _check(tkx.reference.run(exp.optimized, x).outputs, x, "reference interpreter")
    _check(run_schedule(exp.schedule, exp.arena, x).outputs, x, "schedule interpreter")


def test_the_output_row_itself_is_zero():
    x = _inputs(_masks()["left-padding-causal"])
    exp = tkx.explore(lambda q, k, v, m: _sdpa(q, k, v, m), x)
    out = run_schedule(exp.schedule, exp.arena, x).outputs[0]
    assert (out[0, :, :PAD] == 0).all() and torch.isfinite(out).all()


def test_sdpa_with_dropout_takes_the_decomposition_and_gives_zeros():
    """dropout_p > 0 goes through the decomposition (attention_math), not the composite."""
    m = _masks()["key-padding"]

    def step(q, k, v, m, state):
        with tkx.random.philox(state):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.25)
        return out.sum(), out

    x = (*_inputs(m), tkx.random.philox_state(1))
    exp = tkx.explore(step, x)
    assert "attention" not in {op.kind for op in exp.program.ops}
    out = tkx.reference.run(exp.optimized, [t.clone() for t in x]).outputs[1]
    assert torch.isfinite(out).all() and (out[1] == 0).all()


def test_the_fused_kernel_zeroes_an_empty_row_and_compiles():
    x = _inputs(_masks()["key-padding"])
    exp = tkx.explore(_step(_loss(_sdpa)), x, fuse_attention=True)
    text = exp.cuda.text
    assert "== 0.0f ? 0.0f : acc[u] /" in text  # out = acc / l, 0 where l = 0
    if nvrtc_available():
        assert exp.cuda.check("sm_90").spill_bytes == 0


def test_unmasked_attention_keeps_the_plain_division():
    """Without a mask no row is empty: the fused kernel has no test for it."""
    q, k, v, _ = _inputs(_masks()["key-padding"])
    exp = tkx.explore(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(), (q, k, v),
                      fuse_attention=True)
    assert "acc[u] / sL[" in exp.cuda.text and "? 0.0f : acc[u] /" not in exp.cuda.text


def _hand_written(q, k, v, m):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("fuse", [True, False])
def test_hand_written_attention_keeps_eagers_nan(fuse):
    """softmax over a row of -inf is NaN in eager; the recognised composite keeps that."""
    x = _inputs(_masks()["key-padding"])
    exp = tkx.explore(_hand_written, x, fuse_attention=fuse)
    assert "attention" in {op.kind for op in exp.program.ops}
    want = _hand_written(*x)
    assert torch.isnan(want[1]).all() and torch.isfinite(want[0]).all()
    for got in (tkx.reference.run(exp.optimized, x).outputs[0],
                run_schedule(exp.schedule, exp.arena, x).outputs[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_verify_draws_the_users_mask():
    """A bool input is a mask: verify's inputs take the example's values, so that its empty rows are checked."""
    from tkx.runtime.verify import random_inputs
    x = _inputs(_masks()["key-padding"])
    exp = tkx.explore(_step(_loss(_sdpa)), x)
    drawn = random_inputs(exp.program, 5, torch.device("cpu"), examples=list(x))
    assert torch.equal(drawn[3], x[3])
    assert not torch.equal(drawn[0], x[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("case", sorted(_masks()))
def test_sdpa_row_without_keys_is_zero_in_the_kernel(case, fuse):
    x = _inputs(_masks()[case], "cuda")
    runner = tkx.runtime.build(_step(_loss(_sdpa)), x, tkx.Options(fuse_attention=fuse))
    _check([t.cpu() for t in runner(*x)], tuple(t.cpu() for t in x), "kernel")
