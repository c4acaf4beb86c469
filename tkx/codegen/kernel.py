"""From a fused schedule and an arena plan to the CUDA source of one persistent kernel.

``generate(schedule, arena) -> CudaSource``. The kernel has one section per stage; the
groups of a stage share one grid-stride loop over their work items (so the whole grid
works on every stage), and consecutive stages are separated by a barrier
(``__syncthreads`` in one-block mode, the spin-limited grid barrier otherwise).

How a group reads a value (the same rules as the schedule interpreter):

* a *domain* op of the group read at the point being computed -> the register holding it;
* an *inlined* op read at the same point -> a statement computing it there (memoised);
* an inlined op read elsewhere (through a transposed/broadcast view, or inside a GEMM
  operand or a reduction's input) -> a call of its ``__device__`` function
  ``tkx_v_<op>(a, index)``, which recomputes it from memory at that linear index;
* anything else -> a load from its home (user input, output tensor or arena slot).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .. import ops as optable
from ..arena import ArenaPlan
from ..dtypes import DTYPE_BYTES, FLOAT_DTYPES, INT_DTYPES
from ..errors import TkxError
from ..ir import Op, TensorSpec, contiguous_strides
from ..schedule.model import FusedSchedule, Group, Home
from ..target import EPILOGUE_BATCH, GPU, register_budget, register_note
from . import abi, intfacts
from . import epilogue_vector as ev
from . import ops as cops
from .cuda_prelude import (
    C_TYPES,
    barrier,
    barrier_setup,
    grid_barrier_kind,
    load,
    prelude,
    round_to,
    shared_workspace,
    store,
)
from .gemm import GemmProblem, SplitFinal, WgmmaKnobs, _batched_epilogue, emit_gemm, tensormap_prefetch
from .gemv import gemv_stream
from .reduce import emit_reduction, final_reduce, partial_reduce
from .text import block, indent

__all__ = ["generate", "KernelPlan"]


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


class _Emitter:
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
        idx = lin if same_point else _mixed_index(lin, x.shape, x.strides, x.offset)
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
            text = cops.value(op, args, exact=self.exact, exact_cast=bool(exact_cast), cheap=self.cheap)
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

    # -- the domain point of a group ----------------------------------------------------------
    def point(self, g: Group, lin: str, first: dict[str, str], start: int) -> str:
        """Statements computing domain ops ``g.ops[start:]`` at ``lin`` and the stores."""
        lines: list[str] = []
        memo: dict = {}
        registers = dict(first)
        inl = set(g.inlined)
        masked = self.masked_in_place(g, start)
        for op_id in g.ops[start:]:
            op = self.ops[op_id]
            if op_id in masked:  # where(m, v, old) into old's own bytes: store v where m holds, read nothing else
                cond = self.element(op.inputs[0], lin, lines, memo, registers, inl)
                inner: list[str] = []
                value = self.element(op.inputs[1], lin, inner, dict(memo), registers, inl)
                ptr, dtype = self.home_pointer(self.s.homes[op_id], op_id)
                inner.append(store(dtype, ptr, lin, value) + f"  // store {op_id} -> {self.s.homes[op_id]}")
                lines += [f"if ((float)({cond}) != 0.0f) {{  // {op_id}: a masked write in place "
                          "(elsewhere the bytes already hold the old value)", indent(block(inner)), "}"]
                continue
            var = self.value_statements(op, lin, lines, memo, registers, inl)
            registers[op_id] = var
        for s in g.stores:
            if s in masked or s in self.s.scratch:  # a last-slice split-K group's slices: stored by the GEMM
                continue
            ptr, dtype = self.home_pointer(self.s.homes[s], s)
            lines.append(store(dtype, ptr, lin, registers[s]) + f"  // store {s} -> {self.s.homes[s]}")
        return block(lines)

    def slice_write(self, g: Group, op: Op, lin: str) -> str:
        """A ``scatter`` written in place (:attr:`tkx.target.PointwisePlan.slice_write`): point ``lin`` of the
        values stores ``values[e]`` at ``e[dim] = index[e]`` of the input, after the bounds check (an index
        out of range sets the kernel's index error and writes nothing) and, when several values may name one
        position, only if no later value along ``dim`` names it (the last write wins)."""
        base, index, values = op.inputs
        assert isinstance(base, TensorSpec) and isinstance(index, TensorSpec) and isinstance(values, TensorSpec)
        dim = op.attr("dim")
        n, count = base.shape[dim], values.shape[dim]
        lines: list[str] = []
        memo: dict = {}
        inl = set(g.inlined)
        coords = _unravel(lin, values.shape)
        lines.append(f"const long long tkx_j = {self.element(index, lin, lines, memo, {}, inl)};  "
                     f"// {op.id}: scatter, the position along dim {dim}")
        target = list(coords)
        target[dim] = "tkx_j"
        ok = "tkx_last"
        lines.append("bool tkx_last = true;")
        if count > 1:  # a later value naming the same position wins
            later = list(coords)
            later[dim] = "tkx_jj"
            lines += [f"for (long long tkx_jj = {coords[dim]} + 1; tkx_jj < {count}; ++tkx_jj) {{",
                      f"    if ((long long)({self.at(index, later)}) == tkx_j) {{ tkx_last = false; break; }}", "}"]
        inner: list[str] = []
        value = self.element(values, lin, inner, memo, {}, inl)
        ptr, dtype = self.home_pointer(self.s.homes[op.id], op.id)
        inner.append(store(dtype, ptr, _linear(target, base.shape), value)
                     + f"  // store {op.id} -> {self.s.homes[op.id]} (only the indexed slice)")
        lines += [f"if (tkx_j < 0 || tkx_j >= {n}LL) {{",
                  f"    tkx_fail(status, TKX_ERR_INDEX, {self.op_number(op)});  "
                  f"// {op.attr('what', 'scatter')}: the index must be in [0, {n})",
                  f"}} else if ({ok}) {{", indent(block(inner)), "}"]
        return block(lines)

    def masked_in_place(self, g: Group, start: int) -> set[str]:
        """The group's ops ``where(mask, value, old)`` stored in place over ``old``, an input read at the same
        point, that no later op of the group reads (a cache append: a few positions of a big state tensor
        change). Their stores happen only where ``mask`` holds and ``old`` is never loaded."""
        if g.kind != "pointwise":
            return set()
        out = set()
        later_reads: set[str] = set()
        for op_id in reversed(g.ops[start:]):
            op = self.ops[op_id]
            home = self.s.homes.get(op_id)
            old = op.inputs[2] if op.kind == "where" else None
            root = self.p.inputs[home.index].value if home is not None and home.kind == "input" else None
            if (root is not None and isinstance(old, TensorSpec) and op_id in g.stores and op_id not in later_reads
                    and self.inputs.get(old.buffer) == home.index and old.shape == op.out.shape
                    and old.offset == root.offset and old.strides == root.strides and root.is_dense
                    and old.dtype == op.out.dtype):
                out.add(op_id)
            later_reads |= {x.buffer for x in op.inputs if isinstance(x, TensorSpec)}
        return out

    # -- groups -------------------------------------------------------------------------------------
    def group_code(self, g: Group) -> tuple[str, int, int]:
        """(C code for work item ``item``, number of work items, shared bytes)."""
        if g.kind == "copy":
            return self.copy_code(g)
        if g.kind == "pointwise":
            op = self.ops[g.anchor]
            plan = g.plan
            n = int(plan.get("numel", op.out.numel)) if plan.get("slice_write") else op.out.numel
            t = self.threads
            per = int(plan.get("per_thread", 1) or 1)
            inner = self.slice_write(g, op, "i") if plan.get("slice_write") else self.point(g, "i", {}, 0)
            if per == 1:
                body = block(f"const long long i = (long long)item * {t} + threadIdx.x;",
                             f"if (i < {n}LL) {{", indent(inner), "}")
            else:
                body = block(f"for (int tkx_p = 0; tkx_p < {per}; ++tkx_p) {{  // {per} points per thread, "
                             f"{t} apart (coalesced)",
                             indent(block(f"const long long i = ((long long)item * {per} + tkx_p) * {t} + threadIdx.x;",
                                          f"if (i < {n}LL) {{", indent(inner), "}")),
                             "}")
            return "{\n" + indent(body) + "\n}", max(1, -(-n // (t * per))), 0
        if g.kind in ("gemm", "gemm_partial"):
            return self.gemm_code(g)
        if g.kind in ("attention", "attention_partial"):
            return self.attention_code(g)
        if g.params.get("strategy") == "row":
            return self.row_code(g)
        return self.reduction_code(g)

    def row_code(self, g: Group) -> tuple[str, int, int]:
        """A row-persistent group (:mod:`tkx.schedule.rows`): one warp per row; pass ``i`` reduces the
        ``i``-th reduction's input over the row (each lane its ``K = ceil(size / 32)`` elements, the loads
        kept in registers ``tkx_rc*[K]`` after their first pass), a warp all-reduce gives every lane the
        result, the row-level ops after it are computed at the row; a last pass computes and stores the
        row-shaped (full) values. A work item is one row per warp."""
        from ..schedule.rows import member_kind
        from ..schedule.rowshape import row_key
        from .reduce import row_pass_close, row_pass_fold, row_pass_open

        anchor = self.ops[g.anchor]
        key = row_key(anchor)
        assert key is not None
        shape, dims = key
        rows, size = int(g.params["rows"]), int(g.params["size"])
        kept = [d for d in range(len(shape)) if d not in dims]
        lanes_k = -(-size // 32)
        warps = self.threads // 32
        cs = ["0"] * len(shape)
        for d, c in zip(kept, _unravel("(long long)row", tuple(shape[d] for d in kept))):
            cs[d] = c
        for d, c in zip(dims, _unravel("r", tuple(shape[d] for d in dims))):
            cs[d] = c
        lin = _linear(cs, shape)
        kinds = {m: member_kind(self.ops[m], shape, rows) for m in g.ops}
        ctx = _RowContext(shape, dims, lazy={m for m, k in kinds.items() if k == "full"}, lanes=lanes_k)
        inl = set(g.inlined)
        registers: dict[str, str] = {}
        row_memo: dict = {}
        out: list[str] = []

        def element_loop(inner: list[str]) -> str:
            return block("#pragma unroll",
                         f"for (int k = 0; k < {lanes_k}; ++k) {{  // this lane's elements of the row",
                         indent(block("const int r = lane + 32 * k;",
                                      f"if (r < {size}) {{",
                                      indent(block(f"const long long tkx_lin = {lin};", inner)),
                                      "}")),
                         "}")

        self._row = ctx
        try:
            for m in g.ops:
                op = self.ops[m]
                if kinds[m] == "reduction":
                    acc = f"acc_{m}"
                    inner: list[str] = []
                    memo: dict = {}
                    x = self.element(op.inputs[0], "tkx_lin", inner, memo, registers, inl)
                    inner.append(row_pass_fold(op.kind, acc, x))
                    close, result = row_pass_close(op.kind, acc, size)
                    out += [f"// pass over the row: {m} = {op.kind}", row_pass_open(op.kind, acc),
                            element_loop(inner), close,
                            f"const float v_{m} = {round_to(op.out.dtype, result)};  // {m}: {op.kind}"]
                    registers[m] = f"v_{m}"
                elif kinds[m] == "row":
                    registers[m] = self.value_statements(op, "tkx_e", out, row_memo, registers, inl)
                if kinds[m] != "full" and m in g.stores:
                    ptr, dtype = self.home_pointer(self.s.homes[m], m)
                    out.append(f"if (lane == 0) {store(dtype, ptr, 'tkx_e', registers[m])}  "
                               f"// store {m} -> {self.s.homes[m]}")
            tail = [m for m in g.ops if kinds[m] == "full" and m in g.stores]
            if tail:
                inner = []
                memo = {}
                for m in tail:
                    var = self.value_statements(self.ops[m], "tkx_lin", inner, memo, registers, inl)
                    ptr, dtype = self.home_pointer(self.s.homes[m], m)
                    inner.append(store(dtype, ptr, "tkx_lin", var) + f"  // store {m} -> {self.s.homes[m]}")
                out += ["// last pass: the row's own values", element_loop(inner)]
        finally:
            self._row = None
        body = block("const int lane = threadIdx.x % 32;",
                     f"const int row = item * {warps} + threadIdx.x / 32;",
                     f"if (row < {rows}) {{  // the whole warp takes the same branch",
                     indent(block("const long long tkx_e = row;", *ctx.declarations(), *out)),
                     "}")
        reds = [m for m in g.ops if kinds[m] == "reduction"]
        code = "{\n" + indent(block(f"// {g.id}: row-persistent, {len(reds)} reductions "
                                     f"({', '.join(reds)}) over {rows} rows of {size}: one warp per row", body)) \
            + "\n}"
        self.plan.notes[g.id] = {"strategy": "row", "passes": len(reds), "values_per_lane": lanes_k,
                                 "cached_loads": len(ctx.slots)}
        return code, max(1, -(-rows // warps)), 0

    def attention_code(self, g: Group) -> tuple[str, int, int]:
        """A fused attention group (:mod:`tkx.codegen.attention`): operands read through their views."""
        from . import attention as fa

        op = self.ops[g.anchor]
        plan = g.plan

        def loader(view: Any) -> Any:
            assert isinstance(view, TensorSpec)
            lead = view.shape[:-2] if view.ndim >= 2 else ()

            def at(idx: str) -> str:
                if view.buffer in self.s.inlined:
                    return f"{self.function(view.buffer)}(TKX_ARGS, {idx})"
                ptr, dtype = self.pointer(view.buffer)
                return load(dtype, ptr, idx)

            def ld(b: str, r: str, c: str | None = None) -> str:
                cs = _unravel(f"(long long){b}", lead) + [r] + ([c] if c is not None else [])
                return at(_coords_index(cs, view.strides, view.offset))
            return ld

        def lse_loader(view: Any) -> Any:
            assert isinstance(view, TensorSpec)
            lead = view.shape[:-1]

            def ld(b: str, r: str) -> str:
                idx = _coords_index(_unravel(f"(long long){b}", lead) + [r], view.strides, view.offset)
                if view.buffer in self.s.inlined:
                    return f"{self.function(view.buffer)}(TKX_ARGS, {idx})"
                ptr, dtype = self.pointer(view.buffer)
                return load(dtype, ptr, idx)
            return ld

        q, k, v = (loader(x) for x in op.inputs[:3])
        if plan.impl == "flash_decode":
            return self.decode_attention_code(g, op, q, k, v, loader)
        ptr, _ = self.home_pointer(self.s.homes[op.id], op.id)
        if op.kind == "attention":
            mask = loader(op.inputs[3]) if plan.mask != "none" else None
            code = fa.forward(plan, threads=self.threads, ld_q=q, ld_k=k, ld_v=v, ld_mask=mask, out=ptr, name=g.id)
        else:
            mask = loader(op.inputs[6]) if plan.mask != "none" else None
            code = fa.backward(plan, threads=self.threads, ld_q=q, ld_k=k, ld_v=v, ld_mask=mask,
                               ld_out=loader(op.inputs[3]), ld_lse=lse_loader(op.inputs[4]),
                               ld_dout=loader(op.inputs[5]), grads=ptr, name=g.id)
        self.plan.notes[g.id] = {"variant": plan.impl, "tile_q": plan.tile_q, "tile_k": plan.tile_k}
        return code.code, code.work_items, code.shared_bytes

    def decode_attention_code(self, g: Group, op: Op, q: Any, k: Any, v: Any, loader: Any) -> tuple[str, int, int]:
        """Flash-decoding (:func:`tkx.codegen.attention.decode_partial` / ``decode_combine``): the
        ``attention_partial`` group reads the cache in 16-byte vectors where the view allows it."""
        from . import attention as fa

        plan = g.plan
        scratch, _ = self.pointer(plan.partials)
        if g.kind == "attention":
            out, _ = self.home_pointer(self.s.homes[op.id], op.id)
            code = fa.decode_combine(plan, threads=self.threads, partials=scratch, out=out, name=g.id)
            self.plan.notes[g.id] = {"variant": "flash_decode combine", "k_tiles": plan.k_tiles}
            return code.code, code.work_items, code.shared_bytes

        def vec(view: TensorSpec) -> tuple[Any, str]:
            """(pointer function, run-time alignment test) of a bf16 view whose rows are 8-element aligned."""
            lead = view.shape[:-2]
            if (view.buffer in self.s.inlined or view.dtype != "bfloat16" or view.strides[-1] != 1
                    or view.shape[-1] % fa.VEC or view.offset % fa.VEC
                    or any(st % fa.VEC for st in view.strides[:-1])):
                return None, "false"
            ptr, _ = self.pointer(view.buffer)
            base = f"reinterpret_cast<const unsigned short*>({ptr})"

            def at(b: str, r: str, c: str) -> str:
                cs = _unravel(f"(long long){b}", lead) + [r, c]
                return f"({base} + {_coords_index(cs, view.strides, view.offset)})"
            return at, f"((((unsigned long long){ptr}) & 15ULL) == 0)"

        (vk, ak), (vv, av) = vec(op.inputs[1]), vec(op.inputs[2])
        mask = loader(op.inputs[3]) if plan.mask != "none" else None
        code = fa.decode_partial(plan, threads=self.threads, ld_q=q, ld_k=k, ld_v=v, ld_mask=mask, vec_k=vk,
                                 vec_v=vv, aligned_k=ak, aligned_v=av, partials=scratch, name=g.id)
        lay = fa.decode_layout(plan, self.threads)
        self.plan.notes[g.id] = {"variant": "flash_decode partial", "tile_k": plan.tile_k, "k_tiles": plan.k_tiles,
                                 "lanes_per_key": lay.lanes, "rows_in_flight": lay.chunk,
                                 "vector_loads": vk is not None and vv is not None}
        return code.code, code.work_items, code.shared_bytes

    def copy_code(self, g: Group) -> tuple[str, int, int]:
        task = next(c for c in self.s.copies if c.group == g.id)
        n, t = task.src.numel, self.threads
        ptr, dtype = self.home_pointer(task.dst_home, task.src.buffer)
        src = self.element(task.src, "i", None, None, {}, None)
        dst = (self.p.inputs[task.dst_home.index].value if task.dst_home.kind == "input"
               else self.p.outputs[task.dst_home.index].value)
        dst_idx = _mixed_index("i", dst.shape, dst.strides, dst.offset) if task.dst_home.kind == "input" else "i"
        body = block(f"const long long i = (long long)item * {t} + threadIdx.x;",
                     f"if (i < {n}LL) {store(dtype, ptr, dst_idx, src)}  // copy {task.src.buffer} -> {task.dst_home}")
        return "{\n" + indent(body) + "\n}", max(1, -(-n // t)), 0

    def gemm_code(self, g: Group) -> tuple[str, int, int]:
        op = self.ops[g.anchor]
        a, b = (op.inputs[1], op.inputs[2]) if op.kind == "addmm" else (op.inputs[0], op.inputs[1])
        assert isinstance(a, TensorSpec) and isinstance(b, TensorSpec)
        prob = GemmProblem.from_views(a, b)
        m, n = prob.m, prob.n
        params = g.params
        variant = params["impl"]
        batched = op.kind == "bmm"

        def coords(bat: str, r: str, c: str, view: TensorSpec) -> str:
            cs = ([bat] if batched else []) + [r, c]
            return _coords_index(cs, view.strides, view.offset)

        def operand(view: TensorSpec) -> Any:
            def load_elem(bat: str, r: str, c: str) -> str:
                idx = coords(bat, r, c, view)
                if view.buffer in self.s.inlined:
                    return f"{self.function(view.buffer)}(TKX_ARGS, {idx})"
                ptr, dtype = self.pointer(view.buffer)
                return load(dtype, ptr, idx)
            return load_elem

        def pointer_to(view: TensorSpec, fast_dim: int) -> Any:
            """(batch, r, c) -> C pointer to the element, when ``view`` is a stored buffer of the
            problem's 2-byte dtype, contiguous along ``fast_dim`` (0: rows, 1: columns) and every
            other stride and the offset a multiple of 8 elements (so 16-byte vectors stay aligned)."""
            if view.buffer in self.s.inlined or view.dtype != prob.dtype or prob.dtype not in ("bfloat16", "float16"):
                return None
            strides = view.strides[-2:]
            other = [st for d, st in enumerate(view.strides) if d != view.ndim - 2 + fast_dim]
            if strides[fast_dim] != 1 or any(st % 8 for st in other) or view.offset % 8:
                return None
            ptr, _ = self.pointer(view.buffer)

            def at(bat: str, r: str, c: str) -> str:
                return f"({ptr} + {coords(bat, r, c, view)})"
            return at

        def tma_map(view: TensorSpec, fast_dim: int) -> Any:
            """(box inner, box outer) -> index of a tensor map of ``view`` (registered once per box),
            when ``Options.gemm_copy`` is ``"tma"`` or ``"auto"`` and the view is a stored 2-D buffer of the 2-byte
            problem dtype, contiguous along ``fast_dim`` (0: rows, 1: columns), its other stride and
            its offset multiples of 16 bytes; else ``None``."""
            if getattr(self.s.options, "gemm_copy", "auto") not in ("tma", "auto") or batched or view.ndim != 2:
                return None
            if pointer_to(view, fast_dim) is None or view.buffer in self.s.scratch:
                return None
            esize = 2
            outer = 1 - fast_dim
            if view.strides[fast_dim] != 1 or (view.strides[outer] * esize) % 16 or (view.offset * esize) % 16:
                return None
            buf = view.buffer
            if buf in self.inputs:
                role, index, base = "input", self.inputs[buf], 0
            else:
                home = self.s.homes.get(buf)
                if home is None:
                    return None
                if home.kind == "arena":
                    role, index, base = "arena", -1, self.arena.offset(buf)
                else:
                    role, index, base = home.kind, home.index, 0

            def register(box_inner: int, box_outer: int) -> int:
                spec = abi.TensorMapSpec(role, index, base + view.offset * esize, view.dtype,
                                         (view.shape[fast_dim], view.shape[outer]), view.strides[outer] * esize,
                                         (box_inner, box_outer))
                maps = self.plan.tensor_maps
                if spec not in maps:
                    maps.append(spec)
                return maps.index(spec)
            return register

        def epilogue(bat: str, row: str, col: str, acc: str) -> str:
            lin = f"(((long long){bat} * {m} + {row}) * {n} + {col})" if batched else \
                f"((long long){row} * {n} + {col})"
            lines = [f"const long long tkx_e = {lin};"]
            value = acc
            if op.kind == "addmm":
                alpha, beta = op.attr("alpha", 1), op.attr("beta", 1)
                bias = self.element(op.inputs[0], "tkx_e", None, None, {}, set(g.inlined))
                value = f"{cops.literal(alpha)} * {acc} + {cops.literal(beta)} * {bias}" if (alpha, beta) != (1, 1) \
                    else f"{acc} + {bias}"
            lines.append(f"const float v_{op.id} = {round_to(op.out.dtype, value)};  // {op.id}: {op.kind}")
            lines.append(self.point(g, "tkx_e", {op.id: f"v_{op.id}"}, 1))
            return block(lines)

        split = int(params.get("split_k", 1))
        split_final = None
        if split > 1 and g.kind == "gemm" and params.get("split_final") == "last-slice":
            # split-K in one group: each item writes its slice, the last of a tile adds them (gemm.SplitFinal)
            scratch, _ = self.pointer(params["partials"])
            total = prob.batch * m * n
            first = self.plan.tile_counters.setdefault(g.id, self.plan.tile_counter_words)
            if first == self.plan.tile_counter_words:
                self.plan.tile_counter_words += params.tiles

            def slice_store(bat: str, row: str, col: str, acc: str) -> str:
                lin = f"(((long long){bat} * {m} + {row}) * {n} + {col})"
                return f"{scratch}[(long long)ks_split * {total}LL + {lin}] = {acc};  // {op.id}: split-K slice"
            split_final = SplitFinal(scratch, f"(tkx_tiles + {first})", epilogue)
            final = slice_store
        elif split > 1 and g.kind == "gemm":
            # split-K, phase 2: add the slices in order (a fixed order: the same bits every run), then
            # the epilogue, one output element per thread
            scratch, _ = self.pointer(params["partials"])
            total, t = prob.batch * m * n, self.threads
            ub = EPILOGUE_BATCH
            acc = ev.vector_accesses(epilogue("bat", "row", "col", "acc")) if self.s.options.epilogue_vector \
                else None
            batched = _batched_epilogue(epilogue, ub, batch_index=True) if total % (t * ub) == 0 else None
            if batched is not None:
                # EPILOGUE_BATCH elements per thread: every slice load and epilogue load in flight
                # before the first store (one element per thread waited a memory latency per item)
                comp, stores = batched
                lines = [f"const long long e = (long long)item * {t * ub} + threadIdx.x;"]
                for u in range(ub):
                    x = f"tkxE{u}_"
                    lines += [f"const long long {x}e = e + {u * t};",
                              f"const int {x}bat = (int)({x}e / {m * n}), {x}row = (int)(({x}e / {n}) % {m}), "
                              f"{x}col = (int)({x}e % {n});",
                              f"float {x}acc = 0.0f;",
                              "#pragma unroll",
                              f"for (int s = 0; s < {split}; ++s) {x}acc += {scratch}[s * {total}LL + {x}e];"
                              "  // slice order"]
                body = block(*lines, *comp, *stores)
                notes = {"variant": f"{variant} split-K final", "split_k": split, "elements_per_thread": ub}
                if acc is not None and n % acc.width == 0 and ub % acc.width == 0:
                    # the same items, each thread's elements in runs of V columns: float4 slice reads,
                    # 16-byte point reads and stores (tkx.codegen.epilogue_vector), when the pointers are aligned
                    vec = ev.split_final_pass(acc, comp, stores, runs=ub // acc.width, threads=t, split=split,
                                              scratch=scratch, total=total, m=m, n=n)
                    body = block(f"if ({ev.aligned_test(acc, (scratch,))}) {{  // 16-byte aligned pointers "
                                 "(block-uniform): vector epilogue, else the scalar one",
                                 indent(block(*vec)), "} else {", indent(body), "}")
                    notes.update(epilogue_vector=acc.width, epilogue_per_pass=ub)
                self.plan.notes[g.id] = notes
                return (f"{{  // {g.id}: add the {split} split-K slices of {op.id}, then its epilogue, "
                        f"{ub} elements per thread\n" + indent(body) + "\n}"), total // (t * ub), 0
            body = block(
                f"const long long e = (long long)item * {t} + threadIdx.x;",
                f"if (e < {total}LL) {{",
                f"    const int bat = (int)(e / {m * n}), row = (int)((e / {n}) % {m}), col = (int)(e % {n});",
                "    float acc = 0.0f;",
                "    #pragma unroll",
                f"    for (int s = 0; s < {split}; ++s) acc += {scratch}[s * {total}LL + e];  // slice order",
                indent(epilogue("bat", "row", "col", "acc")),
                "}")
            self.plan.notes[g.id] = {"variant": f"{variant} split-K final", "split_k": split}
            return (f"{{  // {g.id}: add the {split} split-K slices of {op.id}, then its epilogue\n"
                    + indent(body) + "\n}"), max(1, -(-total // t)), 0
        elif split > 1:
            # split-K, phase 1: each work item writes one tile's sum over one slice of K to scratch
            scratch, _ = self.pointer(params["partials"])
            total = prob.batch * m * n

            def partial_store(bat: str, row: str, col: str, acc: str) -> str:
                lin = f"(((long long){bat} * {m} + {row}) * {n} + {col})"
                return f"{scratch}[(long long)ks_split * {total}LL + {lin}] = {acc};  // {op.id}: split-K slice"
            final = partial_store
        else:
            final = epilogue
        if variant == "gemv_stream":
            small_m = prob.m <= prob.n
            long_view = b if small_m else a
            k_dim = long_view.ndim - (2 if small_m else 1)
            others = [st for d, st in enumerate(long_view.strides) if d != k_dim]
            long8 = None
            if (self.cheap and long_view.buffer in self.s.inlined and long_view.strides[k_dim] == 1
                    and all(st % 8 == 0 for st in others) and long_view.offset % 8 == 0):
                fn = self.function(long_view.buffer)

                def long8(bat: str, k0: str, col: str, t: str) -> str:
                    # k0 a multiple of 8, every other stride and the offset too: index(k0) + t == index(k0) | t,
                    # which shows the compiler the low 3 bits (one byte, one scale serve the 8 elements)
                    idx = coords(bat, k0, col, long_view) if small_m else coords(bat, col, k0, long_view)
                    return f"{fn}(TKX_ARGS, ({idx} | {t}))"
            code = gemv_stream(prob, operand(a), operand(b), final, threads=self.threads, blocks=self.s.blocks,
                               long8=long8, cheap=self.cheap, **self.gemv_stream_loads(a, b, prob, pointer_to))
        else:
            code = emit_gemm(variant, prob, operand(a), operand(b), final, tile_m=params["tile_m"],
                             tile_n=params["tile_n"], tile_k=params["tile_k"], threads=self.threads,
                             ptr_a=pointer_to(a, 1 if prob.a_k_contiguous else 0),
                             ptr_b=pointer_to(b, 1 if prob.b_n_contiguous else 0), split=split,
                             shared_budget=GPU.shared_per_block // max(1, int(self.s.options.blocks_per_sm)),
                             tma_a=tma_map(a, 1 if prob.a_k_contiguous else 0),
                             tma_b=tma_map(b, 1 if prob.b_n_contiguous else 0), split_final=split_final,
                             epilogue_reads=_point_reads(epilogue("bat", "row", "col", "acc"))
                             if self.s.options.epilogue_prefetch and split == 1 and not batched else (),
                             knobs=WgmmaKnobs.of(self.s.options),
                             **({"cluster": 2} if params.get("cluster") == 2 and self.s.mode != "block" else {}))
        self.plan.tensor_cores |= code.tensor_cores
        if code.cluster > 1:
            self.plan.cluster = max(self.plan.cluster, code.cluster)
            self.plan.cluster_groups.add(g.id)
        self.plan.notes[g.id] = {"variant": code.variant, **code.params}
        return code.code, code.work_items, code.shared_bytes

    def gemv_stream_loads(self, a: TensorSpec, b: TensorSpec, prob: GemmProblem, pointer_to: Any) -> dict:
        """The streaming GEMV's long-operand loads (:mod:`tkx.codegen.gemv`): a pointer for 16-byte loads of a
        stored bf16 weight, or the raw rows an inlined (dequantising) chain reads, to prefetch."""
        from .gemv import Prefetch
        from .leaves import column_spans

        small_m = prob.m <= prob.n
        view = b if small_m else a
        fast = 0 if small_m else 1  # the long operand is contiguous along K
        at = pointer_to(view, fast) if view.dtype == "bfloat16" else None
        if at is not None:
            ptr, _ = self.pointer(view.buffer)

            def ptr_long(bat: str, k: str, col: str) -> str:
                return f"reinterpret_cast<const unsigned short*>({at(bat, k, col) if small_m else at(bat, col, k)})"
            out = {"ptr_long": ptr_long, "aligned": f"((((unsigned long long){ptr}) & 15ULL) == 0)"}
            short = a if small_m else b
            at_s = pointer_to(short, 1 - fast) if short.dtype == "bfloat16" else None
            if at_s is not None:
                sptr, _ = self.pointer(short.buffer)

                def ptr_short(bat: str, k: str, row: str) -> str:
                    elem = at_s(bat, row, k) if small_m else at_s(bat, k, row)
                    return f"reinterpret_cast<const unsigned short*>({elem})"
                out.update(ptr_short=ptr_short, aligned_short=f"((((unsigned long long){sptr}) & 15ULL) == 0)")
            return out
        if prob.batch != 1:
            return {}
        out = {}
        short = a if small_m else b
        at_s = pointer_to(short, 1 - fast) if self.cheap and short.dtype == "bfloat16" else None
        if at_s is not None:  # the activations in 16-byte loads on the 8-elements-per-lane chain path
            sptr, _ = self.pointer(short.buffer)

            def ptr_short_chain(bat: str, k: str, row: str) -> str:
                elem = at_s(bat, row, k) if small_m else at_s(bat, k, row)
                return f"reinterpret_cast<const unsigned short*>({elem})"
            out.update(ptr_short=ptr_short_chain, aligned_short=f"((((unsigned long long){sptr}) & 15ULL) == 0)")
        spans = column_spans(view, self.ops, set(self.s.inlined), 0 if small_m else 1)
        fetch = []
        for sp in spans:
            ptr, dtype = self.pointer(sp.buffer)
            size = DTYPE_BYTES[dtype]
            fetch.append(Prefetch(ptr, sp.row_stride * size, sp.start * size, sp.span * size))
        out["prefetch"] = tuple(fetch)
        return out

    def reduction_code(self, g: Group) -> tuple[str, int, int]:
        op = self.ops[g.anchor]
        x = op.inputs[0]
        assert isinstance(x, TensorSpec)
        dims = tuple(op.attr("dims", ()))
        kept = [d for d in range(x.ndim) if d not in dims]
        rows = op.out.numel
        size = math.prod(x.shape[d] for d in dims) if dims else 1
        kept_shape = tuple(x.shape[d] for d in kept)
        red_shape = tuple(x.shape[d] for d in dims)

        def element(row: str, r: str) -> str:
            cs = ["0"] * x.ndim
            for d, c in zip(kept, _unravel(f"(long long){row}", kept_shape)):
                cs[d] = c
            for d, c in zip(dims, _unravel(f"(long long){r}", red_shape)):
                cs[d] = c
            idx = _coords_index(cs, x.strides, x.offset)
            if x.buffer in self.s.inlined:
                return f"{self.function(x.buffer)}(TKX_ARGS, {idx})"
            ptr, dtype = self.pointer(x.buffer)
            return load(dtype, ptr, idx)

        def finish(row: str, value: str) -> str:
            ctype = cops.c_type(op.out.dtype)  # an integer reduction stays in long long
            return block(f"const long long tkx_e = {row};",
                         f"const {ctype} v_{op.id} = {round_to(op.out.dtype, value)};  // {op.id}: {op.kind}",
                         self.point(g, "tkx_e", {op.id: f"v_{op.id}"}, 1))

        kind = op.kind
        if op.out.dtype in INT_DTYPES and g.kind == "reduction_partial" or (
                op.out.dtype in INT_DTYPES and "partials" in g.params):
            raise TkxError(f"codegen: integer reduction {op.id} was scheduled in two phases (float partials)")
        strategy = g.params.get("strategy", "warp")
        rows_contiguous = g.params.get("rows_contiguous", False)
        if g.kind == "reduction_partial":
            scratch, _ = self.pointer(g.params["partials"])
            code = partial_reduce(kind, rows, size, g.params["parts"], element, scratch=scratch,
                                  threads=self.threads, rows_contiguous=rows_contiguous)
        elif "partials" in g.params:
            scratch, _ = self.pointer(g.params["partials"])
            code = final_reduce(kind, rows, size, g.params["parts"], finish, scratch=scratch, threads=self.threads)
        else:
            code = emit_reduction(strategy, kind, rows, max(size, 1), element, finish, threads=self.threads,
                                  ctype=cops.c_type(op.out.dtype))
        self.plan.notes[g.id] = {"strategy": code.strategy, **code.params}
        return code.code, code.work_items, code.shared_bytes


_POINT_LOAD = re.compile(r"tkx_ld_(\w+)\(((?:[^(),]|\([^()]*\))+), tkx_e\)")


def _point_reads(code: str) -> tuple[tuple[str, int], ...]:
    """``(C pointer, element bytes)`` of each buffer ``code`` (a GEMM epilogue's statements) loads at the
    output element's own linear index ``tkx_e`` (the epilogue's ``load(dtype, ptr, "tkx_e")``)."""
    from .cuda_prelude import SUFFIX
    size = {suffix: _ITEMSIZE[dt] for dt, suffix in SUFFIX.items() if dt in _ITEMSIZE}
    seen: dict[str, int] = {}
    for suffix, ptr in _POINT_LOAD.findall(code):
        if suffix in size:
            seen.setdefault(ptr.strip(), size[suffix])
    return tuple(seen.items())


_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "int8": 1, "uint8": 1}


def _stage_loop(parts: list[tuple[Group, str, int]], paired: frozenset[str] | set[str] = frozenset()) -> str:
    """One grid-stride loop over the work items of every group of a stage. The groups in ``paired``
    (items in pairs of a 2-CTA cluster, each an even count) go first, so each pair's items are
    ``tkx_w`` = 2c and 2c + 1: the two CTAs of one cluster (the grid is a whole number of clusters)."""
    if paired and any(g.id in paired for g, _, _ in parts):
        parts = [x for x in parts if x[0].id in paired] + [x for x in parts if x[0].id not in paired]
    total = sum(n for _, _, n in parts)
    if len(parts) == 1:
        g, code, n = parts[0]
        return block(f"for (int item = blockIdx.x; item < {n}; item += gridDim.x) {{  // {g.id}: {n} items",
                     indent(code), "}")
    lines = [f"for (int tkx_w = blockIdx.x; tkx_w < {total}; tkx_w += gridDim.x) {{"
             f"  // {len(parts)} groups share the grid"]
    base = 0
    for j, (g, code, n) in enumerate(parts):
        cond = f"tkx_w < {base + n}"
        head = "if" if j == 0 else "} else if"
        if j == len(parts) - 1:
            lines.append("} else {" if j else f"if ({cond}) {{")
        else:
            lines.append(f"{head} ({cond}) {{")
        lines.append(indent(f"const int item = tkx_w - {base};  // {g.id}: {n} items", 1))
        lines.append(indent(code, 1))
        base += n
    lines.append("}")
    return block(lines[0], indent(block(lines[1:])), "}")




def _sync_plan(s: FusedSchedule, arena: ArenaPlan, stage_code: list) -> tuple[str, str, Any]:
    """(sync, reason, task DAG or None): the DAG (with the emitters' work item counts) is built
    when counters or a timeline need it."""
    want_dag = getattr(s.options, "sync", "barrier") != "barrier" or getattr(s.options, "timeline", False)
    if not want_dag:
        return "barrier", "sync='barrier' (the default): a barrier between stages", None
    from ..dataflow import build
    from ..dataflow.cost import choose_sync

    items = {g.id: n for _, parts in stage_code for g, _, n in parts}
    dag = build(s, arena, work_items=items)
    sync, reason = choose_sync(dag, s.options, s.mode, s.blocks)
    return sync, reason, dag


def _tile_counter_base(sync: str, dag: Any) -> int:
    """Word of ``sync`` where the last-slice split-K tile counters start: past the dataflow counters
    (``sync="counters"``), else past the status words."""
    from .cuda_prelude import COUNTER_BASE
    return COUNTER_BASE + (len(dag.counters) if sync == "counters" else 0)


def _sync_words(sync: str, dag: Any, tile_counters: int = 0) -> int:
    if tile_counters:
        return _tile_counter_base(sync, dag) + tile_counters
    from .cuda_prelude import COUNTER_BASE

    return COUNTER_BASE + len(dag.counters) if sync == "counters" else 8


def _task_code(g: Group, code: str, dag: Any, counters: bool, timeline: bool, spin: int) -> str:
    """A work item's code with its waits before and its counter bump (and timeline record) after."""
    pos = dag.order.index(g.id)
    base = sum(dag.items[x] for x in dag.order[:pos])
    pre: list[str] = []
    post: list[str] = []
    if timeline:
        pre.append("const unsigned long long tkx_ready = tkx_now();")
    if counters:
        for w in dag.waits[g.id]:
            prod = dag.counters[w.counter].group
            pre.append(f"if (!tkx_wait(sync, tkx_epoch, status, {w.counter}, {w.threshold}u, {pos}, item, "
                       f"{spin}ULL)) return;  // wait for {prod} ({w.threshold} tiles)")
        post.append(f"tkx_task_done(sync, {dag.counter_of[g.id]});  // publish this tile of {g.id}")
    if timeline:
        pre.append("const unsigned long long tkx_start = tkx_now();")
        post.append(f"tkx_record(timeline, {base} + item, tkx_ready, tkx_start);  // task {base} + item")
    return block(*pre, code, *post)


def _check_supported(s: FusedSchedule) -> None:
    """Refuse what the kernel would get wrong, with the op and the user's line."""
    from ..errors import UnsupportedError

    first_reader = {}
    for op in s.program.ops:
        for x in op.tensor_inputs:
            first_reader.setdefault(x.buffer, op)
    values = [(i.value, f"input {i.name}", first_reader.get(i.value.buffer)) for i in s.program.inputs] + \
        [(op.out, f"the result of {op.kind} ({op.id})", op) for op in s.program.ops]
    for v, what, op in values:
        where = dict(op=op.kind, node=op.fx_node, source=op.source) if op is not None else {}
        if v.numel >= 2**31 or v.extent >= 2**31:
            raise UnsupportedError("unsupported-shape",
                                   f"{what} has {max(v.numel, v.extent)} elements ({list(v.shape)}), "
                                   f"2**31 or more", **where,
                                   hint="the generated kernel indexes tensors with 32-bit counts: keep every "
                                        "tensor below 2**31 elements (split the batch into smaller steps)")
        if v.numel == 0:
            raise UnsupportedError("unsupported-shape", f"{what} is a zero-size tensor {list(v.shape)}", **where,
                                   hint="drop empty tensors from the step (the kernel would have nothing to do)")
    for op in s.program.ops:
        r = optable.row(op.kind)  # a kind without a row fails here, loudly
        if op.out.dtype in INT_DTYPES and not r.int_exact:
            raise UnsupportedError(
                "integer-arithmetic", f"{op.kind} on {op.out.dtype} values ({op.id})", op=op.kind, node=op.fx_node,
                source=op.source, hint="compute it in float32 (cast the operands first)")
        emitted = r.statements and op.kind in SPECIAL_POINTWISE
        if r.family in ("pointwise", "index") and r.c is None and not emitted:
            raise TkxError(f"codegen: the op table row of {op.kind} ({op.id}) has no C expression or emitter")


#: Pointwise and index kinds the kernel generator emits as statements (no C expression in the table).
SPECIAL_POINTWISE = {
    "gather": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "cat": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "slice_scatter": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "scatter": lambda em, op, lin, lines, memo, regs, inl, var: em.index_code(op, lin, lines, var),
    "index_check": lambda em, op, lin, lines, memo, regs, inl, var: em.index_check_code(op, lin, lines, memo, regs,
                                                                                        inl, var),
}


def max_registers(threads: int, blocks_per_sm: int = 1) -> int:
    """Registers per thread that let ``blocks_per_sm`` blocks of ``threads`` share a 64K-register SM
    (CUDA caps a thread at 255; register allocation is in units of 8), but never fewer than
    :data:`tkx.target.MIN_REGISTERS` (:func:`tkx.target.register_budget`)."""
    return register_budget(threads, blocks_per_sm)


def generate(s: FusedSchedule, arena: ArenaPlan):
    """The CUDA source of ``s`` with memory from ``arena``: a :class:`tkx.codegen.CudaSource`.

    Raises :class:`tkx.TkxError` if a group cannot be emitted (a scheduler/codegen bug).
    """
    from .source import CudaSource

    _check_supported(s)
    em = _Emitter(s, arena)
    params = abi.kernel_params(s.program, timeline=bool(getattr(s.options, "timeline", False)))
    stage_code: list[tuple[int, list[tuple[Group, str, int]]]] = []
    shared = 0
    for si, stage in enumerate(s.stages):
        parts = []
        for gid in stage:
            g = s.groups[gid]
            code, n, smem = em.group_code(g)
            shared = max(shared, smem)
            parts.append((g, code, n))
        stage_code.append((si, parts))
    if em.plan.tensor_maps:
        params.append(abi.Param("tmaps", "const unsigned char* __restrict__", "tensormaps"))
    mode = s.mode
    spin = s.options.spin_limit
    sync, sync_reason, dag = _sync_plan(s, arena, stage_code)
    timeline = bool(getattr(s.options, "timeline", False))
    pointers = [p for p in params if p.role in ("input", "output", "arena", "status")]
    body: list[str] = [
        f"if (!tkx_check_launch(status, {s.threads})) return;",
        barrier_setup(mode, s.blocks, s.options.grid_barrier) if sync == "barrier" else
        "const unsigned int tkx_epoch = tkx_counters_init(sync);  // launches completed: this launch's base",
    ]
    prefetch_maps = tensormap_prefetch(len(em.plan.tensor_maps), on=s.options.tensormap_prefetch)
    if prefetch_maps:
        body.append(prefetch_maps)
    if em.plan.tile_counter_words:
        body.append(f"unsigned int* const tkx_tiles = sync + {_tile_counter_base(sync, dag)};  // split-K tile "
                    f"arrival counters ({em.plan.tile_counter_words} words, left at 0 by every launch)")
    if shared:
        body.append(shared_workspace(shared))
    group_lines: dict[str, tuple[int, int]] = {}
    for si, parts in stage_code:
        if si > 0 and sync == "barrier":
            hz = "; ".join(s.barriers[si - 1].hazards[:2])
            body.append(f"// ---- barrier before stage {si} ({hz})")
            body.append(barrier(mode, si, spin_limit=f"{spin}ULL", blocks=s.blocks,
                                 choice=s.options.grid_barrier))
        names = ", ".join(f"{g.id} {g.kind}" for g, _, _ in parts)
        body.append(f"// ==== stage {si}: {names} ====")
        if sync == "counters" or timeline:
            parts = [(g, _task_code(g, code, dag, sync == "counters", timeline, spin), n) for g, code, n in parts]
        body.append(_stage_loop(parts, em.plan.cluster_groups))
    if sync == "counters":
        body.append("tkx_counters_exit(sync);  // the last block out advances the epoch")
    # Register budget of the requested occupancy (blocks_per_sm blocks of s.threads threads on
    # a 64K-register SM). An explicit cap also keeps ptxas from its small default budget for
    # very large kernels, which made it spill.
    max_regs = max_registers(s.threads, s.options.blocks_per_sm)
    why_regs = register_note(s.threads, s.options.blocks_per_sm)
    if why_regs:
        em.plan.notes["kernel"] = {"registers": max_regs, "why": why_regs}
    kernel = block(
        f"extern \"C\" __global__ void __maxnreg__({max_regs}) {abi.KERNEL_NAME}(",
        indent(",\n".join(p.declaration() for p in params), 2) + ") {",
        indent(block(body)),
        "}")
    header = block(
        f"// tkx megakernel for `{s.program.name}`: {len(s.groups)} groups in {len(s.stages)} stages, "
        f"{s.num_barriers} barriers ({mode} mode), {s.threads} threads per block.",
        f"// Arena: {arena.size_bytes} bytes. Generated by tkx; every address is a kernel argument.")
    struct = block("// The kernel's pointers, handed on to the device functions (inlined: no copies are made).",
                   "#define TKX_POINTERS " + ", ".join(p.declaration() for p in pointers),
                   "#define TKX_ARGS " + ", ".join(p.name for p in pointers))
    declarations = "\n".join(
        f"__device__ __forceinline__ {cops.c_type(em.ops[name[len('tkx_v_'):]].out.dtype)} {name}"
        f"(TKX_POINTERS, {'int' if em.index32() else 'long long'} i);" for name in em.plan.functions)
    functions = "\n\n".join([declarations] + [f for f in em.plan.functions.values() if f]) \
        if em.plan.functions else ""
    if sync == "barrier" and mode == "grid" and s.num_barriers:
        kind = grid_barrier_kind(s.blocks, s.options.grid_barrier)
        header = block(header, f"// Grid barrier: {kind} (cuda_prelude.GRID_BARRIER = {s.options.grid_barrier!r}, "
                               f"grid of at most {s.blocks} blocks)")
    if sync == "counters":
        header = block(header, f"// Sync: counters ({len(dag.counters)} counters, "
                               f"{sum(len(w) for w in dag.waits.values())} waits, no grid barrier): {sync_reason}")
    text = block(header, "", prelude(tensor_cores=em.plan.tensor_cores, counters=sync == "counters",
                                     timeline=timeline, tma=bool(em.plan.tensor_maps)), "", struct, "",
                 functions, "" if functions else None, kernel) + "\n"
    # Source map: the lines of each group (by its marker comment) and of each op.
    lines = text.splitlines()
    op_lines: dict[str, list[int]] = {}
    for no, line in enumerate(lines, start=1):
        if "//" in line:
            tail = line.split("//", 1)[1].strip()
            tok = tail.split(":")[0].split(" ")[0]
            if tok in em.ops:
                op_lines.setdefault(tok, []).append(no)
            if tail.startswith("store "):
                op_lines.setdefault(tail.split()[1], []).append(no)
        if line.lstrip().startswith("__device__ __forceinline__ float tkx_v_"):
            op_id = line.split("tkx_v_", 1)[1].split("(", 1)[0]
            op_lines.setdefault(op_id, []).append(no)
    starts = []
    for no, line in enumerate(lines, start=1):
        tail = line.split("//", 1)[1].strip() if "//" in line else ""
        gid = tail.split(":")[0]
        if gid in s.groups and "items" in tail:
            starts.append((no, gid))
        elif tail.startswith(("==== stage", "---- barrier")) or line.startswith("}"):
            starts.append((no, None))
    for (no, gid), (nxt, _) in zip(starts, starts[1:] + [(len(lines) + 1, None)]):
        if gid is not None:
            group_lines[gid] = (no, nxt - 1)
    # The loop skeleton of a group (tile loops, the GEMM's k-loop, a reduction's accumulation) carries no
    # op comment: its code lines belong to the group's anchor op, so lines_of("mm") is the whole GEMM.
    claimed = {no for nos in op_lines.values() for no in nos}
    for gid, (first, last) in group_lines.items():
        anchor = s.groups[gid].anchor
        if anchor not in em.ops:
            continue
        own = [no for no in range(first + 1, last + 1)
               if no not in claimed and lines[no - 1].strip().replace("else", "").strip("{} ")
               and not lines[no - 1].lstrip().startswith("//")]
        op_lines[anchor] = sorted(set(op_lines.get(anchor, [])) | set(own))
    config = abi.KernelConfig(threads=s.threads, mode=mode, blocks=1 if mode == "block" else s.blocks,
                              shared_bytes=shared, max_registers=max_regs, spin_limit=int(s.options.spin_limit),
                              exact=bool(s.options.exact), max_blocks=s.options.max_blocks,
                              backend=s.options.backend, **({"cluster": em.plan.cluster}
                                                              if em.plan.cluster > 1 else {}))
    launch = abi.LaunchContract(abi.KERNEL_NAME, tuple(params), config, arena.size_bytes,
                                tensor_maps=tuple(em.plan.tensor_maps))
    return CudaSource(text=text, launch=launch, schedule=s, arena=arena,
                      op_lines={k: tuple(v) for k, v in op_lines.items()}, group_lines=group_lines,
                      tensor_cores=em.plan.tensor_cores, notes=em.plan.notes, sync=sync, sync_reason=sync_reason,
                      sync_words=_sync_words(sync, dag, em.plan.tile_counter_words),
                      timeline_tasks=dag.num_tasks if timeline and dag else 0,
                      dag=dag)
