"""Train ``digits_mlp`` data parallel with tkx.distributed, on ranks started by torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/distributed_digits.py --steps 20 --check

Every rank builds the same step (capture, split at the gradient, schedules), trains on its slice of each
global batch of ``64 x N`` digits and prints its loss; rank 0 prints the plan and, with ``--check``, trains
ONE eager process on the concatenated batches and prints the largest difference of the final parameters
(exit status 1 above the fp32 tolerance). CPU ranks use gloo and the schedule interpreter; with
``--device cuda`` each rank uses ``cuda:LOCAL_RANK``, NCCL and the compiled kernels.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

import tkx.distributed as td
from tkx.examples import digits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--bucket-bytes", type=int, default=16 * 1024)
    ap.add_argument("--check", action="store_true", help="compare with one eager process on the global batch")
    a = ap.parse_args()
    if not td.under_torchrun():
        print("start this script with torchrun, e.g.\n  python -m torch.distributed.run --standalone "
              "--nproc_per_node 2 scripts/distributed_digits.py --check", file=sys.stderr)
        return 2
    rank, world = td.init("nccl" if a.device == "cuda" else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    params, momentum, x0, y0 = digits.make_digits_inputs(0, device)
    step = td.data_parallel(digits.digits_step, (params, momentum, x0, y0), bucket_bytes=a.bucket_bytes)
    if rank == 0:
        print(step.plan, flush=True)
    batches = digits.digits_batches(64 * world, seed=1, epochs=100, device=device)
    seen = []
    for k in range(a.steps):
        x, y = next(batches)
        seen.append((x, y))
        loss = step(params, momentum, x.chunk(world)[rank].contiguous(), y.chunk(world)[rank].contiguous())
        if k % 5 == 0 or k == a.steps - 1:
            print(f"rank {rank} step {k} loss {float(loss):.6f} (A {step.last_timings['a']:.1f} ms, "
                  f"all-reduce wait {step.last_timings['wait']:.1f} ms, B {step.last_timings['b']:.1f} ms)", flush=True)
    status = 0
    if a.check and rank == 0:
        ref_p, ref_m, _, _ = digits.make_digits_inputs(0, device)
        for x, y in seen:
            digits.digits_step(ref_p, ref_m, x, y)
        diff = max(float((ref_p[k] - params[k]).abs().max()) for k in params)
        ok = all(torch.allclose(params[k], ref_p[k], rtol=1e-5, atol=1e-5) for k in params)
        print(f"max |parameter difference| vs one process on the concatenated batch after {a.steps} steps: "
              f"{diff:.3e} ({'OK' if ok else 'FAILED'})", flush=True)
        status = 0 if ok else 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
