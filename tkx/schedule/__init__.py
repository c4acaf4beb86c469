"""The scheduler: fusion groups, stages, barriers, homes and the grid.

``schedule(program, options) -> FusedSchedule`` works in five steps, each recorded:

0. **Attention.** Each attention composite becomes one fused FlashAttention group or is
   expanded to its math (:mod:`tkx.schedule.attention`, ``Options.fuse_attention``).
1. **Epilogues.** Each GEMM and reduction grows a chain of same-shaped pointwise consumers
   it can apply in registers (the value read through an identity view, single consumer).
2. **Inlining.** Every other pointwise/generator op is either inlined into all of its
   consumers (recomputed where read) or materialised; each producer/consumer pair is a
   candidate judged by the fusion rules (:mod:`tkx.schedule.rules`).
3. **Groups.** Materialised ops become groups; same-shaped pointwise ops that read a
   group's value through an identity view join it (multi-output loops, side outputs).
4. **Stages and barriers** from read-after-write dependencies between groups; in-place
   state updates go straight into the user's tensor when every other read of the old value
   is in an earlier stage (write-after-read proven), otherwise through a staged commit.
5. **Mode and grid**: one block with ``__syncthreads`` or the whole grid with grid
   barriers, by a cost estimate that is recorded with its numbers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .. import ops
from ..dtypes import INT_DTYPES
from ..errors import TkxError
from ..ir import Op, Program, TensorSpec
from ..target import (
    ATTENTION_EMITTER,
    SM_COUNT,
    AttentionPlan,
    CopyPlan,
    Cost,
    GemmPlan,
    GemmProblem,
    PointwisePlan,
    ReductionPlan,
    ReductionProblem,
    choose_gemm,
    choose_reduction,
    decode_partials_layout,
    gemm_emitter,
    pointwise_cost,
    pointwise_per_thread,
    reduction_emitter,
    resolve_arch,
)
from .attention import prepare as _prepare_attention
from .model import (
    Barrier,
    CopyTask,
    FusedSchedule,
    FusionDecision,
    Group,
    Home,
)
from .rules import (
    BUILTIN_RULES,
    Candidate,
    FusionRule,
    Verdict,
    active_rules,
    fuse,
    fusion_rule,
    judge,
    keep,
    remove_fusion_rule,
    sibling_gemm,
)

__all__ = [
    "schedule", "FusedSchedule", "Group", "Home", "FusionDecision", "Barrier", "CopyTask",
    "FusionRule", "Candidate", "Verdict", "fuse", "keep", "fusion_rule", "remove_fusion_rule",
    "BUILTIN_RULES", "is_identity", "SM_COUNT",
]

def is_identity(view: TensorSpec, root: TensorSpec) -> bool:
    """True when element ``i`` of ``view`` (row-major) is element ``i`` of ``root``.

    That holds for the root itself and for dense reshapes of a dense root (``[1,128]`` read
    as ``[128]``): an elementwise loop over the linear index reads it in registers.
    """
    if view.numel != root.numel or view.offset != root.offset:
        return False
    if view.shape == root.shape and all(d == 1 or a == b for d, a, b in
                                        zip(view.shape, view.strides, root.strides)):
        return True
    return view.is_dense and root.is_dense


class _Graph:
    """Dependency facts about a program used by every scheduling step."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.ops = {op.id: op for op in program.ops}
        self.pos = {op.id: i for i, op in enumerate(program.ops)}
        self.users: dict[str, list[tuple[Op, TensorSpec]]] = {}
        for op in program.ops:
            for x in op.tensor_inputs:
                self.users.setdefault(x.buffer, []).append((op, x))
        self.sink_buffers = {v.buffer for v in program.sinks()}
        self.input_buffers = {i.value.buffer: k for k, i in enumerate(program.inputs)}
        anc: dict[str, int] = {}
        for op in program.ops:
            mask = 0
            for x in op.tensor_inputs:
                if x.buffer in self.pos:
                    mask |= anc[x.buffer] | (1 << self.pos[x.buffer])
            anc[op.id] = mask
        self.anc = anc

    def consumer_ops(self, buf: str) -> list[Op]:
        return list({op.id: op for op, _ in self.users.get(buf, [])}.values())

    def depends(self, a: str, b: str) -> bool:
        """Does op ``a`` (transitively) read op ``b``?"""
        return b in self.pos and bool(self.anc[a] >> self.pos[b] & 1)


