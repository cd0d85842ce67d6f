"""Reference for ``skinny_linear``: ``x · weightᵀ + bias`` in float32 (the kernel's sums differ from
it by rounding only; each of the kernel's output rows is independent of the other rows of x)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Shape: x ``[M, K]``, weight ``[N, K]``, bias ``[N]`` or None -> ``[M, N]`` (float32)."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float())


def unpack_weight(panels: torch.Tensor, out_features: int) -> torch.Tensor:
    """The ``[N, K]`` float32 weight held by packed panels ``[ceil(N / 64), K, 64]``."""
    P, K, width = panels.shape
    return panels.float().transpose(1, 2).reshape(P * width, K)[:out_features]


def skinny_linear_packed(x: torch.Tensor, panels: torch.Tensor, out_features: int,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """Shape: x ``[M, K]``, panels ``[ceil(N / 64), K, 64]``, bias ``[N]`` or None -> ``[M, N]``."""
    return skinny_linear(x, unpack_weight(panels, out_features), bias)
