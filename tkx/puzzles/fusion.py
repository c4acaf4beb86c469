"""Puzzles on what the code of a group is: which ops fuse (and which rule forbids the others),
GEMM tiles under a register and shared-memory budget, and split-K.

Fusion answers are scored against the scheduler's recorded decisions
(:attr:`FusedSchedule.decisions`, each naming its rule, :mod:`tkx.schedule.rules`); tile and
split-K answers against the budgets of :mod:`tkx.target` and its cost model (predicted µs,
:func:`tkx.target._stage_us` with :func:`tkx.costs.constants`), and a split-K answer is also
run through the schedule interpreter and the task VM.
"""

from __future__ import annotations

from typing import Any

from .core import Drawing, Puzzle, PuzzleError, interpreter_faults, step, vm_faults

__all__ = ["Fusion", "GemmTiles", "SplitK"]

#: The split factors a GEMM may take (1: no split; ``Options.split_k`` allows the others).
SPLITS = (1, 2, 4, 8, 16)
LEGALITY = "legality"  # the scheduler's own check (shapes, access, dependency order): no rule is asked


def rule_names() -> list[str]:
    """The rules a fusion candidate can be refused by: the built-in rules and the legality check."""
    from ..schedule.rules import BUILTIN_RULES

    return [LEGALITY] + [r.name for r in BUILTIN_RULES]


