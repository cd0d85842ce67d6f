"""The DFlash drafter: its cache follows the committed text (a cached block forward equals a
from-scratch one), the training forward's block mask, save / load, the proposer's draft kinds,
and one short training run that lowers the loss."""

from __future__ import annotations

import pytest
import torch

from decoding_models import load_backend, make_checkpoint
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.models.dflash import DFlashConfig, DFlashDrafter, default_target_layers
from specdec_cuda.proposers.base import DraftKind
from specdec_cuda.proposers.dflash import DFlashProposer
from specdec_cuda.train.dflash import block_loss, drafter_scorer

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("dflash") / "target", layers=3, seed=0)
    return load_backend(folder, "builtin")


def _drafter(target, block_size=4, seed=0):
    # std 0.2: a random drafter whose outputs depend visibly on the context and the block.
    return DFlashDrafter.random(DFlashConfig.for_target(target, block_size=block_size), seed=seed,
                                std=0.2).attach(target)


def _scratch_logits(drafter, target, seq: list[int], block_size: int | None = None) -> torch.Tensor:
    """The block after ``seq`` (anchor = its last token) from scratch: the target over ``seq``, the
    training forward with one anchor. Shape: [blk - 1, V]."""
    tokens = torch.tensor([seq])
    feats = drafter.context_features(target_hidden(target, tokens, drafter.config.target_layers))
    H = drafter.config.hidden_size
    pad = torch.cat([tokens, tokens.new_zeros(1, drafter.config.block_size)], dim=1)  # room after the anchor
    feats = torch.cat([feats, feats.new_zeros(1, drafter.config.block_size, H)], dim=1)
    return drafter.train_forward(pad, feats, torch.tensor([[len(seq) - 1]]), block_size)[0, 0, 1:]


@torch.no_grad()
def target_hidden(target, tokens: torch.Tensor, layers) -> dict[int, torch.Tensor]:
    """The target's hidden states at ``layers`` over ``tokens`` [B, L]: layer -> [B, L, H]."""
    B, L = tokens.shape
    out = target.forward(tokens, torch.arange(L).expand(B, L), target.new_cache(B, L), hidden_layers=tuple(layers))
    return {layer: out.hidden_states[layer] for layer in layers}


class _Checked(DFlashProposer):
    """DFlash that checks every cached block forward against the from-scratch one."""

    def __init__(self, drafter, target, trim_block=True):
        super().__init__(drafter, trim_block=trim_block)
        self.target, self.checked, self.trimmed = target, 0, 0

    def prefill(self, ctx):
        super().prefill(ctx)
        self.seq = [ctx.prompts[b, :n].tolist() + [int(t)]
                    for b, (n, t) in enumerate(zip(ctx.prompt_lens.tolist(), ctx.first_tokens.tolist()))]

    def block_logits(self, state, depth):
        logits = super().block_logits(state, depth)
        assert self.cache.lengths.tolist() == state.lengths.tolist()  # context = committed before the root
        # A trimmed block (a step granted fewer drafts than the block holds) is the root and depth masks.
        blk = depth + 1 if self.trim_block else self.block_size
        self.trimmed += blk < self.block_size
        for b, active in enumerate(state.active.tolist()):
            if active:
                want = _scratch_logits(self.drafter, self.target, self.seq[b], blk)[:depth]
                torch.testing.assert_close(logits[b], want, rtol=1e-9, atol=1e-9)
                self.checked += 1
        return logits

    def block_tokens(self, state, depth):
        # A greedy chain's tokens: the checked logits' argmax (the op ranks them itself).
        want = self.draft_ids(self.block_logits(state, depth).argmax(-1))
        tokens = super().block_tokens(state, depth)
        assert torch.equal(tokens, want)
        return tokens

    def accept(self, draft, outcome):
        super().accept(draft, outcome)
        for b, active in enumerate(outcome.active.tolist()):
            if active:
                self.seq[b].extend(outcome.tokens[b, : int(outcome.num_accepted[b]) + 1].tolist())


