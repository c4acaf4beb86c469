"""A Llama-style **decode step** (AMK's workload) in plain PyTorch: one new token per sequence.

``decode_step(params, k_cache, v_cache, tokens, pos) -> next_tokens``

* ``tokens``: int64 ``[B]``, the current token of each of ``B`` sequences;
* ``pos``: int64 0-d tensor, the position those tokens sit at (the same for every sequence);
* ``k_cache``, ``v_cache``: tuples of ``L`` bf16 tensors ``[B, H, S, D]`` (one per layer: batch, heads,
  cache positions, head width), **updated in place**: the step writes the new keys and values at
  position ``pos``;
* ``params``: a dict of weights in ``nn.Linear`` layout ``[N_out, K_in]`` (``F.linear`` computes
  ``x @ W.T``), bf16, or weight-only quantised (below);
* returns int64 ``[B]``: the greedy next token (``argmax`` of the logits).

Per layer: RMSNorm, the q/k/v projections, rotary embeddings at ``pos`` (rotate-half, base 10000),
the cache append, attention of the one query over the whole cache with the positions after ``pos``
masked out (a static shape: the cache length ``S`` is fixed), the output projection and residual,
RMSNorm, a SwiGLU MLP and residual; then a final RMSNorm, the LM head (in fp32: bf16 logits tie too often
for a greedy choice that does not depend on the summation order) and ``argmax``.

Weight-only quantisation, written as users write it (the step dequantises, tkx fuses that into
the GEMV's operand load):

* ``"int8"``: ``w_q`` int8 ``[N, K]`` and ``w_s`` bf16 ``[N, K // G]``; ``W = w_q.to(bf16) * w_s``
  repeated over each group of ``G`` input columns (symmetric, ``real = q * scale``);
* ``"int4"``: ``w_q`` uint8 ``[N, K // 2]`` holding two 4-bit values per byte, column ``2b`` in the
  low nibble and ``2b + 1`` in the high one, each stored as ``q + 8`` (``q`` in ``[-8, 7]``);
  ``w_s`` as for int8. These are AMK's storage conventions.

Shapes of the registered configurations (:data:`CONFIGS`): ``decode`` is 4 layers, width 512,
8 heads of 64, SwiGLU hidden 1536, vocabulary 4096, a cache of 1024 positions and batch 4; ``decode_tiny``
(2 layers, width 64, 2 heads of 32, hidden 128, vocabulary 256, cache 32, batch 2) keeps the CPU tests fast.
``llama_1b`` has Llama-3.2-1B's shapes (:data:`LLAMA_1B`: 16 layers, width 2048, 32 query heads over 8 K/V
heads of 64, SwiGLU hidden 8192, vocabulary 128,256 with the LM head tied to the embedding, rope theta
500,000 without Llama 3's long-context frequency scaling), bf16, batch 1 (``llama_1b_b4``: 4), a cache of
2,048 positions filled to 1,024; 1.24e9 random weights (2.47 GB in bf16) made on the device.
``llama_1b_tiny`` runs the same code path at CPU-test size. Every model runs on ``meta`` tensors too, so
tkx's stages up to the CUDA source can be explored at full size without allocating the weights.
This module imports nothing from the rest of tkx.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from ._base import named, randn, seeded_generator

BF16 = torch.bfloat16
QUANTS = ("bf16", "int8", "int4")
LINEARS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")

__all__ = ["DecodeConfig", "DecodeExample", "CONFIGS", "QUANTS", "get", "names", "make_decode_step",
           "quantize_int8", "quantize_int4", "dequantize", "generate", "weight_bytes", "cache_bytes",
           "compare_greedy", "GreedyComparison", "float32_inputs", "logits_errors", "LogitsErrors", "arbitrate",
           "judge_difference", "margin_noise", "describe_greedy", "FLOAT32_FACTOR", "FLOAT32_RULE"]


@dataclass(frozen=True)
class DecodeConfig:
    """Sizes of a decode model. ``group``: input columns sharing one quantisation scale; ``kv_heads``:
    K/V heads of grouped-query attention (``None``: as many as query heads); ``tied_head``: the LM head is
    the embedding matrix (as in Llama-3.2-1B); ``prefill``: cache positions holding (random) keys and
    values before the first step, which then runs at ``pos = prefill``; ``embed_std``: the standard deviation of
    the random embedding (with a tied head, 1.0 makes the residual stream mostly the current token's row, so the
    greedy step repeats its input token forever; Llama's initialiser range, 0.02, gives varied tokens)."""

    layers: int = 4
    width: int = 512
    heads: int = 8
    hidden: int = 1536
    vocab: int = 4096
    cache: int = 1024
    batch: int = 4
    group: int = 128
    eps: float = 1e-6
    theta: float = 10000.0
    kv_heads: int | None = None
    tied_head: bool = False
    prefill: int = 0
    embed_std: float = 1.0

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def kv(self) -> int:
        """K/V heads: ``kv_heads``, or ``heads`` when unset (no grouped-query attention)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """name -> ``(N_out, K_in)`` of every projection of one layer."""
        c, h, ckv = self.width, self.hidden, self.kv * self.head_dim
        return {"wq": (c, c), "wk": (ckv, c), "wv": (ckv, c), "wo": (c, c),
                "w_gate": (h, c), "w_up": (h, c), "w_down": (c, h)}

    def parameter_count(self) -> int:
        """Weights of the model (the tied LM head counted once)."""
        per_layer = sum(n * k for n, k in self.linear_shapes().values()) + 2 * self.width
        head = 0 if self.tied_head else self.vocab * self.width
        return self.layers * per_layer + self.vocab * self.width + self.width + head


# -- quantisation (as users store weights) ----------------------------------------------------------


def quantize_int8(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group-wise int8: ``(q int8 [N, K], scale bf16 [N, K // group])``, ``w ~ q * scale``."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    scale = (g.abs().amax(-1) / 127.0).clamp_min(1e-8).to(BF16)
    q = torch.round(g / scale.float()[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(n, k), scale


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group-wise int4 packed two per byte: ``(q uint8 [N, K // 2], scale bf16 [N, K // group])``;
    byte ``b`` holds column ``2b`` in its low nibble and ``2b + 1`` in its high nibble, each as ``q + 8``."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    scale = (g.abs().amax(-1) / 7.0).clamp_min(1e-8).to(BF16)
    q = torch.round(g / scale.float()[..., None]).clamp(-8, 7).to(torch.int32).reshape(n, k) + 8
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, quant: str, group: int) -> torch.Tensor:
    """The bf16 weight ``[N, K]`` of a quantised one, written as a user writes it in a step:
    ``q.to(bf16) * scale`` with the scale repeated over each group of ``group`` input columns."""
    if quant == "int4":
        # byte // 16**j % 16 is nibble j (low first): [N, K/2, 2] -> [N, K], each q + 8 -> q
        nibble = 1 + 15 * torch.arange(2, dtype=torch.int32, device=q.device)  # [1, 16] (16 ** j)
        q = ((q.to(torch.int32).unsqueeze(-1) // nibble) % 16 - 8).reshape(q.shape[0], -1)
    n, k = q.shape
    w = q.to(BF16).reshape(n, k // group, group) * scale[..., None]
    return w.reshape(n, k)


# -- the model --------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * w`` over the last dim, in fp32, cast back to ``x.dtype``."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_at(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half) of ``x [B, H, D]`` at the 0-d int64 position ``pos``."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    angles = pos.float() * inv_freq                                   # [D/2]
    emb = torch.cat((angles, angles), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * emb.cos().to(x.dtype) + rotated * emb.sin().to(x.dtype)


def make_decode_step(cfg: DecodeConfig, quant: str = "bf16", *, return_logits: bool = False,
                     dtype: torch.dtype = BF16) -> Callable:
    """The decode step of ``cfg`` with weights stored as ``quant`` (``"bf16"``, ``"int8"``, ``"int4"``);
    with ``return_logits`` it returns ``(next_tokens, logits)`` (fp32 ``[B, V]``) instead of the tokens.
    ``dtype``: the activations' dtype (bf16, as the weights); ``torch.float32`` with the float32 weights and
    caches of :func:`float32_inputs` (and ``quant="bf16"``) is the float32 reference of a model."""
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, got {quant!r}")
    L, H, D, S, HKV = cfg.layers, cfg.heads, cfg.head_dim, cfg.cache, cfg.kv
    G = H // HKV                                                       # query heads per K/V head

    def weight(p: dict, name: str) -> torch.Tensor:
        if quant == "bf16":
            return p[name]
        return dequantize(p[name + ".q"], p[name + ".s"], quant, cfg.group)

    def decode_step(params, k_cache, v_cache, tokens, pos):
        b = tokens.shape[0]
        x = F.embedding(tokens, params["embed"])                       # [B, C] bf16
        keep = torch.arange(S, device=tokens.device) <= pos            # [S]: positions written so far
        for layer in range(L):
            p = {name: weight(params, f"l{layer}.{name}") for name in LINEARS}
            h = rms_norm(x, params[f"l{layer}.attn_norm"], cfg.eps)
            q = F.linear(h, p["wq"]).view(b, H, D)
            k = F.linear(h, p["wk"]).view(b, HKV, D)
            v = F.linear(h, p["wv"]).view(b, HKV, D)
            q, k = rope_at(q, pos, cfg.theta), rope_at(k, pos, cfg.theta)
            at = pos.view(1)                                           # a 1-element index: index_put
            kc, vc = k_cache[layer], v_cache[layer]
            kc[:, :, at] = k.unsqueeze(2)                              # the cache append, in place
            vc[:, :, at] = v.unsqueeze(2)
            # grouped-query attention: the G query heads of one K/V head are G rows over its cache
            qg = q.unsqueeze(2) if G == 1 else q.view(b, HKV, G, D)
            scores = (qg @ kc.transpose(-2, -1)).float() / math.sqrt(D)  # [B, HKV, G, S]
            scores = torch.where(keep, scores, float("-inf"))
            att = scores.softmax(-1).to(dtype) @ vc                     # [B, HKV, G, D]
            x = x + F.linear(att.reshape(b, H * D), p["wo"])
            h = rms_norm(x, params[f"l{layer}.mlp_norm"], cfg.eps)
            x = x + F.linear(F.silu(F.linear(h, p["w_gate"])) * F.linear(h, p["w_up"]), p["w_down"])
        # the LM head in fp32 (its bf16 weight widened in the GEMV's load): bf16 logits tie often over a
        # vocabulary of thousands, and a tie makes the greedy token depend on the summation order
        h = rms_norm(x, params["final_norm"], cfg.eps)
        head = params["embed"] if cfg.tied_head else params["head"]
        logits = F.linear(h.float(), head.float())                    # [B, V] fp32
        return (logits.argmax(-1), logits) if return_logits else logits.argmax(-1)

    decode_step.__name__ = f"decode_step_{quant}" + ("" if dtype == BF16 else "_" + str(dtype).split(".")[-1])
    decode_step.__qualname__ = decode_step.__name__
    return decode_step


def make_params(cfg: DecodeConfig, quant: str = "bf16", seed: int = 0, device="cpu") -> dict[str, torch.Tensor]:
    """Random weights (bf16; the projections quantised when ``quant`` says so), drawn on the CPU; a model
    of over 2**28 weights (``llama_1b``: 1.24e9) is drawn on ``device`` itself, so a seed gives the same
    weights on one kind of device only."""
    gen = seeded_generator(seed)
    if cfg.parameter_count() > 2 ** 28 and torch.device(device).type not in ("cpu", "meta"):
        gen = torch.Generator(device=device).manual_seed(int(seed))
    c = cfg.width
    params = {"embed": randn(gen, cfg.vocab, c, scale=cfg.embed_std, dtype=BF16, device=device)}
    for layer in range(cfg.layers):
        params[f"l{layer}.attn_norm"] = (1 + randn(gen, c, scale=0.1, device=device)).to(dtype=BF16)
        params[f"l{layer}.mlp_norm"] = (1 + randn(gen, c, scale=0.1, device=device)).to(dtype=BF16)
        for name, (n, k) in cfg.linear_shapes().items():
            w = randn(gen, n, k, scale=1 / math.sqrt(k), device=device)
            if quant == "bf16":
                params[f"l{layer}.{name}"] = w.to(device=device, dtype=BF16)
            else:
                q, s = (quantize_int8 if quant == "int8" else quantize_int4)(w, cfg.group)
                params[f"l{layer}.{name}.q"], params[f"l{layer}.{name}.s"] = q.to(device), s.to(device)
    params["final_norm"] = (1 + randn(gen, c, scale=0.1, device=device)).to(dtype=BF16)
    if not cfg.tied_head:
        # a head with large weights makes the greedy choice well separated (few near-ties in bf16)
        params["head"] = randn(gen, cfg.vocab, c, scale=4 / math.sqrt(c), dtype=BF16, device=device)
    return params


def make_decode_inputs(cfg: DecodeConfig, quant: str = "bf16", seed: int = 0, device="cpu",
                       start: int | None = None):
    """``(params, k_cache, v_cache, tokens, pos)``: caches (tuples of ``[B, kv_heads, cache, head_dim]``
    bf16 tensors, one per layer) holding random keys and values at the first ``cfg.prefill`` positions
    and zeros after them, random tokens, ``pos = start`` (default: ``cfg.prefill``)."""
    gen = seeded_generator(seed + 1000)
    shape = (cfg.batch, cfg.kv, cfg.cache, cfg.head_dim)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch,), generator=gen).to(device)

    def caches():
        out = []
        for _ in range(cfg.layers):
            t = torch.zeros(shape, dtype=BF16, device=device)
            if cfg.prefill and t.device.type != "meta":
                t[:, :, :cfg.prefill] = randn(gen, cfg.batch, cfg.kv, cfg.prefill, cfg.head_dim, dtype=BF16,
                                              device=device)
            out.append(t)
        return tuple(out)

    pos = cfg.prefill if start is None else start
    return (make_params(cfg, quant, seed, device), caches(), caches(), tokens,
            torch.tensor(pos, dtype=torch.int64, device=device))


def generate(step: Callable, inputs: tuple, n: int) -> torch.Tensor:
    """Greedy decoding: ``n`` calls of ``step(params, k_cache, v_cache, tokens, pos)``, each feeding its
    tokens to the next at ``pos + 1``; the caches are updated in place. Returns int64 ``[n, B]``."""
    params, kc, vc, tokens, pos = inputs
    out = []
    for i in range(n):
        tokens = step(params, kc, vc, tokens, pos + i)
        out.append(tokens)
    return torch.stack(out)


#: The float32 arbiter of a differing greedy token: accepted when float32's margin of eager's token over the
#: other one is at most FLOAT32_FACTOR times the bf16 noise of a logit margin at that step (see :func:`arbitrate`).
FLOAT32_FACTOR = 3.0
FLOAT32_RULE = (f"a differing token is accepted when eager float32's logit margin of eager bf16's token over it "
                f"is at most {FLOAT32_FACTOR:g} x the bf16 noise of a logit margin at that step (the larger of eager "
                f"bf16's and tkx's RMS error against float32, over the vocabulary, of the margin of eager's token "
                f"over every token)")


def margin_noise(logits: torch.Tensor, ref: torch.Tensor, token: int) -> float:
    """The RMS over the vocabulary of the error of ``logits``' margin of ``token`` over every token against
    ``ref``'s: ``sqrt(mean_v(((l[token] - l[v]) - (r[token] - r[v]))^2))``; ``logits``, ``ref``: ``[V]`` (``ref``
    fp32). The bf16 noise of a greedy choice at one step: how far rounding moves a logit margin."""
    d = logits.float() - ref.float()
    return float((d - d[token]).square().mean().sqrt())


def judge_difference(d: dict, factor: float = FLOAT32_FACTOR) -> dict:
    """The float32 rule on one recorded difference ``d`` (the keys :func:`arbitrate` writes: ``float32_logits``
    ``[eager's token, the other]``, ``eager_noise``, ``tkx_noise`` (``None`` without tkx's logits)): ``d`` with
    ``float32_margin``, ``allowance`` (``factor`` x the larger noise) and ``accepted`` set. ``KeyError`` when
    ``d`` lacks ``float32_logits`` or ``eager_noise`` (a record made before they were kept)."""
    r_e, r_t = d["float32_logits"]
    noise = max(x for x in (d["eager_noise"], d.get("tkx_noise")) if x is not None)
    margin, allowance = r_e - r_t, factor * noise
    return {**d, "float32_margin": margin, "allowance": allowance, "accepted": bool(margin <= allowance)}


def arbitrate(ref: torch.Tensor, eager: torch.Tensor, eager_token: int, token: int, tkx: torch.Tensor | None = None,
              factor: float = FLOAT32_FACTOR) -> dict:
    """Judge one greedy token ``token`` that differs from eager bf16's ``eager_token`` by eager float32's logits
    ``ref`` (``[V]`` fp32; ``eager``, ``tkx``: eager bf16's and tkx's ``[V]`` logits at the same step, ``tkx``
    optional): accepted when ``ref[eager_token] - ref[token]`` (``float32_margin``; negative when float32 prefers
    ``token``) is at most ``factor`` x the larger of eager's and tkx's :func:`margin_noise` at that step. A
    step-wide noise, not the two tokens' own errors: tkx's error at the two tokens bounds the float32 margin by
    construction whenever its logits pick ``token``. Returns a JSON-ready dict (the logits at both tokens, the
    noises, ``float32_margin``, ``allowance``, ``accepted``)."""
    pair = [int(eager_token), int(token)]
    d = {"float32_logits": [float(ref[i]) for i in pair], "eager_logits": [float(eager[i]) for i in pair],
         "tkx_logits": None if tkx is None else [float(tkx[i]) for i in pair],
         "eager_noise": margin_noise(eager, ref, eager_token),
         "tkx_noise": None if tkx is None else margin_noise(tkx, ref, eager_token)}
    return judge_difference(d, factor)


def describe_greedy(n: int, batch: int, records: list[dict], rel: float, factor: float | None = None) -> str:
    """One sentence on a teacher-forced comparison of ``n`` steps of ``batch`` tokens with the differences
    ``records`` (dicts with ``eager_margin`` and ``tolerance``, and when float32 arbitrated ``float32_margin``,
    ``allowance`` and ``accepted``; ``factor``: the arbiter's, ``None`` when eager's margin judged)."""
    total = n * batch
    if not records:
        return f"all {n} x {batch} greedy tokens equal to eager"
    head = (f"{total - len(records)} of {total} greedy tokens equal to eager (teacher-forced); {len(records)} differ "
            f"with eager's logit margin up to {max(r['eager_margin'] for r in records):.4g}")
    if factor is None:
        ok = all(r["eager_margin"] <= r["tolerance"] for r in records)
        return f"{head} ({'near-ties, within' if ok else 'BEYOND'} the tolerance {rel:g} x |best logit|)"
    refused = sum(not r["accepted"] for r in records)
    worst = max(records, key=lambda r: r["float32_margin"] - r["allowance"])
    verdict = (f"{refused} of {len(records)} BEYOND the allowance" if refused
               else f"all {len(records)} near-ties in float32, within the allowance")
    return (f"{head}; judged by eager float32: {verdict} ({'worst' if refused else 'closest'}: float32 margin "
            f"{worst['float32_margin']:.4g} against an allowance of {worst['allowance']:.4g} = {factor:g} x the "
            f"bf16 noise at step {worst['step']})")


@dataclass(frozen=True)
class GreedyComparison:
    """Greedy tokens of a compiled step against eager, teacher-forced (both are fed eager's tokens).

    ``tokens``: eager's int64 ``[n, B]``; ``got``: the other step's; ``differences``: ``(step, sequence,
    eager's token, its token, margin)`` for each token that differs, where ``margin`` is eager's best logit
    minus eager's logit of the other token; ``tolerances``: for each difference, the largest margin that
    counts as a near-tie by eager's logits alone (``rel x |eager's best logit|``); ``arbitration``: for each
    difference, eager float32's verdict (:func:`arbitrate`), empty when no float32 reference ran; ``factor``: its
    :data:`FLOAT32_FACTOR`. ``equal``: every token the same; ``ok``: every difference accepted by float32 when it
    arbitrated, else every difference a near-tie in eager's logits.
    """

    tokens: torch.Tensor
    got: torch.Tensor
    differences: tuple[tuple[int, int, int, int, float], ...]
    rel: float
    tolerances: tuple[float, ...] = ()
    arbitration: tuple[dict, ...] = ()
    factor: float | None = None

    @property
    def equal(self) -> bool:
        return not self.differences

    @property
    def judged_by(self) -> str:
        """``"float32"`` (eager float32 arbitrated) or ``"eager margin"`` (``rel`` x |eager's best logit|)."""
        return "float32" if self.factor is not None else "eager margin"

    @property
    def ok(self) -> bool:
        if self.factor is not None:
            return all(a["accepted"] for a in self.arbitration)
        return all(d[4] <= tol for d, tol in zip(self.differences, self.tolerances))

    def records(self) -> list[dict]:
        """One JSON-ready dict per difference: ``step``, ``sequence``, ``eager_token``, ``token``,
        ``eager_margin``, ``tolerance`` and, when float32 arbitrated, :func:`arbitrate`'s keys."""
        out = []
        for i, (d, tol) in enumerate(zip(self.differences, self.tolerances)):
            rec = {"step": d[0], "sequence": d[1], "eager_token": d[2], "token": d[3], "eager_margin": d[4],
                   "tolerance": tol}
            out.append({**rec, **(self.arbitration[i] if self.arbitration else {})})
        return out

    def __str__(self) -> str:
        n, b = self.tokens.shape
        return describe_greedy(n, b, self.records(), self.rel, self.factor)


def compare_greedy(step: Callable, ex: DecodeExample, n: int = 20, device="cpu", rel: float = 2 ** -7, *,
                   logits_step: Callable | None = None, factor: float | None = FLOAT32_FACTOR):
    """Run ``step`` (e.g. a tkx runner) and eager for ``n`` greedy steps from ``ex.make_inputs(0, device)``,
    both fed eager's tokens (so one near-tie does not change every later step), on separate caches.
    Returns a :class:`GreedyComparison`. With ``factor`` (default), eager in float32 (:func:`float32_inputs`) runs
    alongside and judges each token that differs (:func:`arbitrate`; ``logits_step``, e.g. a tkx runner of
    ``make_decode_step(..., return_logits=True)``, adds tkx's logits, run on its own caches, to the noise); with
    ``factor=None``, a token that differs counts as a near-tie when eager's logit of it is within
    ``rel x |eager's best logit|`` of the best."""
    with_logits = make_decode_step(ex.config, ex.quant, return_logits=True)
    mine, eager = ex.make_inputs(0, device), ex.make_inputs(0, device)
    ref = float32_inputs(ex, ex.make_inputs(0, device)) if factor is not None else None
    ref_step = make_decode_step(ex.config, "bf16", return_logits=True, dtype=torch.float32)
    theirs = ex.make_inputs(0, device) if factor is not None and logits_step is not None else None
    tok, pos = eager[3], eager[4]
    want, got, diffs, tols, arb = [], [], [], [], []
    for i in range(n):
        e_tok, logits = with_logits(eager[0], eager[1], eager[2], tok, pos + i)
        m_tok = step(mine[0], mine[1], mine[2], tok, pos + i)
        r_logits = ref_step(ref[0], ref[1], ref[2], tok, pos + i)[1] if ref is not None else None
        t_logits = logits_step(theirs[0], theirs[1], theirs[2], tok, pos + i)[1] if theirs is not None else None
        want.append(e_tok.cpu())
        got.append(m_tok.cpu())
        for b in torch.nonzero(e_tok != m_tok).flatten().tolist():
            best = float(logits[b, e_tok[b]])
            diffs.append((i, b, int(e_tok[b]), int(m_tok[b]), best - float(logits[b, m_tok[b]])))
            tols.append(rel * abs(best))
            if r_logits is not None:
                arb.append(arbitrate(r_logits[b], logits[b], int(e_tok[b]), int(m_tok[b]),
                                     None if t_logits is None else t_logits[b], factor))
        tok = e_tok
    return GreedyComparison(torch.stack(want), torch.stack(got), tuple(diffs), rel, tuple(tols), tuple(arb), factor)


def float32_inputs(ex: DecodeExample, inputs: tuple) -> tuple:
    """The float32 copy of ``ex``'s inputs ``(params, k_cache, v_cache, tokens, pos)`` for
    ``make_decode_step(ex.config, "bf16", dtype=torch.float32)``: every weight widened (a quantised one
    dequantised first, as the step does), the caches widened; tokens and position shared."""
    params, kc, vc, tokens, pos = inputs
    wide = {}
    for name, t in params.items():
        if name.endswith(".s"):
            continue
        if name.endswith(".q"):
            base = name[:-2]
            wide[base] = dequantize(t, params[base + ".s"], ex.quant, ex.config.group).float()
        else:
            wide[name] = t.float()
    return wide, tuple(c.float() for c in kc), tuple(c.float() for c in vc), tokens, pos


@dataclass(frozen=True)
class LogitsErrors:
    """Per decode step, the relative error ``||logits - ref||_2 / ||ref||_2`` (over the batch and the
    vocabulary) of a compiled step's fp32 logits (``compiled``) and of eager's own (``eager``, the same model in
    bf16: the rounding any bf16 implementation has), both against the float32 reference ``ref``; all three are
    fed the same tokens (eager's greedy ones) on their own caches."""

    compiled: tuple[float, ...]
    eager: tuple[float, ...]

    def __str__(self) -> str:
        return (f"logits' relative error against eager float32 over {len(self.compiled)} steps: at most "
                f"{max(self.compiled):.3g} (eager bf16: at most {max(self.eager):.3g})")


def logits_errors(step: Callable, ex: DecodeExample, n: int = 8, device="cpu") -> LogitsErrors:
    """Run ``step`` (``(params, k_cache, v_cache, tokens, pos) -> (tokens, logits)``, e.g. a tkx runner of
    ``make_decode_step(ex.config, ex.quant, return_logits=True)``), eager and eager in float32 for ``n`` steps
    from ``ex.make_inputs(0, device)``, each fed eager's greedy tokens, and compare their logits
    (:class:`LogitsErrors`)."""
    eager_step = make_decode_step(ex.config, ex.quant, return_logits=True)
    ref_step = make_decode_step(ex.config, "bf16", return_logits=True, dtype=torch.float32)
    mine, eager = ex.make_inputs(0, device), ex.make_inputs(0, device)
    ref = float32_inputs(ex, ex.make_inputs(0, device))
    tok, pos = eager[3], eager[4]
    compiled, own = [], []

    def rel(x: torch.Tensor, want: torch.Tensor) -> float:
        return float((x.float() - want).norm() / want.norm().clamp_min(1e-30))

    for i in range(n):
        e_tok, e_logits = eager_step(eager[0], eager[1], eager[2], tok, pos + i)
        _, r_logits = ref_step(ref[0], ref[1], ref[2], tok, pos + i)
        _, m_logits = step(mine[0], mine[1], mine[2], tok, pos + i)
        compiled.append(rel(m_logits, r_logits))
        own.append(rel(e_logits, r_logits))
        tok = e_tok
    return LogitsErrors(tuple(compiled), tuple(own))


def weight_bytes(cfg: DecodeConfig, quant: str = "bf16") -> int:
    """Bytes of weights one step reads: every projection (with its scales), the norms, the LM head and
    ``batch`` embedding rows."""
    per_el = {"bf16": 2.0, "int8": 1.0, "int4": 0.5}[quant]
    n = 0
    for _ in range(cfg.layers):
        for nn_, kk in cfg.linear_shapes().values():
            n += int(nn_ * kk * per_el) + (0 if quant == "bf16" else 2 * nn_ * (kk // cfg.group))
        n += 2 * 2 * cfg.width
    head = 2 * cfg.vocab * cfg.width            # the LM head (the embedding itself when tied)
    return n + 2 * cfg.width + head + 2 * cfg.batch * cfg.width


def cache_bytes(cfg: DecodeConfig) -> int:
    """Bytes of K/V cache one step reads when attention spans the whole cache (bf16)."""
    return 2 * 2 * cfg.layers * cfg.batch * cfg.kv * cfg.cache * cfg.head_dim


@dataclass(frozen=True)
class DecodeExample:
    """A registered decode configuration: ``step_fn`` and ``make_inputs(seed=0, device="cpu")``."""

    name: str
    config: DecodeConfig
    quant: str
    description: str = ""
    step_fn: Callable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_fn", make_decode_step(self.config, self.quant))

    def make_inputs(self, seed: int = 0, device="cpu", start: int | None = None) -> tuple:
        return make_decode_inputs(self.config, self.quant, seed, device, start)

    @property
    def example_inputs(self) -> tuple:
        return self.make_inputs(0)


# Llama-3.2-1B's shapes (its published config: 16 layers, hidden size 2048, 32 attention heads and 8 K/V
# heads of 64, intermediate size 8192, vocabulary 128,256, RMSNorm eps 1e-5, rope theta 500,000, word
# embeddings tied to the LM head); random weights, batch 1, a cache of 2,048 positions filled to 1,024.
LLAMA_1B = DecodeConfig(layers=16, width=2048, heads=32, kv_heads=8, hidden=8192, vocab=128256, cache=2048,
                        batch=1, group=128, eps=1e-5, theta=500000.0, tied_head=True, prefill=1024,
                        embed_std=0.02)

CONFIGS = {"decode": DecodeConfig(),
           "decode_tiny": DecodeConfig(layers=2, width=64, heads=2, hidden=128, vocab=256, cache=32, batch=2,
                                       group=32),
           "llama_1b": LLAMA_1B,
           "llama_1b_b4": replace(LLAMA_1B, batch=4),
           # the same code path (grouped-query attention, a tied head, theta 500,000, a filled cache) at a
           # size the CPU tests run in seconds
           "llama_1b_tiny": replace(LLAMA_1B, layers=2, width=128, heads=4, kv_heads=2, hidden=256, vocab=512,
                                    cache=64, batch=1, group=32, prefill=24)}

_REGISTRY = {
    (name if quant == "bf16" else f"{name}_{quant}"): DecodeExample(
        name if quant == "bf16" else f"{name}_{quant}", cfg, quant,
        f"Llama-style decode step ({cfg.layers} layers, width {cfg.width}, {cfg.heads} heads"
        f"{'' if cfg.kv == cfg.heads else f' ({cfg.kv} K/V heads)'}, vocabulary {cfg.vocab}"
        f"{' tied' if cfg.tied_head else ''}, cache {cfg.cache}, batch {cfg.batch}), {quant} weights")
    for name, cfg in CONFIGS.items() for quant in QUANTS
}


def names() -> list[str]:
    """Registered decode examples: ``decode``, ``llama_1b``, ``llama_1b_b4``, their ``_int8``/``_int4``
    variants and the ``_tiny`` configurations of both."""
    return list(_REGISTRY)


def get(name: str) -> DecodeExample:
    """The decode example called ``name``; ``KeyError`` naming the available ones otherwise."""
    return named(_REGISTRY, name, "decode example")
