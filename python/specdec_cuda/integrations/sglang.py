"""Stand-ins for sgl_kernel's EAGLE tree calls, computed by the project's tree ops.

SGLang's EAGLE worker calls three CUDA-only ``sgl_kernel`` functions per step; each function here
has the same name, argument order, dtypes and in-place outputs, and runs wherever
``specdec_cuda.ops`` does (CPU and CUDA):

* :func:`build_tree_kernel_efficient`: EAGLE's top-k-per-step drafts (``parent_list``,
  ``selected_index``) to positions, the tree attention mask and SGLang's linked-list tree
  (``retrive_index``, ``retrive_next_token`` = first child, ``retrive_next_sibling``), through
  ``ops.build_tree``. Outputs equal sgl_kernel's bit for bit.
* :func:`verify_tree_greedy`: the greedy walk, through ``ops.verify_tree`` at temperature 0.
  Outputs equal sgl_kernel's.
* :func:`tree_speculative_sampling_target_only`: the sampled walk, through ``ops.verify_tree``'s
  sample-and-match (``draft_logits=None``). Lossless, and equal to sgl_kernel's in distribution,
  not draw for draw: the project draws from Philox streams, not from the caller's uniforms.
* :func:`eagle_parents` (not an sgl_kernel call): EAGLE's drafts as the project's parent arrays,
  for an engine that calls ``ops.verify_tree`` itself, with no host synchronisation.

Trees. SGLang links nodes as lists (node 0 = the verified token); the project takes parent arrays
in which siblings are tried in index order. The verify adapters renumber each row's reachable
nodes breadth-first, siblings in list order, down to depth ``num_spec_step - 1`` (where
sgl_kernel's walk stops), so "the first child in index order" is sgl_kernel's "the first child in
list order". They read the links on the host (one device-to-host copy per call, where sgl_kernel
reads nothing back) and refuse links that do not form a tree (a node reached twice, an index
outside the row), which would make sgl_kernel loop or read out of bounds.

Random numbers (the sampled adapter). sgl_kernel spends ``uniform_samples[b, node]`` on the
acceptance at each node of the walk and ``uniform_samples_for_final_sampling[b]`` on the final
token. ``ops.verify_tree`` draws one token ``y ~ p`` per node from Philox keyed by (seed, position
of the token, purpose) and follows the first child whose token is ``y``. Both give every
accepted prefix and the final token exactly the target's probabilities when sibling tokens are
distinct; they are different couplings of the same law. The Philox key is, per row, ``seed`` and
``position`` when passed (the project's keying: a request seed and the absolute position of the
root's token), else a 62-bit hash of the row's uniforms (all ``n + 1`` of them) and position 0:
fresh uniforms give a fresh stream, equal uniforms equal tokens.

What is refused. ``threshold_acc != 1`` or ``threshold_single < 1`` (with such
``speculative_accept_threshold_*`` sgl_kernel accepts a draft with a probability other than the
target's: lossy) and tree-mask modes other than the three SGLang defines; bit-packed masks for more than 32 nodes
(sgl_kernel's items are at most 4 bytes). One behaviour differs on purpose: duplicate sibling
tokens. sgl_kernel adds a duplicate's probability to the running sum again, so a token drafted
twice is accepted with up to twice its probability; here the first copy wins, as it must for the
output to keep the target's distribution.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from .. import ops
from ..ops.status import describe, flagged_rows

__all__ = ["FULL_MASK", "QLEN_ONLY", "QLEN_ONLY_BITPACKING", "build_tree_kernel_efficient",
           "eagle_parents", "verify_tree_greedy", "tree_speculative_sampling_target_only"]

# SGLang's TreeMaskMode values (the ``tree_mask_mode`` argument).
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


# --- argument checks: sgl_kernel's own (dims, dtypes), plus the bounds it leaves unchecked -------

def _tensor(value, name: str, dtypes, dim: int | None = None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want} (as SGLang passes it), got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-d tensor, got shape {tuple(value.shape)}")
    return value


def _shape(t: torch.Tensor, name: str, shape: tuple) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")


def _same_device(device, **tensors) -> None:
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, expected {device} (the other inputs' device)")


def _int(value, name: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {value!r}") from None


_LONG, _INT = (torch.int64,), (torch.int32,)


# --- SGLang's linked-list trees as the project's parent arrays ------------------------------------

class _Trees(NamedTuple):
    parents: torch.Tensor      # (N,) int64, row-local parents in the new (BFS) numbering
    cu_num_nodes: torch.Tensor  # (B + 1,) int64
    local: torch.Tensor        # (N,) int64, b * n + SGLang's node index of each new node
    children: list             # children[b][k]: new node k's children (new indices, list order)
    max_nodes: int


def _linked_trees(next_token: torch.Tensor, next_sibling: torch.Tensor, max_depth: int) -> _Trees:
    """Each row's nodes reachable from node 0 within ``max_depth`` links, breadth first."""
    batch, n = next_token.shape
    first, sibling = next_token.tolist(), next_sibling.tolist()
    parents, local, cu, children = [], [], [0], []
    for b in range(batch):
        order, depth, row_children = [0], [0], [[]]
        parents.append(-1)
        seen = {0}
        k = 0
        while k < len(order):
            if depth[k] < max_depth:
                child = first[b][order[k]]
                while child != -1:
                    if not 0 <= child < n:
                        raise ValueError(
                            f"retrive_next_token / retrive_next_sibling: row {b}: link to node "
                            f"{child}, outside [0, {n})")
                    if child in seen:
                        raise ValueError(
                            f"retrive_next_token / retrive_next_sibling: row {b}: node {child} is "
                            "reached twice; the links must form a tree")
                    seen.add(child)
                    row_children[k].append(len(order))
                    parents.append(k)
                    order.append(child)
                    depth.append(depth[k] + 1)
                    row_children.append([])
                    child = sibling[b][child]
            k += 1
        local.extend(b * n + v for v in order)
        cu.append(cu[-1] + len(order))
        children.append(row_children)
    device = next_token.device
    as_long = dict(dtype=torch.int64, device=device)
    max_nodes = max(cu[i + 1] - cu[i] for i in range(batch)) if batch else 1
    return _Trees(torch.tensor(parents, **as_long), torch.tensor(cu, **as_long),
                  torch.tensor(local, **as_long), children, max_nodes)