@pytest.mark.parametrize("temperature,trim_block", [(0.0, True), (1.0, True), (0.0, False)])
def test_the_cached_block_equals_a_forward_from_scratch(target, temperature, trim_block):
    drafter = _drafter(target)
    proposer = _Checked(drafter, target, trim_block)
    params = SamplingParams.make(len(PROMPTS), temperature, 0, 1.0, [3, 4, 5])
    decode(target, PROMPTS, params, 10, proposer=proposer)
    assert proposer.checked >= 6
    # The last steps are granted fewer drafts than the block holds (the rows' token budget).
    assert (proposer.trimmed > 0) == trim_block


def test_the_prompts_catch_up_is_counted_as_one_time_work(target):
    # Metrics.one_time_seconds: the drafter's prefill of the prompt (its first catch-up), a part of
    # propose_seconds that the bench reports apart from the per-block cost.
    out = decode(target, PROMPTS, SamplingParams.make(len(PROMPTS), 0.0, 0, 1.0, [3, 4, 5]), 6,
                 proposer=DFlashProposer(_drafter(target)))
    m = out.metrics
    assert 0.0 < m.one_time_seconds < m.propose_seconds
    assert m.as_dict()["one_time_seconds"] == m.one_time_seconds


def test_a_trimmed_block_is_not_the_full_block(target):
    # The masks past the depth are attended to: dropping them changes the kept positions' logits,
    # so the trimmed path is a different (cheaper) forward, not a slice of the full one.
    drafter = _drafter(target, block_size=6)
    full, trimmed = (_scratch_logits(drafter, target, [1, 2, 3, 4], blk)[:2] for blk in (6, 3))
    assert not torch.allclose(full, trimmed)


def test_blocks_see_only_the_context_before_their_anchor_and_themselves(target):
    drafter = _drafter(target, block_size=3)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (1, 12), generator=g)
    H = drafter.config.hidden_size
    feats = torch.randn(1, 12, H, generator=g, dtype=drafter.dtype)
    anchors = torch.tensor([[2, 6, 9]])
    base = drafter.train_forward(tokens, feats, anchors)
    # Context at or after block 0's anchor (2) and the other blocks' anchor tokens do not matter to it.
    feats2, tokens2 = feats.clone(), tokens.clone()
    feats2[:, 2:] += 1.0
    tokens2[:, 6], tokens2[:, 9] = (tokens[:, 6] + 1) % target.vocab_size, (tokens[:, 9] + 1) % target.vocab_size
    torch.testing.assert_close(drafter.train_forward(tokens2, feats2, anchors)[:, 0], base[:, 0])
    # Context before block 1's anchor does.
    feats3 = feats.clone()
    feats3[:, 4] += 1.0
    assert not torch.allclose(drafter.train_forward(tokens, feats3, anchors)[:, 1], base[:, 1])


def test_cache_rollback_then_regrowth(target):
    drafter = _drafter(target)
    g = torch.Generator().manual_seed(1)
    hidden = {l: torch.randn(2, 6, target.hidden_size, generator=g, dtype=drafter.dtype)
              for l in drafter.config.target_layers}
    direct = drafter.new_cache(2, 16)
    drafter.extend(direct, {l: h[:, :4] for l, h in hidden.items()}, torch.tensor([4, 3]))
    rolled = drafter.new_cache(2, 16)
    drafter.extend(rolled, hidden, torch.tensor([6, 5]))
    rolled.truncate(torch.tensor([2, 2]))  # roll back, then commit other tokens' features there
    drafter.extend(rolled, {l: h[:, 2:4] for l, h in hidden.items()}, torch.tensor([2, 1]))
    assert rolled.lengths.tolist() == direct.lengths.tolist() == [4, 3]
    last = torch.tensor([7, 9])
    torch.testing.assert_close(drafter.draft(rolled, last), drafter.draft(direct, last))
    with pytest.raises(ValueError, match="truncate"):
        rolled.truncate(torch.tensor([5, 0]))


