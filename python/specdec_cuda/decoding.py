"""The one decoding loop: autoregressive, and speculative with any proposer (chains and trees).

Sequence bookkeeping, per row ``b``: the target cache holds the committed prefix, ``lengths[b]``
tokens; ``last[b]``, the newest token (the step's *root*), sits at absolute position ``lengths[b]``
and is *not* in the cache yet. A step feeds ``[root, draft nodes, extra rows]`` in one target
forward: draft node ``v`` at position ``lengths[b] + depth(v)``, seeing the prefix and its
ancestors (a chain is causal); the target's logits at node ``v`` judge ``v``'s children, and at
the last accepted node give the bonus token. Only the accepted path is committed to the cache.

Verification follows how the draft was drawn (``proposers.base.DraftKind``): rejection sampling /
SpecInfer for tokens sampled from q, greedy / sample-and-match for deterministic guesses, typical
acceptance (lossy) when asked; greedy rows (temperature 0) are greedy under every rule.

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
from .ops.status import raise_for
from .proposers.base import Draft, DraftKind, ExtraRows, Outcome, PrefillContext, StepState

if TYPE_CHECKING:
    from .models.protocol import CausalLM
    from .policy import SpeculationPolicy
    from .proposers.base import Proposer

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
    target_seconds: float = 0.0  # in target forwards of decoding steps (wall time; see host_overhead)
    propose_seconds: float = 0.0  # in the proposer's propose() (drafter forwards included)

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
        """Share of the decoding steps' time spent outside target forwards and ``propose``: building
        the step, verification, commits, bookkeeping. On a GPU the forwards' wall time is their
        launch time, so there this share also holds the waits for the device."""
        steps = self.seconds - self.prefill_seconds
        return max(0.0, steps - self.target_seconds - self.propose_seconds) / steps if steps > 0 else 0.0

    def as_dict(self) -> dict:
        return dict(new_tokens=self.new_tokens, seconds=self.seconds, tokens_per_s=self.tokens_per_s,
                    tau=self.tau, target_forwards=self.target_forwards,
                    acceptance_rate=self.acceptance_rate, acceptance_per_position=self.acceptance,
                    target_seconds=self.target_seconds, propose_seconds=self.propose_seconds,
                    host_overhead=self.host_overhead)

    def _count(self, drafted: list[int], accepted: list[int]) -> None:
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


@dataclass
class _Fed:
    """One step's target input. Shape: tokens / positions [B, T] (T = 1 + n + e: root, draft nodes,
    extra rows); mask [B, T, T] bool or None (causal). Trees also keep their flat layout for
    ``verify_tree``: parents / cu_num_nodes / node_tokens (N,), first_child and depth [B, 1 + n]."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    num_nodes: torch.Tensor  # [B] draft nodes per row after masking finished rows
    num_nodes_host: list[int]
    num_extra: int = 0
    parents: torch.Tensor | None = None
    cu_num_nodes: torch.Tensor | None = None
    node_tokens: torch.Tensor | None = None
    first_child: torch.Tensor | None = None
    depth_host: list[int] | None = None  # deepest draft node per row


