"""HFCausalLM on sliding-window models (Mistral, Gemma 2, Gemma 3): full caches, windowed masks.

The adapter keeps every layer's whole sequence (plain ``DynamicLayer``, no rolling buffer) and
applies the window in the attention mask, by position, one mask per layer type. Here, tiny random
float64 models with a window of 4 and prompts longer than it: greedy speculative output (draft,
prompt lookup, lookahead; a batch of two prompts of different lengths, so ragged rows) must be token
for token ``transformers``' own ``generate(do_sample=False)``, which runs its sliding-window cache.
``test_the_window_matters`` checks that each model generates differently with a wide window, so
a mask that ignored the window would fail the equality tests.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import specdec_cuda
from specdec_cuda.models import HFCausalLM

VOCAB = 100
WINDOW = 4
NEW_TOKENS = 24
PROMPTS = [
    [5, 17, 33, 8, 61, 5, 17, 33, 8, 61, 40, 2, 71],
    [9, 44, 23, 9, 44, 23, 88, 12, 9, 44],
]
METHODS = {
    "draft": dict(k=4),
    "prompt_lookup": dict(k=4, num_candidates=2),
    "lookahead": dict(window=3, ngram=3, num_guesses=3),
}
# Untied embeddings: a tied random Gemma mostly predicts its input token again (its embedding is
# scaled by sqrt(hidden)), and such constant output would not show a wrong mask.
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, initializer_range=0.2, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=None, pad_token_id=0)
MIXED = ["sliding_attention", "full_attention", "sliding_attention"]
# name -> (config class, extra arguments, attention implementation)
FAMILIES = {
    "mistral": ("MistralConfig", dict(), "sdpa"),  # every layer sliding: a single 4-D mask
    "gemma2": ("Gemma2Config", dict(head_dim=8), "eager"),  # alternating by default; soft-capping
    "gemma3": ("Gemma3TextConfig", dict(head_dim=8), "sdpa"),  # own RoPE base on sliding layers
}
# Logit tolerance against the raw model. transformers' own Gemma 2 forward (5.24, float64, eager)
# gives logits at a position that differ by ~6e-7 (of ~4) between a 7- and a 20-token input; a
# wrong mask changes them by O(1).
TOLERANCE = {"gemma2": 1e-5}


def make(name: str, layers: int, seed: int, window: int = WINDOW):
    cls, extra, attn = FAMILIES[name]
    kwargs = dict(COMMON, **extra, num_hidden_layers=layers, sliding_window=window)
    if name != "mistral":
        kwargs["layer_types"] = (MIXED * layers)[:layers]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**kwargs), attn_implementation=attn)
    return model.to(torch.float64).eval()


def hf_greedy(model, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=list(FAMILIES))
def case(request):
    name = request.param
    target = make(name, 3, seed=0)
    return name, target, make(name, 1, seed=1), [hf_greedy(target, p) for p in PROMPTS]


def test_the_window_matters(case):
    name, target, _draft, expected = case
    assert {"sliding_attention"} <= set(HFCausalLM(target).layer_types)
    assert all(len(set(tokens)) > 6 for tokens in expected), f"{name}: degenerate output {expected}"
    wide = make(name, 3, seed=0, window=1024)
    assert [hf_greedy(wide, p) for p in PROMPTS] != expected, name


@pytest.mark.parametrize("method", list(METHODS))
def test_speculative_greedy_equals_transformers(case, method):
    name, target, draft, expected = case
    options = dict(METHODS[method], draft=HFCausalLM(draft)) if method == "draft" else METHODS[method]
    out = specdec_cuda.generate(HFCausalLM(target), PROMPTS, method=method, max_new_tokens=NEW_TOKENS, **options)
    assert out.tokens == expected, f"{name} / {method}"


def test_cache_keeps_every_token_and_logits_follow_the_window(case):
    # Prefill and decode in pieces: the logits equal the raw model's on the whole sequence (its own
    # sliding-window mask), while the cache holds the whole sequence in plain DynamicLayers.
    from transformers.cache_utils import DynamicLayer

    name, target, _draft, _expected = case
    model = HFCausalLM(target)
    tokens = torch.randint(3, VOCAB, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = target(input_ids=tokens).logits
    cache = model.new_cache(2, 24)
    pieces, start = [], 0
    for n in (7, 1, 1, 5, 6):
        out = model.forward(tokens[:, start : start + n], torch.arange(start, start + n).expand(2, n), cache)
        cache.commit(torch.tensor([n, n]))
        pieces.append(out.logits)
        start += n
    tol = TOLERANCE.get(name, 1e-9)
    torch.testing.assert_close(torch.cat(pieces, 1), ref, rtol=tol, atol=tol)
    assert all(type(layer) is DynamicLayer for layer in cache.dynamic.layers), name
    assert all(layer.keys.shape[2] == 20 for layer in cache.dynamic.layers), name


def test_tree_logits_respect_the_window(case):
    # Tree nodes deeper than the window sit on top of a committed prefix: each node's logits equal
    # the model's on the linear sequence prompt + path to the node.
    name, target, _draft, _expected = case
    model = HFCausalLM(target)
    parents = [-1, 0, 0, 1, 3, 4, 2, 6]
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        depth.append(0 if p < 0 else depth[p] + 1)
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    prompt = torch.tensor([PROMPTS[0]])
    tree = torch.randint(3, VOCAB, (1, len(parents)), generator=torch.Generator().manual_seed(5))
    P = prompt.shape[1]
    cache = model.new_cache(1, 32)
    model.forward(prompt, torch.arange(P)[None], cache)
    cache.commit(torch.tensor([P]))
    out = model.forward(tree, torch.tensor([[P + d for d in depth]]), cache, tree_mask=mask[None])
    tol = TOLERANCE.get(name, 1e-9)
    for node in range(len(parents)):
        path = mask[node].nonzero()[:, 0]
        with torch.no_grad():
            ref = target(input_ids=torch.cat([prompt, tree[:, path]], 1)).logits[0, -1]
        torch.testing.assert_close(out.logits[0, node], ref, rtol=tol, atol=tol, msg=f"{name} node {node}")
