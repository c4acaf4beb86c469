"""``tkx.training_loop``: K optimizer steps in one launch of the megakernel, with a live loss curve.

::

    X, Y = datasets                          # [N, batch, ...] tensors on the GPU
    result = tkx.training_loop(step, (params, momentum, X[0], Y[0]), (X, Y), steps=1000)
    result.losses                            # [1000]: the loss of every step
    # params and momentum now hold the state after 1000 steps

**Binding.** ``inputs`` are the step's positional arguments, as for :func:`tkx.capture`; the last
``len(batches)`` of them are the batch arguments, each one tensor: ``batches[b]`` is a dataset tensor
``[N, *shape of that argument]`` (same dtype and device), and step ``k`` reads row ``k % N`` of every
dataset (or row ``order[k % len(order)]`` with ``order=``, an int64 permutation). The arguments
before them are the state:

* a step that updates its state in place (``p.sub_(lr * g)``, ``torch.optim`` with ``state=(model,
  opt)``) keeps updating the same tensors, step after step;
* a functional step returns ``(loss, *new_state)``: the outputs other than the loss, flattened, are
  the new values of the leading state arguments, flattened, in order (same shapes and dtypes), and
  become the next step's arguments. The loop writes the final state back into the argument tensors.
  Outputs after the new state (``(loss, new_params, accuracy)``) are results of each step: computed,
  not carried and not kept (only the losses are). ``carry=False`` treats every output other than the
  loss that way: nothing carries from one step to the next but what the step updates in place.

**Where it runs.** CUDA tensors: one cooperative launch of the loop kernel
(:mod:`tkx.codegen.loop`, :class:`tkx.runtime.loop.LoopRunner`): a grid barrier between steps,
every loss written to ``losses[k]``, the step count and latest loss published to mapped host memory
for the progress display, a stop flag polled at step boundaries. CPU tensors: the same K steps
through the schedule interpreter (:mod:`tkx.schedule.interpreter`), the check that needs no GPU.

:func:`eager_training_loop` runs the user's own step K times eagerly on copies: the reference the
tests and ``scripts/multistep-bench`` compare with.

**Limits.** Hyperparameters stay fixed for the K steps (an LR scheduler steps between calls: the next
call reads the new learning rate); a step that draws random numbers (dropout) is refused, as are
``Options(timeline=True)`` and the protocol audit (both describe one launch of one step); the loop
kernel synchronises with grid barriers whatever ``Options.sync`` says. A stop request ends the loop
at a step boundary, after the step running when the kernel sees it or the one after.
"""

from __future__ import annotations

import contextlib
import operator
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .errors import TkxError, UnsupportedError
from .options import OptionsError, as_options


@dataclass(frozen=True)
class Binding:
    """Which flat program inputs a training loop feeds from datasets and which outputs it carries.

    ``batch_inputs``: flat input index per dataset (in ``batches`` order); ``carry``: ``(input index,
    output index)`` pairs; ``loss``: the flat output index of the loss; ``lifted``: how many flat inputs
    come before the step's own arguments (the lifted module/optimizer tensors of a stateful step)."""

    batch_inputs: tuple[int, ...]
    carry: tuple[tuple[int, int], ...]
    loss: int
    lifted: int


