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


def exact_sequences(model, prompt, vocab, length, temperature, top_k, top_p=1.0, chunk=1024):
    """P(x1 .. x_length | prompt) for every sequence of probability > 0, as a dict (tuple -> p).

    The prefixes of each length are enumerated together: one batched forward per chunk of
    prefixes (every prefix of nonzero probability), so six tokens on a vocabulary of six cost a
    few thousand rows, not a few thousand forwards. Probabilities after temperature / top-k /
    top-p, as the kernels apply them (``exact_joint`` is the three-token case, one row at a time).
    """
    level = {(): 1.0}
    for _ in range(length):
        prefixes, nxt = list(level), {}
        for start in range(0, len(prefixes), chunk):
            part = prefixes[start : start + chunk]
            rows = torch.tensor([list(prompt) + list(p) for p in part], dtype=torch.int64, device=model.device)
            B, L = rows.shape
            cache = model.new_cache(B, L + 1)
            positions = torch.arange(L, device=model.device).expand(B, L)
            logits = model.forward(rows, positions, cache).logits[:, -1].cpu()
            for prefix, row in zip(part, logits):
                probs = ref.probs_of(ref.scaled_logits(row, temperature, top_k, top_p)).double()
                for t in torch.nonzero(probs).flatten().tolist():
                    nxt[prefix + (t,)] = level[prefix] * float(probs[t])
        level = nxt
    assert all(0 <= t < vocab for seq in level for t in seq)
    return level


def project(dist, indices):
    """The marginal of ``dist`` (tuple -> p, or sampled tuple -> count) on the 0-based token
    ``indices``: a dict keyed by the tuple of those tokens."""
    out = {}
    for seq, value in dist.items():
        key = tuple(seq[i] for i in indices)
        out[key] = out.get(key, 0) + value
    return out


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
