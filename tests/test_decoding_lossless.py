"""Sampling losslessness end to end: speculative samples have the target's distribution.

On a tiny-vocabulary model the exact joint distribution of the first three generated tokens is
computed from the target (after temperature / top-k, as the kernels apply them), and the
speculative samples (one per request seed) are compared with it by chi-square. Seeds are fixed,
so the test is deterministic. A power check makes sure the same test tells the draft's own
distribution apart.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

import specdec_cuda
from decoding_models import load_backend, make_checkpoint
from specdec_cuda.reference import sampling as ref

VOCAB, PROMPT, SAMPLES = 6, [1, 2, 3], 3000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless")
    target = make_checkpoint(root / "target", vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1, seed=3)
    draft = make_checkpoint(root / "draft", perturb_from=target, noise=0.5, seed=4)
    return load_backend(target, "builtin"), load_backend(draft, "builtin")


def exact_joint(model, temperature, top_k):
    """P(x1, x2, x3 | PROMPT) as a dict, from the model's next-token distributions."""
    def next_probs(prefix):
        cache = model.new_cache(1, len(prefix) + 1)
        logits = model.forward(torch.tensor([prefix]), torch.arange(len(prefix))[None], cache).logits[0, -1]
        return ref.probs_of(ref.scaled_logits(logits, temperature, top_k, 1.0)).double()

    joint = {}
    p1 = next_probs(PROMPT)
    for a in range(VOCAB):
        if p1[a] == 0:
            continue
        p2 = next_probs(PROMPT + [a])
        for b in range(VOCAB):
            if p2[b] == 0:
                continue
            p3 = next_probs(PROMPT + [a, b])
            for c in range(VOCAB):
                joint[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return joint


def chi2_pvalue(counts, joint, n):
    """p-value of the counts under ``joint``; 0 when a sequence of probability 0 was sampled."""
    if any(c not in joint or joint[c] == 0 for c in counts):
        return 0.0
    cells = sorted(joint, key=joint.get)
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for cell in cells:  # pool cells with expected counts below 5
        pool_o += counts.get(cell, 0)
        pool_e += joint[cell] * n
        if pool_e >= 5:
            obs.append(pool_o); exp.append(pool_e); pool_o, pool_e = 0, 0.0
    if pool_e > 0:
        obs[-1] += pool_o; exp[-1] += pool_e
    exp = [e * sum(obs) / sum(exp) for e in exp]
    return chisquare(obs, exp).pvalue


@pytest.mark.parametrize("verification,k,temperature,top_k", [
    ("rejection", 1, 1.0, 0),
    ("rejection", 2, 1.0, 0),
    ("rejection", 2, 0.7, 4),
    ("match", 2, 1.0, 0),
])
def test_first_three_tokens_have_the_target_distribution(tiny, verification, k, temperature, top_k):
    target, draft = tiny
    counts: dict = {}
    batch = 500
    for start in range(0, SAMPLES, batch):
        out = specdec_cuda.generate(target, [PROMPT] * batch, method="draft", draft=draft, k=k,
                                    verification=verification, max_new_tokens=3, temperature=temperature,
                                    top_k=top_k, seed=list(range(start, start + batch)))
        for row in out.tokens:
            counts[tuple(row)] = counts.get(tuple(row), 0) + 1
        acceptance = out.metrics.acceptance_rate
    assert 0.2 < acceptance < 0.95  # both accepts and rejections happen
    assert chi2_pvalue(counts, exact_joint(target, temperature, top_k), SAMPLES) > 1e-3
    # Power: the draft's own distribution is rejected by the same test on the same samples.
    assert chi2_pvalue(counts, exact_joint(draft, temperature, top_k), SAMPLES) < 1e-6


def test_match_mode_reproduces_autoregressive_samples(tiny):
    """Sample-and-match draws each emitted token with the autoregressive stream of its position."""
    target, draft = tiny
    seeds = list(range(40))
    ar = specdec_cuda.generate(target, [PROMPT] * 40, max_new_tokens=12, temperature=1.0, seed=seeds)
    sd = specdec_cuda.generate(target, [PROMPT] * 40, method="draft", draft=draft, k=3, verification="match",
                               max_new_tokens=12, temperature=1.0, seed=seeds)
    assert sd.tokens == ar.tokens


def test_per_request_seeds(tiny):
    target, draft = tiny
    a = specdec_cuda.generate(target, [PROMPT] * 3, method="draft", draft=draft, k=2, max_new_tokens=8,
                              temperature=1.0, seed=[5, 6, 5])
    assert a.tokens[0] == a.tokens[2]
    alone = specdec_cuda.generate(target, [PROMPT], method="draft", draft=draft, k=2, max_new_tokens=8,
                                  temperature=1.0, seed=6)
    assert alone.tokens[0] == a.tokens[1]
    assert len({tuple(t) for t in specdec_cuda.generate(
        target, [PROMPT] * 8, max_new_tokens=8, temperature=1.0, seed=list(range(8))).tokens}) > 1