def bind(program: Any, loss_index: int | None, args: Sequence[Any], batches: Sequence[torch.Tensor], *,
         lifted: int = 0, carry: bool | None = None, stateful: bool = False) -> Binding:
    """The :class:`Binding` of ``batches`` to the trailing arguments of ``args``; raises
    :class:`tkx.UnsupportedError` naming the argument that does not fit."""
    if loss_index is None:
        raise UnsupportedError("training-loop", f"{program.name} returns no 0-d float loss",
                               hint="return the loss (first 0-d float output) or pass loss=INDEX")
    if not batches:
        raise UnsupportedError("training-loop", "batches is empty", hint="pass one dataset tensor per batch argument")
    if len(batches) > len(args):
        raise UnsupportedError("training-loop", f"{len(batches)} datasets for a step of {len(args)} arguments",
                               hint="the datasets feed the last arguments of the step, one each")
    counts = [len(tree_flatten(a)[0]) for a in args]
    starts = [lifted + sum(counts[:i]) for i in range(len(args))]
    first = len(args) - len(batches)
    batch_inputs = []
    for b, (arg, data) in enumerate(zip(args[first:], batches)):
        pos = first + b
        if not isinstance(arg, torch.Tensor) or not isinstance(data, torch.Tensor):
            raise UnsupportedError("training-loop", f"argument {pos} is fed from batches[{b}] but is not one tensor",
                                   hint="a batch argument is one tensor; its dataset has one more leading dimension")
        if data.dim() != arg.dim() + 1 or tuple(data.shape[1:]) != tuple(arg.shape) or data.dtype != arg.dtype:
            raise UnsupportedError("training-loop", f"batches[{b}] is {data.dtype} {list(data.shape)}, argument {pos} "
                                   f"is {arg.dtype} {list(arg.shape)}",
                                   hint="a dataset is [N, *batch shape] of the batch argument's dtype")
        if data.device != arg.device:
            raise UnsupportedError("training-loop", f"batches[{b}] is on {data.device}, argument {pos} on {arg.device}",
                                   hint="put the datasets on the step's device")
        if data.shape[0] == 0:
            raise UnsupportedError("training-loop", f"batches[{b}] has no rows", hint="give at least one batch")
        batch_inputs.append(starts[pos])
    if len({int(d.shape[0]) for d in batches}) != 1:
        raise UnsupportedError("training-loop", f"the datasets have {[int(d.shape[0]) for d in batches]} rows",
                               hint="every dataset holds the same number of batches")
    pairs: list[tuple[int, int]] = []
    rest = [j for j in range(len(program.outputs)) if j != loss_index]
    if rest and carry is not False and not stateful:
        state_leaves = list(range(lifted, starts[first] if first < len(args) else lifted + sum(counts)))
        pairs = list(zip(state_leaves, rest))
        out_keys = _output_keys(program)
        if out_keys is not None:
            pairs = _pair_by_keys(pairs, _leaf_keys(tuple(args[:first])), [out_keys[j] for j in rest], program)
        bad = [(i, j) for i, j in pairs if program.inputs[i].value.shape != program.outputs[j].value.shape
               or program.inputs[i].value.dtype != program.outputs[j].value.dtype]
        if bad or not pairs:
            i, j = bad[0] if bad else (None, rest[0])
            what = (f"output {program.outputs[j].name} cannot become input {program.inputs[i].name}" if i is not None
                    else f"output {program.outputs[j].name} has no state argument to become")
            raise UnsupportedError("training-loop", what,
                                   hint="a functional step returns (loss, *new_state, *results) with the new state "
                                        "in the order, shapes and dtypes of its leading arguments; pass carry=False "
                                        "if none of its other outputs is state (the step then updates its state in "
                                        "place, or nothing carries from one step to the next)")
    return Binding(tuple(batch_inputs), tuple(pairs), int(loss_index), lifted)


def _leaf_keys(tree: Any) -> list[tuple[Any, ...]]:
    """The dict keys on the path to every leaf of ``tree``, in flattening order."""
    from torch.utils._pytree import MappingKey, tree_flatten_with_path

    return [tuple(k.key for k in path if isinstance(k, MappingKey)) for path, _ in tree_flatten_with_path(tree)[0]]


def _output_keys(program: Any) -> list[tuple[Any, ...]] | None:
    if program.out_tree is None:
        return None
    from torch.utils._pytree import tree_unflatten

    return _leaf_keys(tree_unflatten(list(range(len(program.outputs))), program.out_tree))


