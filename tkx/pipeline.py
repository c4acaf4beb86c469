"""The pipeline, written once: every stage of tkx as one row of :data:`STAGES`.

Each :class:`Stage` row says what the stage is called, how it is made from the stages before
it and the :class:`tkx.Options`, whether it needs a GPU, which options invalidate it and what a
first-time reader needs to know about it. Everything that walks the pipeline reads this table:

* :class:`tkx.Exploration` (lazy cached stages, :meth:`~tkx.Exploration.with_options` keeps the
  stages before the first one an option change invalidates);
* :func:`lower` and :func:`build` (also ``tkx.runtime.lower`` / ``tkx.runtime.build``);
* the HTML report's sections (:mod:`tkx.render.report`) and the Explorer's tabs.

A new stage (a task DAG, a timeline) is one more row. ::

    >>> [s.name for s in STAGES]
    ['captured', 'program', 'passes', 'optimized', 'schedule', 'arena', 'cuda', 'timeline', 'runner']
    >>> first_stage_of("tile_m")
    'schedule'

Rows marked ``derived`` are cheap views of an earlier stage (``optimized`` is
``passes.output``): they are shown like stages but never cached on their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import TkxError

__all__ = ["Context", "Stage", "STAGES", "NAMES", "CPU_STAGES", "STAGE_OF_OPTION", "stage",
           "first_stage_of", "invalidated_by", "compute", "lower", "build"]


@dataclass(frozen=True)
class Context:
    """What every stage is made from besides the earlier stages: the user's step and options.

    ``example_inputs`` is a tuple of the step's positional arguments (pytrees of tensors);
    ``loss`` the flat index of the loss among the outputs (``None``: found by capture).
    """

    step_fn: Callable[..., Any]
    example_inputs: tuple[Any, ...]
    options: Any
    name: str | None = None
    loss: int | None = None
    #: the modules and optimizers of a stateful step (``tkx.capture``'s ``state=``), else ``None``
    state: Any = None


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline.

    * ``name``: the attribute of :class:`tkx.Exploration` holding it; ``title``: its heading in
      the report; ``tab``: its tab in the Explorer (``None``: no tab of its own);
    * ``result``: the class the stage produces (its name, for docs and views);
    * ``needs``: the earlier stages ``make`` reads; ``make(ctx, get)`` builds the stage from
      the :class:`Context` and ``get(name)``, which returns an earlier stage;
    * ``gpu``: whether making it needs a CUDA device;
    * ``options``: the :class:`tkx.Options` fields whose change invalidates this stage (and so
      every later one);
    * ``fingerprint``: a function returning what else the stage depends on (the pass registry,
      the user fusion rules: both can change while a notebook runs), and ``depends_on`` says it
      in words for the "recomputed" notes;
    * ``derived``: a cheap view of an earlier stage, never cached;
    * ``about``: what a first-time reader needs to know about the stage (the report shows it).
    """

    name: str
    title: str
    tab: str | None
    result: str
    needs: tuple[str, ...]
    make: Callable[[Context, Callable[[str], Any]], Any] = field(repr=False)
    gpu: bool = False
    options: tuple[str, ...] = ()
    fingerprint: Callable[[], tuple] | None = field(default=None, repr=False)
    depends_on: str = ""
    derived: bool = False
    about: str = ""


# -- how each stage is made (imports are lazy: the core imports without GPU packages) ----------
def _capture(ctx: Context, get: Callable[[str], Any]) -> Any:
    from .capture import capture
    return capture(ctx.step_fn, ctx.example_inputs, loss=ctx.loss, name=ctx.name, state=ctx.state)


def _program(ctx: Context, get: Callable[[str], Any]) -> Any:
    return get("captured").lower()


def _passes(ctx: Context, get: Callable[[str], Any]) -> Any:
    from .passes import run_passes
    return run_passes(get("program"), ctx.options.passes)


def _optimized(ctx: Context, get: Callable[[str], Any]) -> Any:
    return get("passes").output


