"""What the side-by-side training scripts (``tkx.train_digits``, ``tkx.train_cnn``) report: the two loss
curves compared step by step, printed and written as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def compare_losses(eager: Sequence[float], other: Sequence[float], label: str) -> dict[str, Any]:
    """The losses of an eager loop and of ``label``'s loop (``"megakernel"``, ``"tkx"``) over the same
    steps (floats, at least one): both curves (``eager_loss``, ``<label>_loss``), the largest absolute
    difference and its step, that difference relative to the eager loss there, the first loss and both
    final losses."""
    diffs = [abs(a - b) for a, b in zip(eager, other)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    return {
        "eager_loss": list(eager), f"{label}_loss": list(other),
        "max_abs_loss_diff": diffs[worst], "max_diff_step": worst,
        "max_rel_loss_diff": diffs[worst] / max(abs(eager[worst]), 1e-12),
        "first_loss": eager[0], "final_loss_eager": eager[-1], f"final_loss_{label}": other[-1],
    }


def print_and_write(report: dict[str, Any], out: str | None) -> int:
    """Print ``report`` as JSON without its lists (the loss curves), write all of it to the file ``out``
    when given; returns 0 (the exit status)."""
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, list)}, indent=2))
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=2)
    return 0
