"""Cache semantics of the model protocol, on both backends (built-in model and HF adapter), in fp64:
pending slots, commit, truncate, tree compaction, ragged rows and tree masks."""

from __future__ import annotations

import pytest
import torch

from _models_testlib import VOCAB, ancestors_mask, depths, make_hf_model, path_to, save_checkpoint

from specdec_cuda import models

# fp64 everywhere: the batched/tree forwards and their one-row/causal references differ only by
# summation order over masked slots, so they agree to ~1e-15.
EXACT = dict(rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module", params=["builtin", "hf"])
def model(request, tmp_path_factory):
    hf = make_hf_model("llama3").double()
    if request.param == "hf":
        return models.HFCausalLM(hf)
    return models.load(save_checkpoint(hf, tmp_path_factory.mktemp("llama3")), dtype=torch.float64)


def rand_tokens(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def prefill(model, prompts: list[torch.Tensor], max_length: int = 64):
    """Cache with each row's prompt committed (shorter rows padded with token 0); prompt logits."""
    B, n = len(prompts), max(len(p) for p in prompts)
    tokens = torch.zeros(B, n, dtype=torch.int64)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = p
    cache = model.new_cache(B, max_length)
    out = model.forward(tokens, torch.arange(n).expand(B, n), cache)
    cache.commit(torch.tensor([len(p) for p in prompts]))
    return cache, out.logits


def step(model, cache, tokens: torch.Tensor, num_kept: list[int], **kw):
    """Forward ``tokens`` [B, n] after each row's committed tokens, then commit ``num_kept``."""
    B, n = tokens.shape
    out = model.forward(tokens, cache.lengths[:, None] + torch.arange(n), cache, **kw)
    cache.commit(torch.tensor(num_kept), kw.get("kept_indices"))
    return out.logits


def test_ragged_rows_equal_rows_alone(model):
    # Prompts of different lengths, then chunks whose commits leave the rows at different lengths
    # (as ragged acceptance does): every real token's logits equal those of its row run alone.
    prompts = [rand_tokens(1, 5), rand_tokens(2, 9), rand_tokens(3, 7)]
    chunks = [rand_tokens(4, 3, 1), rand_tokens(5, 3, 4), rand_tokens(6, 3, 3), rand_tokens(7, 3, 1)]
    keeps = [[1, 1, 1], [1, 4, 2], [3, 0, 2], [1, 1, 1]]

    cache, logits = prefill(model, prompts)
    batched = [logits] + [step(model, cache, c, k) for c, k in zip(chunks, keeps)]
    assert cache.lengths.tolist() == [len(p) + sum(k[b] for k in keeps) for b, p in enumerate(prompts)]

    for b, prompt in enumerate(prompts):
        alone_cache, alone_logits = prefill(model, [prompt])
        torch.testing.assert_close(batched[0][b, : len(prompt)], alone_logits[0], **EXACT)
        for i, (c, k) in enumerate(zip(chunks, keeps)):
            alone = step(model, alone_cache, c[b : b + 1], [k[b]])
            torch.testing.assert_close(batched[i + 1][b], alone[0], **EXACT)


TREES = [
    [-1, 0, 0, 1, 1, 2, 4],  # root with two subtrees, depth 3
    [-1, 0, 1, 0, 3, 3, 5],
]


def test_tree_forward_equals_path_forwards_and_compaction(model):
    # Rows with different prefixes and different trees. Each node's logits equal the last logits
    # of a causal forward over its root-to-node path; committing one path with kept_indices
    # leaves the cache as if that path had been fed causally.
    prompts = [rand_tokens(10, 6), rand_tokens(11, 10)]
    tree_tokens = rand_tokens(12, 2, 7)
    tree_mask = torch.stack([ancestors_mask(p) for p in TREES])
    positions = torch.tensor([[len(p) + d for d in depths(t)] for p, t in zip(prompts, TREES)])
    kept_paths = [path_to(TREES[0], 6), path_to(TREES[1], 5)]  # [0, 1, 4, 6] and [0, 3, 5]
    next_tokens = rand_tokens(13, 2, 1)

    cache, _ = prefill(model, prompts)
    out = model.forward(tree_tokens, positions, cache, tree_mask=tree_mask)
    kept = torch.full((2, 7), -1)
    for b, path in enumerate(kept_paths):
        kept[b, : len(path)] = torch.tensor(path)
    cache.commit(torch.tensor([len(p) for p in kept_paths]), kept)
    assert cache.lengths.tolist() == [6 + 4, 10 + 3]
    after = step(model, cache, next_tokens, [1, 1])

    for b, (prompt, parents) in enumerate(zip(prompts, TREES)):
        for node in range(len(parents)):
            path = path_to(parents, node)
            ref_cache, _ = prefill(model, [prompt])
            ref = step(model, ref_cache, tree_tokens[b : b + 1, path], [len(path)])
            torch.testing.assert_close(out.logits[b, node], ref[0, -1], **EXACT)
        ref_cache, _ = prefill(model, [prompt])
        step(model, ref_cache, tree_tokens[b : b + 1, kept_paths[b]], [len(kept_paths[b])])
        ref_next = step(model, ref_cache, next_tokens[b : b + 1], [1])
        torch.testing.assert_close(after[b], ref_next[0], **EXACT)


def test_builtin_compaction_moves_kv_slots(tmp_path):
    # On the static cache, compare the moved K/V slots themselves, for every layer.
    hf = make_hf_model("qwen3").double()
    model = models.load(save_checkpoint(hf, tmp_path / "q3"), dtype=torch.float64)
    prompt = rand_tokens(20, 5)
    tree_tokens = rand_tokens(21, 1, 7)
    path = path_to(TREES[0], 5)  # [0, 2, 5]
    cache, _ = prefill(model, [prompt])
    model.forward(
        tree_tokens, torch.tensor([[5 + d for d in depths(TREES[0])]]), cache, tree_mask=ancestors_mask(TREES[0])[None]
    )
    cache.commit(torch.tensor([3]), torch.tensor([[0, 2, 5, -1]]))
    ref, _ = prefill(model, [prompt])
    step(model, ref, tree_tokens[:, path], [3])
    torch.testing.assert_close(cache.kv[..., :8, :], ref.kv[..., :8, :], **EXACT)


def test_truncate_rolls_back(model):
    prompts = [rand_tokens(30, 8), rand_tokens(31, 8)]
    more = rand_tokens(32, 2, 6)
    cache, _ = prefill(model, prompts)
    first = step(model, cache, more, [6, 6])
    cache.truncate(torch.tensor([10, 12]))  # ragged roll-back: rows keep 2 and 4 of the 6
    assert cache.lengths.tolist() == [10, 12]
    # Re-feed the dropped tokens (row 1 has two, then padding): the same logits as the first time.
    refeed = torch.stack([more[0, 2:], torch.cat([more[1, 4:], torch.zeros(2, dtype=torch.int64)])])
    again = step(model, cache, refeed, [4, 2])
    torch.testing.assert_close(again[0], first[0, 2:], **EXACT)
    torch.testing.assert_close(again[1, :2], first[1, 4:], **EXACT)
    assert cache.lengths.tolist() == [14, 14]


def test_uncommitted_forward_is_discarded(model):
    prompt = [rand_tokens(40, 6)]
    cache, _ = prefill(model, prompt)
    model.forward(rand_tokens(41, 1, 5), torch.arange(6, 11)[None], cache)  # never committed
    got = step(model, cache, rand_tokens(42, 1, 3), [3])
    ref_cache, _ = prefill(model, prompt)
    torch.testing.assert_close(got, step(model, ref_cache, rand_tokens(42, 1, 3), [3]), **EXACT)


def test_tree_mask_diagonal_is_implied(model):
    # A mask whose diagonal is False still lets each token see itself (no empty attention row).
    prompt = [rand_tokens(50, 4)]
    parents = TREES[0]
    mask = ancestors_mask(parents) & ~torch.eye(7, dtype=torch.bool)
    positions = torch.tensor([[4 + d for d in depths(parents)]])
    cache, _ = prefill(model, prompt)
    a = model.forward(rand_tokens(51, 1, 7), positions, cache, tree_mask=mask[None]).logits
    b = model.forward(rand_tokens(51, 1, 7), positions, cache, tree_mask=ancestors_mask(parents)[None]).logits
    torch.testing.assert_close(a, b, **EXACT)


def test_bad_commits_and_shapes_raise(model):
    cache, _ = prefill(model, [rand_tokens(60, 4), rand_tokens(61, 4)], max_length=12)
    model.forward(rand_tokens(62, 2, 3), torch.arange(4, 7).expand(2, 3), cache)
    with pytest.raises(ValueError, match="num_kept must lie in"):
        cache.commit(torch.tensor([4, 1]))
    with pytest.raises(ValueError, match="num_kept must lie in"):
        cache.commit(torch.tensor([-1, 1]))
    with pytest.raises(ValueError, match="num_kept must have shape"):
        cache.commit(torch.tensor([1]))
    with pytest.raises(ValueError, match="kept_indices must index"):
        cache.commit(torch.tensor([2, 1]), torch.tensor([[0, 3, -1], [0, -1, -1]]))
    with pytest.raises(ValueError, match="kept_indices has 4 columns"):
        cache.commit(torch.tensor([2, 1]), torch.full((2, 4), 0))
    cache.commit(torch.tensor([2, 0]))
    assert cache.lengths.tolist() == [6, 4]
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(torch.tensor([7, 4]))
    with pytest.raises(ValueError, match="KV cache overflow"):
        model.forward(rand_tokens(63, 2, 7), torch.arange(6, 13).expand(2, 7), cache)
    with pytest.raises(ValueError, match="positions must have the shape"):
        model.forward(rand_tokens(64, 2, 2), torch.arange(2)[None], cache)
    with pytest.raises(ValueError, match="tree_mask must have shape"):
        bad_mask = torch.ones(2, 3, 3, dtype=torch.bool)
        model.forward(rand_tokens(64, 2, 2), torch.arange(2).expand(2, 2), cache, tree_mask=bad_mask)
    with pytest.raises(ValueError, match="hidden_layers"):
        model.forward(rand_tokens(64, 2, 2), torch.arange(2).expand(2, 2), cache, hidden_layers=(model.num_layers,))
    with pytest.raises(ValueError, match="rows but the cache"):
        model.forward(rand_tokens(64, 3, 2), torch.arange(2).expand(3, 2), cache)
