"""Speculation policies: how many draft tokens each row may use in the next step.

Speculation pays when the tokens it gains per step outweigh what the step costs extra. At batch 1
a target forward over 1 + k tokens costs about what one token does, so long drafts win; at batch 8
or 16 the target's matmuls stop being free, and drafting can make a batch slower than plain
decoding. ``CostAwarePolicy`` measures instead of guessing:

* **Acceptance per row.** Each draft token of row ``b`` is taken to be accepted with probability
  ``alpha_b`` given the ones before it were (the i.i.d. model of Leviathan et al.); a step that
  drafted ``d`` and accepted ``a`` adds ``a`` successes and, when ``a < d``, one failure. Counts
  decay by ``decay`` per step the row drafts, so ``alpha_b`` follows the text (a run of
  predictable tokens raises it, as adaptive k does), starting from the pooled estimate of this
  run's and earlier runs' rows (earlier runs that sampled alike: greedy, or the same temperature
  and truncation; ``set_sampling``). In greedy runs, a proposer whose drafts cost no forward
  (prompt lookup) also has the chains it would have drafted on plain steps judged against the
  tokens those steps emit (``observe_shadow``, ``specdec_cuda.shadow``): exact evidence, for free,
  so a row that starts copying its prompt is seen to at once rather than at the next probe.
* **Cost of a step**, as a function of the deepest draft ``K`` sent this step (a chain is fed as
  wide as its longest row's, so the step's cost depends on ``K``, not on each row's length) and of the number
  of active rows ``B``: a table of measured step times per ``(B, K)`` (exponential moving
  averages), read directly where measured and extended linearly in ``K`` through the measured
  drafting lengths (``K >= 1``; with fewer than two, every measured length) of the same ``B``
  elsewhere. A run's first draft also pays its drafter's catch-up with the prompt (measured, kept),
  so a short run may rightly never draft.
* **Choice.** Expected tokens of row ``b`` per step with ``K`` drafts:
  ``E_b(K) = (1 - alpha_b^(K+1)) / (1 - alpha_b)``. A batch of requests is done when its last row
  is, so the policy picks the ``K`` in ``0 .. max``, ``0`` (plain decoding) included, with the
  least expected time to finish: ``cost(B, K) * max_b(remaining_b / E_b(K))``. (Summing tokens
  instead would reward rows that finish early while the slowest one sets the batch's time.) A batch
  size it has not measured yet is explored cheaply: ``K = 0``, then ``K = 1``, each twice, which
  fixes the line; then the longest length, twice, unless even at a quarter of the first token's
  added cost per further token it cannot come near plain decoding (a verification's cost grows
  less than linearly in its width on a CPU and the first token carries the proposer's fixed work,
  so the line overstates long drafts, and a length never measured would never be chosen); other lengths are
  predicted from the measured ones and measured when chosen. The first
  measurements of a (rows, K) keep their minimum before the moving average starts: the first step
  of a new shape pays one-time costs (allocations, tables), and a length that looked dear once
  would otherwise never be chosen, so never measured again. Every run drafts on its second
  step (one token, or the best length that costs about what one does), so that its rows show
  their acceptance, unless no length could win at this batch size even at the average acceptance
  seen so far. Every ``probe_every`` steps it measures the next length above (or below) the best one
  again, but only when that length is predicted to come within ``probe_margin`` of the best (a
  clearly losing length is not paid for again), and half as often after each probe that lost.

Nothing here is lossy: a policy only decides how many tokens are drafted, and every draft is
verified losslessly.

Reproducibility: a greedy row's output does not depend on how many tokens it drafted, nor does a
sampled row's whose drafts are verified by sample-and-match (guesses, or drafts coupled to the
target's own sampling noise: ``Proposer.matches_samples``): it emits the autoregressive samples
of its seed. A row verified by rejection sampling draws its token at position t from the draft
stream when t was drafted and from the sampling stream when it was not: the same distribution, a
different sample. A policy that reads timings and the batch would make such a row's sample depend
on its neighbours and on the machine's load. So the loop marks the rows the policy may adapt
(``adaptable``: greedy or matching), and ``CostAwarePolicy`` grants the others their full limit
(their step structure then depends on their own history alone, as with adaptive k);
``adapt_sampled=True`` adapts them too, trading that reproducibility for speed. The methods that
sample drafts from q draw them coupled by default (``verification="coupled"``,
``draft_sampling="coupled"``), so their sampled rows are adaptable: the fastest rule we found that
keeps a seeded row's output independent of its batch and of the machine
(docs/speculation-policy.md).

Memory: the measured costs and pooled acceptance outlive the decoder when it is given a
``PolicyMemory`` (``SpeculativeDecoder`` gives one per target, method, options and machine,
``policy_memory``): a new process starts where the last one stopped instead of exploring again.
"""

