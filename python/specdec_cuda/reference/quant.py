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
* ``LAYOUT_CUDA`` (1): tensor-core fragment order for ``mma.m16n8k16`` with the weight as operand
  B (k x n, "col"), and a nibble interleave that depends on the activation dtype (fp16 / bf16).
  N is padded to a multiple of 8 (``CUDA_TILE_N``: one n8 tile per mma) and K to a multiple of 128
  (``CUDA_CHUNK_K``: one 16-byte load per lane); padding codes are 8 (weight 0), padding scales 0::

      packed  int32        [ceil(N/8), ceil(K/128), 128]     128 words = 512 bytes per (tile, chunk)
      scales  scale_dtype  [ceil(N/8), K/group, 8]           scales[nt, grp, g] = scale of row 8nt+g

  Word ``4 * lane + w`` of tile ``nt`` / chunk ``c`` (``lane = 4g + t``: g = lane >> 2 is the mma
  groupID, t = lane & 3 the threadID_in_group) holds the codes of row ``n = 8nt + g`` at
  ``k = 128c + 32t + 8w + j`` for j = 0..7; nibble p (bits 4p..4p+3) holds ``j = NIBBLE_ORDER[dtype][p]``.

  Why: the B fragment of lane (g, t) is column n = g and mma rows kappa in {2t, 2t+1} (b0, b1) and
  {2t+8, 2t+9} (b2, b3). The kernel maps the mma row kappa of k-step s (0..7) of chunk c to
  ``k = 128c + 32 * t(kappa) + 4s + 2 * (kappa >= 8) + (kappa & 1)`` with t(kappa) = (kappa & 7) >> 1,
  and permutes x's columns the same way (the dot product does not care), so all a lane needs
  over a chunk is 32 consecutive codes of one row (one 16-byte load, j = 4s..4s+3 for step s)
  and 32 consecutive activations x[m, 128c + 32t ...] (64 bytes). Word w serves steps 2w and
  2w + 1; the dequantiser turns it into four 32-bit registers, two 16-bit weights each:
  (j0, j1) = b0b1 of step 2w, (j2, j3) = b2b3 of step 2w, (j4, j5) and (j6, j7) those of step 2w+1.

  - fp16 (``NIBBLE_ORDER[float16] = [0, 2, 4, 6, 1, 3, 5, 7]``): ``(q & 0x000f000f) | 0x64006400``
    is the half2 (1024 + nibble 0, 1024 + nibble 4) and ``(q & 0x00f000f0) | 0x64006400`` the half2
    (1024 + 16 * nibble 1, 1024 + 16 * nibble 5) (one lop3 each); after ``q >> 8`` the same two
    masks give nibbles (2, 6) and (3, 7). Subtracting 1032, resp. ``x / 16 - 72`` (one hfma2),
    leaves code - 8 exactly. So register i holds nibbles (i, i + 4): j-pairs (0,1) (2,3) (4,5) (6,7)
    sit in nibbles (0,4) (1,5) (2,6) (3,7).
  - bf16 (``NIBBLE_ORDER[bfloat16] = [0, 4, 1, 5, 2, 6, 3, 7]``): bf16 has 7 mantissa bits, so a
    code can only sit in bits 0..3 of each 16-bit half (in bits 4..7 its top bit would land in the
    exponent): ``lo = q & 0x0f0f0f0f`` and ``hi = (q >> 4) & 0x0f0f0f0f`` bring every nibble to
    the bottom of a byte, and one byte permute per register (``prmt`` with the constant 0x43)
    builds the bf16x2 (128 + code, 128 + code) from two bytes: bytes (0, 1) of lo = nibbles (0, 2),
    bytes (2, 3) of lo = nibbles (4, 6), then nibbles (1, 3) and (5, 7) from hi. Subtracting 136
    leaves code - 8 exactly. So byte i of the word is ``j_i | j_(i+4) << 4``.

  The lane's scale (one per 32 codes: groups are multiples of 32) multiplies the register in the
  activation dtype, so the kernel's weight equals ``dequant(W)`` rounded once to that dtype, the
  same weight ``w4_dequantize`` gives the dense (cuBLAS) path.
