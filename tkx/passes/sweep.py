"""A forward sweep that rewrites ops and forwards values: the engine of most passes.

A pass built on :class:`Sweep` visits the ops in program order. Before the visit, each
operand has already been rewritten for earlier decisions. The visitor returns either an
:class:`~tkx.ir.Op` (the same object when unchanged, or a rewritten op with the same id)
or a :class:`~tkx.ir.TensorSpec` ``R`` meaning "this op's result equals ``R``": every later
read of the op is then re-expressed as a view of ``R`` (:func:`tkx.passes.views.compose`).

Sinks (outputs and state updates) are forwarded too, with two rules that keep the
runtime's contract: a sink never moves onto a buffer of an input that is updated in place
(that buffer changes during the step), and a state-update value stays dense. Where a read
cannot be forwarded it keeps reading the op, which then stays; a forwarded op nobody reads
any more is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Op, Operand, OutputSpec, Program, StateUpdate, TensorSpec
from .views import compose

Visit = Callable[["Sweep", Op], "Op | TensorSpec"]


class Sweep:
    """State of one forward sweep over ``program`` (see the module docstring)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        #: buffer -> root value (program inputs and op outputs)
        self.roots: dict[str, TensorSpec] = {i.value.buffer: i.value for i in program.inputs}
        self.roots.update({op.id: op.out for op in program.ops})
        self.input_buffers = frozenset(i.value.buffer for i in program.inputs)
        self.mutated = frozenset(
            [i.value.buffer for i in program.inputs if i.mutated]
            + [program.inputs[u.input_index].value.buffer for u in program.updates])
        #: op id -> the value it was forwarded to
        self.subst: dict[str, TensorSpec] = {}
        #: op id -> the op as emitted so far (rewritten)
        self.current: dict[str, Op] = {}

    def read(self, x: Operand) -> Operand:
        """``x`` re-expressed after earlier forwards (``x`` itself when untouched)."""
        if isinstance(x, TensorSpec) and x.buffer in self.subst:
            c = compose(x, self.subst[x.buffer])
            return c if c is not None else x
        return x

    def producer(self, x: Operand) -> Op | None:
        """The (rewritten) op defining the buffer ``x`` reads, or ``None`` for inputs/scalars."""
        return self.current.get(x.buffer) if isinstance(x, TensorSpec) else None

    def _sink(self, spec: TensorSpec, update: bool) -> TensorSpec:
        if spec.buffer not in self.subst:
            return spec
        c = compose(spec, self.subst[spec.buffer])
        if c is None or c.buffer in self.mutated or (update and not c.is_dense):
            return spec
        return c

    def run(self, visit: Visit, sink_hook: Callable[[TensorSpec], TensorSpec] | None = None) -> Program:
        """Apply ``visit`` to every op; return the new program (``program`` itself if unchanged)."""
        program = self.program
        emitted: list[Op] = []
        forwarded: set[str] = set()
        for op in program.ops:
            ins = tuple(self.read(x) for x in op.inputs)
            if any(a is not b for a, b in zip(ins, op.inputs)):
                op = op.replace(inputs=ins)
            result = visit(self, op)
            if isinstance(result, TensorSpec):
                if result.shape != op.out.shape or result.dtype != op.out.dtype:
                    raise AssertionError(f"forwarding {op.id} to a value of another type")
                self.subst[op.id] = result
                forwarded.add(op.id)
                result = op
            elif result.id != op.id:
                raise AssertionError(f"a sweep visitor renamed op {op.id} to {result.id}")
            self.current[result.id] = result
            emitted.append(result)
        hook = sink_hook or (lambda s: s)
        outputs = tuple(OutputSpec(o.name, hook(self._sink(o.value, False))) for o in program.outputs)
        updates = tuple(StateUpdate(u.input_index, hook(self._sink(u.value, True))) for u in program.updates)
        needed = {s.buffer for s in (*(o.value for o in outputs), *(u.value for u in updates))}
        kept: list[Op] = []
        for op in reversed(emitted):
            if op.id in forwarded and op.id not in needed:
                continue
            kept.append(op)
            needed.update(x.buffer for x in op.tensor_inputs)
        kept.reverse()
        same_ops = len(kept) == len(program.ops) and all(a is b for a, b in zip(kept, program.ops))
        if same_ops and outputs == program.outputs and updates == program.updates:
            return program
        return program.replace(ops=tuple(kept), outputs=outputs, updates=updates)
