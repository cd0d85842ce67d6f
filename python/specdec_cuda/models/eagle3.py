"""The EAGLE-3 drafter (Li et al. 2025): one decoder layer on the target's low, middle and high
features, drafting token by token over a KV cache of its own.

At drafter position t (RoPE position t), for a target of hidden size H_t and a drafter of hidden
size H (the same for every published EAGLE-3 drafter but one kind)::

    g_t  = fc([f^{l0}_t ; f^{l1}_t ; f^{l2}_t])                  # [.., 3 H_t] -> [.., H], no bias
    a    = [input_layernorm(embed(x_{t+1})) ; hidden_norm(h)]    # [.., 2H]; h = g_t at step 1
    h    = h + o_proj(attention(q_proj(a), k_proj(a), v_proj(a)))   # residual: h, not a
    h'   = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
    q    = softmax(lm_head(norm(h')))                            # over the draft vocabulary [Vd]

``f^l`` is the target's hidden state at layer ``l``; ``x_{t+1}`` the token after position t (a
target id, embedded by the target's embedding, or by the checkpoint's own ``embed_tokens`` when it
has one); ``h'`` predicts ``x_{t+2}``. The next step, at position t + 1, feeds ``h'`` itself as
``h`` (not through ``fc``) with the token ``x_{t+2}`` drafted: the drafter runs on its own
outputs, which EAGLE-3 trains for ("training-time test", ``train_forward``).

Target layers. ``target_layers`` are this library's hidden-state indices (``models.protocol``):
``l`` = the output of decoder layer ``l``, before the final norm. That is the numbering of
SGLang / SpecForge's ``eagle_aux_hidden_state_layer_ids``; vLLM's speculators configs count from
the embedding instead (their id ``j`` is the output of layer ``j - 1``). The default, EAGLE-3's and
SpecForge's, is ``(1, L // 2 - 1, L - 4)`` for an ``L``-layer target, each clamped to
``[0, L - 1]`` and sorted for targets of fewer than 8 layers (``default_target_layers``).

Draft vocabulary. The LM head covers ``Vd`` target ids (a frequency-ranked subset, as FR-Spec's);
``d2t`` [Vd] int64 holds offsets, target id = draft id + ``d2t[draft id]``, and ``t2d`` [V] bool
marks the target ids in the draft vocabulary (the published layout's buffers). ``target_logits``
scatters draft logits into the target vocabulary, ``draft_vocab.MASKED`` elsewhere (probability
0); verification always runs over the target's whole vocabulary.

Cache. ``Eagle3Cache`` holds one layer's K/V per row; slots ``0 .. lengths[b] - 1`` are committed,
slot ``p`` = position ``p`` computed from the target's own features (``fc(g_p)``) and the committed
token ``x_{p+1}``. A forward (``step``) writes its positions to *scratch* slots past the committed
length and keeps them only on ``commit``: the proposer commits true-feature positions and never the
positions it fed its own outputs, so nothing needs rolling back after a rejected draft. A
single-layer drafter's K/V at a slot depend only on that slot's inputs, so a cached forward equals
one over the whole sequence exactly.

Checkpoints: ``save`` / ``load`` write and read this library's folder (``config.json`` with
``"model_type": "eagle3_drafter"``, ``model.safetensors`` with the published layout's tensor names);
``models.published.load_eagle3`` also reads the EAGLE authors' and SpecForge's folders.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .draft_vocab import MASKED
from .drafter_folder import read_drafter_folder, write_drafter_folder
from .layers import rms_norm
from .rope import apply_rope, cached_cos_sin

MODEL_TYPE = "eagle3_drafter"
FORMAT = 1
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def default_target_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high target layers, ``(1, L // 2 - 1, L - 4)`` (outputs of those
    decoder layers), each clamped to ``[0, L - 1]`` and sorted (targets of fewer than 8 layers)."""
    if num_layers < 1:
        raise ValueError(f"a target has at least one layer, got {num_layers}")
    picks = (1, num_layers // 2 - 1, num_layers - 4)
    return tuple(sorted(min(max(i, 0), num_layers - 1) for i in picks))


@dataclass
class Eagle3Config:
    """The drafter's shape. ``vocab_size`` is the target's; ``draft_vocab_size`` the LM head's rows.

    ``target_layers``: target hidden-state indices read, in the order their features are
    concatenated (None: ``default_target_layers`` of the target it is attached to);
    ``target_hidden_size``: their width (None: ``hidden_size``); ``own_embedding``: the drafter
    carries its own ``embed_tokens`` [V, H] instead of reading the target's. ``rope_scaling``: a
    ``rope_type`` (``default``, ``linear``, ``llama3``) and its parameters, as ``LlamaConfig`` holds
    them.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_layers: tuple[int, ...] | None = None
    target_hidden_size: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    own_embedding: bool = False
    attention_bias: bool = False
    extra: dict = field(default_factory=dict)  # free-form notes (source, training report), saved as is

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "vocab_size", "draft_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Eagle3Config: {name} must be a positive int, got {value!r}")
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"Eagle3Config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"Eagle3Config: head_dim must be even (RoPE), got {self.head_dim}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"Eagle3Config: draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size "
                             f"({self.vocab_size})")
        if self.attention_bias:
            raise ValueError("Eagle3Config: attention_bias is not supported (EAGLE-3's projections have no bias)")
        if self.target_layers is not None:
            self.target_layers = tuple(int(i) for i in self.target_layers)
            if not self.target_layers or min(self.target_layers) < 0:
                raise ValueError(f"Eagle3Config: target_layers must name target layers >= 0, got {self.target_layers}")
        self.rope_scaling = dict(self.rope_scaling or {"rope_type": "default"})
        kind = self.rope_scaling.setdefault("rope_type", self.rope_scaling.pop("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"Eagle3Config: rope_type {kind!r} is not supported ({', '.join(SUPPORTED_ROPE_TYPES)})")

    @property
    def num_target_layers(self) -> int:
        """How many target layers ``fc`` fuses (3 unless ``target_layers`` says otherwise)."""
        return 3 if self.target_layers is None else len(self.target_layers)

    @classmethod
    def for_target(cls, target, draft_vocab_size: int | None = None, **overrides) -> "Eagle3Config":
        """A drafter shaped after ``target`` (the built-in model or ``HFCausalLM``): its hidden
        size, attention shape, MLP width, RMSNorm epsilon and RoPE, its vocabulary (the draft
        vocabulary: all of it unless ``draft_vocab_size``), EAGLE-3's default target layers."""
        c = _target_llama_config(target)
        kw = dict(hidden_size=int(target.hidden_size), intermediate_size=c.intermediate_size,
                  num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                  head_dim=c.head_dim, vocab_size=int(target.vocab_size),
                  draft_vocab_size=int(draft_vocab_size or target.vocab_size),
                  target_layers=default_target_layers(int(target.num_layers)), rms_norm_eps=c.rms_norm_eps,
                  rope_theta=c.rope_theta, rope_scaling=dict(c.rope_scaling))
        kw.update(overrides)
        return cls(**kw)


def _target_llama_config(target):
    """The target's decoder config as a ``LlamaConfig`` (a transformers model's read from its config)."""
    from .config import LlamaConfig

    config = getattr(target, "config", None)
    if isinstance(config, LlamaConfig):
        return config
    if config is not None and hasattr(config, "to_dict"):
        return LlamaConfig.from_hf_dict(config.to_dict(), source=type(getattr(target, "model", target)).__name__)
    raise TypeError(f"cannot read the decoder config of a {type(target).__name__} (expected the built-in model "
                    f"or an HFCausalLM)")


def draft_vocab_from_counts(counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The published layout's vocabulary maps for the ``size`` most frequent target ids.

    Shape: counts [V] (token counts in the training text; ties go to the lower id) -> d2t [size]
    int64 (draft id ``d`` is target id ``ids[d] = d + d2t[d]``, ``ids`` sorted) and t2d [V] bool."""
    counts = torch.as_tensor(counts)
    if counts.dim() != 1 or counts.numel() == 0 or counts.dtype == torch.bool or counts.is_complex():
        raise ValueError(f"counts must be a non-empty 1-D tensor of token counts, got {counts.dtype} "
                         f"{tuple(counts.shape)}")
    V = counts.numel()
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= V:
        raise ValueError(f"a draft vocabulary of {size!r} tokens: it must hold 1 .. {V} (the vocabulary)")
    # Stable sort on -count: equal counts keep id order, so ties go to the lower id.
    order = torch.sort(-counts.to(torch.float64), stable=True).indices[:size]
    ids = order.sort().values.to(torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size, dtype=torch.int64), t2d


class Eagle3Cache:
    """The drafter's K/V per row (see the module docstring).

    Shape: keys / values [B, kv_heads, capacity + 1, D] (slot ``capacity`` is a trash slot that
    padding columns write to and no query reads); lengths [B] int64, the committed slots per row.
    ``max_committed`` is ``max(lengths)`` on the host (it bounds the slots a forward attends over).
    """

    def __init__(self, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
                 device) -> None:
        if batch < 1 or capacity < 1:
            raise ValueError(f"Eagle3Cache: batch ({batch}) and capacity ({capacity}) must be positive")
        shape = (batch, kv_heads, capacity + 1, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int64, device=device)
        self.capacity = capacity
        self.max_committed = 0

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def commit(self, num_kept: torch.Tensor) -> None:
        """Keep the first ``num_kept[b]`` scratch slots of each row (the last forward wrote them at
        offset 0). Shape: num_kept [B] int64 >= 0."""
        new = self.lengths + num_kept
        low, high = torch.stack([num_kept.min(), new.max()]).tolist()  # the one host sync of this call
        if low < 0 or high > self.capacity:
            raise ValueError(f"Eagle3Cache.commit: num_kept must be >= 0 and the new lengths at most the capacity "
                             f"{self.capacity}; got num_kept from {low}, longest row {high}")
        self.lengths = new
        self.max_committed = int(high)


class _RMSNorm(nn.Module):
    """RMSNorm with a trainable weight (``layers.rms_norm``: Hugging Face's order in half precision)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Eagle3Attention(nn.Module):
    """The midlayer's projections: q / k / v read the 2H-wide ``[embedding ; hidden]`` input."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        H, D = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(2 * H, c.num_attention_heads * D, bias=False)
        self.k_proj = nn.Linear(2 * H, c.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(2 * H, c.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * D, H, bias=False)


class Eagle3MLP(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """The "midlayer" (module docstring): two input norms, attention, post-attention norm, MLP."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Eagle3Attention(c)
        self.post_attention_layernorm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Eagle3MLP(c)


class Eagle3Drafter(nn.Module):
    """The drafter's own weights, named as the published layout names them; the target's embedding
    is bound with ``attach`` (unless the drafter has its own).

    Example::

        drafter = Eagle3Drafter.load(folder).attach(target)
        cache = drafter.new_cache(batch, capacity)
        g = drafter.features(hidden_states)                    # {layer: [B, n, H_t]} -> [B, n, H]
        h = drafter.step(g, next_tokens, positions, cache)     # [B, n, H], K/V in scratch slots
        cache.commit(num_new)                                  # keep the true-feature positions
        logits = drafter.target_logits(h[:, -1])               # [B, V], MASKED outside the draft vocab
    """

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        c = self.config = config
        H = c.hidden_size
        self.fc = nn.Linear(c.num_target_layers * c.target_hidden_size, H, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = _RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        # Default draft vocabulary: target ids 0 .. Vd - 1 (all of them when Vd = V).
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[: c.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        self.embed_tokens = nn.Embedding(c.vocab_size, H) if c.own_embedding else None
        if self.embed_tokens is not None:
            self.embed_tokens.weight.requires_grad_(False)  # the target's embedding space: never trained
        self._embed: torch.Tensor | None = None  # the target's [V, H] embedding (bound by attach, not ours)
        self._inv_freq: dict = {}
        self._vocab: tuple | None = None  # (key of d2t's state, target ids [Vd], identity?) cached

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        self._inv_freq, self._vocab = {}, None
        if self._embed is not None:
            self._embed = self._embed.to(device=self.device)
        return result

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def random(cls, config: Eagle3Config, seed: int = 0, std: float = 0.02, d2t: torch.Tensor | None = None,
               t2d: torch.Tensor | None = None) -> "Eagle3Drafter":
        """Random weights (projections ~ N(0, std^2), unit norms); ``d2t`` / ``t2d`` (optional)
        set the draft vocabulary (``draft_vocab_from_counts``)."""
        model = cls(config)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2 and not name.startswith("embed_tokens"):
                    p.copy_(torch.randn(p.shape, generator=g) * std)
            if model.embed_tokens is not None:
                model.embed_tokens.weight.copy_(torch.randn(model.embed_tokens.weight.shape, generator=g))
        if d2t is not None or t2d is not None:
            model.set_draft_vocab(d2t, t2d)
        return model

    def set_draft_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> "Eagle3Drafter":
        """Set the draft vocabulary maps (module docstring); ValueError if they disagree.
        Shape: d2t [Vd] integer offsets; t2d [V] bool."""
        c = self.config
        d2t, t2d = torch.as_tensor(d2t), torch.as_tensor(t2d)
        if d2t.shape != (c.draft_vocab_size,) or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
            raise ValueError(f"d2t must be an integer tensor of shape ({c.draft_vocab_size},), got {d2t.dtype} "
                             f"{tuple(d2t.shape)}")
        if t2d.shape != (c.vocab_size,):
            raise ValueError(f"t2d must have shape ({c.vocab_size},), got {tuple(t2d.shape)}")
        ids = torch.arange(c.draft_vocab_size) + d2t.cpu().to(torch.int64)
        if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
            raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {c.vocab_size}): "
                             f"{int(ids.min())} .. {int(ids.max())}")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("d2t maps two draft ids to the same target id")
        t2d_cpu = t2d.cpu().to(torch.bool)
        if int(t2d_cpu.sum()) != c.draft_vocab_size or not bool(t2d_cpu[ids].all()):
            raise ValueError("t2d does not mark exactly the target ids that d2t maps the draft vocabulary to")
        with torch.no_grad():
            self.d2t.copy_(d2t.to(torch.int64))
            self.t2d.copy_(t2d_cpu)
        self._vocab = None
        return self

    def attach(self, target) -> "Eagle3Drafter":
        """Check the sizes against ``target`` (the built-in model or ``HFCausalLM``), bind its token
        embedding (read, never trained; unless the drafter has its own), resolve default target
        layers, and move to the target's device and dtype. ValueError naming what does not fit."""
        c = self.config
        if int(target.vocab_size) != c.vocab_size:
            raise ValueError(f"the drafter is for a vocabulary of {c.vocab_size} tokens, the target has "
                             f"{target.vocab_size}")
        if int(target.hidden_size) != c.target_hidden_size:
            raise ValueError(f"the drafter reads target features of width {c.target_hidden_size}, the target's hidden "
                             f"size is {target.hidden_size}")
        layers = int(target.num_layers)
        if c.target_layers is None:
            c.target_layers = default_target_layers(layers)
        bad = [i for i in c.target_layers if not 0 <= i < layers]
        if bad:
            raise ValueError(f"the drafter reads target layers {bad}, but the target has {layers} layers "
                             f"(0 .. {layers - 1})")
        embed = None
        if self.embed_tokens is None:
            embed = target_embedding(target)
            if tuple(embed.shape) != (c.vocab_size, c.hidden_size):
                raise ValueError(f"the target's embedding is {tuple(embed.shape)}, the drafter needs "
                                 f"({c.vocab_size}, {c.hidden_size}) (a drafter of another width carries its own "
                                 f"embed_tokens)")
        dtype = target.dtype if embed is None else embed.dtype
        self.to(device=target.device, dtype=dtype)
        self._embed = None if embed is None else embed.detach()
        return self

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """The distinct target layers the drafter reads (what a proposer asks the loop for)."""
        if self.config.target_layers is None:
            raise RuntimeError("the drafter's target layers are the default for its target: call attach(target)")
        return tuple(sorted(set(self.config.target_layers)))

    def save(self, folder) -> Path:
        """``config.json`` + ``model.safetensors`` in ``folder``, written beside it and renamed into
        place (a reader never sees half a checkpoint). Float weights are stored as float32."""
        config = asdict(self.config)
        config["target_layers"] = None if self.config.target_layers is None else list(self.config.target_layers)
        config.update(model_type=MODEL_TYPE, format=FORMAT)
        return write_drafter_folder(folder, config, self.state_dict())

    @classmethod
    def load(cls, folder) -> "Eagle3Drafter":
        """A drafter written by ``save``; float32 on the CPU until ``attach``. (``models.published.
        load_eagle3`` also reads the published EAGLE-3 layouts.)"""
        raw, tensors = read_drafter_folder(folder, MODEL_TYPE, FORMAT, "EAGLE-3 drafter")
        return cls(Eagle3Config(**raw)).load_checked(tensors, str(folder))

    def load_checked(self, tensors: dict[str, torch.Tensor], source: str) -> "Eagle3Drafter":
        """Copy ``tensors`` (this module's state-dict names) in, float ones as float32; ValueError
        naming missing, unexpected or misshapen tensors, or vocabulary maps that disagree."""
        expected = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        missing = sorted(set(expected) - set(tensors))
        unexpected = sorted(set(tensors) - set(expected))
        if missing or unexpected:
            raise ValueError(f"{source}: the drafter's tensors do not match its config (missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]})")
        wrong = [f"{k} {tuple(tensors[k].shape)} != {s}" for k, s in expected.items() if tuple(tensors[k].shape) != s]
        if wrong:
            raise ValueError(f"{source}: tensor shapes do not match the config: {wrong[:3]}")
        state = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items() if k not in ("d2t", "t2d")}
        self.load_state_dict(state, strict=False)
        self.set_draft_vocab(tensors["d2t"], tensors["t2d"])
        return self

    # -- the pieces of a forward --------------------------------------------------------------

    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id, ``arange(Vd) + d2t``. Shape: [Vd] int64."""
        return self._vocab_maps()[0]

    def _vocab_maps(self) -> tuple[torch.Tensor, bool]:
        key = (self.d2t._version, self.d2t.data_ptr(), self.d2t.device)
        if self._vocab is None or self._vocab[0] != key:
            ids = torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t
            identity = self.config.draft_vocab_size == self.config.vocab_size and not bool(self.d2t.any())
            self._vocab = (key, ids, identity)
        return self._vocab[1], self._vocab[2]

    def draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 for ids outside the draft vocabulary (training labels).
        Shape: [...] int64 -> [...] int64."""
        table = torch.full((self.config.vocab_size,), -1, dtype=torch.int64, device=self.d2t.device)
        table[self.target_ids()] = torch.arange(self.config.draft_vocab_size, device=self.d2t.device)
        return table[target_ids.to(self.d2t.device)]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embeddings of target ids. Shape: [...] int64 -> [..., H] in the drafter's dtype."""
        if self.embed_tokens is not None:
            return self.embed_tokens(tokens).to(self.dtype)
        if self._embed is None:
            raise RuntimeError("the drafter has no embedding: call attach(target) first")
        return F.embedding(tokens, self._embed).to(self.dtype)

    def features(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        """``fc`` of the target's features at ``target_layers``, concatenated low to high.
        Shape: hidden_states layer -> [B, n, H_t]; returns g [B, n, H]."""
        layers = self.config.target_layers
        if layers is None:
            raise RuntimeError("the drafter's target layers are the default for its target: call attach(target)")
        missing = [i for i in layers if i not in hidden_states]
        if missing:
            raise ValueError(f"features: the target's hidden states of layers {missing} are missing")
        return self.fc(torch.cat([hidden_states[i].to(self.dtype) for i in layers], dim=-1))

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [B, n, 1, D] at absolute ``positions`` [B, n] (``models.rope``)."""
        return cached_cos_sin(self._inv_freq, self.config, positions, self.dtype)

    def project(self, hidden: torch.Tensor, tokens: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The attention inputs at n positions: RoPE'd queries and keys, values.

        Shape: hidden [B, n, H]; tokens / positions [B, n] int64 -> q [B, heads, n, D],
        k / v [B, kv_heads, n, D]."""
        c, layer = self.config, self.midlayer
        B, n, _ = hidden.shape
        a = torch.cat([layer.input_layernorm(self.embed(tokens)), layer.hidden_norm(hidden.to(self.dtype))], dim=-1)
        attn = layer.self_attn
        q = attn.q_proj(a).view(B, n, c.num_attention_heads, c.head_dim)
        k = attn.k_proj(a).view(B, n, c.num_key_value_heads, c.head_dim)
        v = attn.v_proj(a).view(B, n, c.num_key_value_heads, c.head_dim)
        cos, sin = self.rope(positions)
        return apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2), v.transpose(1, 2)

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residuals after attention: h + o_proj(attended), then the MLP's.
        Shape: hidden [B, n, H]; attended [B, heads, n, D] -> h' [B, n, H]."""
        B, _, n, _ = attended.shape
        layer = self.midlayer
        h = hidden.to(self.dtype) + layer.self_attn.o_proj(attended.transpose(1, 2).reshape(B, n, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``lm_head(norm(h'))`` over the draft vocabulary. Shape: [..., H] -> [..., Vd]."""
        return self.lm_head(self.norm(h))

    def target_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The draft logits scattered into the target vocabulary, ``MASKED`` (probability 0) at ids
        outside the draft vocabulary. Shape: [..., H] -> [..., V]."""
        return self.to_target_vocab(self.logits(h))

    def to_target_vocab(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Shape: [..., Vd] -> [..., V] (``target_logits`` of logits already computed)."""
        ids, identity = self._vocab_maps()
        if identity:
            return draft_logits
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), MASKED)
        return out.index_copy_(-1, ids, draft_logits)

    # -- inference ----------------------------------------------------------------------------

    def new_cache(self, batch: int, capacity: int) -> Eagle3Cache:
        c = self.config
        return Eagle3Cache(batch, c.num_key_value_heads, capacity, c.head_dim, self.dtype, self.device)

    @torch.no_grad()
    def step(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache: Eagle3Cache,
             offset: int = 0, scratch_mask: torch.Tensor | None = None,
             num_new: torch.Tensor | None = None) -> torch.Tensor:
        """The drafter over ``n`` new positions per row, on top of ``cache``.

        New position ``i`` of row ``b`` writes its K/V to scratch slot ``lengths[b] + offset + i``
        (``cache.lengths`` does not move; ``cache.commit`` keeps slots written at offset 0). It
        sees the row's committed slots and, of the scratch slots ``lengths[b] .. lengths[b] +
        offset + n - 1``, those ``scratch_mask`` allows, and always itself. Scratch slots below
        ``offset`` must have been written by earlier forwards since the last commit.

        Shape:
            hidden: [B, n, H] (``fc`` features, or the drafter's own earlier outputs).
            tokens: [B, n] int64, target ids: the token after each position.
            positions: [B, n] int64, RoPE positions.
            scratch_mask: [B, n, offset + n] bool, or None: every earlier scratch slot and, among
                the new positions, the causal ones (a chain).
            num_new: [B] int64 or None. Columns ``i >= num_new[b]`` are padding: they write to the
                trash slot. None: every column is real, and the slots must fit the capacity.
            Returns h' [B, n, H] (before ``norm``).
        """
        B, n, _ = hidden.shape
        total = offset + n
        if tokens.shape != (B, n) or positions.shape != (B, n):
            raise ValueError(f"step: tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)} must be "
                             f"{(B, n)} like hidden's first dimensions")
        if scratch_mask is not None and scratch_mask.shape != (B, n, total):
            raise ValueError(f"step: scratch_mask must have shape {(B, n, total)}, got {tuple(scratch_mask.shape)}")
        if cache.batch_size != B:
            raise ValueError(f"step: {B} rows, but the cache was made for {cache.batch_size}")
        if num_new is None and cache.max_committed + total > cache.capacity:
            raise ValueError(f"Eagle3Cache overflow: a row holds {cache.max_committed} committed slots and this forward "
                             f"writes up to scratch slot {total}, but the capacity is {cache.capacity}")
        q, k, v = self.project(hidden, tokens, positions)
        steps = torch.arange(n, device=hidden.device)
        slots = cache.lengths[:, None] + offset + steps  # [B, n]
        if num_new is not None:  # padding columns (and anything past the capacity) to the trash slot
            slots = torch.where(steps[None, :] < num_new[:, None], slots, cache.capacity).clamp(max=cache.capacity)
        c = self.config
        index = slots[:, None, :, None].expand(B, c.num_key_value_heads, n, c.head_dim)
        cache.keys.scatter_(2, index, k)
        cache.values.scatter_(2, index, v)
        span = min(cache.max_committed + total, cache.capacity)  # the trash slot is never attended
        rel = torch.arange(span, device=hidden.device)[None, :] - cache.lengths[:, None]  # [B, span]: scratch index
        own = rel[:, None, :] == (offset + steps)[None, :, None]  # [B, n, span]
        if scratch_mask is None:
            visible = rel[:, None, :] <= (offset + steps)[None, :, None]  # committed, earlier scratch, causal
        else:
            in_scratch = (rel >= 0) & (rel < total)
            col = rel.clamp(0, total - 1)[:, None, :].expand(B, n, span)
            visible = (rel < 0)[:, None, :] | (in_scratch[:, None, :] & scratch_mask.to(torch.bool).gather(2, col))
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        mask = torch.where((visible | own)[:, None], zero, torch.full((), float("-inf"), dtype=q.dtype, device=q.device))
        out = F.scaled_dot_product_attention(q, cache.keys[:, :, :span], cache.values[:, :, :span], attn_mask=mask,
                                             enable_gqa=c.num_attention_heads != c.num_key_value_heads)
        return self.finish(hidden, out)

    # -- training -----------------------------------------------------------------------------

    def train_forward(self, feats: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """EAGLE-3's training-time test over whole sequences: ``steps`` chained drafter steps at
        every position, gradients through all of them.

        Step 0 is teacher-forced: at position t it reads ``fc(feats[:, t])`` and ``tokens[:, t + 1]``.
        Step i > 0 at position t reads step i - 1's output at t (not through ``fc``) and
        ``tokens[:, t + 1 + i]``: the chain a drafting step runs from root position t + 1, fed the
        true tokens. Its query sees step 0's keys at positions 0 .. t (what the drafter's cache
        holds at inference: true features) and the keys of steps 1 .. i at the same t (the chain
        drafted so far), itself included. RoPE: step i at position t is at position t + i, where
        inference runs the chain's i-th step after the committed slot t.

        Shape: feats [B, T, F] (F = ``len(target_layers) * target_hidden_size``: the target's
        hidden states at ``target_layers`` concatenated in that order, e.g. ``torch.cat([h[l] for l
        in target_layers], -1)``); tokens [B, T] int64 target ids; T >= steps + 2. Returns ``steps``
        tensors, entry i [B, T - 2 - i, Vd]: the draft-vocabulary logits of step i at positions
        t = 0 .. T - 3 - i, whose label is ``tokens[:, t + 2 + i]``, i.e. entry i lines up with
        ``tokens[:, 2 + i:]`` (``draft_ids`` maps those labels to draft ids, -1 outside the draft
        vocabulary; padding at the end of a row only reaches positions after it).
        """
        c = self.config
        B, T = tokens.shape
        if feats.dim() != 3 or feats.shape[:2] != (B, T) or feats.shape[-1] != self.fc.in_features:
            raise ValueError(f"train_forward: feats must be [B, T, {self.fc.in_features}] with tokens' [B, T] = "
                             f"{(B, T)}, got {tuple(feats.shape)}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"train_forward: steps must be an int >= 1, got {steps!r}")
        if T < steps + 2:
            raise ValueError(f"train_forward: {steps} steps need sequences of at least {steps + 2} tokens, got {T}")
        n0 = T - 2
        KV, G, D = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        scale = 1.0 / math.sqrt(D)
        base = torch.arange(T, device=tokens.device)
        causal = base[None, :n0] <= base[:n0, None]  # [n0, n0]: step 0's keys at positions <= t
        h = self.fc(feats[:, :n0].to(self.dtype))  # [B, n0, H]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        out: list[torch.Tensor] = []
        for i in range(steps):
            n = T - 2 - i
            q, k, v = self.project(h[:, :n], tokens[:, 1 + i: 1 + i + n], (base[:n] + i).expand(B, n))
            keys.append(k)
            values.append(v)
            qg = q.reshape(B, KV, G, n, D)  # query head g * ... of kv head k: SDPA's grouping
            scores = [torch.einsum("bkgnd,bksd->bkgns", qg, keys[0]).masked_fill(~causal[:n], float("-inf"))]
            scores += [torch.einsum("bkgnd,bknd->bkgn", qg, keys[j][:, :, :n])[..., None] for j in range(1, i + 1)]
            s = torch.cat(scores, dim=-1) * scale  # [B, KV, G, n, n0 + i]
            w = torch.softmax(s.float() if s.dtype in (torch.float16, torch.bfloat16) else s, dim=-1).to(q.dtype)
            attended = torch.einsum("bkgns,bksd->bkgnd", w[..., :n0], values[0])
            for j in range(1, i + 1):
                attended = attended + w[..., n0 + j - 1, None] * values[j][:, :, None, :n]
            h = self.finish(h[:, :n], attended.reshape(B, KV * G, n, D))
            out.append(self.logits(h))
        return out


def target_embedding(target) -> torch.Tensor:
    """The token embedding [V, H] of the built-in model (a dense copy when it keeps it only in
    packed panels or GGUF blocks) or of an ``HFCausalLM``."""
    if hasattr(target, "embedding_weight"):
        return target.embedding_weight()
    model = getattr(target, "model", None)
    if model is not None and hasattr(model, "get_input_embeddings"):
        return model.get_input_embeddings().weight
    raise TypeError(f"cannot find the token embedding of a {type(target).__name__} (expected the built-in model or "
                    f"an HFCausalLM)")


__all__: Sequence[str] = ("Eagle3Cache", "Eagle3Config", "Eagle3Drafter", "default_target_layers",
                          "draft_vocab_from_counts", "target_embedding")
