"""A :class:`~tkx.dataflow.timeline.Timeline` as a Chrome / Perfetto trace, alone or merged with ``torch.profiler``.

The output is Trace Event Format JSON (the JSON object form: ``{"traceEvents": [...], ...}``), which
Perfetto UI (ui.perfetto.dev: *Open trace file*) and ``chrome://tracing`` (*Load*) open. The format is
Google's "Trace Event Format" document (the one ``chrome://tracing`` and ``torch.profiler`` follow):
times ``ts`` and ``dur`` in µs, ``pid``/``tid`` pick the track, ``ph`` the kind of event.

:func:`chrome_trace` lays a timeline out as

* one process (``pid``) for the kernel, named after the step and the kernel's entry;
* one thread (``tid``) per block: ``"block 0"``, ``"block 1"``, ... (``"M"`` metadata events name them);
* one complete slice (``"ph": "X"``, category ``task``) per task, named by its group and, when the
  program's ops carry an ``nn.Module`` path (``op.module``), the module: ``"g3 model.fc1"``; its
  ``args`` hold group, item, task number, block, ops and modules;
* one slice (category ``wait``) before each task that waited, from the block reaching the task to its
  start, and a flow (``"ph": "s"`` / ``"f"``, category ``dependency``) from the producer task whose counter
  release it waited for (the last task to finish among the groups it waits on) to the task;
* two counter tracks (``"ph": "C"``; Perfetto names a track by event name and argument): ``tasks in
  flight`` (tasks running on all blocks) and ``arena bytes in use`` (the bytes of the arena plan's slots
  live in the latest-started stage: :meth:`tkx.arena.ArenaPlan.live_at`; the plan is per stage, so with
  counters, where stages overlap, it is the step function of the stages' first starts).

Times: a timeline in ns (the kernel's ``%globaltimer``) becomes µs (``ts = t / 1000``); a timeline in
``"us"`` stays; one in VM ``"events"`` (the task VM's logical clock) is drawn at 1 µs per event.

:func:`merge_profiler_trace` puts the same events into a ``torch.profiler`` trace, on the GPU's clock:
see its docstring and ``docs/profiling.md`` for the alignment and how its offset is measured.
:func:`check_trace` lists what in a trace breaks the format (used by the tests; call it on your own
traces too).
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import TkxError

__all__ = ["chrome_trace", "write_trace", "read_trace", "merge_profiler_trace", "check_trace", "UNIT_US",
           "task_label"]

#: µs per timeline unit (``Timeline.unit``): ns from the kernel's ``%globaltimer``, VM events at 1 µs each.
UNIT_US = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "events": 1.0}
_SOURCE = {"ns": "kernel %globaltimer", "events": "task VM, 1 event drawn as 1 µs"}


class TraceError(TkxError):
    """A trace that cannot be exported or merged (unknown unit, no kernel slice to expand)."""


def _us_per_unit(tl: Any) -> float:
    try:
        return UNIT_US[tl.unit]
    except KeyError:
        raise TraceError(f"timeline {tl.name!r} is in {tl.unit!r}, which the trace export cannot convert to "
                         f"µs; use one of {', '.join(UNIT_US)}") from None


def _modules(dag: Any, group: str) -> list[str]:
    """The distinct ``op.module`` paths of ``group``'s ops (program order), [] without a DAG or modules."""
    if dag is None:
        return []
    schedule = dag.schedule
    g = schedule.groups.get(group)
    out: list[str] = []
    for op_id in getattr(g, "ops", ()):
        try:
            module = getattr(schedule.op(op_id), "module", None)
        except Exception:  # an op the program no longer has: name the group alone
            module = None
        if module and module not in out:
            out.append(str(module))
    return out


def task_label(group: str, modules: Sequence[str]) -> str:
    """A task slice's name: the group, then its module (``"g3 model.fc1"``) or the first of its modules and
    how many more (``"g4 model.fc1 +2"``)."""
    if not modules:
        return group
    return f"{group} {modules[0]}" + (f" +{len(modules) - 1}" if len(modules) > 1 else "")


