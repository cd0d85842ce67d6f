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


def cached_inv_freq(cache: dict, config, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The [head_dim] vector ``cat(f, f)`` of ``config``'s frequencies for a model computing in
    ``dtype``, on ``device``: angles in float32 as Hugging Face does (float64 for a float64 model).
    ``cache`` (the model's own dict) keeps it per (device, precision), so it never goes stale when
    the model moves. ``config``: anything ``inverse_frequencies`` reads (head_dim, rope_theta,
    rope_scaling)."""
    precision = torch.float64 if dtype == torch.float64 else torch.float32
    key = (device, precision)
    if key not in cache:
        inv = inverse_frequencies(config, precision)
        cache[key] = torch.cat((inv, inv)).to(device)
    return cache[key]


def cached_cos_sin(cache: dict, config, positions: torch.Tensor,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_cos_sin`` at ``positions`` [B, n] with ``cached_inv_freq``'s frequencies."""
    return rope_cos_sin(positions, cached_inv_freq(cache, config, positions.device, dtype), dtype)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin for ``positions`` [B, n]; each [B, n, 1, head_dim] in ``dtype`` (broadcast
    over heads). ``inv_freq`` is the [head_dim] vector ``cat(f, f)`` of the [head_dim / 2]
    frequencies ``f``; the sin's first half is negated for ``apply_rope``."""
    angles = positions.unsqueeze(-1).to(inv_freq.dtype) * inv_freq  # [B, n, head_dim]
    half = inv_freq.shape[0] // 2
    sin = angles.sin()
    sin[..., :half].neg_()
    return angles.cos().to(dtype).unsqueeze(2), sin.to(dtype).unsqueeze(2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, n, heads, head_dim] by the angles of ``rope_cos_sin`` [B, n, 1, head_dim].

    Pairs dimension i with i + head_dim / 2: out = x * cos + cat(-x2, x1) * sin, written as
    x * cos + roll(x, head_dim / 2) * cat(-sin1, sin2) (the same products, two ops fewer).
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
