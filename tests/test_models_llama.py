"""The built-in Llama/Qwen model against transformers on tiny random checkpoints of each family."""

from __future__ import annotations

import json

import pytest
import torch

from _models_testlib import FAMILIES, VOCAB, ancestors_mask, make_hf_model, save_checkpoint

from specdec_cuda import models
from specdec_cuda.models import CausalLM, KVCache, LlamaModel, StaticKVCache
from specdec_cuda.ops.skinny_linear import packed_kernel_available

# fp32 logits of the built-in model and transformers differ only by summation order (fused q|k|v
# and gate|up matmuls, SDPA over a static cache); observed differences are 0 to ~1e-6 on logits
# of magnitude ~5.
FP32_TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_pair(request, tmp_path_factory):
    """(family, transformers model, built-in model loaded from its saved folder)."""
    family = request.param
    hf = make_hf_model(family)
    folder = save_checkpoint(hf, tmp_path_factory.mktemp(family))
    return family, hf, models.load(folder), folder


def hf_logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=tokens).logits


def test_prefill_matches_transformers(family_pair):
    _, hf, model, _ = family_pair
    tokens = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(3, 64)
    out = model.forward(tokens, torch.arange(40).expand(3, 40), cache)
    torch.testing.assert_close(out.logits, hf_logits(hf, tokens), **FP32_TOL)


def test_incremental_decode_matches_transformers(family_pair):
    # Prefill, single-token steps, then a chunk: positions reach past the Llama 3 scaling's
    # original context (32) so the scaled frequencies matter.
    _, hf, model, _ = family_pair
    B, T = 2, 60
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(2))
    ref = hf_logits(hf, tokens)
    cache = model.new_cache(B, T)
    pieces, start = [], 0
    for n in [20] + [1] * 8 + [5, 27]:
        chunk = tokens[:, start : start + n]
        out = model.forward(chunk, torch.arange(start, start + n).expand(B, n), cache)
        cache.commit(torch.full((B,), n))
        pieces.append(out.logits)
        start += n
    assert start == T
    torch.testing.assert_close(torch.cat(pieces, 1), ref, **FP32_TOL)
    assert cache.lengths.tolist() == [T, T]


def test_hidden_states_match_transformers(family_pair):
    _, hf, model, _ = family_pair
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    L = model.num_layers
    out = model.forward(tokens, torch.arange(12).expand(2, 12), model.new_cache(2, 16), hidden_layers=(0, L - 1, -1))
    with torch.no_grad():
        # [embeddings, layer 0, ..., layer L-2, final normed]
        ref = hf(input_ids=tokens, output_hidden_states=True).hidden_states
    assert set(out.hidden_states) == {0, L - 1, -1}
    assert out.hidden_states[0].shape == (2, 12, model.hidden_size)
    torch.testing.assert_close(out.hidden_states[0], ref[1], **FP32_TOL)
    torch.testing.assert_close(out.hidden_states[-1], ref[-1], **FP32_TOL)
    # The last decoder layer's raw output, normed, is the final hidden state.
    torch.testing.assert_close(model.norm(out.hidden_states[L - 1]), out.hidden_states[-1])


def test_protocol_and_attributes(family_pair):
    family, hf, model, _ = family_pair
    assert isinstance(model, LlamaModel) and isinstance(model, CausalLM)
    cache = model.new_cache(2, 8)
    assert isinstance(cache, StaticKVCache) and isinstance(cache, KVCache)
    assert model.vocab_size == VOCAB and model.num_layers == hf.config.num_hidden_layers
    assert model.hidden_size == hf.config.hidden_size
    assert model.dtype == torch.float32 and model.device == torch.device("cpu")
    assert model.config.family == {"llama3": "llama", "llama_bias_tied": "llama"}.get(family, family)
    # Cache layout [B, H_kv, T_max, D] per layer.
    c = model.config
    assert cache.keys[0].shape == (2, c.num_key_value_heads, 8, c.head_dim)
    assert cache.keys[0].is_contiguous()
    assert (model.lm_head is None) == bool(hf.config.tie_word_embeddings)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-4), (torch.bfloat16, 0.1), (torch.float16, 0.02)])
