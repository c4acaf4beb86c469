"""What running passes produced: one :class:`PassStep` per pass, gathered in a :class:`PassTrace`."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .. import display
from ..ir import Program
from ..printer import format_program
from ..words import plural


def op_delta(before: Program, after: Program) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """``(added, removed, changed)`` op ids between two programs.

    ``added``/``changed`` are in the order of ``after``, ``removed`` in the order of
    ``before``. An op is *changed* when its id survives but its kind, operands, attrs,
    output or region differ (``Op.__eq__``, which ignores the source line).
    """
    old = {op.id: op for op in before.ops}
    new_ids = {op.id for op in after.ops}
    added = tuple(op.id for op in after.ops if op.id not in old)
    removed = tuple(op.id for op in before.ops if op.id not in new_ids)
    changed = tuple(op.id for op in after.ops if op.id in old and old[op.id] != op)
    return added, removed, changed


@dataclass(frozen=True)
class PassStep:
    """One pass applied to one program.

    ``name``: the pass; ``before``/``after``: the programs (``after is before`` when the pass
    changed nothing); ``ms``: wall time of the pass in milliseconds; ``added``/``removed``/``changed``:
    op ids, read from the two programs (see :func:`op_delta`).
    """

    name: str
    before: Program
    after: Program
    ms: float

    @cached_property
    def _delta(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        return op_delta(self.before, self.after)

    @property
    def added(self) -> tuple[str, ...]:
        return self._delta[0]

    @property
    def removed(self) -> tuple[str, ...]:
        return self._delta[1]

    @property
    def changed(self) -> tuple[str, ...]:
        return self._delta[2]

    @property
    def modified(self) -> bool:
        """Whether the pass changed anything (ops, outputs or state updates)."""
        return self.after is not self.before and self.after != self.before

    def diff_text(self, context: int = 1) -> str:
        """A unified diff of the printed programs before and after this pass.

        Values are named after their op ids (``%relu``), so only the ops the pass added,
        removed or changed differ. Empty string when the printed programs are equal.
        """
        a = format_program(self.before).splitlines()
        b = format_program(self.after).splitlines()
        return "\n".join(difflib.unified_diff(a, b, f"before {self.name}", f"after {self.name}",
                                              n=context, lineterm=""))

    def summary(self) -> str:
        return (f"{self.name}: {len(self.before.ops)} -> {len(self.after.ops)} ops, +{len(self.added)} "
                f"-{len(self.removed)} ~{len(self.changed)}, {self.ms:.2f} ms")

    def __repr__(self) -> str:
        return f"<tkx.PassStep {self.summary()}>"

    def diff(self) -> Any:
        """This pass as a :class:`~tkx.passes.diff.ProgramDiff` (before -> after)."""
        return display.lookup(self, "diff")(self)

    def graph(self, **kw: Any) -> Any:
        """Before and after in one ``graphviz.Digraph``: added ops green, removed red, changed yellow."""
        return display.graph(self, **kw)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)


@dataclass(frozen=True)
class PassTrace:
    """The result of :func:`tkx.passes.run_passes`: the input program and one step per pass.

    Index it by position or by pass name (the first step of that name); ``.output`` is the
    final program.
    """

    input: Program
    steps: tuple[PassStep, ...]

    @property
    def output(self) -> Program:
        return self.steps[-1].after if self.steps else self.input

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    @property
    def ms(self) -> float:
        """Total time of all passes, in milliseconds."""
        return sum(s.ms for s in self.steps)

    def __getitem__(self, key: int | str) -> PassStep:
        if isinstance(key, str):
            for s in self.steps:
                if s.name == key:
                    return s
            ran = ", ".join(self.names) or "nothing"
            raise KeyError(f"no pass named {key!r} in this trace; it ran: {ran}")
        return self.steps[key]

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[PassStep]:
        return iter(self.steps)

    def __repr__(self) -> str:
        return (f"<tkx.PassTrace {plural(len(self.steps), 'pass')}: {len(self.input.ops)} -> "
                f"{len(self.output.ops)} ops, {self.ms:.2f} ms>")

    def rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """Table rows (pass, ms, +added, -removed, ~changed, ops after), header first."""
        rows = [("pass", "ms", "+added", "-removed", "~changed", "ops")]
        for s in self.steps:
            rows.append((s.name, f"{s.ms:.2f}", str(len(s.added)), str(len(s.removed)),
                         str(len(s.changed)), str(len(s.after.ops))))
        return rows

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"PassTrace of {self.input.name}: {len(self.input.ops)} -> {len(self.output.ops)} ops "
                 f"in {plural(len(self.steps), 'pass')}, {self.ms:.2f} ms"]
        for r in rows:
            lines.append("  " + r[0].ljust(widths[0]) + "".join(
                "  " + c.rjust(w) for c, w in zip(r[1:], widths[1:])))
        return "\n".join(lines)

    # -- views, looked up in tkx.display (tkx.render registers them) --
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)

    def __rich__(self) -> Any:
        return display.rich(self)

    def graph(self, step: int | str | None = None, **kw: Any) -> Any:
        """The pass pipeline as a ``graphviz.Digraph`` (one node per pass with its op delta);
        with ``step`` (position or pass name), that pass's before/after graph (added ops
        green, removed red, changed yellow)."""
        return display.graph(self, step, **kw)

    def diff(self, other: PassTrace) -> Any:
        """A :class:`~tkx.passes.diff.TraceDiff`: the two traces step by step, and the
        diff of their output programs."""
        return display.diff(self, other)
