"""What one kernel buys: the megakernel against the same fused groups launched as one kernel each.

:func:`graph_of_kernels` builds the megakernel of a step and its :class:`~tkx.runtime.GraphOfKernels`
(the same schedule, arena and group code; a launch boundary where the megakernel has a grid barrier),
checks that both give the same numbers, captures each in CUDA graphs (every kernel of a step in one graph)
and times them the way :func:`tkx.bench.compare` does. Needs a CUDA GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Largest relative error between the two runs' results still called "the same numbers" (the group code is
#: the same; only an atomic's order can change a rounding).
SAME_NUMBERS = 1e-5


@dataclass(frozen=True)
class ManyKernelsTiming:
    """The megakernel against its graph of kernels on one step (µs per step, medians of CUDA-event-timed
    batches of CUDA-graph replays, two input sets alternated).

    ``kernels``: kernels in the graph (one per fused group); ``stages`` and ``barriers`` of the megakernel's
    schedule; ``relative_error``: the largest between the two runs' results
    (:func:`tkx.runtime.relative_error`); ``speed_of_light_us``: :func:`tkx.target.speed_of_light_us` of the
    step; ``samples_us``: every sample per candidate."""

    name: str
    megakernel_us: float
    graph_of_kernels_us: float
    kernels: int
    stages: int
    barriers: int
    relative_error: float
    speed_of_light_us: float
    samples_us: dict[str, list[float]]

    @property
    def one_kernel_saves_us(self) -> float:
        """µs per step the single kernel saves over the graph of kernels (negative: it costs more)."""
        return self.graph_of_kernels_us - self.megakernel_us

    @property
    def ratio(self) -> float:
        """megakernel µs / graph-of-kernels µs (below 1: the single kernel is faster)."""
        return self.megakernel_us / self.graph_of_kernels_us

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "one_kernel_saves_us": self.one_kernel_saves_us, "ratio": self.ratio}

    def __str__(self) -> str:
        return (f"{self.name}: megakernel {self.megakernel_us:.1f} µs/step ({self.stages} stages, {self.barriers} "
                f"barriers) vs {self.kernels} kernels in one CUDA graph {self.graph_of_kernels_us:.1f} µs/step: "
                f"one kernel saves {self.one_kernel_saves_us:.1f} µs ({self.ratio:.2f}x); speed of light "
                f"{self.speed_of_light_us:.2f} µs")

    def __repr__(self) -> str:
        return f"<tkx.bench.ManyKernelsTiming {self}>"


def graph_of_kernels(what: Any, example_inputs: Sequence[Any] | None = None, options: Any = None, *,
                     make_inputs: Callable[..., Any] | None = None, repeats: int = 9, warmup: int = 3,
                     target_us: float = 1000.0, device: Any = None) -> ManyKernelsTiming:
    """Time the megakernel of a step against the same groups as one kernel each (module docstring).

    ``what``: a :class:`tkx.Exploration` (``tkx.explore(...)``: its step, inputs and options), a built
    :class:`~tkx.runtime.CompiledRunner`, or a step function (then ``example_inputs`` and ``options`` as
    for :func:`tkx.runtime.build`). ``make_inputs(seed)`` gives the two input sets (default: the example
    inputs and, for a second set, the same). Returns a :class:`ManyKernelsTiming`.

    Raises :class:`tkx.runtime.NoDeviceError` without a GPU, :class:`tkx.TkxError` when the two give
    different numbers (relative error above :data:`SAME_NUMBERS`), and what building either raises.
    """
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    from .. import runtime
    from ..errors import TkxError
    from ..runtime.device import device_of, require_cuda
    from ..runtime.verify import call_make_inputs
    from ..target import program_work, speed_of_light_us
    from .compare import _State, same_numbers
    from .timing import time_steps

    if isinstance(what, runtime.CompiledRunner):
        mega, inputs = what, example_inputs
        if inputs is None and make_inputs is None:
            raise ValueError("graph_of_kernels(runner) needs example_inputs or make_inputs")
    elif hasattr(what, "step_fn") and hasattr(what, "example_inputs"):  # an Exploration
        inputs = what.example_inputs if example_inputs is None else example_inputs
        mega = None
    else:
        inputs, mega = example_inputs, None
    if make_inputs is not None:
        dev = require_cuda(device if mega is None else mega.device)
        sets = [call_make_inputs(make_inputs, seed, dev) for seed in (0, 1)]
    else:
        flat = tree_flatten(tuple(inputs))[0]
        dev = device_of(flat, device if mega is None else mega.device)
        sets = [tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, tuple(inputs))]
    if mega is None:
        if hasattr(what, "step_fn"):
            mega = runtime.build(what.step_fn, sets[0], what.options if options is None else options,
                                 name=what.name, loss=what.loss, device=dev)
        else:
            mega = runtime.build(what, sets[0], options, device=dev)
    many = runtime.GraphOfKernels.from_runner(mega)
    state = _State(sets)
    worst, sentence = same_numbers(mega, many, sets[0])
    if worst > SAME_NUMBERS:
        raise TkxError(f"{mega.program.name}: the graph of kernels' {sentence}")
    state.restore()
    medians, samples = {}, {}
    for label, runner in (("megakernel", mega), ("graph_of_kernels", many)):
        graphs = [runner.capture_graph(*a, warmup=warmup) for a in sets]
        got, _ = time_steps([g.graph.replay for g in graphs], dev, repeats=repeats, warmup=warmup,
                            target_us=target_us)
        for g in graphs:
            g.check_status()
        samples[label] = got
        medians[label] = statistics.median(got)
        torch.cuda.synchronize(dev)
        state.restore()
    flops, nbytes = program_work(mega.program)
    s = mega.schedule
    return ManyKernelsTiming(mega.program.name, medians["megakernel"], medians["graph_of_kernels"],
                             len(many.kernel.entries), len(s.stages), int(s.num_barriers), worst,
                             speed_of_light_us(flops, nbytes), samples)