def _waited_groups(dag: Any, group: str) -> list[str]:
    if dag is None:
        return []
    waits = dag.waits.get(group, ())
    return [dag.counters[w.counter].group for w in waits if 0 <= w.counter < len(dag.counters)]


def _arena_steps(tl: Any, dag: Any) -> list[tuple[float, int]]:
    """``(time, bytes live)`` at the first start of each stage, in time order."""
    arena = getattr(dag, "arena", None)
    if arena is None:
        return []
    first: dict[int, float] = {}
    for s in tl.spans:
        stage = dag.stage_of.get(s.group)
        if stage is not None and (stage not in first or s.start < first[stage]):
            first[stage] = s.start
    out = []
    for stage, t in sorted(first.items(), key=lambda kv: (kv[1], kv[0])):
        try:
            out.append((t, sum(slot.nbytes for slot in arena.live_at(stage))))
        except TkxError:  # a stage the plan does not know: leave the counter as it was
            continue
    return out


def _in_flight(tl: Any) -> list[tuple[float, int]]:
    """``(time, tasks running)`` after every change, in time order (ends before starts at one time)."""
    deltas: dict[float, int] = {}
    for s in tl.spans:
        deltas[s.start] = deltas.get(s.start, 0) + 1
        deltas[s.end] = deltas.get(s.end, 0) - 1
    out, n = [], 0
    for t in sorted(deltas):
        n += deltas[t]
        out.append((t, n))
    return out


def _us(x: float) -> float:
    return round(x, 3)  # ns resolution


def _dur(ts: float, end: float) -> float:
    """The ``dur`` of a slice from ``ts`` to ``end`` (both already rounded by :func:`_us`) such that
    ``ts + dur`` does not pass ``end`` in floating point. At a profiler's absolute times (~5e12 µs) a double
    holds only ~1 ns, so ``ts + round(end - ts, 3)`` can land one step past ``end``, and a wait ending where
    its task starts would then overlap the task; there ``end - ts`` (exact for ``ts <= end <= 2 ts``) is
    used instead. Slices that touch or are disjoint on the timeline stay so in the trace."""
    d = _us(end - ts)
    return d if ts + d <= end else end - ts


