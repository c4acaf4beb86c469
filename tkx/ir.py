"""The tkx IR: SSA tensor values with explicit layouts, primitive ops, and programs.

A :class:`Program` is a list of :class:`Op` records in topological order. Every op defines
one new *root buffer* (named by the op's stable ``id``) in a contiguous layout. Values read
by ops are :class:`TensorSpec` objects: a root buffer plus shape, strides and element
offset. Views (transpose, permute, expand, reshape, squeeze/unsqueeze, slice, select) are
therefore metadata on a ``TensorSpec``, never ops.

Scalars (Python ``int``/``float``/``bool``) may appear directly as op operands.

The primitive op set is the op table :data:`tkx.ops.OPS` (re-exported here): one row per
kind with its family (``pointwise``, ``reduction``, ``matmul``, ``generator``, ``index``),
arity, meaning, torch reference, C expression and flags. The same table drives lowering,
both interpreters, the passes, the fusion rules, the code generator and their tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .display import Views
from .dtypes import DTYPE_BYTES, DTYPE_SHORT, FLOAT_DTYPES, INT_DTYPES  # noqa: F401 (re-exported)
from .errors import SourceLine, TkxError
from .ops import OPS, POINTWISE, Kind, OpDef, row  # noqa: F401 (re-exported)

REGIONS = ("forward", "backward", "optimizer")


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) of a dense tensor of ``shape``."""
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TensorSpec:
    """A tensor value: a window onto a root buffer.

    shape/strides are in elements; ``offset`` is the element offset into the root buffer;
    ``buffer`` names the root (a program input's buffer name or the id of the op that
    defines it); ``dtype`` is one of :data:`DTYPE_BYTES`.
    """

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    buffer: str
    offset: int = 0

    @staticmethod
    def dense(buffer: str, shape: tuple[int, ...], dtype: str) -> TensorSpec:
        """The contiguous, offset-0 root value of ``buffer``."""
        return TensorSpec(tuple(shape), dtype, contiguous_strides(tuple(shape)), buffer, 0)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements this value spans if stored densely."""
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def is_dense(self) -> bool:
        """True when this value is its root buffer itself: contiguous and at offset 0."""
        return self.offset == 0 and all(
            d == 1 or s == c for d, s, c in zip(self.shape, self.strides, contiguous_strides(self.shape)))

    @property
    def extent(self) -> int:
        """One past the largest element index this value touches (0 when empty)."""
        if self.numel == 0:
            return 0
        return self.offset + 1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides))


Operand = TensorSpec | int | float | bool

#: Kept for code written against earlier releases: a row of the op table.
OpInfo = OpDef


@dataclass(frozen=True)
class Op:
    """One IR operation, defining the root buffer ``id``.

    ``id`` is stable across passes (it starts as the FX node name); ``kind`` is a key of
    :data:`OPS`; ``out`` is the dense value this op writes (``out.buffer == id``);
    ``region`` is ``forward``/``backward``/``optimizer``; ``source`` is the user's line
    and ``fx_node`` the FX node this op was lowered from (``None`` for ops a pass made).
    ``module`` is the dotted path of the ``nn.Module`` the op came from (``"blocks.1.attn"``;
    ``""`` for the root module; ``None`` outside every module) and ``module_type`` its class name
    (``"Attention"``; ``None`` when the module is known only from parameter names). Backward ops
    carry the module of the forward op they differentiate, optimizer ops that of their parameter
    (see :mod:`tkx.capture.modules`).
    """

    id: str
    kind: str
    inputs: tuple[Operand, ...]
    out: TensorSpec
    attrs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    region: str = "forward"
    source: SourceLine | None = field(default=None, compare=False)
    fx_node: str | None = field(default=None, compare=False)
    module: str | None = field(default=None, compare=False)
    module_type: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Ops are shared between stages and explorations: attributes must not change in place
        # (a pass that wants other attributes makes a new Op with ``op.replace(attrs=...)``).
        if type(self.kind) is not str:  # a tkx.ops.Kind member: store the plain name
            object.__setattr__(self, "kind", str(self.kind))
        if not isinstance(self.attrs, MappingProxyType):
            object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    @property
    def info(self) -> OpDef:
        """This op's row of the op table (raises :class:`tkx.ops.UnknownKindError` for an unknown kind)."""
        return row(self.kind)

    @property
    def family(self) -> str:
        return row(self.kind).family

    @property
    def tensor_inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(x for x in self.inputs if isinstance(x, TensorSpec))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def replace(self, **changes: Any) -> Op:
        return replace(self, **changes)


