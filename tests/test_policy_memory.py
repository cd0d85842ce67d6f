"""The cost policy's memory across processes, and which rows the loop lets a policy adapt."""

from __future__ import annotations

import json

import pytest
import torch

import specdec_cuda
from decoding_models import load_backend, make_checkpoint
from specdec_cuda import policy_memory
from specdec_cuda.policy import CostAwarePolicy, sampling_label
from specdec_cuda.policy_memory import PolicyMemory, memory_key
from test_policy import _drive


def _losing(rows, k):
    return 1.0 + 1.0 * k  # every drafted token costs a whole step: drafting never pays


def test_a_saved_state_is_taken_up_by_the_next_policy(tmp_path):
    memory = PolicyMemory(tmp_path / "m.json")
    first = CostAwarePolicy(memory=memory)
    first.start(1)
    _drive(first, 30, 1, 4, _losing, lambda b: 0.3)
    first.finish()
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["format"] == policy_memory.FORMAT and saved["cost"]

    second = CostAwarePolicy(memory=memory)
    assert second.cost == first.cost and second.seen_success == pytest.approx(first.seen_success)
    second.start(1)
    # Nothing left to explore at batch 1: plain decoding from the first step on.
    assert [g[0] for g in _drive(second, 6, 1, 4, _losing, lambda b: 0.3)] == [0] * 6


def test_a_fresh_policy_explores_where_a_remembering_one_does_not(tmp_path):
    fresh = CostAwarePolicy()
    fresh.start(1)
    assert any(g[0] > 0 for g in _drive(fresh, 6, 1, 4, _losing, lambda b: 0.3))


def test_unreadable_or_foreign_files_are_ignored(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{not json")
    assert PolicyMemory(path).load() is None
    path.write_text(json.dumps({"format": 999, "cost": [[1, 0, 1.0, 3]]}))
    assert PolicyMemory(path).load() is None
    path.write_text(json.dumps({"format": policy_memory.FORMAT, "cost": [[1, 0, 1.0, 3], ["x"], [1, 2, -1.0, 2]],
                                "seen_success": "many"}))
    policy = CostAwarePolicy(memory=PolicyMemory(path))
    assert policy.cost == {(1, 0): 1.0} and policy.seen_success == 0.0


def test_acceptance_is_remembered_per_kind_of_sampling(tmp_path):
    memory = PolicyMemory(tmp_path / "m.json")
    policy = CostAwarePolicy(memory=memory)
    policy.start(1)
    _drive(policy, 30, 1, 4, lambda rows, k: 1.0, lambda b: 0.9)  # greedy runs: drafts accepted
    greedy = (policy.seen_success, policy.seen_failure)
    assert greedy[0] > 5 * greedy[1]
    sampled = sampling_label([0.8], [0], [1.0])
    policy.start(1)
    policy.set_sampling(sampled)  # (the loop's order)
    # A sampled run starts from no evidence, not from the greedy runs' acceptance ...
    assert (policy.seen_success, policy.seen_failure) == (0.0, 0.0) and policy._pooled() == policy.prior
    _drive(policy, 30, 1, 4, lambda rows, k: 1.0, lambda b: 0.1)
    hot = (policy.seen_success, policy.seen_failure)
    assert hot[1] > hot[0]
    policy.set_sampling("greedy")  # ... and neither kind's evidence moves the other's
    assert (policy.seen_success, policy.seen_failure) == greedy
    policy.finish()
    saved = json.loads((tmp_path / "m.json").read_text())["seen"]
    assert saved == {"greedy": list(greedy), sampled: list(hot)}
    again = CostAwarePolicy(memory=memory)
    assert (again.seen_success, again.seen_failure) == greedy
    again.set_sampling(sampled)
    assert (again.seen_success, again.seen_failure) == hot


def test_a_kind_of_sampling_never_seen_still_gets_its_early_draft():
    # Step costs known from greedy runs (drafting pays at a good drafter's acceptance, not at the
    # prior's 0.5), no acceptance seen yet for sampled rows: the first sampled run drafts early, a
    # few tokens, to see it (before, such runs decoded plainly for good: the real pair's
    # `lookahead+draft` at T = 0.8 after its greedy rows), and keeps drafting where that pays only.
    def cost(rows, k):
        return 1.0 + (0.5 if k else 0.0) + 0.1 * k

    sampled = sampling_label([0.8], [0], [1.0])
    for acceptance, drafts_on in ((0.9, True), (0.1, False)):
        policy = CostAwarePolicy()
        policy.start(1)
        _drive(policy, 30, 1, 4, cost, lambda b: 0.95)  # greedy: costs measured, drafts accepted
        policy.start(1)
        policy.set_sampling(sampled)
        grants = [g[0] for g in _drive(policy, 24, 1, 4, cost, lambda b: acceptance)]
        assert grants[1] > 1, grants  # the early draft (step 1), several tokens long
        assert (sum(grants[12:]) > 0) == drafts_on, grants
    # One rejected token remembered is too little to give up on: the next run drafts early again.
    unlucky = CostAwarePolicy()
    unlucky.load_state({"cost": [[1, k, cost(1, k), 3] for k in range(5)], "seen": {sampled: [0.0, 1.0]}})
    unlucky.set_sampling(sampled)
    unlucky.start(1)
    assert [g[0] for g in _drive(unlucky, 2, 1, 4, cost, lambda b: 0.9)][1] > 1


def test_a_file_of_one_pooled_count_is_read_as_greedy_evidence(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": policy_memory.FORMAT, "cost": [], "seen_success": 12.0,
                                "seen_failure": 3.0}))
    policy = CostAwarePolicy(memory=PolicyMemory(path))
    assert (policy.seen_success, policy.seen_failure) == (12.0, 3.0)
    policy.set_sampling("T=0.8 top_k=0 top_p=1.00")
    assert (policy.seen_success, policy.seen_failure) == (0.0, 0.0)


