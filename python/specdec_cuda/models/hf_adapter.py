"""``HFCausalLM``: any ``transformers`` causal LM behind the model protocol.

The cache is a ``transformers`` ``DynamicCache`` (K/V [B, H, T, D] per layer, one physical length
``T`` for the whole batch) plus per-row committed lengths. Row ``b`` keeps its committed tokens in
physical slots ``0 .. lengths[b] - 1``; slots ``lengths[b] .. T - 1`` are holes left by rows that
committed fewer tokens than the longest row, hidden by a 4-D additive attention mask. So ragged
batches (rows accepting different numbers of tokens) work, and a batch whose rows share one length
runs with no mask at all (the model's own causal path).

A forward appends the ``n`` new tokens at physical slots ``T .. T + n - 1``; ``commit`` moves each
row's kept ones to ``lengths[b] + j`` (the same slot rule as the built-in model) and crops the
physical length back to ``max(lengths)``.

Attention: custom masks (trees, ragged rows) need the ``sdpa`` or ``eager`` implementation
(FlashAttention-2 rejects 4-D masks); pass ``attn_implementation="sdpa"`` to switch a model.
Only models whose cache layers are all plain full-attention ``DynamicLayer`` are supported
(sliding-window or linear-attention layers cannot be cropped or compacted this way).
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch
from torch import nn

from .config import UnsupportedModelError, eos_token_ids
from ..ops.args import index_tensor
from ..ops.tree import compact_kv
from .protocol import ModelOutput, check_commit_args, check_forward_args, logits_rows

_MASKABLE = ("sdpa", "eager")


class HFCache:
    """DynamicCache plus per-row ``lengths`` [B] int64 (see the module docstring)."""

    def __init__(self, dynamic, batch_size: int, max_length: int, device: torch.device) -> None:
        self.dynamic = dynamic  # transformers.DynamicCache
        self.batch_size = batch_size
        self.max_length = max_length
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.max_length_committed = 0  # host: max(lengths) = committed physical length
        self.uniform = True  # host: every row has the same length (no holes, no mask needed)
        self.num_pending = 0

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    def _layers(self):
        return [layer for layer in self.dynamic.layers if getattr(layer, "is_initialized", False)]

    def _crop_to(self, length: int) -> None:
        current = self.dynamic.get_seq_length()
        if current > length:
            self.dynamic.crop(length - current)  # negative: number of tokens to drop

    def begin_forward(self, n: int) -> None:
        if self.max_length_committed + n > self.max_length:
            raise ValueError(
                f"KV cache overflow: a row holds {self.max_length_committed} committed tokens and the "
                f"forward adds {n}, but the cache was made with max_length={self.max_length}"
            )
        self._crop_to(self.max_length_committed)  # drop pending tokens of an uncommitted forward
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
                compact_kv(caches, path, (num_kept - 1).clamp(min=0), torch.full_like(num_kept, base),
                           self.lengths)
        self._crop_to(hi_len)
        self.lengths.copy_(new_lengths)
        self.max_length_committed = int(hi_len)
        self.uniform = lo_len == hi_len
        self.num_pending = 0

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
        self._crop_to(hi)
        self.lengths.copy_(lengths)
        self.max_length_committed = int(hi)
        self.uniform = lo == hi
        self.num_pending = 0


class HFCausalLM:
    """Wrap a ``transformers`` causal LM (``...ForCausalLM``) so it speaks the model protocol.

    Parameters
    ----------
    model : a ``transformers`` ``PreTrainedModel`` with a causal-LM head; it is put in eval mode.
    attn_implementation : if given (``"sdpa"`` or ``"eager"``), switch the model to it; needed
        for tree masks and ragged batches when the model was loaded with FlashAttention-2.

    Example::

        hf = transformers.AutoModelForCausalLM.from_pretrained(folder)
        target = HFCausalLM(hf)
        cache = target.new_cache(batch_size=1, max_length=128)
        out = target.forward(tokens, positions, cache)   # logits [1, n, V]
        cache.commit(torch.tensor([tokens.shape[1]]))
    """

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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def new_cache(self, batch_size: int, max_length: int) -> HFCache:
        """An empty cache for ``batch_size`` rows of up to ``max_length`` tokens (pending included)."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        dynamic = DynamicCache(config=self.model.config)
        odd = sorted({type(layer).__name__ for layer in dynamic.layers if type(layer) is not DynamicLayer})
        if odd:
            raise UnsupportedModelError(
                f"HFCausalLM supports models whose cache layers are all full-attention DynamicLayer; "
                f"{type(self.model).__name__} uses {', '.join(odd)}"
            )
        return HFCache(dynamic, batch_size, max_length, self.device)

    def _attention_mask(self, cache: HFCache, n: int, tree_mask: torch.Tensor | None) -> torch.Tensor:
        # Additive [B, 1, n, P + n] over physical slots: row b sees its committed slots < lengths[b]
        # and, among the new tokens at P .. P + n - 1, those the tree (or causality) allows.
        impl = getattr(self.model.config, "_attn_implementation", "eager")
        if impl not in _MASKABLE:
            raise ValueError(
                f"tree masks and ragged batches need sdpa or eager attention (custom 4-D masks), but the "
                f"model uses {impl!r}; wrap it as HFCausalLM(model, attn_implementation='sdpa')"
            )
        B, P, device = cache.batch_size, cache.max_length_committed, self.device
        committed = torch.arange(P, device=device)[None, :] < cache.lengths[:, None]  # [B, P]
        steps = torch.arange(n, device=device)
        if tree_mask is None:
            new = (steps[None, :] <= steps[:, None]).expand(B, n, n)
        else:
            new = tree_mask.to(torch.bool) | torch.eye(n, dtype=torch.bool, device=device)
        visible = torch.cat([committed[:, None, :].expand(B, n, P), new], dim=2)
        mask = torch.zeros(B, 1, n, P + n, dtype=self.dtype, device=device)
        return mask.masked_fill_(~visible[:, None], torch.finfo(self.dtype).min)

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
        sees itself); returns logits [B, n, V] (or [B, 1, V] at ``logits_at`` [B]: ``transformers``
        computes them all, and the adapter keeps those) and hidden_states {layer: [B, n, hidden]}.
        """
        B, n = check_forward_args(tokens, positions, cache, tree_mask, hidden_layers, self.num_layers, logits_at)
        cache.begin_forward(n)
        mask = None if (tree_mask is None and cache.uniform) else self._attention_mask(cache, n, tree_mask)

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
        try:
            out = self.model(
                input_ids=tokens,
                position_ids=positions,
                attention_mask=mask,
                use_cache=True,
                output_hidden_states=bool(hidden_layers),
                **{self._cache_arg: cache.dynamic},
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
        return ModelOutput(logits=logits_rows(out.logits, logits_at), hidden_states=hidden_states)


def _find_decoder_layers(model: nn.Module, num_layers: int) -> nn.ModuleList | None:
    # The decoder stack is the ModuleList holding one module per layer (model.model.layers for
    # Llama-like models, transformer.h for GPT-2, ...).
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            return module
    return None
