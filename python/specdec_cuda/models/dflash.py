"""The DFlash block-diffusion drafter (Chen et al. 2026): one parallel forward drafts a whole block.

The drafter is a few Llama/Qwen3-style decoder layers with no embedding and no LM head of its own:
it reads the target's (frozen) token embedding and LM head. It is conditioned on the target
through *context features*: the target's hidden states at ``target_layers`` (evenly spaced
layers), concatenated, projected ``k*H -> H`` (``fc``) and RMS-normalised (``context_norm``).

KV injection, in every drafter layer::

    queries = q_proj(block states)                       # [B, blk, heads, D]
    keys    = k_proj([context features ; block states])  # context first, then the block
    values  = v_proj([context features ; block states])

The block sees every context feature of its row (the committed tokens strictly before the block's
anchor) and itself bidirectionally; RoPE at true absolute positions. The block input is
``[last committed token, MASK x (blk - 1)]``, where MASK is the drafter's own learned embedding
(``mask_embedding``; the target's vocabulary is not extended), or, for z-lab's published drafters,
the target's embedding of ``mask_token_id``. One forward gives the
distributions of positions ``1 .. blk - 1``: position ``i`` predicts the token at ``anchor + i``
(no label shift).

``DFlashCache`` keeps each layer's context K/V (RoPE applied) of the committed tokens: it grows
when the target commits tokens (their hidden states arrive with the step's outcome), never holds
block entries after a forward, and follows rollbacks with ``truncate``.

A checkpoint folder holds ``config.json`` (``"model_type": "dflash_drafter"``) and
``model.safetensors`` with the drafter's own weights only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.mtp import mtp_head_topk_packed
from ..ops.status import raise_for
from ..ops.skinny_linear import PackedWeight, pack_weight
from .draft_vocab import VocabSubset
from .layers import packed_path_wanted, project
from .rope import apply_rope

MODEL_TYPE = "dflash_drafter"


def default_target_layers(num_layers: int, count: int = 4) -> tuple[int, ...]:
    """``count`` evenly spaced target layers from the second to the second-to-last (all layers of
    a model too shallow for that)."""
    if num_layers <= 2:
        return tuple(range(num_layers))
    lo, hi = 1, num_layers - 2
    count = max(1, min(count, hi - lo + 1))
    if count == 1:
        return (hi,)
    return tuple(sorted({round(lo + i * (hi - lo) / (count - 1)) for i in range(count)}))


@dataclass
class DFlashConfig:
    """The drafter's shape. ``hidden_size`` and ``vocab_size`` are the target's."""

    hidden_size: int
    vocab_size: int
    target_layers: tuple[int, ...]
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    block_size: int = 8
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # z-lab's published drafters: MASK is a token of the target's vocabulary (its embedding, not a
    # learned vector), and q/k/v/o may carry biases (Qwen3's attention_bias).
    mask_token_id: int | None = None
    attention_bias: bool = False
    # The drafter's own draft vocabulary (FR-Spec, ``models.draft_vocab``): the target ids its LM
    # head runs over by default, the most frequent in its training text; None: the whole vocabulary.
    draft_vocab: tuple[int, ...] | None = None
    extra: dict = field(default_factory=dict)  # free-form notes (training report), saved as is

    def __post_init__(self) -> None:
        self.target_layers = tuple(int(i) for i in self.target_layers)
        if not self.target_layers:
            raise ValueError("DFlashConfig: target_layers must name at least one target layer")
        for name in ("hidden_size", "vocab_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"DFlashConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"DFlashConfig: num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"DFlashConfig: head_dim must be even (RoPE), got {self.head_dim}")
        if self.block_size < 2:
            raise ValueError(f"DFlashConfig: block_size must be >= 2 (the anchor and one mask), got {self.block_size}")
        if self.draft_vocab is not None:
            self.draft_vocab = tuple(int(i) for i in self.draft_vocab)
            if not self.draft_vocab or min(self.draft_vocab) < 0 or max(self.draft_vocab) >= self.vocab_size:
                raise ValueError(f"DFlashConfig: draft_vocab must hold ids in [0, {self.vocab_size}) (and at least one)")

    @classmethod
    def for_target(cls, target, num_layers: int = 2, block_size: int = 8, num_target_layers: int = 4,
                   **overrides) -> "DFlashConfig":
        """A drafter shaped after ``target`` (a model-protocol LM): its hidden size and vocabulary,
        heads of its head size where the hidden size allows."""
        H = int(target.hidden_size)
        head_dim = next(d for d in (64, 32, 16, 8, 4, 2) if H % d == 0 and H // d >= 2) if H >= 4 else 2
        heads = max(1, H // head_dim)
        kv = heads if heads < 2 else next(k for k in (heads // 2, 1) if heads % k == 0)
        kw = dict(hidden_size=H, vocab_size=int(target.vocab_size),
                  target_layers=default_target_layers(int(target.num_layers), num_target_layers),
                  num_layers=num_layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                  intermediate_size=2 * H, block_size=block_size)
        kw.update(overrides)
        return cls(**kw)


class _PackedIO(NamedTuple):
    """The drafter's own projections outside its layers, packed for inference (``_packed_io``)."""

    fc: PackedWeight  # of fc [H, layers_read * H]
    kv: PackedWeight  # of every layer's k_proj and v_proj stacked [layers * 2 * kv_heads * D, H]


