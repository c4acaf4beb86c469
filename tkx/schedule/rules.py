"""Fusion rules: small, named, inspectable policies that decide each fusion candidate.

A candidate is a producer/consumer pair the scheduler could fuse (``inline``: compute the
producer inside its consumer; ``epilogue``: apply a pointwise consumer to a GEMM or
reduction result in registers; ``loop``: compute a same-shaped pointwise consumer in the
same elementwise loop and store both). Legality (shapes, identity access, dependency
order) is checked by the scheduler before any rule sees a candidate; rules only express
*policy*, so a user rule can never make the schedule wrong.

Rules are asked in order - user rules first, then :data:`BUILTIN_RULES` - and the first
that returns a :class:`Verdict` decides. If none objects, the candidate is fused.

Add a rule from a notebook cell::

    @tkx.fusion_rule("keep-softmax-separate", kinds=("inline",))
    def keep_softmax(c):
        if c.producer.kind == "exp":
            return tkx.keep("user", "not fused: I want exp materialised")
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ops
from ..errors import TkxError
from ..ir import Op, Program, TensorSpec, ancestors
from ..target import SKINNY_MAX, row_threads
from ..watchdog import UserCodeTimeout, user_code

#: Kinds the op table marks as transcendental (their cost class): recomputed only when needed.
TRANSCENDENTAL = ops.TRANSCENDENTAL
CANDIDATE_KINDS = ("inline", "epilogue", "loop", "row")


@dataclass(frozen=True)
class Verdict:
    """A rule's answer: fuse or not, a stable reason ``code`` and a sentence."""

    fuse: bool
    code: str
    reason: str


def fuse(code: str, reason: str) -> Verdict:
    """Verdict: fuse this candidate."""
    return Verdict(True, code, reason)


def keep(code: str, reason: str) -> Verdict:
    """Verdict: do not fuse (keep the producer materialised / the groups apart)."""
    return Verdict(False, code, reason)


@dataclass(frozen=True)
class Candidate:
    """A fusion candidate shown to rules.

    ``kind``: ``inline``/``epilogue``/``loop``; ``producer``/``consumer``: the two ops;
    ``view``: how the consumer reads the producer; ``consumers``: number of ops reading
    the producer; ``program`` and ``options`` for context; ``cost``: ops recomputed per
    element if inlined (the producer's inline expression size).
    """

    kind: str
    producer: Op
    consumer: Op
    view: TensorSpec | None
    consumers: int
    cost: int
    program: Program
    options: Any


@dataclass(frozen=True)
class FusionRule:
    """A named policy: ``decide(candidate) -> Verdict | None`` for candidate ``kinds``."""

    name: str
    kinds: tuple[str, ...]
    decide: Callable[[Candidate], Verdict | None]
    doc: str = ""

    def __call__(self, c: Candidate) -> Verdict | None:
        return self.decide(c) if c.kind in self.kinds else None


# -- built-in policies -----------------------------------------------------------------

def _switches(c: Candidate) -> Verdict | None:
    o = c.options
    if c.kind == "epilogue" and not o.fuse_epilogues:
        return keep("option-off", "not fused: fuse_epilogues is off")
    if c.kind == "inline" and c.consumer.family == "reduction" and not o.fuse_reductions:
        return keep("option-off", "not fused: fuse_reductions is off")
    if c.kind in ("inline", "loop") and not o.fuse_pointwise and c.producer.family == "pointwise":
        return keep("option-off", "not fused: fuse_pointwise is off")
    if c.kind == "row" and not getattr(o, "fuse_rows", True):
        return keep("option-off", "not fused: fuse_rows is off")
    return None


