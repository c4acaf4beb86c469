"""A differential fuzzer of whole training steps: random user-level PyTorch steps and random
legal options, each run through tkx's reference interpreter, its schedule interpreter and an
NVRTC compile of the kernel, and compared with eager PyTorch, arbitrated by float64.

A case is a :class:`Config` (plain data: depth, widths, activation, norm, loss, optimizer,
clipping, dtype, views, options). :func:`source_of` writes it as the Python source of a step
function - the form a user would write - and :func:`build` executes that source (registered
with ``linecache`` so tkx's errors quote its lines). :func:`check` runs one case and returns an
:class:`Outcome`: ``ok``, ``refused`` (a tkx error the user can act on, at capture or options),
``crash`` (any other exception, at any stage) or ``wrong`` (numbers outside tolerance that
float64 arbitration does not excuse). :func:`shrink` reduces a failing case field by field to a
small one that still fails, and :func:`reproduction` prints it as a runnable script.

Used by ``tests/test_fuzz.py`` (bounded, in CI) and ``scripts/fuzz-campaign`` (long runs, as the ``mlp`` family).
Builds on user-level steps, not on IR, so that it keeps working when the op table grows.
"""

from __future__ import annotations

import dataclasses
import linecache
import math
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

ACTIVATIONS = ("relu", "tanh", "sigmoid", "gelu", "silu", "leaky_relu", "none")
NORMS = ("none", "layer_norm")
LOSSES = ("mse", "cross_entropy", "l1", "smooth_l1", "bce_logits")
OPTIMIZERS = ("sgd", "sgd_inplace", "momentum", "momentum_inplace", "adam")
CLIPS = ("none", "global_norm", "clamp")
DTYPES = ("float32", "bfloat16_mixed")
VIEWS = ("none", "transposed_input", "reshape")
WIDTHS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 32)
BATCHES = (1, 2, 3, 5, 8, 16)

#: Options drawn in CI (the fusion switches and the execution mode).
SAFE_OPTIONS = {
    "fuse_pointwise": (True, False), "fuse_epilogues": (True, False), "fuse_reductions": (True, False),
    "mode": ("auto", "block", "grid"),
}
#: Options the long campaign adds (tile sizes, threads): crashes there are issue 12's (emitters).
WIDE_OPTIONS = dict(SAFE_OPTIONS, tile_m=(16, 32, 64), tile_n=(16, 32, 64, 128), tile_k=(8, 16, 32),
                    threads_per_block=(64, 128, 256, 512))


@dataclass(frozen=True)
class Config:
    """One random training step (see the module docstring)."""

    seed: int
    batch: int = 4
    widths: tuple[int, ...] = (3, 4, 2)   # input, hidden..., output
    activation: str = "relu"
    norm: str = "none"
    loss: str = "mse"
    optimizer: str = "sgd"
    clip: str = "none"
    dtype: str = "float32"
    view: str = "none"
    bias: bool = True
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def classes(self) -> int:
        return self.widths[-1]


def random_config(seed: int, *, wide: bool = False) -> Config:
    """A random :class:`Config` drawn from ``seed`` (``wide``: also tile and thread options)."""
    rng = random.Random(seed)
    depth = rng.choice((1, 1, 2, 2, 3))
    widths = tuple(rng.choice(WIDTHS) for _ in range(depth + 1))
    loss = rng.choice(LOSSES)
    if loss == "cross_entropy" and widths[-1] < 2:
        widths = widths[:-1] + (rng.choice((2, 3, 5, 10)),)
    space = WIDE_OPTIONS if wide else SAFE_OPTIONS
    options = tuple((k, rng.choice(v)) for k, v in sorted(space.items()) if rng.random() < 0.6)
    return Config(seed=seed, batch=rng.choice(BATCHES), widths=widths, activation=rng.choice(ACTIVATIONS),
                  norm=rng.choice(NORMS) if depth > 1 else "none", loss=loss, optimizer=rng.choice(OPTIMIZERS),
                  clip=rng.choice(CLIPS), dtype=rng.choice(DTYPES), view=rng.choice(VIEWS),
                  bias=rng.random() < 0.7, options=options)


# -- the step as Python source ------------------------------------------------------------------

