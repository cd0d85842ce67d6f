"""Plain-PyTorch specification of the 4-bit weight ops (``quantize_w4``, ``w4a16_matmul``).

Quantisation (symmetric int4, one scale per group of ``group_size`` consecutive input features of
one output row; ``group_size = -1`` means one group per row, i.e. per channel)::

    scale[n, g] = max_k |W[n, k]| / 7           over the group's k
    q[n, k]     = clamp(round(W[n, k] / scale), -8, 7)        (0 where scale == 0)
    code[n, k]  = q[n, k] + 8                                 an unsigned nibble, 0..15
    dequant(W)[n, k] = (code[n, k] - 8) * scale[n, k // group_size]

``w4a16_matmul(x, W) = x @ dequant(W).T`` accumulated in float32 and rounded once to x's dtype.

Packed layouts (exact inverses are ``unpack_*`` below; the kernels read only these):

* ``LAYOUT_CPU`` (0): output rows in tiles of 16 (N padded with zero-scale rows):
  ``packed[t, p, j] = code[16t + j, 2p] | code[16t + j, 2p + 1] << 4`` as uint8
  ``[ceil(N/16), K/2, 16]``, scales float32 ``[ceil(N/16), K/group, 16]``. One 16-byte load
  holds two input features of 16 output rows: a single zero-extension to 16 int32 lanes followed
  by a mask and a shift yields both, so the AVX-512 loop needs no shuffles and no horizontal sums.
* ``LAYOUT_CUDA`` (1): ``packed[n, c]`` int32 ``[N, K/8]``, nibble ``j`` (bits 4j..4j+3) holding
  ``code[n, 8c + j]``; scales in the activation dtype ``[N, K/group]``. The kernel splits a word
  into even and odd nibbles (``w & 0x0f0f0f0f``, ``(w >> 4) & 0x0f0f0f0f``) and turns each byte
  into the float ``128 + code`` with one byte permute (``prmt`` with exponent byte 0x43), so the
  same layout serves fp16 and bf16 activations (the dequantised value is built in fp32 for both).
"""

from __future__ import annotations

import torch

LAYOUT_CPU = 0
LAYOUT_CUDA = 1
CPU_TILE_N = 16


def resolve_group_size(in_features: int, group_size: int) -> int:
    """``-1`` (per channel) becomes ``in_features``."""
    return in_features if group_size == -1 else group_size


def quantize_w4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 codes and float32 scales.  Shape: [N, K] -> codes uint8 [N, K], scales [N, K/g]."""
    n, k = weight.shape
    g = resolve_group_size(k, group_size)
    w = weight.to(torch.float32).reshape(n, k // g, g)
    scales = w.abs().amax(dim=-1) / 7.0  # [N, K/g]
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.clamp(torch.round(w / safe[..., None]), -8, 7)
    codes = (q + 8).to(torch.uint8).reshape(n, k)
    return codes, scales


def dequantize_w4(codes: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 weight from codes.  Shape: codes [N, K], scales [N, K/g] -> [N, K]."""
    n, k = codes.shape
    g = resolve_group_size(k, group_size)
    q = codes.to(torch.float32).reshape(n, k // g, g) - 8.0
    return (q * scales.to(torch.float32)[..., None]).reshape(n, k)


def w4a16_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """``x @ dequant(W).T`` in float32, rounded to x's dtype.  Shape: x [M, K] -> [M, N]."""
    w = dequantize_w4(codes, scales, group_size)
    return (x.to(torch.float32) @ w.T).to(x.dtype)


# ---- layouts -----------------------------------------------------------------------------------


def pack_cpu(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LAYOUT_CPU.  Shape: codes [N, K], scales [N, K/g] -> [T, K/2, 16] uint8, [T, K/g, 16] f32."""
    n, k = codes.shape
    tiles = (n + CPU_TILE_N - 1) // CPU_TILE_N
    pad = tiles * CPU_TILE_N - n
    c = torch.cat([codes, torch.full((pad, k), 8, dtype=torch.uint8)]) if pad else codes
    s = torch.cat([scales.float(), scales.new_zeros(pad, scales.shape[1]).float()]) if pad else scales.float()
    c = c.reshape(tiles, CPU_TILE_N, k // 2, 2).to(torch.int32)
    packed = (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8).permute(0, 2, 1).contiguous()
    return packed, s.reshape(tiles, CPU_TILE_N, -1).permute(0, 2, 1).contiguous()


def unpack_cpu(packed: torch.Tensor, scales: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_cpu`` (padding rows dropped)."""
    tiles, half_k, _ = packed.shape
    p = packed.to(torch.int32).permute(0, 2, 1)  # [T, 16, K/2]
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(tiles * CPU_TILE_N, half_k * 2)
    s = scales.permute(0, 2, 1).reshape(tiles * CPU_TILE_N, -1)
    return codes[:n].to(torch.uint8), s[:n]


def pack_cuda(codes: torch.Tensor, scales: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """LAYOUT_CUDA.  Shape: codes [N, K], scales [N, K/g] -> int32 [N, K/8], scale_dtype [N, K/g]."""
    n, k = codes.shape
    c = codes.to(torch.int64).reshape(n, k // 8, 8)
    shifts = torch.arange(8, dtype=torch.int64, device=codes.device) * 4
    words = (c << shifts).sum(dim=-1)  # nibbles are disjoint, so the sum is a bitwise or
    words = torch.where(words >= 2**31, words - 2**32, words)  # reinterpret as int32
    return words.to(torch.int32), scales.to(scale_dtype).contiguous()


def unpack_cuda(packed: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_cuda``."""
    n, words = packed.shape
    w = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(8, dtype=torch.int64, device=packed.device) * 4
    codes = ((w[..., None] >> shifts) & 0xF).reshape(n, words * 8)
    return codes.to(torch.uint8), scales
