"""``ddtree_build``: the best draft tree under a node budget (DDTree, Ringel & Romano 2026).

A block drafter (DFlash) gives one distribution per depth; DDTree takes per depth the top-K
log-probabilities and builds the tree of the ``budget`` most probable prefixes with a best-first
heap: pop the most probable prefix, push its next sibling and its first child. For the factorised
draft distribution that is the tree of the largest expected accepted length. One call builds the
trees of the whole batch (CPU: rows over threads; CUDA: one thread block per row); the plain-Python
heap in :mod:`specdec_cuda.reference.ddtree` is the specification, node for node.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _native  # noqa: F401  (registers torch.ops.specdec)
from . import args
from .status import describe, flagged_rows

__all__ = ["DDTree", "ddtree_build", "ddtree_outputs"]


class DDTree(NamedTuple):
    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    num_nodes: torch.Tensor
    tree_mask: torch.Tensor
    status: torch.Tensor


def ddtree_build(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, max_depth, budget: int, *,
                 check: bool = True, out: DDTree | None = None) -> DDTree:
    """Build each row's best draft tree of at most ``budget`` nodes.

    Parameters
    ----------
    topk_logprobs : the drafter's top-K log-probabilities per depth, sorted descending along K.
    topk_tokens : their token ids.
    max_depth : deepest node per row (an int for every row, or per row); <= 0: an empty tree.
        Depths past ``D`` are clamped to ``D``.
    budget : M, the most nodes per row (the root not counted).
    check : raise ``ValueError`` naming the rows with NaN / +inf log-probs (reads ``status``, a
        device sync); pass False inside CUDA graphs and read ``status`` yourself.
    out : the six output tensors to write instead of new ones (a ``DDTree`` of the shapes below,
        contiguous, on the inputs' device; the op checks them): a caller building a tree every
        step keeps those it does not hand on (six allocations were ~20 us of a ~60 us call).

    Shape:
        topk_logprobs: [B, D, K] float32 (other float dtypes are converted).
        topk_tokens: [B, D, K] int64.
        max_depth: [B] int64 (or an int).
        Returns, freshly allocated on the inputs' device (``out``'s tensors when given):
        tokens [B, M] int64, draft node ``j`` of row ``b`` in BFS order (children in rank order),
        padded with 0; parents [B, M] int64, ``0`` = the root, ``i + 1`` = node ``i``
        (``parents[b, j] <= j``), padded with 0 (``Draft.parents``); depth [B, M] int64 (1 .. D),
        padded with -1; num_nodes [B] int64; tree_mask [B, M + 1, M + 1] bool, entry ``(i, j)``:
        node ``j`` is node ``i`` or one of its ancestors (index 0 = the root, ``i`` = draft node
        ``i - 1``; padded rows see only themselves); status [B] int32 (0, or
        ``STATUS_NONFINITE_LOGITS`` for a row with NaN / +inf log-probs: that row gets no nodes).

    Example:
        >>> import torch, specdec_cuda.ops as ops
        >>> lp = torch.log(torch.tensor([[[0.6, 0.3], [0.9, 0.1]]]))   # depth 1: 0.6 / 0.3, depth 2: 0.9 / 0.1
        >>> tok = torch.tensor([[[5, 7], [8, 9]]])
        >>> tree = ops.ddtree.ddtree_build(lp, tok, max_depth=2, budget=3)
        >>> tree.tokens.tolist(), tree.parents.tolist()               # 5, 7 under the root; 8 under 5
        ([[5, 7, 8]], [[0, 0, 1]])
    """
    if topk_logprobs.dim() != 3:
        raise ValueError(f"topk_logprobs must have shape [B, D, K], got {tuple(topk_logprobs.shape)}")
    if tuple(topk_tokens.shape) != tuple(topk_logprobs.shape):
        raise ValueError(f"topk_tokens {tuple(topk_tokens.shape)} must have the shape of topk_logprobs "
                         f"{tuple(topk_logprobs.shape)}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget must be an int >= 0, got {budget!r}")
    B, device = topk_logprobs.shape[0], topk_logprobs.device
    lp, tok = topk_logprobs, topk_tokens
    if lp.dtype != torch.float32 or not lp.is_contiguous():  # the checks cost less than the no-op calls
        lp = lp.to(torch.float32).contiguous()
    if tok.dtype != torch.int64 or not tok.is_contiguous():
        tok = tok.to(torch.int64).contiguous()
    max_depth = args.per_row(max_depth, "max_depth", B, torch.int64, device)
    if out is None:
        out = ddtree_outputs(B, budget, device)
    torch.ops.specdec.ddtree_build(lp, tok, max_depth, budget, *out)
    if check and not torch.compiler.is_compiling():
        bad = flagged_rows(out.status)
        if bad:
            row, code = bad[0]
            raise ValueError(f"ddtree_build: row {row}: {describe(code)} in topk_logprobs "
                             f"(rows flagged: {[r for r, _ in bad]})")
    return out


def ddtree_outputs(batch: int, budget: int, device=None) -> DDTree:
    """Uninitialised outputs of ``ddtree_build`` for ``batch`` rows of at most ``budget`` nodes
    (its ``out``): tokens, parents, depth [B, M] int64, num_nodes [B] int64, tree_mask
    [B, M + 1, M + 1] bool, status [B] int32."""
    M = budget
    return DDTree(torch.empty(batch, M, dtype=torch.int64, device=device),
                  torch.empty(batch, M, dtype=torch.int64, device=device),
                  torch.empty(batch, M, dtype=torch.int64, device=device),
                  torch.empty(batch, dtype=torch.int64, device=device),
                  torch.empty(batch, M + 1, M + 1, dtype=torch.bool, device=device),
                  torch.empty(batch, dtype=torch.int32, device=device))


@torch.library.register_fake("specdec::ddtree_build")
def _ddtree_build_fake(topk_logprobs, topk_tokens, max_depth, budget, tokens, parents, depth, num_nodes,
                       tree_mask, status):
    return None
