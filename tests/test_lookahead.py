"""Lookahead decoding and lookahead + draft model (proposers/lookahead.py).

The conformance suite (test_conformance.py) holds both methods to greedy equality and the sampled
distribution; here: the guess-tree merge, the Jacobi window's bookkeeping (the layout it sends, how
it fills, shifts and feeds the pool), and end-to-end properties on small random checkpoints.
"""

from __future__ import annotations

import random

import pytest
import torch

import specdec_cuda
import specdec_cuda.ops as ops
from decoding_models import load_backend, make_checkpoint
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.proposers.base import Outcome, PrefillContext, StepState
from specdec_cuda.proposers.lookahead import LookaheadProposer, merge_paths, tree_paths
from specdec_cuda.reference import lookahead as ref

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8, 9, 10, 11], [4]]


# -- the guess tree --------------------------------------------------------------------------------

def _paths_of(tokens, parents):
    return sorted(tree_paths(tokens, parents, len(tokens)))


def test_merge_paths_shares_prefixes_once_in_bfs_order():
    tokens, parents = merge_paths([[1, 2, 3], [1, 2, 4], [1, 5], [6]], max_nodes=10, max_depth=3)
    assert tokens == [1, 6, 2, 5, 3, 4]
    assert parents == [0, 0, 1, 1, 3, 3]
    assert _paths_of(tokens, parents) == [[1, 2, 3], [1, 2, 4], [1, 5], [6]]


@pytest.mark.parametrize("seed", range(20))
def test_merge_paths_keeps_every_path_under_budget_and_depth(seed):
    rng = random.Random(seed)
    paths = [[rng.randrange(3) for _ in range(rng.randrange(1, 5))] for _ in range(rng.randrange(1, 6))]
    budget, depth = rng.randrange(1, 12), rng.randrange(1, 5)
    tokens, parents = merge_paths(paths, budget, depth)
    assert len(tokens) <= budget and all(p <= j for j, p in enumerate(parents))
    depth_of = [0]
    for p in parents:
        depth_of.append(depth_of[p] + 1)
    assert max(depth_of) <= depth
    # No two siblings carry the same token (shared prefixes are stored once).
    for parent in set(parents):
        kids = [t for t, p in zip(tokens, parents) if p == parent]
        assert len(kids) == len(set(kids))
    # With room for every node, every path (cut at the depth) is a root path of the tree.
    if budget >= sum(len(p) for p in paths):
        got = {tuple(p) for p in tree_paths(tokens, parents, len(tokens))}
        prefixes = {tuple(q[:i]) for q in got for i in range(1, len(q) + 1)}
        assert all(tuple(p[:depth]) in prefixes for p in paths)


# -- the Jacobi window ----------------------------------------------------------------------------

def _prefilled(window=3, ngram=4, prompts=((3, 4, 5, 6, 7), (8, 9))):
    proposer = LookaheadProposer(window=window, ngram=ngram, num_guesses=3)
    width = max(len(p) for p in prompts)
    padded = torch.zeros(len(prompts), width, dtype=torch.int64)
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = torch.tensor(p)
    lens = torch.tensor([len(p) for p in prompts])
    first = torch.tensor([11, 12])
    params = SamplingParams.make(len(prompts))
    proposer.prefill(PrefillContext(None, None, padded, lens, first, params, 64))
    return proposer, lens, first, params


def _state(lens, last, params):
    batch = lens.shape[0]
    return StepState(last, lens, torch.ones(batch, dtype=torch.bool), torch.full((batch,), 3), params)


def _outcome(lens, last, extra_logits, active=None):
    batch = lens.shape[0]
    tokens = torch.stack([last, torch.full_like(last, -1)], dim=1)
    nodes = torch.tensor([[0, -1]] * batch)
    active = torch.ones(batch, dtype=torch.bool) if active is None else active
    return Outcome(torch.zeros(batch, dtype=torch.int64), nodes, tokens, last, active, lens,
                   extra_logits=extra_logits)


