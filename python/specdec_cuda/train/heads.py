"""Medusa heads and MTP modules trained on the frozen target's cached features (``features``).

* Medusa: head i (0-based) at position t reads the target's final normed hidden state at t and
  learns token t + 2 + i, through the target's frozen final norm and LM head.
* MTP: module d (1-based) at position t, reading module d - 1's output at t (the target's hidden
  state for d = 1) and the embedding of token t + d, learns token t + d + 1; the D modules are
  trained jointly over whole sequences (teacher-forced: under greedy decoding the inputs of an
  accepted chain are exactly these).

Only labels the target generated count. A large vocabulary is scored over a subset of the LM
head's rows (``loss_vocab``): the ids the sequences hold (the ``LOSS_VOCAB`` most frequent when
there are more), every label outside it dropped. The softmax over the subset approximates the full one where the head
puts its mass, and costs a tenth on a 152k-token vocabulary; drafting still uses the whole head.

The held-out report (``metrics``) gives, per draft position, the agreement with the target and
the chain acceptance. The rank-r accuracies are kept in the checkpoint: they pick the Medusa tree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.heads import MedusaHeads, MTPModules, TargetHead, mtp_block_config
from ..models.layers import rms_norm
from .features import FeatureSet
from .metrics import position_report, ranks_hit

LOSS_VOCAB = 16384  # rows of the LM head scored in training when the vocabulary is larger


def loss_vocab(features: FeatureSet, vocab_size: int, size: int = LOSS_VOCAB) -> torch.Tensor | None:
    """The LM-head rows scored in training (sorted ids): the ids of the sequences, the ``size``
    most frequent when there are more; None (the whole vocabulary) when it has at most 2 x ``size``."""
    if vocab_size <= 2 * size:
        return None
    counts = features.token_counts(vocab_size)
    return counts.topk(min(size, int((counts > 0).sum()))).indices.sort().values


class Scorer:
    """``lm_head(final_norm(h))`` over the full vocabulary or the training subset, with labels
    mapped into it (labels outside the subset get -1 and are masked)."""

    def __init__(self, head: TargetHead, ids: torch.Tensor | None):
        self.head, self.ids = head, ids
        self.weight = head.lm_head if ids is None else head.lm_head[ids]
        if ids is not None:
            self.index = torch.full((head.lm_head.shape[0],), -1, dtype=torch.int64)
            self.index[ids] = torch.arange(ids.numel())

    def logits(self, h: torch.Tensor, norm_weight: torch.Tensor | None = None) -> torch.Tensor:
        w = self.head.norm_weight if norm_weight is None else norm_weight
        return F.linear(rms_norm(h, w, self.head.eps), self.weight)

    def labels(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens if self.ids is None else self.index[tokens]


def masked_ce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over ``mask & labels >= 0``. Shape: logits [..., V]; labels / mask [...]."""
    keep = mask & (labels >= 0)
    if not keep.any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits[keep].float(), labels[keep])


def _shifted(tokens: torch.Tensor, mask: torch.Tensor, offset: int):
    """Labels ``tokens[:, t + offset]`` at positions t and where they count. Shape: [B, T] -> [B, T - offset]."""
    return tokens[:, offset:], mask[:, offset:]


# -- Medusa -------------------------------------------------------------------------------------------


def medusa_loss(heads: MedusaHeads, scorer: Scorer, features: FeatureSet, rows: torch.Tensor) -> torch.Tensor:
    """Mean over heads of each head's cross-entropy on ``rows``."""
    start = max(0, int(features.prompt_lens[rows].min()) - 2)  # no label before the first prompt end - 2
    tokens, generated, hidden = features.batch(rows, (-1,), start=start)
    out = heads(hidden[-1])  # [B, T, K, H]
    loss = 0.0
    for i in range(heads.num_heads):
        labels, mask = _shifted(tokens, generated, 2 + i)
        n = labels.shape[1]
        loss = loss + masked_ce(scorer.logits(out[:, :n, i]), scorer.labels(labels), mask)
    return loss / heads.num_heads


@torch.no_grad()
def medusa_report(heads: MedusaHeads, head: TargetHead, features: FeatureSet) -> dict:
    """The held-out report (``metrics.position_report``): head i is draft position i."""
    per = [[] for _ in range(heads.num_heads)]
    for i in range(len(features)):
        tokens, generated, hidden = features.batch([i], (-1,))
        logits = head.logits(heads(hidden[-1]))[0]  # [T, K, V]
        for k in range(heads.num_heads):
            labels, mask = _shifted(tokens, generated, 2 + k)
            n = labels.shape[1]
            per[k].append((ranks_hit(logits[:n, k], labels[0]), mask[0]))
    return position_report(per)


