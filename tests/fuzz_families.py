"""Random training steps over the model families people write, as Python source.

A :class:`Case` is plain data: a family name, a seed, the family's knobs (sizes, mask kind, norm
kind, ...), the step's knobs shared by every family (optimizer, mixed precision, clipping, update
style) and a set of legal :class:`tkx.Options`. :func:`source_of` writes the case as the source of a
module defining ``step(...)`` and ``make_inputs(seed)`` - the form a user would write - so a failure
is reproduced by running that text. :func:`random_case` draws a case; every knob's values are listed
simplest first, which is what :mod:`fuzz_oracle`'s shrinker walks towards.

Families (``FAMILIES``): ``sdpa`` (``F.scaled_dot_product_attention``: causal, boolean and additive
masks, key padding, rows that see no key, grouped-query attention by repeat, dropout), ``attention``
(softmax over masked scores written out), ``norm`` (RMSNorm, LayerNorm, BatchNorm in training with
running statistics and in evaluation), ``conv`` (``conv2d`` with stride, padding, dilation and groups,
then max or average pooling), ``index`` (embeddings, gather, scatter-add, ``index_add``/``index_put``
and advanced indexing, always with duplicate indices), ``views`` (``cat``/``split``/``chunk``/``stack``,
slicing and their backward), ``random`` (dropout, ``rand``/``randn``/``bernoulli``) and ``module``:
an ``nn.Module`` with a ``torch.optim`` optimizer passed as ``state=(model, opt)``, drawn only when
:func:`tkx.explore` takes ``state``. Random ops draw inside ``tkx.random.philox`` so eager and tkx
use the same numbers.

The step's optimizer is written by hand (SGD with momentum/Nesterov/weight decay, Adam, AdamW, AMSGrad,
RMSprop plain and centered, Adagrad, as in ``torch.optim``'s documentation), in place or functional;
mixed precision is ``torch.autocast`` (bf16, fp16) with GradScaler's two ATen ops.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Any

#: Knobs of the step around every family's loss (values simplest first).
STEP_KNOBS: dict[str, tuple] = {
    "optimizer": ("sgd", "momentum", "nesterov", "adam", "adamw", "amsgrad", "rmsprop", "rmsprop_centered",
                  "adagrad"),
    "weight_decay": (0.0, 0.01),
    "maximize": (False, True),
    "update": ("inplace", "functional"),
    "clip": ("none", "global_norm"),
    "amp": ("none", "bf16", "fp16", "fp16_scaler"),
}

#: Each family's knobs (values simplest first).
FAMILY_KNOBS: dict[str, dict[str, tuple]] = {
    "sdpa": {"batch": (1, 2, 3), "kv_heads": (1, 2, 3), "group": (1, 2, 4), "q_len": (1, 2, 3, 5, 8, 17, 33),
             "k_len": ("same", 1, 3, 7, 16, 19, 40), "head_dim": (1, 2, 4, 8, 16, 17, 32),
             "embed": (2, 4, 8, 13, 16), "mask": ("none", "causal", "bool", "additive", "key_padding",
                                                 "causal_padding"),
             "empty_rows": (False, True), "dropout": (0.0, 0.1, 0.5), "scale": (None, 0.3),
             "gqa": ("repeat_interleave", "expand")},
    "attention": {"batch": (1, 2, 3), "heads": (1, 2, 3), "length": (1, 2, 3, 5, 8, 17, 33),
                  "head_dim": (1, 2, 4, 8, 16, 17), "mask": ("none", "causal_inf", "causal_large", "random_inf",
                                                             "additive"),
                  "softmax": ("method", "functional_fp32", "log_softmax_exp"), "dropout": (0.0, 0.1)},
    "norm": {"kind": ("layer_norm", "layer_norm_plain", "rms_norm", "rms_manual", "batch_norm_train",
                      "batch_norm_eval"),
             "batch": (2, 1, 3, 5, 8), "channels": (1, 2, 3, 7, 16, 17), "length": (None, 1, 3, 5),
             "eps": (1e-5, 1e-2), "width": (3, 1, 8, 13)},
    "conv": {"batch": (1, 2, 3), "in_group": (1, 2, 3), "out_group": (1, 2, 4), "groups": (1, 2, 3),
             "height": (1, 3, 5, 7, 8, 9, 12), "width": (1, 3, 5, 8, 11), "kernel": (1, 2, 3, 5),
             "stride": (1, 2, 3), "padding": (0, 1, 2, "same"), "dilation": (1, 2), "bias": (False, True),
             "pool": ("none", "max", "avg", "avg_exclude_pad", "max_ceil"), "pool_kernel": (1, 2, 3),
             "pool_stride": (None, 1, 2), "pool_padding": (0, 1)},
    "index": {"op": ("embedding", "advanced", "gather", "scatter_add", "index_add", "index_put"),
              "rows": (1, 2, 3, 5, 17), "dim": (1, 2, 4, 7, 16), "batch": (1, 2, 3), "length": (1, 3, 5, 8, 13),
              "padding_idx": (None, 0), "second": ("none", "embedding", "gather")},
    "views": {"pattern": ("split_cat", "chunk_stack", "slices", "narrow_flip", "strided", "unbind_sum",
                          "transpose_slice"),
              "batch": (1, 2, 3, 5), "inner": (1, 2, 3, 4, 7, 16), "width": (2, 3, 6, 8, 9, 17, 33)},
    "random": {"op": ("dropout", "dropout_eval", "randn_like", "bernoulli", "rand", "alpha_dropout"),
               "p": (0.1, 0.5, 0.9, 0.0), "batch": (1, 2, 5, 8), "width": (1, 3, 8, 17), "hidden": (2, 5, 16, 33)},
    "mlp": {"config": tuple(range(400))},
    "module": {"optimizer": ("SGD", "SGD_momentum", "SGD_nesterov", "Adam", "Adam_amsgrad", "AdamW", "RMSprop",
                             "RMSprop_centered", "Adagrad"),
               "foreach": (False, True), "weight_decay": (0.0, 0.01), "norm": ("none", "layer", "batch"),
               "mode": ("train", "eval"), "clip": ("none", "clip_grad_norm"),
               "batch": (2, 3, 8), "width": (3, 5, 16), "hidden": (4, 7, 32), "classes": (2, 3, 10)},
}

FAMILIES = tuple(FAMILY_KNOBS)
#: Families passing ``state=(model, optimizer)`` to tkx.
STATEFUL = ("module",)
#: Families writing their own step (no optimizer or mixed-precision knobs): ``mlp`` is the MLP
#: generator of :mod:`fuzz` (its config number a knob), ``module`` the stateful step.
OWN_STEP = ("mlp", *STATEFUL)

#: Knobs whose first (simplest) value is drawn with this probability, the rest evenly: mixed precision in
#: about a third of the steps, rows that see no key in three masked attentions of ten.
FIRST_VALUE = {"amp": 0.65, "empty_rows": 0.7}

#: Options fields drawn (the rest - passes, rules, backend, timeline, spin_limit - stay default).
SKIPPED_OPTIONS = ("passes", "rules", "backend", "timeline", "spin_limit")


@dataclass(frozen=True)
class Case:
    """One random program: ``family``, ``seed`` (its inputs), ``knobs`` (the family's and the step's,
    as sorted ``(name, value)`` pairs) and ``options`` (``(name, value)`` pairs of :class:`tkx.Options`)."""

    family: str
    seed: int
    knobs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def k(self) -> dict[str, Any]:
        return dict(self.knobs)

    def replace_knob(self, name: str, value: Any) -> Case:
        return Case(self.family, self.seed, tuple(sorted({**self.k, name: value}.items())), self.options)

    def label(self) -> str:
        return f"{self.family}-{self.seed}"


def state_available() -> bool:
    """Whether :func:`tkx.explore` takes ``state=(model, optimizer)`` (the module family needs it)."""
    import tkx
    return "state" in inspect.signature(tkx.explore).parameters


def families_available() -> tuple[str, ...]:
    return tuple(f for f in FAMILIES if f not in STATEFUL or state_available())


def knob_space(family: str) -> dict[str, tuple]:
    """Every knob of ``family`` with its values, simplest first."""
    return dict(FAMILY_KNOBS[family]) if family in OWN_STEP else {**FAMILY_KNOBS[family], **STEP_KNOBS}


def random_options(rng: random.Random, p: float = 0.35) -> tuple[tuple[str, Any], ...]:
    """A random legal set of :class:`tkx.Options` fields (each drawn with probability ``p``)."""
    from tkx import Options, OptionsError
    for _ in range(50):
        chosen = {}
        for name, _default, allowed, _help in Options.fields_info():
            if name in SKIPPED_OPTIONS or rng.random() >= p or allowed is None:
                continue
            if allowed[0] == "range":
                lo, hi = allowed[1], allowed[2] or 64
                chosen[name] = rng.randint(lo, hi)
            else:
                chosen[name] = rng.choice(allowed)
        try:
            Options.make(**chosen)
        except OptionsError:
            continue
        return tuple(sorted(chosen.items()))
    return ()


def random_case(seed: int, family: str | None = None, *, options: bool = True) -> Case:
    """A random :class:`Case` from ``seed`` (``family``: a given one, else any available)."""
    rng = random.Random(seed)
    family = family or rng.choice(families_available())
    knobs = {}
    for name, values in knob_space(family).items():
        if name in FIRST_VALUE:
            knobs[name] = values[0] if rng.random() < FIRST_VALUE[name] else rng.choice(values[1:])
        else:
            knobs[name] = rng.choice(values)
    return Case(family, seed, tuple(sorted(knobs.items())), random_options(rng) if options else ())


def compute_dtype(case: Case) -> str:
    """The dtype the case computes in: ``float32``, ``bfloat16`` or ``float16``."""
    if case.family == "mlp":
        return "bfloat16" if _mlp_config(case).dtype == "bfloat16_mixed" else "float32"
    amp = case.k.get("amp", "none")
    return {"none": "float32", "bf16": "bfloat16"}.get(amp, "float16")


def uses_random(case: Case) -> bool:
    k = case.k
    return case.family == "random" or bool(k.get("dropout"))


# -- the families' losses -----------------------------------------------------------------------------
# Each returns (lines of make_inputs that fill `P` (parameters) and define the data, the data's names,
# lines of loss_fn's body that set `loss` from `p` and the data).

def _sdpa(k: dict) -> tuple[list[str], list[str], list[str]]:
    b, hk, grp, lq, d, e = k["batch"], k["kv_heads"], k["group"], k["q_len"], k["head_dim"], k["embed"]
    lk = lq if k["k_len"] == "same" else k["k_len"]
    h = hk * grp
    init = [f"P['wq'] = r({e}, {h * d}) / {e ** 0.5:.4f}", f"P['wk'] = r({e}, {hk * d}) / {e ** 0.5:.4f}",
            f"P['wv'] = r({e}, {hk * d}) / {e ** 0.5:.4f}", f"P['wo'] = r({h * d}, {e}) / {(h * d) ** 0.5:.4f}",
            f"x = r({b}, {lq}, {e})", f"y = r({b}, {lq}, {e})"]
    data = ["x", "y"]
    kv = "x"
    if k["k_len"] != "same":
        init.append(f"mem = r({b}, {lk}, {e})")
        data.append("mem")
        kv = "mem"
    mask, empty = k["mask"], k["empty_rows"]
    if mask == "bool":
        init += [f"mask = torch.rand({lq}, {lk}, generator=g) > 0.4",
                 f"mask[torch.arange({lq}), torch.arange({lq}) % {lk}] = True"]
        if empty:
            init.append("mask[0] = False")
    elif mask == "additive":
        init += [f"keep = torch.rand({b}, 1, {lq}, {lk}, generator=g) > 0.4",
                 f"keep[..., torch.arange({lq}), torch.arange({lq}) % {lk}] = True"]
        if empty:
            init.append("keep[0, :, -1] = False")
        init.append(f"mask = torch.where(keep, 0.3 * r({b}, 1, {lq}, {lk}), float('-inf'))")
    elif mask == "key_padding":
        init += [f"lens = torch.randint(1, {lk + 1}, ({b},), generator=g)"]
        if empty:
            init.append("lens[0] = 0")
        init.append(f"mask = (torch.arange({lk})[None, :] < lens[:, None])[:, None, None, :]")
    elif mask == "causal_padding":  # left padding when rows may be empty, else right padding
        if empty:
            init += [f"pad = torch.randint(1, {lk + 1}, ({b},), generator=g)",
                     f"keys = torch.arange({lk})[None, :] >= pad[:, None]"]
        else:
            init += [f"lens = torch.randint(1, {lk + 1}, ({b},), generator=g)",
                     f"keys = torch.arange({lk})[None, :] < lens[:, None]"]
        init.append(f"mask = (torch.ones({lq}, {lk}, dtype=torch.bool).tril()[None] & keys[:, None, :])[:, None]")
    if mask not in ("none", "causal"):
        data.append("mask")
    if k["gqa"] == "repeat_interleave":
        rep = [f"    k = k.repeat_interleave({grp}, dim=1)", f"    v = v.repeat_interleave({grp}, dim=1)"]
    else:
        rep = [f"    k = k[:, :, None].expand({b}, {hk}, {grp}, {lk}, {d}).reshape({b}, {h}, {lk}, {d})",
               f"    v = v[:, :, None].expand({b}, {hk}, {grp}, {lk}, {d}).reshape({b}, {h}, {lk}, {d})"]
    kwargs = ["attn_mask=mask" if "mask" in data else "", "is_causal=True" if mask == "causal" else "",
              f"dropout_p={k['dropout']}" if k["dropout"] else "", f"scale={k['scale']}" if k["scale"] else ""]
    loss = [f"    q = (x @ p['wq']).reshape({b}, {lq}, {h}, {d}).transpose(1, 2)",
            f"    k = ({kv} @ p['wk']).reshape({b}, {lk}, {hk}, {d}).transpose(1, 2)",
            f"    v = ({kv} @ p['wv']).reshape({b}, {lk}, {hk}, {d}).transpose(1, 2)", *rep,
            f"    o = F.scaled_dot_product_attention(q, k, v{''.join(', ' + a for a in kwargs if a)})",
            f"    o = o.transpose(1, 2).reshape({b}, {lq}, {h * d}) @ p['wo']",
            "    loss = F.mse_loss(o, y)"]
    return init, data, loss


def _attention(k: dict) -> tuple[list[str], list[str], list[str]]:
    b, h, n, d = k["batch"], k["heads"], k["length"], k["head_dim"]
    e = h * d
    init = [f"P['wqkv'] = r({e}, {3 * e}) / {e ** 0.5:.4f}", f"x = r({b}, {n}, {e})", f"y = r({b}, {n}, {e})"]
    data = ["x", "y"]
    mask = k["mask"]
    lines = [f"    q, k, v = (x @ p['wqkv']).reshape({b}, {n}, 3, {h}, {d}).permute(2, 0, 3, 1, 4).unbind(0)",
             f"    s = (q @ k.transpose(-2, -1)) / {d ** 0.5:.4f}"]
    if mask in ("causal_inf", "causal_large"):
        # a large negative fill as users write it for their dtype: -1e9 overflows float16 (eager refuses it)
        large = "torch.finfo(s.dtype).min" if k.get("amp") in ("fp16", "fp16_scaler") else "-1e9"
        fill = "float('-inf')" if mask == "causal_inf" else large
        lines.append(f"    s = s.masked_fill(torch.ones({n}, {n}, dtype=torch.bool, device=s.device).triu(1), {fill})")
    elif mask == "random_inf":
        init += [f"mask = torch.rand({b}, 1, {n}, {n}, generator=g) < 0.3",
                 f"mask[..., torch.arange({n}), torch.arange({n})] = False"]
        data.append("mask")
        lines.append("    s = s.masked_fill(mask, float('-inf'))")
    elif mask == "additive":
        init.append(f"bias = r({h}, {n}, {n})")
        data.append("bias")
        lines.append("    s = s + bias")
    soft = {"method": "s.softmax(-1)", "functional_fp32": "F.softmax(s, dim=-1, dtype=torch.float32).to(s.dtype)",
            "log_softmax_exp": "torch.exp(F.log_softmax(s, dim=-1))"}[k["softmax"]]
    lines.append(f"    a = {soft}")
    if k["dropout"]:
        lines.append(f"    a = F.dropout(a, {k['dropout']})")
    lines += [f"    o = (a @ v).transpose(1, 2).reshape({b}, {n}, {e})", "    loss = F.mse_loss(o, y)"]
    return init, data, lines


def _norm(k: dict) -> tuple[list[str], list[str], list[str]]:
    n, c, length, w, eps, kind = k["batch"], k["channels"], k["length"], k["width"], k["eps"], k["kind"]
    lead = f"{n}" if length is None else f"{n}, {length}"  # channels last for the linear layers
    init = [f"P['w1'] = r({w}, {c}) / {w ** 0.5:.4f}", f"P['gamma'] = 1 + 0.1 * r({c})", f"P['beta'] = 0.1 * r({c})",
            f"P['w2'] = r({c}, 3) / {c ** 0.5:.4f}", f"x = r({lead}, {w})", f"y = r({lead}, 3)"]
    data = ["x", "y"]
    lines = ["    h = x @ p['w1']"]
    if kind == "layer_norm":
        lines.append(f"    h = F.layer_norm(h, ({c},), p['gamma'], p['beta'], eps={eps})")
    elif kind == "layer_norm_plain":
        dims = f"({c},)" if length is None else f"({length}, {c})"
        lines.append(f"    h = F.layer_norm(h, {dims}, eps={eps}) * p['gamma'] + p['beta']")
    elif kind == "rms_norm":
        lines.append(f"    h = F.rms_norm(h, ({c},), p['gamma'], eps={eps})")
    elif kind == "rms_manual":
        lines.append(f"    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + {eps}) * p['gamma']")
    else:
        init += [f"running_mean = 0.1 * r({c})", f"running_var = 1 + 0.1 * torch.rand({c}, generator=g)"]
        data += ["running_mean", "running_var"]
        train = kind == "batch_norm_train"
        t = ".transpose(1, 2)" if length is not None else ""
        lines.append(f"    h = F.batch_norm(h{t}, running_mean, running_var, p['gamma'], p['beta'], "
                     f"training={train}, momentum=0.1, eps={eps}){t}")
    lines += ["    h = F.gelu(h) @ p['w2']", "    loss = F.mse_loss(h, y)"]
    return init, data, lines


def _legal_size(n: int, k: dict, stride: int) -> int:
    """The smallest image side from ``n`` up whose convolution and pooling outputs are not empty."""
    pad = 0 if k["padding"] == "same" else k["padding"]
    pool_pad = min(k["pool_padding"], k["pool_kernel"] // 2)
    while True:
        out = n if k["padding"] == "same" else (n + 2 * pad - k["dilation"] * (k["kernel"] - 1) - 1) // stride + 1
        if out >= 1 and (k["pool"] == "none" or out + 2 * pool_pad >= k["pool_kernel"]):
            return n
        n += 1


def _conv(k: dict) -> tuple[list[str], list[str], list[str]]:
    g_, cin, cout = k["groups"], k["in_group"] * k["groups"], k["out_group"] * k["groups"]
    kk, pad = k["kernel"], k["padding"]
    padding = "'same'" if pad == "same" else pad
    stride = 1 if pad == "same" else k["stride"]
    sizes = [_legal_size(n, k, stride) for n in (k["height"], k["width"])]
    init = [f"P['w'] = r({cout}, {k['in_group']}, {kk}, {kk}) / {(k['in_group'] * kk * kk) ** 0.5:.4f}",
            f"x = r({k['batch']}, {cin}, {sizes[0]}, {sizes[1]})"]
    bias = ""
    if k["bias"]:
        init.append(f"P['b'] = 0.1 * r({cout})")
        bias = ", p['b']"
    lines = [f"    h = F.conv2d(x, p['w']{bias}, stride={stride}, padding={padding}, dilation={k['dilation']}, "
             f"groups={g_})"]
    pk, ps, pp = k["pool_kernel"], k["pool_stride"], min(k["pool_padding"], k["pool_kernel"] // 2)
    pool = k["pool"]
    if pool in ("max", "max_ceil"):
        lines.append(f"    h = F.max_pool2d(h, {pk}, stride={ps}, padding={pp}, ceil_mode={pool == 'max_ceil'})")
    elif pool in ("avg", "avg_exclude_pad"):
        lines.append(f"    h = F.avg_pool2d(h, {pk}, stride={ps}, padding={pp}, "
                     f"count_include_pad={pool == 'avg'})")
    lines.append("    loss = (torch.tanh(h) * h).mean()")
    return init, ["x"], lines


def _index(k: dict) -> tuple[list[str], list[str], list[str]]:
    v, d, b, n, op = k["rows"], k["dim"], k["batch"], k["length"], k["op"]
    pad = k["padding_idx"]
    init = [f"P['table'] = r({v}, {d})", f"P['w'] = r({d}, 2) / {d ** 0.5:.4f}",
            f"tokens = torch.randint(0, {v}, ({b}, {n}), generator=g)", f"y = r({b}, {n}, 2)"]
    data = ["tokens", "y"]
    if op == "embedding":
        lines = [f"    h = F.embedding(tokens, p['table']{f', padding_idx={pad}' if pad is not None else ''})"]
    elif op == "advanced":
        lines = ["    h = p['table'][tokens]"]
    elif op == "gather":
        index = f"tokens.reshape(-1, 1).expand({b * n}, {d})"
        lines = [f"    h = torch.gather(p['table'], 0, {index}).reshape({b}, {n}, {d})"]
    else:
        init.append(f"P['src'] = r({b * n}, {d})")
        flat = "tokens.reshape(-1)"
        zeros = f"p['table'].new_zeros({v}, {d})"
        acc = {"scatter_add": f"{zeros}.scatter_add(0, {flat}[:, None].expand({b * n}, {d}), p['src'])",
               "index_add": f"{zeros}.index_add(0, {flat}, p['src'])",
               "index_put": f"{zeros}.index_put(({flat},), p['src'], accumulate=True)"}[op]
        lines = [f"    acc = p['table'] * {acc}", "    h = acc[tokens]"]
    if k["second"] == "embedding":
        lines.append("    h = h + F.embedding(tokens.flip(-1), p['table'])")
    elif k["second"] == "gather":
        lines.append(f"    h = h + torch.gather(h, 2, tokens[..., None].expand({b}, {n}, {d}) % {d})")
    lines += ["    loss = F.mse_loss(torch.tanh(h) @ p['w'], y)"]
    return init, data, lines


def _views(k: dict) -> tuple[list[str], list[str], list[str]]:
    b, m, w = k["batch"], k["inner"], k["width"]
    init = [f"P['w'] = r({m}, {w}) / {m ** 0.5:.4f}", f"P['u'] = r({w})", f"x = r({b}, {m})"]
    lines = ["    h = x @ p['w']"]
    first = max(1, w // 3)
    pattern = k["pattern"]
    if pattern == "split_cat":
        lines += [f"    a, c = h.split([{first}, {w - first}], dim=1)",
                  "    h = torch.cat([c * 2, torch.sigmoid(a), a], dim=1)", "    h = h[:, :" + str(w) + "]"]
    elif pattern == "chunk_stack":
        lines += ["    parts = h.chunk(2, dim=1)", "    h = torch.stack([t.sum(1) for t in parts], dim=1)",
                  f"    h = torch.cat([h, x @ p['w'][:, :1]], dim=1).repeat(1, {w})[:, :{w}]"]
    elif pattern == "slices":
        lines += ["    h = torch.cat([h[:, 1:], h[:, :1] * 3], dim=1)",
                  "    h = h[..., -1:] + h[:, ::2].sum(1, keepdim=True) + h"]
    elif pattern == "narrow_flip":
        lines += [f"    h = h.narrow(1, {w - first}, {first}).flip(1).repeat(1, {w // first + 1})[:, :{w}] * h"]
    elif pattern == "strided":
        lines += ["    even, odd = h[:, ::2], h[:, 1::2]", "    h = torch.cat([odd, even], 1) * h.exp()"]
    elif pattern == "unbind_sum":
        lines += ["    h = torch.stack(h.unbind(1)[::-1], 1) + h.t().contiguous().t()"]
    else:
        lines += [f"    h = h.reshape({b}, {w}, 1).transpose(0, 1)[1:].transpose(0, 1).reshape({b}, {w - 1})",
                  "    h = F.pad(h, (0, 1))"]
    lines += ["    loss = (torch.tanh(h) * p['u']).sum() / " + str(b)]
    return init, ["x"], lines


def _random(k: dict) -> tuple[list[str], list[str], list[str]]:
    b, w, hid, prob, op = k["batch"], k["width"], k["hidden"], k["p"], k["op"]
    init = [f"P['w1'] = r({w}, {hid}) / {w ** 0.5:.4f}", f"P['w2'] = r({hid}, 2) / {hid ** 0.5:.4f}",
            f"x = r({b}, {w})", f"y = r({b}, 2)"]
    noise = {"dropout": f"F.dropout(h, {prob})", "dropout_eval": f"F.dropout(h, {prob}, training=False)",
             "randn_like": f"h + {prob} * torch.randn_like(h)",
             "bernoulli": f"h * torch.bernoulli(torch.full_like(h, {1 - prob}))",
             "rand": f"h * (torch.rand({b}, {hid}, device=h.device) >= {prob}).to(h.dtype)",
             "alpha_dropout": f"F.dropout(F.relu(h), {prob}) + torch.rand_like(h)"}[op]
    lines = ["    h = torch.relu(x @ p['w1'])", f"    h = {noise}", "    loss = F.mse_loss(h @ p['w2'], y)"]
    return init, ["x", "y"], lines


_LOSSES = {"sdpa": _sdpa, "attention": _attention, "norm": _norm, "conv": _conv, "index": _index,
           "views": _views, "random": _random}

_HEADER = ["import torch", "import torch.nn.functional as F", "import tkx", ""]


# -- the step around the loss ---------------------------------------------------------------------------

_STATE_OF = {"sgd": (), "momentum": ("buf",), "nesterov": ("buf",), "adam": ("m", "v"), "adamw": ("m", "v"),
             "amsgrad": ("m", "v", "vmax"), "rmsprop": ("sq",), "rmsprop_centered": ("sq", "avg"),
             "adagrad": ("sum",)}
_LR = {"sgd": 0.05, "momentum": 0.05, "nesterov": 0.05, "adam": 0.01, "adamw": 0.01, "amsgrad": 0.01,
       "rmsprop": 0.01, "rmsprop_centered": 0.01, "adagrad": 0.05}


def _update_lines(k: dict) -> list[str]:
    """The optimizer's update of one parameter ``p`` with gradient ``g``: sets ``new_p`` and ``new[name]``."""
    opt, lr, wd = k["optimizer"], _LR[k["optimizer"]], k["weight_decay"]
    out = []
    if k["maximize"]:
        out.append("g = -g")
    if wd and opt != "adamw":
        out.append(f"g = g + {wd} * p")
    if opt == "sgd":
        out.append(f"new_p = p - {lr} * g")
    elif opt in ("momentum", "nesterov"):
        out.append("new['buf'] = 0.9 * state['buf'][key] + g")
        out.append(f"new_p = p - {lr} * " + ("(g + 0.9 * new['buf'])" if opt == "nesterov" else "new['buf']"))
    elif opt in ("adam", "adamw", "amsgrad"):
        out += ["new['m'] = 0.9 * state['m'][key] + 0.1 * g", "new['v'] = 0.999 * state['v'][key] + 0.001 * g * g"]
        second = "new['v']"
        if opt == "amsgrad":
            out.append("new['vmax'] = torch.maximum(state['vmax'][key], new['v'])")
            second = "new['vmax']"
        base = f"p * {1 - lr * wd}" if opt == "adamw" and wd else "p"
        out.append(f"new_p = {base} - {lr} * (new['m'] / (1 - 0.9 ** t)) / "
                   f"(torch.sqrt({second} / (1 - 0.999 ** t)) + 1e-8)")
    elif opt in ("rmsprop", "rmsprop_centered"):
        out.append("new['sq'] = 0.99 * state['sq'][key] + 0.01 * g * g")
        if opt == "rmsprop_centered":
            out += ["new['avg'] = 0.99 * state['avg'][key] + 0.01 * g",
                    "den = torch.sqrt(new['sq'] - new['avg'] * new['avg']) + 1e-8"]
        else:
            out.append("den = new['sq'].sqrt() + 1e-8")
        out.append(f"new_p = p - {lr} * g / den")
    else:
        out += ["new['sum'] = state['sum'][key] + g * g",
                f"new_p = p - {lr} / (1 + (t - 1) * 0.01) * g / (new['sum'].sqrt() + 1e-10)"]
    return out


