"""The per-task timeline as a Chrome / Perfetto trace (Trace Event Format), merged with torch.profiler, and the
runner's profiler ranges: all on the CPU (the task VM's timeline and timelines built from kernel-like records)."""

from __future__ import annotations

import base64
import gzip
import json
import re
from types import SimpleNamespace

import pytest
import torch

import tkx
from tkx.dataflow.timeline import Span, Timeline
from tkx.dataflow.trace import TraceError, check_trace, merge_profiler_trace, read_trace, task_label
from tkx.runtime import ranges

# The Trace Event Format as a JSON schema (the parts Perfetto and chrome://tracing need), to check the output
# with a validator that is not ours.
EVENT_SCHEMA = {
    "type": "object",
    "required": ["ph", "pid"],
    "properties": {
        "ph": {"enum": ["X", "C", "M", "s", "f", "i"]},
        "name": {"type": "string"}, "cat": {"type": "string"},
        "ts": {"type": "number"}, "dur": {"type": "number", "minimum": 0},
        "pid": {"type": "integer"}, "tid": {"type": "integer"},
        "id": {"type": "integer"}, "bp": {"const": "e"}, "args": {"type": "object"},
    },
    "allOf": [
        {"if": {"properties": {"ph": {"const": "X"}}}, "then": {"required": ["name", "ts", "dur", "tid"]}},
        {"if": {"properties": {"ph": {"enum": ["s", "f"]}}}, "then": {"required": ["id", "ts", "tid", "name"]}},
        {"if": {"properties": {"ph": {"const": "C"}}},
         "then": {"required": ["name", "ts", "args"],
                  "properties": {"args": {"additionalProperties": {"type": "number"}, "minProperties": 1}}}},
        {"if": {"properties": {"ph": {"const": "M"}}},
         "then": {"required": ["name", "args"], "properties": {"name": {"enum": [
             "process_name", "process_sort_index", "thread_name", "thread_sort_index"]}}}},
    ],
}
TRACE_SCHEMA = {"type": "object", "required": ["traceEvents"],
                "properties": {"traceEvents": {"type": "array", "items": EVENT_SCHEMA},
                               "displayTimeUnit": {"enum": ["ms", "ns"]}}}


def validate(trace):
    """No problem by :func:`check_trace`, and (where jsonschema is installed) the schema above."""
    assert check_trace(trace) == []
    try:
        import jsonschema
    except ImportError:  # the structural check above still ran
        return
    jsonschema.validate(trace, TRACE_SCHEMA)


@pytest.fixture(scope="module")
def vm_tl():
    from tkx.dataflow.timeline import vm_timeline

    ex = tkx.examples.get("digits_mlp")
    exp = tkx.explore(ex.step_fn, ex.example_inputs, mode="grid", sync="counters")
    return vm_timeline(exp.schedule, exp.arena, ex.example_inputs)  # the task VM's, in events


def kernel_like(tl, origin=1_700_000_000_123_456_789):
    """Rows as the kernel writes them (%globaltimer ns, 1000 ns after ``origin``) from ``tl``'s spans, 1 event
    = 1000 ns."""
    rows = [[(s.block << 32) | s.task, origin + int(s.start * 1000) + 1000, origin + int(s.end * 1000) + 1000,
             int(s.wait * 1000)] for s in tl.spans]
    return Timeline.from_records(tl.dag, rows, kernel="tkx_step"), origin


def by_ph(trace, ph):
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_vm_timeline_exports_one_slice_per_task_on_block_tracks(vm_tl):
    trace = vm_tl.chrome_trace()
    validate(trace)
    tasks = [e for e in by_ph(trace, "X") if e["cat"] == "task"]
    assert sorted(e["args"]["task"] for e in tasks) == sorted(s.task for s in vm_tl.spans)
    for e in tasks:
        s = next(s for s in vm_tl.spans if s.task == e["args"]["task"])
        assert (e["name"], e["tid"], e["ts"], e["dur"]) == (s.group, s.block, s.start, s.end - s.start)
        assert e["args"]["ops"] == list(vm_tl.dag.schedule.groups[s.group].ops)
    names = {e["tid"]: e["args"]["name"] for e in by_ph(trace, "M") if e["name"] == "thread_name"}
    assert names == {b: f"block {b}" for b in range(vm_tl.blocks)}
    process = [e["args"]["name"] for e in by_ph(trace, "M") if e["name"] == "process_name"]
    assert process == ["tkx digits_step (task VM, 1 event drawn as 1 µs)"]
    assert trace["otherData"]["tkx"]["unit"] == "events"


