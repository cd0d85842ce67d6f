"""The one decoding loop: autoregressive, and speculative with any proposer (chains and trees).

Sequence bookkeeping, per row ``b``: the target cache holds the committed prefix, ``lengths[b]``
tokens; ``last[b]``, the newest token (the step's *root*), sits at absolute position ``lengths[b]``
and is *not* in the cache yet. A step feeds ``[root, draft nodes, extra rows]`` in one target
forward: draft node ``v`` at position ``lengths[b] + depth(v)``, seeing the prefix and its
ancestors (a chain is causal); the target's logits at node ``v`` judge ``v``'s children, and at
the last accepted node give the bonus token. Only the accepted path is committed to the cache.

Verification follows how the draft was drawn (``contract.DraftKind``): rejection sampling /
SpecInfer for tokens sampled from q, greedy / sample-and-match for deterministic guesses, typical
acceptance (lossy) when asked; greedy rows (temperature 0) are greedy under every rule.

Randomness: every draw is a Philox draw keyed by (row seed, absolute position of the token drawn,
purpose), so a request's output depends neither on its batch nor on the method's step structure
(sample-and-match speculation emits exactly the autoregressive samples of the same seed).

The loop is ``decode``; each of its steps is a function below that takes and returns values:
``prefill``, ``plan``, ``propose``, ``chain_input`` / ``tree_input``, ``verify_chain`` /
``verify_tree``, ``commit``, ``emit``, ``outcome``. The contract with proposers is
``specdec_cuda.contract`` (re-exported here and in ``proposers.base``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

import torch

from . import ops
from .contract import Draft, DraftKind, ExtraRows, Outcome, PrefillContext, Proposer, SamplingParams, StepState
from .models.protocol import batch_invariant, prefill_kwargs
from .ops.status import raise_for
from .outputs import GenerationResult, Metrics, RowOutputs, StreamCallback
from .policy import sampling_label
from .shadow import ShadowDrafts

if TYPE_CHECKING:
    from .models.protocol import CausalLM, KVCache, ModelOutput
    from .policy import SpeculationPolicy

__all__ = ["Draft", "DraftKind", "ExtraRows", "GenerationResult", "Metrics", "Outcome", "PrefillContext", "Proposer",
           "SamplingParams", "StepState", "StreamCallback", "decode"]


@torch.no_grad()
def decode(target: "CausalLM", prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int,
           proposer: Proposer | None = None, eos_token_id: Sequence[int] = (),
           stream: StreamCallback | None = None, policy: "SpeculationPolicy | None" = None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` per prompt; ``proposer=None`` is autoregressive decoding.

    ``policy`` decides, per step and row, how many draft tokens a row may use (None: as many as
    the proposer's ``max_draft`` and the row's budget allow).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    rows = RowOutputs(len(prompts), max_new_tokens, eos_token_id, stream)
    max_draft = proposer.max_draft if proposer is not None else 0
    metrics = Metrics(drafted=[0] * max_draft, accepted=[0] * max_draft, batch_invariant=batch_invariant(target))
    hidden_layers = tuple(proposer.hidden_layers) if proposer is not None else ()
    greedy, device = (params.temperature == 0).tolist(), target.device
    adaptable = greedy
    start = time.perf_counter()
    if policy is not None:
        policy.start(len(prompts))
        if hasattr(policy, "set_sampling"):  # acceptance evidence is kept per kind of sampling
            policy.set_sampling(sampling_label(params.temperature.tolist(), params.top_k.tolist(),
                                               params.top_p.tolist()))
    ctx = prefill(target, prompts, params, max_new_tokens, proposer, hidden_layers)
    for b, t in enumerate(ctx.first_tokens.tolist()):
        rows.emit(b, [t])
    if proposer is not None:
        proposer.prefill(ctx)
        # Rows whose output does not depend on their draft length: greedy ones, and sampled ones
        # whose drafts are verified by sample-and-match. A policy may shorten only their drafts.
        matching = proposer.matches_samples()
        adaptable = [g or matching for g in greedy]
    cache, last, lengths = ctx.cache, ctx.first_tokens, ctx.prompt_lens.clone()
    # A free proposer's chains on the policy's plain steps, scored against what they emit; greedy
    # runs only. A sampled row matches a guess only where its sample lands on it: short scattered
    # runs of matches that end holds of plain decoding for drafts that mostly lose (zoo pair, prompt
    # lookup at T = 0.8, batch 1: 0.93x of autoregressive decoding with shadows, 0.98-1.04x without;
    # on the real pair at T = 0.8 prompt lookup keeps its gain: 1.40x with them, 1.43x without).
    shadows = (ShadowDrafts(len(prompts)) if offers_shadows(proposer) and hasattr(policy, "observe_shadow")
               and all(greedy) else None)
    step_start = time.perf_counter()
    metrics.prefill_seconds = step_start - start
    while not all(rows.done):
        active, limits = plan(rows, proposer, policy, adaptable)   # who runs, drafts granted per row
        if proposer is not None and shadows is None and drafting_over(policy, active, adaptable):
            proposer, hidden_layers = None, ()  # plain decoding to the end: no drafter bookkeeping
        if shadows is not None:
            shadows = start_shadows(shadows, proposer, active, limits, rows, policy)
        state = StepState(last, lengths, torch.tensor(active, device=device),
                          torch.tensor(limits, dtype=torch.int64, device=device), params,
                          [n if a else 0 for n, a in zip(limits, active)])
        t = time.perf_counter()
        draft, extra = propose(proposer, state, limits)             # a tree (or chain) per row, + riding rows
        metrics.propose_seconds += time.perf_counter() - t
        one_time = draft.one_time_seconds if draft is not None else 0.0  # not this step's cost (Draft)
        metrics.one_time_seconds += one_time
        if draft is None or draft.is_chain:                         # the one place chains and trees part
            fed, verify = chain_input(state, draft, limits), verify_chain
        else:
            fed, verify = tree_input(state, draft), verify_tree
        if extra is not None:
            fed = with_extra_rows(fed, extra)
        t = time.perf_counter()
        out = target.forward(fed.tokens, fed.positions, cache, tree_mask=fed.mask, hidden_layers=hidden_layers)
        metrics.target_seconds += time.perf_counter() - t
        # Accept draft d_j with probability min(1, p(d_j) / q(d_j)) (q one-hot for guesses; greedy rows:
        # while d_j = argmax p); at the first rejection draw from max(0, p - q) normalised; when all
        # survive, draw a bonus token from p. The output is then distributed exactly as p's samples.
        verdict = verify(fed, draft, out.logits, params, lengths)
        next_tokens, next_lengths = commit(cache, state, verdict)  # cache keeps the accepted path
        num_accepted, emitted = emit(rows, verdict, active, "sampling" if draft is None else "verification")
        if shadows is not None and shadows.pending():
            for b, matched, missed, first in shadows.judge(rows.out, rows.done):
                policy.observe_shadow(b, matched, missed, first)
        drafted = [d if a else 0 for d, a in zip(fed.depth_host, active)]
        metrics.count_step(drafted, [n if a else 0 for n, a in zip(num_accepted, active)], emitted, sum(active))
        if proposer is not None:
            t = time.perf_counter()
            proposer.accept(draft, outcome(fed, out, verdict, next_tokens, state))
            metrics.accept_seconds += time.perf_counter() - t
        last, lengths = next_tokens, next_lengths
        if policy is not None:  # last: the step's time includes the proposer's accept()
            now = time.perf_counter()
            if one_time and hasattr(policy, "one_time"):
                policy.one_time(one_time)  # before observe: it marks the run as having drafted
            policy.observe(active, drafted, num_accepted, fed.tokens.shape[1], now - step_start - one_time)
            step_start = now
    metrics.seconds = time.perf_counter() - start
    metrics.new_tokens = sum(len(o) for o in rows.out)
    if policy is not None and hasattr(policy, "finish"):
        policy.finish()  # e.g. the cost policy's memory of this (model, machine) is saved
    return GenerationResult(rows.out, metrics)


# -- prefill ----------------------------------------------------------------------------------------

def prefill(target: "CausalLM", prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int,
            proposer: Proposer | None, hidden_layers: tuple[int, ...]) -> PrefillContext:
    """The prompts into a new target cache, the first token sampled; returns what the proposer's
    ``prefill`` receives (the first roots are ``first_tokens``, at positions ``prompt_lens``)."""
    device, batch = target.device, len(prompts)
    prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    if batch == 0 or int(prompt_lens.min()) == 0:
        raise ValueError("prompts must be a non-empty list of non-empty token id sequences")
    width = int(prompt_lens.max())
    padded = torch.zeros(batch, width, dtype=torch.int64)
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = torch.as_tensor(p, dtype=torch.int64)
    if int(padded.min()) < 0 or int(padded.max()) >= target.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {target.vocab_size}) (the target's vocabulary)")
    padded, prompt_lens = padded.to(device), prompt_lens.to(device)
    # Capacity: prompt, every token to generate, and the most a step sends beyond its root.
    pending = proposer.max_pending_tokens() if proposer is not None else 0
    max_length = width + max_new_tokens + pending + 2
    cache = target.new_cache(batch, max_length)
    # Logits of each prompt's last token only: the LM head over the whole prompt would cost
    # about a seventh of the zoo target's prefill.
    out = target.forward(padded, torch.arange(width, device=device).expand(batch, width), cache,
                         hidden_layers=hidden_layers, logits_at=prompt_lens - 1, **prefill_kwargs(target))
    cache.commit(prompt_lens)
    first = ops.sample(out.logits[:, 0], **params.kwargs(), position=prompt_lens)
    raise_for(first.status.tolist(), "sampling the first token", exc=RuntimeError)
    return PrefillContext(target, cache, padded, prompt_lens, first.tokens, params, max_length, out.hidden_states)


# -- propose ----------------------------------------------------------------------------------------

def plan(rows: RowOutputs, proposer: Proposer | None, policy: "SpeculationPolicy | None",
         adaptable: list[bool]) -> tuple[list[bool], list[int]]:
    """Who runs this step, and how many draft tokens each row may use (the policy's choice, capped
    by the proposer's ``max_draft`` and the row's budget; ``adaptable[b]``: row b emits the same
    tokens whatever it drafts)."""
    active = [not d for d in rows.done]
    remaining = rows.budget()
    if proposer is None:
        return active, [0] * len(active)
    # The bonus token is always emitted: a row may draft one token fewer than it has left.
    limits = [min(max(0, r - 1), proposer.max_draft) for r in remaining]
    if policy is not None:
        limits = policy.plan(active, limits, adaptable, remaining)
    return active, limits


def drafting_over(policy: "SpeculationPolicy | None", active: list[bool], adaptable: list[bool]) -> bool:
    """Whether the policy will grant no more drafts in this run (``drafting_over``), every active
    row being one it decides for (a row it leaves alone keeps its full draft length). The loop asks
    only in runs that judge no shadow drafts (a proposer without them, or a sampled run): a free
    proposer's (prompt lookup's) are what lets plain steps move the acceptance, so in a greedy run
    it stays (dropping it lost 9% of a real-pair HumanEval run where its drafts paid later)."""
    over = getattr(policy, "drafting_over", None)
    return (over is not None and all(ad for a, ad in zip(active, adaptable) if a) and over())


def offers_shadows(proposer: Proposer | None) -> bool:
    """Whether the proposer overrides ``Proposer.shadow_draft`` (drafts that cost no forward)."""
    return proposer is not None and type(proposer).shadow_draft is not Proposer.shadow_draft


def start_shadows(shadows: ShadowDrafts, proposer: Proposer, active: list[bool], limits: list[int],
                  rows: RowOutputs, policy: "SpeculationPolicy") -> ShadowDrafts | None:
    """New shadow chains for the rows decoding plainly without one (``specdec_cuda.shadow``),
    while the policy wants them; None, for the rest of the run, when the proposer returns none.
    (A run that judges shadow drafts never drops its proposer: ``drafting_over``.)"""
    wants = getattr(policy, "wants_shadows", None)
    if wants is not None and not wants():
        return shadows  # none started for now; the pending ones are still judged
    depth = shadows.wanted(active, limits, rows.budget(), proposer.max_draft)
    if any(depth):
        chains = proposer.shadow_draft(depth)
        if chains is None:
            return None
        shadows.start(chains, [len(o) for o in rows.out])
    return shadows


def propose(proposer: Proposer | None, state: StepState,
            limits: list[int]) -> tuple[Draft | None, ExtraRows | None]:
    """The proposer's draft and extra rows for this step (``limits``: host copy of ``state.max_draft``)."""
    if proposer is None:
        return None, None
    # No row may draft (the policy chose plain decoding): no proposal to ask for.
    draft = proposer.propose(state) if max(limits) > 0 else None
    return draft, proposer.extra_rows(state, draft)


