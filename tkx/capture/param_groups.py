"""The parameter-group keys a captured stateful step specialises on, and why a change needs a new capture."""

from __future__ import annotations

#: Keys ``torch.optim.lr_scheduler`` and ``swa_utils`` keep in a parameter group for their own
#: bookkeeping: no optimizer reads them, so a scheduler created or stepped after the capture does
#: not make the step stale.
SCHEDULER_KEYS = frozenset({"initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum", "swa_lr"})


def changed_hyperparameter(now: tuple, then: tuple) -> str:
    """``now``/``then``: per group, sorted ``(key, frozen value)`` pairs. The message of ``Stateful.stale`` for a changed group: names the first key that differs."""
    for gi, (g_now, g_then) in enumerate(zip(now, then)):
        a, b = dict(g_now), dict(g_then)
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                why = (" (a scheduler that cycles momentum, such as OneCycleLR or CyclicLR with "
                       "cycle_momentum=True, changes it at every step)" if key in ("betas", "momentum") else "")
                return (f"a hyperparameter other than the learning rate changed: param_groups[{gi}]"
                        f"[{key!r}] {b.get(key)!r} -> {a.get(key)!r}{why}")
    return "a hyperparameter other than the learning rate changed"
