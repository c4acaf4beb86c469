"""Compile a :class:`~tkx.codegen.CudaSource` with NVRTC (cached on disk) and load it with cuda-core.

* :func:`compile_cubin` - source -> cubin for an architecture; needs no GPU (NVRTC is a
  library). Cached by content (:mod:`tkx.runtime.cache`).
* :func:`compile` - cubin for the device's own architecture, loaded with ``cuda.core``:
  a :class:`CompiledKernel` holding the registers, shared and local memory the *driver*
  reports, the occupancy and the grid it will launch with.

Grid size: 1 in ``block`` mode; in ``grid`` mode ``min(source.blocks, occupancy * SMs)``
(capped by ``Options.max_blocks``), from the compiled kernel's occupancy, never a guess:
a cooperative launch needs every block resident at once.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..errors import TkxError
from . import cache as _cache
from .device import cuda_core, make_current, sm_count

#: Dynamic shared memory a kernel may use without opting in (bytes).
DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024

#: How a kernel whose launch contract asks for thread-block clusters (``KernelConfig.cluster`` > 1) is
#: launched: ``"cooperative"`` (``cuLaunchKernelEx`` with both the cooperative and the cluster-dimension
#: attributes: the driver checks that every block is co-resident) or ``"plain"`` (the cluster attribute
#: only; the grid is still no larger than the clusters the occupancy calculator says are co-resident,
#: which the grid barriers need). On the H200 both launch: cuOccupancyMaxActiveClusters gives 528 2-CTA
#: clusters (8 x 132 / 2) with or without the cooperative attribute, so no SM is lost to pairing.
CLUSTER_LAUNCH = "cooperative"


class KernelLoadError(TkxError):
    """The compiled kernel cannot be loaded or launched as generated (resources, signature)."""


# --------------------------------------------------------------------------------------
# What the runtime reads of a CudaSource: its typed launch contract (tkx.codegen.abi)
# --------------------------------------------------------------------------------------
def launch_contract(source: Any) -> Any:
    """The :class:`~tkx.codegen.abi.LaunchContract` of ``source`` (a :class:`~tkx.codegen.CudaSource`
    or any object with a ``launch`` contract); :class:`TypeError` naming what was given otherwise."""
    from ..codegen.abi import LaunchContract

    launch = getattr(source, "launch", None)
    if not isinstance(launch, LaunchContract):
        raise TypeError(f"the runtime runs a tkx.codegen.CudaSource (tkx.runtime.lower or ex.cuda), not a "
                        f"{type(source).__name__} without a LaunchContract")
    return launch


def source_options(source: Any) -> Any:
    """The :class:`tkx.Options` a source was generated under (``source.options``)."""
    return source.options


def source_program(source: Any) -> Any:
    """The (optimised) :class:`tkx.Program` a source implements (``source.program``)."""
    return source.program


def kernel_name(source: Any) -> str:
    return launch_contract(source).kernel_name


# --------------------------------------------------------------------------------------
# Compiling to a cubin (no GPU needed)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Binary:
    """A compiled cubin and where it came from.

    ``report`` is NVRTC/ptxas's :class:`~tkx.codegen.nvrtc.CompileReport` (registers, spills,
    static shared memory, stack); ``compile_seconds`` the cold NVRTC time of this source (as
    measured when it was compiled, also for a cache hit); ``seconds`` the wall time of this
    call (the cache lookup for a hit); ``key`` the cache key (SHA-256).
    """

    arch: str
    report: Any = field(repr=False)
    key: str
    cache_hit: bool
    seconds: float
    compile_seconds: float
    flags: tuple[str, ...] = field(default=(), repr=False)

    @property
    def cubin(self) -> bytes:
        return self.report.cubin


def _tkx_version() -> str:
    import tkx

    return getattr(tkx, "__version__", "0")


def _report_to_json(report: Any) -> dict[str, Any]:
    data = asdict(report)
    data.pop("cubin", None)
    return data


_REPORT_INTS = ("registers", "spill_store_bytes", "spill_load_bytes", "shared_bytes", "stack_bytes", "cmem_bytes")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _report_from_json(data: dict[str, Any], cubin: bytes) -> Any:
    """The :class:`~tkx.codegen.nvrtc.CompileReport` of a cache entry; raises ``ValueError``
    when a field is missing or of the wrong type (the entry is then recompiled)."""
    from ..codegen.nvrtc import CompileReport, KernelResources

    if not isinstance(data, dict):
        raise ValueError("report is not an object")
    fields = dict(data)
    for name in _REPORT_INTS:
        if not _count(fields.get(name)):
            raise ValueError(f"report field {name}={fields.get(name)!r} is not a count")
    if not _seconds(fields.get("compile_seconds")):
        raise ValueError(f"compile_seconds={fields.get('compile_seconds')!r} is not a number of seconds")
    if not isinstance(fields.get("arch"), str):
        raise ValueError("report has no arch")
    kernels = fields.get("kernels", ())
    if not isinstance(kernels, (list, tuple)) or not all(isinstance(k, dict) for k in kernels):
        raise ValueError("report kernels are not a list of objects")
    parsed = []
    for k in kernels:
        if not isinstance(k.get("name"), str) or not all(_count(v) for n, v in k.items() if n != "name"):
            raise ValueError(f"kernel entry {k!r} is malformed")
        parsed.append(KernelResources(**k))
    fields["kernels"] = tuple(parsed)
    fields["options"] = tuple(str(o) for o in fields.get("options", ()))
    known = CompileReport.__dataclass_fields__
    return CompileReport(**{k: v for k, v in fields.items() if k in known}, cubin=cubin)


def nvrtc_cache_key(text: str, arch: str, *, exact: bool = False) -> tuple[str, tuple[str, ...]]:
    """``(key, flags)``: the cache key of compiling ``text`` for ``arch`` with tkx's NVRTC flags."""
    from ..codegen import nvrtc

    major, minor = nvrtc.nvrtc_version()
    includes = nvrtc.include_dirs()
    flags = nvrtc.nvrtc_flags(arch, exact=exact, includes=includes)
    # The key holds the headers' contents, not their folder: replaced headers invalidate an
    # entry, and the same headers installed elsewhere (another user, another venv) share it.
    keyed = tuple(f for f in flags if not f.startswith("-I"))
    keyed += (f"headers={nvrtc.headers_fingerprint(includes)}",) if includes else ()
    key = _cache.cache_key(text, arch, keyed, tkx_version=_tkx_version(),
                           compiler_version=f"nvrtc {major}.{minor}")
    return key, flags


