"""Drawing a :class:`~tkx.diff.StageDiff` (HTML and rich); the diff itself is data."""

from __future__ import annotations

from typing import Any

from .. import display
from ..diff import StageDiff
from .base import esc
from .stage_common import _view


@display.register(StageDiff, "html")
def stage_diff_html(self: StageDiff) -> str:
    parts = [f'<div>{"<br>".join(esc(x) for x in self.summary)}</div>']
    for head, lines in self.sections:
        if not lines:
            continue
        if head == "unified diff":
            body = []
            for ln in lines:
                cls = ("tkx-hunk" if ln.startswith("@@") else "tkx-add" if ln.startswith("+")
                       else "tkx-del" if ln.startswith("-") else "")
                body.append(f'<div class="{cls}">{esc(ln) or " "}</div>')
            parts.append(f'<div class="tkx-sub">{esc(head)}</div><div class="tkx-src">{"".join(body)}</div>')
            continue
        items = []
        for ln in lines:
            cls = "tkx-add" if ln.startswith("+") else "tkx-del" if ln.startswith("-") else ""
            items.append(f'<div class="{cls}">{esc(ln)}</div>')
        parts.append(f'<div class="tkx-sub">{esc(head)} ({len(lines)})</div><div>{"".join(items)}</div>')
    if not self.changed:
        parts.append('<div class="tkx-dim">no change</div>')
    return _view("diff", self.title, "".join(parts), str(self))


@display.register(StageDiff, "rich")
def stage_diff_rich(self: StageDiff) -> Any:
    from rich.text import Text

    t = Text()
    for line in str(self).split("\n"):
        style = "green" if line.strip().startswith("+") else "red" if line.strip().startswith("-") else ""
        t.append(line + "\n", style=style)
    return t
