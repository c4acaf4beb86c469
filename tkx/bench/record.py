"""What a benchmark record of ``docs/results/`` says about its run: the tkx commit measured.

The scripts of ``scripts/`` share it: each takes ``--commit`` for a tree whose ``.git`` does not say (a copy
of the checkout on another machine), else asks git.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

#: The checkout tkx is imported from (``tkx/bench/record.py`` -> the repository root).
CHECKOUT = Path(__file__).resolve().parents[2]


def commit(given: str | None = None) -> str:
    """``given`` when set, else ``git rev-parse --short HEAD`` of :data:`CHECKOUT`; ``"unknown"`` when git
    cannot tell (no git, not a checkout)."""
    if given:
        return given
    try:
        out = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out or "unknown"
