"""The result of a benchmark: :class:`Row` per candidate, :class:`BenchmarkReport` for a workload.

All times are microseconds per training step (µs), medians over repeats of CUDA-event-timed
batches of CUDA-graph replays (plain ``eager`` is timed without a graph). Ratios are
``median / best baseline median``: below 1 the candidate is faster than the best baseline.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Baseline candidates, in the order they are timed.
BASELINES = ("eager", "eager+cudagraph", "inductor", "inductor-max-autotune")
#: The megakernel's row.
MEGAKERNEL = "tkx"
#: The row of the same fused groups launched as one kernel each, in one CUDA graph
#: (:class:`tkx.runtime.GraphOfKernels`): what the single kernel buys over the same code as many kernels.
GRAPH_OF_KERNELS = "tkx graph of kernels"
#: tkx's own rows (never a baseline).
TKX_ROWS = (MEGAKERNEL, GRAPH_OF_KERNELS)


@dataclass(frozen=True)
class Row:
    """One candidate: ``median_us`` (µs per step, ``None`` if it failed), every ``samples``
    value (µs per step, one per repeat), ``ok``, a ``note`` (the error for a failed candidate),
    ``steps_per_sample`` (steps timed between one pair of CUDA events)."""

    name: str
    median_us: float | None
    samples: tuple[float, ...] = ()
    ok: bool = True
    note: str = ""
    steps_per_sample: int = 0

    @staticmethod
    def measured(name: str, samples: Sequence[float], steps_per_sample: int, *, ok: bool = True,
                 note: str = "") -> Row:
        return Row(name, float(statistics.median(samples)), tuple(float(s) for s in samples), ok, note,
                   steps_per_sample)

    @staticmethod
    def failed(name: str, note: str) -> Row:
        return Row(name, None, (), False, note)

    @property
    def min_us(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def max_us(self) -> float | None:
        return max(self.samples) if self.samples else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "median_us": self.median_us, "samples_us": list(self.samples),
                "ok": self.ok, "note": self.note, "steps_per_sample": self.steps_per_sample}


@dataclass(frozen=True)
class BenchmarkReport:
    """Megakernel against baselines on one workload, all from one run.

    ``rows``: one :class:`Row` per candidate (baselines first, then ``tkx`` and ``tkx graph of kernels``);
    ``verification``: the correctness check made before timing (a dict, see
    :meth:`tkx.runtime.Verification.as_dict`); ``resources``: the kernel's registers, shared
    and local bytes, occupancy, grid (:class:`tkx.runtime.Resources` as a dict); ``compile``:
    seconds for lowering and for cold and cached NVRTC compiles; ``meta``: device, versions,
    repeats, input sets.
    """

    name: str
    rows: tuple[Row, ...]
    verification: dict[str, Any] | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    compile: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    # -- queries ----------------------------------------------------------------------------
    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    @property
    def baselines(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.name not in TKX_ROWS)

    @property
    def best_baseline(self) -> str | None:
        """The fastest baseline that ran (``None`` if none did)."""
        ok = [r for r in self.baselines if r.ok and r.median_us is not None]
        return min(ok, key=lambda r: r.median_us).name if ok else None

    @property
    def best_baseline_us(self) -> float | None:
        best = self.best_baseline
        return self.row(best).median_us if best else None

    @property
    def megakernel_us(self) -> float | None:
        r = self.row(MEGAKERNEL)
        return r.median_us if r is not None else None

    @property
    def graph_of_kernels_us(self) -> float | None:
        """µs per step of the same groups as one kernel each in one CUDA graph (``None`` if not timed)."""
        r = self.row(GRAPH_OF_KERNELS)
        return r.median_us if r is not None else None

    @property
    def sol_fraction(self) -> float | None:
        """The megakernel's fraction of the speed of light: speed-of-light µs / tkx µs (1 = at the limit)."""
        return self.sol_ratios.get(MEGAKERNEL)

    @property
    def ratio_to_best(self) -> float | None:
        """``tkx median / best baseline median`` (below 1: tkx is faster)."""
        mine, best = self.megakernel_us, self.best_baseline_us
        return mine / best if mine is not None and best else None

    @property
    def ratios(self) -> dict[str, float | None]:
        """Every candidate's median divided by the best baseline's."""
        best = self.best_baseline_us
        return {r.name: (r.median_us / best if r.median_us is not None and best else None) for r in self.rows}

    @property
    def speed_of_light_us(self) -> float | None:
        """max(FLOPs / 790 TFLOP/s, bytes / 4.8 TB/s) of the step in µs (``schedule["speed_of_light_us"]``,
        :func:`tkx.target.speed_of_light_us`), ``None`` when not recorded."""
        return self.schedule.get("speed_of_light_us")

    @property
    def sol_ratios(self) -> dict[str, float | None]:
        """Every candidate's speed-of-light ratio: the speed-of-light time / its median (1 = at the limit)."""
        sol = self.speed_of_light_us
        return {r.name: (sol / r.median_us if sol and r.median_us else None) for r in self.rows}

    @property
    def verified(self) -> bool | None:
        return None if self.verification is None else bool(self.verification.get("passed"))

    # -- output -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "rows": [r.as_dict() for r in self.rows], "best_baseline": self.best_baseline,
            "best_baseline_us": self.best_baseline_us, "us_per_step": self.megakernel_us,
            "ratio_to_best": self.ratio_to_best, "ratios": self.ratios,
            "graph_of_kernels_us": self.graph_of_kernels_us,
            "speed_of_light_us": self.speed_of_light_us, "sol_fraction": self.sol_fraction,
            "sol_ratios": self.sol_ratios,
            "verification": self.verification,
            "resources": self.resources, "compile": self.compile, "schedule": self.schedule,
            "meta": self.meta,
        }

    def to_json(self, path: str | None = None, *, indent: int = 2) -> str:
        """The report as JSON text (written to ``path`` too when given)."""
        text = json.dumps(self.to_dict(), indent=indent, default=str)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    def table_rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """Header plus one row per candidate: name, median, min..max, ratio, samples, note."""
        sol = self.sol_ratios
        head = ("candidate", "median µs", "min..max µs", "x best baseline", "steps/sample", "note")
        if self.speed_of_light_us:
            head = head[:4] + ("speed of light",) + head[4:]
        out = [head]
        ratios = self.ratios
        for r in self.rows:
            if r.median_us is None:
                out.append((r.name, "-", "-", "-") + (("-",) if len(head) == 7 else ()) + ("-", r.note or "failed"))
                continue
            ratio = ratios.get(r.name)
            mark = " (best)" if r.name == self.best_baseline else ""
            cells = (r.name, f"{r.median_us:.1f}", f"{r.min_us:.1f}..{r.max_us:.1f}",
                     (f"{ratio:.2f}" if ratio is not None else "-") + mark)
            if len(head) == 7:
                cells += (f"{sol[r.name]:.3f}" if sol.get(r.name) is not None else "-",)
            out.append(cells + (str(r.steps_per_sample), r.note if not r.ok or r.note else ""))
        return out

    def headline(self) -> str:
        mine, best, ratio = self.megakernel_us, self.best_baseline_us, self.ratio_to_best
        verdict = {True: "verified", False: "WRONG RESULTS", None: "not verified"}[self.verified]
        if mine is None:
            return f"{self.name}: tkx did not run ({verdict})"
        if best is None:
            return f"{self.name}: tkx {mine:.1f} µs/step, no baseline ran ({verdict})"
        return (f"{self.name}: tkx {mine:.1f} µs/step vs {self.best_baseline} {best:.1f} µs/step "
                f"= {ratio:.2f}x ({verdict})")

    def __str__(self) -> str:
        rows = self.table_rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [self.headline()]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<tkx.BenchmarkReport {self.headline()}>"

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=self.headline(), title_justify="left")
        header, *body = self.table_rows()
        for i, h in enumerate(header):
            table.add_column(h, justify="right" if 0 < i < 5 else "left")
        for r in body:
            style = ("bold green" if r[0] == MEGAKERNEL else "green" if r[0] == GRAPH_OF_KERNELS
                     else "red" if r[1] == "-" else None)
            table.add_row(*r, style=style)
        return table

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from .. import display

        return display.mimebundle(self, include, exclude)
