"""The public entry points: ``generate`` and ``SpeculativeDecoder``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from .decoding import GenerationResult, SamplingParams, StreamCallback, decode

METHODS = ("autoregressive", "draft")


def as_causal_lm(model, dtype: torch.dtype | None = None, device=None):
    """A model behind the protocol: built-in models pass through, ``transformers`` models are
    wrapped in ``HFCausalLM``, and a checkpoint folder is loaded with ``models.load``."""
    from . import models

    if isinstance(model, (str, Path)):
        kwargs = {} if dtype is None else {"dtype": dtype}
        return models.load(model, device=device or "cpu", **kwargs)
    if isinstance(model, models.CausalLM):
        return model
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency of the dev setup only
        PreTrainedModel = ()
    if isinstance(model, PreTrainedModel):
        return models.HFCausalLM(model)
    raise TypeError(f"expected a specdec_cuda model, a transformers model or a checkpoint folder, got "
                    f"{type(model).__name__}")


def _as_prompts(prompts) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        if prompts.dim() != 2:
            raise ValueError(f"prompts tensor must be [B, P] or [P], got shape {tuple(prompts.shape)}")
        return prompts.tolist()
    prompts = list(prompts)
    if prompts and isinstance(prompts[0], int):
        prompts = [prompts]
    return [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompts]


class SpeculativeDecoder:
    """A target (and drafter) set up once, for repeated ``generate`` calls.

    Parameters
    ----------
    target : built-in model, ``transformers`` causal LM, or checkpoint folder
    method : ``"autoregressive"`` or ``"draft"`` (draft-model speculative decoding)
    draft : the drafter for ``method="draft"`` (same tokenizer as the target)
    k : draft tokens per step (the starting k when ``adaptive_k``)
    adaptive_k : +2 after a fully accepted step, -1 otherwise, within ``[k_min, k_max]``
    confidence_threshold : stop a row's draft where the drafter's max probability drops below it
    verification : ``"rejection"`` (lossless, uses draft logits), ``"match"`` (lossless
        sample-and-match with greedy drafts), ``"typical"`` (lossy typical acceptance)

    Example
    -------
    >>> dec = SpeculativeDecoder(target, method="draft", draft=draft, k=4)      # doctest: +SKIP
    >>> out = dec.generate([[1, 2, 3]], max_new_tokens=32, temperature=0.7)   # doctest: +SKIP
    >>> out.tokens[0], out.metrics.tau                                          # doctest: +SKIP
    """

    def __init__(self, target, method: str = "autoregressive", draft=None, k: int = 4, adaptive_k: bool = False,
                 k_min: int = 1, k_max: int | None = None, confidence_threshold: float | None = None,
                 verification: str = "rejection") -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.target = as_causal_lm(target)
        self.method = method
        self.proposer = None
        if method == "draft":
            if draft is None:
                raise ValueError('method="draft" needs a draft model (draft=...)')
            from .proposers.draft_model import DraftModelProposer

            drafter = as_causal_lm(draft, dtype=self.target.dtype, device=self.target.device)
            if drafter.vocab_size != self.target.vocab_size:
                raise ValueError(f"the draft's vocabulary ({drafter.vocab_size}) differs from the target's "
                                 f"({self.target.vocab_size}); they must share a tokenizer")
            self.proposer = DraftModelProposer(drafter, k=k, adaptive=adaptive_k, k_min=k_min, k_max=k_max,
                                               confidence_threshold=confidence_threshold,
                                               verification=verification)

    def generate(self, prompts, max_new_tokens: int = 64, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                 eos_token_id: int | Sequence[int] | None = None,
                 stream: StreamCallback | None = None) -> GenerationResult:
        """Generate for a batch of prompts (token id lists, or a [B, P] tensor).

        Sampling parameters and ``seed`` are scalars or one value per prompt. ``stream(row,
        token_ids)`` is called with each row's new tokens after every step. Returns the generated
        ids per prompt (EOS included when hit) and the run's ``Metrics``.
        """
        prompts = _as_prompts(prompts)
        params = SamplingParams.make(len(prompts), temperature, top_k, top_p, seed, self.target.device)
        eos = () if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        return decode(self.target, prompts, params, max_new_tokens, proposer=self.proposer,
                      max_draft=0 if self.proposer is None else self.proposer.max_draft,
                      eos_token_id=list(eos), stream=stream,
                      typical=self.proposer is not None and self.proposer.typical)


def generate(target, prompts, method: str = "autoregressive", draft=None, max_new_tokens: int = 64,
             temperature=0.0, top_k=0, top_p=1.0, seed=0, k: int = 4, adaptive_k: bool = False,
             eos_token_id=None, stream: StreamCallback | None = None, **options) -> GenerationResult:
    """Generate with ``method`` (see ``SpeculativeDecoder`` for the options); one-shot form.

    Greedy (``temperature=0``) output is token for token the target's greedy output, and sampled
    output has the target's distribution, whichever lossless method is used.
    """
    decoder = SpeculativeDecoder(target, method=method, draft=draft, k=k, adaptive_k=adaptive_k, **options)
    return decoder.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, eos_token_id=eos_token_id, stream=stream)