def _schedule(ctx: Context, get: Callable[[str], Any]) -> Any:
    from .schedule import schedule
    return schedule(get("optimized"), ctx.options)


def _arena(ctx: Context, get: Callable[[str], Any]) -> Any:
    from .arena import plan
    return plan(get("schedule"))


def _cuda(ctx: Context, get: Callable[[str], Any]) -> Any:
    from .codegen import generate
    return generate(get("schedule"), get("arena"))


def _timeline(ctx: Context, get: Callable[[str], Any]) -> Any:
    from .dataflow.timeline import predicted_timeline
    return predicted_timeline(get("cuda"))


def _runner(ctx: Context, get: Callable[[str], Any]) -> Any:
    if ctx.state is not None:
        return build(ctx.step_fn, ctx.example_inputs, ctx.options, name=ctx.name, loss=ctx.loss, state=ctx.state)
    from .runtime.runner import CompiledRunner
    return CompiledRunner(get("cuda"))


def _pass_fingerprint() -> tuple:
    from .passes.registry import registry_fingerprint
    return registry_fingerprint()


def _rule_fingerprint() -> tuple:
    from .schedule.rules import rules_fingerprint
    return rules_fingerprint()


#: The stages in pipeline order.
STAGES: tuple[Stage, ...] = (
    Stage("captured", "Captured graph", "graph", "CapturedGraph", (), _capture,
          about="The training step traced by torch.fx on fake tensors (no data, no GPU): forward, backward "
                "(autograd: loss.backward() or torch.func) and the optimizer update as one flat graph of aten "
                "ops, each knowing the line of your Python it came from."),
    Stage("program", "IR", "IR", "Program", ("captured",), _program,
          about="The graph lowered to tkx's own IR: every value is a TensorSpec (shape, dtype, strides, "
                "buffer), views are metadata only, and the ops are pointwise maps, reductions, matmuls, "
                "fills and casts."),
    Stage("passes", "Pass trace", "passes", "PassTrace", ("program",), _passes, options=("passes",),
          fingerprint=_pass_fingerprint, depends_on="the registered passes",
          about="Named Program -> Program rewrites, in the order they ran, with what each added, removed "
                "or changed."),
    Stage("optimized", "IR after the passes", None, "Program", ("passes",), _optimized, derived=True,
          about="The program the scheduler works on. Its op ids are the ones the schedule, the arena and "
                "the CUDA source refer to."),
    Stage("schedule", "Fused schedule", "schedule", "FusedSchedule", ("optimized",), _schedule,
          # Code generation and the runtime read the options from the schedule, which is cheap to
          # recompute: the codegen/launch options invalidate it too, so every later stage sees them.
          options=("rules", "fuse_pointwise", "fuse_epilogues", "fuse_reductions", "fuse_rows", "fuse_attention",
                   "tile_m", "tile_n",
                   "tile_k", "threads_per_block", "blocks_per_sm", "max_blocks", "split_k", "mode",
                   "fp32_math", "arch", "gemm_copy", "spin_limit", "exact", "backend", "sync", "timeline",
                   "grid_barrier", "cheap_int_math", "wgmma_min_macs", "wgmma_in_flight", "split_k_final",
                   "split_k_min_steps", "epilogue_vector", "epilogue_prefetch", "tensormap_prefetch",
                   "gemv_prefetch", "gemv_ring", "weight_prefetch", "gemm_cluster", "cluster_scope",
                   "cluster_multicast", "outline"),
          fingerprint=_rule_fingerprint, depends_on="the user fusion rules",
          about="Which ops are computed together in one loop (fusion groups), which values must be "
                "written to memory, where a barrier separates stages, and why each candidate fusion did "
                "or did not happen."),
    Stage("arena", "Arena", "arena", "ArenaPlan", ("schedule",), _arena,
          about="Where every value that lives in memory is placed in the one workspace: offsets, "
                "lifetimes, reuse after the last reader, and the peak against the lower bound (bytes "
                "live at once)."),
    Stage("cuda", "CUDA source", "CUDA", "CudaSource", ("schedule", "arena"), _cuda,
          about="The generated source of ONE cooperative persistent kernel that runs the whole training "
                "step."),
    Stage("timeline", "Task timeline", "timeline", "Timeline", ("cuda",), _timeline,
          about="Which block runs which task (a work item of a group) when, predicted without a GPU: the "
                "kernel's tasks timed by the cost model, in its grid-stride order and with its barriers or "
                "counters (a task's wait is the grey bar before it; barriers show as gaps; the critical path "
                "is outlined). On a GPU, Options(timeline=True) and runner.timeline() give the same chart "
                "measured with %globaltimer, and predicted.compare(measured) puts the two side by side."),
    Stage("runner", "Compiled runner and verification", "runner", "CompiledRunner", ("cuda",), _runner,
          gpu=True,
          about="The kernel compiled with NVRTC and loaded on the GPU: registers, shared memory, spills, "
                "occupancy, and a check of its results against eager PyTorch and the reference "
                "interpreter."),
)

_BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}

#: The stages that are computed and cached (not ``derived``), in pipeline order.
NAMES: tuple[str, ...] = tuple(s.name for s in STAGES if not s.derived)
#: The cached stages that need no GPU.
CPU_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if not s.derived and not s.gpu)
#: The first stage each option invalidates (everything after it is recomputed too).
STAGE_OF_OPTION: Mapping[str, str] = {opt: s.name for s in STAGES for opt in s.options}


def stage(name: str) -> Stage:
    """The row of stage ``name``; :class:`tkx.TkxError` naming the stages for any other name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TkxError(f"no stage {name!r}: the stages are {', '.join(_BY_NAME)}") from None


def index(name: str) -> int:
    """Position of a cached stage in :data:`NAMES` (a derived stage counts as the one it views)."""
    s = stage(name)
    while s.derived:
        s = stage(s.needs[0])
    return NAMES.index(s.name)


def first_stage_of(option: str) -> str:
    """The first stage a change of ``option`` invalidates. An option no row names (none today:
    a test checks every field is named) invalidates the earliest stage that reads options."""
    return STAGE_OF_OPTION.get(option, "passes")


def invalidated_by(changes: Mapping[str, Any], options: Any) -> int:
    """Index in :data:`NAMES` of the first stage the option ``changes`` invalidate against
    ``options`` (``len(NAMES)`` when nothing changes)."""
    return min((index(first_stage_of(k)) for k, v in changes.items() if getattr(options, k) != v),
               default=len(NAMES))


def compute(upto: str, ctx: Context, cache: dict[str, Any] | None = None,
            timings: dict[str, float] | None = None) -> Any:
    """Make stage ``upto`` and every stage it needs, reusing (and filling) ``cache``.

    ``timings`` receives the milliseconds each newly made stage took. Raises whatever a stage
    raises (e.g. :class:`tkx.UnsupportedError` from capture, a ``NoDeviceError`` for the runner).
    """
    cache = {} if cache is None else cache

    def get(name: str) -> Any:
        s = stage(name)
        if s.derived:
            return s.make(ctx, get)
        if name not in cache:
            for need in s.needs:
                get(need)
            t0 = time.perf_counter()
            cache[name] = s.make(ctx, get)
            if timings is not None:
                timings[name] = (time.perf_counter() - t0) * 1e3
        return cache[name]

    return get(upto)


def _context(step_fn: Callable[..., Any], example_inputs: Sequence[Any] | Any, options: Any,
             name: str | None, loss: int | None, state: Any = None) -> Context:
    from .options import as_options

    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)  # one positional argument, as tkx.capture accepts
    return Context(step_fn, tuple(example_inputs), as_options(options), name, loss, state)


def lower(step_fn: Callable[..., Any], example_inputs: Sequence[Any], options: Any = None, *,
          name: str | None = None, loss: int | None = None, state: Any = None) -> Any:
    """Capture, optimise, schedule, plan and generate: the :class:`~tkx.codegen.CudaSource` of a step
    (every stage of :data:`STAGES` before the runner). Needs no GPU. ``state``: as for :func:`tkx.capture`."""
    return compute("cuda", _context(step_fn, example_inputs, options, name, loss, state))


def _options_for_device(options: Any, dev: Any) -> Any:
    """``options`` with ``arch="auto"`` resolved for ``dev`` (:func:`tkx.target.resolve_arch`):
    sm_90a (wgmma GEMMs) on Hopper, the device's own architecture elsewhere."""
    from .runtime.device import arch_of
    from .target import resolve_arch

    if getattr(options, "arch", "auto") == "auto":
        options = options.replace(arch=resolve_arch("auto", arch_of(dev)))
    return options


