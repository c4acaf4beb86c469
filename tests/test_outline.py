"""Group bodies emitted once (``Options.outline``): a model's layers share one ``__noinline__`` device
function per distinct body, called with each group's addresses; the source map follows them."""

from __future__ import annotations

import re

import pytest
import torch

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.codegen.outline import Outliner
from tkx.examples import decode as D

TYPES = {"in3": "const tkx_bf16* __restrict__", "in7": "const tkx_bf16* __restrict__",
         "out0": "float* __restrict__", "arena": "unsigned char* __restrict__", "status": "int*"}


def _explore(name: str, **options):
    ex = D.get(name)
    return tkx.explore(ex.step_fn, ex.make_inputs(0), name=name, **options)


def test_bodies_differing_only_in_addresses_and_local_names_are_one():
    o = Outliner(TYPES, {})
    a = o.parametrise("const float v_mm = tkx_ld_bf16(in3, i) + tkx_ld_f32((float*)(arena + 64), i);"
                      "  // mm: mm\ntkx_fail(status, TKX_ERR_INDEX, 12);")
    b = o.parametrise("const float v_mm_9 = tkx_ld_bf16(in7, i) + tkx_ld_f32((float*)(arena + 4096), i);"
                      "  // mm_9: mm\ntkx_fail(status, TKX_ERR_INDEX, 40);")
    assert a.key == b.key and a.params == b.params
    assert b.args == ["in7", "arena + 4096", "status", "40"]
    assert "tkx_p0" in a.text and "tkx_a0" in a.text and "// mm: mm" in a.text  # comments kept, locals kept
    other_shape = o.parametrise("const float v_mm = tkx_ld_bf16(in3, i * 2);")
    assert other_shape.key != a.key
    same_pointer_twice = o.parametrise("x = tkx_ld_bf16(in3, i) + tkx_ld_bf16(in3, i + 1);")
    two_pointers = o.parametrise("x = tkx_ld_bf16(in3, i) + tkx_ld_bf16(in7, i + 1);")
    assert same_pointer_twice.key != two_pointers.key  # an alias is not merged with two pointers


@pytest.mark.parametrize("code", ["tkx_wait(sync, tkx_epoch, status, 0, 1u, 0, item, 9ULL);",
                                  "const unsigned long long m = (unsigned long long)(tmaps + 128);",
                                  "if (item > 3) return;"])
def test_code_tied_to_the_kernel_stays_in_it(code):
    assert Outliner(TYPES, {}).parametrise(code) is None


def test_options_validate_outline():
    with pytest.raises(tkx.OptionsError, match="outline"):
        tkx.Options(outline="always")
    assert tkx.Options(outline="off").key() != tkx.Options().key()


def test_layers_share_one_function_per_distinct_body():
    exp = _explore("llama_1b_tiny", outline="on")  # its 2 layers (auto outlines from 4: the decode steps)
    src, sched = exp.cuda, exp.schedule
    assert set(src.function_lines) == set(sched.groups)
    functions = re.findall(r"__device__ __noinline__ void (tkx_body_\d+)\(", src.text)
    assert len(set(functions)) == len(functions) < len(sched.groups)
    per_layer = len(sched.groups) // 2
    assert len(functions) <= per_layer + 4  # layer 1 reuses layer 0's bodies (the edges of the model aside)
    lines = src.text.splitlines()
    for gid in sched.groups:
        first, last = src.group_lines[gid]
        call = [n for n in range(first, last + 1) if re.search(r"tkx_body_\d+\(", lines[n - 1])]
        assert len(call) == 1, gid
        a, b = src.function_lines[gid]
        name = re.search(r"tkx_body_\d+", lines[call[0] - 1]).group(0)
        assert lines[a].startswith(f"__device__ __noinline__ void {name}(") and lines[b - 1] == "}"
        for op_id in sched.groups[gid].stores:  # every stored op is mapped into its body's lines
            if op_id in sched.homes:
                assert any(a <= n <= b for n in src.lines_of(op_id)), (gid, op_id)


def test_auto_outlines_a_layered_model_and_leaves_small_examples_inline():
    assert "__noinline__" in _explore("decode").cuda.text  # 4 layers: most of its code repeats
    tiny = _explore("llama_1b_tiny").cuda
    assert "__noinline__" not in tiny.text and not tiny.function_lines
    assert tiny.text == _explore("llama_1b_tiny", outline="off").cuda.text
    ex = tkx.examples.get("digits_mlp")
    auto = tkx.explore(ex.step_fn, ex.example_inputs).cuda
    assert auto.text == tkx.explore(ex.step_fn, ex.example_inputs, outline="off").cuda.text
    on = tkx.explore(ex.step_fn, ex.example_inputs, outline="on").cuda
    assert "__noinline__" in on.text and on.function_lines


