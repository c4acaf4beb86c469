"""Training steps written the way people write them every day (plain PyTorch, no tkx imports).

* ``char_lm``: a character-level language model: an embedding table looked up with token ids
  (``F.embedding``), a tanh hidden layer, cross-entropy over the next character, Adam with a
  0-d tensor step count (``1 - beta ** t`` bias correction), all updated in place.
* ``q_learning``: a DQN-style update: ``q.gather(1, actions)`` on the taken actions, a target
  from ``max`` over the next state's Q-values of a frozen target network, Huber loss, Adam
  with a tensor step count.
* ``glu_mlp``: a gated MLP: ``a, b = (x @ w_in).chunk(2, -1)``, ``a * sigmoid(b)``, MSE,
  SGD with momentum (functional).
* ``poly_clip_adamw``: polynomial features with ``torch.cat``, MSE, global-norm gradient
  clipping (``torch.stack`` of per-tensor norms, ``linalg.vector_norm``) and AdamW with a
  tensor step count (functional).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._base import Example, randn, seeded_generator

# -- char_lm --------------------------------------------------------------------------------------

TEXT = ("the quick brown fox jumps over the lazy dog. pack my box with five dozen liquor jugs! "
        "how vexingly quick daft zebras jump; sphinx of black quartz, judge my vow.")
VOCAB = sorted(set(TEXT))
LM_BATCH, LM_CONTEXT, LM_EMBED, LM_HIDDEN = 32, 8, 16, 128
BETA1, BETA2, ADAM_LR, ADAM_EPS = 0.9, 0.999, 3e-3, 1e-8


def char_lm_loss(params, tokens, targets):
    emb = F.embedding(tokens, params["emb"])                  # (B, T, D)
    h = torch.tanh(emb.flatten(1) @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]                   # (B, V)
    return F.cross_entropy(logits, targets)


def adam_in_place(params, grads, m, v, t, lr=ADAM_LR, weight_decay=0.0):
    """torch.optim.Adam(W)'s update written out, in place, with a 0-d float step count ``t``."""
    t.add_(1)
    c1 = 1 - BETA1 ** t
    c2 = 1 - BETA2 ** t
    for k, p in params.items():
        g = grads[k]
        if weight_decay:
            p.mul_(1 - lr * weight_decay)
        m[k].mul_(BETA1).add_((1 - BETA1) * g)
        v[k].mul_(BETA2).add_((1 - BETA2) * g * g)
        p.sub_(lr * (m[k] / c1) / ((v[k] / c2).sqrt() + ADAM_EPS))


def char_lm_step(params, m, v, t, tokens, targets):
    """One Adam step (in place on params, m, v and the step count t); returns the loss."""
    grads, loss = torch.func.grad_and_value(char_lm_loss)(params, tokens, targets)
    adam_in_place(params, grads, m, v, t)
    return loss


def char_lm_batch(seed: int = 0, device="cpu"):
    """``(tokens (B, T) int64, targets (B,) int64)``: random windows of :data:`TEXT`."""
    gen = seeded_generator(seed)
    ids = torch.tensor([VOCAB.index(c) for c in TEXT])
    starts = torch.randint(0, len(TEXT) - LM_CONTEXT - 1, (LM_BATCH,), generator=gen)
    tokens = torch.stack([ids[s:s + LM_CONTEXT] for s in starts.tolist()])
    targets = ids[starts + LM_CONTEXT]
    return tokens.to(device), targets.to(device)


def make_char_lm_inputs(seed: int = 0, device="cpu"):
    gen = seeded_generator(seed)
    n = len(VOCAB)
    params = {
        "emb": randn(gen, n, LM_EMBED, scale=0.5, device=device),
        "w1": randn(gen, LM_CONTEXT * LM_EMBED, LM_HIDDEN, scale=1 / math.sqrt(LM_CONTEXT * LM_EMBED), device=device),
        "b1": torch.zeros(LM_HIDDEN, device=device),
        "w2": randn(gen, LM_HIDDEN, n, scale=1 / math.sqrt(LM_HIDDEN), device=device),
        "b2": torch.zeros(n, device=device),
    }
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    tokens, targets = char_lm_batch(seed, device)
    return params, m, v, torch.zeros((), device=device), tokens, targets


