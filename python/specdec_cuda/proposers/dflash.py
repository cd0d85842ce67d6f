"""DFlash (Chen et al. 2026): a block-diffusion drafter drafts a whole chain in one forward.

The drafter (``models.dflash.DFlashDrafter``) is conditioned on the target's hidden states at a
few evenly spaced layers (``hidden_layers``), which the loop hands over in prefill (the prompt)
and with every step's outcome (the accepted path, root first). Its cache of context K/V thus
always covers exactly the committed tokens before the root: after a step, row ``b`` gains the
``num_accepted + 1`` tokens at positions ``lengths .. lengths + num_accepted``; the new root's
own features arrive one step later, when the target has run it. Block entries never enter the
cache, so a rejected draft needs no rollback. The prompt's features, and those of steps the
speculation policy decodes plainly, are only kept; the next proposal extends the cache with them
(the steps' in one call): a run that never drafts never runs the drafter, and a catch-up of n
tokens is one batched forward, not n.

A step: one drafter forward of ``[root, MASK x (blk - 1)]`` at positions ``lengths + i`` gives
``q_1 .. q_{blk-1}``, the drafter's distributions of the next ``blk - 1`` tokens.

* ``draft_sampling="sampled"``: at T > 0 each position's token is drawn from its own
  q_i (the target's temperature / top-k / top-p applied) and sent as a ``SAMPLED`` chain with the
  q_i logits: rejection sampling against those q_i is lossless because each draft is drawn from
  the q that appears in the ratio. Greedy rows draft the argmax and verify greedily.
* ``draft_sampling="greedy"``: every row drafts the argmaxes, a ``GUESS`` chain: greedy
  verification at T = 0, sample-and-match at T > 0 (lossless too; the reference implementation's
  choice), for comparing the two at T > 0.
* ``draft_sampling="coupled"`` (default): each position's token is drawn from q_i with the very noise the
  target's sample at that position uses (the Gumbel race on the ``SAMPLE`` stream), a ``GUESS``
  chain verified by sample-and-match: the emitted tokens are exactly the autoregressive samples of
  the seed, whatever the draft length or the speculation policy's choices.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .. import ops
from ..contract import Draft, DraftKind, Outcome, PrefillContext, Proposer, StepState
from ..methods import MethodSpec, register
from ..models.draft_vocab import VocabSubset, target_vocab_subset
from ..reference.philox import Purpose

DRAFT_SAMPLING = ("sampled", "greedy", "coupled")
DRAFT_VOCAB_OPTION = ("the drafter's LM head over part of the vocabulary (FR-Spec): an int n (ids 0 .. n-1) or token "
                      'ids; "all" for the whole vocabulary; default: the drafter\'s own (DFlashConfig.draft_vocab, '
                      "the most frequent ids of its training text), else the whole vocabulary")


class DFlashBase(Proposer):
    """The drafter's cache, kept in step with the committed text (shared by DFlash and DDTree)."""

    def __init__(self, drafter, block_size: int | None = None, trim_block: bool = True,
                 vocab: VocabSubset | None = None) -> None:
        block_size = int(block_size or drafter.config.block_size)
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (the anchor and at least one mask), got {block_size}")
        self.drafter, self.block_size, self.trim_block = drafter, block_size, bool(trim_block)
        # The draft vocabulary (FR-Spec): the head runs over these target rows only; block logits
        # are then in the subset's id order (``draft_ids`` maps them back).
        self.vocab = vocab
        self.run = None  # the drafter's weights as its forwards read them (per generate call)
        self.hidden_layers = tuple(drafter.config.target_layers)
        self.max_draft = block_size - 1

    # Plain steps whose features wait for the next proposal, at most: past it they are fed anyway,
    # so that the waiting features stay small ([B, n, H] per target layer read).
    MAX_PENDING = 128

    def prefill(self, ctx: PrefillContext) -> None:
        batch = ctx.prompts.shape[0]
        # Slack: extend writes a whole accepted path (<= block_size tokens) or a catch-up of up to
        # MAX_PENDING plain steps at once, scratch entries included.
        self.cache = self.drafter.new_cache(batch, ctx.max_length + max(self.block_size, self.MAX_PENDING))
        self.run = self.drafter.inference()
        self.all_greedy = bool((ctx.params.temperature == 0).all())
        # Features not yet in the cache, fed at the next proposal: the prompt's (positions 0 ..
        # prompt_len - 1, the first root comes next; layer -> [B, P, H] and the prompt lengths [B]),
        # then each plain step's (layer -> [B, 1, H] and per-row counts [B]: 1 on rows that ran, 0
        # on finished ones).
        self.pending_prompt = (dict(ctx.hidden_states), ctx.prompt_lens)
        self.pending: list[tuple[dict[int, torch.Tensor], torch.Tensor]] = []

    def catch_up(self) -> float:
        """Extend the cache with the waiting features (the prompt's, then the plain steps' in one
        call); returns the seconds it took (a cost of the run and of the policy's idle steps, not of
        this step's draft length).

        A row runs every step until it finishes and never again, so its waiting tokens after the
        prompt are a prefix of the concatenated steps; the prompt (padded to the longest) goes first
        in its own call, then the steps in one: ``extend`` writes the first ``count[b]`` of each."""
        if self.pending_prompt is None and not self.pending:
            return 0.0
        started = time.perf_counter()
        if self.pending_prompt is not None:  # ragged: its own call
            self.drafter.extend(self.cache, *self.pending_prompt, self.run)
            self.pending_prompt = None
        if self.pending:
            layers = self.pending[0][0].keys()
            hidden = {i: torch.cat([h[i] for h, _ in self.pending], dim=1) for i in layers}  # [B, n, H]
            counts = torch.stack([c for _, c in self.pending]).sum(0)  # [B]
            self.pending.clear()
            self.drafter.extend(self.cache, hidden, counts, self.run)
        return time.perf_counter() - started

    def block_logits(self, state: StepState, depth: int) -> torch.Tensor:
        """The drafter's logits of the ``depth`` tokens after each root. Shape: [B, depth, V], or
        [B, depth, len(vocab)] over a draft vocabulary (``draft_ids`` maps indices to token ids).

        ``trim_block``: when the step drafts fewer than ``block_size - 1`` tokens (the speculation
        policy granted fewer), the block is the root and ``depth`` masks only: the drafter's cost
        grows with the block's rows, and the masks past the depth would only be attended to. The
        kept positions then see a shorter block than in training, so their distributions differ a
        little from the full block's (acceptance measured in docs/benchmarks.md); lossless either way."""
        return self.drafter.draft(self.cache, state.last_tokens, self.block_len(depth), depth, self.vocab, self.run)

    def block_tokens(self, state: StepState, depth: int) -> torch.Tensor:
        """``block_logits``' most likely tokens, as token ids: [B, depth] (a greedy chain)."""
        return self.drafter.draft_tokens(self.cache, state.last_tokens, self.block_len(depth), depth, self.vocab,
                                         self.run)

    def block_topk(self, state: StepState, depth: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``block_logits``' top-``k`` log-probabilities and their token ids per position (T = 1):
        [B, depth, k] float32 and int64, ranked in the head op where it can (a greedy DDTree)."""
        return self.drafter.draft_topk(self.cache, state.last_tokens, k, self.block_len(depth), depth, self.vocab,
                                       self.run)

    def block_len(self, depth: int) -> int:
        """The rows of the block that drafts ``depth`` tokens (``trim_block``)."""
        return depth + 1 if self.trim_block else self.block_size

    def draft_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of indices into ``block_logits``' last dimension (the same without a draft vocabulary)."""
        return index if self.vocab is None else self.vocab.ids.to(index.device)[index]

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``block_logits`` over the whole vocabulary: ``MASKED`` outside a draft vocabulary."""
        return logits if self.vocab is None else self.vocab.expand(logits)

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Add the committed path's context features: the root and the accepted drafts; after a
        plain step (no draft: one token per row), keep them for the next proposal's catch-up."""
        num_new = torch.where(outcome.active, outcome.num_accepted + 1, 0)  # [B]
        if draft is None:
            self.pending.append((dict(outcome.hidden_states), num_new))
            if len(self.pending) >= self.MAX_PENDING:
                self.catch_up()
            return
        self.drafter.extend(self.cache, outcome.hidden_states, num_new, self.run)


class DFlashProposer(DFlashBase):
    """Chains of up to ``block_size - 1`` tokens from one drafter forward (module docstring)."""

    def __init__(self, drafter, block_size: int | None = None, draft_sampling: str = "coupled",
                 trim_block: bool = True, vocab: VocabSubset | None = None) -> None:
        if draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"draft_sampling must be one of {DRAFT_SAMPLING}, got {draft_sampling!r}")
        super().__init__(drafter, block_size, trim_block, vocab)
        self.draft_sampling = draft_sampling

    def propose(self, state: StepState) -> Draft | None:
        limit, k = state.draft_limits(self.max_draft)  # [B]
        if k == 0:
            return None
        one_time = self.catch_up()
        if self.draft_sampling == "greedy" or self.all_greedy:
            return Draft(self.block_tokens(state, k), limit, DraftKind.GUESS, one_time_seconds=one_time)
        logits = self.full_logits(self.block_logits(state, k))  # [B, k, V]
        B, V = logits.shape[0], logits.shape[-1]
        # Every position drawn from its own q_i in one call: keyed by its absolute position (on the
        # target's own stream when coupled).
        coupled = self.draft_sampling == "coupled"
        p = state.params
        positions = state.lengths[:, None] + 1 + torch.arange(k, device=logits.device)  # [B, k]
        drawn = ops.sample(logits.reshape(B * k, V), temperature=p.temperature.repeat_interleave(k),
                           top_k=p.top_k.repeat_interleave(k), top_p=p.top_p.repeat_interleave(k),
                           seed=p.seed.repeat_interleave(k), position=positions.reshape(-1),
                           purpose=Purpose.SAMPLE if coupled else Purpose.DRAFT)
        # A flagged row (-1: bad drafter logits) proposes token 0, judged like any draft.
        tokens = drawn.tokens.clamp(min=0).view(B, k)
        if coupled:
            return Draft(tokens, limit, DraftKind.GUESS, one_time_seconds=one_time)
        return Draft(tokens, limit, DraftKind.SAMPLED, logits=logits, one_time_seconds=one_time)

    def matches_samples(self) -> bool:
        return self.draft_sampling in ("greedy", "coupled")


