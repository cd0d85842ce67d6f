"""EAGLE-3 drafters for the tests' small targets, and a plain-torch reference of the drafter's layer.

* ``trained_drafter(target)``: a drafter fitted for a few dozen Adam steps, with the training-time
  test (``Eagle3Drafter.train_forward``), to the target's own greedy and sampled text, so that its
  drafts are accepted often, deep runs included (a random drafter's rarely are). Cached per target.
* ``reference_layer``: the published EAGLE-3 layer's math written out from a state dict with the
  published names (explicit softmax attention over a given mask, "rotate half" RoPE), independent
  of ``models.eagle3``'s code, to hold the module and the published loader to.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import specdec_cuda
from specdec_cuda.models.eagle3 import Eagle3Config, Eagle3Drafter, draft_vocab_from_counts

_TRAINED: dict = {}  # (id(target), options) -> (target, drafter)


def target_text(target, new_tokens: int = 16) -> torch.Tensor:
    """The target's greedy and sampled continuations of every one-token prompt (four sampled runs
    per prompt on a vocabulary under 16). Shape: [N, 1 + new_tokens] int64."""
    V = target.vocab_size
    prompts = [[t] for t in range(V)]
    rows = []
    rows += [p + o for p, o in zip(prompts, specdec_cuda.generate(target, prompts, max_new_tokens=new_tokens).tokens)]
    for rep in range(1 if V > 16 else 4):
        seeds = [rep * V + i for i in range(V)]
        out = specdec_cuda.generate(target, prompts, max_new_tokens=new_tokens, temperature=1.0, seed=seeds)
        rows += [p + o for p, o in zip(prompts, out.tokens)]
    return torch.tensor(rows, device=target.device)


def target_features(target, layers, tokens: torch.Tensor) -> torch.Tensor:
    """The target's hidden states at ``layers`` over ``tokens``, concatenated in that order (what
    ``train_forward`` reads). Shape: tokens [N, T] -> [N, T, len(layers) * H]."""
    N, T = tokens.shape
    cache = target.new_cache(N, T)
    out = target.forward(tokens, torch.arange(T, device=tokens.device).expand(N, T), cache,
                         hidden_layers=tuple(sorted(set(layers))))
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1)


def fit(drafter: Eagle3Drafter, feats: torch.Tensor, tokens: torch.Tensor, depth: int, steps: int,
        lr: float = 1e-2) -> list[float]:
    """Adam on the summed cross-entropy of ``depth`` training-time-test steps; returns the losses."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    labels = [drafter.draft_ids(tokens[:, 2 + i:]) for i in range(depth)]
    losses = []
    for _ in range(steps):
        logits = drafter.train_forward(feats, tokens, depth)
        loss = sum(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1), ignore_index=-1)
                   for lg, y in zip(logits, labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def trained_drafter(target, steps: int = 60, reduced_vocab: bool = False, seed: int = 0,
                    new_tokens: int = 16) -> Eagle3Drafter:
    """A drafter for ``target`` fitted to its text (``target_text(target, new_tokens)``, module
    docstring), attached to it. With ``reduced_vocab``, its vocabulary leaves out the
    ``max(1, V // 8)`` rarest ids of that text."""
    key = (id(target), steps, reduced_vocab, seed, new_tokens)
    if key in _TRAINED and _TRAINED[key][0] is target:
        return _TRAINED[key][1]
    tokens = target_text(target, new_tokens)
    V = target.vocab_size
    vocab = {}
    if reduced_vocab:
        counts = torch.bincount(tokens.reshape(-1).cpu(), minlength=V)
        d2t, t2d = draft_vocab_from_counts(counts, V - max(1, V // 8))
        vocab = dict(d2t=d2t, t2d=t2d)
    config = Eagle3Config.for_target(target, draft_vocab_size=V - max(1, V // 8) if reduced_vocab else None)
    drafter = Eagle3Drafter.random(config, seed=seed, std=0.05, **vocab).attach(target)
    # Trained in float32 (quicker), then attached again: in the target's dtype for drafting.
    drafter.float().requires_grad_(True)
    feats = target_features(target, config.target_layers, tokens).float()
    torch.manual_seed(seed)
    fit(drafter, feats, tokens, depth=3, steps=steps)
    drafter.requires_grad_(False).attach(target)
    _TRAINED[key] = (target, drafter)
    return drafter


# -- the layer's math, from a published state dict ---------------------------------------------------

def _norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def reference_layer(state: dict[str, torch.Tensor], cfg: dict, emb: torch.Tensor, h: torch.Tensor,
                    positions: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """The EAGLE-3 midlayer over n queries (float64, explicit attention).

    ``state``: the published names (``midlayer.self_attn.q_proj.weight``, ...); ``cfg``: heads,
    kv_heads, head_dim, eps, theta. Shape: emb / h [n, H] (the queries' token embeddings and hidden
    inputs), positions [n]; the keys / values are those of the same n positions, and query i sees
    key j where ``visible[i, j]`` ([n, n] bool; None: causal). Returns h' [n, H]."""
    s = {k: v.double() for k, v in state.items()}
    heads, kv, D, eps, theta = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["eps"], cfg["theta"]
    n = h.shape[0]
    a = torch.cat([_norm(emb, s["midlayer.input_layernorm.weight"], eps),
                   _norm(h, s["midlayer.hidden_norm.weight"], eps)], dim=-1)
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = positions.double()[:, None] * torch.cat([inv, inv])[None]  # [n, D]
    cos, sin = ang.cos(), ang.sin()

    def proj(name, count):
        x = (a @ s[f"midlayer.self_attn.{name}_proj.weight"].T).view(n, count, D)
        return x

    q = proj("q", heads)
    k = proj("k", kv)
    v = proj("v", kv)
    q = q * cos[:, None] + _rotate_half(q) * sin[:, None]
    k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
    if visible is None:
        visible = torch.ones(n, n, dtype=torch.bool).tril()
    out = torch.empty(n, heads, D, dtype=torch.float64)
    for head in range(heads):
        g = head // (heads // kv)
        scores = (q[:, head] @ k[:, g].T) / math.sqrt(D)
        scores = scores.masked_fill(~visible, float("-inf"))
        out[:, head] = torch.softmax(scores, dim=-1) @ v[:, g]
    x = h + out.reshape(n, heads * D) @ s["midlayer.self_attn.o_proj.weight"].T
    m = _norm(x, s["midlayer.post_attention_layernorm.weight"], eps)
    gate = m @ s["midlayer.mlp.gate_proj.weight"].T
    up = m @ s["midlayer.mlp.up_proj.weight"].T
    return x + (F.silu(gate) * up) @ s["midlayer.mlp.down_proj.weight"].T


def reference_logits(state: dict[str, torch.Tensor], cfg: dict, h_out: torch.Tensor) -> torch.Tensor:
    """``lm_head(norm(h'))`` scattered into the target vocabulary by ``d2t`` (-inf outside).
    Shape: h_out [n, H] -> [n, V]."""
    s = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    draft = _norm(h_out, s["norm.weight"], cfg["eps"]) @ s["lm_head.weight"].T  # [n, Vd]
    ids = torch.arange(draft.shape[-1]) + s["d2t"]
    full = torch.full((h_out.shape[0], cfg["vocab"]), float("-inf"), dtype=torch.float64)
    full[:, ids] = draft
    return full