@dataclass
class _Work:
    """Mutable scratchpad of the scheduler."""

    graph: _Graph
    options: Any
    rules: tuple[FusionRule, ...]
    decisions: list[FusionDecision] = field(default_factory=list)
    domain_of: dict[str, str] = field(default_factory=dict)     # op id -> group anchor id
    domains: dict[str, list[str]] = field(default_factory=dict)  # anchor id -> domain ops
    inlined: set[str] = field(default_factory=set)
    cost: dict[str, int] = field(default_factory=dict)
    #: pointwise op -> the skinny GEMM whose short operand it is, kept out of a GEMM's epilogue so that
    #: two sibling GEMMs share a stage (rule ``sibling-gemms``); inlined into that operand's load in step 2.
    short_operand: dict[str, str] = field(default_factory=dict)
    #: pointwise ops stored once rather than recomputed in such a short operand (:func:`_plan_short_operand`).
    materialize: set[str] = field(default_factory=set)

    def record(self, kind: str, producer: str, consumer: str, rule: str, v: Verdict) -> None:
        self.decisions.append(FusionDecision(kind, producer, consumer, v.fuse, rule, v.code, v.reason))

    def ask(self, kind: str, producer: Op, consumer: Op, view: TensorSpec | None) -> bool:
        c = Candidate(kind, producer, consumer, view, len(self.graph.consumer_ops(producer.id)),
                      self.cost.get(producer.id, 1), self.graph.program, self.options)
        rule, v = judge(c, self.rules)
        self.record(kind, producer.id, consumer.id, rule, v)
        return v.fuse


def _memory_deps(w: _Work, op: Op, group_ops: set[str]) -> set[str]:
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


def _member_reads(w: _Work, op: Op, members: set[str]) -> list[tuple[str, bool]]:
    """(member buffer, read at the same linear index?) for every read of a group member by
    ``op``, following inlined producers (each evaluated where its reader's view points)."""
    g = w.graph
    found: list[tuple[str, bool]] = []
    stack = [(x, _reads_at_point(op)) for x in op.tensor_inputs]
    while stack:
        x, ident = stack.pop()
        here = ident and is_identity(x, _root(g, x))
        if x.buffer in members:
            found.append((x.buffer, here))
        elif x.buffer in w.inlined:
            inner = g.ops[x.buffer]
            stack.extend((y, here and _reads_at_point(inner)) for y in inner.tensor_inputs)
    return found


def _reads_at_point(op: Op) -> bool:
    """Does ``op`` read its operands at the point it computes? (Not an index op: the op table says.)"""
    return ops.row(op.kind).reads_at_point


def _can_join(w: _Work, anchor: str, op: Op) -> str | None:
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
    reads = _member_reads(w, op, members)
    if not reads:
        return "not fused: it does not read the group"
    if not all(ident for _, ident in reads):
        return "not fused: the value is read through a view (transposed, broadcast or sliced)"
    for dep in _memory_deps(w, op, members):
        if any(g.depends(dep, m) for m in members):
            return "not fused: another operand is computed after this group"
    if _would_cycle(w, members | {op.id}):
        return "not fused: the two groups would each wait for the other's values"
    return None


def _would_cycle(w: _Work, members: set[str]) -> bool:
    """Would a group made of ``members`` (transitively) read one of its own values from memory?"""
    stack = list(_group_reads(w, list(members))[0])
    seen: set[str] = set()
    while stack:
        b = stack.pop()
        if b in members:
            return True
        anchor = w.domain_of.get(b)
        if anchor is None or anchor in seen:
            continue
        seen.add(anchor)
        stack.extend(r for r in _group_reads(w, w.domains[anchor])[0])
    return False


def _reads_through_inlined(w: _Work, op: Op) -> list[str]:
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


def _inline_cost(w: _Work, op: Op) -> int:
    return 1 + sum(w.cost.get(x.buffer, 0) for x in op.tensor_inputs if x.buffer in w.inlined)


def _grow_epilogue(w: _Work, anchor: Op) -> None:
    """Step 1: extend ``anchor``'s domain with single-consumer same-shaped pointwise ops."""
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
        reason = _can_join(w, anchor.id, nxt)
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


