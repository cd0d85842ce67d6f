"""The hierarchical 4-bit KV cache for the built-in model (``QuantKVCache``) and the forward that
runs the model's attention over it with the ``quant_kv_attention`` kernel (``quant_model.py`` puts
the model on this cache behind the protocol: ``QuantKVModel``).

Storage per layer: the quantised history (``ops.kv_quant``: keys grouped along tokens in groups of
``key_group`` tokens per channel, values along channels in groups of ``value_group`` per token,
upper and lower 4-bit halves) for every complete group of tokens, plus a float32 buffer of the
recent tokens ``buffer_start[b] ..`` (the not-yet-quantised tail, the pending drafts, and a window
of ``2 * residual`` tokens that also sit in the history).

Which tokens a query reads from the codes is a function of the query's own position ``p`` only::

    quant_len(p) = floor(max(0, p - residual) / key_group) * key_group

(tokens below it from the codes, the rest from the buffer). So a token is read the same way by a
verification forward over many new tokens and by autoregressive decoding one token at a time: the
autoregressive baseline on this cache is the model the speculative output must equal.

Protocol (``models/protocol.py``): ``forward`` writes the new tokens' K/V to the buffer, and
quantises every group of ``key_group`` tokens that the write completes (pending tokens included:
a query never reads a group that is not wholly below it, and a group holding tokens later
rejected is re-quantised when it is next completed). ``commit`` / ``truncate`` move lengths, mark
groups past the new length stale, and slide the buffer forward in whole groups; rolling back
(``truncate``) never touches quantised data and may go back at most ``residual`` tokens.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from ..ops import kv_quant as kvops
from ..ops.args import index_tensor
from ..ops.quant_attention import quant_kv_attention
from ..ops.skinny_linear import linear as skinny_or_blas_linear
from .layers import rms_norm
from .protocol import ModelOutput, check_commit_args, check_forward_args, logits_rows
from .rope import apply_rope


def _positive(value, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"QuantKVCache: {name} must be an int >= {least}, got {value!r}")
    return value


class QuantKVCache:
    """Hierarchical int4 KV cache with a float32 recent-token buffer (see the module docstring).

    Parameters
    ----------
    num_layers, batch_size, num_kv_heads, max_length, head_dim : int
    key_group : int
        Tokens per key group (also the step in which tokens leave the buffer).
    value_group : int or None
        Channels per value group (even, divides head_dim); None: min(32, head_dim).
    residual : int
        Most recent tokens read in full precision; at least the longest rollback (a draft's length).

    Shape: ``lengths`` [B] int64; per layer ``quantized[l]`` (``ops.kv_quant.allocate_kv_cache``
    over ``capacity`` tokens) and ``k_buffer[l]`` / ``v_buffer[l]`` [B, H_kv, F, head_dim] float32.
    """

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, max_length: int, head_dim: int,
                 device=None, *, key_group: int = 64, value_group: int | None = None, residual: int = 32) -> None:
        for name, value in (("num_layers", num_layers), ("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                            ("max_length", max_length), ("head_dim", head_dim), ("key_group", key_group),
                            ("residual", residual)):
            _positive(value, name)
        value_group = min(32, head_dim) if value_group is None else value_group
        if head_dim % 2 or value_group % 2 or head_dim % value_group:
            raise ValueError(f"QuantKVCache: value_group ({value_group}) must be even and divide head_dim ({head_dim})")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.num_layers, self.batch_size, self.num_kv_heads, self.head_dim = num_layers, batch_size, num_kv_heads, head_dim
        self.key_group, self.value_group, self.residual = key_group, value_group, residual
        self.max_length = max_length
        self.capacity = -(-max_length // key_group) * key_group
        self.quantized = [kvops.allocate_kv_cache(batch_size, num_kv_heads, self.capacity, head_dim, key_group,
                                                  value_group, self.device) for _ in range(num_layers)]
        # Steady-state buffer: the 2 * residual window, a group being filled, a step's pending tokens.
        self._steady = 2 * residual + 2 * key_group + 16
        self.k_buffer = [self._zeros(self._steady) for _ in range(num_layers)]
        self.v_buffer = [self._zeros(self._steady) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
        self.buffer_start = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
        # Host copies, per row: committed length, first buffered token, tokens whose codes are valid.
        self._len = [0] * batch_size
        self._start = [0] * batch_size
        self._valid = [0] * batch_size
        self._pending_valid: list[int] | None = None  # codes valid after the last forward's write
        self.max_length_committed = 0
        self.num_pending = 0

    def _zeros(self, slots: int) -> torch.Tensor:
        return torch.zeros(self.batch_size, self.num_kv_heads, slots, self.head_dim, dtype=torch.float32,
                           device=self.device)

    @property
    def buffer_slots(self) -> int:
        return self.k_buffer[0].shape[2]

    def quant_len(self, positions: torch.Tensor) -> torch.Tensor:
        """Tokens each query reads from the codes (see the module docstring).  Shape: positions
        [B, n] -> [B, n] int64, within [buffer_start, codes valid after this forward's write]."""
        g = self.key_group
        q = (positions.to(torch.int64) - self.residual).clamp(min=0) // g * g
        avail = torch.tensor(self._pending_valid, dtype=torch.int64, device=self.device)
        return torch.minimum(torch.maximum(q, self.buffer_start[:, None]), avail[:, None])

    def kv_bytes_per_token(self) -> float:
        """Bytes of quantised storage per token per layer and KV head (codes + scales / zeros)."""
        d = self.head_dim
        return d + 8 * d / self.key_group + 8 * (d / self.value_group)

    # -- used by the forward ----------------------------------------------------------------------

    def begin_forward(self, n: int) -> None:
        """Room for ``n`` new tokens per row: capacity check, buffer grown if needed."""
        if self.max_length_committed + n > self.max_length:
            raise ValueError(f"KV cache overflow: a row holds {self.max_length_committed} committed tokens and the "
                             f"forward adds {n}, but the cache was made with max_length={self.max_length}")
        needed = max(l - s for l, s in zip(self._len, self._start)) + n
        if needed > self.buffer_slots:
            self._resize(max(needed, self._steady))
        self.num_pending = n
        g = self.key_group
        self._pending_valid = [max(v, (l + n) // g * g) for v, l in zip(self._valid, self._len)]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The new tokens' K/V into the buffer at each row's length, then the groups they complete
        into the codes.  Shape: k, v [B, H_kv, n, head_dim]."""
        B, H, n, D = k.shape
        slots = (self.lengths - self.buffer_start)[:, None] + torch.arange(n, device=self.device)
        index = slots[:, None, :, None].expand(B, H, n, D)
        kb, vb = self.k_buffer[layer], self.v_buffer[layer]
        kb.scatter_(2, index, k.to(torch.float32))
        vb.scatter_(2, index, v.to(torch.float32))
        q = self.quantized[layer]
        for b, (old, new, start) in enumerate(zip(self._valid, self._pending_valid, self._start)):
            if new > old:  # tokens [old, new) from buffer slots old - start ..
                block = slice(old - start, new - start)
                row = {name: t[b : b + 1] for name, t in q.items()}
                kvops.kv_quantize_keys(kb[b : b + 1, :, block], old, self.key_group, row["k_upper"], row["k_lower"],
                                       row["k_scale"], row["k_zero"])
                kvops.kv_quantize_values(vb[b : b + 1, :, block], old, self.value_group, row["v_upper"],
                                         row["v_lower"], row["v_scale"], row["v_zero"])

    def attend(self, layer: int, q: torch.Tensor, quant_len: torch.Tensor, tree_mask: torch.Tensor | None,
               use_lower: bool) -> torch.Tensor:
        """``quant_kv_attention`` of the new tokens' queries.  Shape: q [B, H, n, D] -> [B, H, n, D]."""
        return quant_kv_attention(q, self.quantized[layer], self.k_buffer[layer], self.v_buffer[layer], quant_len,
                                  self.buffer_start, self.lengths, tree_mask, key_group=self.key_group,
                                  value_group=self.value_group, use_lower=use_lower)

    # -- the protocol ---------------------------------------------------------------------------

    def commit(self, num_kept: torch.Tensor, kept_indices: torch.Tensor | None = None) -> None:
        """Keep pending tokens: the first ``num_kept[b]``, or ``kept_indices[b, :num_kept[b]]``.

        Shape: num_kept [B] int64; kept_indices [B, m] int64 (-1 padded) or None.
        """
        num_kept, kept_indices, bad_index = check_commit_args(
            num_kept, kept_indices, self.batch_size, self.num_pending, self.device)
        new_lengths = self.lengths + num_kept
        parts = [new_lengths, num_kept] if bad_index is None else [new_lengths, num_kept, bad_index[None]]
        host = torch.cat(parts).tolist()  # the one host sync of this call
        B = self.batch_size
        lo, hi = min(host[B : 2 * B]), max(host[B : 2 * B])
        if lo < 0 or hi > self.num_pending:
            raise ValueError(f"num_kept must lie in [0, {self.num_pending}] (tokens pending), got values in [{lo}, {hi}]")
        if bad_index is not None and host[-1]:
            raise ValueError(f"kept_indices must index the {self.num_pending} pending tokens (0 .. n-1)")
        pending_valid = self._pending_valid or self._valid
        g = self.key_group
        if kept_indices is not None and kept_indices.numel():
            self._compact(kept_indices, num_kept)
            # Groups holding moved tokens were quantised before the move: stale from the old length on.
            self._valid = [min(v, l // g * g) for v, l in zip(pending_valid, self._len)]
        else:
            self._valid = [min(v, l // g * g) for v, l in zip(pending_valid, host[:B])]
        self._len = host[:B]
        self.lengths.copy_(new_lengths)
        self.max_length_committed = max(self._len)
        self.num_pending = 0
        self._pending_valid = None
        self._slide()

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll rows back to ``lengths`` [B] int64, at most ``residual`` tokens behind the furthest
        length since the buffer last slid (the codes are never touched)."""
        lengths = index_tensor(lengths, "lengths", self.device, dtypes=None)
        if lengths.shape != (self.batch_size,):
            raise ValueError(f"lengths must have shape [{self.batch_size}], got {tuple(lengths.shape)}")
        new = lengths.tolist()  # the one host sync of this call
        for b, (n, c, s) in enumerate(zip(new, self._len, self._start)):
            if n < 0 or n > c:
                raise ValueError(f"truncate: lengths {new} must lie in [0, current lengths {self._len}]")
            if s > 0 and n - self.residual < s:
                raise ValueError(f"truncate: row {b} cannot go back to {n}: the buffer holds tokens from {s} on "
                                 f"and a query reads the last residual={self.residual} in full precision "
                                 f"(raise residual to roll back further)")
        g = self.key_group
        self._valid = [min(v, n // g * g) for v, n in zip(self._valid, new)]
        self._len = new
        self.lengths.copy_(lengths)
        self.max_length_committed = max(new)
        self.num_pending = 0
        self._pending_valid = None

    def reset(self) -> None:
        """Empty every row (the storage is kept)."""
        self.lengths.zero_()
        self.buffer_start.zero_()
        self._len, self._start, self._valid = [0] * self.batch_size, [0] * self.batch_size, [0] * self.batch_size
        self.max_length_committed = self.num_pending = 0
        self._pending_valid = None

    # -- buffer bookkeeping -----------------------------------------------------------------------

    def _gather_slots(self, index: torch.Tensor) -> None:
        # Every layer's buffers re-read through index [B, F] (slot j takes slot index[b, j]).
        B, H, Fs, D = self.k_buffer[0].shape
        full = index[:, None, :, None].expand(B, H, Fs, D)
        for layer in range(self.num_layers):
            self.k_buffer[layer] = self.k_buffer[layer].gather(2, full)
            self.v_buffer[layer] = self.v_buffer[layer].gather(2, full)

    def _compact(self, kept_indices: torch.Tensor, num_kept: torch.Tensor) -> None:
        # Pending slot lengths + kept_indices[b, j] moves to lengths + j (j < num_kept[b]).
        Fs, m = self.buffer_slots, kept_indices.shape[1]
        base = (self.lengths - self.buffer_start)[:, None]
        col = torch.arange(m, device=self.device)
        keep = col < num_kept[:, None]
        dst, src = base + col, base + kept_indices
        index = torch.arange(Fs, device=self.device).expand(self.batch_size, Fs).clone()
        rows = torch.arange(self.batch_size, device=self.device)[:, None].expand(-1, m)
        index[rows[keep], dst[keep]] = src[keep]  # kept destinations are distinct
        self._gather_slots(index)

    def _slide(self) -> None:
        # Drop whole groups from the buffer's front: keep 2 * residual tokens behind each row's
        # length (rollbacks of up to `residual`, then queries reading `residual` in full precision),
        # and never drop a token whose codes are stale.
        g, r = self.key_group, self.residual
        start = [max(s, min(max(0, l - 2 * r) // g * g, v)) for s, l, v in zip(self._start, self._len, self._valid)]
        shift = [a - s for a, s in zip(start, self._start)]
        if any(shift):
            Fs = self.buffer_slots
            offset = torch.tensor(shift, dtype=torch.int64, device=self.device)[:, None]
            self._gather_slots((torch.arange(Fs, device=self.device) + offset).clamp(max=Fs - 1))
            self._start = start
            self.buffer_start.copy_(torch.tensor(start, dtype=torch.int64))
        used = max(l - s for l, s in zip(self._len, self._start))
        if self.buffer_slots > 2 * self._steady and used + self._steady <= self.buffer_slots // 2:
            self._resize(used + self._steady)  # give back what a long prefill needed

    def _resize(self, slots: int) -> None:
        keep = min(slots, self.buffer_slots)
        for layer in range(self.num_layers):
            for buffers in (self.k_buffer, self.v_buffer):
                fresh = self._zeros(slots)
                fresh[:, :, :keep] = buffers[layer][:, :, :keep]
                buffers[layer] = fresh


# -- the model's forward over the quantised cache -------------------------------------------------

class DraftLinears:
    """Per decoder layer, replacements for the model's linear layers in a draft pass (``W4Linear``
    modules, or None to keep the full-precision weight): keys ``"qkv"``, ``"o"``, ``"gate_up"``,
    ``"down"``; and ``lm_head``, the output projection's replacement (or None)."""

    def __init__(self, layers: list[dict], lm_head=None) -> None:
        self.layers = layers
        self.lm_head = lm_head

    @classmethod
    def quantize(cls, model, mlp: bool = True, attention: bool = False, group_size: int = 128,
                 lm_head: bool = False) -> "DraftLinears":
        """4-bit copies (``W4Linear``) of the MLPs' (and optionally the attention projections' and
        the LM head's) weights, made once. A linear whose input width is not a multiple of 32 keeps
        its full weights. A GGUF model (``LlamaModel.load_gguf``) keeps its own blocks: its
        weights are 4-bit already (Q4_K_M: 4.5 - 6.5 bits), so the draft pass reads them as they
        are and differs from verification in the KV cache's lower bits only."""
        from ..quant.linear import W4Linear

        if getattr(model, "gguf", False):
            return cls([dict.fromkeys(("qkv", "o", "gate_up", "down")) for _ in model.layers], None)

        def w4(linear):
            k = linear.in_features
            group = next((g for g in (group_size, 128, 64, 32) if g <= k and k % g == 0 and g % 32 == 0), None)
            return None if group is None else W4Linear.from_linear(linear, group)

        layers = []
        for layer in model.layers:
            attn, m = layer.self_attn, layer.mlp
            # dense_linear: the module itself, or (a packed CPU model) a copy unpacked from its panels
            layers.append({"qkv": w4(layer.dense_linear("qkv")) if attention else None,
                           "o": w4(layer.dense_linear("o")) if attention else None,
                           "gate_up": w4(layer.dense_linear("gate_up")) if mlp else None,
                           "down": w4(layer.dense_linear("down")) if mlp else None})
        head = None
        if lm_head:
            weight = model.output_weight()
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device,
                                     dtype=weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(weight)
            head = w4(linear)
        return cls(layers, head)

    def count(self) -> int:
        return sum(v is not None for layer in self.layers for v in layer.values()) + (self.lm_head is not None)


def _linear(x: torch.Tensor, weight, bias, w4, packed=None) -> torch.Tensor:
    if w4 is None and weight is None:
        # A packed CPU model keeps only the panels (models/layers.py): the packed kernel, float32 inside.
        from .layers import project

        return project(x, None, bias, packed)
    if w4 is None:
        # Float32 on the CPU, a few rows: the skinny kernel reads the weight once for all the rows
        # of a verification (BLAS at 5 rows costs about two one-row GEMVs) and gives each token
        # the bits it gets alone (verification == autoregressive decoding on this cache, exactly).
        return skinny_or_blas_linear(x, weight, bias)
    # W4A16 takes float32 / 16-bit activations on the CPU and 16-bit ones on CUDA.
    want = x.dtype
    if x.device.type == "cuda":
        want = w4.scales.dtype if x.dtype not in (torch.float16, torch.bfloat16) else x.dtype
    elif x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        want = torch.float32
    return w4(x.to(want)).to(x.dtype)


def quantized_forward(model, tokens: torch.Tensor, positions: torch.Tensor, cache: QuantKVCache,
                      tree_mask: torch.Tensor | None = None, hidden_layers: Sequence[int] = (), *,
                      use_lower: bool = True, linears: DraftLinears | None = None,
                      logits_at: torch.Tensor | None = None) -> ModelOutput:
    """``LlamaModel.forward`` over a ``QuantKVCache``: the attention reads the codes (upper + lower,
    or upper only with ``use_lower=False``) and the buffer through ``quant_kv_attention``;
    ``linears`` swaps in 4-bit weights (a QuantSpec draft pass). Same shapes as ``LlamaModel.forward``.
    """
    if torch.is_grad_enabled():
        with torch.no_grad():
            return quantized_forward(model, tokens, positions, cache, tree_mask, hidden_layers,
                                     use_lower=use_lower, linears=linears, logits_at=logits_at)
    B, n = check_forward_args(tokens, positions, cache, tree_mask, hidden_layers, model.num_layers, logits_at)
    c = model.config
    if (cache.num_layers, cache.num_kv_heads, cache.head_dim) != (c.num_hidden_layers, c.num_key_value_heads, c.head_dim):
        raise ValueError(f"the cache ({cache.num_layers} layers, {cache.num_kv_heads} KV heads, head_dim "
                         f"{cache.head_dim}) was not made for this model")
    cache.begin_forward(n)
    quant_len = cache.quant_len(positions)  # [B, n], shared by every layer
    cos, sin = model._rope(positions)
    x = model.embed(tokens)
    H, H_kv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    wanted = set(hidden_layers)
    hidden_states: dict[int, torch.Tensor] = {}
    for i, layer in enumerate(model.layers):
        norm1_w, eps1, norm2_w, eps2, attn_w, mlp_w = layer._bound or layer.bind()
        qkv_w, qkv_b, o_w, o_b, q_norm_w, k_norm_w, eps = attn_w[:7]  # dense weights None when packed
        swap = linears.layers[i] if linears is not None else {}
        h = rms_norm(x, norm1_w, eps1)
        qkv = _linear(h, qkv_w, qkv_b, swap.get("qkv"), attn_w[7]).view(B, n, H + 2 * H_kv, D)
        if q_norm_w is not None:
            qk = torch.cat((rms_norm(qkv[:, :, :H], q_norm_w, eps), rms_norm(qkv[:, :, H : H + H_kv], k_norm_w, eps)), 2)
        else:
            qk = qkv[:, :, : H + H_kv]
        qk = apply_rope(qk, cos, sin).transpose(1, 2)  # [B, H + H_kv, n, D]
        cache.write(i, qk[:, H:], qkv[:, :, H + H_kv :].transpose(1, 2))
        att = cache.attend(i, qk[:, :H], quant_len, tree_mask, use_lower)
        x = x + _linear(att.transpose(1, 2).reshape(B, n, H * D), o_w, o_b, swap.get("o"), attn_w[8])
        gate_up_w, gate_up_b, down_w, down_b = mlp_w[:4]
        gate_up = _linear(rms_norm(x, norm2_w, eps2), gate_up_w, gate_up_b, swap.get("gate_up"), mlp_w[4])
        gate, up = gate_up.chunk(2, dim=-1)
        x = x + _linear(F.silu(gate) * up, down_w, down_b, swap.get("down"), mlp_w[5])
        if i in wanted:
            hidden_states[i] = x
    x = model.norm.forward(x)
    if -1 in wanted:
        hidden_states[-1] = x
    weight = None if model.packed else (model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight)
    head = linears.lm_head if linears is not None else None
    return ModelOutput(logits=_linear(logits_rows(x, logits_at), weight, None, head, model._head_packed),
                       hidden_states=hidden_states)
