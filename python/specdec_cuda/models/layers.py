"""The decoder layer of the Llama/Qwen family: RMSNorm, grouped-query attention with RoPE over the
static cache, and the SwiGLU MLP.

Projections that read the same input are fused (q|k|v in one matmul, gate|up in one) to halve the
number of small matmuls per token; the loader concatenates the checkpoint's weights accordingly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import LlamaConfig
from .rope import apply_rope


class RMSNorm(nn.Module):
    """x / rms(x) * weight, normalised in fp32 (fp64 for fp64 inputs) like Hugging Face."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float32, torch.float64):
            return self.weight * F.rms_norm(x, x.shape[-1:], eps=self.eps)
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention; the new tokens' K/V go to the cache before attending."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.qkv_proj = nn.Linear(config.hidden_size, q_dim + 2 * kv_dim, bias=config.qkv_bias, dtype=dtype)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.o_bias, dtype=dtype)
        if config.qk_norm:  # Qwen3: RMSNorm over head_dim of each head, before RoPE
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        else:
            self.q_norm = self.k_norm = None
        self.enable_gqa = self.num_heads != self.num_kv_heads

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_index: torch.Tensor,
        span: int,
        attn_mask: torch.Tensor,
    ) -> torch.Tensor:
        """x [B, n, hidden]; k_cache/v_cache [B, H_kv, T_max, D]; slot_index [B, H_kv, n, D] (the
        pending slot of each new token, expanded); attn_mask [B, 1, n, span] bool."""
        B, n, _ = x.shape
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(B, n, self.num_heads, self.head_dim)
        k = k.view(B, n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, H, n, D]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, H_kv, n, D]
        v = v.view(B, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        k_cache.scatter_(2, slot_index, k)
        v_cache.scatter_(2, slot_index, v)
        out = F.scaled_dot_product_attention(
            q, k_cache[:, :, :span], v_cache[:, :, :span], attn_mask=attn_mask, enable_gqa=self.enable_gqa
        )
        return self.o_proj(out.transpose(1, 2).reshape(B, n, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(
            config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias, dtype=dtype
        )
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = Attention(config, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x, cos, sin, k_cache, v_cache, slot_index, span, attn_mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, slot_index, span, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))
