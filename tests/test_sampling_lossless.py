"""Losslessness: what verify_chain / sample emit is distributed as the target's exact distribution.

Each case repeats one small-vocab problem over many rows with different seeds (fixed, so the tests
are deterministic), draws the drafts from q with the DRAFT stream, and chi-squares the emitted
tokens against p computed exactly in float64: the first emitted token, the token after an accepted
first draft, and the bonus token after a fully accepted chain.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

import specdec_cuda.ops as ops

ROWS = 12000
P_MIN = 1e-3  # p-value below which the test fails (fixed seeds: deterministic)


def exact_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """float64 p = softmax(logits / T) under top-k / top-p (the semantics of reference.sampling)."""
    s = logits.double() / temperature
    vocab = s.numel()
    if 0 < top_k < vocab:
        kth = torch.topk(s, top_k).values[-1]
        s = torch.where(s >= kth, s, torch.full_like(s, -math.inf))
    if top_p < 1.0:
        probs = torch.softmax(s, 0)
        order = torch.argsort(s, descending=True)
        cum = torch.cumsum(probs[order], 0)
        cut = int(torch.nonzero(cum >= top_p)[0, 0])
        s = torch.where(s >= s[order[cut]], s, torch.full_like(s, -math.inf))
    return torch.softmax(s, 0)


def assert_distributed_as(tokens: torch.Tensor, p: torch.Tensor, what: str):
    vocab = p.numel()
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert counts.numel() == vocab, f"{what}: token out of range"
    zero = p == 0
    assert counts[zero].sum() == 0, f"{what}: zero-probability token emitted: {counts.tolist()}"
    n = counts.sum()
    assert n > 500, f"{what}: too few samples ({int(n)})"
    expected = p[~zero] * n
    result = stats.chisquare(counts[~zero].numpy(), expected.numpy())
    assert result.pvalue > P_MIN, f"{what}: chi-square p={result.pvalue:.2e}, counts {counts.tolist()}, expected {(p * n).tolist()}"


def run_chain(target_rows, draft_rows, temperature, top_k=0, top_p=1.0, *, fixed_drafts=None,
              seed0=0, strategy="auto"):
    """verify_chain over ROWS copies of one k-draft problem; drafts sampled from q (DRAFT stream)."""
    k = target_rows.shape[0] - 1
    cu = torch.arange(ROWS + 1, dtype=torch.int64) * k
    seeds = torch.arange(ROWS, dtype=torch.int64) + seed0 * 1_000_003
    position = torch.full((ROWS,), 100, dtype=torch.int64)
    draft_logits = None
    if draft_rows is not None:
        draft_logits = draft_rows.repeat(ROWS, 1)
        drafts = ops.sample(draft_logits, temperature, top_k, top_p,
                            seeds.repeat_interleave(k),
                            position.repeat_interleave(k) + torch.arange(k).repeat(ROWS),
                            purpose=ops.Purpose.DRAFT).tokens
    else:
        drafts = torch.tensor(fixed_drafts, dtype=torch.int64).repeat(ROWS)
    out = ops.verify_chain(drafts, cu, target_rows.repeat(ROWS, 1), draft_logits, temperature,
                           top_k, top_p, seeds, position, strategy=strategy)
    assert (out.status == 0).all()
    return out


def check_chain(target_rows, draft_rows, temperature, top_k=0, top_p=1.0, **kw):
    out = run_chain(target_rows, draft_rows, temperature, top_k, top_p, **kw)
    p = [exact_probs(row, temperature, top_k, top_p) for row in target_rows]
    assert_distributed_as(out.tokens[:, 0], p[0], "first emitted token")
    after_accept = out.accepted[:, 0] == 1
    assert_distributed_as(out.tokens[after_accept, 1], p[1], "token after an accepted draft")
    k = target_rows.shape[0] - 1
    all_accepted = out.num_accepted == k
    if int(all_accepted.sum()) > 500:
        assert_distributed_as(out.tokens[all_accepted, k], p[k], "bonus token")
    return out


VOCAB = 8


def logits_of(seed, scale=1.5, rows=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * scale


def test_draft_far_from_target():
    target, draft = logits_of(1), logits_of(2, scale=2.5)[:2]
    out = check_chain(target, draft, 1.0)
    rate = float(out.accepted[:, 0].float().mean())
    assert 0.1 < rate < 0.9  # rejections and residual draws really happen


def test_draft_equal_to_target_accepts_everything():
    target = logits_of(3)
    out = check_chain(target, target[:2], 0.8)
    assert (out.num_accepted == 2).all()


def test_draft_zero_where_target_positive():
    target, draft = logits_of(4), logits_of(5)[:2]
    draft[:, :3] = -math.inf  # q = 0 on tokens the target likes: only the residual produces them
    target[:, 0] += 2.0
    check_chain(target, draft, 1.0)


def test_target_zero_where_draft_positive():
    target, draft = logits_of(6), logits_of(7)[:2]
    target[:, 5:] = -math.inf  # p = 0 where q > 0: those drafts must always be rejected
    draft[:, 5:] += 2.0
    out = check_chain(target, draft, 1.0)
    assert not (out.tokens[:, :2] >= 5).any()


@pytest.mark.parametrize("top_k,top_p", [(4, 1.0), (0, 0.75), (5, 0.8)])
def test_with_top_k_top_p(top_k, top_p):
    target, draft = logits_of(8), logits_of(9)[:2]
    check_chain(target, draft, 0.9, top_k, top_p)


def test_parallel_strategy_lossless():
    target, draft = logits_of(10), logits_of(11)[:2]
    check_chain(target, draft, 1.2, strategy="parallel", seed0=3)


def test_sample_and_match_one_hot_drafts():
    target = logits_of(12)
    check_chain(target, None, 1.0, fixed_drafts=[int(target[0].argmax()), 3])


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 3, 1.0), (1.3, 0, 0.7),
                                                     (1.0, 6, 0.9)])
def test_sample_distribution(temperature, top_k, top_p):
    logits = logits_of(13, rows=1)[0]
    seeds = torch.arange(ROWS, dtype=torch.int64)
    out = ops.sample(logits.repeat(ROWS, 1), temperature, top_k, top_p, seeds, 42)
    assert (out.status == 0).all()
    assert_distributed_as(out.tokens, exact_probs(logits, temperature, top_k, top_p), "sample")
    # one seed, many positions: the stream along positions is distributed the same way
    out = ops.sample(logits.repeat(ROWS, 1), temperature, top_k, top_p, 7, torch.arange(ROWS))
    assert_distributed_as(out.tokens, exact_probs(logits, temperature, top_k, top_p), "positions")


def test_chi_square_detects_a_wrong_distribution():
    # guard on the harness itself: a biased sampler must fail the same check
    logits = logits_of(14, rows=1)[0]
    out = ops.sample(logits.repeat(ROWS, 1), 1.0, seed=torch.arange(ROWS))
    with pytest.raises(AssertionError, match="chi-square"):
        assert_distributed_as(out.tokens, exact_probs(logits, 1.3), "sample at the wrong temperature")
