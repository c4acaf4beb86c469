"""Shared by every test module: each distinct kernel is compiled by NVRTC once per test run.

Many tests compile the same generated source for the same architecture (the zoo's kernels are
checked for spills by several files, the Hopper code by two); :func:`tkx.codegen.nvrtc.compile_cuda`
is a pure function of its arguments, so its successful reports (frozen dataclasses) are kept for the
session and handed out again. Failures are not kept: each call raises again. Tests that replace
``compile_cuda`` with ``monkeypatch`` wrap this memo; tests that replace the NVRTC entry points below it
(``_compile_core``, ``_compile_bindings``, ``include_dirs``) miss it, since those are part of the key.
"""

from __future__ import annotations

import inspect

import pytest


@pytest.fixture(scope="session", autouse=True)
def compile_each_kernel_once():
    try:
        from tkx.codegen import nvrtc
    except ImportError:  # pragma: no cover - tkx itself does not import
        yield
        return
    real = nvrtc.compile_cuda
    signature = inspect.signature(real)
    reports: dict[tuple, object] = {}

    def compile_cuda(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        # a test that replaces NVRTC's entry points underneath compiles for real
        key = (tuple(bound.arguments.items()), nvrtc._compile_core, nvrtc._compile_bindings, nvrtc.include_dirs)
        if key not in reports:
            reports[key] = real(*args, **kwargs)
        return reports[key]

    compile_cuda.__doc__ = real.__doc__
    nvrtc.compile_cuda = compile_cuda
    yield reports
    nvrtc.compile_cuda = real
