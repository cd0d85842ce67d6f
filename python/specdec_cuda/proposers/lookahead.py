"""Lookahead decoding (Fu et al. 2024): ``method="lookahead"``, and ``method="lookahead+draft"``.

No drafter is trained. Every verification forward carries, besides the draft, a *Jacobi window*:
``L = N - 1`` levels of ``W`` tokens (``ExtraRows``, never committed) laid out by the tree family's
``lookahead_mask`` kernel: window token (level l, column j) sits at ``root + 1 + l + j`` and sees the
root, level 0 up to column j, and its own column's levels 1 .. l, so it reads one chain of
consecutive positions (its trajectory) and its logits guess the next one. After the step the
argmax at the top level becomes the new top level and the levels shift down (the first ``L - 1``
steps fill the window instead). Each column then holds a fresh n-gram, oldest level first, whose
every token was predicted right after the one before it: ``(level 0, .., level L - 1, new top)``,
N tokens, which enters the row's n-gram *pool*.

The draft of a step is a tree of deterministic guesses (``DraftKind.GUESS``) hanging off the root,
merged with shared prefixes stored once:

* up to ``own_candidates`` continuations of the request's own committed text (prompt lookup: the
  C++ ``NgramIndex`` of the prompt and output, longest repeated suffix first);
* pool n-grams whose first token is the root, ranked by count, then length, then recency (the pool
  is an ``NgramIndex`` too, one document per collected n-gram), up to ``num_guesses`` candidates in
  all;
* with ``draft=`` (``lookahead+draft``): first of all, a draft model's greedy chain of ``k``.

With a drafter, each step uses one of four *arms*: everything ("all"), the lookahead parts without
the drafter's chain ("lookahead"), the chain and the own-text guesses without the window
("draft"), or the own-text guesses alone ("ngram"). The arm is chosen by measured throughput (committed tokens per second of whole steps,
over each arm's last steps; the arms the decoder has not measured are tried first and the others
re-measured every ``explore_every`` steps), so that the mixture is never held to a part that costs
more than it brings, such as a drafter forward on a host where it is slow, or the window's extra
rows. The choice only decides which guesses are made; it never changes what is emitted.

Verification is the loop's: greedy at T = 0, sample-and-match at T > 0, lossless for any mixture of
deterministic guesses. The window's argmax never depends on the random draws, and its rows are
invisible to the draft, so the output is the autoregressive output token for token (T = 0) or
sample for sample with the same seed (T > 0).

Per-request state (made in ``prefill``): the own-text index, the pool, the window ``[B, L, W]``;
nothing per step survives between ``propose`` and ``accept`` except what travels in the draft.
Drafting and pool updates are host work: one batched copy of the window per step.
"""

from __future__ import annotations

import collections
import time

import torch

from .. import ops
from ..contract import Draft, DraftKind, ExtraRows, Outcome, PrefillContext, Proposer, StepState
from ..methods import MethodSpec, register
from ..ngram import NgramIndex, extend_rows, lookup


def tree_paths(tokens: list[int], parents: list[int], num_nodes: int) -> list[list[int]]:
    """Root-to-leaf token paths of one draft tree (``Draft`` layout: parent 0 = the root)."""
    has_child = [False] * (num_nodes + 1)
    for j in range(num_nodes):
        has_child[parents[j]] = True
    paths = []
    for j in range(num_nodes):
        if has_child[j + 1]:
            continue
        path, node = [], j + 1
        while node > 0:
            path.append(tokens[node - 1])
            node = parents[node - 1]
        paths.append(path[::-1])
    return paths


def merge_paths(paths: list[list[int]], max_nodes: int, max_depth: int) -> tuple[list[int], list[int]]:
    """One prefix tree of token paths, shared prefixes stored once, in BFS order.

    Paths are inserted in order, each cut at ``max_depth`` and as deep as the node budget
    ``max_nodes`` allows. Returns ``(tokens, parents)`` of the draft nodes (parent 0 = the root,
    ``i + 1`` = draft node i), siblings in insertion order.
    """
    children: list[dict[int, int]] = [{}]  # trie node -> {token: child trie node}; 0 = the root
    token_of = [-1]
    for path in paths:
        node = 0
        for token in path[:max_depth]:
            child = children[node].get(token)
            if child is None:
                if len(token_of) - 1 >= max_nodes:
                    break
                child = len(token_of)
                children[node][token] = child
                children.append({})
                token_of.append(token)
            node = child
    # BFS renumbering: the loop's tree kernels want every parent before its children.
    order, parents, index = [0], [], {0: 0}
    for trie_node in order:
        for child in children[trie_node].values():
            index[child] = len(order)
            parents.append(index[trie_node])
            order.append(child)
    return [token_of[t] for t in order[1:]], parents


