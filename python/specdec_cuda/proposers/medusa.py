"""Medusa heads (Cai et al. 2024): ``method="medusa"``, drafts from K heads on the target itself.

No second model: K residual SiLU heads (``models.heads.MedusaHeads``) read the target's final
normed hidden state at the newest position the target has seen (``t = lengths - 1``, the node
whose logits gave the root) and head i guesses the token at ``t + 1 + i``, i.e. draft depth i.
Every head shares the target's frozen final norm and LM head; the candidates come out of the
fused ``ops.mtp_head_topk`` (norm + LM head + top-k, no ``[M, V]`` logits written).

Draft shapes:

* chain (``tree=None`` and ``budget=None``): the top-1 candidate of each head;
* static sparse tree: node = a path of per-depth candidate ranks, e.g. ``(0, 2)`` = head 1's
  best candidate followed by head 2's third. ``budget`` picks the ``budget`` paths of highest
  estimated acceptance, the product over the path of each head's measured rank accuracy
  (``MedusaHeads.topk_accuracy``, from held-out data; Medusa's way of choosing its tree), or
  ``tree`` gives the paths explicitly.

Candidates are deterministic guesses (``DraftKind.GUESS``): greedy verification at T = 0,
sample-and-match at T > 0, lossless both; ``verification="typical"`` (chains only) is Medusa's
typical acceptance, LOSSY. The proposer's only state is each row's hidden state at its last
committed position, refreshed in ``accept`` from the hidden states along the accepted path.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch

from ..contract import Draft, DraftKind, Outcome, PrefillContext, Proposer, StepState
from ..methods import MethodSpec, register
from ..models.heads import MedusaHeads, TargetHead, target_head
from ..models.published import load_heads

VERIFICATION_MODES = ("match", "typical")
TOPK_PER_HEAD = 10  # candidate ranks a static tree may use per head


HEADS_DRAFT_VOCAB_OPTION = ("the LM head over part of the vocabulary when drafting (FR-Spec): an int n (ids 0 .. n-1) or "
                            "token ids; other tokens are never drafted (default: the whole vocabulary)")


def default_topk_accuracy(num_heads: int, topk: int = TOPK_PER_HEAD) -> list[list[float]]:
    """A prior for heads without measurements: rank r of head i right with 0.6^i * 0.5^(r+1)."""
    return [[0.6 ** (i + 1) * 0.5 ** (r + 1) for r in range(topk)] for i in range(num_heads)]


def static_tree(topk_accuracy: Sequence[Sequence[float]], budget: int) -> list[tuple[int, ...]]:
    """The ``budget`` rank paths of highest estimated acceptance, in BFS order.

    ``topk_accuracy[i][r]``: the probability that head ``i``'s rank-``r`` candidate is the target's
    token at depth ``i + 1``. A path's estimate is the product along it, so a child never beats
    its parent and best-first expansion yields a prefix-closed tree.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1 tree nodes, got {budget}")
    depth = len(topk_accuracy)
    heap = [(-float(p), (r,)) for r, p in enumerate(topk_accuracy[0])]
    heapq.heapify(heap)
    paths: list[tuple[int, ...]] = []
    while heap and len(paths) < budget:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        if len(path) < depth:
            for r, p in enumerate(topk_accuracy[len(path)]):
                heapq.heappush(heap, (neg * float(p), path + (r,)))
    return sorted(paths, key=lambda p: (len(p), p))