_ACT = {"relu": "torch.relu({})", "tanh": "torch.tanh({})", "sigmoid": "torch.sigmoid({})",
        "gelu": "F.gelu({})", "silu": "F.silu({})", "leaky_relu": "F.leaky_relu({}, 0.1)", "none": "{}"}
_LOSS = {"mse": "F.mse_loss({out}, y)", "cross_entropy": "F.cross_entropy({out}, y)",
         "l1": "F.l1_loss({out}, y)", "smooth_l1": "F.smooth_l1_loss({out}, y)",
         "bce_logits": "F.binary_cross_entropy_with_logits({out}, y)"}


def _layers(c: Config) -> int:
    return len(c.widths) - 1


def source_of(c: Config) -> str:
    """The step of ``c`` as the Python source a user would write."""
    n = _layers(c)
    lines = ["import torch", "import torch.nn.functional as F", "from torch.func import grad_and_value", "", ""]
    state = c.optimizer in ("momentum", "momentum_inplace", "adam")
    args = "params, state, x, y" if state else "params, x, y"
    lines.append(f"def step({args}):")
    lines.append("    def loss_fn(p):")
    h = "x"
    if c.view == "reshape":
        lines.append(f"        h = x.reshape({c.batch}, -1)")
        h = "h"
    for i in range(n):
        w = f'p["w{i}"]' if c.view != "transposed_input" else f'p["w{i}"].t()'
        cast = ".to(torch.bfloat16)" if c.dtype == "bfloat16_mixed" else ""
        expr = f"{h}{cast} @ {w}{cast}"
        if c.bias:
            expr = f'{expr} + p["b{i}"]{cast}'
        if c.dtype == "bfloat16_mixed":
            expr = f"({expr}).float()"
        lines.append(f"        h = {expr}")
        if i < n - 1:
            if c.norm == "layer_norm":
                lines.append(f"        h = F.layer_norm(h, ({c.widths[i + 1]},))")
            lines.append(f"        h = {_ACT[c.activation].format('h')}")
        h = "h"
    lines.append(f"        return {_LOSS[c.loss].format(out=h)}")
    lines.append("    grads, loss = grad_and_value(loss_fn)(params)")
    if c.clip == "global_norm":
        lines.append("    norm = torch.sqrt(sum((g * g).sum() for g in grads.values()))")
        lines.append("    scale = torch.clamp(1.0 / (norm + 1e-6), max=1.0)")
        lines.append("    grads = {k: g * scale for k, g in grads.items()}")
    elif c.clip == "clamp":
        lines.append("    grads = {k: g.clamp(-0.5, 0.5) for k, g in grads.items()}")
    lr = 0.05
    if c.optimizer == "sgd":
        lines.append(f"    return loss, {{k: p - {lr} * grads[k] for k, p in params.items()}}")
    elif c.optimizer == "sgd_inplace":
        lines.append("    for k, p in params.items():")
        lines.append(f"        p.sub_({lr} * grads[k])")
        lines.append("    return loss")
    elif c.optimizer == "momentum":
        lines.append("    new_m = {k: 0.9 * state[k] + grads[k] for k in params}")
        lines.append(f"    return loss, {{k: p - {lr} * new_m[k] for k, p in params.items()}}, new_m")
    elif c.optimizer == "momentum_inplace":
        lines.append("    for k, p in params.items():")
        lines.append("        state[k].mul_(0.9).add_(grads[k])")
        lines.append(f"        p.sub_({lr} * state[k])")
        lines.append("    return loss")
    else:  # adam, functional, bias correction folded into constants (step 1)
        lines.append("    m = {k: 0.9 * state['m'][k] + 0.1 * grads[k] for k in params}")
        lines.append("    v = {k: 0.999 * state['v'][k] + 0.001 * grads[k] * grads[k] for k in params}")
        lines.append(f"    new = {{k: p - {lr} * (m[k] / 0.1) / (torch.sqrt(v[k] / 0.001) + 1e-8) "
                     "for k, p in params.items()}")
        lines.append("    return loss, new, {'m': m, 'v': v}")
    return "\n".join(lines) + "\n"


