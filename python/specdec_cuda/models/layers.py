"""The decoder layer of the Llama/Qwen family: RMSNorm, grouped-query attention with RoPE over the
static cache, and the SwiGLU MLP.

Projections that read the same input are fused (q|k|v in one matmul, gate|up in one) to halve the
number of small matmuls per token; the loader concatenates the checkpoint's weights accordingly.
Inside a layer, projections and norms are called functionally (``F.linear`` on the modules'
parameters) rather than through ``nn.Module.__call__``: decoding small models on a CPU is bound by
per-op overhead, and the module call machinery costs as much as a small matmul. For the same
reason a layer reads its tensors from a tuple bound on first use (``DecoderLayer.bind``) instead
of through ``nn.Module.__getattr__`` (about 1 us per access, ~20 per layer per forward);
``LlamaModel`` drops the binding whenever ``.to()`` / ``to_empty()`` replace the parameters, and
whenever a parameter is written in place.

Bound with ``pack=True`` (what ``LlamaModel`` does for a float32 model on a CPU with AVX-512 or
AVX2), each projection also carries its weight packed for ``skinny_linear_packed`` (bfloat16 when
the values allow it exactly), and ``forward_packed`` runs the whole layer as one ``decoder_layer`` op: what
``LlamaModel`` does for decoding and verification forwards of up to ``PACKED_MAX_ROWS`` token rows
(per-op overhead, about 35 torch ops per layer, is most of a small model's step on a CPU). A
prefill runs ``forward``, through BLAS.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.skinny_linear import PackedWeight, pack_weight, packed_kernel_available
from .config import LlamaConfig
from .rope import apply_rope

# Token rows up to which a forward runs the packed path: one-token decoding, a verification of a
# chain or tree (Medusa's 64-node trees), a batch of 8 verifying up to 11 drafts each, a short
# prompt's prefill. bench/bench_cpu_layer.py on the v4 target, 200 tokens of context: 3.1x the torch
# path at 1 row, 1.7x at 33, 1.45x at 64, 1.22x at 96, 1.11x at 128 (the packed kernel's fixed order
# of multiply-adds, one chain per output, gives way to BLAS's blocking as rows grow); longer
# prefills go to BLAS.
PACKED_MAX_ROWS = 96


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            packed: PackedWeight | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, from ``packed`` when there is one and x has at most
    ``PACKED_MAX_ROWS`` rows. Shape: x [..., K] -> [..., N]."""
    if packed is not None and x.numel() <= PACKED_MAX_ROWS * x.shape[-1]:
        out = x.new_empty(*x.shape[:-1], packed.out_features)
        torch.ops.specdec.skinny_linear_packed(x, packed.panels, bias, out)
        return out
    return F.linear(x, weight, bias)


def packed_path_wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether tensors on ``device`` of ``dtype`` take the packed CPU decoding path: float32 on a
    CPU whose packed kernel is vectorised, unless the environment sets ``SPECDEC_PACKED_LINEAR=0``
    (read on each call, so a test or a user can switch it while a process runs)."""
    return (device.type == "cpu" and dtype == torch.float32 and os.environ.get("SPECDEC_PACKED_LINEAR", "1") != "0"
            and packed_kernel_available())


def maybe_pack(weight: torch.Tensor | None, pack: bool) -> PackedWeight | None:
    """``pack_weight(weight)`` when ``pack`` (bfloat16 panels when exact), else None."""
    return pack_weight(weight) if pack and weight is not None else None


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
        qkv_w, qkv_b, o_w, o_b, q_norm_w, k_norm_w, eps, qkv_p, o_p = weights
        qkv = project(x, qkv_w, qkv_b, qkv_p).view(B, n, H + 2 * H_kv, self.head_dim)
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
        return project(out.transpose(1, 2).reshape(B, n, -1), o_w, o_b, o_p)

    def weights(self, pack: bool = False) -> tuple:
        """(qkv weight, qkv bias, o weight, o bias, q_norm weight, k_norm weight, eps, packed qkv,
        packed o); Nones where absent (the packed ones unless ``pack``)."""
        q_norm = self.q_norm
        return (self.qkv_proj.weight, self.qkv_proj.bias, self.o_proj.weight, self.o_proj.bias,
                None if q_norm is None else q_norm.weight, None if q_norm is None else self.k_norm.weight,
                self.q_norm.eps if q_norm is not None else 0.0,
                maybe_pack(self.qkv_proj.weight, pack), maybe_pack(self.o_proj.weight, pack))


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
        gate_up_w, gate_up_b, down_w, down_b, gate_up_p, down_p = weights
        gate, up = project(x, gate_up_w, gate_up_b, gate_up_p).chunk(2, dim=-1)
        return project(F.silu(gate) * up, down_w, down_b, down_p)

    def weights(self, pack: bool = False) -> tuple:
        """(gate|up weight, its bias, down weight, its bias, packed gate|up, packed down)."""
        return (self.gate_up_proj.weight, self.gate_up_proj.bias, self.down_proj.weight, self.down_proj.bias,
                maybe_pack(self.gate_up_proj.weight, pack), maybe_pack(self.down_proj.weight, pack))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = Attention(config, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype)

        self._bound: tuple | None = None
        self._packed_args: tuple | None = None  # decoder_layer's weight arguments (bind(pack=True))

    def bind(self, pack: bool = False) -> tuple:
        """The tensors forward reads, as one tuple, with packed projection weights if ``pack`` (see
        the module docstring); call ``unbind`` after replacing or writing parameters."""
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        self._bound = (n1.weight, n1.eps, n2.weight, n2.eps, self.self_attn.weights(pack), self.mlp.weights(pack))

        self._packed_args = None
        if pack:
            attn, mlp = self._bound[4], self._bound[5]
            self._packed_args = (n1.weight, n2.weight, n1.eps, attn[7].panels, attn[1], attn[8].panels, attn[3],
                                 mlp[4].panels, mlp[1], mlp[5].panels, mlp[3], attn[4], attn[5])
        return self._bound

    def unbind(self) -> None:
        self._bound = self._packed_args = None

    def forward_packed(self, x, cos, sin, k_cache, v_cache, lengths, tree_mask) -> torch.Tensor:
        """The layer as one ``decoder_layer`` op (bound with ``pack=True``). x [B, n, hidden] float32;
        cos / sin [B, n, head_dim] (``rope_cos_sin``'s, heads dim dropped); k_cache / v_cache
        [B, H_kv, T_max, D]; lengths [B] int64; tree_mask [B, n, n] bool or None (causal). The new
        tokens' K/V go to slots ``lengths[b] + i``. One eps serves every norm (the config's)."""
        attn = self.self_attn
        out = torch.empty_like(x)
        torch.ops.specdec.decoder_layer(x, *self._packed_args, cos, sin, k_cache, v_cache, lengths, tree_mask,
                                        attn.num_heads, attn.num_kv_heads, attn.head_dim ** -0.5, out)
        return out

    def forward(self, x, cos, sin, k_cache, v_cache, slot_index, span, attn_mask) -> torch.Tensor:
        norm1_w, eps1, norm2_w, eps2, attn_w, mlp_w = self._bound or self.bind()
        h = rms_norm(x, norm1_w, eps1)
        x = x + self.self_attn.forward(h, cos, sin, k_cache, v_cache, slot_index, span, attn_mask, attn_w)
        return x + self.mlp.forward(rms_norm(x, norm2_w, eps2), mlp_w)