@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_outlined_kernel_compiles_without_spills(arch):
    report = _explore("llama_1b_tiny_int4", outline="on").cuda.check(arch)
    assert report.registers > 0 and report.spill_bytes == 0, report.summary()
    assert "tkx_body_" in report.log  # the functions' own ptxas report, whose spills count as the kernel's


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["llama_1b_tiny", "llama_1b_tiny_int4", "decode_tiny"])
def test_outlined_kernel_gives_the_inline_kernels_tokens_on_the_gpu(name):
    ex = D.get(name)
    tokens = {}
    for choice in ("on", "off"):
        runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, device="cuda"), tkx.Options(outline=choice))
        assert ("__noinline__" in runner.source.text) == (choice == "on")
        tokens[choice] = D.generate(runner, ex.make_inputs(0, device="cuda"), 8).cpu()
    assert torch.equal(tokens["on"], tokens["off"])
    want = D.generate(ex.step_fn, ex.make_inputs(0, device="cuda"), 8).cpu()
    assert torch.equal(tokens["on"], want)


@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")
def test_graph_of_kernels_of_an_outlined_kernel_compiles():
    """The per-group kernels (tkx.codegen.kernels_graph) share the megakernel's translation unit, its device
    functions and file-scope workspace included, and still inline their own group code."""
    from tkx.codegen.kernels_graph import generate_graph

    graph = generate_graph(_explore("llama_1b_tiny", outline="on").cuda)
    report = graph.check("sm_90")
    assert len(graph.kernels) == len(report.kernels) and report.spill_bytes == 0, report.summary()


def test_read_only_parameters_load_through_ldg():
    """In a device function NVVM never infers ld.global.nc (it does so only for a kernel's own const
    __restrict__ parameters), so the outlined bodies load read-only inputs with __ldg; buffers the kernel
    writes (a cache updated in place) and arena slots keep plain loads."""
    from tkx.codegen.outline import read_only_loads

    params = ["const int item", "const tkx_bf16* __restrict__ tkx_p0", "tkx_bf16* __restrict__ tkx_p1",
              "unsigned char* tkx_a0"]
    text = "\n".join([
        "const float w = tkx_ld_bf16(tkx_p0, i) + tkx_ld_bf16(tkx_p1, i);  // mul: mul",
        "const unsigned short* src = reinterpret_cast<const unsigned short*>((tkx_p0 + (k0 + l * 64)));",
        "if (aligned) raw[c] = *reinterpret_cast<const uint4*>(src);",
        "else raw[c] = make_uint4(src[0] | ((unsigned int)src[1] << 16), 0u, 0u, 0u);",
        "const unsigned short* src = (reinterpret_cast<const unsigned short*>(tkx_p1) + 8);",
        "kraw = *reinterpret_cast<const uint4*>(src);  // 16-byte load",
        "const float a = tkx_ld_f32(reinterpret_cast<float*>(tkx_a0), i);"])
    out = read_only_loads(text, params).splitlines()
    assert out[0] == "const float w = tkx_ldg_bf16(tkx_p0, i) + tkx_ld_bf16(tkx_p1, i);  // mul: mul"
    assert out[2] == "if (aligned) raw[c] = __ldg(reinterpret_cast<const uint4*>(src));"
    assert out[3] == "else raw[c] = make_uint4(__ldg(src + 0) | ((unsigned int)__ldg(src + 1) << 16), 0u, 0u, 0u);"
    assert out[5] == text.splitlines()[5] and out[6] == text.splitlines()[6]  # the cache and the arena: plain
    assert read_only_loads(text, params[2:]) == text


@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")
def test_outlined_weights_load_non_coherent_in_the_ptx():
    """The PTX of an outlined decode step reads its weights through ld.global.nc: the GEMV bodies' 16-byte
    loads and the point loads of norms and embedding (llama_1b_tiny: 77 of 205 global loads, 2 of them
    16-byte; none of them before the bodies used __ldg)."""
    from tkx.codegen.nvrtc import compile_ptx

    src = _explore("llama_1b_tiny", outline="on", mode="grid").cuda
    assert "tkx_ldg_bf16(" in src.text and "__ldg(reinterpret_cast<const uint4*>(" in src.text
    loads = re.findall(r"^\s*(?:@%p\d+\s+)?(ld\.global\.[\w.]+)", compile_ptx(src.text, "sm_90"), re.M)
    nc = [x for x in loads if x.startswith("ld.global.nc.")]
    assert nc.count("ld.global.nc.v4.u32") >= 2 and len(nc) >= 50, (len(nc), len(loads))
