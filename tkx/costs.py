"""Cost constants of the GPU model: defaults from DESIGN.md's H200 anchors, replaced by a
calibrated JSON when one is shipped (``tkx/data/costs.json``, written by ``scripts/calibrate``)
or named by the environment variable ``TKX_COSTS``.

Keys (all µs unless named otherwise): ``grid_barrier_us`` (a grid barrier of ``barrier_blocks``
blocks), ``block_barrier_us`` (``__syncthreads``), ``handoff_us`` (a counter release seen by
a waiting block), ``wait_us`` (one satisfied wait: an acquire load and two ``__syncthreads``),
``task_us`` (fixed cost of
one work item of a group: its index arithmetic and its first loads' latency, paid even when it moves
almost nothing; the median of measured tiny tasks), ``group_us`` (fixed cost of a group on each block that
runs it: fetching its first operands just written by the stage before; fitted to whole-step times),
``publish_us`` (with ``sync="counters"``, a task's release of its tile: the fence that waits for its
stores, then the atomic; fitted to whole-step times),
``launch_us`` (an empty kernel in a CUDA graph), ``sm_flops_per_us`` and ``sm_bytes_per_us`` (one SM's
throughput on CUDA cores: an FMA loop and a streaming copy on every SM), ``sm_tensor_flops_per_us`` (one SM's
dense bf16/fp16 wgmma rate: NVIDIA's H200 SXM datasheet gives 1,979 TFLOP/s bf16 *with sparsity*, so 989.4
dense, over 132 SMs; not measured by ``scripts/calibrate``). :func:`item_us` is the cost of one work item every
estimate uses, at the FLOP rate :func:`flops_per_us` gives the item's code. Imports nothing from tkx.
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
    "task_us": 0.03,
    "group_us": 0.0,
    "publish_us": 0.0,
    "launch_us": 1.1,
    "sm_flops_per_us": 0.45e6,
    "sm_bytes_per_us": 0.1e6,
    "sm_tensor_flops_per_us": 989.4e6 / 132,
}

#: Share of the wgmma rate (``sm_tensor_flops_per_us``) each tensor-core instruction family reaches, by the
#: emitter name's prefix: warp-level ``wmma``/``mma.sync`` issues a third of what Hopper's warpgroup ``wgmma``
#: does (the ratio the model used before the rate was tied to the datasheet; not measured on its own).
TENSOR_SHARE = {"wgmma": 1.0, "wmma": 1.0 / 3.0}

#: tf32 tensor-core math runs at half the bf16/fp16 rate (H200 datasheet: 989 TF32 TFLOP/s with sparsity).
TF32_SHARE = 0.5

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


def flops_per_us(impl: str | None, c: dict[str, float]) -> float:
    """One SM's FLOP rate (FLOP/µs) for code of the emitter named ``impl`` (a GEMM plan's ``impl``:
    ``"wgmma_bf16"``, ``"wmma_tf32"``, ``"simt"`` ...; ``None`` or any other name: CUDA-core code), with
    constants ``c``: tensor-core emitters run at ``sm_tensor_flops_per_us`` times their family's
    :data:`TENSOR_SHARE` (halved for tf32), everything else at the FMA rate ``sm_flops_per_us``."""
    name = impl or ""
    family = next((f for f in TENSOR_SHARE if name.startswith(f + "_")), None)
    if family is None:
        return c["sm_flops_per_us"]
    return c["sm_tensor_flops_per_us"] * TENSOR_SHARE[family] * (TF32_SHARE if name.endswith("tf32") else 1.0)


def item_us(flops: float, nbytes: float, items: int, c: dict[str, float], impl: str | None = None) -> float:
    """Estimated µs of one of ``items`` work items sharing ``flops`` and ``nbytes`` (a group's totals): the
    fixed ``task_us`` plus the item's share of the work at one SM's roofline (the slower of FLOPs at
    :func:`flops_per_us` of the emitter ``impl`` and bytes at ``sm_bytes_per_us``), with constants ``c``
    (:func:`constants`)."""
    return c["task_us"] + max(flops / flops_per_us(impl, c), nbytes / c["sm_bytes_per_us"]) / max(int(items), 1)


def group_impl(group: object) -> str | None:
    """The emitter whose FLOP rate a schedule group's work runs at (:func:`flops_per_us`): its plan's ``impl``
    (GEMM and attention plans name one), except a split-K GEMM's ``"stage"`` final (a ``gemm`` group with
    partials), which adds the slices on CUDA cores (``None``); ``None`` for plans without an ``impl``."""
    plan = getattr(group, "plan", None)
    impl = getattr(plan, "impl", None)
    if not isinstance(impl, str):
        return None
    if getattr(group, "kind", "") == "gemm" and getattr(plan, "partials", None) \
            and getattr(plan, "split_final", None) != "last-slice":
        return None
    return impl


def source() -> str:
    """Where :func:`constants` came from: ``TKX_COSTS``'s path, ``"tkx/data/costs.json"`` (the shipped file,
    named the same wherever the checkout lives, since the name reaches the generated CUDA's header), or the
    defaults."""
    if os.environ.get("TKX_COSTS"):
        return os.environ["TKX_COSTS"]
    return "tkx/data/costs.json" if SHIPPED.exists() else "defaults (DESIGN.md anchors)"
