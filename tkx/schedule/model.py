"""The data model of a fused schedule (what :func:`tkx.schedule.schedule` returns).

Vocabulary
----------
* A **group** (schedule entry) is one unit of generated code: a GEMM with its epilogue, a
  reduction with its fused producers, a pointwise loop, or a copy. It *computes* a set of
  IR ops, of which some are **stored** (materialised in memory) and the rest are
  **inlined** (recomputed in registers wherever they are read).
* A **stage** is a set of groups with no dependencies between them; the work items of all
  its groups are spread over the blocks of the grid. Consecutive stages are separated by a
  **barrier** (``__syncthreads`` in one-block mode, a grid barrier otherwise).
* Every stored value has a **home**: the arena (workspace), a program output tensor, or -
  for in-place state updates proven safe - the user's input tensor itself.

Everything here is plain frozen data so that renderers, the arena planner, the schedule
interpreter and the code generator read the same decisions.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import display
from ..errors import UnknownOpError
from ..ir import OPS, Op, Program, TensorSpec
from ..words import plural

#: Group kinds.
GROUP_KINDS = ("gemm", "gemm_partial", "reduction", "reduction_partial", "pointwise", "copy", "attention",
               "attention_partial")


@dataclass(frozen=True)
class Home:
    """Where a stored value lives.

    ``kind`` is ``"arena"`` (a slot of the workspace, placed by the arena planner),
    ``"output"`` (``index`` = position in ``program.outputs``) or ``"input"`` (``index`` =
    position in ``program.inputs``: an in-place update written directly).
    """

    kind: str
    index: int = -1

    def __str__(self) -> str:
        return "arena" if self.kind == "arena" else f"{self.kind}[{self.index}]"


@dataclass(frozen=True)
class FusionDecision:
    """One fusion candidate and what became of it.

    ``kind`` is ``"inline"`` (producer computed inside its consumer), ``"epilogue"``
    (pointwise consumer applied to a GEMM tile) or ``"side_output"`` (value stored from the
    same GEMM tile), ``"split-k"`` (where a split-K GEMM adds its slices: ``fused`` when the last
    slice of each tile does, ``Options.split_k_final``). ``code`` is a stable reason code
    (e.g. ``"multi-use"``) and ``reason`` a sentence for users ("not fused: producer has 3
    consumers"). ``rule`` names the rule that decided.
    """

    kind: str
    producer: str
    consumer: str
    fused: bool
    rule: str
    code: str
    reason: str

    @property
    def sentence(self) -> str:
        """The decision as one sentence: what was (not) fused, why, and which rule said so
        (``"mul is not inlined into mm_2: a GEMM re-reads ... (rule gemm-operand, code gemm-operand)."``)."""
        p, c = self.producer, self.consumer
        what = {
            "inline": f"{p} is {'' if self.fused else 'not '}inlined into {c}",
            "epilogue": f"{c} {'runs' if self.fused else 'does not run'} in the epilogue of {p}",
            "side_output": f"{c} is {'' if self.fused else 'not '}stored from the tile of {p}",
            "loop": f"{p} and {c} {'share' if self.fused else 'do not share'} one loop",
            "row": f"{c} {'joins' if self.fused else 'does not join'} the row pass of {p}",
            "in-place": f"{c} is {'written in place into' if self.fused else 'staged, then copied into'} {p}",
            "split-k": (f"the split-K final of {p} runs in the last slice of each tile of {c}" if self.fused
                        else f"the split-K final of {p} is a group of its own ({c}), a stage after its slices"),
            "attention": f"the attention {c} {p} "
                         + ("is expanded to its math" if not self.fused else
                            "runs as flash-decoding (a group over KV tiles, then a combine)" if "KV tile" in self.reason
                            else "runs as one fused FlashAttention group"),
        }.get(self.kind, f"{self.kind} {p} -> {c}: {'fused' if self.fused else 'not fused'}")
        why = self.reason
        for prefix in ("not fused: ", "fused: ", "written in place: ", "staged commit: "):
            if why.startswith(prefix):
                why = why[len(prefix):]
                break
        return f"{what}: {why} (rule {self.rule}, code {self.code})."

    def __str__(self) -> str:
        return self.sentence

    def __repr__(self) -> str:
        return f"<FusionDecision {self.sentence}>"


class Decisions(list):
    """A list of :class:`FusionDecision` that prints as sentences, one per line (what
    :meth:`FusedSchedule.why_not_fused` returns; a plain ``list`` otherwise)."""

    def __str__(self) -> str:
        if not self:
            return "no decision"
        return "\n".join(f"{i}. {d.sentence}" for i, d in enumerate(self, 1))

    def __repr__(self) -> str:
        return plural(len(self), "decision") + (":\n" + str(self) if self else "")


@dataclass(frozen=True)
class Group:
    """One schedule entry (a unit of generated code).

    * ``id``: stable name (``g3``), ``kind``: one of :data:`GROUP_KINDS`;
    * ``anchor``: id of the op that defines the group's *iteration domain* (the GEMM, the
      reduction, or the first pointwise op); the domain is ``anchor.out.shape``;
    * ``ops``: ids of the *domain ops*, in evaluation order: the anchor first, then
      pointwise ops of the same shape that read earlier domain ops through identity
      views (GEMM/reduction epilogues, multi-output pointwise loops). At every domain
      point each is computed once and kept in a register;
    * ``inlined``: ids of ops recomputed on demand inside this group (at coordinates
      obtained by mapping the reading view's linear index back onto the producer's
      shape); never stored by this group;
    * ``stores``: the subset of ``ops`` written to memory (homes in
      :attr:`FusedSchedule.homes`), or scratch buffer names for ``reduction_partial``;
    * ``reads``: root buffers this group reads from memory;
    * ``work_items``: how many independent work items (tiles, row blocks, chunks) it has;
    * ``flops`` and ``bytes``: cost estimates (floating-point ops; bytes read + written).
    * ``plan``: the emitter's typed plan (:class:`tkx.target.GemmPlan`, :class:`~tkx.target.ReductionPlan`,
      :class:`~tkx.target.PointwisePlan` or :class:`~tkx.target.CopyPlan`) with the variant, why it was
      chosen, tile sizes and split factors; it reads like a mapping of its fields. ``params`` is the
      same object (the name older code used).
    """

    id: str
    kind: str
    anchor: str
    ops: tuple[str, ...]
    stores: tuple[str, ...]
    reads: tuple[str, ...]
    inlined: tuple[str, ...] = ()
    work_items: int = 1
    flops: int = 0
    bytes: int = 0
    plan: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def params(self) -> Mapping[str, Any]:
        """The plan (:attr:`plan`), read as a mapping of its fields."""
        return self.plan


@dataclass(frozen=True)
class Barrier:
    """The barrier before stage ``stage``: why it is needed (hazards) and its kind."""

    stage: int
    kind: str
    hazards: tuple[str, ...]


@dataclass(frozen=True)
class CopyTask:
    """A copy group's payload: ``src`` view -> ``dst_home`` (a program output or input)."""

    src: TensorSpec
    dst_home: Home


