"""Options of ``method="draft"`` that change what the drafter computes, not what is emitted:
``draft_vocab=`` (its LM head over part of the vocabulary, models/draft_vocab.py) and
``draft_context=`` (it reads only the end of each prompt).

draft_vocab:
Checked: the subset's logits are the full head's columns, for a prefix and a scattered id set: bit
for bit on the packed CPU path (float32, tied and untied heads: each output row's sum is its own),
to float64 rounding on the torch path (BLAS blocks a product by its shape);
``expand`` puts ``MASKED`` everywhere else; greedy drafting with a draft vocabulary gives the
autoregressive tokens, and a token outside it is still emitted (by the target); bad ids, a drafter
without ``vocab_subset`` and another model's subset are refused by name; ``frequent_token_ids``
ranks by count. Sampling with a draft vocabulary is the conformance suite's ``draft-vocab`` case
(chi-square against the exact target distribution); GGUF heads: tests/test_gguf_model.py.

draft_context: greedy output equal to autoregressive decoding on prompts longer and shorter than
the context, ragged in one batch, with drafts accepted; the drafter's cache holds the context
only; bad values refused. Sampling: the conformance suite's ``draft-context`` case.
"""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from decoding_models import load_backend, make_checkpoint
from specdec_cuda import models
from specdec_cuda.models.draft_vocab import MASKED, frequent_token_ids, subset_ids
from specdec_cuda.ops.skinny_linear import packed_kernel_available

VOCAB = 64


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft_vocab")
    target = make_checkpoint(root / "target", vocab=VOCAB, seed=0)
    draft = make_checkpoint(root / "draft", perturb_from=target, noise=0.05, seed=1)
    return target, draft


def _forward_both(model, subset):
    tokens = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5).expand(2, 5)
    full = model.forward(tokens, positions, model.new_cache(2, 8)).logits
    sub = model.forward(tokens, positions, model.new_cache(2, 8), vocab=subset).logits
    return full, sub


@pytest.mark.parametrize("spec", [VOCAB // 4, [3, 60, 7, 7, 21]], ids=["prefix", "scattered"])
def test_the_subset_logits_are_the_full_heads_columns_on_the_torch_path(folders, spec):
    model = load_backend(folders[0], "builtin")  # float64: the torch path
    subset = model.vocab_subset(spec)
    full, sub = _forward_both(model, subset)
    assert sub.shape[-1] == len(subset)
    torch.testing.assert_close(sub, full[..., subset.ids], rtol=1e-12, atol=1e-12)
    wide = subset.expand(sub)
    assert torch.equal(wide[..., subset.ids], sub)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[subset.ids] = False
    assert (wide[..., outside] == MASKED).all()


@pytest.mark.skipif(not packed_kernel_available(), reason="the packed CPU path needs AVX2 or AVX-512")
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_subset_logits_are_the_full_heads_columns_on_the_packed_path(tmp_path, tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = models.load(tmp_path, dtype=torch.float32)
    assert model.packed
    for spec in (70, list(range(5, 200, 7))):
        subset = model.vocab_subset(spec)
        tokens = torch.randint(0, 200, (2, 5), generator=torch.Generator().manual_seed(1))
        positions = torch.arange(5).expand(2, 5)
        full = model.forward(tokens, positions, model.new_cache(2, 8)).logits
        sub = model.forward(tokens, positions, model.new_cache(2, 8), vocab=subset).logits
        assert torch.equal(sub, full[..., subset.ids])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["torch-path", "packed-path"])
def test_greedy_drafting_with_a_draft_vocabulary_is_exact(folders, dtype):
    target = models.load(folders[0], dtype=dtype)
    draft = models.load(folders[1], dtype=dtype)
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9], [4]]
    expected = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=24).tokens
    out = specdec_cuda.generate(target, prompts, method="draft", draft=draft, k=3, policy="fixed",
                                draft_vocab=VOCAB // 2, max_new_tokens=24)
    assert out.tokens == expected
    assert sum(out.metrics.drafted) > 0 and sum(out.metrics.accepted) > 0
    # the target chose tokens the drafter could not propose, and they were emitted all the same
    assert any(t >= VOCAB // 2 for row in expected for t in row)


def test_lookahead_draft_takes_a_draft_vocabulary(folders):
    target, draft = (models.load(f, dtype=torch.float64) for f in folders)
    prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 6, 7, 8, 9]]
    expected = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=20).tokens
    out = specdec_cuda.generate(target, prompts, method="lookahead+draft", draft=draft, k=3, draft_vocab=VOCAB // 2,
                                adaptive=False, max_new_tokens=20)
    assert out.tokens == expected


