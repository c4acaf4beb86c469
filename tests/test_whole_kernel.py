"""The exported report holds every line of the kernel, with a line, group and module index; the terminal
reports carry the NVRTC compile table."""

from __future__ import annotations

import html
import io
import re

import pytest

import tkx
import tkx.render.cuda as cuda_view

#: The zoo's largest kernel (4,159 lines on the CPU machine of the project; gpt_block > llama_block > cnn_digits).
LARGEST = "gpt_block"

_LINE = re.compile(r'<div(?: id="[^"]*")?(?: class="tkx-opl")? data-tkx-key="line:(\d+)"[^>]*>'
                   r'<span class="tkx-ln">\d+</span><span class="tkx-gut"[^>]*>.*?</span>(.*?)</div>')


def _kernel_lines_in(page: str) -> dict[int, str]:
    """Line number -> the line's text, as the page shows it (tags stripped, entities decoded)."""
    return {int(k): html.unescape(re.sub(r"<[^>]+>", "", code)) for k, code in _LINE.findall(page)}


def _explore(name):
    ex = tkx.examples.get(name)
    return tkx.explore(ex.step_fn, ex.example_inputs, name=ex.name, loss=ex.loss_output)


def test_report_of_the_largest_zoo_kernel_holds_every_line(monkeypatch):
    exp = _explore(LARGEST)
    cuda = exp.cuda
    assert cuda.num_lines > 2 * cuda_view.CUDA_VIEW_LINES
    # NVRTC takes tens of seconds on this kernel: the report's compile table is tested on a small one below
    monkeypatch.setattr(cuda_view, "compile_reports", lambda c, *a, **kw: ("not compiled in this test", []))
    page = tkx.render.report.report_html(exp, gpu=False)
    shown = _kernel_lines_in(page.split('id="tkx-sec-cuda"')[1])
    text = cuda.text.split("\n")
    assert len(shown) == len(text)
    assert all(shown[k] == line for k, line in enumerate(text, start=1))
    assert "cuda.page(" not in page and "showing lines" not in page
    # the line index and a jump link to every group's first line, each landing on an anchor
    section = page.split('id="tkx-sec-cuda"')[1]
    anchors = set(re.findall(r'<div id="(tkx-cu-[0-9a-f]+-L\d+)"', section))
    links = set(re.findall(r'href="#(tkx-cu-[0-9a-f]+-L\d+)"', section))
    assert links and links <= anchors
    assert {f"L{a}" for a, _ in cuda.group_lines.values()} <= {x.rsplit("-", 1)[1] for x in links}
    assert "Line index" in section


def test_whole_view_jumps_to_modules():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_modules import gpt_step_inputs

    step, inputs = gpt_step_inputs(layers=2)
    cuda = tkx.explore(step, inputs).cuda
    page = cuda.html(check=False, whole=True)
    assert "Modules → lines" in page
    first = cuda.module_lines["blocks.1.attn"][0]
    chip = rf'data-tkx-key="mod:blocks\.1\.attn"[^<]*</span> <a class="tkx-jump" href="#tkx-cu-[0-9a-f]+-L{first}"'
    assert re.search(chip, page)
    line = re.search(rf'<div id="tkx-cu-[0-9a-f]+-L{first}"[^>]*>', page).group(0)
    assert "mod:blocks.1.attn" in line  # clicking the module highlights its lines


def test_terminal_reports_carry_the_compile_table(tmp_path, monkeypatch):
    from rich.console import Console

    from tkx.codegen.nvrtc import nvrtc_available
    from tkx.tour import run_tour

    out = io.StringIO()
    assert run_tour("linear_regression", console=Console(file=out, width=160, soft_wrap=True), brief=True) == 0
    text = out.getvalue()
    ok, why = nvrtc_available()
    if not ok:
        assert "NVRTC compile table:" in text
        pytest.skip(f"no NVRTC here: {why}")
    table = text[text.index("NVRTC compile report"):]
    for word in ("arch", "registers", "spills", "shared", "sm_80", "sm_90"):
        assert word in table
    row = next(x for x in table.splitlines() if "sm_90" in x)
    assert re.search(r"\b\d+\b.*\d+ B.*\d+ B", row)  # registers, spills and shared memory in numbers
