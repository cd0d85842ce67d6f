"""method="cross_tokenizer": a drafter of another tokenizer, its text re-tokenized for the target.

The tokenizers are written here (BPE trained on small random or fixed texts, with the
``tokenizers`` library) and the models are tiny random Llamas, so nothing is downloaded:

* the sync rule on byte-level tokenizers: the committed text is exactly the target's decode
  (characters split across tokens included), the drafter's context decodes to that text, its
  re-tokenized window stays short, and drafted text becomes target tokens that decode to the
  committed text followed by the drafted text wherever the boundary falls;
* a drafter that is the target itself under another numbering of a character vocabulary proposes
  exactly the target's greedy text, so every draft is accepted: the sync loses nothing;
* the conformance suite's checks (``test_conformance``: greedy identity, chi-square of the first
  three sampled tokens against the exact target distribution, six-token runs seed for seed equal to
  autoregressive sampling, EOS and budget cuts, batch independence, streaming) on both backends;
* greedy and sampled identity with autoregressive decoding on byte-level vocabularies whose random
  targets emit invalid UTF-8, with a drafter cache that has to grow; the option errors.
"""

from __future__ import annotations

import random

import pytest
import torch

import specdec_cuda
import test_conformance as conformance
from conformance_proposers import cross_tokenizer_options
from decoding_models import load_backend, make_checkpoint
from lossless_stats import chi2_pvalue, exact_joint
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.proposers.cross_tokenizer import (CrossTokenizerProposer, RowText, TextTokenizer,
                                                    make_cross_tokenizer_proposer)

TEXT = ("def greet(name):\n    return f\"héllo, {name}! ça va? 你好 🙂\"\n\n"
        "for i in range(10):\n    print(greet(str(i)), end='')  # naïve résumé\n") * 3


