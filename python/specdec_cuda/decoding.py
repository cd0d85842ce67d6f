"""The one decoding loop: autoregressive, and speculative with any chain proposer.

Sequence bookkeeping, per row ``b``: the target cache holds the committed prefix, ``lengths[b]``
tokens; ``last[b]``, the newest token, sits at absolute position ``lengths[b]`` and is *not* in the
cache yet. Every step feeds ``[last, d_1 .. d_k]`` at positions ``lengths + 0 .. k`` in one target
forward, whose logits row ``j`` is the target's distribution for the token after input ``j``:
rows ``0 .. k-1`` judge the drafts, row ``k`` gives the bonus token when all are accepted.

Randomness: every draw is a Philox draw keyed by (row seed, absolute position of the token drawn,
purpose), so a request's output depends neither on its batch nor on the method's step structure
(sample-and-match speculation emits exactly the autoregressive samples of the same seed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from . import ops

if TYPE_CHECKING:
    from .models.protocol import CausalLM
    from .proposers.base import ChainProposer

StreamCallback = Callable[[int, list[int]], None]  # (row, newly emitted token ids)


@dataclass
class SamplingParams:
    """Per-row sampling parameters. Shape: each [B] (temperature/top_p float32, top_k int32, seed int64:
    the dtypes the sampling kernels take, so no call converts them)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def make(cls, batch: int, temperature=0.0, top_k=0, top_p=1.0, seed=0, device="cpu") -> "SamplingParams":
        """Scalars apply to every row; sequences give one value per row (per-request seeds)."""

        def per_row(name, value, dtype):
            t = torch.as_tensor(value, dtype=dtype).reshape(-1)
            if t.numel() == 1:
                t = t.expand(batch)
            if t.numel() != batch:
                raise ValueError(f"{name} has {t.numel()} values for a batch of {batch} prompts")
            return t.to(device).contiguous()

        return cls(per_row("temperature", temperature, torch.float32), per_row("top_k", top_k, torch.int32),
                   per_row("top_p", top_p, torch.float32), per_row("seed", seed, torch.int64))

    def kwargs(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed)


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

    def as_dict(self) -> dict:
        return dict(new_tokens=self.new_tokens, seconds=self.seconds, tokens_per_s=self.tokens_per_s,
                    tau=self.tau, target_forwards=self.target_forwards,
                    acceptance_rate=self.acceptance_rate, acceptance_per_position=self.acceptance)


@dataclass
class GenerationResult:
    """``tokens[b]``: the ids generated for prompt ``b`` (prompt excluded, EOS included if hit)."""

    tokens: list[list[int]]
    metrics: Metrics


class _Rows:
    """Host-side output per row: cuts at EOS and at max_new_tokens, streams, tracks who runs."""

    def __init__(self, batch: int, max_new_tokens: int, eos: Sequence[int], stream: StreamCallback | None):
        self.out: list[list[int]] = [[] for _ in range(batch)]
        self.done = [max_new_tokens <= 0] * batch
        self.max_new_tokens, self.eos, self.stream = max_new_tokens, set(eos), stream

    def emit(self, row: int, tokens: list[int]) -> None:
        tokens = tokens[: self.max_new_tokens - len(self.out[row])]
        for i, t in enumerate(tokens):
            if t in self.eos:  # EOS ends the row, also in the middle of an accepted run
                tokens = tokens[: i + 1]
                self.done[row] = True
                break
        self.out[row].extend(tokens)
        if len(self.out[row]) >= self.max_new_tokens:
            self.done[row] = True
        if self.stream is not None and tokens:
            self.stream(row, tokens)

    def budget(self) -> list[int]:
        return [0 if d else self.max_new_tokens - len(o) for d, o in zip(self.done, self.out)]


def _check_status(status: list[int], what: str) -> None:
    bad = [(b, s) for b, s in enumerate(status) if s]
    if bad:
        meaning = {1: "non-finite logits (NaN / +inf / all -inf)", 2: "a draft token outside the vocabulary",
                   3: "bad sampling parameters (temperature < 0 or top_p outside (0, 1])"}
        b, s = bad[0]
        raise RuntimeError(f"{what} flagged row {b}: status {s}, {meaning.get(s, 'unknown')}")


