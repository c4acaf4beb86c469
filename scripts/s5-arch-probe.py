#!/usr/bin/env python3
"""s5-arch-probe.py [--out FILE.json] EXAMPLES: each example's step built for sm_90a (wgmma, the default on an
H200) and for sm_90 (wmma tensor cores, no wgmma/TMA), verified against eager, timed (µs, CUDA-graph replay,
median of 9), with the GEMM variants each plan chose: whether the register-staged wgmma path of tiny GEMMs
(M or N below one 64-row tile) loses to wmma. Session 5, issue 12."""

from __future__ import annotations

import json
import statistics
import sys

import torch

import tkx
import tkx.runtime
from tkx.bench.timing import time_steps
from tkx.examples import get
from tkx.options import Options


def main() -> int:
    args = sys.argv[1:]
    out = None
    if args and args[0] == "--out":
        out, args = args[1], args[2:]
    dev = torch.device("cuda")
    rows = []
    for name in (args[0].split(",") if args else ["mixed_precision"]):
        ex = get(name)
        for arch in ("sm_90a", "sm_90"):
            try:
                r = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, dev), Options(arch=arch), name=f"{name}_{arch}",
                                      loss=ex.loss_output)
                ok = r.verify(seeds=(0,), make_inputs=ex.make_inputs).passed
                g = r.capture_graph(*ex.make_inputs(0, dev), warmup=3)
                samples, _ = time_steps([g.graph.replay], dev, repeats=9, warmup=3, target_us=2000.0, queue_ahead=True)
                us = statistics.median(samples)
                variants = sorted({gr.plan.impl for gr in r.source.schedule.groups.values()
                                   if gr.kind in ("gemm", "gemm_partial")})
                rows.append({"example": name, "arch": arch, "us": us, "verified": ok, "variants": variants})
                print(f"{name:<18} {arch:<7} {us:8.1f} us verified {ok} {variants}", flush=True)
            except Exception as e:  # one failure must not hide the others
                rows.append({"example": name, "arch": arch, "error": f"{type(e).__name__}: {e}"[:300]})
                print(f"{name:<18} {arch:<7} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
