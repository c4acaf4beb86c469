"""The attention decision: each ``attention``/``attention_backward`` composite is either one fused
FlashAttention group or expanded to its math before the rest of the scheduler runs.

:func:`prepare` asks the fused emitter (:data:`tkx.target.ATTENTION_EMITTER`) whether it supports
the composite, estimates the µs of the fused group and of the unfused math
(:func:`tkx.target.fused_attention_us`, :func:`tkx.target.unfused_attention_us`), and decides by
``Options.fuse_attention``: ``True`` fuses (and raises :class:`~tkx.errors.TkxError` when the
emitter cannot), ``False`` expands, ``"auto"`` takes the cheaper estimate. A decode-shaped forward
(at most :data:`tkx.target.DECODE_MAX_Q` query rows over a long KV cache) is planned as
**flash-decoding** (``flash_decode``): the keys split into KV tiles by :func:`tkx.target.decode_split`
(the split's sentence joins the decision), one work item per (batch, KV tile), and a combine stage. Every decision is a
:class:`~tkx.schedule.model.FusionDecision` of kind ``"attention"`` with both estimates in its
sentence, so ``why_not_fused`` and the Explorer's fusion view show it.

Expanding traces :mod:`tkx.attention_ref` (the composite's meaning, the same function both
interpreters evaluate) with ``make_fx`` and capture's decomposition table on meta tensors laid out
like the composite's operands, lowers that graph with capture's :class:`~tkx.capture.lower.Lowering`
(the operands' views seeded in, so no copy is made), and points every reader of the packed
composite at the piece that holds its value. CSE then merges the score matrix the forward and the
backward recompute.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import TkxError
from ..ir import Op, OutputSpec, Program, StateUpdate, TensorSpec
from ..target import (
    ATTENTION_EMITTER,
    AttentionPlan,
    AttentionProblem,
    fused_attention_us,
    unfused_attention_us,
)
from .model import FusionDecision


def problem_of(op: Op) -> AttentionProblem:
    """The sizes of an attention composite (see :class:`tkx.target.AttentionProblem`)."""
    q, k, v = op.inputs[:3]
    assert isinstance(q, TensorSpec) and isinstance(k, TensorSpec) and isinstance(v, TensorSpec)
    return AttentionProblem(math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.dtype,
                            op.kind == "attention_backward", bool(op.attr("causal")), str(op.attr("mask", "none")))


def prepare(program: Program, options: Any, blocks: int
            ) -> tuple[Program, list[FusionDecision], dict[str, AttentionPlan]]:
    """(program with the unfused composites expanded, the decisions, plan of each fused composite by op id)."""
    decisions: list[FusionDecision] = []
    plans: dict[str, AttentionPlan] = {}
    expand: list[Op] = []
    want = getattr(options, "fuse_attention", "auto")
    for op in program.ops:
        if op.family != "attention":
            continue
        p = problem_of(op)
        unfused = unfused_attention_us(p, blocks)
        refused = ATTENTION_EMITTER.supports(p, options)
        plan = None if refused else ATTENTION_EMITTER.plan(p, options, "", blocks)
        fused = fused_attention_us(plan, blocks) if plan is not None else float("inf")
        numbers = (f"estimated {fused:.1f} µs fused vs {unfused:.1f} µs as its math" if plan is not None
                   else f"the math is estimated at {unfused:.1f} µs")
        what = "backward" if p.backward else "forward"
        if want is True and refused:
            raise TkxError(f"fuse_attention=True but the attention {what} {op.id} ({op.source or 'no source line'}) "
                           f"cannot be fused: {refused}; use fuse_attention='auto' or False")
        if want is False:
            code, reason, take = "option-off", f"not fused: fuse_attention is off ({numbers})", False
        elif refused:
            code, reason, take = "unsupported", f"not fused: {refused} ({numbers})", False
        elif want is True:
            code, reason, take = "forced", f"fused: fuse_attention=True ({numbers})", True
        elif fused <= unfused and plan is not None and plan.impl == "flash_decode":
            code, reason, take = "cheaper", f"fused: cheaper than its math ({numbers})", True
        elif fused <= unfused:
            code, reason, take = "cheaper", f"fused: one FlashAttention group is cheaper ({numbers})", True
        else:
            code, reason, take = "dearer", f"not fused: the math is cheaper ({numbers})", False
        if take and plan is not None and plan.split_why:
            reason += f"; {plan.split_why}"
        decisions.append(FusionDecision("attention", op.id, what, take, "attention", code, reason))
        if take:
            assert plan is not None
            plans[op.id] = plan.replace(why=reason, scale=float(op.attr("scale")), fused_us=round(fused, 2),
                                        unfused_us=round(unfused, 2))
        else:
            expand.append(op)
    if expand:
        program = _expand(program, expand)
    return program, decisions, plans


# -- expansion to the math --------------------------------------------------------------------


def _meta(spec: TensorSpec) -> torch.Tensor:
    from ..capture.lower import IR_TO_TORCH

    base = torch.empty(max(spec.extent, 1), dtype=IR_TO_TORCH[spec.dtype], device="meta")
    return base.as_strided(spec.shape, spec.strides, spec.offset)


def _math(op: Op) -> Any:
    from .. import attention_ref as ref

    causal, scale = bool(op.attr("causal")), float(op.attr("scale"))
    masked = op.attr("mask", "none") != "none"
    if op.kind == "attention":
        empty_rows = str(op.attr("empty_rows", "zero"))

        def fwd(q, k, v, *mask):
            return list(ref.forward(q, k, v, mask[0] if masked else None, causal, scale, empty_rows))
        return fwd

    def bwd(q, k, v, out, lse, dout, *mask):
        return list(ref.backward(q, k, v, mask[0] if masked else None, out, lse, dout, causal, scale))
    return bwd


def _lower_math(op: Op, taken: set[str]) -> tuple[list[Op], list[TensorSpec]]:
    """The IR ops of ``op``'s math reading ``op``'s operands, and the specs of its pieces."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..capture.decompositions import decomposition_table
    from ..capture.lower import Lowering

    operands = [x for x in op.inputs if isinstance(x, TensorSpec)]
    gm = make_fx(_math(op), decomposition_table=decomposition_table(), tracing_mode="real")(
        *[_meta(x) for x in operands])

    class Splice(Lowering):
        @property
        def source(self):  # every op of the math points at the user's attention line and module
            return op.source

        @property
        def module(self):
            return (op.module, op.module_type) if op.module is not None else None

    L = Splice(gm, [], [], {}, op.id)
    L.ids |= taken
    L.regions = _Region(op.region)
    placeholders = iter(operands)
    pieces: list[TensorSpec] = []
    for node in gm.graph.nodes:
        L.node = node
        if node.op == "placeholder":
            L.values[node] = next(placeholders)
        elif node.op == "call_function":
            L.values[node] = L.lower_call(node)
        elif node.op == "output":
            pieces = [L.tensor(a) for a in node.args[0]]
    renamed = [o.replace(id=o.id, fx_node=None) for o in L.ops]
    return renamed, pieces


