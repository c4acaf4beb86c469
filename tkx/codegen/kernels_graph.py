"""The same fused groups as many kernels: one ``__global__`` entry point per group, no grid barriers.

``generate_graph(source) -> GraphSource`` takes the megakernel's :class:`~tkx.codegen.CudaSource` and
emits, from the same :class:`~tkx.schedule.model.FusedSchedule` and :class:`~tkx.arena.ArenaPlan`, one
kernel per group, in stage order (the groups of a stage are independent, so their order inside a stage
does not matter). Launched one after another on one stream, the launch boundary orders each group after
the groups before it, where the megakernel waits at a grid barrier (or a counter). Every kernel takes the
megakernel's parameters (the same arena, inputs, outputs, sync and status words and TMA tensor maps), runs
the same work items with the same group code (:class:`~tkx.codegen.kernel_groups.GroupEmitter` and the
GEMM and attention emitters), so it computes the same numbers; what differs is only how the groups are
ordered: kernel launches instead of barriers inside one kernel. :class:`tkx.runtime.GraphOfKernels` loads
and launches them (and captures them in one CUDA graph); :func:`tkx.bench.graph_of_kernels` times them
beside the megakernel.

The text is the megakernel's own translation unit up to its kernel (prelude, device functions of inlined
values), followed by the per-group kernels ``tkx_k<i>_<group>``. On sm_90 and later each kernel starts with
``griddepcontrol.wait`` (and then releases its dependents), so the runtime may launch it as a programmatic
dependent of the kernel before (PDL): its launch then overlaps the end of that kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import TkxError
from . import abi
from .cuda_prelude import shared_workspace
from .gemm import tensormap_prefetch
from .kernel import _Emitter, _stage_loop, _tile_counter_base, max_registers
from .text import block, indent

__all__ = ["GraphKernel", "GraphSource", "generate_graph"]


@dataclass(frozen=True)
class GraphKernel:
    """One kernel of a :class:`GraphSource`: entry point ``name`` running group ``group`` (of schedule
    stage ``stage``) over ``items`` work items (one block per item, grid-stride when fewer blocks run);
    ``shared_bytes`` of shared workspace per block (dynamic above 48 KiB); ``cluster`` blocks per
    thread-block cluster (2 for a GEMM whose items run in pairs of CTAs, else 1)."""

    name: str
    group: str
    stage: int
    items: int
    shared_bytes: int
    cluster: int = 1

    @property
    def dynamic_shared_bytes(self) -> int:
        """Bytes the launch must pass as dynamic shared memory (0 when the workspace is static)."""
        n = max(16, (self.shared_bytes + 15) // 16 * 16)
        return n if self.shared_bytes and n > abi.STATIC_SHARED_LIMIT else 0


@dataclass(frozen=True)
class GraphSource:
    """The CUDA of a step as one kernel per fused group (see the module docstring).

    ``text``: one translation unit with every kernel; ``kernels``: the :class:`GraphKernel` entries in
    launch order; ``megakernel``: the :class:`~tkx.codegen.CudaSource` it was made from, whose launch
    contract (parameters, arena bytes, sync words, tensor maps) every kernel shares. ``launch``,
    ``schedule``, ``arena``, ``program``, ``options``, ``sync_words`` and ``dag`` are the megakernel's.
    """

    text: str
    kernels: tuple[GraphKernel, ...]
    megakernel: Any = field(repr=False, compare=False)
    max_registers: int = 255

    @property
    def launch(self) -> abi.LaunchContract:
        return self.megakernel.launch

    @property
    def schedule(self) -> Any:
        return self.megakernel.schedule

    @property
    def arena(self) -> Any:
        return self.megakernel.arena

    @property
    def program(self) -> Any:
        return self.megakernel.program

    @property
    def options(self) -> Any:
        return self.megakernel.options

    @property
    def sync_words(self) -> int:
        return self.megakernel.sync_words

    @property
    def dag(self) -> Any:
        return self.megakernel.dag

    @property
    def timeline_tasks(self) -> int:
        """The megakernel's (its timeline buffer is passed on, so the parameters match; these kernels
        record nothing in it)."""
        return self.megakernel.timeline_tasks

    @property
    def threads(self) -> int:
        return self.megakernel.threads

    def check(self, arch: str = "sm_90", **kwargs: Any) -> Any:
        """Compile every kernel with NVRTC for ``arch`` (no GPU needed): a
        :class:`~tkx.codegen.nvrtc.CompileReport` with one entry per kernel (registers, spills).
        Raises :class:`~tkx.codegen.nvrtc.CudaCompileError`."""
        from .nvrtc import compile_cuda

        return compile_cuda(self.text, arch, exact=bool(self.launch.config.exact), **kwargs)

    def __repr__(self) -> str:
        return (f"<tkx.GraphSource {self.program.name}: {len(self.kernels)} kernels for "
                f"{len(self.schedule.stages)} stages, {self.threads} threads per block>")


#: Programmatic dependent launch (sm_90 and later): wait until the kernel launched before this one has finished
#: and its writes are visible (immediately when it was not launched as a programmatic dependent), then let the
#: next kernel's blocks be scheduled while this one runs (they wait here in turn).
PDL = """#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
asm volatile("griddepcontrol.wait;" ::: "memory");  // the kernel before has finished, its writes visible
asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the next kernel may be scheduled now
#endif"""


