"""Stages, homes and barriers of the scheduler, and the choice between one block and the grid.

Steps 5 and 6 of :func:`tkx.schedule.schedule`:

* :func:`assign_stages`: each group runs one stage after the latest group whose value it reads
  (read-after-write);
* :func:`place_values`: where each stored value lives. A returned value is written straight into
  the user's output when it is a whole buffer; an in-place state update goes straight into the
  user's tensor when every other read of the old value is in an earlier stage (write-after-read
  proven), otherwise through a staged commit (a copy after the last read);
* :func:`add_copy_groups` and :func:`order_stages`: the copies as groups, the stage list and the
  barrier before each stage with the hazards it guards;
* :func:`choose_mode`: one block with ``__syncthreads`` or the whole grid with grid barriers, by a
  cost estimate that is recorded with its numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import TkxError
from ..ir import Op, TensorSpec
from ..target import SM_COUNT, CopyPlan, PointwisePlan, pointwise_per_thread
from .fusion import group_reads, member_reads
from .groups import replace_plan
from .model import Barrier, CopyTask, FusedSchedule, FusionDecision, Group, Home
from .work import Work, is_identity


def assign_stages(groups: dict[str, Group]) -> tuple[dict[str, int], dict[str, str]]:
    """({group: stage}, {stored buffer: the group that stores it}); raises :class:`TkxError` on a
    cycle among the groups (a fusion legality bug)."""
    producer_group = {s: gid for gid, grp in groups.items() for s in grp.stores}
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
    return stage, producer_group


@dataclass
class Placement:
    """What :func:`place_values` decides: the homes of stored values, the copies still to make
    (source view, destination, earliest stage) and the write-after-read hazards that stages wait on."""

    w: Work
    groups: dict[str, Group]
    stage: dict[str, int]
    producer_group: dict[str, str]
    homes: dict[str, Home] = field(default_factory=dict)
    copies: list[tuple[TensorSpec, Home, int]] = field(default_factory=list)
    hazards: dict[int, list[str]] = field(default_factory=dict)
    readers_of_input: dict[int, list[str]] = field(default_factory=dict)


def place_values(w: Work, groups: dict[str, Group], stage: dict[str, int], producer_group: dict[str, str]
                 ) -> Placement:
    """Homes of every stored value: the outputs first, then the in-place updates, the rest in the arena."""
    g = w.graph
    program = g.program
    p = Placement(w, groups, stage, producer_group)
    p.homes = {s: Home("arena") for grp in groups.values() for s in grp.stores if s in g.ops}
    for k, out in enumerate(program.outputs):
        v = out.value
        if v.buffer in g.ops and v.buffer in p.homes and p.homes[v.buffer].kind == "arena" \
                and is_identity(v, g.ops[v.buffer].out):
            p.homes[v.buffer] = Home("output", k)
        else:
            src_stage = stage[producer_group[v.buffer]] + 1 if v.buffer in producer_group else 0
            p.copies.append((v, Home("output", k), src_stage))
    for gid, grp in groups.items():
        for b in grp.reads:
            if b in g.input_buffers:
                p.readers_of_input.setdefault(g.input_buffers[b], []).append(gid)
    for upd in program.updates:
        _place_update(p, upd)
    return p


def _place_update(p: Placement, upd: Any) -> None:
    """An in-place update written straight into the user's tensor, or else a staged commit."""
    g = p.w.graph
    program = g.program
    v = upd.value
    name = program.inputs[upd.input_index].name
    producer = p.producer_group.get(v.buffer)
    dense_target = program.inputs[upd.input_index].value.is_dense
    direct = (producer is not None and is_identity(v, g.ops[v.buffer].out) and dense_target
              and p.homes.get(v.buffer) == Home("arena") and p.groups[producer].kind != "reduction_partial")
    if direct:
        assert producer is not None
        why = _write_in_place(p, upd, producer)
        if why is None:
            return
    elif not dense_target:
        why = "the input is not a dense tensor (a view or transposed), so it is written through its strides"
    elif producer is not None and g.ops[p.groups[producer].anchor].kind == "scatter":
        why = "the scattered value is not the whole update of the input"
    else:
        why = "the new value is not computed elementwise in one group"
    last_reader = max((p.stage[r] for r in p.readers_of_input.get(upd.input_index, [])), default=-1)
    src_stage = p.stage[producer] if producer is not None else -1
    p.copies.append((v, Home("input", upd.input_index), max(last_reader, src_stage) + 1))
    p.w.decisions.append(FusionDecision(
        "in-place", v.buffer, name, False, "in-place", "staged-commit",
        f"staged commit: {why}, so the new value is copied into {name} afterwards"))
    p.hazards.setdefault(max(last_reader, src_stage) + 1, []).append(f"WAR {name}: commit after its last read")


