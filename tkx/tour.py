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
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output)
    _stage(console, f"1. captured graph  {exp.captured!r}", exp.captured, exp.timings["captured"] / 1e3)
    _stage(console, f"2. IR  {exp.program!r}", exp.program, exp.timings["program"] / 1e3)
    _stage(console, f"3. passes  {exp.passes!r}", str(exp.passes), exp.timings["passes"] / 1e3)
    console.print(exp.optimized)
    _stage(console, f"4. fused schedule  {exp.schedule!r}", str(exp.schedule), exp.timings["schedule"] / 1e3)
    _stage(console, f"5. arena  {exp.arena!r}", str(exp.arena), exp.timings["arena"] / 1e3)
    try:
        cuda = exp.cuda
    except ImportError as e:  # the code generator is optional until it lands
        console.print(f"[yellow]CUDA code generation unavailable: {e}[/yellow]")
        return 0
    _stage(console, f"6. CUDA source  {cuda!r}", cuda, exp.timings["cuda"] / 1e3)
    return 0
