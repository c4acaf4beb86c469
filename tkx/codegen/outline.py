"""Group bodies emitted once: repeated work (a model's layers) as ``__noinline__`` device functions.

The groups of a model's layers are the same code but for the memory they touch: each layer reads its
own weights (kernel parameters ``inK``), its own arena slots (``arena + offset``) and reports its own
op on an index error. :func:`parametrise` turns a group's code into a body whose addresses are
parameters; bodies of equal text (comments and the names of local values aside) are one function,
emitted once and called with each group's addresses. ptxas then compiles every distinct body once
instead of once per layer: the time to compile grows with the distinct code, not with the depth.

What becomes a parameter, by first appearance in the code:

* a kernel pointer ``inK`` / ``outK`` -> ``tkx_pJ`` (its kernel declaration's type, ``__restrict__``
  included);
* an arena address ``arena + N`` -> ``tkx_aJ`` (``unsigned char*``: slots of one arena, no
  ``__restrict__`` promise between them);
* the op number an index check reports (``tkx_fail(status, code, N)``, ``tkx_check_index(..., N)``) ->
  ``tkx_sJ``;
* ``item`` (the work item), ``status``, ``sync`` and ``tkx_tiles`` under their own names.

Loads through a read-only parameter (a kernel input declared ``const T* __restrict__``) go through ``__ldg``
(:func:`read_only_loads`): inside a kernel NVVM turns such loads into ``ld.global.nc`` itself, but only for the
kernel's own parameters, never in a device function; the helpers ``tkx_ldg_<dtype>`` (:data:`LDG_HELPERS`)
precede the functions.

An inlined value read through a ``tkx_v_<op>`` function becomes a call of the parametrised function of
the same text (``tkx_vf_J``), its addresses passed on. Code that reads the tensor maps, the barrier
generation or the dataflow epoch, or that returns, stays in the kernel (:func:`parametrise` gives
``None``). The shared workspace ``tkx_smem`` moves to file scope so the functions see it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from .text import block, indent

__all__ = ["Body", "Outliner", "REPEATED_SHARE", "op_lines_of", "read_only_loads", "LDG_HELPERS"]

#: ``Options.outline="auto"`` outlines the groups of a kernel whose group code is at least this share repeats
#: (the lines of every body beyond its first use): the decode steps of 4 layers (0.72) and of Llama-3.2-1B's
#: 16 (0.92); not the zoo's training steps, where some backward pieces repeat (gpt_block 0.17, llama_block
#: 0.31), nor the 2-layer decode models (0.42).
REPEATED_SHARE = 0.5

_TOKEN = re.compile(r"(?P<arena>\barena \+ \d+\b)|(?P<site>@S\d+@)|(?P<ptr>\b(?:in|out)\d+\b)"
                    r"|(?P<local>\b(?:v|acc)_\w+)|(?P<word>\b[A-Za-z_]\w*\b)")
_SITES = (re.compile(r"(\btkx_fail\(status, \w+, )(\d+)\)"),
          re.compile(r"(\btkx_check_index\(status, \w+, \d+, )(\d+)\)"))
_VALUE_CALL = re.compile(r"\btkx_v_(\w+)\(TKX_ARGS, ")
#: Kernel-scope names a body may use, passed under their own names (declaration type, name).
_NAMED = {"item": "const int", "status": "int*", "sync": "unsigned int*", "tkx_tiles": "unsigned int* const"}
#: Kernel-scope names that keep a group in the kernel.
_STAY = {"tmaps", "tkx_gen", "tkx_epoch", "tkx_w", "TKX_ARGS", "TKX_POINTERS", "return", "timeline"}

#: The read-only forms of the prelude's ``tkx_ld_<dtype>`` loads, through the non-coherent (texture) path.
LDG_HELPERS = """\
// Loads of read-only inputs in the device functions below: __ldg gives ld.global.nc, which NVVM infers by
// itself only for a kernel's own const __restrict__ parameters.
TKX_INLINE float tkx_ldg_f32(const float* p, long long i) { return __ldg(p + i); }
TKX_INLINE float tkx_ldg_bf16(const void* p, long long i) {
    return tkx_bf16_to_float(__ldg(static_cast<const unsigned short*>(p) + i));
}
TKX_INLINE float tkx_ldg_f16(const void* p, long long i) {
    return tkx_f16_to_float(__ldg(static_cast<const unsigned short*>(p) + i));
}
TKX_INLINE long long tkx_ldg_i64(const long long* p, long long i) { return __ldg(p + i); }
TKX_INLINE long long tkx_ldg_i32(const int* p, long long i) { return (long long)__ldg(p + i); }
TKX_INLINE long long tkx_ldg_i8(const signed char* p, long long i) { return (long long)__ldg(p + i); }
TKX_INLINE long long tkx_ldg_u8(const unsigned char* p, long long i) { return (long long)__ldg(p + i); }
TKX_INLINE float tkx_ldg_bool(const bool* p, long long i) {
    return __ldg(reinterpret_cast<const unsigned char*>(p) + i) ? 1.0f : 0.0f;
}"""
_LDG_SUFFIXES = ("f32", "bf16", "f16", "i64", "i32", "i8", "u8", "bool")
#: A local pointer into a parameter (the GEMV's and attention's raw 16-byte loads read through one).
_LOCAL_POINTER = re.compile(r"\bconst (?:unsigned short|unsigned char|signed char|float|uint4)\* (\w+) = ([^;]*);")


def read_only_loads(text: str, params: list[str]) -> str:
    """``text`` (a parametrised body) with its loads through read-only pointer parameters (``const T*
    __restrict__``, from :data:`params`' declarations) as ``__ldg``: ``tkx_ld_<dtype>(p, i)`` ->
    ``tkx_ldg_<dtype>(p, i)``, and through a local ``const T* src = <address in p>``,
    ``*reinterpret_cast<const uint4*>(src)`` -> ``__ldg(reinterpret_cast<const uint4*>(src))`` and
    ``src[k]`` -> ``__ldg(src + k)``. Other parameters (written by the kernel, or arena slots) keep plain
    loads: a buffer the kernel writes is never read through the non-coherent path."""
    ro = [d.rsplit(" ", 1)[1] for d in params if d.startswith("const ") and "* __restrict__ " in d]
    if not ro:
        return text
    mentions = re.compile(r"\b(?:" + "|".join(map(re.escape, ro)) + r")\b")
    point = re.compile(r"\btkx_ld_(" + "|".join(_LDG_SUFFIXES) + r")\((" + "|".join(map(re.escape, ro)) + r"),")
    local: dict[str, bool] = {}  # local pointer -> it points into a read-only parameter (its latest declaration)
    out = []
    for line in text.splitlines():
        src, comment = _split(line)
        src = point.sub(lambda m: f"tkx_ldg_{m.group(1)}({m.group(2)},", src)
        for name, on in local.items():
            if on:
                src = re.sub(rf"\*reinterpret_cast<const uint4\*>\({name}\)",
                             f"__ldg(reinterpret_cast<const uint4*>({name}))", src)
                src = re.sub(rf"\b{name}\[(\d+)\]", rf"__ldg({name} + \1)", src)
        for m in _LOCAL_POINTER.finditer(src):
            local[m.group(1)] = bool(mentions.search(m.group(2)))
        out.append(src + comment)
    return "\n".join(out)


def _split(line: str) -> tuple[str, str]:
    """(code, comment) of a generated line (generated code has no string literals holding ``//``)."""
    at = line.find("//")
    return (line, "") if at < 0 else (line[:at], line[at:])


def op_lines_of(code: str, ops) -> dict[str, list[int]]:
    """op id -> 0-based lines of ``code`` that compute or store it, from the comment every emitter
    writes after such a statement (``// <op>: <kind>``, ``// store <op> -> ...``)."""
    out: dict[str, list[int]] = {}
    for no, line in enumerate(code.splitlines()):
        if "//" not in line:
            continue
        tail = line.split("//", 1)[1].strip()
        tok = tail.split(":")[0].split(" ")[0]
        if tok in ops:
            out.setdefault(tok, []).append(no)
        if tail.startswith("store "):
            out.setdefault(tail.split()[1], []).append(no)
    return out


@dataclass
class Body:
    """A code fragment with its addresses as parameters.

    ``key``: the text that decides sameness (comments out, local names numbered); ``text``: the code
    with the parameter names in (this fragment's comments and local names kept); ``params``: the
    declarations (``"const tkx_bf16* __restrict__ tkx_p0"``); ``args``: this fragment's values of
    them (``"in3"``, ``"arena + 640"``, ``"39"``, ``"item"``)."""

    key: str
    text: str
    params: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


class Outliner:
    """Parametrises group code and the ``tkx_v_`` functions it calls (one instance per kernel).

    ``kernel_types``: kernel parameter name -> C type; ``functions``: the emitter's ``tkx_v_<op>``
    function texts by name."""

    def __init__(self, kernel_types: dict[str, str], functions: dict[str, str]) -> None:
        self.types = kernel_types
        self.functions = functions
        self.value_functions: dict[str, tuple[str, str]] = {}  # key -> (name, text)
        self._of: dict[str, tuple[str, list[str]] | None] = {}  # tkx_v name -> (tkx_vf name, args)

    def parametrise(self, code: str, *, function: bool = False) -> Body | None:
        """``code`` as a :class:`Body`, or ``None`` when it must stay in the kernel (see the module).
        ``function``: the body of a ``tkx_v_`` function (it returns; its op numbers stay literal)."""
        names: dict[str, str] = {}  # value -> parameter name
        params: list[str] = []
        args: list[str] = []
        locals_: dict[str, str] = {}
        counts = {"p": 0, "a": 0, "s": 0}

        def param(value: str, kind: str, ctype: str) -> str:
            if value not in names:
                if kind in counts:
                    names[value] = f"tkx_{kind}{counts[kind]}"
                    counts[kind] += 1
                else:
                    names[value] = value
                params.append(f"{ctype} {names[value]}")
                args.append(value)
            return names[value]

        missing = []

        def value_call(m: re.Match) -> str:
            called = self.value_function(f"tkx_v_{m.group(1)}")
            if called is None:
                missing.append(m.group(1))
                return m.group(0)
            return f"{called[0]}(" + "".join(f"{a}, " for a in called[1])

        key_lines: list[str] = []
        text_lines: list[str] = []
        for line in code.splitlines():
            src, comment = _split(line)
            src = _VALUE_CALL.sub(value_call, src)
            if missing:
                return None
            if not function:
                for rx in _SITES:
                    src = rx.sub(lambda m: f"{m.group(1)}@S{m.group(2)}@)", src)
            text_parts: list[str] = []
            key_parts: list[str] = []
            pos = 0
            for m in _TOKEN.finditer(src):
                text_parts.append(src[pos:m.start()])
                key_parts.append(src[pos:m.start()])
                pos = m.end()
                tok = m.group(0)
                kind = m.lastgroup
                if kind == "local":
                    text_parts.append(tok)
                    key_parts.append(locals_.setdefault(tok, f"tkx_l{len(locals_)}"))
                    continue
                if kind == "arena":
                    tok = param(tok, "a", "unsigned char*")
                elif kind == "site":
                    tok = param(tok[2:-1], "s", "const int")
                elif kind == "ptr":
                    if tok not in self.types:
                        return None
                    tok = param(tok, "p", self.types[tok])
                elif tok in _STAY and not (function and tok == "return"):
                    return None
                elif tok in _NAMED:
                    param(tok, "named", _NAMED[tok])
                text_parts.append(tok)
                key_parts.append(tok)
            text_parts.append(src[pos:])
            key_parts.append(src[pos:])
            text_lines.append("".join(text_parts) + comment)
            key_lines.append("".join(key_parts).rstrip())
        # the parameters' types belong to the key: two bodies of one text over a `const float*` and a
        # `float*` (or a float and a bfloat16 pointer) are two functions
        key_lines.append("// " + ", ".join(params))
        return Body("\n".join(key_lines), read_only_loads("\n".join(text_lines), params), params, args)

    def value_function(self, name: str) -> tuple[str, list[str]] | None:
        """(the parametrised function of ``tkx_v_<op>`` ``name``, the argument values its call passes)."""
        if name in self._of:
            return self._of[name]
        self._of[name] = None
        text = self.functions.get(name, "")
        head, sep, rest = text.partition(f"{name}(TKX_POINTERS, ")
        if not sep:
            return None
        signature_end = rest.index(") ")
        index_param, after = rest[:signature_end], rest[signature_end:]
        comment, _, decl = head.rpartition("\n")
        body = self.parametrise(after, function=True)
        if body is None:
            return None
        digest = hashlib.sha256((decl + index_param + body.key).encode()).hexdigest()
        if digest not in self.value_functions:
            fname = f"tkx_vf_{len(self.value_functions)}"
            params = ", ".join([*body.params, index_param])
            self.value_functions[digest] = (fname, f"{comment}\n{decl}{fname}({params}{body.text}")
        self._of[name] = (self.value_functions[digest][0], body.args)
        return self._of[name]

    def value_function_texts(self) -> list[tuple[str, str]]:
        """(name, text) of the parametrised ``tkx_vf_`` functions, callees first (each calls only earlier
        ones)."""
        return list(self.value_functions.values())


def function_text(name: str, body: Body, users: list[str]) -> str:
    """The ``__noinline__`` device function of ``body``, called by the groups ``users``."""
    who = ", ".join(users) if len(users) <= 8 else ", ".join(users[:8]) + f" and {len(users) - 8} more"
    return block(f"// one body for {len(users)} groups ({who}): their addresses are the arguments",
                 f"__device__ __noinline__ void {name}(" + ", ".join(body.params) + ") {",
                 indent(body.text), "}")


def call_text(name: str, body: Body, gid: str) -> str:
    """The kernel's call of the outlined body of group ``gid``."""
    return f"{name}({', '.join(body.args)});  // {gid}: the body {name}"