def test_sampling_labels():
    assert sampling_label([0.0, 0.0], [0, 0], [1.0, 1.0]) == "greedy"
    # The hottest row and the loosest truncation (top_k 0: none) name a mixed batch.
    assert sampling_label([0.0, 0.8, 0.71], [40, 0, 20], [0.9, 0.95, 1.0]) == "T=0.8 top_k=0 top_p=1.00"
    assert sampling_label([0.5], [40], [0.9]) == "T=0.5 top_k=40 top_p=0.90"


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_POLICY_CACHE", "off")
    assert policy_memory.cache_dir() is None
    monkeypatch.setenv("SPECDEC_POLICY_CACHE", str(tmp_path))
    assert policy_memory.cache_dir() == tmp_path
    monkeypatch.delenv("SPECDEC_POLICY_CACHE")
    assert policy_memory.cache_dir().parts[-2:] == ("specdec_cuda", "policy")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory-pair")
    target = load_backend(make_checkpoint(root / "target", seed=1, layers=2), "builtin")
    draft = load_backend(make_checkpoint(root / "draft", seed=2, layers=1), "builtin")
    return target, draft


def test_the_key_names_method_options_and_threads(pair):
    target, draft = pair
    base = memory_key(target, "draft", dict(draft=draft, k=4))
    assert base == memory_key(target, "draft", dict(draft=draft, k=4))
    assert base != memory_key(target, "draft", dict(draft=draft, k=3))
    assert base != memory_key(target, "prompt_lookup", dict(k=4))
    assert base != memory_key(draft, "draft", dict(draft=draft, k=4))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert base != memory_key(target, "draft", dict(draft=draft, k=4))
    finally:
        torch.set_num_threads(threads)


def test_a_decoder_saves_and_a_new_one_starts_from_it(pair, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_POLICY_CACHE", str(tmp_path))
    target, draft = pair
    first = specdec_cuda.SpeculativeDecoder(target, "draft", draft=draft, k=3)
    assert first.policy.cost == {}
    out = first.generate([[1, 2, 3]], max_new_tokens=24)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and first.policy.cost
    second = specdec_cuda.SpeculativeDecoder(target, "draft", draft=draft, k=3)
    assert second.policy.cost == first.policy.cost
    assert second.generate([[1, 2, 3]], max_new_tokens=24).tokens == out.tokens
    # A fixed policy keeps no memory.
    specdec_cuda.SpeculativeDecoder(target, "draft", draft=draft, k=2, policy="fixed").generate([[1, 2]], max_new_tokens=8)
    assert len(list(tmp_path.glob("*.json"))) == 1


class Recording:
    """Grants every limit and records what the loop says may be adapted."""

    def __init__(self):
        self.adaptable = self.sampling = None

    def start(self, batch):
        pass

    def set_sampling(self, label):
        self.sampling = label

    def plan(self, active, limits, adaptable, remaining=None):
        self.adaptable = list(adaptable)
        return list(limits)

    def observe(self, *args):
        pass


@pytest.mark.parametrize("method, options, matching", [
    ("prompt_lookup", dict(k=3), True),
    ("draft", dict(k=3), True),  # coupled drafts, the default
    ("draft", dict(k=3, verification="rejection"), False),  # the sample depends on the draft lengths
    ("draft", dict(k=3, verification="match"), True),
    ("draft", dict(k=3, verification="coupled"), True),
])
def test_the_loop_marks_greedy_and_matching_rows_adaptable(pair, method, options, matching):
    target, draft = pair
    if method == "draft":
        options = dict(options, draft=draft)
    policy = Recording()
    specdec_cuda.generate(target, [[1, 2, 3], [4, 5]], method=method, max_new_tokens=6,
                          temperature=[0.0, 0.8], policy=policy, **options)
    assert policy.adaptable == [True, matching]
    assert policy.sampling == "T=0.8 top_k=0 top_p=1.00"  # the loop names how the run's rows sample
