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

import specdec_cuda
from decoding_models import load_backend, make_checkpoint
from lossless_stats import chi2_pvalue, exact_joint

VOCAB, PROMPT, SAMPLES = 6, [1, 2, 3], 3000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless")
    target = make_checkpoint(root / "target", vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1, seed=3)
    draft = make_checkpoint(root / "draft", perturb_from=target, noise=0.5, seed=4)
    return load_backend(target, "builtin"), load_backend(draft, "builtin")


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
        out = specdec_cuda.generate(target, [PROMPT] * batch, method="draft", draft=draft, k=k, policy="fixed",
                                    verification=verification, max_new_tokens=3, temperature=temperature,
                                    top_k=top_k, seed=list(range(start, start + batch)))
        for row in out.tokens:
            counts[tuple(row)] = counts.get(tuple(row), 0) + 1
        acceptance = out.metrics.acceptance_rate
    assert 0.2 < acceptance < 0.95  # both accepts and rejections happen
    assert chi2_pvalue(counts, exact_joint(target, PROMPT, VOCAB, temperature, top_k), SAMPLES) > 1e-3
    # Power: the draft's own distribution is rejected by the same test on the same samples.
    assert chi2_pvalue(counts, exact_joint(draft, PROMPT, VOCAB, temperature, top_k), SAMPLES) < 1e-6


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
