"""The EAGLE-3 drafter (``models.eagle3``) trained on the frozen target's cached features.

EAGLE-3 (Li et al. 2025), on the sequences of ``features`` (the target's continuations of the
prompts, or, with ``DistillSpec.gen_tokens = 0``, the user's text read by the target):

* the draft vocabulary is the ``draft_vocab`` ids most frequent in the sequences
  (``draft_vocab_from_counts``);
* the training-time test (``Eagle3Drafter.train_forward``): ``steps`` chained drafter steps at
  every position, step 0 on the target's fused low / middle / high features, step i > 0 on the
  drafter's own step i - 1 outputs, so the drafter learns from the inputs it will meet when it
  drafts a chain rather than from the target's features only;
* the labels are the target's own next-token distributions, not the text's tokens: step i at
  position t reads tokens up to t + 1 + i, and its label is what the target predicts after them,
  softmax of the target's LM head rows of the draft vocabulary over its final hidden state at
  t + 1 + i (renormalised over those rows). On a greedy continuation the argmax of that is the
  generated token; on text it is what the target would say there, which is what verification
  accepts. Step i's soft cross-entropy is weighted by ``DECAY ** i`` (early draft positions decide
  the accepted length), averaged over every position of the sequences;
* its final norm and LM head start as the target's (``head_from_target``: its final norm and its
  head's rows of the draft vocabulary), so the drafter's output space is the target's from the
  first step; the rest starts random. (Not the target's early exit: the drafter at t reads token
  t + 1 and predicts t + 2, while a stream at t predicts t + 1.)

The held-out report scores step i as draft position i (``metrics``) against the target's argmax
over its whole vocabulary (a label outside the draft vocabulary is a miss), at the positions t
where the chain's inputs are what greedy decoding would feed: tokens t + 2 .. t + 1 + i are the
target's own argmax choices (on generated greedy continuations: every generated position; on text:
where the text follows the target, which leans towards the predictable stretches).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.eagle3 import Eagle3Config, Eagle3Drafter, draft_vocab_from_counts
from .features import FeatureSet
from .metrics import position_report, ranks_hit
from .teacher import Teacher

DECAY = 0.8  # EAGLE-3's per-step loss weight


def head_from_target(drafter: Eagle3Drafter, teacher: Teacher) -> None:
    """Copy the target's final norm and its head's draft-vocabulary rows into the drafter."""
    with torch.no_grad():
        drafter.norm.weight.copy_(teacher.norm_weight)
        drafter.lm_head.weight.copy_(teacher.rows)


def _inputs(drafter: Eagle3Drafter, features: FeatureSet, rows):
    """tokens [B, T], generated [B, T], lengths [B], the fused-input features [B, T, 3H] and the
    target's final hidden states [B, T, H] of ``rows``."""
    layers = drafter.config.target_layers
    tokens, generated, hidden = features.batch(rows, tuple(sorted({*layers, -1})), dtype=drafter.dtype)
    lengths = features.lengths[torch.as_tensor(rows, dtype=torch.int64).reshape(-1)]
    return tokens, generated, lengths, torch.cat([hidden[l] for l in layers], dim=-1), hidden[-1]


def eagle3_loss(drafter: Eagle3Drafter, teacher: Teacher, features: FeatureSet, rows: torch.Tensor,
                steps: int) -> torch.Tensor:
    tokens, _, lengths, feats, final = _inputs(drafter, features, rows)
    T = tokens.shape[1]
    steps = min(steps, T - 2)
    with torch.no_grad():
        probs = teacher.draft_probs(final[:, 1 : T - 1])  # [B, T - 2, Vd]: the label of step i at t is row t + i
    total, weights = 0.0, 0.0
    for i, logits in enumerate(drafter.train_forward(feats, tokens, steps)):
        n = T - 2 - i
        keep = torch.arange(n)[None] + 1 + i < lengths[:, None]  # the target's state at t + 1 + i exists
        if keep.any():
            ce = -(probs[:, i : i + n][keep] * F.log_softmax(logits[keep].float(), dim=-1)).sum(-1).mean()
            total = total + DECAY ** i * ce
            weights += DECAY ** i
    return total / weights if weights else feats.sum() * 0.0


