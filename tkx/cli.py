"""The ``tkx`` command: ``tkx tour [--example NAME]`` and ``tkx --version``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "tour":
        from tkx.examples import names

        if args.example not in names():
            parser.error(f"unknown example {args.example!r}; choose from: {', '.join(names())}")
        from tkx.tour import run_tour

        return run_tour(example=args.example)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
