"""A vLLM plugin: the project's chain verification as vLLM's rejection sampler, and its proposers.

vLLM loads :func:`register` in every one of its processes (entry point group
``vllm.general_plugins``, name ``specdec_cuda``, declared in setup.py). It does two things:

* **Rejection sampler.** :func:`register` makes vLLM V1's model runner build
  :class:`VerifyChainSampler` where it would build its ``RejectionSampler``: a subclass whose
  ``forward`` verifies the whole batch with one ``ops.verify_chain`` call. vLLM's flattened logits
  are ``verify_chain``'s layout: request i's draft positions, then its bonus position, so
  ``cu = [0] + cu_num_draft_tokens`` and ``target_logits = logits`` unchanged. Temperature, top-k
  and top-p come per request from vLLM's ``SamplingMetadata`` and are applied inside the kernel;
  greedy rows (temperature 0) take the argmax, sampled rows with vLLM's one-hot drafts (n-gram,
  ``custom_class``) are verified by sample-and-match, lossless either way. The bonus token is
  verify_chain's too, so vLLM's sampler is not called.
  This also mends vLLM issue #55005 on the CPU build, where the stand-in for the Triton kernel
  that expands per-request temperature / top-k / top-p to per-token values never writes its output,
  so sampled speculative output is not lossless and greedy rows beside sampled rows drift.
  Random numbers: each step and request draws a 62-bit seed, from the request's own
  ``torch.Generator`` when it has a seed (``SamplingParams(seed=...)``: reproducible, and
  independent of its batch neighbours) and from torch's global generator otherwise; the
  kernel's Philox draws are keyed by (that seed, draft position, purpose).
  What the kernel does not do (penalties, bad words, allowed token ids, min-tokens, logit bias,
  min-p, thinking budgets, logprobs, custom logits processors, draft probabilities from a draft
  model at T > 0, vLLM's synthetic acceptance) sends the step to vLLM's own sampler, unchanged.
  ``SPECDEC_VLLM_SAMPLER=0`` in the environment leaves vLLM's sampler alone.

* **Proposers** for ``speculative_config={"method": "custom_class", "model":
  "specdec_cuda.integrations.vllm.PromptLookupProposer", "num_speculative_tokens": k}``:
  vLLM builds ``Class(vllm_config)``, calls ``load_model(target)`` and then, each step,
  ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)``, which
  returns one draft chain (a list of token ids, possibly empty) per batch row.
  :class:`PromptLookupProposer` answers from the project's C++ n-gram index. Subclass it to change
  its orders (``n_min``, ``n_max``) or ``max_occurrences``; vLLM's ``prompt_lookup_min/max`` are
  not passed to a custom class.

What does not fit vLLM's interface (trees, the Jacobi window of lookahead decoding, target hidden
states for a custom proposer, Model Runner V2) and the route for each: docs/integrations.md.

Nothing in the package imports this module, and it imports vLLM only inside :func:`register` (so
``PromptLookupProposer`` imports without vLLM).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import numpy as np
import torch

from ..ngram import NgramIndex, lookup

__all__ = ["PromptLookupProposer", "register", "install_rejection_sampler", "sampler_class"]

ENV_SWITCH = "SPECDEC_VLLM_SAMPLER"
_SEED_BITS = 62


# --- the rejection sampler --------------------------------------------------------------------

def register() -> None:
    """vLLM's plugin hook (every process, possibly more than once): installs the sampler unless
    ``SPECDEC_VLLM_SAMPLER=0``."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return
    install_rejection_sampler()


def install_rejection_sampler() -> type:
    """Makes vLLM V1's model runner build :class:`VerifyChainSampler`; idempotent. Returns it.

    The runner builds its sampler from the name ``RejectionSampler`` in its own module, bound when
    that module is imported: the name is replaced in ``vllm.v1.sample.rejection_sampler`` (for a
    runner module imported later) and in the runner's module when it is already imported.
    """
    import sys

    from vllm.v1.sample import rejection_sampler

    cls = sampler_class()
    rejection_sampler.RejectionSampler = cls
    runner = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    if runner is not None:
        runner.RejectionSampler = cls
    return cls


_SAMPLER_CLASS: type | None = None


