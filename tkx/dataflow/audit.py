"""The post-run protocol audit of a counters kernel: what it executed, checked against the task DAG.

A kernel generated with ``tkx.codegen.generate(..., audit=True)`` logs, in ``sync`` words past its
counters (:func:`layout`), each fenced publish (one word per counter) and each wait that passed (per
wait site: the number of passes, and ``(counter << 16) | threshold``). :func:`audit` reads those words
after ``launches`` launches from zeroed words and names what broke the protocol, whether or not the race
it opens showed in the results (the checks compare counts and logged values, they do not need the race):

* ``epoch-not-advanced``: the epoch word (``sync[2]``) is not ``launches``;
* ``missing-release-fence``: a counter was bumped more often than it was published with a fence;
* ``barrier-skipped-by-one-block``: a wait passed fewer times than its group has tasks (a block ran the
  group's tasks without waiting);
* ``threshold-off-by-one``: a wait's logged threshold is below its counter's tiles per launch;
* ``threshold-one-too-high``: the kernel stopped at the spin limit (error 4) on a wait whose threshold is
  above its counter's tiles;
* ``wait-on-wrong-counter``: the logged waits leave a memory hazard unordered even on the compiler's own
  arena plan (:func:`tkx.arena.plan`);
* ``slot-reused-early``: the logged waits order every hazard of the compiler's arena plan but not of the
  plan the kernel used: an arena slot is reused before the last reader of its old value is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .dag import TaskDAG, Wait

__all__ = ["Finding", "layout", "audit_words", "audit"]

MASK = 0xFFFFFFFF
EPOCH_WORD = 2
STATUS_WORD = 4
WAIT_TIMEOUT = 4


@dataclass(frozen=True)
class Finding:
    """One broken protocol rule: ``poison`` (its name, as in :data:`tkx.puzzles.POISONS`) and ``what``."""

    poison: str
    what: str

    def __str__(self) -> str:
        return f"{self.poison}: {self.what}"


def layout(dag: TaskDAG) -> list[tuple[str, int, Wait]]:
    """The wait sites of ``dag`` in the order of their audit words: ``(group, index of the wait, wait)``."""
    return [(g, k, w) for g in dag.order for k, w in enumerate(dag.waits[g])]


def audit_words(dag: TaskDAG) -> int:
    """Audit words a kernel of ``dag`` needs: one per counter, two per wait site."""
    return len(dag.counters) + 2 * len(layout(dag))


def _u32(x: Any) -> int:
    return int(x) & MASK


def _counter(dag: TaskDAG, counter: int, where: str) -> int:
    """``counter`` as logged for ``where``; :class:`TkxError` when the DAG has no such counter (the words
    were overwritten, or are not this kernel's)."""
    if counter >= len(dag.counters):
        from ..errors import TkxError

        raise TkxError(f"the audit log of {where} names counter c{counter}, but the kernel has "
                       f"{len(dag.counters)} counters: its sync words were overwritten or belong to another kernel")
    return counter


def audit(source: Any, words: Sequence[int], launches: int) -> list[Finding]:
    """What the audited kernel of ``source`` (a :class:`~tkx.codegen.CudaSource` generated with ``audit=True``)
    did wrong, from its ``sync`` words (``words``: the whole words tensor as ints, read after ``launches``
    launches from zeroed words); empty when it ran the protocol of a sound task DAG. Raises
    :class:`~tkx.errors.TkxError` for a source without the audit, fewer words than the audit reads, or a
    logged counter the kernel does not have."""
    from .. import arena as arena_mod
    from ..errors import TkxError
    from .check import check
    from .dag import build

    base = getattr(source, "audit_base", None)
    dag = source.dag
    if base is None or dag is None:
        raise TkxError("this kernel has no protocol audit: generate it with tkx.codegen.generate(..., audit=True) "
                       "and Options(sync='counters')")
    w = [_u32(x) for x in words]
    need = max(base + audit_words(dag), 12 + len(dag.counters), STATUS_WORD + 6)
    if len(w) < need:
        raise TkxError(f"the audit reads {need} sync words of this kernel, got {len(w)}: pass the whole sync "
                       "words tensor the kernel ran with")
    out: list[Finding] = []
    status = w[STATUS_WORD]
    if status == WAIT_TIMEOUT:
        counter, threshold = _counter(dag, w[STATUS_WORD + 3] & 0xFFFF, "the timed-out wait"), w[9]
        tiles = dag.counters[counter].threshold
        if threshold > tiles:
            out.append(Finding("threshold-one-too-high", f"a wait on counter c{counter} "
                               f"({dag.counters[counter].group}) for {threshold} tiles reached the spin limit; "
                               f"its group has {tiles}"))
            return out
        # The block that reached the spin limit first may wait on a sound counter whose group is held up
        # by the unreachable wait (its tasks never run): name the wait that can never be met.
        for g in dag.order:
            for wt in dag.waits[g]:
                if wt.threshold > dag.counters[wt.counter].threshold:
                    out.append(Finding("threshold-one-too-high",
                                       f"{g} waits on counter c{wt.counter} ({dag.counters[wt.counter].group}) for "
                                       f"{wt.threshold} tiles, its group has {dag.counters[wt.counter].threshold}: "
                                       f"the kernel stopped at the spin limit on c{counter} "
                                       f"({dag.counters[counter].group}), which that wait holds up"))
        return out
    if w[EPOCH_WORD] != launches & MASK:
        out.append(Finding("epoch-not-advanced", f"the epoch stands at {w[EPOCH_WORD]} after {launches} launches"))
    n = len(dag.counters)
    for c in dag.counters:
        bumps, fenced = w[12 + c.index], w[base + c.index]
        if bumps != fenced:
            out.append(Finding("missing-release-fence", f"counter c{c.index} ({c.group}) was bumped {bumps} times, "
                               f"{fenced} of them after a release fence"))
    logged: dict[str, list[Wait]] = {g: [] for g in dag.order}
    for j, (g, k, _) in enumerate(layout(dag)):
        passes, entry = w[base + n + 2 * j], w[base + n + 2 * j + 1]
        want = launches * dag.items[g]
        if passes != want:
            out.append(Finding("barrier-skipped-by-one-block", f"wait {k} of {g} passed {passes} times, "
                               f"{want} tasks ran it"))
        if passes:
            counter, threshold = _counter(dag, entry >> 16, f"wait {k} of {g}"), entry & 0xFFFF
            tiles = dag.counters[counter].threshold
            if threshold < tiles:
                out.append(Finding("threshold-off-by-one", f"wait {k} of {g} on counter c{counter} "
                                   f"({dag.counters[counter].group}) waited for {threshold} of its {tiles} tiles"))
            logged[g].append(Wait(counter, threshold))
    if out:
        return out
    items = dict(dag.items)
    own = arena_mod.plan(dag.schedule)
    on_own = build(dag.schedule, own, work_items=items).with_waits({g: tuple(v) for g, v in logged.items()})
    problems = check(on_own)
    if problems:
        return [Finding("wait-on-wrong-counter", f"the waits the kernel ran leave a hazard unordered: {problems[0]}")]
    used = build(dag.schedule, source.arena, work_items=items).with_waits({g: tuple(v) for g, v in logged.items()})
    problems = check(used)
    if problems:
        return [Finding("slot-reused-early", f"the kernel's arena reuses bytes its waits do not order: "
                                             f"{problems[0]}")]
    return []
