"""HFCausalLM: a transformers causal LM behind the model protocol (logits, trees, crop, hidden states).

The cache semantics shared with the built-in model (ragged rows, tree compaction, truncate) are
tested on both backends in test_models_cache.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from _models_testlib import VOCAB, ancestors_mask, depths, make_hf_model, path_to, save_checkpoint

from specdec_cuda import models
from specdec_cuda.models import CausalLM, HFCache, HFCausalLM, KVCache, UnsupportedModelError

FP32_TOL = dict(rtol=1e-4, atol=1e-4)
PARENTS = [-1, 0, 0, 1, 2, 2]


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0
    )
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module", params=["qwen3", "gpt2"])
def hf(request):
    # A family the built-in model also runs, and one it does not (learned absolute positions).
    return make_hf_model("qwen3") if request.param == "qwen3" else tiny_gpt2()


def test_logits_equal_raw_model_prefill_and_decode(hf):
    model = HFCausalLM(hf)
    assert isinstance(model, CausalLM)
    assert model.vocab_size == VOCAB and model.dtype == torch.float32
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=tokens).logits
    cache = model.new_cache(2, 32)
    assert isinstance(cache, HFCache) and isinstance(cache, KVCache)
    pieces, start = [], 0
    for n in (10, 1, 1, 5, 7):
        out = model.forward(tokens[:, start : start + n], torch.arange(start, start + n).expand(2, n), cache)
        cache.commit(torch.tensor([n, n]))
        pieces.append(out.logits)
        start += n
    torch.testing.assert_close(torch.cat(pieces, 1), ref, **FP32_TOL)
    assert cache.dynamic.get_seq_length() == 24


def test_logits_at_keeps_one_row_per_sequence(hf):
    model = HFCausalLM(hf)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(input_ids=tokens).logits
    head = hf.get_output_embeddings()
    rows_seen = []
    hook = head.register_forward_hook(lambda _m, args, _out: rows_seen.append(args[0].shape[1]))
    try:
        for at in (torch.tensor([11, 4]), torch.tensor([7, 7])):
            out = model.forward(tokens, torch.arange(12).expand(2, 12), model.new_cache(2, 16), logits_at=at)
            torch.testing.assert_close(out.logits[:, 0], ref[torch.arange(2), at], **FP32_TOL)
    finally:
        hook.remove()
    assert rows_seen == [2, 1]  # the LM head ran on the distinct kept positions only (logits_to_keep)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_equals_raw_model_on_paths(hf, attn):
    model = HFCausalLM(hf, attn_implementation=attn)
    prompt = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    tree = torch.randint(0, VOCAB, (1, len(PARENTS)), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache(1, 32)
    model.forward(prompt, torch.arange(9)[None], cache)
    cache.commit(torch.tensor([9]))
    positions = torch.tensor([[9 + d for d in depths(PARENTS)]])
    out = model.forward(tree, positions, cache, tree_mask=ancestors_mask(PARENTS)[None])
    for node in range(len(PARENTS)):
        with torch.no_grad():
            ref = hf(input_ids=torch.cat([prompt, tree[:, path_to(PARENTS, node)]], 1)).logits[0, -1]
        torch.testing.assert_close(out.logits[0, node], ref, **FP32_TOL)
    hf.set_attn_implementation("sdpa")


def test_crop_follows_commit_and_truncate(hf):
    model = HFCausalLM(hf)
    cache = model.new_cache(2, 32)
    model.forward(torch.zeros(2, 8, dtype=torch.int64), torch.arange(8).expand(2, 8), cache)
    assert cache.dynamic.get_seq_length() == 8  # pending tokens are appended
    cache.commit(torch.tensor([8, 5]))
    assert cache.dynamic.get_seq_length() == 8 and not cache.uniform
    model.forward(torch.zeros(2, 4, dtype=torch.int64), cache.lengths[:, None] + torch.arange(4), cache)
    assert cache.dynamic.get_seq_length() == 12
    cache.commit(torch.tensor([1, 2]))  # lengths 9 and 7: physical length = the longest row
    assert cache.lengths.tolist() == [9, 7] and cache.dynamic.get_seq_length() == 9
    cache.truncate(torch.tensor([6, 6]))
    assert cache.dynamic.get_seq_length() == 6 and cache.uniform
    # An uncommitted forward is cropped away by the next one.
    model.forward(torch.zeros(2, 3, dtype=torch.int64), torch.arange(6, 9).expand(2, 3), cache)
    model.forward(torch.zeros(2, 2, dtype=torch.int64), torch.arange(6, 8).expand(2, 2), cache)
    assert cache.dynamic.get_seq_length() == 8


def test_hidden_states_equal_builtin_model(tmp_path):
    hf = make_hf_model("llama3")
    builtin = models.load(save_checkpoint(hf, tmp_path / "llama3"))
    adapter = HFCausalLM(hf)
    tokens = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(4))
    layers = tuple(range(builtin.num_layers)) + (-1,)
    a = adapter.forward(tokens, torch.arange(10).expand(2, 10), adapter.new_cache(2, 16), hidden_layers=layers)
    b = builtin.forward(tokens, torch.arange(10).expand(2, 10), builtin.new_cache(2, 16), hidden_layers=layers)
    assert set(a.hidden_states) == set(layers)
    for i in layers:
        torch.testing.assert_close(a.hidden_states[i], b.hidden_states[i], **FP32_TOL)
    torch.testing.assert_close(a.logits, b.logits, **FP32_TOL)


def test_flash_attention_needs_a_maskable_implementation():
    hf = make_hf_model("qwen3")
    model = HFCausalLM(hf)
    cache = model.new_cache(1, 16)
    hf.config._attn_implementation = "flash_attention_2"  # as loaded with FA2 (unavailable on CPU)
    try:
        with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
            model.forward(
                torch.zeros(1, 3, dtype=torch.int64), torch.arange(3)[None], cache,
                tree_mask=torch.ones(1, 3, 3, dtype=torch.bool),
            )
    finally:
        hf.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="attn_implementation must be one of"):
        HFCausalLM(hf, attn_implementation="flash_attention_2")


def test_sliding_window_layers_ragged_rows_and_trees():
    # Qwen2 with sliding layers (window 4) over full ones: rows of different committed lengths, then
    # a tree whose deep nodes see only part of the prefix through the window. Every node's logits
    # equal the raw model's on that row's linear sequence.
    hf = make_hf_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    model = HFCausalLM(hf)
    assert model.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    prompt = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(6))
    tree = torch.randint(0, VOCAB, (2, len(PARENTS)), generator=torch.Generator().manual_seed(7))
    cache = model.new_cache(2, 32)
    model.forward(prompt, torch.arange(10).expand(2, 10), cache)
    cache.commit(torch.tensor([10, 6]))
    positions = cache.lengths[:, None] + torch.tensor([depths(PARENTS)])
    out = model.forward(tree, positions, cache, tree_mask=ancestors_mask(PARENTS).expand(2, -1, -1))
    for b, length in enumerate((10, 6)):
        for node in range(len(PARENTS)):
            with torch.no_grad():
                seq = torch.cat([prompt[b : b + 1, :length], tree[b : b + 1, path_to(PARENTS, node)]], 1)
                ref = hf(input_ids=seq).logits[0, -1]
            torch.testing.assert_close(out.logits[b, node], ref, **FP32_TOL)
    # Keep one path per row (compaction moves the slot positions too), then decode on.
    cache.commit(torch.tensor([2, 3]), torch.tensor([[0, 2, -1], [0, 1, 3]]))
    assert cache.lengths.tolist() == [12, 9]
    assert cache.slot_positions[0, :12].tolist() == list(range(12))
    assert cache.slot_positions[1, :9].tolist() == list(range(9))
    step = torch.randint(0, VOCAB, (2, 1), generator=torch.Generator().manual_seed(8))
    out = model.forward(step, cache.lengths[:, None], cache)
    kept = [tree[0, [0, 2]], tree[1, [0, 1, 3]]]
    for b, length in enumerate((10, 6)):
        with torch.no_grad():
            seq = torch.cat([prompt[b, :length], kept[b], step[b]])[None]
            ref = hf(input_ids=seq).logits[0, -1]
        torch.testing.assert_close(out.logits[b, 0], ref, **FP32_TOL)


def tiny_qwen3_next():
    # Gated-delta-net (linear attention) layers around a full-attention one, MoE MLPs.
    cfg = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention"], initializer_range=0.15,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="eager").eval()


def test_linear_attention_rolls_back_by_recomputation():
    # Rows that keep fewer tokens than a forward fed them, a truncate, and an uncommitted forward:
    # each time the next logits equal the raw model's on the row's sequence, so the recurrent states
    # were put back exactly where each row's committed text ends.
    hf = tiny_qwen3_next()
    model = HFCausalLM(hf)
    assert model.recurrent_layers == [0, 2]
    seq = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(9))
    cache = model.new_cache(2, 32)

    def step(tokens, kept=None):
        out = model.forward(tokens, cache.lengths[:, None] + torch.arange(tokens.shape[1]), cache)
        if kept is not None:
            cache.commit(torch.tensor(kept))
        return out.logits

    def check(logits, rows_text):
        for b, text in enumerate(rows_text):
            with torch.no_grad():
                ref = hf(input_ids=torch.tensor([text])).logits[0, -1]
            torch.testing.assert_close(logits[b, -1], ref, **FP32_TOL)

    step(seq[:, :10], kept=[10, 6])  # prefill, ragged: row 1 reruns its 6 tokens from the empty state
    text = [seq[0, :10].tolist(), seq[1, :6].tolist()]
    feed = torch.stack([seq[0, 10:14], seq[1, 6:10]])
    step(feed, kept=[4, 2])  # row 1 keeps 2 of 4
    text = [text[0] + feed[0].tolist(), text[1] + feed[1, :2].tolist()]
    nxt = torch.tensor([[seq[0, 14]], [seq[1, 20]]])
    check(step(nxt, kept=[1, 1]), [text[0] + nxt[0].tolist(), text[1] + nxt[1].tolist()])
    text = [text[0] + nxt[0].tolist(), text[1] + nxt[1].tolist()]
    assert cache.lengths.tolist() == [15, 9]

    cache.truncate(torch.tensor([12, 9]))  # row 0 back 3 tokens: from a checkpoint, rerun the rest
    text[0] = text[0][:12]
    step(torch.tensor([[7, 8, 9], [7, 8, 9]]))  # uncommitted: the next forward discards it
    nxt = torch.tensor([[seq[0, 22]], [seq[1, 23]]])
    check(step(nxt, kept=[1, 1]), [text[0] + nxt[0].tolist(), text[1] + nxt[1].tolist()])

    with pytest.raises(UnsupportedModelError, match="cannot verify a draft tree"):
        model.forward(torch.zeros(2, len(PARENTS), dtype=torch.int64), torch.zeros(2, len(PARENTS), dtype=torch.int64),
                      cache, tree_mask=ancestors_mask(PARENTS).expand(2, -1, -1))


def test_layers_without_a_rollback_are_refused():
    # LFM2's short-convolution layers ("conv") are neither attention nor the linear attention above.
    cfg = transformers.Lfm2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, layer_types=["conv", "full_attention"], bos_token_id=0, eos_token_id=0,
        pad_token_id=0)
    with pytest.raises(UnsupportedModelError, match="conv"):
        HFCausalLM(transformers.AutoModelForCausalLM.from_config(cfg))


def test_eos_token_ids():
    assert HFCausalLM(tiny_gpt2()).eos_token_ids == (0,)
    hf = make_hf_model("qwen3", eos_token_id=[5, 6])
    assert HFCausalLM(hf).eos_token_ids == (5, 6)