def _plan_short_operand(w: _Work, nxt: Op, gemv: str) -> None:
    """``nxt`` (kept out of a GEMM's epilogue by rule ``sibling-gemms``) is computed in the short-operand load of
    ``gemv``: each warp of the GEMV reads the short operand again, so only cheap ops may be recomputed there.
    An operand of ``nxt`` whose chain holds a transcendental op (SwiGLU's sigmoid) is materialised instead:
    stored once, by the loop of the GEMM it reads (step 3)."""
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


def _decide_inlining(w: _Work) -> None:
    """Step 2: inline each remaining pointwise/generator op into all consumers, or not."""
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


def _fix_register_reads(w: _Work) -> bool:
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
            stack = [(x, _reads_at_point(g.ops[m])) for x in g.ops[m].tensor_inputs]
            while stack:
                x, ident = stack.pop()
                here = ident and is_identity(x, _root(g, x))
                if x.buffer in w.inlined:
                    producer = g.ops[x.buffer]
                    inner_here = here and _reads_at_point(producer)
                    for y in producer.tensor_inputs:
                        if y.buffer in mset and not (inner_here and is_identity(y, _root(g, y))):
                            bad.add(producer.id)
                        stack.append((y, inner_here))
    for b in sorted(bad):
        w.inlined.discard(b)
        w.record("inline", b, "-", "legality",
                 keep("register-view", "not fused: it reads a value of the same group at other "
                                       "coordinates than the group is computing"))
    return bool(bad)


def _root(g: _Graph, x: TensorSpec) -> TensorSpec:
    if x.buffer in g.ops:
        return g.ops[x.buffer].out
    return g.program.inputs[g.input_buffers[x.buffer]].value


