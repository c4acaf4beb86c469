"""The target GPU and the registry of emitters: what each code variant supports, plans and costs.

The scheduler decides *which* emitter runs a GEMM or a reduction and with which tiles; code
generation (:mod:`tkx.codegen.gemm`, :mod:`tkx.codegen.reduce`) writes the C for that choice.
This package is the contract between the two, and it imports neither (:mod:`~tkx.target.facts`,
:mod:`~tkx.target.gemm`, :mod:`~tkx.target.reduction`, :mod:`~tkx.target.attention`):

* :class:`GpuFacts` - the GPU the cost model and the planners assume (:data:`H200`);
* cost constants (µs) of the scheduler's mode estimate;
* :class:`GemmProblem` and :class:`ReductionProblem` - what is to be computed;
* one :class:`GemmEmitter` / :class:`ReductionEmitter` spec per variant, each with
  ``supports(problem, options) -> reason | None``, ``plan(problem, options) -> plan`` and
  ``cost(plan) -> Cost``, and :class:`Capabilities` (architecture, operand staging,
  alignment);
* the typed plans (:class:`GemmPlan`, :class:`ReductionPlan`, :class:`PointwisePlan`,
  :class:`CopyPlan`) that groups carry (``Group.plan``); they read like the mapping of their
  fields (``plan["tile_m"]``), so views can list them;
* :func:`choose_gemm` / :func:`choose_reduction`: walk the registry in order, take the first
  emitter that supports the problem and say why (the reasons the others declined included).

Architectures: ``"sm_80"`` and ``"sm_90"`` run the portable emitters (SIMT, WMMA, GEMV);
``"sm_90a"`` adds the Hopper warpgroup MMA (``wgmma``) GEMMs. ``Options.arch="auto"`` is
portable code on a machine without a GPU and the device's own architecture at run time
(:func:`resolve_arch`).
"""

from __future__ import annotations

from .attention import (  # noqa: F401 - the package's names
    ATTENTION_EMITTER,
    ATTENTION_MAX_HEAD_DIM,
    DECODE_ITEM_KEYS,
    DECODE_MAX_Q,
    DECODE_MIN_KV,
    DECODE_TILE_STEP,
    AttentionEmitter,
    AttentionPlan,
    AttentionProblem,
    _stage_us,
    decode_partials_layout,
    decode_split,
    fused_attention_us,
    unfused_attention_us,
)
from .facts import (  # noqa: F401 - the package's names
    ARCHES,
    BLOCK_BARRIER_US,
    EPILOGUE_BATCH,
    GPU,
    GRID_BARRIER_US,
    H200,
    ITEM_OVERHEAD_US,
    MIN_REGISTERS,
    SM_BYTES_PER_US,
    SM_COUNT,
    SM_FLOPS_PER_US,
    Capabilities,
    Cost,
    GpuFacts,
    Plan,
    _pow2_at_least,
    ceil_div,
    register_budget,
    register_note,
    resolve_arch,
    speed_of_light_us,
)
from .gemm import (  # noqa: F401 - the package's names
    CLUSTER_MIN_K_STEPS,
    GEMM_EMITTERS,
    MAX_STAGED_PER_THREAD,
    SKINNY_MAX,
    SPLIT_K_EMITTERS,
    SPLIT_K_FIRST_STEPS,
    STREAM_MIN_K,
    STREAM_MIN_LONG,
    GemmEmitter,
    GemmPlan,
    GemmProblem,
    _fit_tiles,
    _Gemv,
    _GemvStream,
    _last_index_fast,
    _plan_cluster,
    _plan_split_k,
    _Simt,
    _Wgmma,
    _Wmma,
    choose_gemm,
    cluster_pairs,
    gemm_emitter,
    program_work,
)
from .reduction import (  # noqa: F401 - the package's names
    POINTWISE_MAX_PER_THREAD,
    REDUCTION_EMITTERS,
    THREAD_FINAL_CHUNKS,
    CopyPlan,
    PointwisePlan,
    ReductionEmitter,
    ReductionPlan,
    ReductionProblem,
    _reduction_strategy,
    choose_reduction,
    pointwise_cost,
    pointwise_per_thread,
    reduction_emitter,
    row_threads,
)

__all__ = [
    "GpuFacts",
    "H200",
    "GPU",
    "SM_COUNT",
    "GRID_BARRIER_US",
    "BLOCK_BARRIER_US",
    "ITEM_OVERHEAD_US",
    "SM_FLOPS_PER_US",
    "SM_BYTES_PER_US",
    "EPILOGUE_BATCH",
    "ARCHES",
    "speed_of_light_us",
    "program_work",
    "resolve_arch",
    "MIN_REGISTERS",
    "register_budget",
    "register_note",
    "Plan",
    "Cost",
    "Capabilities",
    "ceil_div",
    "GemmProblem",
    "GemmPlan",
    "SKINNY_MAX",
    "GemmEmitter",
    "MAX_STAGED_PER_THREAD",
    "STREAM_MIN_LONG",
    "STREAM_MIN_K",
    "GEMM_EMITTERS",
    "gemm_emitter",
    "choose_gemm",
    "SPLIT_K_EMITTERS",
    "SPLIT_K_FIRST_STEPS",
    "CLUSTER_MIN_K_STEPS",
    "cluster_pairs",
    "ReductionProblem",
    "ReductionPlan",
    "PointwisePlan",
    "POINTWISE_MAX_PER_THREAD",
    "pointwise_per_thread",
    "CopyPlan",
    "THREAD_FINAL_CHUNKS",
    "ReductionEmitter",
    "REDUCTION_EMITTERS",
    "choose_reduction",
    "reduction_emitter",
    "row_threads",
    "pointwise_cost",
    "AttentionProblem",
    "AttentionPlan",
    "ATTENTION_MAX_HEAD_DIM",
    "DECODE_MAX_Q",
    "DECODE_MIN_KV",
    "DECODE_TILE_STEP",
    "DECODE_ITEM_KEYS",
    "decode_partials_layout",
    "decode_split",
    "AttentionEmitter",
    "ATTENTION_EMITTER",
    "unfused_attention_us",
    "fused_attention_us",
]
