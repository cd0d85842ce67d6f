"""The model protocol: the few things every decoding method needs from a causal LM.

Both the built-in Llama/Qwen model and the Hugging Face adapter implement it; proposers and the
speculative loop use nothing else.

Cache slots and commits
-----------------------
A cache holds, per row ``b``, ``lengths[b]`` committed tokens in slots ``0 .. lengths[b] - 1``.
``forward`` over ``n`` new tokens writes their K/V to the *pending* slots
``lengths[b] .. lengths[b] + n - 1`` (slot = committed length + index of the new token, whatever
its position) and does not move ``lengths``. The caller then commits per row:

* ``commit(num_kept)``: chains and prefill; keeps the first ``num_kept[b]`` pending tokens.
* ``commit(num_kept, kept_indices)``: trees; moves the pending tokens ``kept_indices[b, :num_kept[b]]``
  (indices into the ``n`` new tokens, increasing) to contiguous slots right after the committed
  prefix, then keeps them.

``truncate(lengths)`` rolls rows back to shorter committed lengths. None of these synchronise
with the host per row: they are batched tensor operations. The built-in model's ``forward``
makes no host sync at all (the HF adapter's depends on ``transformers``); ``commit`` and
``truncate`` make one small device-to-host copy per call (it validates the arguments and keeps a
host copy of ``max(lengths)``, which bounds the slots a forward reads). A forward that is not
committed is discarded by the next forward. Commits and truncates past what is pending or
committed raise ValueError, as does a forward that would overflow ``max_length``.

Padding: rows may carry fewer real new tokens than ``n`` (ragged drafts, prompts of different
lengths). Pad the tail of ``tokens`` with any valid id; pads come after the real tokens, so no real
token attends to them, and they are never committed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch

from ..ops.args import index_tensor


def logits_rows(x: torch.Tensor, logits_at: torch.Tensor | None) -> torch.Tensor:
    """x [B, n, H] -> the rows the LM head runs on: all, or [B, 1, H] at ``logits_at`` [B]."""
    if logits_at is None:
        return x
    return x[torch.arange(x.shape[0], device=x.device), logits_at.to(x.device)][:, None]


@dataclass
class ModelOutput:
    """What ``forward`` returns.

    Shape: logits [B, n, V]; hidden_states maps each requested layer index to [B, n, H]
    (layer index ``i`` = output of decoder layer ``i``; ``-1`` = the final normed hidden state).
    """

    logits: torch.Tensor
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)


@runtime_checkable
class KVCache(Protocol):
    lengths: torch.Tensor  # [B] int64, committed tokens per row, on the model's device

    def commit(self, num_kept: torch.Tensor, kept_indices: torch.Tensor | None = None) -> None:
        """Keep pending tokens. num_kept [B] int64; kept_indices [B, m] int64 (-1 padded) or None."""

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll rows back to ``lengths`` [B] int64 (each <= the current length)."""


