"""Running a training loop in one cooperative launch on the GPU: :class:`LoopRunner` and :class:`LoopRun`.

A :class:`LoopRunner` holds the compiled loop kernel (:mod:`tkx.codegen.loop`), its device loop words,
its sync/status words and the mapped host words the kernel publishes to. :meth:`LoopRunner.start`
launches K steps on PyTorch's current stream and returns a :class:`LoopRun` at once; the run's
:meth:`~LoopRun.wait` polls the mapped words (never the stream: the kernel is not slowed) to update a
progress display, then synchronises, checks the kernel's status and returns a :class:`LoopResult`.
Every wait has a limit: the kernel's own barriers give up after ``Options.spin_limit`` polls, and
the host asks the kernel to stop when ``timeout`` passes and raises if it does not finish after that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..codegen.loop import LIVE_STOP, LOOP_CYCLE, LOOP_FIRST, LOOP_RAN, LOOP_STEPS, LOOP_WORDS
from ..errors import TkxError
from . import status as _status
from .live import MappedWords, NoDisplay, Snapshot, progress_display
from .runner import CompiledRunner, _bump_versions, _stream_handle, pack_args

#: Seconds between two reads of the mapped words while a launch is in flight.
POLL_SECONDS = 0.05
#: Seconds the host waits for the kernel to honour a stop request (after ``timeout``) before raising.
STOP_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class LoopResult:
    """What a training loop returns.

    ``losses``: the loss of every step that ran (a 1-D tensor of the loss dtype, on the step's
    device); ``steps``: how many steps ran (fewer than ``requested`` after a stop); ``stopped``: a
    stop was requested (button, :meth:`LoopRun.stop`, Ctrl-C or ``timeout``) and the loop ended
    early at a step boundary; ``seconds``: wall time from launch to the end of the wait; ``device``.
    """

    losses: torch.Tensor
    steps: int
    requested: int
    stopped: bool
    seconds: float
    device: str

    @property
    def final_loss(self) -> float:
        return float(self.losses[-1]) if self.steps else float("nan")

    def __repr__(self) -> str:
        return (f"<tkx.LoopResult {self.steps}/{self.requested} steps on {self.device}"
                f"{' (stopped)' if self.stopped else ''}, final loss {self.final_loss:.6g}, {self.seconds:.3f} s>")


class LoopRunner:
    """The compiled loop kernel of one step on one device.

    ``source``: the loop's :class:`~tkx.codegen.CudaSource` (``generate(..., loop=spec)``); ``spec``:
    its :class:`~tkx.codegen.loop.LoopSpec`. Raises what :class:`CompiledRunner` raises (no GPU,
    compile errors, resources).
    """

    def __init__(self, source: Any, spec: Any, *, device: Any = None, cache: bool | str = True) -> None:
        self.runner = CompiledRunner(source, device=device, cache=cache)
        self.spec = spec
        self.device = self.runner.device
        self.program = self.runner.program
        self.loop_words = torch.zeros(LOOP_WORDS, dtype=torch.int64, device=self.device)
        self.live = MappedWords(self.device)
        self.loss_index = spec.loss_output
        self._batch = spec.batch_inputs()
        self._lock = threading.Lock()

    @property
    def resources(self) -> Any:
        return self.runner.resources

    def check(self, flat: Sequence[torch.Tensor], batches: dict[int, torch.Tensor],
              order: torch.Tensor | None) -> int:
        """Check the flat inputs (a dataset's first row stands for its batch input) and return the cycle
        length; raises :class:`~tkx.runtime.inputs.InputMismatchError` or :class:`TkxError`."""
        rows = {int(t.shape[0]) for t in batches.values()}
        if len(rows) != 1:
            raise TkxError(f"the datasets have different numbers of rows: {sorted(rows)}")
        probe = [batches[i][0] if i in batches else t for i, t in enumerate(flat)]
        self.runner.check_inputs(probe)
        for i, t in batches.items():
            if int(t.stride(0)) != dict(self.spec.batches)[i]:
                raise TkxError(f"dataset for input {self.program.inputs[i].name} has row stride {t.stride(0)}, "
                               f"the kernel was generated for {dict(self.spec.batches)[i]}")
        if order is None:
            return rows.pop()
        return int(order.numel())

    def args(self, flat: Sequence[torch.Tensor], batches: dict[int, torch.Tensor], outs: Sequence[torch.Tensor],
             arena: torch.Tensor, losses: torch.Tensor, order: torch.Tensor | None, words: torch.Tensor,
             loop_words: torch.Tensor | None = None) -> list[int]:
        """The kernel's arguments: the datasets in place of their batch inputs, the loop's own pointers
        (``loop_words``: the device loop words, by default the runner's own)."""
        loop_words = self.loop_words if loop_words is None else loop_words
        ins = [batches[i].data_ptr() if i in batches else t.data_ptr() for i, t in enumerate(flat)]
        sync, status = _status.word_pointers(words)
        r = self.runner
        maps = r.tensor_maps.buffer(ins, [t.data_ptr() for t in outs], arena.data_ptr()).data_ptr() \
            if r.tensor_maps else 0
        return pack_args(r.params, ins, [t.data_ptr() for t in outs], arena.data_ptr(), sync, status,
                         tensormaps=maps, loop={"losses": losses.data_ptr(), "loop": loop_words.data_ptr(),
                                                "live": self.live.device_address,
                                                "order": 0 if order is None else order.data_ptr()})

    def capture_graph(self, flat: Sequence[torch.Tensor], batches: dict[int, torch.Tensor], steps: int, *,
                      order: torch.Tensor | None = None) -> LoopGraph:
        """One launch of ``steps`` steps captured in a CUDA graph (:class:`LoopGraph`); arguments as for
        :meth:`start`. Capturing runs nothing: the state is unchanged until the first replay."""
        return LoopGraph(self, flat, batches, steps, order)

    def start(self, flat: Sequence[torch.Tensor], batches: dict[int, torch.Tensor], steps: int, *,
              order: torch.Tensor | None = None, first: int | None = 0, progress: Any = False,
              title: str = "training", timeout: float | None = None) -> LoopRun:
        """Launch ``steps`` steps on the current stream and return the in-flight :class:`LoopRun`.

        ``flat``: the step's flat inputs (batch inputs: anything, they come from ``batches``, program
        input index -> dataset tensor ``[N, *batch]``); ``order``: int64 permutation of the dataset rows
        (step k reads row ``order[k % len(order)]``), on the device; ``first``: the dataset position of
        the first step (``None``: continue where the previous launch stopped); ``progress``: see
        :func:`tkx.runtime.live.progress_display`. Raises :class:`TkxError` if a run is still in flight.
        """
        steps = int(steps)
        if steps < 0:
            raise ValueError("steps must be >= 0")
        if not self._lock.acquire(blocking=False):
            raise TkxError("this training loop is already running: wait for it (run.wait()) first")
        try:
            if order is not None:
                check_order(order, next(iter(batches.values())).shape[0], self.device)
            cycle = self.check(flat, batches, order)
            outs = self.runner.allocate_outputs()
            arena = self.runner.new_arena()
            dtype = outs[self.loss_index].dtype
            losses = torch.full((max(1, steps),), float("nan"), dtype=dtype, device=self.device)
            host = torch.tensor([steps, cycle], dtype=torch.int64)
            self.loop_words[LOOP_STEPS:LOOP_CYCLE + 1].copy_(host)
            if first is not None:
                self.loop_words[LOOP_FIRST].fill_(int(first))
            self.live.clear()
            args = self.args(flat, batches, outs, arena, losses, order, self.runner._words)
            display = progress_display(progress, steps, title, self.live.request_stop)
            t0 = time.perf_counter()
            with torch.cuda.device(self.device):
                self.runner.kernel.launch(args, _stream_handle(self.device))
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(self.device))
        except BaseException:
            self._lock.release()
            raise
        return LoopRun(self, flat, batches, steps, losses, (outs, arena), done, display, t0, timeout)


def check_order(order: Any, rows: int, device: torch.device) -> None:
    """Refuse an ``order`` the loop cannot follow: it must be a contiguous 1-D int64 tensor on ``device``
    holding at least one row index in ``[0, rows)`` (repeats allowed). Raises :class:`TkxError` saying
    which of these it is not."""
    if not isinstance(order, torch.Tensor):
        raise TkxError(f"order must be a 1-D int64 tensor of dataset rows, got {type(order).__name__}: pass "
                       f"torch.tensor(rows, dtype=torch.int64, device='{device}')")
    if order.dtype != torch.int64 or order.dim() != 1 or order.device != device or not order.is_contiguous():
        raise TkxError(f"order must be a contiguous 1-D int64 tensor on {device}, got {order.dtype} "
                       f"{list(order.shape)} on {order.device}: pass order.to({str(device)!r}, torch.int64)"
                       ".flatten().contiguous() if it holds row indices")
    if order.numel() == 0:
        raise TkxError("order is empty: give at least one dataset row")
    lo, hi = int(order.min()), int(order.max())
    if lo < 0 or hi >= rows:
        raise TkxError(f"order holds row {lo if lo < 0 else hi}, outside the dataset's {rows} rows [0, {rows})")


class LoopRun:
    """A training loop in flight. :meth:`poll` reads the published progress without waiting,
    :meth:`stop` asks the kernel to stop at a step boundary, :meth:`wait` updates the display
    until the launch ends and returns the :class:`LoopResult` (raising the kernel's
    :class:`~tkx.runtime.status.KernelError` if it reported one)."""

    def __init__(self, loop: LoopRunner, flat: Sequence[torch.Tensor], batches: dict[int, torch.Tensor],
                 steps: int, losses: torch.Tensor, keep: Any, done: Any, display: Any, t0: float,
                 timeout: float | None) -> None:
        self.loop, self.flat, self.batches, self.steps = loop, list(flat), batches, steps
        self.losses, self._keep, self._done, self.display = losses, keep, done, display
        self._t0, self.timeout = t0, timeout
        self.result: LoopResult | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        #: Called once the launch has ended (also after an error), in the thread that watched it.
        self.after: list[Any] = []

    def poll(self) -> Snapshot:
        """The progress the kernel has published (steps done, latest loss), read from mapped memory."""
        return self.loop.live.read()

    def stop(self) -> None:
        """Ask the kernel to stop: it leaves the loop at a step boundary, after the step it is running or the
        one after (:mod:`tkx.codegen.loop`), with the state of that many whole steps."""
        self.loop.live.request_stop()

    def running(self) -> bool:
        return self.result is None and self._error is None and not self._done.query()

    def wait(self) -> LoopResult:
        """Show the progress until the launch ends, then synchronise and return the :class:`LoopResult`.
        Ctrl-C asks the kernel to stop and keeps waiting for it; ``timeout`` (seconds) does the same,
        and :class:`TkxError` is raised if the kernel has not ended :data:`STOP_GRACE_SECONDS` later."""
        if self._thread is not None:
            self._thread.join()
        if self.result is None and self._error is None:
            self._watch()
        if self._error is not None:
            raise self._error
        assert self.result is not None
        return self.result

    def in_background(self) -> LoopRun:
        """Watch from a thread (the caller returns at once; a notebook's stop button then works);
        :meth:`wait` joins it."""
        self._thread = threading.Thread(target=self._watch, name="tkx-training-loop", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        try:
            self.result = self._follow()
        except BaseException as exc:  # handed to wait(), which raises it in the caller's thread
            self._error = exc
        finally:
            if self.loop._lock.locked():
                self.loop._lock.release()
            for fn in self.after:
                try:
                    fn()
                except BaseException as exc:  # pragma: no cover - a failing write-back
                    self._error = self._error or exc

    def _follow(self) -> LoopResult:
        deadline = None if self.timeout is None else self._t0 + float(self.timeout)
        stop_deadline = None
        while True:
            try:  # Ctrl-C anywhere in here asks the kernel to stop and keeps waiting for it
                if self._done.query():
                    break
                self.display.update(self.poll())
                time.sleep(POLL_SECONDS)
            except KeyboardInterrupt:
                self.stop()
                stop_deadline = time.perf_counter() + STOP_GRACE_SECONDS
                continue
            now = time.perf_counter()
            if deadline is not None and now > deadline and stop_deadline is None:
                self.stop()
                stop_deadline = now + STOP_GRACE_SECONDS
            if stop_deadline is not None and now > stop_deadline:
                self.display.close(self.poll(), "not stopping")
                raise TkxError(f"the training loop kernel has not ended {STOP_GRACE_SECONDS:.0f} s after it was "
                               f"asked to stop ({self.poll().done} of {self.steps} steps published); the GPU may "
                               "be hung: check another process is not holding its SMs")
        torch.cuda.synchronize(self.loop.device)
        seconds = time.perf_counter() - self._t0
        error = _status.read_and_clear(self.loop.runner._words, self.loop.runner.schedule,
                                       self.loop.runner.launch_description())
        if error is not None:
            self.display.close(self.poll(), "kernel error")
            raise error
        ran = int(self.loop.loop_words[LOOP_RAN])
        mutated = set(self.loop.runner._mutated) | {i for i, _ in self.loop.spec.carry}
        _bump_versions([self.flat[i] for i in sorted(mutated)])
        losses = self.losses[:ran]
        if not isinstance(self.display, NoDisplay):
            self.display.close(self.poll(), "stopped" if ran < self.steps else "done", losses.float().cpu().tolist())
        return LoopResult(losses, ran, self.steps, ran < self.steps, seconds, str(self.loop.device))


class LoopGraph:
    """One launch of ``steps`` loop steps captured in a :class:`torch.cuda.CUDAGraph`
    (:meth:`LoopRunner.capture_graph`).

    :meth:`replay` runs the steps again on the same tensors (the state goes on from where it is; the
    datasets are read on from the position the last launch reached); ``losses`` holds the last
    replay's losses. It has its own outputs, arena, losses and sync/status words; :meth:`check_status`
    synchronises and raises the kernel's :class:`~tkx.runtime.status.KernelError` if a replay reported one.
    """

    def __init__(self, loop: LoopRunner, flat: Sequence[torch.Tensor], batches: dict[int, torch.Tensor],
                 steps: int, order: torch.Tensor | None = None) -> None:
        self.loop, self.steps = loop, int(steps)
        self.flat, self.batches = list(flat), dict(batches)
        if order is not None:
            check_order(order, next(iter(self.batches.values())).shape[0], loop.device)
        cycle = loop.check(self.flat, self.batches, order)
        self.order = order
        runner = loop.runner
        self.outputs = runner.allocate_outputs()
        self.arena = runner.new_arena()
        self.losses = torch.full((max(1, self.steps),), float("nan"), dtype=self.outputs[loop.loss_index].dtype,
                                 device=loop.device)
        self._words = _status.new_words(loop.device, _status.words_of(runner.source))
        #: The graph's own loop words: its step count stays fixed whatever other launches of the runner ask for.
        self.loop_words = torch.zeros(LOOP_WORDS, dtype=torch.int64, device=loop.device)
        self.loop_words[LOOP_STEPS:LOOP_CYCLE + 1].copy_(torch.tensor([self.steps, cycle], dtype=torch.int64))
        loop.live.clear()
        args = loop.args(self.flat, self.batches, self.outputs, self.arena, self.losses, order, self._words,
                         self.loop_words)
        torch.cuda.synchronize(loop.device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(loop.device), torch.cuda.graph(self.graph):
            runner.kernel.launch(args, _stream_handle(loop.device))
        torch.cuda.synchronize(loop.device)

    def replay(self) -> torch.Tensor:
        """Replay the captured launch on the current stream (no wait); returns ``losses`` (filled once it ends)."""
        self.loop.live.words[LIVE_STOP] = 0  # no stop request left over from an earlier run
        self.graph.replay()
        return self.losses

    def check_status(self) -> None:
        error = _status.read_and_clear(self._words, self.loop.runner.schedule, self.loop.runner.launch_description(),
                                       synchronize=True)
        if error is not None:
            raise error

    @property
    def steps_run(self) -> int:
        """Steps the last launch ran (waits for the GPU)."""
        torch.cuda.synchronize(self.loop.device)
        return int(self.loop_words[LOOP_RAN])
