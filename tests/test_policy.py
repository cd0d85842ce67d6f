"""The speculation policies on synthetic costs and acceptance: what they grant, and why."""

from __future__ import annotations

import time

import pytest

from specdec_cuda.policy import CostAwarePolicy, FixedPolicy, make_policy


def _drive(policy, steps, rows, limit, seconds_of, accept_prob_of, greedy=None):
    """Run ``steps`` plan/observe rounds. ``seconds_of(rows, K)`` is the step's cost; each draft
    token of row b is accepted with probability ``accept_prob_of(b)`` until the first rejection
    (seeded). Returns the grants per step."""
    import random

    rng = random.Random(0)
    greedy = greedy or [True] * rows
    granted = []
    for _ in range(steps):
        active = [True] * rows
        grant = policy.plan(active, [limit] * rows, greedy)
        k = max(grant)
        granted.append(grant)
        accepted = []
        for b, g in enumerate(grant):
            n = 0
            while n < g and rng.random() < accept_prob_of(b):
                n += 1
            accepted.append(n)
        policy.observe(active, grant, accepted, 1 + k, seconds_of(rows, k))
    return granted


def test_fixed_policy_grants_the_limit_to_active_rows():
    assert FixedPolicy().plan([True, False, True], [4, 4, 2], [True] * 3) == [4, 0, 2]


def test_flat_cost_and_high_acceptance_draft_the_most():
    # Batch 1 on a CPU: a forward over 1 + K tokens costs about one token's; drafting is cheap.
    policy = CostAwarePolicy()
    granted = _drive(policy, 40, 1, 8, lambda b, k: 1.0 + 0.02 * k, lambda b: 0.9)
    late = [g[0] for g in granted[10:]]
    assert sum(k >= 7 for k in late) >= 0.8 * len(late)


def test_a_cold_first_measurement_does_not_lock_out_drafting():
    # The first step at K = 1 pays one-time costs (5x a warm step); drafting is cheap and usually
    # right afterwards, so the policy must still end up drafting.
    calls = {}

    def seconds_of(rows, k):
        calls[k] = calls.get(k, 0) + 1
        return 5.0 if (k == 1 and calls[k] == 1) else 1.0 + 0.02 * k

    granted = _drive(CostAwarePolicy(), 40, 1, 8, seconds_of, lambda b: 0.9)
    late = [g[0] for g in granted[10:]]
    assert sum(k >= 4 for k in late) >= 0.8 * len(late)


def test_steep_cost_and_low_acceptance_stop_drafting():
    # A large batch whose forward cost grows with every fed token, and a drafter that is rarely right.
    policy = CostAwarePolicy()
    granted = _drive(policy, 40, 16, 8, lambda b, k: 1.0 + 0.5 * k, lambda b: 0.1)
    late = [g[0] for g in granted[10:]]
    assert sum(k == 0 for k in late) >= 0.9 * len(late)  # a clearly losing length is not re-probed


def test_early_draft_only_where_drafting_could_win():
    # The first run at a batch size explores K = 0 and K = 1; later runs draft once on their second
    # step to measure their rows, but only where some length could win at the acceptance seen.
    def runs(cost):
        policy = CostAwarePolicy()
        for _ in range(3):
            policy.start(8)
            granted = _drive(policy, 12, 8, 8, cost, lambda b: 0.6)
        return [max(g) for g in granted]

    hopeless = runs(lambda b, k: 1.0 + 1.5 * k)  # a drafted step costs 2.5 plain ones: never pays
    assert hopeless == [0] * 12
    cheap = runs(lambda b, k: 1.0 + 0.05 * k)
    assert cheap[1] >= 1


def test_a_concave_cost_gets_its_longest_draft_measured():
    # A CPU verification: the first draft token costs most of a plain step more, each further one
    # little (a 1.5B GGUF model: 1 row 57 ms, 5 rows 134 ms, plus the draft model's steps). The line
    # through K = 0 and 1 says K = 6 barely breaks even; measured, it nearly halves the time per token.
    def seconds_of(rows, k):
        return 1.0 if k == 0 else 1.9 + 0.05 * (k - 1)

    granted = _drive(CostAwarePolicy(), 40, 1, 6, seconds_of, lambda b: 0.9)
    late = [g[0] for g in granted[10:]]
    assert sum(k >= 4 for k in late) >= 0.8 * len(late)


