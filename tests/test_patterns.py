"""Every training-step pattern of tests/data/patterns.md (a copy of the team's coverage file)
goes through every CPU stage and matches eager."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pipeline import check_step
from torch.func import grad, grad_and_value, vmap

import tkx

PATTERNS = Path(__file__).parent / "data" / "patterns.md"


def snippets() -> list[tuple[str, str]]:
    """(id, code) of every python block that ends in ``tkx.explore(...).program``."""
    text = PATTERNS.read_text()
    out = []
    for k, block in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.S)):
        if "tkx.explore(" not in block:
            continue
        head = text[:text.index(block)].rsplit("\n## ", 1)[-1].split("\n", 1)[0][:40]
        out.append((f"{k:02d}-{head.split(':')[0].strip().replace(' ', '_')}", block))
    return out


SNIPPETS = snippets()


def test_the_patterns_file_has_the_snippets():
    assert len(SNIPPETS) >= 9


@pytest.mark.parametrize("code", [c for _, c in SNIPPETS], ids=[i for i, _ in SNIPPETS])
def test_pattern_compiles_and_matches_eager(code):
    torch.manual_seed(0)
    call = re.search(r"tkx\.explore\((\w+), (.*)\)\.program\s*$", code.strip(), flags=re.S)
    assert call, "each snippet ends with tkx.explore(step, inputs).program"
    body = code.strip()[:call.start()]
    env = {"torch": torch, "tkx": tkx, "F": F, "math": math, "grad": grad, "grad_and_value": grad_and_value,
           "vmap": vmap}
    exec(compile(body + f"\n__step = {call.group(1)}\n__inputs = {call.group(2)}\n", "pattern.py", "exec"), env)
    check_step(env["__step"], env["__inputs"])