def byte_level_bpe(vocab_size: int, text: str):
    """A GPT-2-style byte-level BPE (regex pre-tokenizer, no prefix space) trained on ``text``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


@pytest.fixture(scope="module")
def byte_tokenizers():
    """A target tokenizer (300 tokens) and a drafter tokenizer (270) of one text: different merges."""
    return TextTokenizer(byte_level_bpe(300, TEXT)), TextTokenizer(byte_level_bpe(270, TEXT[::-1]))


# -- the sync rule ----------------------------------------------------------------------------------

def test_committed_text_and_drafter_context_follow_the_target_tokens(byte_tokenizers):
    target_tok, draft_tok = byte_tokenizers
    rng = random.Random(0)
    # Non-canonical target tokens too (pieces encoded apart), and single bytes of multi-byte characters.
    ids = []
    for piece in [TEXT[i:i + 7] for i in range(0, len(TEXT), 7)]:
        ids += target_tok.encode(piece)
    ids[40:40] = [target_tok.tokenizer.token_to_id("ä")]  # byte 0xE4 alone: a 3-byte character never completed
    row = RowText(ids[:25])
    longest_window = 0
    while True:
        row.extend_text(target_tok, keep_exact=12)
        row.sync_draft_ids(draft_tok, lookbehind=6)
        full = target_tok.decode(row.target_ids)
        # Everything decoded is in the text; what is held back is at most an incomplete character.
        assert full.startswith(row.text) and len(full) - len(row.text) <= 1
        assert draft_tok.decode(row.draft_ids) == row.text
        assert draft_tok.decode(row.draft_ids[: row.anchor_tok]) == row.text[: row.anchor_char]
        longest_window = max(longest_window, len(row.draft_ids) - row.anchor_tok)
        if len(row.target_ids) == len(ids):
            break
        row.target_ids += ids[len(row.target_ids): len(row.target_ids) + rng.randint(1, 5)]
    assert row.text == target_tok.decode(ids)
    assert row.anchor_tok > 0 and longest_window <= 2 * 6 + 12  # the window re-tokenized stays short


def test_drafted_text_becomes_the_target_tokens_that_continue_the_committed_ones(byte_tokenizers):
    target_tok, _ = byte_tokenizers
    rng = random.Random(1)
    merged = 0
    for _ in range(300):
        i = rng.randrange(1, len(TEXT) - 20)
        j = i + rng.randint(1, 20)
        # Committed: the text before i, tokenized as the target would have produced it in one go.
        row = RowText(target_tok.encode(TEXT[:i]))
        row.extend_text(target_tok, keep_exact=12)
        if row.n_text < len(row.target_ids):
            continue  # i falls inside a character
        drafted = TEXT[i:j]
        proposal = row.target_continuation(target_tok, drafted, lookbehind=8, vocab_size=300)
        assert target_tok.decode(row.target_ids + proposal) == TEXT[:j]
        merged += proposal != target_tok.encode(TEXT[:j])[len(row.target_ids):]
    assert merged > 0  # some boundaries fell inside a word the target tokenizes whole
    # The boundary case: "hel" committed, "lo" drafted; the whole would tokenize otherwise.
    row = RowText(target_tok.encode("    print(gr"))
    row.extend_text(target_tok, keep_exact=12)
    proposal = row.target_continuation(target_tok, "eet(str(i)),", lookbehind=8, vocab_size=300)
    assert target_tok.decode(row.target_ids + proposal) == "    print(greet(str(i)),"
    assert target_tok.encode("    print(greet(str(i)),")[: len(row.target_ids)] != row.target_ids


# -- an exact drafter: the target under another numbering ---------------------------------------------

def test_the_target_renumbered_as_drafter_has_every_draft_accepted(tmp_path):
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaForCausalLM

    V = 24
    chars = [chr(ord("A") + i) for i in range(V)]
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(0))  # target id i -> drafter id perm[i]

    def char_tokenizer(ids):
        tok = Tokenizer(models.BPE(vocab={c: int(i) for c, i in zip(chars, ids)}, merges=[]))
        tok.decoder = decoders.Fuse()
        return tok

    folder = make_checkpoint(tmp_path / "target", vocab=V, seed=5)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64)
    with torch.no_grad():
        for w in (model.model.embed_tokens.weight, model.lm_head.weight):
            w[perm] = w.clone()
    model.save_pretrained(tmp_path / "draft")
    target = load_backend(folder, "builtin")
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [11, 12]]
    ar = specdec_cuda.generate(target, prompts, max_new_tokens=30).tokens
    out = specdec_cuda.generate(target, prompts, method="cross_tokenizer", max_new_tokens=30, k=4, policy="fixed",
                                draft=tmp_path / "draft", draft_tokenizer=char_tokenizer(perm.tolist()),
                                target_tokenizer=char_tokenizer(range(V)))
    assert out.tokens == ar
    assert out.metrics.acceptance_rate == 1.0 and out.metrics.tau > 4


# -- the conformance suite's checks ------------------------------------------------------------------

CASE = conformance.Case("cross-tokenizer", True, method="cross_tokenizer",
                        options=lambda env: dict(cross_tokenizer_options(env.target), k=3, policy="fixed"),
                        same_samples_as=conformance.AR)
COST_POLICY = conformance.Case("cross-tokenizer-cost-policy", True, method="cross_tokenizer",
                               options=lambda env: dict(cross_tokenizer_options(env.target), k=3),
                               same_samples_as=conformance.AR)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The suite's models (``test_conformance.folders``): a target of 64 tokens, one of 6."""
    root = tmp_path_factory.mktemp("conformance")
    big = make_checkpoint(root / "target", seed=0)
    small = make_checkpoint(root / "small", vocab=conformance.SMALL_VOCAB, hidden=16, layers=1, heads=2,
                            kv_heads=1, seed=3)
    return dict(big=big, small=small)


@pytest.fixture(scope="module", params=["builtin", "hf"])
def envs(request, folders):
    # The drafter comes with the case's options; the env's draft is not read.
    return {kind: conformance.Env(load_backend(folder, request.param), None) for kind, folder in folders.items()}


def test_greedy_equals_autoregressive(envs):
    conformance.test_greedy_equals_autoregressive(envs, CASE)
    conformance.test_greedy_equals_autoregressive(envs, COST_POLICY)


