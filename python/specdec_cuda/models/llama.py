"""The built-in Llama/Qwen2/Qwen3 causal LM: embeddings, decoder layers, final norm, LM head.

It implements the model protocol (``protocol.py``) over a ``StaticKVCache``. One forward handles
``[B, n]`` new tokens at per-row positions with per-row cache lengths and an optional tree mask,
with batched tensor ops only (no per-row Python loop, no host sync).
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping, Sequence

import torch
from torch import nn

from ..ops.skinny_linear import packed_kernel_available
from .cache import StaticKVCache
from .config import LlamaConfig
from .layers import PACKED_MAX_ROWS, DecoderLayer, RMSNorm, maybe_pack, project
from .protocol import ModelOutput, check_forward_args, logits_rows
from .quant_cache import QuantKVCache, quantized_forward
from .rope import inverse_frequencies, rope_cos_sin


class LlamaModel(nn.Module):
    """A Llama/Qwen-family decoder behind the model protocol.

    Build it with ``specdec_cuda.models.load(folder)``, or ``LlamaModel(config)`` followed by
    ``load_hf_state_dict``. Parameters are created uninitialised (use ``torch.device("meta")`` as
    the default device to skip allocation before loading).

    Example::

        model = specdec_cuda.models.load("path/to/qwen3", dtype=torch.bfloat16)
        cache = model.new_cache(batch_size=1, max_length=256)
        tokens = torch.tensor([[1, 15, 27]])
        out = model.forward(tokens, torch.arange(3)[None], cache)    # logits [1, 3, V]
        cache.commit(torch.tensor([3]))

    ``packed_linear`` (default: on unless the environment sets ``SPECDEC_PACKED_LINEAR=0``): a
    float32 model on a CPU with AVX-512 or AVX2 runs its decoding and verification forwards (up to
    ``layers.PACKED_MAX_ROWS`` token rows) as one ``decoder_layer`` op per layer and the LM head
    through ``skinny_linear_packed``, from weights packed on first use (bfloat16 when exact; the
    packed copy adds half the model's float32 size, or all of it, and is made only while that
    stays within ``SPECDEC_PACKED_LINEAR_MAX_MB``, default 1024). Writing a parameter in place,
    ``load_hf_state_dict`` and ``.to()`` re-pack. Prefills stay on the torch path (BLAS).
    """

    def __init__(self, config: LlamaConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.eos_token_ids = config.eos_token_id  # from config.json / generation_config.json
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(config, dtype) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False, dtype=dtype
        )
        for p in self.parameters():
            p.requires_grad_(False)
        self._inv_freq: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._mask_scalars: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # CPU: cos, signed sin [P, D]
        self._steps: dict[tuple[int, torch.device], torch.Tensor] = {}  # arange(n) per (n, device)
        self.packed_linear = os.environ.get("SPECDEC_PACKED_LINEAR", "1") != "0"
        # What the layers were bound with: (pack, sum of the packed weights' version counters), and
        # the packed LM head; None: bind on the next forward.
        self._binding: tuple[bool, int] | None = None
        self._head_packed = None
        # The weights that have packed copies (projections, LM head): the only tensors whose
        # in-place writes a forward must look for. Everything else is bound by reference.
        self._packed_sources: list[torch.Tensor] = []
        self._warned_packed_size = False

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() / .to_empty() replace parameter tensors: drop the layers' bound tuples
        # (layers.py) so that no forward reads the old ones.
        self._unbind()
        self._inv_freq.clear()
        self._mask_scalars.clear()
        self._rope_table = None
        self._steps.clear()
        return super()._apply(fn, recurse)

    def _unbind(self) -> None:
        for layer in self.layers:
            layer.unbind()
        self._binding, self._head_packed, self._packed_sources = None, None, []

    def _bind(self) -> None:
        """Bind the layers' tensors (layers.py), packed when ``packed_linear`` applies; again after
        a packed weight was written in place (its version counter moved). The bound tuples hold
        every other tensor by reference, so writes to those need no rebinding; replaced parameters
        (``.to()``, ``load_hf_state_dict``) drop the binding where they happen."""
        wanted = (self.packed_linear and self.device.type == "cpu" and self.dtype == torch.float32
                  and packed_kernel_available())
        # About 50 packed weights for a 12-layer model: a few tens of microseconds per forward,
        # where every parameter would be twice that.
        versions = sum(p._version for p in self._packed_sources)
        if self._binding == (wanted, versions):
            return
        pack = wanted and self._packed_copy_fits()
        for layer in self.layers:
            layer.bind(pack)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self._head_packed = maybe_pack(head, pack)
        self._packed_sources = self._packed_weights() + [head] if pack else []
        self._binding = (wanted, sum(p._version for p in self._packed_sources))

    def _packed_weights(self) -> list[torch.Tensor]:
        """The decoder layers' projection weights (what ``bind(pack=True)`` packs)."""
        weights = [layer.self_attn.qkv_proj.weight for layer in self.layers]
        weights += [layer.self_attn.o_proj.weight for layer in self.layers]
        weights += [layer.mlp.gate_up_proj.weight for layer in self.layers]
        weights += [layer.mlp.down_proj.weight for layer in self.layers]
        return weights

    def _packed_copy_fits(self) -> bool:
        """Whether the packed copy (at most the projections' and LM head's float32 size) stays
        within ``SPECDEC_PACKED_LINEAR_MAX_MB`` (default 1024): a large model keeps the torch path
        rather than risk running out of memory; its matmuls outweigh per-op overhead anyway."""
        limit_mb = float(os.environ.get("SPECDEC_PACKED_LINEAR_MAX_MB", "1024"))
        weights = self._packed_weights()
        weights.append(self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight)
        size_mb = sum(w.numel() for w in weights) * 4 / 2**20
        if size_mb <= limit_mb:
            return True
        if not self._warned_packed_size:
            self._warned_packed_size = True
            warnings.warn(f"LlamaModel: the packed CPU decoding path would copy {size_mb:.0f} MB of weights, more "
                          f"than SPECDEC_PACKED_LINEAR_MAX_MB={limit_mb:.0f}; this model keeps the torch path",
                          stacklevel=3)
        return False

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, batch_size: int, max_length: int) -> StaticKVCache:
        """An empty cache for ``batch_size`` rows of up to ``max_length`` tokens (pending included)."""
        c = self.config
        return StaticKVCache(
            c.num_hidden_layers, batch_size, c.num_key_value_heads, max_length, c.head_dim, self.dtype, self.device
        )

    def _mask_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        # 0 and -inf as 0-dim tensors of the model's dtype, so one torch.where makes the mask.
        key = (self.device, self.dtype)
        if key not in self._mask_scalars:
            self._mask_scalars[key] = (
                torch.zeros((), dtype=self.dtype, device=self.device),
                torch.full((), float("-inf"), dtype=self.dtype, device=self.device),
            )
        return self._mask_scalars[key]

    def _rope_inv_freq(self) -> torch.Tensor:
        # Angles in fp32 as Hugging Face does (fp64 for an fp64 model); computed once per device.
        precision = torch.float64 if self.dtype == torch.float64 else torch.float32
        key = (self.device, precision)
        if key not in self._inv_freq:
            inv_freq = inverse_frequencies(self.config, precision)
            self._inv_freq[key] = torch.cat((inv_freq, inv_freq)).to(self.device)  # [head_dim]
        return self._inv_freq[key]

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``rope_cos_sin`` of ``positions`` [B, n]: on the CPU, rows of a cached table (the same
        values, computed once; two lookups instead of a dozen small ops per forward)."""
        if positions.device.type != "cpu" or positions.numel() == 0:
            return rope_cos_sin(positions, self._rope_inv_freq(), self.dtype)
        if positions.shape[0] == 1 and positions.shape[1] <= 16:
            # One sequence's decoding step or chain (a drafter's inner loop): consecutive positions
            # are a slice of the table, a view, where two gathers would copy.
            steps = positions[0].tolist()
            lowest, highest = steps[0], steps[-1]
            if self._rope_table is not None and lowest >= 0 and highest < self._rope_table[0].shape[0] \
                    and steps == list(range(lowest, highest + 1)):
                cos, sin = self._rope_table
                return cos[lowest : highest + 1][None, :, None], sin[lowest : highest + 1][None, :, None]
        lowest, highest = (int(v) for v in torch.aminmax(positions))
        if lowest < 0:  # not a table row: compute them
            return rope_cos_sin(positions, self._rope_inv_freq(), self.dtype)
        need = highest + 1
        if self._rope_table is None or self._rope_table[0].shape[0] < need:
            size = max(1024, 1 << (need - 1).bit_length())
            cos, sin = rope_cos_sin(torch.arange(size)[None], self._rope_inv_freq(), self.dtype)  # [1, P, 1, D]
            self._rope_table = (cos[0, :, 0], sin[0, :, 0])
        cos, sin = self._rope_table
        return cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)

    def _arange(self, n: int, device: torch.device) -> torch.Tensor:
        key = (n, device)
        steps = self._steps.get(key)
        if steps is None:
            steps = self._steps[key] = torch.arange(n, device=device)
        return steps

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: StaticKVCache,
        tree_mask: torch.Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Run ``tokens`` [B, n] at ``positions`` [B, n] on top of ``cache`` (see ``CausalLM.forward``).

        Shape: tokens [B, n] int64; positions [B, n] int64; tree_mask [B, n, n] bool or None (a
        token always sees itself, whatever the mask's diagonal says); returns logits [B, n, V] and
        hidden_states {layer: [B, n, hidden]} for ``hidden_layers`` (``i`` = output of decoder
        layer ``i``, ``-1`` = the final normed hidden state). The new tokens' K/V go to the pending
        slots ``cache.lengths[b] + i``; ``cache.lengths`` is not changed (call ``cache.commit``).
        """
        if torch.is_grad_enabled():  # no autograd graph, also when the caller did not turn it off
            with torch.no_grad():
                return self.forward(tokens, positions, cache, tree_mask, hidden_layers, logits_at)
        if isinstance(cache, QuantKVCache):  # the hierarchical int4 cache: attention by its own kernel
            return quantized_forward(self, tokens, positions, cache, tree_mask, hidden_layers, logits_at=logits_at)
        B, n = check_forward_args(tokens, positions, cache, tree_mask, hidden_layers, self.num_layers, logits_at)
        span = cache.begin_forward(n)
        device = self.device
        self._bind()
        if self._head_packed is not None and B * n <= PACKED_MAX_ROWS:
            return self._forward_packed(tokens, positions, cache, tree_mask, hidden_layers, logits_at)

        # Slot of each new token and the attention mask over slots 0 .. span-1, shared by all layers.
        lengths = cache.lengths
        steps = self._arange(n, device)
        slots = lengths[:, None] + steps  # [B, n]
        slot_index = slots[:, None, :, None].expand(B, self.config.num_key_value_heads, n, self.config.head_dim)
        if tree_mask is None and n == 1 and B == 1:
            # One new token of one row sees every slot up to its own: no mask at all (decoding a
            # single sequence, the drafter's inner loop; saves building one per forward).
            attn_mask = None
        else:
            rel = torch.arange(span, device=device) - lengths[:, None]  # [B, span]: slot - length
            if tree_mask is None:
                attn_mask = rel[:, None, :] <= steps[None, :, None]  # prefix, then causal
            else:
                tree_mask = tree_mask.to(torch.bool) | torch.eye(n, dtype=torch.bool, device=device)
                new_col = rel.clamp(0, n - 1)[:, None, :].expand(B, n, span)
                in_new = (rel >= 0) & (rel < n)
                attn_mask = (rel < 0)[:, None, :] | (in_new[:, None, :] & tree_mask.gather(2, new_col))
            # Additive mask [B, 1, n, span]: SDPA's CPU kernel runs a float mask faster than a bool one.
            zero, minus_inf = self._mask_values()
            attn_mask = torch.where(attn_mask[:, None], zero, minus_inf)

        cos, sin = self._rope(positions)
        x = torch.nn.functional.embedding(tokens, self.embed_tokens.weight)
        wanted = set(hidden_layers)
        hidden_states: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = layer.forward(x, cos, sin, cache.keys[i], cache.values[i], slot_index, span, attn_mask)
            if i in wanted:
                hidden_states[i] = x
        return self._output(x, wanted, hidden_states, logits_at)

    def _forward_packed(self, tokens, positions, cache, tree_mask, hidden_layers, logits_at) -> ModelOutput:
        """``forward`` for a few token rows on the CPU: each layer one ``decoder_layer`` op over
        packed weights, the LM head through ``skinny_linear_packed``."""
        cos, sin = self._rope(positions)  # [B, n, 1, D]
        cos, sin = cos.squeeze(2).contiguous(), sin.squeeze(2).contiguous()
        mask = None if tree_mask is None else tree_mask.to(torch.bool).contiguous()
        x = torch.nn.functional.embedding(tokens, self.embed_tokens.weight)
        wanted = set(hidden_layers)
        hidden_states: dict[int, torch.Tensor] = {}
        lengths = cache.lengths
        for i, layer in enumerate(self.layers):
            x = layer.forward_packed(x, cos, sin, cache.keys[i], cache.values[i], lengths, mask)
            if i in wanted:
                hidden_states[i] = x
        return self._output(x, wanted, hidden_states, logits_at)

    def _output(self, x: torch.Tensor, wanted: set, hidden_states: dict, logits_at) -> ModelOutput:
        """The final norm (kept as hidden state -1 when wanted) and the LM head (packed when bound
        so; ``project`` sends more rows to BLAS) after the last layer's output x [B, n, hidden],
        on every row or at ``logits_at`` only."""
        x = self.norm.forward(x)
        if -1 in wanted:
            hidden_states[-1] = x
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return ModelOutput(logits=project(logits_rows(x, logits_at), weight, None, self._head_packed),
                           hidden_states=hidden_states)

    # -- weights ----------------------------------------------------------------------------------

    def hf_tensor_names(self) -> list[str]:
        """The Hugging Face tensor names this model reads (without any file's prefix)."""
        return list(self._hf_layout())

    def _hf_layout(self) -> dict[str, tuple[torch.Tensor, int, int]]:
        # HF name -> (destination parameter, row offset, rows): fused projections take row slices.
        c = self.config
        q_dim, kv_dim = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        inter = c.intermediate_size
        layout: dict[str, tuple[torch.Tensor, int, int]] = {}

        def whole(name: str, param: torch.Tensor) -> None:
            layout[name] = (param, 0, param.shape[0])

        whole("model.embed_tokens.weight", self.embed_tokens.weight)
        whole("model.norm.weight", self.norm.weight)
        if self.lm_head is not None:
            whole("lm_head.weight", self.lm_head.weight)
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            for proj, off, rows in (("q", 0, q_dim), ("k", q_dim, kv_dim), ("v", q_dim + kv_dim, kv_dim)):
                layout[f"{p}self_attn.{proj}_proj.weight"] = (attn.qkv_proj.weight, off, rows)
                if c.qkv_bias:
                    layout[f"{p}self_attn.{proj}_proj.bias"] = (attn.qkv_proj.bias, off, rows)
            whole(f"{p}self_attn.o_proj.weight", attn.o_proj.weight)
            if c.o_bias:
                whole(f"{p}self_attn.o_proj.bias", attn.o_proj.bias)
            if c.qk_norm:
                whole(f"{p}self_attn.q_norm.weight", attn.q_norm.weight)
                whole(f"{p}self_attn.k_norm.weight", attn.k_norm.weight)
            layout[f"{p}mlp.gate_proj.weight"] = (mlp.gate_up_proj.weight, 0, inter)
            layout[f"{p}mlp.up_proj.weight"] = (mlp.gate_up_proj.weight, inter, inter)
            whole(f"{p}mlp.down_proj.weight", mlp.down_proj.weight)
            if c.mlp_bias:
                layout[f"{p}mlp.gate_proj.bias"] = (mlp.gate_up_proj.bias, 0, inter)
                layout[f"{p}mlp.up_proj.bias"] = (mlp.gate_up_proj.bias, inter, inter)
                whole(f"{p}mlp.down_proj.bias", mlp.down_proj.bias)
            whole(f"{p}input_layernorm.weight", layer.input_layernorm.weight)
            whole(f"{p}post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
        return layout

    @torch.no_grad()
    def load_hf_state_dict(self, tensors: Mapping[str, torch.Tensor], source: str = "state dict") -> None:
        """Copy Hugging Face-named tensors (``model.layers.0.self_attn.q_proj.weight``, ...) in.

        ``tensors`` may be any mapping, e.g. a lazy view of safetensors files; each tensor is read
        once and cast to the model's dtype. Missing tensors or wrong shapes raise ValueError.
        """
        self._unbind()
        layout = self._hf_layout()
        missing = [name for name in layout if name not in tensors]
        if missing:
            shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
            raise ValueError(f"{source} lacks tensors the {self.config.family} model needs: {shown}")
        for name, (param, off, rows) in layout.items():
            src = tensors[name]
            want = (rows, *param.shape[1:])
            if tuple(src.shape) != want:
                raise ValueError(f"{source}: tensor {name} has shape {tuple(src.shape)}, expected {want}")
            param[off : off + rows].copy_(src)
