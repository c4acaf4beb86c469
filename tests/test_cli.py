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
    fake.run_tour = lambda example: calls.append(example) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tkx.tour", fake)
    assert main(["tour"]) == 0
    assert main(["tour", "--example", "online"]) == 0
    assert calls == ["digits_mlp", "online"]


def test_tour_rejects_unknown_example(capsys):
    with pytest.raises(SystemExit) as info:
        main(["tour", "--example", "no_such_example"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_example" in err and "digits_mlp" in err
