"""Random GGUF blocks for the tests: random bytes (every code value, every bit pattern of the
k-quants' 6-bit scales) with sane fp16 scales, so products stay in the range of real weights."""

from __future__ import annotations

import numpy as np

from specdec_cuda.reference.gguf import FORMATS, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0

# Byte offsets of each format's fp16 fields in a block (reference/gguf.py), and a range of sane
# values for each: scales of real weights, offsets (Q4_1's m) of either sign.
HALF_FIELDS = {Q4_1: [(0, 1e-3, 2e-2), (2, -0.2, 0.2)], Q5_0: [(0, -2e-2, 2e-2)], Q8_0: [(0, -2e-2, 2e-2)],
               Q4_K: [(0, 1e-4, 5e-3), (2, 1e-4, 5e-3)], Q6_K: [(208, -5e-3, 5e-3)]}


def random_blocks(qtype, n: int, k: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """The blocks of a random ``[n, k]`` weight of ``qtype`` (an int or gguf.GGMLQuantizationType),
    drawn from ``seed`` (an int, or a generator to draw on).  Shape: uint8 [n, row_bytes]."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    _, qk, nbytes = FORMATS[int(qtype)]
    raw = rng.integers(0, 256, size=(n, k // qk, nbytes), dtype=np.uint8)
    for off, lo, hi in HALF_FIELDS[int(qtype)]:
        vals = rng.uniform(lo, hi, size=raw.shape[:2]).astype(np.float16)
        raw[:, :, off:off + 2] = vals.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(n, -1)
