"""Reduction emitters: C code for ONE work item of ``out[row] = reduce_r x[row, r]``.

A reduction is seen as a ``rows x size`` problem: ``element(row, r)`` is a callback that gets
the names of two C ``int`` variables and returns the element as a float C expression (any
view: the reduced dims flattened into ``r``, the kept dims into ``row``, even a pointwise
producer computed on the fly). ``finish(row, value)`` returns C statements that consume the
reduced value (already divided by ``size`` for ``mean``): round, apply an epilogue, store.

Like the GEMM emitters, each returns a :class:`ReduceCode` whose ``code`` handles the work
item in the C variable ``item``; the caller runs it in a grid-stride loop
(:func:`tkx.codegen.gemm.work_loop`). The kinds are ``sum``, ``mean``, ``amax``, ``amin``
(the last two propagate NaN like ``torch.amax``).

Strategies (:func:`choose_strategy` picks one and says why):

=============== =========================================================================
``thread``      one thread per row, a serial loop over r. Best when ``size`` is small or
                when consecutive *rows* are adjacent in memory (a reduction over dim 0,
                e.g. a bias gradient): a warp then reads 32 adjacent elements per step.
``warp``        one warp per row, lanes take every 32nd r, shuffle reduction.
``block``       one block per row, threads take every ``threads``-th r, block reduction.
``columns``     rows adjacent in memory (a reduction over a leading dim) and enough of them to
                fill the grid: 32 rows per work item, lane = row, the warps split r, their
                results folded in order through shared memory; one phase, no scratch.
``partial``     phase one of a grid-wide reduction: work item (row, chunk) reduces one
                chunk of a row into a float scratch slot ``scratch[row * chunks + chunk]``;
``final``       phase two, after a barrier: one warp per row folds the row's partials, or
                one thread per row when a row has at most :data:`THREAD_FINAL_CHUNKS`.
=============== =========================================================================

Names the emitted block defines (callbacks must not use them for their own variables):
``row r acc elem value lane warp chunk group r_begin r_end part w``.

The order in which elements are added is fixed by the strategy (no atomics), so a kernel
gives the same bits on every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import ops as table
from ..dtypes import literal
from ..target import THREAD_FINAL_CHUNKS, ceil_div
from .text import block, indent

Element = Callable[[str, str], str]  # (row, r) -> float C expression
Finish = Callable[[str, str], str]  # (row, value) -> C statements

KINDS = tuple(sorted(table.REDUCTIONS))
STRATEGIES = ("thread", "warp", "block", "columns", "partial", "final")


def _row(kind: str) -> table.Reduction:
    r = table.row(kind).reduction
    if r is None:
        raise ValueError(f"{kind!r} is not a reduction; one of {KINDS}")
    return r


def _identity(kind: str, ctype: str) -> str:
    return _row(kind).identity["int" if ctype == "long long" else "float"]


@dataclass(frozen=True)
class ReduceCode:
    """One reduction work item's code: ``work_items`` items, ``shared_bytes`` of workspace."""

    strategy: str
    kind: str
    code: str
    work_items: int
    shared_bytes: int
    threads: int
    params: dict

    def __str__(self) -> str:
        return self.code



def _check(kind: str, rows: int, size: int, threads: int) -> None:
    _row(kind)
    if rows < 1 or size < 1:
        raise ValueError(f"reduction of {rows} rows x {size} elements: both must be >= 1")
    if threads % 32:
        raise ValueError("threads must be a multiple of 32")


def _fold(kind: str, acc: str, x: str) -> str:
    return _row(kind).fold.format(acc=acc, x=x)


def _result(kind: str, acc: str, size: int) -> str:
    """The reduced value: the accumulator, divided by ``size`` for a mean."""
    return f"{acc} / {literal(size)}" if _row(kind).divide else acc


def _index(limit: int) -> str:
    """The C type of a loop index that may reach ``limit`` (``int`` unless that overflows 32 bits:
    a strided loop steps past the end before it stops, so near 2**31 elements ``int`` wraps)."""
    return "long long" if limit >= 2**31 - 1 else "int"