def task_events(tl: Any, *, pid: int = 1, t0_us: float = 0.0, us_per_unit: float | None = None,
                dag: Any = None, flows: bool = True, counters: bool = True, flow_id: int = 1,
                name: str | None = None, sort_index: int | None = None) -> list[dict[str, Any]]:
    """The events of ``tl`` on process ``pid``: time ``t`` of the timeline is drawn at
    ``t0_us + t * us_per_unit`` µs (default: :data:`UNIT_US` of its unit). ``dag`` defaults to
    ``tl.dag``; flows get ids from ``flow_id`` on. See the module text for the layout."""
    scale = _us_per_unit(tl) if us_per_unit is None else float(us_per_unit)
    dag = tl.dag if dag is None else dag
    source = "predicted by the cost model" if getattr(tl, "kind", "") == "predicted" else _SOURCE.get(tl.unit, tl.unit)
    title = name or (f"tkx {tl.name}: kernel {tl.kernel}" if tl.kernel else f"tkx {tl.name}") + f" ({source})"
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                     "args": {"name": title}}]
    if sort_index is not None:
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": sort_index}})
    for b in sorted({s.block for s in tl.spans}):
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": b, "args": {"name": f"block {b}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": b, "args": {"sort_index": b}})

    def at(t: float) -> float:
        return _us(t0_us + t * scale)

    labels: dict[str, tuple[str, list[str]]] = {}
    ends: dict[str, list[tuple[float, int, Any]]] = {}  # group -> (end, -task, span), ascending
    for s in tl.spans:
        ends.setdefault(s.group, []).append((s.end, -s.task, s))
    for v in ends.values():
        v.sort(key=lambda x: x[:2])
    for s in tl.spans:
        if s.group not in labels:
            mods = _modules(dag, s.group)
            labels[s.group] = (task_label(s.group, mods), mods)
        label, mods = labels[s.group]
        ts, end = at(s.start), at(s.end)
        args: dict[str, Any] = {"group": s.group, "item": s.item, "task": s.task, "block": s.block,
                                "wait_us": _us(s.wait * scale)}
        if mods:
            args["modules"] = mods
        if dag is not None and s.group in dag.schedule.groups:
            args["ops"] = list(dag.schedule.groups[s.group].ops)
        events.append({"name": label, "cat": "task", "ph": "X", "ts": ts, "dur": _dur(ts, end), "pid": pid,
                       "tid": s.block, "args": args})
        if s.wait > 0:
            ready = at(s.start - s.wait)
            waited = _waited_groups(dag, s.group)
            events.append({"name": f"wait ({', '.join(waited)})" if waited else "wait", "cat": "wait",
                           "ph": "X", "ts": ready, "dur": _dur(ready, ts),
                           "pid": pid, "tid": s.block, "args": {"task": s.task, "for": waited}})
            done = [ends[g][i - 1] for g in waited if g in ends
                    and (i := bisect.bisect_right(ends[g], (s.start, math.inf), key=lambda x: x[:2])) > 0]
            if flows and done:  # the release it waited for: the last producer tile to finish before it started
                p = max(done, key=lambda x: x[:2])[2]
                events.append({"name": "counter release", "cat": "dependency", "ph": "s", "id": flow_id,
                               "ts": at((p.start + p.end) / 2), "pid": pid, "tid": p.block})
                events.append({"name": "counter release", "cat": "dependency", "ph": "f", "bp": "e", "id": flow_id,
                               "ts": at((s.start + s.end) / 2), "pid": pid, "tid": s.block})
                flow_id += 1
    if counters:
        for t, n in _in_flight(tl):
            events.append({"name": "tasks", "ph": "C", "ts": at(t), "pid": pid, "args": {"in flight": n}})
        steps = _arena_steps(tl, dag)
        for t, nbytes in steps:
            events.append({"name": "arena", "ph": "C", "ts": at(t), "pid": pid, "args": {"bytes in use": nbytes}})
        if steps:
            events.append({"name": "arena", "ph": "C", "ts": at(tl.makespan), "pid": pid, "args": {"bytes in use": 0}})
    return events


def _about(tl: Any) -> dict[str, Any]:
    return {"name": tl.name, "kernel": tl.kernel, "unit": tl.unit, "origin": tl.origin,
            "source": _SOURCE.get(tl.unit, tl.unit), "tasks": len(tl.spans), "blocks": tl.blocks,
            "makespan": tl.makespan}


def chrome_trace(tl: Any, *, flows: bool = True, counters: bool = True, dag: Any = None) -> dict[str, Any]:
    """``tl`` as a Trace Event Format object ``{"traceEvents": [...], "displayTimeUnit": "ns",
    "otherData": {"tkx": {...}}}``, time 0 at ``ts`` 0 (``otherData.tkx.origin``: the clock reading of time 0,
    in ``tl.unit``). ``flows``/``counters``: draw the wait flows / the counter tracks; ``dag``: the
    :class:`~tkx.dataflow.dag.TaskDAG` for waits, modules and arena bytes (default ``tl.dag``; without one the
    slices carry their group only). Raises :class:`TraceError` for a unit not in :data:`UNIT_US`."""
    return {"traceEvents": task_events(tl, flows=flows, counters=counters, dag=dag), "displayTimeUnit": "ns",
            "otherData": {"tkx": _about(tl)}}


