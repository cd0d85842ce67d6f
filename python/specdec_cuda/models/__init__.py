"""Causal LMs behind one protocol (``protocol.py``): the built-in Llama/Qwen model and an adapter
for Hugging Face ``transformers`` models."""

from .protocol import CausalLM, KVCache, ModelOutput

__all__ = ["CausalLM", "KVCache", "ModelOutput"]
