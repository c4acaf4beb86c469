"""Data-parallel throughput (samples/s): tkx.distributed against PyTorch DDP (+ torch.compile), in one run.

    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/distributed_bench.py \
        --out distributed.json

Needs torchrun and, with ``--device cuda`` (the default), one GPU per rank and at least two ranks: NCCL,
tkx's compiled kernels (program A = forward + backward, program B = the update, the bucketed all-reduce
between them). For every workload it first *verifies*: 5 data-parallel steps against ONE eager process
training on the concatenated batch (rank 0 computes it), then times, after a warm-up, ``--steps`` steps of

* ``tkx``: :func:`tkx.distributed.data_parallel` on the example's own step;
* ``ddp``: the same model as an ``nn.Module`` in ``DistributedDataParallel`` with ``torch.optim.SGD``;
* ``ddp+compile``: ``torch.compile(DDP(model))`` (DDP's graph-break optimizer splits it at the buckets).

samples/s = world size x batch per rank x steps / seconds (wall clock between barriers, after a CUDA
synchronize). ``--device cpu`` runs the same on gloo CPU ranks (a smoke test of this script; the figures
mean nothing there). Rank 0 prints a table and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tkx.distributed as td
from tkx.examples import get

WORKLOADS = ("digits_mlp", "online", "small", "medium")
VERIFY_STEPS = 5


class MLP(torch.nn.Module):
    """``relu(x @ w1 + b1) @ w2 + b2`` with the example's parameters (the same math as its step)."""

    def __init__(self, params: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.p
        return torch.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def workload(name: str, device: torch.device, seed: int):
    """``(example, state args, batch args, functional, loss_fn, optimizer factory)``."""
    ex = get(name)
    args = ex.make_inputs(seed, device)
    if name == "digits_mlp":
        params, momentum, x, y = args
        return ex, (params, momentum), (x, y), False, F.cross_entropy, \
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    params, x, y = args
    return ex, (params,), (x, y), True, F.mse_loss, lambda ps: torch.optim.SGD(ps, lr=1e-2)


def run_tkx(step, state, batch, functional, steps):
    loss = None
    for _ in range(steps):
        out = step(*state, *batch)
        if functional:
            loss, *new = out
            state = tuple(new)
        else:
            loss = out
    return loss, state


def timed(fn, device, steps) -> float:
    """Seconds for ``fn(steps)`` on every rank (barriers around, CUDA synchronized)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    fn(steps)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    return time.perf_counter() - t0


def verify(name, rank, world, device) -> tuple[float, bool]:
    """Max |difference| of the parameters after VERIFY_STEPS data-parallel steps against one eager process
    on the concatenated batches (on rank 0), and whether it is within tolerance (fp32 1e-4, bf16 2e-2)."""
    ex, state, batch, functional, _, _ = workload(name, device, 0)
    gen = torch.Generator().manual_seed(123)
    globals_ = []
    for _ in range(VERIFY_STEPS):
        xs = [torch.randn(batch[0].shape, generator=gen).to(batch[0].dtype) for _ in range(world)]
        if batch[1].dtype == torch.int64:
            ys = [torch.randint(0, 10, batch[1].shape, generator=gen) for _ in range(world)]
        else:
            ys = [torch.randn(batch[1].shape, generator=gen).to(batch[1].dtype) for _ in range(world)]
        globals_.append((torch.cat(xs).to(device), torch.cat(ys).to(device)))
    step = td.data_parallel(ex.step_fn, (*state, *batch))
    mine = [(x.chunk(world)[rank].contiguous(), y.chunk(world)[rank].contiguous()) for x, y in globals_]
    dp_state = state
    for b in mine:
        _, dp_state = run_tkx(step, dp_state, b, functional, 1)
    _, ref_state, _, _, _, _ = workload(name, device, 0)
    for b in globals_:
        _, ref_state = run_tkx(ex.step_fn, ref_state, b, functional, 1)
    diff = max(float((a.float() - b.float()).abs().max())
               for a, b in zip(torch.utils._pytree.tree_leaves(dp_state), torch.utils._pytree.tree_leaves(ref_state)))
    tol = 2e-2 if batch[0].dtype == torch.bfloat16 else 1e-4
    return diff, diff <= tol


def bench(name, rank, world, device, steps, warmup, compile_):
    ex, state, batch, functional, loss_fn, make_opt = workload(name, device, rank)
    row = {"workload": name, "world_size": world, "batch_per_rank": int(batch[0].shape[0]),
           "dtype": str(batch[0].dtype).removeprefix("torch.")}
    row["verify_max_diff"], row["verified"] = verify(name, rank, world, device)
    step = td.data_parallel(ex.step_fn, (*state, *batch))
    row["tkx_plan"] = repr(step.plan)
    box = {"state": state}

    def tkx_steps(n):
        _, box["state"] = run_tkx(step, box["state"], batch, functional, n)

    tkx_steps(warmup)
    seconds = {"tkx": timed(tkx_steps, device, steps)}
    _, state0, _, _, _, _ = workload(name, device, 0)
    from torch.nn.parallel import DistributedDataParallel as DDP

    variants = [("ddp", False)] + ([("ddp+compile", True)] if compile_ else [])
    for label, use_compile in variants:
        model = MLP(state0[0]).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        fwd = torch.compile(ddp) if use_compile else ddp
        opt = make_opt(model.parameters())
        def ddp_steps(n, fwd=fwd, opt=opt, x=batch[0], y=batch[1]):
            for _ in range(n):
                opt.zero_grad(set_to_none=True)
                loss_fn(fwd(x), y).backward()
                opt.step()

        ddp_steps(warmup)
        seconds[label] = timed(ddp_steps, device, steps)
    samples = world * row["batch_per_rank"] * steps
    for k, s in seconds.items():
        row[f"{k}_samples_per_s"] = samples / s
        row[f"{k}_us_per_step"] = s / steps * 1e6
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--allow-one-rank", action="store_true", help="run on one rank too (not a data-parallel figure)")
    ap.add_argument("--out", default=None, help="JSON file for the results (rank 0)")
    a = ap.parse_args()
    if not td.under_torchrun():
        print("start this benchmark with torchrun, one process per GPU, e.g.\n  python -m torch.distributed.run "
              "--standalone --nproc_per_node 2 scripts/distributed_bench.py --out results.json", file=sys.stderr)
        return 2
    world = int(os.environ["WORLD_SIZE"])
    if world < 2 and not a.allow_one_rank:
        print(f"distributed_bench: WORLD_SIZE={world}; data parallel needs at least 2 ranks "
              "(--nproc_per_node 2 or more; --allow-one-rank to run anyway)", file=sys.stderr)
        return 2
    if a.device == "cuda":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if torch.cuda.device_count() < local_world:
            print(f"distributed_bench: {local_world} ranks on this host but {torch.cuda.device_count()} CUDA "
                  "devices; NCCL needs one GPU per rank (use fewer ranks, or --device cpu for a gloo smoke run)",
                  file=sys.stderr)
            return 2
    rank, world = td.init("nccl" if a.device == "cuda" else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    rows = []
    for name in a.workloads.split(","):
        row = bench(name, rank, world, device, a.steps, a.warmup, not a.no_compile)
        rows.append(row)
        if rank == 0:
            figs = "  ".join(f"{k.removesuffix('_samples_per_s')} {row[k]:,.0f}/s" for k in row
                             if k.endswith("_samples_per_s"))
            print(f"{name:<12} {world} ranks x {row['batch_per_rank']} ({row['dtype']}): {figs}  "
                  f"verified {row['verified']} (max diff {row['verify_max_diff']:.2e})", flush=True)
    if rank == 0 and a.out:
        meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                else "cpu", "world_size": world, "backend": dist.get_backend(), "steps": a.steps,
                "warmup": a.warmup}
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    ok = all(r["verified"] for r in rows) and all(math.isfinite(r["tkx_samples_per_s"]) for r in rows)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
