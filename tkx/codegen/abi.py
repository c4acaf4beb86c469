"""The kernel's calling convention, shared by the code generator and the runtime.

Every generated kernel is ``extern "C" __global__ void tkx_step(...)`` with parameters,
in this order:

1. one pointer per program input, in ``program.inputs`` order: ``const T* __restrict__
   in{i}``, or ``T* in{i}`` when the step updates that input in place;
2. one pointer per program output, in ``program.outputs`` order: ``T* out{k}`` (dense
   tensors of the output's shape and dtype, allocated by the runtime);
3. ``unsigned char* arena``: the workspace, :attr:`ArenaPlan.size_bytes` bytes (at least
   1), 256-byte aligned, contents undefined at launch;
4. ``unsigned int* sync``: two words (8-byte aligned) for the grid barrier - one 64-bit
   arrival count that only grows (a multiple of the grid at every launch start), or an
   arrival count and a generation (``Options.grid_barrier``) - zeroed
   when the runtime creates them and again only after an error;
5. ``int* status``: four words, zeroed once by the runtime. The kernel writes them only on
   error: ``status[0]`` an error code (:data:`ERROR_CODES`), ``status[1]`` the stage whose
   barrier failed (for an index out of range: the op's position in ``program.ops``),
   ``status[2]`` the block that saw it. The runtime reads and clears them.

6. only with ``Options(timeline=True)``: ``unsigned long long* timeline``, four words per
   task (:attr:`CudaSource.timeline_tasks` tasks): ``block << 32 | task``, start and end
   (``%globaltimer`` ns) and the ns spent waiting before the start; contents undefined at launch.

7. only in a training-loop kernel (:mod:`tkx.codegen.loop`): ``losses`` (one loss per step),
   ``loop`` (the device loop words), ``live`` (pinned host words mapped into the device) and
   ``order`` (a dataset permutation, or null); the inputs read from datasets and the state carried
   from step to step are renamed ``tkx_arg_in{i}``/``tkx_arg_out{k}`` and the loss output is dropped.

With ``sync="counters"`` (:attr:`CudaSource.sync_words` > 8) the ``sync`` words continue past
the status words: ``sync[2]`` the epoch (launches completed), ``sync[3]`` the blocks that have
left, ``sync[8..9]`` a timed-out wait's counter value and threshold, ``sync[12 + k]`` counter
``k``; all zeroed once, like the barrier words (and again after an error).

A split-K GEMM whose last slice adds the slices (``Options.split_k_final="last-slice"``) has one
arrival counter per output tile in the words after those (from word 12, or 12 + the dataflow
counters with ``sync="counters"``; :attr:`CudaSource.sync_words` counts them): each slice's work
item adds 1, the last one stores 0 again, so every launch and graph replay leaves them at zero.

Tensor addresses are arguments, never constants in the source, so one binary serves any
buffers of the compiled shapes, dtypes and strides (CUDA graphs re-launch it as is).
Grid size is chosen at launch time: one block in ``block`` mode, up to the number of
co-resident blocks (from the occupancy of the compiled kernel) in ``grid`` mode; the code
is correct for any grid size >= 1 (all loops are grid-stride loops over work items).

The contract between the code generator and the runtime is typed: a
:class:`~tkx.codegen.CudaSource` carries a :class:`LaunchContract` (entry point, parameters
with their roles, arena bytes, error codes) holding a :class:`KernelConfig` (threads, mode,
preferred grid, shared memory, register cap, spin limit, numerics, back end). The runtime
reads these fields and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import (  # noqa: F401 - the ABI's names for them
    ERR_BAD_LAUNCH,
    ERR_BARRIER_TIMEOUT,
    ERR_INDEX,
    ERR_WAIT_TIMEOUT,
    ERROR_CODES,
)
from ..ir import Program

KERNEL_NAME = "tkx_step"

#: C storage type of each IR dtype (the prelude defines ``tkx_bf16``/``tkx_f16`` as 2-byte
#: structs). The one table: parameters, arena casts and the prelude's helpers all read it.
C_TYPES: Mapping[str, str] = MappingProxyType({
    "float32": "float", "bfloat16": "tkx_bf16", "float16": "tkx_f16",
    "int64": "long long", "int32": "int", "bool": "bool", "int8": "signed char", "uint8": "unsigned char",
})

# The error codes (ERROR_CODES, ERR_*) live in tkx.errors, beside KernelError; re-exported here.
#: Former name of :data:`ERROR_CODES` without the ``0: ok`` entry (kept for callers of 0.1).
ERRORS: Mapping[int, str] = MappingProxyType({k: v for k, v in ERROR_CODES.items() if k})

#: Parameter roles, in ABI order.
ROLES = ("input", "output", "arena", "sync", "status", "timeline", "tensormaps", "losses", "loop", "live", "order")


@dataclass(frozen=True)
class Param:
    """One kernel parameter: C name, C type, role (one of :data:`ROLES`), index (the position
    among the program's inputs or outputs; ``-1`` for arena/sync/status)."""

    name: str
    ctype: str
    role: str
    index: int = -1

    def declaration(self) -> str:
        return f"{self.ctype} {self.name}"


def kernel_params(program: Program, *, timeline: bool = False) -> list[Param]:
    """The parameters of the kernel generated for ``program``, in order (``timeline``: the
    per-task timeline buffer last)."""
    params = []
    for i, inp in enumerate(program.inputs):
        t = C_TYPES[inp.value.dtype]
        ctype = f"{t}* __restrict__" if inp.mutated else f"const {t}* __restrict__"
        params.append(Param(f"in{i}", ctype, "input", i))
    for k, out in enumerate(program.outputs):
        params.append(Param(f"out{k}", f"{C_TYPES[out.value.dtype]}* __restrict__", "output", k))
    params.append(Param("arena", "unsigned char* __restrict__", "arena"))
    params.append(Param("sync", "unsigned int*", "sync"))
    params.append(Param("status", "int*", "status"))
    if timeline:
        params.append(Param("timeline", "unsigned long long*", "timeline"))
    return params


@dataclass(frozen=True)
class TensorMapSpec:
    """One TMA tensor map the runtime encodes (``cuTensorMapEncodeTiled``) for the kernel: a 2-D
    view of a buffer, read in boxes by ``cp.async.bulk.tensor``.

    * ``role``/``index``: where the buffer lives: ``"input"``/``"output"`` (its position) or
      ``"arena"`` (``index`` -1); ``offset_bytes``: from that base to element (0, 0);
    * ``dtype``: ``"bfloat16"`` or ``"float16"``; ``dims``: (inner, outer) extents in elements, the
      inner one contiguous; ``stride_bytes``: bytes between consecutive outer indices (a multiple
      of 16); ``box``: (inner, outer) elements copied per request; ``swizzle``: bytes of the
      shared-memory swizzle (128: the layout the wgmma descriptors read).

    The kernel finds map ``i`` at byte ``128 * i`` of its ``tensormaps`` parameter.
    """

    role: str
    index: int
    offset_bytes: int
    dtype: str
    dims: tuple[int, int]
    stride_bytes: int
    box: tuple[int, int]
    swizzle: int = 128


#: Bytes of one encoded tensor map (``CUtensorMap``), and its alignment in global memory.
TENSOR_MAP_BYTES = 128


@dataclass(frozen=True)
class KernelConfig:
    """How the kernel was generated to run: what the runtime must launch it with.

    * ``threads``: threads per block (the kernel checks it at entry, error 2 otherwise);
    * ``mode``: ``"block"`` (one block, ``__syncthreads``) or ``"grid"`` (a cooperative grid
      with grid barriers); ``blocks``: the grid the schedule would like (the runtime caps it
      by the compiled kernel's occupancy and ``max_blocks``);
    * ``shared_bytes``: shared workspace per block (static up to 48 KiB, else dynamic);
    * ``max_registers``: the ``__maxnreg__`` cap per thread;
    * ``spin_limit``: grid-barrier spins before error 1; ``exact``: compiled without FMA
      contraction; ``max_blocks``: cap on the grid (``None``: as many as fit);
      ``backend``: ``"nvrtc"`` or ``"torch-extension"``; ``cluster``: blocks per thread-block cluster
      (2: the runtime launches the grid in clusters of 2 blocks, a whole number of them, no more than
      are co-resident; a GEMM pairs its work items in them, ``Options.gemm_cluster``).
    """

    threads: int
    mode: str
    blocks: int
    shared_bytes: int = 0
    max_registers: int = 255
    spin_limit: int = 2_000_000
    exact: bool = False
    max_blocks: int | None = None
    backend: str = "nvrtc"
    cluster: int = 1

    @property
    def dynamic_shared_bytes(self) -> int:
        """Dynamic shared memory to pass at launch (0 when the workspace is static, <= 48 KiB)."""
        n = max(16, (self.shared_bytes + 15) // 16 * 16)
        return n if self.shared_bytes and n > STATIC_SHARED_LIMIT else 0

    @property
    def cooperative(self) -> bool:
        """Whether the launch must be cooperative (grid mode)."""
        return self.mode != "block"


#: Largest static ``__shared__`` allocation; above it a kernel needs dynamic shared memory.
STATIC_SHARED_LIMIT = 48 * 1024


@dataclass(frozen=True)
class LaunchContract:
    """Everything the runtime needs to call the kernel: the entry point ``kernel_name``, the
    ``params`` in ABI order (with their roles), the ``arena_bytes`` to allocate (at least 1
    is allocated), the :class:`KernelConfig` and the ``errors`` table the kernel reports in."""

    kernel_name: str
    params: tuple[Param, ...]
    config: KernelConfig
    arena_bytes: int
    errors: Mapping[int, str] = field(default_factory=lambda: ERROR_CODES, compare=False)
    #: The TMA tensor maps the kernel reads through its ``tensormaps`` parameter (none: no such parameter).
    tensor_maps: tuple[TensorMapSpec, ...] = ()

    def role(self, role: str) -> tuple[Param, ...]:
        """The parameters of one role (``"input"``, ``"output"``, ...) in order."""
        if role not in ROLES:
            raise ValueError(f"unknown parameter role {role!r}: the roles are {', '.join(ROLES)}")
        return tuple(p for p in self.params if p.role == role)
