"""The DFlash drafter's two steps on its packed CPU path, each as one CPU op.

``dflash_block_topk`` (a draft): the anchors' embeddings go into row 0 of the block, each drafter
layer runs as the ``decoder_layer`` op computes it (over that layer's cache, the block seeing
itself whole), then the drafted positions go through the final norm and the packed LM head's
top-k. ``dflash_extend`` (the committed tokens' context): the target's hidden states concatenated,
the ``context_kv`` op at the rows' positions, the cache's lengths advanced. The drafter
(``models.dflash.DFlashDrafter``: ``draft_topk`` / ``draft_tokens``, ``extend``) calls them on its
packed CPU path: the torch calls around those kernels, each finding the dispatcher cold after the
target's forward, were a third of a zoo DDTree block and half of its extend in a decoding run.
Their reference is the drafter's torch path (``draft`` then ``log_softmax`` and ``topk``;
``context_features`` and ``context_kv``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .. import _native  # noqa: F401  (registers torch.ops.specdec)
from .skinny_linear import PackedWeight

__all__ = ["LAYER_WEIGHTS", "dflash_block_topk", "dflash_extend"]

# Per drafter layer, the weights the op takes, in this order (the ``decoder_layer`` op's; the
# projections packed, the biases and the q / k norms may be None).
LAYER_WEIGHTS = ("norm1", "norm2", "qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "gate_up_b", "down_w", "down_b",
                 "q_norm", "k_norm")


def dflash_block_topk(anchors: torch.Tensor, embed: torch.Tensor, block: torch.Tensor, rope_cos: torch.Tensor,
                      rope_sin: torch.Tensor, layers: Sequence[torch.Tensor | None], norm_eps: float,
                      k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor], lengths: torch.Tensor,
                      num_heads: int, depth: int, final_norm: torch.Tensor, head: PackedWeight, k: int, *,
                      vocab_ids: torch.Tensor | None = None, log_probs: bool = True,
                      sm_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-``k`` of the drafter's distributions at the block's positions 1 .. ``depth``.

    Parameters
    ----------
    anchors : each row's last committed token (the block's row 0).
    embed : the target's embedding table, float32.
    block : the block's input, float32: rows 1 .. n - 1 hold the MASK embedding; row 0 is written.
    rope_cos, rope_sin : cos and signed sin of positions 0 .. P - 1 (the drafter's ``_rope_table``);
        row ``b``'s block sits at positions ``lengths[b] + i``.
    layers : ``len(LAYER_WEIGHTS)`` tensors per drafter layer, in that order.
    k_caches, v_caches : per layer the drafter's context K / V; the block's K / V are written to
        the scratch slots ``lengths[b] + i`` past each row's context (the next extend overwrites them).
    lengths : each row's context length (not changed).
    head : the LM head over the vocabulary the draft ranks (``pack_weight`` of [N, H]).
    vocab_ids : the token ids of the head's N rows (a draft vocabulary); None: row j is token j.
    log_probs : values as log-probabilities (the head's top-k logits less each row's log-sum-exp
        over the N rows), else the logits.
    sm_scale : attention scale (default ``head_dim ** -0.5``).

    Shape:
        anchors [B] int64; embed [V, H]; block [B, n, H]; rope_cos / rope_sin [P, D] (P >=
        max(lengths) + n); k_caches / v_caches: [B, Hkv, T, D] each (T >= max(lengths) + n);
        lengths [B] int64; final_norm [H]. Returns values [B, depth, k] float32 (descending along
        k), token ids [B, depth, k] int64 and status [B * depth] int32 (row ``b * depth + i - 1``:
        0, or ``STATUS_NONFINITE_LOGITS`` for position i of row b; such a row's values and ids are
        unspecified). Bad shapes, ids outside the embedding or positions past the tables raise
        RuntimeError naming the input. CPU only.
    """
    head_dim = rope_cos.shape[-1]
    return torch.ops.specdec.dflash_block_topk(
        anchors, embed, block, rope_cos, rope_sin, list(layers), float(norm_eps), list(k_caches), list(v_caches),
        lengths, int(num_heads), float(head_dim ** -0.5 if sm_scale is None else sm_scale), int(depth), final_norm,
        head.panels, head.out_features, vocab_ids, int(k), bool(log_probs))


def dflash_extend(hidden: Sequence[torch.Tensor], fc: PackedWeight, context_norm: torch.Tensor, kv: PackedWeight,
                  kv_bias: torch.Tensor | None, k_norm: torch.Tensor, norm_eps: float, rope_cos: torch.Tensor,
                  rope_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                  num_new: torch.Tensor) -> None:
    """Extend the drafter's cache by ``n`` committed tokens: the ``context_kv`` op over the target's
    hidden states at the layers the drafter reads (concatenated along features, in ``hidden``'s
    order), each row's tokens at positions and slots ``lengths[b] + j`` (RoPE rows of the tables),
    then ``lengths[b] += num_new[b]`` in place. Tokens past ``num_new[b]`` land in scratch slots a
    later extend overwrites.

    Shape: hidden: [B, n, H_l] float32 per layer read; fc packed [H, sum H_l]; context_norm [H]; kv
    packed [L * 2 * Hkv * D, H], kv_bias [L * 2 * Hkv * D] or None; k_norm [L, D]; rope_cos /
    rope_sin [P, D] (P >= max(lengths) + n); k_cache / v_cache [L, B, Hkv, T, D] float32, written;
    lengths [B] int64, advanced; num_new [B] int64 in [0, n]. Bad shapes or positions raise
    RuntimeError naming the input. CPU only."""
    torch.ops.specdec.dflash_extend(list(hidden), fc.panels, context_norm, kv.panels, kv_bias, k_norm, float(norm_eps),
                                    rope_cos, rope_sin, k_cache, v_cache, lengths, num_new)


@torch.library.register_fake("specdec::dflash_block_topk")
def _dflash_block_topk_fake(anchors, embed, block, rope_cos, rope_sin, layers, norm_eps, k_caches, v_caches, lengths,
                            num_heads, sm_scale, depth, final_norm, head, vocab_size, vocab_ids, k, log_probs):
    B = block.shape[0]
    return (block.new_empty(B, depth, k), block.new_empty(B, depth, k, dtype=torch.int64),
            block.new_empty(B * depth, dtype=torch.int32))


@torch.library.register_fake("specdec::dflash_extend")
def _dflash_extend_fake(hidden, fc_w, context_norm, kv_w, kv_b, k_norm, norm_eps, rope_cos, rope_sin, k_cache, v_cache,
                        lengths, num_new):
    return None
