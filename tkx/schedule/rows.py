"""Row-persistent multi-reduction fusion: softmax, log-softmax, cross-entropy, layer norm as ONE group.

Softmax over a row is ``m = max(x)``, ``s = sum(exp(x - m))``, ``y = exp(x - m) / s``: two reductions
and a pointwise pass that reads both results *broadcast over the row*. Scheduled one reduction per
group, that is three stages and two barriers; each stage re-reads the row from memory. When the row
fits in registers, one warp can do all of it in one work item: pass 1 loads the row (each lane
``ceil(size / 32)`` elements, kept in registers) and reduces it; pass 2 reduces a function of the
row and of pass 1's result (a register, read wherever a consumer broadcasts it); ...; a last pass
computes and stores the full-row values (the normalised output).

This step (step 3b of :func:`tkx.schedule.schedule`) merges, in program order,

* a **reduction** with the same row structure (input shape and reduced dims) that reads a row
  group's values, and
* a **pointwise group** of the row's shape (the "tail": normalise, layer norm's output)

into the row group of the first reduction, when the merged group reads its own values only

* at the point it computes (a full-row value read through an identity view), or
* as a row value broadcast over the reduced dims (``bcast(%amax -> 64x10)``), or, for row-shaped
  ops (a reduction's epilogue such as ``log``), at the row itself,

and no other operand of the joining ops is computed after the group (that would be a cycle).
Every join is a :class:`~tkx.schedule.model.FusionDecision` of kind ``"row"``, judged by the
fusion rules (``Options(fuse_rows=False)`` turns it off; rows longer than
:data:`MAX_ROW` elements stay apart, rule ``row-fits``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .. import ops as optable
from ..dtypes import INT_DTYPES
from ..ir import Op, TensorSpec, contiguous_strides
from .rowshape import MAX_ROW, ROW_PER_LANE, is_row_broadcast, row_key

__all__ = ["MAX_ROW", "ROW_PER_LANE", "RowFusion", "RowGroup", "is_row_broadcast", "member_kind", "row_key"]

FULL, ROW, OTHER = "full", "row", "other"


@dataclass
class RowGroup:
    """A row group under construction: the anchor (first reduction), the row shape ``shape``
    (the reductions' input shape), reduced ``dims``, and the reductions in order."""

    anchor: str
    shape: tuple[int, ...]
    dims: tuple[int, ...]
    reductions: list[str] = field(default_factory=list)
    joined: int = 0

    @property
    def rows(self) -> int:
        return math.prod(self.shape) // self.size

    @property
    def size(self) -> int:
        return math.prod(self.shape[d] for d in self.dims)


class RowFusion:
    """Step 3b of the scheduler on its scratchpad ``w`` (see the module docstring)."""

    def __init__(self, w: Any, helpers: Any) -> None:
        """``w``: the scheduler's scratchpad; ``helpers``: its graph walks (``is_identity``, ``memory_deps``,
        ``would_cycle``, ``group_reads``, ``rows_contiguous``; passed in so this module imports none of the
        scheduler)."""
        self.w = w
        self.h = helpers
        self.g = w.graph
        self.groups: dict[str, RowGroup] = {}  # anchor -> row group
        self.home: dict[str, str] = {}  # member op -> row group anchor

    # -- shapes --------------------------------------------------------------------------
    def _kind(self, rg: RowGroup, op: Op) -> str | None:
        """``full`` (the row's shape), ``row`` (one value per row) or None."""
        if tuple(op.out.shape) == rg.shape:
            return FULL
        if op.out.numel == rg.rows and op.out.is_dense and op.out.strides == contiguous_strides(op.out.shape):
            return ROW
        return None

    def _walk(self, rg: RowGroup, start: list[tuple[Any, str]], members: set[str]) -> str | None:
        """Why the operands ``start`` (each with the point it is read at) cannot be evaluated inside
        the row group with ``members`` in registers; None when they can. Also True-ish: whether any
        member is read at all is returned by :meth:`_reads`."""
        ops = self.g.ops
        stack = list(start)
        while stack:
            x, at = stack.pop()
            if not isinstance(x, TensorSpec):
                continue
            if x.buffer in members:
                m = ops[x.buffer]
                k = self._kind(rg, m)
                ok = (at == FULL and k == FULL and tuple(x.shape) == rg.shape and self.h.is_identity(x, m.out)) or \
                     (at == FULL and k == ROW and is_row_broadcast(x, m.out, rg.shape, rg.dims)) or \
                     (at == ROW and k == ROW and self.h.is_identity(x, m.out))
                if not ok:
                    return (f"not fused: {x.buffer} would be read at other coordinates than the row pass "
                            f"computes")
            elif x.buffer in self.w.inlined:
                inner = ops[x.buffer]
                point = optable.row(inner.kind).reads_at_point
                if not point:
                    nxt = OTHER
                elif at == FULL and tuple(x.shape) == rg.shape and tuple(inner.out.shape) == rg.shape \
                        and self.h.is_identity(x, inner.out):
                    nxt = FULL
                elif at == FULL and self._kind(rg, inner) == ROW and is_row_broadcast(x, inner.out, rg.shape,
                                                                                       rg.dims):
                    nxt = ROW
                elif at == ROW and self.h.is_identity(x, inner.out):
                    nxt = ROW
                else:
                    nxt = OTHER
                stack.extend((y, nxt) for y in inner.tensor_inputs)
        return None

    def _reads(self, op: Op, members: set[str]) -> bool:
        """Does ``op`` read a member (directly or through inlined producers)?"""
        stack = [x.buffer for x in op.tensor_inputs]
        seen: set[str] = set()
        while stack:
            b = stack.pop()
            if b in seen:
                continue
            seen.add(b)
            if b in members:
                return True
            if b in self.w.inlined:
                stack.extend(x.buffer for x in self.g.ops[b].tensor_inputs)
        return False

    def _legal(self, rg: RowGroup, domain: list[str]) -> str | None:
        """Why the domain (a reduction's or a pointwise group's ops) cannot join ``rg``; None if it can."""
        ops = self.g.ops
        members = set(self.w.domains[rg.anchor])
        both = members | set(domain)
        for m in domain:
            op = ops[m]
            if op.family == "reduction":
                if row_key(op) != (rg.shape, rg.dims):
                    return "not fused: the reduction runs over other rows than the row group"
                start = [(op.inputs[0], FULL)]
            else:
                k = self._kind(rg, op)
                if k is None:
                    return "not fused: it is neither one value per row nor of the row's shape"
                start = [(x, k if optable.row(op.kind).reads_at_point else OTHER) for x in op.tensor_inputs]
            why = self._walk(rg, start, both)
            if why is not None:
                return why
        for m in domain:
            for dep in self.h.memory_deps(self.w, ops[m], both):
                if any(self.g.depends(dep, x) for x in members):
                    return "not fused: another operand is computed after the row group"
        if self.h.would_cycle(self.w, both):
            return "not fused: the two groups would each wait for the other's values"
        return None

    def _eligible(self, op: Op) -> str | None:
        """Why reduction ``op`` cannot start a row group (None when it can)."""
        key = row_key(op)
        if key is None:
            return "no reduced dims"
        if op.out.dtype in INT_DTYPES:
            return "an integer reduction"
        x = op.inputs[0]
        if self.h.rows_contiguous(x, key[1]):
            return "rows adjacent in memory (a reduction over a leading dim)"
        return None

    # -- stages ------------------------------------------------------------------------
    def _level(self, members: list[str], skip: set[str]) -> int:
        """The stage a group made of ``members`` would get at the earliest: one after the latest
        group it reads from memory (longest path over the current domains; ``skip``: their anchors)."""
        w = self.w
        memo: dict[str, int] = {}

        def lev(anchor: str, depth: int = 0) -> int:
            if anchor not in memo:
                memo[anchor] = 0
                if depth < len(w.domains) + 1:
                    reads = self.h.group_reads(w, w.domains[anchor])[0]
                    deps = {w.domain_of[b] for b in reads if b in w.domain_of and w.domain_of[b] != anchor}
                    memo[anchor] = 1 + max((lev(d, depth + 1) for d in deps), default=-1)
            return memo[anchor]

        reads = self.h.group_reads(w, members)[0]
        deps = {w.domain_of[b] for b in reads if b in w.domain_of and w.domain_of[b] not in skip}
        return 1 + max((lev(d) for d in deps), default=-1)

    # -- the sweep -----------------------------------------------------------------------
    def run(self) -> dict[str, RowGroup]:
        """Merge domains of ``w`` in program order; returns the row groups (anchor -> RowGroup) that
        received at least one join.

        A domain that reads a row group's values joins it, and so does a *sibling* reduction over
        the same rows that reads none (cross-entropy's backward ``sum`` next to its forward ones), as
        long as the merged group needs nothing computed later than the row group already does (a join
        never makes the row group wait a stage longer)."""
        w, g = self.w, self.g
        for op in g.program.ops:
            if w.domain_of.get(op.id) != op.id:
                continue  # not a group anchor (a member of another domain, inlined or an input)
            domain = list(w.domains[op.id])
            if op.family not in ("reduction", "pointwise"):
                continue
            joined = False
            for anchor in sorted({self.home[m] for m in self.home}, key=g.pos.__getitem__):
                rg = self.groups[anchor]
                members = set(w.domains[anchor])
                reads = any(self._reads(g.ops[m], members) for m in domain)
                same_rows = op.family == "reduction" and row_key(op) == (rg.shape, rg.dims) \
                    and op.out.dtype not in INT_DTYPES
                if not reads and not same_rows:
                    continue
                if not same_rows and (op.family == "reduction" or self._kind(rg, op) is None):
                    continue  # other rows, or another shape: not a candidate
                producer = next((m for m in reversed(w.domains[anchor]) if any(
                    self._reads(g.ops[d], {m}) for d in domain)), rg.reductions[-1])
                why = self._legal(rg, domain)
                if why is None:
                    before = self._level(w.domains[anchor], {anchor})
                    after = self._level(w.domains[anchor] + domain, {anchor, op.id})
                    if after > before:
                        why = (f"not fused: it reads a value computed later than the row group's inputs, "
                               f"so the row group would wait {after - before} stage(s) longer")
                if why is not None:
                    if reads:
                        w.record("row", producer, op.id, "legality", _keep("illegal", why))
                    continue
                if not w.ask("row", g.ops[producer], op, None):
                    continue
                self._merge(rg, op.id, domain)
                joined = True
                break
            if not joined and op.family == "reduction" and self._eligible(op) is None:
                shape, dims = row_key(op)  # type: ignore[misc]
                self.groups[op.id] = RowGroup(op.id, shape, dims, [op.id])
                for m in domain:
                    self.home[m] = op.id
        return {a: rg for a, rg in self.groups.items() if rg.joined}

    def _merge(self, rg: RowGroup, anchor: str, domain: list[str]) -> None:
        w, g = self.w, self.g
        del w.domains[anchor]
        w.domains[rg.anchor] = sorted(w.domains[rg.anchor] + domain, key=g.pos.__getitem__)
        for m in domain:
            w.domain_of[m] = rg.anchor
            self.home[m] = rg.anchor
        rg.reductions.extend(m for m in domain if g.ops[m].family == "reduction")
        rg.joined += 1


def _keep(code: str, reason: str):
    from .rules import keep
    return keep(code, reason)


def member_kind(op: Op, shape: tuple[int, ...], rows: int) -> str:
    """``reduction``, ``full`` or ``row``: what a member of a row group is (codegen and views)."""
    if op.family == "reduction":
        return "reduction"
    return FULL if tuple(op.out.shape) == tuple(shape) else ROW
