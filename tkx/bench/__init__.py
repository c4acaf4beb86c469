"""Benchmarks: the megakernel against eager, CUDA-graphed eager and Inductor, in one run.

* :func:`compare` - one workload: correctness first, then CUDA events around CUDA-graph
  replays (two input sets alternated, at least 7 repeats, median and raw samples in µs per
  step) for every candidate; returns a :class:`BenchmarkReport` (``rows``, ``best_baseline``,
  ``ratio_to_best``, ``to_json()``, rich and HTML tables).
* :func:`bench_suite` - the MLP workloads of DESIGN.md's anchors into one JSON file;
  ``python -m tkx.bench mlp --out bench.json`` runs it from a shell.

Needs a CUDA GPU; importing this package does not.
"""

from __future__ import annotations

from .compare import compare
from .report import BASELINES, MEGAKERNEL, BenchmarkReport, Row
from .suite import SUITES, bench_suite, summary_lines, workload_entry

__all__ = ["BASELINES", "MEGAKERNEL", "SUITES", "BenchmarkReport", "Row", "bench_suite", "compare",
           "summary_lines", "workload_entry"]
