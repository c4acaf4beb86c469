"""The hierarchical graph's data (tkx/render/hgraph.py), the GraphView widget tied to the linked views,
and the Explorer's first screen (headline, pipeline table, grouped options), without a browser."""

from __future__ import annotations

import json

import pytest

import tkx
from tkx.render.hgraph import FIRST_VIEW_NODES, captured_hgraph, first_view, hgraph_html, program_hgraph

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from graph_steps import tiny_gpt_step  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    e = tkx.examples.get("digits_mlp")
    return tkx.explore(e.step_fn, e.example_inputs, name=e.name, loss=e.loss_output)


@pytest.fixture(scope="module")
def gpt():
    step, inputs = tiny_gpt_step(blocks=2)
    ex = tkx.explore(step, inputs, name="tiny_gpt")
    return ex


def _drawn(data: dict) -> int:
    """Boxes the view draws for data["open"]: nodes whose ancestors are all open and that are not open."""
    by = {n["id"]: n for n in data["nodes"]}
    opened = set(data["open"])

    def shown(n):
        p = n["p"]
        while p:
            if p not in opened:
                return False
            p = by[p]["p"]
        return True
    return sum(1 for n in data["nodes"] if shown(n) and n["id"] not in opened)


def test_every_op_is_one_leaf_and_edges_join_leaves(digits):
    data = program_hgraph(digits.optimized, digits.schedule)
    leaves = [n for n in data["nodes"] if n["t"] == "op"]
    assert sorted(n["k"] for n in leaves) == sorted(f"op:{op.id}" for op in digits.optimized.ops)
    ids = {n["id"] for n in data["nodes"]}
    assert all(a in ids and b in ids for a, b in data["edges"])
    parents = {n["p"] for n in data["nodes"]} - {""}
    assert parents <= {n["id"] for n in data["nodes"] if n["t"] == "c"}
    # every op of a multi-op fusion group sits in that group's cluster
    g = next(g for g in digits.schedule.groups_in_order() if len(g.ops) > 1)
    members = [n for n in leaves if n["g"] == g.id]
    assert {n["k"][3:] for n in members} == set(g.ops) and len({n["p"] for n in members}) == 1


def test_module_levels_and_first_view_limit(gpt):
    data = program_hgraph(gpt.optimized, gpt.schedule)
    assert len(gpt.program.ops) >= 250
    clusters = {n["id"]: n for n in data["nodes"] if n["t"] == "c"}
    attn = [c for c in clusters.values() if c["id"].endswith("blocks.1.attn")]
    assert {c["r"] for c in attn} == {"forward", "backward", "optimizer"}, attn   # one per region
    attn = [c for c in attn if c["r"] == "forward"]
    assert attn[0]["lv"] == "module" and "blocks.1.attn attention" in attn[0]["s"]
    assert attn[0]["l"].startswith("blocks.1.attn · Attention")
    # blocks -> blocks.1 -> blocks.1.attn: nested by the dotted path
    assert clusters[attn[0]["p"]]["id"].endswith("blocks.1")
    assert 3 <= _drawn(data) <= FIRST_VIEW_NODES
    assert set(data["open"]) <= set(clusters)
    fx = captured_hgraph(gpt.captured, gpt.schedule)
    assert any(n["lv"] == "module" and n["id"].endswith("blocks.0.mlp") for n in fx["nodes"])
    assert 3 <= _drawn(fx) <= FIRST_VIEW_NODES


def test_first_view_expands_breadth_first_within_the_limit():
    nodes = [{"id": "r", "p": "", "t": "c", "lv": "region"}]
    nodes += [{"id": f"r/m{i}", "p": "r", "t": "c", "lv": "module"} for i in range(10)]
    nodes += [{"id": f"r/m{i}/o{j}", "p": f"r/m{i}", "t": "op", "lv": "op"} for i in range(10) for j in range(5)]
    assert first_view(nodes, limit=10) == ["r"]
    opened = first_view(nodes, limit=30)
    assert opened[0] == "r" and len(opened) == 1 + 5        # 10 modules, then 5 of them at 4 more boxes each
    assert first_view(nodes, limit=1) == []


def test_names_cannot_end_the_script_element(digits):
    data = program_hgraph(digits.optimized)
    data["title"] = "step </script><b>x"
    html = hgraph_html(data, "graph")
    assert "</script><b>" not in html and json.loads(html.split('tkx-hg-data">', 1)[1].rsplit("</script>", 1)[0]
                                                      )["title"] == data["title"]


def test_graph_view_selects_in_the_linked_view_and_lights_the_group(digits):
    from tkx.explorer import GraphView, LinkedView

    linked = LinkedView(digits)
    view = GraphView(digits)
    view.link(linked)
    g = next(g for g in digits.schedule.groups_in_order() if len(g.ops) > 1)
    view.selected = f"op:{g.ops[0]}"
    assert linked.selected == g.ops[0]
    assert linked.highlight["cuda_lines"], "the op's CUDA lines"
    assert f"op:{g.ops[0]}" in view.highlight and f"grp:{g.id}" in view.highlight
    linked.selected = "line:1"   # a selection made in the linked view shows here too
    assert f"op:{g.ops[0]}" not in view.highlight
    with pytest.raises(ValueError, match="which must be"):
        GraphView(digits, which="cuda")


def test_explorer_first_screen(digits):
    from tkx.explorer import Explorer
    from tkx.options import OPTION_GROUPS, Options

    e = Explorer(digits, debounce_s=0, registers_in_headline=False)
    kids = list(e.children)
    assert kids.index(e.headline) < kids.index(e.pipeline_table) < kids.index(e.options_panel) < kids.index(e.tabs)
    assert e.options_panel.selected_index is None          # collapsed
    for word in ("stage", "barrier", "predicted", "µs", "lower bound"):
        assert word in e.headline_text, e.headline_text
    table = e.pipeline_table.value
    for s in tkx.pipeline.STAGES:
        assert f"ex.{s.name}" in table
    assert "not computed (needs a GPU)" in table and "from ex.passes" in table
    assert "all defaults" in e.options_panel.titles[0]
    # every option field with a control is in exactly one group, shown with its help
    grouped = [n for names in OPTION_GROUPS.values() for n in names]
    assert len(grouped) == len(set(grouped))
    assert set(e.controls) <= {f[0] for f in Options.fields_info()} and set(e.controls) <= set(grouped)
    titles = [w.value for w in e.options_panel.children[0].children if "tkx-opt-group" in str(getattr(w, "value", ""))]
    assert [t.split(">")[1].split("<")[0] for t in titles] == [g for g in OPTION_GROUPS if
                                                                set(OPTION_GROUPS[g]) & set(e.controls)]
    assert all(e.help[n].value for n in e.controls)
    # a change: the headline says what moved, the table what was recomputed
    e.set_options(tile_m=16)
    e.flush()
    assert e.headline_text.startswith("tile_m=16:"), e.headline_text
    assert "reused" in e.pipeline_table.value and "recomputed" in e.pipeline_table.value
    assert e.options_panel.titles[0].endswith("(1 changed: tile_m)"), e.options_panel.titles