def sampler_class() -> type:
    """:class:`VerifyChainSampler`, a subclass of the ``RejectionSampler`` of the installed vLLM
    (made on first use, so that importing this module does not import vLLM)."""
    global _SAMPLER_CLASS
    if _SAMPLER_CLASS is not None:
        return _SAMPLER_CLASS
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample import rejection_sampler

    base = rejection_sampler.RejectionSampler
    while getattr(base, "_specdec_verify_chain", False):  # installed before: subclass vLLM's own
        base = base.__bases__[0]

    class VerifyChainSampler(base):
        """vLLM's ``RejectionSampler`` with ``forward`` computed by ``ops.verify_chain`` (module
        docstring); steps the kernel cannot serve go to vLLM's ``forward``."""

        _specdec_verify_chain = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            from .. import ops  # the binary loads here, in the worker, not at plugin registration

            self._ops = ops
            self.steps_verified = 0  # steps served by verify_chain (tests read them)
            self.steps_delegated = 0  # steps sent to vLLM's own forward
            logging.getLogger("vllm.specdec_cuda").info(
                "specdec_cuda: verify_chain is vLLM's rejection sampler in this process (pid %d)", os.getpid())

        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            if not self.can_verify(draft_probs, sampling_metadata):
                self.steps_delegated += 1
                return super().forward(metadata, draft_probs, logits, sampling_metadata)
            self.steps_verified += 1
            tokens = verify_batch(self._ops, metadata, logits, sampling_metadata)
            return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)

        def can_verify(self, draft_probs, sampling_metadata) -> bool:
            """True when the step needs nothing but temperature, top-k and top-p."""
            return (not self.synthetic_mode
                    and (draft_probs is None or sampling_metadata.all_greedy)
                    and plain_sampling(sampling_metadata))

    _SAMPLER_CLASS = VerifyChainSampler
    return VerifyChainSampler


# vLLM's built-in logits processors, by class name, and the attribute that is empty (or zero)
# while no request of the batch uses them. Any other processor makes the step vLLM's.
_IDLE_WHEN_EMPTY = {"MinPLogitsProcessor": "min_p_count", "LogitBiasLogitsProcessor": "biases",
                    "MinTokensLogitsProcessor": "min_toks"}


