"""Split a captured training step at the gradient: program A (forward + backward) and program B (update).

This module is pure IR work (no ``torch.distributed``): :func:`split_at_gradients` reads the regions
capture gave every op and cuts the :class:`tkx.ir.Program` where the update starts reading what the
backward pass produced.

* **A** (``forward_backward``) holds every op labelled ``forward`` or ``backward`` and every op they
  depend on (a value the forward saves for the backward is sometimes computed outside the loss's
  ancestry; it belongs to A all the same). A writes nothing in place: its outputs are the *cut
  values*, the root buffers of A that B, the step's outputs or its in-place updates read.
* **B** (``update``) holds the rest: the optimizer. Its inputs are the step's own inputs followed by
  one input per cut value (the same buffer name, so its ops read them unchanged); it produces the
  step's outputs and performs its in-place updates.

Each cut value is classified (:class:`CutValue.kind`):

``gradient``
    made by the backward pass (``torch.func.grad``'s outputs and whatever the backward computes for
    the update): averaged over the ranks.
``loss``
    the step's loss output: averaged, so every rank returns the loss of the global batch.
``replicated``
    a forward value the update reads that depends on no batch input (e.g. a cast of a parameter):
    equal on every rank, passed on as it is.
``batch-statistic``
    a forward value the update reads that depends on the local batch (batch-norm running statistics
    are the common case): refused unless ``local_values`` says what to do (``"average"`` or ``"local"``).
``local``
    another output of the step computed in A (per-rank predictions, say): each rank returns its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch.utils._pytree import TreeSpec

from ..dtypes import DTYPE_BYTES, DTYPE_SHORT, FLOAT_DTYPES
from ..errors import SourceLine, UnsupportedError
from ..ir import InputSpec, Op, OutputSpec, Program, TensorSpec, ancestors, validate

__all__ = ["CutValue", "GradientSplit", "DistributedError", "split_at_gradients", "LOCAL_VALUES"]

#: What to do with a forward value that the update reads and that depends on the local batch.
LOCAL_VALUES = ("error", "average", "local")

#: Cut-value kinds, in the order the plan lists them.
KINDS = ("gradient", "loss", "batch-statistic", "replicated", "local")


class DistributedError(UnsupportedError):
    """A step that cannot be run data parallel as given, or a process group that does not fit.

    An :class:`tkx.UnsupportedError` (``kind`` is ``"no-gradient"``, ``"batch-statistic"``,
    ``"bad-batch"``, ``"ambiguous-batch"``, ``"integer-gradient"``, ``"no-process-group"`` or
    ``"bad-input"``) whose message names the op and the user's source line where one is involved, and
    what to do instead."""

    def __init__(self, kind: str, what: str, **kw: object) -> None:
        super().__init__(kind, what, **kw)  # type: ignore[arg-type]
        self.args = (str(self.args[0]).replace("tkx cannot compile this step", "tkx cannot run this step data "
                                               "parallel", 1),)


@dataclass(frozen=True)
class CutValue:
    """A value that crosses from program A to program B.

    ``index``: its position among A's outputs (and among B's inputs after the step's own);
    ``buffer``: the root buffer (op id) in the captured program; ``name``: readable
    (``grad of params['w1']``, ``loss``, or the op id); ``kind``: see the module docstring;
    ``reduce``: ``"average"`` (all-reduced, divided by the world size) or ``"none"``;
    ``shape``/``dtype`` of the dense root; ``nbytes``: its size in bytes; ``source``: the user's line
    of the op that makes it; ``read_by``: ``"update"`` (B's ops or in-place updates) and/or ``"output"``.
    """

    index: int
    buffer: str
    name: str
    kind: str
    reduce: str
    shape: tuple[int, ...]
    dtype: str
    region: str
    source: SourceLine | None
    read_by: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BYTES[self.dtype]

    @property
    def type_text(self) -> str:
        """``f32[64, 128]``."""
        return f"{DTYPE_SHORT.get(self.dtype, self.dtype)}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class GradientSplit:
    """A captured step cut at the gradient (what :func:`split_at_gradients` returns).

    ``program``: the captured program; ``forward_backward`` (A) and ``update`` (B): the two programs;
    ``cut``: the :class:`CutValue` records in A's output order; ``batch_args``: the positional
    arguments that hold each rank's local batch; ``batch_inputs`` / ``replicated_inputs``: flat input
    indices of the batch leaves and of the leaves every rank must hold equal (parameters, optimizer
    state), the latter broadcast from rank 0 at the first call; ``checked_inputs``: replicated leaves of
    arguments only the forward/backward reads that have a leading dimension other than the batch's
    (a target network, or a batch the derivation did not recognise, e.g. tokens ``[B, T]`` beside targets
    already flattened to ``[B*T]``): never overwritten, but compared across ranks at the first call.
    """

    program: Program
    forward_backward: Program
    update: Program
    cut: tuple[CutValue, ...]
    batch_args: tuple[int, ...]
    batch_inputs: tuple[int, ...]
    replicated_inputs: tuple[int, ...]
    checked_inputs: tuple[int, ...] = ()

    @property
    def gradients(self) -> tuple[CutValue, ...]:
        return tuple(c for c in self.cut if c.kind == "gradient")

    @property
    def averaged(self) -> tuple[CutValue, ...]:
        """The cut values all-reduced (averaged) between A and B."""
        return tuple(c for c in self.cut if c.reduce == "average")

    def __repr__(self) -> str:
        return (f"<tkx.distributed.GradientSplit {self.program.name}: A {len(self.forward_backward.ops)} ops -> "
                f"{len(self.gradients)} gradients ({sum(c.nbytes for c in self.gradients):,} B) -> "
                f"B {len(self.update.ops)} ops>")


def c_type(op: Op) -> str:
    return f"{DTYPE_SHORT.get(op.out.dtype, op.out.dtype)}[{', '.join(map(str, op.out.shape))}]"


def _arg_leaves(in_tree: TreeSpec | None, n_inputs: int) -> list[range]:
    """Flat input ranges of each positional argument (one argument when the tree is unknown)."""
    if in_tree is None:
        return [range(n_inputs)]
    out, start = [], 0
    children = in_tree.children() if callable(getattr(in_tree, "children", None)) else in_tree.children_specs
    for child in children:
        out.append(range(start, start + child.num_leaves))
        start += child.num_leaves
    return out


def _depends_on(program: Program, ops: Sequence[Op], sources: set[str]) -> set[str]:
    """Op ids (among ``ops``, in order) that read any of the ``sources`` buffers, transitively."""
    reached = set(sources)
    for op in ops:
        if any(x.buffer in reached for x in op.tensor_inputs):
            reached.add(op.id)
    return reached - sources


def _gradient_name(program: Program, g: Op, b_ops: Sequence[Op], read_by_a: set[str]) -> str | None:
    """``grad of params['w1']``: the input of A that ``g`` updates elementwise, if one is found.

    Follows B's pointwise ops of ``g``'s size from ``g``; the inputs of that size they read (or
    update in place) that A reads too are the parameter ``g`` is the gradient of."""
    numel = g.out.numel
    front = {g.id}
    by_buffer = {i.value.buffer: k for k, i in enumerate(program.inputs)}
    b_by_id = {op.id: op for op in b_ops}
    candidates: list[int] = []

    def collect(op: Op, depth: int) -> None:
        """Inputs of ``g``'s size that ``op`` reads, directly or through pointwise ops of that size
        (``p * (1 - lr * wd) - lr * update`` reads ``p`` one op back)."""
        for x in op.tensor_inputs:
            if x.numel != numel:
                continue
            k = by_buffer.get(x.buffer)
            if k is not None:
                if x.buffer in read_by_a and k not in candidates:
                    candidates.append(k)
            elif depth and x.buffer in b_by_id and x.buffer not in front and b_by_id[x.buffer].family == "pointwise":
                collect(b_by_id[x.buffer], depth - 1)

    for op in b_ops:
        if op.family != "pointwise" or op.out.numel != numel:
            continue
        if not any(x.buffer in front and x.numel == numel for x in op.tensor_inputs):
            continue
        front.add(op.id)
        collect(op, 2)
    for u in program.updates:
        buf = program.inputs[u.input_index].value.buffer
        if u.value.buffer in front and buf in read_by_a and u.input_index not in candidates:
            candidates.append(u.input_index)
    if len(candidates) == 1:
        return f"grad of {program.inputs[candidates[0]].name}"
    return None


def _batch_arguments(program: Program, args: list, leaf_buffers: list[list[str]], read_by_a: set[str],
                     read_by_b: set[str], batch: Sequence[int] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(batch_args, checked)``: the positional arguments that hold each rank's local batch (``batch``, checked,
    or derived: see :func:`split_at_gradients`), and the flat input indices only A reads whose leading dimension
    is not the batch's (the first call checks they are equal on every rank). Raises :class:`DistributedError`
    ``bad-batch`` for a ``batch`` index that is not an argument or whose leaves the update reads."""
    if batch is None:
        # the arguments only A reads whose leaves share one leading (batch) dimension, the most common one
        # among them: a frozen or target network that only the forward reads is replicated state
        only_a = [a for a, bufs in enumerate(leaf_buffers)
                  if bufs and any(b in read_by_a for b in bufs) and not any(b in read_by_b for b in bufs)]
        leading = {}
        for a in only_a:
            dims = {program.inputs[i].value.shape[0] if program.inputs[i].value.shape else None for i in args[a]}
            if len(dims) == 1 and None not in dims:
                leading[a] = dims.pop()
        counts = [list(leading.values()).count(d) for d in leading.values()]
        common = max(zip(counts, leading.values()))[1] if leading else None
        batch_args = tuple(a for a in only_a if leading.get(a, -1) == common)
        # only A reads them but their leading dim is not the batch's: state (a frozen network) or a batch the
        # guess missed; the first call checks they are equal on every rank instead of broadcasting over them
        checked = tuple(i for a in only_a if a in leading and a not in batch_args for i in args[a])
    else:
        checked = ()
        batch_args = tuple(int(a) for a in batch)
        for a in batch_args:
            if not 0 <= a < len(args):
                raise DistributedError("bad-batch", f"batch={tuple(batch)} names argument {a}, but the step takes "
                                                    f"{len(args)} positional arguments",
                                       hint="pass the positional indices of the arguments that hold the local batch")
            hit = next((b for b in leaf_buffers[a] if b in read_by_b), None)
            if hit is not None:
                name = next(i.name for i in program.inputs if i.value.buffer == hit)
                raise DistributedError(
                    "bad-batch", f"batch names argument {a}, but the update reads (or writes) its leaf {name}: "
                                 "it is state every rank must hold equal, not a per-rank batch",
                    hint="list only the arguments with the data (x, y, tokens) in batch=, or leave batch=None")
    return batch_args, checked


def split_at_gradients(program: Program, *, loss_index: int | None = None, batch: Sequence[int] | None = None,
                       local_values: str = "error", average_loss: bool = True) -> GradientSplit:
    """Cut ``program`` (a captured step) into forward + backward (A) and the update (B).

    Parameters
    ----------
    program
        The captured program (:meth:`tkx.CapturedGraph.lower`), before the passes: its op regions
        (``forward``/``backward``/``optimizer``) locate the cut.
    loss_index
        Flat index of the loss among the outputs (:attr:`tkx.CapturedGraph.loss_index`).
    batch
        Positional argument indices that hold each rank's local batch. ``None``: derived, the
        arguments that A reads and B neither reads nor updates (``x``, ``y``, ``tokens``...) whose
        tensors share one leading dimension (the most common one among them; a target network that
        only the forward reads is not batch).
    local_values
        What to do with a forward value the update reads that depends on the batch (batch-norm
        running statistics): ``"error"`` (default: raise), ``"average"`` (average it over the ranks)
        or ``"local"`` (each rank keeps its own, like DDP with ``broadcast_buffers=False``).
    average_loss
        Average the loss output over the ranks (default), so each rank returns the global loss.

    Raises
    ------
    DistributedError
        ``no-gradient`` when no value made by the backward pass reaches the update or the outputs
        (no ``torch.func.grad`` in the step); ``batch-statistic`` for a forward value of the local
        batch that the update reads (names its op and line); ``integer-gradient``; ``bad-batch`` for
        a ``batch`` index that is not an argument or whose leaves the update reads.
    """
    if local_values not in LOCAL_VALUES:
        raise DistributedError("bad-input", f"local_values={local_values!r}",
                               hint=f"pass one of {', '.join(map(repr, LOCAL_VALUES))}")
    ops = program.ops
    producers = program.producers
    backward = {op.id for op in ops if op.region == "backward"}
    if not backward:
        raise DistributedError(
            "no-gradient", f"{program.name} computes no gradient: no op of the step comes from a backward pass, so "
                           "there is nothing to average over the ranks",
            hint="take the gradients with torch.func.grad_and_value(loss_fn)(params, ...) inside the step and "
                 "update the parameters from them")
    in_a = ancestors(program.producers, {op.id for op in ops if op.region in ("forward", "backward")})
    # ops no output or update needs (e.g. the indices of a max whose values alone are used) are dead
    # code: they must not pull forward values across the cut
    live = ancestors(program.producers, {v.buffer for v in program.sinks()})
    a_ops = [op for op in ops if op.id in in_a]
    b_ops = [op for op in ops if op.id not in in_a and op.id in live]

    # -- the cut: A's buffers that B, the outputs or the updates read --------------------------------
    read_by: dict[str, set[str]] = {}
    for op in b_ops:
        for x in op.tensor_inputs:
            if x.buffer in in_a:
                read_by.setdefault(x.buffer, set()).add("update")
    for u in program.updates:
        if u.value.buffer in in_a:
            read_by.setdefault(u.value.buffer, set()).add("update")
    loss_buffer = None
    for k, o in enumerate(program.outputs):
        if o.value.buffer in in_a:
            read_by.setdefault(o.value.buffer, set()).add("output")
            if k == loss_index:
                loss_buffer = o.value.buffer
    order = {op.id: k for k, op in enumerate(ops)}
    cut_buffers = sorted(read_by, key=order.__getitem__)

    # -- which inputs are the batch ------------------------------------------------------------------
    args = _arg_leaves(program.in_tree, len(program.inputs))
    read_by_a = {x.buffer for op in a_ops for x in op.tensor_inputs}
    read_by_b = {x.buffer for op in b_ops for x in op.tensor_inputs} | \
                {program.inputs[u.input_index].value.buffer for u in program.updates} | \
                {o.value.buffer for o in program.outputs}
    leaf_buffers = [[program.inputs[i].value.buffer for i in r] for r in args]
    batch_args, checked = _batch_arguments(program, args, leaf_buffers, read_by_a, read_by_b, batch)
    batch_inputs = tuple(i for a in batch_args for i in args[a])
    replicated = tuple(i for a, r in enumerate(args) if a not in batch_args for i in r)
    of_batch = _depends_on(program, a_ops, {program.inputs[i].value.buffer for i in batch_inputs})

    # -- classify ----------------------------------------------------------------------------------------
    cut: list[CutValue] = []
    for k, buf in enumerate(cut_buffers):
        op = producers[buf]
        readers = tuple(sorted(read_by[buf], reverse=True))
        if op.region == "backward":
            if op.out.dtype not in FLOAT_DTYPES:
                raise DistributedError("integer-gradient", f"the update reads the {op.out.dtype} value {buf} of the "
                                                           "backward pass, which cannot be averaged over the ranks",
                                       op=op.kind, node=op.fx_node, source=op.source,
                                       hint="only floating-point gradients can be all-reduced")
            name = _gradient_name(program, op, b_ops, read_by_a) or f"gradient {buf}"
            kind, reduce = "gradient", "average"
        elif buf == loss_buffer:  # an update that reads the loss (a loss-scaled step) reads the global one
            kind, name = "loss", "loss"
            reduce = "average" if average_loss or "update" in readers else "none"
        elif "update" not in readers:
            kind, reduce, name = "local", "none", next(o.name for o in program.outputs if o.value.buffer == buf)
        elif buf not in of_batch:
            kind, reduce, name = "replicated", "none", buf
        else:
            if local_values == "error":
                raise DistributedError(
                    "batch-statistic",
                    f"the update reads {buf} ({c_type(op)}, made by a {op.kind} op), a forward value computed from "
                    "the local batch, not a "
                    "gradient: with data parallelism each rank would update its state from its own batch (batch-norm "
                    "running statistics are the usual case)",
                    op=op.kind, node=op.fx_node, source=op.source,
                    hint="pass local_values='average' to average it over the ranks (for a mean over equal local "
                         "batches that is the global mean; a variance is not), or local_values='local' to keep each "
                         "rank's own (as DDP with broadcast_buffers=False); note the forward pass itself normalises "
                         "with local batch statistics either way, as torch's BatchNorm does without SyncBatchNorm")
            kind, name = "batch-statistic", buf
            reduce = "average" if local_values == "average" else "none"
            if op.out.dtype not in FLOAT_DTYPES and reduce == "average":
                raise DistributedError("batch-statistic", f"local_values='average' but {buf} is {op.out.dtype}",
                                       op=op.kind, node=op.fx_node, source=op.source,
                                       hint="use local_values='local' for integer values")
        cut.append(CutValue(k, buf, name, kind, reduce, op.out.shape, op.out.dtype, op.region, op.source, readers))
    if not any(c.kind == "gradient" for c in cut):
        raise DistributedError(
            "no-gradient", f"no value of {program.name}'s backward pass reaches its update or its outputs, so there "
                           "is no gradient boundary to all-reduce at",
            hint="update the parameters from the gradients of torch.func.grad_and_value (or return them)")

    # -- the two programs ------------------------------------------------------------------------------
    roots = {buf: TensorSpec.dense(buf, producers[buf].out.shape, producers[buf].out.dtype) for buf in cut_buffers}
    a = Program(
        inputs=tuple(InputSpec(i.name, i.value, False) for i in program.inputs),
        ops=tuple(a_ops),
        outputs=tuple(OutputSpec(c.name if c.kind != "local" else f"{c.name} (local)", roots[c.buffer]) for c in cut),
        updates=(), name=f"{program.name}.forward_backward", in_tree=program.in_tree, out_tree=None,
        modules=program.modules, rng_input=program.rng_input)
    b = Program(
        inputs=program.inputs + tuple(InputSpec(f"{c.name} ({'averaged' if c.reduce == 'average' else 'local'})",
                                                roots[c.buffer]) for c in cut),
        ops=tuple(b_ops), outputs=program.outputs, updates=program.updates,
        name=f"{program.name}.update", in_tree=None, out_tree=program.out_tree, modules=program.modules)
    validate(a)
    validate(b)
    return GradientSplit(program, a, b, tuple(cut), batch_args, batch_inputs, replicated, checked)
