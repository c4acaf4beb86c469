"""Attention groups of the kernel: the operands as loaders and the call of :mod:`tkx.codegen.attention`."""

from __future__ import annotations

from typing import Any

from ..ir import Op, TensorSpec
from ..schedule.model import Group
from .cuda_prelude import (
    load,
)
from .kernel_values import ValueEmitter, _coords_index, _unravel


class AttentionGroups(ValueEmitter):
    """Fused attention groups (FlashAttention forward/backward, flash-decoding partials and combine) through
    :mod:`tkx.codegen.attention`."""

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
            code = fa.forward(plan, threads=self.threads, ld_q=q, ld_k=k, ld_v=v, ld_mask=mask, out=ptr, name=g.id,
                              zero_empty_rows=op.attr("empty_rows", "zero") == "zero")
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
            code = fa.decode_combine(plan, threads=self.threads, partials=scratch, out=out, name=g.id,
                                     zero_empty_rows=op.attr("empty_rows", "zero") == "zero")
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
