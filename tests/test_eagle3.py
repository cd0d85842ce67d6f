"""The EAGLE-3 drafter and ``method="eagle3"``: the layer's math, its cache (a cached forward equals
one over the whole sequence; tree attention equals separate chains), the training-time test
against chained inference, the draft vocabulary, save / load, ``attach``'s checks, the dynamic tree
against a from-scratch EAGLE-2 expansion, greedy and sampled output equal to autoregressive
decoding on the built-in model and on transformers, and acceptance of a briefly trained drafter.

(The distribution of sampled output is the conformance suite's job: tests/test_conformance.py.)
"""

from __future__ import annotations

import copy
import sys
import types
import warnings

import pytest
import torch

import specdec_cuda
from _eagle3_testlib import fit, reference_layer, reference_logits, target_features, target_text, trained_drafter
from conformance_proposers import VaryingPolicy
from decoding_models import load_backend, make_checkpoint
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.models.draft_vocab import MASKED
from specdec_cuda.models.eagle3 import Eagle3Config, Eagle3Drafter, default_target_layers, draft_vocab_from_counts
from specdec_cuda.proposers.base import DraftKind
from specdec_cuda.proposers.eagle3 import Eagle3Proposer, load_drafter, make_eagle3_proposer

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [11, 12], [30, 31, 32, 33]]
LAYERS = 8  # default target layers (1, 3, 4): three distinct ones

warnings.filterwarnings("ignore", category=specdec_cuda.api.InexactVerificationWarning)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("eagle3") / "target", layers=LAYERS, seed=0)


@pytest.fixture(scope="module")
def target(folder):
    return load_backend(folder, "builtin")


@pytest.fixture(scope="module")
def hf_target(folder):
    return load_backend(folder, "hf")


def _random(target, seed=0, std=0.2, vocab=None, **overrides):
    """A random drafter (std 0.2: outputs that depend visibly on every input), optionally over the
    ``vocab`` target ids only."""
    config = Eagle3Config.for_target(target, draft_vocab_size=None if vocab is None else len(vocab), **overrides)
    maps = {}
    if vocab is not None:
        counts = torch.zeros(target.vocab_size)
        counts[torch.tensor(vocab)] = 1.0
        maps = dict(zip(("d2t", "t2d"), draft_vocab_from_counts(counts, len(vocab))))
    return Eagle3Drafter.random(config, seed=seed, std=std, **maps).attach(target)


def _trained(model):
    """The drafter fitted to ``model``'s text (its greedy runs of 32 tokens: this deep random target
    is predictable mostly there)."""
    return trained_drafter(model, new_tokens=32)


def _cfg(d: Eagle3Drafter) -> dict:
    c = d.config
    return dict(heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, head_dim=c.head_dim, eps=c.rms_norm_eps,
                theta=c.rope_theta, vocab=c.vocab_size)


def _inputs(d, B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, d.config.hidden_size, generator=g, dtype=d.dtype)
    tokens = torch.randint(0, d.config.vocab_size, (B, T), generator=g)
    return hidden, tokens


# -- the model ---------------------------------------------------------------------------------------

def test_default_target_layers_are_eagle3s_low_middle_high():
    assert default_target_layers(32) == (1, 15, 28)
    assert default_target_layers(36) == (1, 17, 32)
    assert default_target_layers(8) == (1, 3, 4)
    assert default_target_layers(2) == (0, 0, 1)  # clamped and sorted for shallow targets
    assert default_target_layers(1) == (0, 0, 0)


def test_draft_vocab_from_counts_keeps_the_most_frequent_ids():
    d2t, t2d = draft_vocab_from_counts(torch.tensor([5, 0, 9, 5, 1, 9]), 3)
    # 9, 9, then the tie at 5 goes to the lower id: target ids [0, 2, 5].
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 5]
    assert t2d.tolist() == [True, False, True, False, False, True]
    with pytest.raises(ValueError, match="1 .. 6"):
        draft_vocab_from_counts(torch.ones(6), 7)