def _step_lines(k: dict, data: list[str], random_ops: bool) -> list[str]:
    amp, update = k["amp"], k["update"]
    scaler = amp == "fp16_scaler"
    args = ", ".join(data)
    sig = f"params, state, {args}" + (", rng" if random_ops else "") + (", scale, growth" if scaler else "")
    lines = [f"def step({sig}):"]
    call = f"torch.func.grad_and_value(loss_fn)(params, {args}" + (", scale" if scaler else "") + ")"
    if random_ops:
        lines += ["    with tkx.random.philox(rng):", f"        grads, loss = {call}"]
    else:
        lines.append(f"    grads, loss = {call}")
    if scaler:
        lines += ["    found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)",
                  "    torch._amp_foreach_non_finite_check_and_unscale_(list(grads.values()), found_inf, "
                  "(1.0 / scale).float())",
                  "    ok = found_inf == 0", "    loss = loss / scale"]
    if k["clip"] == "global_norm":
        lines += ["    norm = torch.sqrt(sum((g * g).sum() for g in grads.values()))",
                  "    grads = {key: g * torch.clamp(1.0 / (norm + 1e-6), max=1.0) for key, g in grads.items()}"]
    names = _STATE_OF[k["optimizer"]]
    lines += ["    t = state['t'] + 1",
              "    new_params, new_state = {}, {" + ", ".join(f"'{n}': {{}}" for n in names) + "}",
              "    for key, p in params.items():", "        g, new = grads[key], {}"]
    lines += ["        " + x for x in _update_lines(k)]
    keep = (lambda new, old: f"torch.where(ok, {new}, {old})") if scaler else (lambda new, old: new)
    lines.append(f"        new_params[key] = {keep('new_p', 'p')}")
    for n in names:
        lines.append(f"        new_state['{n}'][key] = {keep(f'new[{n!r}]', f'state[{n!r}][key]')}")
    old_t = "state['t']"
    lines.append(f"    new_state['t'] = {keep('t', old_t)}")
    if scaler:
        lines += ["    new_scale = scale.float().clone()",
                  "    torch._amp_update_scale_(new_scale, growth, found_inf, 2.0, 0.5, 2)",
                  "    scale.copy_(new_scale)"]
    if update == "functional":
        lines.append("    return loss, new_params, new_state")
    else:
        lines += ["    for key, p in params.items():", "        p.copy_(new_params[key])",
                  "        for n, s in state.items():", "            if n != 't':",
                  "                s[key].copy_(new_state[n][key])",
                  "    state['t'].copy_(new_state['t'])", "    return loss"]
    return lines


