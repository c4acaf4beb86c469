"""The GEMM/GEMV emitter registry: a new emitter is one module (a ``@register_gemm`` function) plus one spec
row in ``tkx.target``; code generation finds it through the registry, nothing else names it."""

from __future__ import annotations

import pytest

import tkx
from tkx.codegen import gemm as G
from tkx.codegen import gemm_registry as R
from tkx.options import Options
from tkx.target import gemm as target_gemm
from tkx.target.facts import ARCHES, Capabilities

MARK = "// toy GEMM emitter"


class _ToySpec(target_gemm.GemmEmitter):
    """A spec row that takes every GEMM (it is asked first)."""

    name = "toy_gemm"
    codegen = ""  # registered by the test itself, no module to import
    capabilities = Capabilities(ARCHES, "registers", (1, 1, 1))
    summary = "one thread per output element (test only)"


def _toy(r: R.GemmRequest) -> G.GemmCode:
    """One output element per thread, K summed in a loop: enough to show the request's fields arrive."""
    p = r.problem
    body = "\n".join([
        f"{MARK} {'x'.join(map(str, r.tile))}, {r.threads} threads",
        f"const int e = {r.item} * {r.threads} + threadIdx.x;",
        "const int bat = 0;",
        f"if (e < {p.m * p.n}) {{",
        f"    const int row = e / {p.n}, col = e % {p.n};",
        "    float acc = 0.0f;",
        f"    for (int k = 0; k < {p.k}; ++k) acc += {r.load_a('bat', 'row', 'k')} * {r.load_b('bat', 'k', 'col')};",
        "    " + r.epilogue("bat", "row", "col", "acc"),
        "}",
    ])
    items = -(-p.m * p.n // r.threads)
    return G.GemmCode(r.variant, "{\n" + body + "\n}", items, 0, r.threads, False, {"toy": True})


@pytest.fixture
def toy(monkeypatch):
    """The toy spec row first in the table and its code generator registered (both undone after the test)."""
    monkeypatch.setattr(target_gemm, "GEMM_EMITTERS", (_ToySpec(), *target_gemm.GEMM_EMITTERS))
    monkeypatch.setattr(R, "REGISTRY", dict(R.REGISTRY))
    R.register_gemm("toy_gemm")(_toy)
    return _ToySpec


def test_a_registered_emitter_is_dispatched_by_its_spec_name(toy):
    p = G.GemmProblem(8, 16, 32)
    code = G.emit_gemm("toy_gemm", p, lambda b, r, k: f"A[{r}*32+{k}]", lambda b, k, c: f"B[{k}*16+{c}]",
                       lambda b, r, c, acc: f"C[{r}*16+{c}] = {acc};", tile=(8, 16, 32), threads=64)
    assert code.variant == "toy_gemm" and code.params == {"toy": True} and code.work_items == 2
    assert f"{MARK} 8x16x32, 64 threads" in code.code and "A[row*32+k] * B[k*16+col]" in code.code
    assert "toy_gemm" in G.variants() and R.codegen_for("toy_gemm") is _toy


def test_the_kernel_emits_a_new_emitter_chosen_by_the_scheduler(toy):
    ex = tkx.examples.get("linear_regression")
    src = tkx.runtime.lower(ex.step_fn, ex.example_inputs, Options(mode="grid"))
    gemms = [g for g in src.schedule.groups.values() if g.kind == "gemm"]
    assert gemms and all(g.plan.impl == "toy_gemm" for g in gemms)
    assert all(g.plan.why.startswith("toy_gemm: one thread per output element") for g in gemms)
    assert src.text.count(MARK) == len(gemms)
    assert all(src.notes[g.id]["variant"] == "toy_gemm" for g in gemms)


def test_every_spec_row_has_a_registered_code_generator():
    for variant in G.variants():
        fn = R.codegen_for(variant)
        assert R.REGISTRY[variant] is fn and fn.__module__.startswith("tkx.codegen.")
    assert R.codegen_for("gemv_stream") is G.gemv_stream and R.codegen_for("wgmma_f16") is G.wgmma_gemm


def test_registry_errors_are_clear(monkeypatch):
    with pytest.raises(ValueError, match="unknown GEMM variant 'nope'; one of"):
        R.codegen_for("nope")
    monkeypatch.setattr(target_gemm, "GEMM_EMITTERS", (_ToySpec(), *target_gemm.GEMM_EMITTERS))
    monkeypatch.setattr(R, "REGISTRY", dict(R.REGISTRY))
    with pytest.raises(ValueError, match="has a spec row but no registered code generator"):
        R.codegen_for("toy_gemm")

    def other(r: R.GemmRequest) -> G.GemmCode:
        raise AssertionError("never called")
    with pytest.raises(ValueError, match="'simt' is already registered by tkx.codegen.gemm_simt.simt_gemm"):
        R.register_gemm("simt")(other)
    with pytest.raises(ValueError, match="split-K is implemented by the wgmma variants, not simt"):
        G.emit_gemm("simt", G.GemmProblem(64, 64, 64), *(lambda *a: "0.0f",) * 2, lambda *a: "", split=2)
    with pytest.raises(TypeError, match="tile_q"):
        G.emit_gemm("simt", G.GemmProblem(64, 64, 64), *(lambda *a: "0.0f",) * 2, lambda *a: "", tile_q=2)
