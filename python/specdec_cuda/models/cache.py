"""A static KV cache with one committed length per row, for the built-in model.

Layout: one tensor ``kv`` [L, 2, B, H_kv, T_max, D]; ``keys[l]`` and ``values[l]`` are its
contiguous [B, H_kv, T_max, D] views, which tree compaction hands to the `compact_kv` kernel
all at once. Row ``b`` holds its committed tokens in slots ``0 .. lengths[b] - 1``; a
forward over ``n`` new tokens writes them to the pending slots ``lengths[b] .. lengths[b] + n - 1``
and ``commit`` keeps some of them (see ``protocol.py``). Slots past a row's length hold stale
values that the attention mask hides; the cache starts zeroed so they are always finite.

Host view: ``max_length_committed`` is ``max(lengths)`` as a Python int. It bounds the slots a
forward reads (attention over ``max_length_committed + n`` slots, not ``T_max``) and lets forward
check the capacity without a device sync. ``commit`` and ``truncate`` refresh it with one small
device-to-host copy per call (never one per row), which also validates their arguments.
"""

from __future__ import annotations

import torch

from ..ops.args import index_tensor
from ..ops.tree import compact_kv
from .protocol import check_commit_args


class StaticKVCache:
    """Per-layer K/V [B, H_kv, T_max, D] plus ``lengths`` [B] int64 (see the module docstring).

    Example::

        cache = model.new_cache(batch_size=2, max_length=64)
        out = model.forward(prompt_tokens, positions, cache)    # writes pending slots
        cache.commit(torch.tensor([5, 3]))                      # rows keep 5 and 3 tokens
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size ({batch_size}) and max_length ({max_length}) must be positive")
        self.kv = torch.zeros(
            num_layers, 2, batch_size, num_kv_heads, max_length, head_dim, dtype=dtype, device=device
        )
        self.keys = [self.kv[i, 0] for i in range(num_layers)]
        self.values = [self.kv[i, 1] for i in range(num_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.batch_size = batch_size
        self.max_length = max_length
        self.max_length_committed = 0  # host copy of lengths.max()
        self.num_pending = 0  # new tokens written by the last forward and not yet committed

    @property
    def device(self) -> torch.device:
        return self.kv.device

    # -- used by the model's forward ------------------------------------------------------------

    def begin_forward(self, n: int) -> int:
        """Check room for ``n`` new tokens per row; return the number of slots to attend over."""
        span = self.max_length_committed + n
        if span > self.max_length:
            raise ValueError(
                f"KV cache overflow: a row holds {self.max_length_committed} committed tokens and the "
                f"forward adds {n}, but the cache was made with max_length={self.max_length}"
            )
        self.num_pending = n
        return span

    # -- the protocol ---------------------------------------------------------------------------

    def commit(self, num_kept: torch.Tensor, kept_indices: torch.Tensor | None = None) -> None:
        """Keep pending tokens: the first ``num_kept[b]`` of them, or ``kept_indices[b, :num_kept[b]]``.

        Shape: num_kept [B] int64; kept_indices [B, m] int64 (indices into the last forward's
        ``n`` new tokens, -1 padded, m <= n) or None.
        """
        num_kept, kept_indices, bad_index = check_commit_args(
            num_kept, kept_indices, self.batch_size, self.num_pending, self.device)
        new_lengths = self.lengths + num_kept
        # The one host sync of this call: [new lengths | num_kept | bad-index flag] in one copy.
        parts = [new_lengths, num_kept] if bad_index is None else [new_lengths, num_kept, bad_index[None]]
        host = torch.cat(parts).tolist()
        B = self.batch_size
        new_max, lo, hi = max(host[:B]), min(host[B : 2 * B]), max(host[B : 2 * B])
        if lo < 0 or hi > self.num_pending:
            raise ValueError(
                f"num_kept must lie in [0, {self.num_pending}] (tokens pending), got values in [{lo}, {hi}]"
            )
        if bad_index is not None and host[-1]:
            raise ValueError(f"kept_indices must index the {self.num_pending} pending tokens (0 .. n-1)")
        if kept_indices is not None and kept_indices.numel():
            self._compact(kept_indices, num_kept)
        self.lengths.copy_(new_lengths)
        self.max_length_committed = int(new_max)
        self.num_pending = 0

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll rows back to ``lengths`` [B] int64 (each between 0 and the row's current length)."""
        lengths = index_tensor(lengths, "lengths", self.device, dtypes=None)
        if lengths.shape != (self.batch_size,):
            raise ValueError(f"lengths must have shape [{self.batch_size}], got {tuple(lengths.shape)}")
        host = torch.cat((lengths, self.lengths)).tolist()  # the one host sync of this call
        new, current = host[: self.batch_size], host[self.batch_size :]
        if any(n < 0 or n > c for n, c in zip(new, current)):
            raise ValueError(f"truncate: lengths {new} must lie in [0, current lengths {current}]")
        new_max = max(new)
        self.lengths.copy_(lengths)
        self.max_length_committed = int(new_max)
        self.num_pending = 0

    def reset(self) -> None:
        """Empty every row (the storage is kept)."""
        self.lengths.zero_()
        self.max_length_committed = 0
        self.num_pending = 0

    # -- tree compaction ------------------------------------------------------------------------

    def _compact(self, kept_indices: torch.Tensor, num_kept: torch.Tensor) -> None:
        # Move pending slot lengths[b] + kept_indices[b, j] to lengths[b] + j (j < num_kept[b]) in
        # every layer's K and V with one `compact_kv` kernel call, no loop over rows or layers.
        # Rows keeping nothing get a -1 path, which compact_kv leaves alone; it raises if a kept
        # path is not increasing (the protocol requires increasing kept_indices).
        col = torch.arange(kept_indices.shape[1], device=self.device)
        path = torch.where(col < num_kept[:, None], kept_indices, -1)  # [B, m]
        layers = [self.kv[layer, kv] for layer in range(self.kv.shape[0]) for kv in range(2)]
        compact_kv(layers, path, (num_kept - 1).clamp(min=0), self.lengths)