def _finish_block(kind: str, acc: str, size: int, finish: Finish, ctype: str = "float") -> str:
    return block(f"const {ctype} value = {_result(kind, acc, size)};", finish("row", "value"))


def _wrap(comment: str, body: str) -> str:
    return "{\n" + indent(block(f"// {comment}", body)) + "\n}"


def thread_per_row(kind: str, rows: int, size: int, element: Element, finish: Finish, *, threads: int = 256,
                 item: str = "item", ctype: str = "float") -> ReduceCode:
    """One thread per row; a work item is ``threads`` consecutive rows."""
    _check(kind, rows, size, threads)
    body = block(
        f"const int row = {item} * {threads} + threadIdx.x;",
        f"if (row < {rows}) {{",
        f"    {ctype} acc = {_identity(kind, ctype)};",
        f"    for (int r = 0; r < {size}; ++r) {{",
        f"        const {ctype} elem = {element('row', 'r')};",
        f"        {_fold(kind, 'acc', 'elem')}",
        "    }",
        indent(_finish_block(kind, "acc", size, finish, ctype)),
        "}",
    )
    code = _wrap(f"{kind} over {size} elements of each of {rows} rows: one thread per row", body)
    return ReduceCode("thread", kind, code, ceil_div(rows, threads), 0, threads, {"rows_per_item": threads})


def _strided_fold(kind: str, size: int, first: str, step: int, element: Element, ctype: str) -> str:
    """``acc`` = the fold of ``element(row, r)`` over ``r = first, first + step, ... < size`` (this thread's
    share of the row)."""
    return block(
        f"{ctype} acc = {_identity(kind, ctype)};",
        f"for ({_index(size + step)} r = {first}; r < {size}; r += {step}) {{",
        f"    const {ctype} elem = {element('row', 'r')};",
        f"    {_fold(kind, 'acc', 'elem')}",
        "}")


def warp_per_row(kind: str, rows: int, size: int, element: Element, finish: Finish, *, threads: int = 256,
                 item: str = "item", ctype: str = "float") -> ReduceCode:
    """One warp per row, lanes stride over r, a shuffle reduction; a work item is one row per warp."""
    _check(kind, rows, size, threads)
    warps = threads // 32
    body = block(
        "const int lane = threadIdx.x % 32;",
        f"const int row = {item} * {warps} + threadIdx.x / 32;",
        f"if (row < {rows}) {{  // the whole warp takes the same branch",
        indent(_strided_fold(kind, size, "lane", 32, element, ctype)),
        f"    acc = {_row(kind).warp}(acc);",
        "    if (lane == 0) {",
        indent(_finish_block(kind, "acc", size, finish, ctype), 2),
        "    }",
        "}",
    )
    code = _wrap(f"{kind} over {size} elements of each of {rows} rows: one warp per row", body)
    return ReduceCode("warp", kind, code, ceil_div(rows, warps), 0, threads, {"rows_per_item": warps})


def block_per_row(kind: str, rows: int, size: int, element: Element, finish: Finish, *, threads: int = 256,
                 item: str = "item", ctype: str = "float") -> ReduceCode:
    """One block per row, threads stride over r, a block reduction; a work item is one row."""
    _check(kind, rows, size, threads)
    body = block(
        f"const int row = {item};",
        _strided_fold(kind, size, "threadIdx.x", threads, element, ctype),
        f"acc = {_row(kind).block}(acc);  // every thread gets the row's result",
        "if (threadIdx.x == 0) {",
        indent(_finish_block(kind, "acc", size, finish, ctype)),
        "}",
    )
    code = _wrap(f"{kind} over {size} elements of each of {rows} rows: one block per row", body)
    # tkx_block_reduce keeps its 32 partials in its own small static __shared__ array
    return ReduceCode("block", kind, code, rows, 0, threads, {"rows_per_item": 1})


