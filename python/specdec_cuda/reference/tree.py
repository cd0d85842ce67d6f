"""Plain-PyTorch specification of the tree ops: ``build_tree``, ``verify_tree``, ``compact_kv``.

Slow on purpose: one row at a time, every step spelled out. The kernels must produce the same
integers (and the same mask values) given the same inputs and the same random draws.

Tree layout (shared by every op)
--------------------------------
A batch of ``B`` trees is flattened: row ``b`` owns nodes ``cu_num_nodes[b] .. cu_num_nodes[b+1]-1``
of the flat arrays (``parents``, ``draft_tokens``, ``target_logits`` when 2-D). Inside a row nodes
are numbered ``0 .. n_b - 1``; ``parents`` holds row-local indices. Node 0 is the root, the last
committed token (its KV is not in the cache yet), with parent -1; every other node has
``0 <= parent < own index`` (BFS order satisfies this; it is all that is required). Depth is then
bounded by ``n_b - 1``. A row breaking any of this is *malformed* (status 4).

Padded ``[B, max_nodes, ...]`` outputs put node ``v`` of row ``b`` at ``[b, v]``.
``cache_len[b]`` is the number of tokens of row ``b`` already in its KV cache; the root sits at
position ``cache_len[b]`` and node ``v`` at ``cache_len[b] + depth[v]``.
"""

from __future__ import annotations

import torch

from .philox import Purpose, uniform
from .sampling import (RowError, STATUS_DRAFT_OUT_OF_RANGE, STATUS_OK, check_params, greedy_token,
                       probs_of, race, residual_race, scaled_logits)

STATUS_MALFORMED_TREE = 4


def tree_problem(parents: list[int], max_nodes: int | None = None) -> str | None:
    """Why one row's parent list is not a tree (None when it is)."""
    n = len(parents)
    if n == 0:
        return "it has no node (node 0, the root, is required)"
    if max_nodes is not None and n > max_nodes:
        return f"it has {n} nodes, more than max_nodes={max_nodes}"
    if parents[0] != -1:
        return f"the root (node 0) has parent {parents[0]}, expected -1"
    for v in range(1, n):
        if not (0 <= parents[v] < v):
            return f"node {v} has parent {parents[v]}, expected 0 <= parent < {v}"
    return None


def _rows(cu_num_nodes: torch.Tensor) -> list[tuple[int, int]]:
    cu = [int(c) for c in cu_num_nodes]
    return [(cu[b], cu[b + 1]) for b in range(len(cu) - 1)]


