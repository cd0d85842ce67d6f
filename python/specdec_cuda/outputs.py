"""What a generation run hands back: the tokens of each row, cut and streamed as they come, and
the run's metrics. Speculative decoding (``decoding``) and diffusion generation
(``diffusion_generate``) emit through the same ``RowOutputs``, so both stop a row the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

StreamCallback = Callable[[int, list[int]], None]  # (row, newly emitted token ids)


class RowOutputs:
    """The tokens emitted per row, host side: cut after EOS and at ``max_new_tokens``, streamed.

    ``out[b]``: row ``b``'s tokens so far (EOS included if hit); ``done[b]``: row ``b`` has hit
    EOS or its budget (and takes no more tokens).
    """

    def __init__(self, batch: int, max_new_tokens: int, eos: Sequence[int], stream: StreamCallback | None):
        self.out: list[list[int]] = [[] for _ in range(batch)]
        self.done = [max_new_tokens <= 0] * batch
        self.max_new_tokens, self.eos, self.stream = max_new_tokens, set(eos), stream

    def emit(self, row: int, tokens: list[int]) -> int:
        """Append ``tokens`` to row ``row`` up to its budget and its first EOS (also one in the
        middle of an accepted run), stream what was appended; returns how many tokens that was."""
        if self.done[row]:
            return 0
        tokens = tokens[: self.max_new_tokens - len(self.out[row])]
        for i, t in enumerate(tokens):
            if t in self.eos:
                tokens = tokens[: i + 1]
                self.done[row] = True
                break
        self.out[row].extend(tokens)
        if len(self.out[row]) >= self.max_new_tokens:
            self.done[row] = True
        if self.stream is not None and tokens:
            self.stream(row, tokens)
        return len(tokens)

    def budget(self) -> list[int]:
        """Tokens each row may still emit (0 for finished rows)."""
        return [0 if d else self.max_new_tokens - len(o) for d, o in zip(self.done, self.out)]


@dataclass
class Metrics:
    """What a run measured.

    ``tau``: tokens committed per target forward per row, counting the bonus token (1 for
    autoregressive decoding); ``acceptance[j]``: fraction of draft tokens at draft position ``j``
    that were accepted (over the rows that drafted that far).
    """

    new_tokens: int = 0
    new_tokens_after_prefill: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    target_forwards: int = 0  # decoding steps, prefill excluded
    row_steps: int = 0  # sum over steps of the rows still running
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    target_seconds: float = 0.0  # in target forwards of decoding steps (wall time; see host_overhead)
    propose_seconds: float = 0.0  # in the proposer's propose() (drafter forwards included)
    # of which one-time work (Draft.one_time_seconds: a drafter's prefill of the prompt, a catch-up
    # over plain steps), not the cost of the step's own draft
    one_time_seconds: float = 0.0
    accept_seconds: float = 0.0  # in the proposer's accept() (e.g. a drafter's cache fed the accepted path)
    # Whether the target's forwards were batch invariant (models.protocol.batch_invariant): then
    # greedy speculative output is the autoregressive output exactly; otherwise equal up to
    # near-ties, where a wider forward's rounding can flip an argmax.
    batch_invariant: bool = True

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tau(self) -> float:
        # The first token comes from prefill, not from a decoding step.
        return (self.new_tokens_after_prefill / self.row_steps) if self.row_steps else 0.0

    @property
    def acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted)]

    @property
    def acceptance_rate(self) -> float:
        return sum(self.accepted) / sum(self.drafted) if sum(self.drafted) else 0.0

    @property
    def host_overhead(self) -> float:
        """Share of the decoding steps' time spent outside target forwards and the proposer's
        ``propose`` / ``accept``: building the step, verification, commits, bookkeeping. On a GPU the forwards' wall time is their
        launch time, so there this share also holds the waits for the device."""
        steps = self.seconds - self.prefill_seconds
        outside = steps - self.target_seconds - self.propose_seconds - self.accept_seconds
        return max(0.0, outside) / steps if steps > 0 else 0.0

    def as_dict(self) -> dict:
        return dict(new_tokens=self.new_tokens, seconds=self.seconds, tokens_per_s=self.tokens_per_s,
                    tau=self.tau, target_forwards=self.target_forwards,
                    acceptance_rate=self.acceptance_rate, acceptance_per_position=self.acceptance,
                    target_seconds=self.target_seconds, propose_seconds=self.propose_seconds,
                    one_time_seconds=self.one_time_seconds, accept_seconds=self.accept_seconds,
                    host_overhead=self.host_overhead, batch_invariant=self.batch_invariant)

    def count_step(self, drafted: list[int], accepted: list[int], emitted: int, rows: int) -> None:
        """One decoding step: per row its drafted depth and accepted drafts (0 on rows that took
        no part), the tokens it emitted in all and the rows that took part."""
        # Per-position counts: a row that drafted d deep counts at positions 0 .. d-1.
        for d, a in zip(drafted, accepted):
            if d > len(self.drafted):
                grow = d - len(self.drafted)
                self.drafted += [0] * grow
                self.accepted += [0] * grow
            for j in range(d):
                self.drafted[j] += 1
            for j in range(a):
                self.accepted[j] += 1
        self.new_tokens_after_prefill += emitted
        self.target_forwards += 1
        self.row_steps += rows


@dataclass
class GenerationResult:
    """``tokens[b]``: the ids generated for prompt ``b`` (prompt excluded, EOS included if hit)."""

    tokens: list[list[int]]
    metrics: Metrics
