"""A trained exit adapter (Kangaroo, Liu et al. 2024) for ``method="layer_skip"``: a small
network between the target's first ``exit_layer`` decoder layers and its own final norm and LM head.

An early exit through the target's head alone agrees with the full model at almost no position
until the last layers (Qwen2.5-Coder-1.5B, 28 layers: argmax agreement 0.5% after 8 layers, 11%
after 20, 50% after 24), because the head reads the last layer's residual stream. The adapter maps the
stream after layer ``exit_layer - 1`` to one the head can read, so a draft pass costs the first
layers, the adapter and the head (over a draft vocabulary), not most of a forward.

At position t, with s_t the residual stream after target layer ``exit_layer - 1``::

    a    = s_t + o_proj(attention(q_proj(n), k_proj(n), v_proj(n))),  n = input_layernorm(s)
    s'_t = a + down_proj(silu(gate_proj(m)) * up_proj(m)),             m = post_attention_layernorm(a)
    q    = softmax(lm_head(norm(s'_t)))            # the target's frozen norm and head

Attention is causal over the adapter's own K/V of the earlier positions (RoPE at the absolute
position, the target's rotary base), grouped-query with the target's head layout. Kangaroo's
adapter is attention and two norms only: ``intermediate_size = 0`` builds that; the default adds a
small MLP, which measured better on the 1.5B (a pilot after 8 layers, the same 43k teacher-forced
tokens: held-out top-1 26% without, 45% with a 2048-wide MLP; ``train exit`` on 384k tokens:
54.5%). ``o_proj`` and ``down_proj`` start at zero, so an untrained adapter is the plain early
exit.

Draft vocabulary. ``draft_ids`` [Vd] (sorted target ids) are the head rows the adapter was trained
over (the ids the target chose most often in its training text); the proposer runs the head over
those rows only (``LlamaModel.vocab_subset``), every other token probability 0 in the draft
(verification still runs the whole vocabulary, so output is unchanged).

Cache. The adapter keeps one layer's K/V per row in an ``Eagle3Cache`` (scratch slots past the
committed length, kept on ``commit``): the proposer commits only positions whose stream came from
a verification (the target's own layers over committed tokens), so a rejected draft needs no
rollback. Its K/V at a slot depend only on that slot's stream, so a cached forward equals one over
the whole sequence (``forward_full``, the training path and the tests' reference).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .drafter_folder import read_drafter_folder, write_drafter_folder
from .eagle3 import Eagle3Cache, _RMSNorm, _target_llama_config
from .rope import apply_rope, cached_cos_sin

MODEL_TYPE = "exit_adapter"
FORMAT = 1
DEFAULT_EXIT_SHARE = 0.3  # the default exit: after this share of the target's layers (8 of 28)
DEFAULT_INTERMEDIATE = 2048  # the default MLP width


def default_exit_layer(num_layers: int) -> int:
    """The exit layer ``train`` picks when none is given: about 30% of the depth, at least 1."""
    return max(1, min(num_layers - 1, round(DEFAULT_EXIT_SHARE * num_layers)))


@dataclass
class ExitAdapterConfig:
    """The adapter's shape. ``exit_layer``: the target layers the draft runs (0 .. exit_layer - 1);
    ``num_target_layers`` / ``vocab_size``: the target's, checked on ``attach``;
    ``intermediate_size``: the MLP's width, 0 for none (Kangaroo's); ``draft_vocab_size``: the head
    rows drafted over."""

    exit_layer: int
    num_target_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    extra: dict = field(default_factory=dict)  # free-form notes (training report, fingerprint), saved as is

    def __post_init__(self) -> None:
        for name in ("exit_layer", "num_target_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "vocab_size", "draft_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ExitAdapterConfig: {name} must be a positive int, got {value!r}")
        if isinstance(self.intermediate_size, bool) or not isinstance(self.intermediate_size, int) \
                or self.intermediate_size < 0:
            raise ValueError(f"ExitAdapterConfig: intermediate_size must be an int >= 0, got "
                             f"{self.intermediate_size!r}")
        if self.exit_layer > self.num_target_layers:  # equal: after every layer (the tests' one-layer targets)
            raise ValueError(f"ExitAdapterConfig: exit_layer ({self.exit_layer}) exceeds the target's "
                             f"{self.num_target_layers} layers")
        if self.num_attention_heads % self.num_key_value_heads or self.head_dim % 2:
            raise ValueError("ExitAdapterConfig: heads must be a multiple of kv heads and head_dim even")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"ExitAdapterConfig: draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size "
                             f"({self.vocab_size})")
        self.rope_scaling = dict(self.rope_scaling or {"rope_type": "default"})

    @classmethod
    def for_target(cls, target, exit_layer: int | None = None, intermediate_size: int = DEFAULT_INTERMEDIATE,
                   draft_vocab_size: int | None = None) -> "ExitAdapterConfig":
        """An adapter shaped after ``target``'s attention (heads, RoPE, norm epsilon) at
        ``exit_layer`` (default ``default_exit_layer``)."""
        c = _target_llama_config(target)
        layers = int(target.num_layers)
        return cls(exit_layer=default_exit_layer(layers) if exit_layer is None else int(exit_layer),
                   num_target_layers=layers, hidden_size=int(target.hidden_size),
                   num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                   head_dim=c.head_dim, intermediate_size=int(intermediate_size), vocab_size=int(target.vocab_size),
                   draft_vocab_size=int(draft_vocab_size or target.vocab_size), rms_norm_eps=c.rms_norm_eps,
                   rope_theta=c.rope_theta, rope_scaling=dict(c.rope_scaling))


class ExitAdapter(nn.Module):
    """The adapter's weights (module docstring).

    Example::

        adapter = ExitAdapter.load(folder).attach(target)
        cache = adapter.new_cache(batch, capacity)
        s2 = adapter.step(s, positions, cache)     # [B, n, H] stream after layer exit_layer - 1 -> [B, n, H]
        cache.commit(num_new)                      # keep the positions whose stream was the target's
    """

    def __init__(self, config: ExitAdapterConfig) -> None:
        super().__init__()
        c = self.config = config
        H, D = c.hidden_size, c.head_dim
        self.input_layernorm = _RMSNorm(H, c.rms_norm_eps)
        self.q_proj = nn.Linear(H, c.num_attention_heads * D, bias=False)
        self.k_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * D, H, bias=False)
        if c.intermediate_size:
            self.post_attention_layernorm = _RMSNorm(H, c.rms_norm_eps)
            self.gate_proj = nn.Linear(H, c.intermediate_size, bias=False)
            self.up_proj = nn.Linear(H, c.intermediate_size, bias=False)
            self.down_proj = nn.Linear(c.intermediate_size, H, bias=False)
        self.register_buffer("draft_ids", torch.arange(c.draft_vocab_size, dtype=torch.int64))
        self._inv_freq: dict = {}  # rope.cached_inv_freq's, per (device, precision)

    @classmethod
    def initial(cls, config: ExitAdapterConfig, seed: int = 0, std: float = 0.02,
                draft_ids: torch.Tensor | None = None) -> "ExitAdapter":
        """Random input projections, zero output projections (so it starts as the plain early
        exit), unit norms; ``draft_ids`` sets the draft vocabulary (sorted target ids)."""
        model = cls(config)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.copy_(torch.zeros(p.shape) if name in ("o_proj.weight", "down_proj.weight")
                            else torch.randn(p.shape, generator=g) * std)
        if draft_ids is not None:
            model.set_draft_ids(draft_ids)
        return model

    def set_draft_ids(self, ids: torch.Tensor) -> "ExitAdapter":
        c = self.config
        ids = torch.as_tensor(ids).to(torch.int64).cpu()
        if ids.shape != (c.draft_vocab_size,) or (ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all())) \
                or int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
            raise ValueError(f"draft_ids must be {c.draft_vocab_size} increasing target ids in [0, {c.vocab_size})")
        with torch.no_grad():
            self.draft_ids.copy_(ids)
        return self

    def attach(self, target) -> "ExitAdapter":
        """Check the shapes against ``target`` and move to its device, in float32 (the built-in
        model's packed and GGUF paths carry a float32 stream) or the target's dtype otherwise."""
        c = self.config
        mismatched = [(name, want, got) for name, want, got in (
            ("layers", c.num_target_layers, int(target.num_layers)), ("hidden size", c.hidden_size,
                                                                       int(target.hidden_size)),
            ("vocabulary", c.vocab_size, int(target.vocab_size))) if want != got]
        if mismatched:
            raise ValueError("the exit adapter was trained for another target: "
                             + ", ".join(f"{n} {w} (target {g})" for n, w, g in mismatched))
        dtype = torch.float32 if target.dtype in (torch.bfloat16, torch.float16) and target.device.type == "cpu" \
            else target.dtype
        return self.to(device=target.device, dtype=dtype)

    @property
    def device(self) -> torch.device:
        return self.q_proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q_proj.weight.dtype

    # -- forward ------------------------------------------------------------------------------

    def _qkv(self, s: torch.Tensor, positions: torch.Tensor):
        """RoPE'd q [B, heads, n, D], k / v [B, kv_heads, n, D] of stream s [B, n, H] at positions [B, n]."""
        c = self.config
        B, n, _ = s.shape
        x = self.input_layernorm(s)
        q = self.q_proj(x).view(B, n, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(B, n, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).view(B, n, c.num_key_value_heads, c.head_dim)
        cos, sin = cached_cos_sin(self._inv_freq, self.config, positions, self.dtype)
        return apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2), v.transpose(1, 2)

    def _finish(self, s: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        B, _, n, _ = attended.shape
        a = s + self.o_proj(attended.transpose(1, 2).reshape(B, n, -1))
        if not self.config.intermediate_size:
            return a
        m = self.post_attention_layernorm(a)
        return a + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))

    def forward_full(self, s: torch.Tensor) -> torch.Tensor:
        """Whole sequences at positions 0 .. T - 1, causal (training; the cached path's reference).
        Shape: s [B, T, H] -> [B, T, H]."""
        c = self.config
        B, T, _ = s.shape
        s = s.to(self.dtype)
        q, k, v = self._qkv(s, torch.arange(T, device=s.device).expand(B, T))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=c.num_attention_heads != c.num_key_value_heads)
        return self._finish(s, out)

    def new_cache(self, batch: int, capacity: int) -> Eagle3Cache:
        c = self.config
        return Eagle3Cache(batch, c.num_key_value_heads, capacity, c.head_dim, self.dtype, self.device)

    @torch.no_grad()
    def step(self, s: torch.Tensor, positions: torch.Tensor, cache: Eagle3Cache, offset: int = 0,
             num_new: torch.Tensor | None = None) -> torch.Tensor:
        """The adapter over ``n`` new positions per row on top of ``cache``: position ``i`` of row
        ``b`` writes its K/V to scratch slot ``lengths[b] + offset + i`` and sees the committed
        slots, the scratch slots before it (written since the last commit) and itself.

        Shape: s [B, n, H] (any float dtype; returned in it); positions [B, n] int64; num_new [B]
        or None: columns ``i >= num_new[b]`` are padding and write to the trash slot."""
        c = self.config
        B, n, _ = s.shape
        total = offset + n
        if positions.shape != (B, n) or cache.batch_size != B:
            raise ValueError(f"step: positions {tuple(positions.shape)} and the cache's {cache.batch_size} rows must "
                             f"match s's {(B, n)}")
        if num_new is None and cache.max_committed + total > cache.capacity:
            raise ValueError(f"exit adapter cache overflow: {cache.max_committed} committed slots + {total} new, "
                             f"capacity {cache.capacity}")
        dtype = s.dtype
        s = s.to(self.dtype)
        q, k, v = self._qkv(s, positions)
        steps = torch.arange(n, device=s.device)
        slots = cache.lengths[:, None] + offset + steps  # [B, n]
        if num_new is not None:
            slots = torch.where(steps[None, :] < num_new[:, None], slots, cache.capacity).clamp(max=cache.capacity)
        index = slots[:, None, :, None].expand(B, c.num_key_value_heads, n, c.head_dim)
        cache.keys.scatter_(2, index, k)
        cache.values.scatter_(2, index, v)
        span = min(cache.max_committed + total, cache.capacity)  # the trash slot is never attended
        if B == 1 and n == 1 and num_new is None:  # the drafting step: every slot up to its own
            keys, values = cache.keys[:, :, : int(slots[0, 0]) + 1], cache.values[:, :, : int(slots[0, 0]) + 1]
            mask = None
        else:
            keys, values = cache.keys[:, :, :span], cache.values[:, :, :span]
            rel = torch.arange(span, device=s.device)[None, :] - cache.lengths[:, None]  # [B, span]
            visible = rel[:, None, :] <= (offset + steps)[None, :, None]  # [B, n, span]
            zero = torch.zeros((), dtype=q.dtype, device=q.device)
            mask = torch.where(visible[:, None], zero, torch.full((), float("-inf"), dtype=q.dtype, device=q.device))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                             enable_gqa=c.num_attention_heads != c.num_key_value_heads)
        return self._finish(s, out).to(dtype)

    # -- checkpoints --------------------------------------------------------------------------

    def save(self, folder) -> Path:
        """``config.json`` + ``model.safetensors`` (float32), written beside ``folder`` and renamed
        into place."""
        return write_drafter_folder(folder, dict(asdict(self.config), model_type=MODEL_TYPE, format=FORMAT),
                                    self.state_dict())

    @classmethod
    def load(cls, folder) -> "ExitAdapter":
        """An adapter written by ``save``; float32 on the CPU until ``attach``."""
        raw, tensors = read_drafter_folder(folder, MODEL_TYPE, FORMAT, "exit adapter")
        model = cls(ExitAdapterConfig(**raw))
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if got != expected:
            missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
            misshapen = [k for k in expected if k in got and got[k] != expected[k]]
            raise ValueError(f"{folder}: the tensors do not match the config (missing {missing[:4]}, unexpected "
                             f"{unexpected[:4]}, misshapen {misshapen[:4]})")
        ids = tensors.pop("draft_ids")
        model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
        return model.set_draft_ids(ids)
