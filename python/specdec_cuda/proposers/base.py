"""What the speculative loop asks of a proposer (the one place methods differ)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..decoding import SamplingParams


@dataclass
class ChainDraft:
    """A chain of draft tokens per row, ragged.

    Shape: tokens [B, k_max] int64 (row b's drafts in ``tokens[b, :num_draft[b]]``, tail padded
    with any valid id); num_draft [B] int64; logits [B, k_max, V] (the logits each draft token was
    sampled from, so rejection sampling sees exactly q) or None (sample-and-match / greedy).
    """

    tokens: torch.Tensor
    num_draft: torch.Tensor
    logits: torch.Tensor | None


class ChainProposer(Protocol):
    """Proposes a chain per row on top of the committed sequence; told what was accepted."""

    uses_draft_logits: bool

    def prefill(self, prompts: torch.Tensor, prompt_lens: torch.Tensor, first_tokens: torch.Tensor,
                params: SamplingParams, max_length: int) -> None:
        """Start on padded ``prompts`` [B, P] (``prompt_lens`` [B]) followed by ``first_tokens`` [B]."""

    def propose(self, last_tokens: torch.Tensor, lengths: torch.Tensor, active: torch.Tensor,
                budget: torch.Tensor) -> ChainDraft:
        """Drafts following ``last_tokens`` [B], which sit at absolute positions ``lengths`` [B].

        Rows with ``active[b]`` False are finished: they may get any draft of length 0. Row ``b``
        needs at most ``budget[b]`` drafts (its remaining token budget less the bonus token).
        """

    def accept(self, num_accepted: torch.Tensor, next_tokens: torch.Tensor, active: torch.Tensor) -> None:
        """``num_accepted`` [B] drafts of the last proposal were kept, then ``next_tokens`` [B]."""