class _Loop:
    """The state of one ``decode`` call and its steps: prefill, propose, feed, verify, commit, emit."""

    def __init__(self, target, prompts, params, max_new_tokens, proposer, policy, eos_token_id, stream):
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        self.target, self.params, self.proposer, self.policy = target, params, proposer, policy
        self.batch, self.device = len(prompts), target.device
        self.rows = _Rows(self.batch, max_new_tokens, eos_token_id, stream)
        max_draft = proposer.max_draft if proposer is not None else 0
        self.metrics = Metrics(drafted=[0] * max_draft, accepted=[0] * max_draft)
        self.hidden_layers = tuple(proposer.hidden_layers) if proposer is not None else ()
        self.row_index = torch.arange(self.batch, device=self.device)
        self.prompts = prompts
        self.greedy_host = (params.temperature == 0).tolist()

    # -- prefill ----------------------------------------------------------------------------------

    def prefill(self) -> None:
        """The prompts into the target cache; the first token; the proposer's own prefill."""
        target, device, batch = self.target, self.device, self.batch
        prompt_lens = torch.tensor([len(p) for p in self.prompts], dtype=torch.int64)
        if batch == 0 or int(prompt_lens.min()) == 0:
            raise ValueError("prompts must be a non-empty list of non-empty token id sequences")
        width = int(prompt_lens.max())
        padded = torch.zeros(batch, width, dtype=torch.int64)
        for b, p in enumerate(self.prompts):
            padded[b, : len(p)] = torch.as_tensor(p, dtype=torch.int64)
        if int(padded.min()) < 0 or int(padded.max()) >= target.vocab_size:
            raise ValueError(f"prompt token ids must lie in [0, {target.vocab_size}) (the target's vocabulary)")
        padded, prompt_lens = padded.to(device), prompt_lens.to(device)
        # Capacity: prompt, every token to generate, and the most a step sends beyond its root.
        pending = self.proposer.max_pending_tokens() if self.proposer is not None else 0
        max_length = width + self.rows.max_new_tokens + pending + 2
        self.cache = target.new_cache(batch, max_length)
        # Logits of each prompt's last token only: the LM head over the whole prompt would cost
        # about a seventh of the zoo target's prefill.
        out = target.forward(padded, torch.arange(width, device=device).expand(batch, width), self.cache,
                             hidden_layers=self.hidden_layers, logits_at=prompt_lens - 1)
        self.cache.commit(prompt_lens)
        first = ops.sample(out.logits[:, 0], **self.params.kwargs(), position=prompt_lens)
        raise_for(first.status.tolist(), "sampling the first token", exc=RuntimeError)
        self.last, self.lengths = first.tokens, prompt_lens.clone()
        for b, t in enumerate(self.last.tolist()):
            self.rows.emit(b, [t])
        if self.proposer is not None:
            self.proposer.prefill(PrefillContext(target, self.cache, padded, prompt_lens, self.last, self.params,
                                                 max_length, out.hidden_states))

    # -- one step ---------------------------------------------------------------------------------

    def state(self) -> StepState:
        """Who runs, and how many draft tokens each row may use (policy, capped by its budget)."""
        self.active_host = [not d for d in self.rows.done]
        self.active = active = torch.tensor(self.active_host, device=self.device)
        remaining = self.rows.budget()
        if self.proposer is None:
            limits = [0] * self.batch
        else:
            # The bonus token is always emitted: a row may draft one token fewer than it has left.
            limits = [min(max(0, r - 1), self.proposer.max_draft) for r in remaining]
            if self.policy is not None:
                limits = self.policy.plan(self.active_host, limits, self.greedy_host, remaining)
        self.limits_host = limits
        max_draft = torch.tensor(limits, dtype=torch.int64, device=self.device)
        return StepState(self.last, self.lengths, active, max_draft, self.params)

    def propose(self, state: StepState) -> tuple[Draft | None, ExtraRows | None]:
        if self.proposer is None:
            return None, None
        start = time.perf_counter()
        # No row may draft (the policy chose plain decoding): no proposal to ask for.
        draft = self.proposer.propose(state) if max(self.limits_host) > 0 else None
        extra = self.proposer.extra_rows(state, draft)
        self.metrics.propose_seconds += time.perf_counter() - start
        return draft, extra

    def feed(self, state: StepState, draft: Draft | None, extra: ExtraRows | None) -> _Fed:
        """Lay out ``[root, draft nodes, extra rows]``: tokens, positions and who sees whom."""
        root, lengths = self.last[:, None], self.lengths
        if draft is None:
            empty = torch.zeros(self.batch, dtype=torch.int64, device=self.device)
            draft = Draft(root[:, :0], empty, DraftKind.GUESS)
        num_nodes = torch.where(state.active, draft.num_nodes, 0)
        num_nodes_host = num_nodes.tolist()
        n = draft.width
        if any(c < 0 or c > n for c in num_nodes_host):
            raise ValueError(f"the proposer returned num_nodes {num_nodes_host} for drafts of width {n}")
        tokens = torch.cat([root, draft.tokens], dim=1)  # [B, 1 + n]
        if draft.is_chain:
            limits = self.limits_host  # host copy of state.max_draft
            over = [b for b, (c, m) in enumerate(zip(num_nodes_host, limits)) if c > m]
            if over:
                raise ValueError(f"the proposer drafted {num_nodes_host[over[0]]} tokens for row {over[0]}, "
                                 f"more than the {limits[over[0]]} it was granted (StepState.max_draft)")
            fed = _Fed(tokens, lengths[:, None] + torch.arange(1 + n, device=self.device), None, num_nodes,
                       num_nodes_host)
            fed.depth_host = num_nodes_host
        else:
            fed = self._tree_layout(tokens, draft.parents, num_nodes, num_nodes_host)
        if extra is not None:
            self._append_extra(fed, extra)
        return fed

    def _tree_layout(self, tokens, parents, num_nodes, num_nodes_host) -> _Fed:
        # Flat ragged layout of the tree kernels: per row the root (parent -1), then its nodes.
        B, M = tokens.shape
        full = torch.cat([parents.new_full((B, 1), -1), parents], dim=1)  # [B, M]
        if all(c == M - 1 for c in num_nodes_host):
            flat_parents, flat_tokens = full.reshape(-1), tokens.reshape(-1)
        else:
            real = torch.arange(M, device=self.device)[None, :] <= num_nodes[:, None]
            flat_parents, flat_tokens = full[real], tokens[real]
        cu = torch.nn.functional.pad((num_nodes + 1).cumsum(0), (1, 0))
        layout = ops.build_tree(flat_parents, cu, self.lengths, max_nodes=M)  # raises on a malformed tree
        fed = _Fed(tokens, layout.positions, layout.tree_mask, num_nodes, num_nodes_host,
                   parents=flat_parents, cu_num_nodes=cu, node_tokens=flat_tokens,
                   first_child=layout.first_child)
        fed.depth_host = layout.depth.amax(dim=1).tolist()
        return fed

    def _append_extra(self, fed: _Fed, extra: ExtraRows) -> None:
        # Extra rows see the prefix, the root and each other as their mask says; draft nodes never
        # see them, so the draft's logits do not depend on them.
        B, M = fed.tokens.shape
        e = extra.tokens.shape[1]
        if extra.positions.shape != (B, e) or extra.mask.shape != (B, e, e):
            raise ValueError(f"extra rows: tokens {tuple(extra.tokens.shape)}, positions "
                             f"{tuple(extra.positions.shape)} and mask {tuple(extra.mask.shape)} disagree")
        draft_mask = fed.mask if fed.mask is not None else torch.ones(M, M, dtype=torch.bool,
                                                                      device=self.device).tril().expand(B, M, M)
        top = torch.cat([draft_mask, draft_mask.new_zeros(B, M, e)], dim=2)
        sees_root = draft_mask.new_zeros(B, e, M)
        sees_root[:, :, 0] = True
        bottom = torch.cat([sees_root, extra.mask.to(torch.bool)], dim=2)
        fed.tokens = torch.cat([fed.tokens, extra.tokens], dim=1)
        fed.positions = torch.cat([fed.positions, extra.positions], dim=1)
        fed.mask = torch.cat([top, bottom], dim=1)
        fed.num_extra = e

    def forward(self, fed: _Fed):
        start = time.perf_counter()
        out = self.target.forward(fed.tokens, fed.positions, self.cache, tree_mask=fed.mask,
                                  hidden_layers=self.hidden_layers)
        self.metrics.target_seconds += time.perf_counter() - start
        return out

    def verify(self, draft: Draft | None, fed: _Fed, logits: torch.Tensor):
        """Accepted path and new tokens per row. Returns tokens [B, m], accepted_nodes [B, m] or None
        (chains: the first num_accepted + 1 nodes), num_accepted [B], status [B]."""
        params, position = self.params.kwargs(), self.lengths + 1
        M = fed.tokens.shape[1] - fed.num_extra
        if draft is None or (fed.parents is None and max(fed.num_nodes_host) == 0):
            # Nothing drafted: plain sampling of the next token (the autoregressive draws).
            result = ops.sample(logits[:, 0], **params, position=position)
            zero = torch.zeros(self.batch, dtype=torch.int64, device=self.device)
            return result.tokens[:, None], None, zero, result.status
        if draft.kind is DraftKind.SAMPLED and draft.logits is None:
            raise ValueError("a SAMPLED draft must carry the logits its tokens were drawn from (Draft.logits)")
        if draft.kind is DraftKind.GUESS and draft.logits is not None:
            raise ValueError("a GUESS draft carries no draft logits: guesses are verified by sample-and-match")
        draft_logits = draft.logits
        if draft_logits is not None and draft_logits.dtype != logits.dtype:
            draft_logits = draft_logits.to(logits.dtype)
        if fed.parents is None:
            return self._verify_chain(draft, fed, logits[:, :M], draft_logits, params, position)
        if draft.kind is DraftKind.TYPICAL:
            raise ValueError("typical acceptance is defined for chains only; send the draft as a chain")
        if draft_logits is not None:
            # verify_tree reads, at node v, the q that v's children were drawn from: the logits
            # of v's first child (siblings share them). Leaves' rows are not read.
            src = (fed.first_child - 1).clamp(min=0)  # [B, M]
            draft_logits = draft_logits.gather(1, src[:, :, None].expand(-1, -1, draft_logits.shape[-1]))
        result = ops.verify_tree(fed.node_tokens, fed.parents, fed.cu_num_nodes, logits[:, :M], draft_logits,
                                 **params, position=position, max_nodes=M)
        return result.tokens, result.accepted_nodes, result.num_accepted, result.status

    def _verify_chain(self, draft, fed, logits, draft_logits, params, position):
        # Rejection sampling (Leviathan et al. / Chen et al.): accept d_j with probability
        # min(1, p(d_j) / q(d_j)); at the first rejection sample from max(0, p - q) normalised; if
        # all k survive, sample a bonus token from p. Greedy rows: accept while d_j == argmax p.
        k, batch = draft.width, self.batch
        if all(c == k for c in fed.num_nodes_host):
            # Every row drafted k: the ragged layout verify_chain takes is a plain reshape.
            draft_tokens, target_logits = draft.tokens.reshape(-1), logits.reshape(batch * (k + 1), -1)
            draft_logits = None if draft_logits is None else draft_logits.reshape(batch * k, -1)
        else:
            steps = torch.arange(k + 1, device=self.device)
            is_draft = steps[None, :k] < fed.num_nodes[:, None]  # [B, k]
            draft_tokens = draft.tokens[is_draft]
            target_logits = logits[steps[None, :] <= fed.num_nodes[:, None]]
            draft_logits = None if draft_logits is None else draft_logits[is_draft]
        cu_num_draft = torch.nn.functional.pad(fed.num_nodes.cumsum(0), (1, 0))
        result = ops.verify_chain(draft_tokens, cu_num_draft, target_logits, draft_logits, **params,
                                  position=position, typical=draft.kind is DraftKind.TYPICAL, max_draft=k)
        return result.tokens, None, result.num_accepted, result.status

    def commit(self, draft, fed, out, verified) -> None:
        """Keep the accepted path in the cache, emit its tokens, tell the proposer and the policy."""
        new_tokens, accepted_nodes, num_accepted, status = verified
        active = self.active
        num_kept = torch.where(active, num_accepted + 1, 0)
        self.cache.commit(num_kept, accepted_nodes)
        # One host copy of everything the bookkeeping reads: tokens, counts, status per row.
        host = torch.cat([new_tokens, num_accepted[:, None], status[:, None].to(torch.int64)], 1).tolist()
        raise_for([h[-1] for h in host], "sampling" if draft is None else "verification", exc=RuntimeError)
        num_accepted_host = [h[-2] for h in host]
        drafted = [d if a else 0 for d, a in zip(fed.depth_host, self.active_host)]
        self.metrics._count(drafted, [n if a else 0 for n, a in zip(num_accepted_host, self.active_host)])
        for b in range(self.batch):
            if self.active_host[b]:
                before = len(self.rows.out[b])
                self.rows.emit(b, host[b][: num_accepted_host[b] + 1])
                self.metrics.new_tokens_after_prefill += len(self.rows.out[b]) - before
        self.metrics.target_forwards += 1
        self.metrics.row_steps += sum(self.active_host)
        lengths = self.lengths
        next_tokens = torch.where(active, new_tokens[self.row_index, num_accepted], self.last)
        if self.proposer is not None:
            self.proposer.accept(draft, self._outcome(fed, out, new_tokens, accepted_nodes, num_accepted,
                                                      next_tokens, active, lengths))
        self.last, self.lengths = next_tokens, lengths + num_kept
        if self.policy is not None:  # last: the step's time includes the proposer's accept()
            self.policy.observe(self.active_host, drafted, num_accepted_host, fed.tokens.shape[1],
                                self._last_step_seconds())

    def _last_step_seconds(self) -> float:
        now = time.perf_counter()
        seconds, self._step_start = now - self._step_start, now
        return seconds

    def _outcome(self, fed, out, new_tokens, accepted_nodes, num_accepted, next_tokens, active, lengths) -> Outcome:
        m = new_tokens.shape[1]
        if accepted_nodes is None:  # chain: the root and the first num_accepted drafts
            steps = torch.arange(m, device=self.device)
            accepted_nodes = torch.where(steps[None, :] <= num_accepted[:, None], steps[None, :], -1)
        M = fed.tokens.shape[1] - fed.num_extra
        hidden, extra_hidden = {}, {}
        if out.hidden_states:
            path = accepted_nodes.clamp(min=0)
            for layer, h in out.hidden_states.items():
                hidden[layer] = h.gather(1, path[:, :, None].expand(-1, -1, h.shape[-1]))
                if fed.num_extra:
                    extra_hidden[layer] = h[:, M:]
        extra_logits = out.logits[:, M:] if fed.num_extra else None
        return Outcome(num_accepted, accepted_nodes, new_tokens, next_tokens, active, lengths, hidden,
                       extra_logits, extra_hidden)

    def result(self) -> GenerationResult:
        self.metrics.seconds = time.perf_counter() - self.start
        self.metrics.new_tokens = sum(len(o) for o in self.rows.out)
        return GenerationResult(self.rows.out, self.metrics)