def test_other_dtypes_track_fp32(family_pair, dtype, tol):
    # fp64 (used for exactness tests), bf16 and fp16 run and stay close to the fp32 logits. The
    # tolerance is relative to the logit scale (observed: bf16 <= 0.045, fp16 <= 0.007).
    _, hf, model, folder = family_pair
    other = models.load(folder, dtype=dtype)
    # A bf16 model on the packed CPU path computes in float32 over bf16 weights: float32 K/V and
    # logits (models/llama.py); elsewhere the model's dtype throughout.
    out_dtype = torch.float32 if other.packed else dtype
    assert other.dtype == dtype and other.new_cache(1, 4).kv.dtype == out_dtype
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(24).expand(2, 24)
    ref = model.forward(tokens, positions, model.new_cache(2, 24)).logits
    got = other.forward(tokens, positions, other.new_cache(2, 24)).logits
    assert got.dtype == out_dtype
    scale = ref.abs().max().item()
    assert (got.double() - ref.double()).abs().max().item() <= tol * scale


def test_sharded_checkpoint_loads_the_same(tmp_path):
    hf = make_hf_model("qwen3")
    folder = save_checkpoint(hf, tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = models.load(folder)
    tokens = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(5))
    out = model.forward(tokens, torch.arange(16)[None], model.new_cache(1, 16))
    torch.testing.assert_close(out.logits, hf_logits(hf, tokens), **FP32_TOL)


def test_bf16_checkpoint_is_cast_on_load(tmp_path):
    hf = make_hf_model("llama3")
    folder = save_checkpoint(hf.to(torch.bfloat16), tmp_path / "bf16")
    model = models.load(folder, dtype=torch.float32)
    assert model.dtype == torch.float32
    torch.testing.assert_close(
        model.dense_weight(0, "down"), hf.model.layers[0].mlp.down_proj.weight.float(), rtol=0, atol=0
    )
    if model.packed:  # the packed CPU path holds a bf16 checkpoint's values as bf16 panels
        assert model.layers[0].panels["down"].panels.dtype == torch.bfloat16


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.bfloat16, 0.1)])
def test_cuda_matches_cpu(family_pair, dtype, tol):
    # Prefill, a tree step with compaction and a decode step on the GPU track the CPU fp32 run.
    _, _, cpu_model, folder = family_pair
    gpu_model = models.load(folder, dtype=dtype, device="cuda")
    # Tree 0 <- 1 <- 3, 0 <- 2 (rows as a [4, 4] ancestor mask).
    tree_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    tree_mask = tree_mask[None].expand(2, 4, 4)
    prompt = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(6))
    tree = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(7))
    results = []
    for model, device in ((cpu_model, "cpu"), (gpu_model, "cuda")):
        cache = model.new_cache(2, 32)
        logits = [model.forward(prompt.to(device), torch.arange(12, device=device).expand(2, 12), cache).logits]
        cache.commit(torch.tensor([12, 10], device=device))
        positions = cache.lengths[:, None] + torch.tensor([0, 1, 1, 2], device=device)
        logits.append(model.forward(tree.to(device), positions, cache, tree_mask=tree_mask.to(device)).logits)
        cache.commit(torch.tensor([3, 2], device=device), torch.tensor([[0, 1, 3], [0, 2, -1]], device=device))
        logits.append(model.forward(tree[:, :1].to(device), cache.lengths[:, None], cache).logits)
        results.append([x.float().cpu() for x in logits])
    for ref, got in zip(*results):
        assert (got - ref).abs().max().item() <= tol * ref.abs().max().item()


def test_greedy_decoding_equals_transformers_generate(family_pair):
    # One forward + commit per token over the static cache gives hf.generate's greedy tokens.
    _, hf, model, _ = family_pair
    prompts = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(8))
    expected = hf.generate(
        prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=12, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )[:, 7:]
    cache = model.new_cache(2, 19)
    out = model.forward(prompts, torch.arange(7).expand(2, 7), cache)
    cache.commit(torch.tensor([7, 7]))
    tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(11):
        out = model.forward(tokens[-1], cache.lengths[:, None], cache)
        cache.commit(torch.tensor([1, 1]))
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    assert torch.equal(torch.cat(tokens, 1), expected)


def test_dtype_change_after_a_forward_uses_the_new_parameters(family_pair):
    # Layers bind their tensors on first use; .to() must drop that binding (LlamaModel._apply),
    # or the fp64 copy below would still read the fp32 tensors (and fail on the dtype mix).
    _, hf, _, folder = family_pair
    model = models.load(folder)
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(12)[None]
    model.forward(tokens, positions, model.new_cache(1, 16))
    model.to(torch.float64)
    with torch.no_grad():
        model.layers[0].mlp.down_proj.weight.zero_()  # the new tensors are the ones read
    out = model.forward(tokens, positions, model.new_cache(1, 16)).logits
    assert out.dtype == torch.float64
    fresh = models.load(folder, dtype=torch.float64)
    with torch.no_grad():
        fresh.layers[0].mlp.down_proj.weight.zero_()
    torch.testing.assert_close(out, fresh.forward(tokens, positions, fresh.new_cache(1, 16)).logits, rtol=0, atol=0)


