"""The C code of one group per kind: pointwise (one element per thread), row-persistent, copies and
reductions, and the dispatch by group kind."""

from __future__ import annotations

import math

from ..dtypes import INT_DTYPES
from ..errors import TkxError
from ..ir import Op, TensorSpec
from ..schedule.model import Group
from ..target import ReductionPlan
from . import ops as cops
from .cuda_prelude import (
    load,
    round_to,
    store,
)
from .kernel_values import ValueEmitter, _coords_index, _linear, _mixed_index, _RowContext, _unravel
from .reduce import emit_reduction, final_reduce, partial_reduce
from .text import block, indent


class GroupEmitter(ValueEmitter):
    """Pointwise, row-persistent, copy and reduction groups; :meth:`group_code` dispatches every kind
    (GEMM and attention groups to the methods of :class:`~tkx.codegen.kernel_gemm.GemmGroups` and
    :class:`~tkx.codegen.kernel_attention.AttentionGroups`)."""

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
        if isinstance(g.plan, ReductionPlan) and g.plan.strategy == "row":
            return self.row_code(g)
        return self.reduction_code(g)

    def row_code(self, g: Group) -> tuple[str, int, int]:
        """A row-persistent group (:mod:`tkx.schedule.rows`): one warp per row, or the whole block per row
        when the plan says so (``row_threads``: a few long rows); pass ``i`` reduces the ``i``-th reduction's
        input over the row (each thread its ``K = ceil(size / row_threads)`` elements, the loads kept in
        registers ``tkx_rc*[K]`` after their first pass), a warp (block) all-reduce gives every thread the
        result, the row-level ops after it are computed at the row; a last pass computes and stores the
        row-shaped (full) values. A work item is one row per warp (one row per block)."""
        from ..schedule.rows import member_kind
        from ..schedule.rowshape import row_key
        from .reduce import row_pass_close, row_pass_fold, row_pass_open

        anchor = self.ops[g.anchor]
        key = row_key(anchor)
        assert key is not None
        shape, dims = key
        plan = g.plan
        assert isinstance(plan, ReductionPlan)
        rows, size = plan.rows, plan.size
        kept = [d for d in range(len(shape)) if d not in dims]
        per_row = self.threads if plan.row_threads > 32 else 32
        lanes_k = -(-size // per_row)
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
                         indent(block(f"const int r = lane + {per_row} * k;",
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
                    close, result = row_pass_close(op.kind, acc, size, whole_block=per_row > 32)
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
        if per_row > 32:  # the block per row: a work item is a row, every thread a lane of it
            head = ["const int lane = threadIdx.x;", "const int row = item;",
                    f"if (row < {rows}) {{  // the whole block takes the same branch"]
            who, items = f"one block of {per_row} threads per row", rows
        else:
            head = ["const int lane = threadIdx.x % 32;", f"const int row = item * {warps} + threadIdx.x / 32;",
                    f"if (row < {rows}) {{  // the whole warp takes the same branch"]
            who, items = "one warp per row", max(1, -(-rows // warps))
        body = block(*head, indent(block("const long long tkx_e = row;", *ctx.declarations(), *out)), "}")
        reds = [m for m in g.ops if kinds[m] == "reduction"]
        code = "{\n" + indent(block(f"// {g.id}: row-persistent, {len(reds)} reductions "
                                     f"({', '.join(reds)}) over {rows} rows of {size}: {who}", body)) + "\n}"
        self.plan.notes[g.id] = {"strategy": "row", "passes": len(reds), "values_per_lane": lanes_k,
                                 "threads_per_row": per_row, "cached_loads": len(ctx.slots)}
        return code, items, 0

    def copy_code(self, g: Group) -> tuple[str, int, int]:
        task = self.s.copies[g.id]
        n, t = task.src.numel, self.threads
        ptr, dtype = self.home_pointer(task.dst_home, task.src.buffer)
        src = self.element(task.src, "i", None, None, {}, None)
        dst = (self.p.inputs[task.dst_home.index].value if task.dst_home.kind == "input"
               else self.p.outputs[task.dst_home.index].value)
        dst_idx = _mixed_index("i", dst.shape, dst.strides, dst.offset) if task.dst_home.kind == "input" else "i"
        body = block(f"const long long i = (long long)item * {t} + threadIdx.x;",
                     f"if (i < {n}LL) {store(dtype, ptr, dst_idx, src)}  // copy {task.src.buffer} -> {task.dst_home}")
        return "{\n" + indent(body) + "\n}", max(1, -(-n // t)), 0

    def reduction_code(self, g: Group) -> tuple[str, int, int]:
        op = self.ops[g.anchor]
        plan = g.plan
        assert isinstance(plan, ReductionPlan), f"{g.id}: a reduction group carries a ReductionPlan"
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
                op.out.dtype in INT_DTYPES and plan.partials is not None):
            raise TkxError(f"codegen: integer reduction {op.id} was scheduled in two phases (float partials)")
        strategy = plan.strategy
        rows_contiguous = plan.rows_contiguous
        if g.kind == "reduction_partial":
            scratch, _ = self.pointer(plan.partials)
            code = partial_reduce(kind, rows, size, plan.parts, element, scratch=scratch,
                                  threads=self.threads, rows_contiguous=rows_contiguous)
        elif plan.partials is not None:
            scratch, _ = self.pointer(plan.partials)
            code = final_reduce(kind, rows, size, plan.parts, finish, scratch=scratch, threads=self.threads)
        else:
            code = emit_reduction(strategy, kind, rows, max(size, 1), element, finish, threads=self.threads,
                                  ctype=cops.c_type(op.out.dtype))
        self.plan.notes[g.id] = {"strategy": code.strategy, **code.params}
        return code.code, code.work_items, code.shared_bytes
