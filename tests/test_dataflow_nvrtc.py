"""Every zoo example's kernel with sync="counters" (and a timeline) compiles with NVRTC for sm_90 - the arch
the counters protocol runs on - and, in `make test-full`, for sm_80 (every example's sm_80 kernel with the
default barriers is compiled by tests/test_codegen_examples.py)."""

from __future__ import annotations

import functools

import pytest

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get, names

OK, WHY = nvrtc_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"NVRTC unavailable: {WHY}")


@functools.lru_cache(maxsize=None)
def _counters_source(name):
    ex = get(name)
    return tkx.explore(ex.step_fn, ex.example_inputs, name=name, mode="grid", sync="counters", timeline=True).cuda


def _cases():
    for name in names():
        for arch in ("sm_80", "sm_90"):
            marks = (pytest.mark.full,) if arch == "sm_80" else ()
            yield pytest.param(name, arch, marks=marks, id=f"{name}-{arch}")


@pytest.mark.parametrize("name,arch", list(_cases()))
def test_counters_kernel_compiles(name, arch):
    src = _counters_source(name)
    assert src.sync == "counters" and src.timeline_tasks == src.dag.num_tasks
    assert [p.role for p in src.params][-4:] == ["arena", "sync", "status", "timeline"]
    report = src.check(arch)
    assert report.registers > 0
    assert report.spill_bytes == 0, f"{name}/{arch}: {report.summary()}"