def inputs_of(c: Config, seed: int | None = None) -> tuple:
    """Example inputs of ``c`` (fresh tensors; ``seed`` defaults to the config's)."""
    g = torch.Generator().manual_seed(c.seed if seed is None else seed)
    n = _layers(c)
    params = {}
    for i in range(n):
        fan_in, fan_out = c.widths[i], c.widths[i + 1]
        w = torch.randn(fan_in, fan_out, generator=g) / math.sqrt(fan_in)
        # transposed_input: the step reads p["w"].t(), and p["w"] itself is a strided view
        params[f"w{i}"] = w.t() if c.view == "transposed_input" else w
        if c.bias:
            params[f"b{i}"] = torch.randn(fan_out, generator=g) * 0.1
    x = torch.randn(c.batch, c.widths[0], generator=g)
    if c.loss == "cross_entropy":
        y = torch.randint(0, c.classes, (c.batch,), generator=g)
    elif c.loss == "bce_logits":
        y = torch.rand(c.batch, c.classes, generator=g).round()
    else:
        y = torch.randn(c.batch, c.classes, generator=g)
    if c.optimizer in ("momentum", "momentum_inplace"):
        return params, {k: torch.randn(v.shape, generator=g) * 0.01 for k, v in params.items()}, x, y
    if c.optimizer == "adam":
        return params, {"m": {k: torch.zeros_like(v) for k, v in params.items()},
                        "v": {k: torch.full_like(v, 1e-4) for k, v in params.items()}}, x, y
    return params, x, y


def build(c: Config) -> Any:
    """The step function of ``c``, executed from :func:`source_of` under a fake file name
    that ``linecache`` knows (so tkx's errors quote the generated lines)."""
    text = source_of(c)
    filename = f"<fuzz-step-{c.seed}-{abs(hash(text)) % 10**8}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(text, filename, "exec"), namespace)
    return namespace["step"]


# -- running one case ---------------------------------------------------------------------------

@dataclass
class Outcome:
    """What :func:`check` found: ``status`` (``ok``/``refused``/``crash``/``wrong``), the
    ``stage`` it happened in, a one-line ``detail`` and the ``seconds`` it took."""

    config: Config
    status: str
    stage: str = ""
    detail: str = ""
    seconds: float = 0.0
    errors: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in ("crash", "wrong")

    def line(self) -> str:
        return f"seed {self.config.seed}: {self.status} {self.stage} {self.detail}".rstrip()


def _clone(tree: Any) -> Any:
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _double(tree: Any) -> Any:
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else
                    (t.clone() if isinstance(t, torch.Tensor) else t), tree)


def _eager(step: Any, inputs: tuple) -> list[torch.Tensor]:
    """Eager outputs then every input leaf after the step (in-place updates included)."""
    from torch.utils._pytree import tree_flatten
    args = _clone(inputs)
    out = step(*args)
    return tree_flatten(out)[0] + tree_flatten(args)[0]


def _tkx_values(program: Any, run: Any, n_inputs: int) -> list[torch.Tensor | None]:
    """Outputs, then the new value of every input leaf the step updates (``None`` for the rest)."""
    return list(run.outputs) + [run.updates.get(i) for i in range(n_inputs)]


def tolerance(dtype: str) -> float:
    return 3e-2 if dtype == "bfloat16_mixed" else 1e-5


ARBITRATION = 4.0


def _compare(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, tol: float) -> tuple[bool, float]:
    from tkx.runtime.verify import relative_error
    err = relative_error(got, eager)
    if err <= tol:
        return True, err
    if not got.is_floating_point():
        return False, err
    mine, theirs = relative_error(got, exact.to(torch.float64)), relative_error(eager, exact.to(torch.float64))
    return mine <= max(tol, ARBITRATION * theirs), err