class LookaheadProposer(Proposer):
    """Lookahead decoding, optionally with a draft model's greedy chain (see the module docstring).

    Parameters
    ----------
    window : W, columns of the Jacobi window (0: no window, the pool stays empty).
    ngram : N, the n-gram length: guesses of up to N - 1 tokens, N - 1 window levels.
    num_guesses : G, the most guesses (candidates) merged into one tree per step.
    own_candidates : of those, the most taken from the request's own text (prompt lookup).
    n_min, n_max : n-gram orders of the own-text index (longest match first).
    max_occurrences : newest occurrences of a matched n-gram that are ranked (own text and pool).
    drafter : a ``DraftModelProposer`` in ``"match"`` mode whose greedy chain leads the tree, or None.
    adaptive : with a drafter, choose each step's arm by measured throughput (module docstring);
        False always uses everything.
    explore_every : steps between re-measurements of the arms not in use.
    """

    ARMS = ("all", "lookahead", "draft", "ngram")
    CHAIN_ARMS, WINDOW_ARMS = ("all", "draft"), ("all", "lookahead")

    def __init__(self, window: int = 4, ngram: int = 4, num_guesses: int = 4, own_candidates: int = 1,
                 n_min: int = 1, n_max: int = 4, max_occurrences: int = 64, drafter=None,
                 adaptive: bool = True, explore_every: int = 8) -> None:
        if window < 0 or ngram < 2 or num_guesses < 1 or own_candidates < 0 or max_occurrences < 1:
            raise ValueError(f"need window >= 0, ngram >= 2, num_guesses >= 1, own_candidates >= 0 and "
                             f"max_occurrences >= 1, got window={window}, ngram={ngram}, "
                             f"num_guesses={num_guesses}, own_candidates={own_candidates}, "
                             f"max_occurrences={max_occurrences}")
        NgramIndex(n_min, n_max)  # checks the orders now rather than at the first prefill
        if drafter is not None and drafter.verification != "match":
            raise ValueError("lookahead+draft merges the drafter's greedy chain into a guess tree: "
                             "its DraftModelProposer must use verification='match'")
        self.window, self.ngram, self.num_guesses = int(window), int(ngram), int(num_guesses)
        self.own_candidates = min(int(own_candidates), self.num_guesses)
        self.n_min, self.n_max, self.max_occurrences = int(n_min), int(n_max), int(max_occurrences)
        self.levels = self.ngram - 1
        self.guess_len = self.ngram - 1
        self.drafter = drafter
        self.draft_len = drafter.max_draft if drafter is not None else 0
        self.max_draft = max(self.guess_len, self.draft_len)
        self.max_nodes = self.num_guesses * self.guess_len + self.draft_len
        # Arms: only a mixture has parts to choose between. Measurements outlive a request (like
        # the cost policy's step costs): the host's speed does not change between requests.
        self.adaptive = bool(adaptive) and drafter is not None and self.window > 0
        self.explore_every = max(2, int(explore_every))
        self.arm = "all"
        self.arm_steps = {arm: collections.deque(maxlen=32) for arm in self.ARMS}  # (tokens, seconds)
        self.steps_taken = 0
        self._step_start: float | None = None

    def max_pending_tokens(self) -> int:
        return self.max_nodes + self.window * self.levels

    # -- per request -------------------------------------------------------------------------------

    def prefill(self, ctx: PrefillContext) -> None:
        prompts, lens, first = ctx.prompts.cpu(), ctx.prompt_lens.tolist(), ctx.first_tokens.cpu()
        self.own, self.pool = [], []
        for b, n in enumerate(lens):
            own = NgramIndex(self.n_min, self.n_max)
            own.extend(torch.cat([prompts[b, :n], first[b:b + 1]]))  # through the first root
            self.own.append(own)
            self.pool.append(NgramIndex(1, 1))  # keyed by the n-gram's first token, as in the paper
        # The window starts as one level of prompt tokens spread over the prompt (any tokens are
        # correct: they are guesses); the next L - 1 steps fill the levels above it.
        batch = len(lens)
        window = torch.zeros(batch, max(self.levels, 1), max(self.window, 1), dtype=torch.int64)
        for b, n in enumerate(lens):
            picks = [(j * 7919 + 13) % n for j in range(self.window)]
            window[b, 0, : self.window] = prompts[b, picks]
        self.window_tokens = window.to(ctx.prompts.device)
        self.filled = 1
        if self.drafter is not None:
            self.drafter.prefill(ctx)
        self._step_start = time.perf_counter()

    def memory_bytes(self) -> list[int]:
        """Bytes held by each request's own-text index and pool."""
        return [o.memory_bytes() + p.memory_bytes() for o, p in zip(self.own, self.pool)]

    # -- a step ------------------------------------------------------------------------------------

    @property
    def _window_on(self) -> bool:
        return self.window > 0 and self.arm in self.WINDOW_ARMS

    def _guesses(self, b: int, root: int, depth: int) -> list[list[int]]:
        """Row b's candidate paths: own text first, then the pool (shared continuations once)."""
        paths: list[list[int]] = []
        if self.own_candidates:
            found = lookup([self.own[b]], self.guess_len, self.own_candidates, max_depth=depth,
                           max_occurrences=self.max_occurrences)
            paths += tree_paths(found.tokens[0].tolist(), found.parents[0].tolist(), int(found.num_nodes[0]))
        if self._window_on and len(paths) < self.num_guesses:
            # A context index of the root alone has no candidates of its own, so the pool fills
            # every slot, matched on the root.
            context = NgramIndex(1, 1)
            context.extend([root])
            found = lookup([context], self.guess_len, self.num_guesses, max_depth=depth, corpus=self.pool[b],
                           max_occurrences=self.max_occurrences)
            pool_paths = tree_paths(found.tokens[0].tolist(), found.parents[0].tolist(), int(found.num_nodes[0]))
            paths += [p for p in pool_paths if p not in paths][: self.num_guesses - len(paths)]
        return paths

    def propose(self, state: StepState) -> Draft | None:
        device = state.lengths.device
        depth = torch.where(state.active, state.max_draft, 0).tolist()
        use_chain = self.drafter is not None and self.arm in self.CHAIN_ARMS
        chain = self.drafter.propose(state) if use_chain else None
        chain_tokens = chain.tokens.tolist() if chain is not None else None
        chain_nodes = chain.num_nodes.tolist() if chain is not None else None
        roots = state.last_tokens.tolist()
        rows = []
        for b, d in enumerate(depth):
            if d <= 0:
                rows.append(([], []))
                continue
            paths = [chain_tokens[b][: chain_nodes[b]]] if chain is not None and chain_nodes[b] else []
            paths += self._guesses(b, roots[b], min(d, self.guess_len))
            rows.append(merge_paths(paths, self.max_nodes, d))
        width = max(1, max(len(t) for t, _ in rows))
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)
        parents = torch.zeros(len(rows), width, dtype=torch.int64)
        for b, (t, p) in enumerate(rows):
            tokens[b, : len(t)] = torch.tensor(t, dtype=torch.int64)
            parents[b, : len(p)] = torch.tensor(p, dtype=torch.int64)
        num_nodes = torch.tensor([len(t) for t, _ in rows], dtype=torch.int64)
        is_chain = all(p == list(range(len(p))) for _, p in rows)
        context = chain  # the drafter's own proposal, for its accept()
        # The drafter's catch-up with the prompt (or with tokens decoded plainly) is a one-time
        # cost: the loop leaves it out of the step time the cost policy learns from, or every
        # run's first drafted step would raise that draft length's remembered cost.
        return Draft(tokens.to(device), num_nodes.to(device), DraftKind.GUESS,
                     parents=None if is_chain else parents.to(device), context=context,
                     one_time_seconds=chain.one_time_seconds if chain is not None else 0.0)

    def _window_layout(self, lengths: torch.Tensor):
        no_guesses = torch.zeros(lengths.shape[0], 0, dtype=torch.int64, device=lengths.device)
        return ops.lookahead_mask(lengths, no_guesses, 0, self.window, self.filled, check=False)

    def matches_samples(self) -> bool:
        return True  # guesses (the drafter's chain in "match" mode), sample-and-match at T > 0

    def extra_rows(self, state: StepState, draft: Draft | None) -> ExtraRows | None:
        # No row may draft: the speculation policy decodes this step plainly, and the window waits
        # with it (its rows would cost the step what the policy saved; it resumes where it stood).
        if not self._window_on or (draft is None and not bool(state.max_draft.any())):
            return None
        layout = self._window_layout(state.lengths)  # slot 0 is the root, fed by the loop itself
        tokens = self.window_tokens[:, : self.filled].reshape(state.lengths.shape[0], -1)
        return ExtraRows(tokens, layout.positions[:, 1:], layout.tree_mask[:, 1:, 1:])

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Commit the step's tokens to the own-text index; advance the window; feed the pool."""
        active = outcome.active
        committed = torch.where(active, outcome.num_accepted + 1, 0)  # [B]
        committed_host = committed.cpu()
        extend_rows(self.own, outcome.tokens.cpu(), committed_host)
        if self.drafter is not None:
            self._drafter_accept(draft, outcome)
        if self.window and outcome.extra_logits is not None:
            self._advance_window(outcome)
        if self.adaptive and draft is None:
            self._step_start = None  # a plain step (the policy's): no arm ran, none is measured
        elif self.adaptive:
            self._choose_arm(int(committed_host.sum()), draft.one_time_seconds)

    def _choose_arm(self, committed: int, one_time: float) -> None:
        """Record the step just finished under its arm, less its ``one_time`` seconds (a chain
        arm's drafter catch-up is not what the arm costs per step); pick the next step's arm."""
        now = time.perf_counter()
        if self._step_start is not None:
            self.arm_steps[self.arm].append((committed, max(0.0, now - self._step_start - one_time)))
        self._step_start = now
        self.steps_taken += 1

        def rate(arm):
            steps = self.arm_steps[arm]
            return sum(t for t, _ in steps) / max(sum(s for _, s in steps), 1e-9)

        unmeasured = [arm for arm in self.ARMS if len(self.arm_steps[arm]) < 2]
        if unmeasured:
            self.arm = unmeasured[0]
            return
        best = max(self.ARMS, key=rate)
        if self.steps_taken % self.explore_every == 0:  # re-measure the others in turn
            others = [arm for arm in self.ARMS if arm != best]
            self.arm = others[(self.steps_taken // self.explore_every) % len(others)]
        else:
            self.arm = best

    def _advance_window(self, outcome: Outcome) -> None:
        active = outcome.active
        W, top = self.window, self.filled - 1
        new_top = outcome.extra_logits[:, top * W:(top + 1) * W].argmax(-1)  # [B, W]
        old = self.window_tokens
        if self.filled < self.levels:  # warm-up: the new level goes on top
            grown = old.clone()
            grown[:, self.filled, :W] = new_top
            self.window_tokens = torch.where(active[:, None, None], grown, old)
            self.filled += 1
            return
        # Full window: each column's levels and its new top are an n-gram of N tokens.
        ngrams = torch.cat([old[:, : self.levels, :W], new_top[:, None, :]], dim=1).transpose(1, 2)  # [B, W, N]
        for pool, row, on in zip(self.pool, ngrams.cpu().tolist(), active.tolist()):
            if not on:
                continue
            for gram in row:
                pool.start_document()
                pool.extend(gram)
        shifted = torch.cat([old[:, 1:], new_top[:, None, :]], dim=1)
        self.window_tokens = torch.where(active[:, None, None], shifted, old)

    def _drafter_accept(self, draft: Draft | None, outcome: Outcome) -> None:
        # The drafter's cache holds its own chain; it stays valid only as far as the committed path
        # agrees with that chain, whichever branch of the merged tree was accepted.
        if draft is None:
            # A plain step (the policy's): nothing drafted, so nothing of the drafter's cache to
            # judge, and its copy of the sequence gains the one committed token, as after a plain
            # step of its own (about a dozen small torch ops fewer per step: ~0.15 ms of the zoo
            # target's ~2.8 ms step).
            self.drafter.accept(None, outcome)
            return
        chain = draft.context
        num_accepted = outcome.num_accepted
        if chain is not None:
            k = min(chain.width, outcome.tokens.shape[1])
            agree = (chain.tokens[:, :k] == outcome.tokens[:, :k].clamp(min=0)).to(torch.int64)
            agree = torch.where(torch.arange(k, device=agree.device)[None, :] < num_accepted[:, None], agree, 0)
            num_agree = agree.cumprod(dim=1).sum(dim=1)  # [B] leading drafts on the committed path
        else:
            num_agree = torch.zeros_like(num_accepted)
        rows = torch.arange(num_accepted.shape[0], device=num_accepted.device)
        next_tokens = torch.where(outcome.active, outcome.tokens[rows, num_agree], outcome.next_tokens)
        inner = Outcome(num_agree, outcome.accepted_nodes, outcome.tokens, next_tokens, outcome.active,
                        outcome.lengths)
        self.drafter.accept(chain, inner)
        # ... and its copy of the sequence gets every committed token (the drafter catches up on
        # them at its next proposal).
        seq = self.drafter.seq
        m = outcome.tokens.shape[1]
        cols = (outcome.lengths[:, None] + 1 + torch.arange(m, device=seq.device)).clamp(max=seq.shape[1] - 1)
        keep = torch.arange(m, device=seq.device)[None, :] <= num_accepted[:, None]
        keep = keep & outcome.active[:, None]
        seq.scatter_(1, cols, torch.where(keep, outcome.tokens, seq.gather(1, cols)))


def make_lookahead_proposer(target, window: int = 4, ngram: int = 4, num_guesses: int = 4,
                            own_candidates: int = 1, n_min: int = 1, n_max: int = 4,
                            max_occurrences: int = 64) -> LookaheadProposer:
    """The ``method="lookahead"`` proposer (``target`` is not needed: the window rides in its forward)."""
    return LookaheadProposer(window=window, ngram=ngram, num_guesses=num_guesses,
                             own_candidates=own_candidates, n_min=n_min, n_max=n_max,
                             max_occurrences=max_occurrences)


def make_lookahead_draft_proposer(target, draft=None, k: int = 4, window: int = 4, ngram: int = 4,
                                  num_guesses: int = 4, own_candidates: int = 1, n_min: int = 1,
                                  n_max: int = 4, max_occurrences: int = 64,
                                  adaptive: bool = True, draft_vocab=None) -> LookaheadProposer:
    """The ``method="lookahead+draft"`` proposer: lookahead plus ``draft``'s greedy chain of ``k``
    (its LM head over ``draft_vocab`` only when given: see ``method="draft"``)."""
    from .draft_model import make_draft_model_proposer

    drafter = make_draft_model_proposer(target, draft=draft, k=k, verification="match", draft_vocab=draft_vocab)
    return LookaheadProposer(window=window, ngram=ngram, num_guesses=num_guesses,
                             own_candidates=own_candidates, n_min=n_min, n_max=n_max,
                             max_occurrences=max_occurrences, drafter=drafter, adaptive=adaptive)


LOOKAHEAD_OPTIONS = {
    "window": "W, columns of the Jacobi window riding in each verification forward; 0 = none (default 4)",
    "ngram": "N: guesses of up to N - 1 tokens, N - 1 window levels (default 4)",
    "num_guesses": "G, the most guessed n-grams merged into one tree per step (default 4)",
    "own_candidates": "of those, the most from the request's own text (prompt lookup; default 1)",
    "n_min": "shortest n-gram of the own text matched (default 1)",
    "n_max": "longest n-gram of the own text matched, tried first (default 4)",
    "max_occurrences": "newest occurrences of a matched n-gram that are ranked (default 64)",
}


register(MethodSpec(
    name="lookahead",
    summary="lookahead decoding (Fu et al.): a Jacobi window feeds an n-gram pool, guesses verified as a tree",
    lossless=True,
    make=make_lookahead_proposer,
    options=LOOKAHEAD_OPTIONS,
))

register(MethodSpec(
    name="lookahead+draft",
    summary="lookahead / n-gram guesses and a draft model's greedy chain merged into one tree",
    lossless=True,
    make=make_lookahead_draft_proposer,
    required=("draft",),
    options={
        "draft": "the drafter: a model, transformers model or checkpoint folder (same tokenizer)",
        "k": "the drafter's greedy chain length (default 4)",
        "draft_vocab": "the drafter's LM head over part of the vocabulary, as for method draft (default: all of it)",
        **LOOKAHEAD_OPTIONS,
        "adaptive": "choose per step between everything, lookahead alone, draft + own-text guesses and "
                    "own-text guesses alone by measured throughput (default True); False: always everything",
    },
))
