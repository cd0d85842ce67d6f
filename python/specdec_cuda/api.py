"""The public entry points: ``generate`` and ``SpeculativeDecoder``."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import torch

from . import methods
from .contract import SamplingParams
from .decoding import decode
from .models.protocol import batch_invariant
from .outputs import GenerationResult, StreamCallback
from .policy import make_policy
from .policy_memory import PolicyMemory


class InexactVerificationWarning(UserWarning):
    """A speculative method runs on a target whose forwards are not batch invariant
    (``models.protocol.batch_invariant``): greedy output equals autoregressive output except where
    a wider forward's rounding flips a near-tie. Shown once per kind of target; filter it with
    ``warnings.filterwarnings("ignore", category=InexactVerificationWarning)``."""


_WARNED: set[str] = set()


def _warn_if_inexact(target, method: str) -> None:
    if batch_invariant(target):
        return
    kind = type(target).__name__
    if kind in _WARNED:
        return
    _WARNED.add(kind)
    where = ("the transformers adapter (its matmuls and attention block by shape)" if kind == "HFCausalLM" else
             f"{kind}'s forward (not its packed CPU path or GGUF blocks)")
    warnings.warn(f"method {method!r} verifies drafts through {where}: a row of a verification forward may round "
                  f"differently from the same token decoded alone, so greedy output can differ from autoregressive "
                  f"output at near-ties (Metrics.batch_invariant is False). The built-in model on its packed CPU "
                  f"path (float32 / bfloat16) or GGUF blocks is exact.", InexactVerificationWarning, stacklevel=3)


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
    """Token id lists from a [B, P] / [P] tensor, a list of id lists, or one id list."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        if prompts.dim() != 2:
            raise ValueError(f"prompts tensor must be [B, P] or [P], got shape {tuple(prompts.shape)}")
        if prompts.dtype.is_floating_point or prompts.dtype.is_complex or prompts.dtype == torch.bool:
            raise TypeError(f"prompts must hold integer token ids, got a {prompts.dtype} tensor")
        return prompts.tolist()
    prompts = list(prompts)
    if prompts and not isinstance(prompts[0], (list, tuple, torch.Tensor)) and hasattr(prompts[0], "__index__"):
        prompts = [prompts]
    out = []
    for b, p in enumerate(prompts):
        ids = p.tolist() if isinstance(p, torch.Tensor) else list(p)
        bad = [t for t in ids if isinstance(t, bool) or not hasattr(t, "__index__")]
        if bad:
            raise TypeError(f"prompts must hold integer token ids, got {type(bad[0]).__name__} {bad[0]!r} in prompt {b}")
        out.append([int(t) for t in ids])
    return out


class SpeculativeDecoder:
    """A target and a decoding method set up once, for repeated ``generate`` calls.

    Parameters
    ----------
    target : built-in model, ``transformers`` causal LM, or checkpoint folder
    method : a registered method (``specdec_cuda.methods.describe()`` or ``python -m specdec_cuda
        methods`` lists them with their options), e.g. ``"autoregressive"`` or ``"draft"``
    **options : the method's options, e.g. for ``"draft"``: ``draft`` (the drafter, same
        tokenizer), ``k``, ``adaptive_k``, ``verification``; for every speculative method
        ``policy`` (``"cost"``: measured costs and acceptance choose each row's draft length per
        step, 0 included; ``"fixed"``: always the method's most). Unknown options raise TypeError.

    Example
    -------
    >>> dec = SpeculativeDecoder(target, method="draft", draft=draft, k=4)      # doctest: +SKIP
    >>> out = dec.generate([[1, 2, 3]], max_new_tokens=32, temperature=0.7)   # doctest: +SKIP
    >>> out.tokens[0], out.metrics.tau                                          # doctest: +SKIP
    """

    def __init__(self, target, method: str = "autoregressive", **options) -> None:
        self.spec = methods.get(method)
        self.spec.check_options(options)
        self.method = method
        # A generation mode brings its own model (e.g. a diffusion LM): its make() loads it.
        self.target = target if self.spec.kind == "generation" else as_causal_lm(target)
        policy = options.pop("policy", None)
        built = self.spec.make(self.target, **options)
        self.proposer = built if self.spec.kind == "speculative" else None  # None: autoregressive
        self.generator = built if self.spec.kind == "generation" else None
        # One policy for the decoder's life: the step costs it measures carry over between calls,
        # and (the cost policy) to the next process through its memory file.
        policy = policy if policy is not None else self.spec.default_policy
        memory = PolicyMemory.for_decoder(self.target, method, options) if policy == "cost" and self.proposer else None
        self.policy = make_policy(policy, memory=memory) if self.proposer else None
        if self.proposer is not None:
            _warn_if_inexact(self.target, method)

    def generate(self, prompts, max_new_tokens: int = 64, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                 eos_token_id: int | Sequence[int] | None = None,
                 stream: StreamCallback | None = None) -> GenerationResult:
        """Generate for a batch of prompts (token id lists, or a [B, P] tensor).

        Sampling parameters and ``seed`` are scalars or one value per prompt. ``stream(row,
        token_ids)`` is called with each row's new tokens after every step. Returns the generated
        ids per prompt (EOS included when hit) and the run's ``Metrics``.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        prompts = _as_prompts(prompts)
        device = self.generator.model.device if self.generator is not None else self.target.device
        params = SamplingParams.make(len(prompts), temperature, top_k, top_p, seed, device)
        eos = () if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        if self.generator is not None:
            return self.generator.generate(prompts, params, max_new_tokens, list(eos), stream)
        return decode(self.target, prompts, params, max_new_tokens, proposer=self.proposer,
                      eos_token_id=list(eos), stream=stream, policy=self.policy)


def generate(target, prompts, method: str = "autoregressive", max_new_tokens: int = 64, temperature=0.0,
             top_k=0, top_p=1.0, seed=0, eos_token_id=None, stream: StreamCallback | None = None,
             **options) -> GenerationResult:
    """Generate with ``method`` and its ``options`` (see ``SpeculativeDecoder``); one-shot form.

    Greedy (``temperature=0``) output is token for token the target's greedy output, and sampled
    output has the target's distribution, whichever lossless method is used.
    """
    decoder = SpeculativeDecoder(target, method=method, **options)
    return decoder.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, eos_token_id=eos_token_id, stream=stream)
