"""Benchmark suites: the four MLP workloads of DESIGN.md's measured anchors (``mlp``) and the
everyday steps of the zoo (``everyday``), one JSON file each.

``bench_suite("mlp", out_json="bench.json")`` runs :func:`~tkx.bench.compare` on
``tiny_online``, ``online``, ``small`` and ``medium`` (from :mod:`tkx.examples`) and returns
(and writes) a dict keyed by workload name. Each entry has ``us_per_step`` (the megakernel,
µs), ``best_baseline`` and ``best_baseline_us``, ``ratio_to_best`` (below 1: tkx is faster),
``speed_of_light_us`` (max(FLOPs / 790 TFLOP/s, bytes / 4.8 TB/s) of the step), ``sol_ratio``
(that divided by tkx's time; 1 = at the limit) and ``sol_ratios`` (every candidate's),
``graph_of_kernels_us`` (the same fused groups as one kernel each in one CUDA graph),
``baselines`` (candidate -> median µs, ``None`` if it failed) and ``baseline_notes``,
``samples_us``, the kernel's ``registers``/``spill_bytes``/``local_bytes``/``shared_bytes``/
``occupancy``/``grid``/``block``/``mode``, the schedule's ``barriers`` and ``stages``,
``cold_compile_s``/``cached_compile_s`` (NVRTC), ``verified``, ``worst_output``/``worst_error``,
and ``device``/``torch``. A workload that cannot be built has ``{"error": ...}`` instead.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from .report import BASELINES, BenchmarkReport

SUITES = {
    "mlp": ("tiny_online", "online", "small", "medium"),
    # training steps written the way people write them (embedding, gather, chunk, cat, clipping, Adam)
    "everyday": ("char_lm", "q_learning", "glu_mlp", "poly_clip_adamw"),
    # transformer blocks and a small CNN
    "models": ("gpt_block", "llama_block", "cnn_digits"),
}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def workload_entry(report: BenchmarkReport) -> dict[str, Any]:
    """The flat JSON entry of one workload (see the module docstring)."""
    res, comp, sched, ver = report.resources, report.compile, report.schedule, report.verification or {}
    return {
        "us_per_step": report.megakernel_us,
        "best_baseline": report.best_baseline,
        "best_baseline_us": report.best_baseline_us,
        "ratio_to_best": report.ratio_to_best,
        "speed_of_light_us": report.speed_of_light_us,
        "sol_ratio": report.sol_ratios.get("tkx"),
        "graph_of_kernels_us": report.graph_of_kernels_us,
        "sol_ratios": report.sol_ratios,
        "baselines": {r.name: r.median_us for r in report.baselines},
        "baseline_notes": {r.name: r.note for r in report.baselines if not r.ok},
        "samples_us": {r.name: list(r.samples) for r in report.rows},
        "tkx_note": report.row("tkx").note if report.row("tkx") else None,
        "registers": res.get("registers"), "spill_bytes": res.get("spill_bytes"),
        "local_bytes": res.get("local_bytes"), "shared_bytes": res.get("shared_bytes"),
        "occupancy": res.get("occupancy"), "grid": res.get("grid"), "block": res.get("block"),
        "mode": res.get("mode"), "arena_bytes": res.get("arena_bytes"),
        "barriers": sched.get("barriers"), "stages": sched.get("stages"),
        "cold_compile_s": comp.get("nvrtc_cold_s", comp.get("extension_cold_s")),
        "cached_compile_s": comp.get("nvrtc_cached_s", comp.get("extension_call_s")),
        "build_s": comp.get("build_s"),
        "verified": ver.get("passed"), "worst_output": ver.get("worst"),
        "worst_error": ver.get("worst_error"),
        "device": report.meta.get("device"), "torch": report.meta.get("torch"),
        "repeats": report.meta.get("repeats"),
    }


def bench_suite(suite: str = "mlp", out_json: str | None = None, *, options: Any = None, repeats: int = 9,
                warmup: int = 3, baselines: Sequence[str] = BASELINES, workloads: Sequence[str] | None = None,
                log: Callable[[str], Any] | None = _stderr) -> dict[str, Any]:
    """Run a suite (``"mlp"``: :data:`SUITES`) and return ``{workload name: entry}``.

    ``out_json``: write the dict there (rewritten after every workload, so a run cut short
    keeps what finished). ``workloads`` restricts the suite; ``log`` gets progress lines
    (stderr by default; ``None`` for quiet). Raises :class:`tkx.runtime.NoDeviceError`
    without a GPU; one workload failing is recorded in its entry and the suite goes on.
    """
    from .. import examples
    from ..runtime.device import require_cuda
    from .compare import compare

    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
    require_cuda()
    say = log or (lambda _msg: None)
    names = list(workloads) if workloads else list(SUITES[suite])
    results: dict[str, Any] = {}
    for name in names:
        ex = examples.get(name)
        t0 = time.perf_counter()
        try:
            report = compare(ex.step_fn, ex.make_inputs(0), options, make_inputs=ex.make_inputs,
                             repeats=repeats, warmup=warmup, name=name, loss=ex.loss_output,
                             baselines=baselines, log=say)
            entry = workload_entry(report)
            say(str(report))
        except Exception as exc:
            entry = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
            say(f"[{name}] FAILED: {type(exc).__name__}: {exc}")
        entry["wall_s"] = time.perf_counter() - t0
        results[name] = entry
        if out_json:
            with open(out_json, "w") as f:
                json.dump(results, f, indent=2, default=str)
                f.write("\n")
    return results


def summary_lines(results: dict[str, Any]) -> list[str]:
    """A plain-text table of a suite's results (one line per workload)."""
    lines = [f"{'workload':<12} {'tkx µs':>9} {'best baseline':>24} {'ratio':>6} {'SOL tkx':>7} {'SOL best':>8} "
             f"{'regs':>5} {'grid':>5} {'barriers':>8} {'verified':>8}"]
    for name, e in results.items():
        if "error" in e:
            lines.append(f"{name:<12} ERROR {e['error'][:90]}")
            continue

        def num(x: Any, fmt: str) -> str:
            return format(x, fmt) if isinstance(x, (int, float)) else "-"

        best = f"{e.get('best_baseline') or '-'} {num(e.get('best_baseline_us'), '.1f')}"
        sols = e.get("sol_ratios") or {}
        lines.append(f"{name:<12} {num(e.get('us_per_step'), '9.1f')} {best:>24} "
                     f"{num(e.get('ratio_to_best'), '6.2f')} {num(e.get('sol_ratio'), '7.3f')} "
                     f"{num(sols.get(e.get('best_baseline') or ''), '8.3f')} {num(e.get('registers'), '5d')} "
                     f"{num(e.get('grid'), '5d')} {num(e.get('barriers'), '8d')} {str(e.get('verified')):>8}")
    return lines
