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

The text is the megakernel's own translation unit up to its device functions (its header, the prelude, the
pointer macros), then the device functions of inlined values that the kernels call (not the megakernel's
outlined group bodies: each kernel holds its group's code), then the per-group kernels ``tkx_k<i>_<group>``.
On sm_90 and later each kernel starts with ``griddepcontrol.wait`` (and then releases its dependents), so the
runtime may launch it as a programmatic dependent of the kernel before (PDL): its launch then overlaps the end
of that kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import TkxError
from . import abi
from .cuda_prelude import shared_workspace
from .gemm import tensormap_prefetch
from .kernel import _Emitter, _stage_loop, _tile_counter_base, max_registers, value_functions
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


#: The attributes a :class:`GraphSource` reads from its megakernel: the launch contract every kernel shares,
#: and what the kernels were made from.
MEGAKERNEL_ATTRIBUTES = frozenset({"launch", "schedule", "arena", "program", "options", "sync_words", "dag",
                                   "timeline_tasks", "threads"})


@dataclass(frozen=True)
class GraphSource:
    """The CUDA of a step as one kernel per fused group (see the module docstring).

    ``text``: one translation unit with every kernel; ``kernels``: the :class:`GraphKernel` entries in
    launch order; ``megakernel``: the :class:`~tkx.codegen.CudaSource` it was made from, whose launch
    contract (parameters, arena bytes, sync words, tensor maps) every kernel shares. ``launch``,
    ``schedule``, ``arena``, ``program``, ``options``, ``sync_words``, ``dag``, ``threads`` and
    ``timeline_tasks`` are the megakernel's (:data:`MEGAKERNEL_ATTRIBUTES`; its timeline buffer is passed on,
    so the parameters match, but these kernels record nothing in it).
    """

    text: str
    kernels: tuple[GraphKernel, ...]
    megakernel: Any = field(repr=False, compare=False)
    max_registers: int = 255

    def __getattr__(self, name: str) -> Any:
        if name in MEGAKERNEL_ATTRIBUTES:
            return getattr(self.megakernel, name)
        raise AttributeError(f"'GraphSource' object has no attribute {name!r}")

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
    """The megakernel's translation unit up to the end of its pointer macros (``TKX_ARGS``): its header, the
    prelude and the macros, without its device functions and kernel."""
    lines = text.splitlines()
    for no, line in enumerate(lines):
        if line.startswith("#define TKX_ARGS "):
            return "\n".join(lines[:no + 1]) + "\n"
    raise TkxError("codegen: the megakernel's text has no TKX_ARGS macro before its entry point")


#: A call of a device function of an inlined value.
_VALUE_CALL = re.compile(r"\b(tkx_v_\w+)\(")


def _called(texts: list[str], functions: dict[str, str]) -> set[str]:
    """The names of the device functions ``functions`` (name -> text) that ``texts`` call, directly or
    through one another."""
    todo = [name for text in texts for name in _VALUE_CALL.findall(text)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in functions and name not in seen:
            seen.add(name)
            todo += _VALUE_CALL.findall(functions[name])
    return seen


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
        body.append(_stage_loop([(g, code, n)], em.plan.cluster_groups)[0])
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
    functions = value_functions(em, _called(texts, em.plan.functions))
    text = block(head, _preamble(source.text), functions or None, "\n\n".join(texts)) + "\n"
    return GraphSource(text=text, kernels=tuple(kernels), megakernel=source, max_registers=regs)
