"""The graph of kernels: one kernel per fused group of the megakernel's schedule (tkx.codegen.kernels_graph).

On the CPU: the kernels compile with NVRTC for sm_80, sm_90 (and sm_90a with wgmma/TMA GEMMs) with no
spills, one per group in stage order, with the megakernel's parameters and no grid barrier. On a GPU
(marked gpu): they give the megakernel's numbers, verify against eager, and are timed.
"""

from __future__ import annotations

import re

import pytest

import tkx
from tkx.codegen.kernels_graph import _called, generate_graph
from tkx.codegen.nvrtc import nvrtc_available

OK, WHY = nvrtc_available()
needs_nvrtc = pytest.mark.skipif(not OK, reason=f"NVRTC unavailable: {WHY}")

CASES = {  # case -> (example, Options of the check)
    "linear_regression": ("linear_regression", {}),
    "small": ("small", {}),
    "poly_clip_adamw-block": ("poly_clip_adamw", {"mode": "block"}),
    "char_lm": ("char_lm", {}),
    "mixed_precision-sm_90a": ("mixed_precision", {"arch": "sm_90a"}),
    "medium-tma-clusters": ("medium", {"arch": "sm_90a", "gemm_copy": "tma", "gemm_cluster": "on"}),
    "char_lm-outlined": ("char_lm", {"outline": "on"}),
}


def _source(name, **options):
    ex = tkx.examples.get(name)
    return tkx.explore(ex.step_fn, ex.example_inputs, name=name, **options).cuda


@pytest.fixture(scope="module")
def graphs():
    cache = {}

    def get(name):
        if name not in cache:
            example, options = CASES[name]
            cache[name] = generate_graph(_source(example, **options))
        return cache[name]
    return get


@pytest.mark.parametrize("name", list(CASES))
def test_one_kernel_per_group_in_stage_order(graphs, name):
    g = graphs(name)
    s = g.schedule
    assert [k.group for k in g.kernels] == [gid for stage in s.stages for gid in stage]
    assert [k.stage for k in g.kernels] == sorted(k.stage for k in g.kernels)
    assert [k.items for k in g.kernels] == [g.megakernel.work_items[k.group] for k in g.kernels]
    entries = re.findall(r'extern "C" __global__ void __maxnreg__\(\d+\) (\w+)\(', g.text)
    assert entries == [k.name for k in g.kernels]
    assert g.launch is g.megakernel.launch and g.sync_words == g.megakernel.sync_words
    kernels_text = g.text[g.text.index('extern "C" __global__'):]
    assert "tkx_grid_barrier" not in kernels_text and "tkx_wait(" not in kernels_text
    assert kernels_text.count("griddepcontrol.wait") == len(g.kernels)  # each may be a programmatic dependent
    if CASES[name][1].get("gemm_cluster") == "on":  # the paired GEMMs launch in clusters of 2, the rest alone
        assert {k.cluster for k in g.kernels} == {1, 2}


@needs_nvrtc
@pytest.mark.parametrize("name", list(CASES))
def test_kernels_compile_without_spills(graphs, name):
    g = graphs(name)
    options = CASES[name][1]
    archs = [options["arch"]] if "arch" in options else ["sm_80", "sm_90"]
    for arch in archs:
        report = g.check(arch)
        assert sorted(k.name for k in report.kernels) == sorted(k.name for k in g.kernels)
        assert report.spill_bytes == 0, f"{name}/{arch}: {report.summary()}"
        assert all(k.registers > 0 for k in report.kernels)


def test_same_parameters_as_the_megakernel(graphs):
    g = graphs("small")
    decl = ",\n".join(p.declaration() for p in g.megakernel.params)
    assert g.text.count(decl.splitlines()[0].strip()) >= len(g.kernels)
    assert "tkx_k0_" in g.text and repr(g).startswith("<tkx.GraphSource")


def test_only_the_device_functions_its_kernels_call(graphs):
    g = graphs("char_lm-outlined")
    # the megakernel's outlined group bodies stay out: each kernel holds its group's code
    assert "tkx_body_" in g.megakernel.text and "tkx_body_" not in g.text
    declared = set(re.findall(r"(tkx_v_\w+)\(TKX_POINTERS", g.text))
    assert declared and declared == set(re.findall(r"(tkx_v_\w+)\(TKX_ARGS", g.text))


def test_a_value_function_is_kept_when_called_directly_or_through_another():
    functions = {"tkx_v_a": "return tkx_v_b(TKX_ARGS, i) + 1.0f;", "tkx_v_b": "return arena[i];",
                 "tkx_v_c": "return tkx_v_b(TKX_ARGS, i);"}
    assert _called(["const float x = tkx_v_a(TKX_ARGS, e);"], functions) == {"tkx_v_a", "tkx_v_b"}
    assert _called(["const float x = 0.0f;"], functions) == set()


