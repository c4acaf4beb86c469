"""``compare``: the megakernel against eager, CUDA-graphed eager and Inductor, in one run.

Order of work for one workload:

1. build the megakernel (:func:`tkx.runtime.build`), time a cold and a cached NVRTC compile;
2. check correctness (:meth:`~tkx.runtime.CompiledRunner.verify` against eager and the
   reference interpreter) - a failure is reported, and the timing still runs;
3. make two input sets (``make_inputs(0)``, ``make_inputs(1)``; without ``make_inputs`` the
   example inputs and a perturbed copy) and snapshot them;
4. time each candidate: ``eager`` (plain calls), ``eager+cudagraph``, ``inductor``
   (``torch.compile`` default) and ``inductor-max-autotune``
   (``mode="max-autotune-no-cudagraphs"``), each but plain eager captured in one CUDA graph
   per input set, then ``tkx`` (:meth:`~tkx.runtime.CompiledRunner.capture_graph` per set) and
   ``tkx graph of kernels`` (:class:`~tkx.runtime.GraphOfKernels`: the same fused groups as one kernel
   each, every kernel of a step in one CUDA graph; checked against the megakernel's outputs first).
   Replays alternate between the sets. After each candidate every input is restored from the
   snapshot, so steps that update their inputs in place start each candidate from the same
   state. A candidate that fails is recorded with its error and does not stop the run.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import TkxError
from ..runtime.verify import call_make_inputs, clone_exact
from .report import BASELINES, GRAPH_OF_KERNELS, MEGAKERNEL, BenchmarkReport, Row
from .timing import capture, time_steps


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _input_sets(example_inputs: Sequence[Any], make_inputs: Callable[..., Any] | None,
                device: torch.device) -> list[tuple]:
    if make_inputs is not None:
        return [call_make_inputs(make_inputs, seed, device) for seed in (0, 1)]
    first = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tuple(example_inputs))
    gen = torch.Generator(device="cpu").manual_seed(1)

    def perturb(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        out = clone_exact(t)
        if t.is_floating_point() and t.numel():
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(device=device, dtype=t.dtype)
            out.add_(noise, alpha=0.01)
        return out

    return [first, tree_map(perturb, first)]


class _State:
    """Snapshot of every tensor of every input set; :meth:`restore` copies them back."""

    def __init__(self, sets: Sequence[tuple]) -> None:
        self.live = [tree_flatten(s)[0] for s in sets]
        self.saved = [[clone_exact(t) if isinstance(t, torch.Tensor) else t for t in flat]
                      for flat in self.live]

    def restore(self) -> None:
        for live, saved in zip(self.live, self.saved):
            for t, s in zip(live, saved):
                if isinstance(t, torch.Tensor):
                    t.copy_(s)


def same_numbers(runner: Any, other: Any, args: tuple) -> tuple[float, str]:
    """Run ``runner`` and ``other`` (e.g. its :class:`~tkx.runtime.GraphOfKernels`) once each on clones of
    ``args``: ``(worst relative error, a sentence)`` over the flat outputs and the inputs they update
    (:func:`tkx.runtime.relative_error`; 0.0: bit for bit the same). The two run the same group code, so
    anything above rounding (atomics) is a bug. Raises what either run raises (a kernel error)."""
    from torch.utils._pytree import tree_map

    from ..runtime.verify import relative_error

    results = []
    for r in (runner, other):
        flat = r.flatten(tree_map(lambda t: clone_exact(t) if isinstance(t, torch.Tensor) else t, tuple(args)))
        results.append(r.run_flat(flat) + [t for t in flat if isinstance(t, torch.Tensor)])
    errors = [relative_error(b, a) for a, b in zip(*results)]
    worst = max(errors, default=0.0)
    if worst == 0.0:
        return worst, "outputs bit for bit the megakernel's"
    return worst, f"outputs differ from the megakernel's: relative error {worst:.3g} (flat result " \
                  f"{errors.index(worst)})"


def _graphed(fn: Callable[..., Any], sets: Sequence[tuple], device: torch.device,
             warmup: int) -> tuple[list[Callable[[], Any]], list[Any]]:
    keep: list[Any] = []
    fns = []
    for args in sets:
        graph, out = capture(lambda args=args: fn(*args), device, warmup=warmup)
        keep.append((graph, out))
        fns.append(graph.replay)
    return fns, keep


def compare(step_fn: Callable[..., Any], example_inputs: Sequence[Any], options: Any = None, *,
            make_inputs: Callable[..., Any] | None = None, repeats: int = 9, warmup: int = 3,
            name: str | None = None, loss: int | None = None, device: Any = None,
            baselines: Sequence[str] = BASELINES, target_us: float = 2000.0,
            log: Callable[[str], Any] | None = None, graph_of_kernels: bool = True) -> BenchmarkReport:
    """Benchmark the megakernel of ``step_fn`` against the baselines; see the module docstring.

    ``repeats`` (at least 7 are taken) samples per candidate, each a CUDA-event-timed batch
    of about ``target_us`` µs; ``warmup`` calls before capturing and before timing;
    ``baselines``: a subset of :data:`~tkx.bench.report.BASELINES`. ``log`` receives progress
    lines. ``graph_of_kernels``: also time the same fused groups as one kernel each
    (:data:`~tkx.bench.report.GRAPH_OF_KERNELS` row; its note says how its outputs compare with the
    megakernel's). Returns a :class:`~tkx.bench.report.BenchmarkReport` (µs per step).

    Raises :class:`tkx.runtime.NoDeviceError` without a GPU; errors of building or verifying
    the megakernel propagate (there would be nothing to compare), baseline errors do not.
    """
    from .. import runtime
    from ..runtime.device import device_of

    say = log or (lambda _msg: None)
    repeats = max(7, int(repeats))
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baselines {unknown}; choose from {BASELINES}")
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    dev = device_of(tree_flatten(example_inputs)[0], device)
    name = name or getattr(step_fn, "__name__", "step")
    sets = _input_sets(example_inputs, make_inputs, dev)

    say(f"[{name}] building the megakernel")
    t0 = time.perf_counter()
    runner = runtime.build(step_fn, sets[0], options, name=name, loss=loss, device=dev)
    build_s = time.perf_counter() - t0
    compile_info: dict[str, Any] = {"build_s": build_s, "lower_s": runner.timings.get("lower_seconds"),
                                    "backend": runner.kernel.backend}
    if runner.kernel.backend == "nvrtc":
        arch = runner.kernel.binary.arch
        cold = runtime.compile_cubin(runner.source, arch, cache="refresh")
        cached = runtime.compile_cubin(runner.source, arch)
        compile_info.update(nvrtc_cold_s=cold.compile_seconds, nvrtc_cold_wall_s=cold.seconds,
                            nvrtc_cached_s=cached.seconds, cache_hit=cached.cache_hit)
    else:
        compile_info.update(extension_cold_s=runner.resources.compile_seconds,
                            extension_call_s=runner.resources.seconds)
    say(f"[{name}] {runner.resources.summary()}")

    say(f"[{name}] verifying against eager and the reference interpreter")
    verification = runner.verify(seeds=(0, 1), make_inputs=make_inputs)
    say(f"[{name}] {verification.summary().splitlines()[0]}")

    state = _State(sets)
    rows: list[Row] = []

    def eager_plain() -> tuple[list[Callable[[], Any]], Any, bool]:
        return [lambda args=args: step_fn(*args) for args in sets], None, False

    def eager_graph() -> tuple[list[Callable[[], Any]], Any, bool]:
        fns, keep = _graphed(step_fn, sets, dev, warmup)
        return fns, keep, True

    def inductor(mode: str | None) -> Callable[[], tuple[list[Callable[[], Any]], Any, bool]]:
        def make() -> tuple[list[Callable[[], Any]], Any, bool]:
            torch._dynamo.reset()
            compiled = torch.compile(step_fn, mode=mode) if mode else torch.compile(step_fn)
            fns, keep = _graphed(compiled, sets, dev, warmup)
            return fns, (compiled, keep), True
        return make

    table = {"eager": eager_plain, "eager+cudagraph": eager_graph, "inductor": inductor(None),
             "inductor-max-autotune": inductor("max-autotune-no-cudagraphs")}
    candidates: list[tuple[str, Callable[[], tuple[list[Callable[[], Any]], Any, bool]]]] = [
        (b, table[b]) for b in BASELINES if b in baselines]

    def megakernel() -> tuple[list[Callable[[], Any]], Any, bool]:
        graphs = [runner.capture_graph(*args, warmup=warmup) for args in sets]
        return [g.graph.replay for g in graphs], graphs, True

    candidates.append((MEGAKERNEL, megakernel))
    notes: dict[str, str] = {}

    def many_kernels() -> tuple[list[Callable[[], Any]], Any, bool]:
        from ..runtime.graph_of_kernels import GraphOfKernels

        many = GraphOfKernels.from_runner(runner)
        worst, notes[GRAPH_OF_KERNELS] = same_numbers(runner, many, sets[0])
        if worst > 1e-5:
            raise TkxError(notes[GRAPH_OF_KERNELS])
        state.restore()
        graphs = [many.capture_graph(*args, warmup=warmup) for args in sets]
        return [g.graph.replay for g in graphs], graphs, True

    if graph_of_kernels:
        candidates.append((GRAPH_OF_KERNELS, many_kernels))

    for cand, make in candidates:
        say(f"[{name}] timing {cand}")
        fns = keep = None
        try:
            t0 = time.perf_counter()
            fns, keep, graphed = make()
            setup_s = time.perf_counter() - t0
            samples, steps = time_steps(fns, dev, repeats=repeats, warmup=warmup, target_us=target_us,
                                        queue_ahead=graphed)
            note = f"setup {setup_s:.1f} s" + (f"; {notes[cand]}" if cand in notes else "")
            ok = True
            if cand in (MEGAKERNEL, GRAPH_OF_KERNELS):
                for g in keep:
                    g.check_status()
                if not verification.passed:
                    ok = False
                    note = f"wrong results: worst {verification.worst} {verification.worst_error:.3g}"
            rows.append(Row.measured(cand, samples, steps, ok=ok, note=note))
            say(f"[{name}]   {cand}: {rows[-1].median_us:.1f} µs/step")
        except Exception as exc:  # a failing baseline is a result, not a crash
            rows.append(Row.failed(cand, _first_line(exc)))
            say(f"[{name}]   {cand} failed: {_first_line(exc)}")
        finally:
            fns = keep = None
            gc.collect()
            try:
                torch.cuda.synchronize(dev)
                state.restore()
                torch.cuda.synchronize(dev)
            except Exception as exc:  # pragma: no cover - a broken CUDA context
                say(f"[{name}]   could not restore the inputs: {_first_line(exc)}")

    sched = runner.schedule
    schedule_info = {
        "mode": getattr(sched, "mode", None), "stages": len(getattr(sched, "stages", ()) or ()),
        "barriers": int(getattr(sched, "num_barriers", 0) or 0),
        "groups": len(getattr(sched, "groups", {}) or {}),
        "blocks_wanted": getattr(sched, "blocks", None), "threads": getattr(sched, "threads", None),
    }
    from ..target import program_work, speed_of_light_us

    flops, nbytes = program_work(runner.program)
    schedule_info.update(flops=flops, bytes=nbytes, speed_of_light_us=speed_of_light_us(flops, nbytes))
    props = torch.cuda.get_device_properties(dev)
    meta = {"device": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "repeats": repeats, "warmup": warmup, "input_sets": len(sets),
            "options": repr(runner.options), "timing": "CUDA events around batches of CUDA-graph replays "
            "(plain eager: eager calls), µs per step, median of repeats, input sets alternated"}
    return BenchmarkReport(name, tuple(rows), verification.as_dict(), runner.resources.as_dict(),
                           compile_info, schedule_info, meta)