def build_tree(parents, cu_num_nodes, cache_len, max_nodes, hf_mask_dtype=None, max_prefix=0):
    """Reference of ``specdec_cuda.ops.build_tree``; returns a dict of the outputs.

    Shape: parents [N]; cu_num_nodes [B + 1]; cache_len [B].
    depth, positions, first_child, next_sibling [B, M] int64 (M = max_nodes; pads: -1, except
    positions padded with cache_len[b]); tree_mask [B, M, M] bool (mask[b, i, j]: node j is an
    ancestor of node i or i itself; padded rows see only themselves); packed_mask [B, M, ceil(M/8)]
    uint8 (bit j % 8 of byte j // 8 = tree_mask[b, i, j]); hf_mask [B, 1, M, max_prefix + M] in
    hf_mask_dtype (0 visible, finfo.min hidden; key j < max_prefix is prefix slot j, visible iff
    j < cache_len[b]; key max_prefix + k is tree node k as in tree_mask); status [B] int32.
    """
    rows = _rows(cu_num_nodes)
    batch, m = len(rows), max_nodes
    out = {
        "depth": torch.full((batch, m), -1, dtype=torch.int64),
        "positions": cache_len.to(torch.int64).cpu().reshape(batch, 1).repeat(1, m),
        "tree_mask": torch.eye(m, dtype=torch.bool).repeat(batch, 1, 1),
        "first_child": torch.full((batch, m), -1, dtype=torch.int64),
        "next_sibling": torch.full((batch, m), -1, dtype=torch.int64),
        "status": torch.zeros(batch, dtype=torch.int32),
    }
    for b, (lo, hi) in enumerate(rows):
        par = parents[lo:hi].tolist()
        # cache_len: >= 0, positions cache_len + depth inside int64, and inside the HF mask's prefix
        bad_prefix = not 0 <= int(cache_len[b]) <= 2**63 - 1 - m or (
            hf_mask_dtype is not None and int(cache_len[b]) > max_prefix)
        if tree_problem(par, max_nodes) is not None or bad_prefix:
            out["status"][b] = STATUS_MALFORMED_TREE
            continue
        for v, p in enumerate(par):
            depth = 0 if p < 0 else int(out["depth"][b, p]) + 1
            out["depth"][b, v] = depth
            out["positions"][b, v] = int(cache_len[b]) + depth
            if p >= 0:  # ancestors of v = ancestors of its parent, plus v itself
                out["tree_mask"][b, v] = out["tree_mask"][b, p]
                out["tree_mask"][b, v, v] = True
                if out["first_child"][b, p] < 0:
                    out["first_child"][b, p] = v
                later = [c for c in range(v + 1, len(par)) if par[c] == p]
                out["next_sibling"][b, v] = later[0] if later else -1
    bits = out["tree_mask"].reshape(batch, m, m)
    pad = (-m) % 8
    bits = torch.nn.functional.pad(bits, (0, pad)).reshape(batch, m, -1, 8).to(torch.int32)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.int32)  # little-endian bits
    out["packed_mask"] = (bits * weights).sum(-1).to(torch.uint8)
    if hf_mask_dtype is not None:
        visible = torch.zeros(batch, m, max_prefix + m, dtype=torch.bool)
        for b in range(batch):
            if out["status"][b] == STATUS_OK:
                visible[b, :rows[b][1] - rows[b][0], :int(cache_len[b])] = True
        visible[:, :, max_prefix:] = out["tree_mask"]
        hidden = torch.tensor(torch.finfo(hf_mask_dtype).min, dtype=hf_mask_dtype)
        out["hf_mask"] = torch.where(visible, torch.zeros((), dtype=hf_mask_dtype), hidden)[:, None]
    return out


def _children(par: list[int], v: int) -> list[int]:
    return [c for c in range(v + 1, len(par)) if par[c] == v]


def _verify_row(tokens, par, target, draft, temperature, top_k, top_p, seed, position):
    """One row of verify_tree.  Returns (path of node indices, tokens to commit)."""
    check_params(temperature, top_p)
    vocab = target.shape[-1]
    if any(not (0 <= t < vocab) for t in tokens[1:]):
        raise RowError(STATUS_DRAFT_OUT_OF_RANGE)
    path, out, v, depth = [0], [], 0, 0
    while True:
        pos = position + depth  # absolute position of the token decided at node v
        kids = _children(par, v)
        if temperature == 0.0:  # greedy: follow the first child equal to the argmax
            best = greedy_token(target[v])
            nxt = next((c for c in kids if tokens[c] == best), None)
            if nxt is None:
                return path, out + [best]
        elif draft is None:
            # One-hot drafts: y ~ p by the Gumbel race; follow the first child whose token is y.
            # This is "try the distinct children in turn, accept x w.p. p(x) under p with the
            # rejected tokens removed, finally sample from what remains" in closed form: the i-th
            # distinct child is taken w.p. p(x_i) and a non-child y is emitted w.p. p(y).
            y = race(scaled_logits(target[v], temperature, top_k, top_p), seed, pos, Purpose.SAMPLE)
            nxt = next((c for c in kids if tokens[c] == y), None)
            if nxt is None:
                return path, out + [y]
        else:
            s = scaled_logits(target[v], temperature, top_k, top_p)
            if not kids:  # leaf: bonus token from p
                return path, out + [race(s, seed, pos, Purpose.SAMPLE)]
            # SpecInfer multi-step speculative sampling; children were drawn i.i.d. from q.
            p = probs_of(s)
            q = probs_of(scaled_logits(draft[v], temperature, top_k, top_p))
            nxt = None
            for attempt, c in enumerate(kids):
                x = tokens[c]
                u = torch.tensor(float(uniform(seed, pos, Purpose.ACCEPT, attempt)))
                if u * q[x] < p[x]:  # accept w.p. min(1, p(x) / q(x)); strict: p(x) = 0 never
                    nxt = c
                    break
                if attempt == len(kids) - 1:
                    # all rejected: sample max(0, p - q) (p if that is zero), unnormalised
                    return path, out + [residual_race(p, q, seed, pos)]
                r = torch.clamp(p - q, min=0.0)
                total = r.sum()
                if total > 0:  # p <- normalise(max(0, p - q)); unchanged when p <= q everywhere
                    p = r / total
        path.append(nxt)
        out.append(tokens[nxt])
        v, depth = nxt, depth + 1


