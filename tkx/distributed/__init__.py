"""Data parallel training on ``torch.distributed``: the same step on every rank, the gradients averaged.

::

    import tkx.distributed as td

    td.init()                                    # under torchrun: NCCL on GPUs, gloo on CPUs
    step = td.data_parallel(train_step, (params, momentum, x_local, y_local))
    for x_local, y_local in my_shard_of_the_data:
        loss = step(params, momentum, x_local, y_local)   # params, momentum updated in place

How it works. tkx captures the step on one rank's inputs and cuts it at the gradient
(:func:`split_at_gradients`): program **A** is the forward and backward pass (one schedule, one kernel on
a GPU) and ends with the gradients; program **B** is the optimizer update and starts from them. Between
the two every rank all-reduces the gradients (and the loss) with ``torch.distributed``, bucketed
(``bucket_bytes``, 25 MiB by default as in ``DistributedDataParallel``) and asynchronous: with the schedule
interpreter a bucket starts right after the stage of A that writes its last gradient, so it travels while
A's later stages run; B waits for all of them. The plan (:class:`DistributedPlan`) shows where the collective
sits and the bytes each bucket moves per step.

What the result means. The all-reduce *averages* the gradients. When the loss is a mean over the local
batch and every rank has a batch of the same size, the average of the local gradients is the gradient of
the mean over the global batch: N ranks with batches of b train exactly like one process with the
concatenated batch of N x b (up to floating-point summation order; the tests check it for 2 and 4 ranks).
A loss that is a *sum* over the batch gives the global sum divided by N; unequal local batches, or a mean
over a data-dependent count (``ignore_index`` tokens), weight the ranks' samples unequally. Forward values
of the local batch that the update reads (batch-norm running statistics) are refused unless
``local_values`` says to average or keep them; the forward pass normalises with local statistics, as
PyTorch's ``BatchNorm`` under DDP does without ``SyncBatchNorm``.

Executors: on CPU ranks (gloo) A and B run through the *schedule interpreter*, which executes the fused
schedule and the arena plan exactly as the kernel will (poisoned arena, stage by stage), so CI checks the
schedules that the GPU would run, and its stage loop lets buckets start mid-A; ``executor="reference"``
runs the reference interpreter instead (the oracle; no overlap). On GPUs (NCCL) A and B are the two
compiled kernels; the all-reduces start after A's kernel (one kernel cannot hand a bucket over
mid-flight).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .launch import free_port, init, spawn, under_torchrun
from .planner import DEFAULT_BUCKET_BYTES, EXECUTORS, Bucket, DistributedPlan, make_plan
from .split import CutValue, DistributedError, GradientSplit, split_at_gradients
from .step import DataParallelStep

__all__ = ["data_parallel", "plan", "DataParallelStep", "DistributedPlan", "Bucket", "GradientSplit", "CutValue",
           "DistributedError", "split_at_gradients", "init", "spawn", "free_port", "under_torchrun",
           "DEFAULT_BUCKET_BYTES", "EXECUTORS"]


def plan(step_fn: Callable[..., Any], example_inputs: Sequence[Any], *, world_size: int = 2,
         **kw: Any) -> DistributedPlan:
    """The :class:`DistributedPlan` of ``step_fn`` on ``world_size`` ranks, made without any process group
    (to look at in a notebook). ``example_inputs``: ONE rank's arguments. Keywords as :func:`data_parallel`."""
    return make_plan(step_fn, example_inputs, world_size=world_size, **kw)


def data_parallel(step_fn: Callable[..., Any] | DistributedPlan, example_inputs: Sequence[Any] = (), *,
                  group: Any = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES, batch: Sequence[int] | None = None,
                  local_values: str = "error", average_loss: bool = True, executor: str = "auto",
                  overlap: bool = True, options: Any = None, loss: int | None = None, name: str | None = None,
                  broadcast_state: bool = True) -> DataParallelStep:
    """Run ``step_fn`` data parallel over the ranks of ``group`` (default: the default process group).

    Parameters
    ----------
    step_fn
        A tkx training step (forward, loss, ``torch.func.grad_and_value``, optimizer update; in-place or
        functional), or a :class:`DistributedPlan` made before (e.g. by :func:`plan` in the parent of
        :func:`spawn`'s forked ranks: they then skip capture and scheduling).
    example_inputs
        ONE rank's arguments: the local batch's shapes (every rank must use the same shapes).
    bucket_bytes
        Cap of each gradient bucket in bytes (default 25 MiB, DDP's ``bucket_cap_mb=25``).
    batch
        Positional indices of the arguments holding the local batch; default: the arguments that only
        the forward/backward pass reads. The others are replicated and broadcast from rank 0 at the
        first call (``broadcast_state``).
    local_values, average_loss
        See :func:`split_at_gradients`.
    executor
        ``"auto"`` (``"compiled"`` for CUDA inputs, else ``"schedule"``), ``"schedule"``, ``"reference"``.
    overlap
        Start each bucket as soon as the schedule of A has written it (schedule interpreter only).
    options
        :class:`tkx.Options` for both programs.

    Returns
    -------
    DataParallelStep
        Call it like the step, on every rank, with the rank's local batch.

    Raises
    ------
    DistributedError
        No process group, a plan for another world size, a step without a gradient boundary, batch
        statistics the update reads; and what :func:`tkx.capture` raises.
    """
    import torch.distributed as dist

    if isinstance(step_fn, DistributedPlan):
        return DataParallelStep(step_fn, group=group, broadcast_state=broadcast_state)
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedError(
            "no-process-group", "torch.distributed has no process group on this process",
            hint="start the script with torchrun (python -m torch.distributed.run --nproc_per_node N script.py) "
                 "and call tkx.distributed.init() first, or run it with tkx.distributed.spawn(fn, N); "
                 "tkx.distributed.plan(step, inputs, world_size=N) shows the plan without processes")
    p = make_plan(step_fn, example_inputs, world_size=dist.get_world_size(group), backend=dist.get_backend(group),
                  options=options, bucket_bytes=bucket_bytes, batch=batch, local_values=local_values,
                  average_loss=average_loss, executor=executor, overlap=overlap, loss=loss, name=name)
    return DataParallelStep(p, group=group, broadcast_state=broadcast_state)
