"""Which counter wait a kernel names when a poisoned threshold stalls it (shared by the CPU and GPU tests).

A wait whose threshold is over its producer's task count is never met; every group downstream of the
waiting group stalls with it. Whichever block reaches the spin limit first reports its own wait: the
poisoned one, or a wait on the counter of a group that the poisoned wait holds up."""

from __future__ import annotations

import re
from typing import Any

MESSAGE = re.compile(r"task (?P<task>\S+) item (?P<item>\d+) \(block (?P<block>\d+)\) waited on counter "
                     r"c(?P<counter>\d+) of (?P<group>\S+), which stood at (?P<value>-?\d+) of threshold "
                     r"(?P<threshold>\d+)")


def downstream(dag: Any, group: str) -> set[str]:
    """``group`` and every group that waits, directly or through others, on its counter."""
    reached, grew = {group}, True
    while grew:
        grew = False
        for g in dag.order:
            if g not in reached and any(dag.counters[w.counter].group in reached for w in dag.waits[g]):
                reached.add(g)
                grew = True
    return reached


def check_stalled_wait(dag: Any, text: str) -> str:
    """Assert that ``text`` (a wait-timeout :class:`KernelError` message) names a wait of ``dag`` that the
    poisoned threshold explains; return ``"poisoned"`` or ``"downstream"``."""
    m = MESSAGE.search(text)
    assert m, f"no counter wait named in: {text}"
    task, counter, group = m["task"], int(m["counter"]), m["group"]
    value, threshold = int(m["value"]), int(m["threshold"])
    assert dag.counters[counter].group == group, text
    assert any(w.counter == counter and w.threshold == threshold for w in dag.waits[task]), \
        f"{task} has no wait on c{counter} with threshold {threshold}: {text}"
    assert value < threshold, text
    poisoned = [(g, w) for g in dag.order for w in dag.waits[g]
                if w.threshold > dag.items[dag.counters[w.counter].group]]
    assert len(poisoned) == 1, poisoned
    g, w = poisoned[0]
    if (task, counter) == (g, w.counter):  # the poisoned wait: one tile more than its producer has
        assert threshold == dag.items[group] + 1 and value <= dag.items[group], text
        return "poisoned"
    assert group in downstream(dag, g), f"c{counter} of {group} is not held up by {g}'s wait: {text}"
    return "downstream"