def verify_tree(draft_tokens, parents, cu_num_nodes, target_logits, draft_logits, temperature,
                top_k, top_p, seed, position, max_nodes):
    """Reference of ``specdec_cuda.ops.verify_tree``.

    Shape: draft_tokens, parents [N]; cu_num_nodes [B + 1]; target_logits [N, V] (flat, node v of
    row b at row cu[b] + v) or [B, M, V] (padded); draft_logits like target_logits or None
    (row v = the distribution node v's children were drawn from); per-row params [B].
    Returns tokens [B, M] int64, accepted_nodes [B, M] int64 (the path, root first), both -1
    padded; num_accepted [B] int64 (accepted draft tokens; tokens holds num_accepted + 1);
    status [B] int32.
    """
    rows = _rows(cu_num_nodes)
    batch = len(rows)
    tokens = torch.full((batch, max_nodes), -1, dtype=torch.int64)
    path = torch.full((batch, max_nodes), -1, dtype=torch.int64)
    num_accepted = torch.zeros(batch, dtype=torch.int64)
    status = torch.zeros(batch, dtype=torch.int32)

    def node_rows(logits, b, lo, hi):
        if logits is None:
            return None
        return (logits[lo:hi] if logits.dim() == 2 else logits[b, :hi - lo]).cpu()

    for b, (lo, hi) in enumerate(rows):
        par = parents[lo:hi].tolist()
        if tree_problem(par, max_nodes) is not None:
            status[b] = STATUS_MALFORMED_TREE
            continue
        try:
            row_path, row_tokens = _verify_row(
                draft_tokens[lo:hi].tolist(), par, node_rows(target_logits, b, lo, hi),
                node_rows(draft_logits, b, lo, hi), float(temperature[b]), int(top_k[b]),
                float(top_p[b]), int(seed[b]), int(position[b]))
        except RowError as err:
            status[b] = err.status
            continue
        path[b, :len(row_path)] = torch.tensor(row_path)
        tokens[b, :len(row_tokens)] = torch.tensor(row_tokens)
        num_accepted[b] = len(row_tokens) - 1
    return tokens, path, num_accepted, status


def compact_kv(caches, accepted_nodes, num_accepted, src_start, dst_start):
    """Reference of ``specdec_cuda.ops.compact_kv`` (in place on every tensor of ``caches``).

    Shape: caches: tensors [B, H, T, D]; accepted_nodes [B, W]; num_accepted, src_start,
    dst_start [B]. Row b copies slot src_start[b] + accepted_nodes[b, j] to dst_start[b] + j for
    j = 0 .. num_accepted[b] (num_accepted + 1 slots: the root and the accepted nodes); rows whose
    accepted_nodes[b, 0] is -1 (flagged by verify_tree) are left alone. In-order copy is safe:
    nodes increase and dst_start <= src_start, so a slot is overwritten only after it was read.
    """
    for b in range(accepted_nodes.shape[0]):
        if int(accepted_nodes[b, 0]) < 0:
            continue
        for j in range(int(num_accepted[b]) + 1):
            src = int(src_start[b]) + int(accepted_nodes[b, j])
            dst = int(dst_start[b]) + j
            for cache in caches:
                cache[b, :, dst] = cache[b, :, src]
    return caches