"""

from __future__ import annotations

import torch

LAYOUT_CPU = 0
LAYOUT_CUDA = 1
CPU_TILE_N = 16
CUDA_TILE_N = 8
CUDA_CHUNK_K = 128
# nibble p of a LAYOUT_CUDA word holds the code at j = NIBBLE_ORDER[dtype][p] (see the module docstring)
NIBBLE_ORDER = {torch.float16: (0, 2, 4, 6, 1, 3, 5, 7), torch.bfloat16: (0, 4, 1, 5, 2, 6, 3, 7)}


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


def _nibble_order(dtype: torch.dtype) -> tuple[int, ...]:
    if dtype not in NIBBLE_ORDER:
        raise ValueError(f"LAYOUT_CUDA weights are packed for float16 or bfloat16 activations; got {dtype}")
    return NIBBLE_ORDER[dtype]


def pack_cuda(codes: torch.Tensor, scales: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """LAYOUT_CUDA for ``scale_dtype`` activations.

    Shape: codes [N, K], scales [N, K/g] -> int32 [ceil(N/8), ceil(K/128), 128], scale_dtype [ceil(N/8), K/g, 8].
    """
    order = _nibble_order(scale_dtype)
    n, k = codes.shape
    tiles, chunks = -(-n // CUDA_TILE_N), -(-k // CUDA_CHUNK_K)
    c = torch.full((tiles * CUDA_TILE_N, chunks * CUDA_CHUNK_K), 8, dtype=torch.int64, device=codes.device)
    c[:n, :k] = codes.to(torch.int64)
    # [nt, g, c, t, w, j] -> [nt, c, g, t, w, j]: lane = 4g + t, k = 128c + 32t + 8w + j
    c = c.reshape(tiles, CUDA_TILE_N, chunks, 4, 4, 8).permute(0, 2, 1, 3, 4, 5)
    c = c[..., list(order)]  # now indexed by nibble position p
    shifts = torch.arange(8, dtype=torch.int64, device=codes.device) * 4
    words = (c << shifts).sum(dim=-1)  # nibbles are disjoint, so the sum is a bitwise or
    words = torch.where(words >= 2**31, words - 2**32, words)  # reinterpret as int32
    s = scales.new_zeros(tiles * CUDA_TILE_N, scales.shape[1], dtype=torch.float32)
    s[:n] = scales.float()
    s = s.reshape(tiles, CUDA_TILE_N, -1).permute(0, 2, 1).to(scale_dtype).contiguous()
    return words.to(torch.int32).reshape(tiles, chunks, 128).contiguous(), s


def unpack_cuda(packed: torch.Tensor, scales: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_cuda`` (padding dropped; the interleave follows ``scales.dtype``).

    Shape: packed [ceil(N/8), ceil(K/128), 128], scales [ceil(N/8), K/g, 8] -> codes uint8 [N, K], scales [N, K/g].
    """
    order = _nibble_order(scales.dtype)
    tiles, chunks, _ = packed.shape
    w = (packed.to(torch.int64) & 0xFFFFFFFF).reshape(tiles, chunks, CUDA_TILE_N, 4, 4, 1)
    shifts = torch.arange(8, dtype=torch.int64, device=packed.device) * 4
    by_p = (w >> shifts) & 0xF  # [nt, c, g, t, w, p]
    by_j = torch.empty_like(by_p)
    by_j[..., list(order)] = by_p
    codes = by_j.permute(0, 2, 1, 3, 4, 5).reshape(tiles * CUDA_TILE_N, chunks * CUDA_CHUNK_K)
    s = scales.permute(0, 2, 1).reshape(tiles * CUDA_TILE_N, -1)
    return codes[:n, :k].to(torch.uint8), s[:n]
