"""Hierarchical 4-bit KV cache ops: quantise blocks of keys / values into the cache, read it back
as upper-only (what a draft reads) or upper + lower (close to int8, what verification reads).

The code math and the storage are specified in ``specdec_cuda.reference.kv_quant``:

* keys are grouped along tokens per channel (``key_group`` tokens per scale / zero): ``k_upper``,
  ``k_lower`` uint8 ``[B, H, T, D/2]``, ``k_scale``, ``k_zero`` float32 ``[B, H, T/key_group, D]``;
* values are grouped along channels per token: ``v_upper``, ``v_lower`` uint8 ``[B, H, T, D/2]``,
  ``v_scale``, ``v_zero`` float32 ``[B, H, T, D/value_group]``.

``T`` is the cache's token capacity. The cache tensors are written in place.
"""

from __future__ import annotations

import torch

from . import args

__all__ = [
    "allocate_kv_cache",
    "kv_quantize_keys",
    "kv_quantize_values",
    "kv_dequantize_keys",
    "kv_dequantize_values",
]


def allocate_kv_cache(
    batch: int, heads: int, capacity: int, head_dim: int, key_group: int = 64, value_group: int = 32, device=None
) -> dict[str, torch.Tensor]:
    """Empty quantised storage for one layer (names as the ops' arguments).

    Shape: ``*_upper`` / ``*_lower`` ``[batch, heads, capacity, head_dim/2]`` uint8 (zero-filled),
    ``k_scale`` / ``k_zero`` ``[batch, heads, capacity/key_group, head_dim]``, ``v_scale`` /
    ``v_zero`` ``[batch, heads, capacity, head_dim/value_group]`` float32 (zero-filled).
    """
    if capacity % key_group != 0:
        raise ValueError(f"capacity {capacity} must be a multiple of key_group {key_group}")
    if head_dim % 2 != 0 or value_group % 2 != 0 or head_dim % value_group != 0:
        raise ValueError(f"head_dim {head_dim} must be a multiple of an even value_group; got {value_group}")
    codes = (batch, heads, capacity, head_dim // 2)
    f32 = dict(dtype=torch.float32, device=device)
    return {
        "k_upper": torch.zeros(codes, dtype=torch.uint8, device=device),
        "k_lower": torch.zeros(codes, dtype=torch.uint8, device=device),
        "k_scale": torch.zeros(batch, heads, capacity // key_group, head_dim, **f32),
        "k_zero": torch.zeros(batch, heads, capacity // key_group, head_dim, **f32),
        "v_upper": torch.zeros(codes, dtype=torch.uint8, device=device),
        "v_lower": torch.zeros(codes, dtype=torch.uint8, device=device),
        "v_scale": torch.zeros(batch, heads, capacity, head_dim // value_group, **f32),
        "v_zero": torch.zeros(batch, heads, capacity, head_dim // value_group, **f32),
    }


def _block(x, name: str) -> torch.Tensor:
    x = args.tensor(x, name)
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or x.dim() != 4:
        raise TypeError(f"{name} must be a float32 / float16 / bfloat16 [B, H, n, D] tensor, got "
                        f"{x.dtype} {list(x.shape)}")
    return x.contiguous()


def _start(start, batch: int, device) -> torch.Tensor:
    # an int or integer tensor; a float start is an error, not truncated to a token index
    if isinstance(start, int) and not isinstance(start, bool):
        if not -2**63 <= start < 2**63:
            raise ValueError(f"start {start} does not fit in int64")
        return torch.full((batch,), start, dtype=torch.int64, device=device)
    start = args.tensor(start, "start")
    if start.dtype.is_floating_point or start.dtype.is_complex or start.dtype == torch.bool:
        raise TypeError(f"start must be an int or an integer tensor, got {start.dtype}")
    return start.to(device=device, dtype=torch.int64).contiguous()


def _codes(t, name: str) -> torch.Tensor:
    t = args.tensor(t, name)
    if t.dtype != torch.uint8 or t.dim() != 4:
        raise TypeError(f"{name} must be a uint8 [B, H, capacity, D/2] tensor, got {t.dtype} {list(t.shape)}")
    return t


def _num_tokens(num_tokens) -> int:
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
    return num_tokens


def kv_quantize_keys(k, start, group_size, k_upper, k_lower, k_scale, k_zero) -> None:
    """Quantise a block of keys into the cache, tokens ``[start[b], start[b] + n)`` of row b.

    Shape: k ``[B, H, n, D]`` (n a multiple of ``group_size``); start ``[B]`` int64 (or an int),
    each a multiple of ``group_size``; cache tensors as in the module docstring (written in place).
    On CUDA, rows whose ``start`` is out of range are left untouched (no host sync to check them).

    Example
    -------
    >>> c = allocate_kv_cache(1, 2, 128, 64)
    >>> kv_quantize_keys(torch.randn(1, 2, 64, 64), 0, 64, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"])
    """
    k = _block(k, "k")
    torch.ops.specdec.kv_quantize_keys(
        k, _start(start, k.shape[0], k.device), group_size, k_upper, k_lower, k_scale, k_zero
    )


def kv_quantize_values(v, start, group_size, v_upper, v_lower, v_scale, v_zero) -> None:
    """Quantise a block of values into the cache (any number of tokens ``n``).

    Shape: v ``[B, H, n, D]``; start ``[B]`` int64 (or an int); cache tensors written in place.
    """
    v = _block(v, "v")
    torch.ops.specdec.kv_quantize_values(
        v, _start(start, v.shape[0], v.device), group_size, v_upper, v_lower, v_scale, v_zero
    )


def kv_dequantize_keys(k_upper, k_lower, k_scale, k_zero, group_size, num_tokens, use_lower=True, dtype=torch.float32):
    """Keys of tokens ``[0, num_tokens)`` read back.  Shape: ``[B, H, num_tokens, D]`` in ``dtype``.

    ``use_lower=False`` reads the upper nibbles only (half the bytes; ``k_lower`` is not read).

    Example
    -------
    >>> c = allocate_kv_cache(1, 2, 128, 64)
    >>> kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], 64, 128).shape
    torch.Size([1, 2, 128, 64])
    """
    b, h, _, half_d = _codes(k_upper, "k_upper").shape
    out = torch.empty(b, h, _num_tokens(num_tokens), 2 * half_d, dtype=dtype, device=k_upper.device)
    torch.ops.specdec.kv_dequantize_keys(k_upper, k_lower, k_scale, k_zero, group_size, use_lower, out)
    return out


def kv_dequantize_values(v_upper, v_lower, v_scale, v_zero, group_size, num_tokens, use_lower=True, dtype=torch.float32):
    """Values of tokens ``[0, num_tokens)`` read back.  Shape: ``[B, H, num_tokens, D]`` in ``dtype``."""
    b, h, _, half_d = _codes(v_upper, "v_upper").shape
    out = torch.empty(b, h, _num_tokens(num_tokens), 2 * half_d, dtype=dtype, device=v_upper.device)
    torch.ops.specdec.kv_dequantize_values(v_upper, v_lower, v_scale, v_zero, group_size, use_lower, out)
    return out


@torch.library.register_fake("specdec::kv_quantize_keys")
def _quantize_keys_fake(k, start, group_size, k_upper, k_lower, k_scale, k_zero):
    return None


@torch.library.register_fake("specdec::kv_quantize_values")
def _quantize_values_fake(v, start, group_size, v_upper, v_lower, v_scale, v_zero):
    return None


@torch.library.register_fake("specdec::kv_dequantize_keys")
def _dequantize_keys_fake(k_upper, k_lower, k_scale, k_zero, group_size, use_lower, out):
    return None


@torch.library.register_fake("specdec::kv_dequantize_values")
def _dequantize_values_fake(v_upper, v_lower, v_scale, v_zero, group_size, use_lower, out):
    return None
