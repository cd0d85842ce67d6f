"""Shadow drafts: a free proposer's chains on the policy's plain steps, judged against what those
steps emit (``specdec_cuda.shadow``), and what the cost policy makes of them."""

from __future__ import annotations

from specdec_cuda.policy import CostAwarePolicy
from specdec_cuda.shadow import ShadowDrafts


def test_chains_are_judged_as_the_tokens_come():
    shadows = ShadowDrafts(3)
    # Row 0 runs plainly (granted 0), row 1 drafts, row 2 has finished.
    assert shadows.wanted([True, True, False], [0, 3, 0], [10, 10, 0], 4) == [4, 0, 0]
    out = [[7, 8], [1], []]
    shadows.start([[5, 6, 9, 9], [], []], [len(o) for o in out])
    assert shadows.pending()
    assert shadows.wanted([True, True, False], [0, 0, 0], [9, 9, 0], 4) == [0, 4, 0]  # row 0's chain waits
    out[0].append(5)
    assert shadows.judge(out, [False] * 3) == [(0, 1, False, True)]  # one guess repeated: news at once
    out[0].append(6)
    assert shadows.judge(out, [False] * 3) == [(0, 1, False, False)]
    out[0] += [4, 2]  # a step that emitted two tokens: the third guess missed
    assert shadows.judge(out, [False] * 3) == [(0, 0, True, False)]
    assert not shadows.pending()


def test_a_whole_chain_repeated_ends_without_a_miss_and_a_finished_row_drops_its_chain():
    shadows = ShadowDrafts(2)
    out = [[3], [3]]
    shadows.start([[1, 2], [1, 2]], [1, 1])
    out[0] += [1, 2, 0]
    out[1] += [1]
    assert shadows.judge(out, [False, True]) == [(0, 2, False, True), (1, 1, False, True)]
    assert not shadows.pending()  # row 0 fully judged, row 1 finished before its second guess
    # The budget caps a chain (the bonus token is always emitted); a drafting row drops its chain.
    assert shadows.wanted([True, True], [0, 0], [3, 1], 4) == [2, 0]
    shadows.start([[4, 4], []], [4, 2])
    shadows.wanted([True, True], [2, 0], [3, 1], 4)
    assert not shadows.pending()


def test_the_policy_counts_shadows_as_drafts_and_stops_holding_plain_decoding():
    policy = CostAwarePolicy()
    policy.start(1)
    policy.hold = 5
    low = policy.alpha(0)
    policy.observe_shadow(0, 0, True, True)  # a miss: acceptance falls, plain decoding still held
    assert policy.alpha(0) < low and policy.hold == 5
    policy.observe_shadow(0, 1, False, True)  # one guess repeated: counted, the hold kept
    assert policy.hold == 5
    policy.observe_shadow(0, 1, False, False)  # two in a row: the row may be copying, decide again
    assert policy.success[0] == 2.0 and policy.failure[0] == 0.7  # one decay per chain, not per news
    assert policy.alpha(0) > low and policy.hold == 0
    assert policy.shadowed
    policy.observe_shadow(5, 1, False, True)  # a row outside the run: ignored
    policy.start(1)
    assert not policy.shadowed


def test_a_shadowed_run_does_not_settle():
    # The hopeless costs that settle a run (test_policy), but the row's acceptance moves with plain
    # steps: drafting is not over.
    from test_policy import _drive

    policy = CostAwarePolicy()
    policy.start(1)
    policy.observe_shadow(0, 0, True, True)
    _drive(policy, 12, 1, 4, lambda b, k: 1.0 + 1.5 * k, lambda b: 0.2)
    assert not policy.drafting_over()


def test_the_early_draft_takes_the_best_length():
    # A step that is mostly fixed work: one drafted token costs nearly what four do; the run's early draft
    # (second step) then drafts the most, since it shows the row's acceptance at no extra cost.
    policy = CostAwarePolicy()
    for (k, seconds) in [(0, 1.0), (1, 2.8), (2, 2.8), (3, 2.85), (4, 2.85)]:
        policy.cost[(1, k)], policy.samples[(1, k)] = seconds, 5
    policy.seen_success, policy.seen_failure = 30.0, 3.0
    policy.start(1)
    policy.observe([True], [0], [0], 1, 1.0)  # the first step
    assert policy.plan([True], [4], [True]) == [4]


class _Recording(CostAwarePolicy):
    """Always decodes plainly; records the shadow news it is told."""

    def __init__(self):
        super().__init__()
        self.news = []

    def plan(self, active, limits, adaptable, remaining=None):
        return [0] * len(active)

    def observe_shadow(self, row, matched, missed, first):
        self.news.append((row, matched, missed, first))
        super().observe_shadow(row, matched, missed, first)