def _fold_warps(kind: str, rows: int, warps: int, smem: str, what: str, consume: str) -> str:
    """After each warp reduced its share of r for the 32 rows of a work item (lane = row): the warps' ``acc``
    through shared memory (``part[warp * 32 + lane]``), folded by warp 0 in warp order, then ``consume``
    (statements reading ``acc``) for each row inside ``rows``."""
    return block(
        f"float* part = reinterpret_cast<float*>({smem});  // part[warp * 32 + lane]",
        "part[warp * 32 + lane] = acc;",
        "__syncthreads();",
        f"if (warp == 0 && row < {rows}) {{  // fold the warps' {what} in order",
        f"    acc = {_identity(kind, 'float')};",
        f"    for (int w = 0; w < {warps}; ++w) {{",
        "        const float elem = part[w * 32 + lane];",
        f"        {_fold(_row(kind).partial_kind, 'acc', 'elem')}",
        "    }",
        indent(consume),
        "}",
        "__syncthreads();  // part[] is read before the next work item reuses the workspace",
    )


def columns_per_item(kind: str, rows: int, size: int, element: Element, finish: Finish, *, threads: int = 256,
                     item: str = "item", ctype: str = "float", smem: str = "tkx_smem") -> ReduceCode:
    """Rows adjacent in memory: a work item is 32 consecutive rows (lane = row, so each warp reads 32
    adjacent elements per step), warp w takes r = w, w + warps, ... of every row, and warp 0 folds the
    warps' results in warp order (shared memory, ``threads * 4`` bytes) and finishes the rows. One phase:
    the layout of :func:`partial_reduce`'s ``rows_contiguous`` phase with the whole of r in one chunk, for
    when ``ceil(rows / 32)`` items fill the grid (medium's bias gradient: 4096 rows of 256 in 128 items,
    no final stage). Float accumulators only (``ctype`` must be ``float``)."""
    _check(kind, rows, size, threads)
    if ctype != "float":
        raise ValueError(f"columns_per_item folds float partials; an integer reduction ({ctype}) takes 'thread'")
    warps = threads // 32
    init = _identity(kind, "float")
    idx = _index(size + threads)
    body = block(
        "const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;",
        f"const int row = {item} * 32 + lane;  // lanes take adjacent rows: coalesced reads",
        f"float acc = {init};",
        f"if (row < {rows}) {{",
        "    #pragma unroll 8",
        f"    for ({idx} r = warp; r < {size}; r += {warps}) {{",
        f"        const float elem = {element('row', 'r')};",
        f"        {_fold(kind, 'acc', 'elem')}",
        "    }",
        "}",
        _fold_warps(kind, rows, warps, smem, "results", _finish_block(kind, "acc", size, finish)),
    )
    code = _wrap(f"{kind} over {size} elements of each of {rows} rows: 32 adjacent rows per work item, "
                 f"{warps} warps split r", body)
    return ReduceCode("columns", kind, code, ceil_div(rows, 32), threads * 4, threads, {"rows_per_item": 32})


