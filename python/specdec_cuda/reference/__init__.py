"""Plain-PyTorch specification of every op; tests hold the kernels to it."""

from . import philox, sampling, tree

__all__ = ["philox", "sampling", "tree"]