@runtime_checkable
class CausalLM(Protocol):
    vocab_size: int
    num_layers: int
    hidden_size: int
    device: torch.device
    dtype: torch.dtype

    def new_cache(self, batch_size: int, max_length: int) -> KVCache:
        """An empty cache for ``batch_size`` rows of up to ``max_length`` tokens (pending included)."""

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Run ``tokens`` [B, n] at absolute ``positions`` [B, n] (RoPE) on top of ``cache``.

        ``tree_mask`` [B, n, n] bool: entry (i, j) says new token i may attend to new token j; the
        committed prefix is always visible, and so is the token itself (whatever the diagonal
        says). None means causal among the new tokens.

        ``logits_at`` [B] int64: when given, only new token ``logits_at[b]`` of each row gets
        logits (``logits`` is then [B, 1, V]): a prefill needs the last prompt token's only, and
        the LM head over every prompt token is a large share of its cost. Hidden states are
        returned for every new token either way.

        Both implementations also expose ``eos_token_ids`` (a tuple, from the checkpoint's config
        and generation config); it is not part of this protocol.
        """


def prefill_kwargs(model) -> dict:
    """The extra ``forward`` argument that marks a forward as a prompt's prefill, for models whose
    ``forward`` has a ``prefill`` parameter (``{"prefill": True}``: the built-in model, which may
    then run kernels of another numeric contract, e.g. a GGUF model's bfloat16 AMX tiles), else
    ``{}`` (a wrapper that forwards only the protocol's arguments gets none). Only for tokens that
    every decoding method feeds the same way (the prompt; a drafter's own catch-up): a verification
    must run the decoding kernels so that its rows keep a one-row forward's bits."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin, a C extension)
        return {}
    return {"prefill": True} if "prefill" in params else {}


def batch_invariant(model) -> bool:
    """Whether ``model``'s forward gives every row the bits a one-row forward of the same tokens
    would: then a verification forward scores each draft exactly as autoregressive decoding would,
    and greedy speculative output equals greedy autoregressive output token for token, near-ties
    included. A model says so with a ``batch_invariant`` attribute (the built-in model on its packed
    CPU path or GGUF blocks); without one it is taken not to be (BLAS and attention kernels
    choose their blocking by shape, so the same row rounds differently in a wider forward)."""
    return bool(getattr(model, "batch_invariant", False))


def check_forward_args(tokens, positions, cache, tree_mask, hidden_layers, num_layers: int,
                       logits_at=None) -> tuple[int, int]:
    """The argument checks of ``CausalLM.forward`` that every model shares; returns (B, n).

    Shape: tokens [B, n]; positions [B, n]; tree_mask [B, n, n] or None; ``cache`` made for B rows;
    each of ``hidden_layers`` in [-1, num_layers); logits_at [B] integer or None (its values are
    checked by the indexing that reads them, without a host sync here).
    """
    B, n = tokens.shape
    if positions.shape != (B, n):
        raise ValueError(f"positions must have the shape of tokens {(B, n)}, got {tuple(positions.shape)}")
    if cache.batch_size != B:
        raise ValueError(f"tokens has {B} rows but the cache was made for {cache.batch_size}")
    if tree_mask is not None and tree_mask.shape != (B, n, n):
        raise ValueError(f"tree_mask must have shape {(B, n, n)}, got {tuple(tree_mask.shape)}")
    if logits_at is not None and (logits_at.shape != (B,) or logits_at.dtype.is_floating_point
                                  or logits_at.dtype == torch.bool):
        raise ValueError(f"logits_at must be an integer tensor of shape ({B},), got {logits_at.dtype} "
                         f"{tuple(logits_at.shape)}")
    for i in hidden_layers:
        if not -1 <= i < num_layers:
            raise ValueError(f"hidden_layers: {i} is not a layer index in [-1, {num_layers - 1}]")
    return B, n


def check_commit_args(
    num_kept, kept_indices, batch_size: int, num_pending: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The argument checks of ``KVCache.commit`` that every cache shares.

    Shape checks raise at once; the value check is returned as a 0-dim int64 tensor (nonzero when
    a kept index, ``j < num_kept[b]``, lies outside the ``num_pending`` pending tokens) so the
    caller reads it with its one host sync. Returns num_kept [B] int64, kept_indices [B, m] int64
    (or None) and that flag (None without kept_indices).
    """
    num_kept = index_tensor(num_kept, "num_kept", device, dtypes=None)
    if num_kept.shape != (batch_size,):
        raise ValueError(f"num_kept must have shape [{batch_size}], got {tuple(num_kept.shape)}")
    if kept_indices is None:
        return num_kept, None, None
    kept_indices = index_tensor(kept_indices, "kept_indices", device, dtypes=None)
    if kept_indices.dim() != 2 or kept_indices.shape[0] != batch_size:
        raise ValueError(f"kept_indices must have shape [{batch_size}, m], got {tuple(kept_indices.shape)}")
    if kept_indices.shape[1] > num_pending:
        raise ValueError(
            f"kept_indices has {kept_indices.shape[1]} columns but only {num_pending} tokens are pending"
        )
    col = torch.arange(kept_indices.shape[1], device=device)
    kept = col < num_kept[:, None]  # padding beyond num_kept[b] is ignored
    bad_index = (kept & ((kept_indices < 0) | (kept_indices >= num_pending))).any().to(torch.int64)
    return num_kept, kept_indices, bad_index
