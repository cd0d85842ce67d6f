"""The exit adapter of ``method="layer_skip"`` (Kangaroo; ``models.exit_adapter``) distilled from
the frozen target's cached features.

Data: the target's residual stream after layer ``exit_layer - 1`` and its final normed hidden
state at every position of the training sequences (``features``). By default the sequences are
windows of the user's text read by the target (teacher forcing, ``DistillSpec.gen_tokens = 0``):
one forward per window instead of token-by-token generation (on a 2-core CPU and the 1.5B, ~190
tokens/s against ~17), and the labels still come from the target, not from the text.

Loss: at every position, the KL divergence from the target's next-token distribution to the
adapter's, both over the draft vocabulary (the ``draft_vocab`` ids most frequent in the training
sequences; the head rows the adapter drafts over). The target's distribution there is its own LM
head over its final normed hidden state, restricted to those rows and renormalised.

Held-out report: ``top1`` is how often the adapter's best guess is the target's own argmax over the
whole vocabulary (what greedy verification accepts), ``top5`` the same among its best five.
A chain's later positions cannot be scored on teacher-forced text (the text, not the draft, is
their context), so ``mean_accepted`` is the estimate sum_{d=1..4} top1^d of a 4-token chain whose
tokens are accepted independently.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.eagle3 import draft_vocab_from_counts
from ..models.exit_adapter import ExitAdapter, ExitAdapterConfig
from .features import FeatureSet
from .teacher import Teacher

CHAIN = 4  # the chain length of the report's mean_accepted estimate


def draft_vocabulary(features: FeatureSet, vocab_size: int, size: int | None) -> torch.Tensor:
    """The ``size`` ids most frequent in the training sequences, sorted, ties to the lower id (EAGLE-3's
    rule, ``draft_vocab_from_counts``); all ids when None or at least the vocabulary."""
    if size is None or size >= vocab_size:
        return torch.arange(vocab_size)
    counts = features.token_counts(vocab_size)
    d2t, _ = draft_vocab_from_counts(counts, size)  # draft id d is target id d + d2t[d]
    return torch.arange(size) + d2t


def _batch(adapter: ExitAdapter, features: FeatureSet, rows):
    """stream [B, T, H], final hidden [B, T, H] and valid [B, T] of sequences ``rows``."""
    L = adapter.config.exit_layer - 1
    _, _, hidden = features.batch(rows, (L, -1))
    lengths = features.lengths[torch.as_tensor(rows, dtype=torch.int64).reshape(-1)]
    valid = torch.arange(hidden[L].shape[1])[None] < lengths[:, None]
    return hidden[L], hidden[-1], valid


def exit_loss(adapter: ExitAdapter, teacher: Teacher, features: FeatureSet, rows) -> torch.Tensor:
    stream, final, valid = _batch(adapter, features, rows)
    student = teacher.head_logits(adapter.forward_full(stream))[valid].float()
    with torch.no_grad():
        target = teacher.draft_logits(final)[valid].float()
    return F.kl_div(F.log_softmax(student, -1), F.log_softmax(target, -1), log_target=True, reduction="batchmean")


@torch.no_grad()
def exit_report(adapter: ExitAdapter, teacher: Teacher, features: FeatureSet) -> dict:
    hits, top5, total = 0, 0, 0
    for i in range(len(features)):
        stream, final, valid = _batch(adapter, features, [i])
        logits = teacher.head_logits(adapter.forward_full(stream))[valid].float()
        guess = teacher.ids[logits.topk(min(5, logits.shape[-1]), -1).indices]  # [n, 5] target ids
        label = teacher.argmax(final[valid])  # the target's argmax over every id
        hits += int((guess[:, 0] == label).sum())
        top5 += int((guess == label[:, None]).any(-1).sum())
        total += int(valid.sum())
    top1 = hits / max(total, 1)
    return dict(positions=[dict(top1=round(top1, 4), top5=round(top5 / max(total, 1), 4),
                                chain_acceptance=round(top1, 4))],
                mean_accepted=round(sum(top1 ** d for d in range(1, CHAIN + 1)), 3),
                mean_accepted_is="estimated: sum of top1^d, d = 1..4", scored_positions=total)


def train_exit(target, features: FeatureSet, config: ExitAdapterConfig, loop, checkpoint, log,
               held_out: FeatureSet):
    from .loop import optimise

    ids = draft_vocabulary(features, int(target.vocab_size), config.draft_vocab_size)
    config.draft_vocab_size = ids.numel()
    teacher = Teacher(target, ids)
    adapter = ExitAdapter.initial(config, seed=loop.seed, draft_ids=ids).float()
    log(f"[train] exit: adapter after layer {config.exit_layer} of {config.num_target_layers}, MLP width "
        f"{config.intermediate_size}, draft vocabulary {ids.numel()}, "
        f"{sum(p.numel() for p in adapter.parameters()) / 1e6:.2f}M parameters, {loop.steps} steps of "
        f"{loop.batch_size} sequences")
    optimise(adapter, lambda rows, step: exit_loss(adapter, teacher, features, rows), len(features), loop, checkpoint,
             log, "exit")
    adapter.requires_grad_(False).eval()
    return adapter, exit_report(adapter, teacher, held_out)
