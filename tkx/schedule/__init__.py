"""The scheduler: fusion groups, stages, barriers, homes and the grid.

``schedule(program, options) -> FusedSchedule`` runs these steps in order, each a function of its
own that records what it decides:

0. **Attention** (:func:`tkx.schedule.attention.prepare`): each attention composite becomes one
   fused FlashAttention group or is expanded to its math (``Options.fuse_attention``).
1. **Epilogues** (:func:`~tkx.schedule.fusion.grow_epilogues`): each GEMM and reduction grows a
   chain of same-shaped pointwise consumers it can apply in registers.
2. **Inlining** (:func:`~tkx.schedule.fusion.decide_inlining`): every other pointwise/generator op
   is either inlined into all of its consumers (recomputed where read) or materialised; each
   producer/consumer pair is a candidate judged by the fusion rules (:mod:`tkx.schedule.rules`).
3. **Loops and rows** (:func:`~tkx.schedule.fusion.fuse_loops`, :func:`~tkx.schedule.fusion.fuse_rows`):
   materialised ops become fusion domains; same-shaped pointwise ops that read a domain's value
   through an identity view join it; reductions over the same rows share one row-persistent pass.
4. **Groups** (:mod:`tkx.schedule.groups`): one group per domain with its emitter's plan; two-phase
   plans split into a partial and a final group.
5. **Stages, homes and barriers** (:mod:`tkx.schedule.stages`) from read-after-write dependencies
   between groups; in-place state updates go straight into the user's tensor when every other read
   of the old value is in an earlier stage (write-after-read proven), otherwise through a staged
   commit.
6. **Mode and grid** (:func:`~tkx.schedule.stages.choose_mode`): one block with ``__syncthreads``
   or the whole grid with grid barriers, by a cost estimate that is recorded with its numbers.
"""

from __future__ import annotations

from typing import Any

from ..ir import Program
from ..target import SM_COUNT, resolve_arch
from . import fusion, groups, stages
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
    keep,
    remove_fusion_rule,
)
from .stages import predicted_us
from .work import Graph, Work, is_identity

__all__ = [
    "schedule", "FusedSchedule", "Group", "Home", "FusionDecision", "Barrier", "CopyTask",
    "FusionRule", "Candidate", "Verdict", "fuse", "keep", "fusion_rule", "remove_fusion_rule",
    "BUILTIN_RULES", "is_identity", "SM_COUNT", "predicted_us",
]


def schedule(program: Program, options: Any = None, *, rules: tuple[FusionRule, ...] = ()) -> FusedSchedule:
    """Fuse and schedule ``program`` under ``options`` (a :class:`tkx.Options`; default ``Options()``).

    ``rules`` are extra fusion rules asked before the registered user rules and the built-ins.
    Returns a :class:`FusedSchedule` recording every decision with its reason. Raises
    :class:`~tkx.errors.TkxError` if the program cannot be scheduled (a compiler bug).
    """
    if options is None:
        from ..options import Options
        options = Options()
    program, attention_decisions, attention_plans = _prepare_attention(
        program, options, options.max_blocks or SM_COUNT * options.blocks_per_sm)
    w = Work(Graph(program), options, active_rules(tuple(rules), getattr(options, "rules", None)))
    w.decisions.extend(attention_decisions)
    fusion.grow_epilogues(w)
    fusion.decide_inlining(w)
    fusion.fuse_loops(w)
    row_groups = fusion.fuse_rows(w)
    arch = resolve_arch(getattr(options, "arch", "auto"))
    found = groups.build_groups(w, row_groups, attention_plans, arch)
    scratch = groups.split_phases(w, found)
    stage, producer_group = stages.assign_stages(found)
    placed = stages.place_values(w, found, stage, producer_group)
    copies = stages.add_copy_groups(placed)
    groups.cost_groups(found, w.graph.ops, options.threads_per_block)
    order, barriers = stages.order_stages(placed)
    mode, blocks, reason = stages.choose_mode(found, order, options)
    kind = "__syncthreads" if mode == "block" else "grid"
    barriers = [Barrier(b.stage, kind, b.hazards) for b in barriers]
    return FusedSchedule(
        program=program, groups=found, stages=order, barriers=tuple(barriers),
        inlined=frozenset(w.inlined), homes=placed.homes, copies=copies, scratch=scratch,
        decisions=tuple(w.decisions), mode=mode, mode_reason=reason, blocks=blocks,
        threads=options.threads_per_block, options=options, arch=arch)
