"""A masked-diffusion LM (LLaDA-style): a bidirectional Llama-style transformer with a mask token.

It is the Llama decoder without the causal mask: RMSNorm, grouped-query attention with RoPE, SwiGLU
MLP (the pieces of ``layers.py`` / ``rope.py``), and an LM head over the tokenizer's vocabulary plus
one extra id, the mask token. Given a sequence where some positions hold the mask token, it predicts
every position at once; generation (``specdec_cuda.diffusion_generate``) unmasks the most confident
ones step by step. The mask token's own logit is always -inf: it is never a prediction.

Checkpoint folder (written by ``save`` / ``zoo.diffusion`` in a source checkout): ``config.json`` with
``model_type: "specdec_diffusion"``, ``model.safetensors``, and the tokenizer files (with the mask
token added as a special token). ``load_diffusion(folder)`` refuses any other checkpoint with an
error naming what it found.

Shifted logits (Dream's "shift", ``config.shifted_logits``): a model adapted from an autoregressive LM
(``from_causal_lm``) keeps that LM's habit of predicting the *next* token: the hidden state at
position i predicts the token at i + 1. ``forward`` hides this: its logits are still aligned with
positions (logits[:, j] is the prediction for the token at fed position j, taken from the hidden
state of fed position j - 1), so the generator and the loss index them the same way for both
kinds. The first fed position has no left neighbour among the fed tokens: its logits are all -inf
(no prediction). Callers therefore never mask position 0 (the prompt is never empty), and a cached
forward feeds one already-known token before the positions it wants predicted.

Attention over an approximate KV cache (Fast-dLLM): ``forward(..., past=kv, past_valid=mask)``
lets the queried tokens attend to previously computed, already rotated keys/values of other
positions (a prefix, or a prefix and a suffix) as well as to themselves; ``return_kv=True``
returns every layer's K/V of the tokens fed, for such a cache.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .config import UnsupportedModelError
from .loader import read_checkpoint_config
from .layers import rms_norm
from .rope import apply_rope

MODEL_TYPE = "specdec_diffusion"
MASK_TOKEN = "<|mdm_mask|>"

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each [B, H_kv, T, D]


@dataclass
class DiffusionConfig:
    """Hyper-parameters of a ``DiffusionLM``; ``vocab_size`` counts the mask token."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    mask_token_id: int
    eos_token_id: int
    max_position: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    # True: the hidden state at i predicts the token at i + 1 (adapted from a causal LM); forward
    # still returns logits aligned with positions. False (trained from scratch): at i predicts i.
    shifted_logits: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must split into num_heads {self.num_heads}, "
                             f"and num_heads into num_kv_heads {self.num_kv_heads}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"head_dim {self.hidden_size // self.num_heads} must be even (RoPE)")
        if not 0 <= self.mask_token_id < self.vocab_size or not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} and eos_token_id {self.eos_token_id} "
                             f"must lie in [0, vocab_size {self.vocab_size})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict:
        return {"model_type": MODEL_TYPE, "architectures": ["SpecdecDiffusionLM"], **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "DiffusionConfig":
        if raw.get("model_type") != MODEL_TYPE:
            found = raw.get("model_type", "no model_type")
            arch = ", ".join(raw.get("architectures") or []) or "no architectures"
            raise UnsupportedModelError(
                f"{source}: a {found!r} checkpoint ({arch}), not a masked-diffusion LM; diffusion "
                f"generation needs a checkpoint of model_type {MODEL_TYPE!r} (a mask token and "
                f"bidirectional attention), e.g. one trained by the checkout's zoo.diffusion")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in raw and f.default is dataclasses.MISSING]
        if missing:
            raise ValueError(f"{source}: missing {missing}")
        return cls(**{k: v for k, v in raw.items() if k in names})


class DiffusionBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)) with full (bidirectional) attention, then x + mlp(norm(x))."""

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.eps = config.rms_norm_eps
        self.input_norm = nn.Parameter(torch.ones(h))
        self.qkv_proj = nn.Linear(h, (config.num_heads + 2 * config.num_kv_heads) * d, bias=False)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate_up_proj = nn.Linear(h, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)

    def forward(self, x, cos, sin, attn_mask, past_kv):
        """x [B, n, hidden]; cos/sin [B, n, 1, D]; attn_mask [B, 1, 1, P + n] additive or None;
        past_kv (k, v) [B, H_kv, P, D] or None. Returns (x, (k, v) of the n new tokens)."""
        B, n, _ = x.shape
        H, H_kv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(rms_norm(x, self.input_norm, self.eps)).view(B, n, H + 2 * H_kv, self.head_dim)
        qk = apply_rope(qkv[:, :, : H + H_kv], cos, sin).transpose(1, 2)  # [B, H + H_kv, n, D]
        q, k = qk[:, :H], qk[:, H:]
        v = qkv[:, :, H + H_kv:].transpose(1, 2)
        new_kv = (k, v)
        if past_kv is not None:
            k, v = torch.cat((past_kv[0], k), dim=2), torch.cat((past_kv[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=H != H_kv)
        x = x + self.o_proj(out.transpose(1, 2).reshape(B, n, -1))
        gate, up = self.gate_up_proj(rms_norm(x, self.post_norm, self.eps)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up), new_kv


class DiffusionLM(nn.Module):
    """Bidirectional transformer predicting every position of a partially masked sequence.

    Example
    -------
    >>> cfg = DiffusionConfig(vocab_size=11, hidden_size=16, intermediate_size=32, num_layers=1,
    ...                       num_heads=2, num_kv_heads=1, mask_token_id=10, eos_token_id=0)
    >>> model = DiffusionLM(cfg)
    >>> tokens = torch.tensor([[3, 4, 10, 10]])
    >>> model(tokens).logits.shape
    torch.Size([1, 4, 11])
    """

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DiffusionBlock(config) for _ in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        d = config.head_dim
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", torch.cat((inv, inv)), persistent=False)
        self.reset_parameters()

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def reset_parameters(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # residual projections scaled down with depth (GPT-2's rule) so deep stacks start stable
                scale = 1.0 / math.sqrt(2 * self.config.num_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                nn.init.normal_(p, std=std * scale)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        angles = positions.unsqueeze(-1).to(torch.float32) * self.inv_freq  # [B, n, D]
        half = self.inv_freq.shape[0] // 2
        sin = angles.sin()
        sin[..., :half].neg_()
        return angles.cos().to(dtype).unsqueeze(2), sin.to(dtype).unsqueeze(2)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                valid: torch.Tensor | None = None, past: KV | None = None,
                past_valid: torch.Tensor | None = None, return_kv: bool = False) -> "DiffusionOutput":
        """Logits of every fed position.

        Shape:
            tokens: [B, n] int64 (``mask_token_id`` where masked); positions: [B, n] int64 (RoPE
            positions; default 0 .. n-1); valid: [B, n] bool, False for padding that no token may
            attend to (default all True); past: per layer (k, v) [B, H_kv, P, D] of other positions,
            keys already rotated; past_valid: [B, P] bool (default all True).
            Returns logits [B, n, V] (the mask token's logit -inf; with ``shifted_logits`` the
            logits of fed position 0 are all -inf) and, with ``return_kv``, the fed tokens'
            per-layer (k, v) [B, H_kv, n, D].
        """
        B, n = tokens.shape
        if positions is None:
            positions = torch.arange(n, device=tokens.device).expand(B, n)
        if past is not None and len(past) != len(self.layers):
            raise ValueError(f"past has {len(past)} layers, the model {len(self.layers)}")
        keys_valid = valid
        if past is not None:
            P = past[0][0].shape[2]
            pv = past_valid if past_valid is not None else torch.ones(B, P, dtype=torch.bool, device=tokens.device)
            nv = valid if valid is not None else torch.ones(B, n, dtype=torch.bool, device=tokens.device)
            keys_valid = torch.cat((pv, nv), dim=1)
        x = self.embed_tokens(tokens)
        attn_mask = None
        if keys_valid is not None and not bool(keys_valid.all()):
            attn_mask = torch.zeros(keys_valid.shape, dtype=x.dtype, device=x.device)
            attn_mask = attn_mask.masked_fill(~keys_valid, -math.inf)[:, None, None, :]
        cos, sin = self._rope(positions, x.dtype)
        kvs: KV = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, attn_mask, None if past is None else past[i])
            if return_kv:
                kvs.append(kv)
        h = rms_norm(x, self.norm, self.config.rms_norm_eps)
        if self.config.shifted_logits:
            # the prediction for fed position j is the hidden state of j - 1; j = 0 has none
            h = h[:, :-1]
        logits = self.lm_head(h).float()
        if self.config.shifted_logits:
            logits = torch.cat((logits.new_full((B, 1, logits.shape[-1]), -math.inf), logits), dim=1)
        logits[..., self.config.mask_token_id] = -math.inf
        return DiffusionOutput(logits, kvs if return_kv else None)

    def save(self, folder: str | Path) -> None:
        """config.json + model.safetensors into ``folder`` (the tokenizer is saved by the caller)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2))
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(folder / "model.safetensors"))


@dataclass
class DiffusionOutput:
    logits: torch.Tensor  # [B, n, V] float32
    kv: KV | None = None