CHAR_LM = Example(
    name="char_lm",
    description=(
        f"Character-level language model over a {len(VOCAB)}-character vocabulary: F.embedding of "
        f"({LM_BATCH}, {LM_CONTEXT}) int64 tokens into {LM_EMBED} dims, tanh hidden layer of {LM_HIDDEN}, "
        "cross-entropy on the next character, Adam with a 0-d float step count (1 - beta ** t), "
        "in place: step(params, m, v, t, tokens, targets) -> loss."
    ),
    step_fn=char_lm_step,
    make_inputs=make_char_lm_inputs,
)

# -- q_learning -------------------------------------------------------------------------------------

Q_BATCH, Q_OBS, Q_HIDDEN, Q_ACTIONS, GAMMA = 32, 6, 64, 3, 0.99


def q_values(p, obs):
    return torch.relu(obs @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def q_loss(params, target_params, obs, actions, rewards, next_obs, dones):
    q_taken = q_values(params, obs).gather(1, actions).squeeze(1)          # (B,)
    next_best = q_values(target_params, next_obs).max(dim=1).values        # (B,)
    target = rewards + GAMMA * (1 - dones) * next_best
    return F.huber_loss(q_taken, target.detach())


def q_learning_step(params, m, v, t, target_params, obs, actions, rewards, next_obs, dones):
    """One DQN update with Adam (in place); returns the loss."""
    grads, loss = torch.func.grad_and_value(q_loss)(params, target_params, obs, actions, rewards, next_obs, dones)
    adam_in_place(params, grads, m, v, t, lr=1e-3)
    return loss


def make_q_learning_inputs(seed: int = 0, device="cpu"):
    gen = seeded_generator(seed)

    def net():
        return {"w1": randn(gen, Q_OBS, Q_HIDDEN, scale=1 / math.sqrt(Q_OBS), device=device),
                "b1": torch.zeros(Q_HIDDEN, device=device),
                "w2": randn(gen, Q_HIDDEN, Q_ACTIONS, scale=1 / math.sqrt(Q_HIDDEN), device=device),
                "b2": torch.zeros(Q_ACTIONS, device=device)}

    params = net()
    target = {k: p.clone() for k, p in params.items()}
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    obs = randn(gen, Q_BATCH, Q_OBS, device=device)
    actions = torch.randint(0, Q_ACTIONS, (Q_BATCH, 1), generator=gen).to(device)
    rewards = randn(gen, Q_BATCH, device=device)
    next_obs = randn(gen, Q_BATCH, Q_OBS, device=device)
    dones = (torch.rand(Q_BATCH, generator=gen) < 0.1).float().to(device)
    return params, m, v, torch.zeros((), device=device), target, obs, actions, rewards, next_obs, dones


Q_LEARNING = Example(
    name="q_learning",
    description=(
        f"DQN update: Q-network {Q_OBS}-{Q_HIDDEN}-{Q_ACTIONS} (ReLU), q.gather(1, actions) on the taken "
        "actions, target r + gamma * (1 - done) * max_a Q_target(next_obs), Huber loss, Adam with a tensor "
        f"step count, in place. Batch {Q_BATCH}: step(params, m, v, t, target_params, obs, actions, rewards, "
        "next_obs, dones) -> loss."
    ),
    step_fn=q_learning_step,
    make_inputs=make_q_learning_inputs,
)

# -- glu_mlp --------------------------------------------------------------------------------------

G_BATCH, G_IN, G_HIDDEN, G_OUT, G_LR, G_MOMENTUM = 64, 16, 32, 4, 0.05, 0.9


def glu_loss(params, x, y):
    a, b = (x @ params["w_in"]).chunk(2, dim=-1)       # values and gates
    return ((a * torch.sigmoid(b)) @ params["w_out"] - y).pow(2).mean()


def glu_step(params, velocity, x, y):
    """SGD with momentum, functional: returns ``(loss, new_params, new_velocity)``."""
    grads, loss = torch.func.grad_and_value(glu_loss)(params, x, y)
    new_v = {k: G_MOMENTUM * velocity[k] + grads[k] for k in params}
    return loss, {k: p - G_LR * new_v[k] for k, p in params.items()}, new_v


def make_glu_inputs(seed: int = 0, device="cpu"):
    gen = seeded_generator(seed)
    params = {"w_in": randn(gen, G_IN, 2 * G_HIDDEN, scale=1 / math.sqrt(G_IN), device=device),
              "w_out": randn(gen, G_HIDDEN, G_OUT, scale=1 / math.sqrt(G_HIDDEN), device=device)}
    velocity = {k: torch.zeros_like(p) for k, p in params.items()}
    return params, velocity, randn(gen, G_BATCH, G_IN, device=device), randn(gen, G_BATCH, G_OUT, device=device)


GLU_MLP = Example(
    name="glu_mlp",
    description=(
        f"Gated MLP {G_IN}-2x{G_HIDDEN}-{G_OUT}: (x @ w_in).chunk(2, -1) into values and gates, "
        "a * sigmoid(b), MSE, SGD with momentum 0.9, functional: "
        "step(params, velocity, x, y) -> (loss, new_params, new_velocity)."
    ),
    step_fn=glu_step,
    make_inputs=make_glu_inputs,
)

# -- poly_clip_adamw ----------------------------------------------------------------------------------

P_BATCH, P_IN, P_DEGREE, P_HIDDEN, P_CLIP, P_WD = 64, 8, 3, 32, 1.0, 1e-2


def poly_loss(params, x, y):
    feats = torch.cat([x ** k for k in range(1, P_DEGREE + 1)], dim=1)     # polynomial features
    h = torch.tanh(feats @ params["w1"] + params["b1"])
    return F.mse_loss(h @ params["w2"], y)


def poly_clip_adamw_step(params, m, v, t, x, y):
    """AdamW after clipping the global gradient norm to 1, functional:
    returns ``(loss, new_params, new_m, new_v, t + 1)``."""
    grads, loss = torch.func.grad_and_value(poly_loss)(params, x, y)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    scale = torch.clamp(P_CLIP / (norm + 1e-6), max=1.0)
    t = t + 1
    c1, c2 = 1 - BETA1 ** t, 1 - BETA2 ** t
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k] * scale
        new_m[k] = BETA1 * m[k] + (1 - BETA1) * g
        new_v[k] = BETA2 * v[k] + (1 - BETA2) * g * g
        update = (new_m[k] / c1) / ((new_v[k] / c2).sqrt() + ADAM_EPS)
        new_p[k] = p * (1 - ADAM_LR * P_WD) - ADAM_LR * update
    return loss, new_p, new_m, new_v, t


