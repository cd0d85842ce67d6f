"""A chain drafted by the target itself on its own cache: the loop shared by the self-speculative
methods (``quantspec``: 4-bit weights; ``layer_skip``: a subset of its layers).

Each draft pass runs one token per row at the pending slot, commits it so the next pass sees it,
and the whole chain is rolled back at the end (``truncate``: lengths only), so verification
overwrites those slots with the full model's K/V.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import ops
from ..contract import Draft, DraftKind, SamplingParams, StepState
from ..reference.philox import Purpose


def self_draft_chain(forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], cache, state: StepState,
                     params: SamplingParams, k: int, kind: DraftKind, coupled: bool = False) -> Draft | None:
    """Up to ``k`` tokens per row from ``forward(tokens [B, 1], positions [B, 1]) -> logits [B, V]``
    (a draft pass on ``cache``), each sampled from those logits with the request's parameters (on
    the target's own sampling stream when ``coupled``); ``kind`` SAMPLED keeps the logits (q) for
    rejection sampling, GUESS drafts without them. None where no row may draft."""
    lengths, active = state.lengths, state.active
    limit = torch.where(active, torch.clamp(state.max_draft, max=k), 0)  # [B]
    k_step = int(limit.max())
    if k_step == 0:
        return None
    batch = lengths.shape[0]
    committed = cache.lengths.clone()  # the draft passes are rolled back to this
    ones = torch.ones(batch, dtype=torch.int64, device=lengths.device)
    tokens = torch.zeros(batch, k_step, dtype=torch.int64, device=lengths.device)
    keep_logits = kind is DraftKind.SAMPLED
    draft_logits = None
    current = state.last_tokens[:, None]  # the root, at position lengths
    for j in range(k_step):
        logits = forward(current, lengths[:, None] + j)  # [B, V]: q at position lengths + j + 1
        cache.commit(ones)
        if draft_logits is None and keep_logits:
            draft_logits = torch.empty(batch, k_step, logits.shape[-1], dtype=logits.dtype, device=logits.device)
        sampled = ops.sample(logits, **params.kwargs(), position=lengths + 1 + j,
                             purpose=Purpose.SAMPLE if coupled else Purpose.DRAFT)
        # A row the sampler flagged (-1: bad draft logits) proposes token 0, judged like any draft.
        torch.clamp(sampled.tokens, min=0, out=tokens[:, j])
        if keep_logits:
            draft_logits[:, j] = logits
        current = tokens[:, j : j + 1]
    cache.truncate(committed)  # verification rewrites these slots with the full model's K/V
    return Draft(tokens, limit, kind, logits=draft_logits)