@dataclass(frozen=True)
class FusedSchedule(display.Views):
    """The fused schedule of a program.

    * ``program``: the (optimised) Program scheduled;
    * ``groups``: id -> :class:`Group`, ``stages``: tuple of tuples of group ids;
    * ``barriers``: one per stage after the first;
    * ``inlined``: ids of ops computed in registers (never stored);
    * ``homes``: stored op id -> :class:`Home`;
    * ``copies``: copy group id -> its payload (:class:`CopyTask`: outputs that are views of other
      values or of inputs, and staged commits of in-place state updates);
    * ``scratch``: synthetic buffers (two-phase reduction partials) -> bytes (float32);
    * ``decisions``: every fusion candidate with its decision and reason;
    * ``mode``: ``"block"`` or ``"grid"``, ``mode_reason``: why;
    * ``blocks``: the grid size the schedule would like (the runtime caps it by occupancy),
      ``threads``: threads per block;
    * ``options``: the :class:`tkx.Options` used; ``arch``: the architecture the emitters
      were chosen for (``sm_80`` portable code, or ``sm_90a`` with wgmma GEMMs).
    """

    program: Program
    groups: Mapping[str, Group]
    stages: tuple[tuple[str, ...], ...]
    barriers: tuple[Barrier, ...]
    inlined: frozenset[str]
    homes: Mapping[str, Home]
    copies: Mapping[str, CopyTask]
    scratch: Mapping[str, int]
    decisions: tuple[FusionDecision, ...]
    mode: str
    mode_reason: str
    blocks: int
    threads: int
    options: Any = field(compare=False)
    arch: str = "sm_80"

    def op(self, op_id: str) -> Op:
        """The op ``op_id`` of :attr:`program`; :class:`~tkx.errors.UnknownOpError` (a ``KeyError``)
        explaining an op kind, a printer name (``%25``) or a typo otherwise."""
        try:
            return self.program.op(op_id)
        except KeyError:
            raise self._unknown(op_id) from None

    def _unknown(self, op_id: Any) -> UnknownOpError:
        return unknown_op_error(self.program, op_id, f"schedule {self.program.name}", self.groups)

    def _check_op(self, op_id: Any) -> None:
        self.op(op_id)  # raises the explaining UnknownOpError

    def group_of(self, op_id: str) -> Group:
        """The group that computes ``op_id`` and stores it (or the first that inlines it)."""
        self._check_op(op_id)
        for g in self.groups.values():
            if op_id in g.stores:
                return g
        for g in self.groups.values():
            if op_id in g.ops:
                return g
        for g in self.groups_in_order():
            if op_id in g.inlined:
                return g
        raise UnknownOpError(f"op {op_id!r} is computed by no group of schedule {self.program.name}")

    def stage_of(self, group_id: str) -> int:
        for i, stage in enumerate(self.stages):
            if group_id in stage:
                return i
        raise KeyError(group_id)

    @property
    def epilogue(self) -> dict[str, tuple[str, ...]]:
        """GEMM group id -> its epilogue op ids (domain ops after the GEMM)."""
        return {g.id: g.ops[1:] for g in self.groups.values() if g.kind == "gemm"}

    def why_not_fused(self, op_id: str | None = None) -> Decisions:
        """Decisions that did not fuse (optionally only those involving ``op_id``, an op id of
        :attr:`program`: another name raises :class:`~tkx.errors.UnknownOpError`). A list of
        :class:`FusionDecision` that prints as numbered sentences."""
        if op_id is not None:
            self._check_op(op_id)
        return Decisions(d for d in self.decisions if not d.fused and
                         (op_id is None or op_id in (d.producer, d.consumer)))

    def groups_in_order(self) -> list[Group]:
        """Groups stage by stage."""
        return [self.groups[g] for stage in self.stages for g in stage]

    @property
    def num_barriers(self) -> int:
        return len(self.barriers)

    @property
    def materialized(self) -> tuple[str, ...]:
        return tuple(s for g in self.groups.values() for s in g.stores)

    # -- views, looked up in tkx.display (tkx.render registers them) ----------------------
    def graph(self, **kw: Any) -> Any:
        """A ``graphviz.Digraph``: one cluster per group, ordered by stage, barriers between;
        ``collapse="auto"|"none"|"group"|"stage"`` and ``expand=(stage index or group id, ...)``
        (see :func:`tkx.render.schedule.schedule_graph`): a big schedule is collapsed by default."""
        return display.graph(self, **kw)

    def diff(self, other: FusedSchedule) -> Any:
        """A :class:`~tkx.diff.StageDiff` (computed in :mod:`tkx.schedule.diff`): groups
        added/removed/changed (matched by anchor op), decisions flipped, counts."""
        return display.diff(self, other)


