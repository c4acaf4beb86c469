"""Running a step as many kernels: :class:`GraphOfKernels`, a :class:`~tkx.runtime.CompiledRunner` whose
launch is one kernel per fused group (:mod:`tkx.codegen.kernels_graph`) instead of the megakernel.

Same arena, same inputs and outputs, same group code, same numbers; only the ordering differs (a launch
boundary instead of a grid barrier). Everything a :class:`~tkx.runtime.CompiledRunner` does works:
``runner(*args)``, :meth:`~tkx.runtime.CompiledRunner.verify` against eager,
:meth:`~tkx.runtime.CompiledRunner.capture_graph` (every kernel of a step captured in one CUDA graph),
the status words (a kernel error is raised as for the megakernel).

Each kernel launches ``min(work items, resident blocks)`` blocks, where resident blocks is its own
occupancy (from the driver) times the SM count, capped by ``Options.max_blocks``: what a compiler that
launches one kernel per fused group would launch. The launches are plain (not cooperative); a GEMM whose
items run in pairs of CTAs is launched in clusters of 2. On compute capability 9.0 and later each kernel but
the first is a programmatic dependent of the one before (``pdl="auto"``, see :class:`KernelSequence`).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import TkxError
from .device import cuda_core, kernel_arch, make_current, sm_count
from .kernel import (
    DEFAULT_DYNAMIC_SHARED_LIMIT,
    CompiledKernel,
    KernelLoadError,
    Resources,
    _attr,
    _cluster_grid_arg,
    compile_cubin,
    occupancy_error,
)
from .runner import CompiledRunner

__all__ = ["GraphOfKernels", "KernelSequence"]


class _Entry:
    """One loaded kernel of the sequence (``_kernel``, ``device``: what :class:`CompiledKernel`'s
    occupancy and shared-memory helpers read)."""

    def __init__(self, spec: Any, obj: Any, device: torch.device, threads: int, sms: int, max_blocks: int | None,
                 core: Any, pdl: bool = False) -> None:
        self.spec, self.device, self._core = spec, device, core
        self._kernel = obj.get_kernel(spec.name)
        attrs = self._kernel.attributes
        self.registers = _attr(attrs, "num_regs")
        self.shared_bytes = _attr(attrs, "shared_size_bytes")
        self.local_bytes = _attr(attrs, "local_size_bytes")
        dyn = spec.dynamic_shared_bytes
        if dyn > DEFAULT_DYNAMIC_SHARED_LIMIT:
            CompiledKernel._allow_dynamic_shared(self, dyn)  # type: ignore[arg-type]
        self.occupancy = CompiledKernel._occupancy(self, threads, dyn)  # type: ignore[arg-type]
        if self.occupancy <= 0:
            raise occupancy_error(self.registers, self.shared_bytes, dyn, threads, self.local_bytes)
        grid = min(max(1, spec.items), self.occupancy * sms)
        if max_blocks:
            grid = min(grid, int(max_blocks))
        c = spec.cluster
        extra = {"programmatic_stream_serialization": True} if pdl else {}
        if c > 1:
            grid = max(c, grid - grid % c) if grid >= c else c
            self.config = core.LaunchConfig(grid=_cluster_grid_arg(core, grid, c), cluster=c, block=threads,
                                            shmem_size=dyn, **extra)
        else:
            self.config = core.LaunchConfig(grid=grid, block=threads, shmem_size=dyn, **extra)
        self.grid, self.pdl = grid, pdl

    def launch(self, stream: Any, args: Sequence[Any]) -> None:
        self._core.launch(stream, self.config, self._kernel, *args)


def _pdl_wanted(pdl: bool | str, device: torch.device, core: Any) -> bool:
    """Whether to launch with programmatic dependent launch (see :class:`KernelSequence`)."""
    if pdl not in (True, False, "auto"):
        raise ValueError(f"pdl={pdl!r}: use True, False or 'auto'")
    try:
        core.LaunchConfig(grid=1, block=32, programmatic_stream_serialization=True)
        offered = True
    except TypeError:  # a cuda-core without the keyword
        offered = False
    if pdl is True and not offered:
        raise KernelLoadError("this cuda-core's LaunchConfig has no programmatic_stream_serialization: "
                              "update cuda-core or use pdl=False")
    return bool(pdl is True or (pdl == "auto" and offered and torch.cuda.get_device_capability(device)[0] >= 9))


class KernelSequence:
    """The kernels of a :class:`~tkx.codegen.kernels_graph.GraphSource` loaded on one device, launched in
    order by :meth:`launch`. ``entries`` (one per kernel: ``spec``, ``grid``, ``registers``,
    ``occupancy``); the summary attributes of :class:`~tkx.runtime.kernel.CompiledKernel`
    (``registers``, ``shared_bytes``, ``local_bytes``: the largest over the kernels; ``occupancy``: the
    smallest; ``grid``: the largest; ``block``, ``mode`` = ``"graph"``, ``sm_count``, ``binary``).
    ``pdl``: launch every kernel but the first as a programmatic dependent of the one before (programmatic
    dependent launch: its blocks may be scheduled while that kernel ends, and wait in ``griddepcontrol.wait``
    until it has finished; a kernel launched in clusters is not); ``"auto"``: on compute capability 9.0 and
    later when this cuda-core's ``LaunchConfig`` offers it. ``self.pdl`` says whether it is on.
    Raises :class:`~tkx.runtime.kernel.KernelLoadError` when a kernel cannot run (not one block fits)."""

    backend = "nvrtc"

    def __init__(self, source: Any, binary: Any, device: torch.device, *, pdl: bool | str = "auto") -> None:
        core = cuda_core()
        self.source, self.binary, self.device = source, binary, device
        self._core = core
        threads = source.threads
        make_current(device)
        start = time.perf_counter()
        self.sm_count = sm_count(device)
        with torch.cuda.device(device):
            try:
                obj = core.ObjectCode.from_cubin(binary.cubin, name=f"tkx-graph-{binary.key[:12]}")
            except TypeError:  # cuda-core releases without the name keyword
                obj = core.ObjectCode.from_cubin(binary.cubin)
            self._object = obj
            self.pdl = _pdl_wanted(pdl, device, core)
            self.entries = [_Entry(k, obj, device, threads, self.sm_count, source.launch.config.max_blocks, core,
                                   pdl=self.pdl and i > 0 and k.cluster == 1) for i, k in enumerate(source.kernels)]
        self.load_seconds = time.perf_counter() - start
        self.block = threads
        self.mode = "graph"
        self.cooperative = False
        self.registers = max(e.registers for e in self.entries)
        self.shared_bytes = max(e.shared_bytes for e in self.entries)
        self.local_bytes = max(e.local_bytes for e in self.entries)
        self.dynamic_shared_bytes = max(e.spec.dynamic_shared_bytes for e in self.entries)
        self.occupancy = min(e.occupancy for e in self.entries)
        self.grid = max(e.grid for e in self.entries)

    def launch(self, args: Sequence[int], stream: int) -> None:
        """Launch every kernel in order on the CUDA stream ``stream`` (PyTorch's ``cuda_stream``) with the
        same arguments (device addresses, one per ABI parameter)."""
        make_current(self.device)
        s = self._core.Stream.from_handle(int(stream))
        packed = [ctypes.c_uint64(int(a)) for a in args]
        for e in self.entries:
            try:
                e.launch(s, packed)
            except Exception as exc:
                raise KernelLoadError(f"launch of {e.spec.name} ({e.grid} blocks of {self.block} threads) refused "
                                      f"by the driver: {exc}") from exc

    @property
    def resources(self) -> Resources:
        return Resources(
            backend=self.backend, arch=self.binary.arch, registers=self.registers, shared_bytes=self.shared_bytes,
            dynamic_shared_bytes=self.dynamic_shared_bytes, local_bytes=self.local_bytes,
            spill_bytes=int(self.binary.report.spill_bytes), occupancy=self.occupancy, sm_count=self.sm_count,
            grid=self.grid, block=self.block, mode=self.mode, arena_bytes=self.source.launch.arena_bytes,
            compile_seconds=self.binary.compile_seconds, seconds=self.binary.seconds,
            load_seconds=self.load_seconds, cache_hit=self.binary.cache_hit)

    def __repr__(self) -> str:
        return f"<tkx.KernelSequence {len(self.entries)} kernels: {self.resources.summary()}>"


class GraphOfKernels(CompiledRunner):
    """A compiled step that launches one kernel per fused group (see the module docstring).

    ``GraphOfKernels(source)`` from a :class:`~tkx.codegen.CudaSource` (the megakernel's, e.g.
    ``exp.cuda`` or ``runner.source``) or a :class:`~tkx.codegen.kernels_graph.GraphSource`;
    :meth:`from_runner` from a built :class:`~tkx.runtime.CompiledRunner` (its source, step and device).
    ``kernel`` is a :class:`KernelSequence`; ``source`` the :class:`GraphSource`.

    Raises :class:`~tkx.runtime.device.NoDeviceError` without a GPU,
    :class:`~tkx.codegen.nvrtc.CudaCompileError`, :class:`~tkx.runtime.kernel.KernelLoadError`.
    """

    def __init__(self, source: Any, *, device: Any = None, step_fn: Callable[..., Any] | None = None,
                 cache: bool | str = True, pdl: bool | str = "auto") -> None:
        from ..codegen.kernels_graph import GraphSource, generate_graph

        if not isinstance(source, GraphSource):
            source = generate_graph(source)
        self._pdl = pdl
        super().__init__(source, device=device, step_fn=step_fn, backend="nvrtc", cache=cache)

    @classmethod
    def from_runner(cls, runner: CompiledRunner, *, cache: bool | str = True,
                    pdl: bool | str = "auto") -> GraphOfKernels:
        """The same step as ``runner`` (its megakernel's schedule and arena), as many kernels."""
        return cls(runner.source, device=runner.device, step_fn=runner.step_fn, cache=cache, pdl=pdl)

    def _load(self, source: Any, backend: str | None, cache: bool | str) -> KernelSequence:
        binary = compile_cubin(source, kernel_arch(self.device), cache=cache)
        return KernelSequence(source, binary, self.device, pdl=self._pdl)

    def launch_description(self) -> str:
        k = self.kernel
        pdl = ", programmatic dependent launch" if k.pdl else ""
        return (f"{len(k.entries)} kernels (one per fused group{pdl}), grids {min(e.grid for e in k.entries)}-"
                f"{k.grid} x {k.block} threads, up to {k.registers} registers, arena {self.arena_bytes} B")

    def timeline(self) -> Any:
        """Not recorded: the per-task timeline is the megakernel's (``Options(timeline=True)``)."""
        raise TkxError("the graph of kernels records no timeline; the megakernel does (Options(timeline=True))")

    def __repr__(self) -> str:
        return f"<tkx.GraphOfKernels {self.program.name}: {self.launch_description()}>"