def _length_range(lengths: torch.Tensor) -> tuple[int, int]:
    """The shortest and longest of the rows' lengths [B] (0, 0 for no rows): one read of the
    tensor, the rest on the host (``aminmax``, ``stack`` and ``tolist`` were three ops of ~10 us
    each in a zoo block's drafting)."""
    host = lengths.tolist()
    return (min(host), max(host)) if host else (0, 0)


class DFlashInference(NamedTuple):
    """The drafter's weights as its inference path reads them, built (or checked against the
    weights) once by ``DFlashDrafter.inference()`` for a run of forwards over unchanged weights: a
    proposer holds one per generate call. Checking every forward cost ~0.1 ms of a ~2 ms zoo block
    (a key over every parameter), twice more in each ``extend``.

    ``native``: per layer, the ``decoder_layer`` op's packed weights (None: the torch layers run);
    ``io``: fc and the stacked k/v projections packed for the ``dflash_extend`` op (None: torch ops);
    ``stacked``: the stacked k/v weights, biases and k_norms (``_stacked_kv``); ``buffers``: per
    (batch, block) the block's input with its MASK rows written, and its all-true tree mask (the
    anchor row is rewritten by each draft)."""

    native: list | None
    io: _PackedIO | None
    stacked: tuple
    buffers: dict


