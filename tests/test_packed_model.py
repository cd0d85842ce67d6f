"""The built-in model on the packed CPU path (models/llama.py: weights held once as panels, every
forward one decoder_layer op per layer): each row of a forward gets the bits of a one-row
forward, in float32 and bfloat16 models, whatever the width, the tree, the chunking of a prefill or
the number of threads; a bf16 model gives the float32 model's bits over the same bf16 weights; a
prompt's prefill (``prefill=True``) of bfloat16 panels on AMX rounds activations to bfloat16, and so
does every forward of a model set to ``activations="bfloat16"``."""

from __future__ import annotations

import pytest
import torch

from _models_testlib import VOCAB, ancestors_mask, make_hf_model, save_checkpoint

from specdec_cuda import models
from specdec_cuda.models.layers import PACKED_MAX_ROWS
from specdec_cuda.models.llama import TILE_PREFILL_MIN_ROWS
from specdec_cuda.ops.skinny_linear import (pack_weight, packed_bf16_tier, packed_kernel_available,
                                           skinny_linear_packed)

pytestmark = [pytest.mark.kernels,  # the compiled ops against their references (make cpu-only-check)
              pytest.mark.skipif(not packed_kernel_available(), reason="no AVX-512 or AVX2: models keep the torch path")]

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama_bias_tied"])
def bf16_folder(request, tmp_path_factory):
    """A tiny checkpoint saved in bf16 (so the float32 and bf16 models hold the same weights):
    qwen2 (biases, MQA, tied), qwen3 (q/k norms, untied), llama with every bias (tied)."""
    hf = make_hf_model(request.param).to(torch.bfloat16)
    return save_checkpoint(hf, tmp_path_factory.mktemp(request.param))


def prefill(model, prompt: torch.Tensor):
    cache = model.new_cache(prompt.shape[0], 160)
    model.forward(prompt, torch.arange(prompt.shape[1]).expand(prompt.shape), cache)
    cache.commit(torch.full((prompt.shape[0],), prompt.shape[1]))
    return cache


# set_activations("bfloat16") rounds every row's x for the tiles: AMX only.
ACTIVATIONS = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    packed_bf16_tier() != "amx", reason="no AMX: activations='bfloat16' needs bfloat16 tiles"))]


@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_row_of_a_chain_gets_the_bits_of_decoding_it_alone(bf16_folder, dtype, activations):
    model = models.load(bf16_folder, dtype=dtype, activations=activations)
    assert model.packed
    g = torch.Generator().manual_seed(1)
    prompt, chain = torch.randint(0, VOCAB, (1, 11), generator=g), torch.randint(0, VOCAB, (1, 9), generator=g)
    alone = []
    cache = prefill(model, prompt)
    for i in range(9):  # one token at a time, as autoregressive decoding runs
        out = model.forward(chain[:, i : i + 1], cache.lengths[:, None], cache, hidden_layers=(1, -1))
        alone.append((out.logits[0, 0], out.hidden_states[1][0, 0], out.hidden_states[-1][0, 0]))
        cache.commit(torch.tensor([1]))
    assert out.logits.dtype == torch.float32 and out.hidden_states[-1].dtype == dtype
    for M in range(1, 10):  # a verification of M - 1 drafts: M rows in one forward
        cache = prefill(model, prompt)
        out = model.forward(chain[:, :M], cache.lengths[:, None] + torch.arange(M), cache, hidden_layers=(1, -1))
        for i in range(M):
            logits, h1, h_final = alone[i]
            assert torch.equal(out.logits[0, i], logits), (M, i)
            assert torch.equal(out.hidden_states[1][0, i], h1) and torch.equal(out.hidden_states[-1][0, i], h_final)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_tree_node_gets_the_bits_of_its_path_as_a_chain(bf16_folder, dtype):
    model = models.load(bf16_folder, dtype=dtype)
    g = torch.Generator().manual_seed(2)
    prompt, nodes = torch.randint(0, VOCAB, (2, 13), generator=g), torch.randint(0, VOCAB, (2, 7), generator=g)
    parents = [-1, 0, 0, 1, 2, 2, 5]
    depth = torch.tensor([0, 1, 1, 2, 2, 2, 3])
    mask = ancestors_mask(parents).expand(2, 7, 7)
    cache = prefill(model, prompt)
    tree = model.forward(nodes, cache.lengths[:, None] + depth, cache, tree_mask=mask).logits
    path = [0, 2, 5, 6]
    cache = prefill(model, prompt)
    chain = model.forward(nodes[:, path], cache.lengths[:, None] + torch.arange(4), cache).logits
    assert torch.equal(chain, tree[:, path])


