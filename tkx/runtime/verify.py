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

Where eager itself is the less accurate side, a fixed tolerance against eager cries wolf. So
every floating value is also compared with a float64 run of the reference
(:func:`reference_fp64`): a value outside the tolerance still passes when its error against
float64 is at most ``max(tolerance, k x eager's own error against float64)`` (``k`` =
:data:`ARBITRATION_FACTOR`), or, where eager's own error against float64 already exceeds the
tolerance (rounding noise amplified, e.g. by Adam on a parameter whose true gradient is zero),
within :data:`NOISE_FACTOR` x eager's error; the report gives both errors, the distance in ULPs and which
side is closer. Integer inputs are drawn from the range the step accepts
(:func:`integer_ranges`), and inputs outside it are refused before anything runs.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..errors import TkxError
from ..random import drawing
from ..words import plural
from .inputs import TORCH_DTYPES

#: Default tolerance on the relative error, by IR dtype.
TOLERANCES = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-2, "int64": 0.0, "int32": 0.0, "bool": 0.0, "int8": 0.0,
              "uint8": 0.0}
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
    #: the kernel's relative error against the float64 run of the reference (``None``: not run)
    vs_fp64: float | None = None
    #: eager's own relative error against the float64 run (``None``: not run)
    eager_vs_fp64: float | None = None
    #: the kernel's largest distance from the float64 value, in units in the last place of ``dtype``
    ulps: float | None = None
    #: the float64 arbitration factor ``k``
    factor: float = 0.0

    @property
    def error(self) -> float:
        """The larger of the two errors."""
        return max((e for e in (self.vs_eager, self.vs_reference) if e is not None), default=0.0)

    @property
    def arbitrated(self) -> bool:
        """Outside the tolerance against eager / the reference, but as close to float64 as
        eager is (within ``max(tolerance, factor x eager's error)``): eager is the less
        accurate side. Where eager's own error against float64 is already beyond the tolerance,
        the value is rounding noise amplified by the step (a parameter whose true gradient is
        zero under Adam moves by learning-rate-sized steps of noise): it passes while within
        :data:`NOISE_FACTOR` x eager's error, i.e. as far from float64 as eager is."""
        if self.error <= self.tolerance or self.vs_fp64 is None or self.eager_vs_fp64 is None:
            return False
        bound = max(self.tolerance, self.factor * self.eager_vs_fp64)
        if self.eager_vs_fp64 > self.tolerance:
            bound = max(bound, NOISE_FACTOR * self.eager_vs_fp64)
        return self.vs_fp64 <= bound

    @property
    def closer(self) -> str | None:
        """``"kernel"`` or ``"eager"``: which is closer to the float64 run (``None``: not run)."""
        if self.vs_fp64 is None or self.eager_vs_fp64 is None:
            return None
        return "kernel" if self.vs_fp64 <= self.eager_vs_fp64 else "eager"

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance or self.arbitrated


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
                         f"vs reference {_fmt(c.vs_reference)} > {c.tolerance:.0e}{_fp64_note(c)}")
        arbitrated = [c for c in self.comparisons if c.arbitrated]
        for c in arbitrated[:10]:
            lines.append(f"  {c.kind} {c.name} seed {c.seed}: differs from eager by {_fmt(c.vs_eager)}, "
                         f"but float64 arbitration passes it{_fp64_note(c)}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def table(self) -> str:
        """Every comparison as one row: value, kind, dtype, the relative errors against eager, the
        reference and float64, eager's own error against float64, and the verdict."""
        head = f"{'value':<40} {'kind':<22} {'dtype':<8} {'vs eager':>9} {'vs ref':>9} {'vs fp64':>9} " \
               f"{'eager-fp64':>10}  verdict"
        rows = [head, "-" * len(head)]
        for c in self.comparisons:
            verdict = "ok" if c.error <= c.tolerance else "ok (fp64)" if c.arbitrated else "FAIL"
            rows.append(f"{c.name[:40]:<40} {c.kind[:22]:<22} {c.dtype:<8} {_fmt(c.vs_eager):>9} "
                        f"{_fmt(c.vs_reference):>9} {_fmt(c.vs_fp64):>9} {_fmt(c.eager_vs_fp64):>10}  {verdict}")
        return "\n".join(rows + ["", self.summary()])

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


def _fp64_note(c: Comparison) -> str:
    if c.vs_fp64 is None:
        return ""
    text = f"; vs float64: kernel {_fmt(c.vs_fp64)}"
    if c.ulps is not None:
        text += f" ({c.ulps:.3g} ulp)"
    if c.eager_vs_fp64 is not None:
        text += f", eager {_fmt(c.eager_vs_fp64)}; {c.closer} is closer"
    return text


#: ``k`` of the float64 arbitration: a value outside the tolerance passes when its error
#: against float64 is at most ``max(tolerance, k x eager's error against float64)``.
ARBITRATION_FACTOR = 2.0
#: Where eager's own error against float64 exceeds the tolerance (amplified rounding noise), a value
#: passes within this factor of it (:attr:`Comparison.arbitrated`).
NOISE_FACTOR = 10.0
_FLOATS = ("float32", "bfloat16", "float16")


def reference_fp64(program: Any, flat: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """The program's outputs and updated inputs computed in float64 (the arbiter of
    :func:`verify`): floating inputs are widened, every floating op computes and keeps its
    result in float64; explicit casts to bf16/fp16 still round (they are the step's own
    mixed-precision semantics). Returns ``outputs + [update of input i for i in inputs]``
    (``None`` where input ``i`` is not updated); everything on the inputs' device."""
    from ..ir import TensorSpec
    from ..reference import TORCH, evaluate, in_captured_layout, read
    env: dict[str, torch.Tensor] = {}
    for spec, t in zip(program.inputs, flat):
        env[spec.value.buffer] = in_captured_layout(t.double() if t.is_floating_point() else t, spec.value,
                                                    copy=True)
    device = flat[0].device
    for op in program.ops:
        args = [read(env, x) if isinstance(x, TensorSpec) else x for x in op.inputs]
        floating = op.out.dtype in _FLOATS
        if op.kind in ("sum", "mean") and floating:
            x = args[0].double() if args[0].dtype != torch.float64 else args[0]
            dims, keep = tuple(op.attr("dims", ())), bool(op.attr("keepdim", False))
            result = (torch.sum if op.kind == "sum" else torch.mean)(x, dim=dims, keepdim=keep) if dims else x.clone()
        elif op.kind == "cast" and op.out.dtype == "float32" and args[0].is_floating_point():
            result = args[0].double()
        elif op.kind == "fill" and floating:
            result = torch.full(op.out.shape, float(op.attr("value")), dtype=torch.float64, device=device)
        elif op.kind in ("amax", "amin") and op.out.dtype == "float32":
            # the op table's reference rounds to the op's dtype: a float32 extreme of float64 elements would
            # then equal none of them, and `x == x.amax()` (argmax, max_pool2d's backward) would find no hit
            dims, keep = tuple(op.attr("dims", ())), bool(op.attr("keepdim", False))
            fn = torch.amax if op.kind == "amax" else torch.amin
            result = fn(args[0].double(), dim=dims, keepdim=keep) if dims else args[0].double().clone()
        elif op.kind == "where" and op.out.dtype == "float32":
            cond, a, b = args
            cond = cond.bool() if isinstance(cond, torch.Tensor) else torch.tensor(bool(cond), device=device)
            a, b = (t.double() if isinstance(t, torch.Tensor) else torch.tensor(float(t), dtype=torch.float64,
                                                                                device=device) for t in (a, b))
            result = torch.where(cond, a, b)
        else:  # a cast to bf16/fp16 rounds as the step asks; float32 results stay float64
            result = evaluate(op, args, device)
        result = result.double() if floating else result.to(TORCH[op.out.dtype])
        if tuple(result.shape) != op.out.shape:
            result = result.expand(op.out.shape)
        env[op.id] = result.contiguous()
    outs: list[torch.Tensor | None] = [read(env, o.value) for o in program.outputs]
    updates = {u.input_index: read(env, u.value) for u in program.updates}
    return outs + [updates.get(i) for i in range(len(program.inputs))]


def ulp_distance(got: torch.Tensor, exact: torch.Tensor, dtype: str) -> float:
    """The largest ``|got - exact|`` in units in the last place of ``dtype`` at ``exact``
    (finite elements only; ``0.0`` when there are none)."""
    if dtype not in _FLOATS:
        return 0.0
    g, e = got.detach().double().reshape(-1), exact.detach().double().reshape(-1)
    keep = torch.isfinite(g) & torch.isfinite(e)
    if not bool(keep.any()):
        return 0.0
    g, e = g[keep], e[keep]
    t = TORCH_DTYPES[dtype]
    base = e.abs().to(t)
    ulp = (torch.nextafter(base, torch.full_like(base, float("inf"))) - base).double()
    ulp = torch.where(ulp > 0, ulp, torch.full_like(ulp, torch.finfo(t).tiny))
    return float(((g - e).abs() / ulp).max())


def compare(name: str, kind: str, dtype: str, seed: int, got: torch.Tensor, eager: torch.Tensor | None,
            ref: torch.Tensor, exact: torch.Tensor | None, tolerance: float,
            factor: float = ARBITRATION_FACTOR) -> Comparison:
    """One :class:`Comparison` of ``got`` (the kernel's value) with eager, the reference and
    the float64 run ``exact`` (any of ``eager``/``exact`` may be ``None``)."""
    vs_eager = relative_error(got, eager) if eager is not None else None
    vs_ref = relative_error(got, ref)
    vs64 = e64 = ulps = None
    if exact is not None and dtype in _FLOATS:
        vs64 = relative_error(got, exact)
        e64 = relative_error(eager, exact) if eager is not None else relative_error(ref, exact)
        ulps = ulp_distance(got, exact, dtype)
    return Comparison(name, kind, dtype, seed, vs_eager, vs_ref, tolerance, vs64, e64, ulps, factor)


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

    float32 1e-5, bf16/fp16 2e-2 (tkx's accuracy bounds); a float32 value of a program that
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


#: IR op kinds whose integer operand indexes another operand (the op table's index ops).
INDEX_KINDS = ("gather", "embedding", "index_select", "take_along_dim", "scatter", "scatter_add", "index")
_INT_DTYPES = ("int64", "int32", "int8", "uint8")


@dataclass(frozen=True)
class IntegerRange:
    """The values an integer input may take: ``low <= v < high``, plus the ``also`` values
    the step treats specially (``ignore_index``); ``why`` says where the range came from.
    ``binding`` is False for a guess (``int_high``, the example inputs' range, the default):
    such a range only says what random inputs to draw, and inputs from ``make_inputs``
    outside it are not refused (a Philox state or a step counter takes any value)."""

    name: str
    low: int
    high: int
    also: tuple[int, ...] = ()
    why: str = ""
    binding: bool = True

    def accepts(self, t: torch.Tensor) -> bool:
        ok = (t >= self.low) & (t < self.high)
        for v in self.also:
            ok |= t == v
        return bool(ok.all())


def integer_ranges(program: Any, examples: Sequence[torch.Tensor | None] | None = None,
                   int_high: int | None = None) -> dict[int, IntegerRange]:
    """Input index -> the :class:`IntegerRange` of every integer input of ``program``.

    In order of preference: what the step does with it (compared with an ``iota`` of ``C``
    values, as a one-hot / cross-entropy target: ``[start, start + C)``; the index operand of
    an index op: the size of the indexed dimension), ``int_high`` when given (``[0,
    int_high)``), the example inputs' own range (``[min, max]``), else ``[0, 10)``.
    Constants the input is compared with by ``ne`` (``ignore_index``) are accepted too.
    """
    from ..ir import TensorSpec

    ops = {op.id: op for op in program.ops}
    out: dict[int, IntegerRange] = {}
    for i, spec in enumerate(program.inputs):
        if spec.value.dtype not in _INT_DTYPES:
            continue
        aliases = {spec.value.buffer}  # the input and its checked copies (index_check)
        lows, highs, also, whys = [], [], set(), []
        for op in program.ops:
            ins = op.inputs
            pos = [k for k, x in enumerate(ins) if isinstance(x, TensorSpec) and x.buffer in aliases]
            if not pos:
                continue
            if op.kind == "index_check":
                aliases.add(op.id)
                lows.append(int(op.attr("lo", 0)))
                highs.append(int(op.attr("hi", 0)))
                if op.attr("ignore", None) is not None:
                    also.add(int(op.attr("ignore")))
                whys.append(f"checked by {op.id} ({op.attr('what', 'an index')})")
            elif op.kind == "eq" and len(ins) == 2:
                other = ins[1 - pos[0]]
                src = ops.get(other.buffer) if isinstance(other, TensorSpec) else None
                if src is not None and src.kind == "iota":
                    n = src.out.shape[src.attr("dim", 0)] if src.out.shape else 1
                    start, step = int(src.attr("start", 0)), int(src.attr("step", 1))
                    if step == 1:
                        lows.append(start)
                        highs.append(start + n)
                        whys.append(f"compared with {n} class indices by {op.id}")
            elif op.kind == "ne" and len(ins) == 2 and not isinstance(ins[1 - pos[0]], TensorSpec):
                also.add(int(ins[1 - pos[0]]))
            elif op.kind in INDEX_KINDS:
                dim = op.attr("dim", 0)
                table = next((x for x in ins if isinstance(x, TensorSpec) and x.buffer not in aliases), None)
                if table is not None and table.shape:
                    size = table.shape[dim if op.kind != "embedding" else 0]
                    lows.append(0)
                    highs.append(size)
                    whys.append(f"indexes {size} entries in {op.id}")
        name = spec.name
        if highs:
            out[i] = IntegerRange(name, max(lows), min(highs), tuple(sorted(also)), "; ".join(whys))
        elif int_high is not None:
            out[i] = IntegerRange(name, 0, int(int_high), tuple(sorted(also)), f"int_high={int_high}",
                                  binding=False)
        elif examples is not None and i < len(examples) and examples[i] is not None and examples[i].numel():
            ex = examples[i]
            out[i] = IntegerRange(name, int(ex.min()), int(ex.max()) + 1, tuple(sorted(also)),
                                  "the example input's range", binding=False)
        else:
            out[i] = IntegerRange(name, 0, 10, tuple(sorted(also)), "default [0, 10)", binding=False)
    return out


def is_mask(t: Any) -> bool:
    """True for a tensor that is a mask: bool, or floating with an infinity (an additive ``-inf`` mask)."""
    if not isinstance(t, torch.Tensor):
        return False
    return t.dtype == torch.bool or (t.is_floating_point() and t.device.type != "meta"
                                     and bool(torch.isinf(t).any()))


def random_inputs(program: Any, seed: int, device: torch.device, *, int_high: int | None = None,
                  ranges: Mapping[int, IntegerRange] | None = None,
                  examples: Sequence[torch.Tensor | None] | None = None) -> tuple:
    """Random arguments shaped (and strided) like the compiled inputs, as the step's pytree.

    Floats: standard normal; integers: uniform in the range the step accepts
    (:func:`integer_ranges`: the classes or rows they index, else ``[0, int_high)``, else
    ``[0, 10)``); bool: fair coins. Values are drawn on the CPU from a generator seeded with
    ``seed``, then moved to ``device``.

    Masks are the user's: where ``examples`` (the example inputs' flat leaves, ``None`` for a leaf
    not kept) holds a mask (:func:`is_mask`: a bool tensor, or a floating one with an infinity) for
    an input, that input takes the example's values instead of random ones. A random mask almost
    never masks a whole row of attention, which the user's padding does (a query row that sees no
    key); verifying with the user's mask checks what the step will meet.
    """
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    ranges = dict(ranges) if ranges is not None else integer_ranges(program, int_high=int_high)
    flat = []
    rng = getattr(program, "rng_input", None)  # the implicit Philox state: drawn by each run, not here
    for i, spec in enumerate(program.inputs if rng is None else program.inputs[:rng]):
        v = spec.value
        dtype = TORCH_DTYPES[v.dtype]
        example = examples[i] if examples is not None and i < len(examples) else None
        if is_mask(example) and tuple(example.shape) == tuple(v.shape) and example.dtype == dtype:
            data = example.detach().cpu()
        elif v.dtype in ("float32", "bfloat16", "float16"):
            data = torch.randn(v.shape, generator=gen, dtype=torch.float32).to(dtype)
        elif v.dtype == "bool":
            data = torch.randint(0, 2, v.shape, generator=gen).bool()
        else:
            r = ranges.get(i) or IntegerRange(spec.name, 0, 10)
            data = torch.randint(r.low, max(r.high, r.low + 1), v.shape, generator=gen, dtype=dtype)
        t = torch.empty_strided(v.shape, v.strides, dtype=dtype, device=device)
        t.copy_(data)
        flat.append(t)
    if program.in_tree is None:
        return tuple(flat)
    return tuple(tree_unflatten(flat, program.in_tree))


class InputRangeError(TkxError):
    """Verification inputs with integer values the step cannot accept (they would trip a
    device-side assert in eager PyTorch on the GPU and break the CUDA context)."""


def check_integer_ranges(flat: Sequence[torch.Tensor], ranges: Mapping[int, IntegerRange], seed: int) -> None:
    """Raise :class:`InputRangeError` naming the first integer input outside its binding range
    (what the step indexes or compares it with; guessed ranges are not checked)."""
    for i, r in ranges.items():
        t = flat[i]
        if r.binding and not r.accepts(t):
            also = f" (or {', '.join(map(str, r.also))})" if r.also else ""
            raise InputRangeError(
                f"verify: input {r.name} of seed {seed} holds values in [{int(t.min())}, {int(t.max())}], "
                f"but the step accepts [{r.low}, {r.high}){also}: {r.why}. Eager PyTorch would trip a "
                f"device-side assert on the GPU (and every later CUDA call would fail), so nothing was "
                f"run; make make_inputs draw {r.name} from that range")


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
           strict: bool = False, int_high: int | None = None,
           tolerances: Mapping[str, float] | None = None, fp64: bool = True) -> Verification:
    """See :meth:`tkx.runtime.CompiledRunner.verify`."""
    from .. import reference

    program = runner.program
    options = runner.options
    device = runner.device
    comparisons: list[Comparison] = []
    notes: list[str] = []
    if runner.step_fn is None:
        notes.append("no step_fn: compared with the reference interpreter only (build() keeps the step)")
    ranges = integer_ranges(program, getattr(runner, "example_integers", None), int_high)
    for seed in seeds:
        args = (call_make_inputs(make_inputs, seed, device) if make_inputs is not None
                else random_inputs(program, seed, device, ranges=ranges,
                                   examples=getattr(runner, "example_masks", None)))
        flat = runner.flatten(args)
        check_integer_ranges(flat, ranges, seed)  # before anything runs on the device
        # eager on clones
        eager_out: list[torch.Tensor] | None = None
        eager_in: list[torch.Tensor] | None = None
        if runner.step_fn is not None:
            eager_args = tree_map(lambda t: clone_exact(t) if isinstance(t, torch.Tensor) else t, args)
            rng = program.rng_input
            with drawing(flat[rng]) if rng is not None else contextlib.nullcontext():  # the kernel's random numbers
                out = runner.step_fn(*eager_args)
            eager_out = tree_flatten(out)[0]
            eager_in = runner.flatten(eager_args)
            if rng is not None:
                eager_in[rng] = flat[rng]
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
        exact = reference_fp64(program, flat) if fp64 else [None] * (len(program.outputs) + len(program.inputs))
        n_out = len(program.outputs)
        for k, spec in enumerate(program.outputs):
            dtype = spec.value.dtype
            comparisons.append(compare(
                spec.name, "output", dtype, seed, outs[k], eager_out[k] if eager_out is not None else None,
                ref.outputs[k], exact[k], tolerance_for(dtype, options, tolerances, program)))
        updated = {u.input_index for u in program.updates}
        for i, spec in enumerate(program.inputs):
            dtype = spec.value.dtype
            if i in updated:
                comparisons.append(compare(
                    spec.name, "update", dtype, seed, mine[i], eager_in[i] if eager_in is not None else None,
                    ref.updates[i], exact[n_out + i], tolerance_for(dtype, options, tolerances, program)))
            elif not torch.equal(mine[i], flat[i]) and not (
                    mine[i].is_floating_point() and torch.equal(mine[i].isnan(), flat[i].isnan())
                    and torch.equal(mine[i].nan_to_num(), flat[i].nan_to_num())):
                comparisons.append(Comparison(spec.name, "untouched", dtype, seed, None, math.inf, 0.0))
    result = Verification(tuple(comparisons), tuple(int(s) for s in seeds), tuple(notes))
    if strict and not result.passed:
        raise VerificationError(result)
    return result