def _functional_source(case: Case) -> str:
    k = case.k
    init, data, body = _LOSSES[case.family](k)
    random_ops = uses_random(case)
    amp, scaler = k["amp"], k["amp"] == "fp16_scaler"
    lines = list(_HEADER)
    lines.append(f"def loss_fn(p, {', '.join(data)}" + (", scale" if scaler else "") + "):")
    if amp != "none":
        dt = "torch.bfloat16" if amp == "bf16" else "torch.float16"
        lines.append("    dtype = next(iter(p.values())).dtype")
        lines.append(f"    with torch.autocast(device_type=next(iter(p.values())).device.type, dtype={dt}):")
        lines += ["    " + x for x in body]
        lines.append("    loss = loss.to(dtype)")
    else:
        lines += body
    lines.append("    return loss * scale" if scaler else "    return loss")
    lines += ["", ""] + _step_lines(k, data, random_ops)
    names = _STATE_OF[k["optimizer"]]
    extra = (", rng" if random_ops else "") + (", scale, growth" if scaler else "")
    lines += ["", "", "def make_inputs(seed=0):", "    g = torch.Generator().manual_seed(seed)",
              "    def r(*shape):", "        return torch.randn(*shape, generator=g)", "", "    P = {}"]
    lines += ["    " + x for x in init]
    zero = {"sq": "torch.zeros_like", "sum": "torch.zeros_like"}
    lines.append("    state = {'t': torch.zeros(())" + "".join(
        f", '{n}': {{key: {zero.get(n, 'torch.zeros_like')}(v) for key, v in P.items()}}" for n in names) + "}")
    if random_ops:
        lines.append("    rng = tkx.random.philox_state(seed)")
    if scaler:
        lines += ["    scale = torch.tensor(1024.0)", "    growth = torch.tensor(1, dtype=torch.int32)"]
    lines.append(f"    return (P, state, {', '.join(data)}{extra})")
    return "\n".join(lines) + "\n"