def from_causal_lm(folder: str | Path, mask_token_id: int | None = None,
                   eos_token_id: int | None = None) -> DiffusionLM:
    """A shifted masked-diffusion LM initialised from a causal LM checkpoint (Dream's recipe).

    Every shared weight (embedding, layers, final norm, LM head) is the causal LM's; the mask token
    is one new id, ``mask_token_id`` (default: the causal LM's vocabulary size, i.e. appended),
    whose embedding row starts as the mean of the others (an "average token") and whose LM-head
    row is zero (its logit is forced to -inf anyway). ``shifted_logits`` is set, so the hidden state
    at i keeps predicting the token at i + 1 as it did in the causal LM; only the attention becomes
    bidirectional, which training on the masked-diffusion objective then adapts to.

    Parameters
    ----------
    folder : a Llama-family checkpoint folder loadable by ``specdec_cuda.models.load`` (config.json
        + safetensors), e.g. the zoo target.
    mask_token_id : must equal the causal LM's vocabulary size when given (the mask is appended).
    eos_token_id : default: the checkpoint's first EOS id.

    Raises
    ------
    UnsupportedModelError : a feature the diffusion block lacks (biases, QK-norm, RoPE scaling, a
        head_dim other than hidden_size / num_heads); the message names it.
    ValueError : a ``mask_token_id`` other than the vocabulary size, or no EOS id anywhere.
    """
    from .loader import load

    ar = load(folder)
    ar.unpack()  # dense weights to copy from (a no-op unless the CPU path packed them)
    c = ar.config
    unsupported = [name for name, bad in (
        ("attention / MLP biases", c.qkv_bias or c.o_bias or c.mlp_bias), ("QK-norm", c.qk_norm),
        (f"rope_scaling {c.rope_scaling}", c.rope_scaling.get("rope_type", "default") != "default"),
        (f"head_dim {c.head_dim} != hidden_size / num_attention_heads",
         c.head_dim * c.num_attention_heads != c.hidden_size)) if bad]
    if unsupported:
        raise UnsupportedModelError(f"{folder}: cannot become a diffusion LM: {', '.join(unsupported)} "
                                    f"not supported by models.diffusion_lm")
    vocab = c.vocab_size
    if mask_token_id is not None and mask_token_id != vocab:
        raise ValueError(f"mask_token_id {mask_token_id} must be the causal LM's vocabulary size {vocab} "
                         f"(the mask token is appended after its vocabulary)")
    if eos_token_id is None:
        if not c.eos_token_id:
            raise ValueError(f"{folder}: no eos_token_id in its config; pass eos_token_id")
        eos_token_id = c.eos_token_id[0]
    config = DiffusionConfig(
        vocab_size=vocab + 1, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
        mask_token_id=vocab, eos_token_id=int(eos_token_id), max_position=c.max_position_embeddings,
        rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps, shifted_logits=True)
    model = DiffusionLM(config)
    with torch.no_grad():
        embed = ar.embed_tokens.weight.float()  # [vocab, hidden]
        model.embed_tokens.weight.copy_(torch.cat((embed, embed.mean(0, keepdim=True))))
        head = embed if ar.lm_head is None else ar.lm_head.weight.float()  # tied or not: [vocab, hidden]
        model.lm_head.weight.copy_(torch.cat((head, head.new_zeros(1, c.hidden_size))))
        model.norm.copy_(ar.norm.weight)
        for mine, theirs in zip(model.layers, ar.layers):
            mine.input_norm.copy_(theirs.input_layernorm.weight)
            mine.post_norm.copy_(theirs.post_attention_layernorm.weight)
            # both fuse [q; k; v] rows and [gate; up] rows in the same order
            mine.qkv_proj.weight.copy_(theirs.self_attn.qkv_proj.weight)
            mine.o_proj.weight.copy_(theirs.self_attn.o_proj.weight)
            mine.gate_up_proj.weight.copy_(theirs.mlp.gate_up_proj.weight)
            mine.down_proj.weight.copy_(theirs.mlp.down_proj.weight)
    return model


def is_diffusion_checkpoint(folder: str | Path) -> bool:
    """Whether ``folder/config.json`` declares a masked-diffusion LM of this project."""
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, json.JSONDecodeError):
        return False


def load_diffusion(folder: str | Path, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> DiffusionLM:
    """Load a ``DiffusionLM`` checkpoint folder.

    Raises
    ------
    FileNotFoundError : no such folder, or no config.json / model.safetensors in it.
    UnsupportedModelError (a ValueError) : the folder holds another kind of checkpoint (a causal
        LM, say); the message names its model_type and architectures.
    ValueError : tensors missing from the file or of the wrong shape.
    """
    from safetensors.torch import load_file

    folder, config_path, raw = read_checkpoint_config(folder, "a diffusion LM checkpoint folder")
    config = DiffusionConfig.from_dict(raw, source=str(config_path))
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no model.safetensors")
    model = DiffusionLM(config)
    state = load_file(str(weights))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{weights}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{weights}: {name} has shape {tuple(tensor.shape)}, the config implies "
                             f"{tuple(expected[name].shape)}")
    model.load_state_dict(state)
    model.requires_grad_(False)
    return model.to(device=device, dtype=dtype).eval()
