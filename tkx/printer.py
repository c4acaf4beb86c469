"""A readable, deterministic printer for programs and captured graphs (JAX/MLIR style).

Every value is named after the buffer it lives in: ``%in0``, ``%in1``, ... for the step's inputs (the
user's names, such as ``params['w1']``, are comments) and ``%<op id>`` for ops (``%relu``, ``%mm_2``), the
same ids the schedule, the arena plan and the CUDA source use, so a name never changes when a pass
removes other ops. Every value shows its dtype and shape; views show how they look at their
root (``%3.T``, ``bcast(%1 -> 64x128)``, ``view(%2, ...)``); the user's source line is a
trailing comment. Nothing printed depends on object identity or memory addresses.
"""

from __future__ import annotations

from typing import Any

from .ir import DTYPE_SHORT, Op, Operand, Program, TensorSpec

#: A :class:`tkx.capture.CapturedGraph` (the printer sits below the capture package, so it
#: does not import it: the capture's views call the printer, never the other way round).
CapturedGraph = Any

REGION_STYLE = {"forward": "bold blue", "backward": "bold magenta", "optimizer": "bold green"}
COMMENT_COLUMN = 64


def type_str(spec: TensorSpec) -> str:
    return f"{DTYPE_SHORT[spec.dtype]}[{','.join(str(d) for d in spec.shape)}]"


