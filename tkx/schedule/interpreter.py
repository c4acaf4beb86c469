"""The schedule interpreter: run a :class:`FusedSchedule` + :class:`ArenaPlan` with torch.

It executes exactly what the generated kernel will do, at the granularity of groups: stage
by stage, each group reading stored values from *their planned memory* (user inputs,
output tensors, or byte ranges of one flat arena tensor), recomputing inlined ops,
keeping domain values "in registers", and writing its stores to their homes. Inside a
stage the groups run in reverse order, and the arena starts poisoned (all bits set, NaN
for floats), so an overlap of live arena values, a missing barrier or an in-place update
written too early changes the result. Comparing with :func:`tkx.reference.run` therefore
checks the schedule and the arena plan without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import ops as optable
from ..arena import ArenaPlan
from ..dtypes import TORCH
from ..errors import TkxError
from ..indexing import scatter_writes
from ..ir import Op, TensorSpec
from ..reference import Execution, evaluate, flatten_inputs, in_captured_layout
from ..target import GemmPlan
from .model import FusedSchedule, Group, Home


class ScheduleError(TkxError):
    """The schedule reads a value that no earlier stage stored (a scheduler bug)."""


class _Machine:
    def __init__(self, sched: FusedSchedule, arena: ArenaPlan, flat: list[torch.Tensor],
                 splitk_counters: dict[str, list[int]] | None = None, splitk_order: str | int = "reverse") -> None:
        self.s = sched
        #: group id -> the per-tile arrival counters of a "last-slice" split-K group (the kernel's sync
        #: words: they persist across launches, so the last arrival must leave them at 0)
        self.splitk = {} if splitk_counters is None else splitk_counters
        self.splitk_order = splitk_order
        self.arena_plan = arena
        self.p = sched.program
        self.device = flat[0].device
        self.inputs = flat
        self.outputs = [torch.full(o.value.shape, float("nan"), dtype=TORCH[o.value.dtype], device=self.device)
                        if o.value.dtype in ("float32", "bfloat16", "float16")
                        else torch.full(o.value.shape, -1, dtype=TORCH[o.value.dtype], device=self.device)
                        for o in self.p.outputs]
        self.arena = torch.full((max(arena.size_bytes, 1),), 255, dtype=torch.uint8, device=self.device)
        self.ops = {op.id: op for op in self.p.ops}
        self.input_index = {i.value.buffer: k for k, i in enumerate(self.p.inputs)}
        self.written: set[str] = set()

    # -- memory -------------------------------------------------------------------
    def root_tensor(self, buf: str) -> torch.Tensor:
        """The memory holding root buffer ``buf``, shaped as its dense root."""
        if buf in self.input_index:
            return self.inputs[self.input_index[buf]]
        if buf not in self.written:
            raise ScheduleError(f"{buf} is read before any group stored it")
        home = self.s.homes[buf]
        op = self.ops[buf]
        if home.kind == "output":
            return self.outputs[home.index]
        if home.kind == "input":
            return self.inputs[home.index]
        return self.arena_view(buf, op.out.dtype, op.out.numel)

    def arena_view(self, buf: str, dtype: str, numel: int) -> torch.Tensor:
        slot = self.arena_plan.slots[buf]
        nbytes = numel * torch.tensor([], dtype=TORCH[dtype]).element_size()
        return self.arena[slot.offset: slot.offset + nbytes].view(TORCH[dtype])

    def read(self, spec: TensorSpec) -> torch.Tensor:
        root = self.root_tensor(spec.buffer)
        return root.as_strided(spec.shape, spec.strides, root.storage_offset() + spec.offset)

    def store(self, home: Home, buf: str, value: torch.Tensor) -> None:
        op = self.ops[buf]
        if home.kind == "arena":
            self.arena_view(buf, op.out.dtype, op.out.numel).copy_(value.reshape(-1))
        elif home.kind == "output":
            self.outputs[home.index].copy_(value.reshape(self.outputs[home.index].shape))
        else:
            target = self.inputs[home.index]
            target.copy_(value.reshape(target.shape))
        self.written.add(buf)

    # -- computing --------------------------------------------------------------------
    def operand(self, x: Any, regs: dict[str, torch.Tensor], group: Group, memo: dict[str, torch.Tensor]) -> Any:
        if not isinstance(x, TensorSpec):
            return x
        if x.buffer in regs:
            root = regs[x.buffer]
            return root.as_strided(x.shape, x.strides, root.storage_offset() + x.offset)
        if x.buffer in group.inlined:
            if x.buffer not in memo:
                op = self.ops[x.buffer]
                memo[x.buffer] = self.compute(op, regs, group, memo)
            root = memo[x.buffer]
            return root.as_strided(x.shape, x.strides, root.storage_offset() + x.offset)
        if x.buffer in self.ops and x.buffer not in self.s.homes and x.buffer not in self.input_index:
            raise ScheduleError(f"group {group.id} reads {x.buffer}, which is neither stored nor inlined here")
        return self.read(x)

    def compute(self, op: Op, regs: dict[str, torch.Tensor], group: Group,
                memo: dict[str, torch.Tensor]) -> torch.Tensor:
        args = [self.operand(x, regs, group, memo) for x in op.inputs]
        out = evaluate(op, args, self.device).to(TORCH[op.out.dtype])
        if tuple(out.shape) != op.out.shape:
            out = out.expand(op.out.shape)
        out = out.contiguous()
        # A value "in registers" is the group's own copy: an op that returns its operand (a sum
        # over no dims, a same-dtype cast) would otherwise hand back a view of the arena or an
        # input, which a later store in the same group would change under it.
        if any(isinstance(a, torch.Tensor) and a.numel() and out.numel()
               and a.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() for a in args):
            out = out.clone()
        return out

    def run_group(self, grp: Group) -> None:
        regs: dict[str, torch.Tensor] = {}
        memo: dict[str, torch.Tensor] = {}
        if grp.kind == "copy":
            task = self.s.copies[grp.id]
            value = self.read(task.src)
            dst = self.outputs[task.dst_home.index] if task.dst_home.kind == "output" \
                else self.inputs[task.dst_home.index]
            dst.copy_(value.to(dst.dtype).reshape(dst.shape))
            return
        ops = [self.ops[o] for o in grp.ops]
        if grp.kind == "reduction_partial":
            name = grp.stores[0]
            red = ops[0]
            x = self.operand(red.inputs[0], regs, grp, memo)
            parts = self.partials(red, x, grp.params["parts"])
            self.arena_view(name, "float32", parts.numel()).copy_(parts.reshape(-1))
            self.written.add(name)
            return
        if grp.kind == "attention_partial":  # flash-decoding phase 1: partials of each KV tile
            name = grp.stores[0]
            parts = self.decode_partials(ops[0], regs, grp, memo, grp.params)
            self.arena_view(name, "float32", parts.numel()).copy_(parts)
            self.written.add(name)
            return
        if grp.kind == "attention" and grp.params.get("partials"):  # flash-decoding phase 2: the combine
            att = ops[0]
            self.store(self.s.homes[att.id], att.id,
                       self.decode_combine(grp.params, zero_empty_rows=att.attr("empty_rows", "zero") == "zero"))
            return
        if grp.kind == "gemm_partial":  # split-K phase 1: fp32 products over slices of K
            name = grp.stores[0]
            parts = self.gemm_slices(ops[0], regs, grp, memo, grp.plan)
            self.arena_view(name, "float32", parts.numel()).copy_(parts.reshape(-1))
            self.written.add(name)
            return
        if grp.kind == "pointwise" and grp.params.get("slice_write"):
            self.slice_write(grp, ops[0], regs, memo)
            return
        start = 0
        if grp.kind == "gemm" and grp.params.get("partials"):  # split-K: add the slices in order
            mm, gp = ops[0], grp.plan
            assert isinstance(gp, GemmPlan)
            if gp.split_final == "last-slice":
                acc = self.last_slice_sums(grp, mm, regs, memo).reshape(mm.out.shape)
            else:  # the final phase of its own: every slice was written a stage before
                total = gp.split_k * gp.batch * gp.m * gp.n
                slices = self.arena_view(gp.partials, "float32", total).reshape(gp.split_k, -1)
                acc = slices[0].clone()
                for piece in slices[1:]:
                    acc = acc + piece
                acc = acc.reshape(mm.out.shape)
            if mm.kind == "addmm":
                bias = self.operand(mm.inputs[0], regs, grp, memo).float()
                acc = mm.attr("alpha", 1) * acc + mm.attr("beta", 1) * bias
            regs[mm.id] = acc.to(TORCH[mm.out.dtype]).expand(mm.out.shape).contiguous()
            start = 1
        if grp.kind == "reduction" and "partials" in grp.params:
            red = ops[0]
            rows, parts = grp.params["rows"], grp.params["parts"]
            partial = self.arena_view(grp.params["partials"], "float32", rows * parts).reshape(rows, parts)
            fold = optable.row(red.kind).reduction
            if fold is None:
                raise ScheduleError(f"group {grp.id}: {red.kind} has no reduction row to fold partials with")
            total = fold.combine(partial, 1)
            if fold.divide:
                total = total / grp.params["size"]
            regs[red.id] = total.to(TORCH[red.out.dtype]).reshape(red.out.shape).contiguous()
            start = 1
        for op in ops[start:]:
            regs[op.id] = self.compute(op, regs, grp, memo)
        for s in grp.stores:
            if s not in self.s.scratch:  # a "last-slice" split-K group's slices are written above
                self.store(self.s.homes[s], s, regs[s])

    def last_slice_sums(self, grp: Group, mm: Op, regs: dict[str, torch.Tensor],
                        memo: dict[str, torch.Tensor]) -> torch.Tensor:
        """[batch, m, n] float32: a "last-slice" split-K group item by item, as the kernel runs it.

        Work item ``s * tiles + t`` writes tile ``t`` of slice ``s`` into the scratch, then bumps tile
        ``t``'s arrival counter; the item that finds ``split_k - 1`` there resets it to 0 and adds the
        tile's slices in slice order. Items run in ``splitk_order`` (``"reverse"``: slice 0 of each
        tile arrives last; ``"forward"``; an int: a seeded shuffle). A tile no last item finished stays
        NaN; a counter above ``split_k - 1`` (not reset by the previous launch) or left nonzero raises
        :class:`ScheduleError`."""
        gp = grp.plan
        assert isinstance(gp, GemmPlan)
        split, batch, m, n, tm, tn = gp.split_k, gp.batch, gp.m, gp.n, gp.tile_m, gp.tile_n
        tiles_n = -(-n // tn)
        per_batch = -(-m // tm) * tiles_n
        tiles = batch * per_batch
        slices = self.gemm_slices(mm, regs, grp, memo, gp).reshape(split, batch, m, n)
        scratch = self.arena_view(gp.partials, "float32", split * batch * m * n).reshape(split, batch, m, n)
        self.written.add(gp.partials)
        counters = self.splitk.setdefault(grp.id, [0] * tiles)
        if len(counters) != tiles:
            raise ScheduleError(f"group {grp.id}: {len(counters)} arrival counters for {tiles} tiles")
        items = list(range(split * tiles))
        if self.splitk_order == "reverse":
            items.reverse()
        elif isinstance(self.splitk_order, int):
            import random
            random.Random(self.splitk_order).shuffle(items)
        acc = torch.full((batch, m, n), float("nan"), device=slices.device)
        for item in items:
            sl, t = divmod(item, tiles)
            bat, tile = divmod(t, per_batch)
            r0, c0 = (tile // tiles_n) * tm, (tile % tiles_n) * tn
            region = (bat, slice(r0, r0 + tm), slice(c0, c0 + tn))
            scratch[sl][region] = slices[sl][region]
            arrived = counters[t]
            counters[t] = arrived + 1
            if arrived >= split:
                raise ScheduleError(f"group {grp.id}: tile {t}'s arrival counter stood at {arrived} before slice "
                                    f"{sl} arrived, above {split - 1}: it was not reset by the previous launch")
            if arrived == split - 1:  # the last slice of this tile: reset the counter, add the slices in order
                counters[t] = 0
                total = scratch[0][region].clone()
                for piece in scratch[1:]:
                    total = total + piece[region]
                acc[region] = total
        left = [t for t, c in enumerate(counters) if c]
        if left:
            raise ScheduleError(f"group {grp.id}: the arrival counters of tiles {left[:8]} stand at "
                                f"{[counters[t] for t in left[:8]]} after the group (not reset for the next launch)")
        return acc

    def slice_write(self, grp: Group, op: Op, regs: dict[str, torch.Tensor], memo: dict[str, torch.Tensor]) -> None:
        """A ``scatter`` written in place (the kernel's loop over the values): only the indexed positions
        of the input tensor change; the old value is never read."""
        home = self.s.homes[op.id]
        if home.kind != "input":
            raise ScheduleError(f"group {grp.id}: a slice write must go to an input, not {home}")
        index = self.operand(op.inputs[1], regs, grp, memo)
        values = self.operand(op.inputs[2], regs, grp, memo)
        target = self.inputs[home.index]
        if not target.is_contiguous():
            raise ScheduleError(f"group {grp.id}: input {home.index} is not dense, so no slice write goes to it")
        pos, vals = scatter_writes(op, op.out.shape, index, values)
        target.view(-1)[pos] = vals.to(target.dtype)
        self.written.add(op.id)

    def gemm_slices(self, mm: Op, regs: dict[str, torch.Tensor], grp: Group, memo: dict[str, torch.Tensor],
                    plan: GemmPlan) -> torch.Tensor:
        """[split_k, batch * m * n] float32: the product over each slice of K (whole tile_k steps)."""
        a_spec, b_spec = (mm.inputs[1], mm.inputs[2]) if mm.kind == "addmm" else (mm.inputs[0], mm.inputs[1])
        a = self.operand(a_spec, regs, grp, memo).float()
        b = self.operand(b_spec, regs, grp, memo).float()
        k, tk, split = plan.k, plan.tile_k, plan.split_k
        steps = -(-k // tk)
        per = -(-steps // split) * tk
        out = []
        for s in range(split):
            lo, hi = s * per, min(k, (s + 1) * per)
            if lo >= hi:
                out.append(torch.zeros(a.shape[:-1] + b.shape[-1:], device=a.device).reshape(-1))
            else:
                out.append(torch.matmul(a[..., lo:hi], b[..., lo:hi, :]).reshape(-1))
        return torch.stack(out)

    def decode_partials(self, att: Op, regs: dict[str, torch.Tensor], grp: Group, memo: dict[str, torch.Tensor],
                        plan: Any) -> torch.Tensor:
        """Flash-decoding's scratch ``[acc | m | l]`` (flat float32, :func:`tkx.target.decode_partials_layout`):
        per (batch, KV tile of ``tile_k`` keys, query row) the tile's maximum score ``m`` (``-inf`` when every
        key is masked), ``l = sum exp(s - m)`` and ``acc = sum exp(s - m) v``."""
        from .. import attention_ref as ref

        q, k, v = (self.operand(x, regs, grp, memo) for x in att.inputs[:3])
        mask = self.operand(att.inputs[3], regs, grp, memo) if plan["mask"] != "none" else None
        s = ref.scores(q, k, mask, plan["causal"], plan["scale"])         # [*B, L, S] float32
        nb, lq, lk, ev, tk, kt = plan["batch"], plan["q_len"], plan["kv_len"], plan["value_dim"], plan["tile_k"], \
            -(-plan["kv_len"] // plan["tile_k"])
        pad = kt * tk - lk
        s = torch.nn.functional.pad(s.reshape(nb, lq, lk), (0, pad), value=float("-inf")).reshape(nb, lq, kt, tk)
        vv = torch.nn.functional.pad(v.float().reshape(nb, lk, ev), (0, 0, 0, pad)).reshape(nb, kt, tk, ev)
        m = s.amax(-1)                                                        # [B, L, KT]
        p = torch.where(m.unsqueeze(-1) == float("-inf"), torch.zeros_like(s), torch.exp(s - m.unsqueeze(-1)))
        acc = torch.einsum("blpj,bpje->bple", p, vv)                          # [B, KT, L, Ev]
        return torch.cat([acc.reshape(-1), m.transpose(1, 2).reshape(-1), p.sum(-1).transpose(1, 2).reshape(-1)])

    def decode_combine(self, plan: Any, *, zero_empty_rows: bool = True) -> torch.Tensor:
        """Flash-decoding's combine: the packed float32 root ``[out | lse]`` from the partials; a query row whose
        keys are all masked is 0 (``zero_empty_rows``, as the kernel's combine and eager) or NaN."""
        nb, lq, ev, kt = plan["batch"], plan["q_len"], plan["value_dim"], -(-plan["kv_len"] // plan["tile_k"])
        rows = nb * kt * lq
        flat = self.arena_view(plan["partials"], "float32", rows * (ev + 2))
        acc = flat[: rows * ev].reshape(nb, kt, lq, ev)
        m = flat[rows * ev: rows * (ev + 1)].reshape(nb, kt, lq)
        den = flat[rows * (ev + 1):].reshape(nb, kt, lq)
        top = m.amax(1, keepdim=True)                                        # [B, 1, L]
        w = torch.where(m == float("-inf"), torch.zeros_like(m), torch.exp(m - top))
        total = (den * w).sum(1)                                              # [B, L]
        out = (acc * w.unsqueeze(-1)).sum(1) / total.unsqueeze(-1)
        if zero_empty_rows and plan["mask"] != "none":
            out = torch.where(total.unsqueeze(-1) == 0, torch.zeros_like(out), out)
        return torch.cat([out.reshape(-1), (top.squeeze(1) + torch.log(total)).reshape(-1)])

    @staticmethod
    def partials(red: Op, x: torch.Tensor, parts: int) -> torch.Tensor:
        """[rows, parts] float32 partial results: each part reduces a contiguous chunk."""
        dims = tuple(red.attr("dims", ()))
        kept = [d for d in range(x.ndim) if d not in dims]
        rows = 1
        for d in kept:
            rows *= x.shape[d]
        fold = optable.row(red.kind).reduction
        if fold is None:
            raise ScheduleError(f"{red.id}: {red.kind} has no reduction row (a partial reduction of it is a bug)")
        flat = x.permute(*kept, *dims).reshape(rows, -1).float()
        size = flat.shape[1]
        chunk = -(-size // parts)
        out = []
        for p in range(parts):
            piece = flat[:, p * chunk: min((p + 1) * chunk, size)]
            if piece.shape[1] == 0:
                out.append(torch.full((rows,), fold.empty, device=x.device))
            else:
                out.append(fold.combine(piece, 1))
        return torch.stack(out, dim=1)


def run(sched: FusedSchedule, arena: ArenaPlan, inputs: Sequence[Any], *, update_inputs: bool = False,
        on_stage: Callable[[int, list[torch.Tensor]], None] | None = None,
        splitk_counters: dict[str, list[int]] | None = None, splitk_order: str | int = "reverse") -> Execution:
    """Execute ``sched`` with ``arena`` on ``inputs`` (flat tensors or the step's pytrees).

    Returns an :class:`tkx.reference.Execution` (outputs, updates) comparable with
    :func:`tkx.reference.run`. It runs on copies laid out exactly as captured; with
    ``update_inputs=True`` the in-place state updates are then copied into the given tensors.
    ``on_stage(stage_index, outputs)``, if given, is called after each stage with the output tensors
    (those a finished stage wrote are final: :mod:`tkx.distributed` starts all-reduces from it).
    ``splitk_counters``: group id -> the per-tile arrival counters of each "last-slice" split-K group
    (the kernel's sync words, zero at the first launch): pass the same dict to consecutive runs to
    model repeated launches (updated in place; every counter must be back at 0 after a run).
    ``splitk_order``: the order those groups' work items arrive in (see ``_Machine.last_slice_sums``).
    """
    flat = flatten_inputs(sched.program, inputs)
    originals = flat
    # Work on copies laid out exactly as captured (strides and storage extent), like the kernel.
    flat = [in_captured_layout(t, spec.value, copy=True) for spec, t in zip(sched.program.inputs, originals)]
    m = _Machine(sched, arena, flat, splitk_counters, splitk_order)
    for k, stage in enumerate(sched.stages):
        for gid in reversed(stage):
            m.run_group(sched.groups[gid])
        if on_stage is not None:
            on_stage(k, m.outputs)
    updates = {u.input_index: m.inputs[u.input_index] for u in sched.program.updates}
    if update_inputs:
        with torch.no_grad():  # an input may be an nn.Parameter (requires_grad)
            for i, new in updates.items():
                originals[i].copy_(new)
        updates = {i: originals[i] for i in updates}
    return Execution(sched.program, m.outputs, updates, {})
