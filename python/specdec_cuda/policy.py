"""Speculation policies: how many draft tokens each row may use in the next step.

Speculation pays when the tokens it gains per step outweigh what the step costs extra. At batch 1
a target forward over 1 + k tokens costs about what one token does, so long drafts win; at batch 8
or 16 the target's matmuls stop being free, and drafting can make a batch slower than plain
decoding. ``CostAwarePolicy`` measures instead of guessing:

* **Acceptance per row.** Each draft token of row ``b`` is taken to be accepted with probability
  ``alpha_b`` given the ones before it were (the i.i.d. model of Leviathan et al.); a step that
  drafted ``d`` and accepted ``a`` adds ``a`` successes and, when ``a < d``, one failure. Counts
  decay by ``decay`` per step, so ``alpha_b`` follows the text (a run of predictable tokens raises
  it, as adaptive k does), starting from the batch's pooled estimate.
* **Cost of a step**, as a function of the draft length ``K`` granted this step (chains are padded
  to the longest, so the step's cost depends on ``K``, not on each row's length) and of the number
  of active rows ``B``: a least-squares fit of the measured step times on ``[1, B, B*K, K]``
  (fixed cost, per-row cost, per-fed-token cost, per-draft-step cost of the drafter), over a
  window of recent steps.
* **Choice.** Expected tokens of row ``b`` for ``K`` drafts: ``(1 - alpha_b^(K+1)) / (1 - alpha_b)``;
  the policy picks the ``K`` in ``0 .. max`` with the most expected tokens per second, ``0``
  (plain decoding) included. Until every candidate has been tried, it probes the untried ones
  once; afterwards every ``probe_every`` steps it tries a neighbour of the best ``K`` so the fit
  keeps seeing more than one length.

Nothing here is lossy: a policy only decides how many tokens are drafted, and every draft is
verified losslessly.

Reproducibility: a greedy row's output does not depend on how many tokens it drafted, but a row
verified by rejection sampling draws its token at position t from the draft stream when t was
drafted and from the sampling stream when it was not: the same distribution, a different sample.
A policy that reads timings and the batch would make such a row's sample depend on its
neighbours and on the machine's load. So ``CostAwarePolicy`` adapts greedy rows only, and grants
sampled rows their full limit (their step structure then depends on their own history alone, as
with adaptive k); ``adapt_sampled=True`` adapts them too, trading that reproducibility for speed.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol


class SpeculationPolicy(Protocol):
    def plan(self, active: list[bool], limits: list[int], greedy: list[bool]) -> list[int]:
        """Per row, the draft tokens granted this step (0 .. ``limits[b]``; 0 for finished rows);
        ``greedy[b]``: row ``b`` decodes at temperature 0."""

    def observe(self, active: list[bool], drafted: list[int], accepted: list[int], fed_width: int,
                seconds: float) -> None:
        """The step that was planned last: per row drafted depth and accepted drafts, the width
        of the target forward (root + drafts + extra rows) and the step's wall time."""


class FixedPolicy:
    """Always grant the most the method drafts (within each row's budget)."""

    def plan(self, active: list[bool], limits: list[int], greedy: list[bool]) -> list[int]:
        return [lim if a else 0 for a, lim in zip(active, limits)]

    def observe(self, active, drafted, accepted, fed_width, seconds) -> None:
        pass