def compile_cubin(source: Any, arch: str = "sm_90", *, exact: bool | None = None,
                  cache: bool | str = True) -> Binary:
    """Compile ``source`` (a CudaSource or CUDA text) to a cubin for ``arch`` with NVRTC.

    ``exact`` (default: ``source.options.exact``) turns off multiply-add contraction.
    ``cache``: ``True`` reads and writes the on-disk cache, ``False`` bypasses it,
    ``"refresh"`` recompiles and overwrites the entry (a cold compile, for timing).
    Raises :class:`~tkx.codegen.nvrtc.CudaCompileError` (log and source lines quoted) or
    :class:`~tkx.codegen.nvrtc.NvrtcUnavailableError`.
    """
    from ..codegen import nvrtc

    text = source if isinstance(source, str) else source.text
    if exact is None:
        exact = False if isinstance(source, str) else launch_contract(source).config.exact
    start = time.perf_counter()
    key, flags = nvrtc_cache_key(text, arch, exact=exact)
    if cache is True:
        hit = _cache.load_entry(key)
        if hit is not None:
            cubin, meta = hit
            try:  # every field is validated: a damaged or foreign entry is recompiled, never served
                report = _report_from_json(meta["report"], cubin)
                cold = meta.get("compile_seconds", report.compile_seconds)
                if not _seconds(cold) or meta.get("arch", arch) != arch or report.arch != arch:
                    raise ValueError("compile_seconds or arch of the entry is malformed")
            except (KeyError, TypeError, ValueError):
                report = None
            if report is not None and not report.kernels and "__global__" in text:
                report = None  # an entry without a ptxas report (registers, spills): compile again
            if report is not None:
                return Binary(arch, report, key, True, time.perf_counter() - start, float(cold), flags)
    report = nvrtc.compile_cuda(text, arch, exact=exact)
    if cache and (report.kernels or "__global__" not in text):  # never keep an entry without its report
        _cache.store_entry(key, report.cubin, {"report": _report_to_json(report),
                                               "compile_seconds": report.compile_seconds, "arch": arch})
    return Binary(arch, report, key, False, time.perf_counter() - start, report.compile_seconds, flags)


