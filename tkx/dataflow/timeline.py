"""Per-task timelines: what each block ran, when, and how long it waited first.

A :class:`Timeline` holds one :class:`Span` per task: ``block``, ``task`` (global number),
``group``, ``item``, ``start`` and ``end`` and ``wait`` (ns, relative to the earliest start).
Three kinds come from three sources, all drawn by one renderer (:mod:`tkx.render.timeline`):

* ``"measured"``: the kernel's ``%globaltimer`` (``Options(timeline=True)``, :meth:`CompiledRunner.timeline`);
* ``"predicted"``: :func:`predicted_timeline`, the task DAG timed by the cost model (no GPU; ns);
* ``"events"``: the task VM's interleaving (:meth:`Timeline.from_vm`, times are VM event numbers).

:meth:`Timeline.compare` puts a prediction beside a measurement, group by group.

``svg()`` draws it as a Gantt chart; :meth:`Timeline.to_chrome_trace` writes it for Perfetto and
``chrome://tracing`` (:mod:`tkx.dataflow.trace`).
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
class GroupTime:
    """One group in a timeline: its first ``start`` and last ``end`` (the timeline's unit), its
    ``tasks`` and ``busy`` (the sum of its tasks' durations)."""

    group: str
    start: float
    end: float
    tasks: int
    busy: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Timeline:
    """Spans of one launch (``unit``: ``"ns"`` measured or predicted, ``"events"`` from the VM).

    ``origin``: the clock reading of time 0 in ``unit``, an int (the kernel's ``%globaltimer`` in ns,
    exact; 0 for the VM and a prediction); ``kernel``: the kernel's entry name (what profilers call it);
    ``dag``: the :class:`~tkx.dataflow.dag.TaskDAG` the spans belong to (``None`` when unknown, e.g. after
    :meth:`from_json`): the trace export takes waits, modules and arena bytes from it. ``kind``:
    ``"measured"``, ``"predicted"`` or ``"events"`` (see the module text); ``critical``: the task numbers on
    the critical path (a prediction knows it); ``note``: where the times come from.
    """

    name: str
    spans: tuple[Span, ...]
    unit: str = "ns"
    origin: int = 0
    kernel: str = ""
    dag: Any = field(default=None, repr=False, compare=False)
    kind: str = "measured"
    critical: tuple[int, ...] = ()
    note: str = ""

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
                   int(t0), kernel, dag, "measured", (), "the kernel's %globaltimer")

    @classmethod
    def from_vm(cls, vm_run: Any, launch: int = 0) -> Timeline:
        """From a :class:`tkx.dataflow.vm.VMRun`: event numbers as times."""
        recs = [r for r in vm_run.records if r.launch == launch]
        t0 = min((r.ready for r in recs), default=0)
        spans = tuple(Span(r.block, r.task, r.group, r.item, float(r.start - t0), float(r.end - t0),
                           float(r.start - r.ready)) for r in recs)
        return cls(vm_run.dag.schedule.program.name, spans, "events", dag=vm_run.dag, kind="events",
                   note="task VM event numbers")

    def groups(self) -> dict[str, GroupTime]:
        """Group id -> its :class:`GroupTime`, in order of the group's first start."""
        acc: dict[str, list[float]] = {}
        for s in self.spans:
            a = acc.get(s.group)
            if a is None:
                acc[s.group] = [s.start, s.end, 1, s.end - s.start]
            else:
                a[0], a[1], a[2], a[3] = min(a[0], s.start), max(a[1], s.end), a[2] + 1, a[3] + s.end - s.start
        out = {g: GroupTime(g, a[0], a[1], int(a[2]), a[3]) for g, a in acc.items()}
        return dict(sorted(out.items(), key=lambda kv: (kv[1].start, kv[1].end)))

    def compare(self, measured: Timeline) -> TimelineComparison:
        """This (predicted) timeline beside ``measured``, group by group (:class:`TimelineComparison`).
        Raises ``ValueError`` when the units differ."""
        if self.unit != measured.unit:
            raise ValueError(f"cannot compare a timeline in {self.unit} with one in {measured.unit}")
        return TimelineComparison(self, measured)

    def svg(self, *, span: float | None = None) -> str:
        """The Gantt chart as SVG text (``span``: the time the axis covers, to draw several timelines
        on one scale; default :attr:`makespan`)."""
        from ..render.timeline import timeline_svg
        return timeline_svg(self, span=span)

    def to_json(self) -> dict[str, Any]:
        """The spans as plain data (``{"name", "unit", "origin", "kernel", "kind", "critical", "note", "blocks",
        "makespan", "busy", "spans": [...]}``, each span a dict of :class:`Span`'s fields; times in :attr:`unit`)."""
        return {"name": self.name, "unit": self.unit, "origin": self.origin, "kernel": self.kernel,
                "kind": self.kind, "critical": list(self.critical), "note": self.note,
                "blocks": self.blocks, "makespan": self.makespan, "busy": self.busy(),
                "spans": [dict(vars(s)) for s in self.spans]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timeline:
        """The inverse of :meth:`to_json`."""
        return cls(data["name"], tuple(Span(**s) for s in data["spans"]), data.get("unit", "ns"),
                   int(data.get("origin", 0)), str(data.get("kernel", "")), None, data.get("kind", "measured"),
                   tuple(data.get("critical", ())), data.get("note", ""))

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
            from ..render.timeline import timeline_html
            return {"text/plain": text, "text/html": timeline_html(self, extra=self._download_link())}
        except Exception:  # never a traceback in a notebook cell
            return {"text/plain": text}

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
        from ..words import plural

        label = f"{self.kind} " if self.kind != "events" else ""
        return (f"<tkx.Timeline {self.name}: {label}{plural(len(self.spans), 'task')} on "
                f"{plural(self.blocks, 'block')}, makespan {_amount(self.makespan, self.unit)}, "
                f"{100 * self.busy():.0f}% busy>")


def _amount(x: float, unit: str) -> str:
    """``1234.5`` ns -> ``"1.23 µs"``; other units as they are."""
    return f"{x / 1e3:.2f} µs" if unit == "ns" else f"{x:g} {unit}"


@dataclass(frozen=True)
class TimelineComparison:
    """A predicted timeline beside a measured one (both in ns): per group, the predicted and measured
    µs (first start to last end) and the prediction's error, ``(predicted - measured) / measured``;
    the same for the makespan. Groups in only one of the two are listed with ``None`` for the other."""

    predicted: Timeline
    measured: Timeline

    def rows(self) -> list[tuple[str, float | None, float | None, float | None]]:
        """``(group, predicted µs, measured µs, relative error)`` per group, in the measured order."""
        p, m = self.predicted.groups(), self.measured.groups()
        out = []
        for g in list(m) + [g for g in p if g not in m]:
            pu = p[g].duration / 1e3 if g in p else None
            mu = m[g].duration / 1e3 if g in m else None
            err = (pu - mu) / mu if pu is not None and mu else None
            out.append((g, pu, mu, err))
        return out

    @property
    def makespan_error(self) -> float | None:
        """``(predicted - measured) / measured`` of the makespans (``None`` for an empty measurement)."""
        m = self.measured.makespan
        return (self.predicted.makespan - m) / m if m else None

    def __repr__(self) -> str:
        err = self.makespan_error
        return (f"<tkx.TimelineComparison {self.measured.name}: predicted {_amount(self.predicted.makespan, 'ns')} "
                f"vs measured {_amount(self.measured.makespan, 'ns')}"
                + (f" ({100 * err:+.0f}%)" if err is not None else "") + f", {len(self.rows())} groups>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        text = repr(self)
        try:
            from ..render.timeline import comparison_html
            return {"text/plain": text, "text/html": comparison_html(self)}
        except Exception:  # never a traceback in a notebook cell
            return {"text/plain": text}


def predicted_timeline(source: Any, *, blocks: int | None = None, sync: str | None = None) -> Timeline:
    """The timeline the cost model predicts for one launch, without a GPU (unit ns, kind ``"predicted"``).

    ``source``: a :class:`~tkx.codegen.source.CudaSource` (its task DAG, or the DAG of its schedule and
    arena with the emitters' work items; its sync and grid) or a :class:`~tkx.dataflow.dag.TaskDAG`.
    Each task costs :func:`tkx.dataflow.cost.span_us` (the task's own cost, its share of the group's fixed
    cost, its release with counters), each barrier
    :func:`tkx.dataflow.cost.barrier_us`, each counter hand-off ``handoff_us`` (:func:`tkx.costs.constants`);
    the task VM's timed run (:func:`tkx.dataflow.vm.run_timed`) places every task and finds the critical path.
    ``blocks`` (default: the kernel's grid, 1 in block mode) and ``sync`` (default: the kernel's) override.
    """
    from .. import costs
    from .cost import barrier_us, span_us
    from .dag import build
    from .vm import critical_path, run_timed

    if isinstance(source, TaskDAG):
        dag, kernel_sync, grid = source, "barrier", None
    else:
        dag = source.dag or build(source.schedule, source.arena, work_items=dict(source.work_items) or None)
        kernel_sync, grid = source.sync, source.blocks
    s = dag.schedule
    if blocks is None:
        blocks = 1 if s.mode == "block" else int(grid or s.blocks)
    sync = sync or kernel_sync
    c = costs.constants()
    tasks = run_timed(dag, blocks=blocks, task_us={g: span_us(dag, g, blocks, sync, c) for g in dag.order}, sync=sync,
                      barrier_us=barrier_us(blocks, s.mode, c), handoff_us=c["handoff_us"], wait_us=c["wait_us"])
    spans = tuple(Span(t.block, t.task, t.group, t.item, t.start * 1e3, t.end * 1e3, (t.start - t.ready) * 1e3)
                  for t in sorted(tasks, key=lambda t: (t.block, t.start)))
    where = costs.source()
    note = (f"predicted by the cost model ({where}), {sync}"
            f"{' (__syncthreads)' if sync == 'barrier' and s.mode == 'block' else ''}, {blocks} blocks")
    kernel = getattr(source, "kernel_name", "") if not isinstance(source, TaskDAG) else ""
    return Timeline(s.program.name, spans, "ns", dag=dag, kernel=kernel, kind="predicted",
                    critical=tuple(critical_path(tasks)), note=note)


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
