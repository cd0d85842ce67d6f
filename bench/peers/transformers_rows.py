"""transformers ``generate`` as a peer of the real bench, in the bench's own process.

On the same HF folders (``dtype=`` the bench's ``--dtype``: the bf16 checkpoints as stored, or
float32), the same prompt token ids, ``max_new_tokens``, EOS and torch thread count, batch 1,
greedy (``do_sample=False``) or sampled at each temperature asked (top-k and top-p off,
``torch.manual_seed(seed + i)`` before prompt i), the configurations of ``configs``: plain
``generate``, ``assistant_model=`` the draft (transformers' assisted generation; speculative
sampling when sampled) and ``prompt_lookup_num_tokens=`` each of ``PROMPT_LOOKUP`` (its prompt
lookup; its candidates are kept while they match the target's own samples; 10 is its documented
setting, 32 gives it the long chains that pay on requests which restate their code). Prompts are
interleaved: every configuration decodes prompt i before any decodes prompt i + 1, after one
untimed warm-up call each. Each becomes
a bench row: tokens/s (``generate``'s wall time, prefill included, as this engine's rows), its ratio
to this engine's autoregressive row at the same temperature, and, greedy only, the share of
positions where its tokens equal that row's (``llama_cpp_rows.agreement``; different numerics: a
figure to read, not a check).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from bench.e2e import hf_group
from bench.peers.llama_cpp_rows import agreement, size_label

PROMPT_LOOKUP = (10, 32)
BASELINE = "transformers plain"


def configs(draft, prompt_lookup=PROMPT_LOOKUP, draft_label: str = "") -> list[tuple[str, dict]]:
    """[(row name, ``generate`` options)]: plain, assisted by ``draft`` (when given), prompt lookup
    with each of ``prompt_lookup`` (an int or a sequence of them) candidate tokens."""
    out = [(BASELINE, {})]
    if draft is not None:
        out.append((" ".join(["transformers assistant_model", *([draft_label] if draft_label else [])]),
                    dict(assistant_model=draft)))
    for n in ([prompt_lookup] if isinstance(prompt_lookup, int) else prompt_lookup):
        out.append((f"transformers prompt_lookup n={n}", dict(prompt_lookup_num_tokens=n)))
    return out


def bench_rows(per_config: dict[tuple[str, float], list[dict]], workloads: dict[str, list[list[int]]],
               engine_ar: dict[tuple[str, float], dict], dtype: str) -> list[dict]:
    """Rows in bench/bench_real.py's shape from ``{(row name, temperature): [hf_group result per
    prompt, in the concatenated workloads' order]}``; ``engine_ar`` per (workload, temperature);
    ``identical`` (greedy rows): the row's tokens are transformers plain's."""
    rows, start = [], 0
    baseline = per_config.get((BASELINE, 0.0))  # greedy rows are compared with it
    for w, prompts in workloads.items():
        stop = start + len(prompts)
        greedy_plain = [p["outputs"][0] for p in baseline[start:stop]] if baseline is not None else None
        for (name, t), parts in per_config.items():
            plain = greedy_plain if t == 0 else None
            part = parts[start:stop]
            outputs = [p["outputs"][0] for p in part]
            tokens, seconds = sum(map(len, outputs)), sum(p["seconds"] for p in part)
            per_row = [a == b for a, b in zip(outputs, plain)] if plain is not None else None
            tps = tokens / seconds if seconds > 0 else 0.0
            ar = engine_ar.get((w, t))
            rows.append(dict(workload=w, split=w, batch=1, temperature=t, system="transformers", method=name,
                             dtype=dtype, lossless=True, baseline=BASELINE, tokens=tokens, seconds=seconds,
                             tokens_per_s=tps, tau=None, acceptance=None,
                             vs_engine_ar=tps / ar["tokens_per_s"] if ar else None,
                             identical=all(per_row) if per_row is not None else None, identical_rows=per_row,
                             agreement=agreement(outputs, ar["outputs"]) if ar and t == 0 else None))
        start = stop
    return rows


def measure(target_dir: Path, draft_dir: Path | None, workloads: dict[str, list[list[int]]], max_new_tokens: int,
            eos: int | None, engine_ar: dict[tuple[str, float], dict], dtype: str = "bfloat16",
            threads: int | None = None, prompt_lookup=PROMPT_LOOKUP, temperatures=(0.0,),
            seed: int = 0) -> list[dict]:
    """Load the folders with ``AutoModelForCausalLM`` in ``dtype``, run every configuration at every
    temperature on every prompt (interleaved, batch 1), free the models; the rows."""
    from transformers import AutoModelForCausalLM

    if threads is not None:
        torch.set_num_threads(threads)
    torch_dtype = getattr(torch, dtype)

    def load(folder):
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype).eval()

    target = load(target_dir)
    draft = load(draft_dir) if draft_dir is not None else None
    chosen = configs(draft, prompt_lookup, size_label(draft_dir) if draft_dir is not None else "")
    prompts = [ids for w in workloads for ids in workloads[w]]
    for name, options in chosen:  # first calls allocate, pick kernels; untimed
        hf_group(target, prompts[:1], 8, eos, **options)
    per_config = {(name, float(t)): [] for t in temperatures for name, _ in chosen}
    for t in temperatures:
        for i, prompt in enumerate(prompts):
            for name, options in chosen:
                per_config[name, float(t)].append(hf_group(target, [prompt], max_new_tokens, eos, temperature=t,
                                                           seed=seed + i, **options))
            print(f"[transformers peer] T={t:g}, prompt {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
    del target, draft
    return bench_rows(per_config, workloads, engine_ar, dtype)
