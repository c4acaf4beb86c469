"""Megakernel puzzles: the decisions a megakernel compiler makes, posed on small steps of the zoo
and scored on the CPU, and broken synchronisation protocols to catch.

* :data:`PUZZLES`: puzzles of rising difficulty. ``p.draw()`` shows the problem, ``p.blank()`` is
  the answer skeleton to fill, ``p.solution()`` the compiler's own answer, and
  ``check(p, answer)`` runs an answer through the schedule interpreter (poisoned arena) and/or
  the task VM under random interleavings, then scores it against the compiler (barriers, bytes,
  waits, predicted µs), with a hint when it is wrong (a :class:`Verdict`).
* :data:`POISONS`: broken protocols (:class:`Poison`); ``q.caught_by_checker()`` and
  ``q.caught_by_vm()``.

Example::

    from tkx import puzzles
    p = puzzles.get("barriers-1")
    print(p.draw())
    print(puzzles.check(p, [1]))
"""

from __future__ import annotations

from typing import Any

from ..errors import TkxError
from .core import Drawing, Puzzle, Step, Verdict, check, step
from .fusion import Fusion, GemmTiles, SplitK, rule_names
from .poisons import POISONS, Poison, barrier_dag
from .prefetch import WeightPrefetch
from .sync import ArenaOffsets, Barriers, TaskOrder, Thresholds, Waits

__all__ = ["PUZZLES", "POISONS", "check", "get", "poison", "Puzzle", "Poison", "Verdict", "Drawing", "Step",
           "step", "rule_names", "barrier_dag", "Fusion", "Barriers", "ArenaOffsets", "Thresholds", "Waits",
           "TaskOrder", "GemmTiles", "SplitK", "WeightPrefetch"]

#: The puzzles, easiest first.
PUZZLES: tuple[Puzzle, ...] = (
    Fusion("linear_regression", "fusion-1", 1),
    Barriers("linear_regression", "barriers-1", 1),
    Thresholds("tiny_online", "thresholds-1", 2),
    ArenaOffsets("tiny_online", "arena-1", 2),
    Barriers("tiny_online", "barriers-2", 3),
    Fusion("digits_mlp", "fusion-2", 3),
    TaskOrder("digits_mlp", "order-1", 4),
    ArenaOffsets("digits_mlp", "arena-2", 4),
    Waits("tiny_online", "waits-1", 5),
    GemmTiles("medium", "gemm-tiles-1", 5),
    SplitK("small", "split-k-1", 6),
    Waits("digits_mlp", "waits-2", 6),
    WeightPrefetch("decode_tiny", "prefetch-1", 7),
)


def _named(items: tuple, name: str, what: str) -> Any:
    for x in items:
        if x.name == name:
            return x
    raise TkxError(f"no {what} {name!r}; the {what}s are {', '.join(x.name for x in items)}")


def get(name: str) -> Puzzle:
    """The puzzle called ``name`` (e.g. ``"barriers-1"``); :class:`TkxError` naming them otherwise."""
    return _named(PUZZLES, name, "puzzle")


def poison(name: str) -> Poison:
    """The poison called ``name``; :class:`TkxError` naming them otherwise."""
    return _named(POISONS, name, "poison")
