"""The sgl_kernel stand-ins (specdec_cuda.integrations.sglang) against sgl_kernel's semantics.

``_sglang_reference`` restates what sgl_kernel's CUDA kernels do; the adapters compute the same
through the project's ops. Exact for the tree builder and the greedy walk (every output, and
every entry the kernel leaves alone); for the sampled walk, exact where the draws cannot matter
(one-hot targets) and a chi-square of the committed tokens against the exact target law
elsewhere, with SGLang's own rule at a lossy threshold as the case that must fail.
"""

from __future__ import annotations

import random

import pytest
import torch

import _sglang_reference as ref
from lossless_stats import chi2_pvalue
from specdec_cuda.integrations import sglang

MODES = (sglang.FULL_MASK, sglang.QLEN_ONLY, sglang.QLEN_ONLY_BITPACKING)


# --- EAGLE's drafts, made the way SGLang's draft loop makes them ---------------------------------

def eagle_draft(rng: random.Random, bs: int, topk: int, steps: int, n: int):
    """parent_list [bs, topk * (steps - 1) + 1] and sorted selected_index [bs, n - 1] of a random
    EAGLE draft: step 0 gives the root topk children (places 0 .. topk - 1); step i >= 1 expands
    the topk best paths of step i - 1 into topk children each (topk^2 places), and parent_list
    records the places of the paths expanded. The n - 1 best-scoring places are selected; a
    path's score (product of probabilities < 1) is below its parent's, so parents come first."""
    parent_lists, selected = [], []
    for _ in range(bs):
        scores = [rng.uniform(0.05, 0.95) for _ in range(topk)]
        parent_list = [-1] + list(range(topk))
        expand = list(range(topk))  # places whose children the next step drafts
        for step in range(1, steps):
            base = topk + (step - 1) * topk * topk
            new = []
            for j, place in enumerate(expand):
                for c in range(topk):
                    new.append(base + j * topk + c)
                    scores.append(scores[place] * rng.uniform(0.05, 0.95))
            expand = sorted(rng.sample(new, topk), key=lambda p: -scores[p]) if topk < len(new) \
                else new
            if step < steps - 1:
                parent_list.extend(expand)
        best = sorted(range(len(scores)), key=lambda p: -scores[p])[:n - 1]
        parent_lists.append(parent_list)
        selected.append(sorted(best))
    width = topk * (steps - 1) + 1
    return (torch.tensor([p[:width] for p in parent_lists], dtype=torch.int64).reshape(bs, width),
            torch.tensor(selected, dtype=torch.int64).reshape(bs, n - 1))


def sgl_buffers(bs, n, seq_len, mode, device="cpu"):
    """The outputs as SGLang allocates them before the call."""
    if mode == sglang.FULL_MASK:
        mask = torch.ones(int(seq_len.sum()) * n + bs * n * n, dtype=torch.bool, device=device)
    elif mode == sglang.QLEN_ONLY:
        mask = torch.ones(bs * n * n, dtype=torch.bool, device=device)
    else:
        dtype = torch.uint8 if n <= 8 else torch.uint16 if n <= 16 else torch.uint32
        mask = torch.zeros(bs * n, dtype=dtype, device=device)
    links = [torch.full((bs, n), -1, dtype=torch.int64, device=device) for _ in range(3)]
    return [mask, torch.full((bs * n,), -5, dtype=torch.int64, device=device), *links]


def build_both(parent_list, selected, seq_len, topk, steps, n, mode, noise=None):
    """Both builders on SGLang's buffers; with ``noise`` (a seed) the mask starts as random
    bytes instead of SGLang's fill, so what each leaves alone (FULL_MASK's prefix columns) or
    or-es into (the packed items' upper bytes) is compared too."""
    bs = parent_list.shape[0]
    outs = []
    for fn in (sglang.build_tree_kernel_efficient, ref.build_tree_kernel_efficient):
        bufs = sgl_buffers(bs, n, seq_len, mode)
        if noise is not None:
            raw = bufs[0].view(torch.uint8)
            gen = torch.Generator().manual_seed(noise)
            raw.copy_(torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8))
            if bufs[0].dtype == torch.bool:
                raw &= 1
        fn(parent_list, selected, seq_len, *bufs, topk, steps, n, mode)
        outs.append(bufs)
    return outs


