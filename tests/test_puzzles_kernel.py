"""The poisons compiled into the kernel (tkx.codegen.generate(plant=..., audit=True)), without a GPU: each
poisoned kernel compiles with NVRTC and differs from its sound protocol's kernel exactly at the planted
fault; the post-run audit (tkx.dataflow.audit) names each poison from the sync words its kernel would leave
and finds nothing in a sound protocol's words. tests/test_puzzles_gpu.py runs the kernels on the GPU."""

from __future__ import annotations

import difflib
import re
from functools import cache

import pytest

from tkx import puzzles
from tkx.codegen.nvrtc import nvrtc_available
from tkx.dataflow.audit import audit, audit_words, layout
from tkx.errors import TkxError
from tkx.options import Options

NAMES = [q.name for q in puzzles.POISONS]
ARCH = "sm_90a"


@cache
def sources(name: str):
    q = puzzles.poison(name)
    return q.source(planted=False, arch=ARCH), q.source(planted=True, arch=ARCH)


def changed(name: str) -> tuple[list[str], list[str]]:
    clean, broken = sources(name)
    lines = list(difflib.unified_diff(clean.text.splitlines(), broken.text.splitlines(), lineterm="", n=0))
    removed = [x[1:].strip() for x in lines if x.startswith("-") and not x.startswith("---")]
    added = [x[1:].strip() for x in lines if x.startswith("+") and not x.startswith("+++")]
    return removed, added


def _wait_of(line: str) -> tuple[int, int]:
    m = re.search(r"tkx_wait\(sync, tkx_epoch, status, (\d+), (\d+)u,", line)
    assert m, line
    return int(m.group(1)), int(m.group(2))


def test_the_clean_default_kernel_has_no_audit():
    """The audit and the fault helpers are emitted only on request: the default counters kernel is unchanged."""
    from tkx.examples import get
    from tkx.pipeline import lower

    ex = get("tiny_online")
    src = lower(ex.step_fn, ex.example_inputs, Options(mode="grid", sync="counters", arch=ARCH), name="tiny_online")
    assert src.audit_base is None and "tkx_audit" not in src.text and "planted fault" not in src.text
    clean, _ = sources("threshold-off-by-one")
    assert clean.audit_base is not None and "tkx_audit_wait(" in clean.text and "planted fault:" not in \
        clean.text.split("===== end of tkx prelude")[1]
    assert clean.sync_words == src.sync_words + audit_words(clean.dag)


def test_fence():
    removed, added = changed("missing-release-fence")
    g = next(iter(sources("missing-release-fence")[1].dag.unfenced))
    assert len(removed) == 2 and f"publish this tile of {g}" in removed[0] and "tkx_audit_publish" in removed[1]
    assert len(added) == 1 and added[0].startswith("tkx_task_done_unfenced(") and g in added[0]


@pytest.mark.parametrize("name, delta", [("threshold-off-by-one", -1), ("threshold-one-too-high", 1)])
def test_threshold(name, delta):
    removed, added = changed(name)
    assert len(removed) == len(added) == 2 and "tkx_audit_wait" in removed[1] and "tkx_audit_wait" in added[1]
    (c0, t0), (c1, t1) = _wait_of(removed[0]), _wait_of(added[0])
    assert c0 == c1 and t1 == t0 + delta and f", {c1}, {t1}u);" in added[1]


def test_wrong_counter():
    removed, added = changed("wait-on-wrong-counter")
    assert len(removed) == len(added) == 2
    (c0, t0), (c1, t1) = _wait_of(removed[0]), _wait_of(added[0])
    assert c0 != c1 and t0 == t1 and removed[1].split("(")[1].split(",")[0] == added[1].split("(")[1].split(",")[0]


def test_epoch():
    removed, added = changed("epoch-not-advanced")
    assert [x for x in removed if x != "}"] == ["tkx_counters_exit(sync);  // the last block out advances the epoch"]
    assert [x for x in added if x != "}"] == ["tkx_counters_exit_frozen(sync);  // planted fault: the epoch is "
                                              "not advanced"]


def test_skipped_barrier():
    removed, added = changed("barrier-skipped-by-one-block")
    assert removed and all(x.startswith(("if (!tkx_wait(", "tkx_audit_wait(")) for x in removed)
    assert added[0].startswith("if (blockIdx.x != 0) {  // planted fault: block 0 skips")
    guarded = [x for x in added if not x.startswith(("if (blockIdx.x != 0)", "}"))]
    assert sorted(guarded) == sorted(removed)  # the same waits, now inside the planted condition
    assert added.count("if (blockIdx.x != 0) {  // planted fault: block 0 skips this wait") == len(removed) // 2


def test_slot_reuse():
    clean, broken = sources("slot-reused-early")
    moved = [b for b, s in broken.arena.slots.items() if s.offset != clean.arena.slots[b].offset]
    assert len(moved) == 1
    old, new = clean.arena.slots[moved[0]].offset, broken.arena.slots[moved[0]].offset
    removed, added = changed("slot-reused-early")
    assert removed and len(removed) == len(added)
    for a, b in zip(removed, added):
        assert f"arena + {old})" in a and a.replace(f"arena + {old})", f"arena + {new})") == b, (a, b)


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
@pytest.mark.parametrize("name", NAMES)
def test_poisoned_kernel_compiles_with_nvrtc(name):
    for src in sources(name):
        report = src.check(ARCH)
        assert report.registers > 0


