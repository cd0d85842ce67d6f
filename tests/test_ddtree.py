"""ddtree_build (the DDTree tree-building op) against the plain-Python heap, node for node, plus
the invariants that make it the optimal tree: BFS parents, the ``budget`` most probable prefixes,
the visibility mask as the ancestor closure."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec_cuda import ops
from specdec_cuda.ops.status import STATUS_NONFINITE_LOGITS
from specdec_cuda.reference.ddtree import ddtree_build as ref_build

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


def _inputs(B, D, K, seed, ties=False, vocab=97):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, D, vocab, generator=g) * 2
    if ties:  # coarse log-probs: many equal scores, so the tie-break order is exercised
        logits = (logits * 2).round() / 2
    lp = torch.log_softmax(logits, -1)
    if ties:
        lp = (lp * 2).round() / 2  # exactly representable sums
    vals, idx = lp.topk(K, dim=-1)
    return vals.float().contiguous(), idx.contiguous()


def _assert_same(kernel, want):
    names = ("tokens", "parents", "depth", "num_nodes", "tree_mask", "status")
    for name, k, w in zip(names, kernel, want):
        assert torch.equal(k.cpu(), w), f"{name} differs:\n{k}\n{w}"


@pytest.mark.parametrize("B,D,K,M", [(1, 1, 1, 1), (7, 5, 3, 17), (3, 4, 6, 40), (2, 3, 2, 64), (5, 7, 11, 0),
                                     (8, 15, 64, 256)])
@pytest.mark.parametrize("ties", [False, True])
def test_matches_the_python_heap_node_for_node(B, D, K, M, ties):
    lp, tok = _inputs(B, D, K, seed=B * 100 + D * 10 + K, ties=ties)
    max_depth = torch.tensor([(b * 3) % (D + 3) for b in range(B)])  # 0, > D and in between
    _assert_same(ops.ddtree_build(lp, tok, max_depth, M), ref_build(lp, tok, max_depth, M))


def test_out_tensors_are_written_and_checked():
    """``out``: a caller's buffers (a DDTree proposer keeps them) get the same tree as new ones,
    written over what an earlier, different tree left there; a wrong shape is named."""
    lp, tok = _inputs(3, 4, 6, seed=5)
    other_lp, other_tok = _inputs(3, 4, 6, seed=6)
    out = ops.ddtree.ddtree_outputs(3, 20)
    ops.ddtree_build(other_lp, other_tok, 4, 20, out=out)
    tree = ops.ddtree_build(lp, tok, torch.tensor([4, 1, 3]), 20, out=out)
    assert all(a is b for a, b in zip(tree, out))
    _assert_same(tree, ref_build(lp, tok, torch.tensor([4, 1, 3]), 20))
    with pytest.raises(RuntimeError, match="tree_mask: expected shape"):
        ops.ddtree_build(lp, tok, 4, 20, out=out._replace(tree_mask=torch.empty(3, 20, 20, dtype=torch.bool)))


def test_the_tree_holds_the_most_probable_prefixes():
    # Brute force on a small case: every prefix's score, the M best; the tree's node scores must be them.
    D, K, M = 3, 3, 10
    lp, tok = _inputs(1, D, K, seed=5)
    tree = ops.ddtree_build(lp, tok, D, M)
    n = int(tree.num_nodes[0])
    assert n == M
    scores = []
    for d in range(1, D + 1):
        for ranks in itertools.product(range(K), repeat=d):
            scores.append(sum(float(lp[0, i, r]) for i, r in enumerate(ranks)))
    best = sorted(scores, reverse=True)[:M]
    # Score of each node: its log-prob plus its parent's.
    node_score = []
    for j in range(n):
        d, p, t = int(tree.depth[0, j]), int(tree.parents[0, j]), int(tree.tokens[0, j])
        r = tok[0, d - 1].tolist().index(t)
        node_score.append(float(lp[0, d - 1, r]) + (node_score[p - 1] if p else 0.0))
    assert sorted(node_score, reverse=True) == pytest.approx(best, abs=1e-6)


def test_bfs_parents_depths_and_mask():
    lp, tok = _inputs(4, 6, 5, seed=9)
    tree = ops.ddtree_build(lp, tok, torch.tensor([6, 2, 1, 4]), 30)
    for b in range(4):
        n = int(tree.num_nodes[b])
        depth = [0] + tree.depth[b, :n].tolist()
        for j in range(n):
            p = int(tree.parents[b, j])
            assert 0 <= p <= j and depth[j + 1] == depth[p] + 1
        assert depth[1:] == sorted(depth[1:])  # BFS: depths never decrease
        assert max(depth) <= [6, 2, 1, 4][b]
        # Mask: the ancestor closure (root included), padding rows see only themselves.
        want = torch.eye(31, dtype=torch.bool)
        for i in range(1, n + 1):
            want[i, 0] = True
            want[i] |= want[int(tree.parents[b, i - 1])]
        assert torch.equal(tree.tree_mask[b], want)
        assert (tree.depth[b, n:] == -1).all() and (tree.parents[b, n:] == 0).all()


def test_worked_example():
    lp = torch.log(torch.tensor([[[0.6, 0.3], [0.9, 0.1]]]))
    tok = torch.tensor([[[5, 7], [8, 9]]])
    tree = ops.ddtree_build(lp, tok, max_depth=2, budget=3)
    # Prefix probabilities: 5 (0.6), 5-8 (0.54), 7 (0.3), 7-8 (0.27), 5-9 (0.06): the best three.
    assert tree.tokens.tolist() == [[5, 7, 8]] and tree.parents.tolist() == [[0, 0, 1]]
    assert tree.depth.tolist() == [[1, 1, 2]] and tree.num_nodes.tolist() == [3]


def test_small_search_space_gives_fewer_nodes():
    lp, tok = _inputs(2, 2, 2, seed=1)
    tree = ops.ddtree_build(lp, tok, 2, 50)
    assert tree.num_nodes.tolist() == [6, 6]  # 2 + 2 * 2 prefixes in all


def test_non_finite_rows_are_flagged_and_others_kept():
    lp, tok = _inputs(3, 3, 4, seed=2)
    lp[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="row 1"):
        ops.ddtree_build(lp, tok, 3, 8)
    tree = ops.ddtree_build(lp, tok, 3, 8, check=False)
    assert tree.status.tolist() == [0, STATUS_NONFINITE_LOGITS, 0]
    assert tree.num_nodes.tolist() == [8, 0, 8]
    # A NaN below the row's depth limit is never read: not flagged.
    assert ops.ddtree_build(lp, tok, torch.tensor([3, 2, 3]), 8).status.tolist() == [0, 0, 0]
    _assert_same(ops.ddtree_build(lp, tok, 3, 8, check=False), ref_build(lp, tok, torch.tensor([3, 3, 3]), 8))


def test_minus_inf_log_probs_are_fine():
    lp, tok = _inputs(2, 3, 4, seed=3)
    lp[:, :, 2:] = float("-inf")  # top-k beyond the support
    _assert_same(ops.ddtree_build(lp, tok, 3, 20), ref_build(lp, tok, torch.tensor([3, 3]), 20))


def test_bad_arguments_name_the_input():
    lp, tok = _inputs(2, 3, 4, seed=3)
    with pytest.raises(ValueError, match="topk_logprobs"):
        ops.ddtree_build(lp[0], tok[0], 3, 4)
    with pytest.raises(ValueError, match="topk_tokens"):
        ops.ddtree_build(lp, tok[:, :2], 3, 4)
    with pytest.raises(ValueError, match="budget"):
        ops.ddtree_build(lp, tok, 3, -1)
    with pytest.raises(ValueError, match="max_depth"):
        ops.ddtree_build(lp, tok, torch.tensor([1, 2, 3]), 4)


def test_opcheck():
    lp, tok = _inputs(3, 4, 5, seed=4)
    M = 9
    outs = (torch.empty(3, M, dtype=torch.int64), torch.empty(3, M, dtype=torch.int64),
            torch.empty(3, M, dtype=torch.int64), torch.empty(3, dtype=torch.int64),
            torch.empty(3, M + 1, M + 1, dtype=torch.bool), torch.empty(3, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.ddtree_build, (lp, tok, torch.tensor([4, 1, 0]), M, *outs))


@pytest.mark.cuda
@pytest.mark.parametrize("B,D,K,M", [(8, 15, 256, 256), (7, 5, 3, 17), (3, 4, 6, 40)])
def test_cuda_matches_cpu(B, D, K, M):
    lp, tok = _inputs(B, D, K, seed=7, vocab=max(97, K))
    max_depth = torch.tensor([(b * 3) % (D + 3) for b in range(B)])
    cpu = ops.ddtree_build(lp, tok, max_depth, M)
    cuda = ops.ddtree_build(lp.cuda(), tok.cuda(), max_depth.cuda(), M)
    _assert_same(cuda, tuple(t for t in cpu))


def test_torch_compile_fullgraph():
    lp, tok = _inputs(3, 4, 5, seed=6)
    depth = torch.tensor([4, 2, 3])

    def build(lp, tok, depth):
        tree = ops.ddtree_build(lp, tok, depth, 12)
        return tree.tokens, tree.parents, tree.tree_mask

    got = torch.compile(build, fullgraph=True, backend="aot_eager")(lp, tok, depth)
    want = build(lp, tok, depth)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
