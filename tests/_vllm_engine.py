"""One vLLM engine, one job, in its own process (for tests/test_integrations_vllm.py).

    python tests/_vllm_engine.py JOB.json OUT.json

The job (JSON): ``model`` (an HF folder), ``speculative_config`` (or null), ``multiprocessing``
(the engine core in a process of its own, as vLLM runs by default; false: in this one),
``max_model_len``, and ``batches``: lists of requests, each ``{"prompt": [ids], "max_tokens": n,
"temperature": t, "seed": s or null, "logprobs": k (optional)}``; each batch is one ``LLM.generate`` call, with
``ignore_eos``. Whether the project's plugin loads is the caller's ``VLLM_PLUGINS`` (``""``: none).

The result (JSON): ``outputs`` (per batch, per request, the new token ids), ``pid`` (this
process), ``workers``: what each worker reports about itself (its pid, the class of its
rejection sampler and of its drafter, steps verified by ``verify_chain`` and steps delegated to
vLLM's own sampler), and vLLM's speculative counters ``drafts``, ``draft_tokens``, ``accepted``.
"""

from __future__ import annotations

import json
import os
import sys


def probe(worker) -> dict:
    """Runs in the worker (``collective_rpc``): who verifies and who proposes there."""
    runner = worker.model_runner
    sampler = getattr(runner, "rejection_sampler", None)
    drafter = getattr(runner, "drafter", None)
    return dict(pid=os.getpid(), sampler=None if sampler is None else type(sampler).__name__,
                drafter=None if drafter is None else f"{type(drafter).__module__}.{type(drafter).__name__}",
                steps_verified=getattr(sampler, "steps_verified", None),
                steps_delegated=getattr(sampler, "steps_delegated", None))


def counters(llm) -> dict:
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    out = dict.fromkeys(names.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] += int(getattr(metric, "value", 0))
    return out


def main(job_path: str, out_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    multiprocessing = bool(job.get("multiprocessing", False))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # probe() travels to the worker process
    from vllm import LLM, SamplingParams

    llm = LLM(model=job["model"], dtype="float32", enforce_eager=True, distributed_executor_backend="uni",
              max_model_len=int(job.get("max_model_len", 256)), speculative_config=job.get("speculative_config"),
              disable_log_stats=False, seed=0, enable_prefix_caching=False,
              max_num_seqs=int(job.get("max_num_seqs", 32)))
    outputs = []
    for batch in job["batches"]:
        prompts = [{"prompt_token_ids": r["prompt"]} for r in batch]
        params = [SamplingParams(temperature=float(r.get("temperature", 0.0)), seed=r.get("seed"),
                                 max_tokens=int(r["max_tokens"]), ignore_eos=True, logprobs=r.get("logprobs"))
                  for r in batch]
        results = llm.generate(prompts, params, use_tqdm=False)
        outputs.append([[int(t) for t in res.outputs[0].token_ids] for res in results])
    out = dict(outputs=outputs, pid=os.getpid(), workers=llm.collective_rpc(probe), **counters(llm))
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