from __future__ import annotations

import math
from typing import Protocol


class SpeculationPolicy(Protocol):
    def start(self, batch: int) -> None:
        """A new ``decode`` call over ``batch`` rows begins (what was learned per row is dropped;
        what was learned about costs may be kept)."""

    def plan(self, active: list[bool], limits: list[int], adaptable: list[bool],
             remaining: list[int] | None = None) -> list[int]:
        """Per row, the draft tokens granted this step (0 .. ``limits[b]``; 0 for finished rows);
        ``adaptable[b]``: row ``b`` emits the same tokens whatever it drafts (greedy, or verified by
        sample-and-match); ``remaining[b]``: tokens it may still emit (None: unknown)."""

    def observe(self, active: list[bool], drafted: list[int], accepted: list[int], fed_width: int,
                seconds: float) -> None:
        """The step that was planned last: per row drafted depth and accepted drafts, the width
        of the target forward (root + drafts + extra rows) and the step's wall time."""

    # Optional: ``drafting_over() -> bool``, True once the policy will grant no more drafts in this
    # run whatever its steps measure (the loop then drops the proposer: ``CostAwarePolicy``),
    # ``observe_shadow(row, matched, missed, first)``, news of a free proposer's shadow drafts
    # (``specdec_cuda.shadow``), and ``set_sampling(label)``, called after ``start`` with how the
    # run's rows sample (``sampling_label``).


class FixedPolicy:
    """Always grant the most the method drafts (within each row's budget)."""

    def start(self, batch: int) -> None:
        pass

    def plan(self, active: list[bool], limits: list[int], adaptable: list[bool],
             remaining: list[int] | None = None) -> list[int]:
        return [lim if a else 0 for a, lim in zip(active, limits)]

    def observe(self, active, drafted, accepted, fed_width, seconds) -> None:
        pass