def test_bad_vocabulary_maps_are_refused(target):
    d = _random(target, vocab=list(range(0, 64, 2)))
    d2t, t2d = d.d2t.clone(), d.t2d.clone()
    with pytest.raises(ValueError, match="same target id"):
        d.set_draft_vocab(torch.zeros_like(d2t) + torch.tensor([1] + [0] * 31), t2d)  # ids 1, 1, 2, ...
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        d.set_draft_vocab(d2t + 64, t2d)
    wrong = t2d.clone()
    wrong[1] = True
    with pytest.raises(ValueError, match="t2d does not mark"):
        d.set_draft_vocab(d2t, wrong)


def test_step_and_logits_match_the_layout_math(target):
    d = _random(target, vocab=list(range(3, 64, 3)))
    hidden, tokens = _inputs(d, 2, 7)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 7, 8, 9]])
    out = d.step(hidden, tokens, positions, d.new_cache(2, 16))
    state = d.state_dict()
    emb = target.embed_tokens.weight
    for b in range(2):
        want = reference_layer(state, _cfg(d), emb[tokens[b]], hidden[b], positions[b])
        torch.testing.assert_close(out[b], want, rtol=1e-10, atol=1e-10)
        logits = d.target_logits(out[b])
        ref = reference_logits(state, _cfg(d), want)
        inside = d.t2d
        torch.testing.assert_close(logits[:, inside], ref[:, inside], rtol=1e-10, atol=1e-10)
        assert bool((logits[:, ~inside] == MASKED).all())


def test_cached_ragged_steps_equal_one_forward(target):
    d = _random(target)
    B, T = 3, 9
    hidden, tokens = _inputs(d, B, T, seed=1)
    positions = torch.arange(T).expand(B, T)
    whole = d.step(hidden, tokens, positions, d.new_cache(B, 16))
    cache = d.new_cache(B, 16)
    schedule = torch.tensor([[3, 4, 2], [1, 5, 3], [4, 0, 5]])  # positions per row and call: ragged
    for c in range(schedule.shape[1]):
        num_new = schedule[:, c]
        width = int(num_new.max())
        pos = (cache.lengths[:, None] + torch.arange(width)).clamp(max=T - 1)
        out = d.step(hidden.gather(1, pos[:, :, None].expand(-1, -1, hidden.shape[-1])), tokens.gather(1, pos), pos,
                     cache, num_new=num_new)
        for b in range(B):
            n, start = int(num_new[b]), int(cache.lengths[b])
            torch.testing.assert_close(out[b, :n], whole[b, start:start + n], rtol=1e-12, atol=1e-12)
        cache.commit(num_new)
    assert cache.lengths.tolist() == [9, 9, 9]


def test_tree_attention_equals_separate_chains(target):
    d = _random(target)
    B, K = 2, 2
    hidden, tokens = _inputs(d, B, 8, seed=2)
    cache = d.new_cache(B, 20)
    lengths = torch.tensor([5, 3])
    d.step(hidden[:, :5], tokens[:, :5], torch.arange(5).expand(B, 5), cache, num_new=lengths)
    cache.commit(lengths)
    base = copy.deepcopy(cache)
    # Level A: K nodes hanging off the committed prefix; level B: K nodes, each under one of level A's.
    pos = lengths[:, None].expand(B, K)
    eye = torch.eye(K, dtype=torch.bool).expand(B, K, K)
    out_a = d.step(hidden[:, 5:7], tokens[:, 5:7], pos, cache, offset=0, scratch_mask=eye)
    parent = torch.tensor([[1, 1], [0, 1]])
    seen = torch.cat([eye.gather(1, parent[:, :, None].expand(-1, -1, K)), eye], dim=2)
    h_b = out_a.gather(1, parent[:, :, None].expand(-1, -1, out_a.shape[-1]))
    out_b = d.step(h_b, tokens[:, 6:8], pos + 1, cache, offset=K, scratch_mask=seen)
    for i in range(K):
        chain = copy.deepcopy(base)
        p = parent[:, i]
        first = d.step(hidden[torch.arange(B), 5 + p][:, None], tokens[torch.arange(B), 5 + p][:, None],
                       lengths[:, None], chain, offset=0)
        torch.testing.assert_close(first[:, 0], out_a[torch.arange(B), p], rtol=1e-12, atol=1e-12)
        second = d.step(first, tokens[:, 6 + i, None], lengths[:, None] + 1, chain, offset=1)
        torch.testing.assert_close(second[:, 0], out_b[:, i], rtol=1e-12, atol=1e-12)


