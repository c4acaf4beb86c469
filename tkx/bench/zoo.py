"""The zoo benchmark's machinery, shared by ``scripts/zoo-bench`` and ``scripts/sync-bench``.

Phase 1 (:func:`warm`, parallel worker processes): every torch.compile configuration of every example is
compiled once, filling Inductor's on-disk caches (FX graph cache, autotuning results), and every tkx variant
is built once (NVRTC's cubin cache); :func:`setup_env` points both at one folder. Phase 2
(:func:`bench_example`, serial): each candidate is rebuilt from the warm caches and timed with a
:class:`Timer`: CUDA events around CUDA-graph replays (:func:`tkx.bench.timing.time_steps`; µs per step,
median of the repeats, two input sets alternated); the tkx variants are verified against eager first, and
the graph of kernels (:class:`tkx.runtime.GraphOfKernels`) is checked against its megakernel's outputs.
On the CPU (``dry=True``) every tkx variant is lowered and run by the schedule interpreter and plain calls
are timed with ``perf_counter``: that checks the scripts, not the figures.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

#: The tkx variants (name -> :class:`tkx.Options` keywords) of the sync benchmark.
VARIANTS = {
    "barrier-grid": dict(sync="barrier", mode="grid"),
    "barrier-block": dict(sync="barrier", mode="block"),
    "counters-grid": dict(sync="counters", mode="grid"),
    "auto": dict(sync="auto", mode="auto"),
}
#: torch.compile configurations (name -> ``mode``), each captured in a CUDA graph.
COMPILE_MODES = {"inductor": None, "inductor-max-autotune": "max-autotune-no-cudagraphs"}


def setup_env(cache: Path) -> None:
    """Inductor and tkx caches on disk, shared by the workers and the timing process."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    os.environ.setdefault("TKX_CACHE_DIR", str(cache / "tkx"))


def _device(dry: bool) -> str:
    return "cpu" if dry else "cuda"


def _inputs(ex, seed: int, dry: bool):
    return ex.make_inputs(seed, _device(dry))


# -- phase 1: warm the caches (one job per worker process) --------------------------------------------
def warm_job(kind: str, name: str, what: str, options: dict | None, cache: str, dry: bool) -> dict:
    """Compile one torch.compile configuration (kind "compile", ``what`` a key of :data:`COMPILE_MODES`),
    build one tkx variant (kind "tkx", ``what`` its name, ``options`` its Options keywords), or build it and
    compile its graph of kernels (kind "graph": one kernel per fused group, the NVRTC cubin cached). A tkx
    build's result also carries :func:`_build_info`'s ``"hash"`` and ``"predicted_us"``."""
    setup_env(Path(cache))
    import torch

    import tkx
    from tkx import examples

    t0 = time.perf_counter()
    ex = examples.get(name)
    info: dict = {}
    try:
        args = _inputs(ex, 0, dry)
        if kind == "compile":
            mode = COMPILE_MODES[what]
            fn = torch.compile(ex.step_fn, mode=mode) if mode else torch.compile(ex.step_fn)
            for _ in range(2):
                fn(*args)
            if not dry:
                torch.cuda.synchronize()
        else:
            opts = tkx.Options(**(options or {}))
            if dry:
                src = tkx.runtime.lower(ex.step_fn, args, opts, name=name)
            else:
                src = tkx.runtime.build(ex.step_fn, args, opts, name=name).source
            info = _build_info(src)
            if kind == "graph":
                from tkx.codegen.kernels_graph import generate_graph
                from tkx.runtime.device import kernel_arch

                many = generate_graph(src)
                if not dry:
                    tkx.runtime.compile_cubin(many, kernel_arch(torch.device("cuda")))
        return {"kind": kind, "name": name, "what": what, "s": time.perf_counter() - t0, "ok": True, **info}
    except Exception as exc:
        return {"kind": kind, "name": name, "what": what, "s": time.perf_counter() - t0, "ok": False,
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}