class Fusion(Puzzle):
    """Decide each fusion candidate: ``True`` (fused) or the name of the rule that forbids it
    (:func:`rule_names`). Answer: ``{"producer -> consumer": True | rule name}``."""

    topic = "fusion"
    question = "Which candidates fuse? For each one that does not, name the rule that forbids it."

    def __init__(self, example: str, name: str, level: int, most: int = 8, **options: Any) -> None:
        super().__init__(example, name, level, **options)
        self.most = most

    def decisions(self) -> list[Any]:
        ds = list(self.step.schedule.decisions)
        refused = [d for d in ds if not d.fused]
        fused = [d for d in ds if d.fused]
        pick = refused[: self.most // 2] + fused[: self.most - min(len(refused), self.most // 2)]
        return sorted(pick, key=ds.index)

    @staticmethod
    def key(d: Any) -> str:
        return f"{d.producer} -> {d.consumer}"

    def draw(self) -> Drawing:
        p = self.step.program
        ops = {op.id: op for op in p.ops}
        lines = []
        for d in self.decisions():
            a, b = ops.get(d.producer), ops.get(d.consumer)
            lines.append(f"{d.kind:<9} {self.key(d):<24} ({a.kind if a else '?'} -> {b.kind if b else '?'})")
        lines.append("rules: " + ", ".join(rule_names()))
        return Drawing(f"{self.name}: {self.question}", "\n".join(lines), p)

    def blank(self) -> dict[str, Any]:
        return {self.key(d): None for d in self.decisions()}

    def solution(self) -> dict[str, Any]:
        return {self.key(d): True if d.fused else d.rule for d in self.decisions()}

    def judge(self, answer: Any) -> Any:
        if not isinstance(answer, dict) or set(answer) != set(self.blank()):
            raise PuzzleError(f"an answer has the keys of p.blank(): {sorted(self.blank())}")
        problems, right = [], 0
        names = rule_names()
        for d in self.decisions():
            got, k = answer[self.key(d)], self.key(d)
            if got is True and d.fused or got == d.rule and not d.fused:
                right += 1
            elif got is not True and got not in names:
                problems.append(f"{k}: {got!r} is neither True nor a rule name ({', '.join(names)})")
            elif d.fused:
                problems.append(f"{k}: the compiler fuses it ({d.reason})")
            elif got is True:
                problems.append(f"{k}: not fused")
            else:
                problems.append(f"{k}: not fused, but not by {got}")
        hint = ("read tkx.schedule.rules: a GEMM operand must be cheap to recompute (gemm-operand), a producer "
                "with several consumers is recomputed only when cheap (multi-use); legality refuses what "
                "cannot be computed at the consumer's coordinates")
        n = len(self.decisions())
        return self.verdict(problems, {"decisions right": (right, n)}, hint)


def _gemm_problem(st: Any) -> tuple[Any, Any]:
    """(the largest GEMM group's plan, its problem) of a step."""
    gs = [g for g in st.schedule.groups.values() if g.kind in ("gemm", "gemm_partial")]
    g = max(gs, key=lambda g: g.plan.m * g.plan.n * g.plan.k)
    return g, g.plan.problem


class GemmTiles(Puzzle):
    """Pick the SIMT GEMM tile ``(tile_m, tile_n, tile_k)`` of the step's largest GEMM for 256
    threads and ``blocks_per_sm`` resident blocks: the registers per thread
    (:meth:`GemmEmitter.registers`) within :func:`tkx.target.register_budget`, the fp32 operand tiles
    within 48 KiB of shared memory, operand tiles splitting evenly over the threads, at most
    :data:`tkx.target.MAX_STAGED_PER_THREAD` staged elements per thread; then the fewest predicted µs."""

    topic = "GEMM tiles"
    question = "Which tile_m x tile_n x tile_k fits the budget and runs fastest?"

    def __init__(self, example: str, name: str, level: int, blocks_per_sm: int = 2, **options: Any) -> None:
        super().__init__(example, name, level, **options)
        self.blocks_per_sm = blocks_per_sm

    def _problem(self) -> Any:
        return _gemm_problem(self.step)[1]

    def draw(self) -> Drawing:
        from ..target import GPU, register_budget

        p = self._problem()
        text = (f"C[{p.m}x{p.n}] = A[{p.m}x{p.k}] @ B[{p.k}x{p.n}] (fp32, SIMT), 256 threads, "
                f"blocks_per_sm={self.blocks_per_sm}\nbudget: {register_budget(256, self.blocks_per_sm)} registers "
                f"per thread (registers ~ tm*tn/256 + (tm*tk + tk*tn)/256 + 48), {GPU.shared_default} B of shared "
                "memory for the A and B tiles (fp32)")
        return Drawing(f"{self.name}: {self.question}", text)

    def blank(self) -> dict[str, int]:
        return {"tile_m": 0, "tile_n": 0, "tile_k": 0}

    def solution(self) -> dict[str, int]:
        from ..options import Options
        from ..target import choose_gemm

        plan = choose_gemm(self._problem(), Options(mode="grid", blocks_per_sm=self.blocks_per_sm), "sm_80")
        return {"tile_m": plan.tile_m, "tile_n": plan.tile_n, "tile_k": plan.tile_k}

    def cost(self, tiles: dict[str, int]) -> tuple[list[str], float]:
        from .. import costs
        from ..target import GPU, MAX_STAGED_PER_THREAD, SM_COUNT, GemmPlan, _stage_us, gemm_emitter, register_budget

        p, threads = self._problem(), 256
        tm, tn, tk = tiles["tile_m"], tiles["tile_n"], tiles["tile_k"]
        e = gemm_emitter("simt")
        plan = GemmPlan("simt", "", p.m, p.n, p.k, p.batch, tm, tn, tk, threads=threads)
        problems = []
        budget = register_budget(threads, self.blocks_per_sm)
        if e.registers(plan) > budget:
            problems.append(f"about {e.registers(plan)} registers per thread, over the budget of {budget}")
        if (tm * tk + tk * tn) * 4 > GPU.shared_default:
            problems.append(f"the A and B tiles take {(tm * tk + tk * tn) * 4} B of shared memory, over "
                            f"{GPU.shared_default}")
        if (tm * tk) % threads or (tk * tn) % threads:
            problems.append(f"a {tm}x{tk} or {tk}x{tn} operand tile does not split evenly over {threads} threads")
        if (tm * tk + tk * tn) // threads > MAX_STAGED_PER_THREAD:
            problems.append(f"{(tm * tk + tk * tn) // threads} staged elements per thread, over "
                            f"{MAX_STAGED_PER_THREAD}")
        return problems, _stage_us(e.cost(plan), SM_COUNT, costs.constants())

    def judge(self, answer: Any) -> Any:
        if not isinstance(answer, dict) or set(answer) != set(self.blank()) or \
                not all(isinstance(v, int) and v > 0 and v & (v - 1) == 0 for v in answer.values()):
            raise PuzzleError("an answer gives tile_m, tile_n and tile_k as powers of two")
        problems, us = self.cost(answer)
        _, ref = self.cost(self.solution())
        hint = ("accumulators (tm*tn/256 per thread) dominate the registers: shrink the larger of tile_m and "
                "tile_n first, then tile_k; tiles must cover at least 256 outputs")
        return self.verdict(problems, {"predicted µs": (round(us, 2), round(ref, 2))}, hint)


class SplitK(Puzzle):
    """Decide split-K for a wgmma GEMM whose output tiles cannot fill the SMs: the split factor
    (1: none). Slices are computed by separate work items, then added in slice order in a final
    stage after a grid barrier. The answer is lowered with ``Options(split_k=n)``, run through the
    schedule interpreter and the task VM, and its predicted µs compared with the compiler's
    ``split_k="auto"`` choice."""

    topic = "split-K"
    question = "Into how many K slices should the GEMM be split?"

    def __init__(self, example: str, name: str, level: int, **options: Any) -> None:
        super().__init__(example, name, level, arch="sm_90a", **options)

    def _group(self, split: Any) -> Any:
        st = step(self.example, **{**self.options, "split_k": split})
        gs = [g for g in st.schedule.groups.values() if g.kind in ("gemm", "gemm_partial")]
        return st, max(gs, key=lambda g: (g.plan.k, g.plan.m * g.plan.n))

    def draw(self) -> Drawing:
        from ..target import SM_COUNT

        _, g = self._group("off")
        p = g.plan
        tiles = p.batch * -(-p.m // p.tile_m) * -(-p.n // p.tile_n)
        text = (f"C[{p.m}x{p.n}] = A[{p.m}x{p.k}] @ B[{p.k}x{p.n}] ({p.dtype}, {p.impl}), tiles {p.tile_m}x{p.tile_n}"
                f" -> {tiles} output tiles on {SM_COUNT} SMs, K = {p.k} in {-(-p.k // p.tile_k)} steps of {p.tile_k}")
        return Drawing(f"{self.name}: {self.question}", text)

    def blank(self) -> int:
        return 0

    def solution(self) -> int:
        return int(self._group("auto")[1].plan.split_k)

    def predicted_us(self, st: Any) -> float:
        from .. import costs
        from ..target import SM_COUNT, _stage_us, gemm_emitter

        total = 0.0
        for g in st.schedule.groups.values():
            if g.kind in ("gemm", "gemm_partial") and g.plan.k == self._group("off")[1].plan.k:
                e = gemm_emitter(g.plan.impl)
                phase = "partial" if g.kind == "gemm_partial" else ("final" if g.plan.split_k > 1 else "one")
                total += _stage_us(e.cost(g.plan, phase), SM_COUNT, costs.constants(),
                                   g.plan.impl if phase != "final" else None)
        return total

    def judge(self, answer: Any) -> Any:
        if answer not in SPLITS or isinstance(answer, bool):
            raise PuzzleError(f"an answer is a split factor, one of {', '.join(map(str, SPLITS))}, got {answer!r}")
        st, g = self._group(answer if answer > 1 else "off")
        problems = []
        if g.plan.split_k != answer:
            problems.append(f"split_k={answer} is not possible here: {g.plan.adjusted}")
        problems += interpreter_faults(st, st.schedule, st.arena)
        if not problems:
            problems += vm_faults(st, st.dag(), blocks=(3,), seeds=(0, 1))
        mine, ref = self.predicted_us(st), self.predicted_us(self._group("auto")[0])
        if not problems and mine > ref * 1.0001:
            problems.append(f"predicted {mine:.2f} µs, the compiler's split takes {ref:.2f} µs")
        hint = ("split while the output tiles x slices still fit the SMs in one wave and each slice keeps at "
                "least 2 K steps; each split adds a final stage and a grid barrier")
        return self.verdict(problems, {"predicted µs": (round(mine, 2), round(ref, 2))}, hint)
