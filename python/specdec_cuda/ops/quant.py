"""4-bit weights: ``quantize_w4`` (offline) and ``w4a16_matmul`` (y = x · dequant(W)ᵀ).

Weights are quantised symmetrically to int4 with one scale per group of ``group_size`` input
features (32, 64, 128, or -1 for one scale per output channel) and packed in the layout of the
device that will run them (see ``specdec_cuda.reference.quant`` for both layouts, bit by bit):

* CPU: ``packed`` uint8 ``[ceil(N/16), K/2, 16]``, ``scales`` float32 ``[ceil(N/16), K/g, 16]``;
* CUDA: ``packed`` int32 ``[ceil(N/8), ceil(K/128), 128]`` in tensor-core fragment order,
  ``scales`` float16 / bfloat16 ``[ceil(N/8), K/g, 8]``. The nibble interleave depends on the
  activation dtype (fast fp16 and bf16 dequantisation need different ones), so a CUDA weight is
  packed for one dtype, ``scales.dtype``: ``w4a16_matmul`` with x of the other dtype raises an
  error naming both; ``repack_w4`` converts (exactly, from the integer codes).

``K`` must be a multiple of 32 (and of the group size); other shapes are rejected naming the shape.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _native
from . import args
from ..reference import quant as ref

LAYOUT_CPU = ref.LAYOUT_CPU
LAYOUT_CUDA = ref.LAYOUT_CUDA

__all__ = ["LAYOUT_CPU", "LAYOUT_CUDA", "PackedW4", "quantize_w4", "repack_w4", "w4a16_matmul", "w4_dequantize",
           "layout_of", "cuda_tunings"]


class PackedW4(NamedTuple):
    """A 4-bit weight ready for ``w4a16_matmul`` (see the module docstring for the layouts)."""

    packed: torch.Tensor
    scales: torch.Tensor
    group_size: int
    out_features: int
    in_features: int


def _check_shape(n: int, k: int, group_size: int) -> int:
    if k <= 0 or k % 32 != 0:
        raise ValueError(f"4-bit weights need in_features to be a positive multiple of 32; got weight shape [{n}, {k}]")
    g = k if group_size == -1 else group_size
    if g <= 0 or g % 32 != 0 or k % g != 0:
        raise ValueError(
            f"group_size must be -1 (per channel) or a multiple of 32 dividing in_features; got {group_size} "
            f"for weight shape [{n}, {k}]"
        )
    return g


def layout_of(packed: torch.Tensor) -> int:
    """LAYOUT_CPU for a 3-D uint8 ``packed``, LAYOUT_CUDA for a 3-D int32 one."""
    if packed.dtype == torch.uint8 and packed.dim() == 3:
        return LAYOUT_CPU
    if packed.dtype == torch.int32 and packed.dim() == 3:
        return LAYOUT_CUDA
    raise ValueError(f"packed must be uint8 [ceil(N/16), K/2, 16] or int32 [ceil(N/8), ceil(K/128), 128]; got "
                     f"{packed.dtype} {tuple(packed.shape)}")


@torch.no_grad()
def quantize_w4(
    weight: torch.Tensor,
    group_size: int = 128,
    *,
    device: torch.device | str | None = None,
    scale_dtype: torch.dtype | None = None,
) -> PackedW4:
    """Quantise a linear weight to symmetric int4 and pack it for ``device``.

    Parameters
    ----------
    weight : Tensor
        Shape: ``[N, K]`` (out_features, in_features), any float dtype.
    group_size : int
        Input features per scale: 32, 64, 128 (any multiple of 32 dividing K) or -1 (per channel).
    device : device, optional
        Where the weight will run (default: ``weight.device``); picks the layout.
    scale_dtype : dtype, optional
        CUDA only: the activation dtype the weight will be used with, float16 or bfloat16 (default:
        the weight's dtype if 16-bit, else float16); it fixes the scales' dtype and the nibble
        interleave. CPU scales are float32.

    Returns
    -------
    PackedW4
        ``packed`` / ``scales`` in the device's layout, plus the group size and shape.

    Example
    -------
    >>> w = torch.randn(256, 512)
    >>> q = quantize_w4(w, group_size=64)
    >>> y = w4a16_matmul(torch.randn(3, 512), q)          # Shape: [3, 256]
    """
    args.tensor(weight, "weight")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be floating point, got {weight.dtype}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {group_size!r}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [out_features, in_features]; got shape {tuple(weight.shape)}")
    n, k = weight.shape
    _check_shape(n, k, group_size)
    device = torch.device(device) if device is not None else weight.device
    if device.type == "cpu":
        codes, scales = ref.quantize_w4(weight.detach().cpu(), group_size)
        packed, scales = ref.pack_cpu(codes, scales)
    else:
        if scale_dtype is None:
            scale_dtype = weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.float16
        if scale_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"scale_dtype must be float16 or bfloat16 on CUDA; got {scale_dtype}")
        # Quantise on the CPU, pack for the GPU: the codes are then the CPU layout's, bit for bit.
        # (On an H200, CUDA's amax / 7 differed from the CPU's in the last bit of a scale, which
        # flipped round-half codes.)
        codes, scales = ref.quantize_w4(weight.detach().cpu(), group_size)
        packed, scales = ref.pack_cuda(codes, scales, scale_dtype)
    return PackedW4(packed.to(device), scales.to(device), group_size, n, k)


def w4a16_matmul(x: torch.Tensor, weight: PackedW4, *, tuning: int | None = None) -> torch.Tensor:
    """``x · dequant(W)ᵀ``, accumulated in float32 and rounded once to x's dtype.

    Parameters
    ----------
    x : Tensor
        Shape: ``[..., K]``; float32 / float16 / bfloat16 on CPU, float16 / bfloat16 on CUDA.
    weight : PackedW4
        From ``quantize_w4`` for x's device.
    tuning : int, optional
        CUDA only, for tuning sweeps: the index of a ``cuda_tunings()`` entry to launch instead of
        the automatic choice (the tensor-core kernel at every M, in slices of the entry's rows).

    Returns
    -------
    Tensor
        Shape: ``[..., N]``, x's dtype (freshly allocated).

    Example
    -------
    >>> q = quantize_w4(torch.randn(64, 128), group_size=32)
    >>> w4a16_matmul(torch.randn(2, 5, 128), q).shape
    torch.Size([2, 5, 64])
    """
    args.tensor(x, "x")
    if not isinstance(weight, PackedW4):
        raise TypeError(f"weight must be a PackedW4 (from quantize_w4), got {type(weight).__name__}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        # like nn.Linear: integer / bool activations are an error, not silently truncated outputs
        raise TypeError(f"x must be float32, float16 or bfloat16 (float32 on the CPU only), got {x.dtype}")
    n, k = weight.out_features, weight.in_features
    packed, scales = weight.packed, weight.scales
    shape = x.shape
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension [..., in_features], got a 0-d tensor")
    if shape[-1] != k:
        raise ValueError(f"x has {shape[-1]} features but the weight expects {k} (x shape {tuple(shape)})")
    if x.device != packed.device:
        raise ValueError(f"x is on {x.device} but the packed weight is on {packed.device}")
    layout = layout_of(packed)
    if layout == LAYOUT_CUDA and scales.dtype != x.dtype:
        raise ValueError(f"the weight is packed for {scales.dtype} activations (the CUDA nibble interleave depends on "
                         f"the dtype) but x is {x.dtype}; repack it: repack_w4(weight, scale_dtype={x.dtype})")
    if tuning is not None:
        if layout != LAYOUT_CUDA:
            raise ValueError("tuning selects a CUDA kernel configuration; this weight is packed for the CPU")
        if not 0 <= tuning < len(cuda_tunings()):
            raise ValueError(f"tuning must index cuda_tunings() (0..{len(cuda_tunings()) - 1}); got {tuning}")
    # A 2-D x (the decoding loop's case) skips the reshapes: this is per-call host overhead.
    x2 = x.contiguous() if len(shape) == 2 else x.reshape(-1, k).contiguous()
    out = x2.new_empty((x2.shape[0], n))
    if tuning is None:
        torch.ops.specdec.w4a16_matmul(x2, packed, scales, weight.group_size, layout, out)
    else:
        torch.ops.specdec._w4a16_matmul_tuned(x2, packed, scales, weight.group_size, int(tuning), out)
    return out if len(shape) == 2 else out.reshape(*shape[:-1], n)


def cuda_tunings() -> list[dict]:
    """The CUDA W4A16 kernel's launch configurations, in the order ``tuning`` indexes them.

    Each is a dict: ``index``, ``rows`` (the most activation rows one launch takes: 1, 8 or 16),
    ``tiles_n`` (8-column tiles per block), ``stages`` (128-feature chunks in flight per warp),
    ``warps`` (per block, splitting K) and ``auto_for_rows`` (the M the automatic choice launches it
    for). Empty for a build without CUDA.
    """
    global _TUNINGS
    if _TUNINGS is None:
        _TUNINGS = list(getattr(_native._C, "w4a16_cuda_tunings", lambda: [])())
    return [dict(t) for t in _TUNINGS]


_TUNINGS: list[dict] | None = None  # cuda_tunings(), read from the binary once


def _codes_and_scales(weight: PackedW4) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact integer codes uint8 ``[N, K]`` and scales ``[N, K/g]`` of a packed weight, on the CPU."""
    packed, scales = weight.packed.cpu(), weight.scales.cpu()
    if layout_of(packed) == LAYOUT_CPU:
        return ref.unpack_cpu(packed, scales, weight.out_features)
    return ref.unpack_cuda(packed, scales, weight.out_features, weight.in_features)


@torch.no_grad()
def repack_w4(
    weight: PackedW4, device: torch.device | str | None = None, *, scale_dtype: torch.dtype | None = None
) -> PackedW4:
    """The same 4-bit weight in the layout of ``device`` (default: where it is) for ``scale_dtype``.

    The codes are carried over exactly; scales are converted to ``scale_dtype`` (CUDA: float16 or
    bfloat16, default: the current scales' dtype if 16-bit, else float16; CPU: always float32).
    Returns ``weight`` itself when nothing changes.

    Example
    -------
    >>> q = quantize_w4(torch.randn(64, 128), group_size=32)          # CPU layout
    >>> repack_w4(q, "cpu") is q
    True
    """
    device = torch.device(device) if device is not None else weight.packed.device
    layout = LAYOUT_CPU if device.type == "cpu" else LAYOUT_CUDA
    if layout == LAYOUT_CUDA:
        if scale_dtype is None:
            scale_dtype = weight.scales.dtype if weight.scales.dtype in (torch.float16, torch.bfloat16) else torch.float16
        if scale_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"scale_dtype must be float16 or bfloat16 on CUDA; got {scale_dtype}")
    if layout_of(weight.packed) == layout and weight.packed.device == device and (
            layout == LAYOUT_CPU or weight.scales.dtype == scale_dtype):
        return weight
    codes, scales = _codes_and_scales(weight)
    if layout == LAYOUT_CPU:
        packed, scales = ref.pack_cpu(codes, scales.float())
    else:
        packed, scales = ref.pack_cuda(codes, scales, scale_dtype)
    return PackedW4(packed.to(device), scales.to(device), weight.group_size, weight.out_features, weight.in_features)


def w4_dequantize(weight: PackedW4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense weight ``dequant(W)``.  Shape: ``[N, K]`` in ``dtype``, on the weight's device."""
    out = torch.empty(weight.out_features, weight.in_features, dtype=dtype, device=weight.packed.device)
    torch.ops.specdec.w4_dequantize(weight.packed, weight.scales, weight.group_size, layout_of(weight.packed), out)
    return out


@torch.library.register_fake("specdec::w4a16_matmul")
def _w4a16_matmul_fake(x, packed, scales, group_size, layout, out):
    return None


@torch.library.register_fake("specdec::_w4a16_matmul_tuned")
def _w4a16_matmul_tuned_fake(x, packed, scales, group_size, tuning, out):
    return None


@torch.library.register_fake("specdec::w4_dequantize")
def _w4_dequantize_fake(packed, scales, group_size, layout, weight):
    return None
