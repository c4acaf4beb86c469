"""An Exploration recomputes its pass trace and schedule when a pass or a fusion rule changes after
they were computed (a notebook registers rules after exploring), and nvrtc_available's truthiness."""

import pytest
import torch

import tkx
from tkx.codegen.nvrtc import NvrtcStatus, nvrtc_available
from tkx.passes import unregister_pass
from tkx.schedule import remove_fusion_rule


def _step(p, x):
    return torch.relu(x @ p["w"]).sum()


def _exp():
    return tkx.explore(_step, ({"w": torch.randn(8, 4)}, torch.randn(16, 8)), name="relu_sum")


def test_registering_a_rule_after_exploring_recomputes_the_schedule():
    exp = _exp()
    before = exp.schedule
    arena_before = exp.arena

    @tkx.fusion_rule("test-stale-no-epilogue", kinds=("epilogue",), replace=True)
    def _no_epilogue(c):
        return tkx.keep("test-stale", "not fused: test")

    try:
        after = exp.schedule
        assert after is not before
        assert any(d.rule == "test-stale-no-epilogue" for d in after.decisions)
        assert exp.arena is not arena_before
        assert exp.recomputed == ["the user fusion rules changed: recomputing schedule, arena"]
        # A second access is cached again.
        assert exp.schedule is after
    finally:
        remove_fusion_rule("test-stale-no-epilogue")
    # Removing it is a change too: the schedule comes back without the rule's decisions.
    again = exp.schedule
    assert not any(d.rule == "test-stale-no-epilogue" for d in again.decisions)
    assert len(exp.recomputed) == 2


def test_replacing_a_registered_pass_recomputes():
    seen = []

    @tkx.register_pass("test_stale_pass", replace=True)
    def first(program):
        seen.append("first")
        return program

    try:
        exp = _exp().with_options(passes=("cse", "test_stale_pass", "dce"))
        trace = exp.passes
        schedule = exp.schedule

        @tkx.register_pass("test_stale_pass", replace=True)
        def second(program):
            seen.append("second")
            return program

        assert exp.passes is not trace
        assert exp.schedule is not schedule
        assert seen == ["first", "second"]
        assert exp.recomputed == ["the registered passes changed: recomputing passes, schedule"]
        # with_options on a stale exploration does not hand the stale stages on.
        child = exp.with_options(tile_m=32)
        assert child.passes is exp.passes
    finally:
        unregister_pass("test_stale_pass")


def test_unchanged_registries_keep_the_cache():
    exp = _exp()
    s = exp.schedule
    assert exp.schedule is s and exp.recomputed == []


def test_nvrtc_status_is_falsy_when_unavailable():
    assert not NvrtcStatus(False, "no NVRTC")
    assert NvrtcStatus(True, "NVRTC 13.0")
    ok, why = NvrtcStatus(False, "no NVRTC")
    assert (ok, why) == (False, "no NVRTC")
    status = nvrtc_available()
    assert bool(status) is status.ok and isinstance(status.detail, str) and status.detail


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