def _pair_by_keys(pairs: list[tuple[int, int]], in_keys: Sequence[tuple[Any, ...]],
                  out_keys: Sequence[tuple[Any, ...]], program: Any = None) -> list[tuple[int, int]]:
    """``(state leaf, output)`` pairs made by position, re-paired by dict key where the step returns its new
    state as dicts in another key order (``{"b": ..., "a": ...}`` for ``{"a": ..., "b": ...}``): leaf i takes
    the first unused output with its keys. ``in_keys``/``out_keys``: the dict keys of each state leaf and of
    each non-loss output, in pair order. Raises :class:`tkx.UnsupportedError` when both sides have keys that
    differ (``program`` names them; ``None``: a :class:`tkx.TkxError`)."""
    n = len(pairs)
    mine, theirs = list(in_keys[:n]), list(out_keys[:n])
    if mine == theirs or not any(theirs) or not any(mine):
        return pairs
    free = list(range(n))
    chosen = []
    for k in mine:
        hit = next((m for m in free if theirs[m] == k), None)
        if hit is None:
            i, j = pairs[len(chosen)]
            what = (f"output {program.outputs[j].name} cannot become input {program.inputs[i].name}: no returned "
                    f"state has the keys {list(k)}" if program is not None else f"no returned state has keys {list(k)}")
            raise UnsupportedError("training-loop", what, hint="return the new state with the keys of the state "
                                   "arguments, or pass carry=False if the outputs are results")
        free.remove(hit)
        chosen.append(hit)
    return [(pairs[a][0], pairs[b][1]) for a, b in enumerate(chosen)]


def _refuse_state_in_datasets(program: Any, binding: Binding, leaves: Sequence[Any],
                              batches: Sequence[torch.Tensor]) -> None:
    """Refuse state the steps write (in place or carried) that lives in a dataset's memory: a later step
    would read rows the loop has overwritten. Raises :class:`tkx.UnsupportedError` naming the argument."""
    written = {i for i, op in enumerate(program.inputs) if op.mutated} | {i for i, _ in binding.carry}
    for i in sorted(written - set(binding.batch_inputs)):
        t = leaves[i - binding.lifted] if 0 <= i - binding.lifted < len(leaves) else None
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        start, end = _byte_span(t)
        for b, data in enumerate(batches):
            lo, hi = _byte_span(data)
            if t.untyped_storage().data_ptr() == data.untyped_storage().data_ptr() and start < hi and lo < end:
                raise UnsupportedError("training-loop", f"input {program.inputs[i].name} is state the step writes "
                                       f"but lives in the memory of batches[{b}]",
                                       hint="clone the state (or the dataset) so that no step overwrites a batch")


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of ``t``'s storage that ``t`` can touch, ``[start, end)``."""
    size = t.element_size()
    start = t.storage_offset() * size
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1
    return start, start + extent * size


def _random_step(*programs: Any) -> UnsupportedError:
    """The error for a step that draws random numbers, naming the first op that reads the random state
    (its kind, FX node and the user's source line) when one is known."""
    for program in programs:
        if program.rng_input is None:
            continue
        state = program.inputs[program.rng_input].value.buffer
        for op in program.ops:
            if op.source is not None and any(x.buffer == state for x in op.tensor_inputs):
                return UnsupportedError("training-loop", f"{program.name} draws random numbers ({op.kind})",
                                        op=op.kind, node=op.fx_node, source=op.source, hint=_RANDOM_HINT)
    return UnsupportedError("training-loop", f"{programs[-1].name} draws random numbers (dropout, torch.rand)",
                            hint=_RANDOM_HINT)


_RANDOM_HINT = ("a training loop in one launch runs steps without random numbers: remove the dropout (or put "
                "the module in eval()), or run the step once per launch (tkx.runtime.build(step, inputs)) instead")


def _rows(order: torch.Tensor | None, data: torch.Tensor, steps: int, first: int = 0) -> Iterator[int]:
    """The dataset row of each of ``steps`` steps, one at a time (``data``: the first dataset); raises
    :class:`TkxError` at once for an ``order`` that is not a 1-D int64 tensor of rows of ``data`` on its
    device."""
    from .runtime.loop import check_order

    rows = int(data.shape[0])
    if order is None:
        return ((first + k) % rows for k in range(steps))
    check_order(order, rows, data.device)
    cyc = [int(x) for x in order.tolist()]
    return (cyc[(first + k) % len(cyc)] for k in range(steps))


