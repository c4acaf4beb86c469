"""Cost constants of the GPU model: defaults from DESIGN.md's H200 anchors, replaced by a
calibrated JSON when one is shipped (``tkx/data/costs.json``, written by ``scripts/calibrate``)
or named by the environment variable ``TKX_COSTS``.

Keys (all µs unless named otherwise): ``grid_barrier_us`` (a grid barrier of ``barrier_blocks``
blocks), ``block_barrier_us`` (``__syncthreads``), ``handoff_us`` (a counter release seen by
a waiting block), ``wait_us`` (one satisfied wait: an acquire load and two ``__syncthreads``),
``item_overhead_us`` (fixed cost of a work item in the attention estimates), ``task_us`` (fixed cost of
one work item of a group: its index arithmetic and its first loads' latency, paid even when it moves
almost nothing; the median of measured tiny tasks), ``group_us`` (fixed cost of a group on each block that
runs it: fetching its first operands just written by the stage before; fitted to whole-step times),
``publish_us`` (with ``sync="counters"``, a task's release of its tile: the fence that waits for its
stores, then the atomic; fitted to whole-step times),
``launch_us`` (an empty kernel in a CUDA graph), ``sm_flops_per_us`` and ``sm_bytes_per_us`` (one SM's
throughput). :func:`item_us` is the cost of one work item every estimate uses. Imports nothing from tkx.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

DEFAULTS = {
    "grid_barrier_us": 1.2,
    "barrier_blocks": 132,
    "block_barrier_us": 0.04,
    "handoff_us": 0.5,
    "wait_us": 0.1,
    "item_overhead_us": 0.3,
    "task_us": 0.03,
    "group_us": 0.0,
    "publish_us": 0.0,
    "launch_us": 1.1,
    "sm_flops_per_us": 0.45e6,
    "sm_bytes_per_us": 0.1e6,
}

SHIPPED = Path(__file__).parent / "data" / "costs.json"


@cache
def _load(path: str) -> dict[str, float]:
    data = json.loads(Path(path).read_text())
    values = data.get("constants", data)
    return {k: float(values[k]) for k in DEFAULTS if k in values}


def constants() -> dict[str, float]:
    """The constants in use: :data:`DEFAULTS` updated from ``$TKX_COSTS`` or the shipped JSON.

    Raises ``ValueError`` naming the file if the JSON is malformed."""
    out = dict(DEFAULTS)
    path = os.environ.get("TKX_COSTS") or (str(SHIPPED) if SHIPPED.exists() else None)
    if path:
        try:
            out.update(_load(path))
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"cost constants {path} are unreadable ({e}); rerun scripts/calibrate or unset "
                             "TKX_COSTS") from None
    return out


def item_us(flops: float, nbytes: float, items: int, c: dict[str, float]) -> float:
    """Estimated µs of one of ``items`` work items sharing ``flops`` and ``nbytes`` (a group's totals): the
    fixed ``task_us`` plus the item's share of the work at one SM's roofline (the slower of FLOPs at
    ``sm_flops_per_us`` and bytes at ``sm_bytes_per_us``), with constants ``c`` (:func:`constants`)."""
    return c["task_us"] + max(flops / c["sm_flops_per_us"], nbytes / c["sm_bytes_per_us"]) / max(int(items), 1)


def source() -> str:
    """Where :func:`constants` came from: ``TKX_COSTS``'s path, ``"tkx/data/costs.json"`` (the shipped file,
    named the same wherever the checkout lives, since the name reaches the generated CUDA's header), or the
    defaults."""
    if os.environ.get("TKX_COSTS"):
        return os.environ["TKX_COSTS"]
    return "tkx/data/costs.json" if SHIPPED.exists() else "defaults (DESIGN.md anchors)"
