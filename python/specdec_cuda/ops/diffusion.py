"""Masked-diffusion generation: ``diffusion_unmask``, one unmasking step over a window of positions.

LLaDA-style low-confidence remasking and Fast-dLLM's threshold rule in one op: for every masked
position of the window a token is drawn (temperature / top-k / top-p exactly as :func:`sample`,
greedy at temperature 0) together with its confidence, the token's probability; then each row keeps
its most confident masked positions (top-n), or every one whose confidence reaches a threshold and
at least the best one. No probability tensor is written. The executable specification is
:mod:`specdec_cuda.reference.diffusion`.

Random draws come from the Philox stream (seed, position + w, ``Purpose.DIFFUSION``, substream =
step), so a row's result depends neither on its batch neighbours nor on the device.

Per-row status codes (``status``; a flagged row keeps nothing, sampled -1, confidence -inf):

* 0 ``STATUS_OK``
* 1 ``STATUS_NONFINITE_LOGITS``: a masked position's logits held NaN or +inf (after the
  temperature), or only -inf.
* 3 ``STATUS_BAD_PARAMS``: temperature < 0 or NaN, top_p outside (0, 1], a NaN threshold, or a
  negative num_transfer under the top-n rule.

:func:`specdec_cuda.ops.raise_on_status` turns flagged rows into an exception.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import args
from .sampling import Scalar

__all__ = ["UnmaskResult", "diffusion_unmask"]

_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class UnmaskResult(NamedTuple):
    sampled: torch.Tensor  # [B, W] int64, -1 where not masked or flagged
    confidence: torch.Tensor  # [B, W] float32, -inf where not masked or flagged
    keep: torch.Tensor  # [B, W] bool: positions to unmask with `sampled`
    status: torch.Tensor  # [B] int32


def diffusion_unmask(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    mask_id: int,
    temperature: Scalar = 0.0,
    top_k: Scalar = 0,
    top_p: Scalar = 1.0,
    seed: Scalar = 0,
    position: Scalar = 0,
    step: Scalar = 0,
    num_transfer: Scalar = 1,
    threshold: Scalar = 0.0,
) -> UnmaskResult:
    """One unmasking step: draw the masked positions, keep the most confident.

    The top-n rule (LLaDA, ``threshold <= 0``) keeps the ``num_transfer`` masked positions of
    highest confidence (all of them when fewer are masked); the threshold rule (Fast-dLLM,
    ``threshold > 0``) keeps every masked position with ``confidence >= threshold`` and always the
    most confident one. Ties in confidence go to the lower index. Apply the step with
    ``tokens = torch.where(keep, sampled, tokens)``.

    Shape:
        logits: [B, W, V] float32 / float16 / bfloat16 (float64 on the CPU), contiguous along V
        (other strides free: a block's slice of a sequence's logits is read in place).
        tokens: [B, W] int64, ``mask_id`` at the masked positions (read only).
        temperature, top_p, threshold: float or [B] float32; top_k: int or [B] int32; seed,
        position (absolute position of column 0), step (substream of the draws, in [0, 2^24);
        checked on the CPU, wrapped on CUDA and under torch.compile),
        num_transfer: int or [B] int64.
        Returns sampled [B, W] int64, confidence [B, W] float32, keep [B, W] bool and status [B]
        int32, freshly allocated on ``logits.device``.

    Example:
        >>> import torch, specdec_cuda.ops as ops
        >>> logits = torch.tensor([[[0.0, 4.0, 0.0], [0.0, 0.0, 1.0], [9.0, 0.0, 0.0]]])
        >>> out = ops.diffusion_unmask(logits, torch.tensor([[3, 3, 1]]), mask_id=3, num_transfer=1)
        >>> out.sampled.tolist(), out.keep.tolist()
        ([[1, 2, -1]], [[True, False, False]])
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ValueError(f"logits must be a tensor of shape [batch, width, vocab], got "
                         f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
    if logits.shape[2] == 0:
        raise ValueError("logits has an empty vocab dimension")
    if logits.stride(2) != 1:
        logits = logits.contiguous()
    batch, width, _ = logits.shape
    device = logits.device
    if not isinstance(tokens, torch.Tensor) or tokens.shape != (batch, width):
        raise ValueError(f"tokens must have shape [{batch}, {width}] (logits' first two dimensions), "
                         f"got {tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else tokens!r}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must hold integers, got {tokens.dtype}")
    tokens = tokens.to(device=device, dtype=torch.int64).contiguous()
    step = args.per_row(step, "step", batch, torch.int64, device)
    if device.type == "cuda" or torch.compiler.is_compiling():
        step = step & (2**24 - 1)  # no host sync (nor graph break): out-of-range substreams wrap
    elif batch and not bool(((step >= 0) & (step < 2**24)).all()):
        raise ValueError(f"step must be in [0, 2^24), got {step.tolist()}")
    sampled = torch.empty(batch, width, dtype=torch.int64, device=device)
    confidence = torch.empty(batch, width, dtype=torch.float32, device=device)
    keep = torch.empty(batch, width, dtype=torch.bool, device=device)
    status = torch.empty(batch, dtype=torch.int32, device=device)
    torch.ops.specdec.diffusion_unmask(
        logits, tokens, int(mask_id),
        args.per_row(temperature, "temperature", batch, torch.float32, device),
        args.per_row(top_k, "top_k", batch, torch.int32, device),
        args.per_row(top_p, "top_p", batch, torch.float32, device),
        args.per_row(seed, "seed", batch, torch.int64, device),
        args.per_row(position, "position", batch, torch.int64, device),
        step,
        args.per_row(num_transfer, "num_transfer", batch, torch.int64, device),
        args.per_row(threshold, "threshold", batch, torch.float32, device),
        sampled, confidence, keep, status,
    )
    return UnmaskResult(sampled, confidence, keep, status)


# Fake kernel: the op only writes its preallocated outputs, so tracing needs no shape logic.
@torch.library.register_fake("specdec::diffusion_unmask")
def _diffusion_unmask_fake(logits, tokens, mask_id, temperature, top_k, top_p, seed, position,
                           step, num_transfer, threshold, sampled, confidence, keep, status):
    return None