def _count(steps: Any, what: str = "steps") -> int:
    """``steps`` (or the argument called ``what``) as a count; raises :class:`tkx.OptionsError` (a
    ValueError) for anything but a whole number >= 0."""
    try:
        n = operator.index(steps)  # an int, a numpy or 0-d integer tensor; not 2.5, not "3"
    except TypeError:
        n = None
    if n is None or isinstance(steps, bool) or n < 0:
        raise OptionsError(what, steps, "a whole number >= 0",
                           message=f"{what} must be a whole number >= 0, not {steps!r}")
    return n


class TrainingLoop:
    """A step compiled to run many times per launch (on the GPU) or per call (on the CPU).

    Arguments as for :func:`training_loop` (without ``steps``). :meth:`run` runs K steps. Attributes:
    ``exploration`` (:class:`tkx.Exploration` of the step), ``binding`` (:class:`Binding`), ``device``,
    ``runner`` (:class:`tkx.runtime.loop.LoopRunner` on a GPU, built on first use), ``source`` (the
    loop kernel's :class:`~tkx.codegen.CudaSource`, made without a GPU by :meth:`cuda`).
    """

    def __init__(self, step: Callable[..., Any], inputs: Sequence[Any], batches: Sequence[torch.Tensor], *,
                 state: Any = None, loss: int | None = None, carry: bool | None = None, options: Any = None,
                 name: str | None = None, **changes: Any) -> None:
        from .explore import Exploration

        if not isinstance(inputs, (tuple, list)):
            inputs = (inputs,)
        if isinstance(batches, torch.Tensor):
            batches = (batches,)
        self.inputs = tuple(inputs)
        batches = tuple(batches)
        for b, d in enumerate(batches):
            if not isinstance(d, torch.Tensor):
                raise UnsupportedError("training-loop", f"batches[{b}] is a {type(d).__name__}, not a tensor",
                                       hint="pass one dataset tensor [N, *batch shape] per batch argument, each "
                                            "batch argument one tensor (a list of batches: torch.stack(them))")
        self.batches = tuple(d.contiguous() for d in batches)
        base = as_options(options)
        self.options = base.replace(**changes) if changes else base
        self.device = next((t.device for t in tree_flatten(self.inputs)[0] if isinstance(t, torch.Tensor)),
                           torch.device("cpu"))
        if self.device.type == "cuda":
            from .pipeline import _options_for_device
            self.options = _options_for_device(self.options, self.device)
        self.exploration = Exploration(step, self.inputs, self.options, name=name, loss=loss, state=state)
        self.state = state
        captured = self.exploration.captured
        program = self.exploration.optimized
        if program.rng_input is not None:
            raise _random_step(captured.program, program)
        stateful = captured.stateful
        self.binding = bind(program, captured.loss_index, self.inputs, self.batches,
                            lifted=len(stateful.slots) if stateful else 0, carry=carry, stateful=stateful is not None)
        if getattr(self.options, "timeline", False):
            raise UnsupportedError("training-loop", "Options(timeline=True) records one launch of one step",
                                   hint="record the timeline of the one-step kernel (tkx.runtime.build)")
        from .codegen.loop import check_spec

        check_spec(program, self.spec())  # what the loop kernel refuses, refused on the CPU as well
        _refuse_state_in_datasets(program, self.binding, tree_flatten(self.inputs)[0], self.batches)
        self.runner: Any = None
        self._source: Any = None
        self._position = 0  # the dataset position after the last CPU run (first=None goes on from it)
        self._cpu_run: CpuRun | None = None  # the CPU run started with wait=False, while it may be running

    @property
    def program(self) -> Any:
        return self.exploration.optimized

    def spec(self) -> Any:
        """The :class:`~tkx.codegen.loop.LoopSpec` of this loop (row strides from the datasets)."""
        from .codegen.loop import LoopSpec

        strides = tuple((i, int(d.stride(0))) for i, d in zip(self.binding.batch_inputs, self.batches))
        return LoopSpec(batches=strides, carry=self.binding.carry, loss_output=self.binding.loss)

    def cuda(self) -> Any:
        """The loop kernel's :class:`~tkx.codegen.CudaSource` (no GPU needed)."""
        if self._source is None:
            from .codegen import generate

            ex = self.exploration
            self._source = generate(ex.schedule, ex.arena, loop=self.spec())
        return self._source

    def _flat(self) -> list[torch.Tensor]:
        """The flat inputs of one call: the lifted tensors (prepared) then the step's own leaves."""
        lifted = self.exploration.captured.stateful.prepare() if self.state is not None else []
        return [*lifted, *tree_flatten(self.inputs)[0]]

    def _finish(self) -> None:
        if self.state is not None:
            self.exploration.captured.stateful.finish()

    def loop_runner(self) -> Any:
        """The :class:`~tkx.runtime.loop.LoopRunner` (compiled on first use; needs the step on a GPU)."""
        if self.runner is None:
            from .runtime.loop import LoopRunner

            self.runner = LoopRunner(self.cuda(), self.spec(), device=self.device)
        return self.runner

    def _datasets(self) -> dict[int, torch.Tensor]:
        return dict(zip(self.binding.batch_inputs, self.batches))

    def capture_graph(self, steps: int, *, order: torch.Tensor | None = None) -> Any:
        """One launch of ``steps`` steps on the argument tensors captured in a CUDA graph
        (:class:`~tkx.runtime.loop.LoopGraph`; each ``replay()`` runs ``steps`` more steps). Functional and
        in-place steps only: with ``state=`` use :meth:`run` (it writes learning rates and step counts back)."""
        if self.state is not None:
            raise UnsupportedError("training-loop", "capture_graph of a step with state=(model, opt)",
                                   hint="call run(steps) instead: it keeps the optimizer's own step counts")
        return self.loop_runner().capture_graph(self._flat(), self._datasets(), steps, order=order)

    def run(self, steps: int, *, order: torch.Tensor | None = None, progress: Any = "auto", wait: bool = True,
            timeout: float | None = None, first: int | None = 0) -> Any:
        """Run ``steps`` steps; see :func:`training_loop`. ``first``: the dataset position of the first step
        (step k reads row ``(first + k) % N``; ``None`` goes on from where the last run of this loop
        stopped). Returns a :class:`~tkx.runtime.loop.LoopResult`, or with ``wait=False`` the run in flight:
        a :class:`~tkx.runtime.loop.LoopRun` on a GPU, a :class:`CpuRun` (the same calls) on the CPU. Raises
        :class:`TkxError` while a CPU run of this loop started with ``wait=False`` is still running."""
        steps = _count(steps)
        first = None if first is None else _count(first, "first")
        if order is not None:
            from .runtime.loop import check_order

            check_order(order, int(self.batches[0].shape[0]), self.batches[0].device)
        if self.state is not None:
            reason = self.exploration.captured.stateful.stale()
            if reason is not None:
                raise UnsupportedError("training-loop", f"{reason} since the loop was compiled",
                                       hint="build the training loop again for the modules' current mode")
        if self.device.type != "cuda":
            if self._cpu_run is not None and self._cpu_run.running():
                raise TkxError("this training loop is still running (started with wait=False): call "
                               "run.wait() or run.stop() then run.wait() before the next run")
            return self._run_cpu(steps, order, progress, first, timeout, wait)
        runner = self.loop_runner()
        flat = self._flat()
        try:
            run = runner.start(flat, self._datasets(), steps, order=order, first=first, progress=progress,
                               title=self.program.name, timeout=timeout)
        except BaseException:
            self._finish()
            raise
        run.after.append(self._finish)
        if not wait:
            return run.in_background()
        return run.wait()

    def _run_cpu(self, steps: int, order: torch.Tensor | None, progress: Any, first: int | None,
                 timeout: float | None, wait: bool) -> Any:
        """The CPU run: the display is made here (a notebook shows it under the calling cell), the steps run
        here with ``wait`` or in a :class:`CpuRun`'s thread without (the caller returns at once and a
        notebook stays free to handle the stop button)."""
        from .runtime.live import HostWords, progress_display

        first = self._position if first is None else first
        words = HostWords()
        words.clear()
        display = progress_display(progress, steps, self.program.name, words.request_stop)

        def work() -> Any:
            return self._cpu_steps(steps, order, first, timeout, words, display)

        if wait:
            return work()
        self._cpu_run = CpuRun(words, work)
        return self._cpu_run

    def _cpu_steps(self, steps: int, order: torch.Tensor | None, first: int, timeout: float | None,
                   words: Any, display: Any) -> Any:
        from .runtime.inputs import TORCH_DTYPES
        from .runtime.loop import LoopResult
        from .schedule.interpreter import run as run_schedule

        ex, b = self.exploration, self.binding
        rows = _rows(order, self.batches[0], steps, first)
        t0 = time.perf_counter()
        deadline = None if timeout is None else t0 + float(timeout)
        flat = self._flat()
        losses: list[torch.Tensor] = []
        try:
            with _ctrl_c_stops(words.request_stop):
                for k, row in enumerate(rows):
                    step_in = list(flat)
                    for i, data in zip(b.batch_inputs, self.batches):
                        step_in[i] = data[row]
                    try:
                        out = run_schedule(ex.schedule, ex.arena, step_in, update_inputs=True).outputs
                    except TkxError as exc:
                        exc.add_note(f"in training-loop step {k} (dataset row {row}); the state holds the "
                                     f"{k} steps before it")
                        raise
                    losses.append(out[b.loss].reshape(()).clone())
                    with torch.no_grad():
                        for i, j in b.carry:
                            flat[i].copy_(out[j])
                    words.publish(k + 1, float(losses[-1]))
                    display.update(words.read())
                    if deadline is not None and time.perf_counter() > deadline:
                        words.request_stop()
                    if words.stop_requested:
                        break
        finally:
            self._position = first + len(losses)
            self._finish()
        loss_t = torch.stack(losses) if losses else torch.empty(
            0, dtype=TORCH_DTYPES[self.program.outputs[b.loss].value.dtype])
        stopped = len(losses) < steps
        words.publish(len(losses), float(loss_t[-1]) if losses else float("nan"), finished=True)
        display.close(words.read(), "stopped" if stopped else "done", loss_t.float().tolist())
        return LoopResult(loss_t, len(losses), steps, stopped, time.perf_counter() - t0, str(self.device))