def write_trace(trace: Mapping[str, Any], path: Any) -> str:
    """Write ``trace`` as JSON to ``path`` (gzip when it ends in ``.gz``); returns the path as a string.
    Raises ``OSError`` when the file cannot be written."""
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    text = json.dumps(trace, separators=(",", ":"))
    if path.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return path


def read_trace(source: Any) -> dict[str, Any]:
    """A trace from a path (``.json`` or ``.json.gz``), a JSON string, a dict (copied) or a list; a bare
    event list becomes ``{"traceEvents": [...]}``. Raises :class:`TraceError` for anything else."""
    if isinstance(source, Mapping):
        data: Any = dict(source)
    elif isinstance(source, list):
        data = source
    elif isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        data = json.loads(source)
    else:
        path = os.fspath(source)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError("not a Trace Event Format trace: expected an object with a 'traceEvents' list "
                         "(what torch.profiler's export_chrome_trace writes)")
    return data


def _kernel_slices(events: Sequence[Mapping[str, Any]], kernel: str) -> list[Mapping[str, Any]]:
    found = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
             and (e.get("name") == kernel or str(e.get("name", "")).startswith(kernel + "("))]
    return sorted(found, key=lambda e: float(e.get("ts", 0.0)))


def merge_profiler_trace(profiler: Any, timeline: Any, out: Any = None, *, kernel: str | None = None,
                         launch: int = -1, align: str = "auto", lead_us: float = 0.0,
                         clock_offset_ns: int | None = None) -> dict[str, Any]:
    """One trace: ``profiler`` (a ``torch.profiler`` Chrome trace, from ``prof.export_chrome_trace(path)``:
    a path, JSON text or dict) with ``timeline``'s per-block task slices added as a process of their own,
    under the profiler's slice of the kernel.

    The kernel's slice is the ``launch``-th (default the last) complete event of category ``kernel`` named
    ``kernel`` (default ``timeline.kernel``, e.g. ``"tkx_step"``); the timeline is the one of that launch
    (:meth:`~tkx.runtime.CompiledRunner.timeline` holds the last launch: profile up to it, or pick it).
    Alignment (``align``):

    * ``"start"`` (the default for a kernel timeline in ns): time 0 of the timeline (the first block reaching
      its first task) at the slice's start plus ``lead_us``; both clocks tick GPU ns (CUPTI's kernel times and
      ``%globaltimer``), so durations are kept and no scaling is done. ``lead_us`` is the launch's prologue
      before the first task (``scripts/trace-offset`` measures it on a GPU; 0 draws the tasks from the slice's
      start);
    * ``"stretch"`` (the default for a VM timeline in events): the timeline's ``[0, makespan]`` onto the
      slice's ``[start, end]`` (a prediction placed where the kernel ran);
    * ``"clock"`` (a kernel timeline only): every task at its own ``%globaltimer`` reading plus
      ``clock_offset_ns`` (the profiler's clock minus ``%globaltimer``, as ``scripts/trace-offset`` measures
      it; needs the trace's ``baseTimeNanoseconds``); the slice then only picks the launch.

    ``otherData.tkx_alignment`` of the result records the tasks' ``pid``, the slice, the mode, the µs per
    timeline unit, ``slice_minus_makespan_us`` (the kernel's time outside its tasks when aligned on
    ``"start"``) and, for a kernel timeline in a trace with ``baseTimeNanoseconds``,
    ``profiler_minus_globaltimer_ns``. A flow connects the profiler's kernel slice to the first task.
    Writes the result to ``out`` when given (gzip if it ends in ``.gz``) and returns it. Raises
    :class:`TraceError` when no such kernel slice is in the trace (naming the kernels it has), for an
    unknown ``align`` or a timeline unit not in :data:`UNIT_US`.
    """
    trace = read_trace(profiler)
    events = list(trace["traceEvents"])
    name = kernel or timeline.kernel
    if not name:
        raise TraceError("the timeline does not name its kernel; pass kernel= (the kernel's name in the profiler "
                         "trace, e.g. 'tkx_step')")
    slices = _kernel_slices(events, name)
    if not slices:
        seen = sorted({str(e.get("name")) for e in events if str(e.get("cat", "")).lower() == "kernel"})
        raise TraceError(f"the profiler trace has no kernel slice named {name!r} (kernels in it: "
                         f"{', '.join(seen[:8]) or 'none: was the profiler run with ProfilerActivity.CUDA?'}); "
                         f"pass kernel= to pick another")
    try:
        k = slices[launch]
    except IndexError:
        raise TraceError(f"launch={launch}, but the trace has {len(slices)} launches of {name!r}") from None
    if align == "auto":
        align = "start" if timeline.unit == "ns" else "stretch"
    k_ts, k_dur = float(k["ts"]), float(k.get("dur", 0.0))
    base = trace.get("baseTimeNanoseconds")
    if align == "start":
        scale, t0 = _us_per_unit(timeline), k_ts + float(lead_us)
    elif align == "clock":
        if timeline.unit != "ns" or not isinstance(base, (int, float)) or clock_offset_ns is None:
            raise TraceError("align='clock' needs a kernel timeline (ns), a profiler trace with "
                             "baseTimeNanoseconds and clock_offset_ns=; use align='start' otherwise")
        scale, t0 = 1e-3, (int(timeline.origin) + int(clock_offset_ns) - int(base)) / 1000
    elif align == "stretch":
        _us_per_unit(timeline)
        scale, t0 = (k_dur / timeline.makespan if timeline.makespan else 0.0), k_ts
    else:
        raise TraceError(f"align={align!r}: use 'auto', 'start', 'stretch' or 'clock'")
    pids = [e["pid"] for e in events if isinstance(e.get("pid"), int) and not isinstance(e.get("pid"), bool)]
    ids = [e["id"] for e in events if isinstance(e.get("id"), int) and e.get("ph") in ("s", "t", "f")]
    pid, flow_id = max(pids, default=0) + 1, max(ids, default=0) + 1
    sorts = [e["args"].get("sort_index") for e in events if e.get("ph") == "M" and e.get("pid") == k.get("pid")
             and e.get("name") == "process_sort_index" and isinstance(e.get("args"), Mapping)]
    sort = sorts[0] if sorts and isinstance(sorts[0], int) else k.get("pid") if isinstance(k.get("pid"), int) else None
    added = task_events(timeline, pid=pid, t0_us=t0, us_per_unit=scale, flow_id=flow_id + 1,
                        sort_index=None if sort is None else sort + 1,
                        name=f"tkx {timeline.name}: {name} per block ({_SOURCE.get(timeline.unit, timeline.unit)})")
    first = min(timeline.spans, key=lambda s: (s.start, s.block), default=None)
    if first is not None:
        added.append({"name": "tkx tasks", "cat": "tkx", "ph": "s", "id": flow_id,  # inside the kernel's slice
                      "ts": _us(k_ts + min(k_dur / 2, 0.001)), "pid": k.get("pid"), "tid": k.get("tid")})
        added.append({"name": "tkx tasks", "cat": "tkx", "ph": "f", "bp": "e", "id": flow_id,
                      "ts": _us(t0 + (first.start + first.end) / 2 * scale), "pid": pid, "tid": first.block})
    merged = dict(trace)
    merged["traceEvents"] = events + added
    other = dict(merged.get("otherData") or {})
    other["tkx"] = _about(timeline)
    other["tkx_alignment"] = {"pid": pid, "kernel": name, "launch": launch, "launches": len(slices),
                              "align": align, "slice_ts_us": k_ts, "slice_dur_us": k_dur, "lead_us": float(lead_us),
                              "us_per_unit": scale,
                              "slice_minus_makespan_us": _us(k_dur - timeline.makespan * scale)}
    if timeline.unit == "ns" and isinstance(base, (int, float)) and timeline.origin:
        # the kernel's start on the profiler's clock minus the first task's ready on %globaltimer: a constant
        # clock offset minus the prologue; its spread over launches is what aligning on "start" cannot see
        other["tkx_alignment"]["profiler_minus_globaltimer_ns"] = int(base) + round(k_ts * 1000) - int(timeline.origin)
    merged["otherData"] = other
    if out is not None:
        write_trace(merged, out)
    return merged


_PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "e", "n", "P", "O", "N", "D", "R", "c", "(", ")"}


def _bad(e: Any, i: int) -> str | None:
    """The first thing wrong with event ``i`` on its own, or ``None``."""
    if not isinstance(e, Mapping):
        return f"event {i} is not an object"
    ph = e.get("ph")
    if ph not in _PHASES:
        return f"event {i} has phase {ph!r}"
    if not isinstance(e.get("name", ""), str):
        return f"event {i}: name is not a string"
    if ph != "M" and not isinstance(e.get("ts"), (int, float)):
        return f"event {i} ({ph}) has no numeric ts (µs)"
    if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
        return f"event {i} (X) needs a dur >= 0 (µs)"
    if "pid" not in e or (ph not in ("C", "M") and "tid" not in e):
        return f"event {i} ({ph}) needs pid and tid"
    if ph in ("s", "t", "f") and "id" not in e:
        return f"flow event {i} has no id"
    if ph == "C" and not (isinstance(e.get("args"), Mapping) and e["args"]
                          and all(isinstance(v, (int, float)) for v in e["args"].values())):
        return f"counter event {i} needs numeric args"
    if ph == "M" and not (isinstance(e.get("args"), Mapping) and e["args"]):
        return f"metadata event {i} needs args (a name, sort_index or labels)"
    return None


