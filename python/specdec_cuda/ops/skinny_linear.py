"""A float32 linear layer for a few activation rows on the CPU: ``skinny_linear``, and
``skinny_linear_packed`` from a weight packed once (``pack_weight``).

Decoding and speculative verification multiply 1 .. 16 token rows by every weight matrix. A BLAS
GEMM at 2 .. 16 rows costs about twice its one-row GEMV on a CPU; this kernel streams each weight
row once for up to 8 activation rows, so verifying 5 tokens moves the weights once, as decoding one
token does. Each output row is one fixed sequence of operations on its own input row, so a token's
result does not depend on the other rows of the batch (verification and one-token decoding give
the same bits). The reference is ``specdec_cuda.reference.skinny_linear`` (``F.linear``).

The packed form is what a model's decoding forward uses (``models/layers.py``): the weight is
stored as column panels ``[ceil(N / 64), K, 64]`` so that each input feature is one broadcast
against 64 contiguous weights, with no horizontal sum per output (which costs as much as the
multiply-adds at K of a few hundred). A weight whose values are all bfloat16 numbers (a bf16
checkpoint loaded as float32) is packed as bfloat16: the same values in half the bytes, widened
exactly, so the product is the float32 model's, read at twice the speed from memory. Each output
is one fused multiply-add chain over K in order (then + bias): batch-invariant, and the same bits
from the AVX-512 and AVX2 kernels and the portable loop.

On a CPU with AMX (Intel Sapphire Rapids and later), bfloat16 panels run an AMX tier instead
(``packed_bf16_tier() == "amx"``): each float32 activation is split exactly into three bfloat16
numbers and the tile unit sums the exact products in float32, so up to 16 rows cost what one row
costs (a tree verification for the price of a one-token step). Still batch-invariant, and within
float32 rounding of the FMA tiers, but not their bits. ``SPECDEC_CPU_ISA=avx512-novnni`` (or
narrower) turns it off.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from dataclasses import dataclass

__all__ = ["skinny_linear", "linear", "PANEL", "PackedWeight", "pack_weight", "unpack_weight",
           "skinny_linear_packed", "rounded_activations", "packed_kernel_available"]

# Rows of x up to which ``linear`` takes the skinny kernel: a verification of up to 32 drafts (the
# quantised cache's default residual) plus its root, so every decoding-time forward of a model
# gets batch-invariant results; a prefill (thousands of rows) goes to BLAS.
MAX_ROWS = 33


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x · weightᵀ + bias`` in float32 through the skinny kernel (CPU tensors).

    Shape: x ``[..., K]`` float32, weight ``[N, K]`` float32, bias ``[N]`` float32 or None;
    returns ``[..., N]`` float32 (a new tensor).

    Example
    -------
    >>> w = torch.randn(64, 32)
    >>> skinny_linear(torch.randn(3, 32), w).shape
    torch.Size([3, 64])
    """
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.float32):
            raise TypeError(f"skinny_linear: {name} must be a float32 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"skinny_linear: x [..., K] and weight [N, K] must agree on K, got x "
                         f"{list(x.shape)} and weight {list(weight.shape)}")
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(x2.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
    torch.ops.specdec.skinny_linear(x2, weight.contiguous(), None if bias is None else bias.contiguous(), out)
    return out.view(*x.shape[:-1], weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, through ``skinny_linear`` for float32 CPU inputs of at most ``MAX_ROWS`` rows
    (batch-invariant results, the weight read once), else ``F.linear`` itself.

    Shape: x ``[..., K]``, weight ``[N, K]``, bias ``[N]`` or None -> ``[..., N]``.
    """
    rows = x.numel() // max(1, x.shape[-1])
    if (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and rows <= MAX_ROWS
            and (bias is None or bias.dtype == torch.float32) and not torch.is_grad_enabled()):
        return skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)


# Outputs per panel of a packed weight (csrc/kernels/skinny_linear/packed_cpu.h, kPanel).
PANEL = 64


@dataclass(frozen=True)
class PackedWeight:
    """A linear weight ``[N, K]`` packed for ``skinny_linear_packed``.

    ``panels``: ``[ceil(N / PANEL), K, PANEL]`` float32 or bfloat16, ``panels[p, k, j] = weight[p *
    PANEL + j, k]`` (zero past N); ``out_features``: N."""

    panels: torch.Tensor
    out_features: int

    @property
    def in_features(self) -> int:
        return self.panels.shape[1]

    @property
    def nbytes(self) -> int:
        return self.panels.numel() * self.panels.element_size()


def pack_weight(weight: torch.Tensor, dtype: torch.dtype | None = None) -> PackedWeight:
    """Pack a float32 or bfloat16 weight ``[N, K]`` into panels.

    ``dtype``: float32 or bfloat16; None picks bfloat16 when that is exact (a bfloat16 weight, or a
    float32 one whose values are all bfloat16 numbers, as in a bf16 checkpoint loaded as float32),
    else float32. Packing as bfloat16 a weight that is not exact raises (it would change the model).
    Memory: the panels, plus (float32 weights) one bfloat16 copy for the exactness check.

    Example
    -------
    >>> w = torch.randn(100, 32).bfloat16().float()
    >>> pack_weight(w).panels.shape, pack_weight(w).panels.dtype
    (torch.Size([2, 32, 64]), torch.bfloat16)
    """
    if (not isinstance(weight, torch.Tensor) or weight.dtype not in (torch.float32, torch.bfloat16)
            or weight.dim() != 2):
        raise TypeError(f"pack_weight: weight must be a float32 or bfloat16 [N, K] tensor, got "
                        f"{getattr(weight, 'dtype', type(weight).__name__)} {list(getattr(weight, 'shape', []))}")
    exact_bf16 = weight.dtype == torch.bfloat16 or torch.equal(weight.bfloat16().float(), weight)
    if dtype is None:
        dtype = torch.bfloat16 if exact_bf16 else torch.float32
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"pack_weight: dtype must be float32 or bfloat16, got {dtype}")
    if dtype == torch.bfloat16 and not exact_bf16:
        raise ValueError("pack_weight: the weight holds values that are not bfloat16 numbers; packing it as "
                         "bfloat16 would change the model (pack as float32)")
    N, K = weight.shape
    full, rest = divmod(N, PANEL)
    # panels[p, k, j] = weight[p * PANEL + j, k]: copied (and cast) straight from strided views, so no
    # padded or transposed temporary of the weight's size is made.
    panels = torch.empty(full + (rest > 0), K, PANEL, dtype=dtype, device=weight.device)
    panels[:full].copy_(weight[: full * PANEL].view(full, PANEL, K).transpose(1, 2))
    if rest:
        panels[full].zero_()
        panels[full, :, :rest].copy_(weight[full * PANEL :].T)
    return PackedWeight(panels, N)


def unpack_weight(packed: PackedWeight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The ``[N, K]`` weight held by ``packed`` (exactly its values; in the panels' dtype unless
    ``dtype`` is given): what a model that keeps only its panels gives back for its dense weights.

    Example
    -------
    >>> w = torch.randn(100, 32)
    >>> torch.equal(unpack_weight(pack_weight(w)), w)
    True
    """
    P, K, width = packed.panels.shape
    dense = torch.empty(packed.out_features, K, dtype=dtype or packed.panels.dtype, device=packed.panels.device)
    full = packed.out_features // width
    dense[: full * width].view(full, width, K).copy_(packed.panels[:full].transpose(1, 2))
    if full < P:
        dense[full * width :].copy_(packed.panels[full, :, : packed.out_features - full * width].T)
    return dense


def rounded_activations(activations: str, what: str = "") -> bool:
    """Whether ``activations`` ("float32" or "bfloat16", the products of bfloat16 panels) asks for x
    rounded to bfloat16; ValueError (prefixed with ``what``) for anything else."""
    if activations not in ("float32", "bfloat16"):
        raise ValueError(f"{what}activations must be 'float32' or 'bfloat16', got {activations!r}")
    return activations == "bfloat16"


def skinny_linear_packed(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None, *,
                         activations: str = "float32") -> torch.Tensor:
    """``x · weightᵀ + bias`` in float32 from a packed weight (CPU tensors).

    Shape: x ``[..., K]`` float32 (contiguous), bias ``[N]`` float32 or None; returns ``[..., N]``.
    ``activations="bfloat16"``: on the AMX tier (``packed_bf16_tier() == "amx"``), bfloat16 panels
    multiply x rounded to bfloat16 (one tile product per weight instead of the exact split's three;
    each output sums exact products of the rounded x in the tile unit's order), as a model set to
    bfloat16 activations does; elsewhere, and for float32 panels, x as it is.
    """
    if x.dtype != torch.float32 or x.shape[-1] != packed.in_features:
        raise ValueError(f"skinny_linear_packed: x must be float32 [..., K={packed.in_features}], got "
                         f"{x.dtype} {list(x.shape)}")
    rounded = rounded_activations(activations, "skinny_linear_packed: ")
    out = torch.empty(*x.shape[:-1], packed.out_features, dtype=torch.float32, device=x.device)
    torch.ops.specdec.skinny_linear_packed(x.contiguous(), packed.panels, bias, out, rounded)
    return out


@functools.cache
def packed_kernel_available() -> bool:
    """Whether ``skinny_linear_packed`` runs a vector kernel (AVX-512 or AVX2) on this CPU (the
    portable loop gives the same bits far slower: models then keep BLAS). Fixed when the library
    loads (the ISA and ``SPECDEC_CPU_ISA`` are read then), so asked once per process."""
    from .._native import _C

    return _C.skinny_linear_packed_isa() != "portable"


@functools.cache
def packed_bf16_tier() -> str:
    """The tier bfloat16 panels run on this machine: ``"amx"``, ``"avx512"``, ``"avx2"`` or
    ``"portable"`` (fixed when the library loads, as ``packed_kernel_available``)."""
    from .._native import _C

    return _C.skinny_linear_packed_isa_bf16()


@torch.library.register_fake("specdec::skinny_linear")
def _skinny_linear_fake(x, weight, bias, out):
    return None


@torch.library.register_fake("specdec::skinny_linear_packed")
def _skinny_linear_packed_fake(x, packed, bias, out, rounded=False):
    return None
