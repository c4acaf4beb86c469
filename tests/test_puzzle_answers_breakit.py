"""Malformed answers to the weight-prefetch puzzle are wrong answers with a hint naming what is wrong
(missing or unknown units, a value that is not None, 'start' or a group id), never a traceback."""

from __future__ import annotations

import pytest

from tkx import puzzles


@pytest.fixture(scope="module")
def prefetch():
    return puzzles.get("prefetch-1")


@pytest.mark.parametrize("edit, expected", [
    (lambda a, k: None, "not a NoneType"),
    (lambda a, k: list(a.values()), "not a list"),
    (lambda a, k: {u: x for u, x in a.items() if u != k}, "missing ['l0.attn']"),
    (lambda a, k: {**a, "bogus": None}, "no unit called ['bogus']"),
    (lambda a, k: {**a, k: "g99"}, "'g99' is neither"),
    (lambda a, k: {**a, k: ["start"]}, "['start'] is neither"),
    (lambda a, k: {**a, k: {"g0": 1}}, "is neither"),
    (lambda a, k: {**a, k: 3}, "3 is neither"),
])
def test_a_malformed_prefetch_answer_is_a_wrong_answer_naming_the_fault(prefetch, edit, expected):
    answer = edit(prefetch.blank(), "l0.attn")
    verdict = puzzles.check(prefetch, answer)
    assert not verdict.ok
    assert any(expected in p for p in verdict.problems), verdict.problems
    assert "p.blank()" in verdict.hint


def test_a_unit_larger_than_the_budget_is_never_prefetched(prefetch):
    from tkx.dataflow.prefetch import plan, static_problems

    small = min(u.nbytes for u in prefetch.units())
    assert static_problems(prefetch.dag, prefetch.solution(), prefetch.budget) == []
    assert plan(prefetch.dag, small - 1, blocks=prefetch.blocks) == prefetch.blank()
    one = {**prefetch.blank(), prefetch.units()[0].name: "start"}
    assert any("alone holds" in p for p in static_problems(prefetch.dag, one, small - 1))


def test_fewer_than_one_stream_is_refused(prefetch):
    import tkx
    from tkx.dataflow.prefetch import simulate

    with pytest.raises(tkx.TkxError, match="streams"):
        simulate(prefetch.dag, prefetch.blank(), blocks=2, streams=0)