@pytest.mark.parametrize("bs,topk,steps,n", [(1, 1, 4, 5), (3, 2, 3, 6), (7, 4, 5, 16),
                                             (2, 8, 2, 9), (4, 3, 6, 32), (5, 4, 4, 1)])
def test_build_tree_equals_sgl_kernel(bs, topk, steps, n):
    rng = random.Random(bs * 1000 + topk * 100 + n)
    parent_list, selected = eagle_draft(rng, bs, topk, steps, n)
    seq_len = torch.tensor([rng.randrange(0, 40) for _ in range(bs)], dtype=torch.int64)
    for mode, noise in [(m, None) for m in MODES] + [(m, 7) for m in MODES]:
        ours, want = build_both(parent_list, selected, seq_len, topk, steps, n, mode, noise)
        for name, a, b in zip(("tree_mask", "positions", "retrive_index", "retrive_next_token",
                               "retrive_next_sibling"), ours, want):
            if a.dtype in (torch.uint16, torch.uint32):
                a, b = a.view(torch.uint8), b.view(torch.uint8)
            assert torch.equal(a, b), (mode, noise, name)


def test_build_tree_hand_case():
    # topk 2, 3 steps: places 0, 1 (root's children), 2 .. 5 (children of places 0 and 1),
    # 6 .. 9 (children of the step-1 places parent_list[3:] = 4 and 3).
    parent_list = torch.tensor([[-1, 0, 1, 4, 3]])
    selected = torch.tensor([[0, 1, 3, 4, 7]])  # nodes 1 .. 5
    # node 3 = place 3 (group 1: child of place 0 = node 1); node 4 = place 4 (group 2: node 2);
    # node 5 = place 7 (group 3: parent_list[3] = place 4 = node 4)
    seq_len = torch.tensor([2])
    ours, want = build_both(parent_list, selected, seq_len, 2, 3, 6, sglang.QLEN_ONLY)
    mask, positions, ridx, first, sibling = ours
    assert positions.tolist() == [2, 3, 3, 4, 4, 5]
    assert first.tolist() == [[1, 3, 4, -1, 5, -1]]
    assert sibling.tolist() == [[-1, 2, -1, -1, -1, -1]]
    assert mask.view(6, 6)[5].tolist() == [True, False, True, False, True, True]
    assert all(torch.equal(a, b) for a, b in zip(ours, want))
    packed, *_ = build_both(parent_list, selected, seq_len, 2, 3, 6, sglang.QLEN_ONLY_BITPACKING)[0]
    assert packed.tolist() == [0b1, 0b11, 0b101, 0b1011, 0b10101, 0b110101]


def test_build_tree_refuses_what_sgl_kernel_cannot_do():
    parent_list = torch.tensor([[-1, 0, 1, 4, 3]])
    seq_len = torch.tensor([2])

    def call(selected, mode=sglang.QLEN_ONLY, n=6, bufs=None):
        bufs = bufs or sgl_buffers(1, n, seq_len, mode)
        sglang.build_tree_kernel_efficient(parent_list, selected, seq_len, *bufs, 2, 3, n, mode)

    with pytest.raises(ValueError, match="was not selected"):
        call(torch.tensor([[0, 1, 3, 5, 7]]))  # place 7's parent, place 4, is missing
    with pytest.raises(ValueError, match="sorted"):
        call(torch.tensor([[7, 0, 1, 3, 4]]))
    with pytest.raises(ValueError, match="outside parent_list"):
        call(torch.tensor([[0, 1, 3, 4, 12]]))
    with pytest.raises(ValueError, match="tree_mask_mode"):
        call(torch.tensor([[0, 1, 3, 4, 7]]), mode=3)
    with pytest.raises(ValueError, match="entries"):
        bufs = sgl_buffers(1, 6, seq_len, sglang.QLEN_ONLY)
        bufs[0] = bufs[0][:-1]
        call(torch.tensor([[0, 1, 3, 4, 7]]), bufs=bufs)
    with pytest.raises(ValueError, match="at most 32"):
        rng = random.Random(3)
        pl, sel = eagle_draft(rng, 1, 4, 4, 33)
        bufs = [torch.zeros(33 * 8, dtype=torch.uint8)] + sgl_buffers(1, 33, seq_len, 1)[1:]
        sglang.build_tree_kernel_efficient(pl, sel, seq_len, *bufs, 4, 4, 33, 2)


