"""Diffusion-LM generation (LOSSY): LLaDA-style remasking with Fast-dLLM's threshold rule and cache.

This mode is not speculative decoding. Its output is the masked-diffusion model's, not any
autoregressive target's: it is labelled lossy everywhere it appears (method ``"diffusion"``).

Per prompt the continuation is a fixed window of L = ``gen_length`` positions, all starting as the
mask token, split into blocks of ``block_length`` decoded left to right (semi-autoregressive: a
block is finished before the next one starts). A step is one model forward over the sequence and
one ``ops.diffusion_unmask`` call over the current block, which draws a token for every masked
position of the block (greedy or temperature / top-k / top-p, Philox-keyed by the row's seed, the
token's absolute position and the row's step count) with its probability as the confidence, then
keeps:

* top-n (LLaDA low-confidence remasking): the n most confident, n spread evenly so that ``steps``
  steps finish the block (``block_length / steps`` tokens per forward);
* threshold (Fast-dLLM, ``threshold`` set): every position whose confidence reaches the threshold,
  and at least the most confident one, until the block is done (``steps`` is then unused).

The rest stay masked and are drawn again at the next step.

Approximate KV cache (Fast-dLLM, ``use_cache``): at the first step of a block the whole sequence
is run once, which also stores every layer's K/V; the other steps of the block run only
* ``"prefix"``: the block and everything after it, attending to the stored K/V of the prompt and
  the finished blocks;
* ``"dual"``: the block alone, attending to the stored K/V before and after it.
Stored K/V are those of the block's first step (positions after the block are still masked, and
finished blocks do not change), refreshed when the next block starts: the approximation is that
the block's own tokens changing does not change the others' K/V. ``bench/bench_diffusion.py``
measures its effect on the output.

Prompts of different lengths are left-padded; padding is masked out of attention and RoPE
positions start at 0 at each prompt's first token, so a row's result does not depend on the batch
beyond float rounding. Text after the first EOS is dropped; once every row holds an EOS in its
finished blocks (or has ``max_new_tokens`` tokens) generation stops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from . import ops
from .contract import SamplingParams
from .methods import MethodSpec, register
from .outputs import GenerationResult, Metrics, RowOutputs, StreamCallback

CACHE_MODES = ("none", "prefix", "dual")

DIFFUSION_OPTIONS = {
    "gen_length": "tokens generated per prompt, L (default: max_new_tokens rounded up to a block); "
                  "a multiple of block_length",
    "block_length": "positions per block, decoded left to right (default 32)",
    "steps": "top-n rule: steps per block, block_length / steps tokens unmasked per forward "
             "(default block_length: one token per step)",
    "threshold": "Fast-dLLM threshold rule in (0, 1]: unmask every position whose confidence reaches "
                 "it (at least one per step); replaces steps (default off)",
    "use_cache": "Fast-dLLM approximate KV cache refreshed per block: 'none', 'prefix' (or True) or "
                 "'dual' (prefix and suffix) (default 'none')",
}


@dataclass
class DiffusionMetrics(Metrics):
    """``Metrics`` plus what diffusion decoding counts.

    ``target_forwards``: model forwards (full-sequence and cached); ``unmasked``: positions unmasked
    over all rows (text after EOS included, the parallelism achieved); ``tau``: emitted tokens per
    forward per row.
    """

    unmasked: int = 0
    full_forwards: int = 0

    @property
    def unmasked_per_forward(self) -> float:
        return self.unmasked / self.row_steps if self.row_steps else 0.0

    def as_dict(self) -> dict:
        return {**super().as_dict(), "unmasked": self.unmasked, "full_forwards": self.full_forwards,
                "unmasked_per_forward": self.unmasked_per_forward}


def _cache_mode(use_cache) -> str:
    if use_cache is True:
        return "prefix"
    if use_cache is False or use_cache is None:
        return "none"
    if use_cache in CACHE_MODES:
        return use_cache
    raise ValueError(f"use_cache must be False, True or one of {CACHE_MODES}, got {use_cache!r}")


def transfer_schedule(block_length: int, steps: int) -> list[int]:
    """How many positions each of ``steps`` steps unmasks so a block of ``block_length`` ends
    exactly at the last step: as even as possible, the larger counts first."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if k < extra else 0) for k in range(steps)]


