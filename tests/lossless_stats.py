"""Exact target distributions and the chi-square test the losslessness tests share."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from specdec_cuda.reference import sampling as ref


def exact_joint(model, prompt, vocab, temperature, top_k, top_p=1.0):
    """P(x1, x2, x3 | prompt) as a dict, from the model's next-token distributions after
    temperature / top-k / top-p (as the kernels apply them)."""
    def next_probs(prefix):
        cache = model.new_cache(1, len(prefix) + 1)
        logits = model.forward(torch.tensor([prefix]), torch.arange(len(prefix))[None], cache).logits[0, -1]
        return ref.probs_of(ref.scaled_logits(logits, temperature, top_k, top_p)).double()

    joint = {}
    p1 = next_probs(prompt)
    for a in range(vocab):
        if p1[a] == 0:
            continue
        p2 = next_probs(prompt + [a])
        for b in range(vocab):
            if p2[b] == 0:
                continue
            p3 = next_probs(prompt + [a, b])
            for c in range(vocab):
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
