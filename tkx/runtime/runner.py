"""Running a compiled step: :class:`CompiledRunner`, :class:`GraphRunner` and :func:`build`.

A :class:`CompiledRunner` is called like the user's step (same pytrees in, same pytrees out).
Per call it checks the inputs against the compiled layouts, allocates the outputs and the
workspace arena from PyTorch's caching allocator, launches the kernel on PyTorch's current
stream (so ``torch.cuda.graph`` captures it) and, with ``check=True`` (default), waits for it
and raises :class:`~tkx.runtime.status.KernelError` if the kernel reported an error. In-place
state updates land in the user's tensors (the kernel writes them), as eager does.

A runner owns one set of sync/status words; launches on one stream are ordered, so calls on
one stream may follow each other freely. Do not run one runner on two streams at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import TkxError
from ..random import next_state
from . import inputs as _inputs
from . import ranges as _ranges
from . import status as _status
from . import tma as _tma
from .backends import compile
from .device import require_cuda
from .kernel import arena_bytes_of, kernel_name, launch_contract, source_options, source_program


def _stream_handle(device: torch.device) -> int:
    return int(torch.cuda.current_stream(device).cuda_stream)


def _capturing(device: torch.device) -> bool:
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except RuntimeError:  # pragma: no cover - no CUDA
        return False


def _bump_versions(tensors: Sequence[torch.Tensor]) -> None:
    """Tell autograd that the kernel wrote these tensors (as an in-place op would)."""
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is None or not tensors:
        return
    for t in tensors:
        try:
            bump(t)
        except RuntimeError:  # inference tensors carry no version counter
            pass


class CompiledRunner:
    """A compiled training step, callable like the original.

    Build it with :func:`build` (from a step function) or ``CompiledRunner(source)`` (from a
    :class:`~tkx.codegen.CudaSource`; then :meth:`verify` has no eager step to compare with
    unless ``step_fn`` is given).

    Attributes: ``source``, ``program`` (the optimised :class:`tkx.Program`), ``schedule``,
    ``options``, ``device``, ``kernel`` (:class:`~tkx.runtime.kernel.CompiledKernel` or
    :class:`~tkx.runtime.extension.ExtensionKernel`), ``step_fn``, ``resources``.

    Raises :class:`~tkx.runtime.device.NoDeviceError` without a GPU.
    """

    def __init__(self, source: Any, *, device: Any = None, step_fn: Callable[..., Any] | None = None,
                 backend: str | None = None, cache: bool | str = True) -> None:
        self.device = require_cuda(device)
        self.source = source
        self.program = source_program(source)
        self.schedule = source.schedule
        self.options = source_options(source)
        self.step_fn = step_fn
        self.params = list(launch_contract(source).params)
        self.arena_bytes = arena_bytes_of(source)
        self.kernel = self._load(source, backend, cache)
        self._words = _status.new_words(self.device, _status.words_of(source))
        specs = getattr(launch_contract(source), "tensor_maps", ())
        #: The TMA tensor maps of the kernel's bulk tensor copies (``None`` when it makes none).
        self.tensor_maps = _tma.TensorMaps(specs, self.device) if specs else None
        self._timeline: torch.Tensor | None = None
        if getattr(source, "timeline_tasks", 0):
            self.timeline_buffer()
        self._mutated = sorted({u.input_index for u in self.program.updates} |
                               {i for i, s in enumerate(self.program.inputs) if s.mutated})
        self.timings: dict[str, float] = {}
        #: The :class:`~tkx.runtime.verify.Verification` of the last :meth:`verify` call (``None`` before).
        self.last_verification: Any = None

    def _load(self, source: Any, backend: str | None, cache: bool | str) -> Any:
        """Compile and load ``source`` on ``self.device`` (:func:`tkx.runtime.compile`)."""
        return compile(source, self.device, backend=backend, cache=cache)

    # -- facts ------------------------------------------------------------------------------
    @property
    def resources(self) -> Any:
        """:class:`~tkx.runtime.kernel.Resources`: registers, shared/local bytes, occupancy,
        grid, block, arena bytes, compile seconds (cold) and whether the cache was hit."""
        return self.kernel.resources

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.program.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.program.outputs]

    def launch_description(self) -> str:
        k = self.kernel
        return (f"grid {k.grid} x {k.block} threads ({k.mode} mode, occupancy {k.occupancy}/SM x "
                f"{k.sm_count} SMs), {k.registers} registers, arena {self.arena_bytes} B")

    def __repr__(self) -> str:
        return f"<tkx.CompiledRunner {self.program.name}: {self.launch_description()}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from .. import display

        return display.mimebundle(self, include, exclude)

    # -- building blocks ---------------------------------------------------------------------
    def flatten(self, args: Sequence[Any]) -> list[Any]:
        """The flat inputs of ``args`` (the step's positional arguments); raises
        :class:`~tkx.runtime.inputs.InputMismatchError` if the pytree structure differs."""
        return _inputs.flatten_args(self.program, args)

    def check_inputs(self, flat: Sequence[Any]) -> None:
        """Raise :class:`~tkx.runtime.inputs.InputMismatchError` naming the first input whose
        device, dtype, shape or strides differ from the compiled ones."""
        _inputs.check_inputs(self.program.inputs, flat, self.device)

    def allocate_outputs(self) -> list[torch.Tensor]:
        """Fresh (uninitialised) output tensors, flat, in ``program.outputs`` order."""
        return _inputs.allocate_outputs(self.program, self.device)

    def new_arena(self) -> torch.Tensor:
        """A workspace of ``arena_bytes`` bytes (at least 256) from PyTorch's caching allocator."""
        return torch.empty(max(256, self.arena_bytes), dtype=torch.uint8, device=self.device)

    def kernel_args(self, flat: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], arena: torch.Tensor,
                    words: torch.Tensor) -> list[int]:
        """The kernel's arguments (device addresses) in ABI order (:mod:`tkx.codegen.abi`)."""
        sync, status = _status.word_pointers(words)
        ins, outp = [t.data_ptr() for t in flat], [t.data_ptr() for t in outs]
        maps = self.tensor_maps.buffer(ins, outp, arena.data_ptr()).data_ptr() if self.tensor_maps else 0
        return pack_args(self.params, ins, outp, arena.data_ptr(), sync, status,
                         timeline=self.timeline_buffer().data_ptr()
                         if getattr(self.source, "timeline_tasks", 0) else 0, tensormaps=maps)

    def timeline_buffer(self) -> torch.Tensor:
        """The device buffer the kernel records its per-task timeline in (``Options(timeline=True)``):
        int64 ``[tasks, 4]`` (``block << 32 | task``, start ns, end ns, wait ns), rewritten by each launch."""
        if getattr(self, "_timeline", None) is None:
            n = max(1, int(getattr(self.source, "timeline_tasks", 0)))
            self._timeline = torch.zeros((n, 4), dtype=torch.int64, device=self.device)
        return self._timeline

    def timeline(self) -> Any:
        """The :class:`tkx.dataflow.timeline.Timeline` of the last launch (waits for the GPU).
        Raises :class:`TkxError` unless compiled with ``Options(timeline=True)``."""
        if not getattr(self.source, "timeline_tasks", 0):
            raise TkxError("this kernel records no timeline: compile with Options(timeline=True)")
        from ..dataflow.timeline import Timeline

        torch.cuda.synchronize(self.device)
        return Timeline.from_records(self.source.dag, self.timeline_buffer().cpu().tolist(),
                                     kernel=kernel_name(self.source))

    def timeline_vs_predicted(self) -> Any:
        """The last launch's measured :meth:`timeline` beside the cost model's prediction for the same kernel
        on the grid it launched with (:class:`tkx.dataflow.timeline.TimelineComparison`: both charts on one
        time scale, per group the predicted and measured µs and the error). Raises :class:`TkxError` unless
        compiled with ``Options(timeline=True)``."""
        from ..dataflow.timeline import predicted_timeline

        measured = self.timeline()
        return predicted_timeline(self.source, blocks=int(self.kernel.grid)).compare(measured)

    def launch(self, flat: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], arena: torch.Tensor,
               words: torch.Tensor | None = None) -> None:
        """Launch once on the current stream with already checked tensors (no checks, no sync). Inside a
        range named :meth:`range_name` ``("launch")`` while a profiler listens (:mod:`tkx.runtime.ranges`)."""
        if _ranges.listening():
            with _ranges.annotate(self.range_name("launch")):
                self._launch(flat, outs, arena, words)
        else:
            self._launch(flat, outs, arena, words)

    def range_name(self, what: str) -> str:
        """The NVTX / profiler range name of ``what`` (``"launch"``, ``"graph replay"``) of this step:
        ``"tkx <program> <what> [options that differ from the defaults]"``."""
        return _ranges.range_name(self.program.name, what, self.options)

    def _launch(self, flat: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], arena: torch.Tensor,
                words: torch.Tensor | None) -> None:
        args = self.kernel_args(flat, outs, arena, self._words if words is None else words)
        if torch.cuda.current_device() != self.device.index:
            with torch.cuda.device(self.device):
                self.kernel.launch(args, _stream_handle(self.device))
        else:
            self.kernel.launch(args, _stream_handle(self.device))

    def run_flat(self, flat: Sequence[Any], *, out: Any = None, arena: torch.Tensor | None = None,
                 check: bool = True) -> list[torch.Tensor]:
        """Run on flat inputs (``program.inputs`` order); returns the flat outputs."""
        self.check_inputs(flat)
        outs = (_inputs.check_outputs(self.program, out, self.device, flat) if out is not None
                else self.allocate_outputs())
        if arena is None:
            arena = self.new_arena()
        elif arena.numel() < self.arena_bytes or arena.device != self.device:
            raise TkxError(f"arena= needs {self.arena_bytes} bytes on {self.device}")
        self.launch(flat, outs, arena)
        _bump_versions([flat[i] for i in self._mutated])
        if check and not _capturing(self.device):
            self.check_status(synchronize=False)
        return outs

    # -- the public call ---------------------------------------------------------------------
    def __call__(self, *args: Any, out: Any = None, check: bool = True) -> Any:
        """Run one step: ``runner(*args)`` takes and returns what ``step_fn(*args)`` does.

        ``out``: preallocated outputs (flat list or the output pytree) to write into.
        ``check``: wait for the kernel and raise :class:`~tkx.runtime.status.KernelError` if it
        reported an error (skipped automatically while a CUDA graph is being captured).
        Raises :class:`~tkx.runtime.inputs.InputMismatchError` for arguments that do not fit.
        """
        flat = self.flatten(args)
        outs = self.run_flat(flat, out=out, check=check)
        return _inputs.unflatten_outputs(self.program, outs)

    def status_words(self) -> list[int]:
        """The sync and status words as ints, after waiting for the device: the barrier state, the epoch,
        the error words, the counters and any audit words (:mod:`tkx.runtime.status`,
        :mod:`tkx.dataflow.audit`). Reading them clears nothing."""
        torch.cuda.synchronize(self.device)
        return [int(x) for x in self._words.cpu().tolist()]

    def check_status(self, *, synchronize: bool = True) -> None:
        """Raise :class:`~tkx.runtime.status.KernelError` if a launch since the last check
        reported an error (the words are then cleared). ``synchronize`` waits for the whole
        device first (use it after graph replays or launches on other streams)."""
        error = _status.read_and_clear(self._words, self.schedule, self.launch_description(),
                                       synchronize=synchronize)
        if error is not None:
            raise error

    # -- graphs and checks -------------------------------------------------------------------
    def capture_graph(self, *args: Any, warmup: int = 3) -> GraphRunner:
        """Capture one launch on ``args`` in a :class:`torch.cuda.CUDAGraph`; see :class:`GraphRunner`.

        Warms up ``warmup`` times on a side stream, then captures. Every input the step
        updates in place is snapshotted first and restored after the warm-up and after the
        capture, so the user's state is unchanged by capturing. Raises
        :class:`~tkx.runtime.status.KernelError` if a warm-up launch reported an error.
        """
        return GraphRunner(self, args, warmup=warmup)

    def verify(self, seeds: Sequence[int] = (0, 1), make_inputs: Callable[..., Any] | None = None, *,
               strict: bool = False, int_high: int | None = None, tolerances: dict[str, float] | None = None,
               fp64: bool = True) -> Any:
        """Compare the kernel with eager ``step_fn`` and with :func:`tkx.reference.run`.

        For each seed: inputs from ``make_inputs(seed)`` (``device=`` passed when accepted)
        or random ones shaped like the compiled inputs (normal floats; integers in the range
        the step accepts: the classes or rows they index, else ``[0, int_high)``, else the
        example inputs' range, see :func:`~tkx.runtime.verify.integer_ranges`; masks, bool or
        holding ``-inf``, are the example inputs' own, so a padding mask that leaves an attention
        row without keys is verified as the step will meet it); outputs and
        workspace are poisoned with NaN before the launch. Integer inputs outside that range
        (from ``make_inputs``) raise :class:`~tkx.runtime.verify.InputRangeError` before
        anything runs on the GPU, since eager would trip a device-side assert.
        Every output and in-place updated input is compared (relative error; float32
        ``<= 1e-5``, bf16/fp16 ``<= 2e-2``, or ``tolerances`` by dtype name), and inputs the
        step must not change are checked bit for bit. A floating value outside the tolerance
        still passes when a float64 run of the reference shows eager is the less accurate
        side (its error against float64 within ``max(tolerance, 2 x eager's)``; ``fp64=False``
        turns the arbitration off); the report names the closer side, errors and ULPs.

        Returns a :class:`~tkx.runtime.verify.Verification`; raises nothing on a mismatch
        unless ``strict=True`` (:class:`~tkx.runtime.verify.VerificationError`).
        """
        from .verify import VerificationError, verify

        try:
            result = verify(self, seeds, make_inputs, strict=strict, int_high=int_high, tolerances=tolerances,
                            fp64=fp64)
        except VerificationError as exc:
            self.last_verification = exc.verification
            raise
        self.last_verification = result
        return result


