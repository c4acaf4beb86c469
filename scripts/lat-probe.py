#!/usr/bin/env python3
"""lat-probe.py [--out DIR] [--budget-s S] [--examples small,medium] [--quick]

The fixed latency of work items and grid barriers (issue 12, session 5), measured in one process:

* the grid barrier alone (``tkx.codegen.testing.barrier_kernel``, 4000 rounds over one block per SM,
  µs per barrier) for each :data:`tkx.codegen.cuda_prelude.GRID_BARRIER` kind;
* the whole ``small`` and ``medium`` steps (verified on seed 0, then the CUDA-graph replay's median of
  9 samples, µs) for each variant: the grid barrier kind (``bar=counter|generation|auto``), the tensor-map
  prefetch at kernel entry (``pf=1|0``, :data:`tkx.codegen.gemm.TMA_PREFETCH_AT_ENTRY`), the auto split
  rule's fewest steps per slice (``msteps=N``, :data:`tkx.target.SPLIT_K_MIN_STEPS`), split-K forced per
  GEMM shape (``g0=S``: the GEMM of the step's group ``g0`` split ``S`` ways, 1 = none), an ablation
  (``abl=nocopy|nomma``, timeline only) and Options fields (``opt.sync=counters``); knobs not named keep
  the committed defaults;
* the per-stage timeline (``Options(timeline=True)``, as ``scripts/gemm-profile.py`` prints it) of
  the committed-before setting, of the new defaults and of the fastest verified variant of each example.

A variant is ``bar=K,pf=P[,msteps=N][,gN=S...]``; ``--variants`` takes ``example:variant[:t];...``.
Work stops (writing what it has) when ``--budget-s`` runs out.
Writes ``lat-probe.json`` and prints one line per measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

import tkx
import tkx.runtime
from tkx import target
from tkx.bench.timing import time_steps
from tkx.codegen import cuda_prelude as P
from tkx.codegen import gemm as G
from tkx.examples import get
from tkx.options import Options

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("gemm_profile", os.path.join(_here, "gemm-profile.py"))
profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile)

# the ablations (no MMAs / no copies: wrong values on purpose, timeline only) and its compile hook
_spec4 = importlib.util.spec_from_file_location("gemm_s4_probe", os.path.join(_here, "gemm-s4-probe.py"))
s4 = importlib.util.module_from_spec(_spec4)
_spec4.loader.exec_module(s4)

_PLAN_SPLIT_K = target._plan_split_k
#: (m, n, k) -> split forced by the current variant (1: none)
FORCED: dict[tuple[int, int, int], int] = {}


def _plan_split_k(plan, options, e):
    want = FORCED.get((plan.m, plan.n, plan.k))
    if want is not None and e.name in target.SPLIT_K_EMITTERS:
        return _PLAN_SPLIT_K(plan, options.replace(split_k="off" if want <= 1 else int(want)), e)
    return _PLAN_SPLIT_K(plan, options, e)


target._plan_split_k = _plan_split_k


def gemm_shapes(name: str) -> dict[str, tuple[int, int, int]]:
    """Group id -> (m, n, k) of the example's tiled GEMMs under the default plan."""
    ex = get(name)
    FORCED.clear()
    exp = tkx.explore(ex.step_fn, ex.make_inputs(0, "cpu"), options=Options(arch="sm_90a"), loss=ex.loss_output)
    return {g.id: (g.plan.m, g.plan.n, g.plan.k) for g in exp.schedule.groups.values()
            if g.kind == "gemm" and g.plan.impl != "gemv"}


_DEFAULTS = {"bar": P.GRID_BARRIER, "pf": "1" if G.TMA_PREFETCH_AT_ENTRY else "0",
             "msteps": str(target.SPLIT_K_MIN_STEPS)}


def set_variant(variant: str, shapes: dict[str, tuple[int, int, int]]) -> Options:
    """Set the variant's module knobs and forced splits; its Options."""
    knobs = dict(kv.split("=") for kv in variant.split(",") if kv != "auto")
    P.GRID_BARRIER = knobs.pop("bar", _DEFAULTS["bar"])
    G.TMA_PREFETCH_AT_ENTRY = knobs.pop("pf", _DEFAULTS["pf"]) == "1"
    target.SPLIT_K_MIN_STEPS = int(knobs.pop("msteps", _DEFAULTS["msteps"]))
    s4._TRANSFORM[0] = s4.ABLATIONS[knobs.pop("abl")] if "abl" in knobs else None
    options = Options(**{k[4:]: v for k, v in knobs.items() if k.startswith("opt.")})
    knobs = {k: v for k, v in knobs.items() if not k.startswith("opt.")}
    FORCED.clear()
    for gid, split in knobs.items():
        if gid not in shapes:
            raise KeyError(f"{variant}: no tiled GEMM group {gid} (have {sorted(shapes)})")
        FORCED[shapes[gid]] = int(split)
    return options