def _check_walk_outputs(predicts, accept_index, accept_token_num, candidates, retrive_index,
                        retrive_next_token, retrive_next_sibling):
    """sgl_kernel's checks of the arguments both verify calls share; returns (bs, n, steps)."""
    _tensor(predicts, "predicts", _INT, 1)
    _tensor(accept_index, "accept_index", _INT, 2)
    _tensor(accept_token_num, "accept_token_num", _INT, 1)
    _tensor(candidates, "candidates", _LONG, 2)
    bs, n = candidates.shape
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        _tensor(t, name, _LONG, 2)
        _shape(t, name, (bs, n))
    if accept_index.shape[0] != bs or accept_token_num.shape[0] != bs:
        raise ValueError(f"accept_index {tuple(accept_index.shape)} / accept_token_num "
                         f"{tuple(accept_token_num.shape)}: expected batch {bs} (candidates' rows)")
    steps = accept_index.shape[1]
    if steps < 1 or n < 1:
        raise ValueError(f"accept_index: num_spec_step = {steps} and candidates: num_draft_tokens "
                         f"= {n}; both must be >= 1")
    _same_device(candidates.device, predicts=predicts, accept_index=accept_index,
                 accept_token_num=accept_token_num, retrive_index=retrive_index,
                 retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling)
    return bs, n, steps


