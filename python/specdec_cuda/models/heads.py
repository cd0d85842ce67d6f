"""Multi-token-prediction heads on a frozen target: Medusa heads and DeepSeek-V3-style MTP modules.

Both read the target's hidden states and share its frozen output side (final RMSNorm + LM head,
``TargetHead``); neither has a tokenizer or an LM head of its own.

* ``MedusaHeads``: K independent residual SiLU blocks on the target's final normed hidden state
  at position t; head i (1..K) predicts the token at t + 1 + i (the LM head itself predicts
  t + 1):  ``logits_i = lm_head(final_norm(h + silu(W_i h + b_i)))``. Re-applying the final norm
  keeps every head's input at the scale the LM head was trained on, and makes the output side of
  every head (Medusa's and MTP's) the one fused op ``ops.mtp_head_topk``. Published
  FasterDecoding heads (``models.published``) switch the norm off, may repeat the block and may
  carry their own LM heads: ``logits_i = lm_head_i(block_i^L(h))``.
* ``MTPModules``: D sequential modules. Module d at position t reads the previous depth's hidden
  state at t (the target's final normed one for d = 1) and the embedding of token t + d:
  ``x = eh_proj([enorm(emb(t_{t+d})); hnorm(h^{d-1}_t)])`` (the 2H -> H projection applied as
  two H -> H halves, so the concatenation is never built), then one Llama decoder block over its
  own KV cache; ``h^d_t`` predicts token t + d + 1 through the target's final norm and LM head.

Checkpoint folders (``save_heads`` / ``load_heads``): ``model.safetensors`` + ``config.json``
(``{"kind": "medusa" | "mtp", ...}``), written by ``specdec_cuda.train``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .cache import StaticKVCache
from .config import LlamaConfig
from .layers import PACKED_MAX_ROWS, DecoderLayer, packed_path_wanted, rms_norm
from .rope import cached_cos_sin

HEADS_FORMAT = 1


@dataclass
class TargetHead:
    """The frozen pieces of the target that the heads share.

    Shape: embed [V, H] (input embeddings); norm_weight [H] (final RMSNorm); lm_head [V, H].
    ``config`` is the target's decoder config (the MTP block copies its attention / MLP sizes).
    """

    embed: torch.Tensor
    norm_weight: torch.Tensor
    eps: float
    lm_head: torch.Tensor
    config: LlamaConfig

    lm_head_w4: Any = None  # the LM head as 4-bit weights (ops.quant.PackedW4), when asked for
    # The LM head packed for the CPU decoding path (ops.pack_weight), made on the first float32
    # CPU draft: the fused op then streams bfloat16 panels of a bf16 checkpoint's weights. A GGUF
    # target's head as its file's blocks (ops.gguf.GgufLinear).
    lm_head_packed: Any = None
    # A draft vocabulary (models.draft_vocab.VocabSubset, FR-Spec): ``topk`` then ranks only its
    # rows (the indices it returns are still token ids; logits MASKED elsewhere).
    vocab: Any = None

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``lm_head(final_norm(h))``. Shape: h [..., H] -> [..., V]."""
        return F.linear(rms_norm(h, self.norm_weight, self.eps), self.lm_head)

    def use_w4(self, group_size: int = 128) -> "TargetHead":
        """Draft through a 4-bit copy of the LM head (CPU; the target's own forward is unchanged)."""
        from ..ops.quant import quantize_w4

        if self.lm_head.device.type != "cpu":
            raise ValueError("the 4-bit LM head of the fused MTP-head op is CPU only")
        H = self.lm_head.shape[1]
        self.lm_head_w4 = quantize_w4(self.lm_head.float(), group_size=group_size if H % group_size == 0 else -1,
                                      device="cpu")
        return self

    def topk(self, h: torch.Tensor, k: int, return_logits: bool = False):
        """Top-``k`` tokens of ``lm_head(final_norm(h))`` through the fused op (no [M, V] logits
        unless asked), over the draft vocabulary when the head has one. Shape: h [M, H] ->
        ``ops.mtp.HeadTopK`` (values, indices [M, k] token ids, logits [M, V])."""
        from ..ops import mtp as mtp_ops

        if self.vocab is not None:
            from ..ops.gguf import GgufLinear

            wanted = packed_path_wanted(h.device, h.dtype) and self.lm_head.dtype == torch.float32
            rows = self.vocab.packed if isinstance(self.vocab.packed, GgufLinear) or wanted else None
            dense = None if rows is not None else self.vocab.rows(self.lm_head.dtype)
            out = self._topk_rows(h, k, return_logits, rows, dense)
            ids = self.vocab.ids.to(out.indices.device)
            return mtp_ops.HeadTopK(out.values, ids[out.indices],
                                    None if out.logits is None else self.vocab.expand(out.logits))
        if self.lm_head_w4 is not None:
            w = self.norm_weight if h.dtype != torch.float64 else self.norm_weight.float()
            return mtp_ops.mtp_head_topk_w4(h if h.dtype != torch.float64 else h.float(), w, self.lm_head_w4, k,
                                            self.eps, return_logits)
        return self._topk_rows(h, k, return_logits, self.lm_head_packed if self._use_packed(h) else None,
                               self.lm_head)

    def _topk_rows(self, h: torch.Tensor, k: int, return_logits: bool, packed, dense: torch.Tensor):
        """``topk`` over one form of the head's rows: packed panels (the fused op), a GGUF file's
        blocks (the head's product, then torch's top-k: no fused op reads blocks), or dense rows."""
        from ..ops import mtp as mtp_ops
        from ..ops.gguf import GgufLinear

        if isinstance(packed, GgufLinear):
            from .layers import project

            logits = project(rms_norm(h.float(), self.norm_weight.float(), self.eps), None, None, packed)
            if not bool(torch.isfinite(logits).all()):
                bad = (~torch.isfinite(logits).all(-1)).nonzero().flatten().tolist()
                raise RuntimeError(f"the LM head's logits of rows {bad} are not finite")
            values, indices = logits.topk(k, dim=-1)
            return mtp_ops.HeadTopK(values, indices, logits if return_logits else None)
        if packed is not None:
            return mtp_ops.mtp_head_topk_packed(h, self.norm_weight, packed, k, self.eps, return_logits)
        return mtp_ops.mtp_head_topk(h, self.norm_weight, dense, k, self.eps, return_logits)

    def _use_packed(self, h: torch.Tensor) -> bool:
        """A float32 CPU head on an AVX-512 or AVX2 machine (``SPECDEC_PACKED_LINEAR`` not 0), as for
        the target's own LM head; packs it on first use."""
        if not (packed_path_wanted(h.device, h.dtype) and self.lm_head.dtype == torch.float32):
            return False
        if self.lm_head_packed is None:
            from ..ops.skinny_linear import pack_weight

            self.lm_head_packed = pack_weight(self.lm_head)
        return True


