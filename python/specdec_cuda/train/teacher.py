"""The frozen target as the teacher of the drafters trained on its distributions (the exit adapter,
EAGLE-3): its final norm and LM head, over the rows of a draft vocabulary or over every id.

Feature layer -1 (``features``) is the target's final normed hidden state, so its logits are the
head alone over it; a drafter's own stream goes through the final norm first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.layers import rms_norm


class Teacher:
    """Shape: ids [Vd] target ids of the draft vocabulary (sorted); rows [Vd, H] and full [V, H]
    float32 copies of the LM head's rows."""

    def __init__(self, target, ids: torch.Tensor):
        from ..models.heads import target_head

        head = target_head(target)
        self.norm_weight, self.eps = head.norm_weight.detach().float(), head.eps
        self.full = head.lm_head.detach().float()  # [V, H] (a GGUF head decoded)
        self.ids = ids
        self.rows = self.full[ids].contiguous()  # [Vd, H]

    def draft_logits(self, final: torch.Tensor) -> torch.Tensor:
        """The target's logits over the draft vocabulary. Shape: final [..., H] -> [..., Vd]."""
        return F.linear(final, self.rows.to(final.dtype))

    def draft_probs(self, final: torch.Tensor) -> torch.Tensor:
        """Its next-token distribution renormalised over the draft vocabulary, float32.
        Shape: final [..., H] -> [..., Vd]."""
        return torch.softmax(F.linear(final.float(), self.rows), dim=-1)

    def argmax(self, final: torch.Tensor) -> torch.Tensor:
        """The target's greedy choice over its whole vocabulary. Shape: [n, H] -> [n] int64."""
        return F.linear(final.float(), self.full).argmax(-1)

    def head_logits(self, stream: torch.Tensor) -> torch.Tensor:
        """The target's final norm and draft-vocabulary rows over a drafter's residual stream.
        Shape: [..., H] -> [..., Vd]."""
        return F.linear(rms_norm(stream, self.norm_weight.to(stream.dtype), self.eps), self.rows.to(stream.dtype))
