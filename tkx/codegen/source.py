"""``CudaSource``: the generated kernel, its launch configuration and its source map."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import abi


@dataclass(frozen=True)
class CudaSource:
    """The CUDA source of one cooperative persistent kernel.

    * ``text``: the whole translation unit (prelude, device functions, the kernel);
    * ``kernel_name``/``params``: the entry point and its parameters (:mod:`tkx.codegen.abi`);
    * ``threads`` per block, ``mode`` (``block``: one block, ``__syncthreads``; ``grid``: a
      cooperative grid with grid barriers), ``blocks`` the grid the schedule would like (the
      runtime caps it by the compiled kernel's occupancy);
    * ``shared_bytes``: the shared workspace per block (static up to 48 KiB, else dynamic);
    * ``arena_bytes``: the workspace the runtime allocates;
    * ``op_lines``: IR op id -> 1-based line numbers that compute or store it;
      ``group_lines``: schedule group id -> (first, last) line of its code;
    * ``schedule``/``arena``: the stages this source implements (provenance).
    """

    text: str
    kernel_name: str
    params: tuple[abi.Param, ...]
    threads: int
    mode: str
    blocks: int
    shared_bytes: int
    arena_bytes: int
    schedule: Any = field(repr=False, compare=False)
    arena: Any = field(repr=False, compare=False)
    op_lines: Mapping[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)
    group_lines: Mapping[str, tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)
    tensor_cores: bool = False
    notes: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def program(self):
        return self.schedule.program

    @property
    def options(self):
        return self.schedule.options

    @property
    def dynamic_shared_bytes(self) -> int:
        """Dynamic shared memory to pass at launch (0 when the workspace is static)."""
        from .cuda_prelude import STATIC_SHARED_LIMIT
        n = max(16, (self.shared_bytes + 15) // 16 * 16)
        return n if self.shared_bytes and n > STATIC_SHARED_LIMIT else 0

    @property
    def num_lines(self) -> int:
        return self.text.count("\n")

    def lines_of(self, op_or_group: str) -> tuple[int, ...]:
        """The line numbers implementing an IR op or a schedule group (``()`` for one with no
        lines of its own); :class:`~tkx.errors.UnknownOpError` for any other name."""
        if op_or_group in self.group_lines:
            a, b = self.group_lines[op_or_group]
            return tuple(range(a, b + 1))
        if op_or_group in self.op_lines:
            return tuple(self.op_lines[op_or_group])
        groups = getattr(self.schedule, "groups", {})
        if op_or_group in groups or any(o.id == op_or_group for o in self.program.ops):
            return ()
        from ..schedule.model import unknown_op_error
        raise unknown_op_error(self.program, op_or_group, f"the CUDA source of {self.program.name}", groups,
                               groups_ok=True)

    def check(self, arch: str = "sm_90", **kwargs: Any):
        """Compile with NVRTC for ``arch`` (no GPU needed) -> :class:`tkx.codegen.nvrtc.CompileReport`.

        Raises :class:`tkx.codegen.nvrtc.CudaCompileError` with the offending lines quoted.
        """
        from .nvrtc import compile_cuda
        report = compile_cuda(self.text, arch, exact=bool(getattr(self.options, "exact", False)), **kwargs)
        try:  # the view of this source shows the report without compiling again
            from ..render.stage_views import remember_report
            remember_report(self, arch, report)
        except Exception:  # pragma: no cover - a render module that cannot load changes nothing here
            pass
        return report

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return (f"<tkx.CudaSource {self.kernel_name}: {self.num_lines} lines, {self.mode} mode, "
                f"{self.threads} threads, shared {self.shared_bytes} B, arena {self.arena_bytes} B>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        try:
            from ..render import stage_views
        except Exception:  # never a traceback in a notebook cell
            return {"text/plain": repr(self)}
        return stage_views.bundle(self, lambda: stage_views.cuda_html(self), include, exclude)

    def html(self, check: bool = True, start: int = 1, limit: int | None = None) -> str:
        """The HTML view; ``check=False`` leaves out the NVRTC report (no compile). A kernel
        longer than ``limit`` lines (default 2000) is shown from line ``start``, one piece at a
        time (see :meth:`page`)."""
        from ..render.stage_views import cuda_html
        return cuda_html(self, check=check, start=start, limit=limit)

    def page(self, n: int = 1, *, lines: int | None = None) -> Any:
        """Piece ``n`` (1-based) of a long kernel's view, ``lines`` source lines each (default
        2000): an object that renders in a notebook; ``str()`` of it is its text."""
        from ..render.stage_views import CUDA_VIEW_LINES
        per = CUDA_VIEW_LINES if lines is None else int(lines)
        prelude = next((i for i, line in enumerate(self.text.split("\n")) if line.startswith("#define TKX_POINTERS")),
                       0)
        start = prelude + 1 + (int(n) - 1) * per
        return _CudaPage(self, start, per)

    def diff(self, other: CudaSource) -> Any:
        """A unified diff of the kernel text with line counts."""
        from ..render.stage_views import cuda_diff
        return cuda_diff(self, other)

    def __rich__(self) -> Any:
        from rich.syntax import Syntax
        return Syntax(self.text, "cuda", line_numbers=True, word_wrap=False)


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