def test_window_rows_follow_the_kernel_layout_fill_shift_and_feed_the_pool():
    W, N, V = 3, 4, 50
    proposer, lens, last, params = _prefilled(W, N)
    levels = []
    for step in range(5):
        state = _state(lens, last, params)
        extra = proposer.extra_rows(state, None)
        filled = min(step + 1, N - 1)
        e = W * filled
        positions, mask, _ = ref.lookahead_mask(lens, torch.zeros(2, 0, dtype=torch.int64), 0, W, filled)
        assert torch.equal(extra.positions, positions[:, 1:]) and torch.equal(extra.mask, mask[:, 1:, 1:])
        assert extra.tokens.shape == (2, e)
        window = extra.tokens.view(2, filled, W)
        if step == 0:
            levels = [window[:, 0]]
        assert all(torch.equal(window[:, i], levels[i]) for i in range(filled))
        # The target "predicts" token 20 + step + column at every window slot.
        new_top = 20 + step + torch.arange(W).expand(2, W)
        logits = torch.full((2, e, V), -5.0)
        logits.scatter_(2, torch.cat([new_top] * filled, dim=1)[:, :, None], 5.0)
        sizes_before = [len(p) for p in proposer.pool]
        proposer.accept(None, _outcome(lens, last, logits))
        if filled == N - 1:  # full: each column and its new top became an n-gram
            for b in range(2):
                assert len(proposer.pool[b]) == sizes_before[b] + W * N and proposer.pool[b].num_documents >= W
                tail = proposer.pool[b].tokens()[-W * N:].view(W, N)
                expect = torch.stack([lv[b] for lv in levels] + [new_top[b]], dim=1)
                assert torch.equal(tail, expect)
            levels = levels[1:] + [new_top]
        else:
            assert [len(p) for p in proposer.pool] == sizes_before
            levels.append(new_top)
        lens = lens + 1


def test_finished_rows_keep_their_window_and_pool():
    proposer, lens, last, params = _prefilled(2, 3)
    for _ in range(3):
        extra = proposer.extra_rows(_state(lens, last, params), None)
        before = extra.tokens[1].clone()
        logits = torch.randn(2, extra.tokens.shape[1], 30)
        size = len(proposer.pool[1])
        proposer.accept(None, _outcome(lens, last, logits, active=torch.tensor([True, False])))
        after = proposer.extra_rows(_state(lens, last, params), None).tokens[1]
        assert torch.equal(after[: before.numel()], before) and len(proposer.pool[1]) == size


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="ngram >= 2"):
        LookaheadProposer(ngram=1)
    with pytest.raises(ValueError, match="window >= 0"):
        LookaheadProposer(window=-1)
    with pytest.raises(TypeError, match="no option 'k'"):
        specdec_cuda.SpeculativeDecoder(object(), "lookahead", k=3)
    with pytest.raises(ValueError, match="needs draft="):
        specdec_cuda.SpeculativeDecoder(object(), "lookahead+draft")


# -- end to end -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookahead")
    target = make_checkpoint(root / "target", seed=0)
    draft = make_checkpoint(root / "draft", perturb_from=target, noise=0.05, seed=1)
    return load_backend(target, "builtin"), load_backend(draft, "builtin")


CONFIGS = [
    ("lookahead", dict(window=4, ngram=4, num_guesses=4)),
    ("lookahead", dict(window=5, ngram=3, num_guesses=2, own_candidates=0)),  # pool guesses only
    ("lookahead", dict(window=2, ngram=5, num_guesses=1, own_candidates=0)),  # one guess: a chain
    ("lookahead+draft", dict(window=3, ngram=3, num_guesses=3, k=3)),
    ("lookahead+draft", dict(window=0, ngram=4, num_guesses=2, k=2)),  # n-gram guesses + the chain
    ("lookahead+draft", dict(window=2, ngram=4, num_guesses=2, k=3, adaptive=False)),  # always everything
]


