"""A masked-diffusion LM adapted from a causal LM (Dream's recipe): ``from_causal_lm`` and the
``shifted_logits`` model (the hidden state at i predicts the token at i + 1).

What must hold: the adapted model is the causal LM when attention is made causal again (every
weight copied, the shift kept); ``forward`` returns logits aligned with positions in full and cached
forwards (the generator's prefix / dual cache feed the position before the block); position 0 is
never masked in training; checkpoints keep the flag and old ones load without it; the zoo spec that
adapts a target trains, saves beside the pair and generates.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

import specdec_cuda.models.diffusion_lm as diffusion_lm
from specdec_cuda.decoding import SamplingParams
from specdec_cuda.diffusion_generate import DiffusionGenerator
from specdec_cuda.models.config import UnsupportedModelError
from specdec_cuda.models.diffusion_lm import from_causal_lm, load_diffusion
from zoo.diffusion import masked_diffusion_loss
from test_diffusion import reference_generate, tiny_model


def shifted_model(seed=0, dtype=torch.float32):
    model = tiny_model(seed=seed, dtype=dtype)
    model.config = dataclasses.replace(model.config, shifted_logits=True)
    return model


def tiny_causal_lm(folder, vocab=53, tie=False, **extra):
    """A random Llama checkpoint folder written by transformers (the format of the zoo target)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=0, bos_token_id=0, tie_word_embeddings=tie, **extra)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 so that a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return model


# ---- from_causal_lm -------------------------------------------------------------------------------------

@pytest.mark.parametrize("tie", [False, True])
def test_from_causal_lm_is_the_causal_lm_under_a_causal_mask(tmp_path, monkeypatch, tie):
    ar = tiny_causal_lm(tmp_path / "ar", tie=tie)
    model = from_causal_lm(tmp_path / "ar")
    c = model.config
    assert c.shifted_logits and c.vocab_size == 54 and c.mask_token_id == 53 and c.eos_token_id == 0
    embed = ar.model.embed_tokens.weight
    torch.testing.assert_close(model.embed_tokens.weight[:53], embed)
    torch.testing.assert_close(model.embed_tokens.weight[53], embed.mean(0))
    assert bool((model.lm_head.weight[53] == 0).all())
    tokens = torch.randint(0, 53, (2, 11))
    with torch.no_grad():
        expected = ar(input_ids=tokens).logits  # [2, 11, 53]: position i predicts i + 1
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(diffusion_lm.F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, enable_gqa=False: sdpa(q, k, v, is_causal=True, enable_gqa=enable_gqa))
    with torch.no_grad():
        logits = model(tokens).logits  # [2, 11, 54], aligned: position j predicted from j - 1
    torch.testing.assert_close(logits[:, 1:, :53], expected[:, :-1], rtol=1e-5, atol=1e-5)
    assert bool((logits[:, 0] == -math.inf).all()) and bool((logits[..., 53] == -math.inf).all())


def test_from_causal_lm_errors(tmp_path):
    tiny_causal_lm(tmp_path / "ar")
    with pytest.raises(ValueError, match="mask_token_id 7 must be the causal LM's vocabulary size 53"):
        from_causal_lm(tmp_path / "ar", mask_token_id=7)
    tiny_causal_lm(tmp_path / "biased", attention_bias=True)
    with pytest.raises(UnsupportedModelError, match="attention / MLP biases"):
        from_causal_lm(tmp_path / "biased")
    with pytest.raises(FileNotFoundError):
        from_causal_lm(tmp_path / "nothing")


# ---- the shifted forward ----------------------------------------------------------------------------------

def test_shifted_logits_are_aligned_with_positions():
    plain = tiny_model(seed=5)
    shifted = shifted_model(seed=5)
    x = torch.tensor([[3, 4, 40, 40, 6, 40]])
    a, b = plain(x).logits, shifted(x).logits
    torch.testing.assert_close(b[:, 1:], a[:, :-1])  # same weights: position j read from hidden j - 1
    assert bool((b[:, 0] == -math.inf).all())
    assert shifted(x[:, :1]).logits.shape == (1, 1, 41)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_shifted_cached_block_logits_equal_full_forward(mode):
    """The generator's cached forwards, on K/V from the same sequence, give the full forward's logits
    of the block (the position before the block is fed too, so the block's first position has a
    prediction); left padding included."""
    model = shifted_model(seed=6, dtype=torch.float64)
    mask = model.mask_token_id
    x = torch.randint(0, 40, (2, 20))
    x[:, 10:] = mask
    x[0, 12] = 17  # an unmasked position inside the block
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[1, :3] = False
    positions = (torch.arange(20)[None] - torch.tensor([[0], [3]])).clamp(min=0)
    full = model(x, positions, valid).logits
    gen = DiffusionGenerator(model, gen_length=12, block_length=4, use_cache=mode)
    for start in (8, 12):  # the first block (after the prompt) and a later one
        end, state = start + 4, {}
        first, was_full = gen._block_logits(x, positions, valid, start, end, True, state)
        cached, was_cached_full = gen._block_logits(x, positions, valid, start, end, False, state)
        assert was_full and not was_cached_full
        torch.testing.assert_close(first, full[:, start:end])
        torch.testing.assert_close(cached, full[:, start:end])
        assert bool(torch.isfinite(cached[..., :mask]).all()), "every block position has a prediction"


