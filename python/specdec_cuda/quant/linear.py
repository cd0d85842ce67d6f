"""``W4Linear`` and ``quantize_linears``: int4 weights behind the ``nn.Linear`` interface."""

from __future__ import annotations

import fnmatch
from typing import Callable, Iterable

import torch
from torch import nn

from ..ops import quant as qops


class W4Linear(nn.Module):
    """``y = x · dequant(W)ᵀ + b`` with W symmetric int4 in groups of ``group_size`` input features.

    The packed weight is stored in the layout of the device it lives on; ``.to(device)`` /
    ``.cuda()`` / ``.cpu()`` repack it from the exact integer codes (so the codes move losslessly;
    scales take the device's scale dtype). On CUDA the weight serves one activation dtype (its
    scales' dtype); ``.half()`` / ``.to(torch.bfloat16)`` repack it for the other.

    Shape: input ``[..., in_features]`` -> output ``[..., out_features]``, the input's dtype.

    Example
    -------
    >>> lin = nn.Linear(512, 256)
    >>> q = W4Linear.from_linear(lin, group_size=64)
    >>> q(torch.randn(4, 512)).shape
    torch.Size([4, 256])
    """

    def __init__(self, weight: qops.PackedW4, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = weight.in_features
        self.out_features = weight.out_features
        self.group_size = weight.group_size
        self.register_buffer("packed", weight.packed)
        self.register_buffer("scales", weight.scales)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, *, device=None) -> "W4Linear":
        """Quantise ``linear`` (its weight and device by default); the bias stays full precision."""
        device = torch.device(device) if device is not None else linear.weight.device
        packed = qops.quantize_w4(linear.weight.detach(), group_size, device=device)
        bias = None if linear.bias is None else linear.bias.detach().to(device)
        return cls(packed, bias)

    @property
    def weight_packed(self) -> qops.PackedW4:
        return qops.PackedW4(self.packed, self.scales, self.group_size, self.out_features, self.in_features)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Shape: ``[out_features, in_features]``."""
        return qops.w4_dequantize(self.weight_packed, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = qops.w4a16_matmul(x, self.weight_packed)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y

    def _apply(self, fn, recurse=True):
        # Each device has its own layout, and a CUDA weight is packed for one activation dtype:
        # repack (exactly, from the integer codes) when the device changes, or when a CUDA module
        # is cast to the other 16-bit dtype.
        probe = fn(torch.empty(0, device=self.packed.device))
        half = probe.dtype in (torch.float16, torch.bfloat16)
        moved = probe.device != self.packed.device
        if moved or (probe.device.type != "cpu" and half and probe.dtype != self.scales.dtype):
            repacked = qops.repack_w4(self.weight_packed, probe.device, scale_dtype=probe.dtype if half else None)
            self.packed, self.scales = repacked.packed, repacked.scales
        if self.bias is not None:
            self.bias = nn.Parameter(fn(self.bias.detach()), requires_grad=False)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}")


def quantize_linears(
    model: nn.Module,
    include: Iterable[str] | Callable[[str, nn.Linear], bool] = ("*mlp*",),
    exclude: Iterable[str] = ("*lm_head*",),
    group_size: int = 128,
) -> list[str]:
    """Replace the chosen ``nn.Linear`` modules of ``model`` by ``W4Linear`` in place.

    ``include`` is a list of glob patterns over module names (``"*mlp*"``: only the MLPs, as
    QuantSpec does; ``"*"``: every linear) or a predicate ``(name, module) -> bool``; names
    matching ``exclude`` are kept. Layers whose in_features is not a multiple of 32 (or of the
    group size) are skipped. Returns the names replaced.

    Example
    -------
    >>> m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    >>> quantize_linears(m, include=["*"], group_size=32)
    ['0', '2']
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not (
            group_size == -1 or (group_size > 0 and group_size % 32 == 0)):
        raise ValueError(f"quantize_linears: group_size must be -1 (per channel) or a positive multiple of 32, "
                         f"got {group_size!r}")
    if callable(include):
        chosen = include
    else:
        patterns = list(include)
        chosen = lambda name, _m: any(fnmatch.fnmatch(name, p) for p in patterns)  # noqa: E731
    excluded = list(exclude)
    replaced = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or any(fnmatch.fnmatch(name, p) for p in excluded):
            continue
        if not chosen(name, module):
            continue
        g = module.in_features if group_size == -1 else group_size
        if module.in_features % 32 != 0 or module.in_features % g != 0:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, W4Linear.from_linear(module, group_size))
        replaced.append(name)
    return replaced