# -- on a GPU ----------------------------------------------------------------------------------------
GPU_EXAMPLES = ["linear_regression", "small", "q_learning", "poly_clip_adamw", "char_lm", "medium"]


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, "auto"])
@pytest.mark.parametrize("name", GPU_EXAMPLES)
def test_graph_of_kernels_gives_the_megakernels_numbers(name, pdl):
    import torch

    from tkx.bench.compare import same_numbers

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    ex = tkx.examples.get(name)
    args = ex.make_inputs(0, "cuda")
    runner = tkx.runtime.build(ex.step_fn, args, name=name)
    many = tkx.runtime.GraphOfKernels.from_runner(runner, pdl=pdl)
    assert len(many.kernel.entries) == len(runner.schedule.groups)
    assert not many.kernel.pdl if pdl is False else many.kernel.pdl <= (torch.cuda.get_device_capability()[0] >= 9)
    worst, sentence = same_numbers(runner, many, ex.make_inputs(1, "cuda"))
    assert worst <= 1e-5, sentence
    ver = many.verify(seeds=(0,), make_inputs=ex.make_inputs)
    assert ver.passed, ver.summary()
    graph = many.capture_graph(*ex.make_inputs(2, "cuda"))
    graph.replay()
    graph.check_status()


@pytest.mark.gpu
def test_graph_of_kernels_is_timed_beside_the_megakernel():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    ex = tkx.examples.get("small")
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0, "cuda"), name="small")
    t = tkx.bench.graph_of_kernels(exp, make_inputs=ex.make_inputs, repeats=3)
    assert t.kernels >= t.stages >= 1 and t.relative_error <= 1e-5  # one kernel per group, every stage has one
    assert t.megakernel_us > 0 and t.graph_of_kernels_us > 0 and t.speed_of_light_us > 0
    assert "one kernel saves" in str(t) and set(t.as_dict()["samples_us"]) == {"megakernel", "graph_of_kernels"}


def test_the_report_shows_the_graph_of_kernels_beside_tkx_never_as_a_baseline():
    from tkx.bench import GRAPH_OF_KERNELS, BenchmarkReport, Row

    rows = tuple(Row.measured(n, [us] * 7, 10) for n, us in
                 (("eager", 900.0), ("inductor", 20.0), ("tkx", 10.0), (GRAPH_OF_KERNELS, 5.0)))
    report = BenchmarkReport("x", rows, {"passed": True}, schedule={"speed_of_light_us": 2.0})
    assert report.best_baseline == "inductor" and report.ratio_to_best == pytest.approx(0.5)
    assert report.graph_of_kernels_us == 5.0 and report.sol_fraction == pytest.approx(0.2)
    d = report.to_dict()
    assert d["graph_of_kernels_us"] == 5.0 and d["sol_fraction"] == pytest.approx(0.2)
    assert GRAPH_OF_KERNELS in str(report) and "speed of light" in str(report)


# -- the launch shapes, with a stand-in for cuda-core (no GPU) -------------------------------------
class _FakeConfig:
    def __init__(self, **kw):
        self.kw = kw


class _FakeCore:
    """cuda-core's LaunchConfig and launch, recording what would be launched."""

    LaunchConfig = _FakeConfig
    launched: list = []

    @staticmethod
    def launch(stream, config, kernel, *args):
        _FakeCore.launched.append((kernel.name, config.kw, len(args)))


class _FakeKernel:
    def __init__(self, name):
        from types import SimpleNamespace

        self.name = name
        self.attributes = SimpleNamespace(num_regs=64, shared_size_bytes=1024, local_size_bytes=0)
        self.occupancy = SimpleNamespace(max_active_blocks_per_multiprocessor=lambda threads, dyn: 2)


class _FakeObject:
    def get_kernel(self, name):
        return _FakeKernel(name)


def test_each_kernel_launches_its_items_capped_by_the_resident_blocks():
    import torch

    from tkx.codegen.kernels_graph import GraphKernel
    from tkx.runtime.graph_of_kernels import _Entry

    def entry(items, cluster=1, pdl=False, max_blocks=None):
        spec = GraphKernel(f"k{items}", "g", 0, items, 1024, cluster)
        return _Entry(spec, _FakeObject(), torch.device("cpu"), 256, 132, max_blocks, _FakeCore, pdl=pdl)

    assert entry(500).grid == 264 and entry(3).grid == 3 and entry(500, max_blocks=100).grid == 100
    paired = entry(5, cluster=2, pdl=True)  # clusters of 2: a whole number of clusters
    assert paired.grid == 4 and paired.config.kw["cluster"] == 2 and paired.config.kw["grid"] == 2
    assert entry(3, pdl=True).config.kw["programmatic_stream_serialization"] is True
    assert "programmatic_stream_serialization" not in entry(3).config.kw
    e = entry(7)
    e.launch("stream", [1, 2, 3])
    assert _FakeCore.launched[-1] == ("k7", {"grid": 7, "block": 256, "shmem_size": 0}, 3)


def test_programmatic_dependent_launch_needs_a_cuda_core_that_offers_it():
    import torch

    from tkx.runtime.graph_of_kernels import _pdl_wanted
    from tkx.runtime.kernel import KernelLoadError

    class Old:
        class LaunchConfig:
            def __init__(self, grid, block):
                pass

    cpu = torch.device("cpu")
    assert _pdl_wanted(False, cpu, _FakeCore) is False and _pdl_wanted(True, cpu, _FakeCore) is True
    assert _pdl_wanted("auto", cpu, Old) is False
    with pytest.raises(KernelLoadError, match="programmatic_stream_serialization"):
        _pdl_wanted(True, cpu, Old)
    with pytest.raises(ValueError, match="pdl="):
        _pdl_wanted("yes", cpu, _FakeCore)
