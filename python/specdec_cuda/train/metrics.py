"""The held-out report of a trained drafter: per draft position, how often it agrees with the target.

Draft position k (0-based) of a drafter is scored at the positions t of the held-out sequences
that its trainer marks valid (its label, the target's token there, exists, and the tokens the draft
builds on are what greedy decoding would have fed it). Two figures per position:

* ``top1`` / ``top5`` / ``rank_accuracy``: the label is the drafter's best guess (among its best
  5; is its rank-r guess, r < ``TOPK_RANKS``), at every t where position k is valid;
* ``chain_acceptance``: at the t where the deepest position is valid, the share where positions
  0 .. k all hold the label as their best guess. Greedy chain decoding accepts, per step, the
  sum of these on average (``mean_accepted``): the figure the speedup follows.
"""

from __future__ import annotations

import torch

TOPK_RANKS = 10


def ranks_hit(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Whether ``labels`` is each row's rank-r guess. Shape: logits [n, V], labels [n] -> [n, R] bool."""
    return logits.topk(min(TOPK_RANKS, logits.shape[-1]), dim=-1).indices == labels[:, None]


def position_report(per_position: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> dict:
    """``per_position[k]``: per held-out sequence, (hits [n_k, R] bool, valid [n_k] bool) of draft
    position k at positions t = 0 .. n_k - 1 (n_k not increasing in k). Returns
    ``{"positions": [{top1, top5, chain_acceptance, rank_accuracy}, ...], "mean_accepted": float}``."""
    deepest = [len(v) for _, v in per_position[-1]]
    chain_valid = torch.cat([v for _, v in per_position[-1]])
    ok, rows, total = None, [], 0.0
    for per_seq in per_position:
        hit = torch.cat([h for h, _ in per_seq])
        valid = torch.cat([v for _, v in per_seq])
        ranks = (hit & valid[:, None]).sum(0).double() / valid.sum().clamp(min=1)
        first = torch.cat([h[:n, 0] for (h, _), n in zip(per_seq, deepest)])
        ok = first if ok is None else ok & first
        chain = float((ok & chain_valid).sum() / chain_valid.sum().clamp(min=1))
        total += chain
        rows.append(dict(top1=round(float(ranks[0]), 4), top5=round(float(ranks[:5].sum()), 4),
                         chain_acceptance=round(chain, 4), rank_accuracy=[round(float(r), 4) for r in ranks]))
    return dict(positions=rows, mean_accepted=round(total, 3),
                scored_positions=int(chain_valid.sum()))