# --------------------------------------------------------------------------------------
# Loaded kernels
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses and how it is launched.

    Bytes are per block (shared) or per thread (local); ``occupancy`` is resident blocks per
    SM at this block size; ``grid``/``block`` the launch configuration (blocks, threads);
    ``spill_bytes`` ptxas's spill stores + loads (``-1`` when unknown, as for the
    torch-extension back end); ``compile_seconds`` the cold compile time of this source
    (NVRTC, or nvcc for ``torch-extension``); ``seconds`` the wall time of the compile call
    that produced this kernel (a cache hit costs a few ms); ``load_seconds`` loading the
    binary into the driver.
    """

    backend: str
    arch: str
    registers: int
    shared_bytes: int
    dynamic_shared_bytes: int
    local_bytes: int
    spill_bytes: int
    occupancy: int
    sm_count: int
    grid: int
    block: int
    mode: str
    arena_bytes: int
    compile_seconds: float
    seconds: float
    load_seconds: float
    cache_hit: bool
    #: Blocks per thread-block cluster (1: no clusters); with clusters ``grid`` counts blocks.
    cluster: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line: ``grid 132x256 (grid mode), 96 regs, 0 B local, 4096 B smem, 1 block/SM, ...``."""
        hit = "cache hit" if self.cache_hit else "cold"
        clusters = f", clusters of {self.cluster}" if self.cluster > 1 else ""
        return (f"{self.backend} {self.arch}: grid {self.grid}x{self.block} ({self.mode} mode{clusters}), "
                f"{self.registers} regs, "
                f"{self.local_bytes} B local, {self.shared_bytes + self.dynamic_shared_bytes} B smem, "
                f"{self.occupancy} block(s)/SM x {self.sm_count} SMs, arena {self.arena_bytes} B, "
                f"compile {self.compile_seconds:.2f} s ({hit}, {self.seconds:.3f} s)")

    def __str__(self) -> str:
        return self.summary()


def choose_grid(mode: str, preferred: int, occupancy: int, sms: int, max_blocks: int | None = None) -> int:
    """The grid size (blocks) to launch with.

    ``block`` mode: 1. ``grid`` mode: ``min(preferred, occupancy * sms)``, capped by
    ``max_blocks``; at least 1. ``occupancy`` must be positive (see :func:`occupancy_error`).
    """
    if mode == "block":
        return 1
    grid = min(max(1, int(preferred)), int(occupancy) * int(sms))
    if max_blocks:
        grid = min(grid, int(max_blocks))
    return max(1, grid)


def occupancy_error(registers: int, shared_bytes: int, dynamic_shared_bytes: int, threads: int,
                    local_bytes: int = 0) -> KernelLoadError:
    """The error raised when not even one block of the kernel fits on an SM."""
    return KernelLoadError(
        f"the kernel cannot run: 0 blocks of {threads} threads fit on one SM ({registers} registers/thread = "
        f"{registers * threads} per block, {shared_bytes} B static + {dynamic_shared_bytes} B dynamic shared "
        f"memory per block, {local_bytes} B local/thread); lower Options.threads_per_block or the tile sizes "
        "(tile_m, tile_n, tile_k)")


def threads_error(threads: int, registers: int, max_threads: int) -> KernelLoadError:
    """The error raised when the kernel's registers let fewer than its ``threads`` threads into a block."""
    return KernelLoadError(
        f"the kernel was generated for {threads} threads per block but uses {registers} "
        f"registers/thread, so at most {max_threads} fit in a block; "
        "lower Options.threads_per_block")


def set_launch_shape(kernel: Any, source: Any, device: Any, mode: str, blocks: int, threads: int, dyn: int) -> None:
    """Set ``kernel``'s launch shape from its measured ``occupancy`` (both back ends): ``block``,
    ``mode``, ``grid`` (:func:`choose_grid`), ``cooperative``, ``sm_count`` and ``dynamic_shared_bytes``;
    :func:`occupancy_error` when not one block fits on an SM."""
    kernel.dynamic_shared_bytes = dyn
    kernel.block = threads
    kernel.mode = mode
    kernel.sm_count = sm_count(device)
    if kernel.occupancy <= 0:
        raise occupancy_error(kernel.registers, kernel.shared_bytes, dyn, threads, kernel.local_bytes)
    kernel.grid = choose_grid(mode, blocks, kernel.occupancy, kernel.sm_count,
                              launch_contract(source).config.max_blocks)
    kernel.cooperative = mode != "block"