def check_trace(trace: Any) -> list[str]:
    """What in ``trace`` (a dict, JSON text or path) breaks the Trace Event Format as Perfetto and
    ``chrome://tracing`` read it; ``[]`` when nothing does. Checked: every event's ``ph``, ``ts`` and ``dur``
    (numbers, µs, ``dur >= 0``), ``pid``/``tid``, flows with ids where every ``f`` has an ``s`` of the same id
    before it, numeric counter args, ``"M"`` events with a name, and that the complete slices of each track
    (``pid``, ``tid``) nest (none starts inside another and ends after it: tracks must be monotonic)."""
    problems: list[str] = []
    try:
        events = read_trace(trace)["traceEvents"]
    except (TraceError, ValueError, OSError) as exc:
        return [str(exc)]
    tracks: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    starts: dict[Any, float] = {}
    flows_end: list[tuple[Any, float, int]] = []
    for i, e in enumerate(events):
        bad = _bad(e, i)
        if bad:
            problems.append(bad)
            continue
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"]),
                                                                 e.get("name", "")))
        elif e["ph"] == "s":
            starts[e["id"]] = min(float(e["ts"]), starts.get(e["id"], float("inf")))
        elif e["ph"] == "f":
            flows_end.append((e["id"], float(e["ts"]), i))
    for fid, ts, i in flows_end:
        if fid not in starts:
            problems.append(f"flow end {i} (id {fid}) has no flow start")
        elif starts[fid] > ts:
            problems.append(f"flow {fid} ends at {ts} µs before it starts at {starts[fid]} µs")
    eps = 1e-6
    for (pid, tid), slices in tracks.items():
        open_ends: list[tuple[float, str]] = []
        for ts, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1][0] <= ts + eps:
                open_ends.pop()
            if open_ends and end > open_ends[-1][0] + eps:
                problems.append(f"track pid {pid} tid {tid}: {name!r} at {ts} µs overlaps {open_ends[-1][1]!r} "
                                f"without nesting in it")
                if len(problems) > 50:
                    return problems
            open_ends.append((end, name))
    return problems