def _skinny_long_operand(c: Candidate) -> bool:
    """The producer is the long operand of a skinny matrix product (the GEMV emitters' domain:
    ``min(M, N) <= SKINNY_MAX``), read only by it: each of its elements is loaded once per
    output, in the GEMV's operand load, so computing it there (a weight dequantised on the fly)
    costs no extra reads."""
    op = c.consumer
    a, b = (op.inputs[1], op.inputs[2]) if op.kind == "addmm" else (op.inputs[0], op.inputs[1])
    if not (isinstance(a, TensorSpec) and isinstance(b, TensorSpec)) or c.consumers != 1:
        return False
    m, n = a.shape[-2], b.shape[-1]
    if min(m, n) > SKINNY_MAX:
        return False
    long, short = (b, a) if m <= n else (a, b)
    return long.buffer == c.producer.id and short.buffer != c.producer.id


def _row_fits(c: Candidate) -> Verdict | None:
    from .rowshape import ROW_PER_LANE, row_key

    key = row_key(c.consumer) if c.consumer.family == "reduction" else None
    if key is not None:
        size = math.prod(key[0][d] for d in key[1])
        rows = math.prod(key[0]) // max(size, 1)
    elif c.producer.out.numel < c.consumer.out.numel:
        size = c.consumer.out.numel // max(c.producer.out.numel, 1)
        rows = c.producer.out.numel
    else:
        return fuse("row-persistent", f"fused: {c.consumer.kind} is computed in the row pass that holds "
                                      f"{c.producer.kind} in registers")
    per_row = row_threads(rows, size, c.options.threads_per_block)
    who = "one warp" if per_row == 32 else f"one block of {per_row} threads"
    if size > ROW_PER_LANE * per_row:
        return keep("row-too-long", f"not fused: a row of {size} elements does not fit in {who}'s registers "
                                    f"(at most {ROW_PER_LANE * per_row})")
    return fuse("row-persistent", f"fused: {who} keeps the row of {size} in registers; {c.consumer.kind} is "
                                  f"one more pass over it in the same work item, with no barrier")


def _gemm_operand(c: Candidate) -> Verdict | None:
    if c.consumer.family not in ("matmul", "attention"):
        return None
    if c.consumer.family == "matmul" and c.producer.family == "pointwise" and c.cost <= 16 \
            and _skinny_long_operand(c):
        return fuse("gemv-operand", f"fused: the GEMV loads each element of this operand once, so {c.producer.kind} "
                                    "is computed in its operand load (a weight dequantised on the fly)")
    if c.producer.family == "generator" or (c.producer.kind == "cast" and c.cost <= 1):
        return fuse("cheap-operand", f"fused: {c.producer.kind} is recomputed while loading GEMM tiles")
    return keep("gemm-operand", "not fused: a GEMM re-reads each operand element once per tile, "
                                "so the producer is materialised")


def _multi_use(c: Candidate) -> Verdict | None:
    if c.consumers <= 1:
        return None
    if c.producer.family == "generator":
        return fuse("cheap-recompute", "fused: a generator is cheaper to recompute than to load")
    if c.cost <= 2 and c.producer.kind not in TRANSCENDENTAL:
        return fuse("cheap-recompute", f"fused: recomputing {c.cost} cheap op(s) per element "
                                       f"in each of {c.consumers} consumers beats a store and reloads")
    return keep("multi-use", f"not fused: producer has {c.consumers} consumers "
                             f"and costs {c.cost} op(s) per element to recompute")


def short_operand_of(op: Op) -> TensorSpec | None:
    """The short operand of a skinny matrix product (``min(M, N) <= SKINNY_MAX``: the GEMV emitters), or None."""
    if op.family != "matmul":
        return None
    a, b = (op.inputs[1], op.inputs[2]) if op.kind == "addmm" else (op.inputs[0], op.inputs[1])
    if not (isinstance(a, TensorSpec) and isinstance(b, TensorSpec)):
        return None
    m, n = a.shape[-2], b.shape[-1]
    if min(m, n) > SKINNY_MAX:
        return None
    return a if m <= n else b