class CpuRun:
    """A CPU training loop started with ``wait=False``: the steps run in a thread, with the calls of an
    in-flight :class:`~tkx.runtime.loop.LoopRun`: :meth:`wait` joins the thread and returns the
    :class:`~tkx.runtime.loop.LoopResult` (raising the error a step raised), :meth:`running`,
    :meth:`stop` (the loop ends at the next step boundary), :meth:`poll` (the published step count and
    latest loss). The state tensors change while it runs: read them after :meth:`wait`."""

    def __init__(self, words: Any, work: Callable[[], Any]) -> None:
        self._words = words
        self.result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(work,), name="tkx-training-loop", daemon=True)
        self._thread.start()

    def _work(self, work: Callable[[], Any]) -> None:
        try:
            self.result = work()
        except BaseException as exc:  # handed to wait(), which raises it in the caller's thread
            self._error = exc

    def wait(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.result

    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._words.request_stop()

    def poll(self) -> Any:
        return self._words.read()


@contextlib.contextmanager
def _ctrl_c_stops(request_stop: Callable[[], None]) -> Any:
    """Within the block (in the main thread), the first Ctrl-C asks the loop to stop at the next step
    boundary instead of raising mid-step; a second one raises KeyboardInterrupt as usual."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None:  # not the main thread, or a handler installed outside Python: leave Ctrl-C alone
        yield
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, previous)
        request_stop()

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def training_loop(step: Callable[..., Any], inputs: Sequence[Any], batches: Sequence[torch.Tensor], *, steps: int,
                  order: torch.Tensor | None = None, state: Any = None, loss: int | None = None,
                  carry: bool | None = None, options: Any = None, progress: Any = "auto", wait: bool = True,
                  timeout: float | None = None, **changes: Any) -> Any:
    """Run ``steps`` training steps of ``step``, on the GPU in one cooperative launch of the megakernel.

    * ``step``, ``inputs``, ``state``, ``loss``, ``options`` and Options fields as ``**changes``: as for
      :func:`tkx.explore` (``inputs`` are the step's positional arguments; with ``state=(model, opt)`` the
      step calls ``loss.backward()`` and ``opt.step()`` and the model and optimizer are updated in place);
    * ``batches``: one dataset tensor ``[N, *shape]`` per trailing batch argument of the step (the last
      ``len(batches)`` arguments; same dtype and device); step ``k`` reads row ``k % N``, or
      ``order[k % len(order)]`` with ``order`` (int64, 1-D, rows in ``[0, N)``, on the step's device);
    * ``carry``: how a functional step's outputs other than the loss are treated (module docstring of
      :mod:`tkx.loop`): ``None`` carries them as the new state of the leading arguments (outputs after the
      new state are per-step results: computed, not kept); ``False`` carries none;
    * ``progress``: ``"auto"`` (ipywidgets progress bar, loss curve and stop button in a notebook, a
      ``rich`` bar in a terminal), ``"notebook"``, ``"terminal"`` or ``False``;
    * ``wait=False``: return the run in flight at once (a notebook stays responsive, so its stop button
      works): on a GPU the :class:`~tkx.runtime.loop.LoopRun`, watched from a thread; on the CPU a
      :class:`CpuRun`, the steps running in a thread; ``run.wait()`` gives the result;
    * ``timeout``: seconds after which the loop is asked to stop (the steps done so far are kept).

    The state arguments hold the state after the last step that ran. Returns a
    :class:`~tkx.runtime.loop.LoopResult`: ``losses`` (1-D, one per step run, the loss dtype),
    ``steps``, ``stopped``, ``seconds``. Raises :class:`tkx.UnsupportedError` (capture, or datasets
    that do not fit the step: it names the argument), :class:`tkx.OptionsError` for ``steps`` that is not
    a whole number >= 0, :class:`tkx.TkxError` for an ``order`` that is not a 1-D int64 tensor of dataset
    rows or when the kernel does not end after a stop request, :class:`~tkx.runtime.status.KernelError`
    when the kernel (or, on the CPU, the interpreter) reported an error: its note names the step, and the
    state holds the steps before it. On the CPU, Ctrl-C and ``timeout`` stop the loop at a step boundary
    as on the GPU.
    """
    loop = TrainingLoop(step, inputs, batches, state=state, loss=loss, carry=carry, options=options, **changes)
    return loop.run(steps, order=order, progress=progress, wait=wait, timeout=timeout)


def eager_training_loop(step: Callable[..., Any], inputs: Sequence[Any], batches: Sequence[torch.Tensor], *,
                        steps: int, order: torch.Tensor | None = None, loss: int = 0, carry: bool = True,
                        state: bool = False, first: int = 0) -> torch.Tensor:
    """The reference: ``step`` run ``steps`` times eagerly, binding ``batches`` as :func:`training_loop`
    does, on ``inputs`` themselves (pass copies to keep the originals). ``loss``: the flat output index of
    the loss; ``carry``: a functional step's other outputs are copied into its leading argument leaves;
    ``state=True``: the step updates modules and optimizers itself (nothing to carry); ``first``: the dataset
    position of the first step (to go on from an earlier call). Returns the losses
    (1-D float tensor of ``steps`` values, on the inputs' device)."""
    args = list(inputs)
    n_state = len(args) - len(batches)
    rows = _rows(order, batches[0], _count(steps), first)
    leaves = tree_flatten(tuple(args[:n_state]))[0]
    in_keys = _leaf_keys(tuple(args[:n_state]))
    losses = []
    for row in rows:
        for b, data in enumerate(batches):
            args[n_state + b] = data[row]
        out = step(*args)
        flat = tree_flatten(out)[0]
        losses.append(flat[loss].detach().reshape(()).clone())
        if carry and not state:
            rest = [j for j in range(len(flat)) if j != loss]
            keys = _leaf_keys(out)
            pairs = _pair_by_keys(list(zip(range(len(leaves)), rest)), in_keys, [keys[j] for j in rest])
            with torch.no_grad():
                for i, j in pairs:
                    leaves[i].copy_(flat[j])
    return torch.stack(losses) if losses else torch.empty(0)
