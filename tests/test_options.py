"""Options: defaults, per-field validation, cross-field checks, replace, widget metadata."""

from __future__ import annotations

import dataclasses

import pytest

import tkx
from tkx.options import Options, OptionsError

FIELDS = ["fuse_pointwise", "fuse_epilogues", "fuse_reductions", "fuse_rows", "fuse_attention",
          "tile_m", "tile_n", "tile_k", "threads_per_block", "blocks_per_sm", "max_blocks", "split_k", "gemm_copy",
          "mode", "fp32_math", "arch", "exact",
          "passes", "rules", "backend", "spin_limit", "sync", "timeline",
          "grid_barrier", "cheap_int_math", "wgmma_min_macs", "wgmma_in_flight", "split_k_final", "split_k_min_steps",
          "epilogue_vector", "epilogue_prefetch", "tensormap_prefetch", "gemv_prefetch", "gemv_ring", "weight_prefetch",
          "gemm_cluster", "cluster_scope", "cluster_multicast", "outline"]
#: The fields that select a variant of the generated code (each also checked by tests/test_codegen_identity.py).
CODEGEN_SWITCHES = {"grid_barrier": "generation", "cheap_int_math": False, "wgmma_min_macs": 0, "wgmma_in_flight": 0,
                    "split_k_final": "last-slice", "split_k_min_steps": 4, "epilogue_vector": False,
                    "epilogue_prefetch": True, "tensormap_prefetch": True, "gemm_cluster": "on",
                    "cluster_scope": "cta", "cluster_multicast": False, "outline": "on", "gemv_prefetch": 2,
                    "weight_prefetch": True, "gemv_ring": 8}


def test_defaults_are_valid_and_documented():
    o = Options()
    assert [f.name for f in dataclasses.fields(o)] == FIELDS
    assert (o.fuse_pointwise, o.fuse_epilogues, o.fuse_reductions) == (True, True, True)
    assert (o.tile_m, o.tile_n, o.tile_k, o.threads_per_block) == (64, 64, 32, 256)
    assert (o.blocks_per_sm, o.max_blocks, o.split_k, o.mode) == (1, None, "auto", "auto")
    assert (o.fp32_math, o.exact, o.passes) == ("simt", False, None)
    assert (o.backend, o.spin_limit) == ("nvrtc", 2_000_000)
    assert (o.sync, o.timeline) == ("barrier", False)
    assert repr(o) == "Options()"
    assert o.changed() == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.tile_m = 32  # type: ignore[misc]


def test_codegen_switches_are_validated_keyed_and_invalidate_the_schedule():
    from tkx import pipeline

    o = Options()
    for name, value in CODEGEN_SWITCHES.items():
        changed = o.replace(**{name: value})
        assert changed.key() != o.key() and changed.changed() == {name: value}, name
        assert pipeline.first_stage_of(name) == "schedule", name
    for name, bad in (("grid_barrier", "fast"), ("cheap_int_math", 1), ("wgmma_min_macs", -1),
                      ("wgmma_in_flight", 2), ("split_k_final", "last_slice"), ("split_k_min_steps", 0),
                      ("gemm_cluster", True), ("cluster_scope", "gpu"), ("outline", True),
                      ("gemv_prefetch", 5)):
        with pytest.raises(OptionsError) as info:
            Options(**{name: bad})
        assert info.value.field == name


