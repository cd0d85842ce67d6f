"""Plain-Python reference of the DDTree build (the specification of ``ops.ddtree_build``).

Per row: best-first search with a heap over prefixes of the factorised draft distribution (see
``csrc/kernels/ddtree/ddtree.h``). Pop the most probable prefix and make it a node; push its next
sibling (same parent, next rank of the same depth) and its first child (next depth, rank 0); stop
at ``budget`` nodes. Scores are summed in Python floats (double) in the kernel's order; ties pop
in push order. The nodes are then numbered in BFS order, children in rank order.
"""

from __future__ import annotations

import heapq

import torch

from ..ops.status import STATUS_NONFINITE_LOGITS


def ddtree_build_row(logprobs: list[list[float]], tokens: list[list[int]], max_depth: int, budget: int):
    """One row. logprobs / tokens: [D][K]. Returns (tokens, parents, depths) lists of the nodes in
    BFS order (parents: 0 = root, i + 1 = node i), or None for a row with NaN / +inf log-probs."""
    D = len(logprobs)
    K = len(logprobs[0]) if D else 0
    limit = max(0, min(max_depth, D))
    if any(x != x or x == float("inf") for r in logprobs[:limit] for x in r):
        return None
    heap, counter, nodes = [], 0, []  # nodes in pop order: (parent pop index or -1, depth, rank)
    if limit > 0 and K > 0 and budget > 0:
        heap.append((-float(logprobs[0][0]), 0, 1, 0, -1, 0.0))
        counter = 1
    while heap and len(nodes) < budget:
        neg, _, d, r, parent, pscore = heapq.heappop(heap)
        score = -neg
        nodes.append((parent, d, r))
        if len(nodes) == budget:
            break
        if r + 1 < K:
            heapq.heappush(heap, (-(pscore + float(logprobs[d - 1][r + 1])), counter, d, r + 1, parent, pscore))
            counter += 1
        if d < limit:
            heapq.heappush(heap, (-(score + float(logprobs[d][0])), counter, d + 1, 0, len(nodes) - 1, score))
            counter += 1
    children: dict[int, list[int]] = {}
    for i, (parent, _, _) in enumerate(nodes):
        children.setdefault(parent, []).append(i)  # pop order = rank order among siblings
    order = list(children.get(-1, []))
    for v in order:  # grows while iterated: BFS
        order.extend(children.get(v, []))
    index = {v: j for j, v in enumerate(order)}
    out_tokens = [tokens[nodes[v][1] - 1][nodes[v][2]] for v in order]
    out_parents = [0 if nodes[v][0] < 0 else index[nodes[v][0]] + 1 for v in order]
    out_depths = [nodes[v][1] for v in order]
    return out_tokens, out_parents, out_depths


def ddtree_build(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, max_depth: torch.Tensor, budget: int):
    """Batched reference. Shapes as ``ops.ddtree_build``: [B, D, K] inputs, max_depth [B]; returns
    tokens, parents, depth [B, M]; num_nodes [B]; tree_mask [B, M + 1, M + 1] bool; status [B]."""
    B = topk_logprobs.shape[0]
    M = budget
    tokens = torch.zeros(B, M, dtype=torch.int64)
    parents = torch.zeros(B, M, dtype=torch.int64)
    depth = torch.full((B, M), -1, dtype=torch.int64)
    num_nodes = torch.zeros(B, dtype=torch.int64)
    status = torch.zeros(B, dtype=torch.int32)
    mask = torch.eye(M + 1, dtype=torch.bool).repeat(B, 1, 1)
    lp, tk = topk_logprobs.double().tolist(), topk_tokens.tolist()
    for b in range(B):
        row = ddtree_build_row(lp[b], tk[b], int(max_depth[b]), M)
        if row is None:
            status[b] = STATUS_NONFINITE_LOGITS
            continue
        t, p, d = row
        n = len(t)
        num_nodes[b] = n
        tokens[b, :n], parents[b, :n], depth[b, :n] = torch.tensor(t), torch.tensor(p), torch.tensor(d)
        for i in range(1, n + 1):  # node i sees the root, its ancestors and itself
            mask[b, i, 0] = True
            mask[b, i] |= mask[b, p[i - 1]]
    return tokens, parents, depth, num_nodes, mask, status