def test_bad_draft_vocabularies_are_refused(folders):
    model = load_backend(folders[0], "builtin")
    for bad in (0, VOCAB + 1, [], [-1, 3], [2, VOCAB], [[1, 2]], [0.5]):
        with pytest.raises(ValueError, match="vocabulary"):
            model.vocab_subset(bad)
    with pytest.raises(TypeError, match="bool"):
        subset_ids(True, VOCAB)
    other = load_backend(folders[1], "builtin")
    tokens, positions = torch.tensor([[1]]), torch.tensor([[0]])
    with pytest.raises(ValueError, match="this model's vocab_subset"):
        model.forward(tokens, positions, model.new_cache(1, 4), vocab=other.vocab_subset(8))
    stale = model.vocab_subset(8)
    model.to(torch.float32)  # a packed model from here on where the CPU has the packed kernels, else float32 BLAS
    with pytest.raises(ValueError, match="make it again"):
        model.forward(tokens, positions, model.new_cache(1, 4), vocab=stale)
    hf_draft = load_backend(folders[1], "hf")
    with pytest.raises(TypeError, match="draft_vocab needs a built-in drafter"):
        specdec_cuda.generate(model, [[1, 2]], method="draft", draft=hf_draft, draft_vocab=8, max_new_tokens=2)


def test_frequent_token_ids_rank_by_count():
    class Chars:  # one id per character
        def encode(self, text):
            return [ord(c) - ord("a") for c in text]

    assert frequent_token_ids(Chars(), ["abcabc", "aab", "d"], 2) == [0, 1]
    assert frequent_token_ids(Chars(), ["cccbbd"], 1, always=[25]) == [2, 25]
    assert frequent_token_ids(Chars(), ["ab"], 10) == [0, 1]  # fewer distinct tokens than asked


# ---- draft_context -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["torch-path", "packed-path"])
def test_a_drafter_reading_the_end_of_the_prompt_keeps_greedy_output_exact(folders, dtype):
    from specdec_cuda.proposers.draft_model import DraftModelProposer

    target = models.load(folders[0], dtype=dtype)
    draft = models.load(folders[1], dtype=dtype)
    prompts = [list(range(1, 30)), [5, 6, 7], list(range(40, 52))]  # longer, shorter, longer than 8
    expected = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=20).tokens
    out = specdec_cuda.generate(target, prompts, method="draft", draft=draft, k=3, policy="fixed",
                                draft_context=8, max_new_tokens=20)
    assert out.tokens == expected and sum(out.metrics.accepted) > 0
    proposer = DraftModelProposer(draft, k=3, draft_context=8)
    decoded = specdec_cuda.decoding.decode(target, prompts, specdec_cuda.decoding.SamplingParams.make(3, 0.0, 0, 1.0, 0,
                                           target.device), 20, proposer=proposer)
    assert decoded.tokens == expected
    assert proposer.offset.tolist() == [29 - 8, 0, 12 - 8]
    # the drafter's cache never held more than the context plus what was generated
    assert int(proposer.cache.lengths.max()) <= 8 + 20


def test_bad_draft_contexts_are_refused(folders):
    draft = load_backend(folders[1], "builtin")
    from specdec_cuda.proposers.draft_model import DraftModelProposer

    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="draft_context"):
            DraftModelProposer(draft, draft_context=bad)
