"""Lookups by a wrong name or index raise one clear error saying what was given and what to use."""

from __future__ import annotations

import pytest
import torch

import tkx
import tkx.printer
from tkx.arena import StageIndexError
from tkx.errors import TkxError, UnknownOpError
from tkx.passes import PassError, UnknownPassError, register_pass, run_passes, unregister_pass


@pytest.fixture(scope="module")
def exp():
    ex = tkx.examples.get("digits_mlp")
    e = tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output)
    e.cuda  # noqa: B018 (computes the schedule, the arena and the source)
    return e


def _error(fn, *args):
    with pytest.raises(UnknownOpError) as info:
        fn(*args)
    assert isinstance(info.value, TkxError) and isinstance(info.value, KeyError)
    return str(info.value)


# -- FusedSchedule.why_not_fused / group_of / op ---------------------------------------------
@pytest.mark.parametrize("method", ["why_not_fused", "group_of", "op"])
def test_op_kind_lists_its_ops(exp, method):
    msg = _error(getattr(exp.schedule, method), "cast")
    assert msg == ("no op 'cast' in schedule digits_mlp; 'cast' is an op kind: its ops are _to_copy, _to_copy_1 "
                   "(use an op id)")


def test_group_of_kind_is_not_a_bare_key_error(exp):
    assert _error(exp.schedule.group_of, "maximum") == (
        "no op 'maximum' in schedule digits_mlp; 'maximum' is an op kind: its ops are relu (use an op id)")


def test_typo_suggests_close_op_ids(exp):
    msg = _error(exp.schedule.why_not_fused, "sum_33")
    assert msg.startswith("no op 'sum_33' in schedule digits_mlp; did you mean 'sum_3'")


def test_unrelated_name_lists_op_ids(exp):
    msg = _error(exp.schedule.why_not_fused, "zzzz")
    assert "op ids are names such as mm, add, relu" in msg


def test_group_id_given_for_an_op(exp):
    g = exp.schedule.groups["g0"]
    assert _error(exp.schedule.why_not_fused, "g0") == (
        f"no op 'g0' in schedule digits_mlp; 'g0' is a group id: its ops are {', '.join(g.ops)} (use an op id)")


def test_input_given_for_an_op(exp):
    name = exp.schedule.program.inputs[0].name
    assert _error(exp.schedule.group_of, name).endswith(f"{name!r} is a program input, not an op")


def test_printer_name_maps_to_the_op_id(exp):
    printed = tkx.printer.Namer(exp.schedule.program).names["sum_3"]
    assert f"{printed!r} is the printer's name of op 'sum_3' in this program (use the op id 'sum_3')" in \
        _error(exp.schedule.why_not_fused, printed)


def test_printer_number_maps_to_the_op_id(exp, monkeypatch):
    class Numbered:  # a printer that numbers values %0, %1, ... (inputs first, then ops)
        def __init__(self, program):
            bufs = [i.value.buffer for i in program.inputs] + [o.id for o in program.ops]
            self.names = {b: f"%{k}" for k, b in enumerate(bufs)}

    monkeypatch.setattr(tkx.printer, "Namer", Numbered)
    program = exp.schedule.program
    k = len(program.inputs) + [o.id for o in program.ops].index("sum_3")
    assert _error(exp.schedule.why_not_fused, f"%{k}") == (
        f"no op '%{k}' in schedule digits_mlp; IR value numbers are printer names: '%{k}' is the printer's name "
        "of op 'sum_3' in this program (use the op id 'sum_3')")
    assert "is the printer's name of input params['w1'], not an op" in _error(exp.schedule.op, "%0")


def test_unknown_printer_number_explains_op_ids(exp):
    msg = _error(exp.schedule.why_not_fused, "%9999")
    printed = tkx.printer.Namer(exp.schedule.program).names["mm"]
    assert msg == ("no op '%9999' in schedule digits_mlp; IR value names like '%9999' are printer names, not op ids, "
                   f"and no value of this program prints so (op 'mm' prints as {printed!r}); use an op id such as "
                   "mm, add, relu, mm_1, ... (58 in all)")


def test_known_ids_still_work(exp):
    s = exp.schedule
    assert s.why_not_fused("_to_copy")
    assert s.group_of("relu").id == "g0"
    assert s.op("relu").kind == "maximum"
    inlined = next(iter(sorted(s.inlined)))
    assert inlined in s.group_of(inlined).inlined  # the first group that inlines it (as documented)


