"""Run a training step through every CPU stage of tkx and compare it with eager PyTorch.

``check_step(step, inputs)`` captures the step, runs the passes, schedules it, plans the
arena, generates the CUDA source, compiles it with NVRTC for sm_80 and sm_90 (when NVRTC is
available) and runs the reference interpreter and the schedule interpreter on copies of the
inputs; both must match eager on the outputs and on every in-place update. Returns the
exploration for further checks.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

import tkx
from tkx.codegen.nvrtc import nvrtc_available
from tkx.schedule.interpreter import run as run_schedule

#: Zoo examples whose kernels take NVRTC tens of seconds per compile: the zoo-wide option matrices run
#: them with the default options only; tests/test_models.py puts them through every CPU stage.
LARGE_EXAMPLES = frozenset({"gpt_block", "llama_block", "cnn_digits"})


def clone(tree):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _close(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float, atol: float) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs eager {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs eager {want.dtype}"
    if want.dtype in (torch.int64, torch.int32, torch.bool):
        assert torch.equal(got, want), f"{what}: {got} vs eager {want}"
        return
    ok = torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True)
    assert ok, f"{what}: max abs diff {(got.double() - want.double()).abs().max().item():.3g}"


def check_step(step, inputs, *, rtol: float = 1e-4, atol: float = 1e-5, nvrtc: bool = True,
               archs: tuple[str, ...] = ("sm_80", "sm_90"), **options):
    exp = tkx.explore(step, inputs, **options)
    eager_inputs = clone(inputs)
    eager_out, _ = tree_flatten(step(*eager_inputs))
    eager_in, _ = tree_flatten(eager_inputs)
    program = exp.optimized
    for name, run in (("reference", lambda x: tkx.reference.run(program, x, update_inputs=True)),
                      ("schedule interpreter", lambda x: run_schedule(exp.schedule, exp.arena, x,
                                                                      update_inputs=True))):
        mine = clone(inputs)
        result = run(mine)
        for k, (got, want) in enumerate(zip(result.outputs, eager_out)):
            _close(got, want, f"{name}: output {k}", rtol, atol)
        mine_flat, _ = tree_flatten(mine)
        for k, (got, want) in enumerate(zip(mine_flat, eager_in)):
            if isinstance(got, torch.Tensor):
                _close(got, want, f"{name}: input {k} after the step", rtol, atol)
    cuda = exp.cuda
    if nvrtc and nvrtc_available():
        for arch in archs:
            report = cuda.check(arch)
            assert report.spill_bytes == 0, f"{arch}: {report}"
    return exp
