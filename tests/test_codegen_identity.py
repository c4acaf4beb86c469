"""The generated CUDA source of every zoo and decode example, under the option sets and code-generation
switches of ``tests/codegen_hashes.py``, hashes to the values recorded in ``tests/golden/codegen_hashes.json``.

A change meant to keep the kernels byte-identical must pass unchanged; a change meant to alter them
refreshes the record with ``scripts/codegen-hashes --update`` (and says so). Source only, no NVRTC.
"""

from __future__ import annotations

import codegen_hashes as H
import pytest


def _diff(got: dict, want: dict) -> list[str]:
    """Every hash computed in ``got`` that differs from the record ``want`` (or is not recorded)."""
    return [f"{name}/{key}: {h} != recorded {want.get(name, {}).get(key)}"
            for name, row in got.items() for key, h in row.items()
            if want.get(name, {}).get(key) != h]


def test_every_example_is_byte_identical():
    want = H.load()["fast"]
    got = H.source_hashes({k: H.FAST[k] for k in H.QUICK_SETS}, heavy=H.HEAVY)
    assert set(got) == set(want), "the examples changed: refresh with scripts/codegen-hashes --update"
    assert not _diff(got, want), "\n".join(_diff(got, want))


def test_switches_are_byte_identical():
    want = H.load()["switches"]
    got = H.switch_hashes(H.QUICK_SWITCH_EXAMPLES)
    assert not _diff(got, want), "\n".join(_diff(got, want))


def test_switches_select_different_code():
    """Each switch changes the kernel of at least one example (else it selects nothing)."""
    rec = H.load()
    for key in H.SWITCHES:
        assert any(rec["switches"][n][key] != rec["fast"][n]["sm_90a"] for n in rec["switches"]), key


@pytest.mark.slow
def test_fast_matrix_and_switches_are_byte_identical():
    want = H.load()
    got = H.source_hashes(H.FAST, heavy=H.HEAVY)
    assert not _diff(got, want["fast"]), "\n".join(_diff(got, want["fast"]))
    got = H.switch_hashes()
    assert not _diff(got, want["switches"]), "\n".join(_diff(got, want["switches"]))


@pytest.mark.slow
def test_slow_matrix_is_byte_identical():
    want = H.load().get("slow")
    if want is None:
        pytest.skip("no slow record: scripts/codegen-hashes --update --slow")
    got = H.source_hashes(H.SLOW)
    assert set(got) == set(want) and not _diff(got, want), "\n".join(_diff(got, want))