def _slots(trees: _Trees, retrive_index, predicts, *bounds) -> torch.Tensor:
    """retrive_index of every new node (its slot in predicts and the flat per-token arrays)."""
    slots = retrive_index.reshape(-1)[trees.local]
    limit = min([predicts.numel(), *bounds])
    if slots.numel() and not bool(((slots >= 0) & (slots < limit)).all()):
        bad = int(torch.nonzero((slots < 0) | (slots >= limit))[0])
        row = int(torch.searchsorted(trees.cu_num_nodes, torch.tensor(bad, device=slots.device),
                                     right=True)) - 1
        raise ValueError(f"retrive_index: row {row}: a reachable node has index "
                         f"{int(slots[bad])}, outside [0, {limit}) (predicts' and the "
                         "per-token inputs' length)")
    return slots


def _raise_on_status(status: torch.Tensor, op: str) -> None:
    bad = flagged_rows(status)
    if bad:
        b, code = bad[0]
        raise ValueError(f"{op}: row {b}: {describe(code)} (status {code})")


def _write_walk(result, trees: _Trees, slots, tokens, predicts, accept_index, accept_token_num):
    """sgl_kernel's writes from a verify_tree result: accept_index[b, :n + 1], predicts at those
    slots (the committed tokens), accept_token_num; every other entry is left as it was."""
    steps = accept_index.shape[1]
    width = min(trees.max_nodes, steps)
    path = result.accepted_nodes[:, :width]
    taken = torch.arange(width, device=path.device)[None, :] <= result.num_accepted[:, None]
    node = trees.cu_num_nodes[:-1, None] + path.clamp(min=0)
    path_slots = slots[node]
    accept_index[:, :width][taken] = path_slots[taken].to(torch.int32)
    predicts[path_slots[taken]] = tokens[:, :width][taken].to(torch.int32)
    accept_token_num.copy_(result.num_accepted.to(torch.int32))


# --- the three calls ------------------------------------------------------------------------------