def partial_reduce(kind: str, rows: int, size: int, chunks: int, element: Element, *, scratch: str,
                   threads: int = 256, item: str = "item", rows_contiguous: bool = False,
                   smem: str = "tkx_smem") -> ReduceCode:
    """Phase one of a grid reduction: reduce ``r`` in ``[chunk * L, (chunk + 1) * L)``
    (``L = ceil(size / chunks)``) of a row into ``scratch[row * chunks + chunk]``.

    ``scratch`` is a C expression of type ``float*`` (a scratch buffer of ``rows * chunks``
    floats). For ``mean`` the partials are sums; :func:`final_reduce` divides. Two layouts:

    * ``rows_contiguous=False`` (the reduced index is adjacent in memory): a work item is one
      (row, chunk); the block's threads stride over the chunk, then a block reduction.
    * ``rows_contiguous=True`` (rows adjacent, e.g. a reduction over dim 0): a work item is
      32 rows x one chunk; lane = row so each warp reads 32 adjacent elements, the warps
      split the chunk, and their partials are folded in order through shared memory.
    """
    _check(kind, rows, size, threads)
    if not 1 <= chunks <= size:
        raise ValueError(f"chunks must be in [1, size], got {chunks}")
    length = ceil_div(size, chunks)
    init = _identity(kind, "float")
    idx = _index(chunks * length + max(length, threads))
    if not rows_contiguous:
        body = block(
            f"const int row = {item} / {chunks}, chunk = {item} % {chunks};",
            f"const {idx} r_begin = ({idx})chunk * {length}, r_end = min(({idx}){size}, r_begin + {length});",
            f"float acc = {init};",
            f"for ({idx} r = r_begin + threadIdx.x; r < r_end; r += {threads}) {{",
            f"    const float elem = {element('row', 'r')};",
            f"    {_fold(kind, 'acc', 'elem')}",
            "}",
            f"acc = {_row(kind).block}(acc);",
            f"if (threadIdx.x == 0) {scratch}[row * {chunks} + chunk] = acc;",
        )
        code = _wrap(f"{kind}, phase 1 of 2: {length} elements of one of {rows} rows -> scratch", body)
        return ReduceCode("partial", kind, code, rows * chunks, 0, threads,
                          {"chunks": chunks, "chunk_length": length, "scratch_floats": rows * chunks,
                           "rows_contiguous": False})
    warps = threads // 32
    body = block(
        f"const int group = {item} / {chunks}, chunk = {item} % {chunks};",
        "const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;",
        "const int row = group * 32 + lane;  // lanes take adjacent rows: coalesced reads",
        f"const {idx} r_begin = ({idx})chunk * {length}, r_end = min(({idx}){size}, r_begin + {length});",
        f"float acc = {init};",
        f"if (row < {rows}) {{",
        f"    for ({idx} r = r_begin + warp; r < r_end; r += {warps}) {{",
        f"        const float elem = {element('row', 'r')};",
        f"        {_fold(kind, 'acc', 'elem')}",
        "    }",
        "}",
        _fold_warps(kind, rows, warps, smem, "partials", f"{scratch}[row * {chunks} + chunk] = acc;"),
    )
    code = _wrap(f"{kind}, phase 1 of 2: 32 rows x a chunk of {length} elements -> scratch", body)
    return ReduceCode("partial", kind, code, ceil_div(rows, 32) * chunks, warps * 32 * 4, threads,
                      {"chunks": chunks, "chunk_length": length, "scratch_floats": rows * chunks,
                       "rows_contiguous": True})


def final_reduce(kind: str, rows: int, size: int, chunks: int, finish: Finish, *, scratch: str,
                 threads: int = 256, item: str = "item") -> ReduceCode:
    """Phase two (after a barrier): the ``chunks`` partials of each row folded in chunk order, by one
    thread per row when ``chunks <= THREAD_FINAL_CHUNKS`` (a work item is ``threads`` rows), else by one
    warp per row (lanes take every 32nd partial, then a shuffle reduction; ``threads / 32`` rows per item)."""
    _check(kind, rows, size, threads)
    warps = threads // 32
    partial_kind = _row(kind).partial_kind
    if chunks <= THREAD_FINAL_CHUNKS:
        body = block(
            f"const int row = {item} * {threads} + threadIdx.x;",
            f"if (row < {rows}) {{",
            f"    float acc = {_identity(kind, 'float')};",
            "    #pragma unroll",
            f"    for (int chunk = 0; chunk < {chunks}; ++chunk) {{  // in chunk order",
            f"        const float elem = {scratch}[row * {chunks} + chunk];",
            f"        {_fold(partial_kind, 'acc', 'elem')}",
            "    }",
            indent(_finish_block(kind, "acc", size, finish)),
            "}",
        )
        code = _wrap(f"{kind}, phase 2 of 2: fold the {chunks} partials of each of {rows} rows, one thread per row",
                     body)
        return ReduceCode("final", kind, code, ceil_div(rows, threads), 0, threads,
                          {"chunks": chunks, "rows_per_item": threads})
    body = block(
        "const int lane = threadIdx.x % 32;",
        f"const int row = {item} * {warps} + threadIdx.x / 32;",
        f"if (row < {rows}) {{  // the whole warp takes the same branch",
        f"    float acc = {_identity(kind, 'float')};",
        f"    for (int chunk = lane; chunk < {chunks}; chunk += 32) {{",
        f"        const float elem = {scratch}[row * {chunks} + chunk];",
        f"        {_fold(partial_kind, 'acc', 'elem')}",
        "    }",
        f"    acc = {_row(kind).warp}(acc);",
        "    if (lane == 0) {",
        indent(_finish_block(kind, "acc", size, finish), 2),
        "    }",
        "}",
    )
    code = _wrap(f"{kind}, phase 2 of 2: fold the {chunks} partials of each of {rows} rows", body)
    return ReduceCode("final", kind, code, ceil_div(rows, warps), 0, threads,
                      {"chunks": chunks, "rows_per_item": warps})


