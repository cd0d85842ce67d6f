"""DeepSeek-V3-style chained multi-token prediction: ``method="mtp"``.

D modules on the target (``models.heads.MTPModules``, or a checkpoint's own MTP layers:
``models.native_mtp``). Module d at position t reads the previous
depth's hidden state at t (the target's final normed hidden state for d = 1) and the embedding of
token t + d, and its output predicts token t + d + 1 through the target's final norm and LM head.

Drafting, per row, with the root (newest committed token) at position L: draft j (at position
L + j) comes from module j at position L - 1, whose token input is draft j - 1 (the root for
j = 1), so the chain is D tokens deep; with ``k > D`` the last module runs on at positions L,
L + 1, ... feeding its own previous output as the hidden state (as vLLM does). Each draft token is
sampled from the module's own distribution q with the request's temperature / top-k / top-p: by
default (``verification="coupled"``) with the target's own sampling noise at its position and
matched against the target's sample (``DraftKind.GUESS``: the autoregressive samples exactly);
with ``verification="rejection"`` on the draft stream, q's logits travelling with the draft
(``DraftKind.SAMPLED``: rejection sampling). Both lossless; when every row is greedy the argmax is
drafted and verified greedily.

State per request, kept consistent with commits and rollbacks:

* ``seq`` [B, C]: the committed tokens; positions past a row's length are scratch (this step's
  drafts).
* ``hidden[d]`` [B, C, H]: module d's output at each position (``hidden[0]``: the target's);
  ``hidden[d][:, i]`` is valid for ``i < caches[d - 1].lengths`` (``i < L`` for the target's).
* ``caches[d - 1]``: module d's own KV cache. Module d at position i is valid when its inputs
  were committed tokens: ``i + d <= L + num_accepted``. After a step, each module's cache is cut
  back to what stays valid, and the next proposal first catches every module up through L - 1
  (a few positions per step), deepest last, each reading the depth above's fresh outputs.
"""

from __future__ import annotations

import torch

from .. import ops
from ..contract import (SAMPLED_VERIFICATION_OPTION, Draft, DraftKind, Outcome, PrefillContext, Proposer,
                        StepState, check_sampled_verification, sampled_draft_kind)
from ..methods import MethodSpec, register
from ..models.heads import MTPModules, TargetHead
from ..reference.philox import Purpose
from .medusa import HEADS_DRAFT_VOCAB_OPTION, heads_target_head, resolve_heads


