"""What the back-end stage views share (schedule, arena, CUDA source): style, sizes, tokens.

Provenance tokens (see :mod:`tkx.render`): ``grp:<group>``, ``op:<ir op>``, ``buf:<buffer>``,
``line:<cuda line>``, ``stage:<n>``, ``slot:<buffer>``. A schedule group carries the ops it
computes, inlines and stores, the buffers it reads and writes and its stage; an arena row
carries its buffer, the op that produced it and the groups that write and read it; a CUDA line
carries the ops, groups and arena slots it implements. Clicking any of them highlights the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import view

STAGE_STYLE = """
.tkx-view .tkx-sub{font-family:system-ui,sans-serif;font-weight:600;margin:10px 0 4px}
.tkx-view .tkx-stage-row td{background:#f6f8fa;font-family:system-ui,sans-serif;font-weight:600;
  border-top:1px solid #d0d7de;padding-top:3px}
.tkx-view .tkx-barrier-row td{color:#b42318;white-space:normal;padding:2px 0 2px 18px;font-size:11px}
.tkx-view .tkx-grp td{border-top:1px dotted #e5e7eb;white-space:normal}
.tkx-view .tkx-grp td.tkx-nowrap{white-space:nowrap}
.tkx-view .tkx-chip{display:inline-block;padding:0 3px;margin:0 2px 1px 0;border-radius:3px;background:#f0f3f6;
  white-space:nowrap}
.tkx-view .tkx-chip.tkx-inl{border:1px dashed #8c959f;background:none}
.tkx-view .tkx-why{color:#6e7781;font-size:11px;font-family:system-ui,sans-serif}
.tkx-view .tkx-ok{color:#1a7f37}.tkx-view .tkx-no{color:#b42318;font-weight:600}
.tkx-view tr.tkx-fused td{color:#57606a}
.tkx-view .tkx-kv td:first-child{color:#57606a;font-family:system-ui,sans-serif}
.tkx-view .tkx-src{white-space:pre;font-size:12px;line-height:1.3}
.tkx-view .tkx-scroll{max-height:640px;overflow:auto;border:1px solid #eaeef2}
.tkx-view a.tkx-jump{color:#0969da;text-decoration:none;font-size:11px}
.tkx-view .tkx-src>div{padding-right:8px}
.tkx-view .tkx-src .tkx-ln{display:inline-block;width:4.5em;color:#8c959f;text-align:right;padding-right:6px;
  user-select:none}
.tkx-view .tkx-src .tkx-gut{display:inline-block;width:4em;color:#8250df;user-select:none}
.tkx-view .tkx-src .tkx-opl{background:#f6f8fa}
.tkx-view .tkx-add{color:#1a7f37;background:#e6ffec}.tkx-view .tkx-del{color:#b42318;background:#ffebe9}
.tkx-view .tkx-hunk{color:#8250df}
.tkx-view .tkx-volatile{}
"""



def _view(kind: str, title: str, body: str, text: str) -> str:
    return view(kind, title, f"<style>{STAGE_STYLE}</style>{body}", text)


def _kib(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} B"


def _shape(shape: Sequence[int]) -> str:
    return "×".join(map(str, shape)) or "scalar"


def _is_op(program: Any, name: str) -> bool:
    try:
        program.op(name)
        return True
    except (KeyError, ValueError, LookupError):
        return False


def _op_ids(program: Any) -> set[str]:
    return {o.id for o in program.ops}


def _region(program: Any, op_id: str) -> str:
    try:
        return program.op(op_id).region
    except Exception:
        return ""



def _home_text(s: Any, buf: str) -> str:
    """Where a stored value lives, in user terms (``arena``, ``out``, ``params['w1'] (in place)``)."""
    home = s.homes.get(buf)
    if home is None:
        return "scratch" if buf in s.scratch else "arena"
    if home.kind == "input":
        return f"{s.program.inputs[home.index].name} (in place)"
    if home.kind == "output":
        return f"output {s.program.outputs[home.index].name}"
    return str(home)


def _dst_text(s: Any, home: Any) -> str:
    if home.kind == "input":
        return s.program.inputs[home.index].name
    if home.kind == "output":
        return f"output {s.program.outputs[home.index].name}"
    return str(home)


def _input_buffer(program: Any, name: str) -> str | None:
    for i in program.inputs:
        if i.name == name:
            return i.value.buffer
    return None


def _ref_tokens(program: Any, name: str, ops: set[str]) -> list[str]:
    """Provenance tokens of a decision's producer/consumer (an op id or an input name)."""
    if name in ops:
        return [f"op:{name}"]
    buf = _input_buffer(program, name)
    return [f"buf:{buf}"] if buf else []