@torch.no_grad()
def decode(target: "CausalLM", prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int,
           proposer: "ChainProposer | None" = None, max_draft: int = 0, eos_token_id: Sequence[int] = (),
           stream: StreamCallback | None = None, typical: bool = False) -> GenerationResult:
    """Generate up to ``max_new_tokens`` per prompt; ``proposer=None`` is autoregressive decoding.

    ``max_draft``: the most draft tokens the proposer returns per step (sizes the caches).
    """
    device, batch = target.device, len(prompts)
    prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    if batch == 0 or int(prompt_lens.min()) == 0:
        raise ValueError("prompts must be a non-empty list of non-empty token id sequences")
    width = int(prompt_lens.max())
    padded = torch.zeros(batch, width, dtype=torch.int64)
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = torch.as_tensor(p, dtype=torch.int64)
    padded, prompt_lens = padded.to(device), prompt_lens.to(device)
    if int(padded.min()) < 0 or int(padded.max()) >= target.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {target.vocab_size}) (the target's vocabulary)")
    max_length = width + max_new_tokens + max_draft + 2
    rows_ = torch.arange(batch, device=device)
    metrics = Metrics(drafted=[0] * max_draft, accepted=[0] * max_draft)
    rows = _Rows(batch, max_new_tokens, eos_token_id, stream)
    start = time.perf_counter()

    # Prefill: the prompt into the target cache (and the drafter's); the first token from the target.
    cache = target.new_cache(batch, max_length)
    logits = target.forward(padded, torch.arange(width, device=device).expand(batch, width), cache).logits
    cache.commit(prompt_lens)
    first = ops.sample(logits[rows_, prompt_lens - 1], **params.kwargs(), position=prompt_lens)
    _check_status(first.status.tolist(), "sampling the first token")
    last, lengths = first.tokens, prompt_lens.clone()
    for b, t in enumerate(last.tolist()):
        rows.emit(b, [t])
    if proposer is not None:
        proposer.prefill(padded, prompt_lens, last, params, max_length)
    metrics.prefill_seconds = time.perf_counter() - start

    while not all(rows.done):
        active_list = [not d for d in rows.done]
        active = torch.tensor(active_list, device=device)
        budget = torch.tensor(rows.budget(), device=device)
        draft = None if proposer is None else proposer.propose(last, lengths, active, budget - 1)
        if draft is None or draft.tokens.shape[1] == 0:
            logits = target.forward(last[:, None], lengths[:, None], cache).logits[:, 0]
            num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
            result = ops.sample(logits, **params.kwargs(), position=lengths + 1)
            new_tokens, status = result.tokens[:, None], result.status
        else:
            # Propose, score bonus + drafts in one target forward, verify the whole batch in one call.
            num_draft = torch.where(active, draft.num_draft, 0)
            num_draft_host = num_draft.tolist()  # small; the step reads its results on the host anyway
            k = draft.tokens.shape[1]
            steps = torch.arange(k + 1, device=device)
            fed = torch.cat([last[:, None], draft.tokens], dim=1)  # [B, 1 + k]
            logits = target.forward(fed, lengths[:, None] + steps, cache).logits  # [B, 1 + k, V]
            if all(n == k for n in num_draft_host):
                # Every row drafted k: the ragged layout verify_chain takes is a plain reshape.
                draft_tokens, draft_logits = draft.tokens.reshape(-1), draft.logits
                target_logits = logits.reshape(batch * (k + 1), -1)
                draft_logits = None if draft_logits is None else draft_logits.reshape(batch * k, -1)
                cu_num_draft = steps.new_tensor([k * b for b in range(batch + 1)])
            else:
                is_draft = steps[None, :k] < num_draft[:, None]  # [B, k]
                draft_tokens = draft.tokens[is_draft]
                target_logits = logits[steps[None, :] <= num_draft[:, None]]
                draft_logits = None if draft.logits is None else draft.logits[is_draft]
                cu_num_draft = torch.nn.functional.pad(num_draft.cumsum(0), (1, 0))
            # Rejection sampling (Leviathan et al. / Chen et al.): accept d_j with probability
            # min(1, p(d_j) / q(d_j)); at the first rejection sample from max(0, p - q) normalised;
            # if all k survive, sample a bonus token from p. Greedy rows: accept while d_j == argmax p.
            result = ops.verify_chain(
                draft_tokens, cu_num_draft, target_logits, draft_logits,
                **params.kwargs(), position=lengths + 1, typical=typical, max_draft=k)
            new_tokens, num_accepted, status = result.tokens, result.num_accepted, result.status
        # Commit: the target keeps `last` and the accepted drafts; finished rows keep nothing.
        num_kept = torch.where(active, num_accepted + 1, 0)
        cache.commit(num_kept)
        host = torch.cat([new_tokens, num_accepted[:, None], status[:, None].to(torch.int64)], 1).tolist()
        _check_status([h[-1] for h in host], "sampling" if draft is None else "verification")
        if draft is not None and draft.tokens.shape[1]:
            # A chain's accepted drafts are its first num_accepted ones.
            for b, n in enumerate(num_draft_host):
                for j in range(n):
                    metrics.drafted[j] += 1
                for j in range(host[b][-2]):
                    metrics.accepted[j] += 1
        for b in range(batch):
            if active_list[b]:
                before = len(rows.out[b])
                rows.emit(b, host[b][: host[b][-2] + 1])
                metrics.new_tokens_after_prefill += len(rows.out[b]) - before
        metrics.target_forwards += 1
        metrics.row_steps += sum(active_list)
        last = torch.where(active, new_tokens[rows_, num_accepted], last)
        lengths = lengths + num_kept
        if proposer is not None:
            proposer.accept(num_accepted, last, active)

    metrics.seconds = time.perf_counter() - start
    metrics.new_tokens = sum(len(o) for o in rows.out)
    return GenerationResult(rows.out, metrics)
