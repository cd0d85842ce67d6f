"""llama.cpp (through llama-cpp-python) as a peer: decoding of given token ids, timed.

Runs with the private environment's interpreter, never the project's (it imports neither torch nor
specdec_cuda)::

    .venv-llamacpp/bin/python bench/peers/llama_cpp_peer.py JOB.json [--out RESULT.json]
    ... | .venv-llamacpp/bin/python bench/peers/llama_cpp_peer.py - > RESULT.json

The job (JSON)::

    {"model": "target.gguf", "draft_model": "draft.gguf" or null,
     "prompts": [[token ids], ...], "max_new_tokens": 64, "eos_token_ids": [151645],
     "n_threads": 2, "n_ctx": null (long enough for the longest prompt), "warmup_tokens": 8,
     "modes": ["plain", "prompt_lookup:10", "prompt_lookup:2", "draft:4"], "extra_buffers": true,
     "temperature": 0.0, "seed": 0}

``temperature``: 0 decodes greedily; above 0 samples at that temperature (top-k and top-p off,
no penalties), with llama.cpp's sampler seeded ``seed + i`` for prompt i in every mode.

``extra_buffers``: false loads the weights without llama.cpp's extra buffer types (its weight
repacking, e.g. the AMX buffer on an AMX CPU: ``llama_model_params.use_extra_bufts``). The bench
side retries with it false when a run dies of a signal: llama-cpp-python 0.3.36's AMX path
segfaulted at the first decode on a 2-core Sapphire Rapids VM (2026-12-04; ggml-org/llama.cpp#20824),
which also dropped its AVX-512 repacking. ``make llama-cpp-env`` therefore builds llama.cpp
without AMX on AMX CPUs (bench/peers/install_llama_cpp.sh), so the first run succeeds with every
other buffer type; the retry stays for a build made with ``LLAMA_CPP_AMX=1``.

Modes:

* ``plain``: one token per target forward (``Llama.generate``, greedy sampler);
* ``prompt_lookup:N``: ``llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=N)``
  (llama-cpp-python's default n-gram size 2) proposes up to N tokens copied from the context;
* ``draft:K``: ``GGUFDraftModel``, a second ``Llama`` on ``draft_model`` that greedily drafts K
  tokens from its own KV cache, evaluating only what it has not seen.

In both speculative modes the target verifies the proposal in one forward and keeps it while its
own token agrees (llama-cpp-python samples the target at each proposed position and accepts a
proposed token that equals the sample: sample-and-match), so under greedy decoding every mode emits
the tokens of ``plain`` (up to the float rounding of a batched forward against a one-token forward);
sampled, the drafts change which draws are made, not their distribution.

The result (JSON): the settings, and per mode ``tokens`` / ``seconds`` / ``tokens_per_s`` over all
prompts and per prompt ``new_tokens`` (EOS included when hit), ``seconds`` (the whole
``generate``: prefill and decode, the definition bench/bench_real.py uses for this engine),
``prefill_seconds`` (to the first token), ``tokens_per_s``, and for speculative modes
``target_forwards`` (verify forwards after the prefill) and ``drafted``. Prompts are interleaved:
every mode decodes prompt i before any mode decodes prompt i + 1, so load drift hits all modes.

Model objects, built once and reused across prompts (reset before each prompt, so nothing is
reused from the previous prompt's cache): one target ``Llama`` for ``plain`` (``logits_all=False``)
and, when a speculative mode is asked for, a second one on the same file (mmap'd, so the weights
are shared) with ``logits_all=True``, which llama-cpp-python needs to verify a proposal: it samples
the target at every proposed position (``Llama.__init__`` forces ``_logits_all`` on when given a
draft model but sizes its logits buffer from the ``logits_all`` argument, so it must be passed).
The speculative modes swap that object's ``draft_model``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
import peer_job  # beside this script
from peer_job import job_main

# Greedy: temperature 0 makes llama-cpp-python's sampler chain (neutral penalties) + greedy argmax.
GREEDY = dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0,
              frequency_penalty=0.0, presence_penalty=0.0)
DEFAULT_MODES = ("plain", "prompt_lookup:10", "prompt_lookup:32", "prompt_lookup:2", "draft:4")


class GGUFDraftModel(LlamaDraftModel):
    """Drafts ``num_draft_tokens`` greedy tokens with a small ``Llama`` of the same vocabulary.

    The draft keeps its own KV cache across calls: each call gets the target's whole context
    (prompt, accepted tokens and the target's latest token); the draft keeps the longest prefix of
    what it evaluated before that matches (its own accepted drafts included), drops the rest from
    its cache, evaluates only the new tokens, then drafts. The last drafted token is never
    evaluated (no one needs its logits unless it is accepted, and then the next call evaluates it).
    """

    def __init__(self, llm: Llama, num_draft_tokens: int):
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.llm, self.num_draft_tokens = llm, num_draft_tokens

    def reset(self) -> None:
        self.llm.reset()

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        context = np.asarray(input_ids, dtype=np.intc)
        seen = self.llm.input_ids[: min(self.llm.n_tokens, len(context))]
        differ = np.nonzero(seen != context[: len(seen)])[0]
        keep = int(differ[0]) if len(differ) else len(seen)
        keep = min(keep, len(context) - 1)  # re-evaluate at least the last token: its logits draft the first
        self.llm.n_tokens = keep  # Llama.eval drops the KV cache from n_tokens on before it decodes
        self.llm.eval(context[keep:].tolist())
        drafted = []
        for i in range(self.num_draft_tokens):
            token = self.llm.sample(**GREEDY)
            drafted.append(token)
            if i + 1 < self.num_draft_tokens:
                self.llm.eval([token])
        return np.array(drafted, dtype=np.intc)


class Counting(LlamaDraftModel):
    """Wraps a proposer to count its calls (one per target verify forward) and drafted tokens."""

    def __init__(self, inner: LlamaDraftModel):
        self.inner, self.calls, self.drafted = inner, 0, 0

    def reset(self) -> None:
        self.calls = self.drafted = 0
        if hasattr(self.inner, "reset"):
            self.inner.reset()

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        out = self.inner(input_ids, **kwargs)
        self.calls += 1
        self.drafted += len(out)
        return out


def parse_mode(mode: str) -> tuple[str, int | None]:
    """``"plain"`` -> ("plain", None); ``"prompt_lookup:10"`` -> ("prompt_lookup", 10); ``"draft:4"``."""
    return peer_job.parse_mode(mode, ("prompt_lookup", "draft"))


def sampler(temperature: float) -> dict:
    """``generate``'s sampling arguments: greedy at 0, else plain sampling at ``temperature`` (top-k
    0 and top-p 1: off; min-p, typical-p and the penalties neutral)."""
    return GREEDY if temperature == 0 else dict(GREEDY, temp=float(temperature), top_k=0)


def decode(llm: Llama, prompt: list[int], max_new_tokens: int, eos: set[int], temperature: float = 0.0,
           seed: int = 0) -> dict:
    """``generate`` from ``prompt`` to ``max_new_tokens`` or the first EOS (kept), timed; sampled
    at ``temperature`` > 0 from a sampler seeded with ``seed``."""
    llm.reset()  # no prefix reuse from the previous prompt
    if isinstance(llm.draft_model, Counting):
        llm.draft_model.reset()
    llm.set_seed(seed)
    tokens: list[int] = []
    first = None
    start = time.perf_counter()
    generator = llm.generate(prompt, reset=True, **sampler(temperature))
    for token in generator:
        if first is None:
            first = time.perf_counter()
        tokens.append(int(token))
        if len(tokens) >= max_new_tokens or token in eos:
            break
    seconds = time.perf_counter() - start
    generator.close()
    out = dict(new_tokens=tokens, seconds=seconds, prefill_seconds=(first or start) - start,
               tokens_per_s=len(tokens) / seconds if seconds > 0 else 0.0)
    if isinstance(llm.draft_model, Counting):
        out.update(target_forwards=llm.draft_model.calls, drafted=llm.draft_model.drafted)
    return out


def without_extra_buffers() -> None:
    """Every ``Llama`` built after this loads with ``use_extra_bufts = False``: ``Llama.__init__``
    takes no such argument, so the module's default-parameters function it calls is wrapped."""
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama.llama_cpp.llama_model_default_params = params


