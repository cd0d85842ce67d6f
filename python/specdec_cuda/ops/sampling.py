"""Sampling and chain verification: ``sample`` and ``verify_chain``.

Both ops apply temperature, top-k and top-p inside the kernels (no probability tensor is written)
and draw every random number from counter-based Philox streams keyed by (seed, absolute position,
purpose), so a row's result depends neither on its batch neighbours nor on its place in the batch,
and CPU and CUDA agree. The executable specification is :mod:`specdec_cuda.reference.sampling`.

Per-row status codes (``status`` outputs; a flagged row emits only -1 and accepts nothing) are the
project's one table, :mod:`specdec_cuda.ops.status`: ``STATUS_NONFINITE_LOGITS`` (1),
``STATUS_DRAFT_OUT_OF_RANGE`` (2: a draft outside ``[0, vocab)``, or on CUDA, where they are not
checked on the host, ``cu_num_draft`` entries that are decreasing, outside ``draft_tokens`` or
longer than ``max_draft``) and ``STATUS_BAD_PARAMS`` (3).

Use :func:`raise_on_status` to turn flagged rows into an exception.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from ..reference.philox import Purpose
from . import args
from .status import (
    STATUS_BAD_PARAMS,
    STATUS_DRAFT_OUT_OF_RANGE,
    STATUS_MESSAGES,
    STATUS_NONFINITE_LOGITS,
    STATUS_OK,
    raise_for,
)

__all__ = [
    "Purpose",
    "SampleResult",
    "VerifyResult",
    "STATUS_OK",
    "STATUS_NONFINITE_LOGITS",
    "STATUS_DRAFT_OUT_OF_RANGE",
    "STATUS_BAD_PARAMS",
    "STATUS_MESSAGES",
    "raise_on_status",
    "sample",
    "verify_chain",
]

_STRATEGIES = {"auto": 0, "parallel": 1, "serial": 2}
_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

Scalar = Union[float, int, torch.Tensor]


class SampleResult(NamedTuple):
    tokens: torch.Tensor  # [N] int64, -1 where flagged
    status: torch.Tensor  # [N] int32


class VerifyResult(NamedTuple):
    tokens: torch.Tensor  # [B, max_k + 1] int64, -1 padded
    num_accepted: torch.Tensor  # [B] int64
    accepted: torch.Tensor  # [B, max_k] int8: 1 accepted, 0 rejected, -1 not reached
    status: torch.Tensor  # [B] int32


def raise_on_status(status: torch.Tensor, what: str = "sampling") -> None:
    """Raise ``ValueError`` naming every flagged row and why (synchronises with the device).

    Shape: status [N] int32, as returned by :func:`sample` or :func:`verify_chain`.
    Same as :func:`specdec_cuda.ops.status.raise_for`.
    """
    raise_for(status, what)


def _check_logits(logits: torch.Tensor, name: str) -> torch.Tensor:
    args.tensor(logits, name)
    if logits.dim() != 2:
        raise ValueError(f"{name} must have shape [rows, vocab], got {tuple(logits.shape)}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {logits.dtype}")
    if logits.shape[1] == 0:
        raise ValueError(f"{name} has an empty vocab dimension")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    return logits


def sample(
    logits: torch.Tensor,
    temperature: Scalar = 1.0,
    top_k: Scalar = 0,
    top_p: Scalar = 1.0,
    seed: Scalar = 0,
    position: Scalar = 0,
    *,
    purpose: int = Purpose.SAMPLE,
    substream: int = 0,
) -> SampleResult:
    """Draw one token per logit row with temperature / top-k / top-p.

    Temperature 0 is greedy (``argmax``, ties to the lowest index). Otherwise the token is drawn
    from ``softmax(logits / temperature)`` restricted by top-k (ties at the k-th value kept; <= 0
    or >= vocab: off) and top-p (the smallest set of largest logits whose mass reaches top_p; 1:
    off) with the Gumbel race on the Philox stream (seed, position, purpose, substream).

    Shape:
        logits: [N, V] float32 / float16 / bfloat16 (read only).
        temperature, top_p: float or [N] float32. top_k: int or [N] int32. seed, position: int or
        [N] int64. Scalars are broadcast to every row.
        Returns tokens [N] int64 (-1 on flagged rows) and status [N] int32 (see module docstring),
        both freshly allocated on ``logits.device``.

    Example:
        >>> import torch, specdec_cuda.ops as ops
        >>> logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
        >>> ops.sample(logits, temperature=0.0).tokens.tolist()
        [1, 0]
        >>> ops.sample(logits, temperature=0.7, seed=1234, position=17).tokens.shape
        torch.Size([2])
    """
    logits = _check_logits(logits, "logits")
    rows, device = logits.shape[0], logits.device
    purpose = int(purpose)
    if not 0 <= purpose < 256:
        raise ValueError(f"purpose must be in [0, 256), got {purpose}")
    if not 0 <= int(substream) < 2**24:
        raise ValueError(f"substream must be in [0, 2^24), got {substream}")
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    status = torch.empty(rows, dtype=torch.int32, device=device)
    torch.ops.specdec.sample(
        logits,
        args.per_row(temperature, "temperature", rows, torch.float32, device),
        args.per_row(top_k, "top_k", rows, torch.int32, device),
        args.per_row(top_p, "top_p", rows, torch.float32, device),
        args.per_row(seed, "seed", rows, torch.int64, device),
        args.per_row(position, "position", rows, torch.int64, device),
        purpose,
        int(substream),
        tokens,
        status,
    )
    return SampleResult(tokens, status)


def verify_chain(
    draft_tokens: torch.Tensor,
    cu_num_draft: torch.Tensor,
    target_logits: torch.Tensor,
    draft_logits: Optional[torch.Tensor] = None,
    temperature: Scalar = 0.0,
    top_k: Scalar = 0,
    top_p: Scalar = 1.0,
    seed: Scalar = 0,
    position: Scalar = 0,
    *,
    typical: bool = False,
    typical_epsilon: float = 0.3,
    typical_alpha: float = 0.09,
    strategy: str = "auto",
    max_draft: Optional[int] = None,
) -> VerifyResult:
    """Verify a ragged batch of draft chains in one call.

    Row i proposes ``k_i = cu_num_draft[i + 1] - cu_num_draft[i]`` drafts
    ``draft_tokens[cu[i]:cu[i + 1]]``; its target logits are rows ``cu[i] + i .. cu[i + 1] + i`` of
    ``target_logits`` (one per draft position, then the bonus position). Per row:

    * temperature 0: greedy, accept while the draft equals the target argmax, then emit the argmax;
    * temperature > 0 with ``draft_logits``: rejection sampling (lossless), accept x when
      ``u * q(x) < p(x)``; at the first rejection sample ``max(0, p - q)`` renormalised (``p`` when
      that is zero everywhere); when every draft is accepted sample the bonus token from ``p``;
    * temperature > 0 without ``draft_logits``: sample-and-match (lossless for one-hot drafts such
      as n-gram guesses): sample y from ``p``, accept while y equals the draft;
    * ``typical=True`` (any temperature > 0 row): Medusa's typical acceptance, LOSSY, accept when
      ``p(x) > min(typical_epsilon, typical_alpha * exp(-H(p)))``, else sample from ``p``.

    One call mixes greedy rows with sampled rows of one kind (with draft logits: rejection
    sampling; without: sample-and-match; typical when ``typical``). To put a one-hot draft (e.g. an
    n-gram guess) into a batch with draft logits, give it a draft row of -inf except 0 at the
    guessed token: rejection sampling against a one-hot q is exact too.

    ``p`` and ``q`` are softmax(logits / temperature) after top-k / top-p, as in :func:`sample`.
    Draws use Philox streams keyed by (seed, position + j, purpose).

    Shape:
        draft_tokens: [N] int64, N = sum k_i. cu_num_draft: [B + 1] int64, cu[0] = 0.
        target_logits: [N + B, V] float32 / float16 / bfloat16. draft_logits: [N, V] (same dtype)
        or None. temperature, top_p: float or [B] float32; top_k: int or [B] int32; seed,
        position (absolute position of each row's first draft): int or [B] int64.
        Returns, freshly allocated on the logits' device: tokens [B, max_k + 1] int64 (emitted
        tokens, then -1), num_accepted [B] int64, accepted [B, max_k] int8 (1 accepted, 0
        rejected, -1 not reached), status [B] int32 (see the module docstring).

    ``max_k`` is ``max_draft`` when given (no host synchronisation: pass it when cu_num_draft is on
    the GPU), else ``max(k_i)`` read from cu_num_draft. ``strategy``: "parallel" evaluates every
    position at once; "serial" walks each row and never reads logits past its first rejection;
    "auto" picks by device and shape (CPU: serial unless every position fits in one wave of
    threads; CUDA: parallel unless the batch alone gives two blocks per SM). Results, statuses
    included, do not depend on the strategy. float64 logits are accepted on the CPU only.

    Example:
        >>> import torch, specdec_cuda.ops as ops
        >>> target = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]])
        >>> out = ops.verify_chain(torch.tensor([1, 0]), torch.tensor([0, 2]), target)
        >>> out.tokens.tolist(), out.num_accepted.tolist(), out.accepted.tolist()
        ([[1, 2, -1]], [1], [[1, 0]])
    """
    target_logits = _check_logits(target_logits, "target_logits")
    device = target_logits.device
    for name, t in (("draft_tokens", draft_tokens), ("cu_num_draft", cu_num_draft)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got {t.dtype}")
    if cu_num_draft.numel() < 1:
        raise ValueError("cu_num_draft must have shape [B + 1] with B >= 0")
    batch, num_drafts = cu_num_draft.numel() - 1, draft_tokens.numel()
    if target_logits.shape[0] != num_drafts + batch:
        raise ValueError(
            f"target_logits must have N + B = {num_drafts} + {batch} rows (one per draft plus one "
            f"bonus row per request), got {tuple(target_logits.shape)}")
    if draft_logits is not None:
        draft_logits = _check_logits(draft_logits, "draft_logits")
        if draft_logits.shape != (num_drafts, target_logits.shape[1]):
            raise ValueError(f"draft_logits must have shape [{num_drafts}, {target_logits.shape[1]}],"
                             f" got {tuple(draft_logits.shape)}")
        if draft_logits.dtype != target_logits.dtype:
            raise TypeError(f"draft_logits must have dtype {target_logits.dtype} like target_logits, "
                            f"got {draft_logits.dtype}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be one of {sorted(_STRATEGIES)}, got {strategy!r}")
    draft_tokens = draft_tokens.to(device=device, dtype=torch.int64).contiguous()
    cu_num_draft = cu_num_draft.to(device=device, dtype=torch.int64).contiguous()
    if max_draft is None:
        # cu_num_draft is read anyway to size the outputs: check its layout here, naming it, before a
        # negative or huge entry could size an allocation (the kernels flag rows on their own too)
        cu = cu_num_draft.tolist()
        bad = next((i for i in range(batch + 1) if not 0 <= cu[i] <= num_drafts), None)
        if bad is not None:
            raise ValueError(f"cu_num_draft[{bad}] = {cu[bad]} is outside [0, {num_drafts}] "
                             f"(the number of draft tokens)")
        if cu[0] != 0 or cu[-1] != num_drafts or any(cu[i + 1] < cu[i] for i in range(batch)):
            raise ValueError(f"cu_num_draft must start at 0, never decrease and end at the number of "
                             f"draft tokens {num_drafts}; got {cu[:16]}")
        max_draft = max((cu[i + 1] - cu[i] for i in range(batch)), default=0)
    if isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 0:
        raise ValueError(f"max_draft must be an int >= 0, got {max_draft!r}")
    tokens = torch.empty(batch, max_draft + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    accepted = torch.empty(batch, max_draft, dtype=torch.int8, device=device)
    status = torch.empty(batch, dtype=torch.int32, device=device)
    torch.ops.specdec.verify_chain(
        draft_tokens,
        cu_num_draft,
        target_logits,
        draft_logits,
        args.per_row(temperature, "temperature", batch, torch.float32, device),
        args.per_row(top_k, "top_k", batch, torch.int32, device),
        args.per_row(top_p, "top_p", batch, torch.float32, device),
        args.per_row(seed, "seed", batch, torch.int64, device),
        args.per_row(position, "position", batch, torch.int64, device),
        bool(typical),
        float(typical_epsilon),
        float(typical_alpha),
        _STRATEGIES[strategy],
        tokens,
        num_accepted,
        accepted,
        status,
    )
    return VerifyResult(tokens, num_accepted, accepted, status)


# Fake kernels: the ops only write their preallocated outputs, so tracing needs no shape logic.
@torch.library.register_fake("specdec::sample")
def _sample_fake(logits, temperature, top_k, top_p, seed, position, purpose, substream, tokens,
                 status):
    return None


@torch.library.register_fake("specdec::verify_chain")
def _verify_chain_fake(draft_tokens, cu_num_draft, target_logits, draft_logits, temperature, top_k,
                       top_p, seed, position, typical, typical_epsilon, typical_alpha, strategy,
                       tokens, num_accepted, accepted, status):
    return None
