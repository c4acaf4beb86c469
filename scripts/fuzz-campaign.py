#!/usr/bin/env python3
"""A long run of tkx's differential fuzzer (tests/fuzz.py): random training steps and random
legal options through the reference interpreter, the schedule interpreter and NVRTC, against
eager PyTorch with float64 arbitration.

    PYTHONPATH=. .venv/bin/python scripts/fuzz-campaign.py --seconds 600 --wide --out fuzz.json

Prints one line per case, then the figures (programs tried, ok, refusals, crashes, wrong
answers), the refusals and crashes grouped by message, and a shrunk reproduction of each
distinct failure. ``--wide`` adds tile sizes and threads per block to the option space.
Exits 1 when any case crashed or gave a wrong answer.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import fuzz  # noqa: E402


def _group(detail: str) -> str:
    """A message with its numbers and names masked, to group similar findings."""
    return re.sub(r"\d+", "N", re.sub(r"\(\S+:\d+\)", "", detail)).strip()[:160]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="time budget (default 300)")
    ap.add_argument("--start", type=int, default=100_000, help="first seed (default 100000)")
    ap.add_argument("--count", type=int, default=0, help="stop after this many cases (0: the time budget)")
    ap.add_argument("--wide", action="store_true", help="also draw tile sizes and threads per block")
    ap.add_argument("--no-nvrtc", action="store_true", help="skip the NVRTC compile")
    ap.add_argument("--shrink-seconds", type=float, default=30.0, help="per distinct failure (default 30)")
    ap.add_argument("--out", help="write the figures and findings as JSON here")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    counts: collections.Counter[str] = collections.Counter()
    groups: dict[str, dict[str, list[fuzz.Outcome]]] = {"refused": {}, "crash": {}, "wrong": {}}
    seed = args.start
    while time.perf_counter() - t0 < args.seconds and (not args.count or sum(counts.values()) < args.count):
        o = fuzz.check(fuzz.random_config(seed, wide=args.wide), nvrtc=not args.no_nvrtc)
        counts[o.status] += 1
        if o.status != "ok":
            groups[o.status].setdefault(f"{o.stage}: {_group(o.detail)}", []).append(o)
        print(f"{o.seconds:5.1f}s {o.line()[:240]}", flush=True)
        seed += 1
    elapsed = time.perf_counter() - t0
    total = sum(counts.values())
    print(f"\nprograms tried {total} in {elapsed:.0f} s: ok {counts['ok']}, refused {counts['refused']}, "
          f"crashes {counts['crash']}, wrong answers {counts['wrong']}")
    findings = []
    for status in ("wrong", "crash", "refused"):
        for key, cases in sorted(groups[status].items(), key=lambda kv: -len(kv[1])):
            print(f"  {status:8s} x{len(cases):4d}  {key}")
            entry = {"status": status, "count": len(cases), "message": key,
                     "seeds": [c.config.seed for c in cases[:20]]}
            if status != "refused":
                small = fuzz.shrink(cases[0], nvrtc=not args.no_nvrtc, budget_s=args.shrink_seconds)
                entry["reproduction"] = fuzz.reproduction(small)
                print("\n".join("      " + line for line in entry["reproduction"].splitlines()))
            findings.append(entry)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"tried": total, "seconds": elapsed, "counts": dict(counts), "wide": args.wide,
                       "findings": findings}, f, indent=1)
    return 1 if counts["crash"] or counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
