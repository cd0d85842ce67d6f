"""Plain-PyTorch specification of every op; tests hold the kernels to it."""

from . import kv_quant, philox, quant, sampling, tree

__all__ = ["kv_quant", "philox", "quant", "sampling", "tree"]
