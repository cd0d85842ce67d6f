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

``Q4_K_LANES`` (type 268) and ``Q6_K_LANES`` (270) are not file formats but the CPU's repacking of a
Q4_K / Q6_K weight for its int8 kernel (``ops.gguf.gguf_repack_lanes``): the same blocks with each
one's 256 codes permuted (``to_lanes`` / ``from_lanes`` below, ``csrc/kernels/gguf/blocks.h``); each
dequantises, and multiplies, exactly as the weight it came from.

``gguf_matmul(x, W, activations="q8")`` multiplies int8 activations (``quantize_q8``) with integer
dot products; ``matmul_q8`` below is its specification, bit for bit (float order in
``csrc/kernels/gguf/q8.h``).
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


Q4_K_LANES, Q6_K_LANES = 268, 270  # not GGML types: Q4_K / Q6_K repacked for the CPU's lane dots
LANES = {Q4_K: Q4_K_LANES, Q6_K: Q6_K_LANES}  # file format -> its lane-order layout (to_lanes)
FILE_FORMAT = {lanes: file for file, lanes in LANES.items()}  # lane-order layout -> its file format
Q4_K_PANELS, Q6_K_PANELS = 524, 526  # not GGML types: 512 + the format, in panels of 16 rows (to_panels)
PANELS = {file: 512 + file for file in FORMATS}  # file format -> its panel layout
FILE_OF_PANELS = {panels: file for file, panels in PANELS.items()}  # panel layout -> its file format
LAYOUTS: dict[int, tuple[str, int, int]] = {
    **FORMATS, Q4_K_LANES: ("Q4_K_LANES", 256, 144), Q6_K_LANES: ("Q6_K_LANES", 256, 210),
    **{PANELS[f]: (name + "_PANELS", qk, nb) for f, (name, qk, nb) in FORMATS.items()}}


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one row of ``in_features`` weights (a multiple of the block size)."""
    _, qk, nbytes = LAYOUTS[qtype]
    return in_features // qk * nbytes


def _q4_k_codes(qs: torch.Tensor) -> torch.Tensor:
    """[B, 128] Q4_K code bytes -> [B, 8, 32] codes (sub-block s, weight k)."""
    q = qs.reshape(-1, 4, 32).to(torch.int32)
    return torch.stack([q & 15, q >> 4], dim=2).reshape(-1, 8, 32)  # chunk c: sub-blocks 2c, 2c + 1


def _q6_k_places(blocks: torch.Tensor) -> torch.Tensor:
    """[B, 210] Q6_K blocks -> [B, 2, 4, 32] six-bit codes (0..63) by place (half h, i, l)."""
    ql = blocks[:, 0:128].reshape(-1, 2, 2, 32).to(torch.int32)       # [half, i & 1, l]
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32).to(torch.int32)
    low = torch.cat([ql & 15, ql >> 4], dim=2)                         # [half, i, l]
    return low | ((qh >> torch.tensor([0, 2, 4, 6]).reshape(4, 1)) & 3) << 4


def _q6_k_bytes(places: torch.Tensor) -> torch.Tensor:
    """The inverse of ``_q6_k_places``: [B, 2, 4, 32] codes -> [B, 192] bytes (ql, qh)."""
    low, high = places & 15, places >> 4
    ql = (low[:, :, 0:2] | low[:, :, 2:4] << 4).reshape(-1, 128)      # i = 0, 1 low nibbles; 2, 3 high
    qh = (high * torch.tensor([1, 4, 16, 64]).reshape(4, 1)).sum(2).reshape(-1, 64)
    return torch.cat([ql, qh], dim=1).to(torch.uint8)


def to_lanes(data: torch.Tensor, qtype: int = Q4_K) -> torch.Tensor:
    """Q4_K (or Q6_K) blocks -> Q4_K_LANES (Q6_K_LANES), the codes permuted within each block so that
    the kernel's decode of a 32-byte chunk gives 8 registers of 4-code dwords, one lane per 32-weight
    group: what the VNNI lane dots multiply without a transpose.

    * Q4_K: byte 16 + 32c + 4j + b holds code 8c + b of sub-block j (low nibble) and code 8c + 4 + b
      (high nibble), c < 4, j < 8, b < 4; the first 16 bytes (d, dmin, scales) stay.
    * Q6_K: the place of code 32i + l of half h holds code 4 (4h + i) + l % 4 of group l // 4; the
      scales and d stay.

    Shape: uint8 ``[..., blocks * bytes]`` -> the same shape.
    """
    if qtype == Q6_K:
        b = data.reshape(-1, 210)
        codes = _q6_k_places(b).reshape(-1, 8, 32)                     # [block, group g, k]
        # place (h, i, l = 4g + k % 4) <- code k = 4 (4h + i) + k % 4 of group g
        places = codes.reshape(-1, 8, 2, 4, 4).permute(0, 2, 3, 1, 4).reshape(-1, 2, 4, 32)
        return torch.cat([_q6_k_bytes(places), b[:, 192:]], dim=1).reshape(data.shape)
    b = data.reshape(-1, 144)
    codes = _q4_k_codes(b[:, 16:]).reshape(-1, 8, 4, 2, 4)  # [block, j, c, nibble h, b]: code 8c + 4h + b
    lanes = codes.permute(0, 2, 1, 4, 3)                      # [block, c, j, b, h]
    qs = (lanes[..., 0] | lanes[..., 1] << 4).to(torch.uint8).reshape(-1, 128)
    return torch.cat([b[:, :16], qs], dim=1).reshape(data.shape)


def from_lanes(data: torch.Tensor, qtype: int = Q4_K) -> torch.Tensor:
    """The inverse of ``to_lanes``: Q4_K_LANES (Q6_K_LANES) blocks -> the file's Q4_K (Q6_K) blocks;
    ``qtype`` names the file format (or the lane-order layout)."""
    if qtype in (Q6_K, Q6_K_LANES):
        b = data.reshape(-1, 210)
        places = _q6_k_places(b).reshape(-1, 2, 4, 8, 4)               # [block, h, i, g, k % 4]
        codes = places.permute(0, 3, 1, 2, 4).reshape(-1, 2, 4, 32)    # [block, g // 4, g % 4, k]
        return torch.cat([_q6_k_bytes(codes), b[:, 192:]], dim=1).reshape(data.shape)
    b = data.reshape(-1, 144)
    q = b[:, 16:].reshape(-1, 4, 8, 4).to(torch.int32)        # [block, c, j, b]
    lanes = torch.stack([q & 15, q >> 4], dim=-1)             # [block, c, j, b, h]
    codes = lanes.permute(0, 2, 1, 4, 3).reshape(-1, 8, 32)   # [block, s = j, k = 8c + 4h + b]
    chunks = codes.reshape(-1, 4, 2, 32)                      # sub-block 2c + h -> chunk c, nibble h
    qs = (chunks[:, :, 0] | chunks[:, :, 1] << 4).to(torch.uint8).reshape(-1, 128)
    return torch.cat([b[:, :16], qs], dim=1).reshape(data.shape)


def _legacy_codes(b: torch.Tensor, qtype: int) -> torch.Tensor:
    """[..., bytes] legacy blocks -> [..., 32] codes as the panels hold them: Q8_0 w + 128, Q5_0
    0..31, Q4_1 0..15."""
    if qtype == Q8_0:
        return b[..., 2:34].to(torch.int32) ^ 0x80
    low = _nibbles(b[..., 4:20] if qtype == Q4_1 else b[..., 6:22])
    if qtype == Q4_1:
        return low
    qh = b[..., 2:6].to(torch.int64)
    qh = qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24
    return low | (((qh[..., None] >> torch.arange(32)) & 1) << 4).to(torch.int32)


def _legacy_to_panels(data: torch.Tensor, qtype: int) -> torch.Tensor:
    n, rb = data.shape
    bb = FORMATS[qtype][2]
    g, t = n // 16, rb // bb
    b = data.reshape(g, 16, t, bb)
    codes = _legacy_codes(b, qtype)                                        # [g, r, t, 32]
    if qtype == Q8_0:
        parts = [codes.reshape(g, 16, t, 8, 4).permute(0, 2, 3, 1, 4).reshape(g, t, 512),
                 b[..., 0:2].permute(0, 2, 1, 3).reshape(g, t, 32)]
    else:
        low = (codes & 15).reshape(g, 16, t, 4, 2, 4)                      # k = 8p + 4h + b
        parts = [(low[..., 0, :] | low[..., 1, :] << 4).permute(0, 2, 3, 1, 4).reshape(g, t, 256)]
        if qtype == Q5_0:
            fifth = (codes >> 4).reshape(g, 16, t, 8, 4)                   # k = 4s + b
            bits = (fifth << torch.arange(8).reshape(8, 1)).sum(3)        # [g, r, t, b]
            parts += [bits.permute(0, 2, 1, 3).reshape(g, t, 64), b[..., 0:2].permute(0, 2, 1, 3).reshape(g, t, 32)]
        else:
            parts.append(b[..., 0:4].permute(0, 2, 1, 3).reshape(g, t, 64))
    return torch.cat([p.to(torch.uint8) for p in parts], dim=-1).reshape(n, rb)


def _legacy_from_panels(data: torch.Tensor, qtype: int) -> torch.Tensor:
    n, rb = data.shape
    bb = FORMATS[qtype][2]
    g, t = n // 16, rb // bb
    p = data.reshape(g, t, 16 * bb).to(torch.int32)
    if qtype == Q8_0:
        codes = p[..., :512].reshape(g, t, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(g, 16, t, 32)
        head = p[..., 512:544].reshape(g, t, 16, 2).permute(0, 2, 1, 3)
        return torch.cat([head, codes ^ 0x80], dim=-1).to(torch.uint8).reshape(n, rb)
    pairs = p[..., :256].reshape(g, t, 4, 16, 4)                               # [g, t, p, r, b]
    codes = torch.stack([pairs & 15, pairs >> 4], dim=3).permute(0, 4, 1, 2, 3, 5).reshape(g, 16, t, 32)
    qs = (codes[..., :16] | codes[..., 16:] << 4)                              # weight k, k + 16
    if qtype == Q4_1:
        head = p[..., 256:320].reshape(g, t, 16, 4).permute(0, 2, 1, 3)
        return torch.cat([head, qs], dim=-1).to(torch.uint8).reshape(n, rb)
    bits = p[..., 256:320].reshape(g, t, 16, 4).permute(0, 2, 1, 3)             # [g, r, t, b]: bit s = step s
    fifth = ((bits[..., None, :] >> torch.arange(8).reshape(8, 1)) & 1).reshape(g, 16, t, 32)  # k = 4s + b
    qh = (fifth.reshape(g, 16, t, 4, 8) << torch.arange(8)).sum(-1)             # byte j: bits of k = 8j ..
    head = p[..., 320:352].reshape(g, t, 16, 2).permute(0, 2, 1, 3)
    return torch.cat([head, qh, qs], dim=-1).to(torch.uint8).reshape(n, rb)


def to_panels(data: torch.Tensor, qtype: int = Q4_K) -> torch.Tensor:
    """The blocks of a weight ``[N, K]`` (N a multiple of 16) in panels of 16 rows (type 512 +
    ``qtype``): each group of 16 rows as one panel per block column t (a super-block, or a legacy
    block), [16 rows][4 codes] per step of the lanes kernels (``csrc/kernels/gguf/panels.h`` has the
    byte map):

    * Q4_K / Q6_K: 32 pairs p of 64 bytes, byte 4r + b = c(r, 8p + b) | c(r, 8p + 4 + b) << 4 (Q6_K:
      of the low 4 bits), then Q6_K's 16 quads u, byte 4r + b holding c(r, 16u + 4i + b) >> 4 at
      bits 2i; then each row's scales (Q4_K 12 bytes, Q6_K 16) as dwords of 16 lanes, then d (Q4_K:
      d and dmin) per row;
    * Q8_0: 8 steps s, byte 4r + b = w(r, 4s + b) + 128, then d per row; Q5_0 / Q4_1: 4 pairs as
      above, then Q5_0's fifth bits (byte 4r + b, bit s: that of weight 4s + b) and d per row, or
      Q4_1's d, m per row.

    Shape: uint8 ``[N, K / QK * bytes]`` -> the same shape.
    """
    if qtype in (Q8_0, Q5_0, Q4_1):
        return _legacy_to_panels(data, qtype)
    n, rb = data.shape
    bb = 144 if qtype == Q4_K else 210
    g, t = n // 16, rb // bb
    b = data.reshape(g, 16, t, bb)
    if qtype == Q4_K:
        codes = _q4_k_codes(b[..., 16:].reshape(-1, 128))
    else:
        codes = _q6_k_places(b.reshape(-1, 210))
    codes = codes.reshape(g, 16, t, 32, 2, 4)                              # k = 8p + 4h + b
    low = codes & 15
    pairs = (low[..., 0, :] | low[..., 1, :] << 4).permute(0, 2, 3, 1, 4)  # [g, t, p, r, b]
    parts = [pairs.reshape(g, t, 2048)]
    if qtype == Q6_K:
        high = (codes >> 4).reshape(g, 16, t, 16, 4, 4)                   # k = 16u + 4i + b
        quads = (high * torch.tensor([1, 4, 16, 64]).reshape(4, 1)).sum(4)  # [g, r, t, u, b]
        parts.append(quads.permute(0, 2, 3, 1, 4).reshape(g, t, 1024))
        parts.append(b[..., 192:208].reshape(g, 16, t, 4, 4).permute(0, 2, 3, 1, 4).reshape(g, t, 256))
        parts.append(b[..., 208:210].permute(0, 2, 1, 3).reshape(g, t, 32))
    else:
        parts.append(b[..., 4:16].reshape(g, 16, t, 3, 4).permute(0, 2, 3, 1, 4).reshape(g, t, 192))
        parts.append(b[..., 0:4].permute(0, 2, 1, 3).reshape(g, t, 64))
    return torch.cat([p.to(torch.uint8) for p in parts], dim=-1).reshape(n, rb)


def from_panels(data: torch.Tensor, qtype: int = Q4_K_PANELS) -> torch.Tensor:
    """The inverse of ``to_panels``: a panel layout -> the file's blocks; ``qtype`` names the panel
    layout (or its file format)."""
    file = FILE_OF_PANELS.get(qtype, qtype)
    if file in (Q8_0, Q5_0, Q4_1):
        return _legacy_from_panels(data, file)
    q6 = qtype in (Q6_K, Q6_K_PANELS)
    n, rb = data.shape
    bb = 210 if q6 else 144
    g, t = n // 16, rb // bb
    p = data.reshape(g, t, 16 * bb).to(torch.int32)
    pairs = p[..., :2048].reshape(g, t, 32, 16, 4)                          # [g, t, p, r, b]
    codes = torch.stack([pairs & 15, pairs >> 4], dim=3)                     # [g, t, p, h, r, b]
    codes = codes.permute(0, 4, 1, 2, 3, 5).reshape(g, 16, t, 256)          # k = 8p + 4h + b
    if q6:
        quads = p[..., 2048:3072].reshape(g, t, 16, 16, 4)                  # [g, t, u, r, b]
        high = (quads[..., None, :, :] >> torch.tensor([0, 2, 4, 6]).reshape(4, 1, 1)) & 3  # [g, t, u, i, r, b]
        codes = codes | high.permute(0, 4, 1, 2, 3, 5).reshape(g, 16, t, 256) << 4
        scales = p[..., 3072:3328].reshape(g, t, 4, 16, 4).permute(0, 3, 1, 2, 4).reshape(g, 16, t, 16)
        d = p[..., 3328:3360].reshape(g, t, 16, 2).permute(0, 2, 1, 3)
        blocks = torch.cat([_q6_k_bytes(codes.reshape(-1, 2, 4, 32)).reshape(g, 16, t, 192).to(torch.int32),
                            scales, d], dim=-1)
    else:
        chunks = codes.reshape(g, 16, t, 4, 2, 32)                          # sub-block 2c + h
        qs = (chunks[..., 0, :] | chunks[..., 1, :] << 4).reshape(g, 16, t, 128)
        scales = p[..., 2048:2240].reshape(g, t, 3, 16, 4).permute(0, 3, 1, 2, 4).reshape(g, 16, t, 12)
        dd = p[..., 2240:2304].reshape(g, t, 16, 4).permute(0, 2, 1, 3)
        blocks = torch.cat([dd, scales, qs], dim=-1)
    return blocks.to(torch.uint8).reshape(n, rb)


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
    if qtype in FILE_FORMAT:
        file = FILE_FORMAT[qtype]
        return dequantize(from_lanes(data, file), file, out_features, in_features)
    if qtype in FILE_OF_PANELS:
        return dequantize(from_panels(data.reshape(out_features, -1), qtype), FILE_OF_PANELS[qtype], out_features,
                          in_features)
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


# ---- Q8 activations (csrc/kernels/gguf/q8.h) ------------------------------------------------------


def q8_row_bytes(in_features: int) -> int:
    """Bytes of one Q8 activation row: K codes, 8 T float32 scales, 16 T int16 half sums, padded to 64
    (T = ceil(K / 256), the octets of 8 groups of 32)."""
    t = (in_features // 32 + 7) // 8
    return (in_features + 64 * t + 63) // 64 * 64


def quantize_q8_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q8 activations of ``x``: per group of 32, ``d = amax|x| / 127`` (one float32 division) and
    ``q = round_half_even(x / d)`` clamped to [-127, 127] (0 where d == 0); the int16 sums of q over
    each half of 16.

    Shape: ``x`` ``[M, K]`` (K a multiple of 32); returns q int8 ``[M, K]``, d float32 ``[M, K/32]``,
    s int16 ``[M, K/16]``.
    """
    return _quantize_int8(x, 32)


