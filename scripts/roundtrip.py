"""Round trip of the Explorer's "compile & benchmark" on a GPU: toggle an option -> new µs/step.

``python scripts/roundtrip.py [--example digits_mlp] [--out FILE]`` times, for a few option
toggles, the path the widget's button takes after a control changes: recompute the stages
downstream of the change, compile (NVRTC, disk cache), verify against eager, and time the
megakernel in CUDA-graph replays (baselines are timed once, not per toggle). Prints seconds
per phase, cold (first time this configuration is compiled) and warm (cache hit).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    import torch

    import tkx

    ap = argparse.ArgumentParser()
    ap.add_argument("--example", default="digits_mlp")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ex = tkx.examples.get(args.example)
    inputs = ex.make_inputs(0, device="cuda")
    base = tkx.explore(ex.step_fn, inputs, name=ex.name, loss=ex.loss_output)
    _ = base.cuda
    rows = []
    for toggle in ({"tile_m": 32}, {"fuse_epilogues": False}, {"mode": "grid"}, {"tile_m": 32}):
        t0 = time.perf_counter()
        exp = base.with_options(**toggle)
        _ = exp.cuda
        t_stages = time.perf_counter() - t0
        runner = tkx.runtime.CompiledRunner(exp.cuda)
        t_compile = time.perf_counter() - t0 - t_stages
        ver = runner.verify(seeds=(0,), make_inputs=ex.make_inputs)
        t_verify = time.perf_counter() - t0 - t_stages - t_compile
        report = tkx.bench.compare(ex.step_fn, inputs, exp.options, make_inputs=ex.make_inputs, repeats=7,
                                   name=ex.name, loss=ex.loss_output, baselines=())
        total = time.perf_counter() - t0
        tkx_row = next(r for r in report.rows if r.name == "tkx")
        rows.append({"toggle": toggle, "stages_s": t_stages, "compile_s": t_compile, "verify_s": t_verify,
                     "total_s": total, "us_per_step": tkx_row.median_us, "verified": ver.passed,
                     "cache_hit": runner.resources.cache_hit})
        print(json.dumps(rows[-1]))
    torch.cuda.synchronize()
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
