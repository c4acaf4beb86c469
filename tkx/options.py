"""Every compiler knob in one frozen, validated record: :class:`Options`.

Each field carries its own documentation in ``metadata``: a one-line ``help`` and either
``choices`` (the allowed values) or ``range`` (inclusive integer bounds, ``None`` for an
open end). Widgets are generated from :meth:`Options.fields_info`; an invalid value raises
:class:`OptionsError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import TkxError

__all__ = ["Options", "OptionsError", "OPTION_GROUPS", "option_group"]

#: Resident threads one SM can hold on sm_80 and sm_90.
MAX_THREADS_PER_SM = 2048
#: Most accumulator elements one thread may own in a GEMM tile (register budget).
MAX_TILE_ELEMS_PER_THREAD = 64


class OptionsError(TkxError, ValueError):
    """An invalid compiler option (or combination of options).

    Attributes: ``field`` (the option's name, or several joined by ``" and "``), ``value``
    (the rejected value) and ``allowed`` (a description of what is accepted).
    """

    def __init__(self, field: str, value: Any, allowed: str, *, message: str | None = None) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(message or f"invalid option {field}={value!r}: allowed {allowed}")


def as_options(value: Any) -> Options:
    """``value`` as an :class:`Options`: ``None`` gives the defaults, an ``Options`` is returned
    as is, a mapping ``{"tile_m": 32, ...}`` is validated field by field. Anything else raises
    :class:`OptionsError`."""
    if value is None:
        return Options()
    if isinstance(value, Options):
        return value
    from collections.abc import Mapping
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise OptionsError("options", value, "a mapping from option names (str) to values")
        return Options.make(**value)
    raise OptionsError("options", value, "a tkx.Options, a dict of option names to values, or None",
                       message=f"options must be a tkx.Options or a dict of option values, "
                               f"not {type(value).__name__}: pass options=tkx.Options(tile_m=32) "
                               f"or options={{'tile_m': 32}}")


def _opt(default: Any, help: str, *, choices: tuple | None = None, range: tuple | None = None,
         none_ok: bool = False) -> Any:
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if range is not None:
        meta["range"] = range
    if none_ok:
        meta["none_ok"] = True
    return field(default=default, metadata=meta)


_BOOL = (True, False)


@dataclass(frozen=True, repr=False)
class Options:
    """The knobs of fusion, tiling, launch, numerics and compilation.

    Build with keywords (``Options(tile_m=128, mode="grid")``), derive with
    :meth:`replace`; every construction is validated. ``repr`` shows only the fields that
    differ from their defaults.
    """

    fuse_pointwise: bool = _opt(True, "inline chains of pointwise ops into their consumer", choices=_BOOL)
    fuse_epilogues: bool = _opt(True, "fuse pointwise ops that follow a GEMM into its epilogue",
                                choices=_BOOL)
    fuse_reductions: bool = _opt(True, "fuse pointwise producers into reductions", choices=_BOOL)
    fuse_rows: bool = _opt(True, "row-persistent fusion: reductions over the same rows (softmax's max and sum, "
                           "layer norm's mean and variance) and the row's pointwise outputs in one group, "
                           "the row in registers", choices=_BOOL)
    fuse_attention: bool | str = _opt("auto", "scaled dot-product attention as one fused FlashAttention group per "
                                              "direction (True), as its math (False), or whichever the cost "
                                              "estimate finds cheaper ('auto')", choices=("auto", True, False))
    tile_m: int = _opt(64, "GEMM tile rows per block", choices=(16, 32, 64, 128))
    tile_n: int = _opt(64, "GEMM tile columns per block", choices=(16, 32, 64, 128))
    tile_k: int = _opt(32, "GEMM reduction depth staged per step", choices=(8, 16, 32, 64))
    threads_per_block: int = _opt(256, "threads in each block", choices=(64, 128, 256, 512, 1024))
    blocks_per_sm: int = _opt(1, "resident blocks per SM in the cooperative grid", range=(1, 8))
    max_blocks: int | None = _opt(None, "cap on the grid size (None: as many as fit)", range=(1, None),
                                  none_ok=True)
    split_k: str | int = _opt("auto", "split GEMM reductions over K across blocks",
                              choices=("auto", "off", 2, 4, 8, 16))
    gemm_copy: str = _opt("auto", "how wgmma GEMMs copy operand tiles into shared memory: cp.async (16 bytes per "
                          "thread and request), tma (the bulk tensor copy engine, one request per tile, completing "
                          "on an mbarrier; 2-byte operands without a batch), auto: tma where it applies, else "
                          "cp.async (an input whose storage does not start on 16 bytes is then refused with advice)",
                          choices=("auto", "cp.async", "tma"))
    mode: str = _opt("auto", "block: one block with __syncthreads; grid: whole grid with grid barriers; "
                     "auto: chosen by cost", choices=("auto", "block", "grid"))
    fp32_math: str = _opt("simt", "simt: exact fp32 FMA on CUDA cores; tf32: tensor cores (10-bit mantissa)",
                          choices=("simt", "tf32"))
    arch: str = _opt("auto", "GPU architecture to generate code for: auto (the device's own at run time, "
                     "sm_90a on Hopper; portable sm_80 code without a GPU), sm_80, sm_90, or sm_90a (wgmma)",
                     choices=("auto", "sm_80", "sm_90", "sm_90a"))
    exact: bool = _opt(False, "no fused multiply-add contraction (compile with fmad off)", choices=_BOOL)
    passes: tuple[str, ...] | None = _opt(None, "pass pipeline by name (None: the default pipeline)")
    rules: tuple[str, ...] | None = _opt(None, "user fusion rules by name (None: every registered one)")
    backend: str = _opt("nvrtc", "how the kernel is compiled", choices=("nvrtc", "torch-extension"))
    spin_limit: int = _opt(2_000_000, "grid-barrier spins before the kernel gives up and reports an error",
                           range=(1000, 10**10))
    sync: str = _opt("barrier", "how stages wait for each other in grid mode: barrier: a grid barrier per stage; "
                     "counters: each task waits only for the counters of the groups it depends on; "
                     "auto: chosen by cost", choices=("barrier", "counters", "auto"))
    timeline: bool = _opt(False, "record (block, task, start, end, wait) of every task from %globaltimer "
                          "into a device buffer", choices=_BOOL)

    # -- code-generation variants (each selects a different kernel text; the defaults are the measured
    # -- best on the H200, the figures at each reader: tkx.codegen.cuda_prelude, intfacts, gemm_wgmma, target)
    grid_barrier: str = _opt("auto", "grid barrier of grid mode: counter (one monotonic arrival count, polled), "
                             "generation (the last block to arrive bumps a generation the others poll), auto: "
                             "counter for grids of at most 528 blocks, else generation",
                             choices=("auto", "counter", "generation"))
    cheap_int_math: bool = _opt(True, "cheap integer arithmetic: 32-bit indices where sizes allow, shifts and masks "
                                "for // and % by powers of two, unrounded casts of small integers to bf16/f16 "
                                "(False: the generic 64-bit forms)", choices=_BOOL)
    wgmma_min_macs: int = _opt(1 << 22, "smallest GEMM (batch*M*N*K multiply-adds) that the wgmma emitters take on "
                               "sm_90a; smaller ones use wmma (0: wgmma takes every GEMM it supports)",
                               range=(0, None))
    wgmma_in_flight: int = _opt(1, "wgmma k-tiles whose MMAs a warpgroup leaves in flight when it moves to the next "
                                "k-tile (0: wait for each k-tile's MMAs)", choices=(0, 1))
    split_k_final: str = _opt("stage", "who adds a split-K GEMM's slices: stage (a final group in the next stage, "
                              "over every block) or last-slice (the work item that finishes a tile last)",
                              choices=("stage", "last-slice"))
    split_k_min_steps: int = _opt(2, "split_k='auto' keeps at least this many tile_k steps per K slice",
                                  range=(1, None))
    epilogue_vector: bool = _opt(True, "wgmma tile epilogues in runs of 8 (2-byte) or 4 (4-byte) columns per "
                                 "thread with 16-byte loads and stores (False: one element at a time)",
                                 choices=_BOOL)
    epilogue_prefetch: bool = _opt(False, "a wgmma work item asks L2 to prefetch the rows of its tile that the "
                                   "epilogue reads, before its k-loop", choices=_BOOL)
    tensormap_prefetch: bool = _opt(False, "prefetch every TMA tensor map into the descriptor cache at kernel "
                                    "entry (each copy's own prefetch stays)", choices=_BOOL)
    gemv_prefetch: int = _opt(0, "the streaming GEMV asks L2 to prefetch the weight rows of the work items this "
                              "many rounds of the block's grid-stride loop ahead (0: off; 2 measured 2% slower on "
                              "the Llama-3.2-1B decode step on an H200)", choices=(0, 1, 2, 3, 4))
    gemv_ring: int = _opt(0, "the streaming GEMV's 16-byte weight loads go through a ring of this many "
                          "shared-memory slots per thread (cp.async, global to shared): that many loads in flight "
                          "all the time, none holding a register (0: loads into registers, unroll x columns at "
                          "a time)", choices=(0, 4, 8, 12, 16))
    weight_prefetch: bool = _opt(False, "at the first stage after a streaming GEMV's stage, every block asks L2 "
                                 "for its share of the stored weights the next streaming GEMV stage reads (when "
                                 "they fit in half the L2), so HBM streams them while norms, RoPE and attention "
                                 "run (measured 3% slower on the Llama-3.2-1B decode step on an H200: the "
                                 "q/k/v stages gain 14 µs, the norms and RoPE stages lose 34)", choices=_BOOL)
    gemm_cluster: str = _opt("off", "2-CTA thread-block clusters for TMA wgmma GEMMs: paired work items share the B "
                             "tile by multicast; on: GEMMs at least 8 k-tiles deep, all: any depth",
                             choices=("off", "on", "all"))
    cluster_scope: str = _opt("cluster", "memory scope of the 2-CTA cluster's stage handshake: cluster "
                              "(.release/.acquire.cluster) or cta (the instructions' defaults)",
                              choices=("cluster", "cta"))
    cluster_multicast: bool = _opt(True, "2-CTA clusters copy each half of the B tile once into both CTAs "
                                   "(False: each CTA copies the whole B tile, the pairing kept)", choices=_BOOL)

    outline: str = _opt("auto", "emit a group body that repeats (a model's layers) once, as a __noinline__ device "
                        "function each of its groups calls with its own addresses: the compile time grows with the "
                        "distinct code, not with the depth. auto: on when repeated bodies are at least half the "
                        "code (a model's layers); on: every group's body that can be; off: every group's code inline "
                        "in the kernel",
                        choices=("auto", "on", "off"))

    # -- validation ---------------------------------------------------------------------------
    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "passes":
                object.__setattr__(self, "passes", _check_passes(value))
                continue
            if f.name == "rules":
                object.__setattr__(self, "rules", _check_rules(value))
                continue
            _check_field(f, value)
        self._check_combinations()

    def _check_combinations(self) -> None:
        per_thread = self.tile_m * self.tile_n / self.threads_per_block
        if not 1 <= per_thread <= MAX_TILE_ELEMS_PER_THREAD:
            raise OptionsError(
                "tile_m, tile_n and threads_per_block", (self.tile_m, self.tile_n, self.threads_per_block),
                f"tile_m*tile_n/threads_per_block between 1 and {MAX_TILE_ELEMS_PER_THREAD}",
                message=(f"invalid combination tile_m={self.tile_m}, tile_n={self.tile_n}, "
                         f"threads_per_block={self.threads_per_block}: each thread would own {per_thread:g} "
                         f"tile elements; allowed 1 to {MAX_TILE_ELEMS_PER_THREAD} "
                         "(change the tile size or threads_per_block)"))
        resident = self.threads_per_block * self.blocks_per_sm
        if resident > MAX_THREADS_PER_SM:
            raise OptionsError(
                "threads_per_block and blocks_per_sm", (self.threads_per_block, self.blocks_per_sm),
                f"threads_per_block*blocks_per_sm <= {MAX_THREADS_PER_SM}",
                message=(f"invalid combination threads_per_block={self.threads_per_block}, "
                         f"blocks_per_sm={self.blocks_per_sm}: {resident} resident threads per SM; "
                         f"allowed at most {MAX_THREADS_PER_SM} (sm_80/sm_90)"))
        if self.sync == "counters" and self.mode == "block":
            raise OptionsError(
                "sync and mode", (self.sync, self.mode), "sync='counters' with mode='grid' or 'auto'",
                message=("invalid combination sync='counters', mode='block': one block orders its tasks with "
                         "__syncthreads, which counters cannot beat; use mode='grid' or sync='barrier'"))
        if self.exact and self.fp32_math == "tf32":
            raise OptionsError(
                "exact and fp32_math", (self.exact, self.fp32_math), "exact=True with fp32_math='simt'",
                message=("invalid combination exact=True, fp32_math='tf32': tf32 tensor cores round "
                         "operands to 10 mantissa bits, which defeats exact=True; use fp32_math='simt'"))

    # -- derived records ----------------------------------------------------------------------
    def replace(self, **changes: Any) -> Options:
        """A validated copy with ``changes`` applied; unknown names raise :class:`OptionsError`."""
        _check_names(changes)
        return dataclasses.replace(self, **changes)

    @classmethod
    def make(cls, **values: Any) -> Options:
        """``Options(**values)`` with the same clear error as :meth:`replace` for an unknown name."""
        _check_names(values)
        return cls(**values)

    @classmethod
    def fields_info(cls) -> list[tuple[str, Any, Any, str]]:
        """``(name, default, choices_or_range, help)`` for every field, in declaration order.

        ``choices_or_range`` is the tuple of allowed values, or ``("range", lo, hi)`` for
        integer ranges (``hi`` may be ``None``); for ``passes`` (a sequence, not one value)
        it is the tuple of pass names registered now.
        """
        from .passes import pass_names

        out = []
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if f.name == "passes":
                allowed: Any = pass_names()
            elif f.name == "rules":
                from .schedule.rules import user_rule_names
                allowed = user_rule_names()
            elif "choices" in meta:
                allowed: Any = tuple(meta["choices"])
            elif "range" in meta:
                allowed = ("range", *meta["range"])
            else:
                allowed = None
            out.append((f.name, f.default, allowed, meta["help"]))
        return out

    def changed(self) -> dict[str, Any]:
        """The fields whose value differs from the default."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not _same(getattr(self, f.name), f.default)}

    def key(self) -> tuple:
        """A stable, hashable key of every field (for caches)."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))

    def __repr__(self) -> str:
        return "Options(" + ", ".join(f"{k}={v!r}" for k, v in self.changed().items()) + ")"


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _allowed_text(f: dataclasses.Field) -> str:
    meta = f.metadata
    if "choices" in meta:
        text = "one of " + ", ".join(repr(c) for c in meta["choices"])
    else:
        lo, hi = meta["range"]
        text = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
    if meta.get("none_ok"):
        text = "None or " + text
    return text


def _check_field(f: dataclasses.Field, value: Any) -> None:
    meta = f.metadata
    if value is None and meta.get("none_ok"):
        return
    if "choices" in meta:
        # bool is an int in Python: compare with the type so True is not 1 and 1 is not True
        if any(_same(value, c) for c in meta["choices"]):
            return
    elif "range" in meta:
        lo, hi = meta["range"]
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if is_int and value >= lo and (hi is None or value <= hi):
            return
    else:
        return
    raise OptionsError(f.name, value, _allowed_text(f))


def _check_names(values: dict[str, Any]) -> None:
    """Raise :class:`OptionsError` for an unknown option name, with a did-you-mean hint."""
    import difflib

    names = [f.name for f in dataclasses.fields(Options)]
    for k in values:
        if k not in names:
            close = difflib.get_close_matches(k, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionsError(k, values[k], "one of the fields " + ", ".join(names),
                               message=f"unknown option {k!r}{hint}; the options are: {', '.join(names)}")


def _check_registered(option: str, value: Any, registered: Callable[[], Iterable[str]], what: str
                 ) -> tuple[str, ...] | None:
    """``value`` (``None``, or a tuple or list of names each in ``registered()``) as a tuple, for the option
    ``option`` naming registered ``what``s (``"user fusion rule"``, ``"pass"``); :class:`OptionsError`
    naming the allowed ones otherwise."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise OptionsError(option, value, f"None or a tuple of registered {what} names")
    known = tuple(registered())
    allowed = ", ".join(known)
    for name in value:
        if not isinstance(name, str) or name not in known:
            raise OptionsError(option, name, f"registered {what} names: {allowed or 'none'}",
                               message=f"invalid option {option}: {name!r} is not a registered {what}; "
                                       f"allowed: {allowed or 'none registered'}")
    return tuple(value)


def _check_rules(value: Any) -> tuple[str, ...] | None:
    from .schedule.rules import user_rule_names

    return _check_registered("rules", value, user_rule_names, "user fusion rule")


def _check_passes(value: Any) -> tuple[str, ...] | None:
    from .passes import pass_names

    return _check_registered("passes", value, pass_names, "pass")


#: The Explorer's option groups, in display order: group -> fields. A field in none of them is
#: shown under "compilation" (:func:`option_group`).
OPTION_GROUPS: dict[str, tuple[str, ...]] = {
    "fusion": ("fuse_pointwise", "fuse_epilogues", "fuse_reductions", "fuse_rows", "fuse_attention", "passes",
               "rules"),
    "tiling": ("tile_m", "tile_n", "tile_k", "split_k", "gemm_copy"),
    "launch": ("mode", "threads_per_block", "blocks_per_sm", "max_blocks", "sync", "spin_limit"),
    "numerics": ("fp32_math", "exact"),
    "compilation": ("arch", "backend", "timeline", "outline"),
    "code variants": ("grid_barrier", "cheap_int_math", "wgmma_min_macs", "wgmma_in_flight", "split_k_final",
                      "split_k_min_steps", "epilogue_vector", "epilogue_prefetch", "tensormap_prefetch",
                      "gemv_prefetch", "gemv_ring", "weight_prefetch", "gemm_cluster", "cluster_scope",
                      "cluster_multicast"),
}


def option_group(name: str) -> str:
    """The group of option ``name`` in :data:`OPTION_GROUPS` (``"compilation"`` when in none)."""
    return next((g for g, names in OPTION_GROUPS.items() if name in names), "compilation")