# --- verification: SGLang's linked-list trees -----------------------------------------------------

def random_links(rng: random.Random, bs: int, n: int):
    """Random trees as SGLang links them: node 0 the root, every other node's parent an earlier
    node in a random order, siblings linked in a random order (not index order)."""
    first = [[-1] * n for _ in range(bs)]
    sibling = [[-1] * n for _ in range(bs)]
    for b in range(bs):
        order = [0] + rng.sample(range(1, n), n - 1)  # a random topological order
        kids = {v: [] for v in range(n)}
        for k in range(1, n):
            kids[order[rng.randrange(k)]].append(order[k])
        for v, cs in kids.items():
            rng.shuffle(cs)
            if cs:
                first[b][v] = cs[0]
                for x, y in zip(cs, cs[1:]):
                    sibling[b][x] = y
    return torch.tensor(first), torch.tensor(sibling)


def walk_outputs(bs, steps, total):
    return (torch.full((total,), -7, dtype=torch.int32),
            torch.full((bs, steps), -1, dtype=torch.int32),
            torch.full((bs,), -3, dtype=torch.int32))


def greedy_case(rng, bs, n, vocab):
    first, sibling = random_links(rng, bs, n)
    candidates = torch.tensor([[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)])
    # predictions that often equal a child's token, so paths run deep
    predict = torch.tensor([[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)])
    for b in range(bs):
        for v in range(n):
            if first[b, v] >= 0 and rng.random() < 0.75:
                kids = list(ref._walk_links(first, sibling, b, v))
                predict[b, v] = candidates[b, rng.choice(kids)]
    retrive_index = torch.arange(bs * n).reshape(bs, n)
    return candidates, retrive_index, first, sibling, predict


@pytest.mark.parametrize("bs,n,vocab", [(1, 1, 3), (1, 6, 4), (7, 9, 5), (16, 24, 3), (3, 60, 50)])
def test_verify_tree_greedy_equals_sgl_kernel(bs, n, vocab):
    rng = random.Random(bs * 7 + n)
    args = greedy_case(rng, bs, n, vocab)
    for steps in sorted({1, 2, 4, n + 1}):
        outs = []
        for fn in (sglang.verify_tree_greedy, ref.verify_tree_greedy):
            out = walk_outputs(bs, steps, bs * n + 1)
            fn(*out, *args)
            outs.append(out)
        for name, a, b in zip(("predicts", "accept_index", "accept_token_num"), *outs):
            assert torch.equal(a, b), (steps, name, a, b)


def test_verify_tree_greedy_on_eagle_trees():
    rng = random.Random(11)
    bs, topk, steps, n = 6, 3, 4, 12
    parent_list, selected = eagle_draft(rng, bs, topk, steps, n)
    seq_len = torch.full((bs,), 9)
    _, _, ridx, first, sibling = build_both(parent_list, selected, seq_len, topk, steps, n,
                                            sglang.QLEN_ONLY)[1]
    candidates = torch.randint(0, 3, (bs, n), generator=torch.Generator().manual_seed(1))
    predict = torch.randint(0, 3, (bs, n), generator=torch.Generator().manual_seed(2))
    outs = []
    for fn in (sglang.verify_tree_greedy, ref.verify_tree_greedy):
        out = walk_outputs(bs, steps + 1, bs * n + 1)
        fn(*out, candidates, ridx, first, sibling, predict)
        outs.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    assert int(outs[0][2].max()) >= 2  # some row accepted a path, not only roots


