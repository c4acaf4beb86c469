"""Benchmarks: the megakernel against eager, CUDA-graphed eager and Inductor, in one run.

* :func:`compare` - one workload: correctness first, then CUDA events around CUDA-graph
  replays (two input sets alternated, at least 7 repeats, median and raw samples in µs per
  step) for every candidate; returns a :class:`BenchmarkReport` (``rows``, ``best_baseline``,
  ``ratio_to_best``, ``to_json()``, rich and HTML tables).
* :func:`graph_of_kernels` - what one kernel buys: the megakernel against the same fused groups
  launched as one kernel each in one CUDA graph (:class:`ManyKernelsTiming`);
* :func:`bench_suite` - the MLP workloads of DESIGN.md's anchors into one JSON file;
  ``python -m tkx.bench mlp --out bench.json`` runs it from a shell.

Needs a CUDA GPU; importing this package does not.
"""

from __future__ import annotations

from .compare import compare
from .many_kernels import ManyKernelsTiming, graph_of_kernels
from .report import BASELINES, GRAPH_OF_KERNELS, MEGAKERNEL, BenchmarkReport, Row
from .suite import SUITES, bench_suite, summary_lines, workload_entry

__all__ = ["BASELINES", "GRAPH_OF_KERNELS", "MEGAKERNEL", "SUITES", "BenchmarkReport", "ManyKernelsTiming", "Row",
           "bench_suite", "compare", "graph_of_kernels",
           "summary_lines", "workload_entry"]