def _few(names: Iterable[str], n: int = 8) -> str:
    names = list(names)
    more = f", ... ({len(names)} in all)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def unknown_op_error(program: Program, name: Any, where: str, groups: Mapping[str, Any] | None = None,
                     groups_ok: bool = False) -> UnknownOpError:
    """The error for ``name``, not an op id of ``program``, saying what it is instead.

    ``where`` names the object asked (``"schedule digits_mlp"``). ``name`` may be an op kind
    (its ops are listed), a printer name such as ``%25`` (mapped to the op :mod:`tkx.printer`
    names so), a group id of ``groups``, a program input, or a typo (close op ids are
    suggested). ``groups_ok``: group ids are valid too (a few are listed). One helper for
    :class:`FusedSchedule` lookups and :meth:`tkx.codegen.CudaSource.lines_of`.
    """
    ids = [o.id for o in program.ops]
    groups = dict(groups or {})
    head = f"no {'op or group' if groups_ok else 'op'} {name!r} in {where}; "
    inputs = {i.value.buffer: i.name for i in program.inputs}
    inputs.update({i.name: i.name for i in program.inputs})
    if not isinstance(name, str):
        tail = f"op ids are strings: {_few(ids)}"
    elif any(o.kind == name for o in program.ops):
        tail = f"{name!r} is an op kind: its ops are {_few(o.id for o in program.ops if o.kind == name)} (use an op id)"
    elif name in OPS:
        tail = f"{name!r} is an op kind, but no op of this program has it (op ids: {_few(ids)})"
    elif name.startswith("%"):
        from ..printer import Namer
        printed = Namer(program).names
        buf = {k: b for b, k in printed.items()}.get(name)
        buf = name[1:] if buf is None and name[1:] in ids else buf
        pre = "IR value numbers are printer names: " if name[1:].isdigit() else ""
        if buf in ids:
            tail = f"{pre}{name!r} is the printer's name of op {buf!r} in this program (use the op id {buf!r})"
        elif buf is not None:
            tail = f"{pre}{name!r} is the printer's name of input {inputs[buf]}, not an op"
        else:
            example = f" (op {ids[0]!r} prints as {printed[ids[0]]!r})" if ids else ""
            tail = (f"IR value names like {name!r} are printer names, not op ids, and no value of this program "
                    f"prints so{example}; use an op id such as {_few(ids, 4)}")
    elif name in groups and not groups_ok:
        tail = f"{name!r} is a group id: its ops are {_few(groups[name].ops) or 'none'} (use an op id)"
    elif name in inputs:
        tail = f"{name!r} is a program input, not an op"
    else:
        close = difflib.get_close_matches(name, ids + (list(groups) if groups_ok else []), n=3)
        tail = (f"did you mean {' or '.join(map(repr, close))}?" if close
                else f"op ids are names such as {_few(ids)}")
    if groups_ok:
        tail += f"{'' if tail.endswith('?') else '.'} Group ids: {_few(groups)}"
    return UnknownOpError(head + tail)


def _schedule_str(self: FusedSchedule) -> str:
    from .text import format_schedule
    return format_schedule(self)


def _schedule_repr(self: FusedSchedule) -> str:
    return (f"<tkx.FusedSchedule {self.program.name}: {plural(len(self.groups), 'group')}, "
            f"{plural(len(self.stages), 'stage')}, {plural(self.num_barriers, 'barrier')}, mode={self.mode}, "
            f"{self.blocks}x{self.threads}>")


FusedSchedule.__str__ = _schedule_str  # type: ignore[method-assign]
FusedSchedule.__repr__ = _schedule_repr  # type: ignore[method-assign]
