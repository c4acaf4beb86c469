"""The Explorer's "Compile & benchmark" round trip on a GPU, driven from Python (no browser).

``python scripts/explorer_gpu.py [--out FILE]``: builds ``tkx.Explorer`` for digits_mlp, runs the
benchmark once (baselines timed once per kernel), then flips options and measures the time from
the control change to the new µs/step row in the results table.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    import tkx

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ex = tkx.examples.get("digits_mlp")
    w = tkx.Explorer(ex.step_fn, ex.make_inputs(0, device="cuda"), debounce_s=0, make_inputs=ex.make_inputs)
    t0 = time.perf_counter()
    w.benchmark(wait=True)
    first = time.perf_counter() - t0
    rows = [{"change": "first click (baselines + tkx)", "seconds": first, "row": w.history[-1]}]
    for change in ({"tile_m": 32}, {"mode": "grid"}, {"tile_m": 64}):
        t0 = time.perf_counter()
        for k, v in change.items():
            w.controls[k].value = v
        w.flush()
        w.benchmark(wait=True)
        rows.append({"change": change, "seconds": time.perf_counter() - t0, "row": w.history[-1]})
    for r in rows:
        print(json.dumps(r, default=str))
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