# -- CudaSource.lines_of --------------------------------------------------------------------
def test_lines_of_unknown_name(exp):
    msg = _error(exp.cuda.lines_of, "relu1")
    assert msg.startswith("no op or group 'relu1' in the CUDA source of digits_mlp; did you mean 'relu'?")
    assert "Group ids: g0, g1, g2" in msg


def test_lines_of_kind(exp):
    msg = _error(exp.cuda.lines_of, "maximum")
    assert "'maximum' is an op kind: its ops are relu (use an op id). Group ids: g0, g1" in msg


def test_lines_of_known_names(exp):
    cuda = exp.cuda
    assert cuda.lines_of("relu") and cuda.lines_of("g0")
    for op in cuda.program.ops:  # a known op without lines of its own is (), not an error
        assert isinstance(cuda.lines_of(op.id), tuple)
    for gid in cuda.schedule.groups:
        assert isinstance(cuda.lines_of(gid), tuple)


# -- ArenaPlan.live_at ------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [99, -1])
def test_live_at_out_of_range(exp, stage):
    n = len(exp.schedule.stages)
    with pytest.raises(IndexError) as info:
        exp.arena.live_at(stage)
    assert isinstance(info.value, StageIndexError) and isinstance(info.value, TkxError)
    assert str(info.value) == f"no stage {stage} in the arena plan of digits_mlp: it has {n} stages, 0..{n - 1}"


def test_live_at_group_id(exp):
    with pytest.raises(StageIndexError, match=r"got group id 'g0'; use plan.live_at\(plan.schedule.stage_of"):
        exp.arena.live_at("g0")


def test_live_at_in_range(exp):
    live = [exp.arena.live_at(k) for k in range(len(exp.schedule.stages))]
    assert sum(map(len, live)) >= len(exp.arena.slots)


# -- passes -----------------------------------------------------------------------------------
def test_unregister_pass_missing_ok():
    unregister_pass("lookup_errors_never_registered", missing_ok=True)
    with pytest.raises(UnknownPassError, match="no pass named 'lookup_errors_never_registered'"):
        unregister_pass("lookup_errors_never_registered")

    @register_pass("lookup_errors_identity")
    def identity(program):
        return program

    unregister_pass("lookup_errors_identity", missing_ok=True)
    unregister_pass("lookup_errors_identity", missing_ok=True)  # re-running a cleanup cell


def test_run_passes_on_an_exploration(exp):
    with pytest.raises(PassError) as info:
        run_passes(exp)
    assert str(info.value) == "run_passes expects a tkx Program, got Exploration: pass exp.program (or use exp.passes)"


def test_run_passes_on_other_objects(exp):
    with pytest.raises(PassError, match="got CapturedGraph: pass its .program"):
        run_passes(exp.captured)
    with pytest.raises(PassError, match="got PassTrace: pass trace.output"):
        run_passes(exp.passes)
    with pytest.raises(PassError, match=r"got int: capture one first"):
        run_passes(3)


# -- capture: example inputs that do not match the step's parameters ------------------------
def train_step(params, x, y):
    return ((x @ params["w"] - y) ** 2).mean()


def one_arg(x):
    return (x * 2).sum()


def test_capture_missing_argument():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(train_step, ({"w": torch.randn(3, 2)}, torch.randn(4, 3)))
    err = info.value
    assert err.kind == "bad-call"
    assert err.what == ("step_fn(*example_inputs) raised TypeError: "
                        "train_step() missing 1 required positional argument: 'y'")
    assert err.hint == ("pass example_inputs as a tuple matching step_fn's parameters: "
                        "train_step(params, x, y) -> example_inputs=(params, x, y)")
    assert err.source is not None and "tkx.capture(train_step" in err.source.code


def test_capture_too_many_arguments():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(one_arg, (torch.randn(4, 3), torch.randn(3)))
    assert info.value.kind == "bad-call"
    assert info.value.hint.endswith("one_arg(x) -> example_inputs=(x,)")


def test_type_error_inside_the_step_is_not_a_bad_call():
    def bad_inside(x, y):
        return torch.sum(x, y, 3, 4).sum()

    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(bad_inside, (torch.randn(4, 3), torch.randn(3)))
    # the user's own call raised (eager raises the same TypeError): not tkx's "unsupported-op"
    assert info.value.kind == "step-raised" and "TypeError" in str(info.value)