def test_step_checks_its_inputs(target):
    d = _random(target)
    hidden, tokens = _inputs(d, 2, 4)
    cache = d.new_cache(2, 5)
    with pytest.raises(ValueError, match="scratch_mask must have shape"):
        d.step(hidden, tokens, torch.arange(4).expand(2, 4), cache, scratch_mask=torch.ones(2, 4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="overflow"):
        d.step(hidden, tokens, torch.arange(4).expand(2, 4), cache, offset=2)
    # With padding columns (num_new) the slots are checked when committed: 4 + 4 > 5.
    d.step(hidden, tokens, torch.arange(4).expand(2, 4), cache, num_new=torch.tensor([4, 2]))
    cache.commit(torch.tensor([4, 2]))
    d.step(hidden, tokens, torch.arange(4).expand(2, 4), cache, num_new=torch.tensor([4, 1]))
    with pytest.raises(ValueError, match="capacity 5"):
        cache.commit(torch.tensor([4, 1]))


# -- training ---------------------------------------------------------------------------------------

def test_train_forward_equals_the_chained_inference(target):
    d = _random(target, vocab=list(range(1, 64, 2)))
    B, T, steps = 2, 10, 3
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(B, T, d.fc.in_features, generator=g, dtype=d.dtype)
    tokens = torch.randint(0, 64, (B, T), generator=g)
    logits = d.train_forward(feats, tokens, steps)
    assert [tuple(x.shape) for x in logits] == [(B, T - 2 - i, d.config.draft_vocab_size) for i in range(steps)]
    for t in range(T - 2):
        # Inference from root position t + 1: the cache holds positions 0 .. t (true features).
        cache = d.new_cache(B, T + steps)
        h0 = d.step(d.fc(feats[:, : t + 1]), tokens[:, 1: t + 2], torch.arange(t + 1).expand(B, t + 1), cache)
        cache.commit(torch.full((B,), t + 1))
        h = h0[:, t]
        torch.testing.assert_close(logits[0][:, t], d.logits(h), rtol=1e-10, atol=1e-10)
        for i in range(1, steps):
            if t > T - 3 - i:
                break
            h = d.step(h[:, None], tokens[:, t + 1 + i, None], torch.full((B, 1), t + i), cache, offset=i - 1)[:, 0]
            torch.testing.assert_close(logits[i][:, t], d.logits(h), rtol=1e-10, atol=1e-10)


def test_train_forward_gradients_reach_every_step(target):
    d = _random(target)
    B, T = 2, 8
    feats = torch.randn(B, T, d.fc.in_features, dtype=d.dtype, requires_grad=True)
    tokens = torch.randint(0, 64, (B, T))
    last = d.train_forward(feats, tokens, 3)[2]
    last[:, 0].sum().backward()
    for name in ("fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
                 "midlayer.mlp.down_proj.weight", "lm_head.weight"):
        grad = dict(d.named_parameters())[name].grad
        assert grad is not None and bool(grad.abs().sum() > 0), name
    # Step 2 at t = 0 reads fc(feats) at t = 0 only (steps 1 and 2 feed their own outputs).
    assert bool(feats.grad[:, 0].abs().sum() > 0) and bool((feats.grad[:, 1:] == 0).all())
    with pytest.raises(ValueError, match="at least 5 tokens"):
        d.train_forward(feats.detach()[:, :4], tokens[:, :4], 3)
    with pytest.raises(ValueError, match="feats must be"):
        d.train_forward(feats.detach()[..., :-1], tokens, 1)


def test_a_short_fit_lowers_the_loss(target):
    d = _random(target, std=0.05)
    tokens = target_text(target)
    feats = target_features(target, d.config.target_layers, tokens)
    losses = fit(d, feats, tokens, depth=2, steps=40)
    assert losses[-1] < 0.6 * losses[0]


# -- checkpoints --------------------------------------------------------------------------------------

@pytest.mark.parametrize("own_embedding", [False, True])
def test_save_load_roundtrip(target, tmp_path, own_embedding):
    from specdec_cuda.models.published import load_eagle3

    d = _random(target, vocab=list(range(0, 64, 3)), own_embedding=own_embedding)
    d.save(tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # written beside it, renamed into place
    for loaded in (Eagle3Drafter.load(tmp_path / "d").attach(target), load_eagle3(tmp_path / "d").attach(target)):
        assert loaded.config == d.config and torch.equal(loaded.d2t, d.d2t) and torch.equal(loaded.t2d, d.t2d)
        hidden, tokens = _inputs(d, 2, 5)
        pos = torch.arange(5).expand(2, 5)
        a = d.step(hidden, tokens, pos, d.new_cache(2, 8))
        b = loaded.step(hidden, tokens, pos, loaded.new_cache(2, 8))
        torch.testing.assert_close(loaded.target_logits(b), d.target_logits(a), rtol=1e-6, atol=1e-6)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not an EAGLE-3 drafter config"):
        Eagle3Drafter.load(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="not an EAGLE-3 drafter folder"):
        Eagle3Drafter.load(tmp_path / "nothing")
    config = tmp_path / "d" / "config.json"
    config.write_text(config.read_text().replace('"format": 1', '"format": 2'))
    with pytest.raises(ValueError, match="format 2"):
        Eagle3Drafter.load(tmp_path / "d")


def test_attach_names_what_does_not_fit(target):
    c = Eagle3Config.for_target(target)
    with pytest.raises(ValueError, match="vocabulary of 70"):
        Eagle3Drafter(Eagle3Config.for_target(target, vocab_size=70)).attach(target)
    with pytest.raises(ValueError, match="width 48"):
        Eagle3Drafter(Eagle3Config.for_target(target, target_hidden_size=48)).attach(target)
    with pytest.raises(ValueError, match=r"target layers \[9\]"):
        Eagle3Drafter(Eagle3Config.for_target(target, target_layers=(1, 3, 9))).attach(target)
    with pytest.raises(ValueError, match="embedding"):
        Eagle3Drafter(Eagle3Config.for_target(target, hidden_size=48, target_hidden_size=32)).attach(target)
    with pytest.raises(RuntimeError, match="attach"):
        Eagle3Drafter(c).embed(torch.tensor([1]))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        Eagle3Config.for_target(target, draft_vocab_size=65)
    # A drafter of its own width with its own embedding fits.
    Eagle3Drafter(Eagle3Config.for_target(target, hidden_size=48, target_hidden_size=32, num_attention_heads=6,
                                          num_key_value_heads=2, own_embedding=True)).attach(target)


# -- the proposer -------------------------------------------------------------------------------------

class _Spy(Eagle3Proposer):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.drafts = []

    def propose(self, state):
        draft = super().propose(state)
        self.drafts.append((state, draft))
        return draft


def _decode(target, proposer, prompts=PROMPTS, new=16, temperature=0.0, seed=0, policy=None):
    params = SamplingParams.make(len(prompts), temperature, 0, 1.0, seed)
    return decode(target, prompts, params, new, proposer=proposer, policy=policy)


def _reference_tree(d, cache, first, row, L, depth, K, budget, limit):
    """EAGLE-2's expansion for one row, written plainly: every node's distribution from a chain
    forward of its path on a copy of the committed cache. Returns the kept paths (token tuples)."""
    def child_logp(path_h, path_tokens):
        if not path_tokens:
            return torch.log_softmax(d.logits(path_h[-1]).float(), -1)
        chain = copy.deepcopy(cache)
        h = first
        for j, tok in enumerate(path_tokens):
            h = d.step(h[None, None].expand(cache.batch_size, 1, -1).contiguous(),
                       torch.full((cache.batch_size, 1), tok), torch.full((cache.batch_size, 1), L + j), chain,
                       offset=j)[row, 0]
        return torch.log_softmax(d.logits(h).float(), -1)

    ids = d.target_ids().tolist()
    pool = []  # (score, level, order, path)
    logp = child_logp([first], [])
    top = logp.topk(K)
    expanded = [(float(s), (ids[int(t)],)) for s, t in zip(top.values, top.indices)]
    pool += [(s, 1, i, p) for i, (s, p) in enumerate(expanded)]
    for level in range(2, depth + 1):
        cands = []
        for score, path in expanded:
            lp = child_logp(None, list(path))
            top = lp.topk(K)
            cands += [(score + float(s), path + (ids[int(t)],)) for s, t in zip(top.values, top.indices)]
        pool += [(s, level, len(pool) + i, p) for i, (s, p) in enumerate(cands)]
        expanded = sorted(cands, key=lambda c: -c[0])[:K]
    pool = [c for c in pool if c[1] <= limit]
    kept = sorted(pool, key=lambda c: (-c[0], c[1], c[2]))[:budget]
    return {c[3] for c in kept}


def _paths(draft, b):
    n = int(draft.num_nodes[b])
    tokens, parents = draft.tokens[b, :n].tolist(), draft.parents[b, :n].tolist()
    paths = []
    for j in range(n):
        assert parents[j] <= j  # BFS: a parent comes before its child
        paths.append(((paths[parents[j] - 1] if parents[j] else ()) + (tokens[j],)))
    return set(paths)


def test_the_tree_is_eagle2s_expansion(target):
    d = _random(target, vocab=list(range(0, 64, 2)) + [1, 7])
    depth, K, budget = 4, 3, 10

    class Checked(Eagle3Proposer):
        checked = 0

        def _tree(self, state, limit, k_step, first):
            draft = super()._tree(state, limit, k_step, first)
            base = copy.deepcopy(self.cache)
            for b in range(limit.shape[0]):
                if int(limit[b]) == 0:
                    assert int(draft.num_nodes[b]) == 0
                    continue
                want = _reference_tree(self.drafter, base, first[b], b, int(state.lengths[b]), k_step, K, budget,
                                       int(limit[b]))
                assert _paths(draft, b) == want
                Checked.checked += 1
            return draft

    proposer = Checked(d, tree=True, depth=depth, topk=K, budget=budget)
    _decode(target, proposer, new=10, policy=VaryingPolicy(seed=1))
    assert Checked.checked >= 10


@pytest.mark.parametrize("backend", ["builtin", "hf"])
@pytest.mark.parametrize("options", [dict(tree=False, k=4), dict(tree=True), dict(tree=True, depth=3, topk=2, budget=3)],
                         ids=["chain", "tree", "small-budget-chain"])
def test_greedy_equals_autoregressive(target, hf_target, backend, options):
    model = target if backend == "builtin" else hf_target
    drafter = _trained(model)
    ar = specdec_cuda.generate(model, PROMPTS, max_new_tokens=20).tokens
    out = specdec_cuda.generate(model, PROMPTS, method="eagle3", drafter=drafter, max_new_tokens=20, policy="fixed",
                                **options)
    assert out.tokens == ar
    assert out.metrics.acceptance_rate > 0
    # Per-row grants drawn at random, 0 included, and the cost policy: the same tokens.
    varying = _decode(model, make_eagle3_proposer(model, drafter, **options), new=20, policy=VaryingPolicy(seed=2))
    assert varying.tokens == ar
    cost = specdec_cuda.generate(model, PROMPTS, method="eagle3", drafter=drafter, max_new_tokens=20, **options)
    assert cost.tokens == ar


@pytest.mark.parametrize("options", [dict(tree=False, k=4), dict(tree=True)], ids=["chain", "tree"])
def test_matched_samples_are_the_autoregressive_ones(target, options):
    drafter = _trained(target)
    seeds = [3, 1, 4, 1, 5]
    ar = specdec_cuda.generate(target, PROMPTS, max_new_tokens=16, temperature=0.8, top_p=0.9, seed=seeds).tokens
    params = SamplingParams.make(len(PROMPTS), 0.8, 0, 0.9, seeds)
    out = decode(target, PROMPTS, params, 16, proposer=make_eagle3_proposer(target, drafter, **options),
                 policy=VaryingPolicy(seed=3))
    assert out.tokens == ar and out.metrics.acceptance_rate > 0


@pytest.mark.parametrize("temperature,options,kind", [
    (0.0, dict(tree=False, verification="rejection"), DraftKind.GUESS),
    (0.8, dict(tree=False), DraftKind.GUESS),
    (0.8, dict(tree=False, verification="rejection"), DraftKind.SAMPLED),
    (0.8, dict(tree=True, verification="rejection"), DraftKind.GUESS),  # trees are always matched
])
def test_draft_kinds(target, temperature, options, kind):
    d = _random(target, vocab=list(range(0, 64, 2)))
    spy = _Spy(d, k=3, **options)
    _decode(target, spy, prompts=PROMPTS[:3], new=8, temperature=temperature)
    assert spy.drafts
    assert spy.matches_samples() == (options["tree"] or options.get("verification", "coupled") == "coupled")
    for state, draft in spy.drafts:
        assert draft.kind is kind and (draft.logits is None) == (kind is DraftKind.GUESS)
        assert (draft.parents is not None) == options["tree"]
        limit = torch.where(state.active, state.max_draft, 0)
        if options["tree"]:
            assert int(draft.num_nodes.max()) <= 24
        else:
            assert torch.equal(draft.num_nodes, limit.clamp(max=3))
        if kind is DraftKind.SAMPLED:
            # q over the target vocabulary: MASKED outside the draft vocabulary, every draft inside it.
            assert draft.logits.shape == (*draft.tokens.shape, 64)
            assert bool((draft.logits[..., 1::2] == MASKED).all())
            assert bool((draft.tokens % 2 == 0).all())


def test_a_trained_drafter_is_accepted_far_more_than_a_random_one(target):
    trained = _trained(target)
    random = _random(target, std=0.05)
    taus = {}
    for name, d in (("trained", trained), ("random", random)):
        out = specdec_cuda.generate(target, PROMPTS, method="eagle3", drafter=d, max_new_tokens=24, policy="fixed")
        taus[name] = out.metrics.tau
    assert taus["trained"] > 1.3 and taus["trained"] > taus["random"] + 0.25, taus


def test_the_options_are_checked(target):
    d = _random(target, vocab=[1, 2, 3])
    with pytest.raises(ValueError, match="verification"):
        Eagle3Proposer(d, verification="typical")
    with pytest.raises(ValueError, match="topk"):
        Eagle3Proposer(d, topk=4)  # 3 draft ids
    with pytest.raises(ValueError, match="k must be"):
        Eagle3Proposer(d, tree=False, k=0)
    with pytest.raises(TypeError, match="drafter"):
        load_drafter(target, 3)
    with pytest.raises(TypeError, match="no option"):
        specdec_cuda.generate(target, PROMPTS, method="eagle3", drafter=d, heads=None)
    p = Eagle3Proposer(d, tree=True, depth=4, budget=3, topk=3)
    assert not p.tree and p.max_draft == 3 and p.max_pending_tokens() == 3  # a budget that fits a chain only
    assert Eagle3Proposer(d, tree=True, depth=4, budget=9, topk=3).max_pending_tokens() == 9


def test_without_a_drafter_it_asks_the_drafter_cache(target, tmp_path, monkeypatch):
    folder = _random(target).save(tmp_path / "cached")
    calls = []
    fake = types.ModuleType("specdec_cuda.drafters")

    def cached_drafter(t, method):
        calls.append((t, method))
        return folder

    fake.cached_drafter = cached_drafter
    monkeypatch.setitem(sys.modules, "specdec_cuda.drafters", fake)
    out = specdec_cuda.generate(target, PROMPTS, method="eagle3", max_new_tokens=6, policy="fixed")
    assert calls == [(target, "eagle3")] and out.tokens == specdec_cuda.generate(target, PROMPTS,
                                                                                  max_new_tokens=6).tokens

    def missing(t, method):
        raise FileNotFoundError("no eagle3 drafter for this target: python -m specdec_cuda.train eagle3 --target DIR")

    fake.cached_drafter = missing
    with pytest.raises(FileNotFoundError, match="specdec_cuda.train eagle3"):
        specdec_cuda.generate(target, PROMPTS, method="eagle3", max_new_tokens=6)


def test_without_a_drafter_the_real_cache_names_the_training_command(target):
    pytest.importorskip("specdec_cuda.drafters")  # the drafter cache (merged from main)
    with pytest.raises(FileNotFoundError, match="specdec_cuda.train eagle3"):
        make_eagle3_proposer(target)