class _Region(dict):
    def __init__(self, region: str) -> None:
        super().__init__()
        self.region = region

    def get(self, key: Any, default: Any = None) -> str:
        return self.region


def _rebase(x: Any, pieces: dict[str, list[tuple[int, int, TensorSpec]]]) -> Any:
    """``x`` read from a packed composite -> the same elements of the piece that holds them."""
    if not isinstance(x, TensorSpec) or x.buffer not in pieces:
        return x
    lo, hi = x.offset, x.extent
    for start, n, spec in pieces[x.buffer]:
        if start <= lo and (hi <= start + n or x.numel == 0):
            return TensorSpec(x.shape, x.dtype, x.strides, spec.buffer, spec.offset + lo - start)
    raise TkxError(f"scheduler: a view of {x.buffer} spans two pieces of the attention composite (a lowering bug)")


def _expand(program: Program, expand: list[Op]) -> Program:
    from ..passes.builtin import cse, dce

    taken = {o.id for o in program.ops} | {i.value.buffer for i in program.inputs}
    targets = {o.id for o in expand}
    pieces: dict[str, list[tuple[int, int, TensorSpec]]] = {}
    new_ops: list[Op] = []
    for op in program.ops:
        if op.id not in targets:
            new_ops.append(op.replace(inputs=tuple(_rebase(x, pieces) for x in op.inputs)))
            continue
        inputs = tuple(_rebase(x, pieces) for x in op.inputs)
        body, outs = _lower_math(op.replace(inputs=inputs), taken)
        taken |= {o.id for o in body}
        placed, start = [], 0
        for k, spec in enumerate(outs):
            if not spec.is_dense or spec.buffer not in {o.id for o in body}:
                cid = f"{op.id}_piece{k}"
                body.append(Op(cid, "cast", (spec,), TensorSpec.dense(cid, spec.shape, "float32"), {},
                               region=op.region, source=op.source, module=op.module, module_type=op.module_type))
                taken.add(cid)
                spec = body[-1].out
            placed.append((start, spec.numel, spec))
            start += spec.numel
        pieces[op.id] = placed
        new_ops.extend(body)
    outputs = tuple(OutputSpec(o.name, _rebase(o.value, pieces)) for o in program.outputs)
    updates = tuple(StateUpdate(u.input_index, _rebase(u.value, pieces)) for u in program.updates)
    out = program.replace(ops=tuple(new_ops), outputs=outputs, updates=updates)
    return dce(cse(out))


__all__ = ["prepare", "problem_of"]