@dataclass(frozen=True)
class InputSpec:
    """A program input: a leaf of the step's input pytree.

    ``name`` is the pytree path (``params['w1']``), ``value`` its layout at capture time
    (the buffer name is ``value.buffer``), ``mutated`` whether the step writes it in place.
    """

    name: str
    value: TensorSpec
    mutated: bool = False


@dataclass(frozen=True)
class OutputSpec:
    """A program output: a leaf of the step's output pytree, by pytree path."""

    name: str
    value: TensorSpec


@dataclass(frozen=True)
class StateUpdate:
    """An in-place update of input ``input_index`` with ``value`` (``input.copy_(value)``).

    Functionalization turns ``p.sub_(...)`` into a pure op plus this copy back, which the
    compiled step performs on the user's tensor after every read of the old value.
    """

    input_index: int
    value: TensorSpec


@dataclass(frozen=True)
class Program(Views):
    """A validated SSA program: inputs, ops in topological order, outputs, state updates.

    ``in_tree``/``out_tree`` are the torch pytree specs of the step's inputs (a tuple of
    positional arguments) and outputs; ``modules`` maps the path of every ``nn.Module`` the step
    called (or named in its parameters) to its class name (``None`` when unknown), in call order.
    None of the three takes part in equality. ``rng_input``: the index of the implicit Philox state
    input (int64 ``[seed, offset]``) of a step that draws random numbers, which the caller does not
    pass: every run draws a fresh one from torch's generator (:func:`tkx.random.next_state`); ``None``
    when the step draws none.
    """

    inputs: tuple[InputSpec, ...]
    ops: tuple[Op, ...]
    outputs: tuple[OutputSpec, ...]
    updates: tuple[StateUpdate, ...] = ()
    name: str = "step"
    in_tree: Any = field(default=None, compare=False, repr=False)
    out_tree: Any = field(default=None, compare=False, repr=False)
    modules: Mapping[str, str | None] = field(default_factory=dict, compare=False, repr=False)
    rng_input: int | None = None

    # -- queries --------------------------------------------------------------------
    def op(self, op_id: str) -> Op:
        for op in self.ops:
            if op.id == op_id:
                return op
        raise KeyError(op_id)

    @property
    def producers(self) -> dict[str, Op]:
        """Root buffer name -> the op that defines it."""
        return {op.id: op for op in self.ops}

    def users(self) -> dict[str, list[Op]]:
        """Root buffer name -> ops reading it (an op appears once per buffer)."""
        out: dict[str, list[Op]] = {}
        for op in self.ops:
            for buf in dict.fromkeys(x.buffer for x in op.tensor_inputs):
                out.setdefault(buf, []).append(op)
        return out

    def sinks(self) -> Iterator[TensorSpec]:
        """Values the program must produce: outputs and state-update values."""
        yield from (o.value for o in self.outputs)
        yield from (u.value for u in self.updates)

    def replace(self, **changes: Any) -> Program:
        return replace(self, **changes)

    def __str__(self) -> str:
        from . import display
        return display.text(self)

    def pretty(self, group_by: str = "region") -> str:
        """The program as text, like ``str(program)``; ``group_by="module"`` lists the ops under one
        header per ``nn.Module`` they came from (``"region"``, the default: forward/backward/optimizer).
        Raises ``ValueError`` for another ``group_by``."""
        from . import display
        return display.lookup(self, "text")(self, group_by=group_by)

    def __repr__(self) -> str:
        from .words import plural
        return (f"<tkx.Program {self.name}: {plural(len(self.inputs), 'input')}, {plural(len(self.ops), 'op')}, "
                f"{plural(len(self.outputs), 'output')}, {plural(len(self.updates), 'in-place update')}>")

    # -- views, looked up in tkx.display (the printer and tkx.render register them) --
    def graph(self, **kw: Any) -> Any:
        """The dataflow graph as a ``graphviz.Digraph`` (``collapse="auto"|"region"|"none"``,
        ``expand=(regions...)``); see :func:`tkx.render.program.program_graph`."""
        from . import display
        return display.graph(self, **kw)

    def diff(self, other: Any) -> Any:
        """A :class:`~tkx.passes.diff.ProgramDiff` of this program against ``other``:
        added/removed/changed op ids, ``str()`` a unified diff, side by side in notebooks."""
        from . import display
        return display.diff(self, other)


