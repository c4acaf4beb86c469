#!/usr/bin/env python3
"""cluster-variants.py [--out FILE.json]

Ablations of the 2-CTA cluster GEMM (``tkx.target.GEMM_CLUSTER``) on medium's 256-row GEMMs, each a
one-GEMM step replayed from a CUDA graph (µs per call, median of 9), in one process: the unpaired
kernel; the same unpaired kernel launched in clusters of 2 (what the cluster launch alone costs);
paired with the stage handshake's cluster-scope semantics (``gemm.WGMMA_CLUSTER_SCOPE="cluster"``, as
measured in session 5) and with the default ``"cta"``; with ``"cta"`` and ``WGMMA_CLUSTER_SLACK`` 0 and 2
(k-tiles between a stage's release and its refill); with ``"cta"`` and no multicast (each CTA copies the
whole B tile: the pairing's synchronisation alone); and torch.mm. Needs a Hopper GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import torch

import tkx
import tkx.runtime
import tkx.target as T
from tkx.bench.timing import capture, time_steps
from tkx.codegen import gemm as G
from tkx.options import Options
from tkx.runtime.runner import CompiledRunner

SHAPES = {"g0": (256, 4096, 1024, False, False), "g1": (256, 1024, 4096, False, False),
          "g5": (256, 4096, 1024, False, True)}


def median_us(fn, dev) -> float:
    samples, _ = time_steps([fn], dev, repeats=9, warmup=3, target_us=2000.0, queue_ahead=True)
    return statistics.median(samples)


def run_shape(gid: str, m: int, n: int, k: int, a_t: bool, b_t: bool, dev: torch.device) -> dict:
    """Every variant of one GEMM shape: ``{label: {"us", "err", "grid", "cluster"}}``."""
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn((k, m) if a_t else (m, k), device=dev, generator=g).to(torch.bfloat16)
    b = torch.randn((n, k) if b_t else (k, n), device=dev, generator=g).to(torch.bfloat16)

    def step(x, y):
        return (x.t() if a_t else x) @ (y.t() if b_t else y)
    want = step(a.double(), b.double())
    row: dict = {}

    def measure(label, runner):
        out = runner(a, b)
        err = ((out.double() - want).abs().max() / want.abs().max()).item()
        gr = runner.capture_graph(a, b, warmup=3)
        t = median_us(gr.graph.replay, dev)
        row[label] = {"us": t, "err": err, "grid": runner.resources.grid, "cluster": runner.resources.cluster}
        print(f"{gid} {m}x{n}x{k} {label:<22} {t:7.2f} us  err {err:.1e}  grid {runner.resources.grid} "
              f"cluster {runner.resources.cluster}", flush=True)

    T.GEMM_CLUSTER = False
    off = tkx.runtime.build(step, (a, b), Options(), name=f"mm_{gid}")
    measure("off", off)
    src = off.source
    launch = dataclasses.replace(src.launch, config=dataclasses.replace(src.launch.config, cluster=2))
    measure("off, cluster launch", CompiledRunner(dataclasses.replace(src, launch=launch), step_fn=step))
    T.GEMM_CLUSTER = True
    saved = G.WGMMA_CLUSTER_SCOPE, G.WGMMA_CLUSTER_SLACK, G.WGMMA_CLUSTER_MULTICAST
    for label, scope, slack, mc in (("paired, scope cluster", "cluster", 1, True),
                                    ("paired, scope cta", "cta", 1, True),
                                    ("paired, cta, slack 0", "cta", 0, True),
                                    ("paired, cta, slack 2", "cta", 2, True),
                                    ("paired, cta, no mcast", "cta", 1, False)):
        G.WGMMA_CLUSTER_SCOPE, G.WGMMA_CLUSTER_SLACK, G.WGMMA_CLUSTER_MULTICAST = scope, slack, mc
        measure(label, tkx.runtime.build(step, (a, b), Options(), name=f"mm_{gid}_{scope}_{slack}_{int(mc)}"))
    G.WGMMA_CLUSTER_SCOPE, G.WGMMA_CLUSTER_SLACK, G.WGMMA_CLUSTER_MULTICAST = saved
    T.GEMM_CLUSTER = False
    graph, _ = capture(lambda: step(a, b), dev)
    row["torch.mm"] = {"us": median_us(graph.replay, dev)}
    print(f"{gid} {m}x{n}x{k} {'torch.mm':<22} {row['torch.mm']['us']:7.2f} us", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    result = {gid: run_shape(gid, *shape, dev) for gid, shape in SHAPES.items()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
