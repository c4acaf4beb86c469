"""Fusion steps of the scheduler: epilogues, inlining, loop fusion and row fusion.

Each step works on the scheduler's :class:`~tkx.schedule.work.Work` and records every candidate it
judges (a :class:`~tkx.schedule.model.FusionDecision`, asked of the fusion rules of
:mod:`tkx.schedule.rules`):

1. :func:`grow_epilogues`: each GEMM and reduction grows a chain of same-shaped pointwise consumers it
   applies in registers (the value read through an identity view, single consumer);
2. :func:`decide_inlining`: every other pointwise/generator/index op is inlined into all of its
   consumers (recomputed where read) or materialised;
3. :func:`fuse_loops`: materialised ops become fusion domains; same-shaped pointwise ops that read a
   domain's value through an identity view join it (multi-output loops, side outputs);
4. :func:`fuse_rows`: row-persistent multi-reduction groups (softmax, cross-entropy, layer norm in one
   pass, :mod:`tkx.schedule.rows`).

The graph walks they share follow below the steps.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .. import ops
from ..ir import Op
from .rules import fuse, keep, sibling_gemm
from .work import Work, is_identity, root_of, rows_contiguous


def grow_epilogues(w: Work) -> None:
    """Step 1: each GEMM and reduction anchors a domain and grows its epilogue; a fused attention
    composite stands alone."""
    for op in w.graph.program.ops:
        if op.family in ("attention", "matmul", "reduction"):
            w.domains[op.id] = [op.id]
            w.domain_of[op.id] = op.id
            w.cost[op.id] = 1
            if op.family != "attention":
                _grow_epilogue(w, op)


def decide_inlining(w: Work) -> None:
    """Step 2: inline each remaining pointwise/generator/index op into all of its consumers, or not;
    then un-inline, until none is left, the ops that would read a value of their group at other
    coordinates."""
    _choose_inlined(w)
    for _ in range(len(w.graph.program.ops)):
        if not _fix_register_reads(w):
            break


def fuse_loops(w: Work) -> None:
    """Step 3: every materialised op not yet in a domain joins the first earlier domain it reads whose
    loop it can share (legal, and the rules agree), in program order, or anchors a domain of its own.
    Dead ops (nothing reads them, not a sink) are left out (the dce pass removes them)."""
    g = w.graph
    for op in g.program.ops:
        if op.id in w.domain_of or op.id in w.inlined:
            continue
        if not g.users.get(op.id) and op.id not in g.sink_buffers:
            continue
        joined = False
        reached = reads_through_inlined(w, op)
        for anchor in sorted({w.domain_of[b] for b in reached if b in w.domain_of}, key=g.pos.__getitem__):
            producer = next(b for b in reached if w.domain_of.get(b) == anchor)
            reason = can_join(w, anchor, op)
            if reason is not None:
                w.record("loop", producer, op.id, "legality", keep("illegal", reason))
                continue
            if w.ask("loop", g.ops[producer], op, None):
                w.domains[anchor].append(op.id)
                w.domain_of[op.id] = anchor
                joined = True
                break
        if not joined:
            w.domains[op.id] = [op.id]
            w.domain_of[op.id] = op.id


def fuse_rows(w: Work) -> dict[str, Any]:
    """Step 3b: row-persistent multi-reduction fusion; returns {anchor: row group} of the groups that
    joined reductions. (``Options.fuse_rows=False`` is a rule: the candidates are still recorded, as not
    fused.)"""
    from .rows import RowFusion

    helpers = SimpleNamespace(is_identity=is_identity, memory_deps=memory_deps, would_cycle=would_cycle,
                              group_reads=group_reads, rows_contiguous=rows_contiguous)
    return RowFusion(w, helpers).run()


def _grow_epilogue(w: Work, anchor: Op) -> None:
    """Extend ``anchor``'s domain with single-consumer same-shaped pointwise ops (step 1)."""
    g = w.graph
    current = anchor
    while current.id not in g.sink_buffers:
        users = g.users.get(current.id, [])
        consumers = g.consumer_ops(current.id)
        if len(consumers) != 1:
            break
        nxt = consumers[0]
        view = users[0][1]
        if nxt.family != "pointwise" or nxt.id in w.domain_of:
            break
        if any(x.buffer == current.id and x is not view and x != view for x in nxt.tensor_inputs):
            break
        reason = can_join(w, anchor.id, nxt)
        if reason is not None:
            w.record("epilogue", current.id, nxt.id, "legality", keep("illegal", reason))
            break
        if not w.ask("epilogue", current, nxt, view):
            last = w.decisions[-1]
            if last.code == "sibling-gemms" and not last.fused:
                found = sibling_gemm(g.program, current, nxt)
                if found is not None:
                    _plan_short_operand(w, nxt, found[1])
            break
        w.domains[anchor.id].append(nxt.id)
        w.domain_of[nxt.id] = anchor.id
        current = nxt


