"""The scheduler's working state: the program's dependency facts and the decisions taken so far.

:class:`Graph` holds what every step asks of the program (an op's consumers, whether one op
transitively reads another, the buffers that leave the step); :class:`Work` is the scratchpad the
steps of :func:`tkx.schedule.schedule` fill in: the fusion domains (a group's anchor and the ops
computed in its loop), the inlined ops and every recorded decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir import Op, Program, TensorSpec
from .model import FusionDecision
from .rules import Candidate, FusionRule, Verdict, judge


def is_identity(view: TensorSpec, root: TensorSpec) -> bool:
    """True when element ``i`` of ``view`` (row-major) is element ``i`` of ``root``.

    That holds for the root itself and for dense reshapes of a dense root (``[1,128]`` read
    as ``[128]``): an elementwise loop over the linear index reads it in registers.
    """
    if view.numel != root.numel or view.offset != root.offset:
        return False
    if view.shape == root.shape and all(d == 1 or a == b for d, a, b in
                                        zip(view.shape, view.strides, root.strides)):
        return True
    return view.is_dense and root.is_dense


class Graph:
    """Dependency facts about a program used by every scheduling step."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.ops = {op.id: op for op in program.ops}
        self.pos = {op.id: i for i, op in enumerate(program.ops)}
        self.users: dict[str, list[tuple[Op, TensorSpec]]] = {}
        for op in program.ops:
            for x in op.tensor_inputs:
                self.users.setdefault(x.buffer, []).append((op, x))
        self.sink_buffers = {v.buffer for v in program.sinks()}
        self.input_buffers = {i.value.buffer: k for k, i in enumerate(program.inputs)}
        anc: dict[str, int] = {}
        for op in program.ops:
            mask = 0
            for x in op.tensor_inputs:
                if x.buffer in self.pos:
                    mask |= anc[x.buffer] | (1 << self.pos[x.buffer])
            anc[op.id] = mask
        self.anc = anc

    def consumer_ops(self, buf: str) -> list[Op]:
        return list({op.id: op for op, _ in self.users.get(buf, [])}.values())

    def depends(self, a: str, b: str) -> bool:
        """Does op ``a`` (transitively) read op ``b``?"""
        return b in self.pos and bool(self.anc[a] >> self.pos[b] & 1)


@dataclass
class Work:
    """Mutable scratchpad of the scheduler."""

    graph: Graph
    options: Any
    rules: tuple[FusionRule, ...]
    decisions: list[FusionDecision] = field(default_factory=list)
    domain_of: dict[str, str] = field(default_factory=dict)     # op id -> group anchor id
    domains: dict[str, list[str]] = field(default_factory=dict)  # anchor id -> domain ops
    inlined: set[str] = field(default_factory=set)
    cost: dict[str, int] = field(default_factory=dict)
    #: pointwise op -> the skinny GEMM whose short operand it is, kept out of a GEMM's epilogue so that
    #: two sibling GEMMs share a stage (rule ``sibling-gemms``); inlined into that operand's load (inlining step).
    short_operand: dict[str, str] = field(default_factory=dict)
    #: pointwise ops stored once rather than recomputed in such a short operand
    #: (:func:`tkx.schedule.fusion.grow_epilogues`).
    materialize: set[str] = field(default_factory=set)

    def record(self, kind: str, producer: str, consumer: str, rule: str, v: Verdict) -> None:
        self.decisions.append(FusionDecision(kind, producer, consumer, v.fuse, rule, v.code, v.reason))

    def ask(self, kind: str, producer: Op, consumer: Op, view: TensorSpec | None) -> bool:
        c = Candidate(kind, producer, consumer, view, len(self.graph.consumer_ops(producer.id)),
                      self.cost.get(producer.id, 1), self.graph.program, self.options)
        rule, v = judge(c, self.rules)
        self.record(kind, producer.id, consumer.id, rule, v)
        return v.fuse


def root_of(g: Graph, x: TensorSpec) -> TensorSpec:
    """The whole buffer ``x`` views: its producer's output, or the step input it belongs to."""
    if x.buffer in g.ops:
        return g.ops[x.buffer].out
    return g.program.inputs[g.input_buffers[x.buffer]].value


def rows_contiguous(x: TensorSpec, dims: tuple[int, ...]) -> bool:
    """Are consecutive output rows adjacent in memory (a reduction over a leading dim)?"""
    kept = [d for d in range(x.ndim) if d not in dims and x.shape[d] != 1]
    red = [d for d in dims if x.shape[d] != 1]
    return bool(kept) and x.strides[kept[-1]] == 1 and (not red or x.strides[red[-1]] != 1)