def _matmuls_behind(program_ops: dict[str, Op], bufs: list[str]) -> set[str]:
    """The matrix products reached from ``bufs`` backwards through pointwise producers (each included)."""
    out: set[str] = set()
    stack, seen = list(bufs), set()
    while stack:
        b = stack.pop()
        if b in seen or b not in program_ops:
            continue
        seen.add(b)
        op = program_ops[b]
        if op.family == "matmul":
            out.add(b)
        elif op.family in ("pointwise", "generator"):
            stack.extend(x.buffer for x in op.tensor_inputs)
    return out


def _ancestors(program_ops: dict[str, Op], op_id: str) -> set[str]:
    """The buffers ``op_id`` is computed from (itself excluded)."""
    return ancestors(program_ops, (x.buffer for x in program_ops[op_id].tensor_inputs))


def sibling_gemm(program: Program, producer: Op, consumer: Op) -> tuple[str, str] | None:
    """``(other GEMM, consumer GEMV)`` when epilogue candidate ``consumer`` of a GEMM (``producer`` is the
    GEMM or the end of its epilogue) also reads another GEMM's result, through pointwise producers, that
    neither depends on nor is depended on by the producer's GEMM, and ``consumer`` (not transcendental) is
    read only as the short operand of a skinny GEMM: SwiGLU's ``silu(x @ Wg.T) * (x @ Wu.T)`` before the down
    projection of a decode step. In the epilogue the GEMM would wait for its sibling (one stage each)."""
    if consumer.kind in TRANSCENDENTAL:
        return None
    prog = {op.id: op for op in program.ops}
    readers = [op for op in program.ops if any(x.buffer == consumer.id for x in op.tensor_inputs)]
    if len(readers) != 1 or any(v.buffer == consumer.id for v in program.sinks()):
        return None
    short = short_operand_of(readers[0])
    if short is None or short.buffer != consumer.id:
        return None
    mine = _matmuls_behind(prog, [producer.id])
    others = _matmuls_behind(prog, [x.buffer for x in consumer.tensor_inputs if x.buffer != producer.id]) - mine
    behind_mine = {m: _ancestors(prog, m) for m in mine}
    for other in sorted(others):
        behind = _ancestors(prog, other)
        if all(m not in behind and other not in behind_mine[m] for m in mine):
            return other, readers[0].id
    return None


def _sibling_gemms(c: Candidate) -> Verdict | None:
    found = sibling_gemm(c.program, c.producer, c.consumer)
    if found is None:
        return None
    other, gemv = found
    return keep("sibling-gemms", f"not fused: {c.consumer.kind} also reads {other}, a GEMM independent of this "
                                 f"one, which would wait for it here; {c.consumer.id} is computed in the "
                                 f"short-operand load of the GEMV {gemv} instead, so both GEMMs share a stage")


def _deep_inline(c: Candidate) -> Verdict | None:
    if c.cost > 24:
        return keep("too-deep", f"not fused: the inline expression would have {c.cost} ops")
    return None


BUILTIN_RULES: tuple[FusionRule, ...] = (
    FusionRule("option-switches", CANDIDATE_KINDS, _switches, "honour fuse_* options"),
    FusionRule("gemm-operand", ("inline",), _gemm_operand,
               "only cheap casts/generators feed GEMM and fused attention tiles (and any short chain the long "
               "operand of a GEMV)"),
    FusionRule("multi-use", ("inline",), _multi_use, "recompute multi-use producers only when cheap"),
    FusionRule("expression-size", ("inline",), _deep_inline, "bound inline expression size"),
    FusionRule("row-fits", ("row",), _row_fits, "row-persistent fusion only when the row fits in registers (16 "
                                                "values per thread of a warp, or of the block for a few long rows)"),
    FusionRule("sibling-gemms", ("epilogue",), _sibling_gemms,
               "an epilogue reading an independent GEMM moves into its consumer GEMV's short-operand load, so the "
               "two GEMMs share a stage"),
)

_USER_RULES: dict[str, FusionRule] = {}


