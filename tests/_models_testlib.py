"""Shared helpers for the tests of specdec_cuda.models: tiny random checkpoints and tree helpers."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 101

# Tiny random-initialised checkpoints covering every switch of the built-in model.
FAMILIES = {
    # Llama 3 frequency scaling, GQA (4 heads over 2 KV heads), untied embeddings.
    "llama3": dict(
        cls="LlamaConfig",
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        rope_theta=500.0,
    ),
    # Llama with every bias, linear RoPE scaling, plain multi-head attention, tied embeddings.
    "llama_bias_tied": dict(
        cls="LlamaConfig",
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
    # Qwen2: q/k/v biases, multi-query attention, tied embeddings.
    "qwen2": dict(cls="Qwen2Config", num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True),
    # Qwen3: q/k RMSNorm, head_dim from config (24 != 64 / 4), untied embeddings.
    "qwen3": dict(cls="Qwen3Config", num_attention_heads=4, num_key_value_heads=2, head_dim=24),
}


def make_hf_model(family: str, seed: int = 0, **overrides):
    """A random-initialised tiny ``transformers`` causal LM of ``family`` (eval mode, fp32)."""
    import transformers

    spec = dict(FAMILIES[family])
    cls = getattr(transformers, spec.pop("cls"))
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        max_position_embeddings=256,
        # Larger than the default 0.02, so that attention patterns and logits are far from uniform
        # and a wrong mask or rotation shows in the logits.
        initializer_range=0.15,
    )
    kwargs.update(spec)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cls(**kwargs), attn_implementation="sdpa")
    return model.eval()


def save_checkpoint(model, folder: Path, **kwargs) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), **kwargs)
    return folder


def ancestors_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: (i, j) is True when node j is i or an ancestor of i (parents[root] = -1)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def depths(parents: list[int]) -> list[int]:
    out = []
    for i, p in enumerate(parents):
        out.append(0 if p < 0 else out[p] + 1)
    return out


def path_to(parents: list[int], node: int) -> list[int]:
    """Nodes from the root to ``node`` (inclusive)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