def test_waits_are_slices_and_flows_from_the_releasing_producer(vm_tl):
    trace = vm_tl.chrome_trace()
    waits = [e for e in by_ph(trace, "X") if e["cat"] == "wait"]
    assert len(waits) == sum(1 for s in vm_tl.spans if s.wait > 0)
    dag = vm_tl.dag
    for e in waits:
        s = next(s for s in vm_tl.spans if s.task == e["args"]["task"])
        assert e["ts"] + e["dur"] == s.start and e["dur"] == s.wait and e["tid"] == s.block
        assert e["args"]["for"] == [dag.counters[w.counter].group for w in dag.waits[s.group]]
    starts, ends = {e["id"]: e for e in by_ph(trace, "s")}, {e["id"]: e for e in by_ph(trace, "f")}
    assert starts and starts.keys() == ends.keys()
    waiting = {e["args"]["task"]: e["args"]["for"] for e in waits}
    for fid, f in ends.items():
        s = starts[fid]
        assert s["ts"] < f["ts"] and f["bp"] == "e"
        consumer = next(x for x in vm_tl.spans if x.block == f["tid"] and x.start < f["ts"] < x.end)
        producer = next(x for x in vm_tl.spans if x.block == s["tid"] and x.start < s["ts"] < x.end)
        assert producer.group in waiting[consumer.task] and producer.end <= consumer.start
        assert producer.end == max(x.end for x in vm_tl.spans if x.group in waiting[consumer.task]
                                   and x.end <= consumer.start)  # the release it waited for: the last one
    plain = vm_tl.chrome_trace(flows=False, counters=False)["traceEvents"]
    assert {e["ph"] for e in plain} == {"M", "X"} and len(plain) == len(trace["traceEvents"]) - 2 * len(starts) - \
        len(by_ph(trace, "C"))


def test_counter_tracks_tasks_in_flight_and_arena_bytes(vm_tl):
    trace = vm_tl.chrome_trace()
    flight = [e for e in by_ph(trace, "C") if e["name"] == "tasks"]
    for e in flight:  # the count at each change, computed here from the spans
        t = e["ts"]
        assert e["args"]["in flight"] == sum(1 for s in vm_tl.spans if s.start <= t < s.end)
    assert flight[-1]["args"]["in flight"] == 0 and max(e["args"]["in flight"] for e in flight) > 1
    arena = [e for e in by_ph(trace, "C") if e["name"] == "arena"]
    plan, dag = vm_tl.dag.arena, vm_tl.dag
    expected = {min(s.start for s in vm_tl.spans if dag.stage_of[s.group] == st):
                sum(x.nbytes for x in plan.live_at(st)) for st in set(dag.stage_of.values())}
    assert {e["ts"]: e["args"]["bytes in use"] for e in arena[:-1]} == expected
    assert arena[-1] == {**arena[-1], "ts": vm_tl.makespan, "args": {"bytes in use": 0}}
    assert max(expected.values()) > 0


def test_kernel_records_export_in_microseconds_with_their_origin(vm_tl, tmp_path):
    tl, origin = kernel_like(vm_tl)
    assert (tl.unit, tl.kernel, tl.origin) == ("ns", "tkx_step", origin + 1000)  # the first block's ready
    assert sorted((s.task, s.start, s.end) for s in tl.spans) == sorted((s.task, s.start * 1000, s.end * 1000)
                                                                        for s in vm_tl.spans)
    trace = tl.chrome_trace()
    validate(trace)
    for e in (e for e in by_ph(trace, "X") if e["cat"] == "task"):
        s = next(s for s in tl.spans if s.task == e["args"]["task"])
        assert e["ts"] == pytest.approx(s.start / 1000, abs=1e-3) and e["dur"] == pytest.approx(
            (s.end - s.start) / 1000, abs=2e-3)
    assert trace["otherData"]["tkx"]["origin"] == tl.origin and trace["displayTimeUnit"] == "ns"
    assert "kernel tkx_step (kernel %globaltimer)" in by_ph(trace, "M")[0]["args"]["name"]
    back = Timeline.from_json(json.loads(json.dumps(tl.to_json())))
    assert (back.origin, back.kernel, back.spans) == (tl.origin, tl.kernel, tl.spans)
    path = tl.to_chrome_trace(tmp_path / "sub" / "t.json.gz")
    with gzip.open(path, "rt") as f:
        assert json.load(f) == json.loads(json.dumps(trace))
    assert read_trace(tl.to_chrome_trace(tmp_path / "t.json")) == read_trace(path)


