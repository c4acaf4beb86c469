"""What selecting an op shows (tkx/render/selection.py): its module, fusion group, arena slot, CUDA lines
and the predicted µs of its group, the same facts in the Explorer's linked views (``link_info``) and in
the exported report's side bar (the ``tkx-facts`` data block), on an ``nn.Module`` transformer step."""

from __future__ import annotations

import json
import re

import pytest
from graph_steps import tiny_gpt_step

import tkx
from tkx.dataflow.timeline import Timeline
from tkx.render.report import report_html
from tkx.render.selection import group_times_us, line_ranges, op_facts, selection_facts


@pytest.fixture(scope="module")
def gpt():
    step, inputs = tiny_gpt_step(blocks=2)
    return tkx.explore(step, inputs, name="tiny_gpt")


def _attn_op(ex):
    """An op of blocks.1.attn that the kernel stores in the arena and computes on CUDA lines."""
    cuda = ex.cuda
    return next(op for op in ex.schedule.program.ops
                if op.module == "blocks.1.attn" and op.id in cuda.arena.slots and cuda.op_lines.get(op.id))


def test_group_times_are_the_predicted_timeline_per_group(gpt):
    tl = gpt.timeline
    times = group_times_us(tl)
    assert set(times) == set(tl.groups()) and all(t >= 0 for t in times.values())
    g, gt = next(iter(tl.groups().items()))
    assert times[g] == pytest.approx(gt.duration / 1e3)
    assert group_times_us(Timeline("vm", (), "events", kind="events")) == {}


def test_op_facts_name_module_group_slot_lines_and_predicted_time(gpt):
    op = _attn_op(gpt)
    cuda, sched = gpt.cuda, gpt.schedule
    times = group_times_us(gpt.timeline)
    f = op_facts(cuda.schedule, cuda.arena, cuda, op.id, times)
    group = sched.group_of(op.id).id
    assert f["module"] == "blocks.1.attn" and f["module_type"] == "Attention"
    assert f["group"] == group and f["stage"] == sched.stage_of(group)
    assert f["slot"] is cuda.arena.slots[op.id]
    assert f"; arena slot bytes {f['slot'].offset}..{f['slot'].end}; " in f["text"]
    assert f["cuda_lines"] == sorted(cuda.op_lines[op.id])
    assert f["predicted_us"] == pytest.approx(times[group])
    assert "module blocks.1.attn (Attention)" in f["text"] and f"predicted {times[group]:.2f} µs" in f["text"]
    assert op_facts(cuda.schedule, cuda.arena, cuda, "no_such_op", times) is None
    # without times: every fact but the prediction
    bare = op_facts(cuda.schedule, cuda.arena, cuda, op.id)
    assert bare["predicted_us"] is None and "predicted" not in bare["text"] and bare["group"] == group


def test_link_info_says_the_module_and_the_predicted_time(gpt):
    from tkx.explorer import LinkedView, link_info

    op = _attn_op(gpt)
    group = gpt.schedule.group_of(op.id).id
    want = group_times_us(gpt.timeline)[group]
    info = link_info(gpt, op.id)
    assert info["module"] == "blocks.1.attn" and info["predicted_us"] == pytest.approx(want)
    assert info["arena"]["buffer"] == op.id and info["cuda_lines"] == sorted(gpt.cuda.op_lines[op.id])
    v = LinkedView(gpt.cuda)           # from a CudaSource: the prediction is made for it
    assert v._group_us is None         # nothing timed before an op is selected
    v.selected = op.id
    assert v.highlight["predicted_us"] == pytest.approx(want)
    assert f"predicted {want:.2f} µs" in v.highlight["text"] and "module blocks.1.attn" in v.highlight["text"]
    v.selected = "line:1"              # other selections keep their own text
    assert v.highlight["text"].startswith("CUDA line 1: ")


def test_report_side_bar_facts_for_every_op_and_group(gpt):
    html = report_html(gpt, gpu=False)
    m = re.search(r'<script type="application/json" id="tkx-facts">(.*?)</script>', html, re.S)
    assert m, "the report carries no facts block"
    facts = json.loads(m.group(1))
    sched = gpt.schedule
    assert {k for k in facts if k.startswith("op:")} == {f"op:{o.id}" for o in sched.program.ops}
    assert {k for k in facts if k.startswith("grp:")} == {f"grp:{g}" for g in sched.groups}
    op = _attn_op(gpt)
    rows = dict(facts[f"op:{op.id}"])
    group = sched.group_of(op.id).id
    slot = gpt.arena.slots[op.id]
    assert rows["module"] == "blocks.1.attn · Attention"
    assert rows["fusion group"].startswith(f"{group} (") and f"stage {sched.stage_of(group)}" in rows["fusion group"]
    assert rows["arena slot"].startswith(f"bytes {slot.offset}..{slot.end} ({slot.nbytes} B)")
    assert rows["CUDA lines"].startswith(f"{len(gpt.cuda.op_lines[op.id])}: ")
    assert rows["predicted"] == f"{group_times_us(gpt.timeline)[group]:.2f} µs for group {group} (cost model, no GPU)"
    assert "predicted" in dict(facts[f"grp:{group}"])
    # the side bar's script reads the block
    assert "getElementById('tkx-facts')" in html
    assert selection_facts(sched, gpt.arena, gpt.cuda, {})[f"op:{op.id}"][-1][0] == "CUDA lines"


def test_line_ranges():
    assert line_ranges([9, 3, 4, 5]) == "3-5, 9"
    assert line_ranges([1, 3, 5, 7, 9], most=2) == "1, 3, ..."
    assert line_ranges([]) == ""
