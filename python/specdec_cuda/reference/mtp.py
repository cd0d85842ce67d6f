"""Plain-PyTorch specification of the fused MTP-head ops (``ops.mtp``).

Precision: the normalised rows, the dot products and the returned values / logits are float32
(float64 when the inputs are float64), whatever the storage dtype of the weights.
"""

from __future__ import annotations

import torch


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_normalize(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` in the accumulation precision. Shape: x [M, H] -> [M, H]."""
    acc = _acc(x.dtype)
    x = x.to(acc)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(acc)


def mtp_head_logits(x: torch.Tensor, norm_weight: torch.Tensor, lm_head: torch.Tensor, eps: float) -> torch.Tensor:
    """The logits the fused op ranks. Shape: x [M, H], norm_weight [H], lm_head [V, H] -> [M, V]."""
    xn = rms_normalize(x, norm_weight, eps)
    return xn @ lm_head.to(xn.dtype).T


def topk_lowest_index(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k per row, larger first, equal values by the lower index. Shape: [M, V] -> ([M, k], [M, k])."""
    # A stable descending sort keeps equal values in index order.
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
    return logits.gather(1, order), order


def mtp_head_topk(x, norm_weight, lm_head, k: int, eps: float):
    """(values [M, k], indices [M, k] int64, logits [M, V], status [M] int32: 1 where a logit is
    not finite)."""
    logits = mtp_head_logits(x, norm_weight, lm_head, eps)
    values, indices = topk_lowest_index(logits, k)
    status = (~torch.isfinite(logits)).any(-1).to(torch.int32)
    return values, indices, logits, status


def mtp_head_topk_w4(x, norm_weight, packed, scales, group_size: int, vocab_size: int, k: int, eps: float):
    """``mtp_head_topk`` over a 4-bit LM head in LAYOUT_CPU (``reference.quant``): the dense float32
    weight it encodes, then the same ranking (float32 throughout)."""
    from .quant import dequantize_w4, unpack_cpu

    codes, s = unpack_cpu(packed, scales, vocab_size)
    lm_head = dequantize_w4(codes, s, group_size)
    return mtp_head_topk(x.float(), norm_weight.float(), lm_head, k, eps)


def mtp_input(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, eps: float) -> torch.Tensor:
    """``eh_proj · [enorm(embed[tokens]); hnorm(h)]``. Shape: h [M, H], tokens [M], embed [V, H],
    eh_proj [H, 2H] -> [M, H] (accumulation precision)."""
    H = h.shape[-1]
    e = rms_normalize(embed[tokens], enorm_weight, eps)
    hn = rms_normalize(h, hnorm_weight, eps)
    w = eh_proj.to(e.dtype)
    return e @ w[:, :H].T + hn @ w[:, H:].T
