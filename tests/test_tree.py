"""build_tree, verify_tree and compact_kv against python/specdec_cuda/reference/tree.py."""

from __future__ import annotations

import pytest
import torch

import specdec_cuda.ops as ops
from specdec_cuda.reference import sampling as ref_sampling
from specdec_cuda.reference import tree as ref

from tree_cases import chain, flatten, random_parents

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def batch_of_trees(sizes, seed=0, max_children=None):
    gen = torch.Generator().manual_seed(seed)
    rows = [random_parents(n, gen, max_children) for n in sizes]
    return flatten(rows)


# ----------------------------------------------------------------------------------------------
# build_tree


@pytest.mark.parametrize("hf_dtype", [None, torch.float32, torch.float16, torch.bfloat16])
def test_build_tree_matches_reference(hf_dtype):
    sizes = [1, 5, 33, 17, 2, 40, 9]  # batch 7, ragged, a single-node row
    parents, cu = batch_of_trees(sizes, seed=1)
    cache_len = torch.tensor([0, 3, 11, 7, 1, 2, 5])
    m = 41
    out = ops.build_tree(parents, cu, cache_len, m, hf_mask_dtype=hf_dtype, max_prefix=13)
    want = ref.build_tree(parents, cu, cache_len, m, hf_dtype, 13)
    for name in ("depth", "positions", "tree_mask", "packed_mask", "first_child", "next_sibling",
                 "status"):
        assert torch.equal(getattr(out, name), want[name]), name
    if hf_dtype is None:
        assert out.hf_mask is None
    else:
        assert out.hf_mask.dtype == hf_dtype
        assert torch.equal(out.hf_mask, want["hf_mask"])