def test_a_predicted_timeline_in_microseconds_exports_the_same_way(vm_tl):
    spans = tuple(Span(s.block, s.task, s.group, s.item, s.start * 0.25, s.end * 0.25, s.wait * 0.25)
                  for s in vm_tl.spans)  # as a cost model in µs would time the VM's schedule
    predicted = Timeline(vm_tl.name, spans, "us", dag=vm_tl.dag)
    trace, events = predicted.chrome_trace(), vm_tl.chrome_trace()
    validate(trace)
    scaled = [{**e, "ts": e["ts"] * 0.25, **({"dur": e["dur"] * 0.25} if "dur" in e else {})}
              if "ts" in e else e for e in events["traceEvents"]]
    for e in scaled:
        if e.get("cat") == "task":
            e["args"] = {**e["args"], "wait_us": e["args"]["wait_us"] * 0.25}
        if e["name"] == "process_name":
            e["args"] = {"name": "tkx digits_step (us)"}
    assert trace["traceEvents"] == scaled


def test_slices_are_named_by_group_and_module():
    ops = {"mm": SimpleNamespace(module="model.fc1"), "relu": SimpleNamespace(module="model.act"),
           "add": SimpleNamespace()}
    schedule = SimpleNamespace(groups={"g0": SimpleNamespace(ops=("mm", "add", "relu")),
                                       "g1": SimpleNamespace(ops=("add",))}, op=ops.__getitem__)
    dag = SimpleNamespace(schedule=schedule, waits={}, counters=(), stage_of={}, arena=None)
    tl = Timeline("t", (Span(0, 0, "g0", 0, 0.0, 10.0, 0.0), Span(0, 1, "g1", 0, 10.0, 20.0, 0.0)), "ns", dag=dag)
    trace = tl.chrome_trace()
    validate(trace)
    tasks = by_ph(trace, "X")
    assert [e["name"] for e in tasks] == ["g0 model.fc1 +1", "g1"]
    assert tasks[0]["args"]["modules"] == ["model.fc1", "model.act"] and "modules" not in tasks[1]["args"]
    assert task_label("g2", ["a.b"]) == "g2 a.b" and task_label("g2", []) == "g2"
    # without a DAG (e.g. read back from JSON) the slices carry their group alone
    assert [e["name"] for e in by_ph(Timeline.from_json(tl.to_json()).chrome_trace(), "X")] == ["g0", "g1"]


def test_a_module_step_names_its_task_slices_by_module():
    from torch.func import functional_call, grad_and_value

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    def step(params, x, y):
        grads, loss = grad_and_value(lambda p: ((functional_call(model, p, (x,)) - y) ** 2).mean())(params)
        return loss, {k: p - 0.1 * grads[k] for k, p in params.items()}

    exp = tkx.explore(step, (params, torch.randn(8, 4), torch.randn(8, 2)), mode="grid")
    tasks = [e for e in exp.timeline.chrome_trace()["traceEvents"] if e.get("cat") == "task"]
    named = {e["name"] for e in tasks if "modules" in e["args"]}
    assert named and all(re.fullmatch(r"[gc]\d+ [02]( \+1)?", n) for n in named), named
    for e in tasks:
        mods = [exp.schedule.op(o).module for o in e["args"]["ops"]]
        assert e["args"].get("modules", []) == list(dict.fromkeys(m for m in mods if m))


def test_check_trace_finds_what_breaks_the_format():
    good = {"name": "a", "ph": "X", "ts": 0.0, "dur": 5.0, "pid": 1, "tid": 0}
    assert check_trace({"traceEvents": [good, {**good, "ts": 1.0, "dur": 2.0}]}) == []  # nested
    assert "overlaps" in check_trace([good, {**good, "name": "b", "ts": 3.0, "dur": 5.0}])[0]
    assert "dur" in check_trace([{k: v for k, v in good.items() if k != "dur"}])[0]
    assert "ts" in check_trace([{**good, "ts": "0"}])[0]
    assert "no flow start" in check_trace([good, {"name": "x", "ph": "f", "id": 3, "ts": 1, "pid": 1, "tid": 0}])[0]
    assert "numeric args" in check_trace([{"name": "c", "ph": "C", "ts": 0, "pid": 1, "args": {"n": "x"}}])[0]
    assert "phase" in check_trace([{**good, "ph": "Z"}])[0]
    assert "traceEvents" in check_trace({"events": []})[0]
    with pytest.raises(TraceError, match="'traceEvents' list"):
        read_trace({"events": []})