# -- the target's input -----------------------------------------------------------------------------

@dataclass
class StepInput:
    """One step's target input. Shape: tokens / positions [B, T] (T = width + extra rows, width =
    1 + n: the root and the draft nodes); mask [B, T, T] bool or None (causal). Trees also keep
    their flat layout for ``verify_tree``: parents / cu_num_nodes / node_tokens (flat, ragged),
    first_child [B, 1 + n]."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    num_nodes: torch.Tensor  # [B] draft nodes per row after masking finished rows
    num_nodes_host: list[int]
    depth_host: list[int]  # deepest draft node per row
    width: int
    parents: torch.Tensor | None = None
    cu_num_nodes: torch.Tensor | None = None
    node_tokens: torch.Tensor | None = None
    first_child: torch.Tensor | None = None

    @property
    def num_extra(self) -> int:
        return self.tokens.shape[1] - self.width


def _draft_nodes(state: StepState, draft: Draft) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """Draft nodes per row (none on rows that do not run), their host copy, and ``[root, nodes]`` [B, 1 + n]."""
    num_nodes = torch.where(state.active, draft.num_nodes, 0)
    num_nodes_host = num_nodes.tolist()
    n = draft.width
    if any(c < 0 or c > n for c in num_nodes_host):
        raise ValueError(f"the proposer returned num_nodes {num_nodes_host} for drafts of width {n}")
    return num_nodes, num_nodes_host, torch.cat([state.last_tokens[:, None], draft.tokens], dim=1)


def chain_input(state: StepState, draft: Draft | None, limits: list[int]) -> StepInput:
    """Root and chain, causal: draft node ``j`` at position ``lengths + 1 + j``. No draft: the root alone."""
    if draft is None:
        empty = torch.zeros(len(limits), dtype=torch.int64, device=state.lengths.device)
        draft = Draft(state.last_tokens[:, None][:, :0], empty, DraftKind.GUESS)
    num_nodes, num_nodes_host, tokens = _draft_nodes(state, draft)
    over = [b for b, (c, m) in enumerate(zip(num_nodes_host, limits)) if c > m]
    if over:
        raise ValueError(f"the proposer drafted {num_nodes_host[over[0]]} tokens for row {over[0]}, "
                         f"more than the {limits[over[0]]} it was granted (StepState.max_draft)")
    # Fed only as wide as the longest row's chain: a proposer that found less than its width (prompt
    # lookup without a match: none) does not pay for a forward over padding.
    width = 1 + max(num_nodes_host, default=0)
    if width < tokens.shape[1]:
        tokens = tokens[:, :width]
    positions = state.lengths[:, None] + torch.arange(width, device=tokens.device)
    return StepInput(tokens, positions, None, num_nodes, num_nodes_host, num_nodes_host, width)


def tree_input(state: StepState, draft: Draft) -> StepInput:
    """Root and tree: positions by depth, each node seeing its ancestors (``ops.build_tree``)."""
    num_nodes, num_nodes_host, tokens = _draft_nodes(state, draft)
    # Flat ragged layout of the tree kernels: per row the root (parent -1), then its nodes.
    B, M = tokens.shape
    full = torch.cat([draft.parents.new_full((B, 1), -1), draft.parents], dim=1)  # [B, M]
    if all(c == M - 1 for c in num_nodes_host):
        flat_parents, flat_tokens = full.reshape(-1), tokens.reshape(-1)
    else:
        real = torch.arange(M, device=tokens.device)[None, :] <= num_nodes[:, None]
        flat_parents, flat_tokens = full[real], tokens[real]
    cu = torch.nn.functional.pad((num_nodes + 1).cumsum(0), (1, 0))
    layout = ops.build_tree(flat_parents, cu, state.lengths, max_nodes=M)  # raises on a malformed tree
    return StepInput(tokens, layout.positions, layout.tree_mask, num_nodes, num_nodes_host,
                     layout.depth.amax(dim=1).tolist(), M, parents=flat_parents, cu_num_nodes=cu,
                     node_tokens=flat_tokens, first_child=layout.first_child)


def with_extra_rows(fed: StepInput, extra: ExtraRows) -> StepInput:
    """``fed`` with the extra rows appended. They see the prefix, the root and each other as their
    mask says; draft nodes never see them, so the draft's logits do not depend on them."""
    B, M = fed.tokens.shape
    e = extra.tokens.shape[1]
    if extra.positions.shape != (B, e) or extra.mask.shape != (B, e, e):
        raise ValueError(f"extra rows: tokens {tuple(extra.tokens.shape)}, positions "
                         f"{tuple(extra.positions.shape)} and mask {tuple(extra.mask.shape)} disagree")
    draft_mask = fed.mask if fed.mask is not None else torch.ones(M, M, dtype=torch.bool,
                                                                  device=fed.tokens.device).tril().expand(B, M, M)
    top = torch.cat([draft_mask, draft_mask.new_zeros(B, M, e)], dim=2)
    sees_root = draft_mask.new_zeros(B, e, M)
    sees_root[:, :, 0] = True
    bottom = torch.cat([sees_root, extra.mask.to(torch.bool)], dim=2)
    return replace(fed, tokens=torch.cat([fed.tokens, extra.tokens], dim=1),
                   positions=torch.cat([fed.positions, extra.positions], dim=1), mask=torch.cat([top, bottom], dim=1))


