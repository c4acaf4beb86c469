"""The shape of the house: no import circles among tkx's modules, the stages below their views,
the pipeline written once, one error-code table and one C-type table.

The import graph is read from the source (``ast``), lazy imports inside functions included: a
module A imports B when A's source contains ``import B``, ``from B import ...`` or a relative
form of them anywhere (``TYPE_CHECKING`` blocks too). A package's ``__init__`` handing on its
own submodules is its face, not an arrow back up.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import tkx
from tkx import display, pipeline
from tkx.codegen import abi, cuda_prelude
from tkx.options import Options

ROOT = Path(tkx.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in ROOT.rglob("*.py")}

    def known(name: str) -> str | None:
        while name:
            if name in mods:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    base_name = ".".join(base + ([node.module] if node.module else []))
                else:
                    base_name = node.module or ""
                targets = [f"{base_name}.{a.name}" if f"{base_name}.{a.name}" in mods else base_name
                           for a in node.names]
            else:
                continue
            for t in targets:
                hit = known(t)
                if hit and hit != mod and not (is_pkg and hit.startswith(mod + ".")):
                    graph[mod].add(hit)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that import each other (size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_circle():
    # the check itself must be able to fail: a two-module circle and a three-module one
    g = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert strongly_connected(g) == [["a", "b"], ["c", "d", "e"]]


def test_lazy_and_relative_imports_are_seen():
    g = import_graph()
    # explore imports tkx.pipeline at the top; pipeline imports the runtime inside a function
    assert "tkx.pipeline" in g["tkx.explore"]
    assert "tkx.runtime.runner" in g["tkx.pipeline"]
    assert "tkx.display" in g["tkx.ir"]  # `from . import display` inside a method


def test_no_import_circles_among_tkx_modules():
    circles = strongly_connected(import_graph())
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_stages_do_not_import_their_views():
    stage_packages = ("tkx.ir", "tkx.capture", "tkx.passes", "tkx.schedule", "tkx.arena", "tkx.codegen",
                      "tkx.runtime", "tkx.printer", "tkx.display", "tkx.diff", "tkx.pipeline", "tkx.explore")
    bad = [(m, t) for m, targets in import_graph().items() for t in targets
           if any(m == p or m.startswith(p + ".") for p in stage_packages)
           and any(t == v or t.startswith(v + ".") for v in ("tkx.render", "tkx.explorer"))]
    assert bad == []


def test_every_stage_object_finds_its_views():
    views = display.registered()
    for cls in ("CapturedGraph", "Program", "PassTrace", "PassStep", "FusedSchedule", "ArenaPlan", "CudaSource"):
        assert (cls, "html") in views, cls
    for cls in ("CapturedGraph", "Program", "PassTrace", "FusedSchedule", "ArenaPlan", "CudaSource"):
        assert (cls, "diff") in views and (cls, "rich") in views, cls
    # diffs are computed in the stage packages, drawn in tkx.render
    for cls in ("Program", "FusedSchedule", "ArenaPlan", "CudaSource"):
        assert not views[(cls, "diff")].startswith("tkx.render"), views[(cls, "diff")]
    for cls in ("ProgramDiff", "TraceDiff", "StageDiff"):
        assert views[(cls, "html")].startswith("tkx.render")


def test_a_missing_view_is_a_clear_error_and_never_a_cell_traceback():
    class Unknown:
        def __repr__(self) -> str:
            return "<Unknown>"

    with pytest.raises(display.ViewNotFound, match="no 'graph' view is registered for Unknown"):
        display.graph(Unknown())
    bundle = display.mimebundle(Unknown())
    assert bundle["text/plain"] == "<Unknown>" and "could not render" in bundle["text/html"]


def test_render_modules_are_one_per_stage_and_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "render").glob("*.py")}
    assert {"captured.py", "program.py", "passes.py", "schedule.py", "arena.py", "cuda.py"} <= set(sizes)
    big = {name: n for name, n in sizes.items() if n > 430}
    assert big == {}, big


def test_pipeline_table_names_every_option_and_every_stage_once():
    names = [s.name for s in pipeline.STAGES]
    assert len(names) == len(set(names))
    fields = {f.name for f in dataclasses.fields(Options)}
    named = [o for s in pipeline.STAGES for o in s.options]
    assert sorted(named) == sorted(set(named)), "an option invalidates two stages"
    assert set(named) == fields, set(fields) ^ set(named)
    for s in pipeline.STAGES:
        assert all(names.index(n) < names.index(s.name) for n in s.needs), s.name
    assert pipeline.CPU_STAGES == ("captured", "program", "passes", "schedule", "arena", "cuda", "timeline")
    assert tkx.explore.__module__ == "tkx.explore"
    from tkx.explore import STAGE_OF_OPTION, STAGES
    assert STAGES == pipeline.NAMES and STAGE_OF_OPTION["tile_m"] == "schedule"
    with pytest.raises(tkx.TkxError, match="no stage 'kernel': the stages are captured, program"):
        pipeline.stage("kernel")


def test_report_sections_and_explorer_tabs_come_from_the_table():
    from tkx.render.report import SECTIONS
    assert [sid for sid, _, _ in SECTIONS] == [s.name for s in pipeline.STAGES]
    widget = pytest.importorskip("tkx.explorer.widget")
    assert [stage for _, stage in widget.STAGE_TABS][:-1] == [s.name for s in pipeline.STAGES if s.tab]


def test_one_error_code_table_and_one_c_type_table():
    assert cuda_prelude.ERROR_CODES is abi.ERROR_CODES and cuda_prelude.C_TYPES is abi.C_TYPES
    # the prelude's #defines say the same numbers as the table
    assert f"#define TKX_ERR_BARRIER_TIMEOUT {abi.ERR_BARRIER_TIMEOUT}" in cuda_prelude.PRELUDE
    assert f"#define TKX_ERR_BAD_LAUNCH {abi.ERR_BAD_LAUNCH}" in cuda_prelude.PRELUDE
    from tkx.runtime.status import error_names
    assert error_names() == {k: v for k, v in abi.ERROR_CODES.items() if k}


def test_cuda_source_carries_a_typed_launch_contract():
    ex = tkx.examples.get("linear_regression")
    src = tkx.runtime.lower(ex.step_fn, ex.example_inputs, Options(mode="grid", spin_limit=1000))
    launch = src.launch
    assert isinstance(launch, abi.LaunchContract) and isinstance(launch.config, abi.KernelConfig)
    assert (src.threads, src.mode, src.arena_bytes) == (launch.config.threads, "grid", launch.arena_bytes)
    assert launch.config.spin_limit == 1000 and "1000ULL" in src.text
    assert [p.role for p in launch.params][-3:] == ["arena", "sync", "status"]
    assert len(launch.role("input")) == len(src.program.inputs)
    for p in launch.role("input"):
        base = p.ctype.split("*")[0].replace("const ", "").strip()
        assert base == abi.C_TYPES[src.program.inputs[p.index].value.dtype]
    from tkx.runtime.kernel import launch_contract
    with pytest.raises(TypeError, match="not a SimpleNamespace without a LaunchContract"):
        import types
        launch_contract(types.SimpleNamespace(text="", threads=256))


# -- module size -----------------------------------------------------------------------------------

#: The largest a module of tkx may be (lines; aim for <= 600).
MODULE_LINES_LIMIT = 800
#: Modules still over the limit while they are split into one module per concern (the GEMM/GEMV
#: emitters, the kernel emitter, the target table). An entry leaves this set when its module is split;
#: the test fails on an entry whose module is under the limit, so the set only shrinks.
OVERSIZED_MODULES: set[str] = set()


def module_lines() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in ROOT.rglob("*.py")}


def test_no_module_over_the_line_limit():
    sizes = module_lines()
    over = {m: n for m, n in sizes.items() if n > MODULE_LINES_LIMIT and m not in OVERSIZED_MODULES}
    assert over == {}, f"modules over {MODULE_LINES_LIMIT} lines (split them by concern): {over}"
    split = sorted(m for m in OVERSIZED_MODULES if sizes.get(m, 0) <= MODULE_LINES_LIMIT)
    assert split == [], f"remove from OVERSIZED_MODULES (now within the limit or gone): {split}"


# -- repeated code ---------------------------------------------------------------------------------
#
# The rule of the ``duplicates`` command, written here so that CI needs no such command: a pair is two
# places (two files, or two places of one file) that share a run of 6 lines of the same *shape*: each
# line's tokens with names, strings and numbers replaced by placeholders and white space folded. Blank
# lines, comments, import lines, lines of punctuation only, lines of text only (docstrings, messages) and
# thin lines (fewer than DUPLICATE_MIN_WORDS names, keywords and values: ``x: int``, ``a = b``)
# are passed over; a run standing in more than 8 places is too common to count. Pairs are counted per
# pair of files. Calibration on this tree: every pair this detector finds is one ``duplicates --repo tkx``
# lists too; the command lists more (field lists with defaults, and pairs it marks boilerplate).

DUPLICATE_WINDOW = 6
DUPLICATE_MAX_PLACES = 8
#: Lines with fewer words than this (names, keywords and values; not punctuation or operators) are passed over:
#: ``x: int``, ``return x``, ``a = b``.
DUPLICATE_MIN_WORDS = 3
#: The most pairs of repeated code allowed in tkx/ outside KNOWN_DUPLICATES.
DUPLICATE_PAIRS_LIMIT = 4
#: Tables whose rows share a shape by design (one op, one puzzle a row): not code to factor.
KNOWN_DUPLICATES = {
    ("ops.py", "ops.py"),
    ("puzzles/__init__.py", "puzzles/__init__.py"),
}


def _line_shapes(text: str, shape: bool) -> list[tuple[int, str]]:
    """(line number, normalised tokens) of each line of Python source that counts (see above)."""
    import io
    import keyword
    import re
    import tokenize

    punct = re.compile(r"^[\s()\[\]{},:;.]*$")
    symbols = re.compile(r"^[\s()\[\]{},:;.=|+\-*/<>!%&^~@]*$")  # punctuation and operators
    tokens: dict[int, list[str]] = {}
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type in skip:
            continue
        if shape and t.type == tokenize.NAME and not keyword.iskeyword(t.string):
            word = "N"
        elif t.type == tokenize.STRING or t.type == getattr(tokenize, "FSTRING_START", -1):
            word = "S" if shape else t.string
        elif shape and t.type == tokenize.NUMBER:
            word = "0"
        else:
            word = t.string
        tokens.setdefault(t.start[0], []).append(word)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        folded = " ".join(line.split())
        if not folded or folded.startswith(("#", "import ", "from ")) or punct.match(folded):
            continue
        words = tokens.get(number, [folded])
        if all(w == "S" or w == "+" or punct.match(w) for w in words):
            continue  # text only
        if sum(1 for w in words if not symbols.match(w)) < DUPLICATE_MIN_WORDS:
            continue  # thin
        out.append((number, " ".join(words)))
    return out


def duplicate_pairs(root: Path, shape: bool = True) -> dict[tuple[str, str], int]:
    """{(file a, file b): shared windows} for the Python files below ``root`` (paths relative to it)."""
    places: dict[tuple[str, ...], list[tuple[str, int, int]]] = {}
    for path in sorted(root.rglob("*.py")):
        lines = _line_shapes(path.read_text(encoding="utf-8"), shape)
        name = path.relative_to(root).as_posix()
        for k in range(len(lines) - DUPLICATE_WINDOW + 1):
            w = lines[k:k + DUPLICATE_WINDOW]
            places.setdefault(tuple(s for _, s in w), []).append((name, w[0][0], w[-1][0]))
    found: dict[tuple[str, str], int] = {}
    for where in places.values():
        if not 2 <= len(where) <= DUPLICATE_MAX_PLACES:
            continue
        for i, (fa, sa, ea) in enumerate(where):
            for fb, sb, eb in where[i + 1:]:
                if fa != fb or ea < sb or eb < sa:  # two places, not overlapping windows of one file
                    key = (min(fa, fb), max(fa, fb))
                    found[key] = found.get(key, 0) + 1
    return found


def test_the_duplicate_detector_finds_a_renamed_copy(tmp_path):
    body = ("def f(a, b):\n    c = a + b\n    d = c * 2\n    if d > 3:\n        d = d - 1\n    e = [d, c, a]\n"
            "    return e + [b]\n")
    (tmp_path / "one.py").write_text(body)
    (tmp_path / "two.py").write_text('"""doc"""\n\n' + body.replace("a", "x").replace("2", "7"))
    (tmp_path / "three.py").write_text("x = 1\n" * 3 + "print('text')\n")
    assert duplicate_pairs(tmp_path) == {("one.py", "two.py"): 2}
    assert duplicate_pairs(tmp_path, shape=False) == {}


def test_declaration_lists_are_thin(tmp_path):
    fields = "".join(f"    f{i}: int\n" for i in range(8))
    (tmp_path / "one.py").write_text("class A:\n" + fields)
    (tmp_path / "two.py").write_text("class B:\n" + fields.replace("int", "str"))
    assert duplicate_pairs(tmp_path) == {}


def test_repeated_code_in_tkx_stays_within_the_limit():
    found = duplicate_pairs(ROOT)
    new = sorted(set(found) - KNOWN_DUPLICATES)
    assert len(new) <= DUPLICATE_PAIRS_LIMIT, (
        f"{len(new)} pairs of places repeat 6 lines or more (limit {DUPLICATE_PAIRS_LIMIT}): {new}; "
        "`duplicates --repo tkx` shows the lines")
    gone = sorted(KNOWN_DUPLICATES - set(found))
    assert gone == [], f"remove from KNOWN_DUPLICATES (no longer repeated): {gone}"


# -- long functions --------------------------------------------------------------------------------

#: The longest a function of tkx may be (lines, its decorators excluded, nested functions included).
FUNCTION_LINES_LIMIT = 150
#: Functions still over the limit while they are split ("path name"). An entry leaves when its function is
#: within the limit; the test names stale entries.
LONG_FUNCTIONS: set[str] = set()


def long_functions(root: Path, limit: int = FUNCTION_LINES_LIMIT) -> dict[str, int]:
    """``{"path:line name": lines}`` of the functions below ``root`` longer than ``limit`` lines."""
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > limit:
                    out[f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name}"] = n
    return out


def test_the_function_length_check_can_fail(tmp_path):
    (tmp_path / "m.py").write_text("def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 9)
    assert long_functions(tmp_path, limit=5) == {"m.py:5 long": 10}


def test_no_function_over_the_line_limit():
    found = long_functions(ROOT)
    named = {key.split(":")[0] + " " + key.split(" ")[-1]: n for key, n in found.items()}
    long = {k: n for k, n in named.items() if k not in LONG_FUNCTIONS}
    assert long == {}, f"functions over {FUNCTION_LINES_LIMIT} lines (split them into named steps): {long}"
    stale = sorted(LONG_FUNCTIONS - set(named))
    assert stale == [], f"remove from LONG_FUNCTIONS (now within the limit or gone): {stale}"