def test_cpu_rope_table_equals_direct_computation(family_pair):
    # The CPU path looks positions up in a cached table (grown on demand); the values must be the
    # very ones rope_cos_sin computes, also past the first table size and for a grown table.
    from specdec_cuda.models.rope import rope_cos_sin

    _, _, model, _ = family_pair
    for positions in (torch.tensor([[0, 7, 1023]]), torch.tensor([[1024, 5000], [3, 4]]), torch.tensor([[-2, 3]])):
        got = model._rope(positions)
        want = rope_cos_sin(positions, model._rope_inv_freq(), model.dtype)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    assert model._rope_tables[model.dtype][0].shape[0] == 8192  # grown to the next power of two past 5000


# ---- the packed CPU path (decoder_layer op, packed weights) -------------------------------------

needs_packed = pytest.mark.skipif(not packed_kernel_available(),
                                  reason="no AVX-512 or AVX2: models keep the torch path")


@needs_packed
def test_packed_path_matches_the_torch_path_with_a_tree(family_pair):
    # Decoding-sized forwards (B * n <= PACKED_MAX_ROWS) take one decoder_layer op per layer; the
    # torch path (packed_linear = False) is the same model. A tree mask, per-row lengths.
    _, _, model, folder = family_pair
    torch_path = models.load(folder)
    torch_path.packed_linear = False
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, VOCAB, (2, 9), generator=g)
    tree = torch.randint(0, VOCAB, (2, 5), generator=g)
    mask = ancestors_mask([-1, 0, 0, 1, 1]).expand(2, 5, 5)
    results = []
    for m in (model, torch_path):
        cache = m.new_cache(2, 32)
        m.forward(prompt, torch.arange(9).expand(2, 9), cache)
        cache.commit(torch.tensor([9, 6]))  # row 1 keeps fewer tokens
        positions = cache.lengths[:, None] + torch.tensor([0, 1, 1, 2, 2])
        out = m.forward(tree, positions, cache, tree_mask=mask, hidden_layers=(0, -1))
        results.append((out, cache.keys[1].clone()))
    assert model._head_packed is not None and torch_path._head_packed is None
    (packed, kp), (plain, kt) = results
    torch.testing.assert_close(packed.logits, plain.logits, **FP32_TOL)
    torch.testing.assert_close(packed.hidden_states[0], plain.hidden_states[0], **FP32_TOL)
    torch.testing.assert_close(packed.hidden_states[-1], plain.hidden_states[-1], **FP32_TOL)
    torch.testing.assert_close(kp, kt, **FP32_TOL)


@pytest.mark.parametrize("width", [9, 60])  # the packed path (B * n <= PACKED_MAX_ROWS) and the torch one
def test_logits_at_returns_those_rows_of_the_full_logits(family_pair, width):
    _, _, model, _ = family_pair
    tokens = torch.randint(0, VOCAB, (2, width), generator=torch.Generator().manual_seed(width))
    positions = torch.arange(width).expand(2, width)
    full = model.forward(tokens, positions, model.new_cache(2, 64), hidden_layers=(-1,))
    at = torch.tensor([width - 1, 3])
    some = model.forward(tokens, positions, model.new_cache(2, 64), hidden_layers=(-1,), logits_at=at)
    assert some.logits.shape == (2, 1, VOCAB)
    torch.testing.assert_close(some.logits[:, 0], full.logits[torch.arange(2), at], **FP32_TOL)
    assert torch.equal(some.hidden_states[-1], full.hidden_states[-1])  # hidden states of every token
    with pytest.raises(ValueError, match="logits_at"):
        model.forward(tokens, positions, model.new_cache(2, 64), logits_at=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="logits_at"):
        model.forward(tokens, positions, model.new_cache(2, 64), logits_at=torch.tensor([1]))


