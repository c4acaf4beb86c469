"""The distributed plan: the split step, the schedules of its two programs, and the gradient buckets.

:func:`make_plan` captures a step, cuts it at the gradient (:mod:`tkx.distributed.split`), runs the
passes, the scheduler and the arena planner on each half, and packs the averaged cut values into
buckets (:class:`Bucket`) in the order the schedule of A finishes them. A :class:`DistributedPlan` is a
stage object like the others: immutable, and it renders (text and HTML, :mod:`tkx.render.distributed`)
where the collective sits and how many bytes each bucket moves per step. It needs no process group:
``world_size`` is a number, so a notebook can look at the plan of a 4-rank run on one CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import display
from ..dtypes import DTYPE_BYTES, DTYPE_SHORT
from ..ir import Program
from .split import CutValue, DistributedError, GradientSplit, split_at_gradients

__all__ = ["Bucket", "DistributedPlan", "Half", "make_plan", "EXECUTORS", "DEFAULT_BUCKET_BYTES", "ALIGN_BYTES",
           "ready_stages"]

#: How the programs run: ``"schedule"`` (the schedule interpreter, CPU or GPU tensors), ``"reference"``
#: (the reference interpreter on the optimised programs) or ``"compiled"`` (the generated kernels, GPU).
EXECUTORS = ("schedule", "reference", "compiled")

#: ``torch.nn.parallel.DistributedDataParallel``'s default ``bucket_cap_mb`` (25 MiB), in bytes.
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


#: Each bucket member starts at a multiple of this many bytes in the bucket's flat buffer, so the
#: averaged values handed to program B are as aligned as fresh tensors (vector loads, cp.async).
ALIGN_BYTES = 256


@dataclass(frozen=True)
class Bucket:
    """Cut values all-reduced together as one flat tensor of one dtype.

    ``members``: cut indices (:attr:`CutValue.index`) in buffer order; ``offsets``: the element offset of
    each in the flat buffer (multiples of :data:`ALIGN_BYTES`); ``numel``: elements of the flat buffer
    (members plus alignment padding); ``payload_bytes``: the members' own bytes; ``ready_stage``: the
    stage of A after which every member is written, so the all-reduce can start while A's later stages
    run (``None``: after A finishes); ``world_size``: ranks taking part.
    """

    index: int
    dtype: str
    members: tuple[int, ...]
    offsets: tuple[int, ...]
    numel: int
    payload_bytes: int
    ready_stage: int | None
    world_size: int

    @property
    def nbytes(self) -> int:
        """Bytes of the flat buffer each rank all-reduces (payload plus alignment padding)."""
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def ring_bytes_per_rank(self) -> int:
        """Bytes each rank sends for this bucket in a ring all-reduce: ``2 (N - 1) / N x nbytes``
        (reduce-scatter then all-gather; the "bus bytes" of nccl-tests). 0 on one rank."""
        n = self.world_size
        return 0 if n <= 1 else (2 * (n - 1) * self.nbytes + n - 1) // n


def ready_stages(schedule: Any) -> dict[int, int]:
    """Output index -> the last stage of ``schedule`` that writes it (a stored value or a copy)."""
    ready: dict[int, int] = {}
    copies = schedule.copies
    for k, stage in enumerate(schedule.stages):
        for gid in stage:
            grp = schedule.groups[gid]
            if grp.kind == "copy" and gid in copies and copies[gid].dst_home.kind == "output":
                ready[copies[gid].dst_home.index] = k
            for buf in grp.stores:
                home = schedule.homes.get(buf)
                if home is not None and home.kind == "output":
                    ready[home.index] = k
    return ready


def _buckets(split: GradientSplit, ready: dict[int, int] | None, bucket_bytes: int, world: int) -> tuple[Bucket, ...]:
    """Pack the averaged cut values into buckets of at most ``bucket_bytes`` (a larger value gets a
    bucket of its own), one dtype per bucket, in the order A finishes them."""
    last = None if ready is None else max(ready.values(), default=0)

    def when(c: CutValue) -> int:
        return last if ready is None or c.index not in ready else ready[c.index]  # type: ignore[return-value]

    todo = sorted(split.averaged, key=lambda c: (when(c) if when(c) is not None else 0, c.index))
    open_: dict[str, list[CutValue]] = {}
    done: list[list[CutValue]] = []
    for c in todo:
        members = open_.setdefault(c.dtype, [])
        if members and sum(m.nbytes for m in members) + c.nbytes > bucket_bytes:  # the payload is capped
            done.append(members)
            members = open_[c.dtype] = []
        members.append(c)
    done.extend(m for m in open_.values() if m)
    done.sort(key=lambda ms: (max((when(m) or 0) for m in ms), ms[0].index))
    out = []
    for k, ms in enumerate(done):
        stage = None if ready is None else max(when(m) for m in ms)
        align = max(1, ALIGN_BYTES // DTYPE_BYTES[ms[0].dtype])
        offsets, at = [], 0
        for m in ms:
            offsets.append(at)
            at += -(-(m.nbytes // DTYPE_BYTES[m.dtype]) // align) * align
        last_numel = ms[-1].nbytes // DTYPE_BYTES[ms[-1].dtype]
        numel = offsets[-1] + last_numel
        out.append(Bucket(k, ms[0].dtype, tuple(m.index for m in ms), tuple(offsets), numel,
                          sum(m.nbytes for m in ms), stage, world))
    return tuple(out)


@dataclass(frozen=True)
class Half:
    """One of the two programs of a data-parallel step after the passes (A: forward and backward, B: the
    update), its :class:`~tkx.schedule.FusedSchedule` and its :class:`~tkx.arena.ArenaPlan` (on a GPU, one
    kernel)."""

    program: Program
    schedule: Any = field(repr=False)
    arena: Any = field(repr=False)

    @classmethod
    def planned(cls, program: Program, options: Any) -> Half:
        """``program`` after ``options.passes``, scheduled and placed in an arena under ``options``."""
        from ..arena import plan as plan_arena
        from ..passes import run_passes
        from ..schedule import schedule

        after = run_passes(program, options.passes).output
        s = schedule(after, options)
        return cls(after, s, plan_arena(s))


@dataclass(frozen=True)
class DistributedPlan:
    """A data-parallel step, planned: what runs where and what the collective moves.

    Attributes
    ----------
    split
        The :class:`~tkx.distributed.split.GradientSplit` (captured program, the two programs before
        the passes, the cut values, which inputs are the batch).
    a, b
        Programs A (forward and backward) and B (the update) after the passes, each with its schedule and
        arena (:class:`Half`; on a GPU each becomes one kernel).
    buckets
        The all-reduces between A and B, in launch order (:class:`Bucket`).
    world_size, backend
        Ranks and the ``torch.distributed`` backend (``"gloo"``, ``"nccl"``; ``"planned"`` when no
        process group was asked).
    executor
        One of :data:`EXECUTORS`. ``overlap``: whether buckets start while A still runs (the schedule
        interpreter starts each after its ready stage; one compiled kernel cannot be interrupted, so
        with ``"compiled"`` and ``"reference"`` they start after A).
    bucket_bytes
        The bucket size cap in bytes.
    """

    split: GradientSplit
    a: Half
    b: Half
    buckets: tuple[Bucket, ...]
    world_size: int
    backend: str
    executor: str
    overlap: bool
    bucket_bytes: int
    options: Any = field(repr=False, default=None)

    @property
    def name(self) -> str:
        return self.split.program.name

    @property
    def bytes_per_step(self) -> int:
        """Payload bytes all-reduced per step (the sum over buckets)."""
        return sum(b.nbytes for b in self.buckets)

    @property
    def ring_bytes_per_rank(self) -> int:
        """Bytes each rank sends per step in ring all-reduces (:attr:`Bucket.ring_bytes_per_rank`)."""
        return sum(b.ring_bytes_per_rank for b in self.buckets)

    def with_world_size(self, world_size: int) -> DistributedPlan:
        """The same plan for ``world_size`` ranks (the buckets' byte counts change; nothing is recaptured)."""
        return self._rebucket(int(world_size), self.bucket_bytes)

    def with_bucket_bytes(self, bucket_bytes: int) -> DistributedPlan:
        """The same plan with buckets of at most ``bucket_bytes`` bytes (> 0)."""
        return self._rebucket(self.world_size, int(bucket_bytes))

    def _rebucket(self, world: int, bucket_bytes: int) -> DistributedPlan:
        if world < 1 or bucket_bytes <= 0:
            raise DistributedError("bad-input", f"world_size={world}, bucket_bytes={bucket_bytes}",
                                   hint="pass world_size >= 1 and bucket_bytes > 0")
        ready = ready_stages(self.a.schedule) if self.overlap else None
        return dataclasses.replace(self, world_size=world, bucket_bytes=bucket_bytes,
                                   buckets=_buckets(self.split, ready, bucket_bytes, world))

    def cut_value(self, index: int) -> CutValue:
        return self.split.cut[index]

    def input_text(self, indices: Sequence[int]) -> list[str]:
        """``x f32[64, 64]`` for each flat input index."""
        ins = self.split.program.inputs
        return [f"{ins[i].name} {DTYPE_SHORT.get(ins[i].value.dtype, ins[i].value.dtype)}"
                f"[{', '.join(map(str, ins[i].value.shape))}]" for i in indices]

    def __repr__(self) -> str:
        from ..words import plural
        return (f"<tkx.distributed.DistributedPlan {self.name}: {self.world_size} ranks ({self.backend}), "
                f"{plural(len(self.split.gradients), 'gradient')} in {plural(len(self.buckets), 'bucket')}, "
                f"{self.bytes_per_step:,} B all-reduced per step, {self.executor}>")

    def __str__(self) -> str:
        return display.text(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display.mimebundle(self, include, exclude)


def make_plan(step_fn: Callable[..., Any], example_inputs: Sequence[Any], *, world_size: int, backend: str = "planned",
              options: Any = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES, batch: Sequence[int] | None = None,
              local_values: str = "error", average_loss: bool = True, executor: str = "auto",
              overlap: bool = True, loss: int | None = None, name: str | None = None) -> DistributedPlan:
    """Capture ``step_fn`` on one rank's ``example_inputs``, split it at the gradient and plan the buckets.

    ``example_inputs`` are the arguments of ONE rank (its local batch). ``executor="auto"``: ``"compiled"``
    for CUDA example inputs, else ``"schedule"``. ``bucket_bytes`` (> 0) caps each bucket. The other
    keywords are those of :func:`~tkx.distributed.split.split_at_gradients` and :func:`tkx.capture`.
    Raises :class:`~tkx.distributed.split.DistributedError` (and what capture raises).
    """
    import torch
    from torch.utils._pytree import tree_flatten

    from ..capture import capture
    from ..options import as_options

    if int(world_size) < 1:
        raise DistributedError("bad-input", f"world_size={world_size}", hint="pass the number of ranks (>= 1)")
    if int(bucket_bytes) <= 0:
        raise DistributedError("bad-input", f"bucket_bytes={bucket_bytes}",
                               hint="pass the bucket size cap in bytes, e.g. 25 * 2**20 (DDP's default)")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    leaves = [t for t in tree_flatten(tuple(example_inputs))[0] if isinstance(t, torch.Tensor)]
    on_gpu = any(t.is_cuda for t in leaves)
    if executor == "auto":
        executor = "compiled" if on_gpu else "schedule"
    if executor not in EXECUTORS:
        raise DistributedError("bad-input", f"executor={executor!r}",
                               hint=f"pass one of {', '.join(EXECUTORS)} or 'auto'")
    if executor == "compiled" and not on_gpu:
        raise DistributedError("bad-input", "executor='compiled' needs CUDA example inputs (the kernels run on a GPU)",
                               hint="move the example inputs to the rank's GPU, or use executor='schedule' on CPU")
    options = as_options(options)
    if executor == "compiled":
        from ..pipeline import _options_for_device
        options = _options_for_device(options, leaves[0].device)
    captured = capture(step_fn, example_inputs, loss=loss, name=name)
    split = split_at_gradients(captured.program, loss_index=captured.loss_index, batch=batch,
                               local_values=local_values, average_loss=average_loss)
    a, b = Half.planned(split.forward_backward, options), Half.planned(split.update, options)
    overlap = bool(overlap) and executor == "schedule"
    ready = ready_stages(a.schedule) if overlap else None
    buckets = _buckets(split, ready, int(bucket_bytes), int(world_size))
    return DistributedPlan(split, a, b, buckets, int(world_size), backend, executor, overlap, int(bucket_bytes),
                           options)
