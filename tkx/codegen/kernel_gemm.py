"""GEMM and GEMV groups of the kernel: from a group and its typed plan to the emitter's call."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..dtypes import DTYPE_BYTES
from ..ir import Op, TensorSpec
from ..schedule.model import Group
from ..target import EPILOGUE_BATCH, GPU, GemmPlan, GemmProblem
from . import abi
from . import epilogue_vector as ev
from . import ops as cops
from .cuda_prelude import (
    load,
    round_to,
)
from .gemm_epilogue import _batched_epilogue
from .gemm_registry import GemmRequest, emit, spec_of
from .gemm_tile import GemvLoads, Prefetch, SplitFinal, WgmmaKnobs
from .kernel_values import ValueEmitter, _coords_index
from .text import block, indent

_POINT_LOAD = re.compile(r"tkx_ld_(\w+)\(((?:[^(),]|\([^()]*\))+), tkx_e\)")


def _point_reads(code: str) -> tuple[tuple[str, int], ...]:
    """``(C pointer, element bytes)`` of each buffer ``code`` (a GEMM epilogue's statements) loads at the
    output element's own linear index ``tkx_e`` (the epilogue's ``load(dtype, ptr, "tkx_e")``)."""
    from .cuda_prelude import SUFFIX
    size = {suffix: DTYPE_BYTES[dt] for dt, suffix in SUFFIX.items() if dt in DTYPE_BYTES}
    seen: dict[str, int] = {}
    for suffix, ptr in _POINT_LOAD.findall(code):
        if suffix in size:
            seen.setdefault(ptr.strip(), size[suffix])
    return tuple(seen.items())


def _slice_store(scratch: str, total: int, m: int, n: int, op_id: str) -> Callable[[str, str, str, str], str]:
    """The epilogue of a split-K slice: element (bat, row, col) of slice ``ks_split`` to fp32 ``scratch``."""
    def store(bat: str, row: str, col: str, acc: str) -> str:
        lin = f"(((long long){bat} * {m} + {row}) * {n} + {col})"
        return f"{scratch}[(long long)ks_split * {total}LL + {lin}] = {acc};  // {op_id}: split-K slice"
    return store


class GemmGroups(ValueEmitter):
    """GEMM groups: the operands as load callbacks, pointers and TMA maps, the epilogue of the fused
    pointwise consumers, split-K's slice stores and final, and the call of the emitter the plan names
    (:func:`tkx.codegen.gemm.emit_gemm`, :func:`tkx.codegen.gemv.gemv_stream`)."""

    def gemm_code(self, g: Group) -> tuple[str, int, int]:
        op = self.ops[g.anchor]
        a, b = (op.inputs[1], op.inputs[2]) if op.kind == "addmm" else (op.inputs[0], op.inputs[1])
        assert isinstance(a, TensorSpec) and isinstance(b, TensorSpec)
        prob = GemmProblem.from_views(a, b)
        m, n = prob.m, prob.n
        plan = g.plan
        assert isinstance(plan, GemmPlan), f"{g.id}: a GEMM group carries a GemmPlan, not {type(plan).__name__}"
        variant = plan.impl
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

        split = plan.split_k
        split_final = None
        if split > 1 and g.kind == "gemm" and plan.split_final == "last-slice":
            # split-K in one group: each item writes its slice, the last of a tile adds them (gemm.SplitFinal)
            scratch, _ = self.pointer(plan.partials)
            total = prob.batch * m * n
            first = self.plan.tile_counters.setdefault(g.id, self.plan.tile_counter_words)
            if first == self.plan.tile_counter_words:
                self.plan.tile_counter_words += plan.tiles
            split_final = SplitFinal(scratch, f"(tkx_tiles + {first})", epilogue)
            final = _slice_store(scratch, total, m, n, op.id)
        elif split > 1 and g.kind == "gemm":
            return self.split_k_final(g, op, plan, prob, epilogue)
        elif split > 1:
            # split-K, phase 1: each work item writes one tile's sum over one slice of K to scratch
            scratch, _ = self.pointer(plan.partials)
            total = prob.batch * m * n
            final = _slice_store(scratch, total, m, n, op.id)
        else:
            final = epilogue
        if spec_of(variant).streaming:  # the streaming GEMV's vector, chain and prefetch loads
            decisions = {"blocks": self.s.blocks, "cheap": self.cheap,
                         "gemv_loads": self.gemv_stream_loads(g.id, a, b, prob, pointer_to, coords)}
        else:
            decisions = dict(
                tile=(plan.tile_m, plan.tile_n, plan.tile_k),
                ptr_a=pointer_to(a, 1 if prob.a_k_contiguous else 0),
                ptr_b=pointer_to(b, 1 if prob.b_n_contiguous else 0), split=split,
                shared_budget=GPU.shared_per_block // max(1, int(self.s.options.blocks_per_sm)),
                tma_a=tma_map(a, 1 if prob.a_k_contiguous else 0),
                tma_b=tma_map(b, 1 if prob.b_n_contiguous else 0), split_final=split_final,
                epilogue_reads=_point_reads(epilogue("bat", "row", "col", "acc"))
                if self.s.options.epilogue_prefetch and split == 1 and not batched else (),
                knobs=WgmmaKnobs.of(self.s.options), cluster=2 if plan.cluster == 2 and self.s.mode != "block" else 1)
        code = emit(GemmRequest(variant, prob, operand(a), operand(b), final, threads=self.threads,
                                **decisions))  # type: ignore[arg-type]
        self.plan.tensor_cores |= code.tensor_cores
        if code.cluster > 1:
            self.plan.cluster = max(self.plan.cluster, code.cluster)
            self.plan.cluster_groups.add(g.id)
        self.plan.notes[g.id] = {"variant": code.variant, **code.params}
        return code.code, code.work_items, code.shared_bytes

    def split_k_final(self, g: Group, op: Op, plan: GemmPlan, prob: GemmProblem,
                      epilogue: Callable[[str, str, str, str], str]) -> tuple[str, int, int]:
        """Split-K, phase 2 (``split_final="stage"``): add the fp32 slices of ``plan.partials`` in slice
        order (a fixed order: the same bits every run), then ``epilogue``; :data:`EPILOGUE_BATCH` elements
        per thread (in 16-byte vectors when aligned) or one."""
        m, n, split, variant = prob.m, prob.n, plan.split_k, plan.impl
        # split-K, phase 2: add the slices in order (a fixed order: the same bits every run), then
        # the epilogue, one output element per thread
        scratch, _ = self.pointer(plan.partials)
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
                lines += [f"const long long {x}e = e + {u * t};", ev.element_coords(x, f"{x}e", m, n),
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

    def gemv_stream_loads(self, gid: str, a: TensorSpec, b: TensorSpec, prob: GemmProblem, pointer_to: Any,
                          coords: Callable[[str, str, str, TensorSpec], str]) -> GemvLoads:
        """The streaming GEMV's long-operand loads (:mod:`tkx.codegen.gemv`): a pointer for 16-byte loads of a
        stored bf16 weight, or the raw rows an inlined (dequantising) chain reads, to prefetch, and that chain's
        8-element reads."""
        from .leaves import column_spans

        small_m = prob.m <= prob.n
        view = b if small_m else a
        fast = 0 if small_m else 1  # the long operand is contiguous along K
        long8 = self.chain8(view, small_m, coords)
        stored = self.stored_bf16(view)
        at = self.vector_pointer(stored, fast, coords) if stored is not None else None
        short = a if small_m else b
        if at is not None:
            ptr, _ = self.pointer(stored.buffer)
            if stored.buffer in self.inputs and _dense(stored):
                self.plan.stream_weights[gid] = (ptr, 2 * stored.offset, 2 * stored.numel)

            def ptr_long(bat: str, k: str, col: str) -> str:
                return f"reinterpret_cast<const unsigned short*>({at(bat, k, col) if small_m else at(bat, col, k)})"
            short_stored = self.stored_bf16(short)
            f32 = short_stored is None and short.dtype == "float32" and short.buffer not in self.s.inlined
            if f32:
                short_stored = short
            at_s = self.vector_pointer(short_stored, 1 - fast, coords) if short_stored is not None else None
            return GemvLoads(ptr_long, _aligned(ptr), *self.short_loads(short_stored or short, small_m, at_s),
                             long8=long8, ahead=int(self.s.options.gemv_prefetch), short_f32=f32 and at_s is not None,
                             stage_short=short.buffer in self.s.inlined, ring=int(self.s.options.gemv_ring))
        if prob.batch != 1:
            return GemvLoads(long8=long8)
        at_s = pointer_to(short, 1 - fast) if self.cheap and short.dtype == "bfloat16" else None
        spans = column_spans(view, self.ops, set(self.s.inlined), 0 if small_m else 1)
        fetch = []
        for sp in spans:
            ptr, dtype = self.pointer(sp.buffer)
            size = DTYPE_BYTES[dtype]
            fetch.append(Prefetch(ptr, sp.row_stride * size, sp.start * size, sp.span * size))
        return GemvLoads(None, "false", *self.short_loads(short, small_m, at_s), tuple(fetch), long8)

    def stored_bf16(self, view: TensorSpec) -> TensorSpec | None:
        """``view`` when it reads a stored bfloat16 buffer; when it reads an inlined float32 cast of one laid out
        as the cast's output (``w.float()`` of a contiguous weight, ``h.float()`` of a stored activation), the
        same view of the bfloat16 buffer: widening bfloat16 to float32 is exact, so the GEMV's 16-byte loads
        of the stored bits give the cast's values. Else ``None``."""
        if view.buffer not in self.s.inlined:
            return view if view.dtype == "bfloat16" else None
        op = self.ops.get(view.buffer)
        if op is None or op.kind != "cast" or op.out.dtype != "float32":
            return None
        src = [x for x in op.inputs if isinstance(x, TensorSpec)]
        if len(src) != 1:
            return None
        x = src[0]
        if (x.dtype != "bfloat16" or x.buffer in self.s.inlined or x.shape != op.out.shape
                or x.strides != op.out.strides or x.offset != op.out.offset):
            return None
        return TensorSpec(view.shape, "bfloat16", view.strides, x.buffer, view.offset)

    def vector_pointer(self, view: TensorSpec, fast_dim: int, coords: Callable[[str, str, str, TensorSpec], str]
                       ) -> Any:
        """``(batch, r, c) -> C pointer`` to an element of stored ``view`` (2- or 4-byte elements) for 16-byte
        loads of 8 elements: contiguous along ``fast_dim`` (0: rows, 1: columns), every other stride and the
        offset multiples of 8 elements; else ``None``."""
        if view.buffer in self.s.inlined or DTYPE_BYTES.get(view.dtype) not in (2, 4):
            return None
        other = [st for d, st in enumerate(view.strides) if d != view.ndim - 2 + fast_dim]
        if view.strides[view.ndim - 2 + fast_dim] != 1 or any(st % 8 for st in other) or view.offset % 8:
            return None
        ptr, _ = self.pointer(view.buffer)

        def at(bat: str, r: str, c: str) -> str:
            return f"({ptr} + {coords(bat, r, c, view)})"
        return at

    def short_loads(self, short: TensorSpec, small_m: bool, at_s: Any) -> tuple[Any, str]:
        """``(ptr_short, aligned_short)``: 16-byte loads of the streaming GEMV's short operand (the
        activations) through ``at_s`` (a pointer callback, or ``None``: element loads)."""
        if at_s is None:
            return None, "false"
        sptr, _ = self.pointer(short.buffer)

        c_type = "float" if short.dtype == "float32" else "unsigned short"

        def ptr_short(bat: str, k: str, row: str) -> str:
            elem = at_s(bat, row, k) if small_m else at_s(bat, k, row)
            return f"reinterpret_cast<const {c_type}*>({elem})"
        return ptr_short, _aligned(sptr)

    def chain8(self, long_view: TensorSpec, small_m: bool, coords: Callable[[str, str, str, TensorSpec], str]
               ) -> Any:
        """``(batch, k0, l, t) -> C float`` of an inlined long operand read 8 consecutive K elements at a time
        (``Options.cheap_int_math``, unit stride along K, every other stride and the offset multiples of 8),
        else ``None``."""
        k_dim = long_view.ndim - (2 if small_m else 1)
        others = [st for d, st in enumerate(long_view.strides) if d != k_dim]
        if not (self.cheap and long_view.buffer in self.s.inlined and long_view.strides[k_dim] == 1
                and all(st % 8 == 0 for st in others) and long_view.offset % 8 == 0):
            return None
        fn = self.function(long_view.buffer)

        def long8(bat: str, k0: str, col: str, t: str) -> str:
            # k0 a multiple of 8, every other stride and the offset too: index(k0) + t == index(k0) | t,
            # which shows the compiler the low 3 bits (one byte, one scale serve the 8 elements)
            idx = coords(bat, k0, col, long_view) if small_m else coords(bat, col, k0, long_view)
            return f"{fn}(TKX_ARGS, ({idx} | {t}))"
        return long8


def _dense(view: TensorSpec) -> bool:
    """Whether ``view``'s elements are one run of memory (row-major or its transpose, no gaps)."""
    if view.ndim != 2:
        return False
    rows, cols = view.shape
    return view.strides in ((cols, 1), (1, rows))


def _aligned(ptr: str) -> str:
    """C test that ``ptr`` is 16-byte aligned."""
    return f"((((unsigned long long){ptr}) & 15ULL) == 0)"
