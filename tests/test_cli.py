"""The ``tkx`` command line: version, help, and dispatch to the tour."""

from __future__ import annotations

import sys
import types

import pytest

from tkx.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == "tkx 0.1.0"


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "tour" in capsys.readouterr().out


def test_tour_dispatches_to_run_tour(monkeypatch):
    calls = []
    fake = types.ModuleType("tkx.tour")
    fake.run_tour = lambda example, html=None, brief=False: calls.append((example, html, brief)) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tkx.tour", fake)
    assert main(["tour"]) == 0
    assert main(["tour", "--example", "online", "--brief"]) == 0
    assert main(["tour", "--html", "r.html"]) == 0
    assert calls == [("digits_mlp", None, False), ("online", None, True), ("digits_mlp", "r.html", False)]


def test_tour_rejects_unknown_example(capsys):
    with pytest.raises(SystemExit) as info:
        main(["tour", "--example", "no_such_example"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_example" in err and "digits_mlp" in err


# -- tkx tour --brief --------------------------------------------------------------------------------
def test_tour_brief_shows_the_kernel_body_not_the_prelude():
    import io

    from rich.console import Console

    from tkx.tour import BRIEF_KERNEL_LINES, run_tour

    out = io.StringIO()
    assert run_tour("linear_regression", console=Console(file=out, width=160, soft_wrap=True), brief=True) == 0
    text = out.getvalue()
    cuda = text[text.index("6. CUDA source"):]
    assert 'extern "C" __global__' in cuda and "tkx_bf16_to_float" not in cuda
    assert "more kernel lines: see exp.cuda.body()" in cuda
    assert len(cuda.split("NVRTC")[0].splitlines()) <= BRIEF_KERNEL_LINES + 6
    full = io.StringIO()
    run_tour("linear_regression", console=Console(file=full, width=160, soft_wrap=True))
    assert len(full.getvalue()) > len(text)


def test_cuda_body_starts_at_the_kernel_entry():
    import tkx

    ex = tkx.examples.get("linear_regression")
    src = tkx.explore(ex.step_fn, ex.example_inputs).cuda
    first = src.body(5).splitlines()
    entry = f'extern "C" __global__ void __maxnreg__({src.config.max_registers}) tkx_step('
    assert first[0] == f"{src.kernel_start}  {entry}"
    assert len(first) == 6 and first[-1].startswith("... ") and f"lines 1-{src.kernel_start - 1}" in first[-1]
    assert src.body(numbered=False).splitlines()[0].startswith('extern "C"')


# -- tkx report FILE.py:STEP --inputs FILE.py:MAKE_INPUTS --------------------------------------------
STEP_FILE = """
import torch

def step(w, x, y):
    def loss_fn(w):
        return ((x @ w - y) ** 2).mean()
    g, loss = torch.func.grad_and_value(loss_fn)(w)
    return loss, w - 0.1 * g

def make_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 1, generator=g), torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)

def bad_step(w, x, y):
    return torch.nonzero(w)
"""


@pytest.fixture
def step_file(tmp_path, monkeypatch):
    path = tmp_path / "mystep.py"
    path.write_text(STEP_FILE)
    monkeypatch.chdir(tmp_path)
    return path


def test_report_command_writes_the_report(step_file, capsys):
    assert main(["report", "mystep.py:step", "--inputs", "mystep.py:make_inputs", "--option", "mode=grid",
                 "--option", "tile_m=32"]) == 0
    out = step_file.parent / "mystep-step.html"
    assert f"tkx report of step (mystep.py): {out.name}" in capsys.readouterr().out
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "tkx report: step" in page
    assert "Options(tile_m=32, mode=&#x27;grid&#x27;)" in page and "tkx_step" in page
    assert main(["report", f"{step_file}:step", "--inputs", f"{step_file}:make_inputs", "-o", "x.html"]) == 0
    assert (step_file.parent / "x.html").exists()


def test_report_command_writes_the_predicted_timeline_as_a_trace(step_file, capsys):
    from tkx.dataflow.trace import check_trace, read_trace

    assert main(["report", "mystep.py:step", "--inputs", "mystep.py:make_inputs", "--option", "mode=grid",
                 "-o", "r.html", "--trace", "out/t.json"]) == 0
    assert "the predicted timeline (task VM) as a trace for Perfetto: out/t.json" in capsys.readouterr().out
    trace = read_trace(step_file.parent / "out" / "t.json")
    assert check_trace(trace) == [] and trace["otherData"]["tkx"]["name"] == "step"
    assert [e for e in trace["traceEvents"] if e.get("cat") == "task"]


@pytest.mark.parametrize(("argv", "message"), [
    (["report", "mystep.py:nope", "--inputs", "mystep.py:make_inputs"],
     "the step: 'mystep.py' has no function 'nope' (its functions: bad_step, make_inputs, step)"),
    (["report", "missing.py:step", "--inputs", "mystep.py:make_inputs"],
     "the step: no file 'missing.py' (from 'missing.py:step'); give the path of a .py file"),
    (["report", "mystep.py", "--inputs", "mystep.py:make_inputs"],
     "the step 'mystep.py' is not FILE.py:FUNCTION (for example model.py:train_step)"),
    (["report", "mystep.py:step", "--inputs", "mystep.py:make_inputs", "--option", "tile_m=7"],
     "invalid option tile_m=7: allowed one of 16, 32, 64, 128"),
    (["report", "mystep.py:step", "--inputs", "mystep.py:make_inputs", "--option", "grid"],
     "--option 'grid' is not K=V (for example --option mode=grid)"),
])
def test_report_command_errors_are_one_sentence(step_file, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"tkx: error: {message}")


def test_report_command_on_a_step_tkx_cannot_compile(step_file, capsys):
    assert main(["report", "mystep.py:bad_step", "--inputs", "mystep.py:make_inputs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tkx report: UnsupportedError: ") and "nonzero" in err and "Traceback" not in err


def test_parse_options_values():
    from tkx.user_step import parse_options

    assert parse_options(["mode=grid", "tile_m=32", "exact=True", "max_blocks=None", "passes=dce,cse"]) == {
        "mode": "grid", "tile_m": 32, "exact": True, "max_blocks": None, "passes": ("dce", "cse")}
