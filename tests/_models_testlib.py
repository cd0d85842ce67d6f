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


def write_mimo_checkpoint(source: Path, folder: Path, num_mtp: int = 2, seed: int = 0, noise: float = 0.02) -> Path:
    """A MiMo-layout checkpoint (Qwen2 decoder + ``model.mtp_layers.{i}.*``) from a Llama/Qwen2
    checkpoint folder ``source``: its tensors (zero q/k/v biases added where it has none, as a
    Qwen2 block has them), ``model_type`` "mimo", and ``num_mtp`` MTP layers built to predict a
    little: each block a noisy copy of the source's layer 0, ``input_proj`` passing the next token's
    normed embedding (its hidden half small noise), the final norm the source's; so drafts are
    sometimes accepted and every path of the method runs."""
    import json

    from safetensors.torch import load_file, save_file

    source, folder = Path(source), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    tensors = {}
    for f in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    H = config["hidden_size"]
    q = config["num_attention_heads"] * config.get("head_dim", H // config["num_attention_heads"])
    kv = config["num_key_value_heads"] * config.get("head_dim", H // config["num_attention_heads"])
    dtype = tensors["model.norm.weight"].dtype
    for i in range(config["num_hidden_layers"]):
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            tensors.setdefault(f"model.layers.{i}.self_attn.{proj}_proj.bias", torch.zeros(rows, dtype=dtype))
    g = torch.Generator().manual_seed(seed)

    def noisy(t: torch.Tensor) -> torch.Tensor:
        return (t + noise * t.float().std().clamp(min=1e-3) * torch.randn(t.shape, generator=g)).to(dtype)

    for d in range(num_mtp):
        p = f"model.mtp_layers.{d}."
        for name, t in list(tensors.items()):
            if name.startswith("model.layers.0."):
                tensors[p + name[len("model.layers.0."):]] = noisy(t)
        proj = torch.zeros(H, 2 * H, dtype=dtype)
        proj[:, H:] = 0.3 * torch.eye(H, dtype=dtype)  # [hidden | embedding]: pass the embedding
        tensors[p + "input_proj.weight"] = noisy(proj)
        tensors[p + "token_layernorm.weight"] = noisy(torch.ones(H, dtype=dtype))
        tensors[p + "hidden_layernorm.weight"] = noisy(torch.ones(H, dtype=dtype))
        tensors[p + "final_layernorm.weight"] = noisy(tensors["model.norm.weight"])
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config.update(model_type="mimo", architectures=["MiMoForCausalLM"], num_nextn_predict_layers=num_mtp,
                  attention_bias=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