class DFlashLayer(nn.Module):
    """Pre-norm decoder layer whose attention takes the context K/V from outside (KV injection)."""

    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.c = c
        H, D = c.hidden_size, c.head_dim
        self.input_norm = nn.Parameter(torch.ones(H))
        self.q_proj = nn.Linear(H, c.num_heads * D, bias=c.attention_bias)
        self.k_proj = nn.Linear(H, c.num_kv_heads * D, bias=c.attention_bias)
        self.v_proj = nn.Linear(H, c.num_kv_heads * D, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * D, H, bias=c.attention_bias)
        self.q_norm = nn.Parameter(torch.ones(D))  # Qwen3-style per-head norms before RoPE
        self.k_norm = nn.Parameter(torch.ones(D))
        self.post_norm = nn.Parameter(torch.ones(H))
        self.gate_up = nn.Linear(H, 2 * c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, H, bias=False)

    def kv(self, feats: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (RoPE applied) and values of ``feats`` [B, n, H] at cos/sin [B, n, 1, D]:
        each [B, kv_heads, n, D]. For context features, ``feats`` is already normalised."""
        B, n, _ = feats.shape
        k = self.k_proj(feats).view(B, n, self.c.num_kv_heads, self.c.head_dim)
        k = apply_rope(F.rms_norm(k, k.shape[-1:], self.k_norm, self.c.rms_norm_eps), cos, sin)
        v = self.v_proj(feats).view(B, n, self.c.num_kv_heads, self.c.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, n, H] block states at cos/sin [B, n, 1, D]; ctx_k / ctx_v [B, kv_heads, T, D];
        mask [B, 1, n, T + n] additive (0 / -inf) or None (every context and block entry seen)."""
        c = self.c
        B, n, _ = x.shape
        h = F.rms_norm(x, x.shape[-1:], self.input_norm, c.rms_norm_eps)
        q = self.q_proj(h).view(B, n, c.num_heads, c.head_dim)
        q = apply_rope(F.rms_norm(q, q.shape[-1:], self.q_norm, c.rms_norm_eps), cos, sin).transpose(1, 2)
        k, v = self.kv(h, cos, sin)
        keys, values = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                             enable_gqa=c.num_heads != c.num_kv_heads)
        x = x + self.o_proj(out.transpose(1, 2).reshape(B, n, -1))
        gate, up = self.gate_up(F.rms_norm(x, x.shape[-1:], self.post_norm, c.rms_norm_eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class DFlashCache:
    """Per layer, the context K/V [B, kv_heads, max_length, D] of each row's committed tokens
    (slots ``0 .. lengths[b] - 1`` = absolute positions), and ``lengths`` [B] int64."""

    def __init__(self, c: DFlashConfig, batch: int, max_length: int, dtype: torch.dtype, device) -> None:
        # One tensor per K and V over all layers [layers, B, kv_heads, max_length, D], so that an
        # extend writes every layer in one scatter; keys[i] / values[i] are views of layer i.
        shape = (c.num_layers, batch, c.num_kv_heads, max_length, c.head_dim)
        self.all_keys = torch.zeros(shape, dtype=dtype, device=device)
        self.all_values = torch.zeros(shape, dtype=dtype, device=device)
        self.keys = list(self.all_keys.unbind(0))
        self.values = list(self.all_values.unbind(0))
        self.lengths = torch.zeros(batch, dtype=torch.int64, device=device)
        self.max_length = max_length

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll rows back to ``lengths`` [B] (each <= its current length): a rollback."""
        if bool((lengths > self.lengths).any()) or bool((lengths < 0).any()):
            raise ValueError(f"DFlashCache.truncate: lengths {lengths.tolist()} must lie in [0, current "
                             f"lengths {self.lengths.tolist()}]")
        self.lengths = lengths.clone()


class DFlashDrafter(nn.Module):
    """The drafter's own weights; the target's embedding and LM head are bound with ``attach``.

    Example::

        drafter = DFlashDrafter.load(folder).attach(target)
        cache = drafter.new_cache(batch, max_length)
        run = drafter.inference()                  # the weights as the forwards read them, once
        drafter.extend(cache, {l: h[l] for l in drafter.config.target_layers}, num_new, run)
        logits = drafter.draft(cache, last_tokens, inference=run)    # [B, blk - 1, V]
    """

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        c = self.config = config
        H = c.hidden_size
        self.fc = nn.Linear(len(c.target_layers) * H, H, bias=False)
        self.context_norm = nn.Parameter(torch.ones(H))
        self.mask_embedding = nn.Parameter(torch.zeros(H))
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.norm = nn.Parameter(torch.ones(H))
        self._embed: torch.Tensor | None = None  # the target's [V, H] embedding (frozen, not ours)
        self._head: torch.Tensor | None = None   # the target's [V, H] LM head
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.register_buffer("inv_freq", torch.cat([inv, inv]), persistent=False)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def random(cls, config: DFlashConfig, seed: int = 0, std: float = 0.02) -> "DFlashDrafter":
        """Randomly initialised weights (normal(0, std) projections, unit norms, a random MASK)."""
        model = cls(config)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=g) * std)
            model.mask_embedding.copy_(torch.randn(config.hidden_size, generator=g) * std)
        return model

    def attach(self, target) -> "DFlashDrafter":
        """Bind ``target``'s embedding and LM head (read, never trained); move to its device/dtype."""
        embed, head = target_embedding_and_head(target)
        c = self.config
        if embed.shape != (c.vocab_size, c.hidden_size) or head.shape != (c.vocab_size, c.hidden_size):
            raise ValueError(f"the target's embedding {tuple(embed.shape)} / LM head {tuple(head.shape)} do "
                             f"not fit a drafter for vocab {c.vocab_size}, hidden {c.hidden_size}")
        if c.mask_token_id is not None and not 0 <= c.mask_token_id < c.vocab_size:
            raise ValueError(f"the drafter's mask_token_id {c.mask_token_id} is outside the vocabulary ({c.vocab_size})")
        bad = [i for i in c.target_layers if not 0 <= i < int(target.num_layers)]
        if bad:
            raise ValueError(f"the drafter reads target layers {bad} but the target has {target.num_layers}")
        self.to(device=embed.device, dtype=embed.dtype)
        self._embed, self._head = embed.detach(), head.detach()
        # The target's LM head as its own decoding path holds it (packed panels or GGUF blocks, the
        # same values as ``_head``): the draft's head reads that instead of a float32 matmul.
        self.__dict__["_head_op"] = getattr(target, "_head_packed", None)
        return self

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def save(self, folder) -> Path:
        """``config.json`` + ``model.safetensors`` (the drafter's own weights only) in ``folder``: each
        tensor in bfloat16 when all its values are bfloat16 numbers (a drafter trained with
        bfloat16 weights: the same values in half the bytes), else float32."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = asdict(self.config)
        config["target_layers"] = list(self.config.target_layers)
        config["model_type"] = MODEL_TYPE
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        def stored(t: torch.Tensor) -> torch.Tensor:
            t = t.detach().float().cpu()
            return (t.bfloat16() if torch.equal(t.bfloat16().float(), t) else t).contiguous()

        save_file({k: stored(v) for k, v in self.state_dict().items()}, str(folder / "model.safetensors"))
        return folder

    @classmethod
    def load(cls, folder) -> "DFlashDrafter":
        """A drafter saved by ``save``; fp32 on the CPU until ``attach``.
        (``models.published.load_dflash`` also reads published z-lab DFlash folders.)"""
        from safetensors.torch import load_file

        folder = Path(folder)
        path = folder / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: no config.json (not a DFlash drafter folder)")
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or raw.pop("model_type", None) != MODEL_TYPE:
            raise ValueError(f"{path}: not a DFlash drafter config (model_type must be {MODEL_TYPE!r})")
        model = cls(DFlashConfig(**raw))
        tensors = load_file(str(folder / "model.safetensors"))
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise ValueError(f"{folder}: drafter weights do not match its config (missing {missing}, "
                             f"unexpected {unexpected})")
        return model

    # -- the pieces of a forward --------------------------------------------------------------

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [B, n, 1, D] at absolute ``positions`` [B, n]: rows of a table of
        positions 0 .. P - 1 (P a power of two >= 1024, grown on demand), computed once per dtype
        and device in float64 (the same values as computing them per call; a block forward then
        pays one gather instead of ~10 small ops)."""
        cos, sin = self._rope_table(int(positions.max()) + 1 if positions.numel() else 1, positions.device)
        return cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)

    def rope_at(self, start: int, n: int, batch: int, run: DFlashInference | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of positions ``start .. start + n - 1`` on every one of ``batch`` rows
        (rows of one length): slices of the table, no gather, contiguous at batch 1 (the ops take
        them as they are); ``run`` keeps the table at hand (looking it up by dtype and device was
        most of a slice's ~40 us). Shape: two [batch, n, D] (``rope``'s without its heads dim)."""
        cos, sin = self._run_rope_table(start + n, run)
        if batch == 1:
            return cos[None, start: start + n], sin[None, start: start + n]
        D = cos.shape[-1]
        return cos[start: start + n].expand(batch, n, D), sin[start: start + n].expand(batch, n, D)

    def _run_rope_table(self, need: int, run: DFlashInference | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``_rope_table`` of at least ``need`` positions, kept in ``run``'s buffers."""
        table = None if run is None else run.buffers.get("rope")
        if table is None or table[0].shape[0] < need:
            table = self._rope_table(need, self.device)
            if run is not None:
                run.buffers["rope"] = table
        return table

    def _rope_table(self, need: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [P, D] of positions 0 .. P - 1, P >= ``need``."""
        key = (self.dtype, torch.device(device))
        tables = self.__dict__.setdefault("_rope_tables", {})
        table = tables.get(key)
        if table is None or table[0].shape[0] < need:
            size = max(1024, 1 << (need - 1).bit_length())
            angles = torch.arange(size, dtype=torch.float64, device=device)[:, None] * self.inv_freq.to(torch.float64)
            sin = angles.sin()
            sin[:, : self.config.head_dim // 2].neg_()
            table = tables[key] = (angles.cos().to(self.dtype), sin.to(self.dtype))
        return table

    def context_features(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        """RMSNorm(fc(concat of the target's hidden states at ``target_layers``)) (the packed CPU
        path's ``extend`` runs it inside the ``dflash_extend`` op).

        Shape: hidden_states layer -> [B, n, H]; returns [B, n, H]."""
        return F.rms_norm(self.fc(self._target_hidden(hidden_states)), (self.config.hidden_size,), self.context_norm,
                          self.config.rms_norm_eps)

    def _target_hidden_list(self, hidden_states: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """The target's hidden states at ``target_layers``, in that order: [B, n, H] each;
        ValueError naming the layers missing."""
        missing = [i for i in self.config.target_layers if i not in hidden_states]
        if missing:
            raise ValueError(f"the target's hidden states of layers {missing} are missing")
        return [hidden_states[i] for i in self.config.target_layers]

    def _target_hidden(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        """``_target_hidden_list`` concatenated, in the drafter's dtype: [B, n, layers_read * H]."""
        return torch.cat([h.to(self.dtype) for h in self._target_hidden_list(hidden_states)], dim=-1)

    def block_input(self, anchor_tokens: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
        """Embeddings of ``[anchor, MASK x (blk - 1)]`` per anchor. Shape: anchor_tokens [...];
        returns [..., blk, H]."""
        if self._embed is None:
            raise RuntimeError("the drafter has no target embedding: call attach(target) first")
        blk = block_size or self.config.block_size
        first = F.embedding(anchor_tokens, self._embed)[..., None, :]
        token = self.config.mask_token_id
        mask = self.mask_embedding if token is None else self._embed[token]
        mask = mask.expand(*anchor_tokens.shape, blk - 1, self.config.hidden_size)
        return torch.cat([first, mask], dim=-2)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The target's LM head on the drafter's normed output. x [..., H] -> [..., V]."""
        return F.linear(F.rms_norm(x, x.shape[-1:], self.norm, self.config.rms_norm_eps), self._head)

    # -- inference ----------------------------------------------------------------------------

    def new_cache(self, batch: int, max_length: int) -> DFlashCache:
        return DFlashCache(self.config, batch, max_length, self.dtype, self.device)

    @torch.no_grad()
    def inference(self) -> DFlashInference:
        """The weights as the inference path reads them (``DFlashInference``), packed on first use
        and again whenever a parameter was replaced or written; hand the result to ``draft`` and
        ``extend`` for as long as the weights stay as they are (one generate call)."""
        return DFlashInference(self._native_layers(), self._packed_io(), self._stacked_kv(), {})

    @torch.no_grad()
    def extend(self, cache: DFlashCache, hidden_states: dict[int, torch.Tensor], num_new: torch.Tensor,
               inference: DFlashInference | None = None) -> None:
        """Append committed tokens' context K/V: row ``b`` gains the first ``num_new[b]`` of the
        given tokens, at absolute positions ``cache.lengths[b] + j``; ``cache.lengths`` is then
        advanced in place. ``inference``: the weights as ``inference()`` gave them (default: made
        or checked now).

        Shape: hidden_states layer -> [B, n, H]; num_new [B] int64 (0 .. n)."""
        run = self.inference() if inference is None else inference
        c = self.config
        if run.io is not None:  # the packed CPU path: the whole extend as one op
            # per layer read [B, n, H] contiguous float32 (the op concatenates them)
            hidden = [h if h.dtype == torch.float32 and h.is_contiguous() else h.float().contiguous()
                      for h in self._target_hidden_list(hidden_states)]
            B, n = hidden[0].shape[:2]
        else:
            feats = self.context_features(hidden_states)  # [B, n, H]
            B, n = feats.shape[:2]
        if n == 0:
            return
        shortest, longest = _length_range(cache.lengths)
        # Every given token is written at slot lengths[b] + j; those past num_new[b] land in scratch
        # slots past the row's new length, which nothing reads before a later extend overwrites
        # them. So all n slots must fit (the proposer sizes the cache with a block of slack).
        if longest + n > cache.max_length:
            raise ValueError(f"DFlashCache overflow: a row holds {longest} tokens and {n} are written, but the "
                             f"cache has {cache.max_length} slots")
        if run.io is not None:
            # The features' concatenation, context_kv at the RoPE rows lengths[b] + j and the
            # lengths' advance, in C++: as torch calls around context_kv they were ~140 us of a
            # ~250 us zoo extend in a decoding run on a Zen 4 EPYC.
            fixed = run.buffers.get("extend")
            if fixed is None:  # the op's weights, as it takes them, once per run
                _, bias, k_norm = run.stacked
                fixed = run.buffers["extend"] = (run.io.fc.panels, self.context_norm.detach(), run.io.kv.panels, bias,
                                                 k_norm.reshape(c.num_layers, c.head_dim).contiguous(), c.rms_norm_eps)
            cos, sin = self._run_rope_table(longest + n, run)  # [P, D] each
            if num_new.dtype != torch.int64 or not num_new.is_contiguous():
                num_new = num_new.to(torch.int64).contiguous()
            torch.ops.specdec.dflash_extend(hidden, *fixed, cos, sin, cache.all_keys, cache.all_values, cache.lengths,
                                            num_new)
            return
        if shortest == longest:  # rows of one length (always at batch 1): slices of the table, no gather
            cos, sin = self.rope_at(longest, n, B, run)  # [B, n, D]
        else:
            slots = cache.lengths[:, None] + torch.arange(n, device=cache.lengths.device)  # [B, n]
            cos, sin = (t.squeeze(2) for t in self.rope(slots))
        k, v = self.context_kv(feats, cos.unsqueeze(2), sin.unsqueeze(2), run.stacked)  # [layers, B, kv_heads, n, D]
        if shortest == longest:
            cache.all_keys[:, :, :, longest: longest + n] = k
            cache.all_values[:, :, :, longest: longest + n] = v
        else:
            index = slots[None, :, None, :, None].expand(c.num_layers, B, c.num_kv_heads, n, c.head_dim)
            cache.all_keys.scatter_(3, index, k)
            cache.all_values.scatter_(3, index, v)
        cache.lengths += num_new

    def context_kv(self, feats: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   stacked: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's keys (k_norm, RoPE) and values of the context features at once: the
        layers' k_proj and v_proj as one matmul (their weights stacked, ``stacked`` when given),
        then the per-layer norm and the rotation over all layers together; the same function as
        each ``DFlashLayer.kv`` (the packed CPU path's ``extend`` runs the ``dflash_extend`` op).

        Shape: feats [B, n, H]; cos / sin [B, n, 1, D]; returns two [layers, B, kv_heads, n, D]."""
        c = self.config
        B, n, _ = feats.shape
        L, Hkv, D = c.num_layers, c.num_kv_heads, c.head_dim
        weight, bias, k_norm = self._stacked_kv() if stacked is None else stacked
        kv = F.linear(feats, weight, bias).view(B, n, L, 2, Hkv, D)
        k = F.rms_norm(kv[:, :, :, 0], (D,), None, c.rms_norm_eps) * k_norm  # [B, n, L, Hkv, D]
        k = apply_rope(k, cos.unsqueeze(2), sin.unsqueeze(2))
        return k.permute(2, 0, 3, 1, 4), kv[:, :, :, 1].permute(2, 0, 3, 1, 4)

    def _stacked_kv(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """[k_proj_0; v_proj_0; k_proj_1; ...] weights [layers * 2 * kv_heads * D, H], their biases,
        and the layers' k_norm weights [layers, 1, D]; rebuilt when a parameter changed."""
        training = torch.is_grad_enabled()  # then built each call, inside the autograd graph
        key = None if training else self._weights_key()
        cached = self.__dict__.get("_kv_stack")
        if key is not None and cached is not None and cached[0] == key:
            return cached[1]
        layers = self.layers
        weight = torch.cat([w for layer in layers for w in (layer.k_proj.weight, layer.v_proj.weight)])
        bias = (None if layers[0].k_proj.bias is None
                else torch.cat([b for layer in layers for b in (layer.k_proj.bias, layer.v_proj.bias)]))
        k_norm = torch.stack([layer.k_norm for layer in layers])[:, None, :]
        stacked = (weight, bias, k_norm)
        if key is not None:
            self.__dict__["_kv_stack"] = (key, stacked)
        return stacked

    def _packed_io(self) -> "_PackedIO | None":
        """fc and the stacked k/v projections as panels for the ``dflash_extend`` op (bfloat16 when
        every weight is a bfloat16 number, as ``pack_weight`` picks; else float32), for
        inference on a float32 CPU drafter (``models.layers.packed_path_wanted``; the LM head:
        ``head_logits``).
        None while training or elsewhere. Repacked whenever a parameter changed."""
        if torch.is_grad_enabled() or not packed_path_wanted(self.device, self.dtype):
            return None
        key, cached = self._weights_key(), self.__dict__.get("_packed")
        if cached is not None and cached[0] == key:
            return cached[1]
        weight, _, _ = self._stacked_kv()
        io = _PackedIO(pack_weight(self.fc.weight.detach()), pack_weight(weight.detach()))
        self.__dict__["_packed"] = (key, io)
        return io

    def head_logits(self, x: torch.Tensor, vocab: VocabSubset | None = None) -> torch.Tensor:
        """``logits`` at inference: the target's LM head from its own packed panels or GGUF blocks
        when it decodes from them and the drafter is a float32 CPU one. As a torch float32 matmul a
        few rows' head was half a zoo block's drafting on an AVX2 EPYC (5 rows: 1.2-1.65 ms; the
        fused norm + head op over the panels 0.54). ``vocab``: only that subset's rows of the head
        (its ``packed`` rows, or its dense ones), logits in the subset's id order.
        x [..., H] -> [..., V] (or [..., len(vocab)])."""
        head = self.__dict__.get("_head_op") if vocab is None else vocab.packed
        eps = self.config.rms_norm_eps
        if head is None or torch.is_grad_enabled() or not packed_path_wanted(self.device, self.dtype):
            if vocab is None:
                return self.logits(x)
            return F.linear(F.rms_norm(x, x.shape[-1:], self.norm, eps), vocab.rows(self.dtype))
        if isinstance(head, PackedWeight):  # the norm and the head in one op (the top-1 it also finds is unused)
            H = x.shape[-1]
            logits = mtp_head_topk_packed(x.reshape(-1, H), self.norm, head, 1, eps, return_logits=True).logits
            return logits.view(*x.shape[:-1], -1)
        return project(F.rms_norm(x, x.shape[-1:], self.norm, eps), None, None, head)

    def _weights_key(self) -> tuple:
        """Changes whenever a parameter is replaced (``.to()``) or written in place
        (``load_state_dict``, an optimiser step): the key of the weights derived from them."""
        return tuple((p.data_ptr(), p._version) for p in self.parameters())

    @torch.no_grad()
    def draft(self, cache: DFlashCache, last_tokens: torch.Tensor, block_size: int | None = None,
              depth: int | None = None, vocab: VocabSubset | None = None,
              inference: DFlashInference | None = None) -> torch.Tensor:
        """One parallel forward of the block ``[last, MASK...]`` at positions ``lengths + i``.

        Shape: last_tokens [B]; returns logits [B, depth, V] for positions 1 .. depth (the tokens at
        ``lengths + 1 ..``; ``depth`` defaults to blk - 1), or [B, depth, len(vocab)] over a draft
        vocabulary (``vocab``: a ``VocabSubset`` of the target's head rows). The whole block runs
        through the layers either way; only the LM head is limited to the positions asked for (on
        the zoo pair, 16-token blocks over a 4096-token vocabulary, the head over all 15 was ~45% of
        a block forward). ``inference``: the weights as ``inference()`` gave them (default: made or
        checked now)."""
        return self.head_logits(self._block_states(cache, last_tokens, block_size, depth, inference), vocab)

    @torch.no_grad()
    def draft_tokens(self, cache: DFlashCache, last_tokens: torch.Tensor, block_size: int | None = None,
                     depth: int | None = None, vocab: VocabSubset | None = None,
                     inference: DFlashInference | None = None) -> torch.Tensor:
        """``draft``'s most likely token per position, as ids of the target's vocabulary: a greedy
        chain. On the packed CPU path the whole block is one ``dflash_block_topk`` op whose head
        ranks while it computes (``_fused_topk``: no logits tensor, no argmax or id lookup as torch
        ops). Ties may resolve to another of the tied ids than ``draft(...).argmax(-1)`` does.

        Shape: last_tokens [B]; returns [B, depth] int64."""
        fused = self._fused_topk(cache, last_tokens, block_size, depth, vocab, inference, 1, False)
        if fused is not None:
            return fused[1].squeeze(-1)
        index = self.draft(cache, last_tokens, block_size, depth, vocab, inference).argmax(-1)
        return index if vocab is None else vocab.ids.to(index.device)[index]

    @torch.no_grad()
    def draft_topk(self, cache: DFlashCache, last_tokens: torch.Tensor, k: int, block_size: int | None = None,
                   depth: int | None = None, vocab: VocabSubset | None = None,
                   inference: DFlashInference | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``draft``'s ``k`` most likely tokens per position with their log-probabilities (under the
        block's softmax, over ``vocab`` when given): a DDTree's input. On the packed CPU path the
        whole block is one ``dflash_block_topk`` op whose head ranks and takes each row's
        log-sum-exp while it computes (``_fused_topk``: no logits tensor, no log-softmax or top-k as
        torch ops). Non-finite logits raise RuntimeError on every path: the log-probabilities are finite.

        Shape: last_tokens [B]; returns log-probabilities [B, depth, k] float32 (descending along
        k) and token ids [B, depth, k] int64, ids of the target's vocabulary."""
        fused = self._fused_topk(cache, last_tokens, block_size, depth, vocab, inference, k, True)
        if fused is not None:
            return fused
        logits = self.draft(cache, last_tokens, block_size, depth, vocab, inference).float()
        if not bool(torch.isfinite(logits).all()):  # as the op's status flags them
            raise RuntimeError("the drafter's head: non-finite logits (NaN or inf) in the block")
        logprobs, index = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        return logprobs, (index if vocab is None else vocab.ids.to(index.device)[index])

    def _fused_topk(self, cache: DFlashCache, last_tokens: torch.Tensor, block_size: int | None, depth: int | None,
                    vocab: VocabSubset | None, inference: DFlashInference | None, k: int,
                    log_probs: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The block's top-``k`` per drafted position as one ``dflash_block_topk`` op (the anchors'
        embeddings, the layers, the head's top-k, the log-sum-exp and the draft vocabulary's ids in
        C++), where the layers and the head take the packed CPU path and the block fits the cache's
        scratch slots; None elsewhere (``draft``'s logits then). Fresh tensors: values [B, depth, k]
        float32 (log-probabilities with ``log_probs``, else logits) and token ids [B, depth, k] int64.
        The ~15 torch calls it replaces were ~130 us of a ~400 us zoo DDTree block in a decoding run
        on a Zen 4 EPYC (each found the dispatcher cold after the target's forward)."""
        run = self.inference() if inference is None else inference
        blk = block_size or self.config.block_size
        depth = blk - 1 if depth is None else int(depth)
        head, ids = self._run_head(run, vocab)
        if run.native is None or head is None or not 1 <= depth <= blk - 1:
            return None
        span = _length_range(cache.lengths)[1]
        if span + blk > cache.max_length:
            return None
        fused = run.buffers.get("fused")
        if fused is None:  # the layers' weights as the op lists them (the decoder_layer op's less its eps)
            embed = self._embed if self._embed.dtype == torch.float32 and self._embed.is_contiguous() else None
            fused = run.buffers["fused"] = (embed, [w for args in run.native for w in args[:2] + args[3:]])
        embed, layers = fused
        if embed is None:
            return None
        cos, sin = self._run_rope_table(span + blk, run)  # [P, D] each
        c = self.config
        values, tokens, status = torch.ops.specdec.dflash_block_topk(
            last_tokens, embed, self._block_buffer(run, last_tokens, blk)[0], cos, sin, layers, c.rms_norm_eps,
            cache.keys, cache.values, cache.lengths, c.num_heads, c.head_dim ** -0.5, depth, self.norm, head.panels,
            head.out_features, ids, k, log_probs)
        raise_for(status.tolist(), "the drafter's head", exc=RuntimeError)
        return values, tokens

    def _run_head(self, run: DFlashInference, vocab: VocabSubset | None) -> tuple:
        """For ``_fused_topk`` over ``vocab``, decided once per run: the packed LM head (a
        ``PackedWeight``) the op ranks, or None (``draft``'s logits then), and the vocabulary's ids
        on the drafter's device (None: the whole vocabulary)."""
        cached = run.buffers.get("head")
        if cached is None or cached[0] is not vocab:
            head = self.__dict__.get("_head_op") if vocab is None else vocab.packed
            if not (isinstance(head, PackedWeight) and packed_path_wanted(self.device, self.dtype)):
                head = None
            cached = run.buffers["head"] = (vocab, head, None if vocab is None else vocab.ids.to(self.device))
        return cached[1:]

    def _block_states(self, cache: DFlashCache, last_tokens: torch.Tensor, block_size: int | None,
                      depth: int | None, inference: DFlashInference | None) -> torch.Tensor:
        """The block's states before the final norm at positions 1 .. depth: [B, depth, H] (``draft``)."""
        blk = block_size or self.config.block_size
        depth = blk - 1 if depth is None else int(depth)
        if not 0 <= depth <= blk - 1:
            raise ValueError(f"draft: depth must lie in [0, block_size - 1 = {blk - 1}], got {depth}")
        run = self.inference() if inference is None else inference
        B = last_tokens.shape[0]
        lengths = cache.lengths
        shortest, span = _length_range(lengths)
        if shortest == span:
            cos, sin = self.rope_at(span, blk, B, run)  # [B, blk, D]
        else:
            cos, sin = (t.squeeze(2) for t in self.rope(lengths[:, None] + torch.arange(blk, device=lengths.device)))
        x = self._block_input(run, last_tokens, blk)  # [B, blk, H]
        if run.native is not None and span + blk <= cache.max_length:
            return self._native_block(run, x, cos, sin, cache).narrow(1, 1, depth)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, blk, 1, D]: the torch layers' form
        mask = None  # rows of one length see every context slot and the whole block
        if shortest != span:
            # Row b sees its context slots < lengths[b] and the whole block.
            seen = torch.arange(span, device=lengths.device)[None, :] < lengths[:, None]  # [B, span]
            seen = torch.cat([seen, seen.new_ones(B, blk)], dim=1)
            mask = torch.zeros(seen.shape, dtype=self.dtype, device=seen.device).masked_fill(~seen, float("-inf"))
            mask = mask[:, None, None, :]  # [B, 1, 1, span + blk]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.keys[i][:, :, :span], cache.values[i][:, :, :span], mask)
        return x[:, 1: 1 + depth]

    def _block_input(self, run: DFlashInference, last_tokens: torch.Tensor, blk: int) -> torch.Tensor:
        """``block_input`` in the drafter's dtype, into the run's buffer for this (batch, block):
        the MASK rows stay written, each draft writes the anchors' embeddings (at batch 1 straight
        into the buffer's row, a view kept with it: ~7 us where an indexed assignment took ~18).
        [B, blk, H]."""
        buffer, anchors = self._block_buffer(run, last_tokens, blk)  # [B, blk, H], its row 0 [B, H]
        if last_tokens.shape[0] == 1 and self._embed.dtype == buffer.dtype:
            torch.index_select(self._embed, 0, last_tokens, out=anchors)
        else:
            anchors.copy_(F.embedding(last_tokens, self._embed))
        return buffer

    def _block_buffer(self, run: DFlashInference, last_tokens: torch.Tensor,
                      blk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The run's block buffer for this (batch, block), its MASK rows written (made on first use,
        with ``last_tokens``' embeddings in row 0), and a view of its row 0: [B, blk, H], [B, H]."""
        B = last_tokens.shape[0]
        found = run.buffers.get((B, blk))
        if found is None:
            buffer = self.block_input(last_tokens, blk).to(self.dtype).contiguous()
            found = run.buffers[(B, blk)] = (buffer, buffer.select(1, 0))
        return found

    def _native_layers(self) -> list[tuple] | None:
        """Per drafter layer, the ``decoder_layer`` op's arguments from ``norm1`` to ``k_norm``
        (its weights packed: q|k|v, o, gate|up, down; bfloat16 panels for bfloat16 values, half
        the bytes streamed), where a block forward can run as one op per layer: float32 on a CPU
        whose packed kernel is vectorised (``models.layers.packed_path_wanted``). Packed on first
        use and again whenever a parameter was replaced or written (``.to()``, ``load_state_dict``,
        a training step); None elsewhere (the torch layers run)."""
        if not packed_path_wanted(self.device, self.dtype):
            return None
        key, cached = self._weights_key(), self.__dict__.get("_native")
        if cached is not None and cached[0] == key:
            return cached[1]

        def cat(*tensors):
            return None if tensors[0] is None else torch.cat([t.detach() for t in tensors]).contiguous()

        layers = []
        for layer in self.layers:
            qkv = (layer.q_proj, layer.k_proj, layer.v_proj)
            layers.append((layer.input_norm.detach(), layer.post_norm.detach(), self.config.rms_norm_eps,
                           pack_weight(cat(*(m.weight for m in qkv))).panels, cat(*(m.bias for m in qkv)),
                           pack_weight(layer.o_proj.weight.detach()).panels, cat(layer.o_proj.bias),
                           pack_weight(layer.gate_up.weight.detach()).panels, None,
                           pack_weight(layer.down.weight.detach()).panels, None,
                           layer.q_norm.detach(), layer.k_norm.detach()))
        self.__dict__["_native"] = (key, layers)
        return layers

    def _native_block(self, run: DFlashInference, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      cache: DFlashCache) -> torch.Tensor:
        """The block through the drafter's layers as ``decoder_layer`` ops: each layer's attention
        is the op's over the cache (the context slots < ``lengths[b]``, then the block, written to
        the scratch slots ``lengths[b] + i`` past them, which the next ``extend`` overwrites) with
        an all-true tree mask (the block sees itself bidirectionally), the same function as
        ``DFlashLayer.forward``. The op is called as ``ops.decoder_layer`` calls it, with its
        arguments bound once per run (``_native_layers``): that wrapper's conversions were ~10 us
        per layer of a ~1 ms zoo block. x [B, blk, H] contiguous, cos / sin [B, blk, D] -> the
        block's states [B, blk, H] (position 0, the anchor's, included), in a buffer of the run."""
        c = self.config
        B, blk, _ = x.shape
        found = run.buffers.get(("layers", B, blk))
        if found is None:  # the all-true mask, and the states the layers write in turn
            found = run.buffers[("layers", B, blk)] = (
                torch.ones(B, blk, blk, dtype=torch.bool, device=x.device), (torch.empty_like(x), torch.empty_like(x)))
        sees, outs = found
        if B > 1:  # batch 1: slices of the table, contiguous already
            cos, sin = cos.contiguous(), sin.contiguous()
        scale, lengths = c.head_dim ** -0.5, cache.lengths
        for i, args in enumerate(run.native):
            out = outs[i % 2]
            torch.ops.specdec.decoder_layer(x, *args, cos, sin, cache.keys[i], cache.values[i], lengths, sees,
                                            c.num_heads, c.num_kv_heads, scale, out)
            x = out
        return x

    # -- training -----------------------------------------------------------------------------

    def train_forward(self, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                      block_size: int | None = None) -> torch.Tensor:
        """``train_hidden``'s output through the drafter's norm and the target's LM head. Shape:
        logits [B, A, blk, V] (position 0 of each block included; the caller excludes it)."""
        return self.logits(self.train_hidden(tokens, feats, anchors, block_size))

    def train_hidden(self, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                     block_size: int | None = None) -> torch.Tensor:
        """All blocks of each sequence in one forward (training), before the final norm.

        Block ``a`` of row ``b`` is ``[tokens[b, anchors[b, a]], MASK...]`` at positions
        ``anchors[b, a] + i``; it sees the context features at positions ``< anchors[b, a]``, itself
        bidirectionally, and no other block.

        Shape: tokens [B, N] int64; feats [B, N, H] (``context_features`` of the target's hidden
        states over ``tokens``); anchors [B, A] int64 (each <= N - 1). Returns [B, A, blk, H]
        (a trainer scoring part of the vocabulary applies ``norm`` and its rows of the head);
        ``block_size`` (default the drafter's) shorter for the trimmed blocks of inference.
        """
        B, N = tokens.shape
        A, blk = anchors.shape[1], block_size or self.config.block_size
        x = self.block_input(tokens.gather(1, anchors), blk).reshape(B, A * blk, -1).to(self.dtype)
        positions = (anchors[:, :, None] + torch.arange(blk, device=tokens.device)).reshape(B, A * blk)
        cos, sin = self.rope(positions)
        ctx_cos, ctx_sin = self.rope(torch.arange(N, device=tokens.device).expand(B, N))
        block_of = torch.arange(A * blk, device=tokens.device) // blk  # [A*blk]
        sees_ctx = torch.arange(N, device=tokens.device)[None, None, :] < anchors.repeat_interleave(blk, 1)[:, :, None]
        sees_block = (block_of[:, None] == block_of[None, :]).expand(B, -1, -1)
        seen = torch.cat([sees_ctx, sees_block], dim=2)  # [B, A*blk, N + A*blk]
        mask = torch.zeros(seen.shape, dtype=self.dtype, device=seen.device).masked_fill(~seen, float("-inf"))
        mask = mask[:, None]
        for layer in self.layers:
            k, v = layer.kv(feats, ctx_cos, ctx_sin)
            x = layer(x, cos, sin, k, v, mask)
        return x.reshape(B, A, blk, -1)


def target_embedding_and_head(target) -> tuple[torch.Tensor, torch.Tensor]:
    """The token embedding [V, H] and LM head [V, H] weights of a built-in or HF-adapted target."""
    if hasattr(target, "embed_tokens"):  # built-in LlamaModel (dense copies of packed panels or GGUF blocks)
        head = target.output_weight()
        return (head if target.lm_head is None else target.embedding_weight()), head
    model = getattr(target, "model", None)
    if model is not None and hasattr(model, "get_input_embeddings"):  # HFCausalLM
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no LM head (get_output_embeddings() is None)")
        return model.get_input_embeddings().weight, head.weight
    raise TypeError(f"cannot find the token embedding and LM head of a {type(target).__name__}")


__all__: Sequence[str] = ("DFlashCache", "DFlashConfig", "DFlashDrafter", "default_target_layers",
                          "target_embedding_and_head")
