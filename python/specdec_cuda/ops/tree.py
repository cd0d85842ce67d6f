"""Tree machinery: ``build_tree``, ``verify_tree``, ``compact_kv``, ``lookahead_mask``.

Tree layout (every op)
----------------------
A batch of ``B`` draft trees is flattened with cumulative offsets: row ``b`` owns the nodes
``cu_num_nodes[b] .. cu_num_nodes[b+1] - 1`` of the flat arrays ``parents`` and ``draft_tokens``
(``N = cu_num_nodes[-1]`` nodes in all). Inside a row nodes are numbered ``0 .. n_b - 1`` and
``parents`` holds row-local indices. Node 0 is the root: the last committed token, whose K/V is
not cached yet (its "draft" is the bonus slot), with parent -1. Every other node ``v`` has
``0 <= parents[v] < v`` (BFS order satisfies this; nothing more is required), which bounds every
walk and depth by ``n_b - 1``. Padded outputs are ``[B, max_nodes, ...]`` with node ``v`` of row
``b`` at ``[b, v]``; ``max_nodes`` (at least every ``n_b``) is passed by the caller so nothing has
to read the device to size the outputs.

``cache_len[b]`` is the number of tokens of row ``b`` already in its KV cache: the root sits at
position ``cache_len[b]`` and node ``v`` at ``cache_len[b] + depth[v]``; with the built-in
model's cache node ``v``'s K/V is written at slot ``cache_len[b] + v``.

Errors: a malformed row (a parent not below its node, a root parent other than -1, a row empty or
longer than ``max_nodes``) is reported per row in ``status`` (``STATUS_MALFORMED_TREE``, 4; every
code is in :mod:`specdec_cuda.ops.status`) by the kernels, which never read
out of bounds; with ``check=True`` (the default) the Python layer raises a ``ValueError`` naming the
row and the node. That check reads ``status`` (a device sync); pass ``check=False`` inside CUDA
graphs and read ``status`` yourself. Under ``torch.compile`` the check is skipped.
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Sequence

import torch

from .. import _native  # noqa: F401  (registers torch.ops.specdec)
from ..reference.tree import tree_problem
from . import args
from .status import STATUS_BAD_COMPACTION, STATUS_MALFORMED_TREE, describe, flagged_rows

__all__ = ["TreeLayout", "VerifyTreeResult", "build_tree", "verify_tree", "compact_kv",
           "LookaheadLayout", "lookahead_mask"]


class TreeLayout(NamedTuple):
    depth: torch.Tensor
    positions: torch.Tensor
    tree_mask: torch.Tensor
    packed_mask: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor
    hf_mask: torch.Tensor | None
    status: torch.Tensor


class VerifyTreeResult(NamedTuple):
    tokens: torch.Tensor
    accepted_nodes: torch.Tensor
    num_accepted: torch.Tensor
    status: torch.Tensor


def _max_nodes(cu: torch.Tensor, max_nodes: int | None, num_flat: int) -> int:
    if max_nodes is not None:
        try:
            if isinstance(max_nodes, bool):
                raise TypeError
            return operator.index(max_nodes)  # an int (numpy's too), never a truncated float
        except TypeError:
            raise TypeError(f"max_nodes: expected an int, got {max_nodes!r}") from None
    if cu.numel() < 2:
        return 1
    # Reads the device (pass max_nodes to avoid it). Only rows whose range [lo, hi) lies inside the
    # N flat nodes count: the kernels flag the others (status 4), so a negative or huge offset is
    # reported naming its row instead of sizing an allocation.
    lo, hi = cu[:-1], cu[1:]
    usable = (lo >= 0) & (hi > lo) & (hi <= num_flat)
    return max(1, int(torch.where(usable, hi - lo, torch.zeros_like(lo)).max()))


def _raise_malformed(status, parents, cu, max_nodes, op: str, extra: str = "",
                     cache_len=None) -> None:
    if torch.compiler.is_compiling():
        return
    bad = torch.nonzero(status == STATUS_MALFORMED_TREE).flatten().tolist()
    if not bad:
        return
    b = bad[0]
    lo, hi = int(cu[b]), int(cu[b + 1])
    if not (0 <= lo < hi <= parents.numel()):
        why = f"its node range cu_num_nodes[{b}:{b + 2}] = [{lo}, {hi}) is empty or out of bounds"
    else:
        why = tree_problem(parents[lo:hi].tolist(), max_nodes)
        if why is None and cache_len is not None:
            raise ValueError(f"{op}: cache_len[{b}] = {int(cache_len[b])}: {extra}")
        why = why or extra or "invalid"
    raise ValueError(f"{op}: parents: row {b} is not a valid tree: {why}")


def build_tree(parents, cu_num_nodes, cache_len, max_nodes: int | None = None, *,
               hf_mask_dtype: torch.dtype | None = None, max_prefix: int | None = None,
               check: bool = True) -> TreeLayout:
    """Depth, positions, attention masks and child links of a ragged batch of trees.

    One kernel launch per device, no host synchronisation (given ``max_nodes`` and, for the
    Hugging Face mask, ``max_prefix``, and ``check=False``).

    Parameters
    ----------
    parents : row-local parent indices, flat (see the module docstring), int64 or int32.
    cu_num_nodes : cumulative node counts, ``cu_num_nodes[0] == 0``.
    cache_len : tokens already cached per row (the root's position).
    max_nodes : padded width M; default ``max(n_b)`` (reads the device).
    hf_mask_dtype : also build the additive 4-D mask for Hugging Face models in this dtype.
    max_prefix : prefix width P of the Hugging Face mask; default ``max(cache_len)`` (reads the
        device). Key slot ``j < P`` is prefix slot ``j`` of the row's cache, visible to the row's
        nodes iff ``j < cache_len[b]`` (ragged rows keep their own lengths; slots in
        ``[cache_len[b], P)`` are hidden); key slot ``P + k`` is tree node ``k``.
    check : raise ``ValueError`` naming the row for a malformed tree (reads ``status``).

    Shape:
        parents: (N,); cu_num_nodes: (B + 1,); cache_len: (B,).
        depth: (B, M) int64, -1 padded.
        positions: (B, M) int64, ``cache_len + depth``; padded with ``cache_len[b]`` so padded
            slots still index a valid rotary position.
        tree_mask: (B, M, M) bool, ``[b, i, j]`` = node j is node i or an ancestor of it; padded
            rows i >= n_b see only themselves (so softmax never sees an all-hidden row).
        packed_mask: (B, M, ceil(M / 8)) uint8, tree_mask rows bit-packed little-endian (bit
            ``j % 8`` of byte ``j // 8``), the bit order of FlashInfer's custom masks; covers the
            tree block only (the cached prefix is always visible).
        first_child, next_sibling: (B, M) int64, -1 when none (children in index order).
        hf_mask: (B, 1, M, P + M) in hf_mask_dtype, 0 where visible and ``finfo.min`` where not,
            or None.
        status: (B,) int32, 0 ok, 4 malformed tree (or cache_len < 0, cache_len + M beyond
            int64, or cache_len > P with hf_mask).

    Example
    -------
    >>> import torch, specdec_cuda.ops as ops
    >>> parents = torch.tensor([-1, 0, 0, 1, -1, 0])   # rows: 4 nodes, 2 nodes
    >>> layout = ops.build_tree(parents, torch.tensor([0, 4, 6]), torch.tensor([7, 3]), 4)
    >>> layout.positions.tolist()
    [[7, 8, 8, 9], [3, 4, 3, 3]]
    """
    parents = args.index_tensor(parents, "parents")
    device = parents.device
    cu = args.index_tensor(cu_num_nodes, "cu_num_nodes", device)
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"cu_num_nodes: expected shape (B + 1,), got {tuple(cu.shape)}")
    batch = cu.numel() - 1
    cache_len = args.per_row(cache_len, "cache_len", batch, torch.int64, device)
    m = _max_nodes(cu, max_nodes, parents.numel())
    if m < 1:
        raise ValueError(f"max_nodes: must be >= 1, got {m}")
    if hf_mask_dtype is not None and not isinstance(hf_mask_dtype, torch.dtype):
        raise TypeError(f"hf_mask_dtype: expected a torch float dtype, got {hf_mask_dtype!r}")
    hf_mask = None
    prefix = 0
    if hf_mask_dtype is not None:
        if not hf_mask_dtype.is_floating_point:
            raise TypeError(f"hf_mask_dtype: expected a float dtype, got {hf_mask_dtype}")
        if max_prefix is not None:
            prefix, source = int(max_prefix), "max_prefix"
            if prefix < 0:
                raise ValueError(f"max_prefix: must be >= 0, got {prefix}")
        else:
            # max(cache_len), read from the device; a negative entry is flagged per row below
            prefix, source = (max(0, int(cache_len.max())) if batch else 0), "max(cache_len)"
        try:
            hf_mask = torch.empty(batch, 1, m, prefix + m, dtype=hf_mask_dtype, device=device)
        except (RuntimeError, OverflowError) as exc:
            raise ValueError(f"build_tree: the Hugging Face mask [{batch}, 1, {m}, {source} + {m}] "
                             f"with {source} = {prefix} cannot be allocated; cache_len holds "
                             f"{cache_len.tolist()[:8]} ({exc})") from None
    longs = dict(dtype=torch.int64, device=device)
    depth = torch.empty(batch, m, **longs)
    positions = torch.empty(batch, m, **longs)
    tree_mask = torch.empty(batch, m, m, dtype=torch.bool, device=device)
    packed = torch.empty(batch, m, (m + 7) // 8, dtype=torch.uint8, device=device)
    first_child = torch.empty(batch, m, **longs)
    next_sibling = torch.empty(batch, m, **longs)
    status = torch.empty(batch, dtype=torch.int32, device=device)
    torch.ops.specdec.build_tree(parents, cu, cache_len, prefix, depth, positions, tree_mask,
                                 packed, first_child, next_sibling, hf_mask, status)
    if check:
        _raise_malformed(status, parents, cu, m, "build_tree",
                         "must be >= 0" + (
                             f" and <= max_prefix={prefix}" if hf_mask is not None else
                             " (and cache_len + max_nodes inside int64)"),
                         cache_len)
    return TreeLayout(depth, positions, tree_mask, packed, first_child, next_sibling, hf_mask,
                      status)


def verify_tree(draft_tokens, parents, cu_num_nodes, target_logits, draft_logits=None, *,
                temperature=0.0, top_k=0, top_p=1.0, seed=0, position=0,
                max_nodes: int | None = None, check: bool = True) -> VerifyTreeResult:
    """Walk each row's tree against the target logits; one call for the whole batch.

    At node ``v`` the token at absolute position ``position[b] + depth(v)`` is decided:

    * ``temperature == 0`` (greedy): follow the first child whose token is ``argmax`` of the
      target logits at ``v``; when none is, emit that argmax (correction / bonus token).
    * ``temperature > 0`` with ``draft_logits`` (SpecInfer multi-step speculative sampling; lossless
      when ``v``'s children were drawn independently from ``q = softmax(draft_logits[v])``): try
      the children in index order, accept child x with probability ``min(1, p(x) / q(x))`` (test
      ``u * q(x) < p(x)``, ``u`` = Philox(seed, position, ACCEPT, substream = attempt index)); on
      rejection ``p <- normalise(max(0, p - q))`` (unchanged when that is zero). All rejected: one
      token from ``max(0, p - q)`` (RESIDUAL race, substream 0). Leaf: a bonus token from p
      (SAMPLE race). Duplicate siblings need nothing special: a rejected token keeps
      ``p(x) <= q(x)`` and is rejected again.
    * ``temperature > 0`` without ``draft_logits`` (one-hot drafts): draw ``y ~ p`` (SAMPLE race,
      substream 0) and follow the first child whose token is ``y``, else emit ``y``. This is
      trying the distinct children in turn, accepting x with probability ``p(x)`` under p with the
      rejected tokens removed, then sampling from what remains, in closed form: the i-th distinct
      child is accepted with probability ``p(x_i)``, a non-child y is emitted with ``p(y)``.
      Duplicate siblings: the first wins. On a chain it draws exactly what ``verify_chain`` draws.

    ``p`` and ``q`` are the temperature / top-k / top-p transformed distributions of
    ``specdec_cuda.reference.sampling``. Every random number is keyed by (seed, absolute position
    of the token being decided, purpose, substream), so a row's result depends neither on its
    batch neighbours nor on its place in the batch, and CPU and CUDA agree.

    Parameters
    ----------
    draft_tokens : the token of every node, flat; node 0's (the committed token) is not read.
    parents, cu_num_nodes : the trees (module docstring).
    target_logits : the target's logits at every node (predicting that node's child), flat
        ``(N, V)`` or padded ``(B, M, V)`` as a model forward returns them; fp32 / fp16 / bf16 /
        fp64.
    draft_logits : same layout and dtype; row v = the drafter's logits from which v's children
        were drawn (leaves' rows are not read); None for one-hot drafts.
    temperature, top_k, top_p, seed, position : scalars or per-row (B,) tensors. ``position`` is
        the absolute position of the tokens decided at the root (= cache_len + 1).
    max_nodes : padded width M (default max n_b, which reads the device).

    Shape:
        draft_tokens, parents: (N,); cu_num_nodes: (B + 1,); target_logits: (N, V) or (B, M, V).
        tokens: (B, M) int64, the tokens to commit (accepted drafts, then the correction / bonus
            token), -1 padded.
        accepted_nodes: (B, M) int64, the accepted path as row-local node indices, root first
            (``num_accepted + 1`` entries), -1 padded.
        num_accepted: (B,) int64, accepted draft tokens (tokens holds num_accepted + 1).
        status: (B,) int32 (codes of ``specdec_cuda.ops.status``): 0 ok, 1 non-finite logits,
            2 draft token outside [0, V), 3 bad sampling parameters, 4 malformed tree (raised
            when ``check``). A flagged row emits no token (all -1, num_accepted 0).

    Example
    -------
    >>> import torch, specdec_cuda.ops as ops
    >>> logits = torch.full((3, 5), -9.0); logits[0, 2] = logits[1, 4] = logits[2, 1] = 9.0
    >>> r = ops.verify_tree(torch.tensor([0, 2, 3]), torch.tensor([-1, 0, 0]),
    ...                     torch.tensor([0, 3]), logits)
    >>> r.tokens.tolist(), r.accepted_nodes.tolist()
    ([[2, 4, -1]], [[0, 1, -1]])
    """
    parents = args.index_tensor(parents, "parents")
    device = parents.device
    draft_tokens = args.index_tensor(draft_tokens, "draft_tokens", device)
    cu = args.index_tensor(cu_num_nodes, "cu_num_nodes", device)
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"cu_num_nodes: expected shape (B + 1,), got {tuple(cu.shape)}")
    batch = cu.numel() - 1
    m = _max_nodes(cu, max_nodes, parents.numel())
    for name, t in (("target_logits", target_logits), ("draft_logits", draft_logits)):
        if not (isinstance(t, torch.Tensor) or (t is None and name == "draft_logits")):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
        if t is not None and t.dim() == 0:
            raise ValueError(f"{name}: expected shape (N, V) or (B, max_nodes, V), got a 0-d tensor")
    if target_logits.stride(-1) != 1:
        target_logits = target_logits.contiguous()
    if draft_logits is not None and draft_logits.stride(-1) != 1:
        draft_logits = draft_logits.contiguous()
    params = (
        args.per_row(temperature, "temperature", batch, torch.float32, device),
        args.per_row(top_k, "top_k", batch, torch.int32, device),
        args.per_row(top_p, "top_p", batch, torch.float32, device),
        args.per_row(seed, "seed", batch, torch.int64, device),
        args.per_row(position, "position", batch, torch.int64, device),
    )
    longs = dict(dtype=torch.int64, device=device)
    tokens = torch.empty(batch, m, **longs)
    accepted = torch.empty(batch, m, **longs)
    num_accepted = torch.empty(batch, **longs)
    status = torch.empty(batch, dtype=torch.int32, device=device)
    torch.ops.specdec.verify_tree(draft_tokens, parents, cu, target_logits, draft_logits, *params,
                                  tokens, accepted, num_accepted, status)
    if check:
        _raise_malformed(status, parents, cu, m, "verify_tree")
    return VerifyTreeResult(tokens, accepted, num_accepted, status)


def compact_kv(caches: Sequence[torch.Tensor], accepted_nodes, num_accepted, src_start,
               dst_start=None, *, check: bool = True) -> torch.Tensor:
    """Move each row's accepted nodes' K/V to contiguous slots, every cache tensor in one call.

    Row b copies slot ``src_start[b] + accepted_nodes[b, j]`` to ``dst_start[b] + j`` for
    ``j = 0 .. num_accepted[b]`` in every tensor of ``caches`` (all layers' K and V). With the
    built-in model's cache ``src_start = dst_start = cache_len`` (node v at slot cache_len + v);
    with a Hugging Face cache whose tree was appended at slot P for every row,
    ``src_start = P`` and ``dst_start = cache_len``. Rows flagged by ``verify_tree``
    (``accepted_nodes[b, 0] == -1``) are left alone. The copy runs in order per row, which is safe
    although sources and destinations may overlap: nodes increase (so node j >= j) and
    ``dst_start <= src_start``, hence each destination ``dst + j <= src + node_j`` and a slot is
    only overwritten after it was read.

    Shape:
        caches: tensors (B, H, T, D) of one dtype, shape and strides (D contiguous); written in
            place.
        accepted_nodes: (B, W) int64 (``verify_tree``'s path, -1 padded).
        num_accepted, src_start, dst_start: (B,) int64 (dst_start defaults to src_start).
        returns status: (B,) int32, 0 ok, ``STATUS_BAD_COMPACTION`` (5) an invalid request for
            the row (path not increasing, dst_start > src_start, a slot outside [0, T)); nothing
            of that row is moved, and with ``check`` a ``ValueError`` names the row.

    Example
    -------
    >>> import torch, specdec_cuda.ops as ops
    >>> k = torch.arange(6.0).reshape(1, 1, 6, 1); v = k.clone()
    >>> _ = ops.compact_kv([k, v], torch.tensor([[0, 2, 3]]), torch.tensor([2]), torch.tensor([2]))
    >>> k.flatten().tolist()
    [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    """
    accepted_nodes = args.index_tensor(accepted_nodes, "accepted_nodes")
    device = accepted_nodes.device
    if accepted_nodes.dim() != 2:
        raise ValueError(f"accepted_nodes: expected shape (B, W), got {tuple(accepted_nodes.shape)}")
    batch = accepted_nodes.shape[0]
    num_accepted = args.per_row(num_accepted, "num_accepted", batch, torch.int64, device)
    src_start = args.per_row(src_start, "src_start", batch, torch.int64, device)
    dst_start = src_start if dst_start is None else args.per_row(
        dst_start, "dst_start", batch, torch.int64, device)
    if isinstance(caches, torch.Tensor) or not all(isinstance(c, torch.Tensor) for c in caches):
        raise TypeError("caches: expected a list of (B, H, T, D) tensors, got "
                        f"{type(caches).__name__}" + ("" if isinstance(caches, torch.Tensor) else
                                                      f" of {[type(c).__name__ for c in caches][:4]}"))
    status = torch.empty(batch, dtype=torch.int32, device=device)
    torch.ops.specdec.compact_kv(list(caches), accepted_nodes, num_accepted, src_start, dst_start,
                                 status)
    if check and not torch.compiler.is_compiling():
        bad = flagged_rows(status)
        if bad:
            b, code = bad[0]
            if code != STATUS_BAD_COMPACTION:  # only the kernel's own code is expected here
                raise RuntimeError(f"compact_kv: row {b}: status {code} ({describe(code)})")
            raise ValueError(
                f"compact_kv: row {b}: accepted_nodes {accepted_nodes[b].tolist()} with "
                f"num_accepted {int(num_accepted[b])}, src_start {int(src_start[b])}, dst_start "
                f"{int(dst_start[b])} is {describe(code)}")
    return status


class LookaheadLayout(NamedTuple):
    positions: torch.Tensor
    tree_mask: torch.Tensor
    status: torch.Tensor


def lookahead_mask(cache_len, guess_lens, guess_len: int, window: int, levels: int, *,
                   check: bool = True) -> LookaheadLayout:
    """Positions and attention mask of one lookahead-decoding step (Fu et al. 2024), per row.

    A row feeds ``T = 1 + G * guess_len + window * levels`` tokens in one forward: the root (the
    newest committed token, at ``cache_len``), then G guessed n-grams (guess g's token i at slot
    ``1 + g * guess_len + i``, position ``cache_len + 1 + i``, seeing the root and its own earlier
    tokens; slots past ``guess_lens[g]`` are padding that sees only itself, at ``cache_len``), then
    the Jacobi window (level l, column j at slot ``1 + G * guess_len + l * window + j``, position
    ``cache_len + 1 + l + j``, seeing the root, level 0's columns ``0 .. j`` and its own column's
    levels ``1 .. l``: the trajectory that produced it). No guess sees the window and the window
    sees no guess. The cached prefix is visible to every slot and not part of the mask. The rules
    are written out in ``specdec_cuda.reference.lookahead``; ``csrc/kernels/tree/lookahead_mask.h``
    draws the window's block.

    Parameters
    ----------
    cache_len : tokens already cached per row (the root's position), int64 / int32.
    guess_lens : tokens of each guess per row, each in ``[0, guess_len]`` (0 = an unused slot).
    guess_len : K, the most tokens per guess (``N - 1`` in the paper).
    window, levels : W columns and L levels of the Jacobi window (``N - 1`` levels in the paper);
        either 0 means no window.
    check : raise ``ValueError`` naming the row whose inputs were flagged (reads ``status``).

    Shape:
        cache_len: (B,); guess_lens: (B, G), G <= 256.
        positions: (B, T) int64, absolute positions (for the rotary embedding).
        tree_mask: (B, T, T) bool, ``[b, v, u]``: slot v sees slot u; every slot sees itself.
        status: (B,) int32, 0 ok, 4 (``STATUS_MALFORMED_TREE``) a guess length outside
            ``[0, guess_len]`` or ``cache_len < 0``; such a row is laid out with no guess tokens
            and ``cache_len`` 0.

    Example
    -------
    >>> import torch, specdec_cuda.ops as ops
    >>> lay = ops.lookahead_mask(torch.tensor([10]), torch.tensor([[2]]), 2, window=2, levels=2)
    >>> lay.positions.tolist()
    [[10, 11, 12, 11, 12, 12, 13]]
    >>> lay.tree_mask[0, 6].int().tolist()   # level 1, column 1: root, level 0 cols 0..1, itself
    [1, 0, 0, 1, 1, 0, 1]
    """
    if isinstance(cache_len, torch.Tensor):
        device = cache_len.device
    elif isinstance(guess_lens, torch.Tensor):
        device = guess_lens.device
    else:
        device = None
    cache_len = args.index_tensor(cache_len, "cache_len", device)
    if cache_len.dim() != 1:
        raise ValueError(f"cache_len: expected shape (B,), got {tuple(cache_len.shape)}")
    batch = cache_len.numel()
    guess_lens = args.index_tensor(guess_lens, "guess_lens", cache_len.device)
    if guess_lens.dim() != 2 or guess_lens.shape[0] != batch:
        raise ValueError(f"guess_lens: expected shape ({batch}, G), got {tuple(guess_lens.shape)}")
    sizes = {}
    for name, value in (("guess_len", guess_len), ("window", window), ("levels", levels)):
        try:
            if isinstance(value, bool):
                raise TypeError
            sizes[name] = operator.index(value)
        except TypeError:
            raise TypeError(f"{name}: expected an int, got {value!r}") from None
        if sizes[name] < 0:
            raise ValueError(f"{name}: must be >= 0, got {sizes[name]}")
    t = 1 + guess_lens.shape[1] * sizes["guess_len"] + sizes["window"] * sizes["levels"]
    positions = torch.empty(batch, t, dtype=torch.int64, device=cache_len.device)
    tree_mask = torch.empty(batch, t, t, dtype=torch.bool, device=cache_len.device)
    status = torch.empty(batch, dtype=torch.int32, device=cache_len.device)
    torch.ops.specdec.lookahead_mask(cache_len, guess_lens, sizes["guess_len"], sizes["window"],
                                     sizes["levels"], positions, tree_mask, status)
    if check and not torch.compiler.is_compiling():
        bad = torch.nonzero(status == STATUS_MALFORMED_TREE).flatten().tolist()
        if bad:
            b = bad[0]
            raise ValueError(f"lookahead_mask: row {b}: guess_lens {guess_lens[b].tolist()} must lie in "
                             f"[0, guess_len={sizes['guess_len']}] and cache_len {int(cache_len[b])} "
                             f"must be >= 0")
    return LookaheadLayout(positions, tree_mask, status)


@torch.library.register_fake("specdec::build_tree")
def _build_tree_fake(parents, cu_num_nodes, cache_len, max_prefix, depth, positions, tree_mask,
                     packed_mask, first_child, next_sibling, hf_mask, status):
    return None


@torch.library.register_fake("specdec::verify_tree")
def _verify_tree_fake(draft_tokens, parents, cu_num_nodes, target_logits, draft_logits,
                      temperature, top_k, top_p, seed, position, tokens, accepted_nodes,
                      num_accepted, status):
    return None


@torch.library.register_fake("specdec::compact_kv")
def _compact_kv_fake(caches, accepted_nodes, num_accepted, src_start, dst_start, status):
    return None


@torch.library.register_fake("specdec::lookahead_mask")
def _lookahead_mask_fake(cache_len, guess_lens, guess_len, window, levels, positions, tree_mask, status):
    return None
