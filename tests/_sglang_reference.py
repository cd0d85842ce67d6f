"""What three ``sgl_kernel`` calls do, in plain Python: the specification the SGLang adapters meet.

Written from reading sgl-kernel's CUDA sources (``csrc/speculative/eagle_utils.cu`` and
``speculative_sampling.cuh``), one row at a time, every write spelled out. Like the kernels, each
function writes its outputs in place and leaves every entry it does not write as the caller left
it (SGLang fills ``tree_mask`` with True, or 0 when bit-packed, and the ``retrive_*`` links with
-1, before the call). Where the CUDA kernel's result is undefined (a node whose parent was not
selected: the kernel prints a warning and then writes outside the row) this reference raises.

SGLang's trees, per row of ``draft_token_num = n`` nodes (node 0 = the verified token):

* ``retrive_index[b, i]``: where node i's entries live in the flat per-token arrays
  (``predicts``, ``target_predict``); ``b * n + i`` as ``build_tree_kernel_efficient`` makes it.
* ``retrive_next_token[b, i]``: node i's first child, ``retrive_next_sibling[b, i]``: its next
  sibling (-1 when none); links are row-local node indices.
* EAGLE's drafts as ``build_tree_kernel_efficient`` reads them: ``selected_index[b, i - 1]`` is
  node i's place in the flattened score list of all draft steps (sorted ascending), whose group
  ``selected_index // topk`` names the parent: group 0 is the root's children, group g > 0 the
  children of the token at score-list place ``parent_list[b, g]``, found again among the
  selected places.
"""

from __future__ import annotations

