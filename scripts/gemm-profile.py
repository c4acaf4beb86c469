#!/usr/bin/env python3
"""gemm-profile.py [--examples small,medium] [--out DIR] [--variants]

Where a training step's time goes inside the megakernel, on a GPU: the step is built with
``Options(timeline=True)`` (each work item records its start/end from ``%globaltimer``), launched
a few times, and the last launch's timeline is summarised per stage (wall time from the first
item's start to the last item's end, and the gap to the next stage: the grid barrier plus the
imbalance) and per group (items, median item time, the group's first start and last end).
With ``--variants``, the step's time (CUDA-graph replay, median of 9 samples, µs) is measured
for a few option settings beside the default, so a change's effect is one run's difference.
Writes ``profile.json`` (and the timelines as SVG) under ``--out``; prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

import tkx
import tkx.runtime
from tkx.bench.timing import time_steps
from tkx.examples import get
from tkx.options import Options


def median_us(fn, dev) -> float:
    samples, _ = time_steps([fn], dev, repeats=9, warmup=3, target_us=2000.0, queue_ahead=True)
    return statistics.median(samples)


def stage_summary(runner, tl) -> list[dict]:
    sched = runner.schedule
    by_group: dict[str, list] = {}
    for s in tl.spans:
        by_group.setdefault(s.group, []).append(s)
    rows = []
    prev_end = None
    for si, stage in enumerate(sched.stages):
        spans = [s for g in stage for s in by_group.get(g, [])]
        if not spans:
            continue
        start, end = min(s.start for s in spans), max(s.end for s in spans)
        groups = []
        for g in stage:
            gs = by_group.get(g, [])
            if not gs:
                continue
            durs = sorted(s.end - s.start for s in gs)
            gr = sched.groups[g]
            groups.append({"group": g, "kind": gr.kind, "items": len(gs),
                           "plan": str(getattr(gr.plan, "impl", "")),
                           "tile": [getattr(gr.plan, "tile_m", 0), getattr(gr.plan, "tile_n", 0)],
                           "split_k": getattr(gr.plan, "split_k", 1),
                           "item_median_ns": durs[len(durs) // 2], "item_max_ns": durs[-1],
                           "first_start_ns": min(s.start for s in gs), "last_end_ns": max(s.end for s in gs),
                           "busy_ns": sum(durs)})
        per_block: dict[int, float] = {}
        for s in spans:
            per_block[s.block] = per_block.get(s.block, 0.0) + (s.end - s.start)
        rows.append({"stage": si, "start_ns": start, "end_ns": end, "wall_ns": end - start,
                     "gap_before_ns": (start - prev_end) if prev_end is not None else start,
                     "max_block_busy_ns": max(per_block.values()),
                     "mean_block_busy_ns": sum(per_block.values()) / max(1, len(per_block)),
                     "groups": groups})
        prev_end = end
    return rows


def profile(name: str, dev, out: str, variants: bool, base: Options) -> dict:
    ex = get(name)
    inputs = ex.make_inputs(0, dev)
    result: dict = {"example": name, "options": repr(base)}
    runner = tkx.runtime.build(ex.step_fn, inputs, base, name=name, loss=ex.loss_output)
    graph = runner.capture_graph(*inputs, warmup=3)
    result["step_us"] = median_us(graph.graph.replay, dev)
    result["resources"] = runner.resources.summary()
    print(f"{name}: step {result['step_us']:.1f} us ({result['resources']})", flush=True)

    timed = tkx.runtime.build(ex.step_fn, inputs, base.replace(timeline=True), name=name, loss=ex.loss_output)
    for _ in range(5):
        timed(*inputs)
    torch.cuda.synchronize(dev)
    tl = timed.timeline()
    try:
        with open(os.path.join(out, f"timeline-{name}-{base.gemm_copy}.svg"), "w") as f:
            f.write(tl.svg())
    except Exception as e:  # the picture is a bonus
        print("svg failed:", e)
    gt = tkx.runtime.build(ex.step_fn, inputs, base.replace(timeline=True), name=name, loss=ex.loss_output)
    g2 = gt.capture_graph(*inputs, warmup=3)
    result["step_timeline_us"] = median_us(g2.graph.replay, dev)
    rows = stage_summary(timed, tl)
    result["makespan_us"] = tl.makespan / 1e3
    result["stages"] = rows
    print(f"{name}: timeline makespan {tl.makespan / 1e3:.1f} us (step with timeline {result['step_timeline_us']:.1f}"
          f" us), busy {100 * tl.busy():.0f}%")
    for r in rows:
        print(f"  stage {r['stage']}: gap {r['gap_before_ns'] / 1e3:6.2f} us, wall {r['wall_ns'] / 1e3:6.2f} us, "
              f"block busy max {r['max_block_busy_ns'] / 1e3:6.2f} mean {r['mean_block_busy_ns'] / 1e3:6.2f}")
        for g in r["groups"]:
            print(f"      {g['group']:<5} {g['kind']:<9} {g['plan']:<11} {g['items']:>5} items, item median "
                  f"{g['item_median_ns'] / 1e3:6.2f} max {g['item_max_ns'] / 1e3:6.2f} us, span "
                  f"{g['first_start_ns'] / 1e3:7.2f}..{g['last_end_ns'] / 1e3:7.2f} us", flush=True)
    if variants:
        tries = {"sync=counters": dict(sync="counters"), "split_k=off": dict(split_k="off"),
                 "threads=512": dict(threads_per_block=512), "fuse_epilogues=False": dict(fuse_epilogues=False)}
        result["variants"] = {}
        for label, ch in tries.items():
            try:
                r = tkx.runtime.build(ex.step_fn, inputs, base.replace(**ch), name=name, loss=ex.loss_output)
                g = r.capture_graph(*inputs, warmup=3)
                t = median_us(g.graph.replay, dev)
                ok = r.verify(seeds=(0,), make_inputs=ex.make_inputs).passed
                result["variants"][label] = {"step_us": t, "verified": ok, "resources": r.resources.summary()}
                print(f"  variant {label:<22} {t:7.1f} us verified {ok} ({r.resources.summary()})", flush=True)
            except Exception as e:
                result["variants"][label] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(f"  variant {label:<22} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", default="small,medium")
    ap.add_argument("--out", default=".")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--gemm-copy", default="auto", choices=("auto", "cp.async", "tma"))
    ap.add_argument("--ncu", action="store_true", help="only build and launch each example 4 times (run under ncu)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if args.ncu:
        for name in args.examples.split(","):
            ex = get(name)
            inputs = ex.make_inputs(0, dev)
            r = tkx.runtime.build(ex.step_fn, inputs, Options(), name=name, loss=ex.loss_output)
            for _ in range(4):
                r(*inputs)
            torch.cuda.synchronize(dev)
        return 0
    os.makedirs(args.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(dev), "examples": {}}
    for name in args.examples.split(","):
        res["examples"][name] = profile(name, dev, args.out, args.variants, Options(gemm_copy=args.gemm_copy))
    with open(os.path.join(args.out, f"profile-{args.gemm_copy}.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