# -- verify -----------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """What verification decided, per row. Shape: tokens [B, m], the accepted drafts then the
    correction / bonus token (-1 padded); num_accepted [B]; status [B] (``ops.status`` codes);
    accepted_nodes [B, m], the accepted path's node indices, root (0) first (-1 padded);
    kept_indices: what the cache compacts to, None for chains (their accepted path is a prefix)."""

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    status: torch.Tensor
    accepted_nodes: torch.Tensor
    kept_indices: torch.Tensor | None


def _draft_logits(draft: Draft, dtype: torch.dtype) -> torch.Tensor | None:
    """The draft's q logits in the target logits' dtype, after checking they match its kind."""
    if draft.kind is DraftKind.SAMPLED and draft.logits is None:
        raise ValueError("a SAMPLED draft must carry the logits its tokens were drawn from (Draft.logits)")
    if draft.kind is DraftKind.GUESS and draft.logits is not None:
        raise ValueError("a GUESS draft carries no draft logits: guesses are verified by sample-and-match")
    if draft.logits is not None and draft.logits.dtype != dtype:
        return draft.logits.to(dtype)
    return draft.logits


def verify_chain(fed: StepInput, draft: Draft | None, logits: torch.Tensor, params: SamplingParams,
                 lengths: torch.Tensor) -> Verdict:
    """Rejection sampling (Leviathan et al. / Chen et al.), sample-and-match or typical acceptance
    over each row's chain (``ops.verify_chain``); nothing drafted: plain sampling."""
    kw, position = params.kwargs(), lengths + 1
    if max(fed.num_nodes_host) == 0:
        # Nothing drafted: plain sampling of the next token (the autoregressive draws).
        result = ops.sample(logits[:, 0], **kw, position=position)
        zero = torch.zeros(len(position), dtype=torch.int64, device=position.device)
        return Verdict(result.tokens[:, None], zero, result.status, torch.zeros_like(zero)[:, None], None)
    draft_logits = _draft_logits(draft, logits.dtype)
    k, batch = fed.width - 1, logits.shape[0]  # the chain as fed: cut to its longest row (chain_input)
    logits, tokens = logits[:, : fed.width], draft.tokens[:, :k]
    if draft_logits is not None:
        draft_logits = draft_logits[:, :k]
    if all(c == k for c in fed.num_nodes_host):
        # Every row drafted k: the ragged layout verify_chain takes is a plain reshape.
        draft_tokens, target_logits = tokens.reshape(-1), logits.reshape(batch * (k + 1), -1)
        draft_logits = None if draft_logits is None else draft_logits.reshape(batch * k, -1)
    else:
        steps = torch.arange(k + 1, device=logits.device)
        is_draft = steps[None, :k] < fed.num_nodes[:, None]  # [B, k]
        draft_tokens = tokens[is_draft]
        target_logits = logits[steps[None, :] <= fed.num_nodes[:, None]]
        draft_logits = None if draft_logits is None else draft_logits[is_draft]
    cu_num_draft = torch.nn.functional.pad(fed.num_nodes.cumsum(0), (1, 0))
    result = ops.verify_chain(draft_tokens, cu_num_draft, target_logits, draft_logits, **kw,
                              position=position, typical=draft.kind is DraftKind.TYPICAL, max_draft=k)
    # A chain's accepted path: the root and its first num_accepted drafts.
    steps = torch.arange(result.tokens.shape[1], device=logits.device)[None, :]
    path = torch.where(steps <= result.num_accepted[:, None], steps, -1)
    return Verdict(result.tokens, result.num_accepted, result.status, path, None)