def test_unknown_unit_is_one_clear_error():
    tl = Timeline("t", (Span(0, 0, "g0", 0, 0.0, 1.0, 0.0),), "cycles")
    with pytest.raises(TraceError, match="'cycles'.*ns, us"):
        tl.chrome_trace()


def test_html_view_has_a_download_link_of_the_trace(vm_tl):
    html = vm_tl._repr_mimebundle_()["text/html"]
    m = re.search(r'<a download="timeline-digits_step.json" href="data:application/json;base64,([^"]+)"', html)
    assert m and "Perfetto" in html
    assert json.loads(base64.b64decode(m.group(1))) == json.loads(json.dumps(vm_tl.chrome_trace()))


# -- merged with torch.profiler -----------------------------------------------------------------------------
def profiler_trace(*kernels, base=1_790_000_000_000_000_000):
    """A trace as torch.profiler writes one: a CPU process, the GPU's stream 7 with these kernel slices."""
    events = [{"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python"}},
              {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
              {"ph": "X", "cat": "user_annotation", "name": "train step", "pid": 4242, "tid": 4242,
               "ts": 900.0, "dur": 400.0},
              {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel", "pid": 0,
               "tid": 7, "ts": 950.0, "dur": 3.0},
              {"ph": "f", "id": 17, "pid": 0, "tid": 7, "ts": 950.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
              {"ph": "s", "id": 17, "pid": 4242, "tid": 4242, "ts": 940.0, "cat": "ac2g", "name": "ac2g"}]
    for name, ts, dur in kernels:
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                       "args": {"device": 0, "stream": 7}})
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base, "traceEvents": events}


def tkx_events(merged, prof):
    return [e for e in merged["traceEvents"] if e.get("pid") not in {x.get("pid") for x in prof["traceEvents"]}]


def test_merge_expands_the_last_kernel_slice_on_the_gpu_clock(vm_tl, tmp_path):
    tl, origin = kernel_like(vm_tl)
    prof = profiler_trace(("tkx_step", 1000.0, 80.0), ("tkx_step", 1200.0, 80.0))
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    merged = merge_profiler_trace(path, tl, tmp_path / "merged.json.gz", lead_us=0.5)
    validate(merged)
    assert read_trace(tmp_path / "merged.json.gz") == json.loads(json.dumps(merged))
    assert merged["traceEvents"][:len(prof["traceEvents"])] == prof["traceEvents"]  # the profiler's, unchanged
    assert merged["baseTimeNanoseconds"] == prof["baseTimeNanoseconds"]
    ours = tkx_events(merged, prof)
    assert {e["pid"] for e in ours} == {4243}
    tasks = [e for e in ours if e.get("cat") == "task"]
    for e in tasks:  # ns -> µs from the slice's start (+ the lead): no scaling
        s = next(s for s in tl.spans if s.task == e["args"]["task"])
        assert e["ts"] == pytest.approx(1200.5 + s.start / 1000, abs=1e-3)
    info = merged["otherData"]["tkx_alignment"]
    assert (info["align"], info["slice_ts_us"], info["launches"], info["us_per_unit"]) == ("start", 1200.0, 2, 1e-3)
    assert info["slice_minus_makespan_us"] == pytest.approx(80.0 - tl.makespan / 1000, abs=1e-3)
    assert info["profiler_minus_globaltimer_ns"] == prof["baseTimeNanoseconds"] + 1_200_000 - int(tl.origin)
    link = [e for e in merged["traceEvents"] if e.get("cat") == "tkx"]  # profiler kernel slice -> first task
    assert [(e["ph"], e["pid"]) for e in link] == [("s", 0), ("f", 4243)] and link[0]["id"] == 18
    first = merge_profiler_trace(prof, tl, launch=0)
    assert min(e["ts"] for e in tkx_events(first, prof) if e.get("cat") == "task") == pytest.approx(
        1000.0 + min(s.start for s in tl.spans) / 1000)


