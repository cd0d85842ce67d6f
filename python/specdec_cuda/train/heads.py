"""Medusa heads and MTP modules trained on the frozen target's cached features (``features``).

* Medusa: head i (0-based) at position t reads the target's final normed hidden state at t and
  learns token t + 2 + i, through the target's frozen final norm and LM head.
* MTP: module d (1-based) at position t, reading module d - 1's output at t (the target's hidden
  state for d = 1) and the embedding of token t + d, learns token t + d + 1; the D modules are
  trained jointly over whole sequences (teacher-forced: under greedy decoding the inputs of an
  accepted chain are exactly these).

The labels: where the target generated, its generated tokens; on text it only read
(``DistillSpec.gen_tokens = 0``, teacher forcing), its own greedy choice at every token (the
argmax of its LM head over its final state at the token before), which is what greedy
verification accepts there. (On a greedy continuation the two are the same tokens.) A Medusa head
does not see the tokens between its position and its label, so on text it learns only where those
are the target's own choices, as greedy decoding would have fed them; MTP modules read them. A large
vocabulary is scored over a subset of the LM head's rows (``loss_vocab``): the ids the sequences
hold (the ``LOSS_VOCAB`` most frequent when there are more), every generated label outside it
dropped, and on text the target's choice taken among those rows. The softmax over the subset
approximates the full one where the head puts its mass, and costs a tenth on a 152k-token
vocabulary; drafting still uses the whole head.

The held-out report (``metrics``) gives, per draft position, the agreement with the target's
greedy choice over its whole vocabulary and the chain acceptance, at the positions t where the
tokens the draft builds on (t + 1 .. up to the drafted one) are the target's own greedy choices,
as in greedy decoding (on generated continuations: the generated positions). The rank-r accuracies
are kept in the checkpoint: they pick the Medusa tree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.heads import MedusaHeads, MTPModules, TargetHead, mtp_block_config
from ..models.layers import rms_norm
from .features import FeatureSet
from .metrics import TOPK_RANKS, position_report, ranks_hit

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


@torch.no_grad()
def _labels(scorer: Scorer, features: FeatureSet, rows, tokens: torch.Tensor, generated: torch.Tensor,
            final: torch.Tensor, start: int = 0):
    """Each token's label in the scorer's ids and whether it counts (module docstring): the
    generated tokens where the target generated; on text it only read, the target's greedy choice of
    every token but the first (among the scored rows, from its final state at the token before).
    Shape: tokens / generated [B, T] (``features.batch``'s rows from ``start``), final [B, T, H]
    -> labels [B, T] int64, counts [B, T] bool."""
    if features.generated_tokens() > 0:
        return scorer.labels(tokens), generated
    choice = F.linear(final.float(), scorer.weight).argmax(-1)  # [B, T]: of token s + 1
    labels = torch.cat([torch.full_like(choice[:, :1], -1), choice[:, :-1]], dim=1)
    n = features.lengths[torch.as_tensor(rows, dtype=torch.int64).reshape(-1)] - start
    return labels, torch.arange(tokens.shape[1])[None] < n[:, None]


def _follows(scorer: Scorer, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Whether token s is the label there (``_labels``' on read text: the target's choice), both
    compared in the scorer's ids. Shape: tokens / labels [B, T] -> [B, T] bool."""
    return (scorer.labels(tokens) == labels) & (labels >= 0)


def _greedy(head: TargetHead, tokens: torch.Tensor, final: torch.Tensor):
    """The target's greedy choice of token t + 1 [T] (over its whole vocabulary) and whether token
    t + 1 is it [T - 1]. Shape: tokens [T], final [T, H]."""
    greedy = F.linear(final.float(), head.lm_head).argmax(-1)
    return greedy, tokens[1:] == greedy[:-1]


def _scored(follows: torch.Tensor, generated: torch.Tensor | None, offset: int, n: int) -> torch.Tensor:
    """The report's positions t < n for a draft of token t + ``offset``: tokens t + 1 .. t + offset - 1
    follow the target (greedy decoding's inputs), and token t + offset was generated (on generated
    data, ``generated`` [T]; None on text). Shape: [n] bool."""
    valid = torch.ones(n, dtype=torch.bool) if generated is None else generated[offset : offset + n].clone()
    for j in range(offset - 1):
        valid &= follows[j : j + n]
    return valid


# -- Medusa -------------------------------------------------------------------------------------------


def medusa_loss(heads: MedusaHeads, scorer: Scorer, features: FeatureSet, rows: torch.Tensor) -> torch.Tensor:
    """Mean over heads of each head's cross-entropy on ``rows``: head i at t learns token t + 2 + i."""
    # Where the target generated, no label comes before the first prompt's end: cut there, less 2.
    start = max(0, int(features.prompt_lens[rows].min()) - 2) if features.generated_tokens() > 0 else 0
    tokens, generated, hidden = features.batch(rows, (-1,), start=start)
    labels, counts = _labels(scorer, features, rows, tokens, generated, hidden[-1], start)
    # On read text a head learns only where the tokens between it and its label are the target's own
    # choices: it does not see them, and greedy decoding feeds it no others (a greedy continuation
    # is the target's choice throughout).
    follows = _follows(scorer, tokens, labels) if features.generated_tokens() == 0 else None
    out = heads(hidden[-1])  # [B, T, K, H]
    loss = 0.0
    for i in range(heads.num_heads):
        n = max(0, tokens.shape[1] - 2 - i)
        counted = counts[:, 2 + i :]
        for j in range(i + 1 if follows is not None else 0):  # tokens t + 1 .. t + 1 + i
            counted = counted & follows[:, 1 + j : 1 + j + n]
        keep = counted & (labels[:, 2 + i :] >= 0)  # the LM head runs on these positions only
        loss = loss + (F.cross_entropy(scorer.logits(out[:, :n, i][keep]).float(), labels[:, 2 + i :][keep])
                       if keep.any() else out.sum() * 0.0)
    return loss / heads.num_heads


@torch.no_grad()
def medusa_report(heads: MedusaHeads, head: TargetHead, features: FeatureSet) -> dict:
    """The held-out report (``metrics.position_report``; what is scored where: module docstring):
    head i is draft position i."""
    only_generated = features.generated_tokens() > 0
    per = [[] for _ in range(heads.num_heads)]
    for i in range(len(features)):
        tokens, generated, hidden = features.batch([i], (-1,))
        greedy, follows = _greedy(head, tokens[0], hidden[-1][0])
        out = heads(hidden[-1])[0]  # [T, K, H]
        for k in range(heads.num_heads):
            n = max(0, tokens.shape[1] - 2 - k)
            valid = _scored(follows, generated[0] if only_generated else None, 2 + k, n)
            # The whole-vocabulary head runs on the scored positions only (the others never count).
            hits = torch.zeros(n, min(TOPK_RANKS, head.lm_head.shape[0]), dtype=torch.bool)
            hits[valid] = ranks_hit(head.logits(out[:n, k][valid]), greedy[1 + k : 1 + k + n][valid])
            per[k].append((hits, valid))
    return position_report(per)


def _float_head(target) -> TargetHead:
    """The target's embedding, final norm and LM head as float32 tensors, frozen."""
    from ..models.heads import target_head

    head = target_head(target)
    return TargetHead(head.embed.detach().float(), head.norm_weight.detach().float(), head.eps,
                      head.lm_head.detach().float(), head.config)


def _scored_rows(scorer: Scorer) -> str:
    return "" if scorer.ids is None else f", loss over the {scorer.ids.numel()} most frequent tokens"


def train_medusa(target, features: FeatureSet, num_heads: int, loop, checkpoint, log, held_out: FeatureSet,
                 start: MedusaHeads | None = None):
    """``num_heads`` new heads, or ``start`` fine-tuned (its head count kept), for ``loop.steps`` steps."""
    from .loop import optimise

    head = _float_head(target)
    heads = MedusaHeads(head.norm_weight.shape[0], num_heads) if start is None else start.float().requires_grad_(True)
    scorer = Scorer(head, loss_vocab(features, head.lm_head.shape[0]))
    log(f"[train] medusa: {'fine-tuning the given heads, ' if start is not None else ''}{heads.num_heads} heads, "
        f"{sum(p.numel() for p in heads.parameters()) / 1e6:.2f}M parameters, "
        f"{loop.steps} steps of {loop.batch_size} sequences" + _scored_rows(scorer))
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


def _mtp_logits(modules, head, scorer, tokens, hidden) -> list[torch.Tensor]:
    """Module d's logits at t = 0 .. T - d - 2 (it predicts token t + d + 1). Shape: [B, T - d - 1, V']."""
    T = tokens.shape[1]
    return [scorer.logits(h[:, : max(0, T - d - 1)], modules.head_for(d - 1, head).norm_weight)
            for d, h in enumerate(mtp_outputs(modules, head, hidden, tokens), start=1)]


def mtp_loss(modules: MTPModules, head: TargetHead, scorer: Scorer, features: FeatureSet, rows) -> torch.Tensor:
    """Mean over modules of each one's cross-entropy: module d at t learns token t + d + 1."""
    tokens, generated, hidden = features.batch(rows, (-1,))
    labels, counts = _labels(scorer, features, rows, tokens, generated, hidden[-1])
    terms = _mtp_logits(modules, head, scorer, tokens, hidden[-1])
    return sum(masked_ce(lg, labels[:, d + 1 :], counts[:, d + 1 :])
               for d, lg in enumerate(terms, start=1)) / len(terms)


@torch.no_grad()
def mtp_report(modules: MTPModules, head: TargetHead, features: FeatureSet) -> dict:
    """The held-out report (``metrics.position_report``; what is scored where: module docstring):
    module d is draft position d - 1."""
    full = Scorer(head, None)
    only_generated = features.generated_tokens() > 0
    per = [[] for _ in range(modules.num_modules)]
    for i in range(len(features)):
        tokens, generated, hidden = features.batch([i], (-1,))
        greedy, follows = _greedy(head, tokens[0], hidden[-1][0])
        for d, lg in enumerate(_mtp_logits(modules, head, full, tokens, hidden[-1]), start=1):
            n = lg.shape[1]
            valid = _scored(follows, generated[0] if only_generated else None, d + 1, n)
            per[d - 1].append((ranks_hit(lg[0], greedy[d : d + n]), valid))
    return position_report(per)


def train_mtp(target, features: FeatureSet, num_modules: int, loop, checkpoint, log, held_out: FeatureSet,
              start: MTPModules | None = None):
    """``num_modules`` new modules, or ``start`` fine-tuned (its module count kept), for ``loop.steps`` steps."""
    from .loop import optimise

    head = _float_head(target)
    torch.manual_seed(loop.seed + 1)
    modules = MTPModules(mtp_block_config(head), num_modules) if start is None else start.float()
    modules.requires_grad_(True)
    scorer = Scorer(head, loss_vocab(features, head.lm_head.shape[0]))
    log(f"[train] mtp: {'fine-tuning the given modules, ' if start is not None else ''}{modules.num_modules} modules, "
        f"{sum(p.numel() for p in modules.parameters()) / 1e6:.2f}M parameters, "
        f"{loop.steps} steps of {loop.batch_size} sequences" + _scored_rows(scorer))
    optimise(modules, lambda rows, step: mtp_loss(modules, head, scorer, features, rows), len(features), loop, checkpoint,
             log, "mtp")
    modules.requires_grad_(False)
    report = mtp_report(modules, head, held_out)
    modules.topk_accuracy = [r["rank_accuracy"] for r in report["positions"]]
    return modules, report
