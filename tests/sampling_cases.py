"""Input builders shared by the sampling tests and benchmark (batches of every row kind)."""

from __future__ import annotations

import torch


def llm_like_logits(rows: int, vocab: int, generator: torch.Generator, spread: float = 2.0,
                    peak: float = 6.0) -> torch.Tensor:
    """[rows, vocab] float32 logits: a N(0, spread^2) bulk plus a few boosted tokens per row."""
    logits = torch.randn(rows, vocab, generator=generator) * spread
    num_peaks = max(1, min(8, vocab // 8))
    peaks = torch.randint(0, vocab, (rows, num_peaks), generator=generator)
    boost = torch.rand(rows, num_peaks, generator=generator) * peak
    logits.scatter_add_(1, peaks, boost)
    return logits


def ragged_counts(batch: int, k: int, generator: torch.Generator, ragged: bool) -> list[int]:
    if not ragged:
        return [k] * batch
    return [int(c) for c in torch.randint(0, k + 1, (batch,), generator=generator)]


def make_chain_batch(batch: int, k: int, vocab: int, *, seed: int = 0, ragged: bool = False,
                     with_draft_logits: bool = True, dtype: torch.dtype = torch.float32,
                     greedy_fraction: float = 0.3, filters: bool = True, typical: bool = False,
                     flagged: bool = False, accept_bias: float = 0.7):
    """A verify_chain batch mixing greedy rows with sampled rows (temperature, top-k, top-p).

    Drafts are correlated with the target so that chains are partly accepted: with probability
    ``accept_bias`` a draft is the target's argmax (greedy rows) or a sample of the draft row,
    otherwise a uniform token. ``flagged`` adds rows with NaN logits, out-of-range drafts and bad
    parameters. Returns a dict of verify_chain keyword arguments.
    """
    g = torch.Generator().manual_seed(seed)
    counts = ragged_counts(batch, k, g, ragged)
    cu = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0)
    num_drafts = int(cu[-1])
    target = llm_like_logits(num_drafts + batch, vocab, g)
    draft = target[:0].clone()
    if with_draft_logits:
        rows_of_draft = torch.cat([torch.arange(int(cu[i]), int(cu[i + 1])) + i for i in range(batch)]
                                  ) if num_drafts else torch.zeros(0, dtype=torch.int64)
        draft = target[rows_of_draft] + torch.randn(num_drafts, vocab, generator=g) * 1.5
    temperature = torch.rand(batch, generator=g) * 1.2 + 0.3
    temperature[torch.rand(batch, generator=g) < greedy_fraction] = 0.0
    top_k = torch.zeros(batch, dtype=torch.int32)
    top_p = torch.ones(batch)
    if filters:
        pick = torch.rand(batch, generator=g)
        top_k[pick < 0.25] = torch.randint(1, max(2, min(50, vocab)), (1,), generator=g).int()
        top_p[(pick >= 0.25) & (pick < 0.5)] = 0.8
        both = (pick >= 0.5) & (pick < 0.65)
        top_k[both] = max(1, vocab // 3)
        top_p[both] = 0.6
    drafts = torch.empty(num_drafts, dtype=torch.int64)
    for i in range(batch):
        for j in range(int(cu[i]), int(cu[i + 1])):
            source = draft[j] if with_draft_logits else target[j + i]
            if torch.rand(1, generator=g) < accept_bias:
                if temperature[i] == 0:
                    drafts[j] = int(torch.argmax(target[j + i]))
                else:
                    probs = torch.softmax(source / temperature[i], 0)
                    drafts[j] = int(torch.multinomial(probs, 1, generator=g))
            else:
                drafts[j] = int(torch.randint(0, vocab, (1,), generator=g))
    if flagged and batch >= 4:
        target[int(cu[1]) + 1, vocab // 2] = float("nan")  # row 1, first position: NaN
        if counts[2] > 0:
            drafts[int(cu[2])] = vocab  # row 2: out-of-range draft
        temperature[3] = -1.0  # row 3: bad parameter
    return dict(
        draft_tokens=drafts, cu_num_draft=cu, target_logits=target.to(dtype),
        draft_logits=draft.to(dtype) if with_draft_logits else None, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=torch.randint(0, 2**62, (batch,), generator=g),
        position=torch.randint(0, 10000, (batch,), generator=g), typical=typical,
    )