def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """``sgl_kernel.verify_tree_greedy`` through ``ops.verify_tree`` (temperature 0).

    Per row, from node 0: follow the first child (in list order) whose candidate equals the
    target's prediction at the current node, at most ``num_spec_step - 1`` times. Written in
    place: ``accept_index[b, :k + 1]`` (the path's retrive_index, root first),
    ``accept_token_num[b] = k``, and ``predicts`` at each path slot: the next accepted token,
    then at the last node its prediction (the bonus / correction token). Other entries keep
    their values (SGLang prefills accept_index with -1).

    The predictions are ids, not logits: each is made a one-hot row over the ids that occur in
    its row (candidates and predictions, renumbered densely per row), whose argmax is that id,
    so ``ops.verify_tree`` decides exactly the equalities sgl_kernel tests.

    Shape:
        predicts: (T,) int32, indexed by retrive_index (SGLang: bs * n + 1).
        accept_index: (bs, num_spec_step) int32. accept_token_num: (bs,) int32.
        candidates, retrive_index, retrive_next_token, retrive_next_sibling: (bs, n) int64.
        target_predict: (bs, n) int64, read at ``retrive_index`` (flat).

    Example
    -------
    >>> import torch
    >>> from specdec_cuda.integrations import sglang
    >>> cand = torch.tensor([[9, 4, 7]]); ridx = torch.tensor([[0, 1, 2]])
    >>> first = torch.tensor([[1, -1, -1]]); sib = torch.tensor([[-1, 2, -1]])  # root: 1, then 2
    >>> pred = torch.tensor([[7, 5, 8]])
    >>> out = torch.full((4,), -1, dtype=torch.int32)
    >>> idx = torch.full((1, 3), -1, dtype=torch.int32); num = torch.zeros(1, dtype=torch.int32)
    >>> sglang.verify_tree_greedy(out, idx, num, cand, ridx, first, sib, pred)
    >>> out.tolist(), idx.tolist(), num.tolist()
    ([7, -1, 8, -1], [[0, 2, -1]], [1])
    """
    bs, n, steps = _check_walk_outputs(predicts, accept_index, accept_token_num, candidates,
                                       retrive_index, retrive_next_token, retrive_next_sibling)
    _tensor(target_predict, "target_predict", _LONG, 2)
    _shape(target_predict, "target_predict", (bs, n))
    _same_device(candidates.device, target_predict=target_predict)
    trees = _linked_trees(retrive_next_token, retrive_next_sibling, steps - 1)
    slots = _slots(trees, retrive_index, predicts, target_predict.numel())
    drafted = candidates.reshape(-1)[trees.local]
    predicted = target_predict.reshape(-1)[slots]
    # ids renumbered densely per row: a row's vocabulary is at most its 2 * n_b ids, so the
    # one-hot rows stay (N, <= 2 * max_nodes) whatever the real vocabulary
    device = candidates.device
    counts = trees.cu_num_nodes[1:] - trees.cu_num_nodes[:-1]
    row = torch.repeat_interleave(torch.arange(bs, device=device), counts)
    pairs = torch.stack([torch.cat([row, row]), torch.cat([drafted, predicted])], dim=1)
    ids, pair_index = torch.unique(pairs, dim=0, return_inverse=True)  # sorted by row, then id
    row_start = torch.searchsorted(ids[:, 0].contiguous(), torch.arange(bs, device=device))
    dense = pair_index - row_start[torch.cat([row, row])]
    num_nodes = drafted.numel()
    vocab = int(dense.max()) + 1 if num_nodes else 1
    one_hot = torch.zeros(num_nodes, vocab, dtype=torch.float32, device=device)
    one_hot[torch.arange(num_nodes, device=device), dense[num_nodes:]] = 1.0
    result = ops.verify_tree(dense[:num_nodes], trees.parents, trees.cu_num_nodes, one_hot,
                             temperature=0.0, max_nodes=trees.max_nodes)
    _raise_on_status(result.status, "verify_tree_greedy")
    tokens = ids[row_start[:, None] + result.tokens.clamp(min=0), 1]
    _write_walk(result, trees, slots, tokens, predicts, accept_index, accept_token_num)


