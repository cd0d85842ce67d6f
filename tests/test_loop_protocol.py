"""What the loop hands proposers: target hidden states along the accepted path, extra rows' outputs,
its own draft back, and clear errors for drafts that break the protocol."""

from __future__ import annotations

import pytest
import torch

from conformance_proposers import ChainAsTree, GuessTree
from decoding_models import load_backend, make_checkpoint
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.proposers.base import Draft, DraftKind, ExtraRows, Proposer
from specdec_cuda.proposers.draft_model import DraftModelProposer

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4]]
LAYERS = (0, -1)


@pytest.fixture(scope="module", params=["builtin", "hf"])
def models(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("protocol")
    target = make_checkpoint(root / "target", seed=0)
    draft = make_checkpoint(root / "draft", perturb_from=target, noise=0.05, seed=1)
    return load_backend(target, request.param), load_backend(draft, request.param)


class Recorder(Proposer):
    """Wraps a proposer, asks for hidden states and records what the loop hands back."""

    def __init__(self, inner: Proposer, layers=LAYERS) -> None:
        self.inner, self.hidden_layers = inner, layers
        self.max_draft = inner.max_draft
        self.steps = []

    def max_pending_tokens(self) -> int:
        return self.inner.max_pending_tokens()

    def prefill(self, ctx) -> None:
        self.prefill_hidden = ctx.hidden_states
        self.prompt_lens = ctx.prompt_lens
        self.inner.prefill(ctx)

    def propose(self, state):
        return self.inner.propose(state)

    def accept(self, draft, outcome) -> None:
        self.steps.append(outcome)
        self.inner.accept(draft, outcome)


def _full_hidden(target, sequence: list[int]) -> dict[int, torch.Tensor]:
    cache = target.new_cache(1, len(sequence) + 1)
    out = target.forward(torch.tensor([sequence]), torch.arange(len(sequence))[None], cache, hidden_layers=LAYERS)
    return {layer: h[0] for layer, h in out.hidden_states.items()}


@pytest.mark.parametrize("make", [
    lambda t, d: DraftModelProposer(d, k=3),
    lambda t, d: ChainAsTree(DraftModelProposer(d, k=3)),
    lambda t, d: GuessTree(d, depth=3),
], ids=["chain", "chain-as-tree", "guess-tree"])
def test_hidden_states_along_the_accepted_path(models, make):
    target, draft = models
    rec = Recorder(make(target, draft))
    out = decode(target, PROMPTS, SamplingParams.make(len(PROMPTS)), 16, proposer=rec)
    for b, prompt in enumerate(PROMPTS):
        full = _full_hidden(target, prompt + out.tokens[b])
        for layer in LAYERS:
            torch.testing.assert_close(rec.prefill_hidden[layer][b, : len(prompt)], full[layer][: len(prompt)])
        for step in rec.steps:
            if not bool(step.active[b]):
                continue
            start, n = int(step.lengths[b]), int(step.num_accepted[b]) + 1
            assert step.accepted_nodes[b, :n].tolist()[0] == 0  # the root first
            for layer in LAYERS:
                # Entry j of the path is the token at position lengths + j of the committed text.
                torch.testing.assert_close(step.hidden_states[layer][b, :n], full[layer][start : start + n])
    assert any(int(s.num_accepted.max()) > 0 for s in rec.steps)


class ExtraRecorder(Proposer):
    """Chains from ``inner`` plus ``e`` extra rows of arbitrary tokens continuing the root causally;
    records each step's extra rows with the logits the loop handed back for them."""

    def __init__(self, inner: Proposer, e: int = 3) -> None:
        self.inner, self.e = inner, e
        self.max_draft = inner.max_draft
        self.seen = []
        self.generator = torch.Generator().manual_seed(0)

    def max_pending_tokens(self) -> int:
        return self.inner.max_pending_tokens() + self.e

    def prefill(self, ctx) -> None:
        self.inner.prefill(ctx)

    def propose(self, state):
        return self.inner.propose(state)

    def extra_rows(self, state, draft):
        B, e = state.lengths.shape[0], self.e
        tokens = torch.randint(0, 64, (B, e), generator=self.generator)
        positions = state.lengths[:, None] + 1 + torch.arange(e)
        rows = ExtraRows(tokens, positions, torch.ones(e, e, dtype=torch.bool).tril().expand(B, e, e))
        self.pending = (state.last_tokens.clone(), state.lengths.clone(), state.active.clone(), rows)
        return rows

    def accept(self, draft, outcome) -> None:
        self.seen.append((*self.pending, outcome.extra_logits))
        self.inner.accept(draft, outcome)


def test_extra_rows_ride_along_without_changing_the_output(models):
    target, draft = models
    ar = decode(target, PROMPTS, SamplingParams.make(len(PROMPTS)), 16)
    prop = ExtraRecorder(DraftModelProposer(draft, k=3))
    out = decode(target, PROMPTS, SamplingParams.make(len(PROMPTS)), 16, proposer=prop)
    assert out.tokens == ar.tokens
    # The extra rows saw the prefix, the root and the extra rows before them: their logits are the
    # target's logits on [committed text, root, extras...].
    for root, lengths, active, rows, logits in prop.seen[:4]:
        for b in range(len(PROMPTS)):
            if not bool(active[b]):
                continue
            committed = (PROMPTS[b] + out.tokens[b])[: int(lengths[b])]
            seq = committed + [int(root[b])] + rows.tokens[b].tolist()
            cache = target.new_cache(1, len(seq) + 1)
            ref = target.forward(torch.tensor([seq]), torch.arange(len(seq))[None], cache).logits[0]
            torch.testing.assert_close(logits[b], ref[len(committed) + 1 :])


class BadDraft(Proposer):
    def __init__(self, draft: Draft, max_draft: int = 2) -> None:
        self.draft, self.max_draft = draft, max_draft

    def propose(self, state):
        return self.draft


@pytest.mark.parametrize("draft,match", [
    (Draft(torch.tensor([[1, 2, 3]] * 3), torch.tensor([3, 3, 3]), DraftKind.GUESS), "more than the 2"),
    (Draft(torch.tensor([[1, 2]] * 3), torch.tensor([2, 2, 2]), DraftKind.SAMPLED), "SAMPLED draft must carry"),
    (Draft(torch.tensor([[1, 2]] * 3), torch.tensor([2, 2, 2]), DraftKind.GUESS, parents=torch.tensor([[0, 2]] * 3)),
     "malformed|parent"),
    (Draft(torch.tensor([[1, 2]] * 3), torch.tensor([2, 2, 2]), DraftKind.TYPICAL, parents=torch.tensor([[0, 0]] * 3)),
     "chains only"),
    (Draft(torch.tensor([[1, 2]] * 3), torch.tensor([5, 2, 2]), DraftKind.GUESS), "num_nodes"),
])
def test_drafts_that_break_the_protocol_raise(models, draft, match):
    target, _ = models
    with pytest.raises(ValueError, match=match):
        decode(target, PROMPTS, SamplingParams.make(len(PROMPTS)), 8, proposer=BadDraft(draft))


def test_negative_max_new_tokens_names_itself(models):
    target, _ = models
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode(target, PROMPTS, SamplingParams.make(len(PROMPTS)), -1)
