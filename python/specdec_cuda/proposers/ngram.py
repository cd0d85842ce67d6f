"""Prompt lookup / n-gram drafting (Saxena 2023, "prompt lookup decoding"): ``method="prompt_lookup"``.

No drafter model: each request keeps an n-gram index (``specdec_cuda.ngram.NgramIndex``, C++) of
its committed tokens, prompt and output. Every step, the longest suffix of the committed text that
occurred before proposes what followed it then: one continuation as a chain (``num_candidates=1``),
or several merged into a prefix tree, ranked by count, then length, then recency. An optional static
corpus index, shared read-only by all requests, fills the candidate slots a request's own text
leaves empty.

The guesses are deterministic (``DraftKind.GUESS``): greedy verification at T = 0 and
sample-and-match at T > 0, lossless either way. The index grows in ``accept`` by the step's
committed tokens (accepted drafts and the correction / bonus token), so it always holds exactly
the committed sequence through the next root; nothing is rolled back. Drafting is host work (the
index lives in host memory): one batched lookup and one batched update per step.
"""

from __future__ import annotations

import torch

from ..contract import Draft, DraftKind, Outcome, PrefillContext, Proposer, StepState
from ..methods import MethodSpec, register
from .._native import _C
from ..ngram import NgramIndex, extend_rows, lookup


class PromptLookupProposer(Proposer):
    """Chains (``num_candidates=1``) or trees of n-gram continuations (see the module docstring).

    Parameters
    ----------
    k : most draft tokens per candidate (the chain's length, the tree's depth).
    num_candidates : continuations merged into one tree per row; 1 = a chain.
    n_min, n_max : the n-gram orders matched (longest first).
    max_occurrences : newest occurrences of the matched n-gram that are ranked.
    corpus : a static ``NgramIndex`` (or the path of a saved one) shared by all requests, or None.
    """

    def __init__(self, k: int = 4, num_candidates: int = 1, n_min: int = 1, n_max: int = 4,
                 max_occurrences: int = 64, corpus: NgramIndex | str | None = None) -> None:
        if k < 1 or num_candidates < 1 or max_occurrences < 1:
            raise ValueError(f"need k >= 1, num_candidates >= 1 and max_occurrences >= 1, got k={k}, "
                             f"num_candidates={num_candidates}, max_occurrences={max_occurrences}")
        NgramIndex(n_min, n_max)  # checks the orders now rather than at the first prefill
        if isinstance(corpus, (str, bytes)) or hasattr(corpus, "__fspath__"):
            corpus = NgramIndex.load(corpus)
        if corpus is not None and not isinstance(corpus, NgramIndex):
            raise TypeError(f"corpus: expected an NgramIndex, a path or None, got {type(corpus).__name__}")
        self.k, self.num_candidates = int(k), int(num_candidates)
        self.n_min, self.n_max, self.max_occurrences = int(n_min), int(n_max), int(max_occurrences)
        self.corpus = corpus
        self.max_draft = self.k
        self.indexes: list[NgramIndex] = []

    def max_pending_tokens(self) -> int:
        return self.k * self.num_candidates

    def prefill(self, ctx: PrefillContext) -> None:
        prompts, lens, first = ctx.prompts.cpu(), ctx.prompt_lens.tolist(), ctx.first_tokens.cpu()
        self.indexes = []
        for b, n in enumerate(lens):
            index = NgramIndex(self.n_min, self.n_max)
            index.extend(torch.cat([prompts[b, :n], first[b:b + 1]]))  # through the first root
            self.indexes.append(index)

    def memory_bytes(self) -> list[int]:
        """Bytes held by each request's index (the shared corpus not included)."""
        return [ix.memory_bytes() for ix in self.indexes]

    def propose(self, state: StepState) -> Draft | None:
        depth = torch.where(state.active, state.max_draft, 0).cpu()  # [B] a chain's length, a tree's depth
        if depth.numel() == 0 or int(depth.max()) <= 0:
            return None
        found = lookup(self.indexes, self.k, self.num_candidates, max_depth=depth, corpus=self.corpus,
                       max_occurrences=self.max_occurrences)
        device = state.lengths.device
        num_nodes = found.num_nodes.to(device)
        if self.num_candidates == 1:  # one candidate: the BFS tree is the chain itself
            return Draft(found.tokens.to(device), num_nodes, DraftKind.GUESS)
        return Draft(found.tokens.to(device), num_nodes, DraftKind.GUESS, parents=found.parents.to(device))

    def shadow_draft(self, depth: list[int]) -> list[list[int]]:
        """The best candidate's chain per row (a lookup: no forward), for the policy's shadow
        drafts. A tree's first candidate only: a tree accepts at least what its best chain does."""
        rows = [ix._index if d > 0 else None for ix, d in zip(self.indexes, depth)]
        if not any(r is not None for r in rows):
            return [[] for _ in depth]
        # The lookup op itself (``ngram.lookup`` checks arguments that are right by construction
        # here: ~25 us of a ~50 us call, on every plain step of a small target).
        limit = torch.tensor(depth, dtype=torch.int64)
        tokens, _, num_nodes = _C.ngram_lookup(rows, None if self.corpus is None else self.corpus._index, self.k, 1,
                                               self.max_occurrences, limit, limit)
        return [t[:n] for t, n in zip(tokens.tolist(), num_nodes.tolist())]

    def matches_samples(self) -> bool:
        return True  # guesses, sample-and-match at T > 0

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Commit each row's accepted drafts and correction / bonus token to its index."""
        committed = torch.where(outcome.active, outcome.num_accepted + 1, 0)  # [B]
        extend_rows(self.indexes, outcome.tokens.cpu(), committed.cpu())


def make_prompt_lookup_proposer(target, k: int = 4, num_candidates: int = 1, n_min: int = 1,
                                n_max: int = 4, max_occurrences: int = 64,
                                corpus: NgramIndex | str | None = None) -> PromptLookupProposer:
    """The ``method="prompt_lookup"`` proposer (``target`` is not needed: the guesses are text)."""
    return PromptLookupProposer(k=k, num_candidates=num_candidates, n_min=n_min, n_max=n_max,
                                max_occurrences=max_occurrences, corpus=corpus)


PROMPT_LOOKUP_OPTIONS = {
    "k": "draft tokens per candidate: the chain's length, the tree's depth (default 4)",
    "num_candidates": "continuations merged into one tree per row; 1 = a chain (default 1)",
    "n_min": "shortest n-gram matched (default 1)",
    "n_max": "longest n-gram matched, tried first (default 4)",
    "max_occurrences": "newest occurrences of the matched n-gram that are ranked (default 64)",
    "corpus": "a static NgramIndex (or the path of a saved one) shared read-only by all requests",
}


register(MethodSpec(
    name="prompt_lookup",
    summary="prompt lookup / n-gram drafting: continuations of the longest repeated suffix (chain or tree)",
    lossless=True,
    make=make_prompt_lookup_proposer,
    options=PROMPT_LOOKUP_OPTIONS,
))

# "ngram": the second name for the same method (same proposer, same options, same defaults).
register(MethodSpec(
    name="ngram",
    summary='n-gram drafting from the request\'s own text: another name for "prompt_lookup"',
    lossless=True,
    make=make_prompt_lookup_proposer,
    options=PROMPT_LOOKUP_OPTIONS,
))
