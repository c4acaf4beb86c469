"""Every zoo example's kernel with sync="counters" (and a timeline) compiles with NVRTC for sm_80/sm_90."""

from __future__ import annotations

import pytest

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get, names

OK, WHY = nvrtc_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"NVRTC unavailable: {WHY}")


@pytest.mark.parametrize("name", names())
def test_counters_kernel_compiles(name):
    ex = get(name)
    src = tkx.explore(ex.step_fn, ex.example_inputs, name=name, mode="grid", sync="counters", timeline=True).cuda
    assert src.sync == "counters" and src.timeline_tasks == src.dag.num_tasks
    assert [p.role for p in src.params][-4:] == ["arena", "sync", "status", "timeline"]
    for arch in ("sm_80", "sm_90"):
        report = src.check(arch)
        assert report.registers > 0
        assert report.spill_bytes == 0, f"{name}/{arch}: {report.summary()}"