def _entry_name(i: int, gid: str) -> str:
    return f"tkx_k{i}_" + re.sub(r"[^A-Za-z0-9_]", "_", gid)


def _preamble(text: str) -> str:
    """The megakernel's translation unit up to (not including) its ``__global__`` kernel."""
    lines = text.splitlines()
    for no, line in enumerate(lines):
        if line.startswith('extern "C" __global__'):
            return "\n".join(lines[:no]).rstrip() + "\n"
    raise TkxError("codegen: the megakernel's text has no extern \"C\" __global__ entry point")


def generate_graph(source: Any) -> GraphSource:
    """One kernel per fused group of ``source`` (a :class:`~tkx.codegen.CudaSource`): a
    :class:`GraphSource`. Raises :class:`tkx.TkxError` if the groups emit differently from the
    megakernel (a code generator bug: the two would not share a launch contract)."""
    s, arena = source.schedule, source.arena
    em = _Emitter(s, arena)
    threads = s.threads
    regs = max_registers(threads, s.options.blocks_per_sm)
    params = source.launch.params
    decl = indent(",\n".join(p.declaration() for p in params), 2)
    kernels: list[GraphKernel] = []
    texts: list[str] = []
    codes = [(si, s.groups[gid], *em.group_code(s.groups[gid])) for si, stage in enumerate(s.stages)
             for gid in stage]
    if len(em.plan.tensor_maps) != len(source.launch.tensor_maps):
        raise TkxError(f"codegen: the groups made {len(em.plan.tensor_maps)} tensor maps, the megakernel "
                       f"{len(source.launch.tensor_maps)}")
    prefetch = tensormap_prefetch(len(em.plan.tensor_maps), on=s.options.tensormap_prefetch)
    for si, g, code, n, smem in codes:
        name = _entry_name(len(kernels), g.id)
        cluster = em.plan.cluster if g.id in em.plan.cluster_groups else 1
        body = [f"if (!tkx_check_launch(status, {threads})) return;", PDL]
        if prefetch:
            body.append(prefetch)
        if em.plan.tile_counter_words:
            body.append(f"unsigned int* const tkx_tiles = sync + {_tile_counter_base(source.sync, source.dag)};"
                        "  // split-K tile arrival counters (left at 0 by every launch)")
        if smem:
            body.append(shared_workspace(smem))
        body.append(_stage_loop([(g, code, n)], em.plan.cluster_groups))
        texts.append(block(
            f"// stage {si}, group {g.id} ({g.kind}): {n} work items"
            + (f", clusters of {cluster}" if cluster > 1 else ""),
            f"extern \"C\" __global__ void __maxnreg__({regs}) {name}(",
            decl + ") {",
            indent(block(body)),
            "}"))
        kernels.append(GraphKernel(name, g.id, si, n, smem, cluster))
    head = (f"// tkx graph of kernels for `{s.program.name}`: {len(kernels)} kernels, one per fused group of "
            f"{len(s.stages)} stages; the launch boundary orders them (no grid barriers).")
    text = block(head, _preamble(source.text), "\n\n".join(texts)) + "\n"
    return GraphSource(text=text, kernels=tuple(kernels), megakernel=source, max_registers=regs)
