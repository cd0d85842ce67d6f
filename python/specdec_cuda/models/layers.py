"""The decoder layer of the Llama/Qwen family: RMSNorm, grouped-query attention with RoPE over the
static cache, and the SwiGLU MLP.

Projections that read the same input are fused (q|k|v in one matmul, gate|up in one) to halve the
number of small matmuls per token; the loader concatenates the checkpoint's weights accordingly.
Inside a layer, projections and norms are called functionally (``F.linear`` on the modules'
parameters) rather than through ``nn.Module.__call__``: decoding small models on a CPU is bound by
per-op overhead, and the module call machinery costs as much as a small matmul. For the same
reason a layer reads its tensors from a tuple bound on first use (``DecoderLayer.bind``) instead
of through ``nn.Module.__getattr__`` (about 1 us per access, ~20 per layer per forward);
``LlamaModel`` drops the binding whenever ``.to()`` / ``to_empty()`` replace the parameters.
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
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype in (torch.float32, torch.float64):
        return F.rms_norm(x, weight.shape, weight, eps=eps)
    # Half precisions: normalise in fp32, round, then scale (Hugging Face's order).
    return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention; the new tokens' K/V go to the cache before attending."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
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
        weights: tuple,
    ) -> torch.Tensor:
        """``weights``: ``self.weights()``, bound by the caller.

        x [B, n, hidden]; k_cache/v_cache [B, H_kv, T_max, D]; slot_index [B, H_kv, n, D] (the
        pending slot of each new token, expanded); cos/sin [B, n, 1, D] from ``rope_cos_sin``;
        attn_mask [B, 1, n, span] additive (0 or -inf), or None: every slot of ``span`` visible."""
        B, n, _ = x.shape
        H, H_kv = self.num_heads, self.num_kv_heads
        qkv_w, qkv_b, o_w, o_b, q_norm_w, k_norm_w, eps = weights
        qkv = F.linear(x, qkv_w, qkv_b).view(B, n, H + 2 * H_kv, self.head_dim)
        if q_norm_w is not None:
            q = rms_norm(qkv[:, :, :H], q_norm_w, eps)
            k = rms_norm(qkv[:, :, H : H + H_kv], k_norm_w, eps)
            qk = torch.cat((q, k), dim=2)
        else:
            qk = qkv[:, :, : H + H_kv]
        qk = apply_rope(qk, cos, sin).transpose(1, 2)  # q and k heads rotated together: [B, H + H_kv, n, D]
        q, k = qk[:, :H], qk[:, H:]
        v = qkv[:, :, H + H_kv :].transpose(1, 2)  # [B, H_kv, n, D]
        k_cache.scatter_(2, slot_index, k)
        v_cache.scatter_(2, slot_index, v)
        out = F.scaled_dot_product_attention(
            q, k_cache[:, :, :span], v_cache[:, :, :span], attn_mask=attn_mask, enable_gqa=self.enable_gqa
        )
        return F.linear(out.transpose(1, 2).reshape(B, n, -1), o_w, o_b)

    def weights(self) -> tuple:
        """(qkv weight, qkv bias, o weight, o bias, q_norm weight, k_norm weight, eps); Nones where absent."""
        q_norm = self.q_norm
        return (self.qkv_proj.weight, self.qkv_proj.bias, self.o_proj.weight, self.o_proj.bias,
                None if q_norm is None else q_norm.weight, None if q_norm is None else self.k_norm.weight,
                self.q_norm.eps if q_norm is not None else 0.0)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(
            config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias, dtype=dtype
        )
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias, dtype=dtype)

    def forward(self, x: torch.Tensor, weights: tuple) -> torch.Tensor:
        """``weights``: ``self.weights()``, bound by the caller."""
        gate_up_w, gate_up_b, down_w, down_b = weights
        gate, up = F.linear(x, gate_up_w, gate_up_b).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, down_w, down_b)

    def weights(self) -> tuple:
        return self.gate_up_proj.weight, self.gate_up_proj.bias, self.down_proj.weight, self.down_proj.bias


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = Attention(config, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype)

        self._bound: tuple | None = None

    def bind(self) -> tuple:
        """The tensors forward reads, as one tuple (see the module docstring); call ``unbind`` after
        replacing parameters."""
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        self._bound = (n1.weight, n1.eps, n2.weight, n2.eps, self.self_attn.weights(), self.mlp.weights())
        return self._bound

    def unbind(self) -> None:
        self._bound = None

    def forward(self, x, cos, sin, k_cache, v_cache, slot_index, span, attn_mask) -> torch.Tensor:
        norm1_w, eps1, norm2_w, eps2, attn_w, mlp_w = self._bound or self.bind()
        h = rms_norm(x, norm1_w, eps1)
        x = x + self.self_attn.forward(h, cos, sin, k_cache, v_cache, slot_index, span, attn_mask, attn_w)
        return x + self.mlp.forward(rms_norm(x, norm2_w, eps2), mlp_w)
