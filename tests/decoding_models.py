"""Tiny random Llama checkpoints for the decoding tests, and the two model backends."""

from __future__ import annotations

import torch

from specdec_cuda import models


def make_checkpoint(folder, vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, seed=0, perturb_from=None,
                    noise=0.0):
    """Save a random LlamaForCausalLM; with ``perturb_from`` (a folder), its weights plus noise.

    Random weights are scaled up (std 0.2) so the next-token distributions are peaked, as in a
    trained model, and a perturbed copy agrees with its source often but not always.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if perturb_from is not None:
        model = LlamaForCausalLM.from_pretrained(perturb_from, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * p.std() * torch.randn_like(p))
    else:
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             max_position_embeddings=256, tie_word_embeddings=False, initializer_range=0.2)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return folder


def load_backend(folder, backend: str, dtype=torch.float64):
    """``builtin``: specdec_cuda.models.load; ``hf``: transformers model behind HFCausalLM."""
    if backend == "builtin":
        return models.load(folder, dtype=dtype)
    from transformers import LlamaForCausalLM

    return models.HFCausalLM(LlamaForCausalLM.from_pretrained(folder, dtype=dtype).eval())
