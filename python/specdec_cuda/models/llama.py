"""The built-in Llama/Qwen2/Qwen3 causal LM: embeddings, decoder layers, final norm, LM head.

It implements the model protocol (``protocol.py``) over a ``StaticKVCache``. One forward handles
``[B, n]`` new tokens at per-row positions with per-row cache lengths and an optional tree mask,
with batched tensor ops only (no per-row Python loop, no host sync).
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from ..ops.gguf import (GgufLinear, GgufWeight, gguf_dequantize, gguf_repack_lanes, gguf_repack_panels, gguf_rows,
                        lanes_pay, panels_pay)
from ..ops.skinny_linear import pack_weight, rounded_activations
from .cache import StaticKVCache
from .config import LlamaConfig
from .draft_vocab import VocabSubset, gguf_rows_of, subset_ids
from .layers import PACKED_MAX_ROWS, DecoderLayer, RMSNorm, project
from .protocol import ModelOutput, check_forward_args, logits_rows
from .quant_cache import QuantKVCache, quantized_forward
from .rope import cached_inv_freq, rope_cos_sin

# Rows per chunk of a prefill on AMX tiles (DecoderLayer.prefill_on_tiles): each chunk decodes every
# weight of the model once (~0.15 s for the 1.5B at 2 threads), but past ~256 rows x's tile form
# outgrows L2 (the down projection's: 256 x 8960 bfloat16 = 4.6 MB) and each row costs more:
# 2.6 ms per row at 256, 3.5 at 512 (a 2-core Xeon).
TILE_PREFILL_ROWS = 256
# Fewer rows than this prefill on the decoding kernels: decoding every weight for the tiles costs
# about two one-row steps, which a prompt of a few tokens would not earn back.
TILE_PREFILL_MIN_ROWS = 32


def decoder_layer_hf_layout(layer: DecoderLayer, c: LlamaConfig, prefix: str) -> dict[str, tuple[torch.Tensor, int, int]]:
    """Where a Hugging Face decoder layer's tensors (``{prefix}self_attn.q_proj.weight``, ...) go in
    ``layer``: name -> (destination parameter, row offset, rows); the fused q|k|v and gate|up
    projections take row slices. Also the layout of an MTP block (``native_mtp.py``)."""
    q_dim, kv_dim, inter = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size
    attn, mlp = layer.self_attn, layer.mlp
    layout: dict[str, tuple[torch.Tensor, int, int]] = {}

    def whole(name: str, param: torch.Tensor) -> None:
        layout[prefix + name] = (param, 0, param.shape[0])

    for proj, off, rows in (("q", 0, q_dim), ("k", q_dim, kv_dim), ("v", q_dim + kv_dim, kv_dim)):
        layout[f"{prefix}self_attn.{proj}_proj.weight"] = (attn.qkv_proj.weight, off, rows)
        if c.qkv_bias:
            layout[f"{prefix}self_attn.{proj}_proj.bias"] = (attn.qkv_proj.bias, off, rows)
    whole("self_attn.o_proj.weight", attn.o_proj.weight)
    if c.o_bias:
        whole("self_attn.o_proj.bias", attn.o_proj.bias)
    if c.qk_norm:
        whole("self_attn.q_norm.weight", attn.q_norm.weight)
        whole("self_attn.k_norm.weight", attn.k_norm.weight)
    layout[f"{prefix}mlp.gate_proj.weight"] = (mlp.gate_up_proj.weight, 0, inter)
    layout[f"{prefix}mlp.up_proj.weight"] = (mlp.gate_up_proj.weight, inter, inter)
    whole("mlp.down_proj.weight", mlp.down_proj.weight)
    if c.mlp_bias:
        layout[f"{prefix}mlp.gate_proj.bias"] = (mlp.gate_up_proj.bias, 0, inter)
        layout[f"{prefix}mlp.up_proj.bias"] = (mlp.gate_up_proj.bias, inter, inter)
        whole("mlp.down_proj.bias", mlp.down_proj.bias)
    whole("input_layernorm.weight", layer.input_layernorm.weight)
    whole("post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
    return layout


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
    float32 or bfloat16 model on a CPU with AVX-512 or AVX2 keeps its four projections per layer and
    its LM head only as packed panels (``pack()``: bfloat16 panels for a bf16 model, or for a
    float32 one whose values are bf16 numbers; float32 panels otherwise), the dense weights dropped
    (``layers.dropped``: meta stand-ins), so a model of several GB is held once (the former
    ``SPECDEC_PACKED_LINEAR_MAX_MB``, which kept models of over 1 GB off this path because it made
    a second copy, is gone with the copy). ``load`` packs layer by layer while it reads the
    checkpoint; a model built by hand packs on its first forward. Every forward of a packed model,
    decoding, verification and prefill alike, runs one ``decoder_layer`` op per layer and the LM
    head through ``skinny_linear_packed`` (a long causal forward in chunks of
    ``layers.PACKED_MAX_ROWS`` rows). Inside, activations, the residual stream and the KV cache are
    float32 whatever the model's dtype: a bf16 model computes exactly as the float32 model of the
    same bf16 weights (unless ``set_activations("bfloat16")`` rounds each projection's input), and
    every row gets the bits it would get in a one-row forward (verification == autoregressive
    decoding, bit for bit). Logits come back in float32; hidden states in the
    model's dtype (drafters built in it read them); ``new_cache`` gives float32 caches. A tied
    embedding is read from the LM head's panels (no second copy).

    The dense weights come back with ``unpack()`` (exactly), which ``.to()`` / ``.cuda()`` do
    first; ``packed_linear = False`` unpacks on the next forward (the torch path, BLAS). Writing a
    dropped weight in place is an error (the next forward says so): unpack first, and the forward
    after the write packs again. ``dense_weight()`` / ``embedding_weight()`` /
    ``output_weight()`` give dense copies to callers that need a matrix.
    """

    def __init__(self, config: LlamaConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.eos_token_ids = config.eos_token_id  # from config.json / generation_config.json
        self.checkpoint_dir = None  # the folder models.load read (for layers it did not load: native_mtp.py)
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
        # CPU: cos, signed sin [P, D] per dtype (the model's; float32 for the packed path).
        self._rope_tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._steps: dict[tuple[int, torch.device], torch.Tensor] = {}  # arange(n) per (n, device)
        self.packed_linear = os.environ.get("SPECDEC_PACKED_LINEAR", "1") != "0"
        # forward(prefill=True) may take a prompt's own kernels (GGUF blocks or bf16 panels on AMX
        # tiles, bf16-rounded activations); False: the decoding kernels for prompts too (a prompt's
        # K/V then have a one-row forward's bits).
        self.fast_prefill = True
        # The products' activations on every row (set_activations): "float32" (exact: the three-part
        # split on AMX tiles) or "bfloat16" (rounded, one tile product, as transformers' bf16 GEMMs).
        self.activations = "float32"
        # Packed storage (pack()): the LM head's panels (also the embedding of a tied model), the
        # dropped weights' stand-ins (an in-place write to one moves its version: an error), and
        # float32 copies of the final norm (bf16 models; norms and biases of the layers likewise).
        self._packed = False
        self._head_packed = None
        self._embed_gguf = None  # a GGUF model's token_embd blocks (load_gguf); the head's part when tied
        self._stand_ins: list[torch.Tensor] = []
        self._norm_f32: torch.Tensor | None = None
        # What the layers were bound with: (packed, versions of the stand-ins, versions of the
        # tensors copied to float32 for the packed op); None: bind on the next forward.
        self._binding: tuple | None = None
        self._copied: list[torch.Tensor] = []

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device  # (a packed tied model's embedding is a meta stand-in)

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() / .to_empty() replace parameter tensors: dense weights first (a packed
        # model's stand-ins hold no values), and drop the layers' bound tuples (layers.py) so that
        # no forward reads the old ones.
        self.unpack()
        self._unbind()
        self._inv_freq.clear()
        self._mask_scalars.clear()
        self._rope_tables.clear()
        self._steps.clear()
        return super()._apply(fn, recurse)

    def _unbind(self) -> None:
        for layer in self.layers:
            layer.unbind()
        self._binding, self._norm_f32, self._copied = None, None, []

    # -- packed storage ---------------------------------------------------------------------------

    @property
    def packed(self) -> bool:
        """Whether the projections and the LM head live only in packed panels (see the class docs)."""
        return self._packed

    @property
    def batch_invariant(self) -> bool:
        """Whether a forward gives each row the bits a one-row forward gives it (``protocol.
        batch_invariant``): on the packed CPU path and for GGUF blocks, whose ops compute every
        output in one fixed order of its own row (docs/cpu-path.md, "Exactness"); not on the
        torch path (BLAS and SDPA block by shape)."""
        return self._packed or self._packable()

    def _packable(self) -> bool:
        from .layers import packable

        return self.packed_linear and packable(self.device, self.dtype)

    def pack(self) -> None:
        """Keep the projections and the LM head only as packed panels (see the class docs); a no-op
        when packed. ValueError where the packed path does not apply (device, dtype, ISA, switch)."""
        if self._packed:
            return
        if not self._packable():
            raise ValueError(f"LlamaModel.pack: the packed CPU path takes float32 or bfloat16 models on a CPU with "
                             f"AVX-512 or AVX2 (this one: {self.dtype} on {self.device}, packed_linear="
                             f"{self.packed_linear})")
        for layer in self.layers:
            if layer.panels is None:
                self._stand_ins += layer.pack_weights()
        self._pack_head()

    def _pack_head(self) -> None:
        from .layers import dropped, pack_weight

        linear = self.lm_head if self.lm_head is not None else self.embed_tokens
        self._head_packed = pack_weight(linear.weight)
        linear.weight = dropped(linear.weight)  # tied: embedding rows come from the panels (embed())
        self._stand_ins.append(linear.weight)
        self._packed = True
        self._unbind()
        self._rope_tables.clear()  # the packed path's table is float32

    def unpack(self, values: bool = True) -> None:
        """Dense weights again, the exact values of the panels (uninitialised when not ``values``:
        what ``load_hf_state_dict`` writes into); the panels dropped. A no-op when not packed."""
        from .layers import dense_of

        if not self._packed and not any(layer.panels is not None for layer in self.layers):
            return
        device = self.device
        for layer in self.layers:
            layer.unpack_weights(device, values)
        if self._head_packed is not None:
            linear = self.lm_head if self.lm_head is not None else self.embed_tokens
            dtype = linear.weight.dtype
            dense = (dense_of(self._head_packed, dtype) if values
                     else torch.empty(linear.weight.shape, dtype=dtype, device=device))
            linear.weight = nn.Parameter(dense, requires_grad=False)
        if self._embed_gguf is not None and self.lm_head is not None:  # untied GGUF: its own embedding blocks
            dense = (gguf_dequantize(self._embed_gguf, self.dtype) if values
                     else torch.empty(self.embed_tokens.weight.shape, dtype=self.dtype, device=device))
            self.embed_tokens.weight = nn.Parameter(dense, requires_grad=False)
        self._head_packed, self._embed_gguf, self._stand_ins, self._packed = None, None, [], False
        self._unbind()
        self._rope_tables.clear()

    def dense_weight(self, layer: int, name: str) -> torch.Tensor:
        """Projection ``name`` ("qkv", "o", "gate_up", "down") of decoder layer ``layer`` as a dense
        [N, K] tensor in the model's dtype: the parameter, or a copy unpacked from the panels."""
        return self.layers[layer].dense_linear(name).weight

    def output_weight(self) -> torch.Tensor:
        """The LM head [V, H] (the embedding when tied) as a dense tensor in the model's dtype: the
        parameter, or a copy unpacked from the panels."""
        from .layers import dense_of

        if self._head_packed is None:
            return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return dense_of(self._head_packed, self.dtype)

    def output_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` [R] (sorted, unique) of the LM head (the embedding when tied) as [R, H] in
        the model's dtype, exactly, reading only those rows of panels or GGUF blocks (``output_weight``
        would decode the whole head: ~1 GB in float32 for a 150k vocabulary)."""
        head = self._head_packed
        if head is None:
            return self.output_weight().index_select(0, rows)
        if isinstance(head, GgufLinear):
            return torch.cat([gguf_dequantize(p) for p in gguf_rows_of(head, rows).parts]).to(self.dtype)
        panels = head.panels  # [V / 64, H, 64]: row v is panels[v // 64, :, v % 64]
        return panels[rows // panels.shape[2], :, rows % panels.shape[2]].to(self.dtype)

    def embedding_weight(self) -> torch.Tensor:
        """The token embedding [V, H] as a dense tensor (a copy for a packed tied model or a GGUF one)."""
        if self._embed_gguf is not None:
            return gguf_dequantize(self._embed_gguf, self.dtype)
        return self.output_weight() if self.lm_head is None else self.embed_tokens.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings [..., H] in the model's dtype; a packed tied model reads them from the LM
        head's panels ``[V / 64, H, 64]`` (row v is ``panels[v // 64, :, v % 64]``, exactly); a GGUF
        model decodes the rows' blocks of its ``token_embd``."""
        if self._embed_gguf is not None:
            return gguf_rows(self._embed_gguf, tokens).to(self.dtype)
        if not (self._packed and self.lm_head is None):
            return torch.nn.functional.embedding(tokens, self.embed_tokens.weight)
        from .layers import PACKED_PANEL

        panels = self._head_packed.panels
        if self.vocab_size % PACKED_PANEL and tokens.numel() and int(tokens.max()) >= self.vocab_size:
            raise IndexError(f"token id {int(tokens.max())} is out of the vocabulary ({self.vocab_size})")
        return panels[tokens // PACKED_PANEL, :, tokens % PACKED_PANEL].to(self.dtype)

    def set_activations(self, activations: str) -> None:
        """Which activations every forward of this model multiplies its bfloat16 panels with:
        ``"float32"`` (default: x split exactly into three bfloat16 parts on AMX tiles, so a bf16
        model computes as the float32 model of its weights) or ``"bfloat16"`` (x rounded to
        bfloat16 before each projection, as a bf16 model in ``transformers`` or vLLM multiplies: one
        tile product per weight instead of three, so verification rows past the first cost less;
        a one-row step streams the same bytes). Rows stay independent of each other either way, so
        verification keeps autoregressive decoding's bits: lossless under either setting, each
        against its own decoding. The LM head keeps the exact split (its logits are what sampling
        reads). ``"bfloat16"`` needs packed bfloat16 panels on the AMX tier (``packed_bf16_tier()
        == "amx"``): ValueError elsewhere, and for GGUF models (``gguf_activations`` picks theirs).
        """
        if rounded_activations(activations):
            self._bind()
            if not self._packed or any(layer.gguf or not layer.prefill_on_tiles() for layer in self.layers):
                from ..ops.skinny_linear import packed_bf16_tier

                raise ValueError(f"activations='bfloat16' rounds x for bfloat16 panels on AMX tiles; this model "
                                 f"({self.dtype}, packed={self._packed}, bfloat16 tier {packed_bf16_tier()!r}) has "
                                 f"none (a GGUF model picks its products with gguf_activations)")
        self.activations = activations

    def _bind(self) -> None:
        """Pack (or unpack) as ``packed_linear`` and the device / dtype say, and bind the layers'
        tensors (layers.py). The bound tuples hold the tensors by reference, so in-place writes need
        no rebinding, except to a tensor the packed op reads through a float32 copy (a bf16
        model's norms and biases: rebound when its version counter moves) and to a dropped weight
        (an error)."""
        wanted = self._packable()
        if wanted != self._packed:
            self.pack() if wanted else self.unpack()
        if self._binding is not None:
            if not self._packed:
                return
            # ~115 stand-ins for a 28-layer model: ~30 us per forward.
            if sum(t._version for t in self._stand_ins) != self._binding[1]:
                written = [name for name, p in self.named_parameters() if p.is_meta and any(p is t for t in
                           self._stand_ins) and p._version]
                raise RuntimeError(f"LlamaModel: {', '.join(written[:3]) or 'a weight'} was written in place, but "
                                   f"this model keeps its weights in packed panels (the parameter holds no "
                                   f"values); call model.unpack() before writing weights (the next forward "
                                   f"packs again)")
            if sum(t._version for t in self._copied) == self._binding[2]:
                return
        for layer in self.layers:
            layer.bind()
        self._norm_f32 = self.norm.weight.detach().float()  # by reference for a float32 model
        self._copied = []
        if self._packed and self.dtype != torch.float32:
            self._copied = [p for name, p in self.named_parameters() if not p.is_meta]
        self._binding = (self._packed, sum(t._version for t in self._stand_ins),
                         sum(t._version for t in self._copied))

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, batch_size: int, max_length: int) -> StaticKVCache:
        """An empty cache for ``batch_size`` rows of up to ``max_length`` tokens (pending included)."""
        c = self.config
        # The packed path (the one the next forward takes: _packable) keeps K/V in float32 (see the
        # class docs), whatever the model's dtype.
        dtype = torch.float32 if self._packable() else self.dtype
        return StaticKVCache(
            c.num_hidden_layers, batch_size, c.num_key_value_heads, max_length, c.head_dim, dtype, self.device
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
        return cached_inv_freq(self._inv_freq, self.config, self.device, self.dtype)  # [head_dim]

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``rope_cos_sin`` of ``positions`` [B, n] in ``dtype`` (default: the model's; the packed
        path asks for float32): on the CPU, rows of a cached table (the same values, computed once;
        two lookups instead of a dozen small ops per forward)."""
        dtype = self.dtype if dtype is None else dtype
        if positions.device.type != "cpu" or positions.numel() == 0:
            return rope_cos_sin(positions, self._rope_inv_freq(), dtype)
        table = self._rope_tables.get(dtype)
        if positions.shape[0] == 1 and positions.shape[1] <= 16:
            # One sequence's decoding step or chain (a drafter's inner loop): consecutive positions
            # are a slice of the table, a view, where two gathers would copy.
            steps = positions[0].tolist()
            lowest, highest = steps[0], steps[-1]
            if table is not None and lowest >= 0 and highest < table[0].shape[0] \
                    and steps == list(range(lowest, highest + 1)):
                cos, sin = table
                return cos[lowest : highest + 1][None, :, None], sin[lowest : highest + 1][None, :, None]
        lowest, highest = (int(v) for v in torch.aminmax(positions))
        if lowest < 0:  # not a table row: compute them
            return rope_cos_sin(positions, self._rope_inv_freq(), dtype)
        need = highest + 1
        if table is None or table[0].shape[0] < need:
            size = max(1024, 1 << (need - 1).bit_length())
            cos, sin = rope_cos_sin(torch.arange(size)[None], self._rope_inv_freq(), dtype)  # [1, P, 1, D]
            table = self._rope_tables[dtype] = (cos[0, :, 0], sin[0, :, 0])
        cos, sin = table
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
        layers: Sequence[int] | None = None,
        vocab: VocabSubset | None = None,
        prefill: bool = False,
        before_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> ModelOutput:
        """Run ``tokens`` [B, n] at ``positions`` [B, n] on top of ``cache`` (see ``CausalLM.forward``).

        Shape: tokens [B, n] int64; positions [B, n] int64; tree_mask [B, n, n] bool or None (a
        token always sees itself, whatever the mask's diagonal says); returns logits [B, n, V] and
        hidden_states {layer: [B, n, hidden]} for ``hidden_layers`` (``i`` = output of decoder
        layer ``i``, ``-1`` = the final normed hidden state). The new tokens' K/V go to the pending
        slots ``cache.lengths[b] + i``; ``cache.lengths`` is not changed (call ``cache.commit``).

        ``layers`` (an extension of the protocol, for self-speculation: ``method="layer_skip"``):
        the decoder layers to run, increasing indices; None runs all. The others are skipped (the
        residual stream passes them unchanged) and their cache slots are not written; the final
        norm and the LM head run as always. Hidden states can be asked for the layers that run.

        ``vocab`` (an extension for drafters, ``draft_vocab=``): a ``VocabSubset`` of this model
        (``vocab_subset``); the LM head then runs over its rows only and logits are [B, n, N] in
        the subset's id order (``VocabSubset.expand`` maps them back to the vocabulary).

        ``prefill`` (an extension, ``protocol.prefill_kwargs``): these tokens are a prompt, which
        every decoding method prefills alike, so they may run on kernels of another numeric contract
        than decoding's, on an AMX CPU and for at least ``TILE_PREFILL_MIN_ROWS`` rows: a GGUF model's
        blocks decoded to bfloat16 tiles (``gguf_linear``'s ``activations="bf16"``: 3.8x its decoding
        kernels over a 168-token prompt of the 1.5B), bfloat16 panels with the activations rounded
        to bfloat16 instead of split exactly into three (1.8x); on a VNNI CPU without AMX, a GGUF
        model's k-quant blocks through the Q8K kernel (``activations="q8k"``). Never set it on rows whose bits must
        equal a one-row forward's (a verification). ``fast_prefill = False`` turns it off.

        ``before_head`` (an extension for ``method="layer_skip"``'s exit adapter): a function of the
        residual stream after the last layer run, [B, n, hidden] -> [B, n, hidden] (float32 on the
        packed path), applied before the final norm and the LM head; hidden states of the layers
        are taken before it.
        """
        if torch.is_grad_enabled():  # no autograd graph, also when the caller did not turn it off
            with torch.no_grad():
                return self.forward(tokens, positions, cache, tree_mask, hidden_layers, logits_at, layers, vocab,
                                    prefill, before_head)
        plan = self._layer_plan(layers, hidden_layers)
        if isinstance(cache, QuantKVCache):  # the hierarchical int4 cache: attention by its own kernel
            if layers is not None or vocab is not None or before_head is not None:
                raise ValueError("forward(layers=..., vocab=..., before_head=...) runs on the model's own "
                                 "StaticKVCache, not a QuantKVCache")
            return quantized_forward(self, tokens, positions, cache, tree_mask, hidden_layers, logits_at=logits_at)
        B, n = check_forward_args(tokens, positions, cache, tree_mask, hidden_layers, self.num_layers, logits_at)
        if vocab is not None and vocab.model_id != id(self):
            raise ValueError("forward(vocab=...) takes a VocabSubset made by this model's vocab_subset()")
        span = cache.begin_forward(n)
        device = self.device
        self._bind()
        if vocab is not None and vocab.form != self._head_form():
            raise ValueError("this VocabSubset holds the LM head's rows as the model was when it was made "
                             f"({vocab.form}); the model has changed since (.to(), packed_linear: now "
                             f"{self._head_form()}): make it again with vocab_subset()")
        if self._packed:
            return self._forward_packed(tokens, positions, cache, tree_mask, hidden_layers, logits_at, plan, vocab,
                                        prefill and self.fast_prefill, before_head)

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
        for i, layer in plan:
            x = layer.forward(x, cos, sin, cache.keys[i], cache.values[i], slot_index, span, attn_mask)
            if i in wanted:
                hidden_states[i] = x
        if before_head is not None:
            x = before_head(x)
        return self._output(x, wanted, hidden_states, logits_at, vocab)

    def _layer_plan(self, layers: Sequence[int] | None, hidden_layers: Sequence[int]) -> list:
        """[(index, layer)] that a forward runs: every layer, or those of ``layers`` (increasing
        indices in [0, num_layers)); ValueError for a hidden state asked of a layer skipped."""
        if layers is None:
            return list(enumerate(self.layers))
        chosen = [int(i) for i in layers]
        if any(b <= a for a, b in zip(chosen, chosen[1:])) or any(not 0 <= i < self.num_layers for i in chosen):
            raise ValueError(f"layers must be increasing indices in [0, {self.num_layers}), got {chosen}")
        skipped = sorted(set(hidden_layers) - set(chosen) - {-1})
        if skipped:
            raise ValueError(f"hidden states asked of layers {skipped}, which this forward skips")
        return [(i, self.layers[i]) for i in chosen]

    def _forward_packed(self, tokens, positions, cache, tree_mask, hidden_layers, logits_at, plan,
                        vocab=None, prefill: bool = False, before_head=None) -> ModelOutput:
        """``forward`` of a packed model on the CPU: each layer one ``decoder_layer`` op over packed
        weights, the LM head through ``skinny_linear_packed``, all in float32. A causal forward of
        more than ``PACKED_MAX_ROWS`` rows (a prefill) runs in chunks of new tokens, each chunk on
        top of the slots the previous ones wrote (lengths + its offset): the same bits, since each
        row's arithmetic does not depend on the other rows. A tree forward runs in one call. A
        ``prefill`` on tiles (``DecoderLayer.prefill_on_tiles``; at least ``TILE_PREFILL_MIN_ROWS``
        rows) runs in chunks of up to ``TILE_PREFILL_ROWS`` rows: each chunk decodes every weight
        once, so fewer are cheaper."""
        if cache.keys[0].dtype != torch.float32:
            raise ValueError(f"this model runs the packed CPU path, whose KV cache is float32; got a "
                             f"{cache.keys[0].dtype} cache (make it with model.new_cache)")
        B, n = tokens.shape
        mask = None if tree_mask is None else tree_mask.to(torch.bool).contiguous()
        tiles = prefill and B * n >= TILE_PREFILL_MIN_ROWS and all(layer.prefill_on_tiles() for _, layer in plan)
        rounded = tiles or self.activations == "bfloat16"  # x rounded to bfloat16 (set_activations)
        step = n if mask is not None else max(1, (TILE_PREFILL_ROWS if tiles else PACKED_MAX_ROWS) // B)
        wanted = set(hidden_layers)
        chunks: dict[int, list[torch.Tensor]] = {i: [] for i in wanted if i != -1}
        outputs = []
        for start in range(0, n, step):
            end = min(n, start + step)
            cos, sin = self._rope(positions[:, start:end], torch.float32)  # [B, c, 1, D]
            cos, sin = cos.squeeze(2).contiguous(), sin.squeeze(2).contiguous()
            x = self.embed(tokens[:, start:end]).float()
            lengths = cache.lengths if start == 0 else cache.lengths + start
            for i, layer in plan:
                x = layer.forward_packed(x, cos, sin, cache.keys[i], cache.values[i], lengths, mask, rounded)
                if i in chunks:
                    chunks[i].append(x)
            outputs.append(x)
        hidden_states = {i: (xs[0] if len(xs) == 1 else torch.cat(xs, 1)).to(self.dtype) for i, xs in chunks.items()}
        x = outputs[0] if len(outputs) == 1 else torch.cat(outputs, 1)
        if before_head is not None:
            x = before_head(x)
        x = torch.nn.functional.rms_norm(x, x.shape[-1:], self._norm_f32, eps=self.norm.eps)
        if -1 in wanted:
            hidden_states[-1] = x.to(self.dtype)
        head = self._head_packed if vocab is None else vocab.packed
        logits = project(logits_rows(x, logits_at), None, None, head)  # float32
        return ModelOutput(logits=logits, hidden_states=hidden_states)

    def _output(self, x: torch.Tensor, wanted: set, hidden_states: dict, logits_at, vocab=None) -> ModelOutput:
        """The final norm (kept as hidden state -1 when wanted) and the LM head (or ``vocab``'s rows
        of it) after the last layer's output x [B, n, hidden], on every row or at ``logits_at``
        only (the torch path)."""
        x = self.norm.forward(x)
        if -1 in wanted:
            hidden_states[-1] = x
        if vocab is not None:
            weight = vocab.weight
        else:
            weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return ModelOutput(logits=project(logits_rows(x, logits_at), weight, None, None), hidden_states=hidden_states)

    def vocab_subset(self, ids) -> VocabSubset:
        """The LM head's rows ``ids`` (an int ``n``: ids ``0 .. n - 1``; or a sequence of token ids)
        for ``forward(vocab=...)``, in the form this model's forward multiplies them: GGUF blocks
        gathered as stored, packed panels of the rows, or dense rows. A copy of those rows (the
        prefix of a GGUF head is a view); make it after ``pack`` / ``load_gguf`` / ``.to()``: it
        is tied to the model as it is then."""
        from .layers import dense_of

        ids = subset_ids(ids, self.vocab_size)
        self._bind()  # the path the next forward takes (a model built by hand packs on its first)
        form = self._head_form()
        if isinstance(self._head_packed, GgufLinear):
            return VocabSubset(ids, self.vocab_size, None, gguf_rows_of(self._head_packed, ids), id(self), form)
        if self._head_packed is not None:
            rows = dense_of(self._head_packed, self._head_packed.panels.dtype)[ids]
            return VocabSubset(ids, self.vocab_size, None, pack_weight(rows), id(self), form)
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return VocabSubset(ids, self.vocab_size, weight[ids.to(weight.device)].contiguous(), None, id(self), form)

    def _head_form(self) -> str:
        """How the LM head is held now (a ``VocabSubset`` is valid while this stays the same)."""
        kind = "gguf" if self.gguf else "packed" if self._packed else "dense"
        return f"{kind} {self.dtype} on {self.device}"

    # -- weights ----------------------------------------------------------------------------------

    @torch.no_grad()
    def load_gguf(self, checkpoint, activations: str = "q8") -> None:
        """Take the weights of a ``GgufCheckpoint`` (``gguf_file.py``) as the file stores them: each
        decoder layer's projections as GGUF blocks (q|k|v and gate|up as lists of parts, each in its
        own format), the LM head and the embedding likewise; norms and biases as float32. The dense
        weights become stand-ins (no memory), as for a packed model: every forward runs one
        ``decoder_layer_gguf`` op per layer and the head through ``gguf_linear``, a float32
        residual stream and cache, each row's bits those of a one-row forward. ``unpack()`` (and so
        ``.to()``) dequantises to dense weights exactly. A float32 model on a CPU with AVX-512 or
        AVX2 (``packable``) only; ValueError otherwise.

        ``activations``: "q8" (default) quantises each row's input to a projection to int8 blocks
        of 32 (a float32 scale each; ``ops.gguf.quantize_q8``) and multiplies with integer dot
        products, as llama.cpp does (Qwen2.5-Coder-1.5B Q4_K_M, 2 threads: a one-token step in
        57 ms against 104 ms); "float32" multiplies the activations as they are (closer to the
        dequantised weights' float model, slower). Each is a fixed function of each row,
        so speculative decoding is exact under all.

        With "q8" on an AVX-512 VNNI CPU (``ops.gguf.panels_pay()``; an AMX CPU's prompt tiles read
        them too), the projections
        and head are repacked once here into panels of 16 rows (``gguf_repack_panels``) and
        multiplied, at every row count, with 16 rows of W in the vector lanes: the Q4_K and Q6_K
        ones by the Q8K kernel, int8 activations with one scale per 256 values, llama.cpp's Q8_K
        (the ops' ``activations="q8k_q8"``), the legacy blocks in the Q8 kernel's order (32). The
        Qwen2.5-Coder-1.5B's 5-row verification then costs 1.13x (Zen 4) to 1.42x (a Xeon with
        AMX) a one-token step instead of 1.5-1.6x, the step itself as fast or faster (Xeon: 55.5
        -> 46.6 ms). The embedding table stays in the file's order. "q8_32"
        keeps every format at 32 values per scale (the numerics of a CPU without that tier; the
        Q4_K / Q6_K weights in the Q8 kernel's lane order where ``lanes_pay()``)."""
        from .layers import dropped

        if self.dtype != torch.float32 or not self._packable():
            raise ValueError(f"a GGUF model runs on the CPU's packed path: float32 on a CPU with AVX-512 or AVX2, "
                             f"SPECDEC_PACKED_LINEAR not 0 (this one: {self.dtype} on {self.device})")
        self.unpack(values=False)
        self._unbind()
        c, ck = self.config, checkpoint
        q_dim, kv_dim, hidden, inter = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim,
                                        c.hidden_size, c.intermediate_size)

        if activations not in ("q8", "q8_32", "float32"):
            raise ValueError(f"activations must be 'q8', 'q8_32' or 'float32', got {activations!r}")
        panels = activations == "q8" and panels_pay()
        activations = "q8k_q8" if panels else "q8" if activations == "q8_32" else activations

        def quantised(name: str, shape: tuple[int, int], repack: bool = True) -> GgufWeight:
            w = ck.weight(name, shape)
            if not isinstance(w, GgufWeight):
                raise ValueError(f"{ck.path}: {name} is a float tensor; this loader keeps projections as GGUF "
                                 f"blocks (load the Hugging Face folder for float weights)")
            if not repack:
                return w
            if panels and w.out_features % 16 == 0:
                return gguf_repack_panels(w)
            return gguf_repack_lanes(w) if lanes_pay() and activations != "float32" else w

        def copy(param: torch.Tensor, name: str) -> None:
            param.copy_(ck.weight(name, tuple(param.shape)))

        for i, layer in enumerate(self.layers):
            p = f"blk.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            copy(layer.input_layernorm.weight, p + "attn_norm.weight")
            copy(layer.post_attention_layernorm.weight, p + "ffn_norm.weight")
            if c.qk_norm:
                copy(attn.q_norm.weight, p + "attn_q_norm.weight")
                copy(attn.k_norm.weight, p + "attn_k_norm.weight")
            if c.qkv_bias:
                for proj, off, rows in (("q", 0, q_dim), ("k", q_dim, kv_dim), ("v", q_dim + kv_dim, kv_dim)):
                    attn.qkv_proj.bias[off : off + rows].copy_(ck.weight(f"{p}attn_{proj}.bias", (rows,)))
            if c.o_bias:
                copy(attn.o_proj.bias, p + "attn_output.bias")
            if c.mlp_bias:
                raise ValueError(f"{ck.path}: MLP biases are not read from GGUF files")
            qkv = GgufLinear.of(quantised(p + "attn_q.weight", (q_dim, hidden)),
                                quantised(p + "attn_k.weight", (kv_dim, hidden)),
                                quantised(p + "attn_v.weight", (kv_dim, hidden)), activations=activations)
            gate, up = quantised(p + "ffn_gate.weight", (inter, hidden)), quantised(p + "ffn_up.weight", (inter, hidden))
            if gate.qtype == up.qtype:  # one part when it can be
                gate_up = GgufLinear.of(GgufWeight(torch.cat((gate.data, up.data)), gate.qtype, 2 * inter, hidden),
                                        activations=activations)
            else:
                gate_up = GgufLinear.of(gate, up, activations=activations)
            self._stand_ins += layer.set_gguf({
                "qkv": qkv, "gate_up": gate_up,
                "o": GgufLinear.of(quantised(p + "attn_output.weight", (hidden, q_dim)), activations=activations),
                "down": GgufLinear.of(quantised(p + "ffn_down.weight", (hidden, inter)), activations=activations)})
        copy(self.norm.weight, "output_norm.weight")
        # The embedding is read by rows (gguf_rows), so with panels it stays in the file's order and
        # a tied head is a second copy of the table, in panels (a legacy table: the table itself).
        self._embed_gguf = quantised("token_embd.weight", (c.vocab_size, hidden), repack=not panels)
        if self.lm_head is not None:
            head = quantised("output.weight", (c.vocab_size, hidden))
        else:
            head = gguf_repack_panels(self._embed_gguf) if panels else self._embed_gguf
        self._head_packed = GgufLinear.of(head, activations=activations)
        for linear in (self.embed_tokens, self.lm_head):
            if linear is not None:
                linear.weight = dropped(linear.weight)
                self._stand_ins.append(linear.weight)
        self._packed = True
        self._unbind()
        self._rope_tables.clear()

    @property
    def gguf(self) -> bool:
        """Whether the weights are GGUF blocks (``load_gguf``)."""
        return self._embed_gguf is not None

    def hf_tensor_names(self) -> list[str]:
        """The Hugging Face tensor names this model reads (without any file's prefix)."""
        return list(self._hf_layout())

    def _hf_layout(self) -> dict[str, tuple[torch.Tensor, int, int]]:
        # HF name -> (destination parameter, row offset, rows): fused projections take row slices.
        layout: dict[str, tuple[torch.Tensor, int, int]] = {}
        layout["model.embed_tokens.weight"] = (self.embed_tokens.weight, 0, self.vocab_size)
        layout["model.norm.weight"] = (self.norm.weight, 0, self.hidden_size)
        if self.lm_head is not None:
            layout["lm_head.weight"] = (self.lm_head.weight, 0, self.vocab_size)
        for i, layer in enumerate(self.layers):
            layout.update(decoder_layer_hf_layout(layer, self.config, f"model.layers.{i}."))
        return layout

    @torch.no_grad()
    def load_hf_state_dict(self, tensors: Mapping[str, torch.Tensor], source: str = "state dict") -> None:
        """Copy Hugging Face-named tensors (``model.layers.0.self_attn.q_proj.weight``, ...) in.

        ``tensors`` may be any mapping, e.g. a lazy view of safetensors files; each tensor is read
        once and cast to the model's dtype. Missing tensors or wrong shapes raise ValueError.
        """
        # A packed model reads into dense weights again (uninitialised), packed layer by layer below.
        self.unpack(values=False)
        self._unbind()
        pack = self._packable()
        layout = self._hf_layout()
        missing = [name for name in layout if name not in tensors]
        if missing:
            shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
            raise ValueError(f"{source} lacks tensors the {self.config.family} model needs: {shown}")
        # Names left per decoder layer: when a layer's last tensor is in, it is packed (its dense
        # weights freed) before the next is read, so a packed load peaks near the packed size
        # (weights allocated by to_empty are not touched, so not resident, until written).
        left = [0] * self.num_layers
        for name in layout:
            if name.startswith("model.layers."):
                left[int(name.split(".")[2])] += 1
        for name in list(layout):
            param, off, rows = layout.pop(name)  # (no reference left to a packed layer's dense weights)
            src = tensors[name]
            want = (rows, *param.shape[1:])
            if tuple(src.shape) != want:
                raise ValueError(f"{source}: tensor {name} has shape {tuple(src.shape)}, expected {want}")
            param[off : off + rows].copy_(src)
            del src, param
            if pack and name.startswith("model.layers."):
                i = int(name.split(".")[2])
                left[i] -= 1
                if left[i] == 0:
                    self._stand_ins += self.layers[i].pack_weights()
        if pack:
            self._pack_head()