def target_head(target) -> TargetHead:
    """The embeddings, final norm and LM head of a built-in ``LlamaModel`` or an ``HFCausalLM``."""
    from .hf_adapter import HFCausalLM
    from .llama import LlamaModel

    if isinstance(target, LlamaModel):
        # A packed target keeps its LM head (and a tied embedding) only as panels: the heads get
        # dense copies, and the draft's fused top-k reads the target's own panels (float32 heads).
        lm_head = target.output_weight()
        embed = lm_head if target.lm_head is None else target.embedding_weight()  # (an untied GGUF one: decoded)
        packed = target._head_packed if lm_head.dtype == torch.float32 else None
        return TargetHead(embed, target.norm.weight, target.norm.eps, lm_head, target.config, lm_head_packed=packed)
    if isinstance(target, HFCausalLM):
        model = target.model
        base = getattr(model, model.base_model_prefix, None) if hasattr(model, "base_model_prefix") else None
        norm = getattr(base, "norm", None)
        if norm is None or not hasattr(norm, "weight"):
            raise ValueError(f"{type(model).__name__}: no final norm found at "
                             f"model.{getattr(model, 'base_model_prefix', '?')}.norm (needed by MTP heads)")
        config = _sizes_of(target.config.to_dict(), type(model).__name__)
        eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", config.rms_norm_eps)))
        return TargetHead(model.get_input_embeddings().weight, norm.weight, eps,
                          model.get_output_embeddings().weight, config)
    raise TypeError(f"MTP heads need the built-in LlamaModel or an HFCausalLM target, got {type(target).__name__}")


