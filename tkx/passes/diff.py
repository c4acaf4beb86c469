"""Diffs of the IR-side stages, as data: :class:`ProgramDiff` and :class:`TraceDiff`.

``Program.diff``, ``CapturedGraph.diff``, ``PassStep.diff`` and ``PassTrace.diff`` return these
(through :mod:`tkx.display`); :mod:`tkx.render.diffs` only draws them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from .. import display
from ..capture import CapturedGraph
from ..ir import Op, Program
from ..printer import Namer, _attrs, format_program, type_str
from .trace import PassStep, PassTrace, op_delta

__all__ = ["ProgramDiff", "TraceDiff", "program_diff", "captured_diff", "step_diff", "trace_diff", "aligned_rows"]


def _op_code(op: Op, namer: Namer) -> str:
    args = ", ".join(namer.operand(x) for x in op.inputs)
    return f"{namer.names[op.id]}: {type_str(op.out)} = {op.kind}{(' ' + args) if args else ''}{_attrs(op)}"


def _sink_rows(before: Program, after: Program) -> list[tuple[str, str, str]]:
    """(status, left text, right text) for outputs and updates whose value differs."""
    na, nb = Namer(before), Namer(after)
    rows = []
    for oa, ob in zip(before.outputs, after.outputs):
        if oa.value != ob.value:
            rows.append(("changed", f"{oa.name} = {na.operand(oa.value)}", f"{ob.name} = {nb.operand(ob.value)}"))
    ua = {u.input_index: u for u in before.updates}
    for ub in after.updates:
        u = ua.get(ub.input_index)
        if u is None or u.value != ub.value:
            name = after.inputs[ub.input_index].name
            left = f"{name} <- {na.operand(u.value)}" if u is not None else ""
            rows.append(("changed" if u is not None else "added", left, f"{name} <- {nb.operand(ub.value)}"))
    return rows



@dataclass(frozen=True)
class ProgramDiff:
    """What differs between two programs (before/after a pass, or under two option sets).

    ``added``/``removed``/``changed``: op ids (see :func:`tkx.passes.op_delta`: an op is
    *changed* when its id is in both but its kind, operands, attrs, output or region
    differ). ``str(diff)`` is a one-line summary followed by a unified diff of the printed
    programs (values are named after their op ids, so only the ops that differ show up);
    in a notebook it shows the changed ops side by side. ``.graph()`` draws both programs
    in one graph, added ops green, removed red (dashed), changed yellow.
    """

    before: Program = field(repr=False)
    after: Program = field(repr=False)
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    title: str = "diff"

    @property
    def empty(self) -> bool:
        """True when the programs print the same (no op, output or update differs)."""
        return not (self.added or self.removed or self.changed or _sink_rows(self.before, self.after))

    @property
    def ids(self) -> tuple[str, ...]:
        """Every op id involved: added, removed and changed."""
        return self.added + self.removed + self.changed

    def summary(self) -> str:
        parts = [f"{self.title}: {len(self.before.ops)} -> {len(self.after.ops)} ops, "
                 f"+{len(self.added)} -{len(self.removed)} ~{len(self.changed)}"]
        for sign, ids in (("added", self.added), ("removed", self.removed), ("changed", self.changed)):
            if ids:
                parts.append(f"{sign}: {' '.join(ids)}")
        sinks = _sink_rows(self.before, self.after)
        if sinks:
            parts.append(f"{len(sinks)} outputs/updates read other values")
        return "; ".join(parts)

    def text(self, context: int = 1) -> str:
        a = format_program(self.before).splitlines()
        b = format_program(self.after).splitlines()
        return "\n".join(difflib.unified_diff(a, b, "before", "after", n=context, lineterm=""))

    def __str__(self) -> str:
        body = self.text()
        return self.summary() + "\n" + (body if body else "(the programs print the same)")

    def __repr__(self) -> str:
        return (f"<tkx.ProgramDiff {self.title}: +{len(self.added)} -{len(self.removed)} "
                f"~{len(self.changed)}>")

    def rows(self, context: int = 0) -> list[Any]:
        """Aligned side-by-side rows ``(status before, op before, status after, op after)``,
        ``("skip", n)`` for ``n`` unchanged ops. A status is ``added``/``removed``/``changed``,
        ``moved`` (same id, other position), ``same`` (context rows) or ``""`` (no op)."""
        return aligned_rows(self.before, self.after, set(self.added), set(self.removed), context)

    def html(self, context: int = 0) -> str:
        """The changed ops side by side (HTML; drawn by :mod:`tkx.render.diffs`)."""
        return display.html_of(self, context=context)

    def graph(self, **kw: Any) -> Any:
        """Both programs in one ``graphviz.Digraph``: added ops green, removed red, changed yellow."""
        return display.graph(self, **kw)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)


@display.register(Program, "diff")
def program_diff(before: Program, after: Any, title: str = "diff") -> ProgramDiff:
    """:class:`ProgramDiff` of ``before`` against ``after`` (a Program, or anything with ``.program``)."""
    other = after if isinstance(after, Program) else getattr(after, "program", None)
    if not isinstance(other, Program):
        raise TypeError(f"diff expects a Program (or a CapturedGraph), got {type(after).__name__}")
    added, removed, changed = op_delta(before, other)
    return ProgramDiff(before, other, added, removed, changed, title)


Row = tuple[str, "Op | None", str, "Op | None"]


def aligned_rows(before: Program, after: Program, added: set[str], removed: set[str], context: int) -> list[Any]:
    """Rows ``(status before, op before, status after, op after)`` aligned on op ids, and
    ``("skip", n)`` for runs of ``n`` unchanged ops beyond ``context`` rows of a change."""
    a_ops, b_ops = list(before.ops), list(after.ops)
    sm = difflib.SequenceMatcher(a=[o.id for o in a_ops], b=[o.id for o in b_ops], autojunk=False)
    full: list[Row] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for x, y in zip(a_ops[i1:i2], b_ops[j1:j2]):
                st = "changed" if x != y else "same"
                full.append((st, x, st, y))
            continue
        left, right = a_ops[i1:i2], b_ops[j1:j2]
        for k in range(max(len(left), len(right))):   # a replaced block: removed | added, row by row
            lx = left[k] if k < len(left) else None
            ry = right[k] if k < len(right) else None
            full.append(("" if lx is None else "removed" if lx.id in removed else "moved", lx,
                         "" if ry is None else "added" if ry.id in added else "moved", ry))
    keep = [False] * len(full)
    for i, row in enumerate(full):
        if row[0] != "same":
            for j in range(max(0, i - context), min(len(full), i + context + 1)):
                keep[j] = True
    out: list[Any] = []
    skipped = 0
    for row, k in zip(full, keep):
        if k:
            if skipped:
                out.append(("skip", skipped))
                skipped = 0
            out.append(row)
        else:
            skipped += 1
    if skipped:
        out.append(("skip", skipped))
    return out



@display.register(CapturedGraph, "diff")
def captured_diff(a: CapturedGraph, b: Any) -> ProgramDiff:
    """The diff of two captured graphs' lowered programs (``b``: a CapturedGraph or a Program)."""
    other = getattr(b, "program", b)
    return program_diff(a.program, other)