def median_us(fn, dev) -> float:
    samples, _ = time_steps([fn], dev, repeats=9, warmup=3, target_us=2000.0, queue_ahead=True)
    return statistics.median(samples)


def barrier_alone(dev, grids=(132,)) -> dict:
    """µs per grid barrier over each grid size of ``grids`` (blocks of 256 threads), per kind (4000
    rounds, nothing checked; then 100 checked rounds)."""
    import ctypes

    from cuda.bindings import driver

    from tkx.codegen import nvrtc as nv
    from tkx.codegen import testing as T

    out = {}
    torch.zeros(1, device=dev)  # torch's primary context current for the driver calls
    major, minor = torch.cuda.get_device_capability(dev)
    for kind in P.GRID_BARRIERS:
        P.GRID_BARRIER = kind
        k = T.barrier_kernel("grid")
        rep = nv.compile_cuda(k.source, f"sm_{major}{minor}")
        err, mod = driver.cuModuleLoadData(rep.cubin)
        err, fn = driver.cuModuleGetFunction(mod, k.name.encode())
        for blocks in grids:
            slots = torch.full((2, blocks), -1, dtype=torch.int32, device=dev)
            errors = torch.zeros(1, dtype=torch.int32, device=dev)
            sync = torch.zeros(2, dtype=torch.int32, device=dev)
            status = torch.zeros(4, dtype=torch.int32, device=dev)
            stream = torch.cuda.current_stream(dev).cuda_stream

            def launch(rounds, check=0, fn=fn, slots=slots, errors=errors, sync=sync, status=status, stream=stream,
                       blocks=blocks):
                vp, i32 = ctypes.c_void_p, ctypes.c_int
                params = ((slots.data_ptr(), errors.data_ptr(), rounds, blocks, check, sync.data_ptr(),
                           status.data_ptr(), 1 << 30), (vp, vp, i32, i32, i32, vp, vp, ctypes.c_ulonglong))
                (e,) = driver.cuLaunchCooperativeKernel(fn, blocks, 1, 1, 256, 1, 1, 0, driver.CUstream(stream),
                                                        params)
                assert int(e) == 0, e

            times = {}
            for rounds in (0, 4000, 0, 4000, 0, 4000):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                launch(rounds)
                e.record()
                torch.cuda.synchronize(dev)
                times.setdefault(rounds, []).append(s.elapsed_time(e) * 1000)
            launch(100, check=1)
            torch.cuda.synchronize(dev)
            per = (min(times[4000]) - min(times[0])) / 4000
            out[f"{kind}/{blocks}"] = {"kind": kind, "blocks": blocks, "us_per_barrier": per,
                                       "status": status.tolist(), "errors": int(errors.item()),
                                       "sync_words": sync.tolist()}
            print(f"barrier {kind:<10} {per:.3f} us per barrier over {blocks} blocks; status {status.tolist()} "
                  f"errors {int(errors.item())} sync {sync.tolist()}", flush=True)
    return out


def step(name: str, variant: str, shapes, dev, *, timeline: bool = False) -> dict:
    options = set_variant(variant, shapes)
    ablation = "abl=" in variant
    ex = get(name)
    inputs = ex.make_inputs(0, dev)
    r = tkx.runtime.build(ex.step_fn, inputs, options, name=name, loss=ex.loss_output)
    ver = (type("NotVerified", (), {"passed": None})() if ablation
           else r.verify(seeds=(0,), make_inputs=ex.make_inputs))
    graph = r.capture_graph(*inputs, warmup=3)
    t = median_us(graph.graph.replay, dev)
    torch.cuda.synchronize(dev)
    graph.check_status()
    sched = r.source.schedule
    words = graph._words.cpu()
    row = {"example": name, "variant": variant, "step_us": t, "verified": ver.passed,
           "stages": len(sched.stages), "grid_barriers": sched.num_barriers,
           "sync_words_after": words[:2].tolist(),
           "splits": {g.id: [g.plan.tile_m, g.plan.tile_n, g.plan.split_k] for g in sched.groups.values()
                      if g.kind == "gemm" and g.plan.impl != "gemv"},
           "resources": r.resources.summary()}
    print(f"step {name:<7} {variant:<34} {t:7.2f} us verified {ver.passed} stages {len(sched.stages)} "
          f"splits {row['splits']} ({r.resources.registers} regs, {r.resources.spill_bytes} B spill)", flush=True)
    if timeline:
        timed = tkx.runtime.build(ex.step_fn, inputs, options.replace(timeline=True), name=name,
                                  loss=ex.loss_output)
        for _ in range(5):
            timed(*inputs)
        torch.cuda.synchronize(dev)
        tl = timed.timeline()
        rows = profile.stage_summary(timed, tl)
        row["makespan_us"] = tl.makespan / 1e3
        row["timeline"] = rows
        print(f"  timeline {name} {variant}: makespan {tl.makespan / 1e3:.2f} us", flush=True)
        for s in rows:
            print(f"    stage {s['stage']}: gap {s['gap_before_ns'] / 1e3:6.2f} us, wall {s['wall_ns'] / 1e3:6.2f} us, "
                  f"block busy max {s['max_block_busy_ns'] / 1e3:6.2f}", flush=True)
            for g in s["groups"]:
                print(f"        {g['group']:<5} {g['kind']:<17} {g['items']:>4} items, tile {g['tile']} split "
                      f"{g['split_k']}, item median {g['item_median_ns'] / 1e3:6.2f} max "
                      f"{g['item_max_ns'] / 1e3:6.2f} us", flush=True)
    return row