def _seed_from_uniforms(uniform_samples, uniform_final) -> torch.Tensor:
    """A 62-bit Philox seed per row from the bits of its n + 1 uniforms (two 31-bit polynomial
    hashes modulo 2^31 - 1; every intermediate stays below 2^48)."""
    words = torch.cat([uniform_final.reshape(-1, 1), uniform_samples], dim=1)
    words = words.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    prime = 2**31 - 1
    h1 = torch.zeros(words.shape[0], dtype=torch.int64, device=words.device)
    h2 = torch.full_like(h1, 0x2545F491)
    for j in range(words.shape[1]):
        h1 = (h1 * 48271 + words[:, j]) % prime
        h2 = (h2 * 69621 + (words[:, j] ^ 0x5BD1E995)) % prime
    return (h1 << 31) | h2


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates,
                                          retrive_index, retrive_next_token, retrive_next_sibling,
                                          uniform_samples, uniform_samples_for_final_sampling,
                                          target_probs, draft_probs, threshold_single=1.0,
                                          threshold_acc=1.0, deterministic=True, *, seed=None,
                                          position=None) -> None:
    """``sgl_kernel.tree_speculative_sampling_target_only`` through ``ops.verify_tree``.

    Per row: at the current node draw ``y ~ p`` (the node's row of ``target_probs``, already
    tempered and filtered by SGLang), follow the first child in list order whose candidate is
    ``y``, at most ``num_spec_step - 1`` times; the last ``y`` is the final token. Written as
    sgl_kernel writes them: ``accept_index``, ``accept_token_num``, ``predicts`` (the accepted
    tokens, then the final token), and ``draft_probs[b, node, token] = target_probs[b, node,
    token]`` for every child counted as tried and rejected (those before the accepted one, all of
    them at the last node): sgl_kernel's scratch, where it subtracts rejected mass. Its input is
    not read (sgl_kernel subtracts it in the final draw; SGLang passes zeros).

    Distributionally equal to sgl_kernel with thresholds 1, not draw for draw (module docstring):
    the uniforms only seed Philox unless ``seed`` / ``position`` are given. ``deterministic`` is
    accepted and ignored (the project's draws are always deterministic). Lossy thresholds
    (``threshold_acc != 1``, ``threshold_single < 1``) raise ``ValueError``.

    Shape:
        as :func:`verify_tree_greedy`, and uniform_samples: (bs, n), uniform_samples_for_final_
        sampling: (bs,), target_probs, draft_probs: (bs, n, d) float (draft_probs written).
        seed, position: None, an int or (bs,) int64, keyword only (not in sgl_kernel).
    """
    bs, n, steps = _check_walk_outputs(predicts, accept_index, accept_token_num, candidates,
                                       retrive_index, retrive_next_token, retrive_next_sibling)
    floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    _tensor(target_probs, "target_probs", floats, 3)
    _tensor(draft_probs, "draft_probs", floats, 3)
    if target_probs.shape[:2] != (bs, n) or draft_probs.shape != target_probs.shape:
        raise ValueError(f"target_probs {tuple(target_probs.shape)} / draft_probs "
                         f"{tuple(draft_probs.shape)}: expected ({bs}, {n}, d), both the same")
    _tensor(uniform_samples, "uniform_samples", floats, 2)
    _shape(uniform_samples, "uniform_samples", (bs, n))
    _tensor(uniform_samples_for_final_sampling, "uniform_samples_for_final_sampling", floats, 1)
    _shape(uniform_samples_for_final_sampling, "uniform_samples_for_final_sampling", (bs,))
    _same_device(candidates.device, target_probs=target_probs, draft_probs=draft_probs,
                 uniform_samples=uniform_samples,
                 uniform_samples_for_final_sampling=uniform_samples_for_final_sampling)
    if not (float(threshold_acc) == 1.0 and float(threshold_single) >= 1.0):
        raise ValueError(
            f"threshold_single={threshold_single}, threshold_acc={threshold_acc}: sgl_kernel then "
            "accepts drafts beyond the target's probability (lossy); only threshold_acc == 1 and "
            "threshold_single >= 1 (SGLang's defaults) are supported")
    vocab = target_probs.shape[2]
    trees = _linked_trees(retrive_next_token, retrive_next_sibling, steps - 1)
    slots = _slots(trees, retrive_index, predicts)
    drafted = candidates.reshape(-1)[trees.local]
    outside = ((drafted < 0) | (drafted >= vocab)) & (trees.parents >= 0)  # roots are not read
    if bool(outside.any()):
        k = int(torch.nonzero(outside)[0])
        b, i = divmod(int(trees.local[k]), n)
        raise ValueError(f"candidates: row {b}, node {i}: token {int(drafted[k])} lies outside "
                         f"[0, {vocab}) (target_probs' last dimension)")
    # softmax(log p) = p: the op samples the caller's probabilities at temperature 1, no filter
    log_p = target_probs.reshape(bs * n, vocab)[trees.local].to(torch.float32).log()
    if seed is None:
        seed = _seed_from_uniforms(uniform_samples, uniform_samples_for_final_sampling)
    result = ops.verify_tree(drafted.clamp(0, vocab - 1), trees.parents, trees.cu_num_nodes,
                             log_p, temperature=1.0, seed=seed,
                             position=0 if position is None else position,
                             max_nodes=trees.max_nodes)
    _raise_on_status(result.status, "tree_speculative_sampling_target_only")
    _write_walk(result, trees, slots, result.tokens, predicts, accept_index, accept_token_num)
    _write_rejected(result, trees, drafted, target_probs, draft_probs, bs, n)