@torch.no_grad()
def decode(target: "CausalLM", prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int,
           proposer: "Proposer | None" = None, eos_token_id: Sequence[int] = (),
           stream: StreamCallback | None = None, policy: "SpeculationPolicy | None" = None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` per prompt; ``proposer=None`` is autoregressive decoding.

    ``policy`` decides, per step and row, how many draft tokens a row may use (None: as many as
    the proposer's ``max_draft`` and the row's budget allow).
    """
    loop = _Loop(target, prompts, params, max_new_tokens, proposer, policy, eos_token_id, stream)
    loop.start = time.perf_counter()
    if policy is not None:
        policy.start(len(prompts))
    loop.prefill()
    loop.metrics.prefill_seconds = loop._step_start = time.perf_counter()
    loop.metrics.prefill_seconds -= loop.start
    while not all(loop.rows.done):
        state = loop.state()                             # who runs, draft budget per row
        draft, extra = loop.propose(state)               # a tree (or chain) per row, + riding rows
        fed = loop.feed(state, draft, extra)             # [root, nodes, extra] with masks, positions
        out = loop.forward(fed)                          # one target forward
        verified = loop.verify(draft, fed, out.logits)   # accepted path + correction / bonus token
        loop.commit(draft, fed, out, verified)           # cache, emit, proposer.accept, policy
    return loop.result()
