"""QuantSpec: the hierarchical int4 KV cache behind the model protocol (``models.QuantKVCache`` /
``QuantKVModel``) and the ``quantspec`` method on top of it. The conformance suite runs the method
through greedy equality and chi-square; here: the cache's semantics and the method's wiring."""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from decoding_models import make_checkpoint
from specdec_cuda import models
from specdec_cuda.models import QuantKVCache, QuantKVModel
from specdec_cuda.models.quant_cache import DraftLinears, quantized_forward
from specdec_cuda.proposers.quantspec import QuantSpecProposer


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("quantspec") / "m", vocab=64, hidden=64, layers=2, heads=4,
                             kv_heads=2, seed=0)
    return models.load(folder, dtype=torch.float64)


def step_logits(target, tokens, chunks):
    """Logits of ``tokens`` [1, T] fed in chunks of the given sizes (committing each)."""
    cache = target.new_cache(1, tokens.shape[1] + 4)
    out, at = [], 0
    for n in chunks:
        logits = target.forward(tokens[:, at : at + n], torch.arange(at, at + n)[None], cache).logits
        cache.commit(torch.tensor([n]))
        out.append(logits)
        at += n
    return torch.cat(out, 1)


def test_short_context_equals_the_plain_model(model):
    # Nothing is read from the codes yet (every token within `residual` of the query): the kernel
    # over the float32 buffer gives the plain model's logits up to float32 attention.
    tokens = torch.randint(64, (1, 20), generator=torch.Generator().manual_seed(0))
    target = QuantKVModel(model, key_group=8, residual=32)
    torch.testing.assert_close(step_logits(target, tokens, [20]), step_logits(model, tokens, [20]),
                               rtol=1e-4, atol=1e-4)