def occupancy_limits(registers: int, shared_bytes: int, dynamic_shared_bytes: int, threads: int, *,
                     regs_per_sm: int = 65536, shared_per_sm: int = 233472, threads_per_sm: int = 2048,
                     blocks_per_sm: int = 32) -> dict[str, int]:
    """Resident blocks per SM allowed by each resource: ``{"registers": n, "shared memory": n,
    "threads": n, "blocks": n}`` (the occupancy is the smallest; defaults: an sm_90 SM)."""
    per_block_regs = max(1, int(registers)) * int(threads)
    shared = int(shared_bytes) + int(dynamic_shared_bytes)
    return {
        "registers": regs_per_sm // per_block_regs,
        "shared memory": (shared_per_sm // shared) if shared else blocks_per_sm,
        "threads": threads_per_sm // max(1, int(threads)),
        "blocks": blocks_per_sm,
    }


def cooperative_limit_error(grid: int, occupancy: int, sms: int, registers: int, shared_bytes: int,
                            dynamic_shared_bytes: int, threads: int,
                            limits: dict[str, int] | None = None) -> KernelLoadError | None:
    """The error for a cooperative launch of ``grid`` blocks when at most ``occupancy x sms``
    can be resident at once (``None`` when the grid fits): it names both numbers and the
    resource (registers, shared memory, threads per SM) that sets the limit."""
    most = int(occupancy) * int(sms)
    if grid <= most:
        return None
    limits = limits or occupancy_limits(registers, shared_bytes, dynamic_shared_bytes, threads)
    binding = min(limits, key=lambda k: limits[k])
    return KernelLoadError(
        f"cooperative launch of {grid} blocks, but at most {most} can be resident at once "
        f"({occupancy} block(s)/SM x {sms} SMs) and a cooperative kernel needs all of them resident; "
        f"the limit is set by {binding}: {registers} registers/thread x {threads} threads = "
        f"{registers * threads} registers and {shared_bytes} B static + {dynamic_shared_bytes} B dynamic "
        f"shared memory per block (blocks/SM by registers {limits['registers']}, by shared memory "
        f"{limits['shared memory']}, by threads {limits['threads']}); lower Options.max_blocks to {most} "
        f"or below, or use fewer registers / less shared memory per block (smaller threads_per_block or tiles)")


def _cluster_grid_arg(core: Any, blocks: int, cluster: int) -> int:
    """``LaunchConfig.grid`` for ``blocks`` blocks in clusters of ``cluster``: cuda-core 0.4.0 and later
    count clusters there (earlier releases counted blocks)."""
    version = str(getattr(core, "__version__", "0.4.0"))
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        major, minor = 0, 4
    return blocks // cluster if (major, minor) >= (0, 4) else blocks


def _attr(obj: Any, name: str, default: int = 0) -> int:
    value = getattr(obj, name, None)
    if value is None:
        return default
    return int(value() if callable(value) else value)


def _launch_shape(source: Any) -> tuple[int, str, int, int]:
    """(threads, mode, preferred blocks, dynamic shared bytes) of a CudaSource's launch contract."""
    c = launch_contract(source).config
    return c.threads, c.mode, c.blocks, c.dynamic_shared_bytes


def arena_bytes_of(source: Any) -> int:
    return launch_contract(source).arena_bytes


class CompiledKernel:
    """A cubin loaded with ``cuda.core`` on one device, ready to launch.

    Attributes: ``binary`` (:class:`Binary`), ``device``, ``registers`` (per thread, from the
    driver), ``shared_bytes`` (static, per block), ``dynamic_shared_bytes``, ``local_bytes``
    (per thread), ``occupancy`` (blocks per SM), ``grid``, ``block``, ``cooperative``,
    ``resources`` (:class:`Resources`).

    Raises :class:`KernelLoadError` when not one block fits on an SM (naming registers and
    shared memory) or when the kernel's signature does not have one 8-byte pointer per ABI
    parameter.
    """

    backend = "nvrtc"

    def __init__(self, source: Any, binary: Binary, device: torch.device) -> None:
        core = cuda_core()
        self.source = source
        self.binary = binary
        self.device = device
        self._core = core
        threads, mode, blocks, dyn = _launch_shape(source)
        make_current(device)
        start = time.perf_counter()
        with torch.cuda.device(device):
            try:
                obj = core.ObjectCode.from_cubin(binary.cubin, name=f"tkx-{binary.key[:12]}")
            except TypeError:  # cuda-core releases without the name keyword
                obj = core.ObjectCode.from_cubin(binary.cubin)
            self._kernel = obj.get_kernel(kernel_name(source))
            self._object = obj
            attrs = self._kernel.attributes
            self.registers = _attr(attrs, "num_regs")
            self.shared_bytes = _attr(attrs, "shared_size_bytes")
            self.local_bytes = _attr(attrs, "local_size_bytes")
            max_threads = _attr(attrs, "max_threads_per_block", threads)
            self._check_signature(source)
            if threads > max_threads:
                raise threads_error(threads, self.registers, max_threads)
            if dyn > DEFAULT_DYNAMIC_SHARED_LIMIT:
                self._allow_dynamic_shared(dyn)
            self.occupancy = self._occupancy(threads, dyn)
        self.load_seconds = time.perf_counter() - start
        set_launch_shape(self, source, device, mode, blocks, threads, dyn)
        self.cluster = int(getattr(launch_contract(source).config, "cluster", 1) or 1)
        #: With clusters: how many are co-resident at once (cuOccupancyMaxActiveClusters), else ``None``.
        self.max_clusters: int | None = None
        if self.cluster > 1:
            self._config = self._cluster_config(threads, dyn)
        else:
            self._config = core.LaunchConfig(grid=self.grid, block=threads, shmem_size=dyn,
                                             is_cooperative=self.cooperative)

    # -- loading helpers --------------------------------------------------------------------
    def _cluster_config(self, threads: int, dyn: int) -> Any:
        """The launch configuration in clusters of ``self.cluster`` blocks: the grid cut to a whole
        number of clusters, no more than are co-resident (:data:`CLUSTER_LAUNCH`)."""
        core, c = self._core, self.cluster
        if self.mode == "block":
            raise KernelLoadError("a kernel in block mode (one block) cannot run in clusters of "
                                  f"{c} blocks; set gemm_cluster='off' or use grid mode")
        if CLUSTER_LAUNCH not in ("cooperative", "plain"):
            raise KernelLoadError(f"tkx.runtime.kernel.CLUSTER_LAUNCH is {CLUSTER_LAUNCH!r}; one of "
                                  "'cooperative', 'plain'")
        coop = CLUSTER_LAUNCH == "cooperative"
        self.max_clusters = self._max_active_clusters(threads, dyn, coop)
        if self.max_clusters <= 0:
            raise KernelLoadError(
                f"the kernel cannot run in clusters of {c} blocks: the occupancy calculator says none is "
                f"co-resident ({self.registers} registers/thread x {threads} threads, {self.shared_bytes} B "
                f"static + {dyn} B dynamic shared memory per block); set gemm_cluster='off'")
        self.grid = max(c, min(self.grid - self.grid % c, self.max_clusters * c))
        self.cooperative = coop
        return core.LaunchConfig(grid=_cluster_grid_arg(core, self.grid, c), cluster=c, block=threads,
                                 shmem_size=dyn, is_cooperative=coop)

    def _max_active_clusters(self, threads: int, dyn: int, cooperative: bool) -> int:
        core = self._core
        occ = getattr(self._kernel, "occupancy", None)
        probe = core.LaunchConfig(grid=1, cluster=self.cluster, block=threads, shmem_size=dyn,
                                  is_cooperative=cooperative)
        if occ is not None and hasattr(occ, "max_active_clusters"):
            try:
                stream = core.Device(self.device.index).default_stream
                return int(occ.max_active_clusters(probe, stream=stream))
            except TypeError:  # releases taking the stream positionally
                return int(occ.max_active_clusters(probe))
        raise KernelLoadError("this cuda-core has no occupancy query for clusters "  # pragma: no cover
                              "(KernelOccupancy.max_active_clusters); set gemm_cluster='off'")

    def _check_signature(self, source: Any) -> None:
        params = launch_contract(source).params
        try:
            count = int(self._kernel.num_arguments)
            info = list(self._kernel.arguments_info)
        except Exception:  # older cuda-core or driver: nothing to check against
            return
        if count != len(params):
            raise KernelLoadError(f"the compiled kernel takes {count} arguments but the ABI lists "
                                  f"{len(params)} ({', '.join(p.name for p in params)})")
        try:
            sizes = [int(i[1]) if isinstance(i, (tuple, list)) else int(getattr(i, "size", 8)) for i in info]
        except (TypeError, ValueError, IndexError):  # an unfamiliar ParamInfo layout: skip the size check
            return
        bad = [p.name for p, size in zip(params, sizes) if size != 8]
        if bad:
            raise KernelLoadError(f"kernel parameters {', '.join(bad)} are not 8-byte pointers")

    def _occupancy(self, threads: int, dyn: int) -> int:
        occ = getattr(self._kernel, "occupancy", None)
        if occ is not None:
            return int(occ.max_active_blocks_per_multiprocessor(threads, dyn))
        from cuda.bindings import driver  # pragma: no cover - cuda-core without occupancy queries

        err, n = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            driver.CUfunction(int(self._kernel.handle)), threads, dyn)
        if int(err) != 0:
            raise KernelLoadError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
        return int(n)

    def _allow_dynamic_shared(self, nbytes: int) -> None:
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        handle = self._kernel.handle
        if isinstance(handle, driver.CUkernel):
            (err,) = driver.cuKernelSetAttribute(attr, nbytes, handle, driver.CUdevice(self.device.index))
        else:
            (err,) = driver.cuFuncSetAttribute(driver.CUfunction(int(handle)), attr, nbytes)
        if int(err) != 0:
            raise KernelLoadError(f"could not allow {nbytes} B of dynamic shared memory per block: {err}")

    # -- launching ---------------------------------------------------------------------------
    def launch(self, args: Sequence[int], stream: int) -> None:
        """Launch once on the CUDA stream whose handle is ``stream`` (an int: PyTorch's
        ``cuda_stream``). ``args`` are device addresses, one per ABI parameter, in order.
        Each is passed as an explicit 64-bit value (``ctypes.c_uint64``)."""
        make_current(self.device)
        core = self._core
        if self.cluster > 1:
            try:
                core.launch(core.Stream.from_handle(int(stream)), self._config, self._kernel,
                            *[ctypes.c_uint64(int(a)) for a in args])
            except Exception as e:
                raise KernelLoadError(
                    f"{'cooperative ' if self.cooperative else ''}launch of {self.grid} blocks in clusters of "
                    f"{self.cluster} ({self.max_clusters} clusters co-resident) refused by the driver: {e}; "
                    "set tkx.runtime.kernel.CLUSTER_LAUNCH = 'plain' (or 'cooperative'), or turn "
                    "gemm_cluster='off'") from e
            return
        if self.cooperative:
            err = cooperative_limit_error(self.grid, self.occupancy, self.sm_count, self.registers,
                                          self.shared_bytes, self.dynamic_shared_bytes, self.block,
                                          self._device_limits())
            if err is not None:
                raise err
        try:
            core.launch(core.Stream.from_handle(int(stream)), self._config, self._kernel,
                        *[ctypes.c_uint64(int(a)) for a in args])
        except ValueError as e:  # cuda-core's own grid check, should the driver's occupancy differ
            if "grid" not in str(e):
                raise
            occ = self._occupancy(self.block, self.dynamic_shared_bytes)
            err = cooperative_limit_error(self.grid, occ, self.sm_count, self.registers, self.shared_bytes,
                                          self.dynamic_shared_bytes, self.block, self._device_limits())
            raise (err or KernelLoadError(
                f"cooperative launch of {self.grid} blocks refused by the driver ({e}); the kernel uses "
                f"{self.registers} registers/thread x {self.block} threads and {self.shared_bytes} B static + "
                f"{self.dynamic_shared_bytes} B dynamic shared memory per block, {occ} block(s)/SM x "
                f"{self.sm_count} SMs; lower Options.max_blocks")) from e

    def _device_limits(self) -> dict[str, int]:
        p = torch.cuda.get_device_properties(self.device)
        return occupancy_limits(
            self.registers, self.shared_bytes, self.dynamic_shared_bytes, self.block,
            regs_per_sm=int(getattr(p, "regs_per_multiprocessor", 65536)),
            shared_per_sm=int(getattr(p, "shared_memory_per_multiprocessor", 233472)),
            threads_per_sm=int(getattr(p, "max_threads_per_multi_processor", 2048)))

    @property
    def resources(self) -> Resources:
        return Resources(
            backend=self.backend, arch=self.binary.arch, registers=self.registers,
            shared_bytes=self.shared_bytes,
            dynamic_shared_bytes=self.dynamic_shared_bytes, local_bytes=self.local_bytes,
            spill_bytes=int(self.binary.report.spill_bytes), occupancy=self.occupancy, sm_count=self.sm_count,
            grid=self.grid, block=self.block, mode=self.mode, arena_bytes=arena_bytes_of(self.source),
            compile_seconds=self.binary.compile_seconds, seconds=self.binary.seconds,
            load_seconds=self.load_seconds, cache_hit=self.binary.cache_hit, cluster=self.cluster)

    def __repr__(self) -> str:
        return f"<tkx.CompiledKernel {self.resources.summary()}>"