def pack_args(params: Sequence[Any], inputs: Sequence[int], outputs: Sequence[int], arena: int, sync: int,
              status: int, *, timeline: int = 0, tensormaps: int = 0, loop: dict[str, int] | None = None) -> list[int]:
    """Order the addresses as the kernel's parameters (``abi.Param`` roles) ask. ``loop``: the addresses of a
    training-loop kernel's own parameters by role (``losses``, ``loop``, ``live``, ``order``; ``order`` may be 0).

    Raises :class:`TkxError` for an unknown role or an index out of range (a code generator
    and runtime out of step).
    """
    args = []
    for p in params:
        role = p.role
        if role == "input":
            pool = inputs
        elif role == "output":
            pool = outputs
        elif role == "arena":
            args.append(arena)
            continue
        elif role == "sync":
            args.append(sync)
            continue
        elif role == "status":
            args.append(status)
            continue
        elif role == "timeline":
            if not timeline:
                raise TkxError(f"kernel parameter {p.name} wants a timeline buffer, but none was given")
            args.append(timeline)
            continue
        elif role == "tensormaps":
            if not tensormaps:
                raise TkxError(f"kernel parameter {p.name} wants the TMA tensor maps, but none were given")
            args.append(tensormaps)
            continue
        elif loop is not None and role in loop:
            args.append(int(loop[role]))
            continue
        else:
            raise TkxError(f"kernel parameter {p.name} has role {role!r}, which this runtime does not know")
        if not 0 <= p.index < len(pool):
            raise TkxError(f"kernel parameter {p.name} refers to {role} {p.index}, but there are {len(pool)}")
        args.append(pool[p.index])
    return args


