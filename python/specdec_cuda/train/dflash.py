"""The DFlash block drafter (``models.dflash``) trained on the frozen target's cached features.

Recipe (DFlash, Chen et al. 2026), on the self-distilled sequences of ``features``:

* per sequence, ``anchors`` random positions inside the target's continuation; each anchor is
  one block ``[x_anchor, MASK x (blk - 1)]``, and all blocks of a sequence go through one forward
  under the block mask (``DFlashDrafter.train_hidden``): a block sees the context features
  strictly before its anchor, itself bidirectionally, and no other block;
* cross-entropy without label shift (block position i predicts ``x_{anchor + i}``), position 0
  excluded, position i weighted by ``exp(-(i - 1) / gamma)``: early positions decide the accepted
  length. Labels past a sequence's end, or outside the scored vocabulary (``heads.loss_vocab``),
  are dropped.

The drafter's decoder layers start from the target's last layers where shapes allow (a warm start:
the attention then learns to read the injected context). The report scores block positions
1 .. blk - 1 as draft positions 0 .. blk - 2 at anchors spread over each held-out continuation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.dflash import DFlashConfig, DFlashDrafter
from .features import FeatureSet
from ..models.heads import TargetHead
from .heads import Scorer, loss_vocab
from .metrics import position_report, ranks_hit

GAMMA = 7.0  # the paper's decay for blocks of 16


def drafter_scorer(drafter: DFlashDrafter, ids: torch.Tensor | None = None) -> Scorer:
    """The drafter's output side (its own final norm, the target's LM head) over the full
    vocabulary or the rows ``ids``; pass ``drafter.norm`` to ``Scorer.logits`` (it is trained)."""
    head = TargetHead(drafter._embed, drafter.norm, drafter.config.rms_norm_eps, drafter._head, None)
    return Scorer(head, ids)


def block_loss(drafter: DFlashDrafter, scorer: Scorer, tokens: torch.Tensor, hidden: dict[int, torch.Tensor],
               anchors: torch.Tensor, lengths: torch.Tensor | None = None, gamma: float = GAMMA) -> torch.Tensor:
    """Weighted block cross-entropy (see the module docstring).

    Shape: tokens [B, L] int64; hidden layer -> [B, L, H] (the target's states at the drafter's
    ``target_layers``); anchors [B, A] (each <= L - 1); lengths [B] (tokens past them are padding;
    None: all L)."""
    blk, L = drafter.config.block_size, tokens.shape[1]
    lengths = torch.full((tokens.shape[0],), L) if lengths is None else lengths
    x = drafter.train_hidden(tokens, drafter.context_features(hidden), anchors)[:, :, 1:]  # [B, A, blk - 1, H]
    pos = anchors[:, :, None] + torch.arange(1, blk)  # [B, A, blk - 1]
    labels = scorer.labels(tokens.gather(1, pos.clamp(max=L - 1).flatten(1)).view_as(pos))
    valid = (pos < lengths[:, None, None]) & (labels >= 0)
    weight = torch.exp(-torch.arange(blk - 1, dtype=torch.float32) / gamma)[None, None] * valid
    logits = scorer.logits(x, drafter.norm)
    ce = F.cross_entropy(logits.flatten(0, 2).float(), labels.clamp(min=0).flatten(), reduction="none").view_as(pos)
    return (ce * weight).sum() / weight.sum().clamp(min=1e-9)


def random_anchors(features: FeatureSet, rows: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """``count`` anchors per sequence, uniform over its continuation: from the last prompt token
    (its block drafts the reply's start) to the second-to-last token (one label after it).
    Shape: [B, count] int64."""
    lo = (features.prompt_lens[rows] - 1).clamp(min=0)
    hi = (features.lengths[rows] - 2).clamp(min=0)
    span = (hi - lo + 1).clamp(min=1)  # 1: no continuation, the anchor's labels are all padding
    u = torch.rand(rows.numel(), count, generator=torch.Generator().manual_seed(seed))  # [0, 1)
    return lo[:, None] + (u * span[:, None]).long()


def features_loss(drafter: DFlashDrafter, scorer: Scorer, features: FeatureSet, rows: torch.Tensor, anchors: int,
                  seed: int, gamma: float = GAMMA) -> torch.Tensor:
    tokens, _, hidden = features.batch(rows, drafter.config.target_layers, dtype=drafter.dtype)
    return block_loss(drafter, scorer, tokens, hidden, random_anchors(features, rows, anchors, seed),
                      features.lengths[rows], gamma)


def warm_start(drafter: DFlashDrafter, target) -> int:
    """Copy the target's last decoder layers into the drafter's where shapes agree (the built-in
    model's dense weights, unpacked from its panels when it keeps only those); returns how many."""
    if not hasattr(target, "dense_weight"):
        return 0
    copied = 0
    n = len(target.layers)
    with torch.no_grad():
        for layer, index in zip(drafter.layers, range(n - drafter.config.num_layers, n)):
            if index < 0:
                continue
            src = target.layers[index]
            q, k, v = target.dense_weight(index, "qkv").split([layer.q_proj.out_features, layer.k_proj.out_features,
                                                               layer.v_proj.out_features])
            pairs = [(layer.q_proj.weight, q), (layer.k_proj.weight, k), (layer.v_proj.weight, v),
                     (layer.o_proj.weight, target.dense_weight(index, "o")),
                     (layer.gate_up.weight, target.dense_weight(index, "gate_up")),
                     (layer.down.weight, target.dense_weight(index, "down")),
                     (layer.input_norm, src.input_layernorm.weight),
                     (layer.post_norm, src.post_attention_layernorm.weight)]
            if all(dst.shape == s.shape for dst, s in pairs):
                for dst, s in pairs:
                    dst.copy_(s.float())
                copied += 1
    return copied


@torch.no_grad()
def dflash_report(drafter: DFlashDrafter, features: FeatureSet, blocks: int = 8) -> dict:
    """The held-out report (``metrics.position_report``) over ``blocks`` anchors per sequence."""
    c = drafter.config
    blk = c.block_size
    per = [[] for _ in range(blk - 1)]
    for i in range(len(features)):
        tokens, _, hidden = features.batch([i], c.target_layers, dtype=drafter.dtype)
        L, P = tokens.shape[1], int(features.prompt_lens[i])
        if L - P < 1:
            continue
        anchors = torch.linspace(P - 1, max(P - 1, L - 2), blocks).round().long()[None]
        logits = drafter.logits(drafter.train_hidden(tokens, drafter.context_features(hidden), anchors))[0, :, 1:]
        pos = anchors[0, :, None] + torch.arange(1, blk)  # [A, blk - 1]
        labels = tokens[0, pos.clamp(max=L - 1)]
        for k in range(blk - 1):
            per[k].append((ranks_hit(logits[:, k], labels[:, k]), pos[:, k] < L))
    return position_report(per)


def train_dflash(target, features: FeatureSet, config: DFlashConfig, loop, checkpoint, log, held_out: FeatureSet,
                 anchors_per_sequence: int = 8, gamma: float = GAMMA, draft_vocab: int | None = None,
                 weights: str = "float32"):
    from .loop import optimise

    if weights not in ("float32", "bfloat16"):
        raise ValueError(f"dflash weights must be 'float32' or 'bfloat16', got {weights!r}")
    covered = None
    if draft_vocab is not None and draft_vocab < config.vocab_size:
        config.draft_vocab, covered = frequent_ids(features, config.vocab_size, draft_vocab)
        log(f"[train] dflash: draft vocabulary of {draft_vocab} ids ({100 * covered:.1f}% of the training tokens)")
    torch.manual_seed(loop.seed)
    drafter = DFlashDrafter.random(config, seed=loop.seed).attach(target)
    drafter = drafter.float()
    drafter._embed, drafter._head = drafter._embed.float(), drafter._head.float()
    warm = warm_start(drafter, target)
    scorer = drafter_scorer(drafter, loss_vocab(features, config.vocab_size))
    log(f"[train] dflash: {config.num_layers} layers (warm start from the target's last {warm}), block "
        f"{config.block_size} (loss decay gamma {gamma:g}), target layers {list(config.target_layers)}, "
        f"{sum(p.numel() for p in drafter.parameters() if p.requires_grad) / 1e6:.2f}M parameters, "
        f"{loop.steps} steps of {loop.batch_size} sequences")
    optimise(drafter, lambda rows, step: features_loss(drafter, scorer, features, rows, anchors_per_sequence,
                                                       loop.seed * 1_000_003 + step, gamma),
             len(features), loop, checkpoint, log, "dflash")
    drafter.requires_grad_(False).eval()
    if weights == "bfloat16":  # rounded before the report, so that it measures the drafter saved
        for p in drafter.parameters():
            p.copy_(p.bfloat16())
        log("[train] dflash: weights rounded to bfloat16")
    report = dict(dflash_report(drafter, held_out), warm_started_layers=warm)
    if covered is not None:
        report["draft_vocab_coverage"] = round(covered, 4)
    return drafter, report


def frequent_ids(features: FeatureSet, vocab_size: int, n: int) -> tuple[tuple[int, ...], float]:
    """The ``n`` ids most frequent in the training sequences (ties to the lower id), sorted, and the
    share of the sequences' tokens they cover."""
    from ..models.eagle3 import draft_vocab_from_counts

    counts = features.token_counts(vocab_size)
    _, chosen = draft_vocab_from_counts(counts, n)
    return tuple(chosen.nonzero().flatten().tolist()), float(counts[chosen].sum() / counts.sum().clamp(min=1))
