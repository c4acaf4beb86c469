"""Checking a compiled step against eager PyTorch and the reference interpreter.

:func:`verify` runs the compiled kernel on fresh inputs (one set per seed) with its outputs
and workspace poisoned (NaN for floats) and compares every output and every in-place updated
input with

* eager: ``step_fn`` on clones of the same inputs, and
* the oracle: :func:`tkx.reference.run` on the program the kernel implements.

The error measure is the relative error ``||a - b|| / ||b||`` (float64 norms; the absolute
``||a - b||`` when ``||b|| == 0``; ``inf`` when finite/NaN/inf positions differ). Tolerances:
float32 ``1e-5`` (``5e-3`` with ``Options(fp32_math="tf32")``), bfloat16/float16 ``2e-2``,
integers and bool exact. Inputs the step does not update must come back bit-identical.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..errors import TkxError
from ..words import plural
from .inputs import TORCH_DTYPES

#: Default tolerance on the relative error, by IR dtype.
TOLERANCES = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-2, "int64": 0.0, "int32": 0.0, "bool": 0.0}
#: float32 tolerance when fp32 GEMMs run on tf32 tensor cores.
TF32_TOLERANCE = 5e-3


class VerificationError(TkxError):
    """``verify(strict=True)`` found a mismatch; ``verification`` holds the full report."""

    def __init__(self, verification: Verification) -> None:
        self.verification = verification
        super().__init__(verification.summary())


@dataclass(frozen=True)
class Comparison:
    """One compiled value against eager and the reference on one input set.

    ``kind``: ``"output"``, ``"update"`` (an in-place updated input) or ``"untouched"`` (an
    input the step must not change); ``vs_eager``/``vs_reference``: relative errors
    (``None`` when that side was not run); ``ok``: both within ``tolerance``.
    """

    name: str
    kind: str
    dtype: str
    seed: int
    vs_eager: float | None
    vs_reference: float | None
    tolerance: float

    @property
    def error(self) -> float:
        """The larger of the two errors."""
        return max((e for e in (self.vs_eager, self.vs_reference) if e is not None), default=0.0)

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


@dataclass(frozen=True)
class Verification:
    """The result of :meth:`CompiledRunner.verify`.

    ``comparisons``: every value on every seed; ``errors``: value name -> worst error over
    seeds and both references; ``worst``: the name of the value with the largest error
    relative to its tolerance; ``passed``: every comparison within tolerance; ``notes``:
    anything that was skipped (e.g. no ``step_fn`` to run eagerly).
    """

    comparisons: tuple[Comparison, ...]
    seeds: tuple[int, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.comparisons)

    @property
    def errors(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in self.comparisons:
            out[c.name] = max(out.get(c.name, 0.0), c.error)
        return out

    @property
    def worst_comparison(self) -> Comparison | None:
        def score(c: Comparison) -> float:
            if c.tolerance > 0:
                return c.error / c.tolerance
            return math.inf if c.error > 0 else 0.0
        return max(self.comparisons, key=score, default=None)

    @property
    def worst(self) -> str | None:
        c = self.worst_comparison
        return c.name if c is not None else None

    @property
    def worst_error(self) -> float:
        c = self.worst_comparison
        return c.error if c is not None else 0.0

    def failures(self) -> list[Comparison]:
        return [c for c in self.comparisons if not c.ok]

    def summary(self) -> str:
        """One paragraph: verdict, worst value, failures."""
        verdict = "PASSED" if self.passed else "FAILED"
        n = len({c.name for c in self.comparisons})
        head = f"verification {verdict}: {plural(n, 'value')} x {plural(len(self.seeds), 'seed')}"
        if self.worst is not None:
            c = self.worst_comparison
            head += f"; worst {c.name} ({c.dtype}) rel. error {c.error:.3g} (tolerance {c.tolerance:.0e})"
        lines = [head]
        for c in self.failures()[:10]:
            lines.append(f"  {c.kind} {c.name} seed {c.seed}: vs eager {_fmt(c.vs_eager)}, "
                         f"vs reference {_fmt(c.vs_reference)} > {c.tolerance:.0e}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return f"<tkx.Verification {verdict}: worst {self.worst} {self.worst_error:.3g}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from .. import display

        return display.mimebundle(self, include, exclude)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "worst": self.worst, "worst_error": self.worst_error,
                "errors": self.errors, "seeds": list(self.seeds), "notes": list(self.notes)}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||`` in float64 (see the module docstring for the edge cases).

    Integer and bool tensors: the fraction of elements that differ. Shapes must match
    (a shape mismatch counts as ``inf``).
    """
    if tuple(got.shape) != tuple(want.shape):
        return math.inf
    if not (got.is_floating_point() or want.is_floating_point()):
        if got.numel() == 0:
            return 0.0
        return float((got.to(want.dtype) != want).double().mean())
    a, b = got.detach().double(), want.detach().double()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb):
        return math.inf
    if not bool(fa.all()):
        na, nb = a[~fa], b[~fb]
        if not torch.equal(torch.isnan(na), torch.isnan(nb)):
            return math.inf
        inf_a, inf_b = na[~torch.isnan(na)], nb[~torch.isnan(nb)]
        if not torch.equal(inf_a, inf_b):
            return math.inf
        a, b = a[fa], b[fb]
    num = float(torch.linalg.vector_norm(a - b))
    den = float(torch.linalg.vector_norm(b))
    return num / den if den > 0 else num


def low_precision(program: Any) -> str | None:
    """The bf16/fp16 dtype a program computes in, if any (mixed precision)."""
    for op in getattr(program, "ops", ()):
        if op.out.dtype in ("bfloat16", "float16"):
            return op.out.dtype
    return None


