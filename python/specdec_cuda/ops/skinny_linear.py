"""A float32 linear layer for a few activation rows on the CPU: ``skinny_linear``.

Decoding and speculative verification multiply 1 .. 16 token rows by every weight matrix. A BLAS
GEMM at 2 .. 16 rows costs about twice its one-row GEMV on a CPU; this kernel streams each weight
row once for up to 8 activation rows, so verifying 5 tokens moves the weights once, as decoding one
token does. Each output row is one fixed sequence of operations on its own input row, so a token's
result does not depend on the other rows of the batch (verification and one-token decoding give
the same bits). The reference is ``specdec_cuda.reference.skinny_linear`` (``F.linear``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["skinny_linear", "linear"]

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


@torch.library.register_fake("specdec::skinny_linear")
def _skinny_linear_fake(x, weight, bias, out):
    return None