def build(step_fn: Callable[..., Any], example_inputs: Sequence[Any], options: Any = None, *,
          name: str | None = None, loss: int | None = None, device: Any = None,
          cache: bool | str = True, state: Any = None) -> Any:
    """Compile ``step_fn`` for the shapes, dtypes and strides of ``example_inputs``: a
    :class:`~tkx.runtime.CompiledRunner`.

    Runs on the device of the example inputs when they are CUDA tensors, else ``device`` (or
    PyTorch's current CUDA device). ``options``: a :class:`tkx.Options` (``backend`` picks
    NVRTC or the torch-extension build). ``loss``: flat index of the loss among the outputs.

    ``state``: the modules and optimizers of a step that calls ``loss.backward()`` and
    ``opt.step()`` (as for :func:`tkx.capture`): the result is then a
    :class:`~tkx.runtime.stateful.StatefulRunner`, called with the step's own arguments, which
    updates the modules and optimizers in place.

    Raises :class:`~tkx.runtime.device.NoDeviceError` (no GPU: says what works without one),
    :class:`tkx.UnsupportedError` (capture), :class:`~tkx.codegen.nvrtc.CudaCompileError`.
    """
    if state is not None:
        from .runtime.stateful import StatefulRunner
        return StatefulRunner(lambda inputs: _build(step_fn, inputs, options, name, loss, device, cache, state),
                              example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,))
    return _build(step_fn, example_inputs, options, name, loss, device, cache, None)[0]


def _build(step_fn: Callable[..., Any], example_inputs: Sequence[Any], options: Any, name: str | None,
           loss: int | None, device: Any, cache: bool | str, state: Any) -> tuple[Any, Any]:
    """``(CompiledRunner, StatefulStep or None)`` of :func:`build`."""
    import torch
    from torch.utils._pytree import tree_flatten

    from .runtime.device import device_of
    from .runtime.runner import CompiledRunner
    from .runtime.verify import is_mask

    ctx = _context(step_fn, example_inputs, options, name, loss, state)
    dev = device_of(tree_flatten(ctx.example_inputs)[0], device)
    ctx = _context(step_fn, example_inputs, _options_for_device(ctx.options, dev), name, loss, state)
    t0 = time.perf_counter()
    stages: dict[str, Any] = {}
    source = compute("cuda", ctx, stages)
    lowered = time.perf_counter() - t0
    stateful = stages["captured"].stateful
    runner = CompiledRunner(source, device=dev, step_fn=stateful.eager if stateful else step_fn, cache=cache)
    runner.timings["lower_seconds"] = lowered
    lifted = [None] * len(stateful.slots) if stateful else []
    #: the example inputs' integer leaves (CPU copies), from which verify() takes their range
    runner.example_integers = lifted + [
        t.detach().cpu() if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool
        else None for t in tree_flatten(ctx.example_inputs)[0]]
    #: the example inputs' masks (CPU copies): verify() runs with the user's masks, see verify.random_inputs
    runner.example_masks = lifted + [t.detach().cpu() if is_mask(t) else None
                                     for t in tree_flatten(ctx.example_inputs)[0]]
    return runner, stateful