class MTPProposer(Proposer):
    """Chains of up to ``k`` tokens from chained MTP modules (see the module docstring)."""

    hidden_layers = (-1,)

    def __init__(self, head: TargetHead, modules: MTPModules, k: int | None = None,
                 verification: str = "coupled") -> None:
        if modules.config.hidden_size != head.norm_weight.shape[0]:
            raise ValueError(f"the MTP modules' hidden size ({modules.config.hidden_size}) differs from the "
                             f"target's ({head.norm_weight.shape[0]})")
        k = modules.num_modules if k is None else int(k)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.head, self.modules, self.k = head, modules, k
        self.verification = check_sampled_verification(verification)
        self.heads = [modules.head_for(d, head) for d in range(modules.num_modules)]  # the head of each depth
        self.max_draft = k

    def prefill(self, ctx: PrefillContext) -> None:
        prompts, prompt_lens = ctx.prompts, ctx.prompt_lens
        B, P = prompts.shape
        device = prompts.device
        hidden = ctx.hidden_states[-1]  # [B, P, H]
        # Capacity: the target's, plus the reuse positions past L that the last module drafts at.
        self.capacity = capacity = ctx.max_length + self.k + 2
        self.seq = torch.zeros(B, capacity, dtype=torch.int64, device=device)
        self.seq[:, :P] = prompts
        self.rows = torch.arange(B, device=device)
        self.seq[self.rows, prompt_lens] = ctx.first_tokens
        self.hidden = [torch.zeros(B, capacity, hidden.shape[-1], dtype=hidden.dtype, device=device)
                       for _ in range(self.modules.num_modules + 1)]
        self.hidden[0][:, :P] = hidden
        self.caches = self.modules.new_cache(B, capacity)
        self.params = ctx.params
        self.all_greedy = bool((ctx.params.temperature == 0).all())
        self.kind = sampled_draft_kind(self.verification, self.all_greedy)
        self.purpose = Purpose.SAMPLE if self.verification == "coupled" else Purpose.DRAFT

    def _gather_hidden(self, depth: int, positions: torch.Tensor) -> torch.Tensor:
        h = self.hidden[depth]
        return h.gather(1, positions[:, :, None].expand(-1, -1, h.shape[-1]))

    def _draw(self, h: torch.Tensor, position: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft token per row from q = softmax(lm_head(norm(h))) of module ``depth`` (1-based).
        Shape: h [B, H] -> tokens [B], logits [B, V] (None when every row is greedy: the fused op's
        argmax, no logits written)."""
        head = self.heads[depth - 1]
        if self.all_greedy:
            return head.topk(h, 1).indices[:, 0], None
        logits = head.topk(h, 1, return_logits=True).logits
        sampled = ops.sample(logits, **self.params.kwargs(), position=position, purpose=self.purpose)
        # A row the sampler flagged (-1) proposes token 0, judged like any draft.
        return sampled.tokens.clamp(min=0), logits

    def propose(self, state: StepState) -> Draft | None:
        L = state.lengths  # [B]: the root's position
        limit, most = state.draft_limits()  # [B]
        k_step = min(most, self.k)
        if k_step == 0:
            return None
        B, D, rows, last = L.shape[0], self.modules.num_modules, self.rows, self.capacity - 1
        tokens = torch.zeros(B, k_step, dtype=torch.int64, device=L.device)
        draft_logits = None
        depth = min(D, k_step)
        for d in range(1, depth + 1):
            # Catch module d up through position L - 1 (its token input there: draft d - 1).
            cache = self.caches[d - 1]
            behind = L - cache.lengths  # [B] >= 0
            width = int(behind.max())
            if width > 0:
                pos = (cache.lengths[:, None] + torch.arange(width, device=L.device)).clamp(max=last - d)
                h_prev = self._gather_hidden(d - 1, pos)
                if d > 1:  # another module's output, not the target's hidden state
                    h_prev = self.modules.chain_input(d - 2, h_prev, self.head)
                h = self.modules(d - 1, h_prev, self.seq.gather(1, pos + d), pos, cache, self.head)
                cache.commit(behind)
                # Pad columns land at positions >= L: scratch, never read as valid.
                self.hidden[d].scatter_(1, pos[:, :, None].expand(-1, -1, h.shape[-1]), h)
            token, logits = self._draw(self.hidden[d][rows, L - 1], L + d, d)
            draft_logits = self._keep(draft_logits, logits, d - 1, k_step)
            tokens[:, d - 1] = token
            self.seq[rows, (L + d).clamp(max=last)] = token
        ones = torch.ones_like(L)
        for j in range(D + 1, k_step + 1):
            # The last module again, one position on, its own previous output as the hidden input.
            p = (L - 1 + (j - D)).clamp(max=last - D)
            h_prev = self.modules.chain_input(D - 1, self.hidden[D][rows, p - 1][:, None], self.head)
            h = self.modules(D - 1, h_prev, self.seq[rows, p + D][:, None], p[:, None], self.caches[D - 1],
                             self.head)[:, 0]
            self.caches[D - 1].commit(ones)
            self.hidden[D][rows, p] = h
            token, logits = self._draw(h, L + j, D)
            draft_logits = self._keep(draft_logits, logits, j - 1, k_step)
            tokens[:, j - 1] = token
            self.seq[rows, (L + j).clamp(max=last)] = token
        # Coupled drafts are matched: their q is not needed.
        return Draft(tokens, limit.clamp(max=k_step), self.kind,
                     logits=draft_logits if self.kind is DraftKind.SAMPLED else None)

    def matches_samples(self) -> bool:
        return self.verification == "coupled"

    @staticmethod
    def _keep(buffer, logits, j: int, k_step: int):
        if logits is None:
            return None
        if buffer is None:
            buffer = logits.new_empty(logits.shape[0], k_step, logits.shape[1])
        buffer[:, j] = logits
        return buffer

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        L, a, active = outcome.lengths, outcome.num_accepted, outcome.active
        m, last = outcome.tokens.shape[1], self.capacity - 1
        steps = torch.arange(m, device=L.device)
        # Committed: tokens L + 1 .. L + a + 1 and the target's hidden states at L .. L + a. Entries
        # past them (padding, finished rows) land on scratch positions >= the new length.
        cols = (L[:, None] + 1 + steps).clamp(max=last)
        self.seq.scatter_(1, cols, outcome.tokens.clamp(min=0))
        hidden = outcome.hidden_states[-1]  # [B, m, H]
        self.hidden[0].scatter_(1, (cols - 1)[:, :, None].expand(-1, -1, hidden.shape[-1]), hidden)
        if draft is None:  # no proposal: the modules did not move past the committed text
            return
        a = torch.where(active, a, 0)
        for d, cache in enumerate(self.caches, start=1):
            # Module d at position i stays valid iff i + d <= L + a (all its inputs committed) and
            # i < L (positions >= L were only the reuse phase's, fed the module's own output).
            keep = torch.minimum(torch.minimum(cache.lengths, (L + a - d + 1).clamp(min=0)), L)
            cache.truncate(keep)


def make_mtp_proposer(target, heads=None, k: int | None = None, w4_lm_head: bool = False,
                      verification: str = "coupled", draft_vocab=None) -> MTPProposer:
    """The ``method="mtp"`` proposer for ``target`` (built-in model or ``HFCausalLM``)."""
    head = heads_target_head(target, w4_lm_head, draft_vocab)
    if heads is None:  # modules trained for this target (the drafter cache)
        from ..drafters import find

        heads = find(target, "mtp")
    if heads is None:  # the checkpoint's own MTP layers, or FileNotFoundError saying what it has
        from ..models.native_mtp import native_modules

        modules = native_modules(target)  # in the target's dtype and device
    else:
        modules = resolve_heads(target, heads, "mtp")
    return MTPProposer(head, modules, k=k, verification=verification)


register(MethodSpec(
    name="mtp",
    summary="DeepSeek-V3-style chained MTP modules on the target: a chain sampled from the modules' own q",
    lossless=True,
    make=make_mtp_proposer,
    options={
        "heads": "MTPModules or a heads folder, trained for this target (default: the MTP layers the target's "
                 "checkpoint carries: MiMo layout on the built-in model; DeepSeek-V3 / R1, GLM-4.5, Qwen3-Next "
                 "on the transformers adapter; models/native_mtp.py)",
        "k": "draft tokens per step (default: the number of modules; more reuses the last module)",
        "w4_lm_head": "draft through a 4-bit copy of the LM head (CPU; default False; verification unchanged)",
        "verification": SAMPLED_VERIFICATION_OPTION,
        "draft_vocab": HEADS_DRAFT_VOCAB_OPTION,
    },
))
