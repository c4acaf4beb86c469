#!/usr/bin/env python3
"""gemm-bench.py [--out FILE.json] [--examples small,medium] [--arch auto|sm_90|sm_90a] [--gemm-copy auto|cp.async|tma]
                [--cluster off|on|both]

Per GEMM of each example's training step (shapes, dtypes and operand memory order read from its
schedule): tkx's GEMM alone (a one-GEMM step built by ``tkx.runtime.build``, replayed from a CUDA
graph) vs ``torch.mm`` (cuBLAS) in a CUDA graph, in µs per call (median of 9 samples), with TFLOP/s
and each one's speed-of-light ratio = max(FLOPs / 790 TFLOP/s, bytes / 4.8 TB/s) / time. Then the
whole step (megakernel) the same way. ``--cluster`` sets ``Options.gemm_cluster`` (2-CTA clusters
with TMA multicast); ``both`` measures every GEMM and step with it off and on in the same process.
Needs a CUDA GPU; prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import tkx
import tkx.runtime
import tkx.target
from tkx.bench.timing import capture, time_steps
from tkx.examples import get
from tkx.options import Options

PEAK_FLOPS = 790e12
PEAK_BYTES = 4.8e12
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def speed_of_light_us(flops: float, nbytes: float) -> float:
    return max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e6


def gemm_step(a_t: bool, b_t: bool):
    """A step computing one product; the operands arrive stored as their memory order says."""
    def step(a, b):
        return (a.t() if a_t else a) @ (b.t() if b_t else b)
    return step


def median_us(fns, dev) -> float:
    samples, _ = time_steps(fns, dev, repeats=9, warmup=3, target_us=2000.0, queue_ahead=True)
    return statistics.median(samples)


def bench_gemm(plan, options, dev) -> dict:
    m, n, k, dt = plan.m, plan.n, plan.k, TORCH[plan.dtype]
    a_t, b_t = not plan.a_k_contiguous, not plan.b_n_contiguous
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn((k, m) if a_t else (m, k), device=dev, generator=g).to(dt)
    b = torch.randn((n, k) if b_t else (k, n), device=dev, generator=g).to(dt)
    step = gemm_step(a_t, b_t)
    runner = tkx.runtime.build(step, (a, b), options, name=f"mm_{m}x{n}x{k}")
    got = runner(a, b)
    want = step(a.double() if dt != torch.float32 else a, b.double() if dt != torch.float32 else b)
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
    tkx_graph = runner.capture_graph(a, b, warmup=3)
    t_tkx = median_us([tkx_graph.graph.replay], dev)
    graph, _out = capture(lambda: step(a, b), dev)
    t_torch = median_us([graph.replay], dev)
    impl = [gr.plan.impl for gr in runner.schedule.groups.values() if gr.kind == "gemm"]
    built = [[gr.plan.tile_m, gr.plan.tile_n, gr.plan.split_k] for gr in runner.schedule.groups.values()
             if gr.kind == "gemm"]
    copies = sorted({str(n.get("copies")) for n in runner.source.notes.values() if n.get("copies")})
    flops = 2 * m * n * k
    nbytes = (m * k + k * n + m * n) * a.element_size()
    sol = speed_of_light_us(flops, nbytes)
    return {"m": m, "n": n, "k": k, "dtype": plan.dtype, "a_t": a_t, "b_t": b_t, "impl": impl,
            "tile": [plan.tile_m, plan.tile_n, plan.tile_k], "tkx_us": t_tkx, "torch_mm_us": t_torch,
            "tkx_tflops": flops / t_tkx / 1e6, "torch_tflops": flops / t_torch / 1e6,
            "sol_us": sol, "tkx_sol_ratio": sol / t_tkx, "torch_sol_ratio": sol / t_torch,
            "max_rel_error": err, "registers": runner.resources.registers, "copies": copies,
            "built_tiles": built, "clusters": [gr.id for gr in runner.schedule.groups.values()
                                               if gr.kind in ("gemm", "gemm_partial") and gr.plan.cluster == 2],
            "grid": runner.resources.grid}


def step_flops_bytes(sched) -> tuple[float, float]:
    flops = sum(2 * g.plan.m * g.plan.n * g.plan.k * g.plan.batch for g in sched.groups.values() if g.kind == "gemm")
    prog = sched.program
    nbytes = sum(i.value.nbytes for i in prog.inputs) + sum(o.value.nbytes for o in prog.outputs)
    return float(flops), float(nbytes)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--examples", default="small,medium")
    ap.add_argument("--arch", default="auto")
    ap.add_argument("--gemm-copy", default="auto", choices=("auto", "cp.async", "tma"),
                    help="Options.gemm_copy: how wgmma GEMMs stage operands (tma: bulk tensor copies)")
    ap.add_argument("--no-steps", action="store_true")
    ap.add_argument("--no-gemms", action="store_true", help="only the whole steps")
    ap.add_argument("--cluster", default="off", choices=("off", "on", "both"),
                    help="Options.gemm_cluster: 2-CTA clusters with TMA multicast of B (both: off, then on)")
    args = ap.parse_args()
    settings = {"off": (False,), "on": (True,), "both": (False, True)}[args.cluster]
    dev = torch.device("cuda")
    options = Options(arch=args.arch, gemm_copy=args.gemm_copy)
    result: dict = {"arch": args.arch, "gemm_copy": args.gemm_copy, "cluster": args.cluster,
                    "gpu": torch.cuda.get_device_name(dev),
                    "examples": {}}
    for name in args.examples.split(","):
        ex = get(name)
        inputs = ex.make_inputs(0, dev)
        runner = tkx.runtime.build(ex.step_fn, inputs, options, name=name, loss=ex.loss_output)
        sched = runner.schedule
        entry: dict = {"gemms": []}
        seen = set()
        for gr in sched.groups.values():
            if gr.kind != "gemm" or gr.plan.impl == "gemv" or args.no_gemms:
                continue
            p = gr.plan
            key = (p.m, p.n, p.k, p.a_k_contiguous, p.b_n_contiguous, p.dtype)
            if key in seen:
                continue
            seen.add(key)
            for on in settings:
                row = bench_gemm(p, options.replace(gemm_cluster="on" if on else "off"), dev)
                row["group"] = gr.id
                row["cluster"] = on
                entry["gemms"].append(row)
                print(f"{name:<7} {gr.id:<4} {p.m:>5}x{p.n:<5}x{p.k:<5} {'T' if row['a_t'] else 'N'}"
                      f"{'T' if row['b_t'] else 'N'} {','.join(row['impl']):<11} tile {p.tile_m}x{p.tile_n}x{p.tile_k} "
                      f"cl={'on ' if on else 'off'} tkx {row['tkx_us']:7.2f} us ({row['tkx_tflops']:6.1f} TF/s, "
                      f"SOL {row['tkx_sol_ratio']:.2f})  torch.mm {row['torch_mm_us']:7.2f} us "
                      f"({row['torch_tflops']:6.1f} TF/s, SOL {row['torch_sol_ratio']:.2f})  "
                      f"err {row['max_rel_error']:.1e} {','.join(row['copies'])} {row['clusters']}", flush=True)
        for on in settings:
            rows = [r for r in entry["gemms"] if r["cluster"] == on]
            entry[f"gemm_sum_tkx_us{'_cluster' if on else ''}"] = sum(r["tkx_us"] for r in rows)
            entry[f"gemm_sum_torch_us{'_cluster' if on else ''}"] = sum(r["torch_mm_us"] for r in rows)
        for on in settings if not args.no_steps else ():
            runner = tkx.runtime.build(ex.step_fn, inputs, options.replace(gemm_cluster="on" if on else "off"),
                                       name=name, loss=ex.loss_output)
            v = runner.verify(seeds=(0,), make_inputs=ex.make_inputs)
            graph = runner.capture_graph(*inputs, warmup=3)
            t_step = median_us([graph.graph.replay], dev)
            flops, nbytes = step_flops_bytes(sched)
            sol = speed_of_light_us(flops, nbytes)
            suffix = "_cluster" if on else ""
            entry.update({f"step_us{suffix}": t_step, "step_sol_us": sol, f"step_sol_ratio{suffix}": sol / t_step,
                          f"verified{suffix}": v.passed, f"registers{suffix}": runner.resources.registers,
                          f"grid{suffix}": runner.resources.grid})
            print(f"{name:<7} step cl={'on ' if on else 'off'}: {t_step:.1f} us/step, speed-of-light {sol:.1f} us "
                  f"(ratio {sol / t_step:.2f}), verified {v.passed}, {runner.resources.summary()}", flush=True)
        if entry["gemms"]:
            for on in settings:
                sfx = "_cluster" if on else ""
                print(f"{name:<7} GEMMs cl={'on ' if on else 'off'}: tkx {entry['gemm_sum_tkx_us' + sfx]:.1f} us vs "
                      f"torch.mm {entry['gemm_sum_torch_us' + sfx]:.1f} us", flush=True)
        result["examples"][name] = entry
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
