"""Reference for ``decoder_layer``: the Llama/Qwen decoder layer in plain torch, one batch row at a
time, with unpacked ``[N, K]`` weights (the kernel's sums differ from it by rounding only); and for
``context_kv``, KV injection's context keys and values (the DFlash drafter)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    # x [n, heads, D]; cos / signed_sin [n, 1, D]: x * cos + roll(x, D / 2) * signed sin.
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def decoder_layer(x, norm1, norm2, eps, qkv_w, qkv_b, o_w, o_b, gate_up_w, gate_up_b, down_w, down_b,
                  q_norm, k_norm, cos, sin, k_cache, v_cache, lengths, tree_mask, num_heads, sm_scale=None,
                  activations="float32"):
    """Shape: x [B, n, hidden]; weights [N, K] (biases [N] or None); q_norm / k_norm [D] or None;
    cos / sin [B, n, D]; k_cache / v_cache [B, Hkv, T, D] (slots lengths[b] + i are written);
    lengths [B]; tree_mask [B, n, n] bool or None. Returns [B, n, hidden]. ``activations``
    "bfloat16": each projection's input rounded to nearest bfloat16 first."""
    if activations == "bfloat16":
        def linear(a, w, bias):
            return F.linear(a.to(torch.bfloat16).to(a.dtype), w, bias)
    else:
        linear = F.linear
    B, n, _ = x.shape
    Hkv, D = k_cache.shape[1], k_cache.shape[-1]
    Hq = num_heads
    scale = D ** -0.5 if sm_scale is None else sm_scale
    out = torch.empty_like(x)
    for b in range(B):
        L = int(lengths[b])
        h = _rms(x[b], norm1, eps)
        qkv = linear(h, qkv_w, qkv_b).view(n, Hq + 2 * Hkv, D)
        q, k, v = qkv[:, :Hq], qkv[:, Hq : Hq + Hkv], qkv[:, Hq + Hkv :]
        if q_norm is not None:
            q, k = _rms(q, q_norm, eps), _rms(k, k_norm, eps)
        q, k = _rope(q, cos[b, :, None], sin[b, :, None]), _rope(k, cos[b, :, None], sin[b, :, None])
        k_cache[b, :, L : L + n] = k.transpose(0, 1)
        v_cache[b, :, L : L + n] = v.transpose(0, 1)
        # Visibility [n, L + n]: the committed prefix, each new token itself, and j < i or the tree mask.
        new = torch.ones(n, n, dtype=torch.bool).tril() if tree_mask is None else tree_mask[b] | torch.eye(n, dtype=torch.bool)
        seen = torch.cat((torch.ones(n, L, dtype=torch.bool), new), dim=1)
        keys = k_cache[b, :, : L + n].repeat_interleave(Hq // Hkv, dim=0)  # [Hq, L + n, D]
        values = v_cache[b, :, : L + n].repeat_interleave(Hq // Hkv, dim=0)
        scores = torch.einsum("ihd,htd->hit", q, keys) * scale
        scores = scores.masked_fill(~seen[None], float("-inf"))
        attn = torch.einsum("hit,htd->ihd", scores.softmax(-1), values).reshape(n, Hq * D)
        y = x[b] + linear(attn, o_w, o_b)
        gate, up = linear(_rms(y, norm2, eps), gate_up_w, gate_up_b).chunk(2, dim=-1)
        out[b] = y + linear(F.silu(gate) * up, down_w, down_b)
    return out


def context_kv(hidden, fc_w, context_norm, kv_w, kv_b, k_norm, eps, cos, sin, k_cache, v_cache, lengths):
    """Shape: hidden [B, n, F]; fc_w [H, F]; context_norm [H]; kv_w [L * 2 * Hkv * D, H] (per layer
    k_proj then v_proj), kv_b or None; k_norm [L, D]; cos / sin [B, n, D]; k_cache / v_cache
    [L, B, Hkv, T, D] (slots lengths[b] + i are written); lengths [B]."""
    B, n, _ = hidden.shape
    L, _, Hkv, _, D = k_cache.shape
    for b in range(B):
        start = int(lengths[b])
        feats = _rms(F.linear(hidden[b], fc_w), context_norm, eps)  # [n, H]
        kv = F.linear(feats, kv_w, kv_b).view(n, L, 2, Hkv, D)
        for layer in range(L):
            k = _rope(_rms(kv[:, layer, 0], k_norm[layer], eps), cos[b, :, None], sin[b, :, None])  # [n, Hkv, D]
            k_cache[layer, b, :, start: start + n] = k.transpose(0, 1)
            v_cache[layer, b, :, start: start + n] = kv[:, layer, 1].transpose(0, 1)