def hand_case():
    """Two rows of 6 nodes. Row 0: root -> {1, 3} (list order 3, 1), 1 -> 2, 3 -> 4 -> 5.
    Row 1: root -> {4, 1} (4 first), 1 -> {2, 3}, 4 -> 5. retrive_index is b * 6 + i."""
    candidates = torch.tensor([[50, 11, 12, 13, 14, 15], [60, 21, 22, 23, 21, 25]])
    first = torch.tensor([[3, 2, -1, 4, 5, -1], [4, 2, -1, -1, 5, -1]])
    sibling = torch.tensor([[-1, -1, -1, 1, -1, -1], [-1, -1, 3, -1, 1, -1]])
    retrive_index = torch.arange(12).reshape(2, 6)
    # row 0: the target follows 13 -> 14 -> 15 and predicts 30 after node 5;
    # row 1: at the root it predicts 21, which both node 4 and node 1 carry: list order says 4;
    #        at node 4 it predicts 25 (node 5), after it 31.
    predict = torch.tensor([[13, 40, 40, 14, 15, 30], [21, 22, 40, 40, 25, 31]])
    return candidates, retrive_index, first, sibling, predict


def test_verify_tree_greedy_hand_case():
    args = hand_case()
    out = walk_outputs(2, 4, 13)
    sglang.verify_tree_greedy(*out, *args)
    predicts, accept_index, accept_num = out
    assert accept_index.tolist() == [[0, 3, 4, 5], [6, 10, 11, -1]]
    assert accept_num.tolist() == [3, 2]
    assert predicts.tolist() == [13, -7, -7, 14, 15, 30, 21, -7, -7, -7, 25, 31, -7]
    # two steps: the walk stops at node 3 of row 0, whose own prediction (14) is the bonus
    out = walk_outputs(2, 2, 13)
    sglang.verify_tree_greedy(*out, *args)
    assert out[1].tolist() == [[0, 3], [6, 10]] and out[0].tolist()[3] == 14


def test_verify_tree_greedy_refuses_broken_links():
    candidates, ridx, first, sibling, predict = hand_case()
    looped = sibling.clone()
    looped[0, 1] = 3  # 3 -> 1 -> 3 -> ...: sgl_kernel would spin forever
    with pytest.raises(ValueError, match="reached twice"):
        sglang.verify_tree_greedy(*walk_outputs(2, 4, 13), candidates, ridx, first, looped, predict)
    far = first.clone()
    far[1, 1] = 6
    with pytest.raises(ValueError, match="outside"):
        sglang.verify_tree_greedy(*walk_outputs(2, 4, 13), candidates, ridx, far, sibling, predict)
    wild = ridx.clone()
    wild[1, 4] = 13  # past predicts (13 slots)
    with pytest.raises(ValueError, match="retrive_index: row 1"):
        sglang.verify_tree_greedy(*walk_outputs(2, 4, 13), candidates, wild, first, sibling,
                                  predict)
    with pytest.raises(ValueError, match="candidates: row 1, node 5: token 25"):
        sampling_call(sglang.tree_speculative_sampling_target_only, 2, 4,
                      (candidates, ridx, first, sibling), torch.rand(2, 6), torch.rand(2),
                      torch.full((2, 6, 24), 1 / 24))  # the roots (50, 60) are not read
    with pytest.raises(TypeError, match="int32"):
        out = list(walk_outputs(2, 4, 13))
        out[0] = out[0].long()
        sglang.verify_tree_greedy(*out, candidates, ridx, first, sibling, predict)


