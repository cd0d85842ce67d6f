"""Rotary position embeddings: inverse frequencies (default, linear, Llama 3 scaling) and rotation.

The arithmetic follows Hugging Face's so logits agree in fp32: inverse frequencies and angles are
computed in fp32 (fp64 for an fp64 model), cos/sin are cast to the model dtype, and the rotation
pairs dimension ``i`` with ``i + head_dim / 2`` ("rotate half").
"""

from __future__ import annotations

import math

import torch

from .config import LlamaConfig


def inverse_frequencies(config: LlamaConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Shape: [head_dim / 2]. ``dtype`` is the precision of the computation (fp32 or fp64)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))
    params = config.rope_scaling
    rope_type = params.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_scaling(inv_freq, params)
    return inv_freq


def _llama3_scaling(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    # Llama 3.1: wavelengths longer than the original context / low_freq_factor are stretched by
    # `factor`, those shorter than original context / high_freq_factor are kept, and the band in
    # between is interpolated linearly in 1 / wavelength.
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for ``positions`` [B, n]; each [B, 1, n, head_dim] in ``dtype`` (broadcast over heads)."""
    angles = positions.to(inv_freq.dtype).unsqueeze(-1) * inv_freq  # [B, n, head_dim / 2]
    emb = torch.cat((angles, angles), dim=-1).unsqueeze(1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, heads, n, head_dim] by the angles in cos/sin [B, 1, n, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