class CostAwarePolicy:
    """Per-step draft length from measured step costs and per-row acceptance (module docstring).

    Parameters
    ----------
    decay : weight of past acceptance counts per step (1: never forget; smaller follows the text
        more closely).
    probe_every : steps between probes of a neighbouring draft length (doubled after each probe
        that did not become the best, up to 16x).
    probe_margin : probe a neighbour only when its predicted rate is within this share of the best.
    smoothing : weight of a new measurement in a (rows, K) cost average.
    min_gain : speculate only when the best length is predicted to finish the batch at least this
        share sooner than plain decoding (the estimates are noisy; plain decoding is the safe side).
    prior : acceptance assumed before a row or the batch has shown any (pooled with weight 2).
    adapt_sampled : also adapt rows that are not ``adaptable`` (rows sampled by rejection; see the
        module docstring on reproducibility).
    memory : a ``policy_memory.PolicyMemory``: costs and acceptance loaded from it now and saved to
        it after every run (``finish``).
    """

    WARM_SAMPLES = 2  # measurements of a (rows, K) combined by their minimum
    EXPLORE_MARGIN = 0.25  # the longest draft is measured when predicted within this share of plain decoding
    EXPLORE_ALPHA = 0.9  # ... at this acceptance (or the one seen, if higher)
    EXPLORE_SLOPE = 0.25  # ... and at this share of the first draft token's added cost per further token
    MIN_EVIDENCE = 4  # judged draft tokens under which the acceptance is hoped for (EXPLORE_ALPHA), not settled on
    HOLD = 7  # plain decoding, once chosen, is kept this many steps without deciding again (until a probe)

    def __init__(self, decay: float = 0.7, probe_every: int = 8, probe_margin: float = 0.1,
                 prior: float = 0.5, adapt_sampled: bool = False, smoothing: float = 0.3,
                 min_gain: float = 0.1, memory=None) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay}")
        if probe_every < 1 or not 0.0 <= probe_margin < 1.0:
            raise ValueError(f"probe_every must be >= 1 and probe_margin in [0, 1), got {probe_every}, "
                             f"{probe_margin}")
        if not 0.0 < prior < 1.0:
            raise ValueError(f"prior must lie in (0, 1), got {prior}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must lie in (0, 1], got {smoothing}")
        if min_gain < 0.0:
            raise ValueError(f"min_gain must be >= 0, got {min_gain}")
        self.decay, self.probe_every, self.probe_margin, self.prior = decay, probe_every, probe_margin, prior
        self.adapt_sampled, self.smoothing, self.min_gain = adapt_sampled, smoothing, min_gain
        self.cost: dict[tuple[int, int], float] = {}  # (active rows, K) -> EMA of the step's seconds
        self.samples: dict[tuple[int, int], int] = {}  # (active rows, K) -> measurements taken
        # Acceptance counts over earlier runs (decayed), of the runs sampling as this one does
        # (``sampling``); other kinds of sampling keep theirs in ``seen_by_sampling``.
        self.seen_success = self.seen_failure = 0.0
        self.sampling = "greedy"
        self.seen_by_sampling: dict[str, tuple[float, float]] = {}
        self.explored: dict[tuple[int, int], int] = {}  # (active rows, K) -> times granted
        # Seconds of a run's first proposal spent catching the drafter up with the prompt (a draft
        # model's prefill, DFlash's prompt features): paid once per run that drafts at all, so a
        # short run may not be worth drafting in. Moving average of what was observed; 0: unknown.
        self.catch_up_seconds = 0.0
        self.memory = memory
        if memory is not None:
            self.load_state(memory.load() or {})
        self.start(0)

    # -- memory -------------------------------------------------------------------------------

    def state(self) -> dict:
        """What outlives a run and a process: step costs per (rows, K), how many measurements each
        holds, the pooled acceptance counts per kind of sampling. JSON-able."""
        seen = dict(self.seen_by_sampling, **{self.sampling: (self.seen_success, self.seen_failure)})
        return {"cost": [[b, k, t, self.samples.get((b, k), 0)] for (b, k), t in sorted(self.cost.items())],
                "seen": {label: list(counts) for label, counts in sorted(seen.items())},
                "catch_up_seconds": self.catch_up_seconds}

    def load_state(self, state: dict) -> None:
        """Take up a ``state()`` saved earlier; malformed entries are skipped."""
        for entry in state.get("cost", []):
            try:
                b, k, t, n = (int(entry[0]), int(entry[1]), float(entry[2]), int(entry[3]))
            except (TypeError, ValueError, IndexError):
                continue
            if b > 0 and k >= 0 and t > 0 and math.isfinite(t):
                self.cost[(b, k)], self.samples[(b, k)] = t, max(0, n)
        seen = state.get("seen")
        if not isinstance(seen, dict):  # a file of the single pooled count: taken as the greedy runs'
            seen = {"greedy": [state.get("seen_success"), state.get("seen_failure")]}
        for label, counts in seen.items():
            if (isinstance(label, str) and isinstance(counts, (list, tuple)) and len(counts) == 2
                    and all(isinstance(c, (int, float)) and math.isfinite(c) and c >= 0 for c in counts)):
                self.seen_by_sampling[label] = (float(counts[0]), float(counts[1]))
        self.seen_success, self.seen_failure = self.seen_by_sampling.pop(self.sampling, (0.0, 0.0))
        value = state.get("catch_up_seconds")
        if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
            self.catch_up_seconds = float(value)

    def one_time(self, seconds: float) -> None:
        """The last proposal spent ``seconds`` on one-time work (a catch-up); the first of a run
        is remembered as the price of drafting in a run at all."""
        if seconds > 0 and not self.caught_up:
            old = self.catch_up_seconds
            self.catch_up_seconds = seconds if old == 0 else old + self.smoothing * (seconds - old)

    def finish(self) -> None:
        """A run ended: save what was learned (when given a memory)."""
        if self.memory is not None:
            self.memory.save(self.state())

    def set_sampling(self, label: str) -> None:
        """This run's rows sample as ``label`` says (``sampling_label``: greedy, or a temperature
        and truncation). A draft's acceptance depends on it (of prompt lookup's guesses on the zoo
        pair, ~45% are accepted greedy, ~16% at T = 0.8), so a new run starts from the pooled
        acceptance of earlier runs that sampled the same way, not of whatever ran before: a server
        alternating greedy and sampled requests would otherwise draft its sampled ones on its
        greedy ones' evidence. (Step costs do not depend on it and stay shared.)"""
        if label != self.sampling:
            self.seen_by_sampling[self.sampling] = (self.seen_success, self.seen_failure)
            self.seen_success, self.seen_failure = self.seen_by_sampling.pop(label, (0.0, 0.0))
            self.sampling = label

    def start(self, batch: int) -> None:
        """A new run: per-row acceptance and the step schedule start afresh; the measured step
        costs and the pooled acceptance of earlier runs are kept (they belong to the machine and
        the models, not to the requests): a decoder that serves many calls explores once, and a
        new row starts from what its predecessors showed."""
        self.success, self.failure = [0.0] * batch, [0.0] * batch
        self.steps = 0
        self.probe_interval, self.next_probe, self.probed = self.probe_every, self.probe_every, None
        self.last_k = 0
        self.hold, self.hold_rows = 0, None  # steps plain decoding is kept without a decision, for these rows
        self.caught_up = False  # whether this run has drafted (its drafter has seen the prompt)
        self.settled = False  # drafting_over(): this run decodes plainly to its end
        self.shadowed = False  # shadow drafts were judged: plain steps move the acceptance too
        self.shadow_run = [0] * batch  # per row: guesses its current shadow chain has repeated
        self.shadows_wanted = True  # wants_shadows(): decided again at each choice of plain decoding
        self.history: list[int] = []  # K chosen per step of this run (for reports)

    # -- acceptance ---------------------------------------------------------------------------

    def _evidence(self) -> float:
        """Draft tokens of this kind of sampling judged so far: by this run's rows and remembered."""
        return sum(self.success) + sum(self.failure) + self.seen_success + self.seen_failure

    def _pooled(self) -> float:
        # This run's rows together with every earlier run's (slowly forgotten), over the prior.
        s = sum(self.success) + self.seen_success
        f = sum(self.failure) + self.seen_failure
        return (s + 2 * self.prior) / (s + f + 2)

    def alpha(self, row: int, batch: int = 1) -> float:
        """Estimated per-token acceptance of ``row`` (its decayed counts over a prior).

        The prior is the pooled estimate; for a row that has not drafted yet, in a batch of
        ``batch`` rows, it is lowered to ``pooled ** (1 + log2(batch))`` for the purpose the policy
        uses it for, the slowest row: of many rows not yet seen, the worst tends to accept less
        than their average.
        """
        s, f = self.success[row], self.failure[row]
        prior = self._pooled()
        if s + f == 0:
            prior **= 1.0 + math.log2(max(1, batch))
        return min(0.98, (s + 2 * prior) / (s + f + 2))

    # -- cost ---------------------------------------------------------------------------------

    def step_seconds(self, rows: int, k: int) -> float | None:
        """Predicted step time for ``rows`` active rows drafting ``k``: the measured average, else
        the least-squares line in K through this batch size's measured lengths (None with fewer
        than two)."""
        return self._step_seconds(rows, k, self._line(rows))

    def _line(self, rows: int) -> tuple[float, float, float] | None:
        """(mean K, mean seconds, slope) of the least-squares line through the measured drafting
        lengths (K >= 1) of ``rows`` active rows when two or more are measured, else through every
        measured length, K = 0 included; None with fewer than two. (The first draft token costs a
        proposer's fixed work, a drafter forward, a window, besides its verification row: plain
        decoding is not on the line the drafted lengths lie on.)"""
        known = [(kk, t) for (b, kk), t in self.cost.items() if b == rows]
        drafted = [(kk, t) for kk, t in known if kk > 0]
        if len(drafted) >= 2:
            known = drafted
        if len(known) < 2:
            return None
        n = len(known)
        mean_k = sum(kk for kk, _ in known) / n
        mean_t = sum(t for _, t in known) / n
        var = sum((kk - mean_k) ** 2 for kk, _ in known)
        return mean_k, mean_t, max(0.0, sum((kk - mean_k) * (t - mean_t) for kk, t in known) / var)

    def _step_seconds(self, rows: int, k: int, line) -> float | None:
        measured = self.cost.get((rows, k))
        if measured is not None:
            return measured
        if line is None:
            return None
        mean_k, mean_t, slope = line
        return max(1e-9, mean_t + slope * (k - mean_k))

    # -- the policy ---------------------------------------------------------------------------

    def plan(self, active: list[bool], limits: list[int], adaptable: list[bool],
             remaining: list[int] | None = None) -> list[int]:
        if len(self.success) != len(active):
            self.success, self.failure = [0.0] * len(active), [0.0] * len(active)
            self.shadow_run = [0] * len(active)
        adapt = [a and (g or self.adapt_sampled) for a, g in zip(active, adaptable)]
        rows = [b for b, a in enumerate(active) if a]
        k_max = max((limits[b] for b in rows), default=0)
        if k_max == 0 or not any(adapt):
            return [lim if a else 0 for a, lim in zip(active, limits)]
        fixed = max((limits[b] for b in rows if not adapt[b]), default=0)  # rows the policy leaves alone
        # Plain decoding was best a step ago and nothing it depends on moved since but one more plain
        # step's cost and the rows' budgets: decided again only every HOLD steps (a decision costs
        # ~40 us, 3% of a small target's step), or sooner when a shadow draft raised a row's
        # acceptance (observe_shadow ends the hold).
        holding = bool(self.hold) and self.hold_rows == rows
        self.hold = self.hold - 1 if holding else 0
        # The cheap lengths not yet measured for this batch size.
        untried = [] if holding else [k for k in (0, 1) if self._unmeasured(len(rows), max(k, fixed))]
        if (not holding and not untried and k_max > 1
                and self._worth_measuring(rows, limits, adapt, k_max, fixed, remaining)):
            untried = [k_max]
        if holding:
            k = 0
        elif untried:  # a new batch size: two cheap lengths fix its cost line (and the longest may be measured)
            k = untried[0]
        elif self.steps == 1 and self._may_pay(rows, limits, adapt, k_max, fixed, remaining):
            # Every run drafts once early, so its rows show their acceptance: one token, or the best
            # of the lengths that cost about what one token does (where a step is mostly fixed work,
            # a longer draft shows more of the row for the same price); while too little has been
            # seen to judge, the length best at a good drafter's acceptance.
            if self._evidence() >= self.MIN_EVIDENCE:
                k = self._early_length(rows, limits, adapt, k_max, fixed, remaining)
            else:
                k = self._hopeful_length(rows, limits, adapt, k_max, fixed, remaining)
        else:
            rates = self._rates(rows, limits, adapt, k_max, fixed,
                                remaining if remaining is not None else [1] * len(active))
            k = max(rates, key=rates.get)
            if k and rates[k] < (1.0 + self.min_gain) * rates.get(0, 0.0):
                k = 0  # a predicted gain within the estimates' noise does not pay for the risk
            if k == 0 and self.steps >= 1:  # (not over the run's early draft at step 1)
                self.hold, self.hold_rows = max(0, min(self.HOLD, self.next_probe - self.steps - 1)), rows
                # Shadow drafts only where drafting could win at the acceptance seen on average:
                # elsewhere (the zoo pair at batch 4, where a drafted step costs ~1.6 plain ones)
                # judging them would cost every plain step ~2% for evidence that changes nothing.
                self.shadows_wanted = self._may_pay(rows, limits, adapt, k_max, fixed, remaining)
            if self.probed is not None:
                # The last probe: adopted if its length is now the best, else probe half as often.
                won = k == self.probed
                self.probe_interval = self.probe_every if won else min(16 * self.probe_every, 2 * self.probe_interval)
                self.next_probe = self.steps + self.probe_interval
                self.probed = None
            if self.steps >= self.next_probe:
                probe = k + 1 if k < k_max else k - 1
                if rates.get(probe, 0.0) >= (1.0 - self.probe_margin) * rates[k]:
                    k = self.probed = probe
                else:
                    self.next_probe = self.steps + self.probe_interval
            # Plain decoding, every row the policy's, every length measured or predicted and none
            # within the probe margin of plain decoding: nothing a plain step measures can bring
            # one back (acceptance moves only when rows draft or shadow drafts are judged, drafted
            # costs only when measured), so this run would never draft again.
            if (k == 0 and not fixed and not self.shadowed and self.steps >= 1 and 0 in rates
                    and len(rates) == k_max + 1
                    and all(r < (1.0 - self.probe_margin) * rates[0] for kk, r in rates.items() if kk)
                    and (self._evidence() >= self.MIN_EVIDENCE
                         or not self._may_pay(rows, limits, adapt, k_max, fixed, remaining))):
                self.settled = True
        self.last_k = k
        key = (len(rows), max(k, fixed))
        self.explored[key] = self.explored.get(key, 0) + 1
        return [(min(k, lim) if ad else lim) if a else 0 for a, ad, lim in zip(active, adapt, limits)]

    EARLY_COST_MARGIN = 0.05  # the early draft's length may cost this much more than one token

    def _early_length(self, rows: list[int], limits: list[int], adapt: list[bool], k_max: int, fixed: int,
                      remaining: list[int] | None) -> int:
        """The run's early draft: of the lengths measured or predicted to cost at most
        ``EARLY_COST_MARGIN`` more than one draft token, the one with the best predicted rate."""
        line = self._line(len(rows))
        one = self._step_seconds(len(rows), max(1, fixed), line)
        if one is None:
            return 1
        rates = self._rates(rows, limits, adapt, k_max, fixed,
                            remaining if remaining is not None else [1] * len(limits))
        cheap = [kk for kk in rates if kk and self._step_seconds(len(rows), max(kk, fixed), line)
                 <= (1.0 + self.EARLY_COST_MARGIN) * one]
        return max(cheap, key=rates.get, default=1)

    def _hopeful_length(self, rows: list[int], limits: list[int], adapt: list[bool], k_max: int, fixed: int,
                        remaining: list[int] | None) -> int:
        """The early draft while this kind of sampling has shown too little acceptance to judge
        (``MIN_EVIDENCE``): the length with the best predicted rate at ``EXPLORE_ALPHA``, so that
        one step shows several tokens' worth (a single drafted token, rejected, said the drafter
        was hopeless when it was not)."""
        rates = self._rates(rows, limits, adapt, k_max, fixed,
                            remaining if remaining is not None else [1] * len(limits),
                            alphas=[self.EXPLORE_ALPHA] * len(rows))
        drafted = {kk: r for kk, r in rates.items() if kk}
        return max(drafted, key=drafted.get, default=1)

    def drafting_over(self) -> bool:
        """Whether this run will draft no more (see ``plan``; never in a run whose shadow drafts
        were judged): the loop then decodes the rest of it without the proposer, which stops paying
        for its bookkeeping on every plain step (the target's hidden states for DFlash, EAGLE-3 and
        the heads, ~4% of a zoo step; a draft model's copy of the text and lookahead's index, ~0.15
        ms; ``decoding.drafting_over``). A later run starts afresh from what this one measured."""
        return self.settled

    def _unmeasured(self, rows: int, k: int) -> bool:
        """Whether ``(rows, k)`` still lacks its warm measurements and has not been granted often
        enough to give up on them (a proposer may feed less than it was granted, so a grant need
        not produce its own measurement)."""
        return (self.samples.get((rows, k), 0) < self.WARM_SAMPLES
                and self.explored.get((rows, k), 0) < self.WARM_SAMPLES + 2)

    def _worth_measuring(self, rows: list[int], limits: list[int], adapt: list[bool], k_max: int, fixed: int,
                         remaining: list[int] | None) -> bool:
        """Whether the longest draft, not measured yet at this batch size, should be: its predicted
        rate (each token past the first costing ``EXPLORE_SLOPE`` of what the first added over plain
        decoding, at a good drafter's acceptance, ``EXPLORE_ALPHA``, or the acceptance seen so far if
        higher: a few early drafts say little) comes within ``EXPLORE_MARGIN`` of plain decoding's.
        A verification's cost grows less than linearly in its width on a CPU (1 row 57 ms, 5 rows
        134 ms for a 1.5B GGUF model) and the first draft token carries the proposer's fixed work,
        so the line through K = 0 and 1 overstates the longest draft's cost, and a length never
        measured is never chosen; a clearly hopeless one (a drafted step costing several plain ones)
        is not paid for."""
        if not self._unmeasured(len(rows), max(k_max, fixed)):
            return False
        hopeful = max(self.EXPLORE_ALPHA, min(0.98, self._pooled()))
        # Each token past the first assumed to cost a quarter of what the first added: the first
        # carries the proposer's fixed work (a drafter forward, a lookahead window), and a wider
        # verification costs less than linearly more on a CPU.
        c0, c1 = self.cost.get((len(rows), fixed)), self.cost.get((len(rows), max(1, fixed)))
        guess = None if c0 is None or c1 is None else {k_max: c1 + self.EXPLORE_SLOPE * max(0.0, c1 - c0) * (k_max - 1)}
        rates = self._rates(rows, limits, adapt, k_max, fixed, remaining if remaining is not None else [1] * len(limits),
                            alphas=[hopeful] * len(rows), guess=guess)
        return 0 in rates and k_max in rates and rates[k_max] >= (1.0 - self.EXPLORE_MARGIN) * rates[0]

    def _may_pay(self, rows: list[int], limits: list[int], adapt: list[bool], k_max: int, fixed: int,
                 remaining: list[int] | None) -> bool:
        """Whether drafting could win at this batch size if every row accepted as well as the rows
        seen so far do on average (the optimistic side: no lowering for the slowest row). Where even
        that loses (at batch 8 or 16 a drafted step can cost more than two plain ones), the early
        draft that measures this run's rows is not worth its step. While fewer than
        ``MIN_EVIDENCE`` draft tokens of this kind of sampling have been judged (this run's and
        remembered), the hopeful ``EXPLORE_ALPHA`` stands in: the step costs may be known from runs
        that sampled otherwise (greedy rows before sampled ones), and the prior, or one unlucky
        token over it, would then keep every later run plain without measuring what it rejects
        (the real pair's `lookahead+draft` at T = 0.8 after its greedy rows: tau 1.00)."""
        pooled = min(0.98, self._pooled())
        if self._evidence() < self.MIN_EVIDENCE:
            pooled = max(pooled, self.EXPLORE_ALPHA)
        rates = self._rates(rows, limits, adapt, k_max, fixed, remaining if remaining is not None else [1] * len(limits),
                            alphas=[pooled] * len(rows))
        base = rates.get(0)
        return base is None or any(r >= (1.0 + self.min_gain) * base for k, r in rates.items() if k)

    def _rates(self, rows: list[int], limits: list[int], adapt: list[bool], k_max: int, fixed: int,
               remaining: list[int], alphas: list[float] | None = None, guess: dict | None = None) -> dict:
        """1 / expected seconds until every active row is done, for every length ``K`` in
        ``0 .. k_max`` whose step cost can be predicted (``alphas``: per active row, default each
        row's estimate; ``guess``: K -> step seconds to assume where K is not measured)."""
        if alphas is None:
            alphas = [self.alpha(b, len(rows)) for b in rows]
        line = self._line(len(rows))
        # Rows with the same acceptance, budget and limit need the same number of steps: distinct
        # ones only (a batch of fresh rows is one).
        kinds = {(a, remaining[b], limits[b], adapt[b]) for a, b in zip(alphas, rows)}
        rates = {}
        for k in range(k_max + 1):
            seconds = self._step_seconds(len(rows), max(k, fixed), line)
            if guess and k in guess and (len(rows), max(k, fixed)) not in self.cost:
                seconds = guess[k]
            if seconds is None:
                continue
            # A batch is done when its last row is: the steps it still needs are those of the row
            # with the most tokens left per expected token per step (expected tokens of a row
            # granted g drafts: (1 - a^(g + 1)) / (1 - a)).
            steps = max(left * (1 - a) / (1 - a ** ((min(k, lim) if ad else lim) + 1)) for a, left, lim, ad in kinds)
            # A run that has not drafted yet pays its drafter's catch-up with the prompt first.
            rates[k] = 1.0 / (steps * seconds + (self.catch_up_seconds if k and not self.caught_up else 0.0))
        return rates

    def observe(self, active: list[bool], drafted: list[int], accepted: list[int], fed_width: int,
                seconds: float) -> None:
        self.steps += 1
        rows = sum(active)
        self.history.append(self.last_k)
        if any(d > 0 for d in drafted):
            self.caught_up = True
        # The first step of a run pays one-time costs (first forwards at this batch shape): it
        # would make plain decoding look dearer than it is, so it is not measured.
        if rows and self.steps > 1:
            # Keyed by the deepest draft actually sent (a proposer may draft less than granted), the
            # K that plan() chooses: for chains it is the fed width less the root, for trees and
            # extra rows the width is larger (nodes, window) but grows with the same K.
            key = (rows, max((d for d, a in zip(drafted, active) if a), default=0))
            old, taken = self.cost.get(key), self.samples.get(key, 0)
            if old is None:
                self.cost[key] = seconds
            elif taken < self.WARM_SAMPLES:  # a first, possibly cold, measurement: keep the least
                self.cost[key] = min(old, seconds)
            else:
                self.cost[key] = old + self.smoothing * (seconds - old)
            self.samples[key] = taken + 1
        for b, (a, d, n) in enumerate(zip(active, drafted, accepted)):
            if a and d > 0:
                self._count(b, d, n)

    def wants_shadows(self) -> bool:
        """Whether the loop should start shadow drafts now: unless the last choice of plain
        decoding found that no length could win even at the acceptance rows show on average."""
        return self.shadows_wanted

    SHADOW_RUN = 2  # guesses of one shadow chain repeated in a row that end a hold of plain decoding

    def observe_shadow(self, row: int, matched: int, missed: bool, first: bool) -> None:
        """Guesses of a shadow draft of ``row`` were judged (``specdec_cuda.shadow``): of the chain
        its proposer would have drafted on a plain step, ``matched`` more guesses the text repeated
        and, if ``missed``, the next one it did not; ``first``: the chain's first news (the row's
        counts then decay, once per chain as per verified draft). The same evidence as a verified
        draft. A chain that has repeated ``SHADOW_RUN`` guesses ends a hold of plain decoding (the
        row may have started copying); single matches, frequent in any text, wait for the next
        decision rather than paying for one every step."""
        if not 0 <= row < len(self.success):
            return
        if first:
            self._decay(row)
            self.shadow_run[row] = 0
        self._add(row, matched, 1.0 if missed else 0.0)
        self.shadow_run[row] += matched
        self.shadowed = True
        if self.hold and not missed and self.shadow_run[row] >= self.SHADOW_RUN:
            self.hold = 0

    def _count(self, b: int, d: int, n: int) -> None:
        """Row ``b`` drafted ``d`` tokens and ``n`` were accepted."""
        self._decay(b)
        self._add(b, n, 1.0 if n < d else 0.0)

    def _decay(self, b: int) -> None:
        # Per draft of the row, not per step: a row that showed it is hard to draft for stays known
        # as such through the steps it does not draft. The pooled counts forget slowly.
        self.success[b] *= self.decay
        self.failure[b] *= self.decay
        self.seen_success *= 0.99
        self.seen_failure *= 0.99

    def _add(self, b: int, success: float, failure: float) -> None:
        self.success[b] += success
        self.failure[b] += failure
        self.seen_success += success
        self.seen_failure += failure


def sampling_label(temperature: list[float], top_k: list[int], top_p: list[float]) -> str:
    """The kind of sampling a run's rows do, for ``CostAwarePolicy.set_sampling`` (per-row values):
    ``"greedy"`` when every row is, else the hottest row's temperature and the loosest truncation,
    rounded (nearby settings accept alike; the hottest row is the one that accepts least)."""
    hot = max(temperature, default=0.0)
    if hot <= 0.0:
        return "greedy"
    k = 0 if any(v <= 0 for v in top_k) else max(top_k)
    return f"T={hot:.1f} top_k={k} top_p={max(top_p):.2f}"


def make_policy(policy, memory=None) -> SpeculationPolicy | None:
    """``"cost"`` / ``"fixed"`` / a policy object / None (None: the loop's fixed behaviour);
    ``memory``: the ``PolicyMemory`` a new cost policy starts from and saves to."""
    if policy is None or not isinstance(policy, str):
        return policy
    if policy == "cost":
        return CostAwarePolicy(memory=memory)
    if policy == "fixed":
        return FixedPolicy()
    raise ValueError(f'policy must be "cost", "fixed" or a SpeculationPolicy, got {policy!r}')
