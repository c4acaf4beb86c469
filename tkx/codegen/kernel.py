"""From a fused schedule and an arena plan to the CUDA source of one persistent kernel.

``generate(schedule, arena) -> CudaSource``. The kernel has one section per stage; the
groups of a stage share one grid-stride loop over their work items (so the whole grid
works on every stage), and consecutive stages are separated by a barrier
(``__syncthreads`` in one-block mode, the spin-limited grid barrier otherwise).

How a group reads a value (the same rules as the schedule interpreter):

* a *domain* op of the group read at the point being computed -> the register holding it;
* an *inlined* op read at the same point -> a statement computing it there (memoised);
* an inlined op read elsewhere (through a transposed/broadcast view, or inside a GEMM
  operand or a reduction's input) -> a call of its ``__device__`` function
  ``tkx_v_<op>(a, index)``, which recomputes it from memory at that linear index;
* anything else -> a load from its home (user input, output tensor or arena slot).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from .. import ops as optable
from ..arena import ArenaPlan
from ..dataflow.audit import audit_words
from ..dataflow.audit import layout as audit_layout
from ..dtypes import INT_DTYPES
from ..errors import TkxError
from ..schedule.model import FusedSchedule, Group
from ..target import register_budget, register_note
from . import abi
from . import ops as cops
from .cuda_prelude import (
    barrier,
    barrier_setup,
    grid_barrier_kind,
    prelude,
    shared_workspace,
)
from .gemm import tensormap_prefetch
from .kernel_attention import AttentionGroups
from .kernel_gemm import GemmGroups
from .kernel_groups import GroupEmitter
from .kernel_values import SPECIAL_POINTWISE, KernelPlan
from .outline import LDG_HELPERS, REPEATED_SHARE, Body, Outliner, call_text, function_text
from .source_map import source_map
from .text import block, indent

__all__ = ["generate", "KernelPlan"]


class _Emitter(GemmGroups, AttentionGroups, GroupEmitter):
    """The kernel emitter: every group kind's code (:class:`GroupEmitter`, :class:`GemmGroups`,
    :class:`AttentionGroups`) over the values and indices of :class:`ValueEmitter`."""


def _stage_loop(parts: list[tuple[Group, str, int]],
                paired: frozenset[str] | set[str] = frozenset()) -> tuple[str, list[tuple[int, str]]]:
    """One grid-stride loop over the work items of every group of a stage, and where each group's code
    starts in it (0-based line of its marker, group id). The groups in ``paired`` (items in pairs of a
    2-CTA cluster, each an even count) go first, so each pair's items are ``tkx_w`` = 2c and 2c + 1: the
    two CTAs of one cluster (the grid is a whole number of clusters)."""
    if paired and any(g.id in paired for g, _, _ in parts):
        parts = [x for x in parts if x[0].id in paired] + [x for x in parts if x[0].id not in paired]
    total = sum(n for _, _, n in parts)
    if len(parts) == 1:
        g, code, n = parts[0]
        return block(f"for (int item = blockIdx.x; item < {n}; item += gridDim.x) {{  // {g.id}: {n} items",
                     indent(code), "}"), [(0, g.id)]
    lines = [f"for (int tkx_w = blockIdx.x; tkx_w < {total}; tkx_w += gridDim.x) {{"
             f"  // {len(parts)} groups share the grid"]
    marks: list[tuple[int, str]] = []
    at = 1  # lines so far
    base = 0
    for j, (g, code, n) in enumerate(parts):
        cond = f"tkx_w < {base + n}"
        head = "if" if j == 0 else "} else if"
        if j == len(parts) - 1:
            lines.append("} else {" if j else f"if ({cond}) {{")
        else:
            lines.append(f"{head} ({cond}) {{")
        marks.append((at + 1, g.id))
        lines.append(indent(f"const int item = tkx_w - {base};  // {g.id}: {n} items", 1))
        lines.append(indent(code, 1))
        at += sum(x.count("\n") + 1 for x in lines[-3:])
        base += n
    lines.append("}")
    return block(lines[0], indent(block(lines[1:])), "}"), marks


def _sync_plan(s: FusedSchedule, arena: ArenaPlan, stage_code: list) -> tuple[str, str, Any, dict[str, int]]:
    """(sync, reason, task DAG or None, the emitters' work item count of each group): the DAG is built
    when counters or a timeline need it."""
    items = {g.id: n for _, parts in stage_code for g, _, n in parts}
    want_dag = getattr(s.options, "sync", "barrier") != "barrier" or getattr(s.options, "timeline", False)
    if not want_dag:
        return "barrier", "sync='barrier' (the default): a barrier between stages", None, items
    from ..dataflow import build
    from ..dataflow.cost import choose_sync

    dag = build(s, arena, work_items=items)
    sync, reason = choose_sync(dag, s.options, s.mode, s.blocks)
    return sync, reason, dag, items


def _tile_counter_base(sync: str, dag: Any) -> int:
    """Word of ``sync`` where the last-slice split-K tile counters start: past the dataflow counters
    (``sync="counters"``), else past the status words."""
    from .cuda_prelude import COUNTER_BASE
    return COUNTER_BASE + (len(dag.counters) if sync == "counters" else 0)


def _sync_words(sync: str, dag: Any, tile_counters: int = 0) -> int:
    if tile_counters:
        return _tile_counter_base(sync, dag) + tile_counters
    from .cuda_prelude import COUNTER_BASE

    return COUNTER_BASE + len(dag.counters) if sync == "counters" else 8


def _task_code(g: Group, code: str, dag: Any, counters: bool, timeline: bool, spin: int,
               audit_base: int | None = None) -> str:
    """A work item's code with its waits before and its counter bump (and timeline record) after.
    ``audit_base``: the first audit word (:mod:`tkx.dataflow.audit`) when the protocol is logged; the planted
    faults of ``dag`` (``skips``, ``unfenced``) select the broken forms of a wait and a publish."""
    pos = dag.order.index(g.id)
    base = sum(dag.items[x] for x in dag.order[:pos])
    pre: list[str] = []
    post: list[str] = []
    if timeline:
        pre.append("const unsigned long long tkx_ready = tkx_now();")
    if counters:
        sites = {(x, k): j for j, (x, k, _) in enumerate(audit_layout(dag))} if audit_base is not None else {}
        skippers = sorted(b for b, x in dag.skips if x == g.id)
        for k, w in enumerate(dag.waits[g.id]):
            prod = dag.counters[w.counter].group
            line = (f"if (!tkx_wait(sync, tkx_epoch, status, {w.counter}, {w.threshold}u, {pos}, item, "
                    f"{spin}ULL)) return;  // wait for {prod} ({w.threshold} tiles)")
            if audit_base is not None:
                word = audit_base + len(dag.counters) + 2 * sites[(g.id, k)]
                line = block(line, f"tkx_audit_wait(sync + {word}, {w.counter}, {w.threshold}u);  // log the wait")
            if skippers:
                cond = " && ".join(f"blockIdx.x != {b}" for b in skippers)
                line = block(f"if ({cond}) {{  // planted fault: block {', '.join(map(str, skippers))} skips "
                             "this wait", indent(line), "}")
            pre.append(line)
        c = dag.counter_of[g.id]
        if g.id in dag.unfenced:
            post.append(f"tkx_task_done_unfenced(sync, {c});  // planted fault: publish this tile of {g.id} "
                        "without a release fence")
        else:
            post.append(f"tkx_task_done(sync, {c});  // publish this tile of {g.id}")
            if audit_base is not None:
                post.append(f"tkx_audit_publish(sync + {audit_base + c});  // count the fenced publish")
    if timeline:
        pre.append("const unsigned long long tkx_start = tkx_now();")
        post.append(f"tkx_record(timeline, {base} + item, tkx_ready, tkx_start);  // task {base} + item")
    return block(*pre, code, *post)


def _check_supported(s: FusedSchedule) -> None:
    """Refuse what the kernel would get wrong, with the op and the user's line."""
    from ..errors import UnsupportedError

    first_reader = {}
    for op in s.program.ops:
        for x in op.tensor_inputs:
            first_reader.setdefault(x.buffer, op)
    values = [(i.value, f"input {i.name}", first_reader.get(i.value.buffer)) for i in s.program.inputs] + \
        [(op.out, f"the result of {op.kind} ({op.id})", op) for op in s.program.ops]
    for v, what, op in values:
        where = dict(op=op.kind, node=op.fx_node, source=op.source) if op is not None else {}
        if v.numel >= 2**31 or v.extent >= 2**31:
            raise UnsupportedError("unsupported-shape",
                                   f"{what} has {max(v.numel, v.extent)} elements ({list(v.shape)}), "
                                   f"2**31 or more", **where,
                                   hint="the generated kernel indexes tensors with 32-bit counts: keep every "
                                        "tensor below 2**31 elements (split the batch into smaller steps)")
        if v.numel == 0:
            raise UnsupportedError("unsupported-shape", f"{what} is a zero-size tensor {list(v.shape)}", **where,
                                   hint="drop empty tensors from the step (the kernel would have nothing to do)")
    for op in s.program.ops:
        r = optable.row(op.kind)  # a kind without a row fails here, loudly
        if op.out.dtype in INT_DTYPES and not r.int_exact:
            raise UnsupportedError(
                "integer-arithmetic", f"{op.kind} on {op.out.dtype} values ({op.id})", op=op.kind, node=op.fx_node,
                source=op.source, hint="compute it in float32 (cast the operands first)")
        emitted = r.statements and op.kind in SPECIAL_POINTWISE
        if r.family in ("pointwise", "index") and r.c is None and not emitted:
            raise TkxError(f"codegen: the op table row of {op.kind} ({op.id}) has no C expression or emitter")


def _loop_plan(s: FusedSchedule, em: Any, loop: Any, params: list, timeline: bool,
               audit: bool) -> tuple[str, str, list]:
    """(sync, reason, parameters) of a training-loop kernel: grid barriers (counter epochs are per launch),
    the one-step parameters with the loop's (:func:`tkx.codegen.loop.loop_params`)."""
    from ..errors import UnsupportedError
    from .loop import check_spec, loop_params

    if timeline:
        raise UnsupportedError("training-loop", "Options(timeline=True) records one launch of one step",
                               hint="record the timeline of the one-step kernel (tkx.runtime.build)")
    if audit:
        raise UnsupportedError("training-loop", "the protocol audit and planted faults check one launch of one step",
                               hint="generate the one-step kernel (no loop=) for them")
    check_spec(s.program, loop, em.plan.tensor_maps)
    reason = "grid barriers between stages and steps (a loop runs with sync='barrier')"
    return "barrier", reason, loop_params(params, s.program, loop)


def _outline(s: FusedSchedule, em: _Emitter, params: list, stage_code: list
             ) -> tuple[dict[str, tuple[str, Body]], list[tuple[str, str, list[str]]]]:
    """The groups whose bodies become device functions (``Options.outline``): group id -> (function name,
    its :class:`~tkx.codegen.outline.Body`), and the functions' texts in order (name, text, the groups
    calling it): the parametrised ``tkx_v_`` functions they call first, then one per distinct body.

    ``"auto"`` outlines when repeated bodies are at least :data:`~tkx.codegen.outline.REPEATED_SHARE` of the
    group code (a model's layers), and then every group that can be: NVVM's optimiser and ptxas take superlinear time
    in the size of one function, so the groups left in the kernel would keep most of the compile time
    (the 4-layer decode step for sm_90: 17.5 s inline, 20.5 s with only the repeated bodies outlined,
    9.3 s with every body outlined, on a 2-core CPU)."""
    choice = getattr(s.options, "outline", "off")
    if choice == "off":
        return {}, []
    outliner = Outliner({p.name: p.ctype for p in params}, em.plan.functions)
    same: dict[str, list[tuple[str, Body]]] = {}
    total = 0  # lines of group code
    for _, parts in stage_code:
        for g, code, _ in parts:
            total += code.count("\n") + 1
            body = None if g.id in em.plan.cluster_groups else outliner.parametrise(code)
            if body is not None:
                same.setdefault(body.key, []).append((g.id, body))
    repeated = sum((len(users) - 1) * (users[0][1].text.count("\n") + 1) for users in same.values())
    if choice == "auto" and repeated < REPEATED_SHARE * total:
        return {}, []
    outlined: dict[str, tuple[str, Body]] = {}
    pieces: list[tuple[str, str, list[str]]] = []
    for users in same.values():
        if users:
            name = f"tkx_body_{len(pieces)}"
            pieces.append((name, function_text(name, users[0][1], [gid for gid, _ in users]),
                           [gid for gid, _ in users]))
            outlined.update({gid: (name, body) for gid, body in users})
    used = "\n".join(text for _, text, _ in pieces)
    values = []
    for name, text in reversed(outliner.value_function_texts()):  # callers before callees
        if re.search(rf"\b{name}\(", used):
            values.append((name, text, []))
            used += "\n" + text
    return outlined, values[::-1] + pieces


def value_functions(em: _Emitter, names: Collection[str] | None = None) -> str:
    """The ``tkx_v_`` device functions of inlined values that ``em`` wrote (all, or those in ``names``),
    their declarations first (they call each other in any order); ``""`` when there are none."""
    chosen = [name for name in em.plan.functions if names is None or name in names]
    if not chosen:
        return ""
    declarations = "\n".join(
        f"__device__ __forceinline__ {cops.c_type(em.ops[name[len('tkx_v_'):]].out.dtype)} {name}"
        f"(TKX_POINTERS, {'int' if em.index32() else 'long long'} i);" for name in chosen)
    return "\n\n".join([declarations] + [em.plan.functions[name] for name in chosen if em.plan.functions[name]])


def max_registers(threads: int, blocks_per_sm: int = 1) -> int:
    """Registers per thread that let ``blocks_per_sm`` blocks of ``threads`` share a 64K-register SM
    (CUDA caps a thread at 255; register allocation is in units of 8), but never fewer than
    :data:`tkx.target.MIN_REGISTERS` (:func:`tkx.target.register_budget`)."""
    return register_budget(threads, blocks_per_sm)


def _emit_groups(s: FusedSchedule, arena: ArenaPlan) -> tuple[Any, list, int]:
    """(the emitter, each stage's (group, code, work items), the largest shared-memory workspace in bytes)."""
    em = _Emitter(s, arena)
    stage_code: list[tuple[int, list[tuple[Group, str, int]]]] = []
    shared = 0
    for si, stage in enumerate(s.stages):
        parts = []
        for gid in stage:
            g = s.groups[gid]
            code, n, smem = em.group_code(g)
            shared = max(shared, smem)
            parts.append((g, code, n))
        stage_code.append((si, parts))
    return em, stage_code, shared


def weight_prefetch(s: FusedSchedule, stage_code: list, weights: dict[str, tuple[str, int, int]]) -> dict[int, str]:
    """``Options.weight_prefetch``: stage index -> C text asking L2 for the next streaming GEMV stage's stored
    weights, at the first stage after the streaming stage before it (a norm, RoPE, attention: stages that read
    little from HBM), when they fit in half the L2 (:data:`tkx.target.facts.GPU` ``l2_bytes``). The weights do
    not depend on the values those stages compute, so HBM streams them meanwhile and the GEMV's loads hit L2.
    ``weights``: group id -> (pointer, first byte, bytes) of each streaming GEMV's weight
    (``KernelPlan.stream_weights``). Every thread of the grid issues ``prefetch.global.L2`` for every
    ``grid``-th 128-byte line: a hint, the GEMV reads the same bytes either way."""
    from ..target import GPU

    if not getattr(s.options, "weight_prefetch", False):
        return {}
    streaming = [si for si, parts in stage_code if any(g.id in weights for g, _, _ in parts)]
    out: dict[int, str] = {}
    for n in streaming:
        before = [si for si in streaming if si < n]
        at = before[-1] + 1 if before else 0
        if at >= n:
            continue
        ranges = sorted({weights[g.id] for si, parts in stage_code if si == n for g, _, _ in parts
                         if g.id in weights})
        total = sum(nb for _, _, nb in ranges)
        if total > GPU.l2_bytes // 2:
            continue
        lines = [f"{{  // weight_prefetch: stage {n}'s weights ({total / 1e6:.1f} MB) to L2 while this stage runs",
                 "    const long long tkx_t = (long long)blockIdx.x * blockDim.x + threadIdx.x, "
                 "tkx_n = (long long)gridDim.x * blockDim.x;"]
        for ptr, first, nbytes in ranges:
            lines.append(f"    for (long long x = tkx_t; x < {-(-nbytes // 128)}LL; x += tkx_n) "
                         f"asm volatile(\"prefetch.global.L2 [%0];\" :: "
                         f"\"l\"(reinterpret_cast<const unsigned char*>({ptr}) + {first}LL + x * 128));")
        out[at] = block(*lines, "}")
    return out


def _stages(s: FusedSchedule, stage_code: list, outlined: dict, sync: str, dag: Any, timeline: bool,
            audit_base: int | None, paired: set[str], prefetch: dict[int, str] | None = None
            ) -> tuple[list[str], list[tuple[int, str | None]]]:
    """The kernel's stages (each a comment, its grid-stride loop and, with barriers, the barrier before it;
    an outlined group's code is its call) and where each group starts or a stage ends: (0-based line of the
    stages' text, group id or ``None``), the last entry the end of the stages."""
    body: list[str] = []
    bounds: list[tuple[int, str | None]] = []
    lines = 0
    spin = s.options.spin_limit
    for si, parts in stage_code:
        if si > 0 and sync == "barrier":
            hz = "; ".join(s.barriers[si - 1].hazards[:2])
            body.append(f"// ---- barrier before stage {si} ({hz})")
            body.append(barrier(s.mode, si, spin_limit=f"{spin}ULL", blocks=s.blocks,
                                choice=s.options.grid_barrier))
            bounds.append((lines, None))
            lines += 2
        names = ", ".join(f"{g.id} {g.kind}" for g, _, _ in parts)
        body.append(f"// ==== stage {si}: {names} ====")
        bounds.append((lines, None))
        lines += 1
        if prefetch and si in prefetch:
            body.append(prefetch[si])
            lines += prefetch[si].count("\n") + 1
        parts = [(g, call_text(*outlined[g.id], g.id) if g.id in outlined else code, n) for g, code, n in parts]
        if sync == "counters" or timeline:
            parts = [(g, _task_code(g, code, dag, sync == "counters", timeline, spin, audit_base), n)
                     for g, code, n in parts]
        stage_loop, marks = _stage_loop(parts, paired)
        body.append(stage_loop)
        bounds += [(lines + at, gid) for at, gid in marks]
        lines += stage_loop.count("\n") + 1
    return body, bounds + [(lines, None)]


def generate(s: FusedSchedule, arena: ArenaPlan, *, plant: Any = None, audit: bool = False, loop: Any = None):
    """The CUDA source of ``s`` with memory from ``arena``: a :class:`tkx.codegen.CudaSource`.

    ``loop``: a :class:`tkx.codegen.loop.LoopSpec`: the kernel runs the step in a loop of
    ``tkx_loop[0]`` steps in one launch (:mod:`tkx.codegen.loop`), always with grid barriers
    (:class:`tkx.UnsupportedError` for a loop the kernel cannot run).

    ``audit`` (with ``sync="counters"``): the kernel logs the protocol it runs for the post-run check of
    :func:`tkx.dataflow.audit.audit` (``CudaSource.audit_base``: its first word). ``plant``: a function
    ``TaskDAG -> TaskDAG`` that plants a protocol fault in the kernel's task DAG (its waits, ``unfenced``,
    ``skips``, ``epoch_step`` or its arena plan: :data:`tkx.puzzles.POISONS`); implies ``audit``. Neither is
    reachable from :class:`tkx.Options`: they serve the poison litmus and its tests.

    Raises :class:`tkx.TkxError` if a group cannot be emitted (a scheduler/codegen bug), or for ``plant`` /
    ``audit`` without ``sync="counters"``.
    """
    from .source import CudaSource

    _check_supported(s)
    em, stage_code, shared = _emit_groups(s, arena)
    params = abi.kernel_params(s.program, timeline=bool(getattr(s.options, "timeline", False)))
    mode = s.mode
    spin = s.options.spin_limit
    sync, sync_reason, dag, work_items = _sync_plan(s, arena, stage_code)
    audit = audit or plant is not None
    if audit and sync != "counters":
        raise TkxError(f"the protocol audit and planted faults need the counters protocol, not sync={sync!r}: "
                       "lower with Options(mode='grid', sync='counters')")
    if plant is not None:
        dag = plant(dag)
        if dag.arena is not arena:  # the kernel addresses the planted plan
            arena = dag.arena
            em, stage_code, shared = _emit_groups(s, arena)
    if em.plan.tensor_maps:
        params.append(abi.Param("tmaps", "const unsigned char* __restrict__", "tensormaps"))
    audit_base = _sync_words(sync, dag, em.plan.tile_counter_words) if audit else None
    timeline = bool(getattr(s.options, "timeline", False))
    pointers = [p for p in params if p.role in ("input", "output", "arena", "status")]
    if loop is not None:
        sync, sync_reason, params = _loop_plan(s, em, loop, params, timeline, audit)
    body: list[str] = [
        f"if (!tkx_check_launch(status, {s.threads})) return;",
        barrier_setup(mode, s.blocks, s.options.grid_barrier) if sync == "barrier" else
        "const unsigned int tkx_epoch = tkx_counters_init(sync);  // launches completed: this launch's base",
    ]
    prefetch_maps = tensormap_prefetch(len(em.plan.tensor_maps), on=s.options.tensormap_prefetch)
    if prefetch_maps:
        body.append(prefetch_maps)
    if em.plan.tile_counter_words:
        body.append(f"unsigned int* const tkx_tiles = sync + {_tile_counter_base(sync, dag)};  // split-K tile "
                    f"arrival counters ({em.plan.tile_counter_words} words, left at 0 by every launch)")
    # group bodies as device functions (not in a training loop: its steps rebind the kernel's pointers)
    outlined, pieces = _outline(s, em, params, stage_code) if loop is None else ({}, [])
    file_smem = bool(outlined) and shared > 0  # the functions see the workspace at file scope
    if shared and not file_smem:
        body.append(shared_workspace(shared))
    head = body
    body, bounds = _stages(s, stage_code, outlined, sync, dag, timeline, audit_base, em.plan.cluster_groups,
                           weight_prefetch(s, stage_code, em.plan.stream_weights))
    first_stage = body[0]
    if loop is not None:
        from .loop import loop_kernel_body
        body = loop_kernel_body(head, body, s.program, loop, mode, len(s.stages), spin, s.blocks,
                                s.options.grid_barrier)
    else:
        body = head + body
    if sync == "counters" and dag.epoch_step == 0:
        body.append("tkx_counters_exit_frozen(sync);  // planted fault: the epoch is not advanced")
    elif sync == "counters":
        body.append("tkx_counters_exit(sync);  // the last block out advances the epoch")
    # Register budget of the requested occupancy (blocks_per_sm blocks of s.threads threads on
    # a 64K-register SM). An explicit cap also keeps ptxas from its small default budget for
    # very large kernels, which made it spill.
    max_regs = max_registers(s.threads, s.options.blocks_per_sm)
    why_regs = register_note(s.threads, s.options.blocks_per_sm)
    if why_regs:
        em.plan.notes["kernel"] = {"registers": max_regs, "why": why_regs}
    kernel = block(
        f"extern \"C\" __global__ void __maxnreg__({max_regs}) {abi.KERNEL_NAME}(",
        indent(",\n".join(p.declaration() for p in params), 2) + ") {",
        indent(block(body)),
        "}")
    header = block(
        f"// tkx megakernel for `{s.program.name}`: {len(s.groups)} groups in {len(s.stages)} stages, "
        f"{s.num_barriers} barriers ({mode} mode), {s.threads} threads per block.",
        f"// Arena: {arena.size_bytes} bytes. Generated by tkx; every address is a kernel argument.")
    struct = block("// The kernel's pointers, handed on to the device functions (inlined: no copies are made).",
                   "#define TKX_POINTERS " + ", ".join(p.declaration() for p in pointers),
                   "#define TKX_ARGS " + ", ".join(p.name for p in pointers))
    functions = value_functions(em)
    if sync == "barrier" and mode == "grid" and s.num_barriers:
        kind = grid_barrier_kind(s.blocks, s.options.grid_barrier)
        header = block(header, f"// Grid barrier: {kind} (grid_barrier = {s.options.grid_barrier!r}, "
                               f"grid of at most {s.blocks} blocks)")
    if sync == "counters":
        header = block(header, f"// Sync: counters ({len(dag.counters)} counters, "
                               f"{sum(len(w) for w in dag.waits.values())} waits, no grid barrier): {sync_reason}")
    if audit:
        header = block(header, f"// Protocol audit: {audit_words(dag)} sync words from word {audit_base}")
    pre = prelude(tensor_cores=em.plan.tensor_cores, counters=sync == "counters", timeline=timeline,
                  tma=bool(em.plan.tensor_maps), audit=audit)
    if loop is not None:
        from .loop import LOOP_PRELUDE
        pre = block(pre, "", LOOP_PRELUDE)
        header = block(header, f"// Training loop: the step runs tkx_loop[0] times in this launch, a barrier "
                               f"after each step; {sync_reason}")
    sections = [header, pre, struct, functions]
    ldg = LDG_HELPERS if any("tkx_ldg_" in text for _, text, _ in pieces) else None
    if outlined:
        sections.append(block(ldg, shared_workspace(shared) if file_smem else None,
                              "\n\n".join(text for _, text, _ in pieces)))
    text = block(*sections, kernel) + "\n"
    starts = [1]  # 1-based first line of each section, then of the kernel
    for part in sections:
        starts.append(starts[-1] + (part.count("\n") + 1 if part else 0))
    lines = text.splitlines()
    # the stages' first line (a training loop puts them inside its step loop, indented once more)
    at = next(no for no in range(starts[-1], len(lines) + 1) if lines[no - 1].strip() == first_stage)
    ends = [(at + no, gid) for no, gid in bounds[:-1]] + [(len(lines), None)]  # the last group: to the kernel's end
    op_lines, group_lines, function_lines = source_map(
        lines, s, em.ops, ends,
        functions=(starts[3], starts[4] - 1) if functions else None, outlined=outlined, pieces=pieces,
        outlined_at=starts[4] + int(file_smem) + (ldg.count("\n") + 1 if ldg else 0) if outlined else None)
    config = abi.KernelConfig(threads=s.threads, mode=mode, blocks=1 if mode == "block" else s.blocks,
                              shared_bytes=shared, max_registers=max_regs, spin_limit=int(s.options.spin_limit),
                              exact=bool(s.options.exact), max_blocks=s.options.max_blocks,
                              backend=s.options.backend, **({"cluster": em.plan.cluster}
                                                              if em.plan.cluster > 1 else {}))
    launch = abi.LaunchContract(abi.KERNEL_NAME, tuple(params), config, arena.size_bytes,
                                tensor_maps=tuple(em.plan.tensor_maps))
    return CudaSource(text=text, launch=launch, schedule=s, arena=arena,
                      op_lines={k: tuple(v) for k, v in op_lines.items()}, group_lines=group_lines,
                      function_lines=function_lines,
                      tensor_cores=em.plan.tensor_cores, notes=em.plan.notes, sync=sync, sync_reason=sync_reason,
                      sync_words=_sync_words(sync, dag, em.plan.tile_counter_words)
                      + (audit_words(dag) if audit else 0),
                      timeline_tasks=dag.num_tasks if timeline and dag else 0,
                      dag=dag, work_items=work_items, audit_base=audit_base)