@needs_packed
def test_writing_a_packed_weight_needs_unpack_and_repacks(family_pair):
    # A packed model's dense weights are meta stand-ins: a write to one is an error at the next
    # forward; after unpack() (the panels' exact values) writes work and the next forward packs again.
    _, _, _, folder = family_pair
    model, fresh = models.load(folder), models.load(folder)
    tokens, positions = torch.tensor([[3, 5]]), torch.arange(2)[None]
    before = model.forward(tokens, positions, model.new_cache(1, 8)).logits
    with torch.no_grad():
        model.layers[0].mlp.down_proj.weight.mul_(-2.0)
    with pytest.raises(RuntimeError, match="unpack"):
        model.forward(tokens, positions, model.new_cache(1, 8))
    model.unpack()
    assert not model.packed and torch.equal(model.layers[0].mlp.down_proj.weight, fresh.dense_weight(0, "down"))
    for m in (model, fresh):
        m.unpack()
        with torch.no_grad():
            m.layers[0].mlp.down_proj.weight.mul_(-2.0)
    after = model.forward(tokens, positions, model.new_cache(1, 8)).logits
    assert model.packed and not torch.allclose(before, after)
    torch.testing.assert_close(after, fresh.forward(tokens, positions, fresh.new_cache(1, 8)).logits, rtol=0, atol=0)


def test_packed_linear_follows_the_environment(family_pair, monkeypatch):
    _, _, _, folder = family_pair
    monkeypatch.setenv("SPECDEC_PACKED_LINEAR", "0")
    model = models.load(folder)
    assert model.packed_linear is False
    model.forward(torch.tensor([[1]]), torch.zeros(1, 1, dtype=torch.long), model.new_cache(1, 4))
    assert model._head_packed is None


@needs_packed
def test_a_packed_model_holds_its_weights_once(family_pair):
    # load() packs layer by layer and drops the dense projections and LM head (a tied embedding
    # too: its rows are read from the head's panels); packed_linear = False unpacks them exactly.
    _, _, _, folder = family_pair
    model = models.load(folder)
    assert model.packed
    stand_ins = [w for layer in model.layers for w in (layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight,
                                                        layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)]
    stand_ins.append(model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight)
    assert all(w.is_meta for w in stand_ins)
    tied = model.lm_head is None
    assert model.embed_tokens.weight.is_meta == tied
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(7).expand(2, 7)
    packed = model.forward(tokens, positions, model.new_cache(2, 8)).logits
    model.packed_linear = False
    plain = model.forward(tokens, positions, model.new_cache(2, 8)).logits
    assert not model.packed and not any(p.is_meta for p in model.parameters())
    torch.testing.assert_close(packed, plain, **FP32_TOL)
    model.packed_linear = True
    assert torch.equal(model.forward(tokens, positions, model.new_cache(2, 8)).logits, packed) and model.packed


# ---- forward(layers=...): the layer-skip draft path ----------------------------------------------

@pytest.mark.parametrize("packed", [False, True])
def test_forward_over_a_subset_of_layers_equals_the_model_without_the_others(family_pair, packed):
    # layers=(0, 2) of a 3-layer model is the 2-layer model of those layers (same norm and head):
    # transformers' own model with layer 1 removed, no cache. Incrementally too, on our cache: the
    # skipped layer's cache slots are never read by the layers that run.
    import copy

    if packed and not packed_kernel_available():
        pytest.skip("no AVX-512 or AVX2: models keep the torch path")
    _, hf, _, folder = family_pair
    model = models.load(folder)
    model.packed_linear = packed
    short = copy.deepcopy(hf)
    short.model.layers = torch.nn.ModuleList([short.model.layers[0], short.model.layers[2]])
    short.config.num_hidden_layers = 2
    if getattr(short.config, "layer_types", None):
        short.config.layer_types = short.config.layer_types[:2]
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        ref = short(input_ids=tokens, use_cache=False).logits
    cache = model.new_cache(2, 16)
    first = model.forward(tokens[:, :8], torch.arange(8).expand(2, 8), cache, layers=(0, 2), hidden_layers=(2,))
    cache.commit(torch.full((2,), 8))
    pieces = [first.logits]
    for t in range(8, 12):
        pieces.append(model.forward(tokens[:, t : t + 1], torch.full((2, 1), t), cache, layers=[0, 2]).logits)
        cache.commit(torch.ones(2, dtype=torch.long))
    torch.testing.assert_close(torch.cat(pieces, 1), ref, **FP32_TOL)
    assert set(first.hidden_states) == {2}
    assert torch.count_nonzero(cache.keys[1]) == 0  # the skipped layer's slots were never written


def test_forward_layers_rejects_bad_subsets(family_pair):
    _, _, model, _ = family_pair
    tokens, positions = torch.tensor([[3, 5]]), torch.arange(2)[None]
    for bad in ([1, 0], [0, 0], [0, 3], [-1]):
        with pytest.raises(ValueError, match="increasing indices"):
            model.forward(tokens, positions, model.new_cache(1, 4), layers=bad)
    with pytest.raises(ValueError, match="skips"):
        model.forward(tokens, positions, model.new_cache(1, 4), layers=[0, 2], hidden_layers=(1,))