def test_slices_that_touch_on_the_gpu_clock_do_not_overlap_at_profiler_times():
    """At a profiler's absolute times (~5.3e12 µs, as CUPTI writes them) a double holds only ~1 ns: a wait
    that ends where its task starts, and a task that ends where the next wait starts (%globaltimer ticks
    in 32 ns steps, so ties are common), stay disjoint in the merged trace for every slice start: a slice's
    ``ts + dur`` must not pass the next slice's ``ts`` by the rounding of either."""
    import random

    rng, spans = random.Random(0), []
    for b in range(8):  # per block: tasks with and without a wait before them, some touching the previous one
        t = rng.randint(0, 500)
        for k in range(6):
            wait = rng.choice([0, rng.randint(1, 900)])
            start, end = t + wait, t + wait + rng.randint(100, 3000)
            spans.append(Span(b, 6 * b + k, f"g{k}", b, float(start), float(end), float(wait)))
            t = end + rng.choice([0, rng.randint(1, 50)])
    tl = Timeline("touching", tuple(spans), "ns", origin=1_700_000_000_000_000_000, kernel="tkx_step")
    assert check_trace(tl.chrome_trace()) == []
    for i in range(40):
        slice_ts = round(5333342183900.0 + 37.123 * i, 3)
        merged = merge_profiler_trace(profiler_trace(("tkx_step", slice_ts, 25.0)), tl)
        pid = merged["otherData"]["tkx_alignment"]["pid"]
        ours = [e for e in merged["traceEvents"] if e.get("pid") == pid or e.get("cat") == "tkx"]
        assert check_trace({"traceEvents": ours}) == [], slice_ts
        waits = [e for e in ours if e.get("cat") == "wait"]
        assert len(waits) == sum(s.wait > 0 for s in spans) and all(e["dur"] > 0 for e in waits)
        tasks = {e["args"]["task"]: e for e in ours if e.get("cat") == "task"}
        for s in spans:  # each slice within a ns of its own time: nothing was shifted to make room
            assert tasks[s.task]["ts"] == pytest.approx(slice_ts + s.start / 1000, abs=1.1e-3)
            assert tasks[s.task]["dur"] == pytest.approx((s.end - s.start) / 1000, abs=2.1e-3)


def test_merge_on_the_clock_places_tasks_at_their_own_globaltimer_reading(vm_tl):
    tl, origin = kernel_like(vm_tl)
    base = 1_790_000_000_000_000_000
    prof = profiler_trace(("tkx_step", 1000.0, 80.0), base=base)
    offset = base + 1_000_000 + 700 - tl.origin  # the first task's ready 0.7 µs after the slice's start
    merged = merge_profiler_trace(prof, tl, align="clock", clock_offset_ns=offset)
    validate(merged)
    for e in (e for e in tkx_events(merged, prof) if e.get("cat") == "task"):
        s = next(s for s in tl.spans if s.task == e["args"]["task"])
        assert e["ts"] == pytest.approx(1000.7 + s.start / 1000, abs=1e-3)
    with pytest.raises(TraceError, match="align='clock' needs .* clock_offset_ns="):
        merge_profiler_trace(prof, tl, align="clock")
    with pytest.raises(TraceError, match="align='clock' needs a kernel timeline"):
        merge_profiler_trace(prof, vm_tl, kernel="tkx_step", align="clock", clock_offset_ns=0)


def test_merge_stretches_a_predicted_timeline_over_the_slice(vm_tl):
    prof = profiler_trace(("tkx_step", 500.0, 120.0))
    merged = merge_profiler_trace(json.dumps(prof), vm_tl, kernel="tkx_step")
    validate(merged)
    tasks = [e for e in tkx_events(merged, prof) if e.get("cat") == "task"]
    assert min(e["ts"] for e in tasks) >= 500.0
    assert max(e["ts"] + e["dur"] for e in tasks) == pytest.approx(620.0, abs=2e-3)
    assert merged["otherData"]["tkx_alignment"]["us_per_unit"] == pytest.approx(120.0 / vm_tl.makespan)


def test_merge_errors_name_what_the_trace_has(vm_tl):
    prof = profiler_trace(("tkx_step", 500.0, 120.0))
    with pytest.raises(TraceError, match="no kernel slice named 'tkx_other'.*vectorized_elementwise_kernel"):
        merge_profiler_trace(prof, vm_tl, kernel="tkx_other")
    with pytest.raises(TraceError, match="does not name its kernel; pass kernel="):
        merge_profiler_trace(prof, vm_tl)
    with pytest.raises(TraceError, match="launch=3, but the trace has 1"):
        merge_profiler_trace(prof, vm_tl, kernel="tkx_step", launch=3)
    with pytest.raises(TraceError, match="align='middle'"):
        merge_profiler_trace(prof, vm_tl, kernel="tkx_step", align="middle")


