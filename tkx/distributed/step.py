"""Run a :class:`~tkx.distributed.planner.DistributedPlan` on the ranks of a ``torch.distributed`` process group.

Per call, on every rank: program A (forward + backward) on the rank's local batch; one asynchronous
``all_reduce`` (sum, then divided by the world size) per bucket, started as soon as the bucket's values
exist (with the schedule interpreter: after the stage of A that writes the last of them; otherwise
after A); wait for all of them; program B (the update) on the averaged values, writing the state in
place as the step does. Nothing but ``torch.distributed`` moves data: gloo on CPU ranks, NCCL on GPUs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from .planner import Bucket, DistributedPlan
from .split import DistributedError

__all__ = ["DataParallelStep"]


class _Collective:
    """The all-reduces of one step: start each bucket once, wait for all, hand out the averages.
    ``plan`` is the :class:`DataParallelStep`'s, already checked against ``group`` (backend, size)."""

    def __init__(self, plan: DistributedPlan, group: Any) -> None:
        self.plan = plan
        self.group = group
        self.started: dict[int, tuple[torch.Tensor, Any]] = {}

    def start(self, bucket: Bucket, outputs: Sequence[torch.Tensor]) -> None:
        first = outputs[bucket.members[0]]
        flat = torch.zeros(bucket.numel, dtype=first.dtype, device=first.device)
        for k, at in zip(bucket.members, bucket.offsets):
            flat[at: at + outputs[k].numel()].copy_(outputs[k].reshape(-1))
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self.started[bucket.index] = (flat, work)

    def start_ready(self, stage: int, outputs: Sequence[torch.Tensor]) -> None:
        for b in self.plan.buckets:
            if b.index not in self.started and b.ready_stage is not None and b.ready_stage <= stage:
                self.start(b, outputs)

    def finish(self, outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Start what is left, wait for everything; the cut values with the averaged ones in place."""
        for b in self.plan.buckets:
            if b.index not in self.started:
                self.start(b, outputs)
        values = list(outputs)
        world = self.plan.world_size
        for b in self.plan.buckets:
            flat, work = self.started[b.index]
            work.wait()
            flat.div_(world)
            for k, at in zip(b.members, b.offsets):
                values[k] = flat[at: at + outputs[k].numel()].view(outputs[k].shape)
        return values


class DataParallelStep:
    """A training step run data parallel: call it like the step, on each rank with its local batch.

    Build it with :func:`tkx.distributed.data_parallel`. ``step(*args)`` takes what the step takes
    (the rank's batch in the batch arguments, the replicated parameters and optimizer state in the
    others), updates the state in place exactly as the step does and returns the step's outputs, the
    loss averaged over the ranks. At the first call (``broadcast_state=True``) every replicated input
    is broadcast from rank 0, as ``DistributedDataParallel`` does when it is built.

    Attributes: ``plan`` (the :class:`~tkx.distributed.planner.DistributedPlan`), ``group`` (the process
    group, ``None`` = the default one), ``rank``, ``last_timings`` (ms of the last call: ``a`` running
    program A, ``wait`` waiting for the all-reduces after A, ``b`` running program B).

    Raises :class:`~tkx.distributed.split.DistributedError` when the process group's size is not the
    plan's, and :class:`tkx.TkxError` for arguments that do not match the captured ones.
    """

    def __init__(self, plan: DistributedPlan, *, group: Any = None, broadcast_state: bool = True) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError(
                "no-process-group", "torch.distributed has no process group on this process",
                hint="start the script with torchrun (python -m torch.distributed.run --nproc_per_node N script.py) "
                     "and call tkx.distributed.init() first, or run it with tkx.distributed.spawn(fn, N)")
        world = dist.get_world_size(group)
        if world != plan.world_size:
            raise DistributedError("bad-input",
                                   f"the plan is for {plan.world_size} ranks, the process group has {world}",
                                   hint=f"pass plan.with_world_size({world}), or make the plan with "
                                        "world_size=dist.get_world_size() (data_parallel(step_fn, inputs) does)")
        backend = str(dist.get_backend(group))
        if backend == "nccl" and plan.executor != "compiled":
            raise DistributedError(
                "bad-input", f"the process group uses NCCL, which moves CUDA tensors only, but the plan runs on "
                             f"the {plan.executor} interpreter with CPU tensors",
                hint="move the step's inputs to cuda:LOCAL_RANK before data_parallel (the kernels then run), or "
                     "start the group with gloo for CPU ranks: tkx.distributed.init('gloo')")
        if plan.backend != dist.get_backend(group):
            plan = dataclasses.replace(plan, backend=str(dist.get_backend(group)))
        self.plan = plan
        self.group = group
        self.rank = dist.get_rank(group)
        self.broadcast_state = broadcast_state
        self.calls = 0
        self.last_timings: dict[str, float] = {}
        self._runners: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"<tkx.distributed.DataParallelStep {self.plan.name}: rank {self.rank} of {self.plan.world_size}, " \
               f"{self.plan.executor}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return self.plan._repr_mimebundle_(include, exclude)

    # -- state -----------------------------------------------------------------------------------
    def broadcast(self, *args: Any) -> None:
        """Copy rank 0's replicated inputs (parameters, optimizer state) into every rank's, in place.

        The leaves of ``plan.split.checked_inputs`` (arguments only the forward/backward reads whose leading
        dimension is not the derived batch's) are not overwritten: each rank compares its own with rank 0's,
        and if any rank differs every rank raises :class:`~tkx.distributed.split.DistributedError`
        (``ambiguous-batch``, naming the argument and the fix) before anything is written."""
        flat = self._flatten(args)
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        split = self.plan.split
        differs = []
        for i in split.checked_inputs:
            t = flat[i].contiguous()
            theirs = t.clone()
            dist.broadcast(theirs, src=src, group=self.group)
            differs.append(0 if torch.equal(theirs, t) else 1)
        if split.checked_inputs:
            flags = torch.tensor(differs, dtype=torch.int32, device=flat[split.checked_inputs[0]].device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            bad = [split.checked_inputs[k] for k, f in enumerate(flags.tolist()) if f]
            if bad:
                prog = split.program
                names = ", ".join(f"{prog.inputs[i].name} {tuple(prog.inputs[i].value.shape)}" for i in bad)
                batch = ", ".join(f"{prog.inputs[i].name} {tuple(prog.inputs[i].value.shape)}"
                                  for i in split.batch_inputs) or "none"
                raise DistributedError(
                    "ambiguous-batch",
                    f"{names} differ between the ranks, but the derived batch is {batch} (the most common leading "
                    "dimension of the arguments only the forward/backward reads), so they were taken as state every "
                    "rank holds equal; broadcasting rank 0's copy would overwrite this rank's data",
                    hint="name the arguments that hold each rank's batch: tkx.distributed.data_parallel(step, inputs, "
                         "batch=(i, j, ...)) or give the batch arguments one leading (batch) dimension; if they are "
                         "state (a frozen network), load the same values on every rank")
        for i in split.replicated_inputs:
            if i in split.checked_inputs:
                continue
            t = flat[i]
            if t.is_contiguous():
                dist.broadcast(t, src=src, group=self.group)
            else:
                tmp = t.contiguous()
                dist.broadcast(tmp, src=src, group=self.group)
                t.copy_(tmp)

    def _flatten(self, args: Sequence[Any]) -> list[torch.Tensor]:
        from ..reference import flatten_inputs
        return flatten_inputs(self.plan.split.forward_backward, args)

    # -- one step ----------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        flat = self._flatten(args)
        if self.calls == 0 and self.broadcast_state and self.plan.world_size > 1:
            self.broadcast(*args)
        self.calls += 1
        p = self.plan
        coll = _Collective(p, self.group)
        t0 = time.perf_counter()
        if p.executor == "schedule":
            from ..schedule import interpreter
            hook = coll.start_ready if p.overlap else None
            outs = list(interpreter.run(p.a.schedule, p.a.arena, flat, on_stage=hook).outputs)
        elif p.executor == "reference":
            from .. import reference
            outs = list(reference.run(p.a.program, flat).outputs)
        else:
            runner_a, _ = self._compiled(flat[0].device)
            outs = runner_a.run_flat(flat)
        t1 = time.perf_counter()
        values = coll.finish(outs)
        t2 = time.perf_counter()
        b_inputs = flat + values
        if p.executor == "schedule":
            from ..schedule import interpreter
            result = interpreter.run(p.b.schedule, p.b.arena, b_inputs, update_inputs=True).output_tree()
        elif p.executor == "reference":
            from .. import reference
            result = reference.run(p.b.program, b_inputs, update_inputs=True).output_tree()
        else:
            from ..runtime.inputs import unflatten_outputs
            _, runner_b = self._compiled(flat[0].device)
            result = unflatten_outputs(p.b.program, runner_b.run_flat(b_inputs))
        t3 = time.perf_counter()
        self.last_timings = {"a": (t1 - t0) * 1e3, "wait": (t2 - t1) * 1e3, "b": (t3 - t2) * 1e3}
        return result

    def _compiled(self, device: torch.device) -> tuple[Any, Any]:
        """The two kernels (A and B), compiled with NVRTC at the first call on this rank's GPU."""
        if self._runners is None:
            from ..codegen import generate
            from ..runtime.runner import CompiledRunner

            p = self.plan
            a = CompiledRunner(generate(p.a.schedule, p.a.arena), device=device)
            b = CompiledRunner(generate(p.b.schedule, p.b.arena), device=device)
            self._runners = (a, b)
        return self._runners
