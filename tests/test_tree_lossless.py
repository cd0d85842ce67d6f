"""verify_tree is lossless: the committed tokens follow the target distribution exactly.

A Markov "model" on a small vocabulary: the target's next-token logits depend only on the
previous token (table ``target_table[prev]``), the drafter's likewise (``draft_table[prev]``).
Each batch row is one independent trial with its own seed. The tree's node tokens are drawn
i.i.d. from the drafter (SpecInfer mode) or set deterministically with duplicate siblings
(one-hot mode). The first committed token must follow ``p(. | root)`` and the first two
``p(t1 | root) p(t2 | t1)`` (a second verification step rooted at t1 supplies t2 when the first
step committed only one token). Chi-square with fixed seeds, so the test is deterministic.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

import specdec_cuda.ops as ops
from specdec_cuda.reference.sampling import probs_of, scaled_logits

from tree_cases import chain, random_parents

VOCAB = 6
TRIALS = 6000

TREES = {
    # root with five children (duplicates are frequent on 6 tokens), each with two children
    "wide": [-1, 0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
    # a chain of 7 with side branches
    "deep": chain(7) + [0, 1, 7, 3],
    # a lopsided random tree
    "unbalanced": random_parents(14, torch.Generator().manual_seed(21), max_children=3),
}


def _tables(seed):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(VOCAB, VOCAB, generator=gen) * 1.5
    draft = target + torch.randn(VOCAB, VOCAB, generator=gen)  # close to, not equal to, target
    return target, draft


def _dist(table, temperature, top_k, top_p):
    return torch.stack([probs_of(scaled_logits(table[i], temperature, top_k, top_p))
                        for i in range(VOCAB)])


def _node_tokens(parents, root, draft_probs, onehot, gen):
    """(trials, n) node tokens: drafts ~ q(. | parent token), or fixed with duplicate siblings."""
    n = len(parents)
    toks = torch.empty(root.numel(), n, dtype=torch.int64)
    toks[:, 0] = root
    for v in range(1, n):
        par = toks[:, parents[v]]
        if onehot:
            rank = sum(1 for c in range(1, v) if parents[c] == parents[v])
            toks[:, v] = (par + rank // 2) % VOCAB  # siblings come in duplicate pairs
        else:
            toks[:, v] = torch.multinomial(draft_probs[par], 1, generator=gen).squeeze(1)
    return toks


def _step(parents, root, position, seed, target, draft, params, onehot, gen):
    n = len(parents)
    trials = root.numel()
    toks = _node_tokens(parents, root, _dist(draft, *params), onehot, gen)
    all_parents = torch.tensor(parents).repeat(trials)
    cu = torch.arange(trials + 1) * n
    target_logits = target[toks]  # (trials, n, V)
    draft_logits = None if onehot else draft[toks]
    res = ops.verify_tree(toks.flatten(), all_parents, cu, target_logits, draft_logits,
                          temperature=params[0], top_k=params[1], top_p=params[2], seed=seed,
                          position=position)
    assert (res.status == 0).all()
    return res


# 26 chi-square tests at this level: a false alarm in 0.26% of seed choices; a real bias of the size
# a wrong acceptance rule gives is far below it at these counts.
P_MIN = 1e-4


def _chisquare(observed, expected_probs):
    expected = expected_probs / expected_probs.sum() * observed.sum()  # float64 sums agree
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs.numpy(), exp.numpy()).pvalue


@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("mode,params", [
    ("specinfer", (1.0, 0, 1.0)),
    ("onehot", (1.0, 0, 1.0)),
    ("specinfer", (0.8, 4, 0.9)),
    ("onehot", (0.8, 4, 0.9)),
])
def test_first_two_tokens_follow_target(tree, mode, params):
    parents = TREES[tree]
    onehot = mode == "onehot"
    target, draft = _tables(seed=len(tree) * 7 + int(onehot))
    gen = torch.Generator().manual_seed(7)
    root = torch.full((TRIALS,), 2, dtype=torch.int64)
    seed = torch.arange(TRIALS) * 7919 + 17
    first = _step(parents, root, 10, seed, target, draft, params, onehot, gen)
    t1 = first.tokens[:, 0]
    t2 = first.tokens[:, 1].clone()
    short = first.num_accepted == 0  # only one token committed: a second step rooted at t1
    if short.any():
        second = _step(parents, t1[short], 11, seed[short], target, draft, params, onehot, gen)
        t2[short] = second.tokens[:, 0]
    assert first.num_accepted.float().mean() > 0.3  # the trees are really walked

    p = _dist(target, *params)
    p1 = p[2]
    counts1 = torch.bincount(t1, minlength=VOCAB).double()
    assert _chisquare(counts1, p1.double()) > P_MIN
    joint = (p1[:, None] * p).flatten().double()
    counts2 = torch.bincount(t1 * VOCAB + t2, minlength=VOCAB * VOCAB).double()
    assert _chisquare(counts2, joint) > P_MIN


def test_chisquare_detects_a_wrong_distribution():
    """The statistic above has power: the drafter's distribution is rejected."""
    target, draft = _tables(seed=3)
    gen = torch.Generator().manual_seed(5)
    q = _dist(draft, 1.0, 0, 1.0)[2]
    draws = torch.multinomial(q, TRIALS, replacement=True, generator=gen)
    p = _dist(target, 1.0, 0, 1.0)[2]
    assert _chisquare(torch.bincount(draws, minlength=VOCAB).double(), p.double()) < P_MIN
