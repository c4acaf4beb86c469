"""Reduction, pointwise and copy specs: :class:`ReductionProblem`, the typed plans, one
:class:`ReductionEmitter` per strategy (:mod:`tkx.codegen.reduce`) and :func:`choose_reduction`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .facts import ARCHES, SM_COUNT, Capabilities, Cost, Plan, ceil_div


# --------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReductionProblem:
    """``out[row] = reduce_r x[row, r]``: ``rows`` outputs of ``size`` elements each;
    ``rows_contiguous``: consecutive rows are adjacent in memory (a reduction over a leading dim);
    ``integer``: an integer result (kept in exact long long accumulators, so never two-phase:
    the partials are floats)."""

    rows: int
    size: int
    rows_contiguous: bool = False
    integer: bool = False


@dataclass(frozen=True, eq=False)
class ReductionPlan(Plan):
    """How one reduction group is computed: ``strategy`` (one of
    :data:`REDUCTION_EMITTERS`' names), ``why``, ``rows x size``; for a two-phase reduction
    ``parts`` chunks per row and the scratch buffer ``partials`` (``None`` otherwise)."""

    strategy: str
    why: str
    rows: int
    size: int
    rows_contiguous: bool = False
    parts: int | None = None
    partials: str | None = None
    passes: int = 1
    #: threads that share one row of a row-persistent group: 32 (a warp per row, several rows per work item)
    #: or the block's (a block per row, a work item per row: :func:`row_threads`)
    row_threads: int = 32


def row_threads(rows: int, size: int, threads: int) -> int:
    """Threads per row of a row-persistent group of ``rows`` rows of ``size`` on blocks of ``threads``: the
    whole block when the rows would leave at least half its warps idle and the row is long (at least 8
    elements per lane of a warp): one warp alone would walk the row with dependent loads (an RMSNorm over
    d = 2048 in a batch-1 decode step took 10-13 µs on one warp of an H200, measured by
    ``scripts/decode-profile``); else one warp."""
    if rows * 2 <= threads // 32 and size >= 8 * 32:
        return threads
    return 32


@dataclass(frozen=True, eq=False)
class PointwisePlan(Plan):
    """A pointwise loop: ``numel`` points; each thread of a work item computes ``per_thread`` of them
    (one when absent; :func:`pointwise_per_thread`), ``threads`` apart so the loads stay coalesced.

    ``slice_write`` (a sentence) marks a ``scatter`` written in place into the input it updates: the
    loop runs over the *values* (``numel`` of them) and stores each at its indexed position; the
    rest of the tensor is never touched."""

    numel: int = 1
    per_thread: int | None = None
    slice_write: str | None = None


#: Most points one thread of a pointwise work item computes (:func:`pointwise_per_thread`).
POINTWISE_MAX_PER_THREAD = 8


def pointwise_per_thread(numel: int, threads: int, blocks: int) -> int:
    """Points per thread of a pointwise loop over ``numel`` points: 1 while the loop has at most 4 work
    items per block of the grid (``blocks``); beyond that, enough (at most
    :data:`POINTWISE_MAX_PER_THREAD`) to bring it back to about 4 per block, so a big loop is a few
    thousand-point items rather than thousands of one-point-per-thread ones (each work item costs a
    loop turn, and with counters sync a counter bump and wait)."""
    items = math.ceil(numel / max(threads, 1))
    per_block = 4 * max(blocks, 1)
    if items <= per_block:
        return 1
    return max(1, min(POINTWISE_MAX_PER_THREAD, math.ceil(items / per_block)))


@dataclass(frozen=True, eq=False)
class CopyPlan(Plan):
    """A copy group: ``numel`` elements to ``dst`` (the home's text)."""

    numel: int = 1
    dst: str = ""


#: A final phase folds each row's partials in one thread (a serial loop in chunk order, unrolled: every load
#: in flight) when a row has at most this many; more chunks take a warp per row (8 rows per 256-thread work
#: item). Medium's b2 gradient (1024 rows of 9 partials): 128 work items with a warp per row, 4 with a thread
#: per row; its b1 gradient (4096 rows of 3) took 512 items, 4 waves of ~0.65 µs on 132 SMs (3.9 µs on the
#: H200, from a kernel timeline; it now takes the one-phase ``columns`` strategy).
THREAD_FINAL_CHUNKS = 16


class ReductionEmitter:
    """The spec of one reduction strategy."""

    def __init__(self, name: str, summary: str) -> None:
        self.name, self.summary = name, summary
        self.capabilities = Capabilities(ARCHES, "registers", (1, 1, 1))

    def cost(self, plan: ReductionPlan, threads: int, phase: str = "one") -> Cost:
        rows, size = plan.rows, plan.size
        nbytes = rows * size * 4
        if phase == "partial":
            items = (ceil_div(rows, 32) if plan.rows_contiguous else rows) * (plan.parts or 1)
        elif self.name == "thread":
            items = ceil_div(rows, threads)
        elif self.name == "partial":  # the final phase: a thread or a warp per row folds the partials
            items = ceil_div(rows, threads if (plan.parts or 1) <= THREAD_FINAL_CHUNKS else threads // 32)
            nbytes = rows * (plan.parts or 1) * 4
        elif self.name == "block":
            items = rows
        elif self.name == "columns":
            items = ceil_div(rows, 32)
        elif self.name == "row":  # a warp (or the block) per row, every pass over the row in registers
            items = rows if plan.row_threads > 32 else ceil_div(rows, threads // 32)
            return Cost(items, rows * size * max(plan.passes, 1), nbytes)
        else:
            items = ceil_div(rows, threads // 32)
        return Cost(items, rows * size, nbytes)


REDUCTION_EMITTERS: tuple[ReductionEmitter, ...] = (
    ReductionEmitter("thread", "one thread per row, a serial loop"),
    ReductionEmitter("warp", "one warp per row, shuffle reduction"),
    ReductionEmitter("block", "one block per row, block reduction"),
    ReductionEmitter("columns", "rows adjacent in memory: 32 rows per work item, the warps split the reduced "
                                "index, folded in order in shared memory; one phase"),
    ReductionEmitter("partial", "two phases: chunks of rows into scratch, then one warp per row folds them"),
    ReductionEmitter("row", "row-persistent: one warp (or, for a few long rows, the block) per row, several "
                            "reductions and the row's pointwise outputs in one work item, the row in registers"),
)


def _reduction_strategy(rows: int, size: int, rows_contiguous: bool, threads: int, blocks: int) -> tuple[str, str]:
    warps_total = blocks * threads // 32
    if rows_contiguous and rows >= 32:
        if rows >= blocks * threads // 8 or size <= 64:
            return "thread", "rows adjacent in memory: one thread per row reads coalesced"
        if ceil_div(rows, 32) >= blocks // 2:
            return "columns", (f"rows adjacent in memory: 32 rows per work item ({ceil_div(rows, 32)} items fill the "
                               f"grid), the warps split the {size} elements; one phase, no final stage")
        return "partial", "rows adjacent in memory but few: 32 rows x a chunk of each per work item"
    if size <= 32:
        return "thread", f"only {size} elements per row: a serial loop per thread"
    if rows >= warps_total or size <= 8 * 32 or (size <= 2048 and rows >= blocks):
        return "warp", f"{rows} rows of {size}: one warp per row"
    if size <= 2048:  # one warp would walk the row alone (64 dependent loads per lane for 2048)
        return "block", f"{rows} rows of {size}, fewer than the {blocks} blocks: one block per row"
    if rows >= blocks:
        return "block", f"{rows} long rows ({size}): one block per row"
    return "partial", f"{rows} rows of {size} cannot fill {blocks} blocks: two-phase grid reduction"


def choose_reduction(p: ReductionProblem, threads: int, blocks: int = SM_COUNT) -> ReductionPlan:
    """The strategy for a ``rows x size`` reduction and why (``parts`` set for two phases)."""
    strategy, why = _reduction_strategy(p.rows, max(p.size, 1), p.rows_contiguous, threads, blocks)
    if strategy == "partial" and p.integer:  # partials are floats: keep integers exact
        strategy, why = ("block", f"{why}; an integer reduction stays in one phase (exact long long accumulators)")
    if strategy == "columns" and p.integer:  # its fold is in float: keep integers exact
        strategy, why = ("thread", f"{why}; an integer reduction takes one thread per row (exact long long)")
    parts = None
    if strategy == "partial":
        per = -(-p.rows // 32) if p.rows_contiguous else p.rows
        parts = max(1, min(p.size, max(2, -(-blocks * 2 // max(per, 1)))))
    return ReductionPlan(strategy, why, p.rows, p.size, p.rows_contiguous, parts)


def reduction_emitter(name: str) -> ReductionEmitter:
    for e in REDUCTION_EMITTERS:
        if e.name == name:
            return e
    raise KeyError(f"no reduction emitter {name!r}")


def pointwise_cost(numel: int, ops: int, reads: int, threads: int, store_bytes: int, per_thread: int = 1) -> Cost:
    """Work items (``per_thread`` points per thread), FLOPs and bytes of a pointwise loop."""
    return Cost(max(1, math.ceil(numel / (threads * max(per_thread, 1)))), numel * max(1, ops),
                store_bytes + numel * 4 * max(1, reads))
