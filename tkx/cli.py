"""The ``tkx`` command: ``tkx tour [--example NAME] [--html PATH]``, ``tkx bench`` and ``tkx --version``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .bench.suite import SUITES


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tkx")
    except PackageNotFoundError:  # running from a source tree that is not installed
        import tkx

        return getattr(tkx, "__version__", "unknown")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tkx", description="tkx: a megakernel training compiler whose every stage you can look at."
    )
    parser.add_argument("--version", action="version", version=f"tkx {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    tour = commands.add_parser("tour", help="walk one example through every compiler stage in the terminal")
    tour.add_argument(
        "--example", default="digits_mlp", metavar="NAME", help="example to compile (default: digits_mlp)"
    )
    tour.add_argument(
        "--html", metavar="PATH",
        help="also write every stage to PATH as one self-contained HTML file (open it in any browser)")
    bench = commands.add_parser(
        "bench", help="time the megakernel against eager, CUDA graphs and torch.compile (needs a GPU)")
    bench.add_argument("suite", nargs="?", default="mlp", choices=sorted(SUITES))
    bench.add_argument("--out", metavar="FILE", help="write the results as JSON to FILE")
    bench.add_argument("--repeats", type=int, default=9, help="timed samples per candidate (>= 7)")
    bench.add_argument("--baselines", default="eager,eager+cudagraph,inductor,inductor-max-autotune")
    bench.add_argument("--workloads", default="", help="comma-separated subset (default: the whole suite)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "tour":
        from tkx.examples import names

        if args.example not in names():
            parser.error(f"unknown example {args.example!r}; choose from: {', '.join(names())}")
        from tkx.tour import run_tour

        if args.html:
            return run_tour(example=args.example, html=args.html)
        return run_tour(example=args.example)
    if args.command == "bench":
        from tkx.bench.__main__ import main as bench_main

        argv = [args.suite, "--repeats", str(args.repeats), "--baselines", args.baselines]
        if args.out:
            argv += ["--out", args.out]
        if args.workloads:
            argv += ["--workloads", args.workloads]
        return bench_main(argv)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