def test_save_load_roundtrip(target, tmp_path):
    drafter = _drafter(target)
    drafter.save(tmp_path / "d")
    loaded = DFlashDrafter.load(tmp_path / "d").attach(target)
    assert loaded.config.target_layers == drafter.config.target_layers
    cache_a, cache_b = drafter.new_cache(1, 8), loaded.new_cache(1, 8)
    torch.testing.assert_close(loaded.draft(cache_b, torch.tensor([3])).float(),
                               drafter.draft(cache_a, torch.tensor([3])).float(), rtol=1e-6, atol=1e-6)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="not a DFlash drafter"):
        DFlashDrafter.load(tmp_path / "bad")


def test_a_drafters_own_draft_vocabulary_is_saved_and_used_by_default(target, tmp_path):
    # DFlashConfig.draft_vocab travels with the checkpoint; the method runs the head over it unless
    # told "all" or other ids; the logits over it are the whole head's columns.
    import specdec_cuda
    from specdec_cuda.proposers.dflash import draft_vocab_of

    drafter = _drafter(target)
    ids = tuple(range(1, target.vocab_size, 3))
    drafter.config.draft_vocab = ids
    drafter.save(tmp_path / "d")
    loaded = DFlashDrafter.load(tmp_path / "d").attach(target)
    assert loaded.config.draft_vocab == ids
    assert draft_vocab_of(target, loaded).ids.tolist() == list(ids)
    assert draft_vocab_of(target, loaded, "all") is None
    assert draft_vocab_of(target, loaded, 5).ids.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="draft_vocab"):
        draft_vocab_of(target, loaded, "most")
    vocab = draft_vocab_of(target, loaded)
    full = loaded.draft(loaded.new_cache(1, 8), torch.tensor([3]))
    sub = loaded.draft(loaded.new_cache(1, 8), torch.tensor([3]), vocab=vocab)
    torch.testing.assert_close(sub, full[..., list(ids)], rtol=1e-5, atol=1e-5)
    ar = specdec_cuda.generate(target, PROMPTS[:2], max_new_tokens=8).tokens
    out = specdec_cuda.generate(target, PROMPTS[:2], method="dflash", drafter=tmp_path / "d", max_new_tokens=8,
                                policy="fixed")
    assert out.tokens == ar and sum(out.metrics.drafted) > 0
    with pytest.raises(ValueError, match="draft_vocab"):
        DFlashConfig(**{**drafter.config.__dict__, "draft_vocab": (target.vocab_size,)})


def test_target_layers_are_evenly_spaced():
    assert default_target_layers(12, 4) == (1, 4, 7, 10)
    assert default_target_layers(2, 4) == (0, 1)
    assert default_target_layers(36, 5) == (1, 9, 18, 26, 34)


@pytest.mark.parametrize("temperature,sampling,kind", [(0.0, "sampled", DraftKind.GUESS), (0.8, "sampled", DraftKind.SAMPLED),
                                                       (0.8, "greedy", DraftKind.GUESS)])
def test_draft_kinds(target, temperature, sampling, kind):
    drafts = []

    class Spy(DFlashProposer):
        def propose(self, state):
            d = super().propose(state)
            drafts.append(d)
            return d

    params = SamplingParams.make(2, temperature, 0, 1.0, 0)
    decode(target, PROMPTS[:2], params, 6, proposer=Spy(_drafter(target), draft_sampling=sampling))
    assert drafts and all(d.kind is kind for d in drafts)
    for d in drafts:
        assert (d.logits is None) == (kind is DraftKind.GUESS)
        assert d.tokens.shape[1] <= 3 and int(d.num_nodes.max()) <= 3
        if kind is DraftKind.SAMPLED:
            assert d.logits.shape[:2] == d.tokens.shape


def test_bad_options_are_named(target):
    with pytest.raises(ValueError, match="draft_sampling"):
        DFlashProposer(_drafter(target), draft_sampling="typical")
    with pytest.raises(ValueError, match="block_size"):
        DFlashProposer(_drafter(target), block_size=1)
    with pytest.raises(TypeError, match="drafter"):
        from specdec_cuda.proposers.dflash import load_drafter

        load_drafter(target, 3)