def test_shifted_generator_matches_reference_loop_and_cache_with_one_step_per_block():
    model = shifted_model(seed=7)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    params = SamplingParams.make(2, temperature=0.8, seed=[3, 4])
    out = DiffusionGenerator(model, gen_length=16, block_length=8, steps=4).generate(prompts, params, max_new_tokens=16)
    for b, p in enumerate(prompts):
        assert out.tokens[b] == reference_generate(model, p, 16, 8, 4, (0.8, 0, 1.0, 3 + b))
    # one step per block: only full forwards, so the cache changes nothing
    exact = DiffusionGenerator(model, gen_length=16, block_length=4, steps=1).generate([[5, 6], [1, 2, 3]], max_new_tokens=16)
    for mode in ("prefix", "dual"):
        cached = DiffusionGenerator(model, gen_length=16, block_length=4, steps=1, use_cache=mode)
        assert cached.generate([[5, 6], [1, 2, 3]], max_new_tokens=16).tokens == exact.tokens
        runs = DiffusionGenerator(model, gen_length=16, block_length=4, threshold=0.2, use_cache=mode)
        res = runs.generate([[5, 6], [1, 2, 3]], max_new_tokens=16)
        assert all(len(t) == 16 and all(0 <= v < 40 for v in t) for t in res.tokens)


def test_shifted_training_never_masks_position_zero():
    model = shifted_model(seed=8)
    seen = []

    class Recorder(torch.nn.Module):
        config, mask_token_id = model.config, model.mask_token_id

        def forward(self, inputs):
            seen.append(inputs.clone())
            return model(inputs)

    gen = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, 40, (64, 12))
    loss = masked_diffusion_loss(Recorder(), x0, gen, prefix_fraction=0.5)
    inputs = seen[0]
    assert math.isfinite(float(loss))
    assert not bool((inputs[:, 0] == model.mask_token_id).any())
    assert bool((inputs[:, 1:] == model.mask_token_id).any())


def test_save_load_keeps_the_flag_and_old_configs_load_unshifted(tmp_path):
    model = shifted_model(seed=9)
    model.save(tmp_path / "s")
    assert json.loads((tmp_path / "s" / "config.json").read_text())["shifted_logits"] is True
    loaded = load_diffusion(tmp_path / "s")
    x = torch.randint(0, 40, (1, 7))
    assert loaded.config.shifted_logits
    torch.testing.assert_close(loaded(x).logits, model(x).logits)
    old = tiny_model(seed=9)
    old.save(tmp_path / "old")
    raw = json.loads((tmp_path / "old" / "config.json").read_text())
    del raw["shifted_logits"]  # a checkpoint written before the field existed
    (tmp_path / "old" / "config.json").write_text(json.dumps(raw))
    assert not load_diffusion(tmp_path / "old").config.shifted_logits


# ---- the zoo spec that adapts a target ----------------------------------------------------------------------

def test_zoo_adapted_spec_trains_beside_the_pair(tmp_path, monkeypatch):
    from zoo import pairs
    from zoo import diffusion as zoo_diffusion
    from specdec_cuda.diffusion_generate import make_diffusion

    texts = pairs.stdlib_corpus()
    texts = [t[:4000] for t in texts[:20]]
    tokenizer = pairs.train_tokenizer(texts, 300)
    target = tmp_path / "mypair" / "target"
    tiny_causal_lm(target, vocab=len(tokenizer))
    tokenizer.save_pretrained(target)
    monkeypatch.setattr(pairs, "stdlib_corpus", lambda heldout_modulo=None: texts)
    tiny = dataclasses.replace(zoo_diffusion.DEFAULT_SPEC, seq_len=32, batch_size=4, steps=6, lr=1e-3,
                               eval_tokens=512)
    monkeypatch.setitem(zoo_diffusion.SPECS, "default", tiny)
    assert zoo_diffusion.main(["--target", str(target)]) == 0
    folder = tmp_path / "mypair-diffusion-ar"
    report = json.loads((folder / "report.json").read_text())
    assert report["init_from"] == str(target.resolve()) and report["spec"]["init"] == "target"
    assert math.isfinite(report["eval_loss_bound"]) and math.isfinite(report["ar_eval_nll"])
    model = load_diffusion(folder)
    assert model.config.shifted_logits and model.mask_token_id == len(tokenizer)
    prompt = tokenizer("def main(")["input_ids"]
    out = make_diffusion(str(folder), gen_length=16, block_length=8, threshold=0.9, use_cache="dual").generate(
        [prompt], max_new_tokens=16, eos_token_id=model.config.eos_token_id)
    assert 1 <= len(out.tokens[0]) <= 16
    with pytest.raises(SystemExit):  # --target with the from-scratch spec
        zoo_diffusion.main(["--zoo", "scratch", "--target", str(target)])