class DiffusionGenerator:
    """Generation with a masked-diffusion LM (LOSSY: the diffusion model's text, not an AR target's).

    Parameters
    ----------
    model : a ``models.diffusion_lm.DiffusionLM`` (``mask_token_id``, bidirectional forward with
        ``past`` / ``return_kv``); see ``make_diffusion`` to load one from a folder.
    gen_length, block_length, steps, threshold, use_cache : see ``DIFFUSION_OPTIONS``.

    Example
    -------
    >>> gen = DiffusionGenerator(model, gen_length=64, block_length=32, threshold=0.9,
    ...                          use_cache="dual")  # doctest: +SKIP
    >>> gen.generate([[12, 40, 7]], SamplingParams.make(1), max_new_tokens=64).tokens  # doctest: +SKIP
    """

    lossy = True

    def __init__(self, model, gen_length: int | None = None, block_length: int = 32,
                 steps: int | None = None, threshold: float | None = None, use_cache=False) -> None:
        if not hasattr(model, "mask_token_id") or not hasattr(model, "config"):
            raise TypeError(f"diffusion generation needs a masked-diffusion LM (models.diffusion_lm.DiffusionLM), "
                            f"got {type(model).__name__}: a causal LM cannot fill masked positions")
        if not isinstance(block_length, int) or block_length < 1:
            raise ValueError(f"block_length must be a positive integer, got {block_length!r}")
        if gen_length is not None and (not isinstance(gen_length, int) or gen_length < 1
                                       or gen_length % block_length):
            raise ValueError(f"gen_length must be a positive multiple of block_length {block_length}, got {gen_length!r}")
        steps = block_length if steps is None else steps
        if not isinstance(steps, int) or not 1 <= steps <= block_length:
            raise ValueError(f"steps (per block) must be an integer in [1, block_length {block_length}], got {steps!r}")
        if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 < threshold <= 1.0):
            raise ValueError(f"threshold must be None or in (0, 1], got {threshold!r}")
        self.model = model
        self.gen_length, self.block_length, self.steps = gen_length, block_length, steps
        self.threshold = None if threshold is None else float(threshold)
        self.cache_mode = _cache_mode(use_cache)
        self.mask_id = int(model.mask_token_id)

    # -- the model calls ----------------------------------------------------------------------------

    def _block_logits(self, x, positions, valid, start, end, first_step, state):
        """Logits [B, end - start, V] of the current block; refreshes the cache at a block's first step.

        A model with ``shifted_logits`` predicts position j from the hidden state of j - 1, so the
        cached forwards also feed the position just before the block (``lead``: the last prompt
        token or the last token of the finished block before; never masked, never padding) and
        its K/V is recomputed rather than read from the cache.
        """
        model, mode = self.model, self.cache_mode
        lead = 1 if getattr(model.config, "shifted_logits", False) else 0
        if mode == "none" or first_step:
            out = model(x, positions, valid, return_kv=mode != "none")
            if mode != "none":
                state["prefix"] = [(k[:, :, :start - lead], v[:, :, :start - lead]) for k, v in out.kv]
                state["suffix"] = [(k[:, :, end:], v[:, :, end:]) for k, v in out.kv]
            return out.logits[:, start:end], True
        s = start - lead
        if mode == "prefix":
            out = model(x[:, s:], positions[:, s:], valid[:, s:], past=state["prefix"], past_valid=valid[:, :s])
            return out.logits[:, lead: lead + end - start], False
        past = [(torch.cat((pk, sk), 2), torch.cat((pv, sv), 2))
                for (pk, pv), (sk, sv) in zip(state["prefix"], state["suffix"])]
        past_valid = torch.cat((valid[:, :s], valid[:, end:]), dim=1)
        out = model(x[:, s:end], positions[:, s:end], valid[:, s:end], past=past, past_valid=past_valid)
        return out.logits[:, lead:], False

    # -- generation ---------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None,
                 max_new_tokens: int | None = None, eos_token_id: Sequence[int] | int = (),
                 stream: StreamCallback | None = None) -> GenerationResult:
        """Generate for every prompt; returns tokens per row (prompt excluded, cut after the first EOS
        and at ``max_new_tokens``) and ``DiffusionMetrics``.

        Shape: prompts: B lists of token ids; params: ``SamplingParams`` with [B] tensors (default
        greedy). ``stream(row, tokens)`` is called as each block of a row is finished.
        """
        model, device = self.model, self.model.device
        batch = len(prompts)
        if batch == 0 or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts must be a non-empty list of non-empty token id sequences")
        vocab = int(model.vocab_size)
        for b, p in enumerate(prompts):
            bad = [t for t in p if not (0 <= int(t) < vocab) or int(t) == self.mask_id]
            if bad:
                raise ValueError(f"prompt {b} holds token ids {bad[:4]} outside [0, {vocab}) or equal to the "
                                 f"mask token {self.mask_id}")
        L = self.gen_length
        if L is None:
            if max_new_tokens is None or max_new_tokens < 1:
                raise ValueError("give gen_length or a positive max_new_tokens")
            L = -(-max_new_tokens // self.block_length) * self.block_length
        max_new = L if max_new_tokens is None else int(max_new_tokens)
        if max_new > L:
            raise ValueError(f"max_new_tokens {max_new} exceeds gen_length {L}: a diffusion LM generates a fixed length")
        eos = {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}
        if params is None:
            params = SamplingParams.make(batch, device=device)
        for name in ("temperature", "top_k", "top_p", "seed"):
            if getattr(params, name).shape != (batch,):
                raise ValueError(f"params.{name} must have shape [{batch}], got {tuple(getattr(params, name).shape)}")
        max_prompt = max(len(p) for p in prompts)
        if max_prompt + L > model.config.max_position:
            raise ValueError(f"prompt ({max_prompt}) + gen_length ({L}) exceeds the model's max_position "
                             f"{model.config.max_position}")

        # Layout [B, P + L]: prompt right-aligned at P, then L masked positions.
        P = max_prompt
        prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
        x = torch.full((batch, P + L), self.mask_id, dtype=torch.int64, device=device)
        for b, p in enumerate(prompts):
            x[b, P - len(p): P] = torch.as_tensor(list(p), dtype=torch.int64, device=device)
        pad = (P - prompt_lens)[:, None]
        cols = torch.arange(P + L, device=device)[None, :]
        valid = cols >= pad  # [B, P + L]
        positions = (cols - pad).clamp(min=0)
        x = torch.where(valid, x, next(iter(eos)) if eos else 0)  # padding: any real token, never attended
        kw = {k: v.to(device) for k, v in params.kwargs().items()}
        steps_taken = torch.zeros(batch, dtype=torch.int64, device=device)
        threshold = torch.full((batch,), self.threshold or 0.0, dtype=torch.float32, device=device)
        schedule = transfer_schedule(self.block_length, self.steps)

        metrics = DiffusionMetrics()
        rows = RowOutputs(batch, max_new, eos, stream)
        start_time = time.perf_counter()
        state: dict = {}
        for blk in range(L // self.block_length):
            if all(rows.done):
                break
            start, end = P + blk * self.block_length, P + (blk + 1) * self.block_length
            step = 0
            while True:
                block = x[:, start:end]
                masked = block == self.mask_id
                remaining = masked.any(dim=1)
                if not bool(remaining.any()):
                    break
                logits, full = self._block_logits(x, positions, valid, start, end, step == 0, state)
                n = schedule[step] if step < len(schedule) else self.block_length
                res = ops.diffusion_unmask(
                    logits, block, self.mask_id, **kw, position=prompt_lens + blk * self.block_length,
                    step=steps_taken, num_transfer=n, threshold=threshold)
                status = res.status.tolist()
                if any(status):
                    b = next(i for i, s in enumerate(status) if s)
                    meaning = {1: "non-finite logits (NaN / +inf / all -inf) at a masked position",
                               3: "bad sampling parameters (temperature < 0 or NaN, top_p outside (0, 1])"}
                    raise RuntimeError(f"diffusion step flagged row {b}: status {status[b]}, "
                                       f"{meaning.get(status[b], 'unknown')}")
                x[:, start:end] = torch.where(res.keep, res.sampled, block)
                metrics.unmasked += int(res.keep.sum())
                steps_taken += remaining.to(torch.int64)
                metrics.target_forwards += 1
                metrics.full_forwards += int(full)
                metrics.row_steps += int(remaining.sum())
                step += 1
            # The block is final: emit it (cut after EOS and at max_new_tokens, as decoding does).
            for b, tokens in enumerate(x[:, start:end].tolist()):
                rows.emit(b, tokens)
        metrics.seconds = time.perf_counter() - start_time
        metrics.new_tokens = metrics.new_tokens_after_prefill = sum(len(o) for o in rows.out)
        return GenerationResult(rows.out, metrics)


def make_diffusion(target, **options) -> DiffusionGenerator:
    """The method registry's constructor for ``method="diffusion"`` (LOSSY).

    ``target``: a ``DiffusionLM``, or the path of a diffusion checkpoint folder (loaded on the CPU;
    any other checkpoint raises ``UnsupportedModelError`` naming what it is). ``options``: the keys
    of ``DIFFUSION_OPTIONS``.
    """
    unknown = sorted(set(options) - set(DIFFUSION_OPTIONS))
    if unknown:
        raise ValueError(f"unknown diffusion options {unknown}; known: {sorted(DIFFUSION_OPTIONS)}")
    if isinstance(target, (str, Path)):
        from .models.diffusion_lm import load_diffusion

        target = load_diffusion(target)
    return DiffusionGenerator(target, **options)


register(MethodSpec(
    name="diffusion",
    summary="masked-diffusion LM generation (LLaDA remasking, Fast-dLLM threshold and cache); LOSSY: "
            "the output is the diffusion model's, not an autoregressive target's",
    lossless=False,
    make=make_diffusion,
    options=DIFFUSION_OPTIONS,
    kind="generation",
))