@display.register(PassStep, "diff")
def step_diff(step: PassStep) -> ProgramDiff:
    """The :class:`ProgramDiff` of one pass (its recorded ids, titled with the pass name)."""
    return ProgramDiff(step.before, step.after, step.added, step.removed, step.changed, step.name)


@dataclass(frozen=True)
class TraceDiff:
    """Two pass traces compared step by step (same position; a name mismatch is flagged),
    plus the :class:`ProgramDiff` of their outputs."""

    a: PassTrace = field(repr=False)
    b: PassTrace = field(repr=False)

    def rows(self) -> list[tuple[str, ...]]:
        """(step, pass a, pass b, ops a, ops b, delta a, delta b, verdict), header first."""
        out: list[tuple[str, ...]] = [("#", "pass a", "pass b", "ops a", "ops b", "delta a", "delta b", "verdict")]
        n = max(len(self.a.steps), len(self.b.steps))
        for k in range(n):
            sa = self.a.steps[k] if k < len(self.a.steps) else None
            sb = self.b.steps[k] if k < len(self.b.steps) else None

            def cols(s: Any) -> tuple[str, str, str]:
                if s is None:
                    return "-", "-", "-"
                return s.name, str(len(s.after.ops)), f"+{len(s.added)} -{len(s.removed)} ~{len(s.changed)}"

            na, oa, da = cols(sa)
            nb, ob, db = cols(sb)
            if sa is None or sb is None:
                verdict = "only in " + ("b" if sa is None else "a")
            elif sa.name != sb.name:
                verdict = "different passes"
            elif sa.after == sb.after:
                verdict = "same result"
            else:
                verdict = "results differ"
            out.append((str(k + 1), na, nb, oa, ob, da, db, verdict))
        return out

    @property
    def output(self) -> ProgramDiff:
        return program_diff(self.a.output, self.b.output, title="outputs")

    @property
    def same(self) -> bool:
        return self.a.names == self.b.names and self.a.output == self.b.output

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"TraceDiff of {self.a.input.name}: {len(self.a.steps)} vs {len(self.b.steps)} passes"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(str(self.output))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<tkx.TraceDiff {len(self.a.steps)} vs {len(self.b.steps)} passes: "
                f"{'same output' if self.a.output == self.b.output else 'outputs differ'}>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)


@display.register(PassTrace, "diff")
def trace_diff(a: PassTrace, b: Any) -> TraceDiff:
    """:class:`TraceDiff` of two pass traces; :class:`TypeError` for anything else."""
    if not isinstance(b, PassTrace):
        raise TypeError(f"PassTrace.diff expects another PassTrace, got {type(b).__name__}")
    return TraceDiff(a, b)