def make_poly_inputs(seed: int = 0, device="cpu"):
    gen = seeded_generator(seed)
    fan = P_IN * P_DEGREE
    params = {"w1": randn(gen, fan, P_HIDDEN, scale=1 / math.sqrt(fan), device=device),
              "b1": torch.zeros(P_HIDDEN, device=device),
              "w2": randn(gen, P_HIDDEN, 1, scale=1 / math.sqrt(P_HIDDEN), device=device)}
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    x = randn(gen, P_BATCH, P_IN, scale=0.5, device=device)
    y = (x.sum(1, keepdim=True) - (x ** 2).sum(1, keepdim=True)).to(device)
    return params, m, v, torch.zeros((), device=device), x, y


POLY_CLIP_ADAMW = Example(
    name="poly_clip_adamw",
    description=(
        f"Polynomial features torch.cat([x, x**2, x**3], 1) of {P_IN} inputs, tanh layer of {P_HIDDEN}, MSE, "
        "global-norm clipping to 1 (torch.stack of per-tensor norms, linalg.vector_norm), AdamW with a tensor "
        "step count, functional: step(params, m, v, t, x, y) -> (loss, new_params, new_m, new_v, t + 1)."
    ),
    step_fn=poly_clip_adamw_step,
    make_inputs=make_poly_inputs,
)

EXAMPLES = [CHAR_LM, Q_LEARNING, GLU_MLP, POLY_CLIP_ADAMW]