def test_training_lowers_the_loss(target):
    torch.manual_seed(0)
    drafter = DFlashDrafter.random(DFlashConfig.for_target(target, block_size=4), seed=0).attach(target)
    g = torch.Generator().manual_seed(0)
    # Learnable labels: each sequence repeats with period 3, so the block can copy the context.
    tokens = torch.randint(0, target.vocab_size, (4, 3), generator=g).repeat(1, 6)[:, :16]
    hidden = target_hidden(target, tokens, drafter.config.target_layers)
    anchors = torch.tensor([[3, 7, 11]] * 4)
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss = block_loss(drafter, drafter_scorer(drafter), tokens, hidden, anchors, gamma=4.0)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.7 * first


def test_no_drafter_names_the_training_command(target):
    # The library never falls back to a drafter trained for another model (the zoo's).
    from specdec_cuda.proposers.dflash import load_drafter

    with pytest.raises(FileNotFoundError, match="specdec_cuda.train dflash --target"):
        load_drafter(target, None)


def test_cli_trains_the_drafter_of_the_given_target(monkeypatch, tmp_path):
    from zoo import dflash as zoo_dflash
    from zoo import train

    calls = []
    monkeypatch.setattr(zoo_dflash, "train_dflash", lambda target, force=False: calls.append((target, force)))
    assert train.main(["--dflash", "--target", str(tmp_path), "--force"]) == 0
    assert calls == [(str(tmp_path), True)]


