"""The second back end, ``Options(backend="torch-extension")``: the same kernel built with nvcc.

The generated source is compiled by ``torch.utils.cpp_extension.load`` (the machinery behind
``load_inline``) together with a small host launcher that calls ``cudaLaunchCooperativeKernel``
(grid mode) or ``cudaLaunchKernel`` (block mode) on the stream handle it is given - PyTorch's
current stream, so CUDA graphs capture it. It exists to compare compile times with NVRTC
(DESIGN.md measured 52.8 s for ``load_inline`` against 1.7 s for NVRTC) and as a fallback.

Unlike ``load_inline`` the kernel's translation unit includes no PyTorch header (the binding is
plain pybind11 in its own C++ file), which keeps nvcc's share of the build small. The build
folder is ``<tkx cache>/torch-extension/<name>`` with ``name`` derived from the source's hash,
so a rebuilt process re-imports the library instead of recompiling.

Needs nvcc (``CUDA_HOME``) and ninja; a missing one raises :class:`ExtensionUnavailableError`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import TkxError
from . import cache as _cache
from .device import kernel_arch
from .kernel import (
    DEFAULT_DYNAMIC_SHARED_LIMIT,
    KernelLoadError,
    Resources,
    _launch_shape,
    arena_bytes_of,
    kernel_name,
    launch_contract,
    set_launch_shape,
    threads_error,
)


class ExtensionUnavailableError(TkxError):
    """The torch-extension back end cannot build here (no ninja or no nvcc)."""


#: Host code appended to the kernel's ``.cu`` file. ``{kernel}`` is the kernel's name.
LAUNCHER_CU = r"""
// ----------------------------------------------------------------------------------------
// tkx torch-extension launcher (host code)
// ----------------------------------------------------------------------------------------
#include <cuda_runtime.h>
#define TKX_MAX_ARGS 512

extern "C" int tkx_ext_prepare(unsigned long long dynamic_shared) {
    if (dynamic_shared <= TKX_DEFAULT_DYNAMIC_SHARED) return 0;
    return (int)cudaFuncSetAttribute((const void*)&{kernel}, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)dynamic_shared);
}

extern "C" int tkx_ext_launch(const long long* args, int nargs, unsigned int grid, unsigned int block,
                              unsigned long long dynamic_shared, long long stream, int cooperative) {
    if (nargs > TKX_MAX_ARGS) return (int)cudaErrorInvalidValue;
    void* values[TKX_MAX_ARGS];
    void* slots[TKX_MAX_ARGS];
    for (int i = 0; i < nargs; ++i) {
        values[i] = (void*)args[i];
        slots[i] = &values[i];
    }
    const void* fn = (const void*)&{kernel};
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cooperative
        ? cudaLaunchCooperativeKernel(fn, dim3(grid), dim3(block), slots, (size_t)dynamic_shared, s)
        : cudaLaunchKernel(fn, dim3(grid), dim3(block), slots, (size_t)dynamic_shared, s);
    return (int)err;
}

extern "C" int tkx_ext_attributes(int* out) {
    cudaFuncAttributes a;
    cudaError_t err = cudaFuncGetAttributes(&a, (const void*)&{kernel});
    out[0] = a.numRegs;
    out[1] = (int)a.sharedSizeBytes;
    out[2] = (int)a.localSizeBytes;
    out[3] = a.maxThreadsPerBlock;
    return (int)err;
}

extern "C" int tkx_ext_occupancy(int block, unsigned long long dynamic_shared, int* blocks) {
    return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, (const void*)&{kernel}, block,
                                                              (size_t)dynamic_shared);
}

extern "C" const char* tkx_ext_error(int err) { return cudaGetErrorString((cudaError_t)err); }
"""

#: The Python binding (pybind11 only, no PyTorch headers).
BINDING_CPP = r"""
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <string>
#include <vector>