# --- the sampled walk -----------------------------------------------------------------------------

def sampling_call(fn, bs, steps, args, uniforms, final, probs, **kw):
    n, vocab = probs.shape[1], probs.shape[2]
    out = walk_outputs(bs, steps, bs * n + 1)
    draft_probs = torch.zeros(bs, n, vocab)
    fn(*out, *args, uniforms, final, probs, draft_probs, **kw)
    return (*out, draft_probs)


def test_sampling_with_one_hot_targets_equals_sgl_kernel():
    """One-hot target rows leave nothing to chance: every output equals sgl_kernel's."""
    candidates, ridx, first, sibling, predict = hand_case()
    vocab = 64
    probs = torch.nn.functional.one_hot(predict, vocab).float()
    uniforms = torch.full((2, 6), 0.5)
    final = torch.full((2,), 0.25)
    args = (candidates, ridx, first, sibling)
    for steps in (1, 2, 4, 7):
        ours = sampling_call(sglang.tree_speculative_sampling_target_only, 2, steps, args,
                             uniforms, final, probs)
        want = sampling_call(ref.tree_speculative_sampling_target_only, 2, steps, args,
                             uniforms, final, probs)
        for name, a, b in zip(("predicts", "accept_index", "accept_token_num", "draft_probs"),
                              ours, want):
            assert torch.equal(a, b), (steps, name)


def tree_law(children, tokens, probs, steps):
    """Exact law of the committed tokens: at node v draw y ~ probs[v]; go on at the first child
    carrying y while fewer than steps - 1 tokens were accepted; else stop. tuple -> probability."""
    law = {}

    def visit(v, prefix, mass, depth):
        for y in range(probs.shape[-1]):
            p = float(probs[v, y]) * mass
            if p == 0.0:
                continue
            child = next((c for c in children[v] if tokens[c] == y), None)
            if child is None or depth == steps - 1:
                law[prefix + (y,)] = law.get(prefix + (y,), 0.0) + p
            else:
                visit(child, prefix + (y,), p, depth + 1)

    visit(0, (), 1.0, 0)
    return law


def sampled_counts(fn, tree, probs, rows, steps, seed, **kw):
    """Run the same tree in `rows` rows of one call, fresh uniforms per row; count the committed
    token sequences."""
    first, sibling, tokens = tree
    n = len(tokens)
    gen = torch.Generator().manual_seed(seed)
    args = (torch.tensor([tokens] * rows), torch.arange(rows * n).reshape(rows, n),
            first.expand(rows, n).contiguous(), sibling.expand(rows, n).contiguous())
    uniforms = torch.rand(rows, n, generator=gen)
    final = torch.rand(rows, generator=gen)
    predicts, accept_index, num, _ = sampling_call(fn, rows, steps, args, uniforms, final,
                                                   probs.expand(rows, *probs.shape), **kw)
    counts = {}
    for b in range(rows):
        slots = accept_index[b, :int(num[b]) + 1].tolist()
        key = tuple(int(predicts[s]) for s in slots)
        counts[key] = counts.get(key, 0) + 1
    return counts


def sampling_tree(duplicate: bool):
    """Root -> {a, b, c} (list order c, a, b), a -> {d, e}, e -> f; vocabulary 5.
    With duplicate, the root's children a and c carry the same token."""
    tokens = [0, 1, 3, 1 if duplicate else 4, 2, 0, 4]
    first = torch.tensor([3, 4, -1, -1, -1, 6, -1])
    sibling = torch.tensor([-1, 2, -1, 1, 5, -1, -1])
    children = {0: [3, 1, 2], 1: [4, 5], 2: [], 3: [], 4: [], 5: [6], 6: []}
    return (first, sibling, tokens), children