def _sizes_of(cfg: dict, source: str) -> LlamaConfig:
    """A transformers config as a ``LlamaConfig``: the full one for the built-in model's families;
    for others (latent attention, mixtures of experts, hybrid stacks) their sizes only, which is
    what the heads' shapes and the drafter cache's fingerprint read."""
    from .config import UnsupportedModelError

    try:
        return LlamaConfig.from_hf_dict(cfg, source=source)
    except UnsupportedModelError:
        if not all(cfg.get(k) for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers")):
            raise
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return LlamaConfig(
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or cfg.get("moe_intermediate_size") or hidden),
        num_hidden_layers=int(cfg["num_hidden_layers"]), num_attention_heads=heads,
        num_key_value_heads=kv_heads if heads % kv_heads == 0 else heads,
        head_dim=int(cfg.get("head_dim") or hidden // heads), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        family=str(cfg.get("model_type", source)))


class MedusaHeads(nn.Module):
    """K residual SiLU heads (see the module docstring).

    Shape: weight [K, H, H] (``W_i``, applied as ``h @ W_i.T``); bias [K, H].

    Published Medusa checkpoints (``models.published``) need three switches, all off by default:
    ``num_layers`` applies each head's block that many times (FasterDecoding's heads repeat one
    shared ResBlock); ``renorm=False`` feeds the block's output to the LM head as is (no final
    norm again); ``own_lm_heads`` gives every head its own LM head, ``lm_heads`` [K, V, H]
    (Medusa-1), instead of the target's.
    """

    def __init__(self, hidden_size: int, num_heads: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", num_layers: int = 1, renorm: bool = True,
                 own_lm_heads: int | None = None) -> None:
        super().__init__()
        if num_heads < 1 or hidden_size < 1 or num_layers < 1:
            raise ValueError(f"need num_heads, hidden_size, num_layers >= 1, got {num_heads}, {hidden_size}, "
                             f"{num_layers}")
        # Zero init: every head starts as the identity, i.e. as the LM head's own next-token guess.
        self.weight = nn.Parameter(torch.zeros(num_heads, hidden_size, hidden_size, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(num_heads, hidden_size, dtype=dtype, device=device))
        self.num_heads, self.hidden_size = num_heads, hidden_size
        self.num_layers, self.renorm = num_layers, renorm
        # own_lm_heads: the vocabulary size of the heads' own LM heads (None: the target's LM head).
        self.lm_heads = None if own_lm_heads is None else nn.Parameter(
            torch.zeros(num_heads, own_lm_heads, hidden_size, dtype=dtype, device=device))
        # Measured top-k agreement per head (filled by the trainer; picks the static tree).
        self.topk_accuracy: list[list[float]] | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Every head's output hidden state. Shape: h [..., H] -> [..., K, H]."""
        z = torch.einsum("...h,kgh->...kg", h, self.weight) + self.bias
        x = h.unsqueeze(-2) + F.silu(z)
        for _ in range(self.num_layers - 1):  # the same block again, now on each head's own state
            x = x + F.silu(torch.einsum("...kh,kgh->...kg", x, self.weight) + self.bias)
        return x

    def candidates(self, h: torch.Tensor, depth: int, k: int, head: TargetHead) -> torch.Tensor:
        """Top-``k`` tokens of heads 1..``depth`` at hidden states ``h``. Shape: h [B, H] ->
        [B, depth, k] int64. The library's heads go through the fused norm + LM head + top-k op;
        the published variants (no renorm, or their own LM heads) through plain torch."""
        B, H = h.shape
        out = self(h)[:, :depth]  # [B, depth, H]
        if self.renorm and self.lm_heads is None:
            return head.topk(out.reshape(B * depth, H), k).indices.view(B, depth, k)
        if head.lm_head_w4 is not None or head.vocab is not None:
            raise ValueError("the 4-bit LM head (w4_lm_head=True) and a draft vocabulary draft through the fused op "
                             "of the library's own heads; these heads (published layout) read the LM head in plain torch")
        if self.renorm:
            out = rms_norm(out, head.norm_weight, head.eps)
        if self.lm_heads is None:
            logits = F.linear(out, head.lm_head)
        else:
            if self.lm_heads.shape[1] != head.lm_head.shape[0]:
                raise ValueError(f"the Medusa heads' own LM heads have vocab {self.lm_heads.shape[1]}, the "
                                 f"target's {head.lm_head.shape[0]}")
            logits = torch.einsum("bdh,dvh->bdv", out, self.lm_heads[:depth])
        return logits.topk(k, dim=-1).indices

    def config_dict(self) -> dict[str, Any]:
        out = {"kind": "medusa", "num_heads": self.num_heads, "hidden_size": self.hidden_size,
               "topk_accuracy": self.topk_accuracy}
        if (self.num_layers, self.renorm, self.lm_heads) != (1, True, None):
            out.update(num_layers=self.num_layers, renorm=self.renorm,
                       own_lm_heads=None if self.lm_heads is None else int(self.lm_heads.shape[1]))
        return out


class MTPModule(nn.Module):
    """One DeepSeek-V3-style MTP module: two RMSNorms, the split ``eh_proj``, one decoder block.

    Shape: enorm / hnorm weight [H]; eh_proj weight [H, 2H] (columns ``:H`` act on the normed
    embedding, ``H:`` on the normed previous hidden state).
    """

    def __init__(self, config: LlamaConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        H = config.hidden_size
        self.enorm_weight = nn.Parameter(torch.ones(H, dtype=dtype, device=device))
        self.hnorm_weight = nn.Parameter(torch.ones(H, dtype=dtype, device=device))
        # Init [N(0, 0.02) | I]: the module starts by passing the previous depth's (normed) state
        # through to the shared LM head, i.e. as the target's own next-token guess, and learns the
        # shift from there (without this residual-like start, a few hundred steps generalise poorly).
        self.eh_proj = nn.Parameter(torch.empty(H, 2 * H, dtype=dtype, device=device))
        with torch.no_grad():
            self.eh_proj.normal_(0.0, 0.02)
            self.eh_proj[:, H:] = torch.eye(H, dtype=dtype, device=device)
        self.block = DecoderLayer(config, dtype).to(device)
        with torch.no_grad():
            for name, p in self.block.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif p.dim() > 1:
                    p.normal_(0.0, 0.02)
                else:
                    p.zero_()


class MTPModules(nn.Module):
    """D chained MTP modules sharing the target's embeddings and LM head, and its final norm unless
    they have their own.

    ``final_norm``: each module has its own final RMSNorm before the shared head (``final_norms[d]``
    [H]; DeepSeek-V3's ``shared_head.norm``, MiMo's ``final_layernorm``); False: the target's.
    ``chain_normed``: the next depth reads a module's output after that norm (MiMo) rather than
    before it (DeepSeek-V3, and this project's trained modules); see ``chain_input``.
    """

    def __init__(self, config: LlamaConfig, num_modules: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", final_norm: bool = False, chain_normed: bool = False) -> None:
        super().__init__()
        if num_modules < 1:
            raise ValueError(f"num_modules must be >= 1, got {num_modules}")
        if chain_normed and not final_norm:
            raise ValueError("chain_normed needs the modules' own final norms (final_norm=True)")
        self.config, self.num_modules = config, num_modules
        self.modules_ = nn.ModuleList(MTPModule(config, dtype, device) for _ in range(num_modules))
        self.final_norms = nn.ParameterList(
            nn.Parameter(torch.ones(config.hidden_size, dtype=dtype, device=device)) for _ in range(num_modules)
        ) if final_norm else None
        self.chain_normed = chain_normed
        self._inv_freq: dict = {}
        self.topk_accuracy: list[list[float]] | None = None
        # What the blocks were bound with, as LlamaModel keeps it: (pack, sum of the parameters'
        # version counters); None: bind on the next inference forward.
        self._binding: tuple[bool, int] | None = None
        self._params: list[torch.Tensor] | None = None  # self.parameters(), listed once per binding

    def _apply(self, fn, recurse=True):
        # The decoder blocks bind their tensors on first use: drop the bindings when .to() /
        # .half() replace the parameters, as LlamaModel does.
        result = super()._apply(fn, recurse)
        for m in self.modules_:
            m.block.unbind()
        self._inv_freq = {}
        self._binding = self._params = None
        return result

    def _packed_blocks(self, rows: int, device: torch.device, training: bool) -> bool:
        """Whether a forward of ``rows`` token rows runs each block as one ``decoder_layer`` op
        (LlamaModel's CPU decoding path: inference, float32, AVX-512 or AVX2, at most
        ``PACKED_MAX_ROWS`` rows, ``SPECDEC_PACKED_LINEAR`` not 0); (re)binds the blocks, packed,
        after any parameter was replaced or written in place, and plainly when the packed path does
        not apply (packed copies carry no gradient, and training steps make them stale)."""
        wanted = not training and packed_path_wanted(device, self.modules_[0].eh_proj.dtype)
        if not wanted:
            if self._binding is not None:
                for m in self.modules_:
                    m.block.unbind()
                self._binding = None
            return False
        if self._params is None:
            self._params = list(self.parameters())
        versions = sum(p._version for p in self._params)
        if self._binding != (True, versions):
            for m in self.modules_:
                m.block.bind(pack=True)
            self._binding = (True, versions)
        return rows <= PACKED_MAX_ROWS

    def config_dict(self) -> dict[str, Any]:
        c = self.config
        block = {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
                                            "rope_scaling", "qkv_bias", "o_bias", "mlp_bias", "qk_norm")}
        out = {"kind": "mtp", "num_modules": self.num_modules, "block": block, "topk_accuracy": self.topk_accuracy}
        if self.final_norms is not None:
            out.update(final_norm=True, chain_normed=self.chain_normed)
        return out

    def head_for(self, depth: int, head: TargetHead) -> TargetHead:
        """The head module ``depth`` (0-based) drafts through: the target's, with the module's own
        final norm where it has one."""
        if self.final_norms is None:
            return head
        import dataclasses

        return dataclasses.replace(head, norm_weight=self.final_norms[depth])

    def chain_input(self, producer: int, h: torch.Tensor, head: TargetHead) -> torch.Tensor:
        """The hidden-state input a module reads from module ``producer``'s output ``h`` [..., H]
        (before any final norm): ``h`` itself, or, with ``chain_normed``, ``h`` through that
        module's final norm."""
        if not self.chain_normed:
            return h
        return rms_norm(h, self.final_norms[producer], head.eps)

    def new_cache(self, batch_size: int, max_length: int) -> list[StaticKVCache]:
        """One single-layer KV cache per module (each module has its own committed length per row)."""
        c, p = self.config, self.modules_[0].eh_proj
        return [StaticKVCache(1, batch_size, c.num_key_value_heads, max_length, c.head_dim, p.dtype, p.device)
                for _ in range(self.num_modules)]

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cached_cos_sin(self._inv_freq, self.config, positions, self.modules_[0].eh_proj.dtype)

    def module_input(self, depth: int, h_prev: torch.Tensor, tokens: torch.Tensor, head: TargetHead) -> torch.Tensor:
        """``eh_proj([enorm(emb(tokens)); hnorm(h_prev)])`` for module ``depth`` (0-based), through
        the fused ``ops.mtp.mtp_input`` at inference, in plain torch when training (autograd).

        Shape: h_prev [B, n, H]; tokens [B, n] int64 (token t + depth + 1 at position t) -> [B, n, H].
        """
        m = self.modules_[depth]
        if not (torch.is_grad_enabled() and m.eh_proj.requires_grad):
            from ..ops.mtp import mtp_input

            B, n, H = h_prev.shape
            x = mtp_input(h_prev.reshape(B * n, H).contiguous(), tokens.reshape(B * n).contiguous(), head.embed,
                          m.enorm_weight, m.hnorm_weight, m.eh_proj, head.eps)
            return x.to(h_prev.dtype).view(B, n, H)
        H = h_prev.shape[-1]
        e = rms_norm(F.embedding(tokens, head.embed), m.enorm_weight, head.eps)
        h = rms_norm(h_prev, m.hnorm_weight, head.eps)
        return F.linear(e, m.eh_proj[:, :H]) + F.linear(h, m.eh_proj[:, H:])

    def forward(self, depth: int, h_prev: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                cache: StaticKVCache, head: TargetHead) -> torch.Tensor:
        """Module ``depth`` (0-based) over ``n`` new positions per row on top of its own ``cache``.

        Shape: h_prev [B, n, H]; tokens / positions [B, n] int64 (causal among the new positions,
        the committed prefix visible) -> h [B, n, H] (before the final norm). K/V go to the pending
        slots; call ``cache.commit``.
        """
        B, n, _ = h_prev.shape
        x = self.module_input(depth, h_prev, tokens, head)
        span = cache.begin_forward(n)
        block = self.modules_[depth].block
        training = torch.is_grad_enabled() and block.input_layernorm.weight.requires_grad
        if self._packed_blocks(B * n, x.device, training):
            cos, sin = self._rope(positions)  # [B, n, 1, D]
            return block.forward_packed(x.contiguous(), cos.squeeze(2).contiguous(), sin.squeeze(2).contiguous(),
                                        cache.keys[0], cache.values[0], cache.lengths, None)
        steps = torch.arange(n, device=x.device)
        slot_index = (cache.lengths[:, None] + steps)[:, None, :, None].expand(
            B, self.config.num_key_value_heads, n, self.config.head_dim)
        rel = torch.arange(span, device=x.device) - cache.lengths[:, None]  # [B, span]
        visible = rel[:, None, :] <= steps[None, :, None]  # [B, n, span]: prefix, then causal
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        attn_mask = torch.where(visible[:, None], zero, torch.full((), float("-inf"), dtype=x.dtype, device=x.device))
        cos, sin = self._rope(positions)
        return block.forward(x, cos, sin, cache.keys[0], cache.values[0], slot_index, span, attn_mask)


def save_heads(folder: str | os.PathLike, heads: MedusaHeads | MTPModules, extra: dict | None = None) -> Path:
    """Write ``heads`` as ``folder/{model.safetensors, config.json}`` (renamed into place)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"))
    config = dict(heads.config_dict(), format=HEADS_FORMAT, **(extra or {}))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def load_heads(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> MedusaHeads | MTPModules:
    """Load a heads folder written by ``save_heads``; raises FileNotFoundError / ValueError naming
    it. (``models.published.load_heads`` also reads published FasterDecoding Medusa checkpoints.)"""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file() or not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder}: not a heads checkpoint (needs config.json and model.safetensors)")
    cfg = json.loads(cfg_path.read_text())
    if not isinstance(cfg, dict) or cfg.get("kind") not in ("medusa", "mtp"):
        raise ValueError(f"{cfg_path}: 'kind' must be 'medusa' or 'mtp'")
    if cfg["kind"] == "medusa":
        heads: nn.Module = MedusaHeads(int(cfg["hidden_size"]), int(cfg["num_heads"]), dtype, device,
                                       num_layers=int(cfg.get("num_layers", 1)), renorm=bool(cfg.get("renorm", True)),
                                       own_lm_heads=cfg.get("own_lm_heads"))
    else:
        block = dict(cfg["block"], num_hidden_layers=1)
        heads = MTPModules(LlamaConfig(**block), int(cfg["num_modules"]), dtype, device,
                           final_norm=bool(cfg.get("final_norm", False)), chain_normed=bool(cfg.get("chain_normed", False)))
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = heads.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder}: tensors missing {missing[:4]} / unexpected {unexpected[:4]}")
    heads.topk_accuracy = cfg.get("topk_accuracy")
    heads.requires_grad_(False)
    return heads.to(device)


def random_heads(target, kind: str, count: int, seed: int = 0, scale: float = 1.0) -> MedusaHeads | MTPModules:
    """Randomly initialised heads for ``target`` (tests: losslessness does not depend on their
    quality). ``count``: Medusa heads or MTP modules; weights ~ N(0, scale^2 / fan_in), norms 1."""
    head = target_head(target)
    H = head.norm_weight.shape[0]
    if kind == "medusa":
        heads: nn.Module = MedusaHeads(H, count, head.lm_head.dtype, head.lm_head.device)
    elif kind == "mtp":
        heads = MTPModules(mtp_block_config(head), count, head.lm_head.dtype, head.lm_head.device)
    else:
        raise ValueError(f"kind must be 'medusa' or 'mtp', got {kind!r}")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in heads.named_parameters():
            if name.endswith("norm_weight") or name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * scale / fan_in ** 0.5)
        if kind == "mtp":
            # Carry the previous depth's state through (identity on eh_proj's hidden half), like the
            # Medusa heads' residual: random modules then guess like the target's own next-token
            # head, so some drafts are accepted and the verification paths all run.
            for m in heads.modules_:
                m.eh_proj[:, H:] += torch.eye(H, dtype=m.eh_proj.dtype, device=m.eh_proj.device)
    return heads.requires_grad_(False)


def mtp_block_config(head: TargetHead) -> LlamaConfig:
    """The MTP block's config: the target's layer sizes, one layer."""
    import dataclasses

    return dataclasses.replace(head.config, num_hidden_layers=1)
