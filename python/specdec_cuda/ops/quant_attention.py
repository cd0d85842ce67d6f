"""Attention over the hierarchical 4-bit KV cache: ``quant_kv_attention``.

The cache is the quantised storage of ``ops.kv_quant`` (keys grouped along tokens, values along
channels, upper and lower 4-bit halves) plus a float32 buffer of recent tokens. The kernel
dequantises inside the attention loop (never the whole cache at once): each (row, KV head) reads
its tokens once, in tiles, for all of its ``Hq / Hkv`` query heads. The semantics are those of
``specdec_cuda.reference.quant_attention`` (dequantise + SDPA).
"""

from __future__ import annotations

import math

import torch

__all__ = ["quant_kv_attention"]

_CACHE_KEYS = ("k_upper", "k_lower", "k_scale", "k_zero", "v_upper", "v_lower", "v_scale", "v_zero")


def quant_kv_attention(q: torch.Tensor, cache: dict, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                       quant_len: torch.Tensor, buffer_start: torch.Tensor, lengths: torch.Tensor,
                       tree_mask: torch.Tensor | None = None, *, key_group: int = 64, value_group: int = 32,
                       use_lower: bool = True, sm_scale: float | None = None) -> torch.Tensor:
    """Attention of ``n`` new tokens over the quantised cache and the buffer.

    Query ``i`` of row ``b`` reads token ``t`` from the codes when ``t < quant_len[b, i]`` (upper
    only when ``use_lower`` is False: what a QuantSpec draft reads) and from buffer slot
    ``t - buffer_start[b]`` otherwise. It sees the ``lengths[b]`` committed tokens and, among the
    new tokens at ``lengths[b] + j``, itself and ``j < i`` (causal) or ``tree_mask[b, i, j]``.

    Shape: q ``[B, Hq, n, D]`` (any float dtype; computed in float32); cache as
    ``ops.kv_quant.allocate_kv_cache(B, Hkv, capacity, D, key_group, value_group)``; k_buffer,
    v_buffer ``[B, Hkv, F, D]`` float32; quant_len ``[B, n]`` int64; buffer_start, lengths ``[B]``
    int64; tree_mask ``[B, n, n]`` bool or None. Returns ``[B, Hq, n, D]`` in q's dtype.

    Example
    -------
    >>> from specdec_cuda.ops.kv_quant import allocate_kv_cache
    >>> c = allocate_kv_cache(1, 2, 64, 8, key_group=32, value_group=8)
    >>> buf = torch.zeros(1, 2, 16, 8)
    >>> out = quant_kv_attention(torch.randn(1, 4, 1, 8), c, buf, buf, torch.tensor([[0]]),
    ...                          torch.tensor([0]), torch.tensor([3]), key_group=32, value_group=8)
    >>> out.shape
    torch.Size([1, 4, 1, 8])
    """
    if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() != 4:
        raise TypeError(f"quant_kv_attention: q must be a floating [B, Hq, n, D] tensor, got "
                        f"{getattr(q, 'dtype', type(q).__name__)} {list(getattr(q, 'shape', []))}")
    missing = [k for k in _CACHE_KEYS if k not in cache]
    if missing:
        raise ValueError(f"quant_kv_attention: cache lacks {missing} (make it with ops.kv_quant.allocate_kv_cache)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    qf = q.to(torch.float32).contiguous()
    out = torch.empty_like(qf)
    torch.ops.specdec.quant_kv_attention(
        qf, *(cache[k] for k in _CACHE_KEYS), k_buffer, v_buffer, quant_len.contiguous(), buffer_start.contiguous(),
        lengths.contiguous(),
        None if tree_mask is None else tree_mask.to(torch.bool).contiguous(), key_group, value_group,
        bool(use_lower), scale, out)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


@torch.library.register_fake("specdec::quant_kv_attention")
def _quant_kv_attention_fake(q, k_upper, k_lower, k_scale, k_zero, v_upper, v_lower, v_scale, v_zero, k_buffer,
                             v_buffer, quant_len, buffer_start, lengths, tree_mask, key_group, value_group,
                             use_lower, sm_scale, out):
    return None