def _expected_news(prompt, out, k, n_min, n_max, budget):
    """What judging prompt lookup's chains against ``out`` must report, worked out directly: at each
    plain step that starts a chain, look the committed text up, compare the chain with the tokens
    emitted next."""
    from specdec_cuda.ngram import NgramIndex, lookup

    news, i = [], 1  # out[0] came from prefill: the first chain guesses out[1]
    while i < len(out):
        index = NgramIndex(n_min, n_max)
        index.extend(list(prompt) + out[:i])
        found = lookup([index], k, max_depth=min(k, budget - i - 1))
        chain = found.tokens[0, : int(found.num_nodes[0])].tolist()
        if not chain:
            i += 1
            continue
        n = 0
        while n < len(chain) and i + n < len(out) and out[i + n] == chain[n]:
            n += 1
        missed = n < len(chain) and i + n < len(out)
        # Reported step by step: a matched guess per step, a miss on the step that emitted it.
        for j in range(n):
            news.append((0, 1, False, j == 0))
        if missed:
            news.append((0, 0, True, n == 0))
        i += n + 1 if missed else max(n, 1)
    return news


def test_the_loop_judges_prompt_lookup_chains_exactly(tmp_path):
    from test_policy import _tiny_draft

    from specdec_cuda.contract import SamplingParams
    from specdec_cuda.decoding import decode
    from specdec_cuda.proposers.ngram import PromptLookupProposer

    target = _tiny_draft(tmp_path)
    prompt = [3, 9, 4, 3, 9, 4, 3, 9, 4, 12, 3, 9]
    params = SamplingParams.make(1, 0.0, 0, 1.0, [0])
    ar = decode(target, [prompt], params, 32).tokens
    policy = _Recording()
    out = decode(target, [prompt], params, 32, proposer=PromptLookupProposer(k=3), policy=policy)
    assert out.tokens == ar
    assert policy.news and any(m for _, m, _, _ in policy.news)  # the test text has matches
    assert policy.news == _expected_news(prompt, ar[0], 3, 1, 4, 32)


def test_sampled_runs_judge_no_shadows(tmp_path):
    from test_policy import _tiny_draft

    from specdec_cuda.contract import SamplingParams
    from specdec_cuda.decoding import decode
    from specdec_cuda.proposers.ngram import PromptLookupProposer

    class Counting(PromptLookupProposer):
        def shadow_draft(self, depth):
            self.asked = getattr(self, "asked", 0) + 1
            return super().shadow_draft(depth)

    target = _tiny_draft(tmp_path)
    prompt = [3, 9, 4, 3, 9, 4, 3, 9, 4, 12, 3, 9]
    for temperature, judged in ((0.0, True), (0.8, False), ([0.0, 0.8], False)):  # a mixed batch: none
        batch = 2 if isinstance(temperature, list) else 1
        policy, proposer = _Recording(), Counting(k=3)
        params = SamplingParams.make(batch, temperature, 0, 1.0, list(range(batch)))
        decode(target, [prompt] * batch, params, 24, proposer=proposer, policy=policy)
        assert (getattr(proposer, "asked", 0) > 0) == judged and bool(policy.news) == judged


def test_a_proposer_with_a_cost_offers_no_shadows(tmp_path):
    from test_policy import _tiny_draft

    from specdec_cuda.contract import SamplingParams
    from specdec_cuda.decoding import decode
    from specdec_cuda.proposers.ngram import PromptLookupProposer

    class Costly(PromptLookupProposer):
        def shadow_draft(self, depth):
            self.asked = getattr(self, "asked", 0) + 1
            return None  # the contract's default

    target = _tiny_draft(tmp_path)
    policy, proposer = _Recording(), Costly(k=3)
    params = SamplingParams.make(1, 0.0, 0, 1.0, [0])
    decode(target, [[3, 9, 4, 3, 9, 4, 3, 9]], params, 16, proposer=proposer, policy=policy)
    assert proposer.asked == 1 and policy.news == []  # asked once, then not for the rest of the run


def test_shadows_are_wanted_only_where_drafting_could_win():
    from test_policy import _drive

    hopeless = CostAwarePolicy()
    hopeless.start(4)
    assert hopeless.wants_shadows()  # nothing known yet
    _drive(hopeless, 16, 4, 4, lambda b, k: 1.0 + 1.5 * k, lambda b: 0.3)
    assert not hopeless.wants_shadows()
    # This row accepts little, so plain decoding is chosen; rows before it accepted well, and at
    # their acceptance drafting would win: shadows stay wanted, to see this row start copying.
    promising = CostAwarePolicy()
    promising.seen_success, promising.seen_failure = 200.0, 20.0
    promising.start(1)
    granted = _drive(promising, 16, 1, 4, lambda b, k: 1.0 + 0.3 * k, lambda b: 0.05)
    assert granted[-1] == [0] and promising.wants_shadows()