def _write_rejected(result, trees: _Trees, drafted, target_probs, draft_probs, bs, n) -> None:
    """draft_probs at the children tried before the accepted one (all at the last node)."""
    paths, counts = result.accepted_nodes.tolist(), result.num_accepted.tolist()
    cu, local, tokens = trees.cu_num_nodes.tolist(), trees.local.tolist(), drafted.tolist()
    rows, cols = [], []
    for b in range(bs):
        path = paths[b][:counts[b] + 1]
        for depth, node in enumerate(path):
            chosen = path[depth + 1] if depth + 1 < len(path) else None
            for child in trees.children[b][node]:
                if child == chosen:
                    break
                rows.append(local[cu[b] + node])
                cols.append(tokens[cu[b] + child])
    if rows:
        flat_target = target_probs.reshape(bs * n, -1)
        flat_draft = draft_probs.view(bs * n, -1)
        r = torch.tensor(rows, device=draft_probs.device)
        c = torch.tensor(cols, device=draft_probs.device)
        flat_draft[r, c] = flat_target[r, c].to(draft_probs.dtype)


def eagle_parents(parent_list, selected_index, topk: int, *, check: bool = True) -> torch.Tensor:
    """The parent array of EAGLE's draft trees, as ``build_tree_kernel_efficient`` reads them.

    Node i > 0 of row b is the draft at place ``selected_index[b, i - 1]`` of the flattened score
    list; its parent is the root (0) when ``g = selected_index[b, i - 1] // topk`` is 0, else
    ``1 +`` the first ``p`` with ``selected_index[b, p] == parent_list[b, g]``. The rows are
    ``ops.build_tree`` / ``ops.verify_tree`` parents as they are (flatten them, with
    ``cu_num_nodes = [0, n, 2n, ...]``), children in index order being sgl_kernel's list order:
    the route to verifying SGLang's trees with no host synchronisation.

    With ``check`` (it reads the device), raises ``ValueError`` for a place outside parent_list,
    a node whose parent was not selected and a parent numbered after its child
    (``selected_index`` unsorted). With ``check=False`` nothing is read back: such a node gets
    itself as parent, which the tree ops flag as a malformed row (status 4).

    Shape:
        parent_list: (bs, topk * (depth - 1) + 1) int64; selected_index: (bs, n - 1) int64.
        returns: (bs, n) int64, -1 in column 0.

    Example
    -------
    >>> import torch
    >>> from specdec_cuda.integrations import sglang
    >>> sglang.eagle_parents(torch.tensor([[-1, 0, 1, 4, 3]]), torch.tensor([[0, 1, 3, 4, 7]]),
    ...                      topk=2).tolist()
    [[-1, 0, 0, 1, 2, 4]]
    """
    topk = _int(topk, "topk")
    _tensor(parent_list, "parent_list", _LONG, 2)
    _tensor(selected_index, "selected_index", _LONG, 2)
    bs, width = parent_list.shape
    if selected_index.shape[0] != bs or topk < 1:
        raise ValueError(f"selected_index {tuple(selected_index.shape)}, parent_list "
                         f"{tuple(parent_list.shape)}, topk={topk}: expected the same rows and "
                         "topk >= 1")
    n = selected_index.shape[1] + 1
    device = parent_list.device
    # node i's parent: the first node whose place is parent_list[group]; group 0 is the root's
    group = selected_index // topk
    bad_place = (selected_index < 0) | (group >= width)
    if check and bool(bad_place.any()):
        b, i = (int(x) for x in torch.nonzero(bad_place)[0])
        raise ValueError(f"selected_index: row {b}, node {i + 1}: place "
                         f"{int(selected_index[b, i])} has group {int(group[b, i])}, outside "
                         f"parent_list's [0, {width})")
    wanted = parent_list.gather(1, group.clamp(0, width - 1))
    match = selected_index[:, None, :] == wanted[:, :, None]  # [b, node - 1, candidate - 1]
    found = match.any(-1)
    first_match = (match.to(torch.int8).argmax(-1) if n > 1 else torch.zeros_like(group))
    parent = torch.where(group == 0, torch.zeros_like(group), first_match + 1)
    node = torch.arange(1, n, device=device)
    orphan = ~bad_place & (group != 0) & ~found
    late = ~bad_place & ~orphan & (parent >= node)
    if check:
        for bad, why in ((orphan, "its parent (place {p}) was not selected"),
                         (late, "its parent comes after it (selected_index must be sorted, as "
                                "SGLang sorts it)")):
            if bool(bad.any()):
                b, i = (int(x) for x in torch.nonzero(bad)[0])
                raise ValueError(f"selected_index: row {b}, node {i + 1}: "
                                 + why.format(p=int(wanted[b, i])))
    parent = torch.where(bad_place | orphan, node.expand_as(parent), parent)
    return torch.cat([torch.full((bs, 1), -1, dtype=torch.int64, device=device), parent], 1)


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask,
                                positions, retrive_index, retrive_next_token, retrive_next_sibling,
                                topk, depth, draft_token_num, tree_mask_mode) -> None:
    """``sgl_kernel.build_tree_kernel_efficient`` through ``ops.build_tree``.

    Node i > 0 of row b is the draft at place ``selected_index[b, i - 1]`` of EAGLE's flattened
    score list; its parent is the root when ``selected_index // topk == 0``, else the node whose
    place is ``parent_list[b, selected_index // topk]`` (first match). ``ops.build_tree`` then
    gives depth, positions, the mask and the child links (children in ascending node order, as
    sgl_kernel links them). Written in place: ``positions`` (``verified_seq_len + depth``),
    ``retrive_index`` (``b * n + i``), ``retrive_next_token`` / ``retrive_next_sibling`` (every
    entry: -1 where none), and in ``tree_mask`` what sgl_kernel writes:

    * FULL_MASK (0), bool: row b's block ``[n, seq_len[b] + n]`` after the previous rows' blocks;
      the tree columns ``seq_len[b] ..`` of every node (the prefix columns are the caller's:
      SGLang fills True).
    * QLEN_ONLY (1), bool ``[bs, n, n]``.
    * QLEN_ONLY_BITPACKING (2), ``[bs * n]`` items of 1, 2 or 4 bytes (uint8 / 16 / 32 for n <= 8,
      <= 16, <= 32), bit j of node i's item = j is i or an ancestor (byte 0 assigned, the others
      or-ed into the caller's zeros, as sgl_kernel does). n > 32 is refused.

    Refused with ``ValueError`` (sgl_kernel warns or reads out of bounds): a node whose parent
    was not selected, a parent numbered after its child (``selected_index`` unsorted), indices
    outside ``parent_list``, a tree_mask of the wrong size.

    Shape:
        parent_list: (bs, topk * (depth - 1) + 1) int64; selected_index: (bs, n - 1) int64;
        verified_seq_len: (bs,) int64 (int32 accepted); positions: (bs * n,) int64;
        retrive_index, retrive_next_token, retrive_next_sibling: (bs, n) int64.
    """
    topk, depth, n = (_int(v, name) for v, name in ((topk, "topk"), (depth, "depth"),
                                                    (draft_token_num, "draft_token_num")))
    mode = _int(tree_mask_mode, "tree_mask_mode")
    if mode not in (FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING):
        raise ValueError(f"tree_mask_mode: {mode}; SGLang's modes are FULL_MASK (0), QLEN_ONLY (1) "
                         "and QLEN_ONLY_BITPACKING (2)")
    if topk < 1 or depth < 1 or n < 1:
        raise ValueError(f"topk={topk}, depth={depth}, draft_token_num={n}: all must be >= 1")
    _tensor(parent_list, "parent_list", _LONG, 2)
    bs = parent_list.shape[0]
    width = topk * (depth - 1) + 1
    _shape(parent_list, "parent_list", (bs, width))
    _tensor(selected_index, "selected_index", _LONG, 2)
    _shape(selected_index, "selected_index", (bs, n - 1))
    _tensor(verified_seq_len, "verified_seq_len", (torch.int64, torch.int32), 1)
    _shape(verified_seq_len, "verified_seq_len", (bs,))
    _tensor(positions, "positions", _LONG, 1)
    _shape(positions, "positions", (bs * n,))
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        _tensor(t, name, _LONG, 2)
        _shape(t, name, (bs, n))
    if not isinstance(tree_mask, torch.Tensor):
        raise TypeError(f"tree_mask: expected a tensor, got {type(tree_mask).__name__}")
    device = parent_list.device
    _same_device(device, selected_index=selected_index, verified_seq_len=verified_seq_len,
                 tree_mask=tree_mask, positions=positions, retrive_index=retrive_index,
                 retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling)
    seq_len = verified_seq_len.to(torch.int64)
    item = 1 if n <= 8 else 2 if n <= 16 else 4
    if mode == QLEN_ONLY_BITPACKING:
        if n > 32:
            raise ValueError(f"draft_token_num={n}: a bit-packed mask holds at most 32 nodes "
                             "(sgl_kernel's items are 1, 2 or 4 bytes)")
        expected = bs * n * item
        have = tree_mask.numel() * tree_mask.element_size()
        if not tree_mask.is_contiguous() or have != expected:
            raise ValueError(f"tree_mask: QLEN_ONLY_BITPACKING needs {bs * n} contiguous items of "
                             f"{item} byte(s) ({expected} bytes), got {tuple(tree_mask.shape)} "
                             f"{tree_mask.dtype}")
    else:
        _tensor(tree_mask, "tree_mask", (torch.bool,), 1)
        expected = bs * n * n + (n * int(seq_len.sum()) if mode == FULL_MASK else 0)
        if tree_mask.numel() != expected:
            what = "n * sum(verified_seq_len) + bs * n * n" if mode == FULL_MASK else "bs * n * n"
            raise ValueError(f"tree_mask: expected {what} = {expected} entries, got "
                             f"{tree_mask.numel()}")

    parents = eagle_parents(parent_list, selected_index, topk)
    cu = torch.arange(0, bs * n + 1, n, dtype=torch.int64, device=device)
    layout = ops.build_tree(parents.reshape(-1), cu, seq_len, max_nodes=n)

    positions.copy_(layout.positions.reshape(-1))
    retrive_index.copy_(torch.arange(bs * n, device=device).reshape(bs, n))
    retrive_next_token.copy_(layout.first_child)
    retrive_next_sibling.copy_(layout.next_sibling)
    if mode == QLEN_ONLY:
        tree_mask.view(bs, n, n).copy_(layout.tree_mask)
    elif mode == FULL_MASK:
        # row b's block starts after n * n entries and n * seq_len[j] prefix entries per row j < b
        start = n * n * torch.arange(bs, device=device) + n * (torch.cumsum(seq_len, 0) - seq_len)
        stride = (seq_len + n)[:, None, None]
        rows = torch.arange(n, device=device)[None, :, None]
        cols = torch.arange(n, device=device)[None, None, :]
        index = start[:, None, None] + stride * rows + seq_len[:, None, None] + cols
        tree_mask[index.reshape(-1)] = layout.tree_mask.reshape(-1)
    else:
        packed = layout.packed_mask  # [bs, n, ceil(n / 8)], the same little-endian bit order
        items = tree_mask.view(torch.uint8).view(bs, n, item)
        items[:, :, 0] = packed[:, :, 0]
        used = packed.shape[2]
        items[:, :, 1:used] |= packed[:, :, 1:]
