"""Every example's generated kernel compiles with NVRTC for sm_80 and sm_90 with no spills (no GPU needed)."""

from __future__ import annotations

import pytest
from pipeline import LARGE_EXAMPLES

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import names

OK, WHY = nvrtc_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"NVRTC unavailable: {WHY}")

OPTION_SETS = {
    "default": {},
    "block": {"mode": "block"},
    "no-fusion": {"fuse_pointwise": False, "fuse_epilogues": False, "fuse_reductions": False},
    "tf32-small-tiles": {"fp32_math": "tf32", "tile_m": 32, "tile_n": 32, "tile_k": 16, "threads_per_block": 128},
}


@pytest.fixture(scope="module")
def explorations():
    cache = {}

    def get(name, opt):
        key = (name, opt)
        if key not in cache:
            ex = tkx.examples.get(name)
            cache[key] = tkx.explore(ex.step_fn, ex.example_inputs, name=name, **OPTION_SETS[opt])
        return cache[key]
    return get


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("opt", list(OPTION_SETS))
@pytest.mark.parametrize("name", names())
def test_kernel_compiles_without_spills(explorations, name, opt, arch):
    if name in LARGE_EXAMPLES:
        pytest.skip("a large example: compiled for sm_80 by tests/test_models.py, for sm_90 in make test-full")
    src = explorations(name, opt).cuda
    report = src.check(arch)
    assert report.registers > 0
    assert report.spill_bytes == 0, f"{name}/{opt}/{arch}: {report.summary()}"
    assert report.shared_bytes <= 48 * 1024 or src.dynamic_shared_bytes > 0


@pytest.mark.parametrize("name", names())
def test_source_map_covers_every_group_and_stored_op(explorations, name):
    exp = explorations(name, "default")
    src, sched = exp.cuda, exp.schedule
    lines = src.text.splitlines()
    for gid, g in sched.groups.items():
        first, last = src.group_lines[gid]
        assert 1 <= first <= last <= len(lines)
        for s in g.stores:
            if s in sched.homes:
                assert any(first <= n <= last for n in src.lines_of(s)), f"{s} not stored inside {gid}'s lines"
    for op_id in sched.inlined:
        used = any(op_id in sched.groups[g].inlined for g in sched.groups)
        if used:
            assert src.lines_of(op_id), f"inlined {op_id} has no lines"


def test_addresses_are_arguments_not_constants(explorations):
    src = explorations("online", "default").cuda
    import re
    assert not re.search(r"0x[0-9a-fA-F]{9,}", src.text)  # no device addresses baked in
    params = [p.name for p in src.params]
    assert params[-3:] == ["arena", "sync", "status"]
    assert all(f"{p}" in src.text for p in params)


def test_exact_mode_avoids_contraction(explorations):
    ex = tkx.examples.get("linear_regression")
    exact = tkx.explore(ex.step_fn, ex.example_inputs, exact=True).cuda
    assert "__fmul_rn" in exact.text or "__fadd_rn" in exact.text
    report = exact.check("sm_90")
    assert "--fmad=false" in " ".join(report.options)


@pytest.mark.parametrize("name", names())
def test_hopper_kernel_compiles_for_sm_90a_without_spills(name):
    """Every example generated for Hopper (``arch="sm_90a"``: wgmma GEMMs, TMA copies, the batched epilogues)
    compiles with NVRTC for sm_90a without spills; a bf16/fp16 tiled GEMM takes wgmma."""
    ex = tkx.examples.get(name)
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=name, arch="sm_90a")
    report = exp.cuda.check("sm_90a")
    assert report.registers > 0
    assert report.spill_bytes == 0, f"{name}/sm_90a: {report.summary()}"
    tiled = [g for g in exp.schedule.groups.values() if g.kind in ("gemm", "gemm_partial")
             and getattr(g.plan, "impl", "").startswith(("wgmma", "wmma"))]
    if any(g.plan.impl.startswith("wgmma") for g in tiled):
        assert "wgmma.mma_async" in exp.cuda.text