def _plan_short_operand(w: Work, nxt: Op, gemv: str) -> None:
    """``nxt`` (kept out of a GEMM's epilogue by rule ``sibling-gemms``) is computed in the short-operand load of
    ``gemv``: each warp of the GEMV reads the short operand again, so only cheap ops may be recomputed there.
    An operand of ``nxt`` whose chain holds a transcendental op (SwiGLU's sigmoid) is materialised instead:
    stored once, by the loop of the GEMM it reads (:func:`fuse_loops`)."""
    g = w.graph
    w.short_operand[nxt.id] = gemv
    for x in nxt.tensor_inputs:
        b = x.buffer
        if b not in g.ops or b in w.domain_of or g.ops[b].family != "pointwise":
            continue
        stack, seen = [b], set()
        while stack:
            c = stack.pop()
            if c in seen or c not in g.ops or c in w.domain_of:
                continue
            seen.add(c)
            op = g.ops[c]
            if op.family != "pointwise":
                continue
            if ops.row(op.kind).transcendental:
                w.materialize.add(b)
                break
            stack.extend(y.buffer for y in op.tensor_inputs)


def _choose_inlined(w: Work) -> None:
    """Inline each remaining pointwise/generator/index op into all consumers, or not (step 2)."""
    g = w.graph
    for op in g.program.ops:
        if op.id in w.domain_of or op.family not in ("pointwise", "generator", "index"):
            continue
        w.cost[op.id] = _inline_cost(w, op)
        consumers = g.users.get(op.id, [])
        if op.id in w.materialize:
            for c, _ in consumers[:1]:
                w.record("inline", op.id, c.id, "sibling-gemms", keep(
                    "short-operand-source", f"not fused: {op.kind} would be recomputed by every warp of a GEMV's "
                                            "short-operand load (a transcendental chain), so it is stored once, "
                                            "by the loop of the GEMM it reads"))
            continue
        if op.id in w.short_operand:
            w.inlined.add(op.id)
            w.record("inline", op.id, w.short_operand[op.id], "sibling-gemms", fuse(
                "gemv-short-operand", f"fused: the GEMV {w.short_operand[op.id]} computes {op.kind} in the load of its "
                                      "short operand, so the two GEMMs it reads share one stage"))
            continue
        if op.kind == "scatter":  # materialised: its value at a point would search the whole index list
            for c, _ in consumers[:1]:
                w.record("inline", op.id, c.id, "legality",
                         keep("scatter-stored", "not fused: a scatter is written into memory once (only its "
                                                "indexed slice when it updates an input in place), never "
                                                "recomputed where it is read"))
            continue
        if op.id in g.sink_buffers:
            for c, _ in consumers[:1]:
                w.record("inline", op.id, c.id, "returned-value",
                         keep("returned", "not fused: the value is returned or written back by the step, "
                                          "so it is stored"))
            continue
        if not consumers:
            continue
        verdicts = [w.ask("inline", op, c, v) for c, v in {c.id: (c, v) for c, v in consumers}.values()]
        if all(verdicts):
            w.inlined.add(op.id)


def _fix_register_reads(w: Work) -> bool:
    """Un-inline ops that would read a domain value of their group at other coordinates.

    Inside a group, a domain value exists only in registers at the point being computed;
    an inlined producer reached through a non-identity view would need it elsewhere.
    """
    g = w.graph
    bad: set[str] = set()
    for anchor, members in w.domains.items():
        mset = set(members)
        at_point = members[1:] if g.ops[anchor].family != "pointwise" else members
        for m in at_point:
            stack = [(x, reads_at_point(g.ops[m])) for x in g.ops[m].tensor_inputs]
            while stack:
                x, ident = stack.pop()
                here = ident and is_identity(x, root_of(g, x))
                if x.buffer in w.inlined:
                    producer = g.ops[x.buffer]
                    inner_here = here and reads_at_point(producer)
                    for y in producer.tensor_inputs:
                        if y.buffer in mset and not (inner_here and is_identity(y, root_of(g, y))):
                            bad.add(producer.id)
                        stack.append((y, inner_here))
    for b in sorted(bad):
        w.inlined.discard(b)
        w.record("inline", b, "-", "legality",
                 keep("register-view", "not fused: it reads a value of the same group at other "
                                       "coordinates than the group is computing"))
    return bool(bad)