def test_a_token_is_read_the_same_way_in_one_forward_or_token_by_token(model):
    # quant_len depends on the query's position only, so a prefill of 60 tokens and 60 one-token
    # steps read every token from the same place (codes or buffer) and agree to rounding.
    tokens = torch.randint(64, (1, 60), generator=torch.Generator().manual_seed(1))
    target = QuantKVModel(model, key_group=8, residual=8)
    whole = step_logits(target, tokens, [60])
    one_by_one = step_logits(target, tokens, [1] * 60)
    mixed = step_logits(target, tokens, [13, 5, 1, 9, 20, 12])
    torch.testing.assert_close(whole, one_by_one, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(whole, mixed, rtol=1e-9, atol=1e-9)
    # ... and the codes are really read: the plain model differs, by about int8 noise.
    plain = step_logits(model, tokens, [60])
    err = (whole - plain).abs().max()
    assert 0 < err < 0.05 * plain.abs().max()


def test_upper_only_draft_pass_is_close_but_not_equal(model):
    tokens = torch.randint(64, (1, 48), generator=torch.Generator().manual_seed(2))
    target = QuantKVModel(model, key_group=8, residual=8)
    full_cache, draft_cache = target.new_cache(1, 64), target.new_cache(1, 64)
    pos = torch.arange(48)[None]
    full = quantized_forward(model, tokens, pos, full_cache).logits
    linears = DraftLinears.quantize(model, mlp=True, group_size=32)
    assert linears.count() == 2 * 2
    draft = quantized_forward(model, tokens, pos, draft_cache, use_lower=False, linears=linears).logits
    assert not torch.allclose(full, draft)
    # Same argmax most of the time: the draft pass is a good approximation of the target.
    assert (full.argmax(-1) == draft.argmax(-1)).float().mean() > 0.7


def test_rollback_touches_only_the_buffer(model):
    tokens = torch.randint(64, (1, 50), generator=torch.Generator().manual_seed(3))
    target = QuantKVModel(model, key_group=8, residual=8)
    cache = target.new_cache(1, 64)
    target.forward(tokens[:, :40], torch.arange(40)[None], cache)
    cache.commit(torch.tensor([40]))
    codes = {k: v.clone() for k, v in cache.quantized[0].items()}
    for j in range(6):  # a draft pass: commit garbage, then roll back
        target.forward(torch.tensor([[7 + j]]), torch.tensor([[40 + j]]), cache)
        cache.commit(torch.tensor([1]))
    cache.truncate(torch.tensor([40]))
    valid = cache._valid[0]
    for k, v in cache.quantized[0].items():
        rows = valid if k in ("k_upper", "k_lower", "v_upper", "v_lower", "v_scale", "v_zero") else valid // 8
        assert torch.equal(v[:, :, :rows], codes[k][:, :, :rows]), k
    rest = target.forward(tokens[:, 40:], torch.arange(40, 50)[None], cache).logits
    torch.testing.assert_close(rest, step_logits(target, tokens, [40, 10])[:, 40:], rtol=1e-9, atol=1e-9)


def test_rollback_past_the_residual_is_an_error(model):
    target = QuantKVModel(model, key_group=4, residual=4)
    cache = target.new_cache(1, 64)
    target.forward(torch.zeros(1, 40, dtype=torch.int64), torch.arange(40)[None], cache)
    cache.commit(torch.tensor([40]))
    with pytest.raises(ValueError, match="residual"):
        cache.truncate(torch.tensor([20]))
    cache.truncate(torch.tensor([36]))  # within the residual: fine


def test_tree_commit_keeps_the_chosen_nodes(model):
    tokens = torch.randint(64, (1, 30), generator=torch.Generator().manual_seed(4))
    target = QuantKVModel(model, key_group=4, residual=8)
    cache = target.new_cache(1, 64)
    target.forward(tokens[:, :24], torch.arange(24)[None], cache)
    cache.commit(torch.tensor([24]))
    # Tree: node 0 = tokens[24]; nodes 1, 2 children of 0 (node 2 = tokens[25]); node 3 = tokens[26] under 2.
    tree_tokens = torch.tensor([[tokens[0, 24], 5, tokens[0, 25], tokens[0, 26]]])
    mask = torch.tensor([[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]], dtype=torch.bool)
    positions = torch.tensor([[24, 25, 25, 26]])
    tree = target.forward(tree_tokens, positions, cache, tree_mask=mask).logits
    cache.commit(torch.tensor([3]), torch.tensor([[0, 2, 3]]))
    rest = target.forward(tokens[:, 27:], torch.arange(27, 30)[None], cache).logits
    chain = step_logits(target, tokens, [24, 6])
    torch.testing.assert_close(tree[:, [0, 2, 3]], chain[:, 24:27], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(rest, chain[:, 27:], rtol=1e-9, atol=1e-9)


def test_the_builtin_forward_dispatches_to_the_quantised_cache(model):
    tokens = torch.randint(64, (2, 12), generator=torch.Generator().manual_seed(5))
    cache = QuantKVCache(2, 2, 2, 16, 16, key_group=4, residual=4)
    out = model.forward(tokens, torch.arange(12).expand(2, 12), cache).logits
    ref = QuantKVModel(model, key_group=4, residual=4)
    ref_cache = ref.new_cache(2, 16)
    torch.testing.assert_close(out, ref.forward(tokens, torch.arange(12).expand(2, 12), ref_cache).logits)


def test_memory_per_token():
    cache = QuantKVCache(1, 1, 1, 64, 128, key_group=64, value_group=32, residual=32)
    # upper + lower codes (128 B for K and V), key scale / zero per 64 tokens, value per 32 channels
    assert cache.kv_bytes_per_token() == 128 + 8 * 128 / 64 + 8 * 4
    assert cache.kv_bytes_per_token() / (2 * 4 * 128) < 0.2  # vs a float32 cache


def test_greedy_equals_autoregressive_on_the_quantised_cache_over_many_groups(model):
    target = QuantKVModel(model, key_group=8, residual=6)
    prompts = [[1, 2, 3, 4, 5], [9] * 17, [3, 8]]
    ar = specdec_cuda.generate(target, prompts, max_new_tokens=70).tokens
    for k in (1, 3, 6):
        for draft_attention in (True, False):
            out = specdec_cuda.generate(target, prompts, method="quantspec", k=k, group_size=32, max_new_tokens=70,
                                        policy="fixed", draft_attention=draft_attention)
            assert out.tokens == ar
        # 4-bit MLPs alone keep this tiny random model's drafts mostly right (4-bit attention
        # projections of width 64 too cost it more; the zoo target's acceptance is the measure).
        assert out.metrics.acceptance_rate > 0.3


def test_greedy_equals_autoregressive_in_float32_with_every_draft_option(tmp_path):
    # float32 on the CPU: the forward's linears go through skinny_linear and its attention through
    # the quantised-attention kernel, both batch-invariant, so a 5-token verification gives each
    # token the bits autoregressive decoding gives it: equality holds exactly, not up to near-ties.
    folder = make_checkpoint(tmp_path / "m32", vocab=64, hidden=64, layers=2, heads=4, kv_heads=2, seed=1)
    target = QuantKVModel(models.load(folder, dtype=torch.float32), key_group=8, residual=6)
    prompts = [[1, 2, 3, 4, 5], [9] * 17, [3, 8]]
    ar = specdec_cuda.generate(target, prompts, max_new_tokens=60).tokens
    for options in (dict(), dict(draft_attention=True), dict(draft_lm_head=True)):
        out = specdec_cuda.generate(target, prompts, method="quantspec", k=4, group_size=32, max_new_tokens=60,
                                    policy="fixed", **options)
        assert out.tokens == ar, options


def test_draft_linears_by_option(model):
    target = QuantKVModel(model, key_group=4, residual=8)
    layers = model.num_layers
    assert QuantSpecProposer(target, k=2, group_size=32).linears.count() == 2 * layers  # the default: the MLPs
    assert QuantSpecProposer(target, k=2, group_size=32, draft_attention=True).linears.count() == 4 * layers
    with_head = QuantSpecProposer(target, k=2, group_size=32, draft_lm_head=True).linears
    assert with_head.count() == 2 * layers + 1 and with_head.lm_head is not None


def test_method_wiring_errors(model):
    with pytest.raises(TypeError, match="QuantKVModel"):
        specdec_cuda.generate(model, [[1, 2]], method="quantspec", max_new_tokens=4)
    with pytest.raises(ValueError, match="residual"):
        QuantSpecProposer(QuantKVModel(model, key_group=4, residual=2), k=3)
    with pytest.raises(TypeError, match="LlamaModel"):
        QuantKVModel(object())