def _build_info(src) -> dict:
    """What the main process needs of one tkx build: the SHA-256 of its CUDA text (two variants that generate
    the same kernel are timed once) and the cost model's step µs (its predicted timeline plus ``launch_us``)."""
    import hashlib

    from tkx import costs
    from tkx.dataflow.timeline import predicted_timeline

    try:
        predicted = predicted_timeline(src).makespan / 1e3 + costs.constants()["launch_us"]
    except Exception:  # a kernel the timed VM cannot place (no DAG): no prediction, never a failed build
        predicted = None
    return {"hash": hashlib.sha256(src.text.encode()).hexdigest(), "predicted_us": predicted}


def forced_to_time(warmed: list[dict], names: list[str], variants: dict, base: str,
                   close: float | None = None) -> dict[str, dict[str, str]]:
    """{example: {variant: why it is not timed}} from the warm-up's builds (:func:`warm_job`): a variant whose
    kernel is byte-identical to ``base``'s is measured by ``base``'s time; with ``close``, a variant the cost
    model predicts more than ``close`` times ``base``'s step is left out (auto does not consider it close). A
    variant that failed to build is kept (its error is then recorded)."""
    built = {(r["name"], r["what"]): r for r in warmed if r.get("kind") in ("tkx", "graph") and r.get("ok")}
    out: dict[str, dict[str, str]] = {}
    for n in names:
        ref = built.get((n, base))
        skip: dict[str, str] = {}
        for v in variants:
            r = built.get((n, v))
            if v == base or ref is None or r is None:
                continue
            if r.get("hash") == ref.get("hash"):
                skip[v] = f"same kernel as tkx:{base}"
            elif close and r.get("predicted_us") and ref.get("predicted_us") \
                    and r["predicted_us"] > close * ref["predicted_us"]:
                skip[v] = (f"predicted {r['predicted_us']:.1f} µs, over {close:g}x tkx:{base}'s "
                           f"{ref['predicted_us']:.1f} µs (--close)")
        out[n] = skip
    return out


def step_timeline(name: str, options: dict, dry: bool, steps: int = 5):
    """(the per-task timeline of one step of example ``name`` built with ``options`` plus ``timeline=True``,
    whether it was measured): on the GPU the kernel's ``%globaltimer`` record of the last of ``steps``
    launches (:meth:`tkx.runtime.CompiledRunner.timeline`); on the CPU (``dry``) the cost model's prediction
    (:func:`tkx.dataflow.timeline.predicted_timeline`)."""
    import tkx
    from tkx import examples
    from tkx.dataflow.timeline import predicted_timeline

    ex = examples.get(name)
    args = _inputs(ex, 0, dry)
    if dry:
        exp = tkx.explore(ex.step_fn, args, name=name, **options)
        return predicted_timeline(exp.cuda), False
    runner = tkx.runtime.build(ex.step_fn, args, tkx.Options(**options, timeline=True), name=name)
    for _ in range(steps):
        runner(*_inputs(ex, 0, dry))
    return runner.timeline(), True


def warm(names: list[str], compiles: list[str], variants: dict, cache: Path, workers: int, dry: bool,
         graph_of_kernels: str | None = None) -> list[dict]:
    """Phase 1: every torch.compile configuration and every tkx variant of every example once (variant
    ``graph_of_kernels`` also as its graph of kernels), in ``workers`` spawned processes (filling the caches
    under ``cache``); one result dict per job, progress on stderr."""
    import multiprocessing as mp

    jobs = [("compile", n, c, None) for c in compiles[::-1] for n in names]  # max-autotune first: longest
    jobs += [("graph" if v == graph_of_kernels else "tkx", n, v, variants[v]) for n in names for v in variants]
    done: list[dict] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futs = [pool.submit(warm_job, k, n, w, o, str(cache), dry) for k, n, w, o in jobs]
        for f in as_completed(futs):
            r = f.result()
            done.append(r)
            print(f"[warm {time.perf_counter() - t0:6.1f} s] {r['kind']:7s} {r['name']:22s} {r['what']:22s} "
                  f"{r['s']:6.1f} s {'ok' if r['ok'] else r['error']}", file=sys.stderr, flush=True)
    return done