def load_drafter(target, drafter=None):
    """A ``DFlashDrafter`` bound to ``target``: a drafter or its checkpoint folder. None: the one
    the drafter cache holds for this target (``drafters``), else FileNotFoundError naming the
    train command; the library never guesses a drafter trained for another model."""
    from ..drafters import cached_drafter
    from ..models.dflash import DFlashDrafter

    if drafter is None:
        drafter = cached_drafter(target, "dflash")
    if isinstance(drafter, (str, Path)):
        from ..models.published import load_dflash

        drafter = load_dflash(drafter)
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter: expected a DFlashDrafter, a checkpoint folder or None, got "
                        f"{type(drafter).__name__}")
    return drafter.attach(target)


def draft_vocab_of(target, drafter, draft_vocab=None) -> VocabSubset | None:
    """The draft vocabulary a DFlash / DDTree proposer runs the drafter's head over: ``draft_vocab``
    (an int n: ids 0 .. n - 1, or token ids; "all": the whole vocabulary) or, when None, the one the
    drafter was trained with (``DFlashConfig.draft_vocab``; none: the whole vocabulary). The target's
    head rows in the form its own forward multiplies them (``vocab_subset``), or dense rows of a
    target without that extension (a transformers model)."""
    if isinstance(draft_vocab, str):
        if draft_vocab != "all":
            raise ValueError(f'draft_vocab: an int, token ids, "all" or None, got {draft_vocab!r}')
        return None
    spec = drafter.config.draft_vocab if draft_vocab is None else draft_vocab
    return None if spec is None else target_vocab_subset(target, spec, drafter._head)


