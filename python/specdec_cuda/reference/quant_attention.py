"""Plain-PyTorch specification of ``quant_kv_attention``: dequantise the whole cache, then SDPA.

Row ``b`` holds ``lengths[b]`` committed tokens; the ``n`` new tokens sit at ``lengths[b] + j``.
Query ``i`` reads token ``t``

* from the hierarchical codes (``reference.kv_quant``; upper only or upper + lower) when
  ``t < quant_len[b, i]``,
* from the float32 buffer, slot ``t - buffer_start[b]``, otherwise,

and sees it when ``t < lengths[b]``, or ``t = lengths[b] + j`` with ``j == i``, or ``j < i`` (no
tree mask) / ``tree_mask[b, i, j]``. Query head ``h`` uses KV head ``h // (Hq / Hkv)``.
"""

from __future__ import annotations

import torch

from .kv_quant import dequantize_keys, dequantize_values


def quant_kv_attention(q, cache: dict, k_buffer, v_buffer, quant_len, buffer_start, lengths, tree_mask,
                       key_group: int, value_group: int, use_lower: bool, sm_scale: float) -> torch.Tensor:
    """Shape: q ``[B, Hq, n, D]``; cache tensors as ``ops.kv_quant.allocate_kv_cache``; buffers
    ``[B, Hkv, F, D]``; quant_len ``[B, n]``; buffer_start, lengths ``[B]``; tree_mask ``[B, n, n]``
    bool or None.  Returns ``[B, Hq, n, D]`` float32."""
    B, Hq, n, D = q.shape
    Hkv = cache["k_upper"].shape[1]
    cap, F = cache["k_upper"].shape[2], k_buffer.shape[2]
    lower = cache["k_lower"] if use_lower else None
    kq = dequantize_keys(cache["k_upper"], lower, cache["k_scale"], cache["k_zero"], key_group)     # [B,Hkv,cap,D]
    lower = cache["v_lower"] if use_lower else None
    vq = dequantize_values(cache["v_upper"], lower, cache["v_scale"], cache["v_zero"], value_group)
    total = int(lengths.max()) + n
    t = torch.arange(total)
    out = torch.empty(B, Hq, n, D, dtype=torch.float32)
    for b in range(B):
        slot = (t - int(buffer_start[b])).clamp(0, F - 1)
        kf, vf = k_buffer[b][:, slot].float(), v_buffer[b][:, slot].float()                      # [Hkv,total,D]
        tq = t.clamp(max=cap - 1)
        for i in range(n):
            from_codes = (t < int(quant_len[b, i]))[None, :, None]
            k = torch.where(from_codes, kq[b][:, tq], kf)
            v = torch.where(from_codes, vq[b][:, tq], vf)
            j = t - int(lengths[b])
            if tree_mask is None:
                new_ok = j <= i
            else:
                new_ok = (j == i) | tree_mask[b, i][j.clamp(0, n - 1)].bool()
            seen = (j < 0) | ((j < n) & new_ok)                                                      # [total]
            k = k.repeat_interleave(Hq // Hkv, dim=0)                                                 # [Hq,total,D]
            v = v.repeat_interleave(Hq // Hkv, dim=0)
            out[b, :, i] = torch.nn.functional.scaled_dot_product_attention(
                q[b, :, i : i + 1].float(), k, v, attn_mask=seen[None, None, :], scale=sm_scale)[:, 0]
    return out
