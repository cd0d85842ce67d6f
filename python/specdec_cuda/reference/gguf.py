"""Plain-PyTorch specification of the GGUF weight ops (``gguf_dequantize``, ``gguf_matmul``).

A GGUF (ggml) quantized weight ``W [N, K]`` is stored as the file has it: row ``n`` is ``K / QK``
consecutive blocks, each a few fp16 scales and packed integer codes. Formats (GGML type ids)::

    type name  QK  bytes  block layout (byte offsets)                         weight
     3   Q4_1  32   20    d f16 @0, m f16 @2, qs[16] @4                       d * q + m
     6   Q5_0  32   22    d f16 @0, qh u32 @2, qs[16] @6                      d * (q - 16)
     8   Q8_0  32   34    d f16 @0, qs int8[32] @2                            d * q
    12   Q4_K 256  144    d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16   (d*sc_s) * q - (dmin*m_s)
    14   Q6_K 256  210    ql[128] @0, qh[64] @128, scales int8[16] @192,      (d*sc_s) * (q - 32)
                          d f16 @208

* Q4_1 / Q5_0: weight k < 16 is the low nibble of qs[k], k >= 16 the high nibble of qs[k - 16];
  Q5_0's fifth bit of weight k is bit k of qh.
* Q4_K: 8 sub-blocks s of 32; qs[32c + l] holds weight 64c + l (low nibble, sub-block 2c) and
  64c + 32 + l (high nibble, sub-block 2c + 1). Six-bit sc_s, m_s: for s < 4 ``scales[s] & 63``,
  ``scales[s + 4] & 63``; for s >= 4 ``scales[s + 4] & 15 | (scales[s - 4] >> 6) << 4`` and
  ``scales[s + 4] >> 4 | (scales[s] >> 6) << 4``.
* Q6_K: 16 sub-blocks of 16; in half h (128 weights) weight 32i + l has low bits
  ``ql[64h + 32 (i & 1) + l] >> 4 (i >> 1) & 15``, high bits ``qh[32h + l] >> 2i & 3``.

Every product and sum is a float32 operation rounded once, in the order written above (the scale
products first), which is also ggml's and gguf-py's: ``dequantize`` here equals
``gguf.quants.dequantize`` bit for bit, and so do the kernels.

``gguf_matmul(x, W) = x · dequant(W)ᵀ``: the kernels accumulate in float32 in an order of their
own (see ``csrc/kernels/gguf/gguf_cpu.h``), so they agree with ``matmul`` below to rounding only.
"""

from __future__ import annotations

import torch

Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 3, 6, 8, 12, 14

# type id -> (name, weights per block, bytes per block)
FORMATS: dict[int, tuple[str, int, int]] = {
    Q4_1: ("Q4_1", 32, 20),
    Q5_0: ("Q5_0", 32, 22),
    Q8_0: ("Q8_0", 32, 34),
    Q4_K: ("Q4_K", 256, 144),
    Q6_K: ("Q6_K", 256, 210),
}


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one row of ``in_features`` weights (a multiple of the block size)."""
    _, qk, nbytes = FORMATS[qtype]
    return in_features // qk * nbytes


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 at byte ``offset`` of every block, widened to float32.  [..., bytes] -> [..., 1]"""
    return blocks[..., offset:offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] codes: the low nibbles then the high ones."""
    q = qs.to(torch.int32)
    return torch.cat([q & 15, q >> 4], dim=-1)


def dequantize(data: torch.Tensor, qtype: int, out_features: int, in_features: int) -> torch.Tensor:
    """The float32 weight from its blocks.

    Shape: ``data`` uint8 ``[N, K / QK * bytes]`` (or flat); returns ``[N, K]`` float32.
    """
    name, qk, nbytes = FORMATS[qtype]
    n, k = out_features, in_features
    b = data.reshape(n, k // qk, nbytes)
    if qtype == Q4_1:
        w = _f16(b, 0) * _nibbles(b[..., 4:]).float() + _f16(b, 2)
    elif qtype == Q5_0:
        qh = b[..., 2:6].to(torch.int64)
        qh = qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24
        high = (qh[..., None] >> torch.arange(32)) & 1
        q = _nibbles(b[..., 6:]) | (high << 4).to(torch.int32)
        w = _f16(b, 0) * (q - 16).float()
    elif qtype == Q8_0:
        w = b[..., 2:].contiguous().view(torch.int8).float() * _f16(b, 0)
    elif qtype == Q4_K:
        s = b[..., 4:16].to(torch.int32)
        sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | (s[..., 0:4] >> 6) << 4], dim=-1)
        mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4], dim=-1)
        d = (_f16(b, 0) * sc.float())[..., None]                 # [N, blocks, 8, 1]
        dm = (_f16(b, 2) * mn.float())[..., None]
        qs = b[..., 16:].reshape(n, k // qk, 4, 32).to(torch.int32)
        q = torch.stack([qs & 15, qs >> 4], dim=3).reshape(n, k // qk, 8, 32)  # sub-block 2c, 2c + 1
        w = d * q.float() - dm
    elif qtype == Q6_K:
        ql = b[..., 0:128].reshape(n, k // qk, 2, 2, 32).to(torch.int32)  # [half, i & 1, l]
        qh = b[..., 128:192].reshape(n, k // qk, 2, 1, 32).to(torch.int32)
        low = torch.cat([ql & 15, ql >> 4], dim=3)                          # [half, i, l]
        high = (qh >> torch.tensor([0, 2, 4, 6]).reshape(4, 1)) & 3
        q = ((low | high << 4) - 32).reshape(n, k // qk, 16, 16)
        scales = b[..., 192:208].contiguous().view(torch.int8).float()
        w = (_f16(b, 208) * scales)[..., None] * q.float()
    else:
        raise ValueError(f"unsupported GGML type {qtype}; supported: {sorted(FORMATS)}")
    return w.reshape(n, k)


def matmul(x: torch.Tensor, data: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
    """``x · dequant(W)ᵀ`` in float64 (the exact product of the dequantised values, for tolerances).

    Shape: ``x`` ``[M, K]``; returns ``[M, N]`` float64.
    """
    w = dequantize(data, qtype, out_features, x.shape[-1])
    return x.double() @ w.double().T
