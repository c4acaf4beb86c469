"""``python -m tkx.bench [SUITE] [--out FILE] [--repeats N] [--baselines a,b] [--workloads a,b]``.

Runs :func:`tkx.bench.bench_suite`, writes the JSON to ``--out`` and prints a summary table.
Exit status: 0 when every workload ran and verified, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from .report import BASELINES
    from .suite import SUITES

    parser = argparse.ArgumentParser(prog="python -m tkx.bench", description=__doc__.splitlines()[0])
    parser.add_argument("suite", nargs="?", default="mlp", choices=sorted(SUITES))
    parser.add_argument("--out", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--repeats", type=int, default=9, help="timed samples per candidate (>= 7)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help=f"comma-separated subset of {','.join(BASELINES)}")
    parser.add_argument("--workloads", default="", help="comma-separated subset of the suite's workloads")
    args = parser.parse_args(argv)

    from ..runtime.device import NoDeviceError
    from .suite import bench_suite, summary_lines

    baselines = [b for b in args.baselines.split(",") if b]
    workloads = [w for w in args.workloads.split(",") if w] or None
    try:
        results = bench_suite(args.suite, args.out, repeats=args.repeats, warmup=args.warmup,
                              baselines=baselines, workloads=workloads)
    except NoDeviceError as exc:
        print(f"tkx bench: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(results)))
    ok = all("error" not in e and e.get("verified") for e in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
