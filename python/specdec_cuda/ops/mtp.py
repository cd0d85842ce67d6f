"""The fused MTP-head ops: the output side and the input side of Medusa / MTP heads.

* ``mtp_head_topk(x, norm_weight, lm_head, k, eps)``: per row, the final RMSNorm, the LM-head
  matmul and the top-k candidates (ties to the lower token id, so rank 0 is the argmax) in one
  pass over ``lm_head``, without writing the ``[M, V]`` logits; ``return_logits=True`` also
  returns them (rejection sampling needs q).
* ``mtp_head_topk_w4(x, norm_weight, lm_head_w4, k, eps)``: the same over a 4-bit LM head
  (``ops.quant.quantize_w4(lm_head, device="cpu")``, LAYOUT_CPU; CPU only), for heads whose LM
  head read dominates: a quarter of the bytes of bfloat16.
* ``mtp_head_topk_packed(x, norm_weight, lm_head_packed, k, eps)``: the same over an LM head packed
  for the CPU decoding path (``ops.pack_weight``: column panels, bfloat16 when the weight's values
  are bfloat16 numbers; float32 activations), the layout the built-in model's own LM head uses there.
* ``mtp_input(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, eps)``: the DeepSeek-V3 MTP
  module input ``eh_proj[:, :H] · enorm(embed[tokens]) + eh_proj[:, H:] · hnorm(h)``, the
  concatenation never built.

Specification: ``specdec_cuda.reference.mtp``. Values, logits and ``mtp_input``'s result are
float32 (float64 for float64 inputs); weights may be float32 / float64 / float16 / bfloat16.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _native  # noqa: F401  (loads the library that defines torch.ops.specdec.*)
from .status import raise_for

__all__ = ["HeadTopK", "mtp_head_topk", "mtp_head_topk_packed", "mtp_head_topk_w4", "mtp_input", "MAX_K"]

MAX_K = 64


class HeadTopK(NamedTuple):
    """``values`` [M, k] and ``indices`` [M, k] int64 (descending); ``logits`` [M, V] or None;
    ``lse`` [M] (each row's log-sum-exp over the vocabulary) or None."""

    values: torch.Tensor
    indices: torch.Tensor
    logits: torch.Tensor | None
    lse: torch.Tensor | None = None


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def mtp_head_topk(x: torch.Tensor, norm_weight: torch.Tensor, lm_head: torch.Tensor, k: int, eps: float,
                  return_logits: bool = False) -> HeadTopK:
    """Top-``k`` tokens of ``lm_head(rms_norm(x) * norm_weight)`` per row of ``x``.

    Shape:
        x: [M, H] float32 / float64 / float16 / bfloat16 (a head's output hidden states).
        norm_weight: [H], lm_head: [V, H], x's dtype and device.
        Returns values [M, k] float32 (float64 for float64 x), indices [M, k] int64 and, with
        ``return_logits``, logits [M, V] of the values' dtype; all freshly allocated.

    Raises RuntimeError naming the row when a logit is NaN or infinite.

    Example:
        >>> import torch, specdec_cuda.ops.mtp as mtp
        >>> x, w = torch.randn(2, 8), torch.ones(8)
        >>> head = torch.randn(11, 8)
        >>> mtp.mtp_head_topk(x, w, head, k=3, eps=1e-6).indices.shape
        torch.Size([2, 3])
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [M, H], got shape {tuple(x.shape)}")
    M, V = x.shape[0], lm_head.shape[0] if lm_head.dim() == 2 else -1
    if not 1 <= k <= min(MAX_K, V):
        raise ValueError(f"k must lie in [1, min({MAX_K}, V={V})], got {k}")
    x = x.contiguous()  # activation rows are small; the weights must already be contiguous
    acc = _acc(x.dtype)
    values = torch.empty(M, k, dtype=acc, device=x.device)
    indices = torch.empty(M, k, dtype=torch.int64, device=x.device)
    logits = torch.empty(M, V, dtype=acc, device=x.device) if return_logits else None
    status = torch.empty(M, dtype=torch.int32, device=x.device)
    torch.ops.specdec.mtp_head_topk(x, norm_weight, lm_head, float(eps), values, indices, logits, status)
    if not torch.compiler.is_compiling():
        raise_for(status.tolist(), "mtp_head_topk", exc=RuntimeError)
    return HeadTopK(values, indices, logits)


def mtp_head_topk_w4(x: torch.Tensor, norm_weight: torch.Tensor, lm_head, k: int, eps: float,
                     return_logits: bool = False) -> HeadTopK:
    """``mtp_head_topk`` with the LM head as 4-bit weights (a ``PackedW4`` in LAYOUT_CPU).

    Shape:
        x: [M, H] float32 / float16 / bfloat16; norm_weight: [H] of x's dtype.
        lm_head: ``PackedW4`` of a [V, H] weight, packed for the CPU (``quantize_w4(w, device="cpu")``).
        Returns values [M, k] float32, indices [M, k] int64, logits [M, V] float32 or None.

    Example:
        >>> import torch, specdec_cuda.ops as ops
        >>> q = ops.quantize_w4(torch.randn(100, 64), group_size=32, device="cpu")
        >>> ops.mtp.mtp_head_topk_w4(torch.randn(2, 64), torch.ones(64), q, k=4, eps=1e-6).indices.shape
        torch.Size([2, 4])
    """
    def call(x, values, indices, logits, status):
        torch.ops.specdec.mtp_head_topk_w4(x, norm_weight, lm_head.packed, lm_head.scales, lm_head.group_size,
                                           lm_head.out_features, float(eps), values, indices, logits, status)

    return _float_head_topk("mtp_head_topk_w4", call, x, lm_head.in_features, lm_head.out_features, k, return_logits)


def mtp_head_topk_packed(x: torch.Tensor, norm_weight: torch.Tensor, lm_head, k: int, eps: float,
                         return_logits: bool = False, out: HeadTopK | None = None,
                         return_lse: bool = False) -> HeadTopK:
    """``mtp_head_topk`` with the LM head packed in column panels (a ``PackedWeight`` from
    ``ops.pack_weight``): the CPU decoding path's layout, bfloat16 panels for a bf16 checkpoint's
    weights (half the bytes of its float32 copy, the same values). CPU only.

    ``return_lse``: also each row's log-sum-exp over the vocabulary, taken range by range while the
    logits are in cache, so that ``values - lse[:, None]`` are the top-k log-probabilities without a
    log-softmax over [M, V] (DDTree's tree build).

    Shape:
        x: [M, H] float32; norm_weight: [H] float32; lm_head: ``PackedWeight`` of a [V, H] weight.
        Returns values [M, k] float32, indices [M, k] int64, logits [M, V] float32 or None, lse [M]
        float32 or None.
        ``out``: those tensors to write instead of new ones (a caller drafting every step keeps
        them; ``logits`` None unless ``return_logits``, ``lse`` None unless ``return_lse``).

    Example:
        >>> import torch, specdec_cuda.ops as ops
        >>> packed = ops.pack_weight(torch.randn(100, 64).bfloat16().float())
        >>> ops.mtp.mtp_head_topk_packed(torch.randn(2, 64), torch.ones(64), packed, k=4, eps=1e-6).indices.shape
        torch.Size([2, 4])
    """
    def call(x, values, indices, logits, status, lse=None):
        torch.ops.specdec.mtp_head_topk_packed(x, norm_weight, lm_head.panels, lm_head.out_features, float(eps),
                                               values, indices, logits, status, lse)

    return _float_head_topk("mtp_head_topk_packed", call, x, lm_head.in_features, lm_head.out_features, k,
                            return_logits, out, return_lse)


def _float_head_topk(name: str, call, x: torch.Tensor, H: int, V: int, k: int, return_logits: bool,
                     out: HeadTopK | None = None, return_lse: bool = False) -> HeadTopK:
    """The float32-output head ops' argument checks, output tensors (``out``'s when given; the op
    checks their shapes) and status check around ``call`` (given ``lse`` only with ``return_lse``)."""
    if x.dim() != 2:
        raise ValueError(f"x must be [M, H], got shape {tuple(x.shape)}")
    if H != x.shape[1]:
        raise ValueError(f"the LM head takes {H} features but x has {x.shape[1]}")
    if not 1 <= k <= min(MAX_K, V):
        raise ValueError(f"k must lie in [1, min({MAX_K}, V={V})], got {k}")
    x = x.contiguous()
    M = x.shape[0]
    if out is not None:
        if (out.logits is not None) != return_logits:
            raise ValueError("out.logits must be given exactly when return_logits is")
        if (out.lse is not None) != return_lse:
            raise ValueError("out.lse must be given exactly when return_lse is")
        values, indices, logits, lse = out
    else:
        values = torch.empty(M, k, dtype=torch.float32, device=x.device)
        indices = torch.empty(M, k, dtype=torch.int64, device=x.device)
        logits = torch.empty(M, V, dtype=torch.float32, device=x.device) if return_logits else None
        lse = torch.empty(M, dtype=torch.float32, device=x.device) if return_lse else None
    status = torch.empty(M, dtype=torch.int32, device=x.device)
    if return_lse:
        call(x, values, indices, logits, status, lse)
    else:
        call(x, values, indices, logits, status)
    if not torch.compiler.is_compiling():
        raise_for(status.tolist(), name, exc=RuntimeError)
    return HeadTopK(values, indices, logits, lse)


def mtp_input(h: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor, enorm_weight: torch.Tensor,
              hnorm_weight: torch.Tensor, eh_proj: torch.Tensor, eps: float) -> torch.Tensor:
    """The MTP module input ``eh_proj · [enorm(embed[tokens]); hnorm(h)]`` without the concatenation.

    Shape:
        h: [M, H] float32 / float64 / float16 / bfloat16 (the previous depth's hidden states).
        tokens: [M] int64, each in [0, V). embed: [V, H]; enorm_weight, hnorm_weight: [H];
        eh_proj: [H, 2H] (columns ``:H`` act on the embedding); all of h's dtype and device.
        Returns [M, H] float32 (float64 for float64 h), freshly allocated.

    Raises RuntimeError naming the row whose token id lies outside the vocabulary.

    Example:
        >>> import torch, specdec_cuda.ops.mtp as mtp
        >>> H = 8
        >>> out = mtp.mtp_input(torch.randn(3, H), torch.tensor([0, 4, 2]), torch.randn(5, H),
        ...                     torch.ones(H), torch.ones(H), torch.randn(H, 2 * H), 1e-6)
        >>> out.shape
        torch.Size([3, 8])
    """
    if h.dim() != 2:
        raise ValueError(f"h must be [M, H], got shape {tuple(h.shape)}")
    M, H = h.shape
    h, tokens = h.contiguous(), tokens.contiguous()
    out = torch.empty(M, H, dtype=_acc(h.dtype), device=h.device)
    status = torch.empty(M, dtype=torch.int32, device=h.device)
    torch.ops.specdec.mtp_input(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, float(eps), out, status)
    if h.device.type != "cpu" and not torch.compiler.is_compiling():  # the CPU glue raises itself
        raise_for(status.tolist(), "mtp_input", exc=RuntimeError)
    return out


@torch.library.register_fake("specdec::mtp_head_topk")
def _mtp_head_topk_fake(x, norm_weight, lm_head, eps, values, indices, logits, status):
    return None


@torch.library.register_fake("specdec::mtp_head_topk_w4")
def _mtp_head_topk_w4_fake(x, norm_weight, packed, scales, group_size, vocab_size, eps, values, indices, logits,
                           status):
    return None


@torch.library.register_fake("specdec::mtp_head_topk_packed")
def _mtp_head_topk_packed_fake(x, norm_weight, panels, vocab_size, eps, values, indices, logits, status, lse=None):
    return None


@torch.library.register_fake("specdec::mtp_input")
def _mtp_input_fake(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, eps, out, status):
    return None
