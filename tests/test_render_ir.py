"""The IR-side views: CapturedGraph, Program and PassTrace as HTML, graphviz graphs and diffs."""

from __future__ import annotations

import dataclasses
import functools
import io
import random
import re
import subprocess
import sys
import textwrap
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

import tkx
import tkx.render
from tkx.errors import SourceLine
from tkx.ir import InputSpec, Op, OutputSpec, Program, StateUpdate, TensorSpec, validate
from tkx.passes import PassTrace, run_passes
from tkx.render import ir_views
from tkx.render import program as program_views

EXAMPLES = ["linear_regression", "digits_mlp"]
needs_dot = pytest.mark.skipif(not tkx.render.dot_available(), reason="Graphviz's dot binary is not installed")


# --- fixtures ------------------------------------------------------------------------------------

def capture(name: str) -> tkx.CapturedGraph:
    ex = tkx.examples.get(name)
    return tkx.capture(ex.step_fn, ex.example_inputs, name=name)


@functools.cache
def captured(name: str) -> tkx.CapturedGraph:
    return capture(name)


@functools.cache
def captured_again(name: str) -> tkx.CapturedGraph:
    """A second, independent capture of the same example (for determinism)."""
    return capture(name)


def zero_ms(trace: PassTrace) -> PassTrace:
    """The trace with every pass time set to 0 (times are the only nondeterministic field)."""
    return PassTrace(trace.input, tuple(dataclasses.replace(s, ms=0.0) for s in trace.steps))


@functools.cache
def trace_of(name: str) -> PassTrace:
    return zero_ms(run_passes(captured(name).program))


def html_of(obj) -> str:
    return obj._repr_mimebundle_()["text/html"]


