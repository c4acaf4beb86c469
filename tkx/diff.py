"""What changed between two objects of one back-end stage, as data: :class:`StageDiff`.

``FusedSchedule.diff``, ``ArenaPlan.diff`` and ``CudaSource.diff`` return one (computed in
:mod:`tkx.schedule.diff`, :mod:`tkx.arena.diff`, :mod:`tkx.codegen.diff`); :mod:`tkx.render.stage_diff`
draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import display

__all__ = ["StageDiff", "arrow"]


@dataclass(frozen=True)
class StageDiff:
    """What changed between two objects of one stage.

    ``title``; ``summary``: "what: before -> after" lines; ``sections``: (heading, lines) pairs;
    the stage-specific fields (``groups_added`` ... for schedules, ``moved`` ... for arenas,
    ``unified`` for sources) hold the same information as data. Falsy when nothing changed.
    """

    title: str
    summary: tuple[str, ...]
    sections: tuple[tuple[str, tuple[str, ...]], ...]
    changed: bool
    data: dict[str, Any] = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return self.changed

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("data", {})
        if name in data:
            return data[name]
        raise AttributeError(name)

    def __str__(self) -> str:
        out = [self.title] + [f"  {x}" for x in self.summary]
        for head, lines in self.sections:
            if lines:
                out.append(f"  {head}:")
                out += [f"    {x}" for x in lines]
        if not self.changed:
            out.append("  (no change)")
        return "\n".join(out)

    def __repr__(self) -> str:
        n = sum(len(lines) for _, lines in self.sections)
        return f"<tkx.StageDiff {self.title}: {n} change{'s' if n != 1 else ''}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)

    def __rich__(self) -> Any:
        return display.rich(self)


def arrow(what: str, a: Any, b: Any) -> str:
    """``"what: a -> b"``, or ``"what: a (same)"`` when equal."""
    return f"{what}: {a} -> {b}" if a != b else f"{what}: {a} (same)"