def _write_in_place(p: Placement, upd: Any, producer: str) -> str | None:
    """Write the update of ``producer``'s group straight into the input when every other read of the old
    value is in an earlier stage (a scatter: only its slice); returns None when it does, else why not."""
    w, g = p.w, p.w.graph
    program = g.program
    v, name = upd.value, program.inputs[upd.input_index].name
    own = p.groups[producer]
    others = [r for r in p.readers_of_input.get(upd.input_index, []) if r != producer]
    late = [r for r in others if p.stage[r] >= p.stage[producer]]
    inp_buf = program.inputs[upd.input_index].value.buffer
    evaluated_at_point = own.ops[1:] if own.kind in ("gemm", "reduction") else own.ops
    own_ok = all(ident for m in evaluated_at_point for b, ident in member_reads(w, g.ops[m], {inp_buf}))
    if own.kind in ("gemm", "reduction") and any(
            b == inp_buf for b in group_reads(w, list(own.ops), [own.anchor])[0]):
        own_ok = False  # the GEMM/reduction itself reads the old value at other points
    scatter = g.ops[own.anchor] if g.ops[own.anchor].kind == "scatter" else None
    if scatter is not None:
        own_ok = _slice_write_ok(w, own, scatter, inp_buf, program.inputs[upd.input_index].value)
    if not late and own_ok and scatter is not None:
        values = scatter.inputs[2]
        assert isinstance(values, TensorSpec)
        p.homes[v.buffer] = Home("input", upd.input_index)
        why = (f"only the indexed slice is written: {values.numel} of the {scatter.out.numel} elements of "
               f"{name}, in place")
        options = w.options
        grid = options.max_blocks or SM_COUNT * options.blocks_per_sm
        per = pointwise_per_thread(values.numel, options.threads_per_block, grid)
        p.groups[producer] = replace_plan(own, PointwisePlan(values.numel, per_thread=per if per > 1 else None,
                                                             slice_write=why))
        w.decisions.append(FusionDecision(
            "in-place", v.buffer, name, True, "in-place", "slice-write",
            f"written in place: {why}; every other read of the old {name} happens in an earlier stage"))
        return None
    if not late and own_ok:
        p.homes[v.buffer] = Home("input", upd.input_index)
        w.decisions.append(FusionDecision(
            "in-place", v.buffer, name, True, "in-place", "last-read-proven",
            f"written in place: every other read of the old {name} happens in an earlier stage"))
        return None
    return (f"groups {', '.join(late)} still read the old value in the same or a later stage"
            if late else "the producing loop reads the old value through a view")


def add_copy_groups(p: Placement) -> dict[str, CopyTask]:
    """One copy group ``c<j>`` per copy still to make, in the stage it may run at the earliest: group id ->
    its payload."""
    tasks = {}
    for j, (src, dst, earliest) in enumerate(p.copies):
        cid = f"c{j}"
        p.groups[cid] = Group(cid, "copy", src.buffer, (), (), (src.buffer,), plan=CopyPlan(src.numel, str(dst)))
        p.stage[cid] = max(earliest, 0)
        tasks[cid] = CopyTask(src, dst)
    return tasks


