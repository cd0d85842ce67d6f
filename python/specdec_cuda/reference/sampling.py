"""Plain-PyTorch specification of ``sample`` and ``verify_chain``.

Slow on purpose: one row at a time, every step spelled out. The kernels must produce the same
tokens, counts and statuses given the same random draws (``reference.philox``).

Sampling transform of one logit row ``l`` (any float dtype) with temperature ``T``:

* ``T == 0``: greedy, ``argmax(l)`` with ties to the lowest index (as ``torch.argmax``).
* ``T > 0``: ``s = float32(l) / float32(T)``; top-k keeps ``s >= kth-largest(s)`` (ties kept;
  ``top_k <= 0`` or ``>= V`` disables it); top-p keeps ``s >= t`` for the largest ``t`` whose
  kept mass ``P(s >= t) >= top_p`` under the top-k-filtered softmax (``top_p == 1`` disables it;
  when rounding leaves no such ``t`` everything is kept). ``p = softmax`` over what is kept.
* A token is drawn from ``p`` by the exponential race ``argmax_i s_i + G_i`` with Gumbel noise
  ``G_i = -log(-log(u_i))``, ``u_i`` the i-th uniform of the row's stream; removed tokens never win.

Status codes (see ``csrc/kernels/common/status.h``): 1 = a logit row read by the decision held NaN
or +inf (after scaling) or only -inf; 2 = a draft token outside ``[0, V)``; 3 = temperature < 0 or
NaN, or top_p outside ``(0, 1]``. A flagged row emits no tokens (all -1) and accepts nothing.
"""

from __future__ import annotations

import math

import torch

from .philox import Purpose, random_bits, uniform, uniform_open01

STATUS_OK = 0
STATUS_NONFINITE_LOGITS = 1
STATUS_DRAFT_OUT_OF_RANGE = 2
STATUS_BAD_PARAMS = 3