BEFORE = "bar=generation,pf=0"
NEW = "bar=counter,pf=1"
#: (example, variant, timeline) in order of value
JOBS = [
    ("small", BEFORE, True), ("small", NEW, True), ("small", "bar=counter,pf=0", False),
    ("small", "bar=generation,pf=1", False),
    ("medium", BEFORE, True), ("medium", NEW, True), ("medium", "bar=counter,pf=0", False),
    ("medium", "bar=generation,pf=1", False),
    *(("small", NEW + extra, False) for extra in (
        ",g0=1", ",g0=4", ",g0=8", ",g1=1", ",g1=2", ",g1=8", ",g1=16",
        ",g0=1,g1=1", ",g0=1,g1=8", ",g0=4,g1=8", ",g0=8,g1=16")),
    ("small", NEW + ",abl=nocopy", True), ("small", NEW + ",abl=nomma", True),
    ("medium", NEW + ",g1=2", False), ("medium", NEW + ",g1=8", False),
    ("small", NEW + ",opt.sync=counters", False),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--examples", default="small,medium")
    ap.add_argument("--variants", default=None,
                    help="example:variant[:t];... instead of the built-in list (:t adds the timeline)")
    ap.add_argument("--barrier-blocks", default="132",
                    help="grid sizes (blocks) of the barrier-alone measurement, comma-separated")
    ap.add_argument("--no-timelines", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    result: dict = {"gpu": torch.cuda.get_device_name(dev), "steps": [], "errors": [], "skipped": []}
    path = os.path.join(args.out, "lat-probe.json")

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    try:
        result["barrier_alone"] = barrier_alone(dev, [int(b) for b in args.barrier_blocks.split(",")])
    except Exception as e:  # keep going
        result["errors"].append(["barrier_alone", f"{type(e).__name__}: {e}"[:400]])
        print("ERROR barrier_alone", type(e).__name__, str(e)[:300], flush=True)
    save()
    names = args.examples.split(",")
    jobs = [j for j in JOBS if j[0] in names]
    if args.variants:
        jobs = [(item.split(":")[0], item.split(":")[1], item.endswith(":t")) for item in args.variants.split(";")]
    class Shapes(dict):  # an example's GEMM shapes, found when a variant forces a split
        def __missing__(self, name):
            self[name] = gemm_shapes(name)
            result.setdefault("shapes", {})[name] = {k: list(v) for k, v in self[name].items()}
            return self[name]
    shapes = Shapes()
    for name, v, timeline in jobs:
        if time.time() - t0 > args.budget_s:
            result["skipped"].append([name, v])
            continue
        try:
            forces = any(kv.split("=")[0][1:].isdigit() for kv in v.split(",") if kv.startswith("g"))
            result["steps"].append(step(name, v, shapes[name] if forces else {}, dev,
                                        timeline=timeline and not args.no_timelines))
        except Exception as e:
            result["errors"].append([name, v, f"{type(e).__name__}: {e}"[:400]])
            print("ERROR", name, v, type(e).__name__, str(e)[:300], flush=True)
        save()
    for name in ([] if args.variants else dict.fromkeys(j[0] for j in jobs)):
        ok = [r for r in result["steps"] if r["example"] == name and r["verified"]]
        if not ok:
            continue
        best = min(ok, key=lambda r: r["step_us"])
        result.setdefault("best", {})[name] = [best["variant"], best["step_us"]]
        print(f"best {name}: {best['variant']} {best['step_us']:.2f} us", flush=True)
        if "timeline" not in best and not args.no_timelines and time.time() - t0 < args.budget_s + 10:
            try:
                result["steps"].append(step(name, best["variant"], shapes[name], dev, timeline=True))
            except Exception as e:
                result["errors"].append([name, best["variant"], f"{type(e).__name__}: {e}"[:400]])
        save()
    set_variant(NEW, {})
    s4._TRANSFORM[0] = None
    save()
    print(f"done in {time.time() - t0:.0f} s; skipped {len(result['skipped'])}; errors {len(result['errors'])}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
