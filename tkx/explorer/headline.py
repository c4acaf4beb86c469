"""The Explorer's headline: one line after every change saying what moved.

:func:`facts_of` reads the figures a change can move from an exploration (barriers, stages,
arena bytes; registers and spills from the compiled kernel on a GPU, else from an NVRTC check
for sm_90, which needs no GPU; µs per step from the last benchmark); :func:`headline` writes
the line from the facts before and after. Both are plain functions (the widget only shows the
text), so the line is testable without a browser::

    tile_m=32: barriers 6 -> 12, stages 7 -> 13, arena 1.2 KiB -> 2.3 KiB; same: 40 registers, no spills
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..words import plural

__all__ = ["Facts", "facts_of", "headline", "failure_headline", "headline_html"]


@dataclass(frozen=True)
class Facts:
    """What one state of the Explorer measures: ``barriers``, ``stages`` and ``launch`` (grid x
    threads and mode, e.g. ``"1 block x 256 (block mode)"``) of the schedule,
    ``arena_bytes``, ``registers`` per thread and ``spill_bytes`` (``registers_from`` says
    where they come from: ``"GPU"`` or ``"NVRTC sm_90"``), ``us_per_step`` (median of the last
    benchmark of this state, µs), ``predicted_us`` (the cost model's µs per step,
    :func:`tkx.schedule.predicted_us`) and ``arena_lower_bytes`` (the arena's lower bound: the
    most bytes live at once, :attr:`tkx.arena.ArenaPlan.lower_bound_bytes`). ``None``: not known
    (not computed, no NVRTC)."""

    barriers: int | None = None
    stages: int | None = None
    launch: str | None = None
    arena_bytes: int | None = None
    registers: int | None = None
    spill_bytes: int | None = None
    registers_from: str = ""
    us_per_step: float | None = None
    predicted_us: float | None = None
    arena_lower_bytes: int | None = None


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def facts_of(ex: Any, *, registers: bool = True, report: Any = None) -> Facts:
    """The :class:`Facts` of an exploration's computed stages (nothing is computed here except,
    with ``registers``, an NVRTC check of the CUDA source when no GPU runner exists; it is
    cached by source hash, and the CUDA tab reuses it). ``report``: the
    :class:`~tkx.bench.BenchmarkReport` of this state, for µs per step."""
    cache = ex._cache
    s, a, c = cache.get("schedule"), cache.get("arena"), cache.get("cuda")
    regs = spills = None
    where = ""
    runner = cache.get("runner")
    if runner is not None:
        res = runner.resources
        regs, spills, where = res.registers, (res.spill_bytes if res.spill_bytes >= 0 else None), "GPU"
    elif registers and c is not None:
        from ..render.cuda import compile_reports

        _note, reports = compile_reports(c, ("sm_90",))
        if reports and not isinstance(reports[0], Exception):
            regs, spills, where = reports[0].registers, reports[0].spill_bytes, "NVRTC sm_90"
    us = getattr(report, "megakernel_us", None) if report is not None else None
    predicted = None
    if s is not None:
        from ..schedule import predicted_us

        predicted = round(predicted_us(s), 1)
    launch = f"{plural(s.blocks, 'block')} x {s.threads} ({s.mode} mode)" if s is not None else None
    return Facts(barriers=s.num_barriers if s is not None else None, stages=len(s.stages) if s is not None else None,
                 launch=launch,
                 arena_bytes=a.size_bytes if a is not None else None, registers=regs, spill_bytes=spills,
                 registers_from=where, us_per_step=us, predicted_us=predicted,
                 arena_lower_bytes=a.lower_bound_bytes if a is not None else None)


def _items(f: Facts) -> dict[str, str]:
    """Each known figure of ``f`` as words, in headline order."""
    out: dict[str, str] = {}
    if f.barriers is not None:
        out["barriers"] = plural(f.barriers, "barrier")
    if f.stages is not None:
        out["stages"] = plural(f.stages, "stage")
    if f.predicted_us is not None:
        out["predicted"] = f"predicted {f.predicted_us:.1f} µs"
    if f.launch is not None:
        out["launch"] = f.launch
    if f.arena_bytes is not None:
        out["arena"] = f"arena {_bytes(f.arena_bytes)}" + (
            f" (lower bound {_bytes(f.arena_lower_bytes)})" if f.arena_lower_bytes is not None else "")
    if f.registers is not None:
        out["registers"] = plural(f.registers, "register")
    if f.spill_bytes is not None:
        out["spills"] = "no spills" if f.spill_bytes == 0 else f"{f.spill_bytes} B spilled"
    if f.us_per_step is not None:
        out["us"] = f"{f.us_per_step:.1f} µs/step"
    return out


def _value(f: Facts, key: str) -> str:
    return {"barriers": str(f.barriers), "stages": str(f.stages), "launch": f.launch or "",
            "arena": _bytes(f.arena_bytes) if f.arena_bytes is not None else "",
            "registers": str(f.registers), "spills": f"{f.spill_bytes} B",
            "us": f"{f.us_per_step:.1f}" if f.us_per_step is not None else "",
            "predicted": f"{f.predicted_us:.1f}" if f.predicted_us is not None else ""}[key]


_NAMES = {"barriers": "barriers", "stages": "stages", "launch": "launch", "arena": "arena", "registers": "registers",
          "spills": "spills", "us": "µs/step", "predicted": "predicted µs"}


def _changed_label(changed: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "start"


def headline(changed: dict[str, Any], before: Facts | None, after: Facts) -> str:
    """One line: the change, then what moved (``before -> after``), then what stayed.

    ``changed``: option name -> new value (empty: the first display, which lists the figures).
    Figures known on one side only are shown as they are now."""
    label = _changed_label(changed)
    now = _items(after)
    if before is None or not changed:
        tail = f" ({after.registers_from})" if after.registers_from and "registers" in now else ""
        return f"{label}: " + (", ".join(now.values()) or "nothing computed yet") + tail
    was = _items(before)
    moved, same = [], []
    for key, words in now.items():
        if key not in was:
            moved.append(words)
        elif _value(before, key) != _value(after, key):
            moved.append(f"{_NAMES[key]} {_value(before, key)} -> {_value(after, key)}")
        else:
            same.append(words)
    line = f"{label}: " + (", ".join(moved) if moved else "nothing moved")
    if same:
        line += "; same: " + ", ".join(same)
    return line


def failure_headline(changed: dict[str, Any], stage: str | None, ms: float, done: list[str], *,
                     first: bool = False) -> str:
    """The line after a change (or the first display, ``first``) that failed: which stage, after
    how long, what was computed before it and what stays on screen."""
    where = "invalid options" if stage == "options" else f"stage {stage or '?'} failed"
    computed = f" (computed {', '.join(done)} first)" if done else ""
    kept = "" if first else "; the last good state stays on screen"
    return f"{_changed_label(changed)}: {where} after {ms:.1f} ms{computed}{kept}"


def headline_html(text: str, *, error: bool = False) -> str:
    """The headline as the Explorer shows it: one bold line (red for a failure)."""
    import html

    color = "#cf222e" if error else "#1f2328"
    return (f'<div class="tkx-headline" style="font-family:system-ui,sans-serif;font-size:14px;font-weight:600;'
            f'color:{color};margin:4px 0">{html.escape(text)}</div>')
