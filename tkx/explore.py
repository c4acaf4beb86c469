"""The front door: ``tkx.explore(step_fn, example_inputs, **options)``.

An :class:`Exploration` holds every stage of one compilation, computed lazily and cached::

    ex = tkx.explore(step, inputs)
    ex.captured      # CapturedGraph  (FX graph on fake tensors, regions, source lines)
    ex.program       # Program        (the IR)
    ex.passes        # PassTrace      (one Program per pass, what changed, ms)
    ex.schedule      # FusedSchedule  (groups, stages, barriers, every fusion decision)
    ex.arena         # ArenaPlan      (offsets, peak bytes vs lower bound)
    ex.cuda          # CudaSource     (kernel text, op <-> line map, NVRTC check)
    ex.runner        # CompiledRunner (needs a GPU)
    ex.run(*args)    # one step on the CPU with the schedule interpreter (in-place updates written back)
    ex.verify()      # both interpreters against eager PyTorch, arbitrated in float64

A step that calls ``loss.backward()`` and ``opt.step()`` names its modules and optimizers:
``tkx.explore(step, (x, y), state=(model, opt))`` (see :mod:`tkx.capture.stateful`); ``ex.run(x, y)``
then updates ``model`` and ``opt`` in place as eager does.

``ex.with_options(tile_m=32)`` returns a new exploration that *reuses* every upstream stage
the change cannot affect (toggling a tile size does not re-capture or re-run passes):
:data:`STAGE_OF_OPTION` says which stage each option first affects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import pipeline
from .options import Options, as_options

#: The cached stages in pipeline order (:data:`tkx.pipeline.NAMES`).
STAGES = pipeline.NAMES

#: The first stage each option affects (everything downstream is recomputed too):
#: :data:`tkx.pipeline.STAGE_OF_OPTION`, read from the pipeline table.
STAGE_OF_OPTION = pipeline.STAGE_OF_OPTION


def _registry_fingerprints() -> dict[str, tuple]:
    """What cached stages depend on besides the options (the pass registry, the user fusion
    rules: both can change while a notebook runs), from the pipeline table."""
    return {s.name: s.fingerprint() for s in pipeline.STAGES if s.fingerprint is not None}


#: The cached stages that depend on a registry besides the options.
_FINGERPRINTED = tuple(s.name for s in pipeline.STAGES if s.fingerprint is not None)


def _stage(name: str, doc: str) -> property:
    """The property of :class:`Exploration` that is stage ``name`` (a row of :data:`tkx.pipeline.STAGES`),
    made on first access."""
    return property(lambda self: self._get(name), doc=doc)


class Exploration:
    """Every stage of compiling one step under one :class:`Options`, lazily computed.

    Stage attributes are computed on first access and cached; :attr:`timings` records how
    long each took (ms). Registering, replacing or removing a pass or a fusion rule makes the
    cached ``passes`` or ``schedule`` stage stale: the next access recomputes it and every later
    stage (:attr:`recomputed` lists why). Raises whatever the stage raises (e.g.
    :class:`tkx.UnsupportedError` from capture) on first access.
    """

    def __init__(self, step_fn: Callable[..., Any], example_inputs: Sequence[Any],
                 options: Options | None = None, *, name: str | None = None,
                 loss: int | None = None, state: Any = None) -> None:
        self.step_fn = step_fn
        if not isinstance(example_inputs, (tuple, list)):
            example_inputs = (example_inputs,)  # one positional argument, as tkx.capture accepts
        self.example_inputs = tuple(example_inputs)
        self.options = as_options(options)
        self.name = name or getattr(step_fn, "__name__", "step")
        self.loss = loss
        #: the modules and optimizers of a stateful step (``None``: a functional step)
        self.state = state
        self._cache: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        #: The registry fingerprints the cached ``passes``/``schedule`` stages were computed with.
        self._fingerprints: dict[str, tuple] = {}
        #: One line per stale stage dropped because a pass or fusion rule changed since it was computed.
        self.recomputed: list[str] = []

    # -- stages -----------------------------------------------------------------------
    def _drop_stale(self) -> None:
        now = _registry_fingerprints()
        for name, print_ in now.items():
            if name in self._cache and self._fingerprints.get(name) != print_:
                first = STAGES.index(name)
                dropped = [s for s in STAGES[first:] if s in self._cache]
                for s in dropped:
                    del self._cache[s]
                self.recomputed.append(f"{pipeline.stage(name).depends_on} changed: recomputing {', '.join(dropped)}")
        for name, print_ in now.items():
            if name not in self._cache:
                self._fingerprints[name] = print_

    def _get(self, name: str) -> Any:
        """Stage ``name`` (a row of :data:`tkx.pipeline.STAGES`), made on first access."""
        row = pipeline.stage(name)
        if row.derived:
            return row.make(self._context, self._get)
        if pipeline.index(name) >= min((STAGES.index(n) for n in _FINGERPRINTED), default=len(STAGES)):
            self._drop_stale()
        return pipeline.compute(name, self._context, self._cache, self.timings)

    @property
    def _context(self) -> pipeline.Context:
        return pipeline.Context(self.step_fn, self.example_inputs, self.options, self.name, self.loss, self.state)

    captured = _stage("captured", ":class:`tkx.CapturedGraph`: the traced step.")
    program = _stage("program", ":class:`tkx.Program`: the IR as lowered from the capture.")
    passes = _stage("passes", ":class:`tkx.PassTrace`: one Program per pass.")
    optimized = _stage("optimized", "The program after all passes (``passes.output``).")
    schedule = _stage("schedule", ":class:`tkx.FusedSchedule`: groups, stages, barriers, fusion decisions.")
    arena = _stage("arena", ":class:`tkx.ArenaPlan`: offsets and lifetimes in the one workspace.")
    cuda = _stage("cuda", ":class:`tkx.codegen.CudaSource`: the kernel text and its source map.")
    timeline = _stage("timeline", ":class:`tkx.dataflow.timeline.Timeline`: the predicted Gantt chart of one "
                      "launch (no GPU; ns; :func:`tkx.dataflow.timeline.predicted_timeline`).")
    runner = _stage("runner", ":class:`tkx.runtime.CompiledRunner` (needs a GPU).")

    # -- running on the CPU -------------------------------------------------------------------
    def run(self, *args: Any) -> Any:
        """One step on ``args`` (the step's own arguments) with the schedule interpreter (the fused
        schedule and the arena, on the CPU): returns what the step returns and writes every in-place
        update into the given tensors, as the kernel does. With ``state=``, the modules and
        optimizers are updated in place as eager updates them; a module switched between
        ``train()`` and ``eval()`` or a changed hyperparameter (other than the learning rate)
        captures the step again first (:attr:`recomputed` says so).
        Raises :class:`tkx.UnsupportedError` from capture."""
        from .schedule.interpreter import run as run_schedule

        if self.state is None:
            return run_schedule(self.schedule, self.arena, args, update_inputs=True).output_tree()
        stateful = self._fit_state(args)
        lifted = stateful.prepare()
        try:
            return run_schedule(self.schedule, self.arena, (*lifted, *args), update_inputs=True).output_tree()
        finally:
            stateful.finish()

    def _fit_state(self, args: tuple) -> Any:
        """The stateful step that fits the modules and optimizers now: a module switched between
        ``train()`` and ``eval()`` or a changed hyperparameter captures the step again (on ``args``)."""
        stateful = self.captured.stateful
        reason = stateful.stale()
        if reason is not None:
            self.recomputed.append(f"{reason}: capturing the step again")
            self.example_inputs = tuple(args)
            self._cache.clear()
            stateful = self.captured.stateful
        return stateful

    def verify(self, *args: Any, **kwargs: Any) -> Any:
        """Both interpreters against eager PyTorch on the example inputs (or ``args``), arbitrated in
        float64; prints the table of every value and returns the
        :class:`~tkx.runtime.verify.Verification`. See :func:`tkx.runtime.verify_cpu.verify_cpu`.
        With ``state=``, a module switched between ``train()`` and ``eval()`` (or a changed
        hyperparameter) captures the step again first, as :meth:`run` does."""
        from .runtime.verify_cpu import verify_cpu
        if self.state is not None:
            self._fit_state(tuple(args) or self.example_inputs)
        return verify_cpu(self, args or None, **kwargs)

    def widget(self, **kwargs: Any) -> Any:
        """An interactive :class:`tkx.Explorer` over this exploration (needs ipywidgets)."""
        from . import display
        return display.widget(self, **kwargs)

    @property
    def computed(self) -> tuple[str, ...]:
        """The stages computed so far, in pipeline order."""
        return tuple(s for s in STAGES if s in self._cache)

    def stages(self, upto: str = "cuda") -> dict[str, Any]:
        """Ordered ``{stage name: object}`` up to and including ``upto``."""
        out = {}
        for name in STAGES[: STAGES.index(upto) + 1]:
            out[name] = getattr(self, name)
        return out

    # -- options ------------------------------------------------------------------------
    def with_options(self, **changes: Any) -> Exploration:
        """A new exploration with ``changes`` applied; upstream stages are reused.

        Raises :class:`tkx.options.OptionsError` for an invalid value.
        """
        options = self.options.replace(**changes)
        first = pipeline.invalidated_by(changes, self.options)
        self._drop_stale()
        keep = {k: v for k, v in self._cache.items() if STAGES.index(k) < first}
        return self._derive(options, keep)

    def _derive(self, options: Options, keep: dict[str, Any]) -> Exploration:
        """A new exploration of the same step under ``options`` holding the stages ``keep``
        (those the change does not touch) and their registry fingerprints."""
        new = Exploration(self.step_fn, self.example_inputs, options, name=self.name, loss=self.loss,
                          state=self.state)
        new._cache.update(keep)
        new._fingerprints.update({k: v for k, v in self._fingerprints.items() if k in keep})
        return new

    def __repr__(self) -> str:
        done = [s for s in STAGES if s in self._cache]
        return f"<tkx.Exploration {self.name}: {', '.join(done) or 'nothing'} computed; {self.options!r}>"


def explore(step_fn: Callable[..., Any], example_inputs: Sequence[Any], *, name: str | None = None,
            loss: int | None = None, options: Options | None = None, state: Any = None,
            **changes: Any) -> Exploration:
    """Start exploring ``step_fn``: see :class:`Exploration`. ``options`` is a :class:`tkx.Options`
    and ``changes`` are Options fields applied on top (an unknown or invalid one raises
    :class:`tkx.OptionsError` naming the field and the allowed values). ``state``: the modules and
    optimizers of a step that calls ``loss.backward()`` and ``opt.step()`` (as for :func:`tkx.capture`)."""
    base = as_options(options)
    return Exploration(step_fn, example_inputs, base.replace(**changes) if changes else base, name=name, loss=loss,
                       state=state)
