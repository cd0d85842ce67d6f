"""Philox4x32-10 in plain PyTorch: the same bits as ``csrc/kernels/common/philox.h``.

Every random number in specdec_cuda is a pure function of
``(seed, absolute position, purpose, substream, element index)``. This module is the executable
specification of that function; the kernels are tested against it bit for bit.

uint32 values are carried in int64 tensors, and 32x32-bit products are formed from 16-bit halves
so no intermediate leaves the int64 range.
"""

from __future__ import annotations

import enum

import torch

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


class Purpose(enum.IntEnum):
    """What a draw is for; distinct purposes are independent streams at the same position."""

    ACCEPT = 1  # uniform of an accept / reject test
    RESIDUAL = 2  # sampling from max(0, p - q) after a rejection
    SAMPLE = 3  # sampling from the target: bonus token, sample-and-match, plain sampling
    DRAFT = 4  # sampling draft tokens from a drafter's distribution
    TREE = 5  # tree verification (one-hot sibling walks)
    DIFFUSION = 6  # diffusion generation: a masked position's token at one step (substream = step)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of the 64-bit product of constant ``a`` and uint32 tensor ``b``."""
    ah, al = a >> 16, a & 0xFFFF
    bh, bl = b >> 16, b & 0xFFFF
    low = al * bl
    mid = ah * bl + al * bh
    low_sum = low + ((mid & 0xFFFF) << 16)
    lo = low_sum & _MASK32
    hi = (ah * bh + (mid >> 16) + (low_sum >> 32)) & _MASK32
    return hi, lo


def philox4x32_10(counter: list[torch.Tensor], key: list[torch.Tensor]) -> list[torch.Tensor]:
    """Philox4x32-10 on broadcastable int64 tensors holding uint32 values."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    return [c0, c1, c2, c3]


def random_bits(
    seed: torch.Tensor, position: torch.Tensor, purpose: int, substream: int | torch.Tensor,
    element: torch.Tensor,
) -> torch.Tensor:
    """uint32 draws (in int64) for broadcast ``seed``, ``position``, ``substream`` and ``element``.

    Shape: the broadcast shape of the inputs.
    """
    seed = torch.as_tensor(seed, dtype=torch.int64)
    position = torch.as_tensor(position, dtype=torch.int64)
    element = torch.as_tensor(element, dtype=torch.int64)
    substream = torch.as_tensor(substream, dtype=torch.int64)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    c1 = (purpose & 0xFF) | ((substream << 8) & _MASK32)
    c2, c3 = position & _MASK32, (position >> 32) & _MASK32
    c0 = element >> 2
    shape = torch.broadcast_shapes(k0.shape, c1.shape, c2.shape, c0.shape)
    out = philox4x32_10([t.expand(shape) for t in (c0, c1, c2, c3)],
                        [k0.expand(shape), k1.expand(shape)])
    lane = (element & 3).expand(shape)
    stacked = torch.stack(out, dim=-1)
    return stacked.gather(-1, lane.unsqueeze(-1)).squeeze(-1)


def uniform_open01(bits: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in (0, 1): (2 * (bits >> 9) + 1) * 2^-24, never 0 or 1."""
    return (bits >> 9).to(torch.float32) * 2.0**-23 + 2.0**-24


def uniform(seed, position, purpose: int, substream=0, element=0) -> torch.Tensor:
    """float32 uniform draws in (0, 1) for the given keys (broadcast)."""
    return uniform_open01(random_bits(seed, position, purpose, substream, element))