def make_dflash_proposer(target, drafter=None, block_size: int | None = None,
                         draft_sampling: str = "coupled", trim_block: bool = True, draft_vocab=None) -> DFlashProposer:
    """The ``method="dflash"`` proposer for ``target``."""
    drafter = load_drafter(target, drafter)
    return DFlashProposer(drafter, block_size=block_size, draft_sampling=draft_sampling, trim_block=trim_block,
                          vocab=draft_vocab_of(target, drafter, draft_vocab))


register(MethodSpec(
    name="dflash",
    summary="DFlash (Chen et al. 2026): a block-diffusion drafter on the target's hidden states drafts a chain",
    lossless=True,
    make=make_dflash_proposer,
    options={
        "drafter": "a DFlashDrafter or its checkpoint folder, trained for this target",
        "block_size": "block length: the anchor and block_size - 1 drafted tokens (default: the drafter's)",
        "trim_block": "True (default): a step granted fewer drafts runs only the root and that many masks "
                      "through the drafter; False: always the whole block",
        "draft_vocab": DRAFT_VOCAB_OPTION,
        "draft_sampling": '"coupled" (default: T > 0 drafts drawn with the target\'s own sampling noise, '
                          'sample-and-match: the autoregressive samples exactly), "sampled" (drafts drawn from '
                          'q_i, rejection sampling) or "greedy" (argmax drafts, sample-and-match)',
    },
))