_MODULE_OPT = {"SGD": "torch.optim.SGD(model.parameters(), lr=0.05{wd}{fe})",
               "SGD_momentum": "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9{wd}{fe})",
               "SGD_nesterov": "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True{wd}{fe})",
               "Adam": "torch.optim.Adam(model.parameters(), lr=0.01{wd}{fe})",
               "Adam_amsgrad": "torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=True{wd}{fe})",
               "AdamW": "torch.optim.AdamW(model.parameters(), lr=0.01{wd}{fe})",
               "RMSprop": "torch.optim.RMSprop(model.parameters(), lr=0.01{wd}{fe})",
               "RMSprop_centered": "torch.optim.RMSprop(model.parameters(), lr=0.01, centered=True, "
                                   "momentum=0.5{wd}{fe})",
               "Adagrad": "torch.optim.Adagrad(model.parameters(), lr=0.05{wd}{fe})"}


def _module_source(case: Case) -> str:
    """``make(seed, device)`` -> (train_step, (model, optimizer), (x, y)): the stateful step people write, the
    model moved to ``device`` before its optimizer is made (Adagrad makes its state in its constructor)."""
    k = case.k
    norm = {"none": "", "layer": f"torch.nn.LayerNorm({k['hidden']}), ",
            "batch": f"torch.nn.BatchNorm1d({k['hidden']}), "}[k["norm"]]
    wd = f", weight_decay={k['weight_decay']}" if k["weight_decay"] else ""
    opt = _MODULE_OPT[k["optimizer"]].format(wd=wd, fe=f", foreach={k['foreach']}")
    return "\n".join(_HEADER + [
        "def make(seed=0, device='cpu'):",
        "    torch.manual_seed(seed)",
        f"    model = torch.nn.Sequential(torch.nn.Linear({k['width']}, {k['hidden']}), {norm}torch.nn.GELU(), "
        f"torch.nn.Linear({k['hidden']}, {k['classes']})).to(device)",
        f"    opt = {opt}",
        *(["    model.eval()"] if k["mode"] == "eval" else []),
        "",
        "    def train_step(x, y):",
        "        loss = F.cross_entropy(model(x), y)",
        "        loss.backward()",
        *(["        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)"] if k["clip"] != "none" else []),
        "        opt.step()",
        "        opt.zero_grad()",
        "        return loss",
        "",
        f"    x = torch.randn({k['batch']}, {k['width']}).to(device)",
        f"    y = torch.randint(0, {k['classes']}, ({k['batch']},)).to(device)",
        "    return train_step, (model, opt), (x, y)",
    ]) + "\n"


def _mlp_config(case: Case) -> Any:
    """The :class:`fuzz.Config` of an ``mlp`` case (its options are the case's own)."""
    import dataclasses

    import fuzz
    return dataclasses.replace(fuzz.random_config(case.k["config"]), seed=case.seed, options=())


def _mlp_source(case: Case) -> str:
    config = _mlp_config(case)
    import fuzz
    return "\n".join([fuzz.source_of(config).rstrip(), "", "", "def make_inputs(seed=0):",
                      "    import fuzz  # tests/fuzz.py", f"    return fuzz.inputs_of(fuzz.{config!r}, seed)", ""])


def source_of(case: Case) -> str:
    """The case as a module's source: ``step`` and ``make_inputs(seed)`` (the module family:
    ``make(seed)`` returning the step, its ``(model, optimizer)`` and its inputs)."""
    if case.family == "mlp":
        return _mlp_source(case)
    return _module_source(case) if case.family in STATEFUL else _functional_source(case)