def check(c: Config, *, nvrtc: bool = True, arch: str = "sm_90") -> Outcome:
    """Run case ``c`` through capture, the reference interpreter, the schedule interpreter
    and (``nvrtc``) an NVRTC compile, against eager with float64 arbitration."""
    import tkx
    from tkx.schedule import interpreter

    start = time.perf_counter()
    stage = "build"

    def done(status: str, detail: str = "", **kw: Any) -> Outcome:
        return Outcome(c, status, stage, detail, time.perf_counter() - start, **kw)

    try:
        step = build(c)
        inputs = inputs_of(c)
        stage = "eager"
        want = _eager(step, inputs)
        exact = _eager(step, _double(inputs))
        stage = "options"
        try:
            options = tkx.Options.make(**dict(c.options))
        except tkx.OptionsError as e:
            return done("refused", f"OptionsError: {e}")
        stage = "capture"
        try:
            exp = tkx.explore(step, inputs, options=options)
            program = exp.program
        except tkx.UnsupportedError as e:
            return done("refused", f"{e.kind}: {e.what}")
        n_in = len(program.inputs)
        errors: dict[str, float] = {}
        for stage_name, make in (("reference", lambda: tkx.reference.run(exp.optimized, inputs)),
                                 ("schedule", lambda: interpreter.run(exp.schedule, exp.arena, inputs))):
            stage = stage_name
            got = _tkx_values(program, make(), n_in)
            for k, (g, w, x) in enumerate(zip(got, want, exact)):
                if g is None:  # an input the step does not update
                    continue
                ok, err = _compare(g, w, x, tolerance(c.dtype))
                errors[f"{stage_name}[{k}]"] = err
                if not ok:
                    return done("wrong", f"value {k} differs from eager by {err:.3g}", errors=errors)
        stage = "codegen"
        source = exp.cuda
        if nvrtc:
            stage = "nvrtc"
            source.check(arch)
        stage = ""
        return done("ok", errors=errors)
    except Exception as e:  # noqa: BLE001 - every other exception is a finding
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(tb) if "/tkx/" in f.filename), "")
        text = str(e).splitlines()[0] if str(e) else ""
        return done("crash", f"{type(e).__name__}: {text[:200]} ({where})")


# -- shrinking ----------------------------------------------------------------------------------

def _simpler(c: Config) -> list[Config]:
    """Candidate simplifications of ``c``, simplest first."""
    out = []
    r = dataclasses.replace
    if c.options:
        out.append(r(c, options=()))
        out += [r(c, options=tuple(o for o in c.options if o != drop)) for drop in c.options]
    if len(c.widths) > 2:
        out.append(r(c, widths=(c.widths[0], c.widths[-1]), norm="none"))
        out.append(r(c, widths=c.widths[:1] + c.widths[2:], norm=c.norm if len(c.widths) > 3 else "none"))
    for name, simple in (("clip", "none"), ("optimizer", "sgd"), ("dtype", "float32"), ("view", "none"),
                         ("norm", "none"), ("activation", "none"), ("loss", "mse"), ("bias", False)):
        if getattr(c, name) != simple:
            out.append(r(c, **{name: simple}))
    if c.batch > 1:
        out.append(r(c, batch=1))
        out.append(r(c, batch=max(1, c.batch // 2)))
    for i, w in enumerate(c.widths):
        floor = 2 if (i == len(c.widths) - 1 and c.loss == "cross_entropy") else 1
        if w > floor:
            out.append(r(c, widths=c.widths[:i] + (floor,) + c.widths[i + 1:]))
            if w // 2 > floor:
                out.append(r(c, widths=c.widths[:i] + (w // 2,) + c.widths[i + 1:]))
    return out


def shrink(outcome: Outcome, *, nvrtc: bool = True, budget_s: float = 60.0) -> Outcome:
    """A smaller case failing the same way (same status and stage), greedily, within ``budget_s``."""
    best = outcome
    deadline = time.perf_counter() + budget_s
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for cand in _simpler(best.config):
            if time.perf_counter() > deadline:
                break
            o = check(cand, nvrtc=nvrtc and best.stage == "nvrtc")
            if o.status == best.status and o.stage == best.stage:
                best = o
                improved = True
                break
    return best


def reproduction(o: Outcome) -> str:
    """A runnable script reproducing ``o``."""
    c = o.config
    opts = ", ".join(f"{k}={v!r}" for k, v in c.options)
    return "\n".join([
        f"# tkx fuzzer: {o.status} at {o.stage or 'end'}: {o.detail}",
        f"# config: {c}",
        source_of(c).rstrip(),
        "",
        "import sys; sys.path.insert(0, 'tests')",
        "from fuzz import Config, inputs_of",
        f"inputs = inputs_of({c!r})",
        "import tkx",
        f"exp = tkx.explore(step, inputs{', ' + opts if opts else ''})",
        "print(tkx.reference.run(exp.optimized, inputs).outputs, step(*inputs))",
    ])