def _fmt_scalar(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return repr(x)
    return str(x)


class Namer:
    """Names root buffers ``%<buffer id>`` (inputs ``%in0``..., ops ``%<op id>``)."""

    def __init__(self, program: Program) -> None:
        self.names: dict[str, str] = {}
        self.roots: dict[str, TensorSpec] = {}
        for inp in program.inputs:
            self._add(inp.value.buffer, inp.value)
        for op in program.ops:
            self._add(op.id, op.out)

    def _add(self, buf: str, spec: TensorSpec) -> None:
        self.names[buf] = f"%{buf}"
        self.roots[buf] = spec

    def operand(self, x: Operand) -> str:
        if not isinstance(x, TensorSpec):
            return _fmt_scalar(x)
        name = self.names.get(x.buffer, f"%?{x.buffer}")
        root = self.roots.get(x.buffer)
        if root is None or (x.shape == root.shape and x.strides == root.strides and x.offset == root.offset):
            return name
        if (x.ndim == 2 and root.ndim == 2 and x.offset == root.offset and x.shape == root.shape[::-1]
                and x.strides == root.strides[::-1]):
            return f"{name}.T"
        if x.offset == root.offset and _is_broadcast(x, root):
            return f"bcast({name} -> {'x'.join(map(str, x.shape))})"
        if x.is_dense and root.is_dense and x.numel == root.numel:
            return f"reshape({name} -> {'x'.join(map(str, x.shape))})"
        off = f", offset={x.offset}" if x.offset else ""
        return f"view({name}, {'x'.join(map(str, x.shape))}, strides=({','.join(map(str, x.strides))}){off})"


def _is_broadcast(x: TensorSpec, root: TensorSpec) -> bool:
    """x is root expanded: its non-broadcast dims (size > 1, stride != 0) are root's dims of
    size > 1, in order and with the same strides (size-1 dims and their strides are ignored)."""
    kept = [(d, s) for d, s in zip(root.shape, root.strides) if d != 1]
    xs = [(d, s) for d, s in zip(x.shape, x.strides) if d != 1 and s != 0]
    return kept == xs and x.numel != root.numel


def _attrs(op: Op) -> str:
    if not op.attrs:
        return ""
    parts = []
    for k in sorted(op.attrs):
        v = op.attrs[k]
        if isinstance(v, tuple):
            v = "(" + ",".join(map(str, v)) + ("," if len(v) == 1 else "") + ")"
        parts.append(f"{k}={_fmt_scalar(v) if not isinstance(v, str) else v}")
    return " {" + ", ".join(parts) + "}"


def module_label(path: str | None, kind: str | None = None) -> str:
    """How a module is named in every view: its dotted path (``blocks.1.attn``); the root module
    (path ``""``) by its class; ``""`` outside every module."""
    if path is None:
        return ""
    return path or (kind or "root")


def where(source: Any, module: str | None, module_type: str | None = None) -> str:
    """``file.py:LINE [blocks.1.attn]  code``: the user's line and the module an op came from."""
    mod = module_label(module, module_type)
    mod = f" [{mod}]" if mod else ""
    if source is None:
        return mod.strip()
    return f"{source.short()}{mod}  {source.code}"


def op_line(op: Op, namer: Namer) -> tuple[str, str]:
    """(code, comment) for one op."""
    args = ", ".join(namer.operand(x) for x in op.inputs)
    code = f"{namer.names[op.id]}: {type_str(op.out)} = {op.kind}{(' ' + args) if args else ''}{_attrs(op)}"
    return code, where(op.source, op.module, op.module_type)


def _join(code: str, comment: str, indent: str = "  ") -> str:
    if not comment:
        return indent + code
    pad = max(COMMENT_COLUMN - len(indent) - len(code), 2)
    return f"{indent}{code}{' ' * pad}# {comment}"


GROUPINGS = ("region", "module")


def program_lines(program: Program, group_by: str = "region") -> list[tuple[str, str, str]]:
    """(kind, text, region) rows; kind is header/input/region/module/op/output/update.

    ``group_by="region"`` lists the ops in program order under forward/backward/optimizer headers;
    ``group_by="module"`` lists them under one header per ``nn.Module`` (in order of first appearance,
    ops in program order within it, ops outside every module last), each op's region in its comment.
    Raises ``ValueError`` for another ``group_by``.
    """
    if group_by not in GROUPINGS:
        raise ValueError(f"group_by={group_by!r}: choose one of {', '.join(GROUPINGS)}")
    namer = Namer(program)
    rows: list[tuple[str, str, str]] = [("header", f"program {program.name} {{", "")]
    rows.append(("section", "  inputs:", ""))
    for inp in program.inputs:
        mark = "  (updated in place)" if inp.mutated else ""
        rows.append(("input", _join(f"{namer.names[inp.value.buffer]}: {type_str(inp.value)}",
                                    f"{inp.name}{mark}", "    "), ""))
    if group_by == "module":
        rows.extend(_module_rows(program, namer))
    region = None
    for op in program.ops if group_by == "region" else ():
        if op.region != region:
            region = op.region
            rows.append(("region", f"  {region}:", region))
        code, comment = op_line(op, namer)
        rows.append(("op", _join(code, comment, "    "), op.region))
    rows.append(("section", "  outputs:", ""))
    for o in program.outputs:
        rows.append(("output", f"    {o.name} = {namer.operand(o.value)}: {type_str(o.value)}", ""))
    if program.updates:
        rows.append(("section", "  in-place updates:", ""))
        for u in program.updates:
            rows.append(("update", f"    {program.inputs[u.input_index].name} <- {namer.operand(u.value)}", ""))
    rows.append(("header", "}", ""))
    return rows


def _module_rows(program: Program, namer: Namer) -> list[tuple[str, str, str]]:
    groups: dict[str | None, list[Op]] = {}
    for op in program.ops:
        groups.setdefault(op.module, []).append(op)
    if None in groups:
        groups[None] = groups.pop(None)  # outside every module: last
    rows: list[tuple[str, str, str]] = []
    for path, ops in groups.items():
        kind = ops[0].module_type
        head = (f"{module_label(path, kind)}" + (f" ({kind})" if kind and path else "")) if path is not None \
            else "outside every module"
        rows.append(("module", f"  {head}:  # {len(ops)} ops", ops[0].region))
        for op in ops:
            code, comment = op_line(op, namer)
            src = f"{op.source.short()}  {op.source.code}" if op.source is not None else ""
            rows.append(("op", _join(code, f"{op.region:<9} {src}".rstrip(), "    "), op.region))
    return rows


def format_program(program: Program, group_by: str = "region") -> str:
    """The program as text (deterministic: safe for golden tests); ``group_by`` as for
    :func:`program_lines`."""
    return "\n".join(text for _, text, _ in program_lines(program, group_by))


def rich_program(program: Program) -> Any:
    """A ``rich`` renderable: the same text, regions coloured, comments dimmed."""
    from rich.text import Text

    out = Text()
    for kind, text, region in program_lines(program):
        if kind == "region":
            out.append(text, style=REGION_STYLE[region])
        elif kind == "module":
            out.append(text, style="bold")
        elif "#" in text and kind in ("op", "input"):
            code, comment = text.split("#", 1)
            out.append(code)
            out.append("#" + comment, style="dim")
        elif kind in ("header", "section"):
            out.append(text, style="bold")
        else:
            out.append(text)
        out.append("\n")
    return out


def captured_lines(cg: CapturedGraph) -> list[tuple[str, str | None]]:
    rows: list[tuple[str, str | None]] = [(f"captured graph {cg.name} (FX, aten ops on fake tensors) {{", None)]
    for n in cg.nodes:
        ty = f"{DTYPE_SHORT.get(n.dtype or '', n.dtype)}[{','.join(map(str, n.shape))}]" if n.shape is not None else ""
        if n.op == "placeholder":
            idx = [i.name for i in cg.nodes if i.op == "placeholder"].index(n.name)
            rows.append((_join(f"{n.name}: {ty}", cg.input_names[idx]), None))
        elif n.op == "output":
            rows.append((f"  return ({', '.join(n.args)})", None))
        else:
            target = n.target.replace("aten.", "").replace(".default", "")
            comment = f"{n.region or '':<9} {where(n.source, n.module, n.module_type)}".rstrip()
            args = ", ".join(getattr(n, "arguments", ()) or n.args)
            rows.append((_join(f"{n.name}: {ty} = {target}({args})", comment), n.region))
    rows.append(("}", None))
    return rows


def format_captured(cg: CapturedGraph) -> str:
    return "\n".join(text for text, _ in captured_lines(cg))


def rich_captured(cg: CapturedGraph) -> Any:
    from rich.text import Text

    out = Text()
    for text, region in captured_lines(cg):
        if region and "#" in text:
            code, comment = text.split("#", 1)
            out.append(code)
            out.append("# ", style="dim")
            out.append(comment[1:10], style=REGION_STYLE[region])
            out.append(comment[10:], style="dim")
        else:
            out.append(text)
        out.append("\n")
    return out
