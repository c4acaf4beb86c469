"""Starting ranks: :func:`init` under ``torchrun``, :func:`spawn` for tests and notebooks.

* Under ``torchrun`` (``python -m torch.distributed.run --nproc_per_node N script.py``) every process
  finds ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its environment; :func:`init`
  joins the process group from them (NCCL when CUDA is available, else gloo) and, on GPUs, makes
  ``cuda:LOCAL_RANK`` the current device.
* :func:`spawn` starts N processes on this machine itself (``torch.multiprocessing``), joins them
  through a file store in a fresh temporary folder (no TCP port to pick, nothing to collide with),
  runs ``fn(rank, world_size, *args)`` on each and returns what each returned.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .split import DistributedError

__all__ = ["init", "spawn", "free_port", "under_torchrun"]


def under_torchrun() -> bool:
    """True when ``torchrun`` started this process (``RANK`` and ``WORLD_SIZE`` are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a ``tcp://`` init method)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init(backend: str | None = None, *, timeout_s: float = 300.0) -> tuple[int, int]:
    """Join the default process group from ``torchrun``'s environment; returns ``(rank, world_size)``.

    ``backend``: ``"nccl"`` or ``"gloo"`` (default: NCCL when CUDA is available, else gloo). On NCCL the
    current CUDA device becomes ``LOCAL_RANK``. A second call returns the existing group's numbers.
    Raises :class:`~tkx.distributed.split.DistributedError` outside ``torchrun`` and when NCCL is asked
    for with fewer GPUs than local ranks.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if not under_torchrun():
        raise DistributedError("no-process-group", "tkx.distributed.init() found no torchrun environment "
                                                   "(RANK and WORLD_SIZE are not set)",
                               hint="start the script with python -m torch.distributed.run --nproc_per_node N "
                                    "script.py, or use tkx.distributed.spawn(fn, N) from one process")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        n = torch.cuda.device_count()
        if local >= n:
            raise DistributedError("no-process-group", f"NCCL rank with LOCAL_RANK={local} but this machine has "
                                                       f"{n} CUDA device{'s' if n != 1 else ''}",
                                   hint="start at most one process per GPU (--nproc_per_node <= GPUs), or pass "
                                        "backend='gloo' for CPU ranks")
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def _entry(rank: int, fn: Callable[..., Any], world: int, backend: str, init_method: str, results: str,
           args: tuple, timeout_s: float, threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        out = fn(rank, world, *args)
        with open(Path(results) / f"{rank}.pkl", "wb") as f:
            pickle.dump(out, f)
        # a rank that ran no collective must not close its connections while a peer is still making its
        # own (gloo's full mesh); if fn raised, the parent's join stops the other ranks instead
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (), *, backend: str = "gloo",
          start_method: str = "auto", timeout_s: float = 120.0, threads: int | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new processes joined in one process group.

    Parameters
    ----------
    fn
        Called on every rank after ``torch.distributed.init_process_group``; its (picklable) return
        value comes back. With ``start_method="spawn"`` it must be importable (a module-level function).
    backend
        ``"gloo"`` (CPU ranks) or ``"nccl"`` (rank r on ``cuda:r``; needs ``world_size`` GPUs).
    start_method
        ``"fork"``, ``"spawn"`` or ``"forkserver"``; ``"auto"``: ``"fork"`` where the OS has it and this
        process has not initialised CUDA (fast: the children inherit imported modules and anything built
        before, e.g. a :class:`~tkx.distributed.planner.DistributedPlan`), else ``"spawn"``.
    timeout_s
        The process group's timeout (s): a collective that waits longer raises instead of hanging.
    threads
        ``torch.set_num_threads`` in each rank. Default for gloo: 1 in forked ranks (they inherit the
        parent's OpenMP thread pool, which is not safe to grow after a fork; DataLoader workers do the same),
        else ``max(1, cpu_count // world_size)`` so that N ranks do not oversubscribe the cores.

    Returns
    -------
    list
        What ``fn`` returned on each rank, by rank.

    Raises
    ------
    torch.multiprocessing.ProcessRaisedException
        A rank raised (the message holds its traceback).
    DistributedError
        NCCL asked for with fewer GPUs than ranks, or ``world_size < 1``.
    """
    import torch.multiprocessing as mp

    world_size = int(world_size)
    if world_size < 1:
        raise DistributedError("bad-input", f"world_size={world_size}", hint="pass the number of ranks (>= 1)")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise DistributedError("no-process-group", f"spawn(backend='nccl') for {world_size} ranks, but this machine "
                                                   f"has {torch.cuda.device_count()} CUDA devices",
                               hint="NCCL needs one GPU per rank: use fewer ranks or backend='gloo' on CPU")
    if start_method == "auto":
        forkable = "fork" in mp.get_all_start_methods()
        start_method = "fork" if forkable and not torch.cuda.is_initialized() else "spawn"
    if threads is None and backend == "gloo":
        # a forked child inherits the parent's OpenMP state: one thread, as DataLoader workers do
        threads = 1 if start_method == "fork" else max(1, (os.cpu_count() or 1) // world_size)
    with tempfile.TemporaryDirectory(prefix="tkx-dist-") as tmp:
        init_method = "file://" + str(Path(tmp) / "store")
        results = Path(tmp) / "results"
        results.mkdir()
        mp.start_processes(_entry, args=(fn, world_size, backend, init_method, str(results), tuple(args),
                                         float(timeout_s), threads),
                           nprocs=world_size, join=True, start_method=start_method)
        out = []
        for r in range(world_size):
            with open(results / f"{r}.pkl", "rb") as f:
                out.append(pickle.load(f))
    return out
