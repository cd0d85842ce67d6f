"""The configuration of the built-in Llama/Qwen-family model, read from a Hugging Face config.json.

The three supported families differ only in a few switches:

==========  =====================  ==========================  ============
family      q/k/v bias             q/k RMSNorm (per head)      o_proj bias
==========  =====================  ==========================  ============
llama       ``attention_bias``     no                          ``attention_bias``
qwen2       always                 no                          no
qwen3       ``attention_bias``     yes                         ``attention_bias``
==========  =====================  ==========================  ============

RoPE: ``default``, ``linear`` and ``llama3`` frequency scaling, read from ``rope_parameters``
(transformers 5) or ``rope_theta`` + ``rope_scaling`` (older checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# model_type -> family, and the architectures that map to it.
# MiMo (Xiaomi) is a Qwen2 decoder with MTP layers beside it (read by native_mtp.py).
SUPPORTED_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mimo": "qwen2"}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MiMoForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """A checkpoint this model cannot run (unknown family or an unsupported feature)."""


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama/Qwen2/Qwen3 decoder (the names of Hugging Face config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # rope_type plus its parameters (factor, low_freq_factor, ...), as in config.json.
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    family: str = "llama"
    eos_token_id: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )

    @property
    def num_kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], source: str = "config.json") -> "LlamaConfig":
        """Parse a Hugging Face config dict; raise UnsupportedModelError naming the family if unknown."""
        if not isinstance(cfg, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
        family = family_of(cfg, source)
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
        if cfg.get("use_sliding_window", False) and cfg.get("sliding_window") is not None:
            raise UnsupportedModelError(f"{source}: sliding-window attention (use_sliding_window) is not supported")
        layer_types = cfg.get("layer_types") or []
        if any(t != "full_attention" for t in layer_types):
            raise UnsupportedModelError(f"{source}: only full_attention layers are supported, got {layer_types}")

        def positive(key: str, default=None) -> int:
            value = cfg.get(key, default)
            if value is None:
                raise ValueError(f"{source}: {key} is missing")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
                raise ValueError(f"{source}: {key} must be a positive integer, got {value!r}")
            return int(value)

        num_heads = positive("num_attention_heads")
        hidden = positive("hidden_size")
        for key in ("vocab_size", "intermediate_size", "num_hidden_layers"):
            positive(key)
        if cfg.get("num_key_value_heads") is not None:
            positive("num_key_value_heads")
        if cfg.get("head_dim") is not None:
            positive("head_dim")
        elif hidden % num_heads:
            raise ValueError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads "
                             f"{num_heads} and no head_dim is given")
        head_dim = cfg.get("head_dim") or hidden // num_heads
        attention_bias = bool(cfg.get("attention_bias", False))
        eos_ids = eos_token_ids(cfg.get("eos_token_id"))
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(cfg),
            rope_scaling=_rope_scaling(cfg),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            family=family,
            eos_token_id=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
        )


def eos_token_ids(eos: int | list[int] | None) -> tuple[int, ...]:
    """config.json / generation_config.json ``eos_token_id`` (an int, a list or null) as a tuple."""
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def family_of(cfg: dict[str, Any], source: str = "config.json") -> str:
    """The supported family of a config dict, by ``model_type`` then ``architectures``."""
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in SUPPORTED_FAMILIES:
        return SUPPORTED_FAMILIES[model_type]
    architectures = cfg.get("architectures") or []
    for arch in architectures if isinstance(architectures, list) else []:
        if isinstance(arch, str) and arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    arch_names = ", ".join(map(str, architectures)) if isinstance(architectures, list) else str(architectures)
    name = model_type or arch_names or "<no model_type>"
    raise UnsupportedModelError(
        f"{source}: model family {name!r} is not supported by the built-in model; supported families: "
        f"{', '.join(SUPPORTED_FAMILIES)} (model_type) / {', '.join(_ARCHITECTURES)}. "
        "Wrap a transformers model with specdec_cuda.models.HFCausalLM for other families."
    )


def _rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta)


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any]:
    # transformers 5 writes everything into rope_parameters; older files use rope_scaling (with "type"
    # or "rope_type") and keep rope_theta at the top level.
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "rope_type" not in params:
        params["rope_type"] = params.pop("type", "default")
    params.pop("rope_theta", None)
    if params["rope_type"] == "llama3":
        params.setdefault(
            "original_max_position_embeddings",
            cfg.get("original_max_position_embeddings", cfg.get("max_position_embeddings")),
        )
    return params
