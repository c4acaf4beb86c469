"""The machinery every puzzle shares: a zoo step lowered once, a problem drawing, a verdict.

A puzzle (:class:`Puzzle`) poses one decision a megakernel compiler makes, on a small real
step of :mod:`tkx.examples`. The learner fills ``p.blank()``; :func:`check` runs the answer
through the schedule interpreter (poisoned arena, groups of a stage in reverse order) and/or
the task VM (``policy="random"`` over several seeds and grid sizes), then scores it against
the compiler's own decision (``p.solution()``, read from the compiler, not written down).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from html import escape
from typing import Any

from ..errors import TkxError

__all__ = ["Step", "step", "Puzzle", "Verdict", "Drawing", "check", "vm_faults", "interpreter_faults"]

#: Seeds and grid sizes of the adversarial VM runs a check performs.
VM_SEEDS = (0, 1, 2, 3)
VM_BLOCKS = (1, 2, 3)


class PuzzleError(TkxError):
    """An answer that is not of the puzzle's form (wrong type, unknown group or buffer)."""


def whole(x: Any, what: str) -> int:
    """``x`` as an int when it is a whole number (``3``, ``3.0``); else :class:`PuzzleError` naming ``what``
    (``1.5``, ``inf``, ``nan`` and strings are answers of the wrong form, not rounded)."""
    import operator
    try:
        return operator.index(x)
    except TypeError:
        pass
    if isinstance(x, float) and x.is_integer():
        return int(x)
    raise PuzzleError(f"{what} must be a whole number, got {x!r}")


@dataclass(frozen=True)
class Step:
    """A zoo step lowered on the CPU: its ``program``, ``schedule``, ``arena`` plan, ``inputs``
    (seeded) and the ``reference`` execution (:func:`tkx.reference.run`)."""

    name: str
    options: Any
    program: Any = field(repr=False)
    schedule: Any = field(repr=False)
    arena: Any = field(repr=False)
    inputs: tuple = field(repr=False)
    reference: Any = field(repr=False)

    def dag(self, schedule: Any = None, arena: Any = None) -> Any:
        from .. import dataflow

        return dataflow.build(schedule or self.schedule, arena or self.arena)


@cache
def _step(name: str, opts: tuple) -> Step:
    from ..examples import get
    from ..options import Options
    from ..pipeline import _context, compute
    from ..reference import flatten_inputs
    from ..reference import run as reference_run

    try:
        ex = get(name)
    except KeyError:  # an inference step: the decode registry
        from ..examples import decode

        ex = decode.get(name)
    options = Options(mode="grid", **dict(opts))
    cache: dict[str, Any] = {}
    ctx = _context(ex.step_fn, ex.example_inputs, options, name, None)
    plan = compute("arena", ctx, cache)
    sched = plan.schedule
    inputs = tuple(flatten_inputs(sched.program, ex.make_inputs(seed=0)))
    return Step(name, options, sched.program, sched, plan, inputs, reference_run(sched.program, list(inputs)))


def step(name: str, **options: Any) -> Step:
    """The :class:`Step` of zoo example ``name`` (or decode example, :mod:`tkx.examples.decode`) lowered
    with ``Options(mode="grid", **options)`` (cached). Raises :class:`KeyError` for an unknown example."""
    return _step(name, tuple(sorted(options.items())))


