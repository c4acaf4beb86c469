"""Values and indices in the generated kernel: how a group reads an element (a register, an inlined
statement, a ``tkx_v_<op>`` device function or a load from its home) and computes one."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .. import ops as optable
from ..arena import ArenaPlan
from ..dtypes import FLOAT_DTYPES, INT_DTYPES
from ..errors import TkxError
from ..ir import Op, TensorSpec, contiguous_strides
from ..schedule.model import FusedSchedule, Home
from . import abi, intfacts
from . import ops as cops
from .cuda_prelude import (
    C_TYPES,
    load,
    round_to,
)
from .text import block, indent


def _mixed_index(lin: str, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> str:
    """C expression: the root-buffer index of element ``lin`` (row-major) of a view."""
    if all(d == 1 or s == c for d, s, c in zip(shape, strides, contiguous_strides(shape))):
        return lin if offset == 0 else f"({lin} + {offset})"
    return _coords_index(_unravel(lin, shape), strides, offset)


def _coords_index(coords: list[str], strides: tuple[int, ...], offset: int) -> str:
    terms = [c if s == 1 else f"{c} * {s}" for c, s in zip(coords, strides) if s != 0 and c != "0"]
    if offset:
        terms.append(str(offset))
    return "(" + " + ".join(terms) + ")" if terms else "0"


def _linear(coords: list[str], shape: tuple[int, ...]) -> str:
    """C expression: the row-major linear index of ``coords`` in ``shape``."""
    terms, inner = [], 1
    for c, n in zip(reversed(coords), reversed(shape)):
        if n != 1 and c != "0":
            terms.append(c if inner == 1 else f"(long long){c} * {inner}")
        inner *= n
    return "(" + " + ".join(reversed(terms)) + ")" if terms else "0"


def _unravel(lin: str, shape: tuple[int, ...]) -> list[str]:
    """C expressions of each coordinate of row-major linear index ``lin`` in ``shape``."""
    out = []
    inner = 1
    for d in range(len(shape) - 1, -1, -1):
        n = shape[d]
        if n == 1:
            out.append("0")
        else:
            c = f"({lin} / {inner})" if inner != 1 else lin
            out.append(f"({c} % {n})" if math.prod(shape[:d]) > 1 else c)
        inner *= n
    return out[::-1]


class _RowContext:
    """State of a row-persistent group while it is emitted: the row's shape and reduced dims, the full-row
    members computed where read (``lazy``), and the per-lane register arrays caching the row's loads."""

    def __init__(self, shape: tuple[int, ...], dims: tuple[int, ...], lazy: set[str], lanes: int) -> None:
        self.shape, self.dims, self.lazy, self.lanes = shape, dims, lazy, lanes
        self.slots: dict[tuple[str, str], tuple[str, str]] = {}  # (pointer, index) -> (array, C type)
        self.cached = True

    def broadcast(self, x: TensorSpec, root: TensorSpec) -> bool:
        from ..schedule.rowshape import is_row_broadcast
        return is_row_broadcast(x, root, self.shape, self.dims)

    def cache(self, ptr: str, idx: str, dtype: str, expr: str, lines: list[str]) -> str:
        """The register holding this lane's element ``k`` of the load ``expr`` (loaded on first use)."""
        key = (ptr, idx)
        if key not in self.slots:
            self.slots[key] = (f"tkx_rc{len(self.slots)}", cops.c_type(dtype))
            lines.append(f"{self.slots[key][0]}[k] = {expr};  // the row stays in registers")
        return f"{self.slots[key][0]}[k]"

    def declarations(self) -> list[str]:
        return [f"{ctype} {name}[{self.lanes}];" for name, ctype in self.slots.values()]


@dataclass
class KernelPlan:
    """Scratchpad of code generation: device functions, per-group code, the source map."""

    functions: dict[str, str] = field(default_factory=dict)
    tensor_cores: bool = False
    shared_bytes: int = 0
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: TMA tensor maps the GEMMs read (index = position), for the launch contract.
    tensor_maps: list[abi.TensorMapSpec] = field(default_factory=list)
    #: Per-tile arrival counters of the "last-slice" split-K GEMMs: group id -> first counter (words
    #: ``tkx_tiles[first .. first + tiles)``, ``tkx_tiles`` = ``sync`` + :func:`_tile_counter_base`).
    tile_counters: dict[str, int] = field(default_factory=dict)
    tile_counter_words: int = 0
    #: CTAs per thread-block cluster the kernel is launched in (2 when a GEMM pairs its items,
    #: ``Options.gemm_cluster``), and the groups that do.
    cluster: int = 1
    cluster_groups: set[str] = field(default_factory=set)
    #: The stored weight a streaming GEMV reads: group id -> (C pointer in the kernel's scope, first byte,
    #: bytes), for the L2 prefetch of the stage before it (``Options.weight_prefetch``).
    stream_weights: dict[str, tuple[str, int, int]] = field(default_factory=dict)