class RowError(Exception):
    """Raised inside the reference to flag a row with a status code."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def check_params(temperature: float, top_p: float) -> None:
    if not (temperature >= 0.0) or not (0.0 < top_p <= 1.0):  # NaN fails both comparisons
        raise RowError(STATUS_BAD_PARAMS)


def scaled_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """float32 ``s`` of one row with removed tokens set to -inf.  Shape: [V] -> [V]."""
    s = logits.to(torch.float32) / torch.tensor(temperature, dtype=torch.float32)
    if torch.isnan(s).any() or torch.isposinf(s).any() or torch.isneginf(s).all():
        raise RowError(STATUS_NONFINITE_LOGITS)
    vocab = s.numel()
    if 0 < top_k < vocab:
        kth = torch.topk(s, top_k).values[-1]
        s = torch.where(s >= kth, s, torch.full_like(s, -math.inf))
    if top_p < 1.0:
        probs = torch.softmax(s, dim=0)
        sorted_s, order = torch.sort(s, descending=True)
        cum = torch.cumsum(probs[order], dim=0)
        reached = torch.nonzero(cum >= top_p)
        if reached.numel() > 0:
            threshold = sorted_s[reached[0, 0]]
            s = torch.where(s >= threshold, s, torch.full_like(s, -math.inf))
    return s


def probs_of(s: torch.Tensor) -> torch.Tensor:
    """softmax of a scaled row (float32).  Shape: [V] -> [V]."""
    return torch.softmax(s, dim=0)


def greedy_token(logits: torch.Tensor) -> int:
    l = logits.to(torch.float32)
    if torch.isnan(l).any() or torch.isposinf(l).any() or torch.isneginf(l).all():
        raise RowError(STATUS_NONFINITE_LOGITS)
    return int(torch.argmax(l))


def race(weights_log: torch.Tensor, seed: int, position: int, purpose: int, substream: int = 0) -> int:
    """Exponential race over log-weights (-inf = excluded): argmax_i w_i + G_i.  [V] -> token."""
    vocab = weights_log.numel()
    u = uniform_open01(random_bits(seed, position, purpose, substream, torch.arange(vocab)))
    gumbel = -torch.log(-torch.log(u))
    return int(torch.argmax(weights_log + gumbel))


def residual_race(p: torch.Tensor, q: torch.Tensor, seed: int, position: int) -> int:
    """Sample from max(0, p - q) without normalising it: argmax_i r_i / E_i, E_i = -log(u_i).

    When the residual is zero everywhere (p <= q elementwise, i.e. p == q up to rounding) the
    defined outcome is a sample from p with the same stream.
    """
    vocab = p.numel()
    u = uniform_open01(random_bits(seed, position, Purpose.RESIDUAL, 0, torch.arange(vocab)))
    exp_noise = -torch.log(u)
    r = torch.clamp(p - q, min=0.0)
    if not (r > 0).any():
        r = p
    key = torch.where(r > 0, r / exp_noise, torch.full_like(r, -1.0))
    return int(torch.argmax(key))


def sample_row(logits, temperature, top_k, top_p, seed, position, purpose=Purpose.SAMPLE, substream=0):
    """One token from one row (the ``sample`` op).  Returns (token, status)."""
    try:
        check_params(temperature, top_p)
        if temperature == 0.0:
            return greedy_token(logits), STATUS_OK
        s = scaled_logits(logits, temperature, top_k, top_p)
        return race(s, seed, position, purpose, substream), STATUS_OK
    except RowError as err:
        return -1, err.status


def sample(logits, temperature, top_k, top_p, seed, position, purpose=Purpose.SAMPLE, substream=0):
    """Reference of ``specdec_cuda.ops.sample``: tokens [N] int64, status [N] int32.

    Shape: logits [N, V]; temperature, top_k, top_p, seed, position [N].
    """
    n = logits.shape[0]
    tokens = torch.full((n,), -1, dtype=torch.int64)
    status = torch.zeros(n, dtype=torch.int32)
    for i in range(n):
        tokens[i], status[i] = sample_row(
            logits[i].cpu(), float(temperature[i]), int(top_k[i]), float(top_p[i]),
            int(seed[i]), int(position[i]), purpose, substream,
        )
    return tokens, status


def _verify_row(draft, target, draft_logits, temperature, top_k, top_p, seed, position,
                typical, typical_epsilon, typical_alpha):
    """One row of verify_chain.  Returns (tokens list, accepted list of 0/1)."""
    check_params(temperature, top_p)
    vocab = target.shape[-1]
    if any(not (0 <= int(x) < vocab) for x in draft):
        raise RowError(STATUS_DRAFT_OUT_OF_RANGE)
    k = len(draft)
    tokens, accepted = [], []
    for j in range(k + 1):
        pos = position + j
        x = int(draft[j]) if j < k else None
        if temperature == 0.0:  # greedy: accept while the draft equals the argmax
            best = greedy_token(target[j])
            if x is not None and x == best:
                tokens.append(x); accepted.append(1); continue
            tokens.append(best)
            if x is not None:
                accepted.append(0)
            return tokens, accepted
        s = scaled_logits(target[j], temperature, top_k, top_p)
        if x is None:  # every draft accepted: bonus token from p
            tokens.append(race(s, seed, pos, Purpose.SAMPLE))
            return tokens, accepted
        p = probs_of(s)
        if typical:  # Medusa's typical acceptance (lossy): p(x) > min(eps, alpha * exp(-H(p)))
            entropy = -(p[p > 0] * torch.log(p[p > 0])).sum()
            threshold = min(typical_epsilon, typical_alpha * math.exp(-float(entropy)))
            if float(p[x]) > threshold:
                tokens.append(x); accepted.append(1); continue
            tokens.append(race(s, seed, pos, Purpose.SAMPLE)); accepted.append(0)
            return tokens, accepted
        if draft_logits is None:  # sample-and-match: exact for one-hot drafts
            y = race(s, seed, pos, Purpose.SAMPLE)
            if y == x:
                tokens.append(x); accepted.append(1); continue
            tokens.append(y); accepted.append(0)
            return tokens, accepted
        # rejection sampling: accept x with probability min(1, p(x) / q(x)), written u * q < p
        q = probs_of(scaled_logits(draft_logits[j], temperature, top_k, top_p))
        u = float(uniform(seed, pos, Purpose.ACCEPT))
        if torch.tensor(u, dtype=torch.float32) * q[x] < p[x]:
            tokens.append(x); accepted.append(1); continue
        tokens.append(residual_race(p, q, seed, pos)); accepted.append(0)
        return tokens, accepted
    raise AssertionError("unreachable")


def verify_chain(draft_tokens, cu_num_draft, target_logits, draft_logits, temperature, top_k, top_p,
                 seed, position, typical=False, typical_epsilon=0.3, typical_alpha=0.09):
    """Reference of ``specdec_cuda.ops.verify_chain``.

    Shape: draft_tokens [N] (N = sum k_i); cu_num_draft [B + 1]; target_logits [N + B, V]
    (row i owns rows cu[i] + i .. cu[i + 1] + i); draft_logits [N, V] or None; per-row params [B].
    Returns tokens [B, max_k + 1] (-1 padded), num_accepted [B] int64, accepted [B, max_k] int8
    (1 accepted, 0 rejected, -1 not reached), status [B] int32.
    """
    batch = cu_num_draft.numel() - 1
    cu = [int(c) for c in cu_num_draft]
    max_k = max([cu[i + 1] - cu[i] for i in range(batch)] + [0])
    tokens = torch.full((batch, max_k + 1), -1, dtype=torch.int64)
    num_accepted = torch.zeros(batch, dtype=torch.int64)
    accepted = torch.full((batch, max_k), -1, dtype=torch.int8)
    status = torch.zeros(batch, dtype=torch.int32)
    for i in range(batch):
        lo, hi = cu[i], cu[i + 1]
        target = target_logits[lo + i: hi + i + 1].cpu()
        drafts = None if draft_logits is None else draft_logits[lo:hi].cpu()
        try:
            row_tokens, row_accepted = _verify_row(
                draft_tokens[lo:hi].tolist(), target, drafts, float(temperature[i]), int(top_k[i]),
                float(top_p[i]), int(seed[i]), int(position[i]), typical, typical_epsilon,
                typical_alpha)
        except RowError as err:
            status[i] = err.status
            continue
        tokens[i, :len(row_tokens)] = torch.tensor(row_tokens)
        accepted[i, :len(row_accepted)] = torch.tensor(row_accepted, dtype=torch.int8)
        num_accepted[i] = len(row_tokens) - 1
    return tokens, num_accepted, accepted, status