def test_first_three_sampled_tokens_have_the_target_distribution(envs):
    conformance.test_first_three_sampled_tokens_have_the_target_distribution(envs, CASE)


def test_six_token_runs_are_the_autoregressive_samples_of_the_same_seed(envs):
    conformance.test_late_sampled_tokens_of_deep_drafts_have_the_target_distribution(envs, CASE)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5])
def test_budget_cut_inside_an_accepted_run(envs, max_new_tokens):
    conformance.test_budget_cut_inside_an_accepted_run(envs, CASE, max_new_tokens)


def test_eos_batch_independence_and_streaming(envs):
    conformance.test_eos_inside_an_accepted_run(envs, CASE)
    conformance.test_rows_independent_of_neighbours_and_place(envs, CASE)
    conformance.test_stream_sees_exactly_the_final_tokens(envs, CASE)


def test_sample_and_match_counts_pass_a_chi_square_a_wrong_distribution_fails(folders):
    """The joint of the first three tokens sampled through cross-tokenizer drafts against the exact
    target distribution; the same counts against a neighbouring temperature's distribution fail."""
    target = load_backend(folders["small"], "builtin")
    prompt, n = conformance.CHI_PROMPT, 4000
    out = specdec_cuda.generate(target, [prompt] * n, method="cross_tokenizer", max_new_tokens=3, temperature=1.0,
                                seed=list(range(n)), k=3, policy="fixed", **cross_tokenizer_options(target))
    assert out.metrics.acceptance_rate > 0.1
    counts = {}
    for row in out.tokens:
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    vocab = conformance.SMALL_VOCAB
    assert chi2_pvalue(counts, exact_joint(target, prompt, vocab, 1.0, 0), n) > 1e-3
    assert chi2_pvalue(counts, exact_joint(target, prompt, vocab, 0.7, 0), n) < 1e-6


# -- byte-level vocabularies, random targets (invalid UTF-8 included) ---------------------------------

class SmallCacheProposer(CrossTokenizerProposer):
    """Sizes the drafter's cache for nothing beyond the prompt, so it regrows during the run."""

    caches = 0

    def prefill(self, ctx) -> None:
        super().prefill(ctx)
        self.target_max_length = 0

    def _ensure_capacity(self, need: int) -> bool:
        grown = super()._ensure_capacity(need)
        SmallCacheProposer.caches += grown
        return grown


@pytest.mark.parametrize("backend", ["builtin", "hf"])
def test_byte_level_pair_equals_autoregressive_greedy_and_sampled(tmp_path, byte_tokenizers, backend):
    target_tok, draft_tok = byte_tokenizers
    target = load_backend(make_checkpoint(tmp_path / "target", vocab=300, seed=7), backend)
    drafter = load_backend(make_checkpoint(tmp_path / "draft", vocab=270, seed=8), "builtin")
    prompts = [target_tok.encode(t) for t in ("def greet(name):\n", "for i in range(10):\n    print(", "ça", "你")]
    make = dict(draft=drafter, draft_tokenizer=draft_tok, target_tokenizer=target_tok)
    for temperature in (0.0, 1.0):
        params = SamplingParams.make(len(prompts), temperature, 0, 1.0, [3, 1, 4, 1])
        ar = decode(target, prompts, params, 40).tokens
        for k, lookbehind in ((4, 8), (2, 1)):
            proposer = make_cross_tokenizer_proposer(target, k=k, lookbehind=lookbehind, **make)
            out = decode(target, prompts, params, 40, proposer=proposer)
            assert out.tokens == ar, (temperature, k, lookbehind)
            assert sum(out.metrics.drafted) > 0
    SmallCacheProposer.caches = 0
    grows = SmallCacheProposer(drafter, draft_tok, target_tok, target.vocab_size, k=4)
    params = SamplingParams.make(len(prompts), 0.0, 0, 1.0, 0)
    assert decode(target, prompts, params, 40, proposer=grows).tokens == decode(target, prompts, params, 40).tokens
    assert SmallCacheProposer.caches >= 2  # made, then regrown and re-fed at least once


