"""Per-task timelines: what each block ran, when, and how long it waited first.

A :class:`Timeline` holds one :class:`Span` per task: ``block``, ``task`` (global number),
``group``, ``item``, ``start`` and ``end`` and ``wait`` (ns, relative to the earliest start).
It comes from the kernel (``Options(timeline=True)``, :meth:`CompiledRunner.timeline`) or from
the task VM (:meth:`Timeline.from_vm`, logical event times scaled by estimated task costs).
``svg()`` draws it as a Gantt chart (:mod:`tkx.render.timeline`); :meth:`Timeline.to_chrome_trace`
writes it for Perfetto and ``chrome://tracing`` (:mod:`tkx.dataflow.trace`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
    """Spans of one launch (``unit``: ``"ns"`` from the GPU, ``"events"`` from the VM).

    ``origin``: the clock reading of time 0 in ``unit``, an int (the kernel's ``%globaltimer`` in ns,
    exact; 0 for the VM); ``kernel``: the kernel's entry name (what profilers call it); ``dag``: the
    :class:`~tkx.dataflow.dag.TaskDAG` the spans belong to (``None`` when unknown, e.g. after
    :meth:`from_json`): the trace export takes waits, modules and arena bytes from it."""

    name: str
    spans: tuple[Span, ...]
    unit: str = "ns"
    origin: int = 0
    kernel: str = ""
    dag: Any = field(default=None, repr=False, compare=False)

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
    def from_records(cls, dag: TaskDAG, rows: Sequence[Sequence[int]], *, kernel: str = "") -> Timeline:
        """From the kernel's buffer: rows ``(block << 32 | task, start, end, wait)`` (``%globaltimer`` ns);
        ``origin`` is the earliest ``start - wait``, the time every span is measured from."""
        tasks = dag.tasks
        rows = [r for r in rows if r[1] and r[2]]
        t0 = min((r[1] - r[3] for r in rows), default=0)
        spans = []
        for r in rows:
            block, task = r[0] >> 32, r[0] & 0xFFFFFFFF
            t = tasks[task] if 0 <= task < len(tasks) else None
            spans.append(Span(block, task, t.group if t else "?", t.item if t else -1, float(r[1] - t0),
                              float(r[2] - t0), float(r[3])))
        return cls(dag.schedule.program.name, tuple(sorted(spans, key=lambda s: (s.block, s.start))), "ns",
                   int(t0), kernel, dag)

    @classmethod
    def from_vm(cls, vm_run: Any, launch: int = 0) -> Timeline:
        """From a :class:`tkx.dataflow.vm.VMRun`: event numbers as times."""
        recs = [r for r in vm_run.records if r.launch == launch]
        t0 = min((r.ready for r in recs), default=0)
        spans = tuple(Span(r.block, r.task, r.group, r.item, float(r.start - t0), float(r.end - t0),
                           float(r.start - r.ready)) for r in recs)
        return cls(vm_run.dag.schedule.program.name, spans, "events", dag=vm_run.dag)

    def svg(self) -> str:
        from ..render.timeline import timeline_svg
        return timeline_svg(self)

    def to_json(self) -> dict[str, Any]:
        """The spans as plain data (``{"name", "unit", "origin", "kernel", "blocks", "makespan", "busy",
        "spans": [...]}``, each span a dict of :class:`Span`'s fields; times in :attr:`unit`)."""
        return {"name": self.name, "unit": self.unit, "origin": self.origin, "kernel": self.kernel,
                "blocks": self.blocks, "makespan": self.makespan, "busy": self.busy(),
                "spans": [dict(vars(s)) for s in self.spans]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timeline:
        """The inverse of :meth:`to_json`."""
        return cls(data["name"], tuple(Span(**s) for s in data["spans"]), data.get("unit", "ns"),
                   int(data.get("origin", 0)), str(data.get("kernel", "")))

    def chrome_trace(self, **options: Any) -> dict[str, Any]:
        """The timeline as a Trace Event Format object (Perfetto, ``chrome://tracing``); ``options`` and
        the layout: :func:`tkx.dataflow.trace.chrome_trace`."""
        from .trace import chrome_trace
        return chrome_trace(self, **options)

    def to_chrome_trace(self, path: Any, **options: Any) -> str:
        """Write :meth:`chrome_trace` as JSON to ``path`` (gzip-compressed when it ends in ``.gz``; Perfetto
        UI opens both); returns the path. Raises ``OSError`` when it cannot be written."""
        from .trace import write_trace
        return write_trace(self.chrome_trace(**options), path)

    def write(self, folder: Any, stem: str | None = None) -> tuple[str, str]:
        """Write ``<stem>.svg`` (the Gantt chart) and ``<stem>.json`` (:meth:`to_json`) into ``folder``
        (created); returns both paths. ``stem`` defaults to ``timeline-<name>``."""
        import json
        import os

        os.makedirs(folder, exist_ok=True)
        stem = stem or f"timeline-{self.name}"
        svg_path, json_path = os.path.join(folder, stem + ".svg"), os.path.join(folder, stem + ".json")
        with open(svg_path, "w", encoding="utf-8") as f:
            f.write(self.svg() + "\n")
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        return svg_path, json_path

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        text = repr(self)
        try:
            # inline (hovering a bar shows its task); HTML needs no namespace URL, and a page that names
            # no URL stays self-contained
            svg = self.svg().replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)
        except Exception:  # never a traceback in a notebook cell
            return {"text/plain": text}
        return {"text/plain": text, "text/html": f'<div class="tkx-timeline" style="overflow:auto;max-height:70vh">'
                                                 f"<p>{text.strip('<>')}{self._download_link()}</p>{svg}</div>"}

    def _download_link(self) -> str:
        """`` · <a download>`` of :meth:`chrome_trace` as a data URI (empty above 4 MB of JSON or on failure:
        then :meth:`to_chrome_trace` writes the file)."""
        import base64
        import json
        from html import escape

        try:
            data = json.dumps(self.chrome_trace(), separators=(",", ":")).encode()
        except Exception:  # a timeline the export cannot convert: the chart alone
            return ""
        if len(data) > 4 << 20:
            return " · trace too large to embed: <code>tl.to_chrome_trace(path)</code> writes it"
        name = escape(f"timeline-{self.name}.json", quote=True)
        return (f' · <a download="{name}" href="data:application/json;base64,{base64.b64encode(data).decode()}" '
                f'title="Trace Event Format JSON: open it in Perfetto UI or chrome://tracing">'
                f"download the trace (Perfetto)</a>")

    def __repr__(self) -> str:
        return (f"<tkx.Timeline {self.name}: {len(self.spans)} tasks on {self.blocks} blocks, makespan "
                f"{self.makespan:g} {self.unit}, {100 * self.busy():.0f}% busy>")


def vm_timeline(schedule: Any, arena: Any, inputs: Any, *, blocks: int | None = None) -> Timeline:
    """The timeline of one launch of ``schedule`` run by the task VM in program order (policy ``eager``,
    ordering only: no values computed, so it is fast), on ``blocks`` blocks (default: 1 in block mode,
    else the schedule's grid capped at 8). Times are VM events. Raises what :func:`tkx.dataflow.vm.run`
    raises."""
    from .dag import build
    from .vm import run

    dag = build(schedule, arena)
    if blocks is None:
        blocks = 1 if schedule.mode == "block" else max(1, min(int(schedule.blocks), 8))
    return Timeline.from_vm(run(dag, inputs, blocks=blocks, policy="eager", launches=1, values=False))
