"""On a GPU: a poisoned protocol compiled into the kernel is named by the kernel.

The counters kernel is generated from a task DAG with a fault planted (``tkx.dataflow.build`` wrapped
so the code generator receives the poisoned DAG). A wait whose threshold can never be met spins until
``Options.spin_limit`` and reports error 4 with the waiting task, the counter, its value and the
threshold; the same fault the static checker and the task VM report on the CPU.

Every poison (``Poison.run_kernel``): the kernel generated with the fault planted and the protocol audit
(``tkx.codegen.generate(plant=..., audit=True)``) runs twice from zeroed sync words; the audit of the words
it leaves (``tkx.dataflow.audit``) names the poison, whether or not the race it opens changed a result;
the same kernel generated from the sound protocol runs clean under the same audit."""

from __future__ import annotations

import pytest
import torch
from stalled_wait import check_stalled_wait

import tkx
import tkx.dataflow
import tkx.runtime
from tkx import puzzles
from tkx.examples import get
from tkx.options import Options

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEV = "cuda"


def _poisoned_runner(q, monkeypatch):
    original = tkx.dataflow.build
    monkeypatch.setattr(tkx.dataflow, "build", lambda *a, **k: q.plant(original(*a, **k)))
    ex = get(q.example)
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV), Options(mode="grid", sync="counters",
                                                                           spin_limit=200_000),
                               name=q.example, loss=ex.loss_output)
    monkeypatch.setattr(tkx.dataflow, "build", original)
    return runner, ex


def test_threshold_too_high_is_named_by_the_spin_limit(monkeypatch):
    q = puzzles.poison("threshold-one-too-high")
    assert q.caught_by_checker() and q.caught_by_vm()
    runner, ex = _poisoned_runner(q, monkeypatch)
    with pytest.raises(tkx.runtime.KernelError) as info:
        runner(*ex.make_inputs(0, DEV))
    err = info.value
    assert err.code == 4, str(err)
    check_stalled_wait(runner.source.dag, str(err))  # the poisoned wait, or one on a group it holds up
    runner.check_status()  # the error words were cleared: the next call may run


def test_sound_protocol_runs_with_the_same_spin_limit():
    ex = get("tiny_online")
    runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV), Options(mode="grid", sync="counters",
                                                                           spin_limit=200_000),
                               name="tiny_online", loss=ex.loss_output)
    for _ in range(2):
        runner.verify(seeds=(0,), strict=True)
    runner.check_status()


@pytest.mark.parametrize("q", puzzles.POISONS, ids=[q.name for q in puzzles.POISONS])
def test_each_poison_is_named_by_the_kernel(q):
    findings = q.run_kernel(launches=2, device=DEV)
    assert findings and {f.poison for f in findings} == {q.name}, [str(f) for f in findings]


@pytest.mark.parametrize("q", puzzles.POISONS, ids=[q.name for q in puzzles.POISONS])
def test_the_sound_protocol_passes_the_same_audit(q):
    assert q.run_kernel(planted=False, launches=2, device=DEV) == []
