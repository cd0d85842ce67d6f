"""Draft-model speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

A small LM of the target's tokenizer drafts a chain of k tokens autoregressively; the target
verifies the chain in one forward. The drafter keeps its own KV cache, always a prefix of the
committed sequence: tokens the target accepted but the drafter has not seen yet (the bonus or
correction token, and the last draft when all were accepted) are fed at the start of the next
proposal, ragged per row.

Verification modes (``verification=``):

* ``"rejection"``: drafts are sampled from q with the target's temperature / top-k / top-p and
  q's logits go to ``verify_chain``, which accepts with probability min(1, p/q). Rows at
  temperature 0 are verified greedily whatever the mode.
* ``"match"``: the drafter proposes its argmax and no draft logits are passed: sample-and-match,
  lossless, and the emitted tokens are exactly the autoregressive samples of the same seed.
* ``"coupled"`` (default): each draft token is drawn from q with the very noise the target's sample at that
  position uses (the Gumbel race on the ``SAMPLE`` stream of the token's position), and verified by
  sample-and-match: where q is close to p the two races pick the same token, so most drafts match,
  and the emitted tokens are exactly the autoregressive samples of the same seed, whatever the draft
  length, the batch or the speculation policy's choices (``"rejection"`` gives a sample of the
  same distribution that depends on them). Lossless.
* ``"typical"``: rejection-free typical acceptance (Medusa), lossy, opt-in.

Draft vocabulary (``draft_vocab=``, FR-Spec): the drafter's LM head runs over a subset of the
vocabulary only (an int ``n``: ids ``0 .. n - 1``; or token ids, e.g. from
``models.draft_vocab.frequent_token_ids``); every other token gets probability 0 in the draft, so
it is never drafted but still emitted when the target chooses it: lossless in every mode (q is
the distribution the drafts were drawn from, zeros included). Pays when the head is a large part
of the drafter's step (small drafters of large-vocabulary targets). Built-in drafters only.

Draft context (``draft_context=n``): the drafter reads only the last ``n`` tokens of each prompt
(then everything generated), from position 0: its catch-up on a long prompt, a prefill of the
whole prompt through the drafter, is bounded by ``n`` tokens. What it proposes is verified as
always (lossless); it may propose worse for lack of the prompt's start.

Adaptive k (``adaptive=True``): per row, k grows by 2 after a step whose drafts were all
accepted and shrinks by 1 otherwise, within ``[k_min, k_max]``. ``confidence_threshold``: a row
stops drafting at the first position (after the first) where the drafter's own max probability
falls below it.
"""

from __future__ import annotations

import time

import torch

from .. import ops
from ..contract import Draft, DraftKind, Outcome, PrefillContext, Proposer, SamplingParams, StepState
from ..methods import MethodSpec, register
from ..models.protocol import prefill_kwargs
from ..reference.philox import Purpose

VERIFICATION_MODES = ("rejection", "match", "coupled", "typical")


