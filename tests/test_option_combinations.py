"""Every option combination either compiles without spills or is refused when the options are set.

Random (fixed-seed) combinations of the tiling, launch, numerics and architecture options, each
applied to a zoo example: ``Options(**combo)`` raises :class:`tkx.OptionsError` naming the
combination, or the whole pipeline runs and NVRTC compiles the kernel for the chosen architecture
with 0 spill bytes (the planners adjust tiles that would not fit and record why). Also the cases
that used to crash in codegen, and 0 spills with default options for sm_80, sm_90 and sm_90a.
"""

from __future__ import annotations

import random

import pytest
from pipeline import LARGE_EXAMPLES

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.options import Options, OptionsError

OK, WHY = nvrtc_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"NVRTC unavailable: {WHY}")

CHOICES = {
    "tile_m": (16, 32, 64, 128), "tile_n": (16, 32, 64, 128), "tile_k": (8, 16, 32, 64),
    "threads_per_block": (64, 128, 256, 512, 1024), "blocks_per_sm": (1, 2, 4, 8),
    "fp32_math": ("simt", "tf32"), "mode": ("auto", "block", "grid"), "split_k": ("auto", "off", 2, 8),
    "arch": ("auto", "sm_90a"),
}
EXAMPLES = ("tiny_online", "online", "small", "mixed_precision", "digits_mlp")


def _combos(n: int, seed: int = 1217):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        combo = {k: rng.choice(v) for k, v in CHOICES.items()}
        out.append((EXAMPLES[len(out) % len(EXAMPLES)], combo))
    return out


def _compile(name: str, options: Options, arch: str | None = None):
    ex = tkx.examples.get(name)
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=name, options=options)
    arch = arch or ("sm_90a" if options.arch == "sm_90a" else "sm_90")
    return exp, exp.cuda.check(arch)


@pytest.mark.parametrize(("name", "combo"), _combos(14), ids=lambda x: x if isinstance(x, str) else
                         ",".join(f"{k}={v}" for k, v in x.items()))
def test_combination_compiles_or_is_refused_when_set(name, combo):
    try:
        options = Options(**combo)
    except OptionsError as exc:
        named = [f for f in exc.field.split(" and ") for f in f.split(", ")]
        assert all(f in combo for f in named), exc
        assert all(f"{f}=" in str(exc) for f in named), f"the refusal does not show the combination: {exc}"
        return
    exp, report = _compile(name, options)
    assert report.spill_bytes == 0, f"{name} {combo}: {report.summary()}"
    for g in exp.schedule.groups.values():  # every adjustment says what changed and why
        adjusted = g.plan.get("adjusted", "")
        assert not adjusted or ("raised" in adjusted or "lowered" in adjusted or "tile" in adjusted
                                or "split_k" in adjusted), adjusted


@pytest.mark.parametrize(("name", "changes"), [
    ("online", {"tile_k": 8}),                       # "operand tile does not split evenly"
    ("small", {"tile_k": 8}),                        # "wmma_bf16 needs tiles in multiples of 16"
    ("linear_regression", {"threads_per_block": 64}),  # "split_l gemv needs at least S * 32 threads"
    ("online", {"tile_m": 32, "tile_n": 128, "tile_k": 64, "threads_per_block": 64, "blocks_per_sm": 8}),
])
def test_combinations_that_crashed_or_spilled_now_compile(name, changes):
    exp, report = _compile(name, Options(**changes))
    assert report.spill_bytes == 0, report.summary()
    gemms = [g for g in exp.schedule.groups.values() if g.kind == "gemm"]
    if "tile_k" in changes and changes["tile_k"] == 8 and name == "small":
        assert all(g.plan.tile_k >= 16 for g in gemms if g.plan.impl.startswith("wmma"))
        assert any("tile_k=8 raised to 16" in g.plan.adjusted for g in gemms if g.plan.impl.startswith("wmma"))


def _defaults_cases():
    """(example, arch) for every example; the portable code of the largest examples compiled for sm_90a
    runs in ``make test-full`` only (marker ``full``): minutes of NVRTC on 2 cores, while their Hopper code
    (``wgmma``) and their portable code for sm_80/sm_90 (tests/test_models.py) stay in ``make test``."""
    return [pytest.param(name, arch, marks=pytest.mark.full if arch == "sm_90a" and name in LARGE_EXAMPLES else ())
            for name in tkx.examples.names() for arch in ("sm_90a", "wgmma")]


@pytest.mark.parametrize(("name", "arch"), _defaults_cases())
def test_defaults_never_spill(name, arch):
    """Default options (portable code) compiled for sm_90a, and arch='sm_90a' (the code the runtime
    generates on Hopper, wgmma GEMMs); tests/test_codegen_examples.py covers sm_80 and sm_90."""
    options = Options(arch="sm_90a") if arch == "wgmma" else Options()
    _, report = _compile(name, options, "sm_90a")
    assert report.spill_bytes == 0, f"{name} {arch}: {report.summary()}"