# -- phase 2: time serially -----------------------------------------------------------------------------
class Timer:
    """µs per step of a list of callables (one per input set): CUDA events around CUDA-graph replays on
    the GPU (tkx.bench.timing), perf_counter around plain calls on the CPU (--dry-run)."""

    def __init__(self, dry: bool, repeats: int, target_us: float = 1000.0) -> None:
        self.dry, self.repeats, self.target_us = dry, repeats, target_us

    def __call__(self, fns, graphed: bool) -> tuple[float, list[float]]:
        if self.dry:
            for f in fns:
                f()
            samples = []
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                for f in fns:
                    f()
                samples.append((time.perf_counter() - t0) * 1e6 / len(fns))
            return statistics.median(samples), samples
        import torch

        from tkx.bench.timing import time_steps
        samples, _ = time_steps(fns, torch.device("cuda"), repeats=self.repeats, target_us=self.target_us,
                                queue_ahead=graphed)
        return statistics.median(samples), samples


def graphs(fn, sets, dry: bool):
    """(one replay per input set, what keeps the graphs alive): ``fn`` captured per set (plain calls on the CPU)."""
    if dry:
        return [lambda a=a: fn(*a) for a in sets], None
    import torch

    from tkx.bench.timing import capture
    keep, fns = [], []
    for a in sets:
        g, o = capture(lambda a=a: fn(*a), torch.device("cuda"))
        keep.append((g, o))
        fns.append(g.replay)
    return fns, keep


def restore(sets, saved) -> None:
    """Copy the snapshot ``saved`` back into every tensor of the input sets."""
    from torch.utils._pytree import tree_flatten
    for s, v in zip(sets, saved):
        for t, c in zip(tree_flatten(s)[0], v):
            if hasattr(t, "copy_"):
                t.copy_(c)


def step_speed_of_light_us(program) -> float:
    """max(FLOPs / peak, bytes / peak bandwidth) of one step (tkx.target.speed_of_light_us), µs."""
    from tkx.target import program_work, speed_of_light_us
    return speed_of_light_us(*program_work(program))