def ancestors(producers: Mapping[str, Op], seeds: Any) -> set[str]:
    """The buffers ``seeds`` (root buffer names) and every buffer they are computed from, through
    ``producers`` (:attr:`Program.producers`); inputs and other unproduced names are left out."""
    out: set[str] = set()
    stack = list(seeds)
    while stack:
        b = stack.pop()
        if b in out or b not in producers:
            continue
        out.add(b)
        stack.extend(x.buffer for x in producers[b].tensor_inputs)
    return out


class IRValidationError(TkxError):
    """A Program breaks an IR invariant (a compiler bug or a broken user pass)."""


def validate(program: Program) -> Program:
    """Check the IR invariants; return ``program`` unchanged.

    Checks: op ids unique and not input buffer names; every op kind known with the right
    arity; every op output dense and named by its op; every read refers to a buffer
    defined earlier; views stay inside their root and keep its dtype; outputs and
    updates read defined buffers; an update's value matches its input's shape/dtype.

    Raises :class:`IRValidationError` naming the op at fault.
    """
    roots: dict[str, TensorSpec] = {}
    for i, inp in enumerate(program.inputs):
        v = inp.value
        if v.buffer in roots:
            raise IRValidationError(f"input {i} ({inp.name}) reuses buffer name {v.buffer!r}")
        if v.dtype not in DTYPE_BYTES:
            raise IRValidationError(f"input {inp.name} has unknown dtype {v.dtype}")
        roots[v.buffer] = v

    def check_read(spec: TensorSpec, where: str) -> None:
        if spec.buffer not in roots:
            raise IRValidationError(f"{where} reads {spec.buffer!r}, which is not defined before it")
        root = roots[spec.buffer]
        if spec.dtype != root.dtype:
            raise IRValidationError(f"{where} reads {spec.buffer!r} as {spec.dtype}, root is {root.dtype}")
        if len(spec.shape) != len(spec.strides) or min(spec.strides, default=0) < 0 or spec.offset < 0:
            raise IRValidationError(f"{where} has a malformed view of {spec.buffer!r}")
        if spec.extent > max(root.extent, 0) and spec.numel:
            raise IRValidationError(f"{where} reads past the end of {spec.buffer!r}")

    for op in program.ops:
        where = f"op {op.id} ({op.kind})"
        info = OPS.get(str(op.kind))
        if info is None:
            raise IRValidationError(f"{where}: unknown op kind")
        if info.arity is not None and len(op.inputs) != info.arity:
            raise IRValidationError(f"{where}: expects {info.arity} operands, has {len(op.inputs)}")
        if op.region not in REGIONS:
            raise IRValidationError(f"{where}: unknown region {op.region!r}")
        for x in op.inputs:
            if isinstance(x, TensorSpec):
                check_read(x, where)
            elif not isinstance(x, (int, float, bool)):
                raise IRValidationError(f"{where}: operand of type {type(x).__name__}")
        if op.id in roots:
            raise IRValidationError(f"{where}: id defined twice")
        if op.out.buffer != op.id or not op.out.is_dense or op.out.strides != contiguous_strides(op.out.shape):
            raise IRValidationError(f"{where}: output must be the dense root buffer {op.id!r}")
        roots[op.id] = op.out
    for o in program.outputs:
        check_read(o.value, f"output {o.name}")
    seen = set()
    for u in program.updates:
        if not 0 <= u.input_index < len(program.inputs):
            raise IRValidationError(f"update of missing input {u.input_index}")
        if u.input_index in seen:
            raise IRValidationError(f"input {u.input_index} updated twice")
        seen.add(u.input_index)
        target = program.inputs[u.input_index].value
        check_read(u.value, f"update of {program.inputs[u.input_index].name}")
        if u.value.shape != target.shape or u.value.dtype != target.dtype:
            raise IRValidationError(f"update of {program.inputs[u.input_index].name} changes shape or dtype")
    return program
