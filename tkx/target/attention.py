"""Fused attention specs: :class:`AttentionProblem`, :class:`AttentionPlan`, the FlashAttention /
flash-decoding emitter spec (:mod:`tkx.codegen.attention`), the decode split and the cost comparison
with the unfused math."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .facts import ARCHES, SM_COUNT, Capabilities, Cost, Plan, ceil_div


# --------------------------------------------------------------------------------------
# Fused attention (FlashAttention scheme; codegen in tkx.codegen.attention)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionProblem:
    """One attention composite: ``batch`` (product of the leading dims) x ``q_len`` queries of
    ``head_dim``, ``kv_len`` keys, values of ``value_dim``; ``dtype`` of q; ``backward`` for
    ``attention_backward``; ``causal``; ``mask``: ``"none"``, ``"bool"`` or ``"additive"``."""

    batch: int
    q_len: int
    kv_len: int
    head_dim: int
    value_dim: int
    dtype: str
    backward: bool
    causal: bool
    mask: str

    @property
    def gemm_flops(self) -> int:
        """FLOPs of the products: ``2 B L S (E + Ev)`` forward; the backward recomputes the scores and
        forms dv, dp, dq and dk: ``2 B L S (3 E + 2 Ev)``."""
        e, ev = self.head_dim, self.value_dim
        return 2 * self.batch * self.q_len * self.kv_len * ((3 * e + 2 * ev) if self.backward else (e + ev))


@dataclass(frozen=True, eq=False)
class AttentionPlan(Plan):
    """How a fused attention group runs: ``impl`` (``"flash_fwd"``, ``"flash_bwd"`` or ``"flash_decode"``),
    ``why``, query tile ``tile_q`` and key tile ``tile_k`` rows per work item, the problem's sizes, and the
    softmax ``scale``, and the estimated µs of the fused group and of the unfused math
    (``fused_us``, ``unfused_us``).

    ``flash_decode`` (flash-decoding, a few query rows over a long KV cache): ``tile_q = q_len`` and the
    keys are split into ``k_tiles`` KV tiles of ``tile_k``; phase 1 (an ``attention_partial`` group) writes
    per (batch, KV tile) the un-normalised partials into the float32 scratch ``partials``
    (:func:`decode_partials_layout`), phase 2 (the ``attention`` group, the next stage) combines them
    with the online-softmax weights ``exp(m_p - max_p m_p)``. ``split_why`` says why this split."""

    impl: str
    why: str
    batch: int
    q_len: int
    kv_len: int
    head_dim: int
    value_dim: int
    tile_q: int
    tile_k: int
    causal: bool
    mask: str
    scale: float = 1.0
    fused_us: float = 0.0
    unfused_us: float = 0.0
    partials: str | None = None
    split_why: str | None = None

    @property
    def q_tiles(self) -> int:
        return ceil_div(self.q_len, self.tile_q)

    @property
    def k_tiles(self) -> int:
        return ceil_div(self.kv_len, self.tile_k)


#: The largest head (and value) dimension the fused emitter keeps in shared memory.
ATTENTION_MAX_HEAD_DIM = 128


#: Flash-decoding (``flash_decode``) is planned for at most this many query rows per (batch, head) ...
DECODE_MAX_Q = 4


#: ... and at least this many keys (fewer fit one key tile of the forward emitter).
DECODE_MIN_KV = 32


#: KV tiles of flash-decoding are multiples of this many keys.
DECODE_TILE_STEP = 16


#: A work item's fixed cost in key-rows (staging q, three block barriers, the partials' stores) when
#: :func:`decode_split` compares splits.
DECODE_ITEM_KEYS = 32


def decode_partials_layout(batch: int, k_tiles: int, q_len: int, value_dim: int) -> tuple[int, int, int]:
    """Float offsets of flash-decoding's scratch ``[acc | m | l]``: ``acc [batch, k_tiles, q_len, value_dim]``
    (``sum_j exp(s_j - m) v_j`` over the tile's keys), ``m [batch, k_tiles, q_len]`` (the tile's score
    maximum, ``-inf`` when every key of the tile is masked), ``l [batch, k_tiles, q_len]`` (``sum_j
    exp(s_j - m)``). Returns ``(m offset, l offset, total floats)``."""
    acc = batch * k_tiles * q_len * value_dim
    rows = batch * k_tiles * q_len
    return acc, acc + rows, acc + 2 * rows


def decode_split(batch: int, kv_len: int, blocks: int) -> tuple[int, str]:
    """(KV tile size, why) of flash-decoding ``batch`` (batch x heads) query groups over ``kv_len`` keys on
    ``blocks`` blocks: the tile (a multiple of :data:`DECODE_TILE_STEP`) whose work items
    ``batch x ceil(kv_len / tile)`` cost the fewest waves x (tile + :data:`DECODE_ITEM_KEYS`) key-rows;
    ties go to the larger tile (fewer partials to combine)."""
    step = DECODE_TILE_STEP
    options: list[tuple[int, int, int, int]] = []  # (tile, tiles, waves, cost), the smallest tile per count
    for tiles in range(ceil_div(kv_len, step), 0, -1):
        tile = ceil_div(ceil_div(kv_len, tiles), step) * step
        if ceil_div(kv_len, tile) != tiles or (options and options[-1][0] == tile):
            continue
        waves = ceil_div(batch * tiles, max(blocks, 1))
        options.append((tile, tiles, waves, waves * (min(tile, kv_len) + DECODE_ITEM_KEYS)))
    best = None
    for o in options:  # smallest tile first: ``<=`` lets a larger tile win a tie
        if best is None or o[3] <= best[3]:
            best = o
    assert best is not None
    tile, tiles = best[0], best[1]
    items = batch * tiles
    waves = ceil_div(items, max(blocks, 1))
    smaller = [o for o in options if o[0] < tile]
    alt = ""
    if smaller:
        o = smaller[-1]
        alt = f"; tiles of {o[0]} would make {batch * o[1]} items in {o[2]} wave{'s' if o[2] != 1 else ''}"
    why = (f"{kv_len} keys split into {tiles} KV tile{'s' if tiles != 1 else ''} of {tile}: {batch} x {tiles} = "
           f"{items} work items on {blocks} blocks, {waves} wave{'s' if waves != 1 else ''} streaming the cache"
           f"{alt}")
    return tile, why


class AttentionEmitter:
    """The spec of the fused attention emitter (plain CUDA, fp32 shared-memory tiles and
    accumulators; forward: online softmax over key tiles; backward: one pass over query tiles per
    key tile for dk/dv and one over key tiles per query tile for dq, no atomics)."""

    name = "flash"
    capabilities = Capabilities(ARCHES, "shared memory (fp32 tiles)", (1, 1, 1))

    def supports(self, p: AttentionProblem, options: Any) -> str | None:
        if p.head_dim > ATTENTION_MAX_HEAD_DIM or p.value_dim > ATTENTION_MAX_HEAD_DIM:
            return (f"head dimension {max(p.head_dim, p.value_dim)} is above {ATTENTION_MAX_HEAD_DIM}, "
                    "the most the fused emitter keeps in shared memory")
        if p.dtype not in ("float32", "bfloat16", "float16"):
            return f"inputs of dtype {p.dtype}"
        if options.threads_per_block < 64:
            return "fewer than 64 threads per block"
        return None

    @staticmethod
    def decodes(p: AttentionProblem) -> bool:
        """Is ``p`` decode-shaped (flash-decoding): a forward of at most :data:`DECODE_MAX_Q` query rows over
        at least :data:`DECODE_MIN_KV` keys?"""
        return not p.backward and p.q_len <= DECODE_MAX_Q and p.kv_len >= DECODE_MIN_KV

    def plan(self, p: AttentionProblem, options: Any, why: str, blocks: int = SM_COUNT) -> AttentionPlan:
        if self.decodes(p):
            tile_k, split_why = decode_split(p.batch, p.kv_len, blocks)
            return AttentionPlan("flash_decode", why, p.batch, p.q_len, p.kv_len, p.head_dim, p.value_dim,
                                 p.q_len, tile_k, p.causal, p.mask, split_why=split_why)
        wide = max(p.head_dim, p.value_dim) > 64
        tile = 16 if wide else 32
        return AttentionPlan("flash_bwd" if p.backward else "flash_fwd", why, p.batch, p.q_len, p.kv_len,
                             p.head_dim, p.value_dim, tile, tile, p.causal, p.mask)

    def shared_floats(self, plan: AttentionPlan, threads: int = 256) -> int:
        bq, bk, e, ev = plan.tile_q, plan.tile_k, plan.head_dim, plan.value_dim
        if plan.impl == "flash_decode":  # scores of the tile, each warp's acc, m and l of each row
            return bq * bk + (threads // 32) * bq * ev + 2 * bq
        if plan.impl == "flash_fwd":
            return bq * e + bk * e + bk * ev + bq * bk + 3 * bq
        return bk * e + bk * ev + bq * e + bq * ev + 2 * bq * bk + 2 * bq

    def cost(self, plan: AttentionPlan, phase: str = "one") -> Cost:
        """Work items, FLOPs and bytes of the group; ``phase`` (``flash_decode`` only): ``"partial"`` (the
        KV tiles), ``"combine"`` or ``"one"`` (both together, for the fused-or-not estimate)."""
        b, lq, lk = plan.batch, plan.q_len, plan.kv_len
        dims = plan.head_dim + plan.value_dim
        if plan.impl == "flash_decode":
            _, _, floats = decode_partials_layout(b, plan.k_tiles, lq, plan.value_dim)
            part = Cost(b * plan.k_tiles, 2 * b * lq * lk * dims,
                        4 * (b * lk * dims + b * lq * plan.head_dim) + 4 * floats)
            comb = Cost(ceil_div(b * lq, 8), 4 * floats, 4 * floats + 4 * b * lq * (plan.value_dim + 1))
            if phase == "partial":
                return part
            if phase == "combine":
                return comb
            return Cost(part.items + comb.items, part.flops + comb.flops, part.bytes + comb.bytes)
        if plan.impl == "flash_fwd":
            items = b * plan.q_tiles
            flops = 2 * b * lq * lk * dims
            nbytes = 4 * b * (lq * dims + plan.q_tiles * lk * dims + lq * (plan.value_dim + 1))
        else:
            items = b * (plan.q_tiles + plan.k_tiles)
            flops = 2 * b * lq * lk * (3 * plan.head_dim + 2 * plan.value_dim)
            nbytes = 4 * b * (plan.k_tiles * lq * dims + plan.q_tiles * lk * dims + 2 * (lq + lk) * dims)
        if plan.causal:
            flops //= 2
        return Cost(items, flops, nbytes)


ATTENTION_EMITTER = AttentionEmitter()


def unfused_attention_us(p: AttentionProblem, blocks: int = SM_COUNT) -> float:
    """Estimated µs of the attention's math as separate groups: its products (their FLOPs and q, k, v read
    once, 4 bytes per element as in the fused cost), the score matrix written and read by each softmax stage,
    and a grid barrier per stage (5 forward, 9 backward)."""
    from .. import costs

    c = costs.constants()
    scores = p.batch * p.q_len * p.kv_len * 4
    operands = 4 * p.batch * (p.q_len * p.head_dim + p.kv_len * (p.head_dim + p.value_dim))
    passes, stages = (12, 9) if p.backward else (6, 5)
    flops = p.gemm_flops
    return (flops / (c["sm_flops_per_us"] * blocks) + (scores * passes + operands) / (c["sm_bytes_per_us"] * blocks)
            + stages * (c["grid_barrier_us"] + c["task_us"]))


def fused_attention_us(plan: AttentionPlan, blocks: int = SM_COUNT) -> float:
    """Estimated µs of the fused group: its work items spread over ``blocks``, one stage."""
    from .. import costs

    c = costs.constants()
    if plan.impl == "flash_decode":  # two stages: the KV tiles, then the combine
        return sum(_stage_us(ATTENTION_EMITTER.cost(plan, phase), blocks, c) for phase in ("partial", "combine"))
    return _stage_us(ATTENTION_EMITTER.cost(plan), blocks, c)


def _stage_us(cost: Cost, blocks: int, c: dict, impl: str | None = None) -> float:
    """Estimated µs of one stage holding only the work of ``cost`` on ``blocks`` blocks, its grid barrier
    included: the slowest block's share of the items, each :func:`tkx.costs.item_us` (at the FLOP rate of
    the emitter ``impl``; ``None``: CUDA cores)."""
    from .. import costs

    return math.ceil(cost.items / blocks) * costs.item_us(cost.flops, cost.bytes, cost.items, c, impl) \
        + c["grid_barrier_us"]
