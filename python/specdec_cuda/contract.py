"""The loop-proposer contract: what the speculative loop asks of a proposer (the one place methods
differ), and what it gives.

A step, per row ``b``: the *root* is the newest committed token ``last[b]`` at absolute position
``lengths[b]`` (not in the target cache yet). A proposer drafts a tree of tokens hanging off the
root; a chain is the tree whose node ``j`` hangs off node ``j - 1``. The loop feeds
``[root, draft nodes..., extra rows...]`` to the target in one forward, verifies the draft with
the rule its ``kind`` calls for, commits the accepted path and hands the proposer its own draft
back with the outcome.

Node numbering: node 0 is the root, node ``j + 1`` is draft node ``j`` (``Draft.tokens[:, j]``).
Trees are in BFS order (a parent comes before its children), as the tree kernels require.

A proposer keeps per-request state made in ``prefill`` (a drafter's KV cache, an n-gram index)
but no per-step state between ``propose`` and ``accept``: what ``accept`` needs of its proposal
travels in ``Draft.context``.

This module is a leaf: it imports torch and the standard library only, so that the loop
(``decoding``), the proposers and users' own proposers can all import it without importing
each other. ``decoding`` and ``proposers.base`` re-export its names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # annotations only (models.protocol imports torch alone)
    from .models.protocol import CausalLM, KVCache


@dataclass
class SamplingParams:
    """Per-row sampling parameters. Shape: each [B] (temperature/top_p float32, top_k int32, seed int64:
    the dtypes the sampling kernels take, so no call converts them)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def make(cls, batch: int, temperature=0.0, top_k=0, top_p=1.0, seed=0, device="cpu") -> "SamplingParams":
        """Scalars apply to every row; sequences give one value per row (per-request seeds)."""

        def per_row(name, value, dtype):
            t = torch.as_tensor(value, dtype=dtype).reshape(-1)
            if t.numel() == 1:
                t = t.expand(batch)
            if t.numel() != batch:
                raise ValueError(f"{name} has {t.numel()} values for a batch of {batch} prompts")
            return t.to(device).contiguous()

        return cls(per_row("temperature", temperature, torch.float32), per_row("top_k", top_k, torch.int32),
                   per_row("top_p", top_p, torch.float32), per_row("seed", seed, torch.int64))

    def kwargs(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed)


class DraftKind(str, enum.Enum):
    """How the draft tokens were drawn; it decides the (only) verification that is lossless for them.

    * ``SAMPLED``: each token drawn from the drafter's q, whose logits come with the draft:
      rejection sampling for chains, SpecInfer multi-step speculative sampling for trees (siblings
      drawn independently from their parent's q).
    * ``GUESS``: deterministic guesses (top-k candidates, n-grams, argmax drafts): greedy
      verification at T = 0, sample-and-match at T > 0.
    * ``TYPICAL``: Medusa's typical acceptance; LOSSY, opt-in, chains only.
    """

    SAMPLED = "sampled"
    GUESS = "guess"
    TYPICAL = "typical"


@dataclass
class Draft:
    """One step's proposal for every row, ragged.

    Shape:
        tokens: [B, n] int64, draft node ``j`` of row ``b`` (the root not included); row ``b``'s
            nodes are ``tokens[b, :num_nodes[b]]``, the tail padded with any valid id.
        num_nodes: [B] int64, draft nodes per row (0: the row decodes one token this step).
        parents: [B, n] int64 or None. ``parents[b, j]`` is the node index of draft node ``j``'s
            parent (0 = the root, ``i + 1`` = draft node ``i``), ``parents[b, j] <= j``; None means
            a chain. Padding entries are not read.
        logits: [B, n, V] or None. For ``SAMPLED`` drafts: ``logits[b, j]`` are the drafter
            logits node ``j`` was drawn from (siblings share them); temperature / top-k / top-p
            are applied by the verifier exactly as for the target. ``TYPICAL`` drafts may leave it
            None; ``GUESS`` drafts must.
    """

    tokens: torch.Tensor
    num_nodes: torch.Tensor
    kind: DraftKind
    parents: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    context: Any = None  # the proposer's own bookkeeping, handed back to its accept()
    # Seconds of this proposal spent on work later steps do not repeat (a draft model catching up
    # with the prompt, or with tokens decoded while the policy did not draft): a speculation policy
    # leaves them out of the step's cost, which would otherwise make drafting look dear for good.
    one_time_seconds: float = 0.0

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


