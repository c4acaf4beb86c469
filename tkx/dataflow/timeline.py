"""Per-task timelines: what each block ran, when, and how long it waited first.

A :class:`Timeline` holds one :class:`Span` per task: ``block``, ``task`` (global number),
``group``, ``item``, ``start`` and ``end`` and ``wait`` (ns, relative to the earliest start).
It comes from the kernel (``Options(timeline=True)``, :meth:`CompiledRunner.timeline`) or from
the task VM (:meth:`Timeline.from_vm`, logical event times scaled by estimated task costs).
``svg()`` draws it as a Gantt chart (:mod:`tkx.render.timeline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .dag import TaskDAG


@dataclass(frozen=True)
class Span:
    block: int
    task: int
    group: str
    item: int
    start: float
    end: float
    wait: float


@dataclass(frozen=True)
class Timeline:
    """Spans of one launch (``unit``: ``"ns"`` from the GPU, ``"events"`` from the VM)."""

    name: str
    spans: tuple[Span, ...]
    unit: str = "ns"

    @property
    def blocks(self) -> int:
        return 1 + max((s.block for s in self.spans), default=-1)

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    def busy(self) -> float:
        """Fraction of block-time spent running tasks (0..1)."""
        total = self.makespan * max(self.blocks, 1)
        return sum(s.end - s.start for s in self.spans) / total if total else 0.0

    @classmethod
    def from_records(cls, dag: TaskDAG, rows: Sequence[Sequence[int]]) -> Timeline:
        """From the kernel's buffer: rows ``(block << 32 | task, start, end, wait)``."""
        tasks = dag.tasks
        rows = [r for r in rows if r[1] and r[2]]
        t0 = min((r[1] - r[3] for r in rows), default=0)
        spans = []
        for r in rows:
            block, task = r[0] >> 32, r[0] & 0xFFFFFFFF
            t = tasks[task] if 0 <= task < len(tasks) else None
            spans.append(Span(block, task, t.group if t else "?", t.item if t else -1, float(r[1] - t0),
                              float(r[2] - t0), float(r[3])))
        return cls(dag.schedule.program.name, tuple(sorted(spans, key=lambda s: (s.block, s.start))), "ns")

    @classmethod
    def from_vm(cls, vm_run: Any, launch: int = 0) -> Timeline:
        """From a :class:`tkx.dataflow.vm.VMRun`: event numbers as times."""
        recs = [r for r in vm_run.records if r.launch == launch]
        t0 = min((r.ready for r in recs), default=0)
        spans = tuple(Span(r.block, r.task, r.group, r.item, float(r.start - t0), float(r.end - t0),
                           float(r.start - r.ready)) for r in recs)
        return cls(vm_run.dag.schedule.program.name, spans, "events")

    def svg(self) -> str:
        from ..render.timeline import timeline_svg
        return timeline_svg(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        import base64
        text = repr(self)
        try:
            data = base64.b64encode(self.svg().encode()).decode()
        except Exception:  # never a traceback in a notebook cell
            return {"text/plain": text}
        return {"text/plain": text, "text/html": f'<img src="data:image/svg+xml;base64,{data}" alt="{text}">'}

    def __repr__(self) -> str:
        return (f"<tkx.Timeline {self.name}: {len(self.spans)} tasks on {self.blocks} blocks, makespan "
                f"{self.makespan:g} {self.unit}, {100 * self.busy():.0f}% busy>")
