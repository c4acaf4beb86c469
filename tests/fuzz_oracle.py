"""The oracle of the family fuzzer (:mod:`fuzz_families`): run one case eagerly in float32 and float64,
through tkx's reference interpreter and schedule interpreter, and compile its kernel with NVRTC.

Verdicts (:class:`Outcome.status`):

* ``ok``; ``invalid``: eager PyTorch itself raised (the generator drew an illegal program; not a finding);
* ``refused``: :class:`tkx.UnsupportedError` naming a line of the step's own source, or
  :class:`tkx.OptionsError` (counted per message, not a failure); ``unnamed-refusal``: an
  UnsupportedError naming no line of the step (counted apart, not a failure);
* ``wrong``: a value where tkx is further from float64 than eager float32 is, by more than the dtype's
  factor and further than eager moves under input noise (``tkx_err > max(FACTOR * eager_err, spread,
  FLOOR)``, errors as ``||a - b|| / ||float64||``, the spread the largest move of :data:`SPREAD_RUNS`
  eager runs on inputs perturbed by ``FACTOR * NOISE``, see :func:`compare`); NaN/inf where
  eager is finite or the reverse; an integer that differs from eager; an input eager updates in place
  that tkx leaves alone; a kernel whose element read names another element than the IR's view (found
  on the CPU, :func:`tkx.codegen.read_check.check_reads`). Arbitrating by float64 keeps rounding noise
  that Adam amplifies on parameters whose true gradient is zero from counting: eager is as far off there
  as tkx.
* ``crash``: any other exception at any stage; ``hang``: the case ran past its time limit.

:func:`shrink` walks a failing case's knobs towards their simplest values and drops its options while
it still fails the same way; :func:`reproduction` writes it as a runnable script. ``check(..., gpu=True)``
runs the built kernel on the CUDA device as one more stage (``gpu``), judged like the interpreters.
:func:`injected_error` checks the oracle itself: a pass that gets one constant 0.1% wrong must be caught.
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import os
import signal
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fuzz_families as fam
import torch
from torch.utils._pytree import tree_flatten, tree_map

#: How much further from float64 than eager tkx may be, and the relative error always allowed.
#: ``tfloat32``: a float32 case whose kernel runs with ``fp32_math="tf32"`` (tensor cores round the GEMM
#: operands to float16's 10 mantissa bits), judged on the GPU like a float16 computation; the interpreters
#: compute in float32 and keep float32's rule.
FACTOR = {"float32": 8.0, "bfloat16": 4.0, "float16": 4.0, "tfloat32": 4.0}
FLOOR = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3, "tfloat32": 4e-3}
#: The relative size of rounding-sized noise on the inputs (a few units of rounding). Eager's spread runs
#: add ``FACTOR`` times it: tkx may be ``FACTOR`` times further from float64 than eager, i.e. answer like
#: eager on inputs rounded ``FACTOR`` times more coarsely (for a smooth value the same bound as ``FACTOR``
#: times the spread under ``NOISE``; where rounding decides a sign, the larger noise shows the flip).
NOISE = {"float32": 1e-6, "bfloat16": 4e-3, "float16": 5e-4, "tfloat32": 5e-4}
#: Independent noisy eager runs whose largest move counts as eager's spread. One draw is a coin toss where
#: a rounding error decides a sign (Adam's first step is ``lr * sign(g)``: a float16 gradient element that
#: weight decay cancels to 1e-5 flipped under 12 of 20 draws at ``FACTOR * NOISE``); six draws all miss
#: such a flip once in a few hundred cases. Eager runs cost milliseconds, tkx's capture seconds.
SPREAD_RUNS = 6

FAILURES = ("wrong", "crash", "hang")
#: The device of the ``gpu`` stage.
DEVICE = "cuda"


@dataclass
class Outcome:
    """What :func:`check` found for ``case``: ``status`` (see the module docstring), the ``stage`` it
    happened in (``eager``, ``capture``, ``reference``, ``schedule``, ``nvrtc``, ``run``, ``gpu``), a one-line
    ``detail``, ``key`` (the detail without numbers, to group findings) and ``seconds``."""

    case: fam.Case
    status: str
    stage: str = ""
    detail: str = ""
    key: str = ""
    seconds: float = 0.0
    errors: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in FAILURES

    def line(self) -> str:
        return f"{self.case.label()}: {self.status} {self.stage} {self.detail}".rstrip()


class _Wrong(Exception):
    def __init__(self, detail: str, key: str) -> None:
        super().__init__(detail)
        self.detail, self.key = detail, key


class _Hang(BaseException):
    """The time limit ran out. A ``BaseException`` (like ``KeyboardInterrupt``): the ``except Exception``
    that turns an eager error into an "invalid" verdict, or any in tkx, must not swallow it."""


def load(case: fam.Case) -> dict[str, Any]:
    """Execute the case's source from a file of its own (in the temporary folder), as a user's module:
    tkx names that file's lines in its errors."""
    import hashlib
    import tempfile
    text = fam.source_of(case)
    folder = os.path.join(tempfile.gettempdir(), "tkx-fuzz-programs")
    os.makedirs(folder, exist_ok=True)
    filename = os.path.join(folder, f"{case.label()}-{hashlib.sha1(text.encode()).hexdigest()[:10]}.py")
    if not os.path.exists(filename):
        with open(filename + ".tmp", "w") as f:
            f.write(text)
        os.replace(filename + ".tmp", filename)
    linecache.checkcache(filename)
    namespace: dict[str, Any] = {"__file__": filename, "__name__": f"fuzz_{case.family}"}
    exec(compile(text, filename, "exec"), namespace)
    return namespace


