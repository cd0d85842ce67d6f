"""DDTree (Ringel & Romano 2026): the DFlash drafter's block distributions turned into the best
draft tree under a node budget.

One drafter forward per step (as DFlash) gives q_1 .. q_D, the distributions of the next D tokens
(D = the row's granted depth, at most ``block_size - 1``). Per depth the top-K log-probabilities
(K = min(budget, V); at T > 0 of the temperature-scaled q) go to ``ops.ddtree_build``, which picks
the ``budget`` most probable prefixes of the factorised draft distribution with a best-first heap,
in one batched call: the tree of the largest expected accepted length under that distribution.

The tree's tokens are deterministic guesses (``DraftKind.GUESS``): greedy tree verification at
T = 0, sample-and-match over the tree at T > 0; lossless either way. The drafter's context cache
follows the accepted path exactly as for DFlash (``DFlashBase``).
"""

from __future__ import annotations

import torch

from .. import ops
from ..contract import Draft, DraftKind, StepState
from ..methods import MethodSpec, register
from .dflash import DRAFT_VOCAB_OPTION, DFlashBase, draft_vocab_of, load_drafter


class DDTreeProposer(DFlashBase):
    """Trees of at most ``budget`` nodes, at most ``block_size - 1`` deep (module docstring)."""

    def __init__(self, drafter, budget: int = 16, block_size: int | None = None, trim_block: bool = True,
                 vocab=None) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be an int >= 1 (draft nodes per row), got {budget!r}")
        super().__init__(drafter, block_size, trim_block, vocab)
        self.budget = budget
        self.vocab_size = drafter.config.vocab_size if vocab is None else len(vocab)
        self._kept: ops.ddtree.DDTree | None = None  # ddtree_build's outputs no Draft holds (_tree_outputs)

    def max_pending_tokens(self) -> int:
        return self.budget

    def matches_samples(self) -> bool:
        return True  # a tree of guesses, sample-and-match at T > 0

    def propose(self, state: StepState) -> Draft | None:
        limit, depth = state.draft_limits(self.max_draft)  # [B] tree depth
        if depth == 0:
            return None
        one_time = self.catch_up()
        K = min(self.budget, self.vocab_size)
        if self.all_greedy:  # q itself (T = 1): ranked in the drafter's head op where it can
            values, ids = self.block_topk(state, depth, K)  # [B, D, K]
            # finite (draft_topk raises on non-finite logits): ddtree_build's own scan for them (a
            # read of its status, ~5 us in a decoding run) is skipped
            check = False
        else:  # each row's q at its temperature (greedy rows: T = 1)
            # [B, D, V], or [B, D, N] over a draft vocabulary: q renormalised over it (0 elsewhere)
            logits = self.block_logits(state, depth).float()
            temperature = state.params.temperature.to(logits.device)
            logits = logits / torch.where(temperature > 0, temperature, torch.ones_like(temperature))[:, None, None]
            values, index = torch.log_softmax(logits, dim=-1).topk(K, dim=-1)
            ids = self.draft_ids(index)
            check = True
        tree = ops.ddtree_build(values, ids, limit, self.budget, check=check,
                                out=self._tree_outputs(values.shape[0], values.device))
        return Draft(tree.tokens, tree.num_nodes, DraftKind.GUESS, parents=tree.parents, one_time_seconds=one_time)

    def _tree_outputs(self, batch: int, device: torch.device) -> ops.ddtree.DDTree:
        """``ddtree_build``'s outputs: new tokens, parents and node counts (the Draft's, which a
        caller may hold past the next step), the depth, tree mask and status of the last call of
        this batch size reused (nothing reads them after the build)."""
        kept = self._kept
        if kept is None or kept.status.shape[0] != batch or kept.status.device != device:
            kept = self._kept = ops.ddtree.ddtree_outputs(batch, self.budget, device)
        M = self.budget
        return kept._replace(tokens=torch.empty(batch, M, dtype=torch.int64, device=device),
                             parents=torch.empty(batch, M, dtype=torch.int64, device=device),
                             num_nodes=torch.empty(batch, dtype=torch.int64, device=device))


def make_ddtree_proposer(target, drafter=None, budget: int = 16, block_size: int | None = None,
                         trim_block: bool = True, draft_vocab=None) -> DDTreeProposer:
    """The ``method="ddtree"`` proposer for ``target``."""
    drafter = load_drafter(target, drafter)
    return DDTreeProposer(drafter, budget=budget, block_size=block_size, trim_block=trim_block,
                          vocab=draft_vocab_of(target, drafter, draft_vocab))


register(MethodSpec(
    name="ddtree",
    summary="DDTree (Ringel & Romano 2026): the DFlash drafter's best draft tree under a node budget",
    lossless=True,
    make=make_ddtree_proposer,
    options={
        "drafter": "a DFlashDrafter or its checkpoint folder, trained for this target",
        "budget": "draft nodes per row and step, M (default 16: the fastest on the zoo target, batch 1, CPU)",
        "block_size": "drafter block length; the tree is at most block_size - 1 deep (default: the drafter's)",
        "trim_block": "True (default): a step granted a shallower tree runs only the root and that many masks "
                      "through the drafter; False: always the whole block",
        "draft_vocab": DRAFT_VOCAB_OPTION,
    },
))