extern "C" {
int tkx_ext_prepare(unsigned long long dynamic_shared);
int tkx_ext_launch(const long long* args, int nargs, unsigned int grid, unsigned int block,
                   unsigned long long dynamic_shared, long long stream, int cooperative);
int tkx_ext_attributes(int* out);
int tkx_ext_occupancy(int block, unsigned long long dynamic_shared, int* blocks);
const char* tkx_ext_error(int err);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("prepare", [](unsigned long long dynamic_shared) { return tkx_ext_prepare(dynamic_shared); });
    m.def("launch", [](const std::vector<long long>& args, unsigned int grid, unsigned int block,
                       unsigned long long dynamic_shared, long long stream, bool cooperative) {
        return tkx_ext_launch(args.data(), (int)args.size(), grid, block, dynamic_shared, stream,
                              cooperative ? 1 : 0);
    });
    m.def("attributes", []() {
        int out[4] = {0, 0, 0, 0};
        int err = tkx_ext_attributes(out);
        return std::vector<int>{err, out[0], out[1], out[2], out[3]};
    });
    m.def("occupancy", [](int block, unsigned long long dynamic_shared) {
        int blocks = 0;
        int err = tkx_ext_occupancy(block, dynamic_shared, &blocks);
        return std::vector<int>{err, blocks};
    });
    m.def("error", [](int err) { return std::string(tkx_ext_error(err)); });
}
"""

#: PyTorch defines these for every CUDA extension; generated kernels may use the operators.
_UNDEFINE = ("__CUDA_NO_HALF_OPERATORS__", "__CUDA_NO_HALF_CONVERSIONS__", "__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "__CUDA_NO_HALF2_OPERATORS__")


def launcher_source(source_text: str, kernel: str) -> str:
    """The ``.cu`` file: the generated kernel followed by the host launcher."""
    launcher = LAUNCHER_CU.replace("{kernel}", kernel).replace(
        "TKX_DEFAULT_DYNAMIC_SHARED", str(DEFAULT_DYNAMIC_SHARED_LIMIT))
    return source_text.rstrip() + "\n" + launcher


def nvcc_flags(arch: str, *, exact: bool = False) -> list[str]:
    """nvcc flags: optimised, only the device's own architecture, torch's half/bf16 guards undone."""
    cc = arch.removeprefix("sm_")
    flags = ["-O3", "-std=c++17", f"-gencode=arch=compute_{cc},code=sm_{cc}"]
    flags += [f"-U{m}" for m in _UNDEFINE]
    if exact:
        flags.append("--fmad=false")
    return flags


def check_toolchain() -> None:
    """Raise :class:`ExtensionUnavailableError` unless ninja and nvcc are both available."""
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        raise ExtensionUnavailableError(
            "the torch-extension backend needs ninja: pip install ninja (or put a ninja binary on PATH). "
            "The default backend, Options(backend='nvrtc'), needs neither ninja nor nvcc.")
    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    if not nvcc or not os.path.exists(nvcc):
        raise ExtensionUnavailableError(
            "the torch-extension backend needs nvcc (a CUDA toolkit; set CUDA_HOME) but none was found. "
            "The default backend, Options(backend='nvrtc'), needs no CUDA toolkit.")


def extension_name(text: str, arch: str, flags: Sequence[str]) -> str:
    """A module name unique to (source, arch, flags, tkx, torch)."""
    from .kernel import _tkx_version

    key = _cache.cache_key(text, arch, flags, tkx_version=_tkx_version(),
                           compiler_version=f"torch {torch.__version__}", backend="torch-extension")
    return f"tkx_ext_{key[:24]}"


class ExtensionKernel:
    """A kernel built as a PyTorch C++/CUDA extension; same launch interface as
    :class:`~tkx.runtime.kernel.CompiledKernel` (``launch(args, stream)``, ``resources``).

    Resource figures come from ``cudaFuncGetAttributes`` and
    ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``; spills are unknown (``-1``).
    """

    backend = "torch-extension"

    def __init__(self, source: Any, module: Any, device: torch.device, *, arch: str, compile_seconds: float,
                 seconds: float, cache_hit: bool) -> None:
        self.source = source
        self.device = device
        self._module = module
        self.arch = arch
        self.compile_seconds = compile_seconds
        self.seconds = seconds
        self.cache_hit = cache_hit
        threads, mode, blocks, dyn = _launch_shape(source)
        if int(getattr(launch_contract(source).config, "cluster", 1) or 1) > 1:
            raise KernelLoadError("the torch-extension back end launches without thread-block clusters, but "
                                  "this kernel's GEMMs pair their items in 2-CTA clusters "
                                  "(Options.gemm_cluster); use backend='nvrtc' or gemm_cluster='off'")
        start = time.perf_counter()
        with torch.cuda.device(device):
            self._check(module.prepare(dyn), "cudaFuncSetAttribute")
            err, regs, shared, local, max_threads = module.attributes()
            self._check(err, "cudaFuncGetAttributes")
            err, occupancy = module.occupancy(threads, dyn)
            self._check(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor")
        self.load_seconds = time.perf_counter() - start
        self.registers, self.shared_bytes, self.local_bytes = int(regs), int(shared), int(local)
        if threads > max_threads:
            raise threads_error(threads, int(regs), max_threads)
        self.occupancy = int(occupancy)
        set_launch_shape(self, source, device, mode, blocks, threads, dyn)

    def _check(self, err: int, what: str) -> None:
        if int(err) != 0:
            raise KernelLoadError(f"{what} failed: {self._module.error(int(err))} (CUDA error {int(err)})")

    @classmethod
    def build(cls, source: Any, device: torch.device, *, cache: bool | str = True) -> ExtensionKernel:
        """Build (or re-import) the extension for ``source`` on ``device``.

        ``cache="refresh"`` or ``False`` builds cold in a private folder (removed once the module
        is loaded); the shared build folder, which another process may be using, is never deleted.
        Raises :class:`ExtensionUnavailableError` without ninja/nvcc, :class:`TkxError`
        quoting the compiler's message when the build fails.
        """
        check_toolchain()
        from torch.utils import cpp_extension

        arch = kernel_arch(device)
        exact = launch_contract(source).config.exact
        flags = nvcc_flags(arch, exact=exact)
        name = extension_name(source.text, arch, flags)
        folder = _cache.cache_dir() / "torch-extension" / name
        private = None
        if cache is not True:
            # A cold build goes to a folder (and module name) of its own: the shared folder may
            # be in use by another process (a second notebook importing or building it), so it
            # is never deleted; the private one is removed once the module is loaded.
            tag = uuid.uuid4().hex[:8]
            private = folder.parent / f".{name}.cold-{os.getpid()}-{tag}"
            folder, name = private, f"{name}_cold{tag}"
        folder.mkdir(parents=True, exist_ok=True)
        meta_path = folder / "tkx.json"
        built_before = meta_path.exists()
        cu = folder / "tkx_kernel.cu"
        cpp = folder / "tkx_binding.cpp"
        kernel_text = launcher_source(source.text, kernel_name(source))
        for path, text in ((cu, kernel_text), (cpp, BINDING_CPP)):
            if not path.exists() or path.read_text() != text:
                _cache.atomic_write(path, text.encode())
        start = time.perf_counter()
        try:
            module = cpp_extension.load(
                name=name, sources=[str(cpp), str(cu)], extra_cflags=["-O2"],
                extra_cuda_cflags=flags, build_directory=str(folder), with_cuda=True, verbose=False)
        except Exception as exc:
            text = str(exc)
            raise TkxError(f"the torch-extension build of the kernel failed (folder {folder}):\n"
                           f"{text[-4000:]}") from exc
        finally:
            if private is not None:  # the module is loaded (or failed): its private folder can go
                shutil.rmtree(private, ignore_errors=True)
        seconds = time.perf_counter() - start
        if built_before:
            try:
                cold = float(json.loads(meta_path.read_text())["compile_seconds"])
                if not math.isfinite(cold) or cold < 0:
                    cold = seconds
            except (OSError, ValueError, KeyError, TypeError):
                cold = seconds
        else:
            cold = seconds
            try:
                if private is None:
                    _cache.atomic_write(meta_path, json.dumps({"compile_seconds": seconds, "arch": arch,
                                                               "flags": flags}).encode())
            except OSError:
                pass
        return cls(source, module, device, arch=arch, compile_seconds=cold, seconds=seconds,
                   cache_hit=built_before)

    def launch(self, args: Sequence[int], stream: int) -> None:
        """Launch once on the stream with handle ``stream``; ``args`` are device addresses in ABI order."""
        err = self._module.launch([int(a) for a in args], self.grid, self.block, self.dynamic_shared_bytes,
                                  int(stream), self.cooperative)
        if err:
            self._check(err, "cudaLaunchCooperativeKernel" if self.cooperative else "cudaLaunchKernel")

    @property
    def resources(self) -> Resources:
        return Resources(
            backend=self.backend, arch=self.arch, registers=self.registers, shared_bytes=self.shared_bytes,
            dynamic_shared_bytes=self.dynamic_shared_bytes, local_bytes=self.local_bytes, spill_bytes=-1,
            occupancy=self.occupancy, sm_count=self.sm_count, grid=self.grid, block=self.block,
            mode=self.mode, arena_bytes=arena_bytes_of(self.source), compile_seconds=self.compile_seconds,
            seconds=self.seconds, load_seconds=self.load_seconds, cache_hit=self.cache_hit)

    def __repr__(self) -> str:
        return f"<tkx.ExtensionKernel {self.resources.summary()}>"


def source_digest(text: str) -> str:
    """Short SHA-256 of a source text (for logs)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]