def target_probs(n, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(n, vocab, generator=gen) ** 2
    probs[torch.rand(n, vocab, generator=gen) < 0.2] = 0.0  # zero-probability tokens
    probs[:, 0] += 0.05
    return probs / probs.sum(-1, keepdim=True)


@pytest.mark.parametrize("steps", [2, 4])
def test_sampling_is_lossless(steps):
    rows = 4000
    tree, children = sampling_tree(duplicate=False)
    probs = target_probs(len(tree[2]), 5, seed=steps)
    law = tree_law(children, tree[2], probs, steps)
    ours = sampled_counts(sglang.tree_speculative_sampling_target_only, tree, probs, rows, steps,
                          seed=1)
    assert chi2_pvalue(ours, law, rows) > 1e-3
    # the same test holds SGLang's own rule to the same law, and catches its lossy thresholds
    theirs = sampled_counts(ref.tree_speculative_sampling_target_only, tree, probs, rows, steps,
                            seed=2)
    assert chi2_pvalue(theirs, law, rows) > 1e-3
    lossy = sampled_counts(ref.tree_speculative_sampling_target_only, tree, probs, rows, steps,
                           seed=3, threshold_acc=0.5)
    assert chi2_pvalue(lossy, law, rows) < 1e-6


def test_sampling_with_duplicate_siblings_stays_lossless():
    rows = 4000
    tree, children = sampling_tree(duplicate=True)
    probs = target_probs(len(tree[2]), 5, seed=9)
    law = tree_law(children, tree[2], probs, 3)
    ours = sampled_counts(sglang.tree_speculative_sampling_target_only, tree, probs, rows, 3,
                          seed=4)
    assert chi2_pvalue(ours, law, rows) > 1e-3
    theirs = sampled_counts(ref.tree_speculative_sampling_target_only, tree, probs, rows, 3,
                            seed=5)
    assert chi2_pvalue(theirs, law, rows) < 1e-6  # sgl_kernel counts the duplicate twice


def test_sampling_random_numbers():
    tree, _ = sampling_tree(duplicate=False)
    probs = target_probs(len(tree[2]), 5, seed=1)
    fn = sglang.tree_speculative_sampling_target_only
    # equal uniforms, equal tokens; fresh uniforms, fresh draws
    assert sampled_counts(fn, tree, probs, 50, 4, seed=6) == sampled_counts(fn, tree, probs, 50, 4,
                                                                             seed=6)
    spread = sampled_counts(fn, tree, probs, 200, 4, seed=7)
    assert len(spread) > 5
    # an explicit seed and position key the draws: the uniforms no longer matter
    first, sibling, tokens = tree
    n = len(tokens)
    args = (torch.tensor([tokens] * 3), torch.arange(3 * n).reshape(3, n),
            first.expand(3, n).contiguous(), sibling.expand(3, n).contiguous())
    runs = [sampling_call(fn, 3, 4, args, torch.rand(3, n), torch.rand(3), probs.expand(3, n, 5),
                          seed=torch.tensor([5, 5, 6]), position=17) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_sampling_refuses_lossy_thresholds():
    candidates, ridx, first, sibling, predict = hand_case()
    probs = torch.full((2, 6, 64), 1 / 64)
    for single, acc in ((0.5, 1.0), (1.0, 0.9), (1.0, 2.0)):
        with pytest.raises(ValueError, match="lossy"):
            sampling_call(sglang.tree_speculative_sampling_target_only, 2, 4,
                          (candidates, ridx, first, sibling), torch.rand(2, 6), torch.rand(2),
                          probs, threshold_single=single, threshold_acc=acc)


@pytest.mark.cuda
def test_adapters_on_cuda_equal_cpu():
    rng = random.Random(5)
    bs, topk, steps, n = 4, 2, 4, 10
    parent_list, selected = eagle_draft(rng, bs, topk, steps, n)
    seq_len = torch.tensor([3, 0, 7, 12])
    for mode in MODES:
        cpu = sgl_buffers(bs, n, seq_len, mode)
        sglang.build_tree_kernel_efficient(parent_list, selected, seq_len, *cpu, topk, steps, n,
                                           mode)
        gpu = sgl_buffers(bs, n, seq_len, mode, "cuda")
        sglang.build_tree_kernel_efficient(parent_list.cuda(), selected.cuda(), seq_len.cuda(),
                                           *gpu, topk, steps, n, mode)
        assert all(torch.equal(a.view(torch.uint8) if a.dtype != torch.bool else a,
                               (b.view(torch.uint8) if b.dtype != torch.bool else b).cpu())
                   for a, b in zip(cpu, gpu))
    args = greedy_case(rng, 5, 12, 4)
    cpu, gpu = walk_outputs(5, 4, 61), [t.cuda() for t in walk_outputs(5, 4, 61)]
    sglang.verify_tree_greedy(*cpu, *args)
    sglang.verify_tree_greedy(*gpu, *[a.cuda() for a in args])
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu))
    probs = target_probs(12, 7, seed=3).expand(5, 12, 7).contiguous()
    candidates = args[0] % 7
    outs = []
    for dev in ("cpu", "cuda"):
        out = [t.to(dev) for t in walk_outputs(5, 4, 61)]
        draft_probs = torch.zeros(5, 12, 7, device=dev)
        sglang.tree_speculative_sampling_target_only(
            *out, candidates.to(dev), *[a.to(dev) for a in args[1:4]], torch.rand(5, 12).to(dev),
            torch.rand(5).to(dev), probs.to(dev), draft_probs, seed=torch.arange(5).to(dev),
            position=3)
        outs.append([t.cpu() for t in (*out, draft_probs)])
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_docstring_examples_run():
    import doctest

    assert doctest.testmod(sglang, raise_on_error=False).failed == 0


