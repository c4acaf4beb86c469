"""The README's Python samples run as written (the quick start must stay true): the stateful step
first, then the functional one."""

from __future__ import annotations

import re
from pathlib import Path

import torch


def test_readme_python_sample_runs(capsys):
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python sample"
    assert "state=(model, opt)" in blocks[0], "Using tkx starts with the stateful step"
    functional = next(b for b in blocks if "grad_and_value" in b)
    namespace: dict = {}
    exec(compile(functional, "README.md", "exec"), namespace)
    ref_loss, new_params = namespace["loss"], namespace["new_params"]
    eager_loss, eager_params = namespace["step"](*namespace["inputs"])
    assert torch.allclose(ref_loss, eager_loss, rtol=1e-5)
    assert all(torch.allclose(new_params[k], eager_params[k], rtol=1e-5, atol=1e-7) for k in eager_params)
    fused = namespace["fused"]  # the fused schedule and arena, run on the CPU
    assert torch.allclose(fused.output_tree()[0], eager_loss, rtol=1e-5)
    assert "program" in capsys.readouterr().out


def test_readme_stateful_sample_runs(capsys):
    import copy

    text = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    cut = block.index("exp = tkx.explore")
    namespace: dict = {}
    exec(compile(block[:cut], "README.md", "exec"), namespace)  # the model, the optimizer, the batch
    model = copy.deepcopy(namespace["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)  # as the README makes it
    x, y = namespace["x"], namespace["y"]
    want = torch.nn.functional.cross_entropy(model(x), y)
    want.backward()
    opt.step()
    exec(compile(block[cut:], "README.md", "exec"), namespace)
    torch.testing.assert_close(namespace["loss"], want.detach())
    for p, q in zip(namespace["model"].parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    out = capsys.readouterr().out
    assert "('0.weight', '0.bias', '2.weight')" in out and "verification PASSED" in out
