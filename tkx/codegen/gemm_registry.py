"""The GEMM/GEMV emitter registry: variant name -> the function that writes its C, and the typed request
every such function takes.

Adding an emitter touches two places:

1. **one spec row** in :data:`tkx.target.GEMM_EMITTERS` (:mod:`tkx.target.gemm`): a :class:`GemmEmitter`
   whose ``name`` is the variant, with ``supports`` / ``plan`` / ``cost`` / ``registers`` / ``reason`` (the
   inherited ones fit a plain tiled emitter) and ``codegen``, the name of the module below :mod:`tkx.codegen`
   that writes its code; its place in the table is its priority when the scheduler chooses;
2. **one module** ``tkx/codegen/<codegen>.py`` with a function ``(GemmRequest) -> GemmCode`` decorated
   ``@register_gemm("<name>")``.

Nothing else: :func:`emit` (and :func:`tkx.codegen.gemm.emit_gemm`, the kernel's GEMM groups) find the
function through this table, importing the module the spec row names the first time its variant is asked
for. An emitter reads its inputs as fields of :class:`GemmRequest` (``r.tile``, ``r.split``), never by
string key.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ..target import SPLIT_K_EMITTERS, GemmEmitter, GemmProblem, gemm_emitter
from ..target import gemm as target_gemm
from .gemm_tile import (
    DEFAULT_KNOBS,
    Epilogue,
    GemmCode,
    GemvLoads,
    LoadA,
    LoadB,
    PtrA,
    PtrB,
    SplitFinal,
    TmaMap,
    WgmmaKnobs,
)


@dataclass(frozen=True)
class GemmRequest:
    """What a kernel asks a GEMM emitter to write: one work item (one output tile) of ``C = A @ B``.

    ``variant``: the spec row's name; ``problem``: sizes, batch, dtype and memory order; ``load_a`` / ``load_b`` /
    ``epilogue``: the callbacks of :mod:`tkx.codegen.gemm`; ``tile``: ``(tile_m, tile_n, tile_k)``, the ``tile_m x
    tile_n`` output tile and the K depth staged per step (elements); ``threads`` per block; ``item`` / ``smem``: the
    C names of the work item index and of the shared workspace; ``ptr_a`` / ``ptr_b``: pointers to operand elements
    (16-byte staging, wgmma); ``split``: slices of K (split-K, wgmma); ``shared_budget``: bytes of shared memory a
    block may use (sizes the wgmma pipeline); ``tma_a`` / ``tma_b``: tensor-map registration for bulk tensor copies;
    ``split_final``: the last-slice split-K final; ``epilogue_reads``: ``(C pointer, element bytes)`` the epilogue
    reads at the output's index; ``cluster``: CTAs per cluster (1 or 2); ``knobs``: the wgmma switches; ``blocks``:
    the grid size (the streaming GEMV spreads its columns over it); ``cheap``: ``Options.cheap_int_math``;
    ``gemv_loads``: the streaming GEMV's vector and prefetch loads. Fields an emitter does not use are ignored by it
    (see each emitter)."""

    variant: str
    problem: GemmProblem
    load_a: LoadA
    load_b: LoadB
    epilogue: Epilogue
    tile: tuple[int, int, int] = (64, 64, 32)
    threads: int = 256
    item: str = "item"
    smem: str = "tkx_smem"
    ptr_a: PtrA | None = None
    ptr_b: PtrB | None = None
    split: int = 1
    shared_budget: int | None = None
    tma_a: TmaMap | None = None
    tma_b: TmaMap | None = None
    split_final: SplitFinal | None = None
    epilogue_reads: tuple[tuple[str, int], ...] = ()
    cluster: int = 1
    knobs: WgmmaKnobs = DEFAULT_KNOBS
    blocks: int = 132
    cheap: bool = True
    gemv_loads: GemvLoads = field(default_factory=GemvLoads)


#: A registered emitter: the request in, the work item's code out.
GemmCodegen = Callable[[GemmRequest], GemmCode]

#: Variant name -> its registered code generator (filled by ``@register_gemm`` as the modules load).
REGISTRY: dict[str, GemmCodegen] = {}


def register_gemm(*names: str) -> Callable[[GemmCodegen], GemmCodegen]:
    """Decorator: ``fn`` writes the code of the variants ``names`` (each a spec row's name). Raises
    :class:`ValueError` when another function already holds one of the names."""
    def add(fn: GemmCodegen) -> GemmCodegen:
        for name in names:
            held = REGISTRY.get(name)
            if held is not None and (held.__module__, held.__qualname__) != (fn.__module__, fn.__qualname__):
                raise ValueError(f"GEMM variant {name!r} is already registered by "
                                 f"{held.__module__}.{held.__qualname__}")
            REGISTRY[name] = fn
        return fn
    return add


def variants() -> tuple[str, ...]:
    """The variant names of the spec rows, in the order :func:`tkx.target.choose_gemm` asks them."""
    return tuple(e.name for e in target_gemm.GEMM_EMITTERS)


def spec_of(variant: str) -> GemmEmitter:
    """The spec row of ``variant``; :class:`ValueError` naming the known variants if there is none."""
    try:
        return gemm_emitter(variant)
    except KeyError:
        raise ValueError(f"unknown GEMM variant {variant!r}; one of {variants()}") from None


def codegen_for(variant: str) -> GemmCodegen:
    """The function registered for ``variant``, importing the module its spec row names on first use.
    Raises :class:`ValueError` for a variant without a spec row or whose module registers nothing."""
    spec = spec_of(variant)
    if variant not in REGISTRY and spec.codegen:
        importlib.import_module(f"{__package__}.{spec.codegen}")
    if variant not in REGISTRY:
        raise ValueError(f"GEMM variant {variant!r} has a spec row but no registered code generator "
                         f"(its module {spec.codegen or '(none named)'!r} registers none)")
    return REGISTRY[variant]


def emit(r: GemmRequest) -> GemmCode:
    """The code of one work item of ``r`` by the emitter registered for ``r.variant``.

    Raises :class:`ValueError` for an unknown variant, for split-K (``split > 1``) or a cluster on a variant
    that does not implement it (:data:`tkx.target.SPLIT_K_EMITTERS`), for a last-slice final without a
    split, and whatever the emitter raises for inputs it cannot tile."""
    spec = spec_of(r.variant)
    if r.cluster != 1 and not spec.clusters:
        raise ValueError(f"2-CTA clusters are implemented by the wgmma variants, not {r.variant}")
    if r.split > 1 and r.variant not in SPLIT_K_EMITTERS:
        raise ValueError(f"split-K is implemented by the wgmma variants, not {r.variant}")
    if r.split_final is not None and r.split <= 1:
        raise ValueError("a last-slice split-K final needs split > 1")
    return codegen_for(r.variant)(r)