def _group_reads(w: _Work, members: list[str], walk: list[str] | None = None
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


def _gemm_plan(op: Op, options: Any, arch: str, inlined: frozenset[str] | set[str] = frozenset()) -> GemmPlan:
    """The GEMM's plan: the first registered emitter (:data:`tkx.target.GEMM_EMITTERS`) that
    supports it, its tiles, split-K, and why. ``inlined``: the ops recomputed where they are read
    (an operand among them is not a stored buffer)."""
    a, b = (op.inputs[1], op.inputs[2]) if op.kind == "addmm" else (op.inputs[0], op.inputs[1])
    assert isinstance(a, TensorSpec) and isinstance(b, TensorSpec)
    p = GemmProblem.from_views(a, b)
    fast = (1 if p.a_k_contiguous else 0, 1 if p.b_n_contiguous else 0)
    direct = all(_vector_aligned(v, f, p.dtype, inlined) for v, f in zip((a, b), fast))
    return choose_gemm(dataclasses.replace(p, direct=direct), options, arch)


def _vector_aligned(view: TensorSpec, fast_dim: int, dtype: str, inlined: frozenset[str] | set[str]) -> bool:
    """A stored operand of the problem's 2-byte dtype, unit stride along ``fast_dim`` of its last two
    dimensions, every other stride and its offset multiples of 8 elements (16-byte vectors)."""
    if view.buffer in inlined or view.dtype != dtype or dtype not in ("bfloat16", "float16"):
        return False
    other = [st for d, st in enumerate(view.strides) if d != view.ndim - 2 + fast_dim]
    return view.strides[-2:][fast_dim] == 1 and not any(st % 8 for st in other) and view.offset % 8 == 0


def rows_contiguous(x: TensorSpec, dims: tuple[int, ...]) -> bool:
    """Are consecutive output rows adjacent in memory (a reduction over a leading dim)?"""
    kept = [d for d in range(x.ndim) if d not in dims and x.shape[d] != 1]
    red = [d for d in dims if x.shape[d] != 1]
    return bool(kept) and x.strides[kept[-1]] == 1 and (not red or x.strides[red[-1]] != 1)


def _reduction_plan(op: Op, threads: int) -> ReductionPlan:
    """Rows x size of a reduction and the strategy (and why) of its emitter."""
    x = op.inputs[0]
    assert isinstance(x, TensorSpec)
    dims = tuple(op.attr("dims", ()))
    rows = op.out.numel
    size = math.prod(x.shape[d] for d in dims) if dims else 1
    return choose_reduction(ReductionProblem(rows, size, rows_contiguous(x, dims), op.out.dtype in INT_DTYPES),
                            threads, SM_COUNT)


def _row_plan(rg: Any, g: _Graph) -> ReductionPlan:
    """The plan of a row group: one warp per row, the row in registers, one pass per reduction."""
    kinds = ", ".join(g.ops[r].kind for r in rg.reductions)
    why = (f"row-persistent: {len(rg.reductions)} reductions ({kinds}) over rows of {rg.size} in one work item, "
           f"one warp per row keeping its {-(-rg.size // 32)} value(s) per lane in registers")
    return ReductionPlan("row", why, rg.rows, rg.size, False, passes=len(rg.reductions))


def _group_cost(group: Group, program_ops: dict[str, Op], threads: int) -> Cost:
    anchor = program_ops[group.anchor] if group.anchor in program_ops else None
    p = group.plan
    store_bytes = sum(program_ops[s].out.nbytes for s in group.stores if s in program_ops)
    if isinstance(p, AttentionPlan):
        phase = "partial" if group.kind == "attention_partial" else "combine" if p.partials else "one"
        c = ATTENTION_EMITTER.cost(p, phase)
        return Cost(c.items, c.flops, c.bytes + (store_bytes if phase != "partial" else 0))
    if isinstance(p, GemmPlan):
        phase = ("partial" if group.kind == "gemm_partial" else "fused" if p.split_final == "last-slice"
                 else "final" if p.partials else "one")
        c = gemm_emitter(p.impl).cost(p, phase)
        return Cost(c.items, c.flops, c.bytes + (store_bytes if phase != "partial" else 0))
    if isinstance(p, ReductionPlan):
        phase = "partial" if group.kind == "reduction_partial" else "one"
        c = reduction_emitter(p.strategy).cost(p, threads, phase)
        return Cost(c.items, c.flops, c.bytes + (store_bytes if p.strategy != "partial" or phase == "partial" else 0))
    if isinstance(p, PointwisePlan):
        if p.slice_write:  # stores only the written values
            out = program_ops[group.anchor].out
            store_bytes = p.numel * (out.nbytes // max(out.numel, 1))
        return pointwise_cost(p.numel, len(group.ops), len(group.reads), threads, store_bytes, p.per_thread or 1)
    numel = anchor.out.numel if anchor is not None else p.get("numel", 1)
    return pointwise_cost(numel, len(group.ops), len(group.reads), threads, store_bytes)


def _replace_plan(group: Group, plan: Any) -> Group:
    return Group(group.id, group.kind, group.anchor, group.ops, group.stores, group.reads, group.inlined,
                 group.work_items, group.flops, group.bytes, plan)


def _slice_write_ok(w: _Work, group: Group, scatter: Op, inp_buf: str, root: TensorSpec) -> bool:
    """Can ``scatter`` (alone in ``group``) write only its slice into input ``inp_buf`` (its base)? Its base
    must be the whole input, read nowhere else in the group (not by its index or values, nor by what they
    inline): the positions it does not write then already hold the old value."""
    base = scatter.inputs[0]
    if group.ops != (scatter.id,) or not isinstance(base, TensorSpec) or base.buffer != inp_buf \
            or not is_identity(base, root) or not root.is_dense:
        return False
    if any(isinstance(x, TensorSpec) and x.buffer == inp_buf for x in scatter.inputs[1:]):
        return False
    return not any(x.buffer == inp_buf for m in group.inlined for x in w.graph.ops[m].tensor_inputs)


def schedule(program: Program, options: Any = None, *, rules: tuple[FusionRule, ...] = ()) -> FusedSchedule:
    """Fuse and schedule ``program`` under ``options`` (a :class:`tkx.Options`).

    ``rules`` are extra fusion rules asked before the registered user rules and the
    built-ins. Returns a :class:`FusedSchedule` recording every decision with its reason.
    Raises :class:`TkxError` if the program cannot be scheduled (a compiler bug).
    """
    if options is None:
        from ..options import Options
        options = Options()
    # Step 0: each attention composite becomes one fused group or is expanded to its math.
    program, attention_decisions, attention_plans = _prepare_attention(
        program, options, options.max_blocks or SM_COUNT * options.blocks_per_sm)
    g = _Graph(program)
    w = _Work(g, options, active_rules(tuple(rules), getattr(options, "rules", None)))
    w.decisions.extend(attention_decisions)

    # Step 1: epilogues of GEMMs and reductions; fused attention groups stand alone.
    for op in program.ops:
        if op.family == "attention":
            w.domains[op.id] = [op.id]
            w.domain_of[op.id] = op.id
            w.cost[op.id] = 1
            continue
        if op.family in ("matmul", "reduction"):
            w.domains[op.id] = [op.id]
            w.domain_of[op.id] = op.id
            w.cost[op.id] = 1
            _grow_epilogue(w, op)
    # Step 2: inlining decisions.
    _decide_inlining(w)
    for _ in range(len(program.ops)):
        if not _fix_register_reads(w):
            break
    # Step 3: pointwise groups and loop fusion, in program order.
    for op in program.ops:
        if op.id in w.domain_of or op.id in w.inlined:
            continue
        if not g.users.get(op.id) and op.id not in g.sink_buffers:
            continue  # dead op (run the dce pass to remove it)
        joined = False
        reached = _reads_through_inlined(w, op)
        for anchor in sorted({w.domain_of[b] for b in reached if b in w.domain_of}, key=g.pos.__getitem__):
            producer = next(b for b in reached if w.domain_of.get(b) == anchor)
            reason = _can_join(w, anchor, op)
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

    # Step 3b: row-persistent multi-reduction fusion (softmax, cross-entropy, layer norm in one pass).
    # (Options.fuse_rows=False is a rule: the candidates are still recorded, as not fused.)
    from types import SimpleNamespace

    from .rows import RowFusion
    helpers = SimpleNamespace(is_identity=is_identity, memory_deps=_memory_deps, would_cycle=_would_cycle,
                              group_reads=_group_reads, rows_contiguous=rows_contiguous)
    row_groups = RowFusion(w, helpers).run()

    # Which domain values must be stored: read from memory by another group, or a sink.
    stored: set[str] = set()
    group_reads: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for anchor, members in w.domains.items():
        group_reads[anchor] = _group_reads(w, members)
        for b in group_reads[anchor][0]:
            if b in g.ops:
                stored.add(b)
    stored |= {b for b in g.sink_buffers if b in g.ops}

    # Build groups (ids in program order of their anchors).
    anchors = sorted(w.domains, key=g.pos.__getitem__)
    groups: dict[str, Group] = {}
    gid_of_anchor: dict[str, str] = {}
    threads = options.threads_per_block
    arch = resolve_arch(getattr(options, "arch", "auto"))
    for anchor in anchors:
        members = w.domains[anchor]
        a = g.ops[anchor]
        kind = {"matmul": "gemm", "reduction": "reduction", "attention": "attention"}.get(a.family, "pointwise")
        params: Any
        if kind == "attention":
            params = attention_plans[anchor]
        elif kind == "gemm":
            params = _gemm_plan(a, options, arch, w.inlined)
        elif kind == "reduction" and anchor in row_groups:
            params = _row_plan(row_groups[anchor], g)
        elif kind == "reduction":
            params = _reduction_plan(a, threads)
        else:
            params = PointwisePlan(a.out.numel)
            per = pointwise_per_thread(a.out.numel, threads, options.max_blocks or SM_COUNT * options.blocks_per_sm)
            if per > 1:
                params = PointwisePlan(a.out.numel, per_thread=per)
        reads, inl = group_reads[anchor]
        stores = tuple(m for m in members if m in stored)
        if not stores:
            continue  # nothing reads it: dead code (the dce pass removes it)
        gid = f"g{len(groups)}"
        gid_of_anchor[anchor] = gid
        groups[gid] = Group(gid, kind, anchor, tuple(members), stores, reads, inl, plan=params)

    # Two-phase reductions become a partial group plus the final group.
    scratch: dict[str, int] = {}
    for gid in list(groups):
        grp = groups[gid]
        if grp.kind == "reduction" and grp.plan.get("strategy") == "partial":
            name = f"{grp.anchor}_partials"
            rplan = grp.plan
            assert isinstance(rplan, ReductionPlan) and rplan.parts is not None
            scratch[name] = rplan.rows * rplan.parts * 4
            pid = f"{gid}p"
            in_reads, in_inl = _group_reads(w, list(grp.ops), [grp.anchor])
            epi_reads, epi_inl = _group_reads(w, list(grp.ops), list(grp.ops[1:]))
            groups[pid] = Group(pid, "reduction_partial", grp.anchor, (grp.anchor,), (name,), in_reads,
                                in_inl, plan=rplan.replace(partials=name))
            groups[gid] = Group(gid, "reduction", grp.anchor, grp.ops, grp.stores, epi_reads + (name,),
                                epi_inl, plan=rplan.replace(partials=name))

    # Split-K GEMMs: each work item computes one tile over one slice of K and writes it to fp32
    # scratch. With options.split_k_final == "last-slice" the item that finishes a tile last (a per-tile arrival
    # counter) adds the slices in order and runs the epilogue, in the same group; otherwise a
    # partial group writes the slices and a final group of the next stage adds them.
    for gid in list(groups):
        grp = groups[gid]
        gplan = grp.plan
        if grp.kind == "gemm" and isinstance(gplan, GemmPlan) and gplan.split_k > 1:
            name = f"{grp.anchor}_splitk"
            scratch[name] = gplan.split_k * gplan.batch * gplan.m * gplan.n * 4
            if options.split_k_final == "last-slice":
                why = (f"{gplan.why}; the last of the {gplan.split_k} slices to finish a tile adds them in slice "
                       "order and runs the epilogue (a per-tile arrival counter): no final stage")
                groups[gid] = Group(gid, "gemm", grp.anchor, grp.ops, grp.stores + (name,), grp.reads, grp.inlined,
                                    plan=gplan.replace(partials=name, split_final="last-slice", why=why))
                w.decisions.append(FusionDecision(
                    "split-k", grp.anchor, gid, True, "split-k-final", "last-slice",
                    f"fused: the last of the {gplan.split_k} slices to finish each of its {gplan.tiles} tiles adds "
                    "the slices in slice order and runs the epilogue, so the split-K final needs no stage and no "
                    "grid barrier of its own"))
                continue
            in_reads, in_inl = _group_reads(w, list(grp.ops), [grp.anchor])
            groups[f"{gid}k"] = Group(f"{gid}k", "gemm_partial", grp.anchor, (grp.anchor,), (name,), in_reads, in_inl,
                                      plan=gplan.replace(partials=name, split_final="stage"))
            groups[gid] = Group(gid, "gemm", grp.anchor, grp.ops, grp.stores, grp.reads + (name,), grp.inlined,
                                plan=gplan.replace(partials=name, split_final="stage"))
            w.decisions.append(FusionDecision(
                "split-k", grp.anchor, gid, False, "split-k-final", "stage",
                f"not fused: split_k_final='stage', so {gid}k writes the {gplan.split_k} slices and "
                f"{gid} adds them in the next stage, after a grid barrier"))

    # Flash-decoding attention becomes a partial group (each work item one (batch, KV tile): the tile's
    # un-normalised output, maximum and sum, to fp32 scratch) plus the combine group (the next stage).
    for gid in list(groups):
        grp = groups[gid]
        aplan = grp.plan
        if grp.kind == "attention" and isinstance(aplan, AttentionPlan) and aplan.impl == "flash_decode":
            name = f"{grp.anchor}_flashdec"
            scratch[name] = 4 * decode_partials_layout(aplan.batch, aplan.k_tiles, aplan.q_len, aplan.value_dim)[2]
            groups[f"{gid}p"] = Group(f"{gid}p", "attention_partial", grp.anchor, (grp.anchor,), (name,), grp.reads,
                                      grp.inlined, plan=aplan.replace(partials=name))
            groups[gid] = Group(gid, "attention", grp.anchor, grp.ops, grp.stores, (name,), (),
                                plan=aplan.replace(partials=name))

    # Step 4: stages from read-after-write dependencies.
    producer_group: dict[str, str] = {}
    for gid, grp in groups.items():
        for s in grp.stores:
            producer_group[s] = gid
    stage: dict[str, int] = {}

    def stage_of(gid: str, depth: int = 0) -> int:
        if gid in stage:
            return stage[gid]
        if depth > len(groups) + 1:
            raise TkxError("scheduler: cyclic group dependencies (a fusion legality bug)")
        deps = [producer_group[b] for b in groups[gid].reads if b in producer_group and producer_group[b] != gid]
        stage[gid] = 1 + max((stage_of(d, depth + 1) for d in deps), default=-1)
        return stage[gid]

    for gid in groups:
        stage_of(gid)

    # Homes: outputs first, then in-place updates, the rest in the arena.
    homes: dict[str, Home] = {s: Home("arena") for grp in groups.values() for s in grp.stores if s in g.ops}
    copies: list[tuple[TensorSpec, Home, int]] = []  # (src view, destination, earliest stage)
    for k, out in enumerate(program.outputs):
        v = out.value
        if v.buffer in g.ops and v.buffer in homes and homes[v.buffer].kind == "arena" \
                and is_identity(v, g.ops[v.buffer].out):
            homes[v.buffer] = Home("output", k)
        else:
            src_stage = stage[producer_group[v.buffer]] + 1 if v.buffer in producer_group else 0
            copies.append((v, Home("output", k), src_stage))
    readers_of_input: dict[int, list[str]] = {}
    for gid, grp in groups.items():
        for b in grp.reads:
            if b in g.input_buffers:
                readers_of_input.setdefault(g.input_buffers[b], []).append(gid)
    hazards_extra: dict[int, list[str]] = {}
    for upd in program.updates:
        v = upd.value
        name = program.inputs[upd.input_index].name
        producer = producer_group.get(v.buffer)
        dense_target = program.inputs[upd.input_index].value.is_dense
        direct = (producer is not None and is_identity(v, g.ops[v.buffer].out) and dense_target
                  and homes.get(v.buffer) == Home("arena") and groups[producer].kind != "reduction_partial")
        if direct:
            own = groups[producer]
            others = [r for r in readers_of_input.get(upd.input_index, []) if r != producer]
            late = [r for r in others if stage[r] >= stage[producer]]
            inp_buf = program.inputs[upd.input_index].value.buffer
            evaluated_at_point = own.ops[1:] if own.kind in ("gemm", "reduction") else own.ops
            own_ok = all(ident for m in evaluated_at_point
                         for b, ident in _member_reads(w, g.ops[m], {inp_buf}))
            if own.kind in ("gemm", "reduction") and any(
                    b == inp_buf for b in _group_reads(w, list(own.ops), [own.anchor])[0]):
                own_ok = False  # the GEMM/reduction itself reads the old value at other points
            scatter = g.ops[own.anchor] if g.ops[own.anchor].kind == "scatter" else None
            if scatter is not None:
                own_ok = _slice_write_ok(w, own, scatter, inp_buf, program.inputs[upd.input_index].value)
            if not late and own_ok and scatter is not None:
                values = scatter.inputs[2]
                assert isinstance(values, TensorSpec)
                homes[v.buffer] = Home("input", upd.input_index)
                why = (f"only the indexed slice is written: {values.numel} of the {scatter.out.numel} elements of "
                       f"{name}, in place")
                grid = options.max_blocks or SM_COUNT * options.blocks_per_sm
                per = pointwise_per_thread(values.numel, threads, grid)
                groups[producer] = _replace_plan(own, PointwisePlan(values.numel, per_thread=per if per > 1 else None,
                                                                    slice_write=why))
                w.decisions.append(FusionDecision(
                    "in-place", v.buffer, name, True, "in-place", "slice-write",
                    f"written in place: {why}; every other read of the old {name} happens in an earlier stage"))
                continue
            if not late and own_ok:
                homes[v.buffer] = Home("input", upd.input_index)
                w.decisions.append(FusionDecision(
                    "in-place", v.buffer, name, True, "in-place", "last-read-proven",
                    f"written in place: every other read of the old {name} happens in an earlier stage"))
                continue
            why = (f"groups {', '.join(late)} still read the old value in the same or a later stage"
                   if late else "the producing loop reads the old value through a view")
        elif not dense_target:
            why = "the input is not a dense tensor (a view or transposed), so it is written through its strides"
        elif producer is not None and g.ops[groups[producer].anchor].kind == "scatter":
            why = "the scattered value is not the whole update of the input"
        else:
            why = "the new value is not computed elementwise in one group"
        last_reader = max((stage[r] for r in readers_of_input.get(upd.input_index, [])), default=-1)
        src_stage = stage[producer] if producer is not None else -1
        copies.append((v, Home("input", upd.input_index), max(last_reader, src_stage) + 1))
        w.decisions.append(FusionDecision(
            "in-place", v.buffer, name, False, "in-place", "staged-commit",
            f"staged commit: {why}, so the new value is copied into {name} afterwards"))
        hazards_extra.setdefault(max(last_reader, src_stage) + 1, []).append(
            f"WAR {name}: commit after its last read")

    copy_tasks: list[CopyTask] = []
    for j, (src, dst, earliest) in enumerate(copies):
        cid = f"c{j}"
        numel = src.numel
        groups[cid] = Group(cid, "copy", src.buffer, (), (), (src.buffer,),
                            plan=CopyPlan(numel, str(dst)))
        stage[cid] = max(earliest, 0)
        copy_tasks.append(CopyTask(cid, src, dst))

    # Costs and work items.
    for gid, grp in list(groups.items()):
        c = _group_cost(grp, g.ops, threads)
        groups[gid] = Group(grp.id, grp.kind, grp.anchor, grp.ops, grp.stores, grp.reads, grp.inlined,
                            c.items, c.flops, c.bytes, grp.plan)

    nstages = 1 + max(stage.values(), default=0)
    stages = tuple(tuple(gid for gid in groups if stage[gid] == s) for s in range(nstages))
    stages = tuple(s for s in stages if s)
    # Barriers: the RAW hazards that cross into each stage.
    barriers = []
    index_of = {gid: i for i, s in enumerate(stages) for gid in s}
    for si in range(1, len(stages)):
        hz = []
        for gid in stages[si]:
            for b in groups[gid].reads:
                p = producer_group.get(b)
                if p is not None and index_of.get(p) == si - 1:
                    hz.append(f"RAW {b}: {p} -> {gid}")
        hz.extend(hazards_extra.get(si, []))
        barriers.append(Barrier(si, "", tuple(dict.fromkeys(hz)) or ("ordering",)))

    mode, blocks, reason = _choose_mode(groups, stages, options)
    barrier_kind = "__syncthreads" if mode == "block" else "grid"
    barriers = [Barrier(b.stage, barrier_kind, b.hazards) for b in barriers]
    return FusedSchedule(
        program=program, groups=groups, stages=stages, barriers=tuple(barriers),
        inlined=frozenset(w.inlined), homes=homes, copies=tuple(copy_tasks), scratch=scratch,
        decisions=tuple(w.decisions), mode=mode, mode_reason=reason, blocks=blocks,
        threads=threads, options=options, arch=arch)


def _choose_mode(groups: dict[str, Group], stages: tuple[tuple[str, ...], ...],
                 options: Any) -> tuple[str, int, str]:
    """One block or the whole grid: estimated µs of each, from :func:`tkx.costs.constants` (DESIGN.md's
    anchors, or the calibrated JSON when one is shipped)."""
    from .. import costs

    c = costs.constants()

    def item_us(grp: Group) -> float:
        items = max(grp.work_items, 1)
        return c["item_overhead_us"] * 0.1 + max(grp.flops / c["sm_flops_per_us"],
                                                 grp.bytes / c["sm_bytes_per_us"]) / items

    want = max((sum(groups[g].work_items for g in s) for s in stages), default=1)
    cap = options.max_blocks or SM_COUNT * options.blocks_per_sm
    blocks_grid = max(1, min(want, cap))
    t_block = sum(sum(groups[g].work_items * item_us(groups[g]) for g in s) for s in stages) \
        + c["block_barrier_us"] * (len(stages) - 1)
    t_grid = sum(max(math.ceil(groups[g].work_items / blocks_grid) * item_us(groups[g]) for g in s)
                 for s in stages) + c["grid_barrier_us"] * (len(stages) - 1)
    numbers = f"estimated {t_block:.1f} µs on one block vs {t_grid:.1f} µs on {blocks_grid} blocks"
    if options.mode == "block":
        return "block", 1, f"mode='block' requested ({numbers})"
    if options.mode == "grid":
        return "grid", blocks_grid, f"mode='grid' requested ({numbers})"
    if t_block <= t_grid:
        return "block", 1, f"auto: one block is cheaper: {numbers}"
    return "grid", blocks_grid, f"auto: the grid is cheaper: {numbers}"
