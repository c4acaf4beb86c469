#!/usr/bin/env python3
"""gemm-s4-probe.py [--out FILE.json] [--budget-s S] [--variants V,...] [--steps] [--step-variants V,...]
                 [--no-gemms] [--ablations run1|splitk] [--one VARIANT --launches N]

Compares wgmma pipeline variants on a GPU in one process (issue 12, session 4):

* per GEMM shape of ``small`` and ``medium`` (read from their schedules): tkx's GEMM alone (CUDA-graph
  replay, µs, as ``scripts/gemm-bench.py`` measures it) for each variant, beside ``torch.mm``
  (cuBLAS) in a CUDA graph;
* ``--ablations run1``: on medium's 256x4096x1024 GEMM, the same kernel with its MMAs removed (what the
  copy pipeline alone takes) and with its copies removed (MMAs, barriers and epilogue alone), and
  forced tile shapes; these kernels compute wrong values on purpose (timing only);
* ``--steps``: the whole ``small`` and ``medium`` steps per variant (verified, then timed).

A variant is ``L<n>-<copy>[+field=value...]``: ``gemm.WGMMA_MMA_IN_FLIGHT = n`` (wgmma groups left in
flight per k-tile) and ``Options(gemm_copy=copy, field=value)``; ``+tiles=old`` plans tiles as before
128x256 tiles existed (``L0-cp.async+tiles=old`` is the previous default); ``+epi=16``: 16 elements
per thread and pass in the wgmma tile epilogue (``gemm.WGMMA_EPILOGUE_BATCH``); ``+lastk=0``: split-K
with its final phase as a stage of its own (``target.SPLIT_K_LAST_SLICE = False``; ``1``: the last slice
of each tile adds the slices); ``+pf=1``: L2 prefetch of the epilogue's tile reads
(``gemm.WGMMA_EPILOGUE_PREFETCH``). Knobs not named keep the committed defaults. ``--one VARIANT`` builds
medium's 256x4096x1024 GEMM in that variant and launches it ``--launches`` times (nothing timed: for
``ncu``; several variants comma-separated), and writes its cubin next to ``--out``.
Work is done in order of value and stops (writing what it has) when ``--budget-s`` runs out.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import sys
import time

import torch

import tkx
import tkx.runtime
import tkx.runtime.runner as runner_mod
from tkx import target
from tkx.codegen import gemm as G
from tkx.examples import get
from tkx.options import Options

_spec = importlib.util.spec_from_file_location("gemm_bench", os.path.join(os.path.dirname(__file__), "gemm-bench.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

_compile = runner_mod.compile
_TRANSFORM = [None]


def _compile_with_transform(source, *a, **k):
    if _TRANSFORM[0] is not None:
        source = dataclasses.replace(source, text=_TRANSFORM[0](source.text))
    return _compile(source, *a, **k)


runner_mod.compile = _compile_with_transform


def no_mma(text: str) -> str:
    return re.sub(r"wgmma\.mma_async\.sync\.aligned\.[^;]*;", "", text)


def no_copy(text: str) -> str:
    text = text.replace("tkx_mbar_wait(bar0 + 8 * (kt %", "if (0) tkx_mbar_wait(bar0 + 8 * (kt %")
    text = text.replace("if (threadIdx.x == 0 && k0 +", "if (0 && k0 +")
    text = text.replace("if (k_beg + s * TK < k_end) issue(s", "if (0) issue(s")
    return re.sub(r"if \(k0 \+ (\d+) \* TK < k_end\) issue", "if (0) issue", text)


ABLATIONS = {"nomma": no_mma, "nocopy": no_copy}


class forced_tile:
    """Make the wgmma planner pick ``tm x tn`` (2 warpgroups) while active."""

    def __init__(self, tile):
        self.tile, self.orig = tile, target._Wgmma._best

    def __enter__(self):
        if self.tile is None:
            return self
        tm, tn = self.tile

        def best(em, p, options, threads):
            wgm = tm // 64
            return (0, tm, tn, wgm, (threads // 128) // wgm, p.batch * -(-p.m // tm) * -(-p.n // tn))
        target._Wgmma._best = best
        return self

    def __exit__(self, *exc):
        target._Wgmma._best = self.orig


def parse(variant: str) -> tuple[int, str, dict]:
    """``L1-tma+split_k=off`` -> (1, "tma", {"split_k": "off"})."""
    base, *extra = variant.split("+")
    lag, copy = base.split("-", 1)
    opts = {}
    for kv in extra:
        key, val = kv.split("=")
        opts[key] = int(val) if val.isdigit() else val
    return int(lag[1:]), copy, opts


_DIRECT = target._Wgmma._direct
_DEFAULTS = {"epi": G.WGMMA_EPILOGUE_BATCH, "lastk": int(target.SPLIT_K_LAST_SLICE),
             "pf": int(G.WGMMA_EPILOGUE_PREFETCH)}


def set_variant(variant: str) -> Options:
    """Set the variant's module knobs; its Options. ``+tiles=old``: the planner as before 128x256 tiles
    (every operand treated as staged through registers)."""
    lag, copy, opts = parse(variant)
    G.WGMMA_MMA_IN_FLIGHT = lag
    target._Wgmma._direct = (lambda em, p: False) if opts.pop("tiles", None) == "old" else _DIRECT
    G.WGMMA_EPILOGUE_BATCH = int(opts.pop("epi", _DEFAULTS["epi"]))
    target.SPLIT_K_LAST_SLICE = bool(int(opts.pop("lastk", _DEFAULTS["lastk"])))
    G.WGMMA_EPILOGUE_PREFETCH = bool(int(opts.pop("pf", _DEFAULTS["pf"])))
    return Options(gemm_copy=copy, **opts)


def gemm_shapes(dev) -> list[tuple[str, object]]:
    out, seen = [], set()
    for name in ("medium", "small"):
        ex = get(name)
        exp = tkx.explore(ex.step_fn, ex.make_inputs(0, "cpu"), options=Options(arch="sm_90a"), loss=ex.loss_output)
        for gr in exp.schedule.groups.values():
            if gr.kind != "gemm" or gr.plan.impl == "gemv":
                continue
            p = gr.plan
            key = (p.m, p.n, p.k, p.a_k_contiguous, p.b_n_contiguous, p.dtype)
            if key not in seen:
                seen.add(key)
                out.append((f"{name}:{gr.id}", p))
    return out


def one_gemm(plan, variant, dev, *, ablation=None, tile=None) -> dict:
    options = set_variant(variant)
    _TRANSFORM[0] = ABLATIONS.get(ablation)
    try:
        with forced_tile(tile):
            row = bench.bench_gemm(plan, options, dev)
    finally:
        _TRANSFORM[0] = None
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gemm-s4-probe.json")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--variants", default="L0-cp.async,L1-cp.async,L1-tma,L0-tma")
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--step-variants", default="L1-tma+split_k=off,L1-tma+split_k=8",
                    help="more variants for the whole steps only")
    ap.add_argument("--ablations", default=None, choices=("run1", "splitk"),
                    help="run1: no-MMA / no-copy kernels and tile shapes; splitk: bigger tiles with split-K")
    ap.add_argument("--no-gemms", action="store_true", help="only the whole steps (and ablations)")
    ap.add_argument("--one", default=None)
    ap.add_argument("--launches", type=int, default=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    t0 = time.time()
    shapes = gemm_shapes(dev) if args.one or args.ablations or not args.no_gemms else []
    if args.one:
        plan = shapes[0][1]
        for variant in args.one.split(","):
            options = set_variant(variant)
            a = torch.randn(plan.m, plan.k, device=dev).to(torch.bfloat16)
            b = torch.randn(plan.k, plan.n, device=dev).to(torch.bfloat16)
            r = tkx.runtime.build(bench.gemm_step(False, False), (a, b), options, name=f"mm_{variant}")
            with open(os.path.splitext(args.out)[0] + f"-{variant}.cubin", "wb") as f:
                f.write(r.kernel.binary.cubin)
            for _ in range(args.launches):
                r(a, b)
            torch.cuda.synchronize()
            print(variant, r.source.notes.get(next(iter(r.source.notes))), flush=True)
        return 0
    result: dict = {"gpu": torch.cuda.get_device_name(dev), "gemms": [], "ablations": [], "steps": [],
                    "skipped": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    def left() -> float:
        return args.budget_s - (time.time() - t0)

    variants = args.variants.split(",")
    medium = [(label, plan) for label, plan in shapes if label.startswith("medium")]
    small = [(label, plan) for label, plan in shapes if not label.startswith("medium")]
    main, more = variants[:3], variants[3:] + [v for v in args.step_variants.split(",") if v]
    if args.no_gemms:
        medium = small = []
    jobs = []
    # in order of value: medium's GEMMs, the steps, the ablations, small's GEMMs, the other variants
    jobs += [("gemm", label, plan, v, None, None) for label, plan in medium for v in main]
    if args.steps:
        jobs += [("step", name, None, v, None, None) for name in ("medium", "small") for v in main]
    sets = {  # (shape index, variant, ablation, forced tile)
        # run 1: what bounds medium's 256x4096x1024 GEMM (no MMAs / no copies), and tile shapes
        "run1": ((0, "L1-tma", "nomma", None), (0, "L1-tma", "nocopy", None),
                 (0, "L1-cp.async", "nomma", None), (0, "L1-cp.async", "nocopy", None),
                 (0, "L0-tma", "nocopy", None), (0, "L1-tma", None, (128, 128)),
                 (0, "L1-tma", None, (64, 256)), (2, "L1-tma", None, (128, 256)),
                 (2, "L1-cp.async", None, (128, 256)), (2, "L1-tma", None, (64, 256)),
                 (4, "L1-tma", None, (128, 256)), (3, "L1-tma", None, (64, 256))),
        # run 2: fewer operand bytes per SM through bigger tiles and split-K (128 items each)
        "splitk": ((0, "L1-tma+split_k=4", None, (128, 256)), (1, "L1-tma+split_k=16", None, (128, 256)),
                   (3, "L1-tma+split_k=4", None, (128, 256)), (0, "L1-tma+split_k=2", None, (128, 128))),
    }
    if args.ablations:
        for i, v, abl, tile in sets[args.ablations]:
            jobs.append(("ablation", shapes[i][0], shapes[i][1], v, abl, tile))
    jobs += [("gemm", label, plan, v, None, None) for label, plan in small for v in main]
    if args.steps:
        jobs += [("step", name, None, v, None, None) for name in ("medium", "small") for v in more]
    jobs += [("gemm", label, plan, v, None, None) for label, plan in medium for v in variants[3:]]
    for kind, label, plan, v, abl, tile in jobs:
        if left() < 8:
            result["skipped"].append([kind, label, v, abl, tile])
            continue
        try:
            if kind == "step":
                options = set_variant(v)
                ex = get(label)
                inputs = ex.make_inputs(0, dev)
                r = tkx.runtime.build(ex.step_fn, inputs, options, name=label, loss=ex.loss_output)
                ver = r.verify(seeds=(0,), make_inputs=ex.make_inputs)
                graph = r.capture_graph(*inputs, warmup=3)
                t = bench.median_us([graph.graph.replay], dev)
                torch.cuda.synchronize(dev)
                graph.check_status()
                words = graph._words.cpu()
                # split-K tile arrival counters (sync words 12 on, without sync="counters") after every replay
                tiles_zero = int(words[12:].abs().sum()) == 0 if r.source.sync_words > 12 else None
                sched = r.source.schedule
                row = {"example": label, "variant": v, "step_us": t, "verified": ver.passed,
                       "stages": len(sched.stages), "grid_barriers": sched.num_barriers,
                       "tile_counters_zero": tiles_zero,
                       "knobs": {"epi": G.WGMMA_EPILOGUE_BATCH, "lastk": target.SPLIT_K_LAST_SLICE,
                                 "pf": G.WGMMA_EPILOGUE_PREFETCH},
                       "resources": r.resources.summary(),
                       "gemm_notes": {k: n for k, n in r.source.notes.items() if n.get("tile")}}
                result["steps"].append(row)
                print(f"step {label:<7} {v:<22} {t:7.1f} us  verified {ver.passed}  stages {len(sched.stages)}  "
                      f"tile counters 0: {tiles_zero}  {r.resources.summary()}", flush=True)
            else:
                row = one_gemm(plan, v, dev, ablation=abl, tile=tile)
                row.update(label=label, variant=v, ablation=abl, forced_tile=tile)
                result["gemms" if kind == "gemm" else "ablations"].append(row)
                print(f"{kind:<8} {label:<10} {plan.m}x{plan.n}x{plan.k} {'T' if row['a_t'] else 'N'}"
                      f"{'T' if row['b_t'] else 'N'} {v:<12} {abl or '':<6} tile/split {row['built_tiles']} "
                      f"tkx {row['tkx_us']:7.2f} us  cuBLAS {row['torch_mm_us']:6.2f} us  "
                      f"err {row['max_rel_error']:.1e} regs {row['registers']}", flush=True)
        except Exception as e:  # keep going: one failure must not lose the run
            result.setdefault("errors", []).append([kind, label, v, abl, tile, f"{type(e).__name__}: {e}"[:400]])
            print("ERROR", kind, label, v, abl, tile, type(e).__name__, str(e)[:400], flush=True)
        save()
    save()
    print(f"done in {time.time() - t0:.0f} s; skipped {len(result['skipped'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
