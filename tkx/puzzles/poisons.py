"""Poison litmus: deliberately broken synchronisation protocols, each to be caught twice.

A :class:`Poison` plants one fault in the sound task DAG of a zoo step (a missing release
fence, a threshold off by one, an arena slot reused before its last reader is done, an epoch not
advanced across CUDA-graph replays, a wait on the wrong counter, a barrier skipped by one block).
``q.caught_by_checker()`` asks the static checker (:func:`tkx.dataflow.check`);
``q.caught_by_vm()`` runs the task VM under random interleavings (several seeds and grid sizes,
two launches) and reports whether it found a fault of the kinds the poison must cause.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .core import step

__all__ = ["Poison", "POISONS", "barrier_dag"]

#: The VM's interleavings a poison faces: uniform random, the oldest running task finishing last
#: (the adversary of a missing write-after-read order), and one slow block.
ADVERSARIES = ("random", "lifo", "stall")
ORDER_FAULTS = frozenset({"unwritten-read", "reused-read", "premature-overwrite"})
#: Spin limit of the poisoned kernels: a wait that is never met gives up quickly.
SPIN_LIMIT = 200_000


@dataclass(frozen=True)
class Poison:
    """A broken protocol: ``name``, what is broken (``description``), the zoo ``example`` it is
    planted in, ``plant(dag) -> broken dag`` and the VM fault kinds it must cause (``expect``)."""

    name: str
    description: str
    example: str
    plant: Callable[[Any], Any] = field(repr=False)
    expect: frozenset[str] = ORDER_FAULTS
    launches: int = 1
    #: The sound protocol the fault is planted in (the compiler's task DAG, or its grid-barrier form).
    base: Callable[[Any], Any] | None = field(default=None, repr=False)

    def sound(self) -> Any:
        """The compiler's (sound) task DAG of the example."""
        return step(self.example).dag()

    def broken(self) -> Any:
        """The task DAG with the fault planted."""
        return self.plant(self.sound())

    def checker_problems(self) -> list[str]:
        from .. import dataflow

        return dataflow.check(self.broken())

    def caught_by_checker(self) -> bool:
        """Whether the static checker reports the broken DAG (and not the sound one)."""
        from .. import dataflow

        return bool(self.checker_problems()) and not dataflow.check(self.sound())

    def vm_runs(self, blocks: tuple[int, ...] = (2, 3, 16), seeds: tuple[int, ...] = (0, 1, 2, 3),
                policies: tuple[str, ...] = ADVERSARIES) -> Iterator[Any]:
        """Task VM runs of the broken DAG (lazily, cheapest first): every policy, grid size and seed,
        with the kernel's task assignment and a rotated one, ``launches`` launches each."""
        from ..dataflow import vm

        st, dag = step(self.example), self.broken()
        for rotate in (False, True):
            for b in blocks:
                for p in policies:
                    for s in seeds:
                        yield vm.run(dag, list(st.inputs), blocks=b, policy=p, seed=s, launches=self.launches,
                                     values=False, rotate=rotate)

    def caught_by_vm(self) -> bool:
        """Whether some interleaving shows a fault of the expected kinds."""
        return any(r.kinds() & self.expect for r in self.vm_runs())

    def first_vm_fault(self) -> str:
        """The first expected fault the VM found ("" when none)."""
        for r in self.vm_runs():
            for f in r.faults:
                if f.kind in self.expect:
                    return f"{r.blocks} blocks, seed {r.seed}: {f}"
        return ""

    def options(self, arch: str = "auto") -> Any:
        """The options the poisoned kernel is lowered with: grid mode, counters, a short spin limit."""
        from ..options import Options

        return Options(mode="grid", sync="counters", spin_limit=SPIN_LIMIT, arch=arch)

    def source(self, *, planted: bool = True, arch: str = "auto") -> Any:
        """The :class:`~tkx.codegen.CudaSource` of the example's counters kernel with the protocol audit
        (:mod:`tkx.dataflow.audit`), generated from the broken task DAG (``planted=False``: from the sound
        protocol the fault is planted in). Needs no GPU."""
        from ..codegen import generate
        from ..examples import get
        from ..pipeline import _context, compute

        ex = get(self.example)
        plan = compute("arena", _context(ex.step_fn, ex.example_inputs, self.options(arch), self.example,
                                         ex.loss_output), {})
        plant = self.plant if planted else (self.base or (lambda dag: dag))
        return generate(plan.schedule, plan, plant=plant, audit=True)

    def run_kernel(self, *, planted: bool = True, launches: int = 2, device: Any = "cuda") -> list[Any]:
        """Run the audited kernel :meth:`source` ``launches`` times on a GPU from zeroed sync words, then
        audit them (:func:`tkx.dataflow.audit.audit`): the findings, each naming a poison (empty for a sound
        protocol). The kernel's error words are cleared afterwards. Raises
        :class:`~tkx.runtime.NoDeviceError` without a GPU."""
        from ..dataflow.audit import audit
        from ..errors import KernelError
        from ..examples import get
        from ..pipeline import _options_for_device
        from ..runtime.device import require_cuda
        from ..runtime.runner import CompiledRunner

        dev = require_cuda(device)
        src = self.source(planted=planted, arch=_options_for_device(self.options(), dev).arch)
        runner = CompiledRunner(src, device=dev)
        flat = runner.flatten(get(self.example).make_inputs(0, dev))
        for _ in range(launches):
            runner.run_flat(flat, check=False)
        findings = audit(src, runner.status_words(), launches)
        try:
            runner.check_status()
        except KernelError:
            pass  # the spin limit's error, already read by the audit: cleared for the next call
        return findings

    def __str__(self) -> str:
        return f"{self.name} ({self.example}): {self.description}"

    def __repr__(self) -> str:
        return f"<tkx.puzzles.Poison {self.name}>"