@pytest.mark.parametrize("attention_bias", [False, True])
def test_the_block_as_decoder_layer_ops_equals_the_torch_layers(tmp_path_factory, monkeypatch, attention_bias):
    """On a float32 CPU drafter the block runs one ``decoder_layer`` op per layer over the cache,
    the context's projections and the LM head read packed panels; its logits equal the torch
    path's (``SPECDEC_PACKED_LINEAR=0``), rows of unequal context lengths included, and the
    scratch slots it writes past a row's context are never read."""
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the torch layers always run")
    target = load_backend(make_checkpoint(tmp_path_factory.mktemp("dflash32") / "target", layers=3, seed=0), "builtin",
                          dtype=torch.float32)
    config = DFlashConfig.for_target(target, block_size=4, attention_bias=attention_bias)
    drafter = DFlashDrafter.random(config, seed=3, std=0.2).attach(target)
    g = torch.Generator().manual_seed(2)
    hidden = {l: torch.randn(2, 5, target.hidden_size, generator=g) for l in config.target_layers}
    last = torch.tensor([7, 9])

    def run(native: bool):
        monkeypatch.setenv("SPECDEC_PACKED_LINEAR", "1" if native else "0")
        cache = drafter.new_cache(2, 16)
        drafter.extend(cache, hidden, torch.tensor([5, 3]))
        first = drafter.draft(cache, last)
        drafter.extend(cache, {l: h[:, :2] for l, h in hidden.items()}, torch.tensor([2, 1]))  # over the scratch
        return first, drafter.draft(cache, last)

    assert drafter._native_layers() is not None
    with torch.no_grad():  # the context projections and the head also take the packed path
        assert drafter._packed_io() is not None and drafter.__dict__.get("_head_op") is not None
    for got, want in zip(run(True), run(False)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_draft_tokens_and_topk_are_the_ranks_of_the_drafts_logits(tmp_path_factory, monkeypatch):
    """``draft_tokens`` (a greedy chain) gives the token ids of ``draft``'s argmax, and ``draft_topk``
    (DDTree's input) ``log_softmax(draft(...)).topk(k)`` as token ids: on the packed path the head
    op ranks the rows itself (and takes each row's log-sum-exp) into buffers the run keeps. Over the
    whole vocabulary and a draft vocabulary, at batch 1 (the anchor's embedding written into the
    run's block buffer) and 2, on both paths; each call's results stay as they were after the next."""
    from specdec_cuda.models.layers import packed_kernel_available
    from specdec_cuda.proposers.dflash import draft_vocab_of

    target = load_backend(make_checkpoint(tmp_path_factory.mktemp("dflash_top1") / "target", layers=3, seed=0),
                          "builtin", dtype=torch.float32)
    drafter = DFlashDrafter.random(DFlashConfig.for_target(target, block_size=5), seed=3, std=0.2).attach(target)
    g = torch.Generator().manual_seed(4)
    hidden = {l: torch.randn(2, 6, target.hidden_size, generator=g) for l in drafter.config.target_layers}
    for packed in ("1", "0"):
        monkeypatch.setenv("SPECDEC_PACKED_LINEAR", packed)
        vocab = draft_vocab_of(target, drafter, list(range(3, target.vocab_size, 2)))  # the head in this path's form
        for B in (1, 2):
            run = drafter.inference()
            cache = drafter.new_cache(B, 16)
            drafter.extend(cache, {l: h[:B] for l, h in hidden.items()}, torch.tensor([6, 4][:B]), run)
            kept = []
            for last in ([7, 9], [2, 11]):
                last = torch.tensor(last[:B])
                for sub in (None, vocab):
                    ids_of = (lambda i: i) if sub is None else (lambda i: sub.ids[i])
                    logits = drafter.draft(cache, last, 4, 3, sub, run)
                    got = drafter.draft_tokens(cache, last, 4, 3, sub, run)
                    assert got.shape == (B, 3) and torch.equal(got, ids_of(logits.argmax(-1)))
                    want_lp, index = torch.log_softmax(logits, -1).topk(6, -1)
                    lp, ids = drafter.draft_topk(cache, last, 6, 4, 3, sub, run)
                    assert lp.shape == ids.shape == (B, 3, 6) and lp.dtype == torch.float32
                    torch.testing.assert_close(lp, want_lp, rtol=1e-5, atol=1e-5)
                    assert torch.equal(ids, ids_of(index))
                    # the op ranks on the packed path (where the kernel is vectorised)
                    assert (drafter._run_head(run, sub)[0] is not None) == (packed == "1" and packed_kernel_available())
                    kept += [(got, got.clone()), (lp, lp.clone()), (ids, ids.clone())]
            assert all(torch.equal(a, b) for a, b in kept)


def test_bfloat16_weights_are_saved_as_bfloat16_and_packed_as_bfloat16(target, tmp_path, monkeypatch):
    """A drafter whose weights are bfloat16 numbers (``train dflash --dflash-weights bfloat16``) is
    saved in bfloat16 (the same values, half the file), loads to the same float32 values, and its
    packed CPU path streams bfloat16 panels with the torch path's logits."""
    from safetensors import safe_open

    from specdec_cuda.models.layers import packed_kernel_available

    t32 = load_backend(make_checkpoint(tmp_path / "target", layers=3, seed=0), "builtin", dtype=torch.float32)
    drafter = DFlashDrafter.random(DFlashConfig.for_target(t32, block_size=4), seed=3, std=0.2)
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(p.bfloat16())
    drafter.save(tmp_path / "d")
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    loaded = DFlashDrafter.load(tmp_path / "d").attach(t32)
    for (name, a), b in zip(drafter.named_parameters(), loaded.parameters()):
        assert b.dtype == torch.float32 and torch.equal(a, b), name
    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU")
    run = loaded.inference()
    assert run.native[0][3].dtype == torch.bfloat16 and run.io.fc.panels.dtype == torch.bfloat16  # q|k|v panels
    g = torch.Generator().manual_seed(2)
    hidden = {l: torch.randn(1, 5, t32.hidden_size, generator=g) for l in loaded.config.target_layers}

    def logits(packed: str):
        monkeypatch.setenv("SPECDEC_PACKED_LINEAR", packed)
        cache = loaded.new_cache(1, 16)
        loaded.extend(cache, hidden, torch.tensor([5]))
        return loaded.draft(cache, torch.tensor([7]))

    torch.testing.assert_close(logits("1"), logits("0"), rtol=1e-5, atol=1e-5)
