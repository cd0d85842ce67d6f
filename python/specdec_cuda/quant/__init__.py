"""4-bit weights and KV for QuantSpec-style self-speculation.

* ``W4Linear``: a drop-in ``nn.Linear`` with symmetric int4 weights (``W4Linear.from_linear``).
* ``quantize_linears``: replace chosen ``nn.Linear`` modules of a model (e.g. only the MLPs).
* ``HierarchicalKVCache``: the hierarchical 4-bit KV cache with a full-precision recent window.
"""

from __future__ import annotations

from .kv_cache import HierarchicalKVCache
from .linear import W4Linear, quantize_linears

__all__ = ["HierarchicalKVCache", "W4Linear", "quantize_linears"]
