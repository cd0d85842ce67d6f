"""Causal LMs behind one protocol (``protocol.py``): the built-in Llama/Qwen model and an adapter
for Hugging Face ``transformers`` models."""

from .cache import StaticKVCache
from .config import SUPPORTED_FAMILIES, LlamaConfig, UnsupportedModelError
from .hf_adapter import HFCache, HFCausalLM
from .llama import LlamaModel
from .loader import load
from .protocol import CausalLM, KVCache, ModelOutput

__all__ = [
    "CausalLM",
    "HFCache",
    "HFCausalLM",
    "KVCache",
    "LlamaConfig",
    "LlamaModel",
    "ModelOutput",
    "StaticKVCache",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "load",
]