def order_stages(p: Placement) -> tuple[tuple[tuple[str, ...], ...], list[Barrier]]:
    """The stages (groups in group order, empty stages dropped) and the barrier before each stage after
    the first, naming the read-after-write and write-after-read hazards it guards."""
    groups, stage = p.groups, p.stage
    nstages = 1 + max(stage.values(), default=0)
    stages = tuple(tuple(gid for gid in groups if stage[gid] == s) for s in range(nstages))
    stages = tuple(s for s in stages if s)
    barriers = []
    index_of = {gid: i for i, s in enumerate(stages) for gid in s}
    for si in range(1, len(stages)):
        hz = []
        for gid in stages[si]:
            for b in groups[gid].reads:
                q = p.producer_group.get(b)
                if q is not None and index_of.get(q) == si - 1:
                    hz.append(f"RAW {b}: {q} -> {gid}")
        hz.extend(p.hazards.get(si, []))
        barriers.append(Barrier(si, "", tuple(dict.fromkeys(hz)) or ("ordering",)))
    return stages, barriers


def _slice_write_ok(w: Work, group: Group, scatter: Op, inp_buf: str, root: TensorSpec) -> bool:
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


def choose_mode(groups: dict[str, Group], stages: tuple[tuple[str, ...], ...],
                options: Any) -> tuple[str, int, str]:
    """One block or the whole grid: estimated µs of each (:func:`_mode_costs`) -> (mode, blocks, why)."""
    blocks_grid = grid_blocks(groups, stages, options)
    t_block, t_grid = _mode_costs(groups, stages, blocks_grid)
    numbers = f"estimated {t_block:.1f} µs on one block vs {t_grid:.1f} µs on {blocks_grid} blocks"
    if options.mode == "block":
        return "block", 1, f"mode='block' requested ({numbers})"
    if options.mode == "grid":
        return "grid", blocks_grid, f"mode='grid' requested ({numbers})"
    if t_block <= t_grid:
        return "block", 1, f"auto: one block is cheaper: {numbers}"
    return "grid", blocks_grid, f"auto: the grid is cheaper: {numbers}"


def grid_blocks(groups: dict[str, Group], stages: tuple[tuple[str, ...], ...], options: Any) -> int:
    """Blocks of the grid mode: the most work items of one stage, capped by ``options.max_blocks`` (else
    :data:`SM_COUNT` x ``options.blocks_per_sm``); at least 1."""
    want = max((sum(groups[g].work_items for g in s) for s in stages), default=1)
    cap = options.max_blocks or SM_COUNT * options.blocks_per_sm
    return max(1, min(want, cap))


def predicted_us(schedule: FusedSchedule) -> float:
    """The cost model's µs for one step of ``schedule`` in its mode on its blocks, the launch of its CUDA
    graph included: the figure ``mode='auto'`` compares plus ``launch_us`` (:func:`tkx.costs.constants`; an
    estimate, not a measurement)."""
    from .. import costs

    t_block, t_grid = _mode_costs(schedule.groups, schedule.stages, max(schedule.blocks, 1))
    return (t_block if schedule.mode == "block" else t_grid) + costs.constants()["launch_us"]


def _mode_costs(groups: dict[str, Group], stages: tuple[tuple[str, ...], ...],
                blocks_grid: int, c: dict[str, float] | None = None) -> tuple[float, float]:
    """(µs on one block, µs on ``blocks_grid`` blocks) of one step, with constants ``c`` (default
    :func:`tkx.costs.constants`: DESIGN.md's anchors, or the calibrated JSON when one is shipped). A group
    costs its fixed ``group_us`` plus, per block, its share of the work items (:func:`tkx.costs.item_us`
    each): on one block all of them, one after another, on the grid the slowest block's share; a stage
    costs its slowest group on the grid and the sum of its groups on one block."""
    from .. import costs

    c = c or costs.constants()

    def item(grp: Group) -> float:
        return costs.item_us(grp.flops, grp.bytes, grp.work_items, c, costs.group_impl(grp))

    t_block = sum(sum(c["group_us"] + groups[g].work_items * item(groups[g]) for g in s) for s in stages) \
        + c["block_barrier_us"] * (len(stages) - 1)
    t_grid = sum(max(c["group_us"] + math.ceil(groups[g].work_items / blocks_grid) * item(groups[g]) for g in s)
                 for s in stages) + c["grid_barrier_us"] * (len(stages) - 1)
    return t_block, t_grid
