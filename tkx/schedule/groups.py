"""Groups of the scheduler: one per fusion domain, with its emitter's plan; two-phase groups; costs.

Step 4 of :func:`tkx.schedule.schedule`. :func:`build_groups` turns each fusion domain that stores a
value into a :class:`~tkx.schedule.model.Group` with the plan of its emitter (:mod:`tkx.target` chooses
GEMM tiles, reduction strategies, pointwise work per thread); :func:`split_phases` splits the groups
whose plan works in two phases (two-phase reductions, split-K GEMMs, flash-decoding attention) into a
partial group writing fp32 scratch and a final group; :func:`cost_groups` gives every group its work
items, FLOPs and bytes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..dtypes import INT_DTYPES
from ..ir import Op, TensorSpec
from ..target import (
    ATTENTION_EMITTER,
    SM_COUNT,
    AttentionPlan,
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
    row_threads,
)
from .fusion import group_reads
from .model import FusionDecision, Group
from .work import Graph, Work, rows_contiguous

_KINDS = {"matmul": "gemm", "reduction": "reduction", "attention": "attention"}


def build_groups(w: Work, row_groups: dict[str, Any], attention_plans: dict[str, Any], arch: str
                 ) -> dict[str, Group]:
    """One group per domain that stores a value (read from memory by another group, or a sink), ids
    ``g0, g1, ...`` in program order of their anchors; a domain nothing reads is dead code (the dce pass
    removes it) and gets no group."""
    g = w.graph
    stored: set[str] = set()
    reads_of: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for anchor, members in w.domains.items():
        reads_of[anchor] = group_reads(w, members)
        stored |= {b for b in reads_of[anchor][0] if b in g.ops}
    stored |= {b for b in g.sink_buffers if b in g.ops}
    groups: dict[str, Group] = {}
    for anchor in sorted(w.domains, key=g.pos.__getitem__):
        members = w.domains[anchor]
        a = g.ops[anchor]
        kind = _KINDS.get(a.family, "pointwise")
        plan = _plan(w, a, kind, row_groups, attention_plans, arch)
        reads, inl = reads_of[anchor]
        stores = tuple(m for m in members if m in stored)
        if not stores:
            continue
        gid = f"g{len(groups)}"
        groups[gid] = Group(gid, kind, anchor, tuple(members), stores, reads, inl, plan=plan)
    return groups


def _plan(w: Work, a: Op, kind: str, row_groups: dict[str, Any], attention_plans: dict[str, Any], arch: str) -> Any:
    """The plan of the group anchored at ``a``: its emitter's choice for this problem."""
    options, threads = w.options, w.options.threads_per_block
    if kind == "attention":
        return attention_plans[a.id]
    if kind == "gemm":
        return gemm_plan(a, options, arch, w.inlined)
    if kind == "reduction" and a.id in row_groups:
        return _row_plan(row_groups[a.id], w.graph, threads)
    if kind == "reduction":
        return _reduction_plan(a, threads)
    per = pointwise_per_thread(a.out.numel, threads, options.max_blocks or SM_COUNT * options.blocks_per_sm)
    return PointwisePlan(a.out.numel, per_thread=per) if per > 1 else PointwisePlan(a.out.numel)


def split_phases(w: Work, groups: dict[str, Group]) -> dict[str, int]:
    """Split the two-phase groups in place; returns the fp32 scratch they need ({name: bytes})."""
    scratch: dict[str, int] = {}
    _split_reductions(w, groups, scratch)
    _split_k(w, groups, scratch)
    _split_flash_decoding(groups, scratch)
    return scratch


def _split_reductions(w: Work, groups: dict[str, Group], scratch: dict[str, int]) -> None:
    """Two-phase reductions become a partial group ``<gid>p`` plus the final group."""
    for gid in list(groups):
        grp = groups[gid]
        if grp.kind == "reduction" and grp.plan.get("strategy") == "partial":
            name = f"{grp.anchor}_partials"
            rplan = grp.plan
            assert isinstance(rplan, ReductionPlan) and rplan.parts is not None
            scratch[name] = rplan.rows * rplan.parts * 4
            pid = f"{gid}p"
            in_reads, in_inl = group_reads(w, list(grp.ops), [grp.anchor])
            epi_reads, epi_inl = group_reads(w, list(grp.ops), list(grp.ops[1:]))
            groups[pid] = Group(pid, "reduction_partial", grp.anchor, (grp.anchor,), (name,), in_reads,
                                in_inl, plan=rplan.replace(partials=name))
            groups[gid] = Group(gid, "reduction", grp.anchor, grp.ops, grp.stores, epi_reads + (name,),
                                epi_inl, plan=rplan.replace(partials=name))