# -- the audit, on the words each kernel leaves (a model of the emitted code, launch by launch) -------------

def model_words(src, launches: int, blocks: int = 3) -> list[int]:
    """The sync words the audited kernel of ``src`` leaves after ``launches`` launches on ``blocks`` blocks if
    no wait stalls: what its emitted statements count (a wait's pass, a fenced publish, the epoch)."""
    dag, base = src.dag, src.audit_base
    w = [0] * src.sync_words
    w[2] = launches * dag.epoch_step
    n = len(dag.counters)
    for c in dag.counters:
        w[12 + c.index] = launches * dag.items[c.group]
        w[base + c.index] = 0 if c.group in dag.unfenced else launches * dag.items[c.group]
    on_block = {g: [0] * blocks for g in dag.order}
    for b, tasks in enumerate(dag.task_lists(blocks)):
        for t in tasks:
            on_block[t.group][b] += 1
    for j, (g, _k, wt) in enumerate(layout(dag)):
        skipped = sum(on_block[g][b] for b, x in dag.skips if x == g)
        w[base + n + 2 * j] = launches * (dag.items[g] - skipped)
        w[base + n + 2 * j + 1] = (wt.counter << 16) | wt.threshold
    return w


@pytest.mark.parametrize("name", [n for n in NAMES if n != "threshold-one-too-high"])
def test_audit_names_each_poison(name):
    clean, broken = sources(name)
    assert audit(clean, model_words(clean, 2), 2) == []
    found = audit(broken, model_words(broken, 2), 2)
    assert found and {f.poison for f in found} == {name}, [str(f) for f in found]


def test_audit_names_a_stalled_wait_and_refuses_an_unaudited_kernel():
    _, broken = sources("threshold-one-too-high")
    words = model_words(broken, 1)
    g, k, w = next((g, k, w) for g, k, w in layout(broken.dag) if w.threshold > broken.dag.items[
        broken.dag.counters[w.counter].group])
    words[4], words[7], words[8], words[9] = 4, (broken.dag.order.index(g) << 16) | w.counter, w.threshold - 1, \
        w.threshold
    assert [f.poison for f in audit(broken, words, 1)] == ["threshold-one-too-high"]
    # the first block to give up may wait on a sound counter the unreachable wait holds up (as on the H200)
    sound = next((g2, w2) for g2, _, w2 in layout(broken.dag)
                 if w2.threshold <= broken.dag.counters[w2.counter].threshold)
    words[7], words[8], words[9] = (broken.dag.order.index(sound[0]) << 16) | sound[1].counter, 0, sound[1].threshold
    held = audit(broken, words, 1)
    assert [f.poison for f in held] == ["threshold-one-too-high"] and "holds up" in str(held[0])
    assert f"for {w.threshold} tiles" in str(held[0])
    from tkx.examples import get
    from tkx.pipeline import lower

    ex = get("tiny_online")
    src = lower(ex.step_fn, ex.example_inputs, Options(mode="grid", sync="counters", arch=ARCH), name="tiny_online")
    with pytest.raises(TkxError, match="no protocol audit"):
        audit(src, [0] * src.sync_words, 1)


def test_audit_refuses_words_too_short_or_naming_a_counter_the_kernel_lacks():
    clean, _ = sources("threshold-off-by-one")
    words = model_words(clean, 1)
    with pytest.raises(TkxError, match="sync words"):
        audit(clean, words[: clean.audit_base], 1)
    assert layout(clean.dag)  # the first wait site's log entry, (counter << 16) | threshold, names no counter
    words[clean.audit_base + len(clean.dag.counters) + 1] = (len(clean.dag.counters) + 5) << 16
    with pytest.raises(TkxError, match="overwritten"):
        audit(clean, words, 1)


def test_a_planted_fault_needs_the_counters_protocol():
    from tkx.codegen import generate
    from tkx.examples import get
    from tkx.pipeline import _context, compute

    ex = get("tiny_online")
    plan = compute("arena", _context(ex.step_fn, ex.example_inputs, Options(mode="grid", arch=ARCH), "t", 0), {})
    with pytest.raises(TkxError, match="counters protocol"):
        generate(plan.schedule, plan, audit=True)


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC unavailable")
def test_each_poisoned_kernel_has_its_own_compile_cache_entry():
    """The faults are not options: what keys the compiled kernel is its text, so each poison, its sound
    protocol and the unaudited default kernel get distinct cache entries."""
    from tkx.examples import get
    from tkx.pipeline import lower
    from tkx.runtime.kernel import nvrtc_cache_key

    ex = get("tiny_online")
    default = lower(ex.step_fn, ex.example_inputs, Options(mode="grid", sync="counters", arch=ARCH), name="tiny_online")
    keys = {nvrtc_cache_key(default.text, ARCH)[0]}
    for name in NAMES:
        if puzzles.poison(name).example == "tiny_online":
            keys |= {nvrtc_cache_key(src.text, ARCH)[0] for src in sources(name)}
    texts = {default.text} | {src.text for n in NAMES if puzzles.poison(n).example == "tiny_online"
                              for src in sources(n)}
    assert len(keys) == len(texts) >= 7