@dataclass
class ExtraRows:
    """Tokens that ride in the verification forward and are never committed (a Jacobi window).

    Shape: tokens [B, e] int64; positions [B, e] int64 (absolute, for RoPE); mask [B, e, e] bool,
    ``mask[b, i, j]``: extra row ``i`` sees extra row ``j``. Every extra row also sees the
    committed prefix and the root, and no draft node; no draft node sees an extra row.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor


@dataclass
class StepState:
    """What ``propose`` sees. Shape: every tensor [B].

    ``max_draft[b]``: the most draft tokens row ``b`` can use this step: its remaining token
    budget less the bonus token, capped by the speculation policy; 0 for finished rows and rows
    the policy decodes plainly. A chain holds at most that many nodes; a tree is at most that deep.
    """

    last_tokens: torch.Tensor
    lengths: torch.Tensor
    active: torch.Tensor
    max_draft: torch.Tensor
    params: SamplingParams
    # Host copy of max_draft with 0 on inactive rows, when the loop has one (``draft_limits``).
    max_draft_host: list[int] | None = None

    def draft_limits(self, cap: int | None = None) -> tuple[torch.Tensor, int]:
        """The draft tokens each row may use, capped at ``cap`` (a proposer's longest draft), 0 on
        inactive rows: [B] int64 on ``max_draft``'s device, and the largest as an int. From the
        host copy when there is one: one small tensor made instead of ~4 ops and a device read
        (~50 us of a zoo step on an AVX2 EPYC)."""
        if self.max_draft_host is None:
            limit = torch.where(self.active, self.max_draft if cap is None else self.max_draft.clamp(max=cap), 0)
            return limit, int(limit.max()) if limit.numel() else 0
        host = self.max_draft_host if cap is None else [min(n, cap) for n in self.max_draft_host]
        return torch.tensor(host, dtype=torch.int64, device=self.max_draft.device), max(host, default=0)


@dataclass
class Outcome:
    """What one step decided, handed to ``accept`` with the proposer's own draft.

    Shape:
        num_accepted: [B] int64, accepted draft nodes (0 on rows that took no part).
        accepted_nodes: [B, m] int64, node indices of the accepted path, root (0) first,
            ``num_accepted + 1`` entries, -1 padded.
        tokens: [B, m] int64, the tokens committed after the root: the accepted drafts, then the
            correction / bonus token; ``num_accepted + 1`` entries, -1 padded.
        next_tokens: [B] int64, the next root (the last of ``tokens``; the old root on rows that
            took no part).
        active: [B] bool, rows that took part in the step.
        lengths: [B] int64, committed length before the step (the root's position).
        hidden_states: layer -> [B, m, H], the target's hidden states along the accepted path
            (entry 0 = the root), for the layers the proposer declared.
        extra_logits: [B, e, V] or None, the target's logits at the extra rows.
        extra_hidden_states: layer -> [B, e, H] at the extra rows.
    """

    num_accepted: torch.Tensor
    accepted_nodes: torch.Tensor
    tokens: torch.Tensor
    next_tokens: torch.Tensor
    active: torch.Tensor
    lengths: torch.Tensor
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)
    extra_logits: torch.Tensor | None = None
    extra_hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class PrefillContext:
    """What ``prefill`` receives once per request batch.

    Shape: prompts [B, P] int64 (right-padded with valid ids); prompt_lens [B]; first_tokens [B]
    (sampled from the prefill, at positions ``prompt_lens``); hidden_states layer -> [B, P, H]
    over the prompt, for the declared layers. ``target`` and ``cache`` are the target model and
    its KV cache (for proposers that draft with the target's own weights); ``max_length`` is the
    cache capacity per row.
    """

    target: "CausalLM"
    cache: "KVCache"
    prompts: torch.Tensor
    prompt_lens: torch.Tensor
    first_tokens: torch.Tensor
    params: SamplingParams
    max_length: int
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)


# How a method that samples its drafts from its own q verifies rows at T > 0 (option
# ``verification`` of draft, mtp, layer_skip, quantspec): "coupled" draws each draft token with the
# target's own sampling noise at its position and verifies by sample-and-match, so the row emits the
# autoregressive samples of its seed whatever its draft lengths (the speculation policy may then
# adapt it); "rejection" draws from q on the draft stream and accepts with probability min(1, p/q)
# (SpecInfer), the most accepted tokens per draft, but a sample that depends on the draft lengths.
SAMPLED_VERIFICATION = ("coupled", "rejection")


SAMPLED_VERIFICATION_OPTION = (
    '"coupled" (default: T > 0 drafts drawn with the target\'s own sampling noise, sample-and-match: the '
    'autoregressive samples exactly) or "rejection" (drafts from q, rejection sampling: more accepted at some '
    'temperatures, samples depend on draft lengths)')


def check_sampled_verification(verification: str) -> str:
    if verification not in SAMPLED_VERIFICATION:
        raise ValueError(f"verification must be one of {SAMPLED_VERIFICATION}, got {verification!r}")
    return verification


def sampled_draft_kind(verification: str, all_greedy: bool) -> "DraftKind":
    """The kind of a chain sampled from the proposer's own q: rejection sampling needs q
    (``SAMPLED``); coupled drafts and all-greedy batches are matched and need none (``GUESS``)."""
    return DraftKind.GUESS if verification == "coupled" or all_greedy else DraftKind.SAMPLED


class Proposer:
    """Base class of the methods' proposers; subclasses override what they use.

    ``hidden_layers``: target layers whose hidden states the proposer reads (``-1`` = the final
    normed hidden state); the loop asks for them in prefill and in every verification forward.
    ``max_draft``: the most draft tokens per step (a chain's length or a tree's depth), the upper
    end of what the policy may grant.
    """

    hidden_layers: tuple[int, ...] = ()
    max_draft: int = 0

    def max_pending_tokens(self) -> int:
        """The most draft nodes plus extra rows sent in one step (sizes the target cache)."""
        return self.max_draft

    def prefill(self, ctx: PrefillContext) -> None:
        """Start on a new batch of requests."""

    def propose(self, state: StepState) -> Draft | None:
        """A draft following each row's root; None (or no nodes) decodes one token per row.
        Not called on a step where no row may draft (``state.max_draft`` all 0); ``accept`` is
        then called with ``draft=None``."""
        raise NotImplementedError

    def extra_rows(self, state: StepState, draft: Draft | None) -> ExtraRows | None:
        """Rows to append to this step's verification forward (default: none)."""
        return None

    def shadow_draft(self, depth: list[int]) -> list[list[int]] | None:
        """On a step the policy decodes plainly: the chain of at most ``depth[b]`` tokens each row
        would draft now (an empty list for none, and for rows with ``depth[b] == 0``), as host ids.
        Offered only by proposers whose drafts cost no forward and are guesses verified greedily or
        by sample-and-match (prompt lookup), so that a guess equal to the token a plain step emits
        is one verification would have accepted; the loop scores the chains against what the plain
        steps emit and tells the policy (``specdec_cuda.shadow``). Asked in greedy runs only.
        Called before ``accept``, so the proposer's state is this step's. Default None: none."""
        return None

    def matches_samples(self) -> bool:
        """Whether (after ``prefill``) a sampled row's drafts are all verified by sample-and-match:
        deterministic guesses, or drafts drawn with the target's own sampling noise. Such a row
        emits exactly the autoregressive samples of its seed whatever its draft length, so a
        speculation policy may shorten its drafts as freely as a greedy row's. Default False:
        rejection sampling against q, whose sample depends on which positions were drafted."""
        return False

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Learn the step's outcome (``draft`` is what ``propose`` returned)."""