def _split_k(w: Work, groups: dict[str, Group], scratch: dict[str, int]) -> None:
    """Split-K GEMMs: each work item computes one tile over one slice of K and writes it to fp32
    scratch. With ``options.split_k_final == "last-slice"`` the item that finishes a tile last (a per-tile arrival
    counter) adds the slices in order and runs the epilogue, in the same group; otherwise a
    partial group ``<gid>k`` writes the slices and a final group of the next stage adds them."""
    for gid in list(groups):
        grp = groups[gid]
        gplan = grp.plan
        if not (grp.kind == "gemm" and isinstance(gplan, GemmPlan) and gplan.split_k > 1):
            continue
        name = f"{grp.anchor}_splitk"
        scratch[name] = gplan.split_k * gplan.batch * gplan.m * gplan.n * 4
        if w.options.split_k_final == "last-slice":
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
        in_reads, in_inl = group_reads(w, list(grp.ops), [grp.anchor])
        groups[f"{gid}k"] = Group(f"{gid}k", "gemm_partial", grp.anchor, (grp.anchor,), (name,), in_reads, in_inl,
                                  plan=gplan.replace(partials=name, split_final="stage"))
        groups[gid] = Group(gid, "gemm", grp.anchor, grp.ops, grp.stores, grp.reads + (name,), grp.inlined,
                            plan=gplan.replace(partials=name, split_final="stage"))
        w.decisions.append(FusionDecision(
            "split-k", grp.anchor, gid, False, "split-k-final", "stage",
            f"not fused: split_k_final='stage', so {gid}k writes the {gplan.split_k} slices and "
            f"{gid} adds them in the next stage, after a grid barrier"))


def _split_flash_decoding(groups: dict[str, Group], scratch: dict[str, int]) -> None:
    """Flash-decoding attention becomes a partial group ``<gid>p`` (each work item one (batch, KV tile):
    the tile's un-normalised output, maximum and sum, to fp32 scratch) plus the combine group (the next
    stage)."""
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


def cost_groups(groups: dict[str, Group], program_ops: dict[str, Op], threads: int) -> None:
    """Give every group (in place) its work items, FLOPs and bytes from its emitter's cost model."""
    for gid, grp in list(groups.items()):
        c = _group_cost(grp, program_ops, threads)
        groups[gid] = Group(grp.id, grp.kind, grp.anchor, grp.ops, grp.stores, grp.reads, grp.inlined,
                            c.items, c.flops, c.bytes, grp.plan)


def gemm_plan(op: Op, options: Any, arch: str, inlined: frozenset[str] | set[str] = frozenset()) -> GemmPlan:
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


def _reduction_plan(op: Op, threads: int) -> ReductionPlan:
    """Rows x size of a reduction and the strategy (and why) of its emitter."""
    x = op.inputs[0]
    assert isinstance(x, TensorSpec)
    dims = tuple(op.attr("dims", ()))
    rows = op.out.numel
    size = math.prod(x.shape[d] for d in dims) if dims else 1
    return choose_reduction(ReductionProblem(rows, size, rows_contiguous(x, dims), op.out.dtype in INT_DTYPES),
                            threads, SM_COUNT)


def _row_plan(rg: Any, g: Graph, threads: int) -> ReductionPlan:
    """The plan of a row group: a warp (or, for a few long rows, the block) per row, the row in registers,
    one pass per reduction."""
    kinds = ", ".join(g.ops[r].kind for r in rg.reductions)
    per_row = row_threads(rg.rows, rg.size, threads)
    who = "one warp per row" if per_row == 32 else f"one block of {per_row} threads per row"
    why = (f"row-persistent: {len(rg.reductions)} reductions ({kinds}) over rows of {rg.size} in one work item, "
           f"{who} keeping its {-(-rg.size // per_row)} value(s) per thread in registers")
    return ReductionPlan("row", why, rg.rows, rg.size, False, passes=len(rg.reductions), row_threads=per_row)


def _group_cost(group: Group, program_ops: dict[str, Op], threads: int) -> Cost:
    """Work items, FLOPs and bytes of ``group`` by its plan's emitter (the phase its kind names)."""
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


def replace_plan(group: Group, plan: Any) -> Group:
    """``group`` with another plan (before costs are given)."""
    return Group(group.id, group.kind, group.anchor, group.ops, group.stores, group.reads, group.inlined,
                 group.work_items, group.flops, group.bytes, plan)
