"""``HierarchicalKVCache``: per-layer 4-bit quantised history plus a full-precision recent window.

Token ``j`` of row ``b`` lives in the quantised history when ``j < quantized_lengths[b]`` and in
the full-precision buffer (index ``j - quantized_lengths[b]``) otherwise. Only ``flush`` moves
tokens into the history, in whole key groups, and only tokens at least ``residual`` positions older
than the row's length, so rolling back a rejected draft (``truncate``) only moves a length and
never touches quantised data.

A decoding step::

    for layer in layers:
        cache.write(layer, k_new, v_new)                    # [B, Hkv, n, D] at each row's length
        out = cache.attend(layer, q, upper_only=drafting)   # q [B, Hq, n, D]
    cache.advance(n)
    ... verify ...
    cache.truncate(accepted_lengths)                        # rollback: lengths only
    cache.flush()                                           # quantise groups that left the window
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from ..ops import kv_quant as kvops


def _as_int(value, what: str, least: int) -> int:
    """``value`` as an int >= least (numpy ints too; never a bool or a truncated float)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an int >= {least}, got {value!r}") from None
    if value < least:
        raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
    return value


class HierarchicalKVCache:
    """Hierarchical int4 KV cache (see ``specdec_cuda.reference.kv_quant`` for the codes).

    Parameters
    ----------
    num_layers, batch, num_kv_heads, head_dim : int
    capacity : int
        Quantised tokens per row (rounded up to a multiple of ``key_group``).
    key_group : int
        Tokens per key group (keys are grouped along tokens per channel).
    value_group : int
        Channels per value group (values are grouped along channels per token).
    residual : int
        Most recent tokens always kept in full precision; at least the longest draft + 1 so a
        rollback never reaches quantised history.
    dtype, device
        Of the full-precision buffer and of what ``attend`` returns.

    Shape: buffer ``[batch, num_kv_heads, F, head_dim]`` per layer (F grows as needed).
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int, capacity: int, *,
                 key_group: int = 64, value_group: int = 32, residual: int = 64,
                 dtype: torch.dtype = torch.float32, device=None):
        num_layers, batch, num_kv_heads, head_dim, capacity, key_group, value_group, residual = (
            _as_int(value, f"HierarchicalKVCache: {name}", least) for name, value, least in (
                ("num_layers", num_layers, 1), ("batch", batch, 1), ("num_kv_heads", num_kv_heads, 1),
                ("head_dim", head_dim, 2), ("capacity", capacity, 0), ("key_group", key_group, 1),
                ("value_group", value_group, 2), ("residual", residual, 0)))
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"HierarchicalKVCache: dtype must be a floating dtype, got {dtype!r}")
        self.num_layers, self.batch, self.num_kv_heads, self.head_dim = num_layers, batch, num_kv_heads, head_dim
        self.key_group, self.value_group, self.residual = key_group, value_group, residual
        self.capacity = -(-capacity // key_group) * key_group
        self.dtype, self.device = dtype, torch.device(device) if device is not None else torch.device("cpu")
        self.quantized = [kvops.allocate_kv_cache(batch, num_kv_heads, self.capacity, head_dim, key_group,
                                                  value_group, self.device) for _ in range(num_layers)]
        buf = (batch, num_kv_heads, key_group + residual + 16, head_dim)
        self.k_buffer = [torch.zeros(buf, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(buf, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.lengths = [0] * batch
        self.quantized_lengths = [0] * batch

    # ---- writing ----------------------------------------------------------------------------------

    def _ensure_buffer(self, layer: int, needed: int) -> None:
        have = self.k_buffer[layer].shape[2]
        if needed <= have:
            return
        grow = max(needed, 2 * have) - have
        pad = torch.zeros(self.batch, self.num_kv_heads, grow, self.head_dim, dtype=self.dtype, device=self.device)
        self.k_buffer[layer] = torch.cat([self.k_buffer[layer], pad], dim=2)
        self.v_buffer[layer] = torch.cat([self.v_buffer[layer], pad], dim=2)

    def _check_layer(self, layer, method: str) -> None:
        try:
            ok = not isinstance(layer, bool) and 0 <= operator.index(layer) < self.num_layers
        except TypeError:
            ok = False
        if not ok:
            raise IndexError(f"{method}: layer must be an int in [0, {self.num_layers}), got {layer!r}")

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of ``n`` new tokens at each row's current length (not yet counted).

        Shape: k, v ``[batch, num_kv_heads, n, head_dim]``, floating point.
        """
        self._check_layer(layer, "write")
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"write: {name} must be a tensor, got {type(t).__name__}")
            if not t.is_floating_point():
                raise TypeError(f"write: {name} must be floating point (it is stored as {self.dtype}), "
                                f"got {t.dtype}")
        n = k.shape[2] if k.dim() == 4 else -1
        expected = (self.batch, self.num_kv_heads, n, self.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(f"k and v must be [batch={self.batch}, num_kv_heads={self.num_kv_heads}, n, "
                             f"head_dim={self.head_dim}] alike; got {list(k.shape)} and {list(v.shape)}")
        self._ensure_buffer(layer, max(l - q for l, q in zip(self.lengths, self.quantized_lengths)) + n)
        for b in range(self.batch):
            i = self.lengths[b] - self.quantized_lengths[b]
            self.k_buffer[layer][b, :, i:i + n] = k[b].to(self.dtype)
            self.v_buffer[layer][b, :, i:i + n] = v[b].to(self.dtype)

    def advance(self, n: int) -> None:
        """Count the ``n`` tokens written to every layer (``n >= 0``)."""
        n = _as_int(n, "advance: n", 0)
        self.lengths = [l + n for l in self.lengths]

    def truncate(self, lengths) -> None:
        """Roll rows back to ``lengths`` (list or tensor ``[batch]`` of integers). Quantised data is
        never touched; a length below a row's quantised length is an error (``residual`` was too
        small)."""
        if torch.is_tensor(lengths):
            if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
                raise TypeError(f"truncate: lengths must hold integers, got {lengths.dtype}")
            if lengths.dim() != 1:
                raise ValueError(f"truncate: lengths must have shape [{self.batch}], got {list(lengths.shape)}")
            lengths = lengths.tolist()
        if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__len__"):
            raise TypeError(f"truncate: lengths must be a list or a tensor of {self.batch} integers, "
                            f"got {type(lengths).__name__}")
        if len(lengths) != self.batch:
            raise ValueError(f"truncate: lengths must have one entry per row ({self.batch}), got {len(lengths)}")
        try:
            if any(isinstance(x, bool) for x in lengths):
                raise TypeError
            lengths = [operator.index(x) for x in lengths]  # ints (numpy's too), never floats
        except TypeError:
            raise TypeError(f"truncate: lengths must hold integers, got {list(lengths)}") from None
        for b, (new, old, q) in enumerate(zip(lengths, self.lengths, self.quantized_lengths)):
            if not q <= new <= old:
                raise ValueError(f"row {b}: cannot truncate to {new} (length {old}, quantised history {q}; "
                                 f"rollback may not reach quantised tokens, raise `residual`)")
        self.lengths = lengths

    def flush(self) -> None:
        """Quantise, per row, whole key groups that are more than ``residual`` tokens old."""
        g = self.key_group
        for b in range(self.batch):
            while self.lengths[b] - self.quantized_lengths[b] >= g + self.residual:
                start = self.quantized_lengths[b]
                if start + g > self.capacity:
                    raise RuntimeError(f"row {b}: quantised capacity {self.capacity} exhausted")
                for layer in range(self.num_layers):
                    qt = {name: t[b:b + 1] for name, t in self.quantized[layer].items()}
                    kb, vb = self.k_buffer[layer], self.v_buffer[layer]
                    kvops.kv_quantize_keys(kb[b:b + 1, :, :g], start, g, qt["k_upper"], qt["k_lower"],
                                           qt["k_scale"], qt["k_zero"])
                    kvops.kv_quantize_values(vb[b:b + 1, :, :g], start, self.value_group, qt["v_upper"],
                                             qt["v_lower"], qt["v_scale"], qt["v_zero"])
                    kb[b, :, :-g] = kb[b, :, g:].clone()
                    vb[b, :, :-g] = vb[b, :, g:].clone()
                self.quantized_lengths[b] += g

    # ---- reading ----------------------------------------------------------------------------------

    def keys_values(self, layer: int, upper_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantised history of ``max(quantized_lengths)`` tokens.  Shape: ``[B, Hkv, Tq, D]`` each."""
        self._check_layer(layer, "keys_values")
        q = self.quantized[layer]
        tq = max(self.quantized_lengths)
        use_lower = not upper_only
        k = kvops.kv_dequantize_keys(q["k_upper"], q["k_lower"], q["k_scale"], q["k_zero"], self.key_group, tq,
                                     use_lower, self.dtype)
        v = kvops.kv_dequantize_values(q["v_upper"], q["v_lower"], q["v_scale"], q["v_zero"], self.value_group, tq,
                                       use_lower, self.dtype)
        return k, v

    def attend(self, layer: int, q: torch.Tensor, upper_only: bool = False,
               tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of the ``n`` tokens last written (not yet advanced) over the whole cache.

        Grouped-query attention without copying K/V per query head: the ``Hq / Hkv`` query heads
        that share a KV head are folded into the query-length axis, so SDPA sees ``Hkv`` heads.

        Shape: q ``[B, Hq, n, D]`` (Hq a multiple of Hkv; query head h uses KV head h // (Hq/Hkv));
        tree_mask ``[B, n, n]`` bool (which new tokens each new token sees; default causal);
        returns ``[B, Hq, n, D]``.
        """
        self._check_layer(layer, "attend")
        if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() != 4:
            raise TypeError(f"attend: q must be a floating [B, Hq, n, D] tensor, got "
                            f"{getattr(q, 'dtype', type(q).__name__)} {list(getattr(q, 'shape', []))}")
        bsz, hq, n, d = q.shape
        hkv = self.num_kv_heads
        if hq == 0 or hq % hkv != 0 or bsz != self.batch or d != self.head_dim:
            raise ValueError(f"q of shape {list(q.shape)} does not fit the cache (batch {self.batch}, "
                             f"{hkv} KV heads, head_dim {self.head_dim})")
        if tree_mask is not None and (not isinstance(tree_mask, torch.Tensor) or
                                      tuple(tree_mask.shape) != (bsz, n, n)):
            raise ValueError(f"attend: tree_mask must be a [{bsz}, {n}, {n}] tensor, got "
                             f"{list(getattr(tree_mask, 'shape', [type(tree_mask).__name__]))}")
        kq, vq = self.keys_values(layer, upper_only)
        tq = kq.shape[2]
        fb = max(l + n - ql for l, ql in zip(self.lengths, self.quantized_lengths))
        k_all = torch.cat([kq.to(q.dtype), self.k_buffer[layer][:, :, :fb].to(q.dtype)], dim=2)
        v_all = torch.cat([vq.to(q.dtype), self.v_buffer[layer][:, :, :fb].to(q.dtype)], dim=2)

        dev = q.device
        qlen = torch.tensor(self.quantized_lengths, device=dev)[:, None]           # [B, 1]
        length = torch.tensor(self.lengths, device=dev)[:, None]                     # [B, 1]
        j = torch.arange(tq, device=dev)[None, :]
        i = torch.arange(fb, device=dev)[None, :]
        key_pos = torch.cat([j.expand(bsz, tq), qlen + i], dim=1)                    # [B, Tk]
        key_ok = torch.cat([j < qlen, i < length + n - qlen], dim=1)                  # [B, Tk]
        query_pos = length + torch.arange(n, device=dev)[None, :]                    # [B, n]
        mask = key_ok[:, None, :] & (key_pos[:, None, :] <= query_pos[:, :, None])  # [B, n, Tk]
        if tree_mask is not None:
            new = key_pos[:, None, :] >= length[:, :, None]                          # key is a new token
            col = (key_pos - length).clamp(0, n - 1)                                  # its index among the new
            seen = torch.gather(tree_mask.to(torch.bool), 2, col[:, None, :].expand(bsz, n, -1))
            mask = key_ok[:, None, :] & torch.where(new, seen, torch.ones_like(seen))
        r = hq // hkv
        qf = q.reshape(bsz, hkv, r * n, d)                 # heads sharing a KV head, stacked on length
        mask = mask[:, None, None].expand(bsz, 1, r, n, -1).reshape(bsz, 1, r * n, -1)
        out = F.scaled_dot_product_attention(qf, k_all, v_all, attn_mask=mask)
        return out.reshape(bsz, hq, n, d)