@torch.no_grad()
def eagle3_report(drafter: Eagle3Drafter, teacher: Teacher, features: FeatureSet, steps: int) -> dict:
    """The held-out report (``metrics.position_report``; what is scored where: module docstring)."""
    only_generated = features.generated_tokens() > 0
    per = [[] for _ in range(steps)]
    for i in range(len(features)):
        tokens, generated, lengths, feats, final = _inputs(drafter, features, [i])
        T = int(lengths[0])
        if T < steps + 2:
            continue
        greedy = teacher.argmax(final[0, : T - 1])  # [T - 1]: the target's choice of token t + 1
        follows = tokens[0, 1:T] == greedy  # [T - 1]: token t + 1 is the target's own choice
        for k, logits in enumerate(drafter.train_forward(feats, tokens, steps)):
            n = T - 2 - k
            valid = torch.ones(n, dtype=torch.bool)
            for j in range(k):  # the chain's inputs: tokens t + 2 .. t + 1 + k follow the target
                valid &= follows[1 + j : 1 + j + n]
            if only_generated:
                valid &= generated[0, 2 + k : 2 + k + n]
            labels = drafter.draft_ids(greedy[1 + k : 1 + k + n])  # -1 never equals a draft id: a miss
            per[k].append((ranks_hit(logits[0], labels), valid))
    return position_report(per)


def train_eagle3(target, features: FeatureSet, steps: int, draft_vocab: int, loop, checkpoint, log,
                 held_out: FeatureSet, intermediate_size: int | None = None, start: Eagle3Drafter | None = None):
    """A new drafter (``draft_vocab`` ids, MLP ``intermediate_size``), or ``start`` fine-tuned (an
    attached drafter: its shape and draft vocabulary kept), trained for ``loop.steps`` steps."""
    from .loop import optimise

    V = int(target.vocab_size)
    counts = features.token_counts(V)
    if start is None:
        size = min(draft_vocab, V)
        d2t, t2d = draft_vocab_from_counts(counts, size)
        overrides = {} if intermediate_size is None else dict(intermediate_size=intermediate_size)
        config = Eagle3Config.for_target(target, draft_vocab_size=size, **overrides)
        drafter = Eagle3Drafter.random(config, seed=loop.seed, d2t=d2t, t2d=t2d).attach(target).float()
        teacher = Teacher(target, drafter.target_ids())
        head_from_target(drafter, teacher)
    else:
        drafter = start.float()
        config, t2d = drafter.config, drafter.t2d.cpu()
        teacher = Teacher(target, drafter.target_ids().cpu())
    covered = float(counts[t2d].sum() / counts.sum().clamp(min=1))
    log(f"[train] eagle3: {'fine-tuning the given drafter, ' if start is not None else ''}target layers "
        f"{list(config.target_layers)}, draft vocabulary {config.draft_vocab_size} "
        f"({100 * covered:.1f}% of the training tokens), MLP width {config.intermediate_size}, {steps} "
        f"training-time-test steps, "
        f"{sum(p.numel() for p in drafter.parameters() if p.requires_grad) / 1e6:.2f}M parameters, "
        f"{loop.steps} steps of {loop.batch_size} sequences")
    drafter.requires_grad_(True)
    optimise(drafter, lambda rows, step: eagle3_loss(drafter, teacher, features, rows, steps), len(features), loop,
             checkpoint, log, "eagle3")
    drafter.requires_grad_(False).eval()
    return drafter, dict(eagle3_report(drafter, teacher, held_out, steps), draft_vocab_coverage=round(covered, 4))