def _quantize_int8(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ``[M, K]`` rounded to int8 per ``group`` values (q8.h's and q8k.h's steps): q, d, and the
    int16 sums of q over each 16 values."""
    m, k = x.shape
    xg = x.float().reshape(m, k // group, group)
    d = xg.abs().amax(dim=-1) / 127.0
    safe = torch.where(d == 0, torch.ones_like(d), d)
    q = torch.where(d[..., None] == 0, torch.zeros_like(xg), torch.round(xg / safe[..., None]).clamp(-127, 127))
    q = q.to(torch.int8).reshape(m, k)
    s = q.reshape(m, k // 16, 16).to(torch.int32).sum(-1).to(torch.int16)
    return q, d, s


def quantize_q8(x: torch.Tensor) -> torch.Tensor:
    """The bytes ``gguf_quantize_q8`` writes: per row, codes [K], scales [8 T] (0 beyond K / 32),
    half sums [16 T] (0 beyond K / 16), zeros to ``q8_row_bytes(K)``.

    Shape: ``x`` ``[M, K]``; returns uint8 ``[M, q8_row_bytes(K)]``.
    """
    m, k = x.shape
    q, d, s = quantize_q8_parts(x)
    t = (k // 32 + 7) // 8
    out = torch.zeros(m, q8_row_bytes(k), dtype=torch.uint8)
    out[:, :k] = q.view(torch.uint8)
    dp = torch.zeros(m, 8 * t, dtype=torch.float32)
    dp[:, :k // 32] = d
    sp = torch.zeros(m, 16 * t, dtype=torch.int16)
    sp[:, :k // 16] = s
    out[:, k:k + 32 * t] = dp.view(torch.uint8)
    out[:, k + 32 * t:k + 64 * t] = sp.view(torch.uint8)
    return out


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 ``a * b + c`` rounded once (torch has no float32 fma): the float64 sum of the exact
    float64 product and c, with its rounding error (TwoSum) breaking the one case where rounding it
    again to float32 could differ, a float64 result exactly halfway between two float32s."""
    p = a.double() * b.double()  # exact: 24 + 24 bits
    c64 = c.double()
    s = p + c64
    bv = s - p
    e = (p - (s - bv)) + (c64 - bv)
    f = s.float()
    back = f.double()
    inf = torch.tensor(float("inf"))
    toward = torch.nextafter(f, torch.where(s > back, inf, -inf)).double()
    tie = (s != back) & ((back + toward) * 0.5 == s) & (e != 0)
    s = torch.where(tie, torch.nextafter(s, torch.where(e > 0, inf, -inf).double()), s)
    return s.float()


def _int_dot(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact integer dot products over the last dim: q ``[M, G, L]``, w ``[N, G, L]`` -> ``[M, N, G]``
    (float64 matmul of small integers is exact)."""
    return torch.einsum("mgl,ngl->mng", q.double(), w.double())


def _kquant_integers(data: torch.Tensor, qtype: int, n: int, k: int):
    """Per row and super-block of a Q4_K / Q6_K weight (file order): codes ``[N, T, 256]`` (Q4_K
    0..15, Q6_K 0..63), the per-sub-block scales ``[N, T, S]`` (S = 8 / 16), the mins ``[N, T, 8]``
    (Q6_K: its scales again), d and dmin ``[N, T]`` (Q6_K: zeros)."""
    t = k // 256
    if qtype == Q4_K:
        b = data.reshape(n, t, 144)
        sb = b[..., 4:16].to(torch.int32)
        sc = torch.cat([sb[..., 0:4] & 63, (sb[..., 8:12] & 15) | (sb[..., 0:4] >> 6) << 4], dim=-1)
        mn = torch.cat([sb[..., 4:8] & 63, (sb[..., 8:12] >> 4) | (sb[..., 4:8] >> 6) << 4], dim=-1)
        qs = b[..., 16:].reshape(n, t, 4, 32).to(torch.int32)
        w = torch.stack([qs & 15, qs >> 4], dim=3).reshape(n, t, 256)
        return w, sc, mn, _f16(b, 0)[..., 0], _f16(b, 2)[..., 0]
    b = data.reshape(n, t, 210)
    ql = b[..., 0:128].reshape(n, t, 2, 2, 32).to(torch.int32)
    qh = b[..., 128:192].reshape(n, t, 2, 1, 32).to(torch.int32)
    low = torch.cat([ql & 15, ql >> 4], dim=3)
    high = (qh >> torch.tensor([0, 2, 4, 6]).reshape(4, 1)) & 3
    w = (low | high << 4).reshape(n, t, 256)
    sc = b[..., 192:208].contiguous().view(torch.int8).to(torch.int32)
    return w, sc, sc, _f16(b, 208)[..., 0], torch.zeros(n, t)


def _legacy_steps(qg: torch.Tensor, qsum: torch.Tensor, data: torch.Tensor, qtype: int, n: int) -> list:
    """The float steps of a Q8_0 / Q5_0 / Q4_1 weight against Q8 codes ``qg`` ``[M, G, 32]`` (int32)
    with group sums ``qsum`` ``[M, G]``: per step (integer term ``[M, N, G]`` as float64, weight factor
    ``[N, G]`` float32, sign), in the order q8.h (and q8k.h's legacy order) apply them per group."""
    m, g, _ = qg.shape
    _, qk, nbytes = FORMATS[qtype]
    b = data.reshape(n, g, nbytes)
    dw = _f16(b, 0)[..., 0]                                              # [N, G]
    if qtype == Q8_0:
        return [(_int_dot(qg, b[..., 2:].contiguous().view(torch.int8).to(torch.int32)), dw, 1.0)]
    if qtype == Q5_0:
        qh = b[..., 2:6].to(torch.int64)
        qh = qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24
        w = (_nibbles(b[..., 6:]) | (((qh[..., None] >> torch.arange(32)) & 1) << 4).to(torch.int32)) - 16
        return [(_int_dot(qg, w), dw, 1.0)]
    return [(_int_dot(qg, _nibbles(b[..., 4:])), dw, 1.0),
            (qsum[:, None, :].expand(m, n, g), _f16(b, 2)[..., 0], 1.0)]


def matmul_q8(x: torch.Tensor, data: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
    """``gguf_matmul(x, W, activations="q8")`` bit for bit: per group g = 8t + j of 32 weights, the
    exact integer sums, then lane j of an 8-lane float32 accumulator takes (t in order)
    ``A = fma(float(intsum), d_w * dx, A)`` (plus the min terms), and ``y = h(A)`` (q8.h).

    Shape: ``x`` ``[M, K]``, ``data`` uint8 blocks of W ``[N, K]``; returns float32 ``[M, N]``.
    """
    if qtype in FILE_FORMAT:
        file = FILE_FORMAT[qtype]
        return matmul_q8(x, from_lanes(data, file), file, out_features)
    if qtype in FILE_OF_PANELS:
        return matmul_q8(x, from_panels(data.reshape(out_features, -1), qtype), FILE_OF_PANELS[qtype], out_features)
    m, k = x.shape
    n, g = out_features, k // 32
    q, dx, s = quantize_q8_parts(x)
    qg = q.reshape(m, g, 32).to(torch.int32)
    qsum = s.reshape(m, g, 2).to(torch.int32).sum(-1).double()           # [M, G]: Σ q over group g
    steps = []  # per step: (integer term [M, N, G] as float64, weight factor [N, G] float32, sign)
    if qtype in (Q8_0, Q5_0, Q4_1):
        steps = _legacy_steps(qg, qsum, data, qtype, n)
    elif qtype == Q4_K:
        w, sc, mn, d, dmin = _kquant_integers(data, qtype, n, k)
        rep = lambda v: v.repeat_interleave(8, dim=1)  # noqa: E731  per super-block -> per group
        steps.append((_int_dot(qg, w.reshape(n, g, 32)) * sc.reshape(n, g), rep(d), 1.0))
        steps.append((qsum[:, None, :] * mn.reshape(n, g), rep(dmin), -1.0))
    elif qtype == Q6_K:
        w, sc, _, d, _ = _kquant_integers(data, qtype, n, k)
        w = (w - 32).reshape(n, g, 2, 16)                                  # group g: sub-blocks 2g, 2g + 1
        halves = torch.einsum("mghl,nghl->mngh", qg.reshape(m, g, 2, 16).double(), w.double())
        steps.append(((halves * sc.reshape(n, g, 2)).sum(-1), d.repeat_interleave(8, dim=1), 1.0))
    else:
        raise ValueError(f"unsupported GGML type {qtype}; supported: {sorted(FORMATS)}")
    t = (g + 7) // 8
    acc = torch.zeros(m, n, 8, dtype=torch.float32)
    for step in range(t):
        lo, hi = 8 * step, min(8 * step + 8, g)
        for term, factor, sign in steps:
            a_ = torch.zeros(m, n, 8, dtype=torch.float32)
            f_ = torch.zeros(m, n, 8, dtype=torch.float32)
            a_[..., :hi - lo] = (sign * term[..., lo:hi]).float()          # exact: |term| < 2^24
            f_[..., :hi - lo] = factor[None, :, lo:hi] * dx[:, None, lo:hi]  # one float32 product
            acc = _fma(a_, f_, acc)
    v = acc
    return ((v[..., 0] + v[..., 4]) + (v[..., 2] + v[..., 6])) + ((v[..., 1] + v[..., 5]) + (v[..., 3] + v[..., 7]))


# ---- Q8K activations: the prefill kernel of CPUs without AMX (csrc/kernels/gguf/q8k.h) -------------


def quantize_q8k_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q8K activations of ``x``: per super-block of 256, ``d = amax|x| / 127`` (one float32 division)
    and ``q = round_half_even(x / d)`` clamped to [-127, 127] (0 where d == 0); the int16 sums of q
    over each 16 values.

    Shape: ``x`` ``[M, K]`` (K a multiple of 256); returns q int8 ``[M, K]``, d float32 ``[M, K/256]``,
    s int16 ``[M, K/16]``.
    """
    return _quantize_int8(x, 256)


def matmul_q8k(x: torch.Tensor, data: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
    """``gguf_linear(x, W, activations="q8k")`` bit for bit for a Q4_K / Q6_K weight (or its lane-
    order layout): per super-block t the exact integers S (sub-block scales times the sub-blocks'
    Σ w q) and P (x's 16-value sums times their coefficients), then, t in order, Q4_K
    ``A = fma(float(S), d * dx, A); A = fnma(float(P), dmin * dx, A)``, Q6_K
    ``A = fma(float(S - 32 P), d * dx, A)`` (q8k.h). A Q8_0 / Q5_0 / Q4_1 weight: x's Q8 form
    (``quantize_q8_parts``) and q8.h's integers, the float steps in one accumulator, group by group
    (q8k.h's legacy order).

    Shape: ``x`` ``[M, K]`` (K a multiple of 256; 32 for a legacy weight), ``data`` uint8 blocks of W
    ``[N, K]``; returns float32 ``[M, N]``.
    """
    if qtype in FILE_FORMAT:
        file = FILE_FORMAT[qtype]
        return matmul_q8k(x, from_lanes(data, file), file, out_features)
    if qtype in FILE_OF_PANELS:
        return matmul_q8k(x, from_panels(data.reshape(out_features, -1), qtype), FILE_OF_PANELS[qtype], out_features)
    if qtype in (Q8_0, Q5_0, Q4_1):
        q, dx, s = quantize_q8_parts(x)
        m, g = q.shape[0], q.shape[1] // 32
        qsum = s.reshape(m, g, 2).to(torch.int32).sum(-1).double()
        steps = _legacy_steps(q.reshape(m, g, 32).to(torch.int32), qsum, data, qtype, out_features)
        acc = torch.zeros(m, out_features, dtype=torch.float32)
        for i in range(g):
            for term, factor, sign in steps:
                acc = _fma((sign * term[..., i]).float(), factor[None, :, i] * dx[:, None, i], acc)
        return acc
    if qtype not in (Q4_K, Q6_K):
        raise ValueError(f"the Q8K kernel multiplies Q4_K, Q6_K, Q8_0, Q5_0 and Q4_1 weights; got GGML type {qtype}")
    m, k = x.shape
    n, t = out_features, k // 256
    q, dx, s = quantize_q8k_parts(x)
    w, sc, mn, d, dmin = _kquant_integers(data, qtype, n, k)
    pc = mn.repeat_interleave(2, dim=-1) if qtype == Q4_K else sc  # per 16 values of x: [N, T, 16]
    subs = sc.shape[-1]
    qb = q.reshape(m, t, subs, 256 // subs).double()
    dots = torch.einsum("mtjl,ntjl->mntj", qb, w.reshape(n, t, subs, 256 // subs).double())  # exact
    S = (dots * sc[None].double()).sum(-1)                                                     # [M, N, T]
    P = torch.einsum("mth,nth->mnt", s.reshape(m, t, 16).double(), pc.double())
    acc = torch.zeros(m, n, dtype=torch.float32)
    for i in range(t):
        dd = d[None, :, i] * dx[:, None, i]  # one float32 product
        if qtype == Q4_K:
            acc = _fma(S[..., i].float(), dd, acc)
            acc = _fma(-P[..., i].float(), dmin[None, :, i] * dx[:, None, i], acc)
        else:
            acc = _fma((S[..., i] - 32 * P[..., i]).float(), dd, acc)
    return acc