def choose_strategy(rows: int, size: int, *, rows_contiguous: bool = False, threads: int = 256,
                    blocks: int = 132) -> tuple[str, str]:
    """A strategy for a ``rows x size`` reduction and the reason (:func:`tkx.target.choose_reduction`).

    ``rows_contiguous``: consecutive rows are adjacent in memory (a reduction over a leading
    dim). ``blocks`` is the grid size the kernel expects. Two-phase (``partial``/``final``)
    is chosen when a single row is long and there are too few rows to fill the grid; it
    costs a barrier, which the scheduler accounts for.
    """
    from ..target import ReductionProblem, choose_reduction

    plan = choose_reduction(ReductionProblem(rows, size, rows_contiguous), threads, blocks)
    return plan.strategy, plan.why


def emit_reduction(strategy: str, kind: str, rows: int, size: int, element: Element, finish: Finish, *,
                   threads: int = 256, item: str = "item", ctype: str = "float") -> ReduceCode:
    """Dispatch to a one-phase strategy (``thread``, ``warp``, ``block`` or ``columns``)."""
    emitters = {"thread": thread_per_row, "warp": warp_per_row, "block": block_per_row, "columns": columns_per_item}
    if strategy not in emitters:
        raise ValueError(f"one-phase strategies are {sorted(emitters)}; use partial_reduce/final_reduce "
                         f"for a two-phase reduction, got {strategy!r}")
    return emitters[strategy](kind, rows, size, element, finish, threads=threads, item=item, ctype=ctype)


# -- row-persistent passes (tkx.schedule.rows): one warp per row, several reductions in turn ---------
def row_pass_open(kind: str, acc: str) -> str:
    """C statement: declare the float accumulator ``acc`` of a ``kind`` reduction at its identity."""
    return f"float {acc} = {_identity(kind, 'float')};"


def row_pass_fold(kind: str, acc: str, x: str) -> str:
    """C statement: fold element ``x`` into ``acc`` (each lane folds its own elements in order)."""
    return _fold(kind, acc, x)


def row_pass_close(kind: str, acc: str, size: int, *, whole_block: bool = False) -> tuple[str, str]:
    """(C statement, C expression): the warp's all-reduce of ``acc`` (every lane gets the row's result:
    a butterfly of ``__shfl_xor_sync``, the same order in every lane), or with ``whole_block`` the block's
    (each warp's butterfly, the warps' partials folded in shared memory by every warp), and the reduced
    value (divided by ``size`` for a mean)."""
    if whole_block:
        return f"{acc} = {_row(kind).block}({acc});  // every thread of the block gets the row's result", \
            _result(kind, acc, size)
    return f"{acc} = {_row(kind).warp}({acc});  // every lane of the warp gets the row's result", \
        _result(kind, acc, size)