def _inline_cost(w: Work, op: Op) -> int:
    """How many ops an inlined ``op`` recomputes where it is read (itself and its inlined producers)."""
    return 1 + sum(w.cost.get(x.buffer, 0) for x in op.tensor_inputs if x.buffer in w.inlined)


def memory_deps(w: Work, op: Op, group_ops: set[str]) -> set[str]:
    """Materialised ops ``op`` reads (through inlined producers), excluding ``group_ops``."""
    out: set[str] = set()
    stack = [x.buffer for x in op.tensor_inputs]
    seen: set[str] = set()
    while stack:
        b = stack.pop()
        if b in seen or b not in w.graph.ops:
            continue
        seen.add(b)
        if b in w.inlined:
            stack.extend(x.buffer for x in w.graph.ops[b].tensor_inputs)
        elif b not in group_ops:
            out.add(b)
    return out


def member_reads(w: Work, op: Op, members: set[str]) -> list[tuple[str, bool]]:
    """(member buffer, read at the same linear index?) for every read of a group member by
    ``op``, following inlined producers (each evaluated where its reader's view points)."""
    g = w.graph
    found: list[tuple[str, bool]] = []
    stack = [(x, reads_at_point(op)) for x in op.tensor_inputs]
    while stack:
        x, ident = stack.pop()
        here = ident and is_identity(x, root_of(g, x))
        if x.buffer in members:
            found.append((x.buffer, here))
        elif x.buffer in w.inlined:
            inner = g.ops[x.buffer]
            stack.extend((y, here and reads_at_point(inner)) for y in inner.tensor_inputs)
    return found


def reads_at_point(op: Op) -> bool:
    """Does ``op`` read its operands at the point it computes? (Not an index op: the op table says.)"""
    return ops.row(op.kind).reads_at_point


def can_join(w: Work, anchor: str, op: Op) -> str | None:
    """Legality of adding ``op`` to the domain of ``anchor``'s group; None when legal."""
    g = w.graph
    anchor_op = g.ops[anchor]
    if op.family != "pointwise":
        return "not pointwise"
    if anchor_op.kind == "scatter":
        return "not fused: a scatter's loop may cover only the written slice (an in-place update)"
    if op.out.numel != anchor_op.out.numel:
        return "not fused: the consumer has a different number of elements"
    members = set(w.domains[anchor])
    reads = member_reads(w, op, members)
    if not reads:
        return "not fused: it does not read the group"
    if not all(ident for _, ident in reads):
        return "not fused: the value is read through a view (transposed, broadcast or sliced)"
    for dep in memory_deps(w, op, members):
        if any(g.depends(dep, m) for m in members):
            return "not fused: another operand is computed after this group"
    if would_cycle(w, members | {op.id}):
        return "not fused: the two groups would each wait for the other's values"
    return None


def would_cycle(w: Work, members: set[str]) -> bool:
    """Would a group made of ``members`` (transitively) read one of its own values from memory?"""
    stack = list(group_reads(w, list(members))[0])
    seen: set[str] = set()
    while stack:
        b = stack.pop()
        if b in members:
            return True
        anchor = w.domain_of.get(b)
        if anchor is None or anchor in seen:
            continue
        seen.add(anchor)
        stack.extend(r for r in group_reads(w, w.domains[anchor])[0])
    return False


def reads_through_inlined(w: Work, op: Op) -> list[str]:
    """Materialised ops read by ``op`` directly or through inlined producers, in order."""
    seen: dict[str, None] = {}
    stack = [x.buffer for x in op.tensor_inputs]
    while stack:
        b = stack.pop(0)
        if b in w.inlined:
            stack.extend(x.buffer for x in w.graph.ops[b].tensor_inputs)
        elif b in w.graph.ops:
            seen.setdefault(b, None)
    return list(seen)


def group_reads(w: Work, members: list[str], walk: list[str] | None = None
                 ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(buffers read from memory, ops inlined) for a group with domain ``members``,
    following the operands of ``walk`` (default: all members)."""
    g = w.graph
    mset = set(members)
    reads: dict[str, None] = {}
    inl: dict[str, None] = {}
    stack = [x.buffer for m in (members if walk is None else walk) for x in g.ops[m].tensor_inputs]
    while stack:
        b = stack.pop(0)
        if b in mset:
            continue
        if b in w.inlined:
            if b not in inl:
                inl[b] = None
                stack.extend(x.buffer for x in g.ops[b].tensor_inputs)
        else:
            reads[b] = None
    order = {op.id: i for i, op in enumerate(g.program.ops)}
    return tuple(reads), tuple(sorted(inl, key=order.__getitem__))
