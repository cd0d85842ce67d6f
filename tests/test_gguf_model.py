"""The built-in model over a ``.gguf`` file's own blocks (models/gguf_file.py, LlamaModel.load_gguf,
the decoder_layer_gguf and gguf_linear ops): tiny files written here with the gguf package, every
format in one model, for the llama (q / k rows in llama.cpp's order), qwen2 (biases) and qwen3
(q / k norms) layouts.

Checked: the header reader agrees with the gguf package's; the configuration from metadata; the
logits equal a dense float32 model of the exactly dequantised weights (to float32 rounding: another
summation order); each row of a forward gets the bits of a one-row forward (chains, trees, chunked
prefill, thread counts); greedy speculative decoding on the GGUF model equals its autoregressive
decoding token for token; unpack() gives the dequantised weights; bad files are named.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec_cuda
from _gguf_testlib import random_blocks
from specdec_cuda import models
from specdec_cuda.models.gguf_file import GgufCheckpoint, read_header
from specdec_cuda.models.layers import PACKED_MAX_ROWS
from specdec_cuda.ops import gguf as g
from specdec_cuda.ops.skinny_linear import packed_kernel_available

gguf = pytest.importorskip("gguf")
pytestmark = [pytest.mark.kernels,  # the compiled ops against their references (make cpu-only-check)
              pytest.mark.skipif(not packed_kernel_available(), reason="no AVX-512 or AVX2: GGUF models need the "
                                                                       "packed CPU path")]

Q = gguf.GGMLQuantizationType
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 256, 4, 2, 64, 512, 300, 2
# Which format each tensor gets: every supported one appears, q|k|v and gate|up mix formats.
FORMAT_OF = {"attn_q": Q.Q4_K, "attn_k": Q.Q5_0, "attn_v": Q.Q6_K, "attn_output": Q.Q8_0, "ffn_gate": Q.Q4_1,
             "ffn_up": Q.Q4_1, "ffn_down": Q.Q6_K, "token_embd": Q.Q8_0, "output": Q.Q4_K}
HF_NAME = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}


def llama_cpp_row_order(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of a llama q / k weight's rows (RoPE pairs 2j, 2j + 1)."""
    return rows.reshape(heads, 2, HEAD_DIM // 2, -1).swapaxes(1, 2).reshape(rows.shape)


def write_model(path, arch: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny model as a .gguf file; returns its weights as Hugging Face tensors (the exact
    dequantised values, float32), from which the reference dense model is loaded."""
    rng = np.random.default_rng(seed)
    tied = arch == "llama"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0 if arch != "qwen3" else 1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_eos_token_id(7)
    w.add_bos_token_id(1)
    if arch == "qwen3":
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
    w.add_token_list([f"t{i}" for i in range(VOCAB)])  # an array the header reader must skip
    hf: dict[str, torch.Tensor] = {}

    def quantised(gguf_name: str, hf_name: str, kind: str, n: int, k: int, heads: int | None = None) -> None:
        qtype = FORMAT_OF[kind]
        raw = random_blocks(qtype, n, k, rng)
        hf[hf_name] = torch.from_numpy(gguf.quants.dequantize(raw, qtype).astype(np.float32))
        stored = llama_cpp_row_order(raw, heads) if arch == "llama" and heads else raw
        w.add_tensor(gguf_name, np.ascontiguousarray(stored), raw_dtype=qtype)

    def vector(gguf_name: str, hf_name: str, n: int, scale: float, offset: float = 0.0, heads: int | None = None):
        v = (rng.standard_normal(n) * scale + offset).astype(np.float32)
        hf[hf_name] = torch.from_numpy(v.copy())
        w.add_tensor(gguf_name, llama_cpp_row_order(v[:, None], heads).ravel() if arch == "llama" and heads else v)

    quantised("token_embd.weight", "model.embed_tokens.weight", "token_embd", VOCAB, HIDDEN)
    for i in range(LAYERS):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        vector(b + "attn_norm.weight", p + "input_layernorm.weight", HIDDEN, 0.1, 1.0)
        vector(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", HIDDEN, 0.1, 1.0)
        for kind, n, k, heads in (("attn_q", HEADS * HEAD_DIM, HIDDEN, HEADS),
                                  ("attn_k", KV_HEADS * HEAD_DIM, HIDDEN, KV_HEADS),
                                  ("attn_v", KV_HEADS * HEAD_DIM, HIDDEN, None),
                                  ("attn_output", HIDDEN, HEADS * HEAD_DIM, None),
                                  ("ffn_gate", INTER, HIDDEN, None), ("ffn_up", INTER, HIDDEN, None),
                                  ("ffn_down", HIDDEN, INTER, None)):
            quantised(f"{b}{kind}.weight", f"{p}{HF_NAME[kind]}.weight", kind, n, k, heads)
            if arch == "qwen2" and kind in ("attn_q", "attn_k", "attn_v"):
                vector(f"{b}{kind}.bias", f"{p}{HF_NAME[kind]}.bias", n, 0.5)
        if arch == "qwen3":
            vector(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", HEAD_DIM, 0.1, 1.0)
            vector(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", HEAD_DIM, 0.1, 1.0)
    vector("output_norm.weight", "model.norm.weight", HIDDEN, 0.1, 1.0)
    if not tied:
        quantised("output.weight", "lm_head.weight", "output", VOCAB, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


ARCHS = ["llama", "qwen2", "qwen3"]


@pytest.fixture(scope="module", params=ARCHS)
def written(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "model.gguf"
    return request.param, path, write_model(path, request.param)


def dense_reference(model: models.LlamaModel, hf: dict[str, torch.Tensor]) -> models.LlamaModel:
    with torch.device("meta"):
        dense = models.LlamaModel(model.config)
    dense.to_empty(device="cpu")
    dense.packed_linear = False  # BLAS, the dense weights as they are
    dense.load_hf_state_dict(hf)
    return dense.eval()


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache(tokens.shape[0], 160)
    return model.forward(tokens, torch.arange(tokens.shape[1]).expand(tokens.shape), cache).logits


def test_header_reader_agrees_with_the_gguf_package(written):
    _, path, _ = written
    fields, tensors = read_header(path)
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        info = tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist())) and info.qtype == int(t.tensor_type)
        assert info.offset == t.data_offset
    for key, field in reader.fields.items():
        if field.types and field.types[0] != gguf.GGUFValueType.ARRAY and not key.startswith("GGUF."):
            assert fields[key] == pytest.approx(field.contents()), key


def test_config_from_metadata(written):
    arch, path, _ = written
    c = GgufCheckpoint(path).config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == (HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB)
    assert c.tie_word_embeddings == (arch == "llama") and c.qkv_bias == (arch == "qwen2")
    assert c.qk_norm == (arch == "qwen3") and c.eos_token_id == (7,)


def test_logits_equal_the_dequantised_dense_model(written):
    _, path, hf = written
    model = models.load(path, gguf_activations="float32")
    assert model.gguf and model.packed
    dense = dense_reference(model, hf)
    tokens = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(0))
    got, want = logits(model, tokens), logits(dense, tokens)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4 * want.abs().max().item())
    assert torch.equal(model.embedding_weight(), hf["model.embed_tokens.weight"])
    head = hf["model.embed_tokens.weight" if model.lm_head is None else "lm_head.weight"]
    assert torch.equal(model.output_weight(), head)
    assert torch.equal(model.dense_weight(0, "qkv"), torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.weight"]
                                                                for p in "qkv"]))


def test_q8_activations_stay_near_the_float32_products(written):
    # int8 activations per 32 values (per 256 for the k-quants where they run in panels, as
    # llama.cpp's Q8_K): each product is off by ~1e-2 of its scale; through two layers of this
    # random model the logits stay within a few percent of their range.
    _, path, _ = written
    q8, f32 = models.load(path), models.load(path, gguf_activations="float32")
    mode = "q8k_q8" if g.panels_pay() else "q8"  # k-quants in panels, Q8K, where that pays
    assert q8.layers[0].panels["qkv"].activations == mode and q8._head_packed.activations == mode
    tokens = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(0))
    got, want = logits(q8, tokens), logits(f32, tokens)
    assert not torch.equal(got, want)
    err = ((got - want).abs().mean() / want.abs().mean()).item()
    print(f"{mode} vs float32 activations: mean |diff| / mean |logit| = {err:.4f}")
    assert err < (0.05 if mode == "q8" else 0.08)


@pytest.mark.parametrize("mode", ["q8", "q8_32", "float32"])
def test_each_row_gets_the_bits_of_a_one_row_forward(written, mode):
    _, path, _ = written
    model = models.load(path, gguf_activations=mode)
    g_ = torch.Generator().manual_seed(1)
    prompt, chain = torch.randint(0, VOCAB, (1, 7), generator=g_), torch.randint(0, VOCAB, (1, 6), generator=g_)

    def prefilled():
        cache = model.new_cache(1, 160)
        model.forward(prompt, torch.arange(7)[None], cache)
        cache.commit(torch.tensor([7]))
        return cache

    cache, alone = prefilled(), []
    for i in range(6):
        alone.append(model.forward(chain[:, i:i + 1], cache.lengths[:, None], cache).logits[0, 0])
        cache.commit(torch.tensor([1]))
    for m in (2, 6):
        cache = prefilled()
        out = model.forward(chain[:, :m], cache.lengths[:, None] + torch.arange(m), cache).logits[0]
        assert all(torch.equal(out[i], alone[i]) for i in range(m)), m
    # A tree: root, two children of the root, a grandchild under the second child.
    tree = torch.tensor([[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]], dtype=torch.bool)
    nodes = torch.cat((chain[:, :1], chain[:, 5:6], chain[:, 1:3]), 1)
    cache = prefilled()
    out = model.forward(nodes, cache.lengths[:, None] + torch.tensor([[0, 1, 1, 2]]), cache, tree_mask=tree).logits[0]
    assert torch.equal(out[0], alone[0]) and torch.equal(out[2], alone[1]) and torch.equal(out[3], alone[2])


@pytest.mark.parametrize("mode", ["q8", "q8_32", "float32"])
def test_chunked_prefill_and_threads_keep_the_bits(written, mode):
    _, path, _ = written
    model = models.load(path, gguf_activations=mode)
    tokens = torch.randint(0, VOCAB, (1, PACKED_MAX_ROWS + 9), generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    whole = logits(model, tokens)  # chunks of PACKED_MAX_ROWS rows
    cache, steps = model.new_cache(1, 160), []
    for i in range(PACKED_MAX_ROWS - 3, tokens.shape[1]):  # the tail, one token at a time after a prefill
        if not steps:
            model.forward(tokens[:, :i], torch.arange(i)[None], cache)
            cache.commit(torch.tensor([i]))
        steps.append(model.forward(tokens[:, i:i + 1], torch.tensor([[i]]), cache).logits[0, 0])
        cache.commit(torch.tensor([1]))
    assert all(torch.equal(whole[0, PACKED_MAX_ROWS - 3 + j], s) for j, s in enumerate(steps))
    try:
        torch.set_num_threads(1)
        assert torch.equal(logits(model, tokens[:, :20]), whole[:, :20])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method, options", [("prompt_lookup", {}), ("draft", {"k": 3, "policy": "fixed"})])
def test_greedy_speculation_equals_autoregressive_decoding(written, method, options):
    _, path, _ = written
    model = models.load(path)
    if method == "draft":
        options = {**options, "draft": models.load(path)}
    g_ = torch.Generator().manual_seed(3)
    base = torch.randint(0, VOCAB, (6,), generator=g_).tolist()
    prompts = [base * 3, torch.randint(0, VOCAB, (9,), generator=g_).tolist()]  # repeats: prompt lookup drafts
    expected = specdec_cuda.generate(model, prompts, method="autoregressive", max_new_tokens=24).tokens
    out = specdec_cuda.generate(model, prompts, method=method, max_new_tokens=24, **options)
    assert out.tokens == expected
    if method == "draft":
        assert out.metrics.tau > 2.0  # the model drafting for itself: drafts are accepted


def test_unpack_gives_the_dequantised_weights_and_the_same_model(written):
    _, path, hf = written
    model = models.load(path, gguf_activations="float32")
    tokens = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    model.unpack()
    assert not model.gguf and not model.packed
    assert torch.equal(model.layers[1].mlp.down_proj.weight, hf["model.layers.1.mlp.down_proj.weight"])
    model.packed_linear = False
    torch.testing.assert_close(logits(model, tokens), logits(dense_reference(model, hf), tokens), rtol=0, atol=0)


def test_a_folder_loads_its_gguf_with_its_config_json(written, tmp_path):
    import json

    _, path, _ = written
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.gguf").symlink_to(path)
    c = GgufCheckpoint(path).config
    (folder / "config.json").write_text(json.dumps({
        "model_type": c.family, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
        "rope_theta": c.rope_theta, "rms_norm_eps": 1e-6, "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.qkv_bias}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    model = models.load(folder, weights="gguf")
    assert model.gguf and model.eos_token_ids == (7, 9)
    tokens = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(5))
    assert torch.equal(logits(model, tokens), logits(models.load(path), tokens))


def test_bad_files_and_settings_are_named(tmp_path, written):
    _, path, _ = written
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.load(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="no GGUF magic"):
        models.load(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        models.load(cut)
    with pytest.raises(ValueError, match="float32"):
        models.load(path, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weights must be"):
        models.load(path.parent, weights="bin")
    with pytest.raises(ValueError, match="activations must be"):
        models.load(path, gguf_activations="int4")
    other = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(other), "gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(models.UnsupportedModelError, match="gpt2"):
        models.load(other)


def test_gguf_linear_concatenates_parts_in_any_format():
    rng = np.random.default_rng(6)
    parts = [(Q.Q4_K, 70, 256), (Q.Q6_K, 3, 256), (Q.Q5_0, 64, 256)]
    weights = [g.gguf_weight(torch.from_numpy(random_blocks(q, n, k, rng)), int(q), (n, k)) for q, n, k in parts]
    x, bias = torch.randn(5, 256), torch.randn(137)
    for mode in g.ACTIVATIONS:
        y = g.gguf_linear(x, g.GgufLinear.of(*weights), bias, activations=mode)
        want = torch.cat([g.gguf_matmul(x, w, activations=mode) for w in weights], 1) + bias
        assert torch.equal(y, want), mode
        assert torch.equal(g.gguf_linear(x, g.GgufLinear.of(*weights, activations=mode), bias), y)
    rows = torch.tensor([[3, 69], [0, 5]])
    assert torch.equal(g.gguf_rows(weights[0], rows), g.gguf_dequantize(weights[0])[rows])
    with pytest.raises(IndexError):
        g.gguf_rows(weights[0], torch.tensor([70]))
    with pytest.raises(ValueError, match="share in_features"):
        g.GgufLinear.of(weights[0], g.gguf_weight(torch.zeros(1, 288, dtype=torch.uint8), "Q4_K", (1, 512)))


def test_opcheck(written):
    _, path, _ = written
    model = models.load(path)
    layer = model.layers[0]
    layer.bind()
    x = torch.randn(1, 3, HIDDEN)
    cache = model.new_cache(1, 16)
    cos, sin = (t.squeeze(2).contiguous() for t in model._rope(torch.arange(3)[None], torch.float32))
    attn = layer.self_attn
    args = (x, *layer._gguf_args, cos, sin, cache.keys[0], cache.values[0], cache.lengths, None, attn.num_heads,
            attn.num_kv_heads, attn.head_dim ** -0.5, torch.empty_like(x))
    torch.library.opcheck(torch.ops.specdec.decoder_layer_gguf.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    head = model._head_packed
    torch.library.opcheck(torch.ops.specdec.gguf_linear.default,
                          (torch.randn(2, HIDDEN), [p.data for p in head.parts], [p.qtype for p in head.parts], None, 1,
                           torch.empty(2, VOCAB)))


def test_quantspec_drafts_with_the_files_own_blocks(written):
    _, path, _ = written
    target = models.QuantKVModel(models.load(path), key_group=32, residual=16)
    prompts = [torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(7)).tolist()]
    expected = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=20).tokens
    out = specdec_cuda.generate(target, prompts, method="quantspec", max_new_tokens=20, k=3, policy="fixed")
    assert out.tokens == expected and out.metrics.tau > 1.5


def test_layer_skip_drafts_through_the_files_own_layers(written):
    _, path, _ = written
    target = models.load(path)
    prompts = [torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(8)).tolist()]
    expected = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=20).tokens
    out = specdec_cuda.generate(target, prompts, method="layer_skip", max_new_tokens=20, k=3, policy="fixed")
    assert out.tokens == expected and out.metrics.drafted[0] > 0  # drafted, verified, exact


def test_layer_skip_with_an_exit_adapter_is_exact_on_the_files_layers(written):
    """A random exit adapter after layer 1 (its K/V of committed positions from the verifications'
    stream, which the GGUF path hands out as float32): greedy output and, with coupled drafts, the
    samples of autoregressive decoding."""
    from _models_testlib import random_exit_adapter

    _, path, _ = written
    target = models.load(path)
    adapter = random_exit_adapter(target, exit_layer=1, ids=list(range(0, VOCAB, 2)))
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(8)).tolist() for n in (40, 9)]
    for temperature in (0.0, 0.8):
        expected = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=16,
                                         temperature=temperature, seed=4).tokens
        out = specdec_cuda.generate(target, prompts, method="layer_skip", adapter=adapter, max_new_tokens=16, k=3,
                                    policy="fixed", temperature=temperature, seed=4)
        assert out.tokens == expected and out.metrics.drafted[0] > 0


def test_a_draft_vocabulary_reads_the_heads_own_blocks(written):
    """``vocab_subset`` on a GGUF model gathers the head's rows as stored: the subset's logits are
    the full head's columns, bit for bit (a prefix and a scattered set), and a drafter with a
    draft vocabulary keeps the greedy output exact."""
    _, path, _ = written
    model = models.load(path)
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(7).expand(2, 7)
    full = model.forward(tokens, positions, model.new_cache(2, 16)).logits
    for spec in (VOCAB // 2, list(range(1, VOCAB, 3))):
        subset = model.vocab_subset(spec)
        assert isinstance(subset.packed, g.GgufLinear)
        sub = model.forward(tokens, positions, model.new_cache(2, 16), vocab=subset).logits
        assert torch.equal(sub, full[..., subset.ids])
    prompts = [torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(8)).tolist()]
    expected = specdec_cuda.generate(model, prompts, method="autoregressive", max_new_tokens=16).tokens
    out = specdec_cuda.generate(model, prompts, method="draft", draft=models.load(path), k=3, policy="fixed",
                                draft_vocab=VOCAB // 2, max_new_tokens=16)
    assert out.tokens == expected and out.metrics.drafted[0] > 0
    assert model.batch_invariant and out.metrics.batch_invariant  # GGUF blocks: exact verification


def test_heads_and_a_dflash_drafter_draft_through_the_files_own_head(written):
    """Medusa heads, MTP modules and a DFlash drafter rank the target's LM head as the file stores
    it (GGUF blocks: no fused op reads them, so the head's product then torch's top-k), over the
    whole vocabulary and over a draft vocabulary; greedy output exact either way."""
    from specdec_cuda.models.dflash import DFlashConfig, DFlashDrafter
    from specdec_cuda.models.heads import MedusaHeads, MTPModules, mtp_block_config, target_head

    _, path, _ = written
    target = models.load(path)
    head = target_head(target)
    assert isinstance(head.lm_head_packed, g.GgufLinear)
    h = torch.randn(3, target.hidden_size, generator=torch.Generator().manual_seed(2))
    top = head.topk(h, 4, return_logits=True)
    dense = head.logits(h)  # the dequantised head: q8 activations keep within a few percent of it
    assert ((top.logits - dense).abs().mean() / dense.abs().mean()).item() < 0.05
    assert torch.equal(top.values, top.logits.topk(4, dim=-1).values)
    prompts = [torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(9)).tolist()]
    expected = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=16).tokens
    g_ = torch.Generator().manual_seed(4)
    medusa = MedusaHeads(target.hidden_size, 3)
    with torch.no_grad():
        medusa.weight.copy_(torch.randn(medusa.weight.shape, generator=g_) * 0.1)
    mtp = MTPModules(mtp_block_config(head), 2)
    drafter = DFlashDrafter.random(DFlashConfig.for_target(target, block_size=4), seed=1)
    for method, options in (("medusa", dict(heads=medusa)), ("medusa", dict(heads=medusa, budget=16)),
                            ("mtp", dict(heads=mtp)), ("dflash", dict(drafter=drafter))):
        for vocab in (None, list(range(0, VOCAB, 2))):
            out = specdec_cuda.generate(target, prompts, method=method, max_new_tokens=16, policy="fixed",
                                        draft_vocab=vocab, **options)
            assert out.tokens == expected and sum(out.metrics.drafted) > 0, (method, options.keys(), vocab)


def test_the_drafter_cache_fingerprints_a_gguf_model_from_its_blocks(written):
    # The fingerprint reads a few hundred rows of the embedding and head: from the blocks (the dense
    # stand-ins hold no data), the same for two loads of the file, and that of the dense model of
    # the exactly dequantised weights.
    from specdec_cuda import drafters

    _, path, hf = written
    model = models.load(path)
    assert drafters.fingerprint(model) == drafters.fingerprint(models.load(path))
    assert drafters.fingerprint(model) == drafters.fingerprint(dense_reference(model, hf))


def test_q4_k_projections_repacked_for_the_int8_kernel_keep_the_bits(written, monkeypatch):
    # load_gguf repacks Q4_K / Q6_K weights into the VNNI kernel's lane order where ops.gguf.lanes_pay()
    # (forced both ways here, so any CPU runs both): the same logits, bit for bit, and the same
    # dense weights on unpack().
    import specdec_cuda.models.llama as llama

    _, path, hf = written

    def parts(model) -> list[int]:
        return [p.qtype for layer in model.layers for name in layer.PROJECTIONS for p in layer._panels[name].parts]

    def load(repack: bool):
        monkeypatch.setattr(llama, "panels_pay", lambda: False)  # the Q8 kernel's layouts (panels: below)
        monkeypatch.setattr(llama, "lanes_pay", lambda: repack)
        return models.load(path)

    plain, lanes = load(False), load(True)
    file_type = {g.Q4_K_LANES_ID: 12, g.Q6_K_LANES_ID: 14}
    assert not set(file_type) & set(parts(plain)) and set(file_type) <= set(parts(lanes))
    assert [file_type.get(q, q) for q in parts(lanes)] == parts(plain)
    tokens = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(7))
    assert torch.equal(logits(lanes, tokens).view(torch.int32), logits(plain, tokens).view(torch.int32))
    lanes.unpack()
    assert torch.equal(lanes.layers[0].self_attn.qkv_proj.weight,
                       torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]))


def test_k_quant_projections_in_panels_keep_the_q8k_bits(written, monkeypatch):
    # Where ops.gguf.panels_pay() (forced here, so any CPU runs it: the portable Q8K tier off VNNI),
    # load_gguf holds Q4_K / Q6_K projections in panels of 16 rows and decodes in "q8k_q8": the
    # logits of the same weights kept in the file's order in that mode, bit for bit, and the same
    # dense weights on unpack().
    import specdec_cuda.models.llama as llama

    _, path, hf = written
    monkeypatch.setattr(llama, "panels_pay", lambda: True)
    monkeypatch.setattr(llama, "lanes_pay", lambda: False)
    panels = models.load(path)
    monkeypatch.setattr(llama, "gguf_repack_panels", lambda w: w)
    file_order = models.load(path)

    def parts(model) -> set[int]:
        return {p.qtype for layer in model.layers for name in layer.PROJECTIONS for p in layer._panels[name].parts}

    assert {g.Q4_K_PANELS_ID, g.Q6_K_PANELS_ID} & parts(panels) and not {524, 526} & parts(file_order)
    assert panels._head_packed.activations == file_order._head_packed.activations == "q8k_q8"
    tokens = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(7))
    assert torch.equal(logits(panels, tokens).view(torch.int32), logits(file_order, tokens).view(torch.int32))
    # A prompt's prefill (its own kernels where prefill_on_tiles(): AMX tiles read the panels
    # natively, bf16_amx_panels.cpp) fills the same cache, bit for bit.
    prompt = torch.randint(0, VOCAB, (1, llama.TILE_PREFILL_MIN_ROWS + 9), generator=torch.Generator().manual_seed(8))
    caches = []
    for model in (panels, file_order):
        caches.append(model.new_cache(1, 64))
        model.forward(prompt, torch.arange(prompt.shape[1])[None], caches[-1], prefill=True)
    assert torch.equal(caches[0].kv, caches[1].kv)
    assert torch.equal(panels.embedding_weight(), hf["model.embed_tokens.weight"])  # the table: the file order
    panels.unpack()
    assert torch.equal(panels.layers[0].self_attn.qkv_proj.weight,
                       torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]))
