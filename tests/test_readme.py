"""The README's Python sample runs as written (the quick start must stay true)."""

from __future__ import annotations

import re
from pathlib import Path

import torch


def test_readme_python_sample_runs(capsys):
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python sample"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    ref_loss, new_params = namespace["loss"], namespace["new_params"]
    eager_loss, eager_params = namespace["step"](*namespace["inputs"])
    assert torch.allclose(ref_loss, eager_loss, rtol=1e-5)
    assert all(torch.allclose(new_params[k], eager_params[k], rtol=1e-5, atol=1e-7) for k in eager_params)
    fused = namespace["fused"]  # the fused schedule and arena, run on the CPU
    assert torch.allclose(fused.output_tree()[0], eager_loss, rtol=1e-5)
    assert "program" in capsys.readouterr().out
