"""EAGLE-3 (Li et al. 2025): ``method="eagle3"``, a one-layer drafter on the target's low, middle
and high features (``models.eagle3.Eagle3Drafter``) drafting a chain or a dynamic tree.

Pairing (the drafter at position t reads the target's features at t and the token at t + 1, and
predicts the token at t + 2). With the root, the newest committed token, at position L and the
target's features known through L - 1:

* step 1 runs at position L - 1 on ``(fc(g_{L-1}), root)`` and gives q_1, the distribution of the
  token at L + 1 (draft depth 1). It is a committed position (true features, committed token), so
  it runs as the last column of the *catch-up*: the forward that brings the drafter's cache up to
  L - 1 with the positions committed since the last proposal.
* step j > 1 runs at position L + j - 2 on ``(h'_{j-1}, draft j - 1)``, the drafter's own previous
  output and token, and gives q_j. These positions go to scratch slots that are never committed:
  after verification the next catch-up recomputes the committed ones from the target's features
  along the accepted path (``Outcome.hidden_states``), so the cache only ever holds true-feature
  positions and a rejected draft needs no rollback.

Chains (``tree=False``, or a node ``budget <= depth``): greedy rows draft the argmax. At T > 0,
``verification="coupled"`` (default) draws each token from q_j (the row's temperature / top-k /
top-p applied over the target vocabulary, ``MASKED`` outside the draft vocabulary) with the
target's own sampling noise at its position (``Purpose.SAMPLE``) and sends a ``GUESS`` chain,
verified by sample-and-match: the row emits exactly its autoregressive samples.
``verification="rejection"`` draws on the draft stream and sends q_j's logits (``SAMPLED``):
rejection sampling.

Dynamic trees (EAGLE-2's, ``tree=True``): level 1 is the ``topk`` best tokens of q_1; each further
level runs the drafter once on the ``topk`` nodes of the previous level with the highest cumulative
draft log-probability (tree attention inside the drafter: a node sees the committed prefix, its
ancestors and itself), each giving its ``topk`` best children. Of all the candidates, the
``budget`` of highest cumulative log-probability are kept, at most the row's granted depth deep;
a child's cumulative log-probability never exceeds its parent's (ties: the shallower first), so a
kept node's ancestors are kept. The tree is sent in BFS order with ``parents`` as deterministic
guesses (``GUESS``): greedy verification at T = 0, sample-and-match at T > 0, lossless both.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .. import ops
from ..contract import (SAMPLED_VERIFICATION_OPTION, Draft, DraftKind, Outcome, PrefillContext, Proposer,
                        StepState, check_sampled_verification, sampled_draft_kind)
from ..methods import MethodSpec, register
from ..models.eagle3 import Eagle3Drafter
from ..reference.philox import Purpose


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class Eagle3Proposer(Proposer):
    """EAGLE-3 chains or dynamic trees (module docstring).

    Parameters
    ----------
    drafter : an ``Eagle3Drafter`` attached to the target (``Eagle3Drafter.attach``).
    k : chain length (``tree=False``).
    tree : draft dynamic trees of ``depth`` levels, ``topk`` children per expanded node and at most
        ``budget`` nodes per row; with ``budget <= depth`` a chain of ``budget`` tokens instead.
    verification : how sampled chains are verified (``contract.SAMPLED_VERIFICATION``).
    """

    def __init__(self, drafter: Eagle3Drafter, k: int = 5, tree: bool = True, depth: int = 5, topk: int = 4,
                 budget: int = 24, verification: str = "coupled") -> None:
        self.drafter = drafter
        self.verification = check_sampled_verification(verification)
        k, depth, topk, budget = (_positive_int(n, v) for n, v in (("k", k), ("depth", depth), ("topk", topk),
                                                                    ("budget", budget)))
        if topk > drafter.config.draft_vocab_size:
            raise ValueError(f"topk ({topk}) exceeds the drafter's vocabulary ({drafter.config.draft_vocab_size})")
        self.tree = bool(tree) and budget > depth
        self.k = k if not tree else budget  # a chain: of k, or of a budget too small for a tree
        self.depth, self.topk, self.budget = depth, topk, budget
        self.max_draft = depth if self.tree else self.k
        self.hidden_layers = drafter.hidden_layers

    def max_pending_tokens(self) -> int:
        return self.budget if self.tree else self.k

    def matches_samples(self) -> bool:
        return self.tree or self.verification == "coupled"

    # -- state --------------------------------------------------------------------------------

    def prefill(self, ctx: PrefillContext) -> None:
        prompts, prompt_lens = ctx.prompts, ctx.prompt_lens
        B, P = prompts.shape
        d = self.drafter
        # Slots: every committed position, then one step's scratch (a tree's expanded levels or a
        # chain's steps past the first), then one spare column the token / feature writes of
        # padding entries may land on.
        scratch = (self.depth - 1) * self.topk if self.tree else self.k
        self.capacity = ctx.max_length + scratch + 2
        self.rows = torch.arange(B, device=prompts.device)
        # seq [B, C]: committed tokens (slot p: the token at position p; past a row's length: scratch).
        self.seq = torch.zeros(B, self.capacity, dtype=torch.int64, device=prompts.device)
        self.seq[:, :P] = prompts
        self.seq[self.rows, prompt_lens] = ctx.first_tokens
        # feats [B, C, H]: fc(g_p), the drafter's input at committed position p (valid for p < length).
        feats = d.features(ctx.hidden_states)
        self.feats = feats.new_zeros(B, self.capacity, feats.shape[-1])
        self.feats[:, :P] = feats
        self.cache = d.new_cache(B, self.capacity)
        # The drafter's output at each row's newest committed slot (cache.lengths - 1): step 1's h'.
        self.newest = feats.new_zeros(B, feats.shape[-1])
        self.params = ctx.params
        self.all_greedy = bool((ctx.params.temperature == 0).all())
        self.kind = DraftKind.GUESS if self.tree else sampled_draft_kind(self.verification, self.all_greedy)
        self.purpose = Purpose.SAMPLE if self.verification == "coupled" else Purpose.DRAFT
        self.catching_up = True  # the prompt (or plain steps) wait for the next catch-up

    def _catch_up(self, L: torch.Tensor) -> torch.Tensor:
        """Bring the cache through position L - 1 from the true features; returns step 1's output
        h'_{L-1} per row. Shape: L [B] -> [B, H]. Rows already there keep their last output."""
        cache = self.cache
        behind = (L - cache.lengths).clamp(min=0)  # [B]
        width = int(behind.max())
        if width == 0:
            return self.newest
        pos = cache.lengths[:, None] + torch.arange(width, device=L.device)  # [B, w]; past behind: padding
        pos = pos.clamp(max=self.capacity - 2)
        h = self.feats.gather(1, pos[:, :, None].expand(-1, -1, self.feats.shape[-1]))
        out = self.drafter.step(h, self.seq.gather(1, pos + 1), pos, cache, num_new=behind)
        cache.commit(behind)
        last = out[self.rows, (behind - 1).clamp(min=0)]
        self.newest = torch.where((behind > 0)[:, None], last, self.newest)
        return self.newest

    # -- propose ------------------------------------------------------------------------------

    def propose(self, state: StepState) -> Draft | None:
        limit, k_step = state.draft_limits(self.max_draft)  # [B]
        if k_step == 0:
            return None
        started = time.perf_counter()
        first = self._catch_up(state.lengths)
        one_time = time.perf_counter() - started if self.catching_up else 0.0
        self.catching_up = False
        if self.tree:
            draft = self._tree(state, limit, k_step, first)
        else:
            draft = self._chain(state, limit, k_step, first)
        draft.one_time_seconds = one_time
        return draft

    def _draw(self, h: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft token per row from q = softmax(lm_head(norm(h))). Shape: h [B, H] -> target ids
        [B], target-vocabulary logits [B, V] (None when every row is greedy: the argmax)."""
        d = self.drafter
        draft_logits = d.logits(h)
        if self.all_greedy:
            return d.target_ids()[draft_logits.argmax(-1)], None
        logits = d.to_target_vocab(draft_logits)
        drawn = ops.sample(logits, **self.params.kwargs(), position=position, purpose=self.purpose)
        # A row the sampler flagged (-1: bad drafter logits) proposes token 0, judged like any draft.
        return drawn.tokens.clamp(min=0), logits

    def _chain(self, state: StepState, limit: torch.Tensor, k_step: int, h: torch.Tensor) -> Draft:
        L = state.lengths
        B = L.shape[0]
        tokens = torch.zeros(B, k_step, dtype=torch.int64, device=L.device)
        logits_out = None
        for j in range(1, k_step + 1):
            if j > 1:  # position L + j - 2: the previous output and token, scratch slot j - 2
                h = self.drafter.step(h[:, None], tokens[:, j - 2, None], (L + j - 2)[:, None], self.cache,
                                      offset=j - 2)[:, 0]
            token, logits = self._draw(h, L + j)
            tokens[:, j - 1] = token
            if self.kind is DraftKind.SAMPLED:
                if logits_out is None:
                    logits_out = logits.new_empty(B, k_step, logits.shape[-1])
                logits_out[:, j - 1] = logits
        return Draft(tokens, limit, self.kind, logits=logits_out)

    def _tree(self, state: StepState, limit: torch.Tensor, depth: int, first: torch.Tensor) -> Draft:
        """EAGLE-2's dynamic tree (module docstring), every row at once.

        The candidate pool, per row, in level order: level 1's K nodes, then K * K per further level
        (child c of the level's expanded node e at ``base + e * K + c``). ``pool_*`` list per level:
        cumulative log-probabilities, draft ids and the pool index of each candidate's parent (-1:
        the root)."""
        d, K, L = self.drafter, self.topk, state.lengths
        B, device = L.shape[0], L.device
        logp = torch.log_softmax(d.logits(first).float(), dim=-1)  # [B, Vd]
        score, token = logp.topk(K, dim=-1)  # [B, K], best first
        pool_score, pool_token = [score], [token]
        pool_parent = [torch.full((B, K), -1, dtype=torch.int64, device=device)]
        pool_depth = [torch.ones(K, dtype=torch.int64, device=device)]
        # The expanded nodes of the current level: score, draft id, pool index, the h' that gave
        # their distribution, and the scratch slots of their ancestors ([B, K, slots so far]).
        hidden = first[:, None].expand(B, K, first.shape[-1])
        index = torch.arange(K, device=device).expand(B, K)
        ancestors = torch.zeros(B, K, 0, dtype=torch.bool, device=device)
        eye = torch.eye(K, dtype=torch.bool, device=device).expand(B, K, K)
        target_ids = d.target_ids()
        base = K
        for level in range(2, depth + 1):
            # Run the expanded nodes at position L + level - 2, slots (level - 2) * K + e.
            offset = (level - 2) * K
            seen = torch.cat([ancestors, eye], dim=2)  # [B, K, offset + K]
            out = d.step(hidden, target_ids[token], (L + level - 2)[:, None].expand(B, K), self.cache,
                         offset=offset, scratch_mask=seen)  # [B, K, H]
            logp = torch.log_softmax(d.logits(out).float(), dim=-1)  # [B, K, Vd]
            child_score, child_token = logp.topk(K, dim=-1)  # [B, K, K]
            cand_score = (score[:, :, None] + child_score).reshape(B, K * K)
            cand_token = child_token.reshape(B, K * K)
            pool_score.append(cand_score)
            pool_token.append(cand_token)
            pool_parent.append(index.repeat_interleave(K, dim=1))
            pool_depth.append(torch.full((K * K,), level, dtype=torch.int64, device=device))
            if level < depth:  # the next level expands the best K of these K * K
                score, pick = cand_score.topk(K, dim=-1)  # [B, K]
                parent = pick // K
                token = cand_token.gather(1, pick)
                hidden = out.gather(1, parent[:, :, None].expand(-1, -1, out.shape[-1]))
                ancestors = seen.gather(1, parent[:, :, None].expand(-1, -1, seen.shape[-1]))
                index = base + pick
            base += K * K
        return self._select(torch.cat(pool_score, 1), torch.cat(pool_token, 1), torch.cat(pool_parent, 1),
                            torch.cat(pool_depth), limit, target_ids)

    def _select(self, scores, tokens, parents, depths, limit, target_ids) -> Draft:
        """The ``budget`` best candidates per row as a BFS-ordered tree.

        Shape: scores / tokens / parents [B, N] (pool order), depths [N], limit [B]."""
        B, N = scores.shape
        valid = depths[None, :] <= limit[:, None]  # deeper than the row's grant: out
        scores = torch.where(valid, scores, float("-inf"))
        width = min(self.budget, N)
        # Stable: equal scores keep pool order, so a parent (earlier level) precedes its children.
        best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :width]  # [B, width]
        num_nodes = valid.sum(1).clamp(max=width)
        real = torch.arange(width, device=scores.device)[None, :] < num_nodes[:, None]
        # BFS order = pool order (levels in turn); padding after the real nodes.
        chosen = torch.where(real, best, best + N).sort(dim=1).values
        chosen = torch.where(chosen >= N, chosen - N, chosen)
        where = torch.full((B, N), -1, dtype=torch.int64, device=scores.device)
        where.scatter_(1, chosen, torch.arange(width, device=scores.device).expand(B, width))
        parent = parents.gather(1, chosen)  # pool index, -1 = the root
        node_parent = torch.where(parent < 0, 0, where.gather(1, parent.clamp(min=0)) + 1)
        node_parent = torch.where(real, node_parent, 0)  # padding: any valid index (not read)
        return Draft(target_ids[tokens.gather(1, chosen)], num_nodes, DraftKind.GUESS, parents=node_parent)

    # -- accept -------------------------------------------------------------------------------

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Keep the committed tokens and the target's features along the accepted path (positions
        L .. L + a, root first) for the next catch-up. The scratch slots are simply left behind."""
        L = outcome.lengths
        m, last = outcome.tokens.shape[1], self.capacity - 1
        cols = (L[:, None] + 1 + torch.arange(m, device=L.device)).clamp(max=last)  # tokens L+1 .. L+a+1
        # Padding entries and rows that took no part land past the new length: overwritten later.
        self.seq.scatter_(1, cols, outcome.tokens.clamp(min=0))
        feats = self.drafter.features(outcome.hidden_states)  # [B, m, H] at positions L .. L + m - 1
        self.feats.scatter_(1, (cols - 1)[:, :, None].expand(-1, -1, feats.shape[-1]), feats)
        if draft is None:
            self.catching_up = True


def load_drafter(target, drafter=None) -> Eagle3Drafter:
    """An ``Eagle3Drafter`` bound to ``target``: a drafter, or a folder in this library's format or
    a published EAGLE-3 layout (``models.published.load_eagle3``). None: the drafter cache's for
    this target (``drafters.cached_drafter``), which raises FileNotFoundError naming the command
    that trains one; the library never takes a drafter trained for another model."""
    if drafter is None:
        from ..drafters import cached_drafter

        drafter = cached_drafter(target, "eagle3")
    if isinstance(drafter, (str, Path)):
        from ..models.published import load_eagle3

        drafter = load_eagle3(drafter)
    if not isinstance(drafter, Eagle3Drafter):
        raise TypeError(f"drafter: expected an Eagle3Drafter, a checkpoint folder or None, got {type(drafter).__name__}")
    return drafter.attach(target)


def make_eagle3_proposer(target, drafter=None, k: int = 5, tree: bool = True, depth: int = 5, topk: int = 4,
                         budget: int = 24, verification: str = "coupled") -> Eagle3Proposer:
    """The ``method="eagle3"`` proposer for ``target`` (the built-in model or ``HFCausalLM``)."""
    return Eagle3Proposer(load_drafter(target, drafter), k=k, tree=tree, depth=depth, topk=topk, budget=budget,
                          verification=verification)


register(MethodSpec(
    name="eagle3",
    summary="EAGLE-3 (Li et al. 2025): a one-layer drafter on the target's low/mid/high features, a dynamic tree "
            "or a chain",
    lossless=True,
    make=make_eagle3_proposer,
    options={
        "drafter": "an Eagle3Drafter or its folder (this library's or a published EAGLE / SpecForge layout), trained "
                   "for this target (default: the drafter cache's; `python -m specdec_cuda.train eagle3 --target DIR` "
                   "trains one)",
        "tree": "draft EAGLE-2 dynamic trees (default True); False: chains of k",
        "k": "chain length with tree=False (default 5)",
        "depth": "tree levels: the most draft tokens per path (default 5)",
        "topk": "children per expanded node and nodes expanded per level (default 4)",
        "budget": "tree nodes per row and step (default 24); budget <= depth drafts a chain of budget tokens",
        "verification": SAMPLED_VERIFICATION_OPTION + "; trees are always matched",
    },
))
