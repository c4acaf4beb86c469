"""2-CTA thread-block clusters with TMA multicast for the wgmma GEMMs (``Options.gemm_cluster``),
checked without a GPU: off by default (no cluster text, no cluster launch), the plan's choice and why,
the emitted pipeline (multicast copies of B halves, remote ``mapa`` arrivals on the empty mbarriers,
cluster barriers), the stage loop that keeps each pair in one cluster, the launch contract, and NVRTC
compiles for sm_90a without spills.
"""

from __future__ import annotations

import re

import pytest

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.examples import get
from tkx.options import Options
from tkx.target import GemmProblem, cluster_pairs

CLUSTER_TEXT = ("multicast::cluster", "mapa.shared::cluster", "barrier.cluster.arrive", "cluster_ctarank",
                "shared::cluster.b64 _, [%0];")


def _cuda(name: str, *, on: bool = False, any_depth: bool = False, **opts):
    """The CUDA source of example ``name`` for sm_90a: ``on`` pairs GEMMs at least
    :data:`tkx.target.CLUSTER_MIN_K_STEPS` k-tiles deep, with ``any_depth`` every GEMM that can pair."""
    cluster = ("all" if any_depth else "on") if on else "off"
    ex = get(name)
    return tkx.explore(ex.step_fn, ex.make_inputs(0, "cpu"),
                       options=Options(arch="sm_90a", gemm_cluster=cluster, **opts),
                       loss=ex.loss_output).cuda


def _paired(src) -> list[str]:
    return sorted(g for g, n in src.notes.items() if n.get("cluster") == 2)


@pytest.fixture(scope="module")
def medium_on():
    return _cuda("medium", on=True)


def test_off_by_default_no_cluster_text_or_launch():
    assert Options().gemm_cluster == "off"
    src = _cuda("medium")
    assert src.launch.config.cluster == 1
    for frag in CLUSTER_TEXT:
        assert frag not in src.text, frag
    assert not any("cluster" in n for n in src.notes.values())
    assert all(g.plan.cluster is None for g in src.schedule.groups.values() if g.kind in ("gemm", "gemm_partial"))


def test_plan_records_the_cluster_choice_and_why(medium_on):
    groups = {g.id: g for g in medium_on.schedule.groups.values() if g.kind in ("gemm", "gemm_partial")}
    # medium's 256-row GEMMs (4 row blocks of 64, K = 1024 / 4096 split 4: 16 k-tiles per item) pair up;
    # the K = 256 weight gradients (4 k-tiles) stay unpaired
    assert _paired(medium_on) == ["g0", "g1k", "g5"]
    for gid in ("g0", "g1k", "g5"):
        plan = groups[gid].plan
        assert plan.cluster == 2 and "cluster" in dict(plan)
        assert "2-CTA clusters" in plan.why and "multicast" in plan.why, plan.why
    for gid in ("g4", "g7"):
        assert groups[gid].plan.cluster is None and "2-CTA" not in groups[gid].plan.why
    assert medium_on.launch.config.cluster == 2


def test_cluster_pipeline_text(medium_on):
    text = medium_on.text
    for frag in CLUSTER_TEXT:
        assert frag in text, frag
    # each CTA: its own A box and one half of B, multicast to both CTAs (ctaMask 0b11)
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster" in text
    assert '"h"((unsigned short)3)' in text
    assert text.count("tma_mc(stage + 8192 + tkx_rank * 8192, tma_b, k0, col0 + tkx_rank * 64, bar);") == 1  # g5
    assert "tma_mc(stage + 8192 + (tkx_rank * 1 + 0) * 8192, tma_b, col0 + (tkx_rank * 1 + 0) * 64, k0, bar);" \
        in text  # g0, g1k: N-major B, one 64-column box each
    # the full barrier expects A + the whole B tile; the empty one both CTAs' arrivals
    assert text.count('mbarrier.init.shared::cta.b64 [%0], 2;') == 3
    assert text.count("if (t >= 8) wait_empty(s, ((t / 8) - 1) & 1);") == 3
    assert text.count('barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;') == 3
    # pairs: tiles 2q, 2q + 1 are row blocks 2r, 2r + 1 of one column block, checked against the CTA rank
    assert "const int row0 = ((tkx_pair / 32) * 2 + tkx_rank) * 64;" in text
    assert "if (tkx_cta != (unsigned)tkx_rank) __trap();" in text
    # the K-major B half is its own tensor map box (TK x TN / 2)
    assert any(m.box == (64, 64) for m in medium_on.launch.tensor_maps)


