"""Plain-PyTorch specification of the hierarchical 4-bit KV cache ops.

Each group of ``G`` values (keys: ``G`` consecutive tokens of one channel; values: ``G``
consecutive channels of one token) is quantised twice, all in float32 with every operation rounded
separately (the kernels avoid fused multiply-adds so their codes match these bit for bit)::

    zero  = min(x),  scale = (max(x) - zero) / 15
    upper = clamp(round((x - zero) / scale), 0, 15)                  asymmetric, 4 bits
    r     = x - (upper * scale + zero)                               |r| <= scale / 2
    lower = clamp(round(r / (scale / 16)), -8, 7) + 8                symmetric residual, 4 bits
    (upper and lower are 0 and 8 where scale == 0, i.e. a constant group)
    (a group holding NaN or +-inf, or whose range overflows float32, gets scale = zero = NaN and codes 0 / 8: it reads back as NaN,
    so a diverging model is not hidden from the sampler's non-finite check)

    upper-only    x ~ upper * scale + zero                           error <= scale / 2
    upper + lower x ~ upper * scale + zero + (lower - 8) * (scale / 16)   error <= scale / 32

The lower step ``scale / 16`` makes upper + lower an 8-bit code over the group's range, so a draft
reads half the bytes (upper only) while verification gets close to int8 quality.

Storage (``D`` = head_dim, ``Gk`` / ``Gv`` the key / value group sizes, ``T`` the token capacity):
``*_upper`` and ``*_lower`` uint8 ``[B, H, T, D/2]`` with channel ``2i`` in the low nibble and
``2i + 1`` in the high nibble; ``k_scale`` / ``k_zero`` float32 ``[B, H, T/Gk, D]``;
``v_scale`` / ``v_zero`` float32 ``[B, H, T, D/Gv]``.
"""

from __future__ import annotations

import torch


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hierarchical codes of groups along the last dim.  Shape: [..., G] -> upper, lower [..., G]
    (uint8 codes 0..15), scale, zero [...] (float32)."""
    x = x.to(torch.float32)
    zero = x.amin(dim=-1)
    scale = (x.amax(dim=-1) - zero) / 15.0
    # NaN / +-inf in the group, or a range beyond float32: NaN scale and zero (codes 0 / 8)
    finite = torch.isfinite(x).all(dim=-1) & torch.isfinite(scale)
    nan = torch.full_like(scale, float("nan"))
    zero, scale = torch.where(finite, zero, nan), torch.where(finite, scale, nan)
    nonconstant = (scale > 0)[..., None]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    upper = torch.clamp(torch.round((x - zero[..., None]) / safe), 0, 15)
    upper = torch.where(nonconstant, upper, torch.zeros_like(upper))
    residual = x - (upper * scale[..., None] + zero[..., None])
    # nan=0: a subnormal scale can underflow scale / 16 to 0 (0 / 0); the residual code is then 0
    lower = torch.clamp(torch.nan_to_num(torch.round(residual / (safe / 16.0)), nan=0.0), -8, 7)
    lower = torch.where(nonconstant, lower, torch.zeros_like(lower)) + 8
    return upper.to(torch.uint8), lower.to(torch.uint8), scale, zero


def dequantize_groups(upper, lower, scale, zero) -> torch.Tensor:
    """Inverse of ``quantize_groups`` (``lower=None`` reads the upper half only)."""
    x = upper.to(torch.float32) * scale[..., None] + zero[..., None]
    if lower is not None:
        x = x + (lower.to(torch.float32) - 8.0) * (scale[..., None] / 16.0)
    return x


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes -> [..., D/2] bytes, even channel in the low nibble."""
    c = codes.to(torch.int32)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., D/2] bytes -> [..., D] codes."""
    p = packed.to(torch.int32)
    return torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2).to(torch.uint8)


def quantize_keys(k: torch.Tensor, group_size: int):
    """Keys grouped along tokens per channel.  Shape: k [B, H, T, D] (T % group_size == 0) ->
    upper, lower [B, H, T, D/2] uint8; scale, zero [B, H, T/group_size, D] float32."""
    b, h, t, d = k.shape
    groups = k.reshape(b, h, t // group_size, group_size, d).transpose(-1, -2)  # [B,H,T/G,D,G]
    upper, lower, scale, zero = quantize_groups(groups)
    upper = upper.transpose(-1, -2).reshape(b, h, t, d)
    lower = lower.transpose(-1, -2).reshape(b, h, t, d)
    return pack_nibbles(upper), pack_nibbles(lower), scale, zero


def dequantize_keys(upper, lower, scale, zero, group_size: int) -> torch.Tensor:
    """Inverse of ``quantize_keys`` (``lower=None``: upper only).  Shape: -> [B, H, T, D] float32."""
    b, h, t, _ = upper.shape
    d = scale.shape[-1]

    def grouped(packed):
        codes = unpack_nibbles(packed)
        return codes.reshape(b, h, t // group_size, group_size, d).transpose(-1, -2)

    x = dequantize_groups(grouped(upper), None if lower is None else grouped(lower), scale, zero)
    return x.transpose(-1, -2).reshape(b, h, t, d)


def quantize_values(v: torch.Tensor, group_size: int):
    """Values grouped along channels per token.  Shape: v [B, H, T, D] (D % group_size == 0) ->
    upper, lower [B, H, T, D/2] uint8; scale, zero [B, H, T, D/group_size] float32."""
    b, h, t, d = v.shape
    upper, lower, scale, zero = quantize_groups(v.reshape(b, h, t, d // group_size, group_size))
    return pack_nibbles(upper.reshape(b, h, t, d)), pack_nibbles(lower.reshape(b, h, t, d)), scale, zero


def dequantize_values(upper, lower, scale, zero, group_size: int) -> torch.Tensor:
    """Inverse of ``quantize_values``.  Shape: -> [B, H, T, D] float32."""
    b, h, t, half_d = upper.shape
    d = 2 * half_d

    def grouped(packed):
        return unpack_nibbles(packed).reshape(b, h, t, d // group_size, group_size)

    x = dequantize_groups(grouped(upper), None if lower is None else grouped(lower), scale, zero)
    return x.reshape(b, h, t, d)
