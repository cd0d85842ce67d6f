"""Checkpoint MTP layers on transformers' own decoder blocks: DeepSeek-V3 / R1, GLM-4.5, Qwen3-Next.

These checkpoints' main models (multi-head latent attention, mixtures of experts, gated attention,
linear-attention layers) run through ``HFCausalLM``; ``transformers`` drops their MTP tensors when
it loads them. ``load_hf_mtp`` reads those tensors from the checkpoint folder and builds, for MTP
layer i, the architecture's own decoder-layer class (the class of the target's decoder layers,
from the target's config) with layer i's weights, wrapped as ``HFMTPModules``: the interface of
``models.heads.MTPModules`` that ``proposers.mtp`` drives (chains only).

MTP layer i at position t, as the architectures define it (``h``: the previous depth's hidden
state at t; depth 1 reads the main model's final normed hidden state; ``e``: the embedding of
token t + i + 1; every RMSNorm with the config's ``rms_norm_eps``):

* DeepSeek-V3 / R1, GLM-4.5 (``model.layers.{N + i}.*``, N = num_hidden_layers):
  ``x = eh_proj([enorm(e); hnorm(h)])`` (embedding half first), ``y = block(x)`` (one decoder layer
  of the model's kind: DeepSeek MLA + MoE, GLM-4.5 GQA with partial RoPE + MoE; both residual adds
  inside), logits ``= shared_head.head(shared_head.norm(y))``. The next depth reads ``y`` (before
  ``shared_head.norm``). ``e`` comes from the layer's own ``embed_tokens`` and the head from its own
  ``shared_head.head`` where the checkpoint stores them (DeepSeek-V3 stores copies of the main
  model's; a copy equal to the target's tensor is not kept twice), else the target's.
* Qwen3-Next (``mtp.*``): ``x = fc([pre_fc_norm_embedding(e); pre_fc_norm_hidden(h)])``,
  ``y = mtp.norm(block_i(x))`` (a full-attention layer: gated attention, q/k norms, partial RoPE,
  MoE with a gated shared expert), logits ``= lm_head(y)`` with the target's embeddings and LM head.
  The next depth reads ``y`` (after ``mtp.norm``). Its RMSNorms are zero-centred (``1 + w``): the
  module keeps ``1 + w`` as its norm weights.

Not done, as the reference engines do not define it either: vLLM zeroes the embedding at
position 0 for DeepSeek / GLM MTP layers; the architectures' definitions do not, nor does this
library (it would only touch the prefill's first position).

Each layer keeps its own one-layer cache, an ``HFCache`` (per-row lengths, holes masked, commit and
truncate through the kernels the target's cache uses), with an explicit 4-D additive mask.
Precision: transformers' blocks compute their RMSNorms, routers and eager softmax in float32, so a
float64 module matches a float64 reference to ~1e-6, not to float64 rounding.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping

import torch
from torch import nn

from .config import UnsupportedModelError
from .layers import rms_norm

# Layer i's tensors outside its decoder block, per layout: name -> where (``{p}``: the layer's prefix).
_DEEPSEEK_SIDE = {"enorm": "{p}enorm.weight", "hnorm": "{p}hnorm.weight", "eh_proj": "{p}eh_proj.weight",
                  "final_norm": "{p}shared_head.norm.weight", "lm_head": "{p}shared_head.head.weight",
                  "embed": "{p}embed_tokens.weight"}
_QWEN3_NEXT_SIDE = {"enorm": "mtp.pre_fc_norm_embedding.weight", "hnorm": "mtp.pre_fc_norm_hidden.weight",
                    "eh_proj": "mtp.fc.weight", "final_norm": "mtp.norm.weight"}


class HFMTPModules(nn.Module):
    """D MTP layers on transformers decoder blocks (see the module docstring).

    Per layer d: enorm / hnorm / final-norm weights [H] (zero-centred norms stored as ``1 + w``),
    eh_proj [H, 2H] (columns ``:H`` on the embedding), a transformers decoder layer, and optional
    own embeddings [V, H] / LM head [V, H] (None: the target's).
    ``chain_normed``: the next depth reads a layer's output after its final norm (Qwen3-Next).
    """

    def __init__(self, layout: str, config, blocks: list[nn.Module], side: list[dict[str, torch.Tensor | None]],
                 rotary: nn.Module, eps: float, chain_normed: bool) -> None:
        super().__init__()
        self.layout, self.config, self.eps, self.chain_normed = layout, config, float(eps), chain_normed
        self.num_modules = len(blocks)
        self.blocks = nn.ModuleList(blocks)
        frozen = lambda t: nn.Parameter(t, requires_grad=False)  # noqa: E731
        self.enorm_weights = nn.ParameterList(frozen(s["enorm"]) for s in side)
        self.hnorm_weights = nn.ParameterList(frozen(s["hnorm"]) for s in side)
        self.eh_projs = nn.ParameterList(frozen(s["eh_proj"]) for s in side)
        self.final_norms = nn.ParameterList(frozen(s["final_norm"]) for s in side)
        # Own embeddings / LM heads where the checkpoint has ones that differ from the target's.
        self.embeds = [s.get("embed") for s in side]
        self.lm_heads = [s.get("lm_head") for s in side]
        self._rotary = (rotary,)  # the target's rotary embedding (not a submodule: .to() must not move it)
        params = inspect.signature(blocks[0].forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.topk_accuracy = None

    def head_for(self, depth: int, head):
        """The head module ``depth`` (0-based) drafts through: its final norm, its own LM head if any."""
        own = self.lm_heads[depth]
        extra = {} if own is None else dict(lm_head=own, lm_head_w4=None, lm_head_packed=None)
        return dataclasses.replace(head, norm_weight=self.final_norms[depth], eps=self.eps, **extra)

    def chain_input(self, producer: int, h: torch.Tensor, head) -> torch.Tensor:
        """What the next depth reads from layer ``producer``'s output ``h`` [..., H]."""
        return rms_norm(h, self.final_norms[producer], self.eps) if self.chain_normed else h

    def new_cache(self, batch_size: int, max_length: int) -> list:
        """One single-layer ``HFCache`` per layer."""
        from transformers import DynamicCache

        from .hf_adapter import HFCache

        device = self.eh_projs[0].device
        return [HFCache(DynamicCache(), batch_size, max_length, device) for _ in range(self.num_modules)]

    def forward(self, depth: int, h_prev: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache,
                head) -> torch.Tensor:
        """Layer ``depth`` (0-based) over ``n`` new positions per row on top of its own ``cache``.

        Shape: h_prev [B, n, H]; tokens / positions [B, n] int64 (token t + depth + 1 at position t;
        causal among the new positions, the committed prefix visible) -> [B, n, H] (the block's
        output, before the final norm). K/V go to the pending slots; call ``cache.commit``.
        """
        from ..ops.mtp import mtp_input

        B, n, H = h_prev.shape
        embed = self.embeds[depth] if self.embeds[depth] is not None else head.embed
        x = mtp_input(h_prev.reshape(B * n, H).contiguous(), tokens.reshape(B * n).contiguous(), embed,
                      self.enorm_weights[depth], self.hnorm_weights[depth], self.eh_projs[depth], self.eps)
        x = x.to(h_prev.dtype).view(B, n, H)
        cache.begin_forward(n, positions)
        P = cache.max_length_committed  # physical slot of the first new token
        committed = torch.arange(P, device=x.device)[None, :] < cache.lengths[:, None]  # [B, P]
        steps = torch.arange(n, device=x.device)
        visible = torch.cat([committed[:, None, :].expand(B, n, P),
                             (steps[None, :] <= steps[:, None]).expand(B, n, n)], dim=2)  # [B, n, P + n]
        mask = torch.zeros(B, 1, n, P + n, dtype=x.dtype, device=x.device)
        mask.masked_fill_(~visible[:, None], torch.finfo(x.dtype).min)
        cos_sin = self._rotary[0](x, positions)
        out = self.blocks[depth](hidden_states=x, attention_mask=mask, position_ids=positions,
                                 position_embeddings=cos_sin, **{self._cache_arg: cache.dynamic})
        return out[0] if isinstance(out, tuple) else out


def _block_state(block: nn.Module, tensors: Mapping[str, torch.Tensor], prefix: str, where: str
                 ) -> dict[str, torch.Tensor]:
    """The state dict of ``block`` from the checkpoint tensors under ``prefix``: names as the block
    has them, or experts stored one by one (``experts.{e}.{gate,up,down}_proj.weight``, the hub
    layout) stacked into transformers' fused ``experts.gate_up_proj`` [E, 2I, H] / ``experts.down_proj``
    [E, H, I]. ValueError naming a missing or misshapen tensor."""

    def read(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"{where}: tensor {name} is missing")
        return tensors[name]

    state = {}
    for name, want in block.state_dict(keep_vars=True).items():
        full = prefix + name
        if full in tensors:
            t = tensors[full]
        elif name.endswith("experts.gate_up_proj"):
            base = full[: -len("gate_up_proj")]
            t = torch.stack([torch.cat([read(f"{base}{e}.gate_proj.weight"), read(f"{base}{e}.up_proj.weight")])
                             for e in range(want.shape[0])])
        elif name.endswith("experts.down_proj"):
            base = full[: -len("down_proj")]
            t = torch.stack([read(f"{base}{e}.down_proj.weight") for e in range(want.shape[0])])
        else:
            read(full)  # raises
        if tuple(t.shape) != tuple(want.shape):
            raise ValueError(f"{where}: tensor {full} has shape {tuple(t.shape)}, expected {tuple(want.shape)}")
        state[name] = t
    return state


def load_hf_mtp(target, tensors: Mapping[str, torch.Tensor], layout: str, count: int) -> HFMTPModules:
    """The ``count`` MTP layers of ``layout`` (``deepseek_v3``, ``glm4_moe``, ``qwen3_next``) from the
    checkpoint ``tensors`` of ``target`` (an ``HFCausalLM``), in its dtype and device."""
    from .heads import target_head
    from .hf_adapter import HFCausalLM

    if not isinstance(target, HFCausalLM):
        raise UnsupportedModelError(
            f"the {layout} MTP layers run on transformers' own decoder blocks: load the checkpoint with "
            f"transformers and pass specdec_cuda.models.HFCausalLM(model) as the target")
    model, config = target.model, target.config
    base = getattr(model, model.base_model_prefix, None)
    layers, rotary = getattr(base, "layers", None), getattr(base, "rotary_emb", None)
    if layers is None or rotary is None:
        raise UnsupportedModelError(f"{type(model).__name__}: no decoder layers / rotary embedding at "
                                    f"model.{model.base_model_prefix} to build its MTP layers from")
    block_cls = type(layers[-1])
    dtype, device = target.dtype, target.device
    head = target_head(target)
    H, N = int(config.hidden_size), int(config.num_hidden_layers)
    zero_centred = layout == "qwen3_next"

    def side_tensor(key: str, p: str, shape: tuple[int, ...] | None, optional: bool = False, same_as=None):
        table = _QWEN3_NEXT_SIDE if zero_centred else _DEEPSEEK_SIDE
        if key not in table:
            return None
        name = table[key].format(p=p)
        if name not in tensors:
            if optional:
                return None
            raise ValueError(f"{layout} MTP layer: tensor {name} is missing")
        t = tensors[name]
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"{layout} MTP layer: tensor {name} has shape {tuple(t.shape)}, expected {shape}")
        t = t.to(dtype=dtype, device=device)
        if same_as is not None and t.shape == same_as.shape and torch.equal(t, same_as):
            return None  # a stored copy of the target's own tensor
        if zero_centred and key in ("enorm", "hnorm", "final_norm"):
            t = 1.0 + t
        return t

    blocks, side = [], []
    for i in range(count):
        if zero_centred:
            p = f"mtp.layers.{i}."
            cfg = copy.deepcopy(config)
            cfg.layer_types = ["full_attention"] * max(N, i + 1)  # an MTP layer is a full-attention layer
            moe = any(n.startswith(p + "mlp.experts.") or n == p + "mlp.gate.weight" for n in tensors)
            cfg.mlp_only_layers, cfg.decoder_sparse_step = ([] if moe else [i]), 1
            index, sides_prefix = i, "mtp."
        else:
            p = f"model.layers.{N + i}."
            cfg, index, sides_prefix = config, N + i, p
        if getattr(cfg, "_attn_implementation", None) not in ("sdpa", "eager"):
            cfg = copy.deepcopy(cfg)
            cfg._attn_implementation = "sdpa"  # the layer's cache needs a 4-D mask
        quantised = [n for n in tensors if n.startswith(p) and n.endswith(("_scale_inv", "weight_scale"))]
        if quantised:  # e.g. DeepSeek-V3's published FP8 blocks: their scales would be ignored here
            raise UnsupportedModelError(f"{layout} MTP layer {i}: block-quantised weights ({quantised[0]}); "
                                        f"only unquantised (bf16 / fp16 / fp32) MTP layers are read")
        with torch.device("meta"):
            block = block_cls(cfg, index)
        state = {k: v.to(dtype=dtype, device=device)
                 for k, v in _block_state(block, tensors, p, f"{layout} MTP layer {i}").items()}
        block.load_state_dict(state, strict=True, assign=True)
        for module in block.modules():  # the layer's own one-layer cache
            if hasattr(module, "layer_idx"):
                module.layer_idx = 0
        blocks.append(block.eval().requires_grad_(False))
        side.append(dict(
            enorm=side_tensor("enorm", sides_prefix, (H,)), hnorm=side_tensor("hnorm", sides_prefix, (H,)),
            eh_proj=side_tensor("eh_proj", sides_prefix, (H, 2 * H)),
            final_norm=side_tensor("final_norm", sides_prefix, (H,)),
            embed=side_tensor("embed", sides_prefix, tuple(head.embed.shape), optional=True, same_as=head.embed),
            lm_head=side_tensor("lm_head", sides_prefix, tuple(head.lm_head.shape), optional=True,
                                same_as=head.lm_head),
        ))
    eps = float(getattr(config, "rms_norm_eps", head.eps))
    return HFMTPModules(layout, config, blocks, side, rotary, eps, chain_normed=zero_centred)