def test_transformers_tokenizers_are_accepted(tmp_path, byte_tokenizers):
    from transformers import PreTrainedTokenizerFast

    target_tok, draft_tok = byte_tokenizers
    target = load_backend(make_checkpoint(tmp_path / "target", vocab=300, seed=7), "builtin")
    prompts = [target_tok.encode("def greet(name):\n")]
    out = specdec_cuda.generate(target, prompts, method="cross_tokenizer", max_new_tokens=12,
                                draft=make_checkpoint(tmp_path / "draft", vocab=270, seed=8),
                                draft_tokenizer=PreTrainedTokenizerFast(tokenizer_object=draft_tok.tokenizer),
                                target_tokenizer=PreTrainedTokenizerFast(tokenizer_object=target_tok.tokenizer))
    assert out.tokens == specdec_cuda.generate(target, prompts, max_new_tokens=12).tokens


# -- errors ------------------------------------------------------------------------------------------

def test_bad_options_raise_clear_errors(tmp_path, byte_tokenizers):
    target_tok, draft_tok = byte_tokenizers
    target = load_backend(make_checkpoint(tmp_path / "target", vocab=300, seed=7), "builtin")
    draft = load_backend(make_checkpoint(tmp_path / "draft", vocab=270, seed=8), "builtin")
    small = load_backend(make_checkpoint(tmp_path / "small", vocab=64, seed=9), "builtin")

    def make(**kw):
        return specdec_cuda.SpeculativeDecoder(target, method="cross_tokenizer", **kw)

    with pytest.raises(ValueError, match="needs draft="):
        make(draft_tokenizer=draft_tok, target_tokenizer=target_tok)
    with pytest.raises(ValueError, match="needs target_tokenizer="):  # a folder without tokenizer.json
        make(draft=draft, draft_tokenizer=draft_tok)
    with pytest.raises(ValueError, match="needs draft_tokenizer="):
        make(draft=draft, target_tokenizer=target_tok)
    with pytest.raises(ValueError, match="method='draft'"):
        make(draft=target, draft_tokenizer=target_tok.tokenizer, target_tokenizer=target_tok)
    with pytest.raises(ValueError, match="draft_tokenizer has token ids up to 269, beyond its model's vocabulary of 64"):
        make(draft=small, draft_tokenizer=draft_tok, target_tokenizer=target_tok)
    with pytest.raises(FileNotFoundError, match="draft_tokenizer: no tokenizer file"):
        make(draft=draft, draft_tokenizer=tmp_path / "none.json", target_tokenizer=target_tok)
    with pytest.raises(TypeError, match="draft_tokenizer: expected a tokenizers.Tokenizer"):
        make(draft=draft, draft_tokenizer=3, target_tokenizer=target_tok)
    with pytest.raises(ValueError, match="need k >= 1"):
        make(draft=draft, draft_tokenizer=draft_tok, target_tokenizer=target_tok, k=0)
    with pytest.raises(TypeError, match="takes no option 'temperature_draft'"):
        make(draft=draft, draft_tokenizer=draft_tok, target_tokenizer=target_tok, temperature_draft=1.0)


def test_tokenizers_default_to_the_model_folders(tmp_path, byte_tokenizers):
    target_tok, draft_tok = byte_tokenizers
    target_dir = make_checkpoint(tmp_path / "target", vocab=300, seed=7)
    draft_dir = make_checkpoint(tmp_path / "draft", vocab=270, seed=8)
    target_tok.tokenizer.save(str(target_dir / "tokenizer.json"))
    draft_tok.tokenizer.save(str(draft_dir / "tokenizer.json"))
    target = specdec_cuda.models.load(target_dir, dtype=torch.float64)
    prompts = [target_tok.encode("for i in")]
    out = specdec_cuda.generate(target, prompts, method="cross_tokenizer", draft=draft_dir, max_new_tokens=10)
    assert out.tokens == specdec_cuda.generate(target, prompts, max_new_tokens=10).tokens