def run(job: dict) -> dict:
    prompts = [list(map(int, p)) for p in job["prompts"]]
    if not prompts or any(not p for p in prompts):
        raise ValueError("job['prompts'] must be a non-empty list of non-empty token-id lists")
    max_new = int(job.get("max_new_tokens", 64))
    eos = set(map(int, job.get("eos_token_ids", [])))
    threads = int(job.get("n_threads", 2))
    modes = list(job.get("modes") or DEFAULT_MODES)
    parsed = {m: parse_mode(m) for m in modes}
    if any(kind == "draft" for kind, _ in parsed.values()) and not job.get("draft_model"):
        raise ValueError("a draft:K mode needs job['draft_model'] (a GGUF path)")
    longest_draft = max([n for _, n in parsed.values() if n] + [0])
    # Room for the longest prompt, its new tokens and one proposal past them.
    n_ctx = int(job.get("n_ctx") or max(map(len, prompts)) + max_new + longest_draft + 16)
    common = dict(n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, verbose=False)
    extra_buffers = bool(job.get("extra_buffers", True))
    if not extra_buffers:
        without_extra_buffers()

    plain = Llama(job["model"], logits_all=False, **common)
    speculative = (Llama(job["model"], logits_all=True, **common)
                   if any(kind != "plain" for kind, _ in parsed.values()) else None)
    draft_llm = (Llama(job["draft_model"], logits_all=False, **dict(common, n_ctx=n_ctx + longest_draft))
                 if any(kind == "draft" for kind, _ in parsed.values()) else None)

    def prepared(mode: str) -> Llama:
        kind, n = parsed[mode]
        if kind == "plain":
            return plain
        proposer = (LlamaPromptLookupDecoding(num_pred_tokens=n) if kind == "prompt_lookup"
                    else GGUFDraftModel(draft_llm, n))
        speculative.draft_model = Counting(proposer)
        return speculative

    warmup = int(job.get("warmup_tokens", 8))
    temperature, seed = float(job.get("temperature", 0.0)), int(job.get("seed", 0))
    if temperature < 0:
        raise ValueError(f"job['temperature'] must be >= 0, got {temperature}")
    for mode in modes:  # first decodes allocate llama.cpp's compute buffers; untimed
        decode(prepared(mode), prompts[0], warmup, eos, temperature, seed)

    per_prompt: dict[str, list[dict]] = {m: [] for m in modes}
    for i, prompt in enumerate(prompts):
        for mode in modes:
            per_prompt[mode].append(decode(prepared(mode), prompt, max_new, eos, temperature, seed + i))

    results = {}
    for mode, rows in per_prompt.items():
        tokens, seconds = sum(len(r["new_tokens"]) for r in rows), sum(r["seconds"] for r in rows)
        summary = dict(tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
                       prefill_seconds=sum(r["prefill_seconds"] for r in rows), prompts=rows)
        if parsed[mode][0] != "plain":
            forwards = sum(r["target_forwards"] for r in rows)
            # tokens per target verify forward after each prompt's first token (1.0 for plain)
            summary["tau"] = (tokens - len(rows)) / forwards if forwards else None
            summary["drafted"] = sum(r["drafted"] for r in rows)
        results[mode] = summary
    return dict(peer="llama.cpp", llama_cpp_python=llama_cpp.__version__,
                system_info=llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                model=job["model"], draft_model=job.get("draft_model"), n_threads=threads, n_ctx=n_ctx,
                max_new_tokens=max_new, eos_token_ids=sorted(eos), prompt_lookup_max_ngram_size=2,
                extra_buffers=extra_buffers, temperature=temperature, seed=seed, modes=results)


def main(argv=None) -> int:
    return job_main(run, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
