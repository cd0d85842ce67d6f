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

On a CPU with AVX-512 or AVX2, ``LlamaModel`` keeps its projections packed for
``skinny_linear_packed`` instead (``DecoderLayer.pack_weights``: column panels, bfloat16 for a
bf16 model or when a float32 weight's values allow it exactly) and drops the dense weights, so a
model of several GB is held once; ``forward_packed`` then runs the whole layer as one
``decoder_layer`` op for every forward, decoding, verification and prefill alike (per-op overhead,
about 35 torch ops per layer, is most of a small model's step on a CPU, and a large model's step is
the weight stream, which the op reads once for all the rows). Each row's bits do not depend on the
other rows, so a prefill's K/V are the ones token-by-token decoding would write.
``bind(pack=True)`` on a layer with dense weights (the MTP modules' blocks, small) packs copies
instead and keeps both: ``forward`` then runs up to ``PACKED_MAX_ROWS`` rows from the copies and
longer inputs through BLAS.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.gguf import (LINEAR_ACTIVATIONS, GgufLinear, bf16_tiles_available, gguf_dequantize, gguf_linear,
                       q8k_prefill_pays)
from ..ops.skinny_linear import PANEL as PACKED_PANEL  # outputs per panel of a packed weight
from ..ops.skinny_linear import PackedWeight, pack_weight, packed_bf16_tier, packed_kernel_available, unpack_weight
from .config import LlamaConfig
from .rope import apply_rope

# Token rows per decoder_layer call in a long causal forward of a packed model (a prefill runs in
# chunks of this many rows, each chunk's K/V written before the next attends to them; the chunks
# bound the op's scratch, [rows, hidden + qkv + attention + 3 * intermediate] floats, 12 MB here
# for Qwen2.5-1.5B). For layers holding both dense weights and packed copies (MTP blocks), the
# rows up to which ``project`` reads the copies: bench/bench_cpu_layer.py on the v4 target, 200
# tokens of context: 3.1x the torch path at 1 row, 1.7x at 33, 1.45x at 64, 1.22x at 96, 1.11x at
# 128; longer inputs go to BLAS there.
PACKED_MAX_ROWS = 96


def project(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
            packed: PackedWeight | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, from ``packed`` when there is one and x has at most
    ``PACKED_MAX_ROWS`` rows, or whenever ``weight`` is None (a packed model keeps only its
    panels). The packed product runs in float32 (bias included) and comes back in x's dtype.
    Shape: x [..., K] -> [..., N]."""
    if isinstance(packed, GgufLinear):  # a GGUF model's blocks (its only copy of the weight)
        out = gguf_linear(x.float(), packed, bias)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    if packed is not None and (weight is None or x.numel() <= PACKED_MAX_ROWS * x.shape[-1]):
        xf = x.float().contiguous()
        out = xf.new_empty(*x.shape[:-1], packed.out_features)
        torch.ops.specdec.skinny_linear_packed(xf, packed.panels, None if bias is None else bias.float(), out)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    return F.linear(x, weight, bias)


def packed_path_wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether tensors on ``device`` of ``dtype`` take the packed CPU decoding path: float32 on a
    CPU whose packed kernel is vectorised, unless the environment sets ``SPECDEC_PACKED_LINEAR=0``
    (read on each call, so a test or a user can switch it while a process runs)."""
    return (device.type == "cpu" and dtype == torch.float32 and os.environ.get("SPECDEC_PACKED_LINEAR", "1") != "0"
            and packed_kernel_available())


def packable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model of ``dtype`` on ``device`` keeps its weights packed (``LlamaModel``): float32
    or bfloat16 on a CPU whose packed kernel is vectorised, unless ``SPECDEC_PACKED_LINEAR=0``."""
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and os.environ.get("SPECDEC_PACKED_LINEAR", "1") != "0" and packed_kernel_available())


def dense_of(stored: PackedWeight | GgufLinear, dtype: torch.dtype) -> torch.Tensor:
    """The dense ``[N, K]`` weight a packed or GGUF projection holds, in ``dtype`` (a packed
    weight's exact values; a GGUF one dequantised exactly to float32, then cast)."""
    if isinstance(stored, GgufLinear):
        return torch.cat([gguf_dequantize(p) for p in stored.parts]).to(dtype)
    return unpack_weight(stored, dtype)


def maybe_pack(weight: torch.Tensor | None, pack: bool) -> PackedWeight | None:
    """``pack_weight(weight)`` when ``pack`` (bfloat16 panels when exact), else None."""
    return pack_weight(weight) if pack and weight is not None else None


def dropped(weight: torch.Tensor) -> nn.Parameter:
    """What stands in for a weight whose values moved into panels: a meta tensor of its shape and
    dtype (no memory; reading it into a CPU op fails loudly, and an in-place write moves its version
    counter, which ``LlamaModel`` checks before each forward)."""
    return nn.Parameter(torch.empty(weight.shape, dtype=weight.dtype, device="meta"), requires_grad=False)


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    # The decoder_layer op's norms and biases are float32: a float32 tensor by reference, else a copy.
    return None if t is None else t.float()


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
        # Under autocast (drafter training) the rotated k comes back float32 and v bfloat16: both
        # are written in the cache's dtype (a no-op when they already match, as in decoding).
        k_cache.scatter_(2, slot_index, k.to(k_cache.dtype))
        v_cache.scatter_(2, slot_index, v.to(v_cache.dtype))
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
        # The projections' panels when the layer keeps only those (pack_weights), or their GGUF blocks
        # (set_gguf), keyed like PROJECTIONS.
        self._panels: dict[str, PackedWeight | GgufLinear] | None = None
        self._gguf_args: tuple | None = None  # decoder_layer_gguf's weight arguments (a GGUF layer)

    # The four projections' names (keys of ``linears()`` and ``panels``), in decoder_layer's order.
    PROJECTIONS = ("qkv", "o", "gate_up", "down")

    def linears(self) -> dict[str, nn.Linear]:
        a, m = self.self_attn, self.mlp
        return {"qkv": a.qkv_proj, "o": a.o_proj, "gate_up": m.gate_up_proj, "down": m.down_proj}

    @property
    def panels(self) -> dict[str, PackedWeight | GgufLinear] | None:
        """The packed (or GGUF) projections when the layer keeps only those, else None."""
        return self._panels

    @property
    def gguf(self) -> bool:
        """Whether the projections are GGUF blocks (``set_gguf``)."""
        return self._panels is not None and isinstance(self._panels["qkv"], GgufLinear)

    def set_gguf(self, weights: dict[str, GgufLinear]) -> list[nn.Parameter]:
        """Keep the four projections as GGUF blocks (keys: ``PROJECTIONS``; each ``[N, K]`` as the
        dense weight's shape; one ``activations`` mode for all four) and drop the dense weights
        (``dropped``); returns the stand-ins. ``unpack_weights`` dequantises them back."""
        if len({w.activations for w in weights.values()}) != 1:
            raise ValueError("a GGUF layer's four projections take one activations mode")
        for name, linear in self.linears().items():
            w = weights[name]
            if (w.out_features, w.in_features) != tuple(linear.weight.shape):
                raise ValueError(f"GGUF weight {name} is [{w.out_features}, {w.in_features}]; the layer's "
                                 f"{name} is {list(linear.weight.shape)}")
        self._panels, stand_ins = dict(weights), []
        for linear in self.linears().values():
            linear.weight = dropped(linear.weight)
            stand_ins.append(linear.weight)
        self.unbind()
        return stand_ins

    def pack_weights(self) -> list[nn.Parameter]:
        """Move the four projection weights into panels (``pack_weight``: bfloat16 when exact) and
        drop the dense ones (``dropped``); returns the stand-ins. ``unpack_weights`` undoes it."""
        self._panels, stand_ins = {}, []
        for name, linear in self.linears().items():
            self._panels[name] = pack_weight(linear.weight)
            linear.weight = dropped(linear.weight)  # frees the dense weight
            stand_ins.append(linear.weight)
        self.unbind()
        return stand_ins

    def unpack_weights(self, device: torch.device, values: bool = True) -> None:
        """Dense projection weights again (the panels' exact values, or uninitialised when not
        ``values``), the panels dropped."""
        if self._panels is None:
            return
        for name, linear in self.linears().items():
            dtype = linear.weight.dtype
            dense = (dense_of(self._panels[name], dtype) if values
                     else torch.empty(linear.weight.shape, dtype=dtype, device=device))
            linear.weight = nn.Parameter(dense, requires_grad=False)
            del self._panels[name]  # one projection's dense and packed forms at a time
        self._panels = None
        self.unbind()

    def dense_linear(self, name: str) -> nn.Linear:
        """Projection ``name`` (see ``PROJECTIONS``) as an ``nn.Linear`` with dense weights: the
        layer's own module, or a new one unpacked from the panels (a copy, for callers that need the
        matrix, e.g. to quantise it)."""
        linear = self.linears()[name]
        if self._panels is None:
            return linear
        dense = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          device="meta", dtype=linear.weight.dtype)
        dense.weight = nn.Parameter(dense_of(self._panels[name], linear.weight.dtype), requires_grad=False)
        dense.bias = linear.bias
        return dense

    def bind(self, pack: bool = False) -> tuple:
        """The tensors forward reads, as one tuple, with packed projection weights if ``pack`` or if
        the layer keeps only panels (dense weights None then); see the module docstring. Call
        ``unbind`` after replacing or writing parameters."""
        n1, n2, attn, mlp = self.input_layernorm, self.post_attention_layernorm, self.self_attn, self.mlp
        if self._panels is not None:
            p = self._panels
            q_norm = attn.q_norm
            attn_w = (None, attn.qkv_proj.bias, None, attn.o_proj.bias,
                      None if q_norm is None else q_norm.weight, None if q_norm is None else attn.k_norm.weight,
                      q_norm.eps if q_norm is not None else 0.0, p["qkv"], p["o"])
            mlp_w = (None, mlp.gate_up_proj.bias, None, mlp.down_proj.bias, p["gate_up"], p["down"])
        else:
            attn_w, mlp_w = attn.weights(pack), mlp.weights(pack)
        self._bound = (n1.weight, n1.eps, n2.weight, n2.eps, attn_w, mlp_w)

        self._packed_args = self._gguf_args = None
        if self.gguf:
            weights = [p.data for name in self.PROJECTIONS for p in self._panels[name].parts]
            types = [p.qtype for name in self.PROJECTIONS for p in self._panels[name].parts]
            parts = [len(self._panels[name].parts) for name in self.PROJECTIONS]
            mode = LINEAR_ACTIVATIONS.index(self._panels["qkv"].activations)
            self._gguf_args = (_f32(n1.weight), _f32(n2.weight), n1.eps, weights, types, parts, mode, _f32(attn_w[1]),
                               _f32(attn_w[3]), _f32(mlp_w[1]), _f32(mlp_w[3]), _f32(attn_w[4]), _f32(attn_w[5]))
        elif pack or self._panels is not None:
            self._packed_args = (_f32(n1.weight), _f32(n2.weight), n1.eps, attn_w[7].panels, _f32(attn_w[1]),
                                 attn_w[8].panels, _f32(attn_w[3]), mlp_w[4].panels, _f32(mlp_w[1]),
                                 mlp_w[5].panels, _f32(mlp_w[3]), _f32(attn_w[4]), _f32(attn_w[5]))
        return self._bound

    def unbind(self) -> None:
        self._bound = self._packed_args = self._gguf_args = None

    def prefill_on_tiles(self) -> bool:
        """Whether a prompt's prefill of this layer runs on kernels of its own: on a CPU with
        AMX-BF16, AMX tiles with bfloat16-rounded activations (a GGUF layer: ``gguf_linear``'s
        ``activations="bf16"``, its blocks decoded to bfloat16; or one of bfloat16 panels: one tile
        product per weight instead of the exact three-way split's three); on a VNNI CPU without
        AMX, a GGUF layer's ``activations="q8k"`` (``q8k_prefill_pays``). Their bits are not those
        of the layer's decoding kernels, which every verification row keeps."""
        if self.gguf:
            return bf16_tiles_available() or q8k_prefill_pays()
        packed = self._panels["qkv"].panels if self._panels is not None else (
            self._packed_args[3] if self._packed_args is not None else None)
        return packed is not None and packed.dtype == torch.bfloat16 and packed_bf16_tier() == "amx"

    def forward_packed(self, x, cos, sin, k_cache, v_cache, lengths, tree_mask, prefill: bool = False) -> torch.Tensor:
        """The layer as one ``decoder_layer`` op (bound with ``pack=True`` or packed). x [B, n,
        hidden] float32; cos / sin [B, n, head_dim] float32 (``rope_cos_sin``'s, heads dim dropped);
        k_cache / v_cache [B, H_kv, T_max, D] float32; lengths [B] int64; tree_mask [B, n, n] bool
        or None (causal). The new tokens' K/V go to slots ``lengths[b] + i``. One eps serves every
        norm (the config's). A GGUF layer runs ``decoder_layer_gguf`` over its blocks instead. A
        ``prefill`` (a prompt's, or any forward of a model set to bfloat16 activations:
        ``LlamaModel.set_activations``) runs the prefill kernels where ``prefill_on_tiles()``."""
        if self._packed_args is None and self._gguf_args is None:
            self.bind(pack=True)
        attn = self.self_attn
        out = torch.empty_like(x)
        if self._gguf_args is not None:
            args = self._gguf_args
            if prefill and self.prefill_on_tiles():  # the activations mode: AMX tiles, else Q8K
                mode = "bf16" if bf16_tiles_available() else "q8k"
                args = args[:6] + (LINEAR_ACTIVATIONS.index(mode),) + args[7:]
            torch.ops.specdec.decoder_layer_gguf(x, *args, cos, sin, k_cache, v_cache, lengths, tree_mask,
                                                 attn.num_heads, attn.num_kv_heads, attn.head_dim ** -0.5, out)
            return out
        torch.ops.specdec.decoder_layer(x, *self._packed_args, cos, sin, k_cache, v_cache, lengths, tree_mask,
                                        attn.num_heads, attn.num_kv_heads, attn.head_dim ** -0.5, out,
                                        1 if prefill and self.prefill_on_tiles() else 0)
        return out

    def forward(self, x, cos, sin, k_cache, v_cache, slot_index, span, attn_mask) -> torch.Tensor:
        norm1_w, eps1, norm2_w, eps2, attn_w, mlp_w = self._bound or self.bind()
        h = rms_norm(x, norm1_w, eps1)
        x = x + self.self_attn.forward(h, cos, sin, k_cache, v_cache, slot_index, span, attn_mask, attn_w)
        return x + self.mlp.forward(rms_norm(x, norm2_w, eps2), mlp_w)