class DraftModelProposer(Proposer):
    """Chains of up to ``k_max`` tokens from a drafter LM (see the module docstring)."""

    def __init__(self, draft, k: int = 4, adaptive: bool = False, k_min: int = 1, k_max: int | None = None,
                 confidence_threshold: float | None = None, verification: str = "coupled",
                 draft_vocab=None, draft_context: int | None = None) -> None:
        if verification not in VERIFICATION_MODES:
            raise ValueError(f"verification must be one of {VERIFICATION_MODES}, got {verification!r}")
        k_max = k_max if k_max is not None else (2 * k if adaptive else k)
        if not 1 <= k_min <= k <= k_max:
            raise ValueError(f"need 1 <= k_min ({k_min}) <= k ({k}) <= k_max ({k_max})")
        if confidence_threshold is not None and not 0.0 <= confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must lie in [0, 1], got {confidence_threshold}")
        self.draft, self.k, self.adaptive = draft, k, adaptive
        self.k_min, self.k_max, self.confidence_threshold = k_min, k_max, confidence_threshold
        if draft_context is not None and (isinstance(draft_context, bool) or not isinstance(draft_context, int)
                                          or draft_context < 1):
            raise ValueError(f"draft_context must be an int >= 1 (prompt tokens the drafter reads), got {draft_context!r}")
        self.verification = verification
        self.max_draft = k_max
        self.draft_context = draft_context
        self.vocab = None
        if draft_vocab is not None:
            if not hasattr(draft, "vocab_subset"):
                raise TypeError(f"draft_vocab needs a built-in drafter (specdec_cuda.models.load), whose LM head can "
                                f"run over part of the vocabulary; this drafter is a {type(draft).__name__}")
            self.vocab = draft.vocab_subset(draft_vocab)

    def _forward(self, tokens, positions, logits_at=None, catch_up: bool = False) -> torch.Tensor:
        """The drafter's logits [B, V] at the last (or ``logits_at``) fed token; with a draft
        vocabulary its head runs over the subset and the rest of the row is ``MASKED``. A
        ``catch_up`` (the prompt, or text decoded without drafting) may run the drafter's prefill
        kernels: its bits only steer the drafts, which the target judges either way."""
        extra = prefill_kwargs(self.draft) if catch_up else {}
        if self.vocab is None:
            return self.draft.forward(tokens, positions, self.cache, logits_at=logits_at, **extra).logits[:, -1]
        sub = self.draft.forward(tokens, positions, self.cache, logits_at=logits_at, vocab=self.vocab,
                                 **extra).logits[:, -1]
        return self.vocab.expand(sub)

    def prefill(self, ctx: PrefillContext) -> None:
        prompts, prompt_lens, first_tokens, params = ctx.prompts, ctx.prompt_lens, ctx.first_tokens, ctx.params
        max_length = ctx.max_length
        batch, width = prompts.shape
        device = self.draft.device
        # Sample-and-match drafts the drafter's argmax: one-hot proposals match most often.
        self.draft_params = SamplingParams(torch.zeros_like(params.temperature), params.top_k, params.top_p,
                                           params.seed) if self.verification == "match" else params
        # Coupled drafts race on the target's own sampling stream (see the module docstring).
        self.draft_purpose = Purpose.SAMPLE if self.verification == "coupled" else Purpose.DRAFT
        # The drafter's cache starts empty: the first proposal's catch-up feeds the prompt too. A
        # run whose policy never drafts (large batches, where a drafted step costs more than it
        # gains) then never pays for the drafter at all.
        self.cache = self.draft.new_cache(batch, max_length)
        # seq: the committed sequence per row (prompt, then generated); the drafter's cache holds
        # a prefix of it and catches up at the next proposal.
        self.seq = torch.zeros(batch, max_length, dtype=torch.int64, device=device)
        self.seq[:, :width] = prompts
        self.seq[torch.arange(batch, device=device), prompt_lens] = first_tokens
        # offset[b]: the index in seq of the drafter's cache slot 0 (its position 0); 0 unless the
        # prompt is longer than draft_context.
        self.offset = (torch.zeros(batch, dtype=torch.int64, device=device) if self.draft_context is None else
                       (prompt_lens.to(device=device, dtype=torch.int64) - self.draft_context).clamp(min=0))
        self.k_row = torch.full((batch,), self.k, dtype=torch.int64, device=device)
        self.all_greedy = bool((params.temperature == 0).all())
        # q is only needed by rejection sampling: not in match mode, not when every row is greedy.
        self.keep_logits = verification_needs_q = self.verification not in ("match", "coupled") and not self.all_greedy
        self.kind = (DraftKind.TYPICAL if self.verification == "typical" else
                     DraftKind.SAMPLED if verification_needs_q else DraftKind.GUESS)

    def matches_samples(self) -> bool:
        return self.verification in ("match", "coupled")

    def propose(self, state: StepState) -> Draft | None:
        lengths, active = state.lengths, state.active
        batch, device = lengths.shape[0], lengths.device
        limit = torch.where(active, torch.minimum(self.k_row, state.max_draft), 0)  # [B]
        k_step = int(limit.max())
        if k_step == 0:
            return None

        # Catch up: feed committed tokens the drafter has not seen, through `last` at lengths[b]
        # (seq index offset + slot; the drafter's positions are its slots).
        behind = torch.where(active, lengths + 1 - self.offset - self.cache.lengths, 0)  # [B], >= 1 on active rows
        width = int(behind.max())
        slots = (self.cache.lengths[:, None] + torch.arange(width, device=device)).clamp(max=self.seq.shape[1] - 1)
        idx = (self.offset[:, None] + slots).clamp(max=self.seq.shape[1] - 1)
        last = (behind - 1).clamp(min=0)
        started = time.perf_counter()
        cur = self._forward(self.seq.gather(1, idx), slots, logits_at=last, catch_up=width > 2)
        self.cache.commit(behind)  # cur [B, V]: the drafter's view of position lengths + 1
        # A steady step feeds 1 or 2 tokens (the last draft, the bonus); more is a catch-up (the
        # prompt, or tokens decoded without drafting), a cost the policy should not expect again.
        one_time = time.perf_counter() - started if width > 2 else 0.0

        tokens = torch.zeros(batch, k_step, dtype=torch.int64, device=device)
        keep_logits = self.keep_logits
        draft_logits = torch.empty(batch, k_step, cur.shape[-1], dtype=cur.dtype, device=device) if keep_logits else None
        positions = lengths[:, None] + 1 + torch.arange(k_step, device=device)  # [B, k_step], absolute
        slots = positions - self.offset[:, None]  # the drafter's own positions
        # Uniform steps (every row drafts k_step, no confidence stop) skip the per-row masks.
        uniform = self.confidence_threshold is None and bool((limit == k_step).all())
        drafting = limit > 0
        num_draft = limit if uniform else torch.zeros(batch, dtype=torch.int64, device=device)
        ones = limit.new_ones(batch)
        for j in range(k_step):
            if not uniform:
                drafting = drafting & (j < limit)
            if self.confidence_threshold is not None and j > 0:
                confident = torch.softmax(cur.float(), dim=-1).amax(-1) >= self.confidence_threshold
                drafting = drafting & confident
                if not bool(drafting.any()):
                    break
            sampled = ops.sample(cur, **self.draft_params.kwargs(), position=positions[:, j], purpose=self.draft_purpose)
            # A row the sampler flagged (-1: bad drafter logits) proposes token 0, judged like any draft.
            torch.clamp(sampled.tokens, min=0, out=tokens[:, j])
            if keep_logits:
                draft_logits[:, j] = cur
            if not uniform:
                num_draft += drafting.to(torch.int64)
            if j + 1 < k_step:
                cur = self._forward(tokens[:, j : j + 1], slots[:, j : j + 1])
                self.cache.commit(ones if uniform else drafting.to(torch.int64))
        return Draft(tokens, num_draft, self.kind, logits=draft_logits, context=num_draft, one_time_seconds=one_time)

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Extend ``seq`` with the accepted drafts and the next token; roll the drafter back."""
        lengths, num_accepted, next_tokens = outcome.lengths, outcome.num_accepted, outcome.next_tokens
        active = outcome.active
        k_step = 0 if draft is None else draft.width
        last_col = self.seq.shape[1] - 1
        # Positions past a row's committed length are scratch (nothing reads them before they are
        # rewritten), so all drafts go in and the next token then overwrites the first rejected
        # one; finished rows only get scratch writes.
        if k_step:
            cols = (lengths[:, None] + 1 + torch.arange(k_step, device=lengths.device)).clamp(max=last_col)
            self.seq.scatter_(1, cols, draft.tokens)
        pos = (lengths + 1 + num_accepted).clamp(max=last_col)
        self.seq.scatter_(1, pos[:, None], next_tokens[:, None])
        # The drafter's cache is valid through the last accepted draft (index lengths + num_accepted);
        # it never runs ahead of a finished row (num_accepted 0 there).
        if draft is not None:  # without a proposal the drafter's cache did not move past the text
            self.cache.truncate(torch.minimum(self.cache.lengths, lengths + 1 + num_accepted - self.offset))
        if self.adaptive and draft is not None:
            num_draft = draft.context  # [B] drafts per row of this proposal
            full = (num_accepted == num_draft) & (num_draft > 0)
            grown = torch.where(full, self.k_row + 2, self.k_row - 1).clamp(self.k_min, self.k_max)
            self.k_row = torch.where(active, grown, self.k_row)


def make_draft_model_proposer(target, draft=None, k: int = 4, adaptive_k: bool = False, k_min: int = 1,
                              k_max: int | None = None, confidence_threshold: float | None = None,
                              verification: str = "coupled", draft_vocab=None,
                              draft_context: int | None = None) -> DraftModelProposer:
    """The ``method="draft"`` proposer for ``target``; ``draft`` is a model, a transformers model or a
    checkpoint folder of the same tokenizer (loaded in the target's dtype, on its device)."""
    from ..api import as_causal_lm

    drafter = as_causal_lm(draft, dtype=target.dtype, device=target.device)
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(f"the draft's vocabulary ({drafter.vocab_size}) differs from the target's "
                         f"({target.vocab_size}); they must share a tokenizer")
    return DraftModelProposer(drafter, k=k, adaptive=adaptive_k, k_min=k_min, k_max=k_max,
                              confidence_threshold=confidence_threshold, verification=verification,
                              draft_vocab=draft_vocab, draft_context=draft_context)


register(MethodSpec(
    name="draft",
    summary="draft-model speculative decoding (Leviathan et al. / Chen et al.): a small LM drafts a chain",
    lossless=True,
    make=make_draft_model_proposer,
    required=("draft",),
    options={
        "draft": "the drafter: a model, transformers model or checkpoint folder (same tokenizer)",
        "k": "draft tokens per step (the starting k with adaptive_k; default 4)",
        "adaptive_k": "per row, +2 after a fully accepted step, -1 otherwise, in [k_min, k_max] (default False)",
        "k_min": "adaptive k's lower end (default 1)",
        "k_max": "adaptive k's upper end (default 2k with adaptive_k, else k)",
        "confidence_threshold": "stop a row's draft where the drafter's max probability drops below it",
        "verification": '"coupled" (default: drafts drawn with the target\'s own sampling noise, '
                        'sample-and-match: the autoregressive samples exactly; lossless), "rejection" (drafts '
                        'from q, rejection sampling; lossless, samples depend on the draft lengths), "match" '
                        '(greedy drafts, sample-and-match, lossless) or "typical" (LOSSY typical acceptance)',
        "draft_vocab": "the drafter's LM head over part of the vocabulary (FR-Spec): an int n (ids 0 .. n-1) "
                       "or token ids; lossless, built-in drafters only (default: the whole vocabulary)",
        "draft_context": "the drafter reads only the last n tokens of each prompt (bounds its catch-up on long "
                         "prompts; default: all of it)",
    },
))