@dataclass(frozen=True)
class Drawing:
    """A puzzle's problem as text (``str``) and HTML (the text, then tkx's own rendering of ``obj``:
    the program a fusion or barrier puzzle is posed on, never the stage that holds the answer)."""

    title: str
    text: str
    obj: Any = None

    def __str__(self) -> str:
        return f"{self.title}\n{self.text}"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        html = f"<h4>{escape(self.title)}</h4><pre>{escape(self.text)}</pre>"
        bundle = getattr(self.obj, "_repr_mimebundle_", None)
        if bundle is not None:
            try:
                html += bundle().get("text/html", "")
            except Exception:  # noqa: BLE001 - a notebook package missing: the text still stands
                pass
        return {"text/plain": str(self), "text/html": html}


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` found: ``ok`` (correct), ``problems`` (sentences), ``score`` (metric ->
    (yours, the compiler's), e.g. ``{"barriers": (3, 3)}``), ``optimal`` (no metric worse than the
    compiler's) and a ``hint`` toward the fix when not ``ok``."""

    puzzle: str
    ok: bool
    problems: tuple[str, ...] = ()
    score: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    hint: str = ""

    @property
    def optimal(self) -> bool:
        return self.ok and all(_not_worse(a, b) for a, b in self.score.values())

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = (f"{self.puzzle}: correct" + (" and as good as the compiler" if self.optimal else
                                             ", but the compiler does better") if self.ok
                else f"{self.puzzle}: wrong")
        lines = [head]
        lines += [f"  {m}: yours {_fmt(a)}, compiler {_fmt(b)}" for m, (a, b) in self.score.items()]
        lines += [f"  - {p}" for p in self.problems[:6]]
        if len(self.problems) > 6:
            lines.append(f"  ... {len(self.problems) - 6} more")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.ok else "#cf222e"
        return f'<pre style="border-left:4px solid {color};padding-left:8px">{escape(str(self))}</pre>'


def _not_worse(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a <= b * 1.0001 + 1e-9
    return a == b


def _fmt(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, float) else str(x)


class Puzzle:
    """One puzzle: ``name``, ``level`` (1 easiest), ``topic`` and ``step`` (a zoo example).

    Subclasses implement :meth:`draw` (the problem), :meth:`blank` (the answer skeleton),
    :meth:`solution` (the compiler's answer) and :meth:`judge` (``answer -> Verdict``)."""

    name = ""
    topic = ""
    level = 1
    question = ""

    def __init__(self, example: str, name: str, level: int, **options: Any) -> None:
        self.example, self.name, self.level = example, name, level
        self.options = options

    @property
    def step(self) -> Step:
        return step(self.example, **self.options)

    def draw(self) -> Drawing:
        raise NotImplementedError

    def blank(self) -> Any:
        raise NotImplementedError

    def solution(self) -> Any:
        raise NotImplementedError

    def judge(self, answer: Any) -> Verdict:
        raise NotImplementedError

    def verdict(self, problems: Sequence[str], score: Mapping[str, tuple[Any, Any]], hint: str) -> Verdict:
        ok = not problems
        return Verdict(self.name, ok, tuple(problems), dict(score), "" if ok else hint)

    def __repr__(self) -> str:
        return f"<tkx.puzzles {self.name} (level {self.level}, {self.topic}) on {self.example}>"

    def __str__(self) -> str:
        return f"{self.name} (level {self.level}, {self.topic}) on {self.example}: {self.question}"


def check(puzzle: Puzzle, answer: Any) -> Verdict:
    """Check ``answer`` to ``puzzle``: a :class:`Verdict` (never raises for a wrong answer; an
    answer of the wrong form is a wrong answer whose hint says what form is expected)."""
    if not isinstance(puzzle, Puzzle):
        raise TkxError(f"check takes a puzzle of tkx.puzzles.PUZZLES, got {type(puzzle).__name__}")
    try:
        return puzzle.judge(answer)
    except (PuzzleError, TypeError, ValueError, OverflowError) as e:  # int("x"), a list where a dict belongs
        return Verdict(puzzle.name, False, (f"the answer is not of this puzzle's form: {e}",), {},
                       f"start from p.blank(): {_shape_of(puzzle.blank())}")


def _shape_of(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 160 else text[:157] + "..."


def interpreter_faults(st: Step, schedule: Any, arena: Any) -> list[str]:
    """Run ``schedule`` + ``arena`` in the schedule interpreter (poisoned arena, reverse order in
    a stage) and compare with the reference: the differences as sentences."""
    from ..dataflow.vm import _close
    from ..schedule.interpreter import run

    try:
        got = run(schedule, arena, list(st.inputs))
    except Exception as e:  # noqa: BLE001 - a bad schedule may break the interpreter: that is a finding
        return [f"the schedule interpreter failed: {type(e).__name__}: {e}"]
    out = [f"interpreter: output {st.program.outputs[k].name} differs from the reference (read poisoned memory?)"
           for k, (a, b) in enumerate(zip(got.outputs, st.reference.outputs)) if not _close(a, b, 1e-5)]
    out += [f"interpreter: the update of input {st.program.inputs[k].name} differs from the reference"
            for k, want in st.reference.updates.items() if not _close(got.updates[k], want, 1e-5)]
    return out


def vm_faults(st: Step, dag: Any, *, blocks: Sequence[int] = VM_BLOCKS, seeds: Sequence[int] = VM_SEEDS,
              launches: int = 1, values: bool = False) -> list[str]:
    """Run ``dag`` in the task VM with ``policy="random"`` for every grid size and seed: the first
    fault of each failing run (empty when every interleaving is clean)."""
    from ..dataflow import vm

    out: list[str] = []
    for b in blocks:
        for sd in seeds:
            r = vm.run(dag, list(st.inputs), blocks=b, policy="random", seed=sd, launches=launches,
                       values=values, reference=st.reference if values else None)
            if r.faults:
                out.append(f"task VM ({b} blocks, seed {sd}): {r.faults[0]}")
                if len(out) >= 3:
                    return out
    return out


def replace_schedule(s: Any, stages: Sequence[Sequence[str]]) -> Any:
    """``s`` with other stages (barriers rebuilt, one grid barrier between consecutive stages)."""
    from ..schedule.model import Barrier

    stages = tuple(tuple(x) for x in stages if x)
    barriers = tuple(Barrier(i, "grid", ()) for i in range(1, len(stages)))
    return dataclasses.replace(s, stages=stages, barriers=barriers)
