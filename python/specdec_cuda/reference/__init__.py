"""Plain-PyTorch specification of every op; tests hold the kernels to it."""

from . import decoder_layer, diffusion, gguf, kv_quant, philox, quant, quant_attention, sampling, skinny_linear, tree

__all__ = ["decoder_layer", "diffusion", "gguf", "kv_quant", "philox", "quant", "quant_attention", "sampling", "skinny_linear", "tree"]