def test_middle_ground_picks_a_middle_length():
    policy = CostAwarePolicy(probe_every=1000)
    granted = _drive(policy, 40, 4, 8, lambda b, k: 1.0 + 0.12 * k, lambda b: 0.7)
    late = {g[0] for g in granted[10:]}
    assert late and all(0 < k < 8 for k in late)


def test_sampled_rows_keep_their_full_limit():
    policy = CostAwarePolicy()
    granted = _drive(policy, 30, 3, 6, lambda b, k: 1.0 + 0.5 * k, lambda b: 0.1,
                     greedy=[True, False, True])
    assert all(g[1] == 6 for g in granted)
    adapting = CostAwarePolicy(adapt_sampled=True)
    granted = _drive(adapting, 30, 3, 6, lambda b, k: 1.0 + 0.5 * k, lambda b: 0.1,
                     greedy=[True, False, True])
    assert any(g[1] < 6 for g in granted)


def test_limits_and_finished_rows_are_respected():
    policy = CostAwarePolicy()
    for _ in range(5):
        grant = policy.plan([True, False, True], [3, 8, 1], [True] * 3)
        assert grant[1] == 0 and grant[0] <= 3 and grant[2] <= 1
        policy.observe([True, False, True], grant, [0, 0, 0], 1 + max(grant), 1.0)


def test_acceptance_estimate_follows_the_row():
    policy = CostAwarePolicy()
    policy.plan([True, True], [4, 4], [True, True])
    for _ in range(10):
        policy.observe([True, True], [4, 4], [4, 0], 5, 1.0)
    assert policy.alpha(0) > 0.8 > 0.4 > policy.alpha(1)


@pytest.mark.parametrize("bad", [dict(decay=0.0), dict(probe_margin=1.0), dict(prior=1.0), dict(probe_every=0),
                                 dict(smoothing=0.0), dict(min_gain=-0.1)])
def test_bad_settings_raise(bad):
    with pytest.raises(ValueError):
        CostAwarePolicy(**bad)


def test_make_policy():
    assert isinstance(make_policy("cost"), CostAwarePolicy)
    assert isinstance(make_policy("fixed"), FixedPolicy)
    assert make_policy(None) is None
    with pytest.raises(ValueError, match="policy"):
        make_policy("fastest")


def _first_proposal(proposer):
    """``proposer`` prefilled with one 20-token prompt, then its first proposal: (state, draft)."""
    import torch

    from specdec_cuda.contract import PrefillContext, SamplingParams, StepState

    params = SamplingParams.make(1)
    prompt = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(0))
    ctx = PrefillContext(target=None, cache=None, prompts=prompt, prompt_lens=torch.tensor([20]),
                         first_tokens=torch.tensor([5]), params=params, max_length=64)
    proposer.prefill(ctx)
    state = StepState(torch.tensor([5]), torch.tensor([20]), torch.tensor([True]), torch.tensor([3]), params)
    return state, proposer.propose(state)


def _tiny_draft(tmp_path):
    """The decoding tests' small checkpoint, written under ``tmp_path`` and loaded."""
    from decoding_models import make_checkpoint
    from specdec_cuda import models

    return models.load(make_checkpoint(tmp_path / "d", seed=1))


def test_a_draft_models_catch_up_is_left_out_of_the_step_cost(tmp_path):
    # The drafter's cache starts empty (a run that never drafts never pays for it): its first
    # proposal feeds the whole prompt, and a proposal after plain steps feeds what they decoded.
    # Those forwards are one-time costs (Draft.one_time_seconds), which the loop subtracts from the
    # step time it reports to the policy; a steady proposal (1 or 2 tokens fed) reports none.
    import torch

    from specdec_cuda.contract import StepState
    from specdec_cuda.proposers.draft_model import DraftModelProposer

    proposer = DraftModelProposer(_tiny_draft(tmp_path), k=3)
    state, first = _first_proposal(proposer)
    assert first.one_time_seconds > 0.0
    proposer.cache.truncate(torch.tensor([21]))  # as if the step accepted no draft
    steady = proposer.propose(StepState(torch.tensor([7]), torch.tensor([21]), torch.tensor([True]),
                                        torch.tensor([3]), state.params))
    assert steady.one_time_seconds == 0.0