def test_handshake_scope_and_the_no_multicast_ablation():
    assert Options().cluster_scope == "cluster"  # the handshake verified on the H200
    src = _cuda("medium", on=True)
    assert src.text.count("mbarrier.arrive.release.cluster.shared::cluster.b64") == 3
    assert src.text.count("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64") == 3
    src = _cuda("medium", on=True, cluster_scope="cta")
    assert "mbarrier.arrive.release.cluster" not in src.text and "try_wait.parity.acquire.cluster" not in src.text
    assert src.text.count('"mbarrier.arrive.shared::cluster.b64 _, [%0];') == 3
    src = _cuda("medium", on=True, cluster_scope="cta", cluster_multicast=False)
    assert "tma_mc(stage" not in src.text and _paired(src) == ["g0", "g1k", "g5"]
    assert "tkx_tma2d(stage + 16384, tma_b, col0 + 64, k0, bar);" in src.text  # g0: both N-major B boxes itself
    assert "tkx_tma2d(stage + 16384, tma_b, k0, col0 + 64, bar);" in src.text  # g5: both K-major halves


def test_paired_groups_start_their_stage_loop_on_an_even_item():
    src = _cuda("medium", on=True, any_depth=True)
    paired = set(_paired(src))
    assert paired == {"g0", "g1k", "g4", "g5", "g7"}
    seen = set()
    for base, gid, n in re.findall(r"const int item = tkx_w - (\d+);  // (\w+): (\d+) items", src.text):
        if gid in paired:
            assert int(base) % 2 == 0 and int(n) % 2 == 0, (gid, base, n)
            seen.add(gid)
    assert seen == {"g4", "g5", "g7"}  # the groups that share a stage with others


def test_cluster_pairs_reasons():
    p = GemmProblem(256, 4096, 1024, dtype="bfloat16", direct=True)
    assert cluster_pairs(p, 64, 128, 1, False) is None
    assert "row block" in cluster_pairs(GemmProblem(192, 4096, 1024, dtype="bfloat16"), 64, 128, 1, False)
    assert "batch" in cluster_pairs(GemmProblem(256, 4096, 1024, batch=2, dtype="bfloat16"), 64, 128, 1, False)
    assert "64-column boxes" in cluster_pairs(p, 64, 64, 1, False)
    assert cluster_pairs(p, 64, 64, 1, True) is None  # K-major: 32-row halves


def test_small_has_no_pairs_by_default_and_pairs_its_deep_tiles_when_asked():
    src = _cuda("small", on=True)
    assert _paired(src) == [] and src.launch.config.cluster == 1  # one row block (M = 64) or K = 64
    src = _cuda("small", on=True, any_depth=True)
    assert _paired(src) == ["g4", "g7"] and src.launch.config.cluster == 2


def test_cp_async_and_block_mode_stay_unpaired():
    src = _cuda("medium", on=True, gemm_copy="cp.async")
    assert _paired(src) == [] and src.launch.config.cluster == 1 and "multicast" not in src.text
    src = _cuda("small", on=True, any_depth=True, mode="block")
    assert src.launch.config.mode == "block" and src.launch.config.cluster == 1 and _paired(src) == []


def test_bad_cluster_size_is_refused():
    from tkx.codegen import gemm as G

    p = GemmProblem(256, 256, 1024, dtype="bfloat16", direct=True)
    with pytest.raises(ValueError, match="clusters of 2"):
        G.emit_gemm("wgmma_bf16", p, lambda b, r, k: "0.0f", lambda b, k, c: "0.0f", lambda b, r, c, a: "",
                    tile=(64, 128, 64), ptr_a=lambda b, r, k: "a", ptr_b=lambda b, k, c: "b",
                    tma_a=lambda i, o: 0, tma_b=lambda i, o: 1, cluster=4)


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC")
@pytest.mark.parametrize("name,any_depth", [("medium", False), ("medium", True), ("small", True)])
def test_cluster_kernels_compile_for_sm90a_without_spills(name, any_depth):
    from tkx.runtime import compile_cubin

    src = _cuda(name, on=True, any_depth=any_depth)
    assert _paired(src)
    report = compile_cubin(src, "sm_90a").report
    assert report.spill_bytes == 0 and report.registers <= 255, report


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC")
def test_cta_scope_handshake_compiles_for_sm90a_without_spills():
    from tkx.runtime import compile_cubin

    src = _cuda("medium", on=True, cluster_scope="cta")
    assert "try_wait.parity.acquire.cluster" not in src.text and _paired(src)
    report = compile_cubin(src, "sm_90a").report
    assert report.spill_bytes == 0, report