def plain_sampling(sampling_metadata) -> bool:
    """True when every request of the step samples with temperature / top-k / top-p alone."""
    m = sampling_metadata
    if m.max_num_logprobs is not None or not m.no_penalties or m.allowed_token_ids_mask is not None:
        return False
    if m.bad_words_token_ids or getattr(m, "logprob_token_ids", None):
        return False
    holder = getattr(m, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    for processor in m.logitsprocs.all:
        field = _IDLE_WHEN_EMPTY.get(type(processor).__name__)
        if field is None or getattr(processor, field, True):
            return False
    return True


def step_seeds(batch: int, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One fresh seed per request for this step: from its own generator when it has one.

    Shape:
        returns [batch] int64 in [0, 2^62).
    """
    seeds = torch.randint(0, 1 << _SEED_BITS, (batch,), dtype=torch.int64)
    for row, gen in generators.items():
        if 0 <= row < batch:
            seeds[row] = torch.randint(0, 1 << _SEED_BITS, (1,), dtype=torch.int64, generator=gen,
                                       device=gen.device).item()
    return seeds


def verify_batch(ops, metadata, logits: torch.Tensor, sampling_metadata) -> torch.Tensor:
    """The step's output tokens, vLLM's ``sampled_token_ids``, from one ``verify_chain`` call.

    Shape:
        logits: [N + B, V], request i's N_i draft rows then its bonus row (vLLM's layout).
        returns [B, max_spec_len + 1] int32: accepted drafts, then the correction or bonus token,
        then -1 (vLLM's placeholder).
    """
    batch = len(metadata.num_draft_tokens)
    device = logits.device
    cu = torch.zeros(batch + 1, dtype=torch.int64, device=device)
    cu[1:] = metadata.cu_num_draft_tokens.to(device=device, dtype=torch.int64)
    m = sampling_metadata
    temperature = 0.0 if m.all_greedy or m.temperature is None else m.temperature[:batch].float()
    top_k = 0 if m.top_k is None else m.top_k[:batch].to(torch.int32)
    top_p = 1.0 if m.top_p is None else m.top_p[:batch].float()
    seed = 0 if m.all_greedy else step_seeds(batch, m.generators).to(device)
    result = ops.verify_chain(metadata.draft_token_ids, cu, logits, None, temperature, top_k, top_p,
                              seed, 0, max_draft=int(metadata.max_spec_len))
    ops.raise_on_status(result.status, "verify_chain (vLLM rejection sampler)")
    return result.tokens.to(torch.int32)


# --- proposers --------------------------------------------------------------------------------

class _Indexed:
    """One request's n-gram index and the tokens it holds (to recognise the request next step)."""

    __slots__ = ("index", "tokens")

    def __init__(self, index: NgramIndex, tokens: np.ndarray):
        self.index, self.tokens = index, tokens

    def extends(self, context: np.ndarray) -> bool:
        n = self.tokens.shape[0]
        return n <= context.shape[0] and np.array_equal(self.tokens, context[:n])


class PromptLookupProposer:
    """Prompt lookup from the project's C++ n-gram index, as a vLLM ``custom_class`` proposer.

    Each step, row i's committed tokens ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` (prompt and
    output) propose what followed the longest suffix (orders ``n_max`` down to ``n_min``) that
    occurred before: one chain of up to ``num_speculative_tokens`` tokens, ranked by count, then
    length, then recency among the newest ``max_occurrences`` occurrences. Rows without a new
    sampled token this step (a prefill chunk) and rows at ``max_model_len`` get no draft.

    vLLM does not say which request sits in which row, so each index is kept with the tokens it
    holds. Next step a row takes, of its own index and the others of the last step, the first that
    no other row took this step and whose tokens its committed tokens start with (the same request,
    a request that moved rows, or one with the same text so far), and extends it by the new tokens;
    otherwise it builds one. So at every lookup a row's index holds exactly its committed tokens,
    and the drafts never depend on that bookkeeping.
    """

    n_min: int = 1
    n_max: int = 4
    max_occurrences: int = 64

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        if self.k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.k}")
        NgramIndex(self.n_min, self.n_max)  # checks the orders now, not at the first step
        self._rows: dict[int, _Indexed] = {}

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: the guesses come from the text."""

    def _index_for(self, row: int, context: np.ndarray, last: dict[int, _Indexed],
                   claimed: set[int]) -> _Indexed:
        candidates = [last[row]] if row in last else []
        candidates += [e for r, e in last.items() if r != row]
        entry = next((e for e in candidates if id(e) not in claimed and e.extends(context)), None)
        if entry is None:
            entry = _Indexed(NgramIndex(self.n_min, self.n_max), context[:0])
        n = entry.tokens.shape[0]
        if context.shape[0] > n:
            entry.index.extend(torch.from_numpy(context[n:].astype(np.int64)))
            entry.tokens = context.copy()
        claimed.add(id(entry))
        return entry

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        """One draft chain per row (empty when there is none).

        Shape:
            sampled_token_ids: B lists (this step's committed tokens per row; empty = no draft).
            num_tokens_no_spec: [>= B] committed tokens per row.
            token_ids_cpu: [>= B, max_model_len] the rows' tokens.
        """
        batch = len(sampled_token_ids)
        last, claimed = self._rows, set()
        # rows without a draft this step keep their index for the next one
        self._rows = {r: e for r, e in last.items() if r < batch and not len(sampled_token_ids[r])}
        indexes: list[NgramIndex | None] = [None] * batch
        depth = torch.zeros(batch, dtype=torch.int64)
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            room = min(self.k, self.max_model_len - n)
            if not len(sampled) or room <= 0:
                continue
            entry = self._index_for(row, np.asarray(token_ids_cpu[row, :n]), last, claimed)
            self._rows[row], indexes[row] = entry, entry.index
            depth[row] = room
        if batch == 0 or int(depth.max()) == 0:
            return [[] for _ in range(batch)]
        found = lookup(indexes, self.k, 1, max_depth=depth, max_occurrences=self.max_occurrences)
        counts = found.num_nodes.tolist()
        return [found.tokens[row, :counts[row]].tolist() for row in range(batch)]
