#!/usr/bin/env python
"""Benchmark the decode step (tkx.examples.decode) on a CUDA GPU: one run, every figure a ratio.

    PYTHONPATH=$PWD python scripts/decode-bench.py --out OUT [--quants bf16,int8,int4] [--tokens 20]
    PYTHONPATH=$PWD python scripts/decode-bench.py --prepare bf16 [--sync barrier]   # warm the caches only

For each weight format (bf16, int8, int4 weight-only with group-wise scales):

1. verify: ``--tokens`` greedy tokens from the tkx kernel (``runner(*args)``, the caches updated in
   place and fed back) must equal eager's, token for token;
2. time one decode step (µs per step, CUDA events around CUDA-graph replays; medians of 9 samples) for
   eager, eager in a CUDA graph, ``torch.compile`` (default, and ``max-autotune-no-cudagraphs`` then
   graphed) and tkx (each ``--syncs`` option, one kernel in a CUDA graph);
3. the HBM speed of light: (weight bytes + K/V cache bytes read per step) / 4.8 TB/s.

``tokens/s`` counts every sequence of the batch (batch x 10^6 / µs per step). ``--prepare`` compiles
the tkx kernel (NVRTC's disk cache) and both torch.compile modes (Inductor's caches) and exits: run
several of those in parallel first so the timing run finds everything compiled.
Writes ``OUT/decode-bench.json`` and ``OUT/decode-bench.md``; prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tkx  # noqa: E402
from tkx.bench.timing import capture, time_steps  # noqa: E402
from tkx.examples import decode as D  # noqa: E402
from tkx.target import GPU  # noqa: E402

DEV = torch.device("cuda")


def example(quant: str, config: str) -> D.DecodeExample:
    return D.get(config if quant == "bf16" else f"{config}_{quant}")


def build(ex: D.DecodeExample, sync: str):
    timeline = sync.endswith("+timeline")
    sync = sync.removesuffix("+timeline")
    opts = tkx.Options(sync=sync, timeline=timeline) if sync != "barrier" or timeline else tkx.Options()
    t0 = time.perf_counter()
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, device=DEV), opts, name=ex.name)
    return runner, time.perf_counter() - t0


def compiled(ex: D.DecodeExample, mode: str | None):
    torch._dynamo.reset()
    return torch.compile(ex.step_fn, mode=mode) if mode else torch.compile(ex.step_fn)


def greedy(fn, ex: D.DecodeExample, n: int) -> torch.Tensor:
    return D.generate(fn, ex.make_inputs(0, device=DEV), n).cpu()


def prepare(quant: str, config: str, syncs: list[str], what: str) -> None:
    ex = example(quant, config)
    if what in ("all", "tkx"):
        for sync in syncs:
            _, s = build(ex, sync)
            print(f"[{ex.name}] tkx sync={sync} built in {s:.1f} s", flush=True)
    if what == "tkx":
        return
    args = ex.make_inputs(0, device=DEV)
    for mode in (None, "max-autotune-no-cudagraphs"):
        t0 = time.perf_counter()
        fn = compiled(ex, mode)
        fn(*args)
        torch.cuda.synchronize()
        print(f"[{ex.name}] torch.compile {mode or 'default'} in {time.perf_counter() - t0:.1f} s", flush=True)


def save_timeline(ex: D.DecodeExample, out: Path) -> None:
    """One step of ``ex`` with ``Options(sync="counters", timeline=True)``: every task's block, group, item,
    start/end/wait (ns from the first start) -> ``OUT/decode-timeline.json``."""
    runner, _ = build(ex, "counters+timeline")
    args = ex.make_inputs(0, device=DEV, start=ex.config.cache // 2)
    for _ in range(3):  # warm: the recorded launch is the last one
        runner(*args)
    tl = runner.timeline()
    spans = [dict(block=s.block, task=s.task, group=s.group, item=s.item, start=s.start, end=s.end, wait=s.wait)
             for s in tl.spans]
    groups = {gid: {"kind": g.kind, "anchor": g.anchor, "impl": str(dict(g.plan).get("impl", ""))}
              for gid, g in runner.schedule.groups.items()}
    (out / "decode-timeline.json").write_text(json.dumps({"name": tl.name, "unit": tl.unit, "makespan": tl.makespan,
                                                          "spans": spans, "groups": groups}))
    print(f"[{ex.name}] timeline: {len(spans)} tasks, makespan {tl.makespan:.0f} {tl.unit}", flush=True)


def timed(make, ex: D.DecodeExample, graphed: bool | str) -> float:
    args = ex.make_inputs(0, device=DEV, start=ex.config.cache // 2)
    fn = make()
    if graphed == "tkx":  # the runner's own graph: its outputs, arena and status words captured once
        g = fn.capture_graph(*args)
        samples, _ = time_steps([g.graph.replay], DEV, repeats=9, warmup=3, queue_ahead=True)
        g.check_status()
    elif graphed:
        graph, out = capture(lambda: fn(*args), DEV, warmup=3)
        samples, _ = time_steps([graph.replay], DEV, repeats=9, warmup=3, queue_ahead=True)
        del out
    else:
        samples, _ = time_steps([lambda: fn(*args)], DEV, repeats=9, warmup=3, queue_ahead=False)
    return sorted(samples)[len(samples) // 2]


BASELINES = ("eager", "eager+cudagraph", "torch.compile", "torch.compile max-autotune")


def run(quants: list[str], config: str, syncs: dict[str, list[str]], tokens: int, out: Path,
        wanted_baselines: tuple[str, ...] = BASELINES) -> dict:
    results: dict = {"gpu": torch.cuda.get_device_name(DEV), "torch": torch.__version__, "config": config,
                     "tokens_verified": tokens, "peak_bytes_per_s": GPU.peak_bytes_per_s, "variants": {}}
    for quant in quants:
        ex = example(quant, config)
        cfg = ex.config
        rec: dict = {"batch": cfg.batch, "weight_bytes": D.weight_bytes(cfg, quant), "cache_bytes": D.cache_bytes(cfg)}
        rec["speed_of_light_us"] = (rec["weight_bytes"] + rec["cache_bytes"]) / GPU.peak_bytes_per_s * 1e6
        want = greedy(ex.step_fn, ex, tokens)
        rec["eager_tokens"] = want.T.tolist()
        times: dict[str, float | str] = {}
        for sync in syncs[quant]:
            key = "tkx" if sync == "barrier" else f"tkx ({sync})"
            try:
                runner, build_s = build(ex, sync)
                got = greedy(runner, ex, tokens)
                rec[f"{key} same tokens"] = bool(torch.equal(got, want))
                rec[f"{key} tokens"] = got.T.tolist()
                forced = D.compare_greedy(runner, ex, tokens, device=DEV)
                rec[f"{key} teacher-forced"] = {"ok": forced.ok, "summary": str(forced),
                                                "differences": [list(d) for d in forced.differences]}
                print(f"[{ex.name}] {key}: teacher-forced: {forced}", flush=True)
                rec[f"{key} build_s"] = build_s
                rec[f"{key} resources"] = runner.resources.summary()
                print(f"[{ex.name}] {key}: {tokens} tokens equal to eager: {rec[f'{key} same tokens']}", flush=True)
                times[key] = timed(lambda r=runner: r, ex, graphed="tkx")
            except Exception as exc:  # a failure is a result
                times[key] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(f"[{ex.name}] {key}: {times[key]}", flush=True)
        baselines = [("eager", lambda ex=ex: ex.step_fn, False), ("eager+cudagraph", lambda ex=ex: ex.step_fn, True),
                     ("torch.compile", lambda ex=ex: compiled(ex, None), True),
                     ("torch.compile max-autotune", lambda ex=ex: compiled(ex, "max-autotune-no-cudagraphs"), True)]
        for name, make, graphed in baselines:
            if name not in wanted_baselines:
                continue
            try:
                times[name] = timed(make, ex, graphed)
            except Exception as exc:
                times[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(f"[{ex.name}] {name}: {times[name]}", flush=True)
        rec["us_per_step"] = times
        rec["tokens_per_s"] = {k: cfg.batch * 1e6 / v for k, v in times.items() if isinstance(v, float)}
        rec["fraction_of_speed_of_light"] = {k: rec["speed_of_light_us"] / v for k, v in times.items()
                                             if isinstance(v, float)}
        results["variants"][quant] = rec
        (out / "decode-bench.json").write_text(json.dumps(results, indent=1))
    return results


def table(results: dict) -> str:
    lines = [f"Decode step `{results['config']}` on {results['gpu']} (torch {results['torch']}); µs per step "
             "(median of 9 CUDA-event samples of CUDA-graph replays; plain eager without a graph), tokens/s over the "
             "batch, and the HBM speed of light (weight + K/V cache bytes / 4.8 TB/s).", "",
             "| weights | candidate | µs/step | tokens/s | speed of light µs | fraction of SoL |",
             "|---|---|---|---|---|---|"]
    for quant, rec in results["variants"].items():
        for name, us in rec["us_per_step"].items():
            if isinstance(us, float):
                lines.append(f"| {quant} | {name} | {us:.1f} | {rec['tokens_per_s'][name]:.0f} | "
                             f"{rec['speed_of_light_us']:.1f} | {rec['fraction_of_speed_of_light'][name]:.2f} |")
            else:
                lines.append(f"| {quant} | {name} | {us} | | {rec['speed_of_light_us']:.1f} | |")
    lines.append("")
    for quant, rec in results["variants"].items():
        same = {k[:-len(" same tokens")]: v for k, v in rec.items() if k.endswith(" same tokens")}
        lines.append(f"- {quant}: {results['tokens_verified']} greedy tokens equal to eager: {same}")
        for k, v in rec.items():
            if k.endswith(" teacher-forced"):
                lines.append(f"  - {k}: {v['summary']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("decode-bench-out"))
    ap.add_argument("--quants", default="bf16,int8,int4")
    ap.add_argument("--config", default="decode", choices=sorted(D.CONFIGS))
    ap.add_argument("--syncs", default="barrier,counters", help="tkx Options.sync values to time")
    ap.add_argument("--sync-quants", default="bf16",
                    help="formats timed with every --syncs value (the others with the first one only)")
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--baselines", default=",".join(BASELINES), help="baselines to time (comma list)")
    ap.add_argument("--timeline", action="store_true", help="also record one bf16 step's task timeline (counters)")
    ap.add_argument("--prepare", metavar="QUANT", help="only compile QUANT's kernels and torch.compile caches")
    ap.add_argument("--what", default="all", choices=("all", "tkx", "torch"), help="what --prepare compiles")
    a = ap.parse_args(argv)
    syncs = a.syncs.split(",")
    if a.prepare:
        prepare(a.prepare, a.config, syncs, a.what)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    every = a.sync_quants.split(",")
    results = run(a.quants.split(","), a.config, {q: syncs if q in every else syncs[:1] for q in a.quants.split(",")},
                  a.tokens, a.out, tuple(a.baselines.split(",")))
    if a.timeline:
        try:
            save_timeline(example("bf16", a.config), a.out)
        except Exception as exc:
            print(f"timeline failed: {type(exc).__name__}: {exc}", flush=True)
    text = table(results)
    (a.out / "decode-bench.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
