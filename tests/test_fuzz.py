"""The differential fuzzer in CI (tests/fuzz.py): a fixed list of seeds plus a few fresh ones
per run, each a random training step with random fusion options, through the reference
interpreter, the schedule interpreter and NVRTC, against eager with float64 arbitration.
A failure is shrunk and its reproduction printed. Bounded to about two minutes; the long
campaign is scripts/fuzz-campaign (this generator is its ``mlp`` family)."""

from __future__ import annotations

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzz  # noqa: E402

#: Seeds checked on every run (a regression corpus: widths 1 and primes, every loss, optimizer,
#: clipping, dtype and view appear among them).
FIXED_SEEDS = tuple(range(0, 30))
#: Fresh seeds per run (printed, so a failure can be replayed with TKX_FUZZ_SEEDS=...).
FRESH = 3


def _nvrtc() -> bool:
    from tkx.codegen.nvrtc import nvrtc_available
    return bool(nvrtc_available())


def _seeds() -> list[int]:
    if os.environ.get("TKX_FUZZ_SEEDS"):
        return [int(s) for s in os.environ["TKX_FUZZ_SEEDS"].split(",")]
    fresh = int(time.time() * 1000) % 1_000_000_000
    return list(FIXED_SEEDS) + [fresh + 1_000_000 + k for k in range(FRESH)]


def test_fuzz_training_steps_against_eager():
    nvrtc = _nvrtc()
    seeds = _seeds()
    print(f"fuzz seeds: {seeds[len(FIXED_SEEDS):] or seeds} (replay: TKX_FUZZ_SEEDS=...)")
    outcomes = [fuzz.check(fuzz.random_config(s), nvrtc=nvrtc) for s in seeds]
    ok = [o for o in outcomes if o.status == "ok"]
    failures = [o for o in outcomes if o.failed]
    print(f"fuzz: {len(outcomes)} programs, {len(ok)} ok, "
          f"{sum(o.status == 'refused' for o in outcomes)} refused, {len(failures)} failed")
    if failures:
        small = fuzz.shrink(failures[0], nvrtc=nvrtc, budget_s=30)
        others = "\n".join(o.line() for o in failures[1:])
        pytest.fail(f"{failures[0].line()}\nshrunk to:\n{fuzz.reproduction(small)}\nother failures:\n{others}")
    assert len(ok) >= len(outcomes) // 2, [o.line() for o in outcomes if o.status != "ok"]


def test_fuzzer_catches_a_wrong_op_and_shrinks_it(monkeypatch):
    """The check can fail: a reference interpreter with a broken tanh is found and shrunk."""
    import torch

    import tkx.reference as R
    real = R.evaluate

    def broken(op, args, device):
        out = real(op, args, device)
        return out * 1.01 if op.kind == "tanh" else out
    monkeypatch.setattr(R, "evaluate", broken)
    c = fuzz.Config(seed=7, batch=8, widths=(5, 7, 3), activation="tanh", norm="layer_norm",
                    optimizer="momentum", clip="global_norm", options=(("fuse_pointwise", False),))
    o = fuzz.check(c, nvrtc=False)
    assert o.status == "wrong" and o.stage == "reference", o.line()
    small = fuzz.shrink(o, nvrtc=False, budget_s=60)
    s = small.config
    assert small.status == "wrong" and s.activation == "tanh"
    assert (s.batch, s.optimizer, s.clip, s.options, s.norm) == (1, "sgd", "none", (), "none")
    text = fuzz.reproduction(small)
    assert "def step(" in text and "torch.tanh" in text and "inputs_of(" in text
    del torch


def test_fuzz_configs_cover_the_space():
    cs = [fuzz.random_config(s) for s in FIXED_SEEDS]
    assert {1} & {w for c in cs for w in c.widths} and {7, 13} & {w for c in cs for w in c.widths}
    for name, values in (("loss", fuzz.LOSSES), ("optimizer", fuzz.OPTIMIZERS), ("clip", fuzz.CLIPS),
                         ("dtype", fuzz.DTYPES), ("view", fuzz.VIEWS)):
        assert {getattr(c, name) for c in cs} == set(values), name