class GraphRunner:
    """One launch of a :class:`CompiledRunner` captured in a CUDA graph.

    ``replay()`` re-runs the step on the *same* tensors (the ones given to
    :meth:`CompiledRunner.capture_graph`: copy new data into ``inputs`` to change them), writes
    the in-place updates into them and returns the outputs (static tensors, overwritten by
    each replay). It has its own outputs, arena and sync/status words; it does not check the
    status (that would synchronise): call :meth:`check_status` when convenient.

    Attributes: ``runner``, ``graph`` (:class:`torch.cuda.CUDAGraph`), ``args`` (the pytree
    captured with), ``inputs`` (flat), ``outputs`` (flat), ``capture_seconds``.
    """

    def __init__(self, runner: CompiledRunner, args: Sequence[Any], *, warmup: int = 3) -> None:
        if int(warmup) < 0:
            raise ValueError("warmup must be >= 0")
        self.runner = runner
        self.args = tuple(args)
        device = runner.device
        flat = runner.flatten(self.args)
        runner.check_inputs(flat)
        self.inputs = flat
        self.outputs = runner.allocate_outputs()
        self.arena = runner.new_arena()
        self._words = _status.new_words(device, _status.words_of(runner.source))
        start = time.perf_counter()
        with torch.cuda.device(device):
            mutated = [i for i in runner._mutated]
            snapshot = {i: flat[i].clone() for i in mutated}
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(int(warmup)):
                    runner.launch(flat, self.outputs, self.arena, self._words)
            current.wait_stream(side)
            self._restore(snapshot)
            torch.cuda.synchronize(device)
            self.check_status(synchronize=False)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph):
                    runner.launch(flat, self.outputs, self.arena, self._words)
                # the graph's kernel reads these tensor maps: keep them as long as the graph
                self._tensor_maps = (runner.tensor_maps.buffer([t.data_ptr() for t in flat],
                                                               [t.data_ptr() for t in self.outputs],
                                                               self.arena.data_ptr())
                                     if runner.tensor_maps else None)
            finally:
                self._restore(snapshot)
                torch.cuda.synchronize(device)
        self.capture_seconds = time.perf_counter() - start

    def _restore(self, snapshot: dict[int, torch.Tensor]) -> None:
        with torch.no_grad():  # an input may be an nn.Parameter (requires_grad)
            for i, saved in snapshot.items():
                self.inputs[i].copy_(saved)

    def replay(self) -> Any:
        """Replay the step on the current stream; returns the outputs in the step's pytree. Inside a range
        named ``runner.range_name("graph replay")`` while a profiler listens (:mod:`tkx.runtime.ranges`). A
        step that draws random numbers gets a fresh Philox state first (:func:`tkx.random.next_state`)."""
        rng = self.runner.program.rng_input
        if rng is not None:
            self.inputs[rng].copy_(next_state(), non_blocking=True)
        if _ranges.listening():
            with _ranges.annotate(self.runner.range_name("graph replay")):
                self.graph.replay()
        else:
            self.graph.replay()
        _bump_versions([self.inputs[i] for i in self.runner._mutated])
        return _inputs.unflatten_outputs(self.runner.program, self.outputs)

    def check_status(self, *, synchronize: bool = True) -> None:
        """Raise :class:`~tkx.runtime.status.KernelError` if a replay reported an error."""
        error = _status.read_and_clear(self._words, self.runner.schedule, self.runner.launch_description(),
                                       synchronize=synchronize)
        if error is not None:
            raise error

    def __repr__(self) -> str:
        return f"<tkx.GraphRunner {self.runner.program.name}: {self.runner.launch_description()}>"