def test_eagle_parents_verify_without_the_links():
    """The documented route: eagle_parents straight into ops.verify_tree gives what
    build_tree_kernel_efficient + verify_tree_greedy give, with no link read back."""
    from specdec_cuda import ops

    rng = random.Random(21)
    bs, topk, steps, n, vocab = 5, 3, 4, 14, 4
    parent_list, selected = eagle_draft(rng, bs, topk, steps, n)
    seq_len = torch.zeros(bs, dtype=torch.int64)
    _, _, ridx, first, sibling = build_both(parent_list, selected, seq_len, topk, steps, n,
                                            sglang.QLEN_ONLY)[0]
    gen = torch.Generator().manual_seed(4)
    candidates = torch.randint(0, vocab, (bs, n), generator=gen)
    logits = torch.randn(bs, n, vocab, generator=gen)
    out = walk_outputs(bs, steps + 1, bs * n + 1)
    sglang.verify_tree_greedy(*out, candidates, ridx, first, sibling, logits.argmax(-1))
    parents = sglang.eagle_parents(parent_list, selected, topk, check=False)
    res = ops.verify_tree(candidates.reshape(-1), parents.reshape(-1),
                          torch.arange(0, bs * n + 1, n), logits, max_nodes=n, check=False)
    assert res.num_accepted.tolist() == out[2].tolist()
    assert int(res.num_accepted.max()) >= 1
    for b in range(bs):
        k = int(res.num_accepted[b]) + 1
        slots = (b * n + res.accepted_nodes[b, :k]).tolist()
        assert out[1][b, :k].tolist() == slots
        assert out[0][slots].tolist() == res.tokens[b, :k].tolist()
    # unchecked, an orphan makes its row malformed instead of wrong: place 7's parent is place 4
    orphaned = sglang.eagle_parents(torch.tensor([[-1, 0, 1, 4, 3]] * 2),
                                    torch.tensor([[0, 1, 3, 4, 7], [0, 1, 3, 5, 7]]), 2,
                                    check=False)
    lay = ops.build_tree(orphaned.reshape(-1), torch.tensor([0, 6, 12]),
                         torch.zeros(2, dtype=torch.int64), max_nodes=6, check=False)
    assert lay.status.tolist() == [0, 4]
