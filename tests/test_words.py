"""Golden tests of the words every view uses: plural forms, the Explorer headline, decisions as sentences."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tkx
from tkx.explorer.headline import Facts, failure_headline, headline
from tkx.words import plural, plural_of


@pytest.mark.parametrize(("n", "word", "text"), [
    (0, "row", "0 rows"), (1, "row", "1 row"), (2, "row", "2 rows"),
    (1, "barrier", "1 barrier"), (6, "barrier", "6 barriers"),
    (1, "pass", "1 pass"), (5, "pass", "5 passes"),
    (1, "in-place update", "1 in-place update"), (3, "in-place update", "3 in-place updates"),
    (2, "CUDA line", "2 CUDA lines"), (2, "fusion candidate", "2 fusion candidates"),
    (2, "entry", "2 entries"), (2, "key", "2 keys"), (2, "index", "2 indices"),
])
def test_plural(n, word, text):
    assert plural(n, word) == text


def test_plural_of_and_override():
    assert plural_of("box") == "boxes" and plural_of("match") == "matches"
    assert plural(2, "datum", "data") == "2 data" and plural(1, "datum", "data") == "1 datum"


@pytest.fixture(scope="module")
def linreg():
    ex = tkx.examples.get("linear_regression")
    # one block: the views then name one block and one barrier
    return tkx.explore(ex.step_fn, ex.example_inputs, name="linear_regression", loss=ex.loss_output, mode="block")


def test_views_say_one_of_a_thing(linreg):
    s, a = linreg.schedule, linreg.arena
    assert str(s).splitlines()[0] == ("schedule linear_regression: 4 groups in 2 stages, 1 barrier "
                                      "(__syncthreads), 1 block x 256 threads")
    assert repr(s) == "<tkx.FusedSchedule linear_regression: 4 groups, 2 stages, 1 barrier, mode=block, 1x256>"
    h = s._repr_mimebundle_()["text/html"]
    assert "2 stages, 4 groups, 1 barrier (__syncthreads)" in h and "1 block × 256 threads" in h
    assert "1 barriers" not in h and "1 blocks" not in h and "1 group side by side" not in h
    assert repr(a) == "<tkx.ArenaPlan 2 slots, 256 B (lower bound 256 B, no reuse 256 B)>"
    one = tkx.examples.get("tiny_online")
    p = tkx.explore(one.step_fn, one.example_inputs, name="tiny_online").optimized
    assert repr(p) == "<tkx.Program tiny_online: 6 inputs, 25 ops, 5 outputs, 0 in-place updates>"
    single = p.replace(inputs=p.inputs[:1], ops=p.ops[:1], outputs=p.outputs[:1])
    assert repr(single) == "<tkx.Program tiny_online: 1 input, 1 op, 1 output, 0 in-place updates>"
    assert "1 rows" not in str(tkx.explore(one.step_fn, one.example_inputs).schedule)


def test_why_not_fused_reads_as_sentences():
    ex = tkx.examples.get("digits_mlp")
    s = tkx.explore(ex.step_fn, ex.example_inputs).schedule
    nf = s.why_not_fused("amax")
    assert isinstance(nf, list) and all(not d.fused for d in nf)
    assert str(nf).splitlines() == [
        "1. sub does not run in the epilogue of amax: the consumer has a different number of elements "
        "(rule legality, code illegal).",
        "2. amax and sub_2 do not share one loop: the consumer has a different number of elements "
        "(rule legality, code illegal).",
    ]
    assert repr(nf).startswith("2 decisions:\n1. sub does not run")
    gemm = [d for d in s.why_not_fused() if d.code == "gemm-operand"][0]
    assert repr(gemm) == (f"<FusionDecision {gemm.producer} is not inlined into {gemm.consumer}: a GEMM re-reads "
                          "each operand element once per tile, so the producer is materialised "
                          "(rule gemm-operand, code gemm-operand).>")
    assert repr(s.why_not_fused("mm")) == "0 decisions" and "dataclass" not in repr(nf)


BEFORE = Facts(barriers=6, stages=7, launch="1 block x 256 (block mode)", arena_bytes=76902, registers=215,
               spill_bytes=0, registers_from="NVRTC sm_90")


@pytest.mark.parametrize(("changed", "after", "line"), [
    ({}, BEFORE,
     "start: 6 barriers, 7 stages, 1 block x 256 (block mode), arena 75.1 KiB, 215 registers, no spills "
     "(NVRTC sm_90)"),
    ({"mode": "grid"}, Facts(12, 13, "132 blocks x 256 (grid mode)", 80000, 227, 0, "NVRTC sm_90"),
     "mode='grid': barriers 6 -> 12, stages 7 -> 13, launch 1 block x 256 (block mode) -> 132 blocks x 256 "
     "(grid mode), arena 75.1 KiB -> 78.1 KiB, registers 215 -> 227; same: no spills"),
    ({"tile_m": 32}, Facts(6, 7, "1 block x 256 (block mode)", 76902, 255, 96, "NVRTC sm_90"),
     "tile_m=32: registers 215 -> 255, spills 0 B -> 96 B; same: 6 barriers, 7 stages, "
     "1 block x 256 (block mode), arena 75.1 KiB"),
    ({"spin_limit": 1000}, BEFORE,
     "spin_limit=1000: nothing moved; same: 6 barriers, 7 stages, 1 block x 256 (block mode), arena 75.1 KiB, "
     "215 registers, no spills"),
    ({"benchmark": "mode=grid"}, Facts(1, 2, None, 512, None, None, "", 25.04),
     "benchmark='mode=grid': barriers 6 -> 1, stages 7 -> 2, arena 75.1 KiB -> 512 B, 25.0 µs/step"),
])
def test_headline_golden(changed, after, line):
    assert headline(changed, BEFORE, after) == line


def test_headline_after_a_benchmark_moves_the_time():
    a = Facts(1, 2, None, 512, us_per_step=30.0)
    b = Facts(1, 2, None, 512, us_per_step=22.5)
    assert headline({"tile_m": 16}, a, b) == "tile_m=16: µs/step 30.0 -> 22.5; same: 1 barrier, 2 stages, arena 512 B"


def test_failure_headline_never_says_recomputed_nothing():
    first = failure_headline({}, "capture", 3925.8, [], first=True)
    assert first == "start: stage capture failed after 3925.8 ms"
    later = failure_headline({"tile_m": 128}, "cuda", 120.04, ["schedule", "arena"])
    assert later == ("tile_m=128: stage cuda failed after 120.0 ms (computed schedule, arena first); "
                     "the last good state stays on screen")
    assert "recomputed nothing" not in first + later
    assert failure_headline({"tile_m": 7}, "options", 0.1, []).startswith("tile_m=7: invalid options after 0.1 ms")


# -- the product speaks of what it does, never of how it was made ---------------------------------

REPO = Path(__file__).resolve().parents[1]
#: Words about the making of tkx: work sessions, run names (s5-...), device calls, issue numbers, the
#: people and branches involved.
HISTORY_WORDS = re.compile(
    r"\bsessions? \d|\bs\d-[a-z]|\bcall \d\b|\b(?-i:call [A-D])\b|\bissues? #?\d+|\bthe lead\b|\blead's\b"
    r"|\bworktrees?\b|\bhelper'?s? (?:session|branch|call)|\bdevice calls?\b", re.IGNORECASE)
#: Files whose comments are being rewritten on another branch (the GEMM/GEMV emitters and the target
#: table): the lead empties this set after merging it; the test fails on an entry that is clean.
HISTORY_ALLOWED: set[str] = set()


def product_files() -> list[Path]:
    out = [REPO / "README.md"]
    for folder in ("tkx", "docs", "scripts", "notebooks"):
        out += [p for p in (REPO / folder).rglob("*") if p.is_file() and "_build" not in p.parts
                and "jupyter_execute" not in p.parts and "__pycache__" not in p.parts
                and p.suffix not in (".png", ".svg", ".pyc")]
    return out


def test_history_words_match_what_they_should():
    hits = ["session 5's calls", "results in s5-final-a/", "device call 1", "call B ran", "issue 12",
            "the lead's check", "in the worktree"]
    misses = ["the Explorer session", "to call a function", "calls 3 times", "a helper function", "lead dimensions",
              "sm_90a", "s_5"]
    assert all(HISTORY_WORDS.search(h) for h in hits)
    assert not any(HISTORY_WORDS.search(m) for m in misses)


def test_no_history_words_in_the_product():
    found, clean = [], set(HISTORY_ALLOWED)
    for path in product_files():
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        hits = [(text.count("\n", 0, m.start()) + 1, m.group()) for m in HISTORY_WORDS.finditer(text)]
        if rel in HISTORY_ALLOWED:
            if hits:
                clean.discard(rel)
            continue
        found += [f"{rel}:{line}: {word!r}" for line, word in hits]
    assert found == [], "words about how tkx was made (say what the code does instead):\n" + "\n".join(found)
    assert clean == set(), f"remove from HISTORY_ALLOWED (no such words left): {sorted(clean)}"
