"""Dataflow synchronisation: counters per produced region instead of grid barriers.

* :mod:`tkx.dataflow.dag`: the task DAG (tasks = (group, work item), one counter per group
  whose threshold is its number of tiles, waits from memory hazards incl. arena reuse);
* :mod:`tkx.dataflow.check`: the static checker (every hazard ordered by the waits);
* :mod:`tkx.dataflow.vm`: a CPU VM with the exact counter semantics (many interleavings,
  deadlock and poisoned-read detection, results against the reference interpreter);
* :mod:`tkx.dataflow.timeline`: per-task timelines (from the kernel or the VM);
* :mod:`tkx.dataflow.trace`: a timeline as a Chrome / Perfetto trace, merged with ``torch.profiler``'s;
* :mod:`tkx.dataflow.cost`: the sync choice and the cost constants (calibrated JSON);
* :mod:`tkx.dataflow.audit`: the post-run check of an audited counters kernel's sync words (names a
  broken protocol);
* :mod:`tkx.dataflow.prefetch`: a decode step's weight prefetch (issue points under a byte budget).
"""

from __future__ import annotations

from .check import check
from .dag import Counter, Edge, Region, Task, TaskDAG, Wait, build

__all__ = ["build", "check", "TaskDAG", "Task", "Counter", "Wait", "Edge", "Region"]
