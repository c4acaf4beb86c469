"""The GPU the cost model and the planners assume (:data:`H200`), the cost constants (µs) of the
scheduler's mode estimate, the architectures, the register budget, and the base records of every plan
(:class:`Plan`, :class:`Cost`, :class:`Capabilities`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


# --------------------------------------------------------------------------------------
# The GPU
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuFacts:
    """What the planners and the cost model assume about the GPU.

    ``shared_per_block``: bytes of shared memory one block may use (dynamic, after opting
    in); ``shared_default``: without opting in (48 KB); ``registers_per_sm`` 32-bit
    registers; ``max_registers_per_thread``: the ISA's cap; ``l2_bytes``: the L2 cache (bytes; NVIDIA's
    Hopper tuning guide: 50 MB on the H100 SXM5, the same die in the H200).
    """

    name: str
    sms: int
    shared_per_block: int
    shared_default: int
    registers_per_sm: int
    max_registers_per_thread: int
    max_threads_per_sm: int
    peak_bf16_tflops: float
    peak_bytes_per_s: float
    l2_bytes: int = 50 * 1024 * 1024


#: NVIDIA H200 SXM (sm_90): 132 SMs, 227 KB of shared memory per block, 64K registers per SM.
H200 = GpuFacts("NVIDIA H200", sms=132, shared_per_block=227 * 1024, shared_default=48 * 1024,
                registers_per_sm=65536, max_registers_per_thread=255, max_threads_per_sm=2048,
                peak_bf16_tflops=790.0, peak_bytes_per_s=4.8e12)


GPU = H200


#: Multiprocessors assumed when estimating costs without a GPU.
SM_COUNT = GPU.sms


#: Cost-model constants (µs), from DESIGN.md's measured anchors on the H200.
GRID_BARRIER_US = 1.2


BLOCK_BARRIER_US = 0.04


ITEM_OVERHEAD_US = 0.3


SM_FLOPS_PER_US = 0.45e6       # fp32 FMA throughput of one SM, ~60 TFLOP/s / 132


SM_BYTES_PER_US = 0.1e6        # bytes one SM streams per µs (~100 GB/s)


#: Output elements each thread takes per pass of a GEMM epilogue (and of split-K's final phase), their
#: global loads issued together before any store (:func:`tkx.codegen.gemm._batched_epilogue`).
EPILOGUE_BATCH = 8


#: Architectures code can be generated for (``Options.arch``, besides ``"auto"``).
ARCHES = ("sm_80", "sm_90", "sm_90a")


def speed_of_light_us(flops: float, nbytes: float, gpu: GpuFacts = GPU) -> float:
    """The least time (µs) a workload of ``flops`` floating-point operations moving ``nbytes``
    bytes can take on ``gpu``: ``max(flops / peak bf16 FLOP/s, bytes / peak bandwidth)``."""
    return max(flops / (gpu.peak_bf16_tflops * 1e12), nbytes / gpu.peak_bytes_per_s) * 1e6


def resolve_arch(arch: str, device_arch: str | None = None) -> str:
    """The architecture to generate code for.

    ``arch`` is ``Options.arch``; ``device_arch`` is the GPU's own (``"sm_90"`` for an H200,
    or ``None`` without a GPU). ``"auto"`` gives ``"sm_90a"`` on a compute-capability 9.0 GPU
    (its wgmma instructions), the device's architecture on others, and ``"sm_80"`` (portable
    code) without a GPU. An explicit architecture is returned unchanged.
    """
    if arch != "auto":
        return arch
    if device_arch is None:
        return "sm_80"
    return "sm_90a" if device_arch in ("sm_90", "sm_90a") else device_arch


#: Fewest registers per thread a kernel is given: below this the megakernel's code spills, so a
#: ``blocks_per_sm`` that would leave less is not honoured in full (fewer blocks become resident).
MIN_REGISTERS = 64


def register_budget(threads: int, blocks_per_sm: int = 1, gpu: GpuFacts = GPU) -> int:
    """Registers per thread that let ``blocks_per_sm`` blocks of ``threads`` share an SM, in the
    allocator's units of 8, between :data:`MIN_REGISTERS` (or what one block of ``threads``
    allows, if less) and the ISA's 255."""
    one_block = gpu.registers_per_sm // threads // 8 * 8
    want = gpu.registers_per_sm // (threads * max(blocks_per_sm, 1)) // 8 * 8
    return max(min(MIN_REGISTERS, one_block), min(gpu.max_registers_per_thread, want))


def register_note(threads: int, blocks_per_sm: int, gpu: GpuFacts = GPU) -> str:
    """Why the register budget exceeds what ``blocks_per_sm`` asks for ("" when it does not)."""
    want = gpu.registers_per_sm // (threads * max(blocks_per_sm, 1)) // 8 * 8
    got = register_budget(threads, blocks_per_sm, gpu)
    if got <= want:
        return ""
    fit = gpu.registers_per_sm // (got * threads)
    return (f"blocks_per_sm={blocks_per_sm} with {threads} threads would leave {want} registers per thread and "
            f"the kernel would spill: it gets {got}, so at most {fit} block(s) per SM are resident")


# --------------------------------------------------------------------------------------
# Plans: typed records that read like a mapping of their fields
# --------------------------------------------------------------------------------------
class Plan(Mapping):
    """Base of the typed plans: ``plan["field"]``, ``"field" in plan``, ``dict(plan)``.

    Optional fields left at ``None`` are absent from the mapping (so ``"parts" in plan``
    says whether a reduction is two-phase).
    """

    def _present(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) is not None}

    def __getitem__(self, key: str) -> Any:
        d = self._present()
        if key not in d:
            raise KeyError(key)
        return d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._present())

    def __len__(self) -> int:
        return len(self._present())

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class Cost:
    """Work items, floating-point operations and bytes moved (read + written) of one group."""

    items: int
    flops: int
    bytes: int


@dataclass(frozen=True)
class Capabilities:
    """What an emitter needs and does.

    ``arches``: architectures whose code may contain it; ``staging``: how operands reach
    the math units; ``alignment``: the tile multiple (rows, cols, k) it works in;
    ``tensor_cores``: the instruction family (``None``, ``"wmma"`` or ``"wgmma"``).
    """

    arches: tuple[str, ...]
    staging: str
    alignment: tuple[int, int, int]
    tensor_cores: str | None = None


def _pow2_at_least(x: int, lo: int) -> int:
    p = lo
    while p < x:
        p *= 2
    return p


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (``b > 0``)."""
    return -(-a // b)
