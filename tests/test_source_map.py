"""The CUDA source map: every group's lines are split between its ops; the loop skeleton (tile loops,
the GEMM k-loop, a reduction's accumulation) belongs to the group's anchor op (no NVRTC needed)."""

from __future__ import annotations

import pytest

import tkx
from tkx.examples import names


@pytest.mark.parametrize("name", names())
def test_each_group_line_with_code_belongs_to_an_op_of_that_group(name):
    ex = tkx.examples.get(name)
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name=name)
    cuda, sched = exp.cuda, exp.schedule
    lines = cuda.text.splitlines()
    owner = {}
    for op, nos in cuda.op_lines.items():
        for no in nos:
            owner.setdefault(no, set()).add(op)
    for gid, (first, last) in cuda.group_lines.items():
        g = sched.groups[gid]
        if g.kind == "copy":  # a staged commit copies an input buffer: no op of its own
            continue
        anchor_lines = set(cuda.lines_of(g.anchor))
        for no in range(first + 1, last + 1):
            code = lines[no - 1].strip()
            if not code.replace("else", "").strip("{} ") or code.startswith("//"):
                continue
            assert no in owner, f"{name} {gid} line {no} has no op: {code}"
        if g.kind == "gemm":
            loop = [no for no in anchor_lines if lines[no - 1].lstrip().startswith("for (")]
            assert loop, f"{name} {gid}: the GEMM's loops are not attributed to {g.anchor}"
            for op in g.ops[1:]:  # epilogue ops keep their own lines
                assert not anchor_lines & set(cuda.lines_of(op)), f"{name} {gid}: {op} shares lines with {g.anchor}"


def test_lines_of_the_first_gemm_spans_its_k_loop_and_not_its_epilogue():
    ex = tkx.examples.get("digits_mlp")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, name="digits_mlp")
    cuda = exp.cuda
    first, last = cuda.group_lines["g0"]
    mm = cuda.lines_of("mm")
    assert len(mm) > 20 and all(first < no <= last for no in mm)
    assert cuda.lines_of("relu") and not set(cuda.lines_of("relu")) & set(mm)
    assert any("store relu" in cuda.text.splitlines()[no - 1] for no in cuda.lines_of("relu"))