def verify_tree(fed: StepInput, draft: Draft, logits: torch.Tensor, params: SamplingParams,
                lengths: torch.Tensor) -> Verdict:
    """SpecInfer multi-step speculative sampling, or greedy / sample-and-match, over each row's
    tree (``ops.verify_tree``); the accepted path is a root-to-node path of the tree."""
    draft_logits = _draft_logits(draft, logits.dtype)
    if draft.kind is DraftKind.TYPICAL:
        raise ValueError("typical acceptance is defined for chains only; send the draft as a chain")
    if draft_logits is not None:
        # verify_tree reads, at node v, the q that v's children were drawn from: the logits
        # of v's first child (siblings share them). Leaves' rows are not read.
        src = (fed.first_child - 1).clamp(min=0)  # [B, M]
        draft_logits = draft_logits.gather(1, src[:, :, None].expand(-1, -1, draft_logits.shape[-1]))
    result = ops.verify_tree(fed.node_tokens, fed.parents, fed.cu_num_nodes, logits[:, : fed.width], draft_logits,
                             **params.kwargs(), position=lengths + 1, max_nodes=fed.width)
    return Verdict(result.tokens, result.num_accepted, result.status, result.accepted_nodes, result.accepted_nodes)


# -- commit and emit --------------------------------------------------------------------------------

