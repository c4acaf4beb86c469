"""``tkx tour``: walk one example through every compiler stage in the terminal.

Each stage is printed with ``rich`` as it is computed, so a reader sees the same objects a
notebook shows: the captured FX graph, the IR, and (as they exist) the pass trace, the
fused schedule, the arena plan and the CUDA source. ``html=PATH`` (``tkx tour --html PATH``)
also writes them, with their notebook views, to one self-contained HTML file
(:func:`tkx.render.report.write_report`).
"""

from __future__ import annotations

from typing import Any

#: One-line reading aids printed under each stage.
LEGENDS = {
    "captured": "Each FX node is one aten op on fake tensors; forward/backward/optimizer by dataflow, "
                "with your source line.",
    "program": "%relu names the value of op relu (%in0: input 0); views are metadata: %relu.T is a "
               "transpose, bcast(...) a broadcast, reshape(...) a reshape - none of them is an op.",
    "passes": "Each pass rewrites the program; +added -removed ~changed are op ids (the FX names).",
    "schedule": "gN: a group = one unit of generated code (a GEMM, a reduction, an elementwise loop, a copy). "
                "epilogue: pointwise ops applied to a GEMM/reduction result in registers; loop: same-shaped "
                "ops computed in the same loop; inlined: recomputed where read. items: work items spread "
                "over the grid. RAW: a read-after-write hazard that needs the barrier.",
    "arena": "One workspace: a value lives from the stage that writes it to the last stage that reads it; "
             "values whose stages do not overlap share bytes. In place: the new state is written into your "
             "tensor; staged commit: copied in after its last read.",
}


def _stage(console: Any, title: str, renderable: Any, seconds: float, legend: str | None = None) -> None:
    from rich.rule import Rule
    from rich.text import Text

    console.print(Rule(f"[bold]{title}[/bold]  [dim]({seconds * 1e3:.1f} ms)[/dim]", align="left"))
    if legend:
        console.print(Text(legend, style="dim"))
    # Plain strings are printed as text: their [brackets] are content, not rich markup.
    console.print(Text(renderable) if isinstance(renderable, str) else renderable)


#: Kernel lines ``--brief`` shows (from the kernel's entry).
BRIEF_KERNEL_LINES = 40
#: Lines of the schedule's text ``--brief`` shows.
BRIEF_SCHEDULE_LINES = 14


def _head(text: str, n: int) -> str:
    lines = text.split("\n")
    return "\n".join(lines[:n] + ([f"... {len(lines) - n} more lines"] if len(lines) > n else []))


def run_tour(example: str = "digits_mlp", console: Any = None, html: str | None = None, *,
             brief: bool = False) -> int:
    """Print every stage of ``example``; returns a process exit code (0 on success).

    ``html``: also write the report of every stage to this path (the GPU section reuses the
    runner and verification of stage 7 when there is a GPU). ``brief``: one screen per stage
    at most (the stage's summary line, the pass table, the first lines of the schedule and
    of the kernel body) instead of the full listings."""
    import sys

    from rich.console import Console

    import tkx

    # Piped output: no 80-column wrapping (the IR's source comments and CUDA lines stay whole).
    console = console or Console(soft_wrap=not sys.stdout.isatty())
    ex = tkx.examples.get(example)
    console.print(f"[bold]tkx tour[/bold]: {ex.name} - {ex.description}")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output)
    captured = exp.captured
    _stage(console, f"1. captured graph  {captured!r}", _head(str(captured), 12) if brief else captured,
           exp.timings["captured"] / 1e3, LEGENDS["captured"])
    program = exp.program
    _stage(console, f"2. IR  {program!r}", _head(str(program), 12) if brief else program,
           exp.timings["program"] / 1e3, LEGENDS["program"])
    _stage(console, f"3. passes  {exp.passes!r}", str(exp.passes), exp.timings["passes"] / 1e3, LEGENDS["passes"])
    if not brief:
        console.print(exp.optimized)
    schedule_text = str(exp.schedule)
    _stage(console, f"4. fused schedule  {exp.schedule!r}",
           _head(schedule_text, BRIEF_SCHEDULE_LINES) if brief else schedule_text,
           exp.timings["schedule"] / 1e3, LEGENDS["schedule"])
    _stage(console, f"5. arena  {exp.arena!r}", str(exp.arena), exp.timings["arena"] / 1e3, LEGENDS["arena"])
    cuda = exp.cuda
    first_line = cuda.kernel_start
    from rich.syntax import Syntax
    from rich.text import Text

    # The kernel's entry and its first stages (not the prelude's helpers); the whole source is
    # in exp.cuda.text and --html.
    shown = "\n".join(cuda.text.split("\n")[first_line - 1:])
    second_barrier = shown.find("// ---- barrier before stage 2")
    cut = second_barrier if second_barrier > 0 else len(shown)
    if brief:
        cut = min(cut, len("\n".join(shown.split("\n")[:BRIEF_KERNEL_LINES])))
    rest = shown[cut:].count("\n")
    _stage(console, f"6. CUDA source  {cuda!r}",
           Syntax(shown[:cut], "cuda", line_numbers=True, start_line=first_line),
           exp.timings["cuda"] / 1e3,
           "Device functions recompute inlined values; the kernel runs stage after stage with a barrier "
           "between stages; every address is a kernel argument.")
    console.print(Text(f"(lines 1-{first_line - 1}: the fixed prelude - dtype helpers, barriers, reductions - and "
                       f"the device functions of inlined values; {rest} more kernel lines: see exp.cuda.body(), "
                       "or tkx tour --html report.html)", style="dim"))
    from .render.cuda import compile_table

    console.print(compile_table(cuda))
    gpu: dict[str, Any] = {}
    code = _gpu_part(console, ex, exp, gpu)
    if html:
        from .render.report import write_report

        path = write_report(exp, html, description=ex.description, make_inputs=ex.make_inputs,
                            runner=gpu.get("runner"), verification=gpu.get("verification"))
        console.print(f"[bold]HTML report[/bold] of every stage: {path}")
    else:
        console.print(Text("Next: `tkx tour --html report.html` writes every stage with its notebook view "
                           "(click an op to see its CUDA lines); in Jupyter, `tkx.Explorer(step_fn, inputs)`.",
                           style="bold"))
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
