#!/usr/bin/env python
"""Time only tkx's decode step (no baselines): for an A/B of two checkouts on one GPU in one run.

    PYTHONPATH=CHECKOUT python scripts/decode-tkx-time.py --out OUT.json [--quants bf16,int8] [--syncs barrier]
    PYTHONPATH=CHECKOUT python scripts/decode-tkx-time.py --prepare --quants int4   # compile only (disk cache)

For each weight format and ``Options.sync``: build the kernel of ``tkx.examples.decode``'s ``decode``
configuration, check 20 greedy tokens against eager (strictly, and teacher-forced with near-ties allowed:
:func:`tkx.examples.decode.compare_greedy`), then time one step (µs, median of 9 CUDA-event samples of
CUDA-graph replays of the runner's own graph, the cache half full). Records the schedule's stages, barriers
and groups. ``scripts/decode-bench.py`` is the full benchmark with eager and ``torch.compile``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import tkx
from tkx.bench.timing import time_steps
from tkx.examples import decode as D

DEV = torch.device("cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quants", default="bf16,int8")
    ap.add_argument("--syncs", default="barrier", help="Options.sync values (the first quant gets them all)")
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--outline", default="auto",
                    help="Options.outline values, each timed for the first quant (auto, on, off: group bodies as "
                         "device functions or inline; an A/B of the two in one run)")
    ap.add_argument("--prepare", action="store_true", help="only build (compile) the kernels")
    ap.add_argument("--plain-epilogues", action="store_true",
                    help="a user fusion rule fusing every epilogue (switches rule sibling-gemms off: the A side of an "
                         "A/B of the SwiGLU gate/up GEMVs sharing a stage)")
    a = ap.parse_args(argv)
    if a.plain_epilogues:
        tkx.fusion_rule("plain-epilogues", kinds=("epilogue",), replace=True)(
            lambda c: tkx.fuse("legal", "fused: every epilogue (decode-tkx-time --plain-epilogues)"))
    results: dict = {"tkx": tkx.__file__, "plain_epilogues": a.plain_epilogues,
                     "gpu": torch.cuda.get_device_name(DEV), "torch": torch.__version__, "runs": []}
    for qi, quant in enumerate(a.quants.split(",")):
        ex = D.get("decode" if quant == "bf16" else f"decode_{quant}")
        variants = [(s, o) for s in a.syncs.split(",") for o in a.outline.split(",")] if qi == 0 else \
            [("barrier", a.outline.split(",")[0])]
        for sync, outline in variants:
            t0 = time.perf_counter()
            opts = tkx.Options(sync=sync, outline=outline)
            runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, device=DEV), opts)  # as the GPU test builds it
            rec = {"quant": quant, "sync": sync, "outline": outline, "build_s": round(time.perf_counter() - t0, 1),
                   "compile_s": runner.resources.compile_seconds}
            s = runner.schedule
            rec.update(stages=len(s.stages), barriers=s.num_barriers, groups=len(s.groups),
                       work_items=sum(g.work_items for g in s.groups.values()))
            print(f"[{ex.name} {sync} outline={outline}] built in {rec['build_s']} s: {rec['stages']} stages",
                  flush=True)
            if a.prepare:
                continue
            want = D.generate(ex.step_fn, ex.make_inputs(0, device=DEV), a.tokens).cpu()
            got = D.generate(runner, ex.make_inputs(0, device=DEV), a.tokens).cpu()
            rec["same_tokens"] = bool(torch.equal(got, want))
            forced = D.compare_greedy(runner, ex, a.tokens, device=DEV)
            rec["teacher_forced_ok"], rec["teacher_forced"] = forced.ok, str(forced)
            args = ex.make_inputs(0, device=DEV, start=ex.config.cache // 2)
            g = runner.capture_graph(*args)
            samples, _ = time_steps([g.graph.replay], DEV, repeats=9, warmup=3, queue_ahead=True)
            g.check_status()
            rec["us_per_step"] = sorted(samples)[len(samples) // 2]
            rec["samples_us"] = samples
            rec["tokens_per_s"] = ex.config.batch * 1e6 / rec["us_per_step"]
            print(f"[{ex.name} {sync} outline={outline}] {rec['us_per_step']:.1f} µs/step; "
                  f"strict {rec['same_tokens']}; {forced}",
                  flush=True)
            results["runs"].append(rec)
    if a.out is not None and not a.prepare:
        a.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