class StrictChecker(HTMLParser):
    """Fails on unbalanced or misnested tags (html5lib is not a dependency; this is stricter)."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, tuple[int, int]]] = []
        self.errors: list[str] = []
        self.keys: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        self._attrs(attrs)
        if tag not in self.VOID:
            self.stack.append((tag, self.getpos()))

    def handle_startendtag(self, tag, attrs):
        self._attrs(attrs)

    def _attrs(self, attrs):
        for k, v in attrs:
            if k == "data-tkx-key":
                self.keys.append(v)
            elif k == "data-tkx-ids":
                self.ids.extend(v.split(" "))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack:
            self.errors.append(f"</{tag}> at {self.getpos()} closes nothing")
        elif self.stack[-1][0] != tag:
            self.errors.append(f"</{tag}> at {self.getpos()} closes <{self.stack[-1][0]}> of {self.stack[-1][1]}")
        else:
            self.stack.pop()


def check_html(text: str) -> StrictChecker:
    p = StrictChecker()
    p.feed(text)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed tags: {p.stack[:5]}"
    assert text.startswith('<div class="tkx-view') and text.endswith("</div>")
    return p


ADDRESS = re.compile(r"0x[0-9a-f]{6,}| at 0x", re.IGNORECASE)


def without_images(text: str) -> str:
    """Base64 image data could contain anything by chance: drop it before looking for addresses."""
    return re.sub(r'src="data:[^"]*"', 'src=""', text)


# --- HTML views ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_program_html(name):
    program = captured(name).program
    text = html_of(program)
    p = check_html(text)
    for op in program.ops:
        assert f"op:{op.id}" in p.keys
        assert f'data-tkx-key="op:{op.id}"' in text
    row = next(op for op in program.ops if op.source is not None)
    assert f"src:{row.source.short()}" in p.ids and f"fx:{row.fx_node}" in p.ids
    for region in {op.region for op in program.ops}:
        assert f">{region} <span" in text and tkx.render.REGION_COLORS[region] in text
    for inp in program.inputs:
        assert f"buf:{inp.value.buffer}" in p.keys
    assert "outputs (" in text and "inputs (" in text
    if program.updates:
        assert "in-place updates (" in text
    assert not ADDRESS.search(without_images(text))
    assert 'class="tkx-fallback"' in text and tkx.render.esc(str(program).splitlines()[0]) in text


@pytest.mark.parametrize("name", EXAMPLES)
def test_captured_graph_html(name):
    cg = captured(name)
    text = html_of(cg)
    p = check_html(text)
    for n in cg.nodes:
        assert f"fx:{n.name}" in p.keys
    for op in cg.program.ops:        # every IR op is linked from the FX node it came from
        assert f"op:{op.id}" in p.ids
    mm = next(n for n in cg.nodes if n.target.startswith("aten.mm"))
    row = re.search(rf'data-tkx-key="fx:{mm.name}" data-tkx-ids="([^"]*)"', text)
    assert row and f"op:{mm.name}" in row.group(1).split() and f"src:{mm.source.short()}" in row.group(1).split()
    assert not ADDRESS.search(without_images(text))


@pytest.mark.parametrize("name", EXAMPLES)
def test_pass_trace_html(name):
    trace = trace_of(name)
    text = html_of(trace)
    p = check_html(text)
    touched = {i for s in trace for i in s.added + s.removed + s.changed}
    assert touched, "the example should give the passes something to do"
    for i in touched:
        assert f"op:{i}" in p.keys
    for s in trace:
        assert f"<b>{s.name}</b>" in text
        if s.modified:
            assert f"{s.name}: {len(s.before.ops)} -&gt; {len(s.after.ops)} ops" in text
    assert 'class="tkx-rem"' in text or 'class="tkx-add"' in text
    assert not ADDRESS.search(without_images(text))
    bundle = trace._repr_mimebundle_()
    assert bundle["text/plain"] == str(trace)


@pytest.mark.parametrize("name", EXAMPLES)
def test_html_is_deterministic(name):
    a, b = captured(name), captured_again(name)
    assert html_of(a) == html_of(b)
    assert html_of(a.program) == html_of(b.program)
    assert html_of(zero_ms(run_passes(a.program))) == html_of(zero_ms(run_passes(b.program)))
    assert a.graph().source == b.graph().source
    assert a.program.graph().source == b.program.graph().source


def test_mimebundle_include_exclude():
    program = captured("linear_regression").program
    assert set(program._repr_mimebundle_()) == {"text/plain", "text/html"}
    assert set(program._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert set(program._repr_mimebundle_(exclude={"text/html"})) == {"text/plain"}
    assert program._repr_mimebundle_()["text/plain"] == repr(program)


def test_views_never_raise(monkeypatch):
    program = captured("linear_regression").program

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(program_views, "program_graph", broken)         # the graph fails: the table stays
    text = program._repr_mimebundle_()["text/html"]
    assert "could not draw the graph (RuntimeError: boom)" in text and 'data-tkx-key="op:' in text
    check_html(text)
    monkeypatch.setattr(program_views, "_program_rows", broken)         # the view fails: the text is shown
    bundle = program._repr_mimebundle_()
    assert "could not render" in bundle["text/html"] and "RuntimeError: boom" in bundle["text/html"]
    assert tkx.render.esc(str(program).splitlines()[1]) in bundle["text/html"]
    assert bundle["text/plain"] == repr(program)


def test_without_dot_shows_dot_source(monkeypatch):
    monkeypatch.setattr(tkx.render.base, "dot_available", lambda: False)
    text = html_of(captured("linear_regression").program)
    check_html(text)
    assert "DOT source" in text and "digraph" in text and "<img" not in text


def test_core_imports_without_graphviz():
    code = textwrap.dedent("""
        import sys
        sys.modules["graphviz"] = None          # import graphviz raises ImportError
        import tkx
        ex = tkx.examples.get("linear_regression")
        cg = tkx.capture(ex.step_fn, ex.example_inputs)
        html = cg.program._repr_mimebundle_()["text/html"]
        assert "Install the <code>graphviz</code> Python package" in html, html[-500:]
        assert "data-tkx-key" in cg._repr_mimebundle_()["text/html"]
        print("ok")
    """)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_pass_trace_rich():
    from rich.console import Console

    console = Console(width=120, record=True, color_system=None, file=io.StringIO())
    console.print(trace_of("linear_regression"))
    text = console.export_text()
    assert "PassTrace of linear_regression" in text and "canonicalize_views" in text and "~changed" in text


# --- golden text -----------------------------------------------------------------------------------

def test_pass_trace_golden():
    assert str(trace_of("linear_regression")) == textwrap.dedent("""\
        PassTrace of linear_regression: 15 -> 12 ops in 5 passes, 0.00 ms
          pass                  ms  +added  -removed  ~changed  ops
          canonicalize_views  0.00       0         0         2   15
          simplify            0.00       0         1         2   14
          cse                 0.00       0         1         1   13
          transpose_gemm      0.00       0         0         0   13
          dce                 0.00       0         1         0   12""")


def test_pass_step_diff_golden():
    d = trace_of("linear_regression")["simplify"].diff()
    assert repr(d) == "<tkx.ProgramDiff simplify: +0 -1 ~2>"
    lines = str(d).splitlines()
    assert lines[:4] == [
        "simplify: 15 -> 14 ops, +0 -1 ~2; removed: mul_1; changed: sum_1 mm_1",
        "--- before",
        "+++ after",
        "@@ -16,5 +16,4 @@",
    ]
    # Values are named after their op ids, so the diff holds only the ops simplify touched.
    assert [line.split("#")[0].rstrip() for line in lines[4:10]] == [
        "     %mul: f32[32,1] = mul %sub_1, 0.0625",
        "-    %mul_1: f32[32,1] = mul %mul, bcast(%ones_like -> 32x1)",
        "-    %sum_1: f32[1,1] = sum %mul_1 {dims=(0,), keepdim=true}",
        "-    %mm_1: f32[8,1] = mm %in2.T, %mul_1",
        "+    %sum_1: f32[1,1] = sum %mul {dims=(0,), keepdim=true}",
        "+    %mm_1: f32[8,1] = mm %in2.T, %mul",
    ]


# --- diffs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_diff_after_a_pass_lists_exactly_the_changed_ops(name):
    trace = trace_of(name)
    for step in trace:
        d = step.before.diff(step.after)
        assert (d.added, d.removed, d.changed) == (step.added, step.removed, step.changed)
        assert d.empty == (not step.modified)
    before = captured(name).program
    after = trace.output
    d = before.diff(after)
    old, new = {o.id: o for o in before.ops}, {o.id: o for o in after.ops}
    assert set(d.removed) == old.keys() - new.keys()
    assert set(d.added) == new.keys() - old.keys()
    assert set(d.changed) == {i for i in old.keys() & new.keys() if old[i] != new[i]}
    text = html_of(d)
    p = check_html(text)
    assert set(k[3:] for k in p.keys if k.startswith("op:")) >= set(d.ids)
    assert captured(name).diff(after).ids == d.ids          # CapturedGraph.diff goes through the programs


def test_diff_of_a_hand_made_change():
    program = captured("linear_regression").program
    ops = list(program.ops)
    k = next(i for i, op in enumerate(ops) if op.id == "mul_2")
    ops[k] = ops[k].replace(attrs={}, inputs=(ops[k].inputs[0], 0.5))          # changed: the scalar
    extra = Op("extra", "neg", (ops[0].out,), TensorSpec.dense("extra", ops[0].out.shape, "float32"),
               region="forward")
    ops.insert(1, extra)                                                        # added, unused
    after = validate(program.replace(ops=tuple(ops)))
    d = program.diff(after)
    assert (d.added, d.removed, d.changed) == (("extra",), (), ("mul_2",))
    back = after.diff(program)
    assert (back.added, back.removed, back.changed) == ((), ("extra",), ("mul_2",))
    text = html_of(d)
    check_html(text)
    assert re.search(r'class="tkx-add" data-tkx-key="op:extra"', text)
    assert re.search(r'class="tkx-chg" data-tkx-key="op:mul_2"', text)
    assert "tkx-rem\" data-tkx-key" not in text
    rows = [r for r in d.rows() if r[0] != "skip"]
    assert [(r[0], r[2]) for r in rows] == [("", "added"), ("changed", "changed")]
    assert program.diff(program).empty and "print the same" in str(program.diff(program))
    with pytest.raises(TypeError, match="diff expects a Program"):
        program.diff("nope")


def test_trace_diff():
    program = captured("digits_mlp").program
    a, b = trace_of("digits_mlp"), zero_ms(run_passes(program, ["cse", "dce"]))
    d = a.diff(b)
    rows = d.rows()
    assert rows[0][0] == "#" and rows[1][1:3] == ("canonicalize_views", "cse") and rows[1][-1] == "different passes"
    assert rows[-1][-1] == "only in a"
    assert d.output.empty and not d.same
    assert a.diff(a).same and all(r[-1] == "same result" for r in a.diff(a).rows()[1:])
    check_html(html_of(d))
    assert "TraceDiff of digits_mlp: 5 vs 2 passes" in str(d)


# --- graphs ----------------------------------------------------------------------------------------

def node_count(g) -> int:
    """Nodes declared in a DOT source (graph-level attribute lines and edges excluded)."""
    n = 0
    for line in g.body:
        s = line.strip()
        if "->" in s or s.startswith(("graph ", "node ", "edge ", "subgraph", "label=", "}", "{")) or "[" not in s:
            continue
        n += 1
    return n


@pytest.mark.parametrize("name", EXAMPLES)
def test_graph_sources(name):
    cg = captured(name)
    program = cg.program
    g = program.graph()
    src = g.source
    assert node_count(g) == len(program.inputs) + len(program.ops) + len(program.outputs) + len(program.updates)
    for region in {op.region for op in program.ops}:
        assert f"cluster_{region}" in src and tkx.render.REGION_FILL[region] in src
    assert "shape=invhouse" in src and "shape=house" in src
    assert 'label=".T"' in src and "bcast " in src          # views on the edges
    assert "f32[" in src
    cgg = cg.graph()
    assert node_count(cgg) == len(cg.nodes) and "shape=invhouse" in cgg.source
    collapsed = program.graph(collapse="region")
    assert node_count(collapsed) == len(program.inputs) + len({op.region for op in program.ops}) + \
        len(program.outputs) + len(program.updates)
    part = program.graph(collapse="region", expand=("optimizer",))
    n_opt = sum(op.region == "optimizer" for op in program.ops)
    assert node_count(part) == node_count(collapsed) - 1 + n_opt
    with pytest.raises(ValueError, match="expand names unknown regions"):
        program.graph(expand=("sideways",))
    with pytest.raises(ValueError, match="collapse must be"):
        program.graph(collapse="all")
    trace = trace_of(name)
    assert node_count(trace.graph()) == len(trace) + 2
    step = next(s for s in trace if s.removed)
    dg = trace.graph(step.name)
    assert "(removed)" in dg.source and "#ffebe9" in dg.source


@needs_dot
@pytest.mark.parametrize("name", EXAMPLES)
def test_graphs_render(name):
    cg = captured(name)
    for g in (cg.graph(), cg.program.graph(), cg.program.graph(collapse="region"), trace_of(name).graph(),
              cg.program.diff(trace_of(name).output).graph()):
        svg = tkx.render.graph_svg(g)
        assert svg is not None and "<svg" in svg and "<!--" not in svg
    assert '<img alt="dataflow graph" src="data:image/svg+xml;base64,' in html_of(cg.program)


# --- large programs ----------------------------------------------------------------------------------

def big_program(n_ops: int = 1000, seed: int = 0) -> Program:
    """A random valid program: 8 parameters (4 updated in place), ``n_ops`` ops over three regions."""
    rng = random.Random(seed)
    shape = (16, 16)
    inputs = tuple(InputSpec(f"p{i}", TensorSpec.dense(f"in{i}", shape, "float32"), mutated=i < 4) for i in range(8))
    values = [i.value for i in inputs]
    ops = []
    for k in range(n_ops):
        region = "forward" if k < 0.4 * n_ops else "backward" if k < 0.8 * n_ops else "optimizer"
        kind = rng.choice(["add", "mul", "sub", "maximum", "mm", "exp"])
        a = rng.choice(values[-12:])
        b = rng.choice(values)
        if rng.random() < 0.2:
            b = TensorSpec(shape, "float32", (1, 16), b.buffer)               # read transposed
        args = (a,) if kind == "exp" else (a, b)
        out = TensorSpec.dense(f"v{k}", shape, "float32")
        ops.append(Op(f"v{k}", kind, args, out, {}, region, SourceLine("gen.py", 10 + k // 7, "x = f(x)"), f"v{k}"))
        values.append(out)
    opt = [op for op in ops if op.region == "optimizer"]
    return validate(Program(inputs, tuple(ops), (OutputSpec("loss", ops[int(0.4 * n_ops) - 1].out),),
                            tuple(StateUpdate(i, opt[-1 - i].out) for i in range(4)), name="big"))


def test_large_program_collapses():
    program = big_program()
    g = program.graph()
    n = node_count(g)
    assert n < 200, n
    assert n == len(program.inputs) + 3 + len(program.outputs) + len(program.updates)
    assert "region_forward" in g.source and "400 ops" in g.source
    assert node_count(program.graph(collapse="none")) >= 1000
    assert node_count(program.graph(expand=("optimizer",))) == n - 1 + 200
    text = html_of(program)
    check_html(text)
    assert "collapsed by region" in text
    assert all(f'data-tkx-key="op:{op.id}" data-tkx-ids=' in text for op in program.ops)
    wide = Program(tuple(InputSpec(f"p{i}", TensorSpec.dense(f"in{i}", (4,), "float32")) for i in range(300)),
                   tuple(Op(f"v{i}", "neg", (TensorSpec.dense(f"in{i}", (4,), "float32"),),
                            TensorSpec.dense(f"v{i}", (4,), "float32")) for i in range(300)),
                   tuple(OutputSpec(f"o{i}", TensorSpec.dense(f"v{i}", (4,), "float32")) for i in range(300)))
    assert node_count(validate(wide).graph()) == 3                       # inputs, one region, outputs


def test_large_program_timing():
    """Prints how long a 1,000-op program takes to render (no assertion on time)."""
    program = big_program()
    t0 = time.perf_counter()
    text = ir_views.program_html(program, graph=False)
    t1 = time.perf_counter()
    g = program.graph()
    source = g.source
    t2 = time.perf_counter()
    svg = tkx.render.graph_svg(g)
    t3 = time.perf_counter()
    full = program._repr_mimebundle_()["text/html"]
    t4 = time.perf_counter()
    print(f"\n1000-op program: HTML table {1e3 * (t1 - t0):.0f} ms ({len(text) // 1024} KiB), "
          f"graph() DOT {1e3 * (t2 - t1):.0f} ms ({len(source)} chars, {node_count(g)} nodes), "
          f"dot layout {1e3 * (t3 - t2):.0f} ms ({'done' if svg else 'no dot'}), "
          f"whole _repr_mimebundle_ {1e3 * (t4 - t3):.0f} ms ({len(full) // 1024} KiB)")
