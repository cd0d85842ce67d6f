"""``QuantKVModel``: the built-in model behind the model protocol on the hierarchical 4-bit KV cache
(``quant_cache.py``), the target of ``method="quantspec"`` and of its autoregressive baseline.

It sits above both ``llama.py`` and ``quant_cache.py`` (which imports nothing of ``llama.py``).
"""

from __future__ import annotations

import torch

from .llama import LlamaModel
from .protocol import ModelOutput
from .quant_cache import QuantKVCache, quantized_forward


class QuantKVModel:
    """A built-in ``LlamaModel`` behind the model protocol with the hierarchical 4-bit KV cache:
    ``new_cache`` makes a ``QuantKVCache`` and ``forward`` reads it with upper + lower bits.
    It is the target of ``method="quantspec"`` and of the autoregressive baseline it equals.

    Example::

        target = QuantKVModel(specdec_cuda.models.load("zoo/target"), key_group=64, residual=32)
        out = specdec_cuda.generate(target, prompts, method="quantspec", k=4)
    """

    def __init__(self, model, *, key_group: int = 64, value_group: int | None = None, residual: int = 32) -> None:
        if not isinstance(model, LlamaModel):
            raise TypeError(f"QuantKVModel wraps the built-in LlamaModel (specdec_cuda.models.load), got "
                            f"{type(model).__name__}")
        self.model = model
        self.key_group, self.value_group, self.residual = key_group, value_group, residual
        self.vocab_size, self.num_layers, self.hidden_size = model.vocab_size, model.num_layers, model.hidden_size
        self.config, self.eos_token_ids = model.config, model.eos_token_ids

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def batch_invariant(self) -> bool:
        """The wrapped model's projections decide it: the quantised attention scores each query over
        the same tiles of cache slots, in the same order, whatever the other queries."""
        return self.model.batch_invariant

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def new_cache(self, batch_size: int, max_length: int) -> QuantKVCache:
        c = self.model.config
        return QuantKVCache(c.num_hidden_layers, batch_size, c.num_key_value_heads, max_length, c.head_dim,
                            self.device, key_group=self.key_group, value_group=self.value_group,
                            residual=self.residual)

    def forward(self, tokens, positions, cache, tree_mask=None, hidden_layers=(), logits_at=None) -> ModelOutput:
        if not isinstance(cache, QuantKVCache):
            raise TypeError(f"QuantKVModel.forward needs a QuantKVCache (from new_cache), got {type(cache).__name__}")
        return quantized_forward(self.model, tokens, positions, cache, tree_mask, hidden_layers, logits_at=logits_at)