def test_every_valid_choice_is_accepted():
    for name, _default, allowed, _ in Options.fields_info():
        values = allowed[1:3] if allowed and allowed[0] == "range" else allowed
        for v in values:
            if v is None and name != "max_blocks":
                continue  # an open upper end of a range
            if name in ("tile_m", "tile_n"):
                continue  # checked with a matching thread count below
            if name == "passes":
                v = (v,)
            if name == "threads_per_block" and v == 64:
                o = Options(threads_per_block=64, tile_m=32, tile_n=32)
            elif name == "threads_per_block" and v == 1024:
                o = Options(threads_per_block=1024, tile_m=128, tile_n=128)
            elif name == "blocks_per_sm" and v == 8:
                o = Options(blocks_per_sm=8, threads_per_block=256)
            elif name == "fp32_math" and v == "tf32":
                o = Options(fp32_math="tf32")
            elif name == "max_blocks" and v is None:
                continue
            else:
                o = Options(**{name: v})
            assert getattr(o, name) == v
    for t in (16, 32, 64, 128):
        Options(tile_m=t, tile_n=t, threads_per_block=min(1024, max(64, t * t // 16)))


BAD = [
    ("fuse_pointwise", 1), ("fuse_epilogues", "yes"), ("fuse_reductions", None),
    ("tile_m", 48), ("tile_m", True), ("tile_n", 256), ("tile_k", 4), ("tile_k", 32.0),
    ("threads_per_block", 100), ("blocks_per_sm", 0), ("blocks_per_sm", 9), ("blocks_per_sm", 2.0),
    ("max_blocks", 0), ("max_blocks", -3), ("max_blocks", "all"), ("split_k", 3), ("split_k", "on"),
    ("split_k", True), ("mode", "warp"), ("fp32_math", "fp16"), ("exact", "no"), ("backend", "triton"),
    ("spin_limit", 999), ("spin_limit", 10**10 + 1), ("passes", "dce"), ("passes", ("dce", "no_such_pass")),
]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_each_invalid_value_names_the_field_and_what_is_allowed(name, value):
    with pytest.raises(OptionsError) as info:
        Options(**{name: value})
    err = info.value
    assert isinstance(err, tkx.TkxError) and isinstance(err, ValueError)
    message = str(err)
    assert name in message
    assert repr(value) in message or (name == "passes" and "no_such_pass" in message)
    assert err.field == name
    allowed = dict((n, a) for n, _, a, _ in Options.fields_info())[name]
    if allowed and allowed[0] == "range":
        assert str(allowed[1]) in message
    elif name == "passes":
        assert "registered pass" in message
    else:
        assert all(repr(c) in message for c in allowed)


def test_cross_field_checks_name_both_fields():
    with pytest.raises(OptionsError, match="tile_m=16, tile_n=16, threads_per_block=1024") as info:
        Options(tile_m=16, tile_n=16, threads_per_block=1024)  # 0.25 elements per thread
    assert "tile_m" in info.value.field and "threads_per_block" in info.value.field
    with pytest.raises(OptionsError, match="own 256 tile elements"):
        Options(tile_m=128, tile_n=128, threads_per_block=64)
    with pytest.raises(OptionsError, match="threads_per_block=1024, blocks_per_sm=4"):
        Options(threads_per_block=1024, blocks_per_sm=4, tile_m=128, tile_n=128)
    with pytest.raises(OptionsError, match="exact=True, fp32_math='tf32'"):
        Options(exact=True, fp32_math="tf32")
    # each is fine alone
    Options(exact=True)
    Options(fp32_math="tf32")
    Options(tile_m=128, tile_n=128)  # 64 per thread at 256 threads: the limit


def test_replace_validates_and_rejects_unknown_names():
    o = Options()
    o2 = o.replace(tile_m=128, mode="grid", passes=["cse", "dce"])
    assert o2 is not o and o2.tile_m == 128 and o2.mode == "grid"
    assert o2.passes == ("cse", "dce")  # a list becomes a tuple
    assert o.tile_m == 64
    assert o2.changed() == {"tile_m": 128, "mode": "grid", "passes": ("cse", "dce")}
    assert repr(o2) == "Options(tile_m=128, mode='grid', passes=('cse', 'dce'))"
    with pytest.raises(OptionsError, match="tile_m=3"):
        o.replace(tile_m=3)
    with pytest.raises(OptionsError, match="unknown option 'tilem'") as info:
        o.replace(tilem=3)
    assert "tile_m" in str(info.value) and "spin_limit" in str(info.value)


def test_key_is_stable_and_hashable():
    a, b = Options(tile_k=16), Options().replace(tile_k=16)
    assert a == b and a.key() == b.key() and hash(a.key()) == hash(b.key())
    assert a.key() != Options().key()
    assert [k for k, _ in a.key()] == FIELDS
    assert {a.key(): 1}[b.key()] == 1
    assert Options(max_blocks=1, split_k=2).key() != Options(max_blocks=None, split_k=2).key()


def test_fields_info_covers_every_field_with_help():
    info = Options.fields_info()
    assert [name for name, *_ in info] == FIELDS
    for name, default, allowed, help_text in info:
        f = {f.name: f for f in dataclasses.fields(Options)}[name]
        assert default == f.default
        assert isinstance(help_text, str) and len(help_text) > 10 and "\n" not in help_text
        assert allowed is not None, name
        if name == "rules":  # the registered user rules (none in a fresh session)
            assert isinstance(allowed, tuple)
            continue
        if allowed[0] != "range":
            assert default in allowed or name in ("passes",)
    by_name = {n: a for n, _, a, _ in info}
    assert by_name["tile_m"] == (16, 32, 64, 128)
    assert by_name["blocks_per_sm"] == ("range", 1, 8)
    assert by_name["max_blocks"] == ("range", 1, None)
    assert by_name["spin_limit"] == ("range", 1000, 10**10)
    assert by_name["split_k"] == ("auto", "off", 2, 4, 8, 16)
    assert set(by_name["passes"]) >= {"dce", "cse", "simplify", "canonicalize_views", "transpose_gemm"}