def test_lookahead_draft_passes_its_drafters_catch_up_on(tmp_path):
    # lookahead+draft merges the drafter's chain into its own tree: the chain's one-time catch-up
    # must travel with the merged draft, or the policy books the drafter's prefill as the cost of
    # the draft length the run first drafted at (and remembers it across runs).
    import torch

    from specdec_cuda.contract import Outcome
    from specdec_cuda.proposers.draft_model import DraftModelProposer
    from specdec_cuda.proposers.lookahead import LookaheadProposer

    proposer = LookaheadProposer(drafter=DraftModelProposer(_tiny_draft(tmp_path), k=3, verification="match"))
    state, first = _first_proposal(proposer)
    started = proposer._step_start  # set by prefill
    assert first.one_time_seconds > 0.0 and first.one_time_seconds == first.context.one_time_seconds
    # ... and it is left out of the step time the arms are chosen by (arms outlive a request, so
    # every request's first chain step would otherwise count a drafter prefill against its arm)
    # (the step accepted no draft and committed token 9; the window's logits are all zero)
    proposer.accept(first, Outcome(torch.zeros(1, dtype=torch.int64), torch.tensor([[0, -1]]),
                                   torch.tensor([[9, -1]]), torch.tensor([9]), torch.tensor([True]),
                                   torch.tensor([20]), extra_logits=torch.zeros(1, proposer.window, 64)))
    seconds = proposer.arm_steps["all"][-1][1]
    assert 0.0 <= seconds and seconds + first.one_time_seconds <= time.perf_counter() - started
    proposer.arm = "lookahead"  # an arm without the drafter's chain: nothing one-time
    assert proposer.propose(state).one_time_seconds == 0.0


def test_a_hopeless_run_settles_on_plain_decoding():
    # Drafting at batch 1 costs 2.5 plain steps per token and is rarely right: once every length is
    # measured or predicted and none comes within the probe margin, drafting is over for the run
    # (and only then); a new run starts unsettled.
    policy = CostAwarePolicy()
    policy.start(1)
    _drive(policy, 12, 1, 4, lambda b, k: 1.0 + 1.5 * k, lambda b: 0.2)
    assert policy.drafting_over()
    policy.start(1)
    assert not policy.drafting_over()
    cheap = CostAwarePolicy()
    cheap.start(1)
    _drive(cheap, 12, 1, 4, lambda b, k: 1.0 + 0.02 * k, lambda b: 0.9)
    assert not cheap.drafting_over()


@pytest.mark.parametrize("layers", [(-1,), ()], ids=["keeps-features", "text-only"])
def test_a_settled_run_decodes_on_without_the_proposer(tmp_path, layers):
    # When the policy says drafting is over, the loop stops calling the proposer (and asking the
    # target for its hidden states): one that keeps features, or one that matches text but offers
    # no shadow drafts (lookahead); the output is the autoregressive one all the same.
    import torch

    from specdec_cuda.contract import SamplingParams
    from specdec_cuda.decoding import decode
    from specdec_cuda.proposers.ngram import PromptLookupProposer

    target = _tiny_draft(tmp_path)

    class Counting(PromptLookupProposer):
        hidden_layers = layers  # (-1,): as a drafter that keeps features would (DFlash, the heads)

        def __init__(self):
            super().__init__(k=3)
            self.proposed = self.accepted = 0

        def propose(self, state):
            self.proposed += 1
            return super().propose(state)

        def shadow_draft(self, depth):
            return None  # drafts that cost a forward, as a drafter's do

        def accept(self, draft, outcome):
            self.accepted += 1
            assert (-1 in outcome.hidden_states) == bool(layers)
            super().accept(draft, outcome)

    policy = CostAwarePolicy()
    policy.start(1)
    _drive(policy, 12, 1, 3, lambda b, k: 1.0 + 1.5 * k, lambda b: 0.2)  # what earlier runs measured
    prompts = [[1, 2, 3, 4, 5, 6]]
    params = SamplingParams.make(1, 0.0, 0, 1.0, [0])
    ar = decode(target, prompts, params, 24).tokens
    proposer = Counting()
    out = decode(target, prompts, params, 24, proposer=proposer, policy=policy)
    assert out.tokens == ar
    assert policy.drafting_over() and 0 < proposer.accepted <= 3 and proposer.proposed == 0