def test_a_bf16_model_gives_the_float32_models_bits(bf16_folder):
    f32, bf16 = models.load(bf16_folder), models.load(bf16_folder, dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and all(layer.panels["qkv"].panels.dtype == torch.bfloat16
                                                for m in (f32, bf16) for layer in m.layers)
    g = torch.Generator().manual_seed(3)
    prompt, step = torch.randint(0, VOCAB, (2, 20), generator=g), torch.randint(0, VOCAB, (2, 5), generator=g)
    results = []
    for m in (f32, bf16):
        cache = prefill(m, prompt)
        out = m.forward(step, cache.lengths[:, None] + torch.arange(5), cache)
        results.append((out.logits, cache.keys[2].clone()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("B", [1, 2])
def test_a_chunked_prefill_writes_the_kv_of_token_by_token_decoding(bf16_folder, B):
    # More than PACKED_MAX_ROWS rows run in chunks of new tokens: the same K/V and logits as one
    # token at a time (each row's arithmetic is independent of the others).
    model = models.load(bf16_folder)
    n = PACKED_MAX_ROWS // B + 37
    tokens = torch.randint(0, VOCAB, (B, n), generator=torch.Generator().manual_seed(4))
    whole = model.new_cache(B, 160)
    logits = model.forward(tokens, torch.arange(n).expand(B, n), whole, hidden_layers=(0,))
    single = model.new_cache(B, 160)
    for i in range(n):
        out = model.forward(tokens[:, i : i + 1], torch.full((B, 1), i), single, hidden_layers=(0,))
        single.commit(torch.ones(B, dtype=torch.long))
        assert torch.equal(out.logits[:, 0], logits.logits[:, i]), i
        assert torch.equal(out.hidden_states[0][:, 0], logits.hidden_states[0][:, i]), i
    for layer in range(model.num_layers):
        assert torch.equal(whole.keys[layer][:, :, :n], single.keys[layer][:, :, :n])
        assert torch.equal(whole.values[layer][:, :, :n], single.values[layer][:, :, :n])
    at = model.forward(tokens, torch.arange(n).expand(B, n), model.new_cache(B, 160),
                       logits_at=torch.full((B,), n - 1)).logits
    assert torch.equal(at[:, 0], logits.logits[:, -1])


def test_one_or_two_threads_give_the_same_bits(tmp_path):
    # Projections and the LM head split their output panels over threads (4 panels a chunk, so
    # gate|up's 20 and the head's 11 split), attention its (row, head) items: each output is
    # computed whole by one thread, in one order.
    hf = make_hf_model("qwen3", seed=5, intermediate_size=640, vocab_size=700).to(torch.bfloat16)
    model = models.load(save_checkpoint(hf, tmp_path), dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    prompt, step = torch.randint(0, 700, (2, 120), generator=g), torch.randint(0, 700, (2, 5), generator=g)
    x, w = torch.randn(7, 256, generator=g), torch.randn(1000, 256, generator=g).bfloat16()
    threads = torch.get_num_threads()
    results = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            cache = prefill(model, prompt)
            out = model.forward(step, cache.lengths[:, None] + torch.arange(5), cache).logits
            results.append((out, cache.keys[1].clone(), skinny_linear_packed(x, pack_weight(w))))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_a_tied_embedding_is_read_from_the_head_panels():
    hf = make_hf_model("qwen2", seed=6)  # tied, float32 values (float32 panels)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        model = models.load(save_checkpoint(hf, Path(tmp)))
    assert model.lm_head is None and model.embed_tokens.weight.is_meta
    tokens = torch.tensor([[0, 5, VOCAB - 1], [64, 63, 100]])
    assert torch.equal(model.embed(tokens), hf.model.embed_tokens.weight.detach()[tokens])
    assert torch.equal(model.embedding_weight(), hf.model.embed_tokens.weight.detach())
    with pytest.raises(IndexError, match="vocabulary"):
        model.embed(torch.tensor([[VOCAB]]))


@pytest.mark.skipif(packed_bf16_tier() != "amx", reason="no AMX: bfloat16 panels prefill like they decode")
def test_a_prefill_rounds_activations_to_bf16_on_amx_and_stays_batch_invariant(bf16_folder):
    # forward(prefill=True) of bf16 panels on the AMX tier: x rounded to bfloat16 (one tile product
    # per weight, not the exact split's three), rows still independent of each other; short prompts
    # and fast_prefill = False keep the decoding bits.
    bf16, f32 = models.load(bf16_folder, dtype=torch.bfloat16), models.load(bf16_folder)
    n = TILE_PREFILL_MIN_ROWS + 5
    tokens = torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(6))

    def logits(model, t, prefill):
        return model.forward(t, torch.arange(t.shape[1]).expand(t.shape), model.new_cache(t.shape[0], 160),
                             prefill=prefill).logits

    exact, fast = logits(bf16, tokens, False), logits(bf16, tokens, True)
    assert not torch.equal(exact, fast)
    assert ((fast - exact).abs().max() / exact.abs().max()).item() < 2e-2  # bf16 rounding of activations
    assert torch.equal(torch.cat([logits(bf16, tokens[b:b + 1], True) for b in range(2)]), fast)
    assert torch.equal(logits(f32, tokens, True), fast)  # the float32 model packs these bf16 weights alike
    short = tokens[:1, : TILE_PREFILL_MIN_ROWS - 1]
    assert torch.equal(logits(bf16, short, True), logits(bf16, short, False))
    bf16.fast_prefill = False
    assert torch.equal(logits(bf16, tokens, True), exact)


@pytest.mark.skipif(packed_bf16_tier() != "amx", reason="no AMX: activations='bfloat16' needs bfloat16 tiles")
def test_bfloat16_activations_round_every_row_and_speculation_stays_lossless(bf16_folder):
    # set_activations("bfloat16"): a one-row step takes x rounded to bfloat16 as a prompt's prefill
    # does (not the exact split's bits), and speculation under it emits its own autoregressive tokens.
    import specdec_cuda

    exact, rounded = (models.load(bf16_folder, dtype=torch.bfloat16, activations=a) for a in ("float32", "bfloat16"))
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(8))
    steps = [model.forward(tokens[:, :1], torch.zeros(1, 1, dtype=torch.long), model.new_cache(1, 16)).logits
             for model in (exact, rounded)]
    assert not torch.equal(*steps)
    assert ((steps[1] - steps[0]).abs().max() / steps[0].abs().max()).item() < 2e-2
    prompts = [torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(9)).tolist() * 5]
    expected = specdec_cuda.generate(rounded, prompts, method="autoregressive", max_new_tokens=16).tokens
    assert specdec_cuda.generate(rounded, prompts, method="prompt_lookup", max_new_tokens=16).tokens == expected


def test_bfloat16_activations_are_refused_where_no_tiles_take_them(bf16_folder):
    model = models.load(bf16_folder, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'float32' or 'bfloat16'"):
        model.set_activations("fp8")
    model.packed_linear = False  # the torch path: no panels
    with pytest.raises(ValueError, match="AMX tiles"):
        model.set_activations("bfloat16")
    assert model.activations == "float32"
    with pytest.raises(ValueError, match="gguf_activations"):
        models.load(bf16_folder, weights="gguf", activations="bfloat16")


def test_greedy_speculation_with_a_long_prompt_equals_autoregressive_decoding(bf16_folder):
    # Where the prompt prefills with rounded activations (AMX), verification still runs the exact
    # split: prompt lookup emits autoregressive decoding's tokens.
    import specdec_cuda

    model = models.load(bf16_folder, dtype=torch.bfloat16)
    base = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(7)).tolist()
    prompts = [base * 6]
    expected = specdec_cuda.generate(model, prompts, method="autoregressive", max_new_tokens=16).tokens
    assert specdec_cuda.generate(model, prompts, method="prompt_lookup", max_new_tokens=16).tokens == expected
