"""``tkx tour``: walk one example through every compiler stage in the terminal.

Each stage is printed with ``rich`` as it is computed, so a reader sees the same objects a
notebook shows: the captured FX graph, the IR, and (as they exist) the pass trace, the
fused schedule, the arena plan and the CUDA source. ``html=PATH`` (``tkx tour --html PATH``)
also writes them, with their notebook views, to one self-contained HTML file
(:func:`tkx.render.report.write_report`).
"""

from __future__ import annotations

from typing import Any


def _stage(console: Any, title: str, renderable: Any, seconds: float) -> None:
    from rich.rule import Rule

    console.print(Rule(f"[bold]{title}[/bold]  [dim]({seconds * 1e3:.1f} ms)[/dim]", align="left"))
    console.print(renderable)


def run_tour(example: str = "digits_mlp", console: Any = None, html: str | None = None) -> int:
    """Print every stage of ``example``; returns a process exit code (0 on success).

    ``html``: also write the report of every stage to this path (the GPU section reuses the
    runner and verification of stage 7 when there is a GPU)."""
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
    cuda = exp.cuda
    kernel_start = cuda.text.index("#define TKX_POINTERS")
    first_line = cuda.text[:kernel_start].count("\n") + 1
    from rich.syntax import Syntax

    _stage(console, f"6. CUDA source  {cuda!r}",
           Syntax(cuda.text[kernel_start:], "cuda", line_numbers=True, start_line=first_line),
           exp.timings["cuda"] / 1e3)
    console.print(f"[dim](lines 1-{first_line - 1}: the fixed prelude - dtype helpers, barriers, reductions; "
                  f"see exp.cuda.text)[/dim]")
    from .codegen.nvrtc import nvrtc_available

    ok, why = nvrtc_available()
    if ok:
        for arch in ("sm_80", "sm_90"):
            console.print(f"NVRTC check: {cuda.check(arch).summary()}")
    else:
        console.print(f"[yellow]NVRTC unavailable ({why}): skipping the compile check[/yellow]")
    gpu: dict[str, Any] = {}
    code = _gpu_part(console, ex, exp, gpu)
    if html:
        from .render.report import write_report

        path = write_report(exp, html, description=ex.description, make_inputs=ex.make_inputs,
                            runner=gpu.get("runner"), verification=gpu.get("verification"))
        console.print(f"[bold]HTML report[/bold] of every stage: {path}")
    return code


def _gpu_part(console: Any, ex: Any, exp: Any, out: dict[str, Any] | None = None) -> int:
    """Stage 7 on a GPU: compile, verify, and (for digits_mlp) train against eager."""
    import torch
    from rich.rule import Rule

    if not torch.cuda.is_available():
        console.print(Rule("[bold]7. run on the GPU[/bold]", align="left"))
        console.print("No CUDA GPU here: compiling for the device, verifying against eager and timing need one "
                      "(see README, 'What a GPU adds'). Everything above ran on the CPU.")
        return 0
    import tkx

    runner = tkx.runtime.CompiledRunner(exp.cuda, step_fn=ex.step_fn)
    console.print(Rule(f"[bold]7. compiled runner[/bold]  {runner!r}", align="left"))
    verification = runner.verify(make_inputs=ex.make_inputs)
    console.print(verification.summary())
    if out is not None:
        out.update(runner=runner, verification=verification)
    if ex.name == "digits_mlp":
        from .train_digits import train

        console.print(Rule("[bold]8. digits: 300 steps, megakernel vs eager[/bold]", align="left"))
        r = train(300)
        console.print(f"largest loss difference {r['max_abs_loss_diff']:.2e} (step {r['max_diff_step']}); "
                      f"final loss {r['final_loss_megakernel']:.4f} vs eager {r['final_loss_eager']:.4f}; "
                      f"test accuracy {100 * r['test_accuracy_megakernel']:.1f} % vs eager "
                      f"{100 * r['test_accuracy_eager']:.1f} %")
    return 0