import torch

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def eagle_parent(parent_list_row, selected_row, topk, i):
    """Node i's parent node (row-local), as the kernel finds it; None when it was not selected."""
    group = selected_row[i - 1] // topk
    if group == 0:
        return 0
    wanted = parent_list_row[group]
    for p, place in enumerate(selected_row):
        if place == wanted:
            return p + 1
    return None


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                retrive_index, retrive_next_token, retrive_next_sibling, topk,
                                depth, draft_token_num, tree_mask_mode):
    """Reference of ``sgl_kernel.build_tree_kernel_efficient`` (everything written in place).

    Shape: parent_list [bs, topk * (depth - 1) + 1]; selected_index [bs, n - 1];
    verified_seq_len [bs]; positions [bs * n]; retrive_* [bs, n]. tree_mask, flat:
    FULL_MASK bool, row b's block [n, seq_len[b] + n] after the blocks of the rows before it;
    QLEN_ONLY bool [bs, n, n]; QLEN_ONLY_BITPACKING [bs * n] items of 1, 2 or 4 bytes
    (n <= 8, <= 16, more), bit j of node i's item = node j is i or an ancestor of i.
    """
    n = draft_token_num
    bs = parent_list.shape[0]
    par = parent_list.tolist()
    sel = selected_index.tolist()
    seq = [int(s) for s in verified_seq_len.tolist()]
    item = 1 if n <= 8 else 2 if n <= 16 else 4
    flat_mask = tree_mask.view(torch.uint8) if tree_mask_mode == QLEN_ONLY_BITPACKING else tree_mask
    for b in range(bs):
        parent = [None] + [eagle_parent(par[b], sel[b], topk, i) for i in range(1, n)]
        # links: node i pushed in front of its parent's child list, i from n - 1 down to 1, so
        # every list ends up in ascending node order
        for i in range(n - 1, 0, -1):
            retrive_index[b, i] = b * n + i
            p = parent[i]
            if p is None:
                continue  # the kernel warns and leaves the node unlinked
            head = int(retrive_next_token[b, p])
            retrive_next_token[b, p] = i
            if head != -1:
                retrive_next_sibling[b, i] = head
        retrive_index[b, 0] = b * n
        for i in range(n):
            seen, v = [], i  # i and its ancestors below the root
            while v != 0:
                seen.append(v)
                v = parent[v]
                if v is None:
                    raise ValueError(f"row {b}: node {i} has an ancestor whose parent was not "
                                     "selected (sgl_kernel's result is undefined)")
            positions[b * n + i] = seq[b] + len(seen)
            if tree_mask_mode == QLEN_ONLY_BITPACKING:
                base = (b * n + i) * item
                flat_mask[base] = 1  # assigned, not or-ed: the root's bit
                for v in seen:
                    flat_mask[base + v // 8] |= 1 << (v % 8)
                continue
            if tree_mask_mode == FULL_MASK:
                base = n * n * b + n * sum(seq[:b]) + (seq[b] + n) * i + seq[b]
            else:
                base = n * n * b + n * i
            flat_mask[base] = True
            for j in range(1, n):
                flat_mask[base + j] = j in seen


def _walk_links(next_token, next_sibling, b, cur):
    """The children of node cur in list order (row b)."""
    child = int(next_token[b, cur])
    while child != -1:
        yield child
        child = int(next_sibling[b, child])


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict):
    """Reference of ``sgl_kernel.verify_tree_greedy``.

    Shape: predicts [T] int32 (indexed by retrive_index); accept_index [bs, num_spec_step] int32;
    accept_token_num [bs] int32; candidates, retrive_*, target_predict [bs, n] int64.
    Per row: from the root, take the first child in list order whose candidate equals the
    target's prediction at the current node, at most num_spec_step - 1 times; predicts at each
    accepted node's parent gets that token, predicts at the last node its own prediction.
    """
    flat_predict = target_predict.reshape(-1)
    steps = accept_index.shape[1]
    for b in range(candidates.shape[0]):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            nxt = None
            for child in _walk_links(retrive_next_token, retrive_next_sibling, b, cur):
                if int(candidates[b, child]) == int(flat_predict[last]):
                    nxt = child
                    break
            if nxt is None:
                break
            predicts[last] = int(flat_predict[last])
            accepted += 1
            last = int(retrive_index[b, nxt])
            accept_index[b, accepted] = last
            cur = nxt
        accept_token_num[b] = accepted
        predicts[last] = int(flat_predict[last])


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates,
                                          retrive_index, retrive_next_token, retrive_next_sibling,
                                          uniform_samples, uniform_samples_for_final_sampling,
                                          target_probs, draft_probs, threshold_single=1.0,
                                          threshold_acc=1.0):
    """Reference of ``sgl_kernel.tree_speculative_sampling_target_only`` (SGLang's own draws).

    Shape: as verify_tree_greedy, plus uniform_samples [bs, n], uniform_samples_for_final_sampling
    [bs], target_probs / draft_probs [bs, n, d] float32 (draft_probs zeros from the caller, used
    as scratch: a rejected child's target probability is written there).
    Per node: one coin u = uniform_samples[b, node]; the children are tried in list order and
    child c accepted when ``u <= sum of p(tried children, c included) / threshold_acc`` or
    ``p(c) >= threshold_single``. When none is (or num_spec_step - 1 were accepted) one token is
    drawn by inverse CDF with uniform_samples_for_final_sampling[b] from ``max(p - draft_probs,
    0)`` (from p when the walk stopped at num_spec_step - 1). Thresholds of 1 make this "y ~ p
    by inverse CDF, follow the child whose token is y": lossless for distinct sibling tokens.
    """
    steps = accept_index.shape[1]
    acc_threshold = max(float(threshold_acc), 1e-9)
    for b in range(candidates.shape[0]):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        coin = float(uniform_samples[b, 0])
        for _ in range(1, steps):
            nxt, mass = None, 0.0
            for child in _walk_links(retrive_next_token, retrive_next_sibling, b, cur):
                token = int(candidates[b, child])
                p = float(target_probs[b, cur, token])
                mass += p
                if coin <= mass / acc_threshold or p >= threshold_single:
                    nxt = child
                    break
                draft_probs[b, cur, token] = target_probs[b, cur, token]
            if nxt is None:
                break
            predicts[last] = int(candidates[b, nxt])
            accepted += 1
            last = int(retrive_index[b, nxt])
            accept_index[b, accepted] = last
            cur, coin = nxt, float(uniform_samples[b, nxt])
        accept_token_num[b] = accepted
        p = target_probs[b, cur].double()
        q = draft_probs[b, cur].double() if accepted != steps - 1 else torch.zeros_like(p)
        residual = torch.clamp(p - q, min=0.0)
        u = float(uniform_samples_for_final_sampling[b]) * float(residual.sum())
        cdf = torch.cumsum(residual, 0)
        hits = torch.nonzero((cdf > u) & (residual > 0)).flatten()
        predicts[last] = int(hits[0]) if hits.numel() else p.numel() - 1
