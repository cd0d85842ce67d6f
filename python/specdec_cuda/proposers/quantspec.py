"""QuantSpec (Tiwari et al. 2025): self-speculative decoding with 4-bit weights and a hierarchical
4-bit KV cache.

The target drafts for itself. Its KV cache is the hierarchical one (``models.QuantKVCache``):
every complete group of tokens is kept as an upper and a lower 4-bit half, the recent tokens in a
float32 buffer. A draft pass runs the same layers with their linears through ``W4Linear`` (the MLPs
by default; ``draft_attention=True`` puts the attention projections in 4 bits too: on the GPU-shaped
bench model that drafts in 0.25 of a one-token step against 0.37 with 4-bit MLPs only, for
acceptance 0.95 .. 0.99 instead of 0.98 .. 1.00 on the zoo target; the 4-bit weights are made once
from the full ones; a GGUF model's draft reads its own 4-bit blocks, as verification does) and
attention that reads only the upper 4 bits, so it moves a fraction of the weight bytes and half of
the KV bytes. Verification is the target's own forward: full weights,
upper + lower bits. Both passes share the one cache: a draft pass writes its K/V to the buffer at
the pending slots and is rolled back (``truncate``: lengths only; the codes are never touched), and
verification overwrites those slots with the full-precision K/V.

Drafts are sampled from the draft pass's own distribution q, with the target's own sampling noise
and matched (``verification="coupled"``, the default), or on the draft stream and verified by
rejection sampling (``"rejection"``, ``DraftKind.SAMPLED``, q's logits come with the draft), or
greedily at temperature 0: the output
has exactly the distribution of the target's autoregressive decoding on the same cache
(``QuantKVModel``), which is the baseline it is tested against.
"""

from __future__ import annotations

from ..contract import (SAMPLED_VERIFICATION_OPTION, Draft, Outcome, PrefillContext, Proposer, StepState,
                        check_sampled_verification, sampled_draft_kind)
from ..methods import MethodSpec, register
from ..models.quant_cache import DraftLinears, QuantKVCache, quantized_forward
from ..models.quant_model import QuantKVModel
from .self_chain import self_draft_chain


class QuantSpecProposer(Proposer):
    """Chains of ``k`` tokens from the target's own 4-bit draft pass (see the module docstring)."""

    def __init__(self, target: QuantKVModel, k: int = 4, draft_attention: bool = False, group_size: int = 128,
                 draft_lm_head: bool = False, verification: str = "coupled") -> None:
        if not isinstance(target, QuantKVModel):
            raise TypeError("method 'quantspec' verifies on the hierarchical 4-bit KV cache: pass "
                            "specdec_cuda.models.QuantKVModel(model) as the target (its autoregressive decoding "
                            f"is the baseline the output equals), got {type(target).__name__}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        if k > target.residual:
            raise ValueError(f"k ({k}) must be at most the cache's residual ({target.residual}): a draft is rolled "
                             f"back, and rollbacks may not reach tokens read from the codes")
        self.target, self.k, self.max_draft = target, k, k
        self.verification = check_sampled_verification(verification)
        self.linears = DraftLinears.quantize(target.model, mlp=True, attention=draft_attention, group_size=group_size,
                                             lm_head=draft_lm_head)

    def prefill(self, ctx: PrefillContext) -> None:
        if not isinstance(ctx.cache, QuantKVCache):
            raise TypeError(f"quantspec drafts on the target's QuantKVCache, got {type(ctx.cache).__name__}")
        self.cache, self.params = ctx.cache, ctx.params
        self.kind = sampled_draft_kind(self.verification, bool((ctx.params.temperature == 0).all()))

    def propose(self, state: StepState) -> Draft | None:
        def draft_pass(tokens, positions):  # full-precision buffer, upper 4 bits of the codes, 4-bit linears
            return quantized_forward(self.target.model, tokens, positions, self.cache, use_lower=False,
                                     linears=self.linears).logits[:, 0]

        return self_draft_chain(draft_pass, self.cache, state, self.params, self.k, self.kind,
                                coupled=self.verification == "coupled")

    def matches_samples(self) -> bool:
        return self.verification == "coupled"

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Nothing to learn: the shared cache was committed by the loop."""


def make_quantspec_proposer(target, k: int = 4, draft_attention: bool = False, group_size: int = 128,
                            draft_lm_head: bool = False, verification: str = "coupled") -> QuantSpecProposer:
    """The ``method="quantspec"`` proposer; ``target`` is a ``models.QuantKVModel``."""
    return QuantSpecProposer(target, k=k, draft_attention=draft_attention, group_size=group_size,
                             draft_lm_head=draft_lm_head, verification=verification)


register(MethodSpec(
    name="quantspec",
    summary="QuantSpec (Tiwari et al. 2025): the target drafts itself with 4-bit weights and the upper 4 bits "
            "of its hierarchical 4-bit KV cache (target: models.QuantKVModel)",
    lossless=True,
    make=make_quantspec_proposer,
    options={
        "k": "draft tokens per step (default 4; at most the cache's residual)",
        "draft_attention": "draft with 4-bit attention projections too (default False: 4-bit MLPs only)",
        "group_size": "input features per 4-bit weight scale (default 128; smaller where a layer needs it)",
        "draft_lm_head": "also draft with a 4-bit LM head (default False: it costs acceptance where the "
                         "head's logits are peaked)",
        "verification": SAMPLED_VERIFICATION_OPTION,
    },
))
