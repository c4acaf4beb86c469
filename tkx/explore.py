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

``ex.with_options(tile_m=32)`` returns a new exploration that *reuses* every upstream stage
the change cannot affect (toggling a tile size does not re-capture or re-run passes):
:data:`STAGE_OF_OPTION` says which stage each option first affects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .options import Options, as_options

#: The stages in pipeline order.
STAGES = ("captured", "program", "passes", "schedule", "arena", "cuda", "runner")

#: The first stage each option affects (everything downstream is recomputed too).
STAGE_OF_OPTION = {
    "passes": "passes", "rules": "schedule",
    "fuse_pointwise": "schedule", "fuse_epilogues": "schedule", "fuse_reductions": "schedule",
    "tile_m": "schedule", "tile_n": "schedule", "tile_k": "schedule",
    "threads_per_block": "schedule", "blocks_per_sm": "schedule", "max_blocks": "schedule",
    "split_k": "schedule", "mode": "schedule", "fp32_math": "schedule",
    # Code generation and the runtime read the options from the schedule, which is cheap to
    # recompute: these re-run it too, so every later stage sees the new value.
    "spin_limit": "schedule", "exact": "schedule", "backend": "schedule",
}


def _registry_fingerprints() -> dict[str, tuple]:
    """What the cached ``passes`` and ``schedule`` stages depend on besides the options: the pass
    registry and the user fusion rules (both can change while a notebook runs)."""
    from .passes.registry import registry_fingerprint
    from .schedule.rules import rules_fingerprint
    return {"passes": registry_fingerprint(), "schedule": rules_fingerprint()}


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
                 loss: int | None = None, _cache: dict[str, Any] | None = None,
                 _fingerprints: dict[str, tuple] | None = None) -> None:
        self.step_fn = step_fn
        if not isinstance(example_inputs, (tuple, list)):
            example_inputs = (example_inputs,)  # one positional argument, as tkx.capture accepts
        self.example_inputs = tuple(example_inputs)
        self.options = as_options(options)
        self.name = name or getattr(step_fn, "__name__", "step")
        self.loss = loss
        self._cache: dict[str, Any] = dict(_cache or {})
        self.timings: dict[str, float] = {}
        #: The registry fingerprints the cached ``passes``/``schedule`` stages were computed with.
        self._fingerprints: dict[str, tuple] = dict(_fingerprints or {})
        #: One line per stale stage dropped because a pass or fusion rule changed since it was computed.
        self.recomputed: list[str] = []

    # -- stages -----------------------------------------------------------------------
    def _drop_stale(self) -> None:
        now = _registry_fingerprints()
        for stage, what in (("passes", "the registered passes"), ("schedule", "the user fusion rules")):
            if stage in self._cache and self._fingerprints.get(stage) != now[stage]:
                first = STAGES.index(stage)
                dropped = [s for s in STAGES[first:] if s in self._cache]
                for s in dropped:
                    del self._cache[s]
                self.recomputed.append(f"{what} changed: recomputing {', '.join(dropped)}")
        for stage in ("passes", "schedule"):
            if stage not in self._cache:
                self._fingerprints[stage] = now[stage]

    def _stage(self, name: str, make: Callable[[], Any]) -> Any:
        if STAGES.index(name) >= STAGES.index("passes"):
            self._drop_stale()
        if name not in self._cache:
            t0 = time.perf_counter()
            self._cache[name] = make()
            self.timings[name] = (time.perf_counter() - t0) * 1e3
        return self._cache[name]

    @property
    def captured(self):
        from .capture import capture
        return self._stage("captured", lambda: capture(self.step_fn, self.example_inputs,
                                                       loss=self.loss, name=self.name))

    @property
    def program(self):
        return self._stage("program", lambda: self.captured.lower())

    @property
    def passes(self):
        from .passes import run_passes
        return self._stage("passes", lambda: run_passes(self.program, self.options.passes))

    @property
    def optimized(self):
        """The program after all passes (``passes.output``)."""
        return self.passes.output

    @property
    def schedule(self):
        from .schedule import schedule
        return self._stage("schedule", lambda: schedule(self.optimized, self.options))

    @property
    def arena(self):
        from .arena import plan
        return self._stage("arena", lambda: plan(self.schedule))

    @property
    def cuda(self):
        from .codegen import generate
        return self._stage("cuda", lambda: generate(self.schedule, self.arena))

    @property
    def runner(self):
        from .runtime import CompiledRunner
        return self._stage("runner", lambda: CompiledRunner(self.cuda))

    def widget(self, **kwargs: Any) -> Any:
        """An interactive :class:`tkx.Explorer` over this exploration (needs ipywidgets)."""
        from .explorer import widget
        return widget(self, **kwargs)

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
        first = min((STAGES.index(STAGE_OF_OPTION.get(k, "passes")) for k, v in changes.items()
                     if getattr(self.options, k) != v), default=len(STAGES))
        self._drop_stale()
        keep = {k: v for k, v in self._cache.items() if STAGES.index(k) < first}
        return Exploration(self.step_fn, self.example_inputs, options, name=self.name, loss=self.loss,
                           _cache=keep, _fingerprints={k: v for k, v in self._fingerprints.items() if k in keep})

    def __repr__(self) -> str:
        done = [s for s in STAGES if s in self._cache]
        return f"<tkx.Exploration {self.name}: {', '.join(done) or 'nothing'} computed; {self.options!r}>"


def explore(step_fn: Callable[..., Any], example_inputs: Sequence[Any], *, name: str | None = None,
            loss: int | None = None, options: Options | None = None, **changes: Any) -> Exploration:
    """Start exploring ``step_fn``: see :class:`Exploration`. ``options`` is a :class:`tkx.Options`
    and ``changes`` are Options fields applied on top (an unknown or invalid one raises
    :class:`tkx.OptionsError` naming the field and the allowed values)."""
    base = as_options(options)
    return Exploration(step_fn, example_inputs, base.replace(**changes) if changes else base, name=name, loss=loss)
