"""4-bit weights for QuantSpec-style self-speculation (the 4-bit KV cache is
``specdec_cuda.models.QuantKVCache``, its ops ``specdec_cuda.ops.kv_quant``).

* ``W4Linear``: a drop-in ``nn.Linear`` with symmetric int4 weights (``W4Linear.from_linear``).
* ``quantize_linears``: replace chosen ``nn.Linear`` modules of a model (e.g. only the MLPs).
"""

from __future__ import annotations

from .linear import W4Linear, quantize_linears

__all__ = ["W4Linear", "quantize_linears"]
