"""The ``tkx`` command.

* ``tkx tour [--example NAME] [--brief] [--html PATH]``: one zoo example through every stage;
* ``tkx report FILE.py:STEP --inputs FILE.py:MAKE_INPUTS [-o report.html] [--option k=v ...] [--trace t.json]``:
  your own step, every stage written to one HTML file (no GPU needed); ``--trace`` also writes the
  predicted per-task timeline for Perfetto;
* ``tkx bench`` (needs a GPU) and ``tkx --version``.
"""

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
    tour.add_argument("--brief", action="store_true",
                      help="one screen per stage: summaries and the first kernel lines, not the full listings")
    report = commands.add_parser(
        "report", help="compile your own step (FILE.py:FUNCTION) and write every stage to one HTML file",
        description="Capture, optimise, schedule and generate the kernel of your own training step, and write "
                    "every stage to one self-contained HTML file. No GPU needed.")
    report.add_argument("step", metavar="FILE.py:STEP",
                        help="the step function: a Python file and the name of a function in it")
    report.add_argument("--inputs", metavar="FILE.py:MAKE_INPUTS", required=True,
                        help="a function returning the step's example inputs (a tuple of its positional "
                             "arguments); called with no arguments")
    report.add_argument("-o", "--output", metavar="PATH", default=None,
                        help="where to write the report (default: <FILE>-<STEP>.html)")
    report.add_argument("--option", metavar="K=V", action="append", default=[],
                        help="a tkx.Options field, e.g. --option mode=grid --option tile_m=32 (repeatable)")
    report.add_argument("--trace", metavar="PATH", default=None,
                        help="also write the predicted per-task timeline (task VM) as Trace Event Format JSON "
                             "for Perfetto UI or chrome://tracing")
    report.add_argument("--loss", type=int, default=None, metavar="N",
                        help="flat index of the loss among the step's outputs (default: found by capture)")
    report.add_argument("--state", metavar="FILE.py:NAME", default=None,
                        help="the modules and optimizers of a step that calls loss.backward() and opt.step(): "
                             "a name in the file bound to them (a tuple such as (model, opt)) or a function "
                             "returning them")
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

        return run_tour(example=args.example, html=args.html, brief=args.brief)
    if args.command == "report":
        from tkx.errors import TkxError
        from tkx.user_step import report_command

        try:
            return report_command(args.step, args.inputs, args.output, args.option, loss=args.loss,
                                  error=parser.error, trace=args.trace, state=args.state)
        except TkxError as exc:  # the step itself: one message naming the op and line, no traceback
            print(f"tkx report: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
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
