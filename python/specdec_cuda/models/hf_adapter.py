"""``HFCausalLM``: any ``transformers`` causal LM behind the model protocol.

The cache is a ``transformers`` ``DynamicCache`` (K/V [B, H, T, D] per layer, one physical length
``T`` for the whole batch) plus per-row committed lengths. Row ``b`` keeps its committed tokens in
physical slots ``0 .. lengths[b] - 1``; slots ``lengths[b] .. T - 1`` are holes left by rows that
committed fewer tokens than the longest row, hidden by a 4-D additive attention mask. So ragged
batches (rows accepting different numbers of tokens) work, and a batch whose rows share one length
runs with no mask at all (the model's own causal path) when every layer is full attention.

A forward appends the ``n`` new tokens at physical slots ``T .. T + n - 1``; ``commit`` moves each
row's kept ones to ``lengths[b] + j`` (the same slot rule as the built-in model) and crops the
physical length back to ``max(lengths)``. The cache also records the position of every slot
(``HFCache.slot_positions``), which the windowed masks below are computed from.

Layer types (``config.layer_types``, or what ``transformers`` infers from the config):

* ``full_attention``: a plain ``DynamicLayer``.
* ``sliding_attention`` (Gemma 2 / 3, Mistral / Qwen2 / Phi-3 / Qwen3-MoE with ``sliding_window``
  set, gpt-oss) and ``chunked_attention`` (Llama 4): also a full ``DynamicLayer``, never the
  ``DynamicSlidingWindowLayer`` that ``transformers`` would pick, since a rolling buffer cannot be
  cropped back or compacted. The window is applied in the mask instead, by position, with the
  rule ``transformers``' own mask functions use: a query at position ``q`` sees a key at ``k <= q``
  when ``q - k < config.sliding_window`` (sliding), or when ``q // C == k // C`` with ``C =
  config.attention_chunk_size`` (chunked). With a draft tree, a new token sees the committed tokens
  and its tree ancestors that satisfy the rule. Such models always get explicit masks, one per
  layer type: a 4-D tensor when all layers share a type, else a dict keyed by layer type (the form
  ``transformers`` models accept for mixed stacks). The price is memory: windowed layers keep the
  whole sequence, not just the window.
* ``linear_attention`` (Qwen3-Next's gated delta net): a ``LinearAttentionLayer``, one conv and
  one recurrent state per row, which only move forward. Such models take chains only (a tree
  forward raises ``UnsupportedModelError``). Rollback is by checkpoint and recomputation
  (``_RecurrentStates``): each forward first copies the states; a row that keeps fewer tokens than
  it was fed is restored from that copy and its kept tokens run through the model again on a
  one-row cache; ``truncate`` restores the newest checkpoint at or below the new length and reruns
  the committed tokens after it.
* anything else (short convolutions such as LFM2's ``conv``, indexed or compressed attention,
  KV-shared layers) is refused with ``UnsupportedModelError`` naming the layer type.

Attention: custom masks (trees, ragged rows, windows) need the ``sdpa`` or ``eager``
implementation (FlashAttention-2 rejects 4-D masks); pass ``attn_implementation="sdpa"`` to switch
a model.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch
from torch import nn

from .config import UnsupportedModelError, eos_token_ids
from ..ops.args import index_tensor
from ..ops.tree import compact_kv
from .protocol import ModelOutput, check_commit_args, check_forward_args, logits_rows

_MASKABLE = ("sdpa", "eager")
_WINDOWED = ("sliding_attention", "chunked_attention")  # full K/V kept, the rule applied in the mask
_ATTENTION = ("full_attention",) + _WINDOWED
_RECURRENT = ("linear_attention",)  # a state per row, rolled back by checkpoint + recomputation
_MAX_CHECKPOINTS = 8  # recurrent-state checkpoints kept for truncate (older ones: recompute from 0)

# A layer type's visibility rule between query positions q [B, n, 1] and key positions k [B, 1, K]
# (both int64), on top of causality / the tree; None: no rule beyond that (full attention).
MaskRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class HFCache:
    """DynamicCache plus per-row ``lengths`` [B] int64 (see the module docstring).

    ``slot_positions`` [B, max_length + 1] int64: the position of the token in each physical slot
    (the last column is scratch for compaction's padding lanes).
    """

    def __init__(self, dynamic, batch_size: int, max_length: int, device: torch.device,
                 recurrent: "_RecurrentStates | None" = None) -> None:
        self.dynamic = dynamic  # transformers.DynamicCache
        self.batch_size = batch_size
        self.max_length = max_length
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.slot_positions = torch.zeros(batch_size, max_length + 1, dtype=torch.int64, device=device)
        self.max_length_committed = 0  # host: max(lengths) = committed physical length
        self.uniform = True  # host: every row has the same length (no holes, no mask needed)
        self.num_pending = 0
        # Linear-attention layers (None without): their states, checkpoints and the token of each slot.
        self.recurrent = recurrent
        self.slot_tokens = (torch.zeros(batch_size, max_length + 1, dtype=torch.int64, device=device)
                            if recurrent is not None else None)

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    def _layers(self):
        # The initialized K/V layers (linear-attention layers have no keys and are never "initialized").
        return [layer for layer in self.dynamic.layers if getattr(layer, "is_initialized", False)]

    def _crop_to(self, length: int) -> None:
        for layer in self._layers():  # K/V layers only: a recurrent layer has no length to crop
            current = layer.get_seq_length()
            if current > length:
                layer.crop(length - current)  # negative: number of tokens to drop

    def begin_forward(self, n: int, positions: torch.Tensor | None = None, tokens: torch.Tensor | None = None) -> None:
        """Drop an uncommitted forward, check room for ``n`` new tokens, record their ``positions``
        and ``tokens`` [B, n] in the pending slots."""
        if self.max_length_committed + n > self.max_length:
            raise ValueError(
                f"KV cache overflow: a row holds {self.max_length_committed} committed tokens and the "
                f"forward adds {n}, but the cache was made with max_length={self.max_length}"
            )
        self._crop_to(self.max_length_committed)  # drop pending tokens of an uncommitted forward
        P = self.max_length_committed
        if positions is not None:
            self.slot_positions[:, P : P + n] = positions
        if self.recurrent is not None:
            if tokens is None:
                raise ValueError("a cache with linear-attention layers needs the forward's tokens")
            self.slot_tokens[:, P : P + n] = tokens
            self.recurrent.begin_forward(self, self.lengths.tolist(), discard=self.num_pending > 0)
        self.num_pending = n

    def commit(self, num_kept: torch.Tensor, kept_indices: torch.Tensor | None = None) -> None:
        """Keep pending tokens (see ``protocol.py``). num_kept [B]; kept_indices [B, m] or None."""
        num_kept, kept_indices, bad_index = check_commit_args(
            num_kept, kept_indices, self.batch_size, self.num_pending, self.device)
        base = self.max_length_committed  # physical slot of pending token 0
        checks = [] if bad_index is None else [bad_index]
        new_lengths = self.lengths + num_kept
        lo_len, hi_len, lo, hi, *bad = torch.stack(
            [new_lengths.min(), new_lengths.max(), num_kept.min(), num_kept.max(), *checks]
        ).tolist()  # the one host sync of this call
        if lo < 0 or hi > self.num_pending:
            raise ValueError(
                f"num_kept must lie in [0, {self.num_pending}] (tokens pending), got values in [{lo}, {hi}]"
            )
        if bad and bad[0]:
            raise ValueError(f"kept_indices must index the {self.num_pending} pending tokens (0 .. n-1)")
        if self.recurrent is not None:
            self._commit_recurrent(num_kept, kept_indices, base)

        # Move row b's kept pending tokens from physical base + i to lengths[b] + j. With no holes
        # and no kept_indices the tokens are already in place.
        if kept_indices is not None or not self.uniform:
            m = kept_indices.shape[1] if kept_indices is not None else hi
            if m > 0:
                # One `compact_kv` kernel call moves every layer's K and V: pending token i of row b
                # sits at slot base + i and goes to lengths[b] + j. Rows keeping nothing get a -1
                # path, which compact_kv leaves alone.
                col = torch.arange(m, device=self.device)
                kept = kept_indices if kept_indices is not None else col.expand(self.batch_size, m)
                path = torch.where(col < num_kept[:, None], kept, -1)  # [B, m]
                caches = [t for layer in self._layers() for t in (layer.keys, layer.values)]
                for group in _same_layout(caches):
                    compact_kv(group, path, (num_kept - 1).clamp(min=0), torch.full_like(num_kept, base),
                               self.lengths)
                self._compact_slots(path, base)
        self._crop_to(hi_len)
        self.lengths.copy_(new_lengths)
        self.max_length_committed = int(hi_len)
        self.uniform = lo_len == hi_len
        self.num_pending = 0

    def _compact_slots(self, path: torch.Tensor, base: int) -> None:
        # The same move for the slot positions (and tokens): slot base + path[b, j] -> lengths[b] + j
        # for the kept lanes (path >= 0); padding lanes write to the scratch column. The gather reads
        # every source before the scatter writes, so overlapping sources and destinations are safe.
        kept = path >= 0
        scratch = self.slot_positions.shape[1] - 1
        target = torch.where(kept, self.lengths[:, None] + torch.arange(path.shape[1], device=self.device), scratch)
        for slots in (self.slot_positions, self.slot_tokens):
            if slots is not None:
                slots.scatter_(1, target, slots.gather(1, base + path.clamp(min=0)))

    def _commit_recurrent(self, num_kept: torch.Tensor, kept_indices: torch.Tensor | None, base: int) -> None:
        # The recurrent states ran over all n pending tokens; a row keeping fewer goes back to its
        # state before the forward and runs the kept ones again (a recurrence cannot skip tokens, so
        # only a prefix of the pending tokens can be kept).
        kept = num_kept.tolist()
        if kept_indices is not None:
            width = kept_indices.shape[1]
            prefix = torch.arange(width, device=self.device).expand_as(kept_indices)
            lanes = prefix < num_kept[:, None]
            if bool((lanes & (kept_indices != prefix)).any()):
                raise UnsupportedModelError(
                    "a model with linear-attention layers can keep only a prefix of the pending tokens "
                    "(a chain), not tree nodes")
        self.recurrent.commit(self, self.lengths.tolist(), kept, base)

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll rows back to ``lengths`` [B] int64 (each between 0 and the row's current length)."""
        lengths = index_tensor(lengths, "lengths", self.device, dtypes=None)
        if lengths.shape != (self.batch_size,):
            raise ValueError(f"lengths must have shape [{self.batch_size}], got {tuple(lengths.shape)}")
        lo, hi, bad = torch.stack(
            [lengths.min(), lengths.max(), ((lengths < 0) | (lengths > self.lengths)).any().to(torch.int64)]
        ).tolist()
        if bad:
            raise ValueError(
                f"truncate: lengths {lengths.tolist()} must lie in [0, current lengths {self.lengths.tolist()}]"
            )
        if self.recurrent is not None:
            self.recurrent.truncate(self, self.lengths.tolist(), lengths.tolist())
        self._crop_to(hi)
        self.lengths.copy_(lengths)
        self.max_length_committed = int(hi)
        self.uniform = lo == hi
        self.num_pending = 0


def _same_layout(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by shape, strides and dtype (what one ``compact_kv`` call takes). Most
    models give one group; multi-head latent attention (DeepSeek-V2 / V3) caches its compressed
    latent [B, 1, T, kv_lora_rank] as the keys and its rotary key [B, 1, T, rope_dim] as the values."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((tuple(t.shape), t.stride(), t.dtype), []).append(t)
    return list(groups.values())


class _RecurrentStates:
    """Rollback for linear-attention (recurrent) layers, by checkpoint and recomputation.

    Such a layer keeps one state per row (a conv window and a recurrent matrix) that only moves
    forward. Invariant between calls: every row's state is its state after its ``lengths[b]``
    committed tokens. ``begin_forward`` checkpoints the states (a copy per layer, with the lengths
    they belong to). A commit that keeps fewer than all pending tokens of a row restores the row
    from that checkpoint and runs the kept tokens through the model again, on a one-row cache (its
    K/V prefix copied from the main cache, its recurrent states from the restored row), then copies
    the row's new states back. ``truncate`` restores the newest checkpoint at or below a row's new
    length and reruns the committed tokens from there (from the empty state if none is left).
    Costs: a copy of the states per forward, and a forward over the kept tokens of each partially
    accepted row.
    """

    def __init__(self, adapter: "HFCausalLM", layer_indices: list[int]) -> None:
        self.adapter = adapter
        self.layer_indices = layer_indices
        # [lengths, snapshot, valid per row], oldest first: the states at those lengths.
        self.checkpoints: list[list] = []
        self.before: list | None = None  # the states before the pending forward

    def _layers(self, cache: HFCache):
        return [cache.dynamic.layers[i] for i in self.layer_indices]

    def _snapshot(self, cache: HFCache) -> list:
        # Per layer, per state index: (conv, recurrent) copies; None where there is no state yet.
        out = []
        for layer in self._layers(cache):
            states = []
            for i in range(layer.number_of_states):
                started = layer.has_previous_state[i]
                conv = layer.conv_states[i].clone() if started and layer.is_conv_states_initialized[i] else None
                rec = layer.recurrent_states[i].clone() if started and layer.is_recurrent_states_initialized[i] else None
                states.append((conv, rec))
            out.append(states)
        return out

    def _restore(self, cache: HFCache, rows, snapshot: list | None) -> None:
        # Rows' states from a snapshot; None (or no state in it): the empty state, zeros (what a
        # first forward starts from).
        for li, layer in enumerate(self._layers(cache)):
            for i in range(layer.number_of_states):
                conv, rec = (None, None) if snapshot is None else snapshot[li][i]
                for b in rows:
                    if layer.is_conv_states_initialized[i]:
                        layer.conv_states[i][b] = 0 if conv is None else conv[b]
                    if layer.is_recurrent_states_initialized[i]:
                        layer.recurrent_states[i][b] = 0 if rec is None else rec[b]

    def begin_forward(self, cache: HFCache, lengths: list[int], discard: bool) -> None:
        if discard and self.before is not None:  # an uncommitted forward moved every row's state
            self._restore(cache, range(cache.batch_size), self.before)
        self.before = self._snapshot(cache)
        self.checkpoints.append([list(lengths), self.before, [True] * cache.batch_size])
        self.checkpoints = self.checkpoints[-_MAX_CHECKPOINTS:]

    def commit(self, cache: HFCache, lengths: list[int], kept: list[int], base: int) -> None:
        """Rows keeping ``kept[b]`` < n pending tokens: back to ``lengths[b]``, then through those tokens."""
        for b, k in enumerate(kept):
            if k < cache.num_pending:
                self._restore(cache, [b], self.before)
                if k:
                    self.adapter._advance_row(cache, b, lengths[b], cache.slot_tokens[b, base : base + k],
                                              cache.slot_positions[b, base : base + k])
        self.before = None

    def truncate(self, cache: HFCache, current: list[int], new: list[int]) -> None:
        if self.before is not None:  # an uncommitted forward: undo it first
            self._restore(cache, range(cache.batch_size), self.before)
            self.before = None
        for b in range(cache.batch_size):
            if new[b] < current[b]:
                start, snapshot = 0, None
                for lengths, states, valid in reversed(self.checkpoints):
                    if valid[b] and lengths[b] <= new[b]:
                        start, snapshot = lengths[b], states
                        break
                self._restore(cache, [b], snapshot)
                if new[b] > start:
                    self.adapter._advance_row(cache, b, start, cache.slot_tokens[b, start : new[b]],
                                              cache.slot_positions[b, start : new[b]])
            for lengths, _states, valid in self.checkpoints:  # their tokens past new[b] are gone
                valid[b] = valid[b] and lengths[b] <= new[b]


class HFCausalLM:
    """Wrap a ``transformers`` causal LM (``...ForCausalLM``) so it speaks the model protocol.

    Parameters
    ----------
    model : a ``transformers`` ``PreTrainedModel`` with a causal-LM head; it is put in eval mode.
    attn_implementation : if given (``"sdpa"`` or ``"eager"``), switch the model to it; needed
        for tree masks, ragged batches and windowed layers when the model was loaded with
        FlashAttention-2.

    Raises
    ------
    UnsupportedModelError : the model has layers other than full, sliding-window, chunked or
        linear attention (see the module docstring); ``forward`` raises it for a draft tree on a
        model with linear-attention layers.

    Example::

        hf = transformers.AutoModelForCausalLM.from_pretrained(folder)
        target = HFCausalLM(hf)
        cache = target.new_cache(batch_size=1, max_length=128)
        out = target.forward(tokens, positions, cache)   # logits [1, n, V]
        cache.commit(torch.tensor([tokens.shape[1]]))
    """

    # transformers' matmuls and attention block by shape: a row of a verification forward may round
    # differently from the same token decoded alone (protocol.batch_invariant).
    batch_invariant = False

    def __init__(self, model: nn.Module, attn_implementation: str | None = None) -> None:
        if attn_implementation is not None:
            if attn_implementation not in _MASKABLE:
                raise ValueError(f"attn_implementation must be one of {_MASKABLE}, got {attn_implementation!r}")
            model.set_attn_implementation(attn_implementation)
        self.model = model.eval()
        config = model.config
        if hasattr(config, "get_text_config"):  # multimodal configs nest the decoder's
            config = config.get_text_config(decoder=True)
        self.config = config
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0]) if head is not None else int(config.vocab_size)
        self.num_layers = int(config.num_hidden_layers)
        self.hidden_size = int(config.hidden_size)
        generation = getattr(model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None)
        self.eos_token_ids = eos_token_ids(eos if eos is not None else getattr(config, "eos_token_id", None))
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.? names the cache argument `cache`; earlier releases `past_key_values`.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._decoder_layers = _find_decoder_layers(model, self.num_layers)
        self.layer_types = _layer_types(config, type(model).__name__)
        self.recurrent_layers = [i for i, t in enumerate(self.layer_types) if t in _RECURRENT]
        self._rules = {t: _mask_rule(config, t, type(model).__name__)
                       for t in sorted(set(self.layer_types) - set(_RECURRENT))}
        self._logits_arg = "logits_to_keep" if "logits_to_keep" in params else None
        self.windowed = any(rule is not None for rule in self._rules.values())
        if self.windowed:
            _check_windowed_model(config, type(model).__name__)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def new_cache(self, batch_size: int, max_length: int) -> HFCache:
        """An empty cache for ``batch_size`` rows of up to ``max_length`` tokens (pending included)."""
        if self.windowed:
            _check_length(self.config, max_length, type(self.model).__name__)
        recurrent = _RecurrentStates(self, self.recurrent_layers) if self.recurrent_layers else None
        return HFCache(self._dynamic_cache(), batch_size, max_length, self.device, recurrent)

    def _dynamic_cache(self):
        # Every attention layer a plain DynamicLayer (so sliding and chunked layers keep their whole
        # sequence; their rule is in the mask), every linear-attention layer a LinearAttentionLayer.
        from transformers import DynamicCache

        cache = DynamicCache()  # no config: layers are DynamicLayer, created as the model writes them
        if self.recurrent_layers:
            from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

            cache.layers = [LinearAttentionLayer() if t in _RECURRENT else DynamicLayer() for t in self.layer_types]
        return cache

    def _advance_row(self, cache: HFCache, b: int, start: int, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        # Run row b's tokens [m] at positions [m] (slots start .. start + m - 1) through the model on a
        # one-row cache holding row b's K/V slots < start and its current recurrent states, and take
        # the recurrent states it ends with. Its K/V are dropped: the main cache has them already.
        sub = self._dynamic_cache()
        for i, layer in enumerate(cache.dynamic.layers):
            mine = sub.layers[i]
            if i in cache.recurrent.layer_indices:
                for s in (range(layer.number_of_states) if start > 0 else ()):
                    if layer.is_conv_states_initialized[s]:
                        mine.update_conv_state(layer.conv_states[s][b : b + 1].clone(), state_idx=s)
                    if layer.is_recurrent_states_initialized[s]:
                        mine.update_recurrent_state(layer.recurrent_states[s][b : b + 1].clone(), state_idx=s)
            elif start > 0 and layer.is_initialized:
                mine.update(layer.keys[b : b + 1, :, :start].clone(), layer.values[b : b + 1, :, :start].clone())
        extra = {self._logits_arg: 1} if self._logits_arg else {}
        self.model(input_ids=tokens[None], position_ids=positions[None], use_cache=True,
                   **{self._cache_arg: sub}, **extra)
        for i in cache.recurrent.layer_indices:
            layer, mine = cache.dynamic.layers[i], sub.layers[i]
            for s in range(layer.number_of_states):
                if layer.is_conv_states_initialized[s]:
                    layer.conv_states[s][b] = mine.conv_states[s][0]
                if layer.is_recurrent_states_initialized[s]:
                    layer.recurrent_states[s][b] = mine.recurrent_states[s][0]

    def _attention_mask(self, cache: HFCache, positions: torch.Tensor,
                        tree_mask: torch.Tensor | None) -> torch.Tensor | dict[str, torch.Tensor]:
        # Additive [B, 1, n, P + n] over physical slots: row b sees its committed slots < lengths[b]
        # and, among the new tokens at P .. P + n - 1, those the tree (or causality) allows; a
        # windowed layer type further keeps the keys its rule admits by position.
        impl = getattr(self.model.config, "_attn_implementation", "eager")
        if impl not in _MASKABLE:
            raise ValueError(
                f"tree masks, ragged batches and windowed layers need sdpa or eager attention (custom 4-D "
                f"masks), but the model uses {impl!r}; wrap it as HFCausalLM(model, attn_implementation='sdpa')"
            )
        B, n = positions.shape
        P, device = cache.max_length_committed, self.device
        committed = torch.arange(P, device=device)[None, :] < cache.lengths[:, None]  # [B, P]
        steps = torch.arange(n, device=device)
        if tree_mask is None:
            new = (steps[None, :] <= steps[:, None]).expand(B, n, n)
        else:
            new = tree_mask.to(torch.bool) | torch.eye(n, dtype=torch.bool, device=device)
        visible = torch.cat([committed[:, None, :].expand(B, n, P), new], dim=2)  # [B, n, P + n]
        key_positions = cache.slot_positions[:, : P + n]  # the new tokens' were recorded by begin_forward
        query = positions[:, :, None]
        masks = {}
        for layer_type, rule in self._rules.items():
            seen = visible if rule is None else visible & rule(query, key_positions[:, None, :])
            mask = torch.zeros(B, 1, n, P + n, dtype=self.dtype, device=device)
            masks[layer_type] = mask.masked_fill_(~seen[:, None], torch.finfo(self.dtype).min)
        # One attention type: the tensor itself (every model takes it, and makes its own masks for
        # linear-attention layers from it); mixed stacks take a dict.
        if len(masks) == 1:
            return next(iter(masks.values()))
        return {**masks, **{t: None for t in set(self.layer_types) & set(_RECURRENT)}}

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: HFCache,
        tree_mask: torch.Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Run ``tokens`` [B, n] at ``positions`` [B, n] on top of ``cache``; see ``CausalLM.forward``.

        Shape: tokens [B, n]; positions [B, n]; tree_mask [B, n, n] bool or None (a token always
        sees itself); returns logits [B, n, V] (or [B, 1, V] at ``logits_at`` [B]: the model's LM
        head runs on those positions only, through its ``logits_to_keep`` argument where it has one)
        and hidden_states {layer: [B, n, hidden]}.
        """
        B, n = check_forward_args(tokens, positions, cache, tree_mask, hidden_layers, self.num_layers, logits_at)
        if self.recurrent_layers and tree_mask is not None:
            chain = torch.ones(n, n, dtype=torch.bool, device=tree_mask.device).tril()
            if not torch.equal(tree_mask.to(torch.bool) | torch.eye(n, dtype=torch.bool, device=tree_mask.device),
                               chain.expand(B, n, n)):
                raise UnsupportedModelError(
                    f"{type(self.model).__name__} has linear-attention layers: a recurrent state follows one "
                    f"sequence, so it cannot verify a draft tree; use a chain method (draft, prompt_lookup "
                    f"with num_candidates=1)")
        cache.begin_forward(n, positions, tokens)
        needs_mask = tree_mask is not None or not cache.uniform or self.windowed
        mask = self._attention_mask(cache, positions, tree_mask) if needs_mask else None

        # transformers replaces its last hidden state by the final normed one, so the raw output of
        # the last decoder layer comes from a hook.
        last = self.num_layers - 1
        captured: dict[int, torch.Tensor] = {}
        hook = None
        if last in hidden_layers:
            if self._decoder_layers is None:
                name = type(self.model).__name__
                raise ValueError(f"cannot find the decoder layers of {name} to read layer {last}")

            def grab(_module, _args, output):
                captured[last] = output[0] if isinstance(output, tuple) else output

            hook = self._decoder_layers[last].register_forward_hook(grab)
        # A prefill wants one position per row: the LM head runs on the distinct ones only (a
        # 262k-token vocabulary over a long prompt is otherwise most of the prefill).
        extra, keep = {}, None
        if logits_at is not None and self._logits_arg is not None:
            keep, where = torch.unique(logits_at.to(tokens.device), return_inverse=True)
            extra[self._logits_arg] = keep
        try:
            out = self.model(
                input_ids=tokens,
                position_ids=positions,
                attention_mask=mask,
                use_cache=True,
                output_hidden_states=bool(hidden_layers),
                **{self._cache_arg: cache.dynamic},
                **extra,
            )
        finally:
            if hook is not None:
                hook.remove()
        hidden_states: dict[int, torch.Tensor] = {}
        for i in hidden_layers:
            if i == -1:
                hidden_states[-1] = out.hidden_states[-1]
            elif i == last:
                hidden_states[i] = captured[last]
            else:
                hidden_states[i] = out.hidden_states[i + 1]  # [0] is the embedding output
        if keep is not None:  # out.logits [B, len(keep), V]: row b's position is keep[where[b]]
            logits = out.logits[torch.arange(B, device=out.logits.device), where.to(out.logits.device)][:, None]
        else:
            logits = logits_rows(out.logits, logits_at)
        return ModelOutput(logits=logits, hidden_states=hidden_states)


def _layer_types(config, name: str) -> list[str]:
    # transformers' own reading of the config (explicit layer_types, else inferred from
    # sliding_window / attention_chunk_size), which is also what DynamicCache(config) dispatches on.
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # older transformers: explicit layer_types or all full attention
        types = list(getattr(config, "layer_types", None) or ["full_attention"] * int(config.num_hidden_layers))
    else:
        types = list(get_layer_types_and_kwargs(config)[0])
    odd = sorted(set(types) - set(_ATTENTION) - set(_RECURRENT))
    if odd:
        raise UnsupportedModelError(
            f"HFCausalLM supports full, sliding-window, chunked and linear attention layers; {name} has "
            f"{', '.join(odd)} layers, whose state cannot be rolled back to a shorter prefix or compacted "
            f"to an accepted tree path"
        )
    if set(types) & set(_RECURRENT) and set(types) & set(_WINDOWED):
        raise UnsupportedModelError(f"{name} mixes linear-attention and windowed layers, which HFCausalLM "
                                    f"does not combine")
    return types


def _positive_int(config, attr: str, name: str) -> int:
    value = getattr(config, attr, None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModelError(f"{name} has {attr}-type layers but config.{attr} is {value!r}, not a positive int")
    return value


def _mask_rule(config, layer_type: str, name: str) -> MaskRule | None:
    # The rules of transformers' masking_utils (sliding_window_overlay / chunked_overlay, no left
    # padding), by position: query at q, key at k <= q.
    if layer_type == "sliding_attention":
        window = _positive_int(config, "sliding_window", name)
        return lambda q, k: q - k < window
    if layer_type == "chunked_attention":
        chunk = _positive_int(config, "attention_chunk_size", name)
        return lambda q, k: torch.div(q, chunk, rounding_mode="floor") == torch.div(k, chunk, rounding_mode="floor")
    return None


def _check_windowed_model(config, name: str) -> None:
    # Masking variants that the window rules above do not describe.
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(f"{name} uses bidirectional attention (use_bidirectional_attention=True)")
    if getattr(config, "is_causal", True) is False:
        raise UnsupportedModelError(f"{name} is configured as non-causal (is_causal=False)")


def _check_length(config, max_length: int, name: str) -> None:
    # Llama 4 scales the queries of its NoRoPE layers by floor((slot + 1) / floor_scale), with the
    # slot counted from the cache's physical length rather than the token's position. The two agree
    # when both stay below floor_scale - 1, which max_length guarantees here (a token's position
    # never exceeds its slot); past that, trees and ragged rows would get the wrong scale.
    if getattr(config, "attn_temperature_tuning", False) and any(
            not use for use in (getattr(config, "no_rope_layers", None) or [1])):
        floor_scale = int(getattr(config, "floor_scale", 0) or 0)
        if floor_scale and max_length > floor_scale - 1:
            raise UnsupportedModelError(
                f"{name}: attention temperature tuning counts cache slots, not positions; a cache of "
                f"max_length={max_length} would pass floor_scale={floor_scale} (use max_length <= {floor_scale - 1})"
            )


def _find_decoder_layers(model: nn.Module, num_layers: int) -> nn.ModuleList | None:
    # The decoder stack is the ModuleList holding one module per layer (model.model.layers for
    # Llama-like models, transformer.h for GPT-2, ...).
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            return module
    return None