def commit(cache: "KVCache", state: StepState, verdict: Verdict) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the accepted path of each running row in the cache; returns the next roots and lengths [B]."""
    num_kept = torch.where(state.active, verdict.num_accepted + 1, 0)
    cache.commit(num_kept, verdict.kept_indices)
    row = torch.arange(len(num_kept), device=num_kept.device)
    next_tokens = torch.where(state.active, verdict.tokens[row, verdict.num_accepted], state.last_tokens)
    return next_tokens, state.lengths + num_kept


def emit(rows: RowOutputs, verdict: Verdict, active: list[bool], what: str) -> tuple[list[int], int]:
    """The step's tokens to the rows that ran (cut at EOS and the budget, streamed); returns
    accepted drafts per row and the tokens emitted in all. Raises on a row the kernel flagged."""
    # One host copy of everything the bookkeeping reads: tokens, counts, status per row.
    host = torch.cat([verdict.tokens, verdict.num_accepted[:, None], verdict.status[:, None].to(torch.int64)],
                     1).tolist()
    raise_for([h[-1] for h in host], what, exc=RuntimeError)
    num_accepted, emitted = [h[-2] for h in host], 0
    for b, (h, n) in enumerate(zip(host, num_accepted)):
        if active[b]:
            emitted += rows.emit(b, h[: n + 1])
    return num_accepted, emitted


def outcome(fed: StepInput, out: "ModelOutput", verdict: Verdict, next_tokens: torch.Tensor,
            state: StepState) -> Outcome:
    """What the proposer learns of the step: the accepted path, its tokens and hidden states, and
    the target's outputs at the extra rows."""
    hidden, extra_hidden = {}, {}
    if out.hidden_states:
        path = verdict.accepted_nodes.clamp(min=0)
        for layer, h in out.hidden_states.items():
            # A plain step (the root alone, no extra rows) accepted its one node: nothing to gather.
            plain = h.shape[1] == 1 and path.shape[1] == 1
            hidden[layer] = h if plain else h.gather(1, path[:, :, None].expand(-1, -1, h.shape[-1]))
            if fed.num_extra:
                extra_hidden[layer] = h[:, fed.width:]
    extra_logits = out.logits[:, fed.width:] if fed.num_extra else None
    return Outcome(verdict.num_accepted, verdict.accepted_nodes, verdict.tokens, next_tokens, state.active,
                   state.lengths, hidden, extra_logits, extra_hidden)