def _clone(tree: Any) -> Any:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _double(tree: Any) -> Any:
    return tree_map(lambda t: (t.double() if t.dtype == torch.float32 else t.clone())
                    if isinstance(t, torch.Tensor) else t, tree)


def _perturbed(tree: Any, size: float, seed: int) -> Any:
    """A copy of ``tree`` whose float32 tensors are multiplied by ``1 + size * N(0, 1)`` noise."""
    g = torch.Generator().manual_seed(seed)

    def noise(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            return t.clone() if isinstance(t, torch.Tensor) else t
        return t * (1 + size * torch.randn(t.shape, generator=g).to(t.device))
    return tree_map(noise, tree)


def _spread_runs(run: Any, dtype: str, seed: int) -> list[list[torch.Tensor]]:
    """``run(noise, seed)`` for :data:`SPREAD_RUNS` seeds: eager's values on inputs perturbed by ``FACTOR``
    times :data:`NOISE`."""
    return [run(FACTOR[dtype] * NOISE[dtype], seed + 7919 * j) for j in range(SPREAD_RUNS)]


def _kernel_dtype(case: fam.Case, dtype: str) -> str:
    """The dtype the kernel on the device is judged in: ``tfloat32`` for a float32 case built with
    ``fp32_math="tf32"``, else ``dtype``."""
    return "tfloat32" if dtype == "float32" and dict(case.options).get("fp32_math") == "tf32" else dtype


def _eager(step: Any, inputs: tuple) -> list[torch.Tensor]:
    """The step's outputs, then every input leaf as the step left it."""
    args = _clone(inputs)
    out = step(*args)
    return tree_flatten(out)[0] + tree_flatten(args)[0]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` over the finite elements, in float64 (``||a - b||`` when ``b`` is 0)."""
    a, b = a.detach().double(), b.detach().double()
    keep = torch.isfinite(a) & torch.isfinite(b)
    num = float(torch.linalg.vector_norm((a - b)[keep]))
    den = float(torch.linalg.vector_norm(b[keep]))
    return num / den if den > 0 else num


def spread(noisy: list[torch.Tensor], eager: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest ``||noisy - eager|| / ||exact||``: eager's moves under rounding-sized input noise, scaled
    by the float64 value's norm like the errors (scaled by eager's own norm instead, the spread of a value
    that is rounding noise - RMSprop's average of an exactly-zero gradient squared, 1e-19 in float32 where
    float64 says 1e-37 - would read 10 against errors of 1e17)."""
    out = 0.0
    den = float(torch.linalg.vector_norm(exact.detach().double()[torch.isfinite(exact)]))
    for z in noisy:
        if tuple(z.shape) != tuple(eager.shape) or not z.is_floating_point():
            continue
        a, b = z.detach().double(), eager.detach().double()
        keep = torch.isfinite(a) & torch.isfinite(b)
        num = float(torch.linalg.vector_norm((a - b)[keep]))
        out = max(out, num / den if den > 0 else num)
    return out


def compare(name: str, got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, dtype: str,
            noisy: torch.Tensor | list[torch.Tensor] | None = None) -> float:
    """Raise :class:`_Wrong` when ``got`` (tkx) is wrong by the oracle's rule; return its error vs float64.

    ``noisy``: eager on inputs perturbed by rounding-sized noise (:data:`NOISE`), one run or several; how
    far they move from eager (:func:`spread`) counts as eager's error too (a value whose rounding is
    amplified - Adam's first step divides a gradient by its own magnitude - can land anywhere in that
    spread, and eager was merely lucky)."""
    if tuple(got.shape) != tuple(eager.shape):
        raise _Wrong(f"{name}: shape {list(got.shape)}, eager {list(eager.shape)}", f"{name}: shape")
    if not got.is_floating_point():
        if not torch.equal(got.to(eager.dtype), eager) and not torch.equal(got.to(exact.dtype), exact):
            n = int((got.to(eager.dtype) != eager).sum())
            raise _Wrong(f"{name}: {n} of {got.numel()} integers differ from eager", f"{name}: integers")
        return 0.0
    fin_got, fin_eager = torch.isfinite(got), torch.isfinite(eager)
    if not torch.equal(fin_got, fin_eager):
        nan = int((~fin_got & fin_eager).sum())
        what = f"{nan} NaN/inf where eager is finite" if nan else \
            f"{int((fin_got & ~fin_eager).sum())} finite where eager is NaN/inf"
        raise _Wrong(f"{name}: {what} (of {got.numel()})", f"{name}: " + ("NaN/inf" if nan else "finite"))
    e_tkx, e_eager = relative(got, exact), relative(eager, exact)
    e_spread = spread(noisy if isinstance(noisy, list) else [noisy], eager, exact) if noisy is not None else 0.0
    if e_tkx > max(FACTOR[dtype] * e_eager, e_spread, FLOOR[dtype]):
        raise _Wrong(f"{name}: {e_tkx:.3g} from float64, eager {e_eager:.3g}, eager's spread {e_spread:.3g} "
                     f"(allowed max({FACTOR[dtype]:g} x eager, spread, {FLOOR[dtype]:g}))",
                     f"{name}: far from float64")
    return e_tkx


def _compare_all(stage: str, got: list[Any], want: list[torch.Tensor], exact: list[torch.Tensor],
                 noisy: list[list[torch.Tensor]], originals: list[torch.Tensor], n_out: int, dtype: str,
                 errors: dict[str, float]) -> None:
    """Compare each of tkx's values with eager's (``noisy``: the spread runs, each a list like ``want``)."""
    for i, (g, w, x) in enumerate(zip(got, want, exact)):
        name = f"output {i}" if i < n_out else f"input {i - n_out}"
        if g is None:  # tkx does not update this input: eager must not have either
            j = i - n_out
            if i >= n_out and isinstance(w, torch.Tensor) and not torch.equal(originals[j], w):
                raise _Wrong(f"{name}: eager updates it in place, tkx leaves it", f"{name}: update lost")
            continue
        errors[f"{stage} {name}"] = compare(name, g, w, x, dtype, [run[i] for run in noisy if i < len(run)])


def _refusal(e: Exception, filename: str | None) -> tuple[str, str]:
    """``refused`` for an OptionsError or an UnsupportedError naming a line of ``filename`` (the
    step's source), else ``unnamed-refusal``; with the message."""
    import tkx
    if isinstance(e, tkx.OptionsError):
        return "refused", f"OptionsError: {e}"
    op = getattr(e, "op", None) or "-"
    source = getattr(e, "source", None)
    named = source is not None and filename is not None and os.path.realpath(str(source.file)) == \
        os.path.realpath(filename)
    status = "refused" if named else "unnamed-refusal"
    return status, f"{e.kind}: {op}: {e.what}"


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return next((f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(tb) if "/tkx/" in f.filename), "")


def _key(text: str) -> str:
    import re
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)[:160]


def _alarm(_signum: int, _frame: Any) -> None:
    raise _Hang()


def check(case: fam.Case, *, nvrtc: bool = True, timeout_s: float = 0.0,
          namespace: dict[str, Any] | None = None, gpu: bool = False, eager_only: bool = False) -> Outcome:
    """Run ``case`` through eager (float32, float64), tkx's two interpreters and NVRTC (``nvrtc``), within
    ``timeout_s`` seconds (0: no limit; SIGALRM, main thread only). Never raises. ``namespace``: the
    module of the case's source already executed (a reproduction passes its own globals). ``gpu``: build
    the kernel (:func:`tkx.runtime.build`) and run it on the CUDA device (stage ``gpu``), its values
    judged like the interpreters' but against eager on the device (its autocast policy and kernels; the
    spread runs there too), arbitrated by float64, in place of the NVRTC compile. ``eager_only``: only eager's
    runs (float32, float64, the spread runs, and with ``gpu`` eager on the device), nothing of tkx: the canary
    that tells a program whose eager run kills the process (invalid) from one whose compiled run does."""
    start = time.perf_counter()
    state = {"stage": "build", "eager_only": eager_only}
    errors: dict[str, float] = {}

    def done(status: str, detail: str = "", key: str = "") -> Outcome:
        return Outcome(case, status, state["stage"], detail, key or _key(detail), time.perf_counter() - start, errors)

    old = None
    if timeout_s:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        ns = namespace if namespace is not None else load(case)
        state["file"] = ns.get("__file__")
        if case.family in fam.STATEFUL:
            _check_stateful(case, ns, state, errors, nvrtc, gpu)
        else:
            _check_functional(case, ns, state, errors, nvrtc, gpu)
        state["stage"] = ""
        return done("ok")
    except _Verdict as v:
        return done(v.status, v.detail)
    except _Wrong as w:
        return done("wrong", w.detail, w.key)
    except _Hang:
        return done("hang", f"still running after {timeout_s:g} s")
    except Exception as e:  # noqa: BLE001 - every other exception is a finding
        import tkx
        if isinstance(e, (tkx.UnsupportedError, tkx.OptionsError)):
            status, detail = _refusal(e, state.get("file"))
            return done(status, detail, _key(detail))
        text = str(e).splitlines()[0] if str(e) else ""
        return done("crash", f"{type(e).__name__}: {text[:200]} ({_where(e)})", f"{type(e).__name__} at {_where(e)}")
    finally:
        if timeout_s:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


class _Verdict(Exception):
    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def _eager_pair(run: Any) -> tuple[Any, Any]:
    """``run(False)`` (float32) and ``run(True)`` (float64)."""
    try:
        return run(False), run(True)
    except Exception as e:  # noqa: BLE001 - eager raised: an illegal program, not a finding
        text = str(e).splitlines()[0][:160] if str(e) else ""
        raise _Verdict("invalid", f"eager raised {type(e).__name__}: {text}") from e


def _to_device(tree: Any, device: str) -> Any:
    """A copy of ``tree`` with every tensor on ``device``."""
    return tree_map(lambda t: t.detach().clone().to(device) if isinstance(t, torch.Tensor) else t, tree)


def _cpu(values: list[Any]) -> list[Any]:
    return [v.detach().cpu() if isinstance(v, torch.Tensor) else None for v in values]


def _eager_on_device(run: Any) -> list[Any]:
    """``run()``: eager on the CUDA device, the reference of the ``gpu`` stage; eager raising there (and not
    on the CPU) makes the case ``invalid`` for the device."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - eager raised: not a finding of tkx
        text = str(e).splitlines()[0][:160] if str(e) else ""
        raise _Verdict("invalid", f"eager raised {type(e).__name__} on the device: {text}") from e


def _check_functional(case: fam.Case, ns: dict, state: dict, errors: dict, nvrtc: bool, gpu: bool) -> None:
    import tkx
    from tkx.schedule import interpreter

    step, inputs = ns["step"], ns["make_inputs"](case.seed)
    state["stage"] = "eager"
    want, exact = _eager_pair(lambda double: _eager(step, _double(inputs) if double else _clone(inputs)))
    originals = tree_flatten(inputs)[0]
    dtype = fam.compute_dtype(case)
    noisy = _spread_runs(lambda size, seed: _eager(step, _perturbed(inputs, size, seed)), dtype, case.seed)
    if state.get("eager_only"):  # the canary of a program that killed its process: eager's runs alone
        if gpu:
            _eager_on_device(lambda: _cpu(_eager(step, _to_device(inputs, DEVICE))))
        return
    state["stage"] = "capture"
    options = tkx.Options.make(**dict(case.options))
    exp = tkx.explore(step, inputs, options=options)
    n_out = len(exp.program.outputs)
    n_in = len(exp.program.inputs)
    runs = (("reference", lambda: tkx.reference.run(exp.optimized, inputs)),
            ("schedule", lambda: interpreter.run(exp.schedule, exp.arena, inputs)))
    for stage, make in runs:
        state["stage"] = stage
        r = make()
        got = list(r.outputs) + [r.updates.get(i) for i in range(n_in)]
        _compare_all(stage, got, want, exact, noisy, originals, n_out, dtype, errors)
    if gpu:  # the kernel on the device: outputs, then every input as the step left it
        state["stage"] = "gpu"

        def on_device(tree: Any) -> list[Any]:  # eager on the device (its autocast policy and kernels)
            return _cpu(_eager(step, _to_device(tree, DEVICE)))
        want = _eager_on_device(lambda: on_device(inputs))
        dtype = _kernel_dtype(case, dtype)
        noisy = _spread_runs(lambda size, seed: on_device(_perturbed(inputs, size, seed)), dtype, case.seed)
        runner = tkx.runtime.build(step, _to_device(inputs, DEVICE), options)
        args = _to_device(inputs, DEVICE)
        out = runner(*args)
        got = _cpu(tree_flatten(out)[0] + tree_flatten(args)[0])
        _compare_all("gpu", got, want, exact, noisy, originals, len(tree_flatten(out)[0]), dtype, errors)
        return
    _nvrtc_check(exp, state, nvrtc)


def _module_values(model: Any, opt: Any) -> list[torch.Tensor]:
    """Parameters, buffers and optimizer state (in a fixed order) of a ``(model, optimizer)`` pair."""
    out = [t for _, t in sorted(model.state_dict().items())]
    for group in opt.param_groups:
        for p in group["params"]:
            out += [v for _, v in sorted(opt.state.get(p, {}).items()) if isinstance(v, torch.Tensor)]
    return out


def _check_stateful(case: fam.Case, ns: dict, state: dict, errors: dict, nvrtc: bool, gpu: bool) -> None:
    import tkx

    step, (model, opt), inputs = ns["make"](case.seed)
    state["stage"] = "eager"

    def eager(double: bool, noise: float = 0.0, seed: int = 0, device: str = "cpu") -> list[torch.Tensor]:
        s, (m, o), x = ns["make"](case.seed, device)  # made on the device, as its optimizer's state
        if double:
            m.double()
            x = _double(x)
        if noise:  # the parameters and the batch moved by rounding-sized noise
            with torch.no_grad():
                for j, p in enumerate(m.parameters()):
                    p.copy_(_perturbed(p, noise, seed + j + 1))
            x = _perturbed(x, noise, seed)
        loss = s(*x)
        return _cpu([loss] + _module_values(m, o))
    want, exact = _eager_pair(eager)
    dtype = fam.compute_dtype(case)
    noisy = _spread_runs(lambda size, seed: eager(False, size, seed), dtype, case.seed)
    if state.get("eager_only"):  # the canary of a program that killed its process: eager's runs alone
        if gpu:
            _eager_on_device(lambda: eager(False, device=DEVICE))
        return
    state["stage"] = "capture"
    exp = tkx.explore(step, inputs, options=tkx.Options.make(**dict(case.options)), state=(model, opt))
    state["stage"] = "run"
    loss = exp.run(*copy.deepcopy(inputs))
    got = [loss] + _module_values(model, opt)
    if len(got) != len(want):
        raise _Wrong(f"{len(got)} state tensors after the step, eager {len(want)}", "state count")
    for i, (g, w, x) in enumerate(zip(got, want, exact)):
        errors[f"run value {i}"] = compare(f"value {i}", g, w, x, dtype, [run[i] for run in noisy])
    if gpu:  # the kernel on the device updates a fresh model and optimizer moved there
        state["stage"] = "gpu"
        want = _eager_on_device(lambda: eager(False, device=DEVICE))
        dtype = _kernel_dtype(case, dtype)
        noisy = _spread_runs(lambda size, seed: eager(False, size, seed, DEVICE), dtype, case.seed)
        s, (m, o), x = ns["make"](case.seed, DEVICE)
        runner = tkx.runtime.build(s, x, tkx.Options.make(**dict(case.options)), state=(m, o))
        got = _cpu([runner(*x)] + _module_values(m, o))
        if len(got) != len(want):
            raise _Wrong(f"{len(got)} state tensors after the kernel's step, eager {len(want)}", "state count")
        for i, (g, w, x64) in enumerate(zip(got, want, exact)):
            errors[f"gpu value {i}"] = compare(f"value {i}", g, w, x64, dtype, [run[i] for run in noisy])
        return
    _nvrtc_check(exp, state, nvrtc)


def _nvrtc_check(exp: Any, state: dict, nvrtc: bool) -> None:
    """Generate the kernel, check the index of its element reads on the CPU
    (:func:`tkx.codegen.read_check.check_reads`: a read of another element than the IR's is ``wrong``) and
    (``nvrtc``) compile it for the options' arch (sm_90 for ``auto``)."""
    from tkx.codegen.read_check import check_reads

    state["stage"] = "codegen"
    source = exp.cuda
    reads = check_reads(exp.schedule, exp.arena)  # every emitted element read names its view's element
    if reads.problems:
        raise _Wrong(f"kernel read: {reads.problems[0]}", "kernel reads another element")
    if nvrtc:
        state["stage"] = "nvrtc"
        arch = exp.options.arch
        source.check(arch if arch != "auto" else "sm_90")


def check_seed(seed: int, family: str, options: bool = True, nvrtc: bool = True, timeout_s: float = 0.0,
               gpu: bool = False, eager_only: bool = False) -> Outcome:
    """:func:`check` of ``fam.random_case(seed, family, options=options)`` (a campaign worker's job)."""
    return check(fam.random_case(seed, family, options=options), nvrtc=nvrtc, timeout_s=timeout_s, gpu=gpu,
                 eager_only=eager_only)


# -- the injected error (a check of the oracle itself) ---------------------------------------------------

@contextlib.contextmanager
def injected_error(size: float = 1e-3) -> Iterator[list[str]]:
    """While open, every capture runs one more default pass, ``perturbed_constant``: it multiplies the first
    float constant (not 0 or +-1) of the first op that an output or update depends on by ``1 + size`` - a
    rewrite that gets one constant 0.1% wrong. Yields a list that collects the ids of the ops it changed.
    The pass is removed on exit."""
    import tkx
    from tkx.passes.registry import unregister_pass

    hits: list[str] = []

    def perturbed_constant(program: Any) -> Any:
        ops = list(program.ops)
        live = {o.value.buffer for o in (*program.outputs, *program.updates)}
        for op in reversed(ops):
            if op.id in live:
                live |= {x.buffer for x in op.inputs if hasattr(x, "buffer")}
        for i, op in enumerate(ops):
            k = next((j for j, a in enumerate(op.inputs) if type(a) is float and abs(a) not in (0.0, 1.0)
                      and abs(a) < 1e30), None)
            if k is not None and op.id in live:
                ops[i] = op.replace(inputs=op.inputs[:k] + (op.inputs[k] * (1 + size),) + op.inputs[k + 1:])
                hits.append(op.id)
                break
        return program.replace(ops=tuple(ops))

    tkx.register_pass("perturbed_constant", default=True, replace=True)(perturbed_constant)
    try:
        yield hits
    finally:
        unregister_pass("perturbed_constant")


# -- shrinking and reproductions --------------------------------------------------------------------------

def simpler(case: fam.Case, target: Any) -> list[fam.Case]:
    """Simpler versions of ``case`` in one respect, ``target``: ``"options"`` (none at all), ``("option",
    name)`` (that option left out) or a knob's name (its first listed value, then the one before it)."""
    if target == "options":
        return [fam.Case(case.family, case.seed, case.knobs, ())] if case.options else []
    if isinstance(target, tuple):
        rest = tuple(o for o in case.options if o[0] != target[1])
        return [fam.Case(case.family, case.seed, case.knobs, rest)] if rest != case.options else []
    values, value = fam.knob_space(case.family).get(target, ()), case.k.get(target)
    if value not in values:
        return []
    i = values.index(value)
    return [case.replace_knob(target, values[j]) for j in sorted({0, i - 1}) if 0 <= j < i]


def shrink(outcome: Outcome, *, nvrtc: bool = True, budget_s: float = 60.0, timeout_s: float = 0.0) -> Outcome:
    """A simpler case failing the same way (same status, stage and key), within ``budget_s``: sweeps over
    the options and the knobs, keeping each simplification that still fails, until a sweep changes nothing."""
    best = outcome
    deadline = time.perf_counter() + budget_s
    improved = True
    while improved:
        improved = False
        targets = ["options", *(("option", name) for name, _ in best.case.options), *best.case.k]
        for target in targets:
            for cand in simpler(best.case, target):
                if time.perf_counter() > deadline:
                    return best
                o = check(cand, nvrtc=nvrtc and best.stage == "nvrtc", timeout_s=timeout_s, gpu=best.stage == "gpu")
                if (o.status, o.stage, o.key) == (best.status, best.stage, best.key):
                    best, improved = o, True
                    break
    return best


def reproduction(o: Outcome) -> str:
    """A runnable script reproducing ``o`` (run from the repository root: ``python REPRO.py``)."""
    c = o.case
    return "\n".join([
        f"# tkx fuzzer: {o.status} at {o.stage or 'end'}: {o.detail}",
        f"# case: {c!r}",
        "# run from the repository root: PYTHONPATH=. python THIS_FILE",
        fam.source_of(c).rstrip(),
        "",
        "",
        "if __name__ == '__main__':",
        "    import sys",
        "    sys.path.insert(0, 'tests')",
        "    import fuzz_families, fuzz_oracle",
        f"    case = fuzz_families.{c!r}",
        f"    print(fuzz_oracle.check(case, namespace=globals(){', gpu=True' if o.stage == 'gpu' else ''}).line())",
        "",
    ])