def bench_example(name: str, compiles: list[str], variants: dict, timer: Timer, dry: bool,
                  graph_of_kernels: str | None = None) -> dict:
    """Every candidate of one example: ``{"candidates": {name: {"us", "samples_us", ...}}, "sol_us": µs}``:
    eager, eager+cudagraph (GPU), the torch.compile modes ``compiles``, every tkx variant of ``variants``
    (name -> Options keywords) as ``tkx:<name>``, verified against eager first.
    ``graph_of_kernels``: the variant whose groups are also timed as one kernel each ("tkx:graph-of-kernels",
    its outputs compared with that variant's megakernel first; None: not timed)."""
    import torch
    from torch.utils._pytree import tree_flatten

    import tkx
    from tkx import examples
    from tkx.runtime.verify import clone_exact

    ex = examples.get(name)
    sets = [_inputs(ex, s, dry) for s in (0, 1)]
    saved = [[clone_exact(t) if isinstance(t, torch.Tensor) else t for t in tree_flatten(s)[0]] for s in sets]
    entry: dict = {"candidates": {}}
    built: dict = {}  # variant -> its runner (GPU) or exploration (dry run)

    def record(cand: str, make) -> None:
        t0 = time.perf_counter()
        try:
            fns, keep, graphed, info = make()
            med, samples = timer(fns, graphed)
            entry["candidates"][cand] = {"us": med, "samples_us": samples, "setup_s": time.perf_counter() - t0,
                                         **info}
            print(f"[{name}] {cand:24s} {med:9.1f} µs/step", file=sys.stderr, flush=True)
            del keep
        except Exception as exc:
            entry["candidates"][cand] = {"us": None, "error": f"{type(exc).__name__}: {exc}"[:400],
                                         "traceback": traceback.format_exc(limit=4)}
            print(f"[{name}] {cand:24s} FAILED {type(exc).__name__}: {exc}"[:300], file=sys.stderr, flush=True)
        finally:
            if not dry:
                torch.cuda.synchronize()
            restore(sets, saved)

    record("eager", lambda: ([lambda a=a: ex.step_fn(*a) for a in sets], None, False, {}))
    if not dry:
        record("eager+cudagraph", lambda: (*graphs(ex.step_fn, sets, dry), True, {}))
    for cand in compiles:
        def make(cand=cand):
            torch._dynamo.reset()
            mode = COMPILE_MODES[cand]
            fn = torch.compile(ex.step_fn, mode=mode) if mode else torch.compile(ex.step_fn)
            fns, keep = graphs(fn, sets, dry)
            return fns, (fn, keep), not dry, {}
        record(cand, make)
    for var, kw in variants.items():
        def make(kw=kw, var=var):
            options = tkx.Options(**kw)
            if dry:
                from tkx.schedule.interpreter import run as run_schedule
                exp = tkx.explore(ex.step_fn, sets[0], **kw)
                src = exp.cuda
                fns = [lambda a=a: run_schedule(exp.schedule, exp.arena, a) for a in sets]
                built[var] = exp
                entry.setdefault("sol_us", step_speed_of_light_us(exp.program))
                info = {"sync": src.sync, "mode": exp.schedule.mode, "stages": len(exp.schedule.stages),
                        "barriers": exp.schedule.num_barriers, "verified": None}
                return fns, None, False, info
            runner = tkx.runtime.build(ex.step_fn, sets[0], options, name=name)
            built[var] = runner
            entry.setdefault("sol_us", step_speed_of_light_us(runner.program))
            ver = runner.verify(seeds=(0,), make_inputs=ex.make_inputs)
            restore(sets, saved)
            graphs = [runner.capture_graph(*a) for a in sets]
            s = runner.schedule
            info = {"sync": runner.source.sync, "sync_reason": runner.source.sync_reason, "mode": s.mode,
                    "stages": len(s.stages), "barriers": s.num_barriers,
                    "blocks": runner.resources.as_dict().get("grid"),
                    "verified": bool(ver.passed), "worst_error": getattr(ver, "worst_error", None)}
            return [g.graph.replay for g in graphs], graphs, True, info
        record(f"tkx:{var}", make)
    if graph_of_kernels is not None:
        def many() -> tuple:
            """The variant's fused groups as one kernel each: checked against its megakernel, then graphed."""
            base = built.get(graph_of_kernels)
            if base is None:
                raise RuntimeError(f"tkx:{graph_of_kernels} was not built, so there is nothing to split")
            if dry:  # the per-group kernels are generated; the schedule interpreter stands in for running them
                from tkx.codegen.kernels_graph import generate_graph
                from tkx.schedule.interpreter import run as run_schedule
                kernels = len(generate_graph(base.cuda).kernels)
                return ([lambda a=a: run_schedule(base.schedule, base.arena, a) for a in sets], None, False,
                        {"kernels": kernels, "verified": None})
            from tkx.bench.compare import same_numbers
            runner = tkx.runtime.GraphOfKernels.from_runner(base)
            worst, sentence = same_numbers(base, runner, sets[0])
            restore(sets, saved)
            graphs = [runner.capture_graph(*a) for a in sets]
            return ([g.graph.replay for g in graphs], graphs, True,
                    {"kernels": len(runner.kernel.entries), "verified": worst <= 1e-5, "worst_error": worst,
                     "same_numbers": sentence, "of": f"tkx:{graph_of_kernels}"})
        record("tkx:graph-of-kernels", many)
    return entry
