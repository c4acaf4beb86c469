"""The runtime and the benchmark report, checked without a GPU.

Covered here: the compile cache (keys, atomic writes, clearing, NVRTC hits and misses), the
call signature (pytree mirroring, input/output checks naming the input), kernel argument
order and packing through cuda-core, grid choice, status decoding, the verification logic
(with a stand-in runner that executes the reference interpreter on the CPU), the no-GPU
error, the torch-extension launcher text and toolchain errors, and the benchmark report.
What needs a GPU is in ``tests/test_gpu.py``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_structure

import tkx
from tkx import reference
from tkx.bench import BenchmarkReport, Row, summary_lines, workload_entry
from tkx.codegen import abi
from tkx.ir import InputSpec, TensorSpec
from tkx.options import Options
from tkx.runtime import cache as C
from tkx.runtime import inputs as I
from tkx.runtime import kernel as K
from tkx.runtime import status as S
from tkx.runtime import verify as V
from tkx.runtime.device import NoDeviceError
from tkx.runtime.runner import pack_args

ROOT = Path(__file__).resolve().parents[1]

TINY_KERNEL = r"""
extern "C" __global__ void tkx_step(const float* __restrict__ in0, float* __restrict__ out0,
                                    unsigned char* __restrict__ arena, unsigned int* sync, int* status) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 16) out0[i] = 2.0f * in0[i] + 1.0f;
}
"""


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TKX_CACHE_DIR", str(tmp_path / "tkx-cache"))
    return tmp_path / "tkx-cache"


def _program(name: str):
    ex = tkx.examples.get(name)
    return ex, tkx.capture(ex.step_fn, ex.example_inputs, loss=ex.loss_output).lower()


def nvrtc_or_skip():
    from tkx.codegen.nvrtc import nvrtc_available

    ok, why = nvrtc_available()
    if not ok:
        pytest.skip(why)


# --------------------------------------------------------------------------------------
# cache
# --------------------------------------------------------------------------------------
def test_cache_key_changes_with_every_ingredient():
    base = dict(source="a", arch="sm_90", flags=("-x",), tkx_version="0.1", compiler_version="nvrtc 13.0")

    def key(**changes):
        args = {**base, **changes}
        return C.cache_key(args.pop("source"), args.pop("arch"), args.pop("flags"), **args)

    k0 = key()
    assert k0 == key() and len(k0) == 64 and all(c in "0123456789abcdef" for c in k0)
    variants = [key(source="b"), key(arch="sm_80"), key(flags=("-y",)), key(flags=("-x", "-y")),
                key(tkx_version="0.2"), key(compiler_version="nvrtc 13.1"), key(backend="torch-extension")]
    assert len({k0, *variants}) == len(variants) + 1


def test_cache_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TKX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert C.cache_dir() == tmp_path / "xdg" / "tkx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.cache_dir() == tmp_path / "home" / ".cache" / "tkx"
    monkeypatch.setenv("TKX_CACHE_DIR", str(tmp_path / "explicit"))
    assert C.cache_dir() == tmp_path / "explicit"
    assert tkx.runtime.cache_dir() == C.cache_dir()


def test_atomic_write_concurrent_writers_leave_one_whole_file(tmp_path):
    target = tmp_path / "sub" / "entry.bin"
    payloads = [bytes([i]) * (200_000 + i) for i in range(8)]
    threads = [threading.Thread(target=C.atomic_write, args=(target, p)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_bytes() in payloads
    assert [p.name for p in target.parent.iterdir()] == ["entry.bin"]  # no temporary files left


def test_atomic_write_failure_leaves_nothing(tmp_path, monkeypatch):
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(C.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        C.atomic_write(tmp_path / "x.bin", b"data")
    assert list(tmp_path.iterdir()) == []


def test_store_load_corrupt_and_clear(cache_home):
    assert C.load_entry("k" * 64) is None
    assert C.store_entry("k" * 64, b"cubin-bytes", {"report": {"a": 1}})
    binary, meta = C.load_entry("k" * 64)
    assert binary == b"cubin-bytes" and meta["report"] == {"a": 1} and meta["key"] == "k" * 64
    assert len(C.cache_entries()) == 1
    (cache_home / "nvrtc" / ("k" * 64 + ".cubin")).write_bytes(b"truncated")
    assert C.load_entry("k" * 64) is None  # hash mismatch: ignored
    assert C.clear_cache() == 2
    assert not cache_home.exists() and C.clear_cache() == 0


def test_unwritable_cache_warns_and_goes_on(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TKX_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="could not write the kernel cache"):
        assert not C.store_entry("a" * 64, b"x", {})


def test_compile_cubin_cache_miss_hit_refresh_and_flags(cache_home):
    nvrtc_or_skip()
    first = K.compile_cubin(TINY_KERNEL, "sm_90")
    assert not first.cache_hit and first.cubin and first.report.registers > 0
    assert first.compile_seconds == first.report.compile_seconds
    second = K.compile_cubin(TINY_KERNEL, "sm_90")
    assert second.cache_hit and second.key == first.key and second.cubin == first.cubin
    assert second.report.registers == first.report.registers
    assert second.report.kernels == first.report.kernels
    assert second.compile_seconds == pytest.approx(first.compile_seconds)  # the cold time is remembered
    exact = K.compile_cubin(TINY_KERNEL, "sm_90", exact=True)
    assert not exact.cache_hit and exact.key != first.key and "--fmad=false" in exact.flags
    other_arch = K.compile_cubin(TINY_KERNEL, "sm_80")
    assert not other_arch.cache_hit and other_arch.key != first.key
    assert not K.compile_cubin(TINY_KERNEL, "sm_90", cache="refresh").cache_hit
    assert K.compile_cubin(TINY_KERNEL, "sm_90").cache_hit
    uncached = K.compile_cubin(TINY_KERNEL + "\n// new\n", "sm_90", cache=False)
    assert not uncached.cache_hit and not (cache_home / "nvrtc" / f"{uncached.key}.json").exists()
    # a damaged entry is recompiled, not trusted
    (cache_home / "nvrtc" / f"{first.key}.cubin").write_bytes(b"garbage")
    again = K.compile_cubin(TINY_KERNEL, "sm_90")
    assert not again.cache_hit and again.cubin == first.cubin
    assert tkx.runtime.clear_cache() >= 6


def test_compile_cubin_reads_exact_from_the_source_options(cache_home):
    nvrtc_or_skip()
    config = abi.KernelConfig(threads=32, mode="block", blocks=1, exact=True)
    source = types.SimpleNamespace(text=TINY_KERNEL, launch=abi.LaunchContract("k", (), config, 0))
    binary = K.compile_cubin(source, "sm_90")
    key, flags = K.nvrtc_cache_key(TINY_KERNEL, "sm_90", exact=True)
    assert binary.key == key and "--fmad=false" in flags


# --------------------------------------------------------------------------------------
# the call signature
# --------------------------------------------------------------------------------------
CPU = torch.device("cpu")


def test_arg_names_and_flatten_mirror_the_step():
    ex, program = _program("tiny_online")
    assert I.arg_names(program) == ["params", "x", "y"]
    args = ex.make_inputs(0)
    flat = I.flatten_args(program, args)
    assert [t.shape for t in flat] == [torch.Size(i.value.shape) for i in program.inputs]
    assert I.leaf_names(args, ["params", "x", "y"]) == [i.name for i in program.inputs]
    outs = reference.run(program, flat).outputs
    assert tree_structure(I.unflatten_outputs(program, outs)) == tree_structure(ex.step_fn(*args))


def test_flatten_names_missing_and_unexpected_leaves():
    ex, program = _program("tiny_online")
    params, x, y = ex.make_inputs(0)
    bad = {k: v for k, v in params.items() if k != "b2"}
    bad["b3"] = params["b2"]
    with pytest.raises(I.InputMismatchError) as info:
        I.flatten_args(program, (bad, x, y))
    assert "missing params['b2']" in str(info.value) and "unexpected params['b3']" in str(info.value)
    with pytest.raises(I.InputMismatchError, match="takes 3 arguments"):
        I.flatten_args(program, (params, x))
    with pytest.raises(I.InputMismatchError, match="missing x; unexpected x\\[0\\]"):
        I.flatten_args(program, (params, (x,), y))
    reordered = dict(reversed(list(params.items())))  # same leaves, another container layout
    with pytest.raises(I.InputMismatchError, match="containers differ"):
        I.flatten_args(program, (reordered, x, y))


def test_check_inputs_names_the_input_and_what_differs():
    ex, program = _program("tiny_online")
    params, x, y = ex.make_inputs(0)
    I.check_inputs(program.inputs, I.flatten_args(program, (params, x, y)), CPU)

    def problems(**changes):
        p = dict(params, **changes)
        with pytest.raises(I.InputMismatchError) as info:
            I.check_inputs(program.inputs, I.flatten_args(program, (p, x, y)), CPU)
        return info.value

    err = problems(w1=torch.zeros(64, 7))
    assert err.name == "params['w1']" and "shape (64, 7), compiled for (64, 128)" in str(err)
    err = problems(w1=params["w1"].double())
    assert "params['w1'] has dtype float64, compiled for float32" in str(err)
    err = problems(w1=params["w1"].t().contiguous().t())
    assert "strides (1, 64), compiled for (128, 1)" in str(err) and ".contiguous()" in str(err)
    err = problems(w1=params["w1"].to("meta"))
    assert "is on meta, compiled for cpu" in str(err)
    err = problems(w1=params["w1"].to(torch.float16), b1=params["b1"][:3])
    assert err.name == "params['w1']" and "and 1 more input(s) differ: params['b1']" in str(err)
    err = problems(w1=3.0)
    assert "is a float, not a tensor" in str(err)
    assert isinstance(err, tkx.TkxError)


def test_check_inputs_rejects_shared_memory_for_updated_inputs():
    spec = TensorSpec.dense("a", (4,), "float32")
    specs = [InputSpec("p", spec, mutated=True), InputSpec("q", TensorSpec.dense("b", (4,), "float32"))]
    base = torch.zeros(8)
    with pytest.raises(I.InputMismatchError, match="inputs p and q share memory"):
        I.check_inputs(specs, [base[:4], base[4:]], CPU)
    I.check_inputs([InputSpec("p", spec), InputSpec("q", TensorSpec.dense("b", (4,), "float32"))],
                   [base[:4], base[4:]], CPU)  # read-only inputs may share


def test_size_one_dims_ignore_strides():
    spec = InputSpec("v", TensorSpec((1, 4), "float32", (4, 1), "v"))
    I.check_inputs([spec], [torch.zeros(4, 1).t()], CPU)  # strides (1, 1): dim 0 has size 1


def test_outputs_allocation_and_out_checks():
    ex, program = _program("tiny_online")
    flat = I.flatten_args(program, ex.make_inputs(0))
    outs = I.allocate_outputs(program, CPU)
    assert [tuple(o.shape) for o in outs] == [o.value.shape for o in program.outputs]
    assert I.check_outputs(program, outs, CPU, flat) == outs
    tree = I.unflatten_outputs(program, outs)
    assert I.check_outputs(program, tree, CPU, flat) == outs  # the output pytree works too
    with pytest.raises(I.InputMismatchError, match="shares memory with input"):
        I.check_outputs(program, [flat[0] if k == 1 else o for k, o in enumerate(outs)], CPU, flat)
    with pytest.raises(I.InputMismatchError, match="has shape"):
        I.check_outputs(program, [torch.zeros(3)] + outs[1:], CPU, flat)
    with pytest.raises(I.InputMismatchError, match="out= has"):
        I.check_outputs(program, outs[:-1], CPU, flat)


# --------------------------------------------------------------------------------------
# kernel arguments, grid, status
# --------------------------------------------------------------------------------------
def test_pack_args_follows_the_abi_order():
    _, program = _program("digits_mlp")
    params = abi.kernel_params(program)
    n_in, n_out = len(program.inputs), len(program.outputs)
    ins = [1000 + i for i in range(n_in)]
    outs = [2000 + k for k in range(n_out)]
    args = pack_args(params, ins, outs, 3000, 4000, 4016)
    assert args == ins + outs + [3000, 4000, 4016]
    with pytest.raises(tkx.TkxError, match="role 'scalar'"):
        pack_args([abi.Param("n", "int", "scalar")], ins, outs, 0, 0, 0)
    with pytest.raises(tkx.TkxError, match="refers to input 99"):
        pack_args([abi.Param("in99", "float*", "input", 99)], ins, outs, 0, 0, 0)


def test_cuda_core_packs_uint64_addresses_exactly():
    pytest.importorskip("cuda.core")
    try:
        from cuda.core._kernel_arg_handler import ParamHolder
    except ImportError:  # pragma: no cover - layout of other cuda-core releases
        pytest.skip("cuda.core has no _kernel_arg_handler here")
    addresses = [0x7F00_1234_5678, 0xFFFF_FFFF_FFFF_FF00, 16]
    holder = ParamHolder([ctypes.c_uint64(a) for a in addresses])
    slots = (ctypes.c_void_p * len(addresses)).from_address(holder.ptr)
    assert [ctypes.c_uint64.from_address(slots[i]).value for i in range(len(addresses))] == addresses


def test_status_words_layout():
    words = S.new_words(CPU)
    sync, status = S.word_pointers(words)
    assert words.dtype == torch.int32 and words.numel() == S.WORDS and not words.any()
    assert sync == words.data_ptr() and status == words.data_ptr() + 16


def test_choose_grid_and_occupancy_error():
    assert K.choose_grid("block", 500, 2, 132) == 1
    assert K.choose_grid("grid", 500, 2, 132) == 264
    assert K.choose_grid("grid", 100, 2, 132) == 100
    assert K.choose_grid("grid", 500, 2, 132, max_blocks=64) == 64
    assert K.choose_grid("grid", 0, 1, 132) == 1
    err = K.occupancy_error(255, 50_000, 4096, 1024, 32)
    text = str(err)
    assert "0 blocks of 1024 threads" in text and "255 registers" in text and "50000 B static" in text


def test_status_description_names_stage_block_and_hazards():
    from tkx.schedule.model import Barrier

    sched = types.SimpleNamespace(barriers=(Barrier(1, "grid", ("RAW g0 -> g1",)),
                                            Barrier(2, "grid", ("RAW g1 -> g2 (h)", "WAR arena slot of t3"))),
                                  stages=(("g0",), ("g1",), ("g2", "g4")))
    err = S.describe_status(1, 2, 17, sched, "grid 264 x 256")
    text = str(err)
    assert isinstance(err, S.KernelError) and err.code == 1 and err.stage == 2 and err.block == 17
    assert "barrier before stage 2" in text and "block 17" in text and "timed out" in text
    assert "RAW g1 -> g2 (h); WAR arena slot of t3" in text and "g2, g4" in text and "grid 264 x 256" in text
    assert err.hazards == ("RAW g1 -> g2 (h)", "WAR arena slot of t3")
    assert "kernel entry" in str(S.describe_status(2, -1, 0))
    assert "unknown error code 77" in str(S.describe_status(77, 0, 0))
    assert 1 in S.error_names()


def test_read_and_clear_on_cpu_words():
    words = S.new_words(CPU)
    assert S.read_and_clear(words) is None
    words[:2] = 5
    words[S.STATUS_OFFSET:S.STATUS_OFFSET + 3] = torch.tensor([1, 3, 9], dtype=torch.int32)
    err = S.read_and_clear(words, synchronize=True)
    assert err is not None and err.stage == 3 and err.block == 9 and not words.any()


# --------------------------------------------------------------------------------------
# verification logic (a stand-in runner that executes the reference interpreter)
# --------------------------------------------------------------------------------------
def test_relative_error_edge_cases():
    a = torch.tensor([1.0, 2.0, 3.0])
    assert V.relative_error(a, a.clone()) == 0
    assert V.relative_error(a.double() * (1 + 1e-6), a.double()) == pytest.approx(1e-6, rel=1e-6)
    nan = torch.tensor([1.0, float("nan"), float("inf")])
    assert V.relative_error(nan, nan.clone()) == 0
    assert V.relative_error(torch.tensor([1.0, 2.0, float("inf")]), nan) == float("inf")
    assert V.relative_error(torch.tensor([1.0, float("nan"), -float("inf")]), nan) == float("inf")
    assert V.relative_error(torch.tensor([0.5, 0.0]), torch.zeros(2)) == pytest.approx(0.5)
    assert V.relative_error(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, 4])) == 0.25
    assert V.relative_error(torch.zeros(3), torch.zeros(4)) == float("inf")
    assert V.relative_error(a.bfloat16(), a) < 1e-2


def test_tolerances():
    assert V.tolerance_for("float32") == 1e-5
    assert V.tolerance_for("float32", Options(fp32_math="tf32")) == V.TF32_TOLERANCE
    assert V.tolerance_for("bfloat16") == V.tolerance_for("float16") == 2e-2
    assert V.tolerance_for("int64") == 0
    assert V.tolerance_for("float32", None, {"float32": 1e-3}) == 1e-3


def test_random_inputs_follow_the_compiled_layouts():
    _, program = _program("digits_mlp")
    args = V.random_inputs(program, 3, CPU, int_high=10)
    flat, tree = tree_flatten(args)
    assert tree == program.in_tree
    for spec, t in zip(program.inputs, flat):
        assert tuple(t.shape) == spec.value.shape and I.dtype_name(t.dtype) == spec.value.dtype
        assert tuple(t.stride()) == spec.value.strides
        if not t.is_floating_point():
            assert 0 <= int(t.min()) and int(t.max()) < 10
    again = tree_flatten(V.random_inputs(program, 3, CPU))[0]
    assert all(torch.equal(a, b) for a, b in zip(flat, again))


class ReferenceRunner:
    """Runs the reference interpreter where the kernel would run (optionally corrupting it)."""

    def __init__(self, name: str, corrupt: str | None = None, with_step: bool = True):
        self.example, self.program = _program(name)
        self.options = Options()
        self.device = CPU
        self.step_fn = self.example.step_fn if with_step else None
        self.corrupt = corrupt

    def flatten(self, args):
        return I.flatten_args(self.program, args)

    def allocate_outputs(self):
        return I.allocate_outputs(self.program, CPU)

    def new_arena(self):
        return torch.empty(256, dtype=torch.uint8)

    def run_flat(self, flat, *, out=None, arena=None, check=True):
        result = reference.run(self.program, flat, update_inputs=True)
        for o, v in zip(out, result.outputs):
            o.copy_(v)
        if self.corrupt == "output":
            out[0].mul_(1.5)
        elif self.corrupt == "untouched":
            read_only = next(i for i, s in enumerate(self.program.inputs) if not s.mutated)
            flat[read_only].add_(1.0)
        elif self.corrupt == "update":
            flat[self.program.updates[0].input_index].mul_(1.01)
        return out


@pytest.mark.parametrize("name", ["tiny_online", "digits_mlp", "mixed_precision"])
def test_verify_passes_for_a_correct_kernel(name):
    runner = ReferenceRunner(name)
    result = V.verify(runner, seeds=(0, 1), make_inputs=runner.example.make_inputs)
    assert result.passed, result.summary()
    names = {c.name for c in result.comparisons}
    assert {o.name for o in runner.program.outputs} <= names
    assert {runner.program.inputs[u.input_index].name for u in runner.program.updates} <= names
    assert result.seeds == (0, 1) and "PASSED" in result.summary()


def test_verify_reports_wrong_outputs_updates_and_writes_to_inputs():
    wrong = V.verify(ReferenceRunner("tiny_online", "output"), seeds=(0,))
    assert not wrong.passed and wrong.worst == "out[0]" and wrong.worst_error == pytest.approx(0.5)
    assert "FAILED" in wrong.summary() and "out[0]" in wrong.summary()
    with pytest.raises(V.VerificationError) as info:
        V.verify(ReferenceRunner("tiny_online", "output"), seeds=(0,), strict=True)
    assert info.value.verification.worst == "out[0]"
    updated = V.verify(ReferenceRunner("digits_mlp", "update"), seeds=(0,),
                       make_inputs=tkx.examples.get("digits_mlp").make_inputs)
    assert not updated.passed and updated.failures()[0].kind == "update"
    touched = V.verify(ReferenceRunner("digits_mlp", "untouched"), seeds=(0,),
                       make_inputs=tkx.examples.get("digits_mlp").make_inputs)
    assert any(c.kind == "untouched" for c in touched.failures())


def test_verify_without_step_fn_uses_the_reference_only():
    result = V.verify(ReferenceRunner("tiny_online", with_step=False), seeds=(0,))
    assert result.passed and all(c.vs_eager is None for c in result.comparisons)
    assert any("reference interpreter only" in n for n in result.notes)
    assert result.as_dict()["passed"] is True


# --------------------------------------------------------------------------------------
# no GPU
# --------------------------------------------------------------------------------------
def test_without_a_gpu_build_says_what_works(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ex = tkx.examples.get("tiny_online")
    with pytest.raises(NoDeviceError) as info:
        tkx.runtime.build(ex.step_fn, ex.example_inputs)
    text = str(info.value)
    assert text.startswith("no CUDA device") and "NVRTC" in text and "compile_cubin" in text
    assert isinstance(info.value, tkx.TkxError)
    with pytest.raises(NoDeviceError):
        tkx.runtime.CompiledRunner(types.SimpleNamespace(text=TINY_KERNEL))
    with pytest.raises(NoDeviceError):
        tkx.bench.bench_suite("mlp", log=None)
    from tkx.bench.__main__ import main

    assert main(["mlp"]) == 2


def test_importing_runtime_and_bench_loads_no_cuda_core():
    code = ("import sys, tkx, tkx.runtime, tkx.bench; "
            "sys.exit(1 if any(m == 'cuda.core' or m.startswith('cuda.core.') for m in sys.modules) else 0)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# --------------------------------------------------------------------------------------
# the torch-extension back end (building it needs a GPU machine with nvcc and ninja)
# --------------------------------------------------------------------------------------
def test_extension_launcher_text_and_flags():
    from tkx.runtime import extension as X

    text = X.launcher_source("// kernel here", "tkx_step")
    assert text.startswith("// kernel here")
    assert "(const void*)&tkx_step" in text and "cudaLaunchCooperativeKernel" in text
    assert "{kernel}" not in text and "TKX_DEFAULT_DYNAMIC_SHARED" not in text
    flags = X.nvcc_flags("sm_90", exact=True)
    assert "-gencode=arch=compute_90,code=sm_90" in flags and "--fmad=false" in flags
    assert "-U__CUDA_NO_HALF_OPERATORS__" in flags
    assert X.extension_name("a", "sm_90", flags) != X.extension_name("b", "sm_90", flags)


def test_extension_toolchain_errors(monkeypatch):
    from torch.utils import cpp_extension

    from tkx.runtime import extension as X

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    with pytest.raises(X.ExtensionUnavailableError, match="needs ninja"):
        X.check_toolchain()
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(X.ExtensionUnavailableError, match="needs nvcc"):
        X.check_toolchain()


def _gxx_or_skip():
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++")
    return gxx


def test_extension_binding_cpp_is_valid_cpp(tmp_path):
    """The pybind11 binding compiles (syntax and types) against torch's bundled pybind11."""
    from torch.utils import cpp_extension

    from tkx.runtime import extension as X

    gxx = _gxx_or_skip()
    import sysconfig

    src = tmp_path / "binding.cpp"
    src.write_text(X.BINDING_CPP)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    result = subprocess.run([gxx, "-std=c++17", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=tkx_ext_test",
                             *includes, str(src)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_extension_launcher_host_code_is_valid_cpp(tmp_path):
    """The launcher's host code compiles against the CUDA runtime headers (the kernel stubbed
    as a host function); skipped without the headers."""
    from tkx.codegen.nvrtc import include_dirs
    from tkx.runtime import extension as X

    gxx = _gxx_or_skip()
    headers = [d for d in include_dirs() if (Path(d) / "cuda_runtime.h").exists()]
    if not headers:
        pytest.skip("no cuda_runtime.h")
    stub = 'extern "C" void tkx_step(const float* a, float* b, unsigned char* c, unsigned int* d, int* e) {}'
    src = tmp_path / "launcher.cpp"
    src.write_text(X.launcher_source(stub, "tkx_step"))
    result = subprocess.run([gxx, "-std=c++17", "-fsyntax-only", f"-I{headers[0]}", str(src)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


# --------------------------------------------------------------------------------------
# the benchmark report
# --------------------------------------------------------------------------------------
def _report() -> BenchmarkReport:
    rows = (Row.measured("eager", [1300.0, 1350.0, 1346.0], 2),
            Row.measured("eager+cudagraph", [45.0, 46.0, 45.4], 44),
            Row.failed("inductor", "RuntimeError: no triton"),
            Row.measured("inductor-max-autotune", [6.3, 6.4, 6.2], 320),
            Row.measured("tkx", [3.1, 3.0, 3.2], 640, note="setup 0.2 s"))
    return BenchmarkReport("tiny_online", rows, {"passed": True, "worst": "out[0]", "worst_error": 1e-7},
                           {"registers": 40, "grid": 1, "block": 256, "mode": "block", "occupancy": 4},
                           {"nvrtc_cold_s": 0.3, "nvrtc_cached_s": 0.004}, {"barriers": 6, "stages": 7},
                           {"device": "H200", "torch": "2.11", "repeats": 9})


def test_report_best_baseline_ratios_and_json():
    report = _report()
    assert report.best_baseline == "inductor-max-autotune" and report.best_baseline_us == 6.3
    assert report.megakernel_us == 3.1 and report.ratio_to_best == pytest.approx(3.1 / 6.3)
    assert report.ratios["inductor"] is None and report.ratios["eager"] == pytest.approx(1346 / 6.3)
    assert report.verified is True
    data = json.loads(report.to_json())
    assert data["best_baseline"] == "inductor-max-autotune" and data["us_per_step"] == 3.1
    assert data["rows"][2] == {"name": "inductor", "median_us": None, "samples_us": [], "ok": False,
                               "note": "RuntimeError: no triton", "steps_per_sample": 0}
    assert data["rows"][0]["samples_us"] == [1300.0, 1350.0, 1346.0]
    assert "0.49x" in report.headline() and "verified" in report.headline()
    assert "inductor-max-autotune" in repr(report) and "no triton" in str(report)
    assert "<table>" in report._repr_mimebundle_()["text/html"]


def test_report_renders_with_rich():
    from rich.console import Console

    console = Console(record=True, width=140)
    console.print(_report())
    text = console.export_text()
    assert "tkx" in text and "inductor-max-autotune" in text and "(best)" in text


def test_report_without_baselines_or_megakernel():
    only = BenchmarkReport("w", (Row.failed("eager", "x"), Row.failed("tkx", "boom")))
    assert only.best_baseline is None and only.ratio_to_best is None and "did not run" in only.headline()


def test_workload_entry_and_summary():
    entry = workload_entry(_report())
    for key in ("us_per_step", "best_baseline", "best_baseline_us", "ratio_to_best", "baselines", "registers",
                "barriers", "grid", "cold_compile_s", "cached_compile_s", "verified"):
        assert key in entry
    assert entry["baselines"]["inductor"] is None and entry["baseline_notes"] == {
        "inductor": "RuntimeError: no triton"}
    lines = summary_lines({"tiny_online": entry, "medium": {"error": "TkxError: boom"}})
    assert lines[1].startswith("tiny_online") and "3.1" in lines[1] and "ERROR" in lines[2]


# --------------------------------------------------------------------------------------
# the runner's plumbing, end to end on the CPU: a stand-in "kernel" that reads its inputs
# from the raw addresses it is launched with and writes outputs and updates back to them
# --------------------------------------------------------------------------------------
def _tensor_at(address: int, spec: TensorSpec) -> torch.Tensor:
    """A CPU tensor viewing ``spec``'s layout at host ``address`` (no copy)."""
    import numpy as np

    itemsize = torch.empty(0, dtype=I.TORCH_DTYPES[spec.dtype]).element_size()
    nbytes = max(spec.extent, 1) * itemsize
    raw = torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)))
    flat = raw.view(I.TORCH_DTYPES[spec.dtype])
    return flat.as_strided(spec.shape, spec.strides, spec.offset)


class CpuKernel:
    """Implements the ABI on the CPU with the reference interpreter (what the GPU kernel must do)."""

    backend = "cpu-reference"

    def __init__(self, source, fail_stage=None):
        self.source, self.fail_stage = source, fail_stage
        self.grid, self.block, self.mode = 1, 256, "block"
        self.occupancy, self.sm_count, self.registers = 1, 1, 0
        self.launches = []

    def launch(self, args, stream):
        program = self.source.program
        params = self.source.params
        self.launches.append(list(args))
        by_role = {(p.role, p.index): a for p, a in zip(params, args)}
        status = by_role[("status", -1)]
        if self.fail_stage is not None:
            words = _tensor_at(status, TensorSpec.dense("s", (4,), "int32"))
            words[:3] = torch.tensor([1, self.fail_stage, 0], dtype=torch.int32)
            return
        flat = [_tensor_at(by_role[("input", i)], s.value) for i, s in enumerate(program.inputs)]
        result = reference.run(program, [t.clone() for t in flat])
        for k, (spec, value) in enumerate(zip(program.outputs, result.outputs)):
            dense = TensorSpec.dense("o", spec.value.shape, spec.value.dtype)
            _tensor_at(by_role[("output", k)], dense).copy_(value)
        for i, value in result.updates.items():
            flat[i].copy_(value)

    @property
    def resources(self):
        return types.SimpleNamespace(backend=self.backend, grid=1, block=256)


@pytest.fixture
def cpu_runner(monkeypatch):
    from tkx.arena import plan
    from tkx.codegen import generate
    from tkx.passes import run_passes
    from tkx.runtime import runner as R
    from tkx.schedule import schedule

    monkeypatch.setattr(R, "require_cuda", lambda device=None: CPU)
    monkeypatch.setattr(R, "_stream_handle", lambda device: 0)
    monkeypatch.setattr(R, "_capturing", lambda device: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # == CPU.index: no device switch

    def make(name, fail_stage=None):
        ex = tkx.examples.get(name)
        program = run_passes(tkx.capture(ex.step_fn, ex.example_inputs, loss=ex.loss_output).lower()).output
        sched = schedule(program, Options())
        arena = plan(sched)
        source = generate(sched, arena)
        monkeypatch.setattr(R, "compile",
                            lambda src, device, backend=None, cache=True: CpuKernel(src, fail_stage))
        return ex, R.CompiledRunner(source, step_fn=ex.step_fn)

    return make


@pytest.mark.parametrize("name", ["tiny_online", "digits_mlp", "layernorm_gelu_adamw", "mixed_precision"])
def test_runner_calls_like_the_step_and_updates_in_place(cpu_runner, name):
    ex, runner = cpu_runner(name)
    args = ex.make_inputs(0)
    eager_args = tree_map(lambda t: t.clone(), args)
    flat = runner.flatten(args)
    before = [t.clone() for t in flat]
    versions = [t._version for t in flat]
    out = runner(*args)
    eager = ex.step_fn(*eager_args)
    assert tree_structure(out) == tree_structure(eager)
    for got, want in zip(tree_flatten(out)[0], tree_flatten(eager)[0]):
        assert V.relative_error(got, want) <= V.tolerance_for(I.dtype_name(want.dtype))
    updated = {u.input_index for u in runner.program.updates}
    eager_flat = runner.flatten(eager_args)
    for i, t in enumerate(flat):
        if i in updated:
            assert not torch.equal(t, before[i])
            assert V.relative_error(t, eager_flat[i]) <= V.tolerance_for(I.dtype_name(t.dtype))
            assert t._version > versions[i]  # autograd learns that the kernel wrote it
        else:
            assert torch.equal(t, before[i])
    assert runner.verify(make_inputs=ex.make_inputs).passed


def test_runner_out_arguments_and_kernel_argument_order(cpu_runner):
    ex, runner = cpu_runner("tiny_online")
    args = ex.make_inputs(0)
    outs = [torch.full(o.value.shape, float("nan")) for o in runner.program.outputs]
    result = runner(*args, out=outs)
    assert all(a is b for a, b in zip(tree_flatten(result)[0], outs))
    assert all(torch.isfinite(o).all() for o in outs)
    launch = runner.kernel.launches[-1]
    flat = runner.flatten(args)
    n_in = len(flat)
    assert launch[:n_in] == [t.data_ptr() for t in flat]
    assert launch[n_in:n_in + len(outs)] == [o.data_ptr() for o in outs]
    sync, status = S.word_pointers(runner._words)
    assert launch[-2:] == [sync, status]
    with pytest.raises(I.InputMismatchError, match="params\\['w1'\\]"):
        runner(dict(args[0], w1=torch.zeros(3, 3)), *args[1:])


def test_runner_raises_the_kernel_error_and_clears_the_words(cpu_runner):
    ex, runner = cpu_runner("digits_mlp", fail_stage=2)
    with pytest.raises(S.KernelError) as info:
        runner(*ex.make_inputs(0))
    assert info.value.stage == 2 and "barrier before stage 2" in str(info.value)
    hazards = S.barrier_hazards(runner.schedule, 2)
    if hazards:
        assert hazards[0] in str(info.value)
    assert not runner._words.any()
    runner.check_status()  # nothing left to report
    runner(*ex.make_inputs(0), check=False)  # deferred: the error waits for check_status
    with pytest.raises(S.KernelError):
        runner.check_status()


def test_speed_of_light_ratios_beside_the_baselines():
    from tkx.target import program_work, speed_of_light_us

    rows = (Row.measured("inductor", [20.0, 21.0, 19.0], 10), Row.measured("tkx", [40.0, 41.0, 39.0], 10))
    report = BenchmarkReport("w", rows, schedule={"speed_of_light_us": 10.0})
    assert report.sol_ratios == {"inductor": 0.5, "tkx": 0.25}
    assert "speed of light" in str(report) and "0.250" in str(report)
    entry = workload_entry(report)
    assert entry["sol_ratio"] == 0.25 and entry["speed_of_light_us"] == 10.0
    line = summary_lines({"w": entry})[1]
    assert "0.250" in line and "0.500" in line
    assert speed_of_light_us(790e12, 0) == pytest.approx(1e6) and speed_of_light_us(0, 4.8e6) == pytest.approx(1.0)
    ex = tkx.examples.get("medium")
    flops, nbytes = program_work(tkx.capture(ex.step_fn, ex.example_inputs).lower())
    assert flops == 5 * 2 * 256 * 1024 * 4096  # two forward and three backward GEMMs
    assert nbytes > 2 * (1024 * 4096 + 4096 * 1024) * 2  # the weights read and written, bf16