@pytest.mark.parametrize("method,options", CONFIGS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CONFIGS)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_same_tokens_as_autoregressive_with_the_same_seed(pair, method, options, temperature):
    target, draft = pair
    if method == "lookahead+draft":
        options = dict(options, draft=draft)
    kw = dict(max_new_tokens=40, temperature=temperature, seed=[3, 4, 5])
    # Always drafting: on this tiny model the cost policy (the default) may rightly decode plainly.
    out = specdec_cuda.generate(target, PROMPTS, method=method, policy="fixed", **options, **kw)
    assert out.tokens == specdec_cuda.generate(target, PROMPTS, **kw).tokens
    assert out.metrics.tau > 1.0  # guesses were accepted


def test_pool_guesses_alone_are_accepted_and_memory_is_reported(pair):
    target, _ = pair
    proposer = LookaheadProposer(window=6, ngram=3, num_guesses=3, own_candidates=0)
    params = SamplingParams.make(len(PROMPTS))
    out = decode(target, PROMPTS, params, 48, proposer=proposer)
    assert out.tokens == decode(target, PROMPTS, params, 48).tokens
    assert out.metrics.acceptance_rate > 0.0  # only pool n-grams were guessed
    assert all(len(p) > 0 for p in proposer.pool)
    assert all(m > 0 for m in proposer.memory_bytes())


def test_every_forward_carries_the_window_as_laid_out_by_the_kernel(pair):
    target, _ = pair
    seen = []

    class Recorder:
        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            return getattr(self.model, name)

        def forward(self, tokens, positions, cache, tree_mask=None, hidden_layers=(), logits_at=None):
            seen.append((tokens.shape[1], positions.clone(), None if tree_mask is None else tree_mask.clone()))
            return self.model.forward(tokens, positions, cache, tree_mask=tree_mask, hidden_layers=hidden_layers,
                                      logits_at=logits_at)

    W, N = 3, 3
    proposer = LookaheadProposer(window=W, ngram=N, num_guesses=2)
    params = SamplingParams.make(1)
    decode(Recorder(target), [PROMPTS[0]], params, 12, proposer=proposer)
    steps = seen[1:]  # after the prefill
    assert steps
    length = len(PROMPTS[0])
    for i, (width, positions, mask) in enumerate(steps):
        filled = min(i + 1, N - 1)
        e = W * filled
        m = width - e  # root + draft nodes
        lay = ops.lookahead_mask(torch.tensor([int(positions[0, 0])]), torch.zeros(1, 0, dtype=torch.int64), 0,
                                 W, filled)
        assert torch.equal(positions[:, m:], lay.positions[:, 1:])
        assert torch.equal(mask[0, m:, m:], lay.tree_mask[0, 1:, 1:])
        assert mask[0, m:, 0].all() and not mask[0, m:, 1:m].any() and not mask[0, :m, m:].any()
        assert int(positions[0, 0]) >= length


def test_arms_follow_measured_throughput_and_keep_exploring(pair, monkeypatch):
    from specdec_cuda.proposers import lookahead as module
    from specdec_cuda.proposers.draft_model import DraftModelProposer

    _, draft = pair
    proposer = LookaheadProposer(window=2, ngram=3, drafter=DraftModelProposer(draft, k=2, verification="match"),
                                 explore_every=4)
    clock = [0.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock[0])
    proposer._step_start = 0.0
    # Each arm's step takes this long and commits 2 tokens: "lookahead" is the fastest.
    seconds = {"all": 0.05, "lookahead": 0.02, "draft": 0.04, "ngram": 0.03}
    used = []
    for _ in range(60):
        used.append(proposer.arm)
        clock[0] += seconds[proposer.arm]
        proposer._choose_arm(2, 0.0)  # no catch-up in these steps
    assert used[:8] == ["all", "all", "lookahead", "lookahead", "draft", "draft", "ngram", "ngram"]
    tail = used[8:]
    assert tail.count("lookahead") >= 0.6 * len(tail)
    assert {"all", "draft", "ngram"} <= set(tail)  # the others are re-measured now and then
    # Without a drafter (or without a window) there is nothing to choose between.
    assert not LookaheadProposer(window=2).adaptive
    assert not LookaheadProposer(window=0, drafter=DraftModelProposer(draft, k=2, verification="match")).adaptive
