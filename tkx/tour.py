"""``tkx tour``: walk one example through every compiler stage in the terminal.

Each stage is printed with ``rich`` as it is computed, so a reader sees the same objects a
notebook shows: the captured FX graph, the IR, and (as they exist) the pass trace, the
fused schedule, the arena plan and the CUDA source.
"""

from __future__ import annotations

import time
from typing import Any


def _stage(console: Any, title: str, renderable: Any, seconds: float) -> None:
    from rich.rule import Rule

    console.print(Rule(f"[bold]{title}[/bold]  [dim]({seconds * 1e3:.1f} ms)[/dim]", align="left"))
    console.print(renderable)


def run_tour(example: str = "digits_mlp", console: Any = None) -> int:
    """Print every stage of ``example``; returns a process exit code (0 on success)."""
    from rich.console import Console

    import tkx

    console = console or Console()
    ex = tkx.examples.get(example)
    console.print(f"[bold]tkx tour[/bold]: {ex.name} - {ex.description}")
    t0 = time.perf_counter()
    cg = tkx.capture(ex.step_fn, ex.example_inputs, loss=ex.loss_output, name=ex.name)
    _stage(console, f"1. captured graph  {cg!r}", cg, time.perf_counter() - t0)
    t0 = time.perf_counter()
    program = cg.lower()
    _stage(console, f"2. IR  {program!r}", program, time.perf_counter() - t0)
    return 0
