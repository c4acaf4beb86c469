"""Views of FusedSchedule, ArenaPlan and CudaSource: HTML, provenance tokens, graphs, diffs."""

from __future__ import annotations

import base64
import os
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

import tkx
import tkx.render
from tkx.examples import get
from tkx.render import dot_available, stage_views

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = ["linear_regression", "digits_mlp"]
VOID = {"br", "img", "meta", "hr", "input", "link", "col", "wbr", "area", "base", "source"}
ADDRESS = re.compile(r"0x[0-9a-fA-F]{9,}|object at |\bat 0x")
DATA_URI = re.compile(r"data:image/svg\+xml;base64,[A-Za-z0-9+/=]+")

_CACHE: dict[str, tkx.Exploration] = {}


def explored(name: str) -> tkx.Exploration:
    if name not in _CACHE:
        ex = get(name)
        _CACHE[name] = tkx.explore(ex.step_fn, ex.example_inputs)
    return _CACHE[name]


class Checker(HTMLParser):
    """Checks that tags balance and collects provenance: key -> ids of every element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.tokens: set[str] = set()

    def handle_starttag(self, tag, attrs_):
        a = dict(attrs_)
        self.elements.append((tag, a))
        self.tokens.update((a.get("data-tkx-ids") or "").split())
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs_):
        a = dict(attrs_)
        self.elements.append((tag, a))
        self.tokens.update((a.get("data-tkx-ids") or "").split())

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()


def parse(html_text: str) -> Checker:
    c = Checker()
    c.feed(html_text)
    c.close()
    assert not c.errors, c.errors[:5]
    assert not c.stack, f"unclosed: {c.stack[:5]}"
    return c


def html_of(obj) -> str:
    bundle = obj._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"] == repr(obj)
    return bundle["text/html"]


def no_addresses(html_text: str) -> None:
    assert not ADDRESS.search(DATA_URI.sub("", html_text)), ADDRESS.search(DATA_URI.sub("", html_text))


# --------------------------------------------------------------------------------------
# FusedSchedule
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EXAMPLES)
def test_schedule_html(name):
    s = explored(name).schedule
    h = html_of(s)
    c = parse(h)
    no_addresses(h)
    ops = {o.id for o in s.program.ops}
    for g in s.groups.values():
        assert f"grp:{g.id}" in c.tokens
        for o in (*g.ops, *g.inlined, *g.stores):
            if o in ops:
                assert f"op:{o}" in c.tokens, o
    for d in s.decisions:
        for o in (d.producer, d.consumer):
            if o in ops:
                assert f"op:{o}" in c.tokens
    # every decision has a row; one <details> per decision kind
    assert h.count('class="tkx-notfused"') == len(s.why_not_fused())
    assert h.count('class="tkx-fused"') == len(s.decisions) - len(s.why_not_fused())
    assert sum(h.count(f"<summary>{k}: ") for k in {d.kind for d in s.decisions}) == len({d.kind for d in s.decisions})
    # the group element carries its ops and its stage
    keyed = {a["data-tkx-key"]: a["data-tkx-ids"].split() for _, a in c.elements if a.get("data-tkx-key")}
    for gid in s.groups:
        assert f"stage:{s.stage_of(gid)}" in keyed[f"grp:{gid}"]
    assert s.mode_reason in h or stage_views.esc(s.mode_reason) in h


@pytest.mark.parametrize("name", EXAMPLES)
def test_views_are_deterministic(name):
    ex = get(name)
    a, b = explored(name), tkx.explore(ex.step_fn, ex.example_inputs)
    assert html_of(a.schedule) == html_of(b.schedule)
    assert html_of(a.arena) == html_of(b.arena)
    assert a.cuda.html(check=False) == b.cuda.html(check=False)
    assert html_of(a.cuda) == html_of(b.cuda)  # NVRTC reports are cached by source hash


def test_schedule_text_golden():
    text = str(explored("linear_regression").schedule)
    path = GOLDEN / "linear_regression.schedule.txt"
    if os.environ.get("TKX_UPDATE_GOLDEN"):
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), "schedule text changed; rerun with TKX_UPDATE_GOLDEN=1 if intended"
    assert not ADDRESS.search(text)


@pytest.mark.parametrize("name", EXAMPLES)
def test_schedule_graph_source(name):
    s = explored(name).schedule
    g = s.graph(collapse="none")
    src = g.source
    assert src.count("subgraph cluster_") == len(s.groups)
    for gid in s.groups:
        assert f"subgraph cluster_{gid} " in src
    assert src.count("barrier (") == s.num_barriers
    assert not ADDRESS.search(src)


@pytest.mark.skipif(not dot_available(), reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("name", EXAMPLES)
def test_schedule_graph_renders(name):
    from tkx.render import graph_svg

    svg = graph_svg(explored(name).schedule.graph(collapse="none"))
    ET.fromstring(svg.split("\n", 1)[1] if svg.startswith("<?xml") else svg)  # the browser parses it as XML
    assert svg.count('class="cluster"') == len(explored(name).schedule.groups)


@pytest.mark.skipif(not dot_available(), reason="Graphviz's dot is not installed")
def test_big_schedule_graph_collapses_and_expands():
    import re

    from tkx.render import graph_svg

    s = explored("digits_mlp").schedule

    def area(**kw) -> int:  # pt^2 of the drawing
        m = re.search(r'width="(\d+)pt" height="(\d+)pt"', graph_svg(s.graph(**kw)))
        return int(m[1]) * int(m[2])

    assert s.graph().source == s.graph(collapse="group").source  # 16 groups, more than 30 ops: one node each
    assert "subgraph cluster_" not in s.graph(collapse="group").source
    assert area(collapse="stage") < area(collapse="group") < area(collapse="none") / 1.5
    src = s.graph(collapse="stage").source
    assert src.count("stage_node_") >= len(s.stages) and "1 group" in src or "groups" in src
    opened = s.graph(collapse="group", expand=(s.stages[1][0],)).source
    assert opened.count("subgraph cluster_") == 1
    assert s.graph(collapse="stage", expand=(1,)).source.count("subgraph cluster_") == len(s.stages[1])
    with pytest.raises(ValueError, match="collapse='ops': use 'auto', 'none'"):
        s.graph(collapse="ops")


def test_schedule_html_without_dot(monkeypatch):
    monkeypatch.setattr(tkx.render.base, "dot_available", lambda: False)
    h = html_of(explored("linear_regression").schedule)
    parse(h)
    assert "DOT source" in h and "subgraph cluster_g0" in h


def test_repr_never_raises(monkeypatch):
    s = explored("linear_regression").schedule

    def boom(*args, **kwargs):
        raise RuntimeError("renderer broke")

    monkeypatch.setitem(tkx.display._VIEWS, (type(s), "html"), boom)
    h = html_of(s)
    assert "renderer broke" in h and stage_views.esc(str(s).splitlines()[0]) in h
    assert s._repr_mimebundle_(include={"text/plain"}) == {"text/plain": repr(s)}
    assert set(s._repr_mimebundle_(exclude={"text/plain"})) == {"text/html"}


def test_rich_views():
    from rich.console import Console

    e = explored("digits_mlp")
    console = Console(record=True, width=200)
    console.print(e.schedule)
    console.print(e.arena)
    out = console.export_text()
    for gid in e.schedule.groups:
        assert gid in out
    for b in e.arena.slots:
        assert b in out
    assert "not fused" in out


# --------------------------------------------------------------------------------------
# ArenaPlan
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EXAMPLES)
def test_arena_html_and_svg(name):
    a = explored(name).arena
    h = html_of(a)
    c = parse(h)
    no_addresses(h)
    assert "<svg" not in DATA_URI.sub("", h)  # the timeline is an <img>, never inline SVG
    uris = DATA_URI.findall(h)
    assert len(uris) == 1
    svg = base64.b64decode(uris[0].split(",", 1)[1]).decode()
    ET.fromstring(svg)
    assert svg.count('class="tkx-slot"') == len(a.slots)
    assert f"peak {stage_views._kib(a.size_bytes)}" in svg and "lower bound" in svg
    keyed = {x["data-tkx-key"]: x["data-tkx-ids"].split() for _, x in c.elements if x.get("data-tkx-key")}
    for b in a.slots:
        assert f"buf:{b}" in keyed
        if any(o.id == b for o in a.schedule.program.ops):
            assert f"op:{b}" in keyed[f"buf:{b}"]
    for staged in a.staged:
        assert f"staged commit → {stage_views.esc(staged)}" in h


def test_arena_marks_state_updates():
    a = explored("digits_mlp").arena
    svg = a.svg()
    assert a.staged and a.in_place
    assert "staged commit" in svg and "written in place" in svg
    for name in a.in_place:
        assert stage_views.esc(name) in svg


# --------------------------------------------------------------------------------------
# CudaSource
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EXAMPLES)
def test_cuda_html_lines_carry_ops(name):
    c = explored(name).cuda
    h = c.html(check=False)
    p = parse(h)
    no_addresses(h)
    lines = {int(a["data-tkx-key"].split(":")[1]): set(a["data-tkx-ids"].split())
             for _, a in p.elements if (a.get("data-tkx-key") or "").startswith("line:")}
    assert sorted(lines) == list(range(1, c.text.count("\n") + 2))
    for op, nums in c.op_lines.items():
        for n in nums:
            assert f"op:{op}" in lines[n], (op, n)
    for gid, (first, last) in c.group_lines.items():
        for n in (first, (first + last) // 2, last):
            assert f"grp:{gid}" in lines[n]
    assert "<details><summary>prelude: lines 1–" in h
    assert "style=" in h and 'class="k"' not in h  # inline pygments styles, no stylesheet classes


def test_cuda_html_compile_report():
    from tkx.codegen.nvrtc import nvrtc_available

    c = explored("linear_regression").cuda
    h = html_of(c)
    parse(h)
    ok, why = nvrtc_available()
    if not ok:
        assert "no NVRTC check" in h
        return
    assert "sm_90" in h and "sm_80" in h and "registers" in h


# --------------------------------------------------------------------------------------
# Diffs
# --------------------------------------------------------------------------------------
def test_schedule_diff_fuse_epilogues():
    e = explored("linear_regression")
    f = e.with_options(fuse_epilogues=False)
    d = e.schedule.diff(f.schedule)
    assert d and d.groups_changed and d.decisions_flipped
    text = str(d)
    assert "groups changed" in text and "decisions flipped" in text
    assert "epilogue mm -> add: fused -> not fused" in text
    parse(d._repr_mimebundle_()["text/html"])
    assert not e.schedule.diff(explored("linear_regression").schedule)
    a = e.arena.diff(f.arena)
    assert "size:" in str(a) and isinstance(a.moved, tuple)
    c = e.cuda.diff(f.cuda)
    assert c and c.unified and f"lines: {e.cuda.num_lines} -> {f.cuda.num_lines}" in str(c)
    parse(c._repr_mimebundle_()["text/html"])
    with pytest.raises(TypeError):
        e.schedule.diff(e.arena)


def test_schedule_diff_digits():
    e = explored("digits_mlp")
    d = e.schedule.diff(e.with_options(fuse_reductions=False, fuse_rows=False).schedule)
    assert d.decisions_flipped and (d.groups_changed or d.groups_moved) and d.groups_added
    assert f"stages: {len(e.schedule.stages)} -> " in str(d)