def _first_wait(dag: Any, min_threshold: int = 2) -> tuple[str, int]:
    """(group, index) of the first wait on a producer of at least ``min_threshold`` tasks."""
    for g in dag.order:
        for k, w in enumerate(dag.waits[g]):
            if w.threshold >= min_threshold:
                return g, k
    raise LookupError("no wait on a multi-task producer")


def _edit_wait(dag: Any, fn: Callable[[Any, Any], Any]) -> Any:
    g, k = _first_wait(dag)
    ws = list(dag.waits[g])
    ws[k] = fn(dag, ws[k])
    return dag.with_waits({**dag.waits, g: tuple(ws)})


def _off_by_one(dag: Any) -> Any:
    return _edit_wait(dag, lambda d, w: dataclasses.replace(w, threshold=w.threshold - 1))


def _one_too_high(dag: Any) -> Any:
    return _edit_wait(dag, lambda d, w: dataclasses.replace(w, threshold=w.threshold + 1))


def _wrong_counter(dag: Any) -> Any:
    """A wait names the counter of another, earlier group with as many tasks as its producer (so
    the threshold still looks right and the wait is met: only the order is lost)."""
    from ..dataflow import check

    pos = {g: i for i, g in enumerate(dag.order)}
    for g in dag.order:
        for k, w in enumerate(dag.waits[g]):
            for c in dag.counters:
                if c.index != w.counter and c.threshold == w.threshold and pos[c.group] < pos[g]:
                    ws = list(dag.waits[g])
                    ws[k] = dataclasses.replace(w, counter=c.index)
                    broken = dag.with_waits({**dag.waits, g: tuple(ws)})
                    if check(broken):  # the other counter does not imply the producer's
                        return broken
    raise LookupError("no wait with another earlier counter of the same threshold")


def _no_fence(dag: Any) -> Any:
    g, k = _first_wait(dag)
    return dag.with_faults(unfenced=frozenset({dag.counters[dag.waits[g][k].counter].group}))


def _no_epoch(dag: Any) -> Any:
    return dag.with_faults(epoch_step=0)


def barrier_dag(dag: Any) -> Any:
    """The grid-barrier protocol as a task DAG: each group of stage ``k`` waits for every group of
    stage ``k - 1`` (a barrier: all tiles of the stage before are done)."""
    from ..dataflow.dag import Wait

    by_stage: dict[int, list[str]] = {}
    for g in dag.order:
        by_stage.setdefault(dag.stage_of[g], []).append(g)
    stages = sorted(by_stage)
    waits = {g: () for g in dag.order}
    for prev, cur in zip(stages, stages[1:]):
        for g in by_stage[cur]:
            waits[g] = tuple(Wait(dag.counter_of[p], dag.items[p]) for p in by_stage[prev])
    return dag.with_waits(waits)


def _skipped_barrier(dag: Any) -> Any:
    """Block 0 (which gets the first task of each stage) skips the barrier before the first stage
    that waits on a stage of several tasks."""
    bar = barrier_dag(dag)
    g, _ = _first_wait(bar)
    stage = bar.stage_of[g]
    return bar.with_faults(skips=frozenset((0, x) for x in bar.order if bar.stage_of[x] == stage))


def _early_reuse(dag: Any) -> Any:
    """A later value moved onto the bytes of an earlier one whose lifetime has ended (a legal arena
    plan), while the waits stay those of the original plan: the reuse is not ordered after the
    earlier value's last reader."""
    from .. import arena as arena_mod
    from .. import dataflow

    plan, sched = dag.arena, dag.schedule
    slots = sorted(plan.slots.values(), key=lambda s: (s.first, s.offset))
    for a in slots:
        for b in slots:
            if b.first <= a.last or b.offset == a.offset:
                continue
            moved = {**plan.slots, b.buffer: dataclasses.replace(b, offset=a.offset)}
            bad = dataclasses.replace(plan, slots=moved,
                                      size_bytes=max(plan.size_bytes, a.offset + b.nbytes + arena_mod.ALIGN))
            if arena_mod.check(bad):
                continue
            broken = dag.with_arena(bad)
            if dataflow.check(broken):
                return broken
    raise LookupError(f"{sched.program.name}: no slot reuse left unordered by the original waits")


POISONS: tuple[Poison, ...] = (
    Poison("missing-release-fence", "a producer bumps its counter without a release fence first: a consumer "
           "may see the bump before the tile's stores", "tiny_online", _no_fence),
    Poison("threshold-off-by-one", "a wait's threshold is one less than its producer's task count: the "
           "consumer starts while the last tile is still being written", "tiny_online", _off_by_one),
    Poison("threshold-one-too-high", "a wait's threshold is one more than its producer's task count: it is never "
           "met, every block that reaches it spins until the spin limit", "tiny_online", _one_too_high,
           expect=frozenset({"deadlock"})),
    Poison("slot-reused-early", "an arena slot is given to a new value before the last reader of the old one "
           "has finished (the waits do not order the reuse)", "poly_clip_adamw", _early_reuse),
    Poison("epoch-not-advanced", "the epoch does not advance at the end of a launch: in a CUDA-graph replay "
           "the counters already stand at their thresholds", "tiny_online", _no_epoch, launches=2),
    Poison("wait-on-wrong-counter", "a wait names the counter of another group: the producer it should order "
           "is not waited for", "tiny_online", _wrong_counter),
    Poison("barrier-skipped-by-one-block", "in the grid-barrier protocol, block 0 does not wait at one barrier",
           "tiny_online", _skipped_barrier, base=barrier_dag),
)
