"""``decoder_layer``: one Llama/Qwen decoder layer for the few token rows of a decoding or
verification forward on the CPU, as one op (``csrc/ops/decoder_layer_cpu.cpp``).

``LlamaModel`` runs it for forwards of up to ``models.layers.PACKED_MAX_ROWS`` token rows when its
weights are packed (``models/layers.py``): on a CPU, a small model's step is bound by per-op
overhead (about 35 torch ops per layer), and one op per layer removes it. The op computes
RMSNorm, the packed q|k|v projection (+ bias), q / k RMSNorm per head (Qwen3), RoPE, writes the
new tokens' K/V to the cache slots ``lengths[b] + i``, attends over the cache (the committed prefix,
then causal or tree-masked among the new tokens), the o projection, the residual, RMSNorm, SwiGLU
and the second residual. Each row's arithmetic is a fixed sequence on its own data: a token gets
the same bits decoded alone or verified with others. The reference is
``specdec_cuda.reference.decoder_layer``.

``decoder_layer_gguf`` (``torch.ops.specdec``) is the same layer over projections held as a GGUF
file's blocks (``GgufLinear``: q|k|v and gate|up as lists of parts, each in its own format); a GGUF
model (``models.load("x.gguf")``) runs it, and its tests hold it to a dense model of the
dequantised weights (``tests/test_gguf_model.py``).
"""

from __future__ import annotations

import torch

from .skinny_linear import PackedWeight, rounded_activations

__all__ = ["context_kv", "decoder_layer"]


def decoder_layer(x: torch.Tensor, norm1: torch.Tensor, norm2: torch.Tensor, eps: float, qkv: PackedWeight,
                  o: PackedWeight, gate_up: PackedWeight, down: PackedWeight, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, num_heads: int, *,
                  biases: tuple = (None, None, None, None), qk_norm: tuple | None = None,
                  tree_mask: torch.Tensor | None = None, sm_scale: float | None = None,
                  out: torch.Tensor | None = None, activations: str = "float32") -> torch.Tensor:
    """One decoder layer over ``x``; returns the layer's output and writes the caches' new slots.

    Shape: x ``[B, n, hidden]`` float32; norm1 / norm2 ``[hidden]``; the projections packed with
    ``pack_weight`` (q|k|v ``[(Hq + 2 Hkv) D, hidden]``, o ``[hidden, Hq D]``, gate|up ``[2 I,
    hidden]``, down ``[hidden, I]``); cos / signed sin ``[B, n, D]`` (``models.rope.rope_cos_sin``
    without its heads dim); k_cache / v_cache ``[B, Hkv, T, D]`` float32; lengths ``[B]`` int64;
    ``biases``: (q|k|v, o, gate|up, down) float32 or None; ``qk_norm``: (q weight, k weight) ``[D]``
    or None; tree_mask ``[B, n, n]`` bool or None (causal); sm_scale defaults to ``D ** -0.5``;
    ``out``: a contiguous float32 tensor of x's shape to write (not x itself), default a new one.
    ``activations``: "float32" (exact) or "bfloat16" (each projection's input rounded to bfloat16
    for bfloat16 panels on the AMX tier, ``packed_bf16_tier() == "amx"``; ignored elsewhere).
    """
    rounded = rounded_activations(activations)
    out = torch.empty_like(x) if out is None else out
    q_norm, k_norm = qk_norm if qk_norm is not None else (None, None)
    scale = k_cache.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)
    torch.ops.specdec.decoder_layer(
        x, norm1, norm2, float(eps), qkv.panels, biases[0], o.panels, biases[1], gate_up.panels, biases[2],
        down.panels, biases[3], q_norm, k_norm, cos, sin, k_cache, v_cache, lengths,
        None if tree_mask is None else tree_mask.to(torch.bool).contiguous(), num_heads, k_cache.shape[1], scale, out,
        1 if rounded else 0)
    return out


def context_kv(hidden: torch.Tensor, fc: PackedWeight, context_norm: torch.Tensor, kv: PackedWeight,
               kv_bias: torch.Tensor | None, k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor) -> None:
    """KV injection's context keys and values as one CPU op (the DFlash drafter's ``extend``):
    features ``RMSNorm(fc(hidden))``, every drafter layer's k|v projection of them, k normalised by
    that layer's ``k_norm`` and rotated, both written to the caches' slots ``lengths[b] + i``. As
    torch ops (``DFlashDrafter.context_features`` + ``context_kv``) this was ~15 small ops, about
    0.6 ms for three zoo tokens against a 2.2 ms target step.

    Shape: hidden ``[B, n, F]`` float32 (the target's hidden states at the layers read,
    concatenated); ``fc`` packed ``[H, F]``; context_norm ``[H]``; ``kv`` packed ``[L * 2 * Hkv * D,
    H]`` (per layer its k_proj then its v_proj) and kv_bias ``[L * 2 * Hkv * D]`` or None; k_norm
    ``[L, D]``; cos / signed sin ``[B, n, D]``; k_cache / v_cache ``[L, B, Hkv, T, D]`` float32,
    written; lengths ``[B]`` int64 (not changed)."""
    torch.ops.specdec.context_kv(hidden, fc.panels, context_norm, kv.panels, kv_bias, k_norm, float(eps), cos, sin,
                                 k_cache, v_cache, lengths)


@torch.library.register_fake("specdec::context_kv")
def _context_kv_fake(hidden, fc_w, context_norm, kv_w, kv_b, k_norm, norm_eps, cos, sin, k_cache, v_cache, lengths):
    return None


@torch.library.register_fake("specdec::decoder_layer")
def _decoder_layer_fake(x, norm1, norm2, norm_eps, qkv_w, qkv_b, o_w, o_b, gate_up_w, gate_up_b, down_w, down_b,
                        q_norm, k_norm, cos, sin, k_cache, v_cache, lengths, tree_mask, num_heads, num_kv_heads,
                        sm_scale, out, activations=0):
    return None


@torch.library.register_fake("specdec::decoder_layer_gguf")
def _decoder_layer_gguf_fake(x, norm1, norm2, norm_eps, weights, types, parts, activations, qkv_b, o_b, gate_up_b, down_b, q_norm,
                             k_norm, cos, sin, k_cache, v_cache, lengths, tree_mask, num_heads, num_kv_heads, sm_scale,
                             out):
    return None
