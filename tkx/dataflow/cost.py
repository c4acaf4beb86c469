"""Barriers or counters: estimated µs of each for a schedule, from :mod:`tkx.costs`.

* barriers: per stage, the slowest block's share of the stage's items (a group costs its fixed
  ``group_us`` plus its items' share of the grid, each item :func:`tkx.costs.item_us`), plus one
  grid barrier per stage boundary;
* counters: the longest path through the task DAG (a group costs as above plus ``publish_us`` per
  task, the fence and atomic that release its tile; an edge a counter hand-off), but never less than
  the total work spread over the grid, plus one satisfied wait per task.
"""

from __future__ import annotations

import math
from typing import Any

from .. import costs
from .dag import TaskDAG


def task_us(dag: TaskDAG, gid: str, c: dict[str, float]) -> float:
    """Estimated µs of one task (work item) of group ``gid``: :func:`tkx.costs.item_us` (the fixed
    ``task_us`` plus the item's share of the group's FLOPs or bytes at one SM's roofline)."""
    g = dag.schedule.groups[gid]
    return costs.item_us(g.flops, g.bytes, dag.items[gid], c, costs.group_impl(g))


def span_us(dag: TaskDAG, gid: str, blocks: int, sync: str, c: dict[str, float]) -> float:
    """Estimated µs of one task of group ``gid`` as a predicted timeline draws it: :func:`task_us` plus the
    group's fixed ``group_us`` spread over the tasks one of ``blocks`` blocks runs (it is paid once per
    block), plus ``publish_us`` with ``sync="counters"``."""
    per_block = math.ceil(max(dag.items[gid], 1) / max(blocks, 1))
    return task_us(dag, gid, c) + c["group_us"] / per_block + (c["publish_us"] if sync == "counters" else 0.0)


def barrier_us(blocks: int, mode: str, c: dict[str, float]) -> float:
    """Estimated µs of one barrier: ``__syncthreads`` in block mode, else a grid barrier, ``grid_barrier_us``
    whatever the grid's size (``blocks`` is kept for callers: on the H200 a grid barrier measured 1.31, 1.33,
    1.33 and 1.36 µs on 8, 32, 66 and 132 blocks, flat within 4%)."""
    if mode == "block":
        return c["block_barrier_us"]
    return c["grid_barrier_us"]


def group_us(dag: TaskDAG, gid: str, blocks: int, c: dict[str, float]) -> float:
    """Estimated µs of group ``gid`` on ``blocks`` blocks: its fixed ``group_us`` plus the slowest block's
    share of its tasks."""
    return c["group_us"] + math.ceil(max(dag.items[gid], 1) / max(blocks, 1)) * task_us(dag, gid, c)


def estimate(dag: TaskDAG, blocks: int, c: dict[str, float] | None = None) -> dict[str, float]:
    """``{"barrier": µs, "counters": µs}`` for ``dag`` on ``blocks`` blocks, with constants ``c``
    (default :func:`tkx.costs.constants`)."""
    c = c or costs.constants()
    s = dag.schedule
    t_bar = sum(max(group_us(dag, g, blocks, c) for g in st) for st in s.stages) \
        + barrier_us(blocks, "grid", c) * (len(s.stages) - 1)
    finish: dict[str, float] = {}

    def counted(g: str, b: int) -> float:  # with counters every task also publishes (fence and atomic)
        return group_us(dag, g, b, c) + math.ceil(max(dag.items[g], 1) / max(b, 1)) * c["publish_us"]

    for g in dag.order:
        start = max((finish[dag.counters[w.counter].group] + c["handoff_us"] for w in dag.waits[g]), default=0.0)
        finish[g] = start + counted(g, blocks)
    work = sum(counted(g, 1) for g in dag.order) / max(blocks, 1)
    waits = sum(len(dag.waits[g]) * math.ceil(dag.items[g] / max(blocks, 1)) for g in dag.order) * c["wait_us"]
    t_cnt = max(max(finish.values(), default=0.0), work) + waits
    return {"barrier": t_bar, "counters": t_cnt}


def choose_sync(dag: TaskDAG | None, options: Any, mode: str, blocks: int) -> tuple[str, str]:
    """(``"barrier"`` or ``"counters"``, the reason) for ``options.sync`` in ``mode``."""
    want = getattr(options, "sync", "barrier")
    if want == "barrier":
        return "barrier", "sync='barrier' (the default): a barrier between stages"
    if mode == "block":
        return "barrier", "one block: __syncthreads orders its tasks (counters would cost more)"
    if dag is None:
        return "barrier", "no task DAG"
    est = estimate(dag, blocks)
    numbers = f"estimated {est['barrier']:.1f} µs with barriers vs {est['counters']:.1f} µs with counters " \
              f"on {blocks} blocks ({costs.source()})"
    if want == "counters":
        return "counters", f"sync='counters' requested ({numbers})"
    if est["counters"] < est["barrier"]:
        return "counters", f"auto: counters are cheaper: {numbers}"
    return "barrier", f"auto: barriers are cheaper: {numbers}"
