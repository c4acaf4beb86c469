"""Barriers or counters: estimated µs of each for a schedule, from :mod:`tkx.costs`.

* barriers: per stage, the slowest block's share of the stage's items, plus one grid barrier
  per stage boundary;
* counters: the longest path through the task DAG (a group costs its items' share of the
  grid, an edge a counter hand-off), but never less than the total work spread over the grid,
  plus one satisfied wait per task.
"""

from __future__ import annotations

import math
from typing import Any

from .. import costs
from .dag import TaskDAG


def task_us(dag: TaskDAG, gid: str, c: dict[str, float]) -> float:
    """Estimated µs of one task (work item) of group ``gid``: a tenth of the fixed item overhead plus
    the item's share of the group's FLOPs or bytes, whichever takes one SM longer (the roofline of one
    SM, constants from :func:`tkx.costs.constants`)."""
    g = dag.schedule.groups[gid]
    n = max(dag.items[gid], 1)
    return c["item_overhead_us"] * 0.1 + max(g.flops / c["sm_flops_per_us"], g.bytes / c["sm_bytes_per_us"]) / n


def barrier_us(blocks: int, mode: str, c: dict[str, float]) -> float:
    """Estimated µs of one barrier: ``__syncthreads`` in block mode, else a grid barrier of ``blocks``
    blocks (half fixed, half growing with the blocks up to ``barrier_blocks``)."""
    if mode == "block":
        return c["block_barrier_us"]
    return c["grid_barrier_us"] * (0.5 + 0.5 * min(blocks, c["barrier_blocks"]) / c["barrier_blocks"])


def group_us(dag: TaskDAG, gid: str, blocks: int, c: dict[str, float]) -> float:
    """Estimated µs of group ``gid`` on ``blocks`` blocks."""
    return math.ceil(max(dag.items[gid], 1) / max(blocks, 1)) * task_us(dag, gid, c)


def estimate(dag: TaskDAG, blocks: int) -> dict[str, float]:
    """``{"barrier": µs, "counters": µs}`` for ``dag`` on ``blocks`` blocks."""
    c = costs.constants()
    s = dag.schedule
    t_bar = sum(max(group_us(dag, g, blocks, c) for g in st) for st in s.stages) \
        + barrier_us(blocks, "grid", c) * (len(s.stages) - 1)
    finish: dict[str, float] = {}
    for g in dag.order:
        start = max((finish[dag.counters[w.counter].group] + c["handoff_us"] for w in dag.waits[g]), default=0.0)
        finish[g] = start + group_us(dag, g, blocks, c)
    work = sum(group_us(dag, g, 1, c) for g in dag.order) / max(blocks, 1)
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