def test_build_tree_invariants():
    parents, cu = batch_of_trees([64, 20], seed=2)
    out = ops.build_tree(parents, cu, torch.tensor([100, 0]), 64)
    m = out.tree_mask[0]
    # every row sees the root and itself; depth = number of visible ancestors - 1
    assert m[:, 0].all() and m.diagonal().all()
    assert torch.equal(out.depth[0], m.sum(-1) - 1)
    assert torch.equal(out.positions[0], 100 + out.depth[0])
    # unpacking the bits gives the dense mask back
    bits = (out.packed_mask[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1
    assert torch.equal(bits.flatten(-2)[..., :64].bool(), out.tree_mask)
    # padded rows of the shorter tree see only themselves
    assert torch.equal(out.tree_mask[1, 20:, :], torch.eye(64, dtype=torch.bool)[20:])
    assert (out.depth[1, 20:] == -1).all()


def test_build_tree_defaults_read_sizes():
    parents, cu = flatten([chain(3), [-1, 0, 0, 0]])
    out = ops.build_tree(parents, cu, torch.tensor([2, 5]), hf_mask_dtype=torch.float32)
    assert out.depth.shape == (2, 4)
    assert out.hf_mask.shape == (2, 1, 4, 5 + 4)
    assert out.hf_mask[0, 0, 0, :2].eq(0).all() and out.hf_mask[0, 0, 0, 2:5].lt(-1e38).all()


@pytest.mark.parametrize("rows,why", [
    ([[-1, 0, 2]], "node 2 has parent 2"),
    ([[-1, 0], [0, 0]], "root \\(node 0\\) has parent 0"),
    ([[-1, 0], [-1, -1]], "node 1 has parent -1"),
    ([[-1], [-1, 5, 0]], "node 1 has parent 5"),
    ([[-1], []], "is empty"),
])
@pytest.mark.parametrize("op", ["build_tree", "verify_tree"])
def test_malformed_tree_raises_naming_row(rows, why, op):
    parents, cu = flatten(rows)
    bad_row = len(rows) - 1
    with pytest.raises(ValueError, match=f"row {bad_row} .*{why}"):
        if op == "build_tree":
            ops.build_tree(parents, cu, torch.zeros(len(rows), dtype=torch.int64), 4)
        else:
            ops.verify_tree(torch.zeros(parents.numel(), dtype=torch.int64), parents, cu,
                            torch.zeros(max(parents.numel(), 1), 7), max_nodes=4)


def test_malformed_tree_status_without_check():
    parents, cu = flatten([[-1, 0], [-1, 1, 0]])
    out = ops.build_tree(parents, cu, torch.zeros(2, dtype=torch.int64), 3, check=False)
    assert out.status.tolist() == [0, 4]
    res = ops.verify_tree(torch.zeros(5, dtype=torch.int64), parents, cu, torch.zeros(5, 9),
                          check=False)
    assert res.status.tolist() == [0, 4]
    assert (res.tokens[1] == -1).all() and (res.accepted_nodes[1] == -1).all()


def test_tree_too_large_for_max_nodes_raises():
    parents, cu = flatten([chain(5)])
    with pytest.raises(ValueError, match="more than max_nodes=4"):
        ops.build_tree(parents, cu, torch.zeros(1, dtype=torch.int64), 4)


def test_cache_len_beyond_max_prefix_raises():
    parents, cu = flatten([chain(2)])
    with pytest.raises(ValueError, match="max_prefix"):
        ops.build_tree(parents, cu, torch.tensor([9]), 2, hf_mask_dtype=torch.float32,
                       max_prefix=4)


def test_build_tree_bad_inputs():
    parents, cu = flatten([chain(2)])
    with pytest.raises(TypeError, match="parents"):
        ops.build_tree(parents.float(), cu, torch.zeros(1, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="cache_len"):
        ops.build_tree(parents, cu, torch.zeros(3, dtype=torch.int64), 2)


# ----------------------------------------------------------------------------------------------
# compact_kv


def _paths(sizes, gen, width):
    """Random increasing paths starting at the root (node 0) in trees of the given sizes."""
    nodes = torch.full((len(sizes), width), -1, dtype=torch.int64)
    num = torch.zeros(len(sizes), dtype=torch.int64)
    for b, n in enumerate(sizes):
        k = int(torch.randint(0, min(n, width), (1,), generator=gen))
        picks = sorted(torch.randperm(n - 1, generator=gen)[:k].add(1).tolist())
        nodes[b, :k + 1] = torch.tensor([0] + picks)
        num[b] = k
    return nodes, num


@pytest.mark.parametrize("dtype", DTYPES)
def test_compact_kv_matches_reference(dtype):
    gen = torch.Generator().manual_seed(3)
    batch, heads, slots, dim = 7, 3, 48, 20
    sizes = [9, 1, 16, 5, 12, 3, 16]
    nodes, num = _paths(sizes, gen, 16)
    nodes[5] = -1  # a row flagged by verify_tree: untouched
    cache_len = torch.tensor([0, 4, 20, 7, 30, 2, 13])
    caches = [torch.randn(batch, heads, slots, dim, generator=gen).to(dtype) for _ in range(5)]
    want = ref.compact_kv([c.clone() for c in caches], nodes, num, cache_len, cache_len)
    status = ops.compact_kv(caches, nodes, num, cache_len)
    assert status.tolist() == [0] * batch
    for got, exp in zip(caches, want):
        assert torch.equal(got, exp)


def test_compact_kv_hf_layout_and_strided_views():
    # A Hugging Face style cache: the tree was appended at slot P = 10 for every row; the rows'
    # own prefixes are shorter. The cache tensors are views of one [L, 2, B, H, T, D] buffer.
    gen = torch.Generator().manual_seed(4)
    buf = torch.randn(3, 2, 4, 2, 24, 8, generator=gen)
    caches = [buf[layer, kv] for layer in range(3) for kv in range(2)]
    nodes, num = _paths([6, 6, 6, 6], gen, 6)
    src = torch.full((4,), 10)
    dst = torch.tensor([10, 3, 0, 9])
    want = ref.compact_kv([c.clone() for c in caches], nodes, num, src, dst)
    ops.compact_kv(caches, nodes, num, src, dst)
    for got, exp in zip(caches, want):
        assert torch.equal(got, exp)


def test_compact_kv_overlapping_slots_in_order():
    # dst == src, path 0, 2, 5: slot 2 is read (node 2) before node 5 is written over slot 2
    k = torch.arange(10.0).reshape(1, 1, 10, 1)
    ops.compact_kv([k], torch.tensor([[0, 2, 5]]), torch.tensor([2]), torch.tensor([0]))
    assert k.flatten().tolist() == [0, 2, 5, 3, 4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("nodes,num,src,dst", [
    ([[0, 3, 2]], 2, 0, 0),   # not increasing
    ([[0, 1, 2]], 2, 0, 1),   # dst > src
    ([[0, 1, 9]], 2, 0, 0),   # source slot outside the cache
    ([[0, 1, 2]], 5, 0, 0),   # longer than the path width
])
def test_compact_kv_invalid_request_raises(nodes, num, src, dst):
    k = torch.zeros(1, 1, 8, 2)
    with pytest.raises(ValueError, match="row 0"):
        ops.compact_kv([k], torch.tensor(nodes), torch.tensor([num]), torch.tensor([src]),
                       torch.tensor([dst]))
    assert (k == 0).all()


def test_compact_kv_mismatched_caches_raise():
    with pytest.raises(RuntimeError, match=r"caches\[1\]"):
        ops.compact_kv([torch.zeros(1, 1, 8, 2), torch.zeros(1, 1, 8, 3)],
                       torch.tensor([[0]]), torch.tensor([0]), torch.tensor([0]))


# ----------------------------------------------------------------------------------------------
# verify_tree


def _tokens_following(parents_rows, logits_rows, gen, vocab, hit=0.6):
    """Node tokens that often equal the target argmax / a likely token, so walks go deep."""
    toks = []
    for par, lg in zip(parents_rows, logits_rows):
        row = [0]
        for v in range(1, len(par)):
            best = int(lg[par[v]].float().argmax())
            r = float(torch.rand((), generator=gen))
            row.append(best if r < hit else int(torch.randint(vocab, (), generator=gen)))
        toks += row
    return torch.tensor(toks)


def _case(sizes, vocab, dtype, seed, with_draft, padded=False, peaked=3.0):
    gen = torch.Generator().manual_seed(seed)
    rows = [random_parents(n, gen, 4) for n in sizes]
    parents, cu = flatten(rows)
    n = parents.numel()
    target = (torch.randn(n, vocab, generator=gen) * peaked).to(dtype)
    draft = (target.float() + torch.randn(n, vocab, generator=gen)).to(dtype) if with_draft else None
    lg_rows = [target[int(cu[b]):int(cu[b + 1])] for b in range(len(sizes))]
    tokens = _tokens_following(rows, lg_rows, gen, vocab)
    if padded:  # (B, M, V) as a model forward returns them
        m = max(sizes)

        def pad(x):
            out = torch.zeros(len(sizes), m, vocab, dtype=dtype)
            for b in range(len(sizes)):
                out[b, :sizes[b]] = x[int(cu[b]):int(cu[b + 1])]
            return out
        target = pad(target)
        draft = pad(draft) if draft is not None else None
    return tokens, parents, cu, target, draft


def _check_verify(tokens, parents, cu, target, draft, params, m):
    got = ops.verify_tree(tokens, parents, cu, target, draft, max_nodes=m, **params)
    b = cu.numel() - 1
    per_row = {k: torch.as_tensor(v).expand(b) if torch.as_tensor(v).dim() == 0 else torch.as_tensor(v)
               for k, v in params.items()}
    want = ref.verify_tree(tokens, parents, cu, target, draft, per_row["temperature"],
                           per_row["top_k"], per_row["top_p"], per_row["seed"],
                           per_row["position"], m)
    for g, w, name in zip(got, want, ("tokens", "accepted_nodes", "num_accepted", "status")):
        assert torch.equal(g, w), f"{name}: got {g.tolist()} want {w.tolist()}"
    return got


SIZES = [1, 6, 13, 4, 9, 2, 11]  # batch 7


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["greedy", "onehot", "specinfer"])
def test_verify_tree_matches_reference(dtype, mode):
    tokens, parents, cu, target, draft = _case(SIZES, 111, dtype, seed=5,
                                               with_draft=mode == "specinfer")
    temperature = 0.0 if mode == "greedy" else torch.tensor([0.7, 1.0, 1.3, 0.9, 1.0, 0.5, 2.0])
    params = dict(temperature=temperature, top_k=0, top_p=1.0,
                  seed=torch.arange(7) * 977 + 3, position=torch.arange(7) + 40)
    got = _check_verify(tokens, parents, cu, target, draft, params, 13)
    assert got.num_accepted.sum() > 0  # the walks went somewhere


@pytest.mark.parametrize("mode", ["onehot", "specinfer"])
def test_verify_tree_top_k_top_p_and_padded_logits(mode):
    tokens, parents, cu, target, draft = _case(SIZES, 111, torch.float32, seed=6,
                                               with_draft=mode == "specinfer", padded=True)
    params = dict(temperature=torch.tensor([1.0, 0.8, 1.0, 1.2, 0.0, 1.0, 1.0]),
                  top_k=torch.tensor([0, 5, 20, 110, 3, 1, 0]),
                  top_p=torch.tensor([0.9, 1.0, 0.5, 0.95, 0.3, 1.0, 0.7]),
                  seed=torch.arange(7) + 11, position=torch.arange(7) * 3)
    _check_verify(tokens, parents, cu, target, draft, params, 13)


def test_verify_tree_flagged_rows():
    tokens, parents, cu, target, draft = _case([5, 5, 5, 5], 31, torch.float32, 7, True)
    target[int(cu[1]) + 0, 4] = float("nan")        # row 1: NaN at its root
    tokens[int(cu[2]) + 3] = 31                      # row 2: token out of range
    params = dict(temperature=torch.tensor([1.0, 1.0, 1.0, -1.0]), top_k=0, top_p=1.0,
                  seed=1, position=0)
    got = _check_verify(tokens, parents, cu, target, draft, params, 5)
    assert got.status.tolist() == [0, 1, 2, 3]
    assert (got.tokens[1:] == -1).all() and (got.num_accepted[1:] == 0).all()


def test_verify_tree_batch_placement_does_not_matter():
    tokens, parents, cu, target, draft = _case([7, 7, 7], 50, torch.float32, 8, True)
    params = dict(temperature=1.0, top_k=0, top_p=1.0, seed=torch.tensor([5, 6, 7]),
                  position=torch.tensor([10, 20, 30]))
    whole = ops.verify_tree(tokens, parents, cu, target, draft, **params)
    for b in range(3):
        lo, hi = int(cu[b]), int(cu[b + 1])
        alone = ops.verify_tree(tokens[lo:hi], parents[lo:hi], torch.tensor([0, 7]),
                                target[lo:hi], draft[lo:hi], temperature=1.0,
                                seed=int(params["seed"][b]), position=int(params["position"][b]))
        assert torch.equal(alone.tokens[0], whole.tokens[b])


@pytest.mark.parametrize("mode", ["greedy", "onehot", "specinfer"])
def test_chain_tree_equals_verify_chain(mode):
    """A chain-shaped tree is a draft chain: same tokens and counts as verify_chain."""
    gen = torch.Generator().manual_seed(9)
    ks, vocab = [3, 0, 5, 2, 4], 37
    rows = [chain(k + 1) for k in ks]
    parents, cu = flatten(rows)
    n = parents.numel()
    target = torch.randn(n, vocab, generator=gen) * 2
    draft_nodes = (target + torch.randn(n, vocab, generator=gen)) if mode == "specinfer" else None
    lg_rows = [target[int(cu[b]):int(cu[b + 1])] for b in range(len(ks))]
    tokens = _tokens_following(rows, lg_rows, gen, vocab, hit=0.8)
    temperature = torch.zeros(5) if mode == "greedy" else torch.full((5,), 0.9)
    seed, position = torch.arange(5) + 100, torch.arange(5) * 7 + 1
    tree = ops.verify_tree(tokens, parents, cu, target, draft_nodes, temperature=temperature,
                           seed=seed, position=position)
    # the same drafts as chains: drop each row's root token / last draft-logit row
    keep = torch.ones(n, dtype=torch.bool)
    keep[cu[:-1]] = False
    chain_tokens = tokens[keep]
    chain_draft = None
    if draft_nodes is not None:
        last = torch.ones(n, dtype=torch.bool)
        last[cu[1:] - 1] = False
        chain_draft = draft_nodes[last]
    cu_chain = torch.tensor([0] + torch.tensor(ks).cumsum(0).tolist())
    zeros = torch.zeros(5, dtype=torch.int64)
    want = ref_sampling.verify_chain(chain_tokens, cu_chain, target, chain_draft, temperature,
                                     zeros, torch.ones(5), seed, position)
    assert torch.equal(tree.tokens[:, :max(ks) + 1], want[0])
    assert torch.equal(tree.num_accepted, want[1])
    # and the sampling family's verify_chain kernel on the same chains
    kernel = ops.verify_chain(chain_tokens, cu_chain, target, chain_draft, temperature, 0, 1.0,
                              seed, position)
    assert torch.equal(kernel.tokens, want[0])
    assert torch.equal(kernel.num_accepted, want[1])


# ----------------------------------------------------------------------------------------------
# opcheck, torch.compile


def _op_args():
    tokens, parents, cu, target, draft = _case([4, 6], 23, torch.float32, 10, True)
    params = [torch.tensor([1.0, 0.0]), torch.tensor([0, 3], dtype=torch.int32),
              torch.tensor([1.0, 0.9]),
              torch.tensor([1, 2]), torch.tensor([5, 9])]
    return tokens, parents, cu, target, draft, params


def test_opcheck_build_tree():
    parents, cu = batch_of_trees([5, 3], seed=11)
    m, p = 5, 4
    outs = [torch.empty(2, m, dtype=torch.int64), torch.empty(2, m, dtype=torch.int64),
            torch.empty(2, m, m, dtype=torch.bool), torch.empty(2, m, 1, dtype=torch.uint8),
            torch.empty(2, m, dtype=torch.int64), torch.empty(2, m, dtype=torch.int64)]
    for hf in (None, torch.empty(2, 1, m, p + m, dtype=torch.float16)):
        torch.library.opcheck(torch.ops.specdec.build_tree,
                              (parents, cu, torch.tensor([1, 4]), p, *outs, hf,
                               torch.empty(2, dtype=torch.int32)))


def test_opcheck_verify_tree():
    tokens, parents, cu, target, draft, params = _op_args()
    for d in (draft, None):
        outs = (torch.empty(2, 6, dtype=torch.int64), torch.empty(2, 6, dtype=torch.int64),
                torch.empty(2, dtype=torch.int64), torch.empty(2, dtype=torch.int32))
        torch.library.opcheck(torch.ops.specdec.verify_tree,
                              (tokens, parents, cu, target, d, *params, *outs))


def test_opcheck_compact_kv():
    caches = [torch.randn(2, 2, 12, 4) for _ in range(3)]
    torch.library.opcheck(torch.ops.specdec.compact_kv,
                          (caches, torch.tensor([[0, 1, 3], [0, 2, -1]]), torch.tensor([2, 1]),
                           torch.tensor([2, 5]), torch.tensor([2, 4]),
                           torch.empty(2, dtype=torch.int32)))


def test_torch_compile_fullgraph_tree_step():
    tokens, parents, cu, target, draft, params = _op_args()
    caches = [torch.randn(2, 2, 16, 4) for _ in range(2)]
    cache_len = torch.tensor([3, 5])

    def step(tokens, parents, cu, target, draft, caches):
        layout = ops.build_tree(parents, cu, cache_len, 6, hf_mask_dtype=torch.float32,
                                max_prefix=8)
        res = ops.verify_tree(tokens, parents, cu, target, draft, temperature=params[0],
                              top_k=params[1], top_p=params[2], seed=params[3],
                              position=cache_len + 1, max_nodes=6)
        ops.compact_kv(caches, res.accepted_nodes, res.num_accepted, cache_len)
        return layout.positions, layout.hf_mask, res.tokens

    eager_caches = [c.clone() for c in caches]
    want = step(tokens, parents, cu, target, draft, eager_caches)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(tokens, parents, cu, target, draft, caches)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    for g, w in zip(caches, eager_caches):
        assert torch.equal(g, w)


# ----------------------------------------------------------------------------------------------
# CUDA equals CPU

@pytest.mark.cuda
@pytest.mark.parametrize("hf_dtype", [None, torch.bfloat16])
def test_build_tree_cuda_equals_cpu(hf_dtype):
    parents, cu = batch_of_trees([1, 64, 300, 17, 512, 2, 40], seed=12)
    cache_len = torch.tensor([0, 3, 11, 7, 1, 2, 5])
    cpu = ops.build_tree(parents, cu, cache_len, 512, hf_mask_dtype=hf_dtype, max_prefix=16)
    gpu = ops.build_tree(parents.cuda(), cu.cuda(), cache_len.cuda(), 512,
                         hf_mask_dtype=hf_dtype, max_prefix=16)
    for c, g in zip(cpu, gpu):
        assert (c is None and g is None) or torch.equal(c, g.cpu())
    bad_parents, bad_cu = flatten([[-1, 0], [-1, 1]])
    with pytest.raises(ValueError, match="row 1"):
        ops.build_tree(bad_parents.cuda(), bad_cu.cuda(), torch.zeros(2, dtype=torch.int64).cuda(), 2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["greedy", "onehot", "specinfer"])
def test_verify_tree_cuda_equals_cpu(dtype, mode):
    sizes = [1, 6, 13, 64, 9, 2, 11]
    tokens, parents, cu, target, draft = _case(sizes, 5003, dtype, seed=13,
                                               with_draft=mode == "specinfer")
    temperature = 0.0 if mode == "greedy" else torch.tensor([0.7, 1.0, 1.3, 0.9, 1.0, 0.5, 2.0])
    params = dict(temperature=temperature, top_k=torch.tensor([0, 0, 7, 0, 50, 0, 0]),
                  top_p=torch.tensor([1.0, 0.9, 1.0, 1.0, 0.8, 1.0, 1.0]),
                  seed=torch.arange(7) + 1, position=torch.arange(7) + 3)
    cpu = ops.verify_tree(tokens, parents, cu, target, draft, **params)
    dev = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in params.items()}
    gpu = ops.verify_tree(tokens.cuda(), parents.cuda(), cu.cuda(), target.cuda(),
                          None if draft is None else draft.cuda(), **dev)
    for c, g in zip(cpu, gpu):
        assert torch.equal(c, g.cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_compact_kv_cuda_equals_cpu(dtype):
    gen = torch.Generator().manual_seed(14)
    nodes, num = _paths([40, 3, 64, 9], gen, 64)
    cache_len = torch.tensor([5, 0, 100, 7])
    caches = [torch.randn(4, 8, 200, 128, generator=gen).to(dtype) for _ in range(4)]
    gpu = [c.cuda() for c in caches]
    ops.compact_kv(caches, nodes, num, cache_len)
    ops.compact_kv(gpu, nodes.cuda(), num.cuda(), cache_len.cuda())
    for c, g in zip(caches, gpu):
        assert torch.equal(c, g.cpu())


@pytest.mark.cuda
def test_tree_step_captures_in_cuda_graph():
    tokens, parents, cu, target, draft = (t.cuda() for t in _case([6, 9], 1000, torch.float32, 15, True))
    cache_len = torch.tensor([3, 5], device="cuda")
    params = dict(temperature=torch.ones(2, device="cuda"),
                  top_k=torch.zeros(2, dtype=torch.int32, device="cuda"),
                  top_p=torch.ones(2, device="cuda"), seed=torch.tensor([7, 8], device="cuda"),
                  position=cache_len + 1)
    caches = [torch.randn(2, 2, 32, 8, device="cuda") for _ in range(2)]
    want_caches = [c.clone() for c in caches]
    want_layout = ops.build_tree(parents, cu, cache_len, 9, hf_mask_dtype=torch.float16,
                                 max_prefix=8)
    want = ops.verify_tree(tokens, parents, cu, target, draft, max_nodes=9, **params)
    ops.compact_kv(want_caches, want.accepted_nodes, want.num_accepted, cache_len)

    def step():
        layout = ops.build_tree(parents, cu, cache_len, 9, hf_mask_dtype=torch.float16,
                                max_prefix=8, check=False)
        res = ops.verify_tree(tokens, parents, cu, target, draft, max_nodes=9, check=False,
                              **params)
        return layout, res

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (caches untouched)
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layout, res = step()
        ops.compact_kv(caches, res.accepted_nodes, res.num_accepted, cache_len, check=False)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(layout.hf_mask, want_layout.hf_mask)
    for got, exp in zip(res, want):
        assert torch.equal(got, exp)
    for got, exp in zip(caches, want_caches):
        assert torch.equal(got, exp)