def fusion_rule(name: str | Callable[[Candidate], Verdict | None] | None = None, *,
                kinds: tuple[str, ...] | str = CANDIDATE_KINDS, replace: bool = False):
    """Decorator: register a user fusion rule ``fn(candidate) -> Verdict | None``.

    Use as ``@fusion_rule("name", kinds=("inline",))`` or bare ``@fusion_rule`` (the function's
    name is the rule's). User rules are asked before the built-in ones. Raises
    :class:`TkxError` if ``name`` is taken (pass ``replace=True`` to redefine it, e.g. when
    re-running a notebook cell) or ``kinds`` names an unknown candidate kind.
    """
    if callable(name):  # bare @fusion_rule
        fn = name
        return fusion_rule(fn.__name__, kinds=kinds, replace=replace)(fn)
    if isinstance(kinds, str):
        kinds = (kinds,)
    if name is not None and not isinstance(name, str):
        raise TkxError(f"fusion_rule: the name must be a string, got {type(name).__name__}")
    bad = [k for k in kinds if k not in CANDIDATE_KINDS]
    if bad:
        raise TkxError(f"fusion_rule {name!r}: unknown candidate kinds {bad}; allowed: {CANDIDATE_KINDS}")

    def register(fn: Callable[[Candidate], Verdict | None]) -> FusionRule:
        rule_name = name or fn.__name__
        if rule_name in _USER_RULES and not replace:
            raise TkxError(f"fusion rule {rule_name!r} already exists; pass replace=True to redefine it")
        rule = FusionRule(rule_name, tuple(kinds), fn, (fn.__doc__ or "").strip())
        _USER_RULES[rule_name] = rule
        return rule

    return register


def remove_fusion_rule(name: str) -> None:
    """Forget a user rule (no error if absent)."""
    _USER_RULES.pop(name, None)


def rules_fingerprint() -> tuple[tuple[str, int, tuple[str, ...]], ...]:
    """A value that changes whenever a user rule is registered, replaced or removed: ``(name,
    id(fn), kinds)`` per rule. :class:`tkx.Exploration` compares it to recompute stale schedules."""
    return tuple((n, id(r.decide), r.kinds) for n, r in _USER_RULES.items())


def user_rule_names() -> tuple[str, ...]:
    """Names of the registered user fusion rules, in registration order."""
    return tuple(_USER_RULES)


def active_rules(extra: tuple[FusionRule, ...] = (), enabled: tuple[str, ...] | None = None
                 ) -> tuple[FusionRule, ...]:
    """The rules in the order they are asked: ``extra``, user rules (only those named in
    ``enabled`` when it is given), built-ins."""
    users = tuple(r for n, r in _USER_RULES.items() if enabled is None or n in enabled)
    return tuple(extra) + users + BUILTIN_RULES


def judge(c: Candidate, rules: tuple[FusionRule, ...]) -> tuple[str, Verdict]:
    """(rule name, verdict) for a candidate; fused by default when no rule objects."""
    for rule in rules:
        try:
            if rule.name in _USER_RULES:
                with user_code(f"fusion rule {rule.name!r} (on {c.kind} candidate {c.producer.id} -> {c.consumer.id})"):
                    v = rule(c)
            else:
                v = rule(c)
        except UserCodeTimeout:
            raise
        except Exception as e:
            raise TkxError(f"fusion rule {rule.name!r} raised {type(e).__name__}: {e} (on {c.kind} candidate "
                           f"{c.producer.id} -> {c.consumer.id})") from e
        if v is None:
            continue
        if not isinstance(v, Verdict):
            raise TkxError(f"fusion rule {rule.name!r} returned {v!r}; return tkx.fuse(code, reason), "
                           f"tkx.keep(code, reason) or None (no opinion)")
        return rule.name, v
    return "default", fuse("legal", f"fused: {c.kind} of {c.producer.kind} into {c.consumer.kind}")
