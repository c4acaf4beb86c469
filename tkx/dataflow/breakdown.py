"""Where the time of one step goes: its timeline's critical path split into GEMM groups, other groups
(pointwise, reductions, copies), synchronisation (grid barriers, counter waits) and idle time, plus the
step's time outside its tasks (launch, prologue, epilogue), and a sentence naming what would shorten it.

The critical path is walked backwards from the task that ends last (:func:`critical_spans`). A task is
*released* when it is the first of its stage on its block (a grid barrier let it start: the kernel's timeline
records no wait for a barrier, only the gap) or it waited on a counter (``Span.wait`` above
:data:`WAITED_NS`); a released task follows the latest task, on any block, that ended before it started,
any other task its own block's previous task. Each task's duration counts for its group's class; the gap
before a task counts as synchronisation when the task was released by a barrier (all of it) or a counter
(up to the time it waited), the rest as idle. The path covers the timeline from 0 to its makespan exactly, so
the parts add up to the makespan; with ``step_us`` (the measured step) the rest of the step is ``outside_us``.
"""

from __future__ import annotations

from typing import Any

from .timeline import Span, Timeline

#: Group kinds whose tasks count as GEMM time (attention is two GEMMs and a softmax in one group).
GEMM_KINDS = frozenset({"gemm", "gemm_partial", "attention", "attention_partial"})

#: A task that waited more than this (ns) before it started was released by a barrier or a counter.
WAITED_NS = 50.0

#: The parts of a breakdown, in the order they are shown: (key, words).
PARTS = (("gemm_us", "GEMM groups"), ("other_us", "pointwise/reduction groups"),
         ("sync_us", "grid barriers / counter waits"), ("idle_us", "idle between tasks"),
         ("outside_us", "launch and outside the tasks"))


def _groups(tl: Timeline, groups: dict[str, tuple[str, int]] | None) -> dict[str, tuple[str, int]]:
    """group id -> (kind, stage index): ``groups`` when given, else from the timeline's DAG."""
    if groups is not None:
        return groups
    if tl.dag is None:
        raise ValueError("a breakdown needs the timeline's DAG or the groups' kinds and stages")
    s = tl.dag.schedule
    stage = {g: i for i, st in enumerate(s.stages) for g in st}
    return {g: (grp.kind, stage.get(g, 0)) for g, grp in s.groups.items()}


def critical_spans(tl: Timeline, groups: dict[str, tuple[str, int]] | None = None) -> list[tuple[Span, bool]]:
    """The critical path of ``tl``, first to last: (span, released) pairs (see the module text; ``groups``:
    group id -> (kind, stage), default from ``tl.dag``). Empty for an empty timeline."""
    import bisect

    if not tl.spans:
        return []
    info = _groups(tl, groups)
    own_prev: dict[tuple[int, int], Span | None] = {}
    by_block: dict[int, list[Span]] = {}
    for s in sorted(tl.spans, key=lambda s: (s.start, s.end)):
        lst = by_block.setdefault(s.block, [])
        own_prev[(s.block, s.task)] = lst[-1] if lst else None
        lst.append(s)
    ends = sorted(tl.spans, key=lambda s: s.end)
    end_times = [s.end for s in ends]
    cur = ends[-1]
    path: list[tuple[Span, bool]] = []
    seen = {(cur.block, cur.task)}
    while cur is not None:
        prev = own_prev[(cur.block, cur.task)]
        stage = info.get(cur.group, ("", 0))[1]
        released = cur.wait > WAITED_NS or prev is None or info.get(prev.group, ("", 0))[1] != stage
        if released:
            i = bisect.bisect_right(end_times, cur.start + 1e-6) - 1
            while i >= 0 and (ends[i].block, ends[i].task) in seen:
                i -= 1
            prev = ends[i] if i >= 0 else None
        path.append((cur, released))
        if prev is not None:
            seen.add((prev.block, prev.task))
        cur = prev
    return path[::-1]


def breakdown(tl: Timeline, step_us: float | None = None,
              groups: dict[str, tuple[str, int]] | None = None) -> dict[str, Any]:
    """The critical path of ``tl`` (unit ns) in µs: ``{"source", "step_us", "critical_path_us", "gemm_us",
    "other_us", "sync_us", "idle_us", "outside_us", "tasks", "fractions": {part: share of the step}}``.
    ``step_us``: the measured step (µs per step); ``outside_us`` is what it has beyond the makespan (0 when
    not given or shorter). ``groups``: group id -> (kind, stage index), for a timeline without its DAG (else
    read from ``tl.dag``). Raises ``ValueError`` for a timeline not in ns or without either."""
    if tl.unit != "ns":
        raise ValueError(f"a breakdown needs a timeline in ns, not {tl.unit}")
    info = _groups(tl, groups)
    path = critical_spans(tl, info)
    parts = dict.fromkeys(("gemm_us", "other_us", "sync_us", "idle_us"), 0.0)
    t = 0.0
    for s, released in path:
        gap = max(s.start - t, 0.0)
        if released and s.wait > WAITED_NS:
            waited = min(gap, s.wait)
        else:
            waited = gap if released else 0.0
        parts["sync_us"] += waited / 1e3
        parts["idle_us"] += (gap - waited) / 1e3
        key = "gemm_us" if info.get(s.group, ("", 0))[0] in GEMM_KINDS else "other_us"
        parts[key] += max(s.end - max(s.start, t), 0.0) / 1e3
        t = max(t, s.end)
    span = tl.makespan / 1e3
    step = step_us if step_us and step_us > span else span
    out: dict[str, Any] = {"source": f"{tl.kind} timeline", "step_us": round(step, 3),
                           "critical_path_us": round(span, 3), **{k: round(v, 3) for k, v in parts.items()},
                           "outside_us": round(step - span, 3), "tasks": len(path)}
    out["fractions"] = {k: round(out[k] / step, 4) if step else 0.0 for k, _ in PARTS}
    return out


def what_would_close(b: dict[str, Any]) -> str:
    """One sentence from a :func:`breakdown`: the largest part of the step, what would shorten it, and the next
    part when that is at least a quarter of the step too."""
    f = b.get("fractions") or {}
    if not f or not any(f.values()):
        return ""
    ranked = sorted(f, key=f.get, reverse=True)
    key = ranked[0]
    pct = round(100 * f[key])
    words = dict(PARTS)
    first = {
        "gemm_us": f"GEMM-bound: GEMM groups are {pct}% of the step; faster GEMMs (less fixed cost per work item, "
                   "pipelined TMA/wgmma tiles) would close it",
        "other_us": f"pointwise/reduction-bound: those groups are {pct}% of the step; fusing them into fewer, "
                    "wider groups (fewer tasks with fixed costs) would close it",
        "sync_us": f"sync-bound: grid barriers and counter waits are {pct}% of the step; fewer stages, or counters "
                   "per tile instead of barriers, would close it",
        "idle_us": f"latency-bound: {pct}% of the step is idle between tasks; fewer, larger tasks would close it",
        "outside_us": f"launch-bound: {pct}% of the step is outside the tasks (launch, prologue); several steps "
                      "per launch would close it",
    }[key]
    second = ranked[1] if len(ranked) > 1 else None
    if second is not None and f[second] >= 0.25:
        first += f"; next, {words[second]} ({round(100 * f[second])}%)"
    return first
