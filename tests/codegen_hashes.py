"""SHA-256 of the generated CUDA source of every zoo example under the option sets that select
different code paths (architecture, launch mode, split-K, GEMM copy engine, fp32 math, sync).

The recorded hashes (``tests/golden/codegen_hashes.json``) pin the generated text: a change of the
code generator that is meant to keep the kernels byte-identical is checked by
``tests/test_codegen_identity.py``; a change that is meant to alter them refreshes the file with
``scripts/codegen-hashes --update``. Only the source is generated (no NVRTC).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden" / "codegen_hashes.json"

#: Option sets of the fast matrix, by name. Each selects a different emitter or code path of at least
#: one example (wmma vs wgmma by architecture, grid vs block mode, split-K, TMA vs cp.async copies).
FAST = {
    "default": {},
    "sm_80": {"arch": "sm_80"},
    "sm_90": {"arch": "sm_90"},
    "sm_90a": {"arch": "sm_90a"},
    "grid": {"mode": "grid"},
    "block": {"mode": "block"},
    "sm_90a-split_k-off": {"arch": "sm_90a", "split_k": "off"},
    "sm_90a-split_k-4": {"arch": "sm_90a", "split_k": 4},
    "sm_90a-cp.async": {"arch": "sm_90a", "gemm_copy": "cp.async"},
    "sm_90a-tma": {"arch": "sm_90a", "gemm_copy": "tma"},
    "tf32": {"fp32_math": "tf32"},
    "sm_90a-tf32": {"arch": "sm_90a", "fp32_math": "tf32"},
}

#: The default test's share (seconds on 2 cores): these option sets of every example, the switches on
#: these examples; ``pytest -m slow`` checks the whole record.
QUICK_SETS = ("default", "sm_90a", "block")
QUICK_SWITCH_EXAMPLES = ("small", "decode_tiny_int8")

#: Examples whose code generation takes minutes under the whole fast matrix (the int8/int4 dequantising
#: GEMVs): the fast test runs them with these option sets only, the slow test with all.
HEAVY = {"decode_int8": ("default", "sm_90a"), "decode_int4": ("default", "sm_90a")}

#: The slow matrix adds combinations (pytest -m slow).
SLOW = {
    **FAST,
    "sm_90a-grid": {"arch": "sm_90a", "mode": "grid"},
    "sm_90a-block": {"arch": "sm_90a", "mode": "block"},
    "sm_80-split_k-2": {"arch": "sm_80", "split_k": 2},
    "sm_90a-split_k-16": {"arch": "sm_90a", "split_k": 16},
    "counters": {"sync": "counters"},
    "sm_90a-counters": {"arch": "sm_90a", "sync": "counters"},
    "timeline": {"timeline": True},
    "exact": {"exact": True},
    "small-tiles": {"tile_m": 32, "tile_n": 32, "tile_k": 16, "threads_per_block": 128},
    "sm_90a-tiles-128": {"arch": "sm_90a", "tile_m": 128, "tile_n": 128, "tile_k": 64},
    "no-fusion": {"fuse_pointwise": False, "fuse_epilogues": False, "fuse_reductions": False},
}


#: The decode examples hashed (the full-size models take minutes to draw their weights on the CPU).
DECODE = ("decode", "decode_int8", "decode_int4", "decode_tiny", "decode_tiny_int8", "decode_tiny_int4")


def examples() -> dict:
    """Every zoo example and the decode examples of :data:`DECODE`, by name (each has ``step_fn`` and
    ``example_inputs``)."""
    import tkx.examples as E
    from tkx.examples import decode as D

    out = {n: E.get(n) for n in E.names()}
    out.update({n: D.get(n) for n in DECODE})
    return out


def source_hashes(matrix: dict[str, dict], names: list[str] | None = None,
                  heavy: dict[str, tuple[str, ...]] | None = None) -> dict[str, dict[str, str]]:
    """``{example: {option set: sha256 of the CUDA source}}``; an option set the example refuses is
    recorded as ``"error: <ExceptionType>"``. ``heavy``: examples limited to the option sets named."""
    import tkx

    out: dict[str, dict[str, str]] = {}
    for name, ex in examples().items():
        if names is not None and name not in names:
            continue
        base = tkx.explore(ex.step_fn, ex.example_inputs, name=name)
        keys = (heavy or {}).get(name, tuple(matrix))
        out[name] = {key: _hash(base, matrix[key]) for key in keys}
    return out


def load() -> dict:
    return json.loads(GOLDEN.read_text())


def switch_hashes(names: tuple[str, ...] | None = None) -> dict[str, dict[str, str]]:
    """``{example: {switch: sha256}}`` for :data:`SWITCHES` on :data:`SWITCH_EXAMPLES` (or ``names``), sm_90a."""
    import tkx

    every = examples()
    out: dict[str, dict[str, str]] = {}
    for name in names or SWITCH_EXAMPLES:
        ex = every[name]
        base = tkx.explore(ex.step_fn, ex.example_inputs, name=name, arch="sm_90a")
        out[name] = {key: _hash(base, opts) for key, opts in SWITCHES.items()}
    return out


def _hash(base, opts: dict) -> str:
    try:
        text = (base.with_options(**opts) if opts else base).cuda.text
    except Exception as e:  # noqa: BLE001 - recorded: a refusal must stay a refusal
        return f"error: {type(e).__name__}"
    return hashlib.sha256(text.encode()).hexdigest()


def update(slow: bool = False) -> dict:
    """Recompute the fast matrix and the switches (and the slow matrix with ``slow``) into :data:`GOLDEN`."""
    old = load() if GOLDEN.exists() else {}
    data = {"fast": source_hashes(FAST), "switches": switch_hashes()}
    if slow:
        data["slow"] = source_hashes(SLOW)
    elif "slow" in old:
        data["slow"] = old["slow"]
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


#: Code-generation switches, each as the option changes that select it, applied with the sm_90a
#: architecture to the examples of :data:`SWITCH_EXAMPLES`.
SWITCHES: dict[str, dict] = {
    "grid_barrier=generation": {"mode": "grid", "grid_barrier": "generation"},
    "grid_barrier=counter": {"mode": "grid", "grid_barrier": "counter"},
    "cheap_int_math=False": {"cheap_int_math": False},
    "gemm_cluster=True": {"gemm_copy": "tma", "gemm_cluster": "on"},
    "gemm_cluster-cta-scope": {"gemm_copy": "tma", "gemm_cluster": "on", "cluster_scope": "cta"},
    "gemm_cluster-no-multicast": {"gemm_copy": "tma", "gemm_cluster": "on", "cluster_multicast": False},
    "epilogue_vector=False": {"epilogue_vector": False},
    "epilogue_prefetch=True": {"epilogue_prefetch": True},
    "tensormap_prefetch=True": {"gemm_copy": "tma", "tensormap_prefetch": True},
    "wgmma_min_macs=0": {"wgmma_min_macs": 0},
    "wgmma_in_flight=0": {"wgmma_in_flight": 0},
    "split_k_final=last_slice": {"split_k_final": "last-slice"},
    "split_k_min_steps=4": {"split_k_min_steps": 4},
    "outline=on": {"outline": "on"},
    "gemv_prefetch=2": {"gemv_prefetch": 2},
    "weight_prefetch=True": {"weight_prefetch": True},
    "gemv_ring=8": {"gemv_ring": 8},
}
SWITCH_EXAMPLES = ("online", "small", "medium", "mixed_precision", "llama_block", "decode_tiny",
                   "decode_tiny_int8", "decode")