class CostAwarePolicy:
    """Per-step draft length from measured step costs and per-row acceptance (module docstring).

    Parameters
    ----------
    decay : weight of past acceptance counts per step (1: never forget; smaller follows the text
        more closely).
    window : recent steps the cost fit uses.
    probe_every : steps between probes of a neighbouring draft length once every length was tried.
    prior : acceptance assumed before a row or the batch has shown any (pooled with weight 2).
    adapt_sampled : also adapt rows that sample (see the module docstring on reproducibility).
    """

    def __init__(self, decay: float = 0.7, window: int = 64, probe_every: int = 8, prior: float = 0.5,
                 adapt_sampled: bool = False) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay}")
        if window < 4 or probe_every < 1:
            raise ValueError(f"window must be >= 4 and probe_every >= 1, got {window}, {probe_every}")
        if not 0.0 < prior < 1.0:
            raise ValueError(f"prior must lie in (0, 1), got {prior}")
        self.decay, self.window, self.probe_every, self.prior = decay, window, probe_every, prior
        self.adapt_sampled = adapt_sampled
        self.samples: deque[tuple[int, int, float]] = deque(maxlen=window)  # (active rows, K, seconds)
        self.success: list[float] = []
        self.failure: list[float] = []
        self.tried: set[int] = set()
        self.steps = 0
        self.last_k = 0
        self.history: list[int] = []  # K chosen per step (for reports)

    # -- acceptance ---------------------------------------------------------------------------

    def _pooled(self) -> float:
        s, f = sum(self.success), sum(self.failure)
        return (s + 2 * self.prior) / (s + f + 2)

    def alpha(self, row: int) -> float:
        """Estimated per-token acceptance of ``row`` (its decayed counts over the pooled prior)."""
        pooled = self._pooled()
        s, f = self.success[row], self.failure[row]
        return min(0.98, (s + 2 * pooled) / (s + f + 2))

    # -- cost ---------------------------------------------------------------------------------

    def step_seconds(self, rows: int, k: int) -> float | None:
        """Predicted step time for ``rows`` active rows drafting ``k``; None before any data."""
        if not self.samples:
            return None
        import numpy as np

        data = np.array(self.samples, dtype=np.float64)
        b, kk, t = data[:, 0], data[:, 1], data[:, 2]
        features = np.stack([np.ones_like(b), b, b * kk, kk], axis=1)
        # A light ridge keeps the fit defined while few distinct (B, K) have been seen; costs are
        # not negative, so the coefficients are clipped at zero after the solve.
        scale = max(float(t.mean()), 1e-9)
        ridge = 1e-3 * np.eye(4)
        coef = np.linalg.solve(features.T @ features + ridge * len(t), features.T @ (t / scale)) * scale
        coef = np.maximum(coef, 0.0)
        return float(coef @ np.array([1.0, rows, rows * k, k]))

    # -- the policy ---------------------------------------------------------------------------

    def plan(self, active: list[bool], limits: list[int], greedy: list[bool]) -> list[int]:
        if len(self.success) != len(active):
            self.success, self.failure = [0.0] * len(active), [0.0] * len(active)
        adapt = [a and (g or self.adapt_sampled) for a, g in zip(active, greedy)]
        rows = [b for b, a in enumerate(active) if a]
        k_max = max((limits[b] for b in rows), default=0)
        if k_max == 0 or not any(adapt):
            return [lim if a else 0 for a, lim in zip(active, limits)]
        untried = [k for k in (k_max, 0) if k not in self.tried]
        if untried:
            k = untried[0]
        else:
            k = self._best(rows, limits, adapt, k_max)
            if self.steps % self.probe_every == self.probe_every - 1:
                k = min(k_max, k + 1) if k < k_max else max(0, k - 1)
        self.last_k = k
        return [(min(k, lim) if ad else lim) if a else 0 for a, ad, lim in zip(active, adapt, limits)]

    def _best(self, rows: list[int], limits: list[int], adapt: list[bool], k_max: int) -> int:
        alphas = [self.alpha(b) for b in rows]
        best_k, best_rate = 0, -1.0
        fixed = max((limits[b] for b in rows if not adapt[b]), default=0)  # rows the policy leaves alone
        for k in range(k_max + 1):
            grant = {b: min(k, limits[b]) if adapt[b] else limits[b] for b in rows}
            seconds = self.step_seconds(len(rows), max(k, fixed))
            if seconds is None or seconds <= 0:
                continue
            tokens = sum((1 - a ** (grant[b] + 1)) / (1 - a) for a, b in zip(alphas, rows))
            rate = tokens / seconds
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def observe(self, active: list[bool], drafted: list[int], accepted: list[int], fed_width: int,
                seconds: float) -> None:
        self.steps += 1
        rows = sum(active)
        k = fed_width - 1
        self.tried.add(self.last_k)
        self.history.append(self.last_k)
        if rows:
            self.samples.append((rows, k, seconds))
        for b, (a, d, n) in enumerate(zip(active, drafted, accepted)):
            self.success[b] *= self.decay
            self.failure[b] *= self.decay
            if a and d > 0:
                self.success[b] += n
                self.failure[b] += 1.0 if n < d else 0.0


def make_policy(policy) -> SpeculationPolicy | None:
    """``"cost"`` / ``"fixed"`` / a policy object / None (None: the loop's fixed behaviour)."""
    if policy is None or not isinstance(policy, str):
        return policy
    if policy == "cost":
        return CostAwarePolicy()
    if policy == "fixed":
        return FixedPolicy()
    raise ValueError(f'policy must be "cost", "fixed" or a SpeculationPolicy, got {policy!r}')
