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


# Tiny main models (2 decoder layers, float64) of the architectures whose checkpoints carry MTP
# layers that run on transformers' blocks (models/native_mtp_hf.py): config class and arguments.
_HF_MTP_COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, initializer_range=0.1)
HF_MTP_ARCHITECTURES = {
    # MLA with a low-rank query, interleaved RoPE; layer 0 dense, layer 1 MoE with grouped routing.
    "deepseek_v3": ("DeepseekV3Config", dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                                             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                             n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                                             n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
                                             routed_scaling_factor=2.5)),
    # GQA with q/k norms, biases and half-dimension RoPE; layer 0 dense, layer 1 MoE.
    "glm4_moe": ("Glm4MoeConfig", dict(num_key_value_heads=2, head_dim=8, use_qk_norm=True, attention_bias=True,
                                       n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                       n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
                                       routed_scaling_factor=1.5)),
    # A gated-delta-net layer, then a full gated-attention layer; both MoE with a gated shared expert.
    "qwen3_next": ("Qwen3NextConfig", dict(num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                           linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                                           linear_value_head_dim=8,
                                           layer_types=["linear_attention", "full_attention"])),
}


def write_hf_mtp_checkpoint(layout: str, folder: Path, num_mtp: int, seed: int = 0, noise: float = 0.1,
                            **overrides) -> Path:
    """A tiny float64 checkpoint of ``layout`` (``deepseek_v3``, ``glm4_moe``, ``qwen3_next``) with
    ``num_mtp`` MTP layers in the checkpoint's own layout, as transformers saves the main model
    (experts one by one). Each MTP block is a noisy copy of main layer 1 (an MoE layer; Qwen3-Next's
    full-attention one), the [embedding; hidden] projection passes the next token's normed embedding
    (its hidden half small noise), the final norm the model's; so drafts are sometimes accepted.
    DeepSeek / GLM: MTP layer 0 stores exact copies of the embeddings and LM head (as DeepSeek-V3
    does), layer 1 a noisy LM head of its own. Routers get non-zero correction biases. ``overrides``:
    config arguments (e.g. ``vocab_size``)."""
    import json

    import transformers
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    cls, kwargs = HF_MTP_ARCHITECTURES[layout]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**{**_HF_MTP_COMMON, **kwargs, **overrides}),
                                                          attn_implementation="sdpa", experts_implementation="eager")
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
        for name, p in model.named_parameters():  # zero-centred norms start at 0: make them matter
            if layout == "qwen3_next" and name.endswith("norm.weight"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    model.double().save_pretrained(str(folder))
    tensors = load_file(str(folder / "model.safetensors"))
    H, N = _HF_MTP_COMMON["hidden_size"], _HF_MTP_COMMON["num_hidden_layers"]

    def noisy(t: torch.Tensor) -> torch.Tensor:
        return t + noise * t.std().clamp(min=1e-3) * torch.randn(t.shape, generator=g, dtype=t.dtype)

    def projection() -> torch.Tensor:  # [embedding | hidden]
        proj = noise * torch.randn(H, 2 * H, generator=g, dtype=torch.float64) / H ** 0.5
        proj[:, :H] += torch.eye(H, dtype=torch.float64)
        return proj

    if layout == "qwen3_next":
        for d in range(num_mtp):
            for name, t in list(tensors.items()):
                if name.startswith("model.layers.1."):
                    tensors[f"mtp.layers.{d}." + name[len("model.layers.1."):]] = noisy(t)
        tensors["mtp.fc.weight"] = projection()
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
            tensors[f"mtp.{name}.weight"] = 0.2 * torch.randn(H, generator=g, dtype=torch.float64)
        tensors["mtp.norm.weight"] = noisy(tensors["model.norm.weight"])
    else:
        for d in range(num_mtp):
            p = f"model.layers.{N + d}."
            for name, t in list(tensors.items()):
                if name.startswith("model.layers.1."):
                    tensors[p + name[len("model.layers.1."):]] = noisy(t)
            tensors[p + "eh_proj.weight"] = projection()
            tensors[p + "enorm.weight"] = noisy(torch.ones(H, dtype=torch.float64))
            tensors[p + "hnorm.weight"] = noisy(torch.ones(H, dtype=torch.float64))
            tensors[p + "shared_head.norm.weight"] = noisy(tensors["model.norm.weight"])
            head = tensors["lm_head.weight"]
            tensors[p + "shared_head.head.weight"] = head.clone() if d == 0 else noisy(head)
            if d == 0:
                tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = num_mtp
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def load_hf_mtp_target(folder: Path):
    """The main model of a ``write_hf_mtp_checkpoint`` folder, loaded by transformers (which drops
    the MTP tensors), float64, as an ``HFCausalLM``."""
    import transformers

    from specdec_cuda.models import HFCausalLM

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64,
                                                              attn_implementation="sdpa",
                                                              experts_implementation="eager")
    return HFCausalLM(model.eval())


def random_exit_adapter(model, exit_layer: int = 1, mlp: int = 8, ids=None, seed: int = 1, std: float = 0.3):
    """An exit adapter (``models.exit_adapter``) for ``model`` with random weights, the output
    projections included (an untrained one is the plain early exit), over ``ids`` (default: every
    id), attached to the model."""
    from specdec_cuda.models.exit_adapter import ExitAdapter, ExitAdapterConfig

    ids = torch.arange(model.vocab_size) if ids is None else torch.as_tensor(ids)
    config = ExitAdapterConfig.for_target(model, exit_layer=exit_layer, intermediate_size=mlp,
                                          draft_vocab_size=ids.numel())
    adapter = ExitAdapter.initial(config, seed=seed, std=std, draft_ids=ids)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in (adapter.o_proj.weight, *([adapter.down_proj.weight] if mlp else [])):
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return adapter.attach(model)
