"""The kernels' Python face: one module per op family, all re-exported here."""

from __future__ import annotations

from .sampling import *  # noqa: E402,F401,F403  (sample, verify_chain, Purpose, raise_on_status, ...)
from .sampling import __all__ as _sampling_all  # noqa: E402
from .tree import build_tree, compact_kv, lookahead_mask, verify_tree  # noqa: E402,F401
from . import quant  # noqa: E402,F401  (quantize_w4, w4a16_matmul, w4_dequantize, PackedW4)
from .quant import PackedW4, quantize_w4, repack_w4, w4_dequantize, w4a16_matmul  # noqa: E402,F401
from . import kv_quant  # noqa: E402,F401  (hierarchical 4-bit KV cache ops)
from .diffusion import diffusion_unmask  # noqa: E402,F401  (masked-diffusion generation step)
from . import ddtree  # noqa: E402,F401  (DDTree: best draft tree under a node budget)
from .ddtree import ddtree_build  # noqa: E402,F401
from .quant_attention import quant_kv_attention  # noqa: E402,F401  (attention over the int4 KV cache)
from . import mtp  # noqa: E402,F401  (fused MTP-head ops: mtp_head_topk, mtp_input)
from .skinny_linear import pack_weight, skinny_linear, skinny_linear_packed  # noqa: E402,F401  (few-row linears, CPU)
from .decoder_layer import context_kv, decoder_layer  # noqa: E402,F401  (one decoder layer as one op, CPU)
from .dflash import dflash_block_topk, dflash_extend  # noqa: E402,F401  (the DFlash drafter's steps, CPU)
from . import gguf  # noqa: E402,F401  (GGUF k-quant / legacy blocks read as stored in the file)
from .gguf import GgufLinear, GgufWeight, gguf_dequantize, gguf_linear, gguf_matmul, gguf_rows, gguf_weight  # noqa: E402,F401,E501

__all__ = [
    *_sampling_all,
    "build_tree", "verify_tree", "compact_kv", "lookahead_mask",
    "quant", "PackedW4", "quantize_w4", "w4a16_matmul", "w4_dequantize",
    "kv_quant",
    "diffusion_unmask",
    "ddtree", "ddtree_build",
    "quant_kv_attention",
    "mtp",
    "skinny_linear", "pack_weight", "skinny_linear_packed",
    "decoder_layer", "context_kv",
    "dflash_block_topk", "dflash_extend",
    "gguf", "GgufWeight", "GgufLinear", "gguf_weight", "gguf_matmul", "gguf_linear", "gguf_rows", "gguf_dequantize",
]