def test_merge_into_a_real_torch_profiler_trace(vm_tl, tmp_path):
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with ranges.annotate("tkx digits_step launch [mode=grid]"):
            x @ x
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    data = json.loads(path.read_text())
    cpu = next(e for e in data["traceEvents"] if e.get("name") == "tkx digits_step launch [mode=grid]")
    data["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "tkx_step", "pid": 0, "tid": 7,
                                "ts": cpu["ts"] + 5.0, "dur": 50.0})  # where CUPTI would put the GPU slice
    merged = merge_profiler_trace(data, vm_tl, kernel="tkx_step")
    assert check_trace(merged) == []
    tasks = [e for e in merged["traceEvents"] if e.get("cat") == "task"]
    assert len(tasks) == len(vm_tl.spans) and min(e["ts"] for e in tasks) >= cpu["ts"] + 5.0


# -- profiler ranges ------------------------------------------------------------------------------------------
def test_range_names_say_step_and_options():
    assert ranges.range_name("digits_step", "launch", tkx.Options(mode="grid", sync="counters")) == \
        "tkx digits_step launch [mode=grid sync=counters]"
    assert ranges.range_name("s", "graph replay", tkx.Options()) == "tkx s graph replay"


def test_nvtx_follows_the_tool_and_the_switch():
    assert not ranges._nvtx_from_env({})
    assert ranges._nvtx_from_env({"NVTX_INJECTION64_PATH": "/opt/nsys/libToolsInjection64.so"})
    assert ranges._nvtx_from_env({"TKX_NVTX": "1"})
    assert not ranges._nvtx_from_env({"TKX_NVTX": "0", "NVTX_INJECTION64_PATH": "/x.so"})


def test_annotate_pushes_and_pops_only_while_listening(monkeypatch):
    calls = []
    fake = SimpleNamespace(range_push=lambda n: calls.append(("push", n)), range_pop=lambda: calls.append("pop"))
    monkeypatch.setattr(ranges, "_OFF", False)
    was = ranges.set_nvtx(False)
    try:
        assert not ranges.listening()
        with ranges.annotate("tkx a launch", nvtx=fake):
            pass
        assert calls == []
        ranges.set_nvtx(True)
        assert ranges.listening() and ranges.nvtx_listening()
        with pytest.raises(RuntimeError), ranges.annotate("tkx a launch", nvtx=fake):
            raise RuntimeError("a failing launch still closes its range")
        assert calls == [("push", "tkx a launch"), "pop"]
    finally:
        ranges.set_nvtx(was)


def test_runner_launches_and_replays_inside_named_ranges(monkeypatch):
    """CompiledRunner.launch and GraphRunner.replay on stand-ins for the kernel and the graph (no GPU here):
    a range around each while NVTX listens, none otherwise."""
    from tkx.runtime.runner import CompiledRunner, GraphRunner

    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    monkeypatch.setattr(ranges, "_OFF", False)
    runner = object.__new__(CompiledRunner)
    runner.program = SimpleNamespace(name="digits_step", rng_input=None)
    runner.options = tkx.Options(mode="grid")
    runner._mutated = []
    monkeypatch.setattr(runner, "_launch", lambda *a: calls.append("kernel"), raising=False)
    graph = object.__new__(GraphRunner)
    graph.runner, graph.inputs, graph.outputs = runner, [], []
    graph.graph = SimpleNamespace(replay=lambda: calls.append("graph"))
    monkeypatch.setattr("tkx.runtime.runner._inputs.unflatten_outputs", lambda program, outs: outs)
    was = ranges.set_nvtx(False)
    try:
        runner.launch([], [], None)
        graph.replay()
        assert calls == ["kernel", "graph"]
        ranges.set_nvtx(True)
        calls.clear()
        runner.launch([], [], None)
        graph.replay()
    finally:
        ranges.set_nvtx(was)
    assert calls == [("push", "tkx digits_step launch [mode=grid]"), "kernel", "pop",
                     ("push", "tkx digits_step graph replay [mode=grid]"), "graph", "pop"]
