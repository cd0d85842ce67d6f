"""``method="layer_skip"``: the target drafting through a subset of its own layers.

The conformance suite runs the method (greedy identity, chi-square, EOS, budgets, batch
independence); here: the calibration's choice on a model with a layer that does nothing, the
early exit, the cost model, a GGUF target, and bad options.
"""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from decoding_models import make_checkpoint
from specdec_cuda import models
from specdec_cuda.proposers.layer_skip import (LayerSkipProposer, block_influence, candidate_paths, choose_layers,
                                               estimated_speedup, layer_cost_shares)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("layer_skip") / "target", vocab=64, hidden=32, layers=4, seed=2)


def _prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 64, (n,), generator=g).tolist() for n in (9, 17, 4)]


def _idle_layer(model, index: int) -> None:
    """Zero layer ``index``'s attention output and MLP down projections: its output is its input."""
    model.unpack()
    with torch.no_grad():
        model.layers[index].self_attn.o_proj.weight.zero_()
        model.layers[index].mlp.down_proj.weight.zero_()


def test_calibration_skips_a_layer_that_does_nothing_and_its_drafts_are_all_accepted(folder):
    model = models.load(folder, dtype=torch.float64)
    _idle_layer(model, 2)
    tokens = torch.tensor([_prompts()[1]])
    influence, _ = block_influence(model, tokens)
    assert influence[2] < 1e-12 < float(influence[[0, 1, 3]].min())
    assert candidate_paths(influence)[0] == ("skip 1 least influential", (0, 1, 3))
    chosen, measured = choose_layers(model, tokens, k=4)
    skip_one = next(c for c in measured if c.layers == (0, 1, 3))
    assert skip_one.agreement == 1.0 and chosen.speedup >= skip_one.speedup
    # With layer 2 out the draft is the target: every drafted token is accepted.
    out = specdec_cuda.generate(model, _prompts(), method="layer_skip", max_new_tokens=16, k=4, skip=[2],
                                policy="fixed")
    ar = specdec_cuda.generate(model, _prompts(), method="autoregressive", max_new_tokens=16)
    assert out.tokens == ar.tokens and out.metrics.acceptance_rate == 1.0


def test_the_calibrated_choice_is_kept_and_decodes_exactly(folder):
    from specdec_cuda.decoding import SamplingParams, decode

    model = models.load(folder, dtype=torch.float64)
    proposer = LayerSkipProposer(model, k=3)
    ar = specdec_cuda.generate(model, _prompts(), method="autoregressive", max_new_tokens=20)
    params = SamplingParams.make(3, 0.0, 0, 1.0, 0, model.device)
    first = decode(model, _prompts(), params, 20, proposer=proposer)
    chosen = proposer.layers
    assert first.tokens == ar.tokens and proposer.choice is not None and len(proposer.candidates) >= 2
    assert chosen == proposer.choice.layers and len(chosen) < model.num_layers
    second = decode(model, _prompts()[::-1], params, 20, proposer=proposer)  # another first prompt: same choice
    assert proposer.layers == chosen and second.tokens == ar.tokens[::-1]


def test_early_exit_runs_the_first_layers(folder):
    model = models.load(folder, dtype=torch.float64)
    proposer = LayerSkipProposer(model, exit_layer=2)
    assert proposer.layers == (0, 1)
    assert LayerSkipProposer(model, exit_layer=0).layers == ()  # the head over the embeddings
    out = specdec_cuda.generate(model, _prompts(), method="layer_skip", max_new_tokens=20, exit_layer=2,
                                temperature=0.8, seed=5, policy="fixed")
    again = specdec_cuda.generate(model, _prompts(), method="layer_skip", max_new_tokens=20, exit_layer=2,
                                  temperature=0.8, seed=5, policy="fixed")
    assert out.tokens == again.tokens and all(len(t) == 20 for t in out.tokens)


def test_draft_vocabulary_is_lossless_and_priced_by_the_calibration(folder):
    model = models.load(folder, dtype=torch.float64)
    ar = specdec_cuda.generate(model, _prompts(), method="autoregressive", max_new_tokens=16)
    out = specdec_cuda.generate(model, _prompts(), method="layer_skip", max_new_tokens=16, k=3, skip=[2],
                                policy="fixed", draft_vocab=16)
    assert out.tokens == ar.tokens
    tokens = torch.tensor([_prompts()[1]])
    _, whole = choose_layers(model, tokens, k=3)
    _, part = choose_layers(model, tokens, k=3, vocab=model.vocab_subset(16))
    assert [c.layers for c in whole] == [c.layers for c in part]
    assert all(p.cost < w.cost for w, p in zip(whole, part))
    # With every id in the subset the draft is the same as without one.
    _, every = choose_layers(model, tokens, k=3, vocab=model.vocab_subset(model.vocab_size))
    assert [c.agreement for c in every] == [c.agreement for c in whole]
    with pytest.raises(ValueError, match="draft vocabulary"):
        LayerSkipProposer(model, draft_vocab=0)


def test_cost_model():
    assert estimated_speedup(0.0, 0.5, 4) == pytest.approx(1 / 3)
    assert estimated_speedup(1.0, 0.5, 4) == pytest.approx(5 / 3)
    assert estimated_speedup(0.5, 0.5, 2) == pytest.approx(1.75 / 2)

    class Config:  # Qwen2.5-1.5B's shape: the tied head is about a sixth of the weight bytes
        num_attention_heads, num_key_value_heads, head_dim = 12, 2, 128
        hidden_size, intermediate_size, vocab_size, num_hidden_layers = 1536, 8960, 151936, 28

    class Model:
        config = Config

    layer, head = layer_cost_shares(Model)
    assert 28 * layer + head == pytest.approx(1.0)
    assert 0.14 < head < 0.16 and 18 * layer + head == pytest.approx(0.70, abs=0.01)


def test_bad_options(folder):
    model = models.load(folder)
    with pytest.raises(ValueError, match="not both"):
        LayerSkipProposer(model, skip=[1], exit_layer=2)
    for bad in ([], [4], [-1]):
        with pytest.raises(ValueError, match="skip must name"):
            LayerSkipProposer(model, skip=bad)
    for bad in (4, -1, True, 1.5):
        with pytest.raises(ValueError, match="exit_layer"):
            LayerSkipProposer(model, exit_layer=bad)
    with pytest.raises(ValueError, match="k must be"):
        LayerSkipProposer(model, k=0)
    with pytest.raises(TypeError, match="built-in model"):
        LayerSkipProposer(models.HFCausalLM(_hf(folder)))


def _hf(folder):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder).eval()