class ValueEmitter:
    """The base of the kernel emitter: the schedule, the arena and the op table; pointers to homes, the
    ``tkx_v_<op>`` device functions of inlined values, and the C statements computing one value or index
    at a linear index. The group emitters (:mod:`~tkx.codegen.kernel_groups`, :mod:`~tkx.codegen.kernel_gemm`,
    :mod:`~tkx.codegen.kernel_attention`) build on it."""

    def __init__(self, s: FusedSchedule, arena: ArenaPlan) -> None:
        self.s = s
        self.arena = arena
        self.p = s.program
        self.ops = {op.id: op for op in self.p.ops}
        self.inputs = {i.value.buffer: k for k, i in enumerate(self.p.inputs)}
        self.exact = bool(s.options.exact)
        self.cheap = bool(s.options.cheap_int_math)
        self.threads = s.threads
        self.plan = KernelPlan()
        self._row: _RowContext | None = None  # set while a row-persistent group is emitted
        self._index_only: dict = {}  # intfacts' cache of index-only values (divisors such as 16**j)
        self._index32: bool | None = None
        self._ranges: dict = {}  # intfacts' cache of integer value bounds
        self._readers: dict[str, int] | None = None  # buffer -> how many ops (and sinks) read it

    def readers(self, buf: str) -> int:
        """How many ops of the program (:meth:`tkx.ir.Program.users`), outputs and state updates read root
        buffer ``buf``."""
        if self._readers is None:
            counts = {b: len(ops) for b, ops in self.p.users().items()}
            for v in self.p.sinks():
                counts[v.buffer] = counts.get(v.buffer, 0) + 1
            self._readers = counts
        return self._readers.get(buf, 0)

    def rounds_once(self, op: Op) -> bool:
        """A float32 product read by more than one op is rounded on its own (``__fmul_rn``): left to the
        compiler, ``a * b - c`` at one reader contracts into ``fma(a, b, -c)`` (the product unrounded)
        while another reader (a reduction, a recomputation elsewhere) sees the rounded product, so one
        SSA value would hold two numbers. LayerNorm's backward over one element is where it shows: its
        ``dy*g - sum(dy*g)`` left a rounding residual that ``1/sqrt(eps)`` magnified."""
        return op.kind == "mul" and op.out.dtype == "float32" and self.readers(op.id) > 1

    def index32(self) -> bool:
        """Device functions take a 32-bit non-negative index (:func:`tkx.codegen.intfacts.index_fits_32` over
        every view of the program), when :attr:`tkx.Options.cheap_int_math` is on."""
        if self._index32 is None:
            specs = [i.value for i in self.p.inputs] + [o.value for o in self.p.outputs]
            for op in self.p.ops:
                specs.append(op.out)
                specs += [x for x in op.inputs if isinstance(x, TensorSpec)]
            self._index32 = self.cheap and intfacts.index_fits_32(specs)
        return self._index32

    # -- memory ---------------------------------------------------------------------------
    def pointer(self, buf: str) -> tuple[str, str]:
        """(C pointer expression, dtype) of root buffer ``buf``."""
        if buf in self.inputs:
            k = self.inputs[buf]
            return f"in{k}", self.p.inputs[k].value.dtype
        if buf in self.s.scratch:
            return f"reinterpret_cast<float*>(arena + {self.arena.offset(buf)})", "float32"
        home = self.s.homes.get(buf)
        if home is None:
            raise TkxError(f"codegen: {buf} is read from memory but has no home")
        dtype = self.ops[buf].out.dtype
        if home.kind == "arena":
            return f"reinterpret_cast<{C_TYPES[dtype]}*>(arena + {self.arena.offset(buf)})", dtype
        return (f"out{home.index}" if home.kind == "output" else f"in{home.index}"), dtype

    def home_pointer(self, home: Home, buf: str) -> tuple[str, str]:
        if home.kind == "arena":
            return self.pointer(buf)
        if home.kind == "output":
            return f"out{home.index}", self.p.outputs[home.index].value.dtype
        return f"in{home.index}", self.p.inputs[home.index].value.dtype

    # -- device functions for inlined values read at arbitrary indices ------------------
    def function(self, op_id: str) -> str:
        name = f"tkx_v_{op_id}"
        if name in self.plan.functions:
            return name
        self.plan.functions[name] = ""  # reserve (recursion is impossible: the IR is a DAG)
        op = self.ops[op_id]
        lines: list[str] = []
        memo: dict[tuple[str, str], str] = {}
        val = self.value_statements(op, "i", lines, memo, registers={}, group_inlined=None)
        # every index of the program fits (index32): a 32-bit non-negative index, so / and % by 2**s are shifts
        # and masks (the assumption on the signature's line: the source's line numbers stay as they were)
        narrow = self.index32()
        body = block(lines, f"return {val};")
        self.plan.functions[name] = (
            f"// {op_id} = {op.kind}: recomputed where it is read ({op.source.short() if op.source else ''})\n"
            f"__device__ __forceinline__ {cops.c_type(op.out.dtype)} {name}(TKX_POINTERS, "
            + ("int i) { __builtin_assume(i >= 0);  // an element index: all fit 32 bits\n" if narrow
               else "long long i) {\n")
            + f"{indent(body)}\n}}")
        return name

    def element(self, x: Any, lin: str, lines: list[str] | None, memo: dict | None,
                registers: dict[str, str], group_inlined: set[str] | None) -> str:
        """C float expression of element ``lin`` (row-major in ``x.shape``) of operand ``x``.

        With ``lines`` (a statement context), inlined values at the same point are emitted as
        statements; otherwise (an expression context) they become device-function calls.
        """
        if not isinstance(x, TensorSpec):
            return cops.literal(x)
        root = self.ops[x.buffer].out if x.buffer in self.ops else self.p.inputs[self.inputs[x.buffer]].value
        same_point = x.numel == root.numel and x.offset == root.offset and (
            (x.is_dense and root.is_dense) or x.strides == root.strides)
        row = self._row
        if x.buffer in registers:
            if not same_point:
                if row is not None and row.broadcast(x, root):
                    return registers[x.buffer]  # a row value, broadcast over the row
                raise TkxError(f"codegen: {x.buffer} is a register but is read through a view")
            return registers[x.buffer]
        # the index into the root's storage: an op's value is stored row-major, so the same point is ``lin``;
        # a program input keeps the caller's layout (a transposed parameter has strides (1, rows)), so
        # even the input itself is read through its strides
        idx = lin if same_point and root.is_dense else _mixed_index(lin, x.shape, x.strides, x.offset)
        if x.buffer in self.s.inlined or (row is not None and x.buffer in row.lazy and same_point):
            if lines is not None and same_point:
                return self.value_statements(self.ops[x.buffer], lin, lines, memo, registers, group_inlined)
            if lines is not None and row is not None and row.broadcast(x, root):
                # a row-level value read broadcast: computed once at the row (tkx_e), from registers
                return self.value_statements(self.ops[x.buffer], "tkx_e", lines, memo, registers, group_inlined)
            return f"{self.function(x.buffer)}(TKX_ARGS, {idx})"
        ptr, dtype = self.pointer(x.buffer)
        if row is not None and lines is not None and row.cached and "tkx_lin" in idx:
            return row.cache(ptr, idx, dtype, load(dtype, ptr, idx), lines)
        return load(dtype, ptr, idx)

    def value_statements(self, op: Op, lin: str, lines: list[str], memo: dict | None,
                         registers: dict[str, str], group_inlined: set[str] | None) -> str:
        """Emit statements computing pointwise/generator ``op`` at ``lin``; return its variable."""
        key = (op.id, lin)
        if memo is not None and key in memo:
            return memo[key]
        ctype = cops.c_type(op.out.dtype)
        var = f"v_{op.id}"
        if memo is not None:
            n = sum(1 for k in memo if k[0] == op.id)
            var = f"v_{op.id}" if n == 0 else f"v_{op.id}_{n}"
        integer = op.out.dtype in INT_DTYPES
        if op.kind == "fill":
            v = op.attr("value")
            text = (cops.int_literal(v) if integer else
                    cops.literal(cops.round_scalar(float(v), op.out.dtype) if op.out.dtype in FLOAT_DTYPES
                                 else (1.0 if v else 0.0)))
        elif op.kind == "iota":
            dim = op.attr("dim", 0)
            coord = _unravel(lin, op.out.shape)[dim] if op.out.shape else "0"
            if integer:
                text = f"({cops.int_literal(op.attr('start', 0))} + {cops.int_literal(op.attr('step', 1))} * " \
                       f"(long long){coord})"
            else:
                text = round_to(op.out.dtype, f"({cops.literal(op.attr('start', 0))} + "
                                              f"{cops.literal(op.attr('step', 1))} * (float){coord})")
        elif op.kind in SPECIAL_POINTWISE:
            text = SPECIAL_POINTWISE[op.kind](self, op, lin, lines, memo, registers, group_inlined, var)
        elif (shift := self.power_of_two_divisor(op)) is not None:
            a = self.element(op.inputs[0], lin, lines, memo, registers, group_inlined) \
                if isinstance(op.inputs[0], TensorSpec) else cops.int_literal(op.inputs[0])
            if isinstance(shift, int):
                s_text = str(shift)
            elif (table := intfacts.shift_table(op.inputs[1], self.ops, self._index_only)) is not None:
                b = op.inputs[1]  # an index-only divisor (16**j): its shifts from a constant, by its index
                r = _mixed_index(lin, b.shape, b.strides, b.offset)
                s_text = f"(int)((0x{table:x}ULL >> ({intfacts.TABLE_BITS} * {r})) & 63ULL)"
            else:
                b = self.element(op.inputs[1], lin, lines, memo, registers, group_inlined)
                s_text = f"(__ffsll((long long)({b})) - 1)"
            a = f"(long long)({a})"
            if op.kind == "floor_divide":  # arithmetic shift: floor(a / 2**s) for any sign of a
                text = round_to(op.out.dtype, f"({a} >> {s_text})")
            else:  # floor-mod by 2**s > 0: the low s bits (two's complement), the divisor's sign
                text = round_to(op.out.dtype, f"({a} & ((1LL << {s_text}) - 1LL))")
        else:
            args = [self.element(x, lin, lines, memo, registers, group_inlined) if isinstance(x, TensorSpec)
                    else x for x in op.inputs]  # scalars are formatted in the op's compute type
            exact_cast = (self.cheap and op.kind == "cast" and op.inputs
                          and intfacts.exact_in_half(op.inputs[0], self.ops, self._ranges))
            text = cops.value(op, args, exact=self.exact or self.rounds_once(op), exact_cast=bool(exact_cast),
                              cheap=self.cheap)
        if memo is not None:
            memo[key] = var
        if text is not None:
            lines.append(f"const {ctype} {var} = {text};  // {op.id}: {op.kind}")
        return var

    def power_of_two_divisor(self, op: Op) -> int | str | None:
        """For an integer ``floor_divide``/``remainder`` whose divisor only takes positive powers of two
        (:func:`tkx.codegen.intfacts.power_of_two_shifts`): the shift (an ``int`` when it is one value,
        ``"tensor"`` when it varies per element); else ``None`` (also with ``cheap_int_math`` off)."""
        if not self.cheap or op.kind not in ("floor_divide", "remainder") or len(op.inputs) != 2:
            return None
        if optable.compute_type(op) != "int":
            return None
        a, b = op.inputs
        if isinstance(a, TensorSpec) and a.dtype not in INT_DTYPES:
            return None
        if isinstance(b, TensorSpec) and b.dtype not in INT_DTYPES:
            return None
        if not isinstance(a, TensorSpec) and not (isinstance(a, int) and not isinstance(a, bool)):
            return None
        shifts = intfacts.power_of_two_shifts(b, self.ops, self._index_only)
        if not shifts:
            return None
        return next(iter(shifts)) if len(shifts) == 1 else "tensor"

    # -- index ops: operands read at computed coordinates -------------------------------------
    def op_number(self, op: Op) -> int:
        """The position of ``op`` in the program: what the kernel writes into status[1] on an index error."""
        return next(i for i, o in enumerate(self.p.ops) if o.id == op.id)

    def at(self, x: TensorSpec, coords: list[str]) -> str:
        """Expression: element ``coords`` (in ``x.shape``) of operand ``x``, evaluated lazily
        (a load or a device-function call, never statements: it may sit in one branch)."""
        lin = _linear(coords, x.shape)
        return self.element(x, lin, None, None, {}, None)

    def index_code(self, op: Op, lin: str, lines: list[str], var: str) -> str | None:
        """Statements of ``gather``/``cat``/``slice_scatter`` at ``lin``; defines ``var``; returns None."""
        ctype = cops.c_type(op.out.dtype)
        coords = _unravel(lin, op.out.shape) if op.out.shape else []
        dim = op.attr("dim", 0)
        tag = f"  // {op.id}: {op.kind}"
        if op.kind == "gather":
            src, index = op.inputs
            n = src.shape[dim]
            j = f"{var}_j"
            lines.append(f"long long {j} = {self.element(index, lin, lines, {}, {}, None)};{tag}")
            if op.attr("wrap", False):
                lines.append(f"if ({j} < 0) {j} += {n};  // negative indices count from the end")
            lines.append(f"{j} = tkx_check_index(status, {j}, {n}, {self.op_number(op)});  // 0 <= index < {n}")
            cs = list(coords)
            cs[dim] = j
            lines.append(f"const {ctype} {var} = {self.at(src, cs)};{tag}")
            return None
        if op.kind == "cat":
            cd = coords[dim]
            lines.append(f"{ctype} {var};{tag}")
            offset = 0
            parts = [x for x in op.inputs if isinstance(x, TensorSpec)]
            for k, x in enumerate(parts):
                size = x.shape[dim]
                cs = list(coords)
                cs[dim] = f"({cd} - {offset})" if offset else cd
                head = "if" if k == 0 else "else if"
                cond = f"{head} ({cd} < {offset + size}) " if k < len(parts) - 1 else ("else " if k else "")
                lines.append(f"{cond}{var} = {self.at(x, cs)};")
                offset += size
            return None
        if op.kind == "slice_scatter":
            base, src = op.inputs
            start, end, step = op.attr("start"), op.attr("end"), op.attr("step")
            cd = coords[dim]
            rel = f"({cd} - {start})" if start else cd
            inside = f"{cd} >= {start} && {cd} < {end}" + (f" && {rel} % {step} == 0" if step != 1 else "")
            cs = list(coords)
            cs[dim] = f"({rel} / {step})" if step != 1 else rel
            lines.append(f"const {ctype} {var} = ({inside}) ? {self.at(src, cs)} : {self.at(base, coords)};{tag}")
            return None
        if op.kind == "scatter":  # the value at an output point: the base, or the last value written there
            base, index, values = op.inputs
            assert isinstance(index, TensorSpec) and isinstance(values, TensorSpec)
            cd = coords[dim]
            count = values.shape[dim]
            lines.append(f"{ctype} {var} = {self.at(base, coords)};{tag} (every value naming this point, last wins)")
            e = list(coords)
            e[dim] = "tkx_jj" if count > 1 else "0"
            test = f"if ((long long)({self.at(index, e)}) == (long long){cd}) {var} = {self.at(values, e)};"
            lines.append(f"for (long long tkx_jj = 0; tkx_jj < {count}; ++tkx_jj) {test}" if count > 1 else test)
            return None
        raise TkxError(f"codegen: no emitter for index op {op.kind} ({op.id})")

    def index_check_code(self, op: Op, lin: str, lines: list[str], memo: dict | None, registers: dict[str, str],
                         group_inlined: set[str] | None, var: str) -> str | None:
        """``index_check`` is a pointwise op: its operand is read at the point (a register when it is one)."""
        x = self.element(op.inputs[0], lin, lines, memo, registers, group_inlined)
        lo, hi, ignore = op.attr("lo"), op.attr("hi"), op.attr("ignore")
        bad = f"{var} < {lo}LL || {var} >= {hi}LL"
        if ignore is not None:
            bad = f"({bad}) && {var} != {ignore}LL"
        lines.append(f"const long long {var} = {x};  // {op.id}: index_check")
        lines.append(f"if ({bad}) tkx_fail(status, TKX_ERR_INDEX, {self.op_number(op)});  "
                     f"// {op.attr('what', 'an index')} must be in [{lo}, {hi})")
        return None


#: Pointwise and index kinds the kernel generator emits as statements (no C expression in the table).
SPECIAL_POINTWISE = {
    "gather": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "cat": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "slice_scatter": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "scatter": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "index_check": lambda em, op, lin, lines, memo, regs, inl, var: em.index_check_code(op, lin, lines, memo, regs,
                                                                                        inl, var),
}
