"""``CudaSource``: the generated kernel, its launch configuration and its source map."""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .. import display
from . import abi


def alias(path: str, doc: str | None = None) -> property:
    """A read-only property whose value is the attribute at the dotted ``path`` of the object
    (``"launch.config.threads"``); ``doc`` its docstring (else ``path``)."""
    return property(operator.attrgetter(path), doc=doc or f"``{path}``")


#: Source lines the CUDA view shows at once; a longer kernel is shown in pages (:meth:`CudaSource.page`).
CUDA_VIEW_LINES = 2000


@dataclass(frozen=True)
class CudaSource:
    """The CUDA source of one cooperative persistent kernel.

    * ``text``: the whole translation unit (prelude, device functions, the kernel);
    * ``launch``: the typed contract with the runtime, :class:`~tkx.codegen.abi.LaunchContract`:
      the entry point ``kernel_name``, the ``params`` (:mod:`tkx.codegen.abi`), ``arena_bytes``
      (the workspace the runtime allocates), the error codes, and ``launch.config``
      (:class:`~tkx.codegen.abi.KernelConfig`): ``threads`` per block, ``mode`` (``block``: one
      block, ``__syncthreads``; ``grid``: a cooperative grid with grid barriers), ``blocks`` the
      grid the schedule would like (the runtime caps it by the compiled kernel's occupancy),
      ``shared_bytes`` the shared workspace per block (static up to 48 KiB, else dynamic). The
      same names are properties of the source (``source.threads`` ...);
    * ``op_lines``: IR op id -> 1-based line numbers that compute or store it;
      ``group_lines``: schedule group id -> (first, last) line of its code;
    * ``schedule``/``arena``: the stages this source implements (provenance); ``dag``: the task DAG
      (counters or a recorded timeline), ``work_items``: group id -> its tasks.
    """

    text: str
    launch: abi.LaunchContract
    schedule: Any = field(repr=False, compare=False)
    arena: Any = field(repr=False, compare=False)
    op_lines: Mapping[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)
    group_lines: Mapping[str, tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)
    tensor_cores: bool = False
    notes: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    sync: str = "barrier"
    sync_reason: str = field(default="", repr=False, compare=False)
    #: Words of the ``sync`` + status tensor the kernel uses (8; more with ``sync="counters"`` and with
    #: last-slice split-K tile counters, see :mod:`tkx.codegen.abi`).
    sync_words: int = 8
    timeline_tasks: int = 0
    dag: Any = field(default=None, repr=False, compare=False)
    #: Schedule group id -> the work items (tasks) its emitter deals over the grid.
    work_items: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)
    #: Group id -> (first, last) line of the ``__noinline__`` device function holding its body, for the groups
    #: whose body is emitted once for all its users (``Options.outline``); their ``group_lines`` are the call.
    function_lines: Mapping[str, tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)
    #: First ``sync`` word of the protocol audit (:mod:`tkx.dataflow.audit`; ``None``: the kernel has none).
    audit_base: int | None = None

    # -- the launch contract, by its old names ---------------------------------------------------
    config = alias("launch.config", ":class:`~tkx.codegen.abi.KernelConfig` (``launch.config``).")
    kernel_name = alias("launch.kernel_name")
    params = alias("launch.params")
    threads = alias("launch.config.threads")
    mode = alias("launch.config.mode")
    blocks = alias("launch.config.blocks")
    shared_bytes = alias("launch.config.shared_bytes")
    arena_bytes = alias("launch.arena_bytes")
    program = alias("schedule.program")
    options = alias("schedule.options")
    dynamic_shared_bytes = alias("launch.config.dynamic_shared_bytes",
                                 "Dynamic shared memory to pass at launch (0 when the workspace is static).")

    @property
    def num_lines(self) -> int:
        return self.text.count("\n")

    @property
    def kernel_start(self) -> int:
        """1-based line of the kernel's entry (``extern "C" __global__ ...``): above it are the
        fixed prelude and the device functions of inlined values."""
        for no, line in enumerate(self.text.split("\n"), start=1):
            if line.startswith('extern "C"'):
                return no
        return 1

    def body(self, lines: int | None = None, *, numbered: bool = True) -> str:
        """The kernel itself, from its entry (:attr:`kernel_start`) on: what the schedule's
        stages and barriers became, without the prelude's helpers. ``lines`` caps the number
        of lines shown (a last line says how many more there are); ``numbered`` prefixes each
        line with its number in the whole text (as the views and :meth:`lines_of` count)."""
        all_lines = self.text.split("\n")
        start = self.kernel_start
        shown = all_lines[start - 1:]
        if shown and shown[-1] == "":
            shown = shown[:-1]
        more = 0
        if lines is not None and len(shown) > lines:
            more, shown = len(shown) - lines, shown[:lines]
        width = len(str(start + len(shown)))
        out = [f"{start + i:>{width}}  {x}" if numbered else x for i, x in enumerate(shown)]
        if more:
            out.append(f"... {more} more kernel lines (the whole text: str(source); the prelude: lines 1-{start - 1})")
        return "\n".join(out)

    @cached_property
    def arena_lines(self) -> Mapping[str, tuple[int, ...]]:
        """Arena slot (its buffer name, as in :attr:`ArenaPlan.slots`) -> the 1-based lines that
        read or write it (``arena + <offset>`` in the text).

        A line inside a group's code belongs to the slot at that offset that is live in the
        group's stage (the arena reuses offsets once a value is dead); a line outside every group
        (a device function recomputing an inlined op, called from several stages) is attributed
        only when one slot alone has that offset."""
        slots = list(self.arena.slots.values()) if self.arena is not None else []
        by_offset: dict[int, list] = {}
        for sl in slots:
            by_offset.setdefault(sl.offset, []).append(sl)
        stage_at: dict[int, int] = {}
        for gid, (a, b) in self.group_lines.items():
            st = self.schedule.stage_of(gid)
            for k in range(a, b + 1):
                stage_at[k] = st
        out: dict[str, list[int]] = {}
        for no, line in enumerate(self.text.split("\n"), start=1):
            for m in re.finditer(r"\barena \+ (\d+)\)", line):
                cands = by_offset.get(int(m.group(1)), [])
                st = stage_at.get(no)
                if st is not None:
                    cands = [sl for sl in cands if sl.first <= st <= sl.last]
                if len(cands) == 1 or (st is not None and cands):
                    for sl in cands:
                        if no not in out.setdefault(sl.buffer, []):
                            out[sl.buffer].append(no)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def module_lines(self) -> Mapping[str, tuple[int, ...]]:
        """``nn.Module`` path (as :attr:`tkx.ir.Op.module`; ``""`` the root module) -> the sorted 1-based
        lines that compute or store its ops (from :attr:`op_lines`; the kernel text carries no module
        names)."""
        out: dict[str, set[int]] = {}
        for op in self.program.ops if self.schedule is not None else ():
            if op.module is not None and op.id in self.op_lines:
                out.setdefault(op.module, set()).update(self.op_lines[op.id])
        return {m: tuple(sorted(v)) for m, v in out.items()}

    def lines_of(self, op_or_group: str) -> tuple[int, ...]:
        """The line numbers implementing an IR op or a schedule group (``()`` for one with no
        lines of its own); :class:`~tkx.errors.UnknownOpError` for any other name."""
        if op_or_group in self.group_lines:
            a, b = self.group_lines[op_or_group]
            return tuple(range(a, b + 1))
        if op_or_group in self.op_lines:
            return tuple(self.op_lines[op_or_group])
        groups = self.schedule.groups
        if op_or_group in groups or any(o.id == op_or_group for o in self.program.ops):
            return ()
        from ..schedule.model import unknown_op_error
        raise unknown_op_error(self.program, op_or_group, f"the CUDA source of {self.program.name}", groups,
                               groups_ok=True)

    def check(self, arch: str = "sm_90", **kwargs: Any):
        """Compile with NVRTC for ``arch`` (no GPU needed) -> :class:`tkx.codegen.nvrtc.CompileReport`.

        Raises :class:`tkx.codegen.nvrtc.CudaCompileError` with the offending lines quoted.
        """
        from .nvrtc import compile_cuda, remember_report
        report = compile_cuda(self.text, arch, exact=self.launch.config.exact, **kwargs)
        remember_report(self.text, arch, self.launch.config.exact, report)  # the view shows it, no recompile
        return report

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return (f"<tkx.CudaSource {self.kernel_name}: {self.num_lines} lines, {self.mode} mode, "
                f"{self.threads} threads, shared {self.shared_bytes} B, arena {self.arena_bytes} B>")

    # -- views, looked up in tkx.display (tkx.render registers them) ----------------------
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)

    def html(self, check: bool = True, start: int = 1, limit: int | None = None, *, whole: bool = False) -> str:
        """The HTML view; ``check=False`` leaves out the NVRTC report (no compile). A kernel
        longer than ``limit`` lines (default 2000) is shown from line ``start``, one piece at a
        time (see :meth:`page`); ``whole=True`` shows every line with a line, group and module index
        (what the exported report shows)."""
        return display.html_of(self, check=check, start=start, limit=limit, whole=whole)

    def page(self, n: int = 1, *, lines: int | None = None) -> Any:
        """Piece ``n`` (1-based) of a long kernel's view, ``lines`` source lines each (default: the
        view's page, 2000 lines): an object that renders in a notebook; ``str()`` of it is its text."""
        if lines is None:
            lines = CUDA_VIEW_LINES
        prelude = next((i for i, line in enumerate(self.text.split("\n")) if line.startswith("#define TKX_POINTERS")),
                       0)
        start = prelude + 1 + (int(n) - 1) * int(lines)
        return _CudaPage(self, start, int(lines))

    def diff(self, other: CudaSource) -> Any:
        """A :class:`~tkx.diff.StageDiff` (computed in :mod:`tkx.codegen.diff`): a unified diff
        of the kernel text with line counts."""
        return display.diff(self, other)

    def __rich__(self) -> Any:
        return display.rich(self)


class _CudaPage:
    """One piece of a long kernel's view (:meth:`CudaSource.page`)."""

    def __init__(self, source: CudaSource, start: int, lines: int) -> None:
        self.source, self.start, self.lines = source, start, lines

    def __str__(self) -> str:
        return "\n".join(self.source.text.split("\n")[self.start - 1:self.start - 1 + self.lines])

    def __repr__(self) -> str:
        end = min(self.source.num_lines, self.start + self.lines - 1)
        return f"<tkx.CudaSource {self.source.kernel_name}: lines {self.start}-{end} of {self.source.num_lines}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self),
                "text/html": self.source.html(check=False, start=self.start, limit=self.lines)}