def tolerance_for(dtype: str, options: Any = None, overrides: Mapping[str, float] | None = None,
                  program: Any = None) -> float:
    """The relative-error tolerance of a value of IR dtype ``dtype``.

    float32 1e-5, bf16/fp16 2e-2 (the issue's bounds); a float32 value of a program that
    computes in bf16/fp16 (mixed precision: fp32 masters, bf16 math) gets the bf16/fp16
    bound, since its accuracy is that of the low-precision math; tf32 math gets 5e-3.
    """
    if overrides and dtype in overrides:
        return float(overrides[dtype])
    if dtype == "float32" and getattr(options, "fp32_math", "simt") == "tf32":
        return TF32_TOLERANCE
    if dtype == "float32" and program is not None:
        low = low_precision(program)
        if low is not None:
            return TOLERANCES[low]
    return TOLERANCES.get(dtype, 0.0)


def random_inputs(program: Any, seed: int, device: torch.device, *, int_high: int = 10) -> tuple:
    """Random arguments shaped (and strided) like the compiled inputs, as the step's pytree.

    Floats: standard normal; integers: uniform in ``[0, int_high)``; bool: fair coins. Values
    are drawn on the CPU from a generator seeded with ``seed``, then moved to ``device``.
    """
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    flat = []
    for spec in program.inputs:
        v = spec.value
        dtype = TORCH_DTYPES[v.dtype]
        if v.dtype in ("float32", "bfloat16", "float16"):
            data = torch.randn(v.shape, generator=gen, dtype=torch.float32).to(dtype)
        elif v.dtype == "bool":
            data = torch.randint(0, 2, v.shape, generator=gen).bool()
        else:
            data = torch.randint(0, int(int_high), v.shape, generator=gen, dtype=dtype)
        t = torch.empty_strided(v.shape, v.strides, dtype=dtype, device=device)
        t.copy_(data)
        flat.append(t)
    if program.in_tree is None:
        return tuple(flat)
    return tuple(tree_unflatten(flat, program.in_tree))


def call_make_inputs(make_inputs: Callable[..., Any], seed: int, device: torch.device) -> tuple:
    """``make_inputs(seed)`` (passing ``device=`` when it accepts one), moved to ``device``."""
    try:
        accepts_device = "device" in inspect.signature(make_inputs).parameters
    except (TypeError, ValueError):
        accepts_device = False
    args = make_inputs(seed, device=device) if accepts_device else make_inputs(seed)
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, args)


def clone_exact(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same shape, dtype, device and strides."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (floats), the most negative value (integers) or True (bool)."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(torch.iinfo(t.dtype).min)


def verify(runner: Any, seeds: Sequence[int] = (0, 1), make_inputs: Callable[..., Any] | None = None, *,
           strict: bool = False, int_high: int = 10,
           tolerances: Mapping[str, float] | None = None) -> Verification:
    """See :meth:`tkx.runtime.CompiledRunner.verify`."""
    from .. import reference

    program = runner.program
    options = runner.options
    device = runner.device
    comparisons: list[Comparison] = []
    notes: list[str] = []
    if runner.step_fn is None:
        notes.append("no step_fn: compared with the reference interpreter only (build() keeps the step)")
    for seed in seeds:
        args = (call_make_inputs(make_inputs, seed, device) if make_inputs is not None
                else random_inputs(program, seed, device, int_high=int_high))
        flat = runner.flatten(args)
        # eager on clones
        eager_out: list[torch.Tensor] | None = None
        eager_in: list[torch.Tensor] | None = None
        if runner.step_fn is not None:
            eager_args = tree_map(lambda t: clone_exact(t) if isinstance(t, torch.Tensor) else t, args)
            out = runner.step_fn(*eager_args)
            eager_out = tree_flatten(out)[0]
            eager_in = runner.flatten(eager_args)
            if len(eager_out) != len(program.outputs):
                notes.append(f"seed {seed}: eager returned {len(eager_out)} outputs, the program has "
                             f"{len(program.outputs)}; eager comparison skipped")
                eager_out = None
        # the oracle
        ref = reference.run(program, [clone_exact(t) for t in flat])
        # the kernel, outputs and workspace poisoned
        mine = [clone_exact(t) for t in flat]
        outs = [poison_(t) for t in runner.allocate_outputs()]
        arena = runner.new_arena()
        arena.fill_(0xFF)  # NaN in every float format
        runner.run_flat(mine, out=outs, arena=arena, check=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        for k, spec in enumerate(program.outputs):
            dtype = spec.value.dtype
            comparisons.append(Comparison(
                spec.name, "output", dtype, seed,
                relative_error(outs[k], eager_out[k]) if eager_out is not None else None,
                relative_error(outs[k], ref.outputs[k]), tolerance_for(dtype, options, tolerances, program)))
        updated = {u.input_index for u in program.updates}
        for i, spec in enumerate(program.inputs):
            dtype = spec.value.dtype
            if i in updated:
                comparisons.append(Comparison(
                    spec.name, "update", dtype, seed,
                    relative_error(mine[i], eager_in[i]) if eager_in is not None else None,
                    relative_error(mine[i], ref.updates[i]), tolerance_for(dtype, options, tolerances, program)))
            elif not torch.equal(mine[i], flat[i]) and not (
                    mine[i].is_floating_point() and torch.equal(mine[i].isnan(), flat[i].isnan())
                    and torch.equal(mine[i].nan_to_num(), flat[i].nan_to_num())):
                comparisons.append(Comparison(spec.name, "untouched", dtype, seed, None, math.inf, 0.0))
    result = Verification(tuple(comparisons), tuple(int(s) for s in seeds), tuple(notes))
    if strict and not result.passed:
        raise VerificationError(result)
    return result