class MedusaProposer(Proposer):
    """Chains or static trees of Medusa head candidates (see the module docstring).

    Parameters
    ----------
    head : the target's shared embeddings / final norm / LM head (``models.heads.target_head``).
    heads : ``MedusaHeads`` on the target's hidden size, in the target's dtype and device.
    tree : rank paths (tuples) of a static tree, or None.
    budget : tree nodes chosen from ``heads.topk_accuracy`` (or a prior), or None.
    verification : ``"match"`` (lossless) or ``"typical"`` (LOSSY, chains only).
    """

    hidden_layers = (-1,)

    def __init__(self, head: TargetHead, heads: MedusaHeads, tree: Sequence[Sequence[int]] | None = None,
                 budget: int | None = None, verification: str = "match") -> None:
        if verification not in VERIFICATION_MODES:
            raise ValueError(f"verification must be one of {VERIFICATION_MODES}, got {verification!r}")
        if heads.hidden_size != head.norm_weight.shape[0]:
            raise ValueError(f"the heads' hidden size ({heads.hidden_size}) differs from the target's "
                             f"({head.norm_weight.shape[0]})")
        if tree is not None and budget is not None:
            raise ValueError("give tree= or budget=, not both")
        if budget is not None:
            accuracy = heads.topk_accuracy or default_topk_accuracy(heads.num_heads)
            tree = static_tree(accuracy, budget)
        if tree is not None:
            tree = sorted((tuple(int(r) for r in p) for p in tree), key=lambda p: (len(p), p))
            if not tree or any(len(p) == 0 or len(p) > heads.num_heads or min(p) < 0 for p in tree):
                raise ValueError(f"tree paths must be non-empty rank tuples of at most {heads.num_heads} "
                                 f"non-negative ranks, got {tree}")
            index = {p: j for j, p in enumerate(tree)}
            missing = [p for p in tree if len(p) > 1 and p[:-1] not in index]
            if missing:
                raise ValueError(f"tree paths must be prefix-closed; the parent of {missing[0]} is missing")
            if verification == "typical":
                raise ValueError("typical acceptance is defined for chains only (tree=None, budget=None)")
        if tree is not None and head.vocab is not None and 1 + max(max(p) for p in tree) > len(head.vocab):
            raise ValueError(f"the tree ranks {1 + max(max(p) for p in tree)} candidates per head, more than the "
                             f"draft vocabulary's {len(head.vocab)} tokens")
        self.head, self.heads, self.tree = head, heads, tree
        self.kind = DraftKind.TYPICAL if verification == "typical" else DraftKind.GUESS
        device = head.lm_head.device
        if tree is None:
            self.max_draft, self.topk = heads.num_heads, 1
        else:
            self.max_draft = max(len(p) for p in tree)
            self.topk = 1 + max(max(p) for p in tree)
            # Per node: its parent's node index (0 = root), depth (1-based) and candidate rank.
            self.tree_parents = torch.tensor([0 if len(p) == 1 else 1 + index[p[:-1]] for p in tree],
                                             dtype=torch.int64, device=device)
            self.tree_depth = torch.tensor([len(p) for p in tree], dtype=torch.int64, device=device)
            self.tree_rank = torch.tensor([p[-1] for p in tree], dtype=torch.int64, device=device)

    def max_pending_tokens(self) -> int:
        return self.max_draft if self.tree is None else len(self.tree)

    def prefill(self, ctx: PrefillContext) -> None:
        hidden = ctx.hidden_states[-1]  # [B, P, H]
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        self.hidden = hidden[rows, ctx.prompt_lens - 1]  # [B, H]: the position that gave the root

    def candidates(self, depth: int) -> torch.Tensor:
        """Top-``self.topk`` tokens of heads 1..depth. Shape: [B, depth, topk] int64."""
        return self.heads.candidates(self.hidden, depth, self.topk, self.head)

    def propose(self, state: StepState) -> Draft | None:
        limit, most = state.draft_limits()  # [B]
        depth = min(most, self.max_draft)
        if depth == 0:
            return None
        cand = self.candidates(depth)  # [B, depth, topk]
        if self.tree is None:
            return Draft(cand[:, :, 0].contiguous(), limit.clamp(max=depth), self.kind)
        # Nodes deeper than a row's limit form a BFS suffix: cutting num_nodes prunes them.
        keep = self.tree_depth <= depth
        d, r, parents = self.tree_depth[keep], self.tree_rank[keep], self.tree_parents[keep]
        tokens = cand[:, d - 1, r]  # [B, n]
        num_nodes = (self.tree_depth[None, keep] <= limit[:, None]).sum(1)
        B = tokens.shape[0]
        return Draft(tokens, num_nodes, self.kind, parents=parents.expand(B, -1).contiguous())

    def matches_samples(self) -> bool:
        return self.kind is DraftKind.GUESS  # "match": sample-and-match; "typical" accepts by a threshold

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        hidden = outcome.hidden_states[-1]  # [B, m, H] along the accepted path, root first
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        newest = hidden[rows, outcome.num_accepted]  # the last accepted node: it gave the next root
        self.hidden = torch.where(outcome.active[:, None], newest, self.hidden)


def heads_target_head(target, w4_lm_head: bool, draft_vocab) -> TargetHead:
    """The target's head as the heads draft through it: a 4-bit copy (``w4_lm_head``), or over a
    draft vocabulary (``draft_vocab``: FR-Spec, an int n for ids 0 .. n - 1 or token ids; tokens
    outside it are never drafted), or as it is."""
    head = target_head(target)
    if w4_lm_head and draft_vocab is not None:
        raise ValueError("give w4_lm_head or draft_vocab, not both (each is a cheaper LM head for the drafts)")
    if w4_lm_head:
        head.use_w4()
    if draft_vocab is not None:
        from ..models.draft_vocab import target_vocab_subset

        head.vocab = target_vocab_subset(target, draft_vocab, head.lm_head)
    return head


def resolve_heads(target, heads, kind: str):
    """``heads`` as a module in the target's dtype and device: a module or a folder. Checks that
    its kind and hidden size fit the target. None: the heads the drafter cache holds for this
    target (``drafters``), else FileNotFoundError naming the train command; the library never
    guesses heads trained for another model."""
    from pathlib import Path

    from ..drafters import cached_drafter
    from ..models.heads import MTPModules

    if heads is None:
        heads = cached_drafter(target, kind)
    if isinstance(heads, (str, Path)):
        heads = load_heads(heads, dtype=target.dtype, device=target.device)
    want = MedusaHeads if kind == "medusa" else MTPModules
    if not isinstance(heads, want):
        raise TypeError(f"heads for method {kind!r} must be {want.__name__} (or its folder), got {type(heads).__name__}")
    return heads.to(dtype=target.dtype, device=target.device)


def make_medusa_proposer(target, heads=None, tree=None, budget: int | None = None,
                         verification: str = "match", w4_lm_head: bool = False, draft_vocab=None) -> MedusaProposer:
    """The ``method="medusa"`` proposer for ``target`` (built-in model or ``HFCausalLM``)."""
    head = heads_target_head(target, w4_lm_head, draft_vocab)
    heads = resolve_heads(target, heads, "medusa")
    return MedusaProposer(head, heads, tree=tree, budget=budget, verification=verification)


register(MethodSpec(
    name="medusa",
    summary="Medusa heads on the target (Cai et al.): per-head top-k candidates as a chain or a static tree",
    lossless=True,
    make=make_medusa_proposer,
    options={
        "heads": "MedusaHeads or a heads folder, trained for this target",
        "tree": "static tree as rank paths, e.g. [(0,), (1,), (0, 0)] (default: a chain of top-1 candidates)",
        "budget": "tree nodes chosen from the heads' measured top-k accuracy (16 / 32 / 64; default: chain)",
        "verification": '"match" (greedy / sample-and-match, lossless; default) or "typical" (LOSSY, chains)',
        "w4_lm_head": "draft through a 4-bit copy of the LM head (CPU; default False; verification unchanged)",
        "draft_vocab": HEADS_DRAFT_VOCAB_OPTION,
    },
))
