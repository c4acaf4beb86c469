"""A puzzle on a decode step's weight prefetch: which layer's weight loads are issued when.

Scored by :mod:`tkx.dataflow.prefetch`: the answer is checked for faults that hold in every
interleaving (a load that waits for its own reader: deadlock; units that may be held at once over the
byte budget), then run through the prefetch timeline under adversarial interleavings (random task and
load times, 1 to many blocks, two deals of tasks to blocks), and its predicted µs compared with the
compiler's plan (:func:`tkx.dataflow.prefetch.plan`).
"""

from __future__ import annotations

from typing import Any

from .core import Drawing, Puzzle, PuzzleError

__all__ = ["WeightPrefetch"]

#: Block counts and seeds of the adversarial runs (plus the step's own grid).
ADVERSARY_BLOCKS = (1, 2, 3)
ADVERSARY_SEEDS = (0, 1, 2)


class WeightPrefetch(Puzzle):
    """Schedule a decode layer's weight prefetch: give every prefetch unit (a layer's attention or MLP
    projections, the LM head; :func:`tkx.dataflow.prefetch.units`) an issue point: ``None`` (not
    prefetched), ``"start"`` (kernel entry) or a group id (once every task of that group has ended).
    A load is streamed by ``streams`` SMs and must land before its first reader starts; its bytes are
    held until its last reader ends, and the bytes held at once stay within ``budget`` bytes in every
    interleaving. Answer: ``{unit: None | "start" | group id}``."""

    topic = "weight prefetch"
    question = ("When is each unit of weights loaded? Hide each load behind the previous layer's tail "
                "without exceeding the byte budget in any interleaving.")

    def __init__(self, example: str, name: str, level: int, budget: int = 80 * 1024, streams: int = 1,
                 **options: Any) -> None:
        super().__init__(example, name, level, **options)
        self.budget, self.streams = budget, streams
        self._memo: dict[str, Any] = {}

    @property
    def dag(self) -> Any:
        if "dag" not in self._memo:
            self._memo["dag"] = self.step.dag()
        return self._memo["dag"]

    @property
    def blocks(self) -> int:
        return int(self.step.schedule.blocks)

    def units(self) -> tuple[Any, ...]:
        from ..dataflow.prefetch import units

        return units(self.dag)

    def draw(self) -> Drawing:
        from .. import costs

        d, s = self.dag, self.step.schedule
        c = costs.constants()
        reads = {g: u.name for u in self.units() for g in u.consumers}
        lines = [f"{len(d.order)} groups on {self.blocks} blocks, in task order (a load issued after X starts "
                 f"once X's counter is full, plus a hand-off of {c['handoff_us']:.2f} µs):"]
        for g in d.order:
            waits = ", ".join(d.counters[w.counter].group for w in d.waits[g]) or "-"
            tail = f"  reads the weights of {reads[g]}" if g in reads else ""
            lines.append(f"  {g:<5} {s.groups[g].kind:<18} {d.items[g]:>3} tasks, waits for {waits}{tail}")
        lines.append(f"units (a load streams at {self.streams} x {c['sm_bytes_per_us']:.0f} bytes/µs; "
                     f"budget {self.budget} bytes held at once):")
        for u in self.units():
            load = u.nbytes / (self.streams * c['sm_bytes_per_us'])
            lines.append(f"  {u.name:<8} {u.nbytes:>6} bytes, {load:.2f} µs to load; read by {', '.join(u.consumers)}")
        return Drawing(f"{self.name}: {self.question}", "\n".join(lines))

    def blank(self) -> dict[str, Any]:
        return {u.name: None for u in self.units()}

    def solution(self) -> dict[str, Any]:
        from ..dataflow.prefetch import plan

        if "plan" not in self._memo:
            self._memo["plan"] = plan(self.dag, self.budget, blocks=self.blocks, streams=self.streams)
        return dict(self._memo["plan"])

    def issue_of(self, answer: Any) -> dict[str, Any]:
        d, names = self.dag, list(self.blank())
        form = f"an answer is a dict mapping every unit {names} to None, 'start' or a group id"
        if not isinstance(answer, dict):
            raise PuzzleError(f"{form}, not a {type(answer).__name__}")
        missing = [u for u in names if u not in answer]
        unknown = [u for u in answer if u not in names]
        if missing or unknown:
            parts = ([f"missing {missing}"] if missing else []) + ([f"no unit called {unknown}"] if unknown else [])
            raise PuzzleError(f"{form}: {'; '.join(parts)}")
        for u, x in answer.items():
            if x is not None and x != "start" and not (isinstance(x, str) and x in d.items):
                raise PuzzleError(f"{u}: {x!r} is neither None, 'start' nor a group id (a str: {', '.join(d.order)})")
        return dict(answer)

    def adversarial_problems(self, issue: dict[str, Any]) -> list[str]:
        """Deadlocks and budget overruns of the prefetch timeline under adversarial interleavings (the first 3)."""
        from ..dataflow.prefetch import simulate

        out: list[str] = []
        for rotate in (False, True):
            for b in (*ADVERSARY_BLOCKS, self.blocks):
                for seed in ADVERSARY_SEEDS:
                    r = simulate(self.dag, issue, blocks=b, streams=self.streams, jitter=1.0, seed=seed,
                                 rotate=rotate)
                    where = f"timeline ({b} blocks, seed {seed}{', rotated' if rotate else ''})"
                    if r.deadlock:
                        out.append(f"{where}: {r.deadlock}")
                    elif r.peak_bytes > self.budget:
                        out.append(f"{where}: {', '.join(r.peak_units)} held at once, {r.peak_bytes} bytes "
                                   f"> {self.budget}")
                    if len(out) >= 3:
                        return out
        return out

    def judge(self, answer: Any) -> Any:
        from ..dataflow.prefetch import simulate, static_problems

        issue = self.issue_of(answer)
        problems = static_problems(self.dag, issue, self.budget)
        problems += self.adversarial_problems(issue)
        ref = self.solution()
        mine_run = simulate(self.dag, issue, blocks=self.blocks, streams=self.streams)
        ref_us = simulate(self.dag, ref, blocks=self.blocks, streams=self.streams).makespan
        mine = mine_run.makespan
        hint = ("a load must be issued after a group that comes before its first reader, and early enough to "
                "land in time: (bytes / rate) µs before the reader could start")
        if any("over budget" in p or "held at once" in p for p in problems):
            hint = ("over the byte budget: two units are held at once unless the later one's issue group waits "
                    "(directly or through others) for every reader of the earlier one: issue after the earlier "
                    "unit's last reader, or prefetch less")
        elif any("deadlock" in p for p in problems):
            hint = "issue each load after a group that comes before the unit's first reader in the task order"
        if not problems and mine > ref_us * 1.0001:
            late = ", ".join(f"{n} ({t:.2f} µs)" for n, t in mine_run.stalled.items())
            problems.append(f"predicted {mine:.2f} µs, the compiler's plan takes {ref_us:.2f} µs"
                            + (f"; readers stall for the loads of {late}" if late else ""))
            hint = ("prefetch every unit you can, and issue each load early enough to land before its first reader "
                    "starts: overlap it with the previous layer's tail while the budget allows")
        score = {"predicted µs": (round(mine, 2) if mine != float("inf") else mine, round(ref_us, 2))}
        return self.verdict(problems, score, hint)