def train_medusa(target, features: FeatureSet, num_heads: int, loop, checkpoint, log, held_out: FeatureSet):
    from ..models.heads import target_head
    from .loop import optimise

    head = target_head(target)
    head = TargetHead(head.embed.detach().float(), head.norm_weight.detach().float(), head.eps,
                      head.lm_head.detach().float(), head.config)
    heads = MedusaHeads(head.norm_weight.shape[0], num_heads)
    scorer = Scorer(head, loss_vocab(features, head.lm_head.shape[0]))
    log(f"[train] medusa: {num_heads} heads, {sum(p.numel() for p in heads.parameters()) / 1e6:.2f}M parameters, "
        f"{loop.steps} steps of {loop.batch_size} sequences"
        + ("" if scorer.ids is None else f", loss over the {scorer.ids.numel()} most generated tokens"))
    optimise(heads, lambda rows, step: medusa_loss(heads, scorer, features, rows), len(features), loop, checkpoint, log,
             "medusa")
    heads.requires_grad_(False)
    report = medusa_report(heads, head, held_out)
    heads.topk_accuracy = [r["rank_accuracy"] for r in report["positions"]]
    return heads, report


# -- MTP ----------------------------------------------------------------------------------------------


class _TrainingCache:
    """A one-layer K/V scratch for whole-sequence training forwards: separate K and V tensors (not
    views of one buffer, which autograd cannot write into twice), empty, never committed."""

    def __init__(self, modules: MTPModules, batch: int, length: int, like: torch.Tensor) -> None:
        c = modules.config
        shape = (batch, c.num_key_value_heads, length, c.head_dim)
        self.keys = [torch.zeros(shape, dtype=like.dtype)]
        self.values = [torch.zeros(shape, dtype=like.dtype)]
        self.lengths = torch.zeros(batch, dtype=torch.int64)

    def begin_forward(self, n: int) -> int:
        return n


def mtp_outputs(modules: MTPModules, head: TargetHead, hidden: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Module d's outputs over whole sequences (teacher-forced). Shape: hidden [B, T, H], tokens
    [B, T] -> D tensors [B, T - d, H] (module d at positions 0 .. T - d - 1)."""
    B, T, _ = hidden.shape
    outs, h = [], hidden
    for d in range(1, modules.num_modules + 1):
        n = T - d
        cache = _TrainingCache(modules, B, n, hidden) if torch.is_grad_enabled() else modules.new_cache(B, n)[0]
        h = modules(d - 1, modules.chain_input(d - 2, h[:, :n], head) if d > 1 else h[:, :n],
                    tokens[:, d : d + n], torch.arange(n).expand(B, n), cache, head)
        outs.append(h)
    return outs


def _mtp_terms(modules, head, scorer, tokens, generated, hidden):
    """(logits, labels, mask) per module: module d at t predicts t + d + 1."""
    terms = []
    for d, h in enumerate(mtp_outputs(modules, head, hidden, tokens), start=1):
        labels, mask = _shifted(tokens, generated, d + 1)
        n = labels.shape[1]
        norm = modules.head_for(d - 1, head).norm_weight
        terms.append((scorer.logits(h[:, :n], norm), scorer.labels(labels), mask))
    return terms


def mtp_loss(modules: MTPModules, head: TargetHead, scorer: Scorer, features: FeatureSet, rows) -> torch.Tensor:
    tokens, generated, hidden = features.batch(rows, (-1,))
    terms = _mtp_terms(modules, head, scorer, tokens, generated, hidden[-1])
    return sum(masked_ce(lg, lb, m) for lg, lb, m in terms) / len(terms)


@torch.no_grad()
def mtp_report(modules: MTPModules, head: TargetHead, features: FeatureSet) -> dict:
    """The held-out report (``metrics.position_report``): module d is draft position d - 1."""
    full = Scorer(head, None)
    per = [[] for _ in range(modules.num_modules)]
    for i in range(len(features)):
        tokens, generated, hidden = features.batch([i], (-1,))
        for d, (lg, lb, m) in enumerate(_mtp_terms(modules, head, full, tokens, generated, hidden[-1])):
            per[d].append((ranks_hit(lg[0], lb[0]), m[0]))
    return position_report(per)


def train_mtp(target, features: FeatureSet, num_modules: int, loop, checkpoint, log, held_out: FeatureSet):
    from ..models.heads import target_head
    from .loop import optimise

    head = target_head(target)
    head = TargetHead(head.embed.detach().float(), head.norm_weight.detach().float(), head.eps,
                      head.lm_head.detach().float(), head.config)
    torch.manual_seed(loop.seed + 1)
    modules = MTPModules(mtp_block_config(head), num_modules)
    modules.requires_grad_(True)
    scorer = Scorer(head, loss_vocab(features, head.lm_head.shape[0]))
    log(f"[train] mtp: {num_modules} modules, {sum(p.numel() for p in modules.parameters()) / 1e6:.2f}M parameters, "
        f"{loop.steps} steps of {loop.batch_size} sequences"
        + ("" if scorer.ids is None else f", loss over the {scorer.ids.numel()} most generated tokens"))
    optimise(modules, lambda rows, step: mtp_loss(modules, head, scorer, features, rows), len(features), loop, checkpoint,
             log, "mtp")
    modules.requires_grad_(False)
    report = mtp_report(modules, head, held_out)
    modules.topk_accuracy = [r["rank_accuracy"] for r in report["positions"]]
    return modules, report
