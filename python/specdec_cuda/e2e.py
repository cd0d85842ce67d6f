"""The demo and the end-to-end benchmark: the zoo pair (or any HF checkpoint folders) decoded
autoregressively and speculatively, next to ``transformers`` ``generate`` on the same models."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .api import SpeculativeDecoder

PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n",
    "    for i in range(len(self.items)):\n",
    "def read_config(path):\n    \"\"\"Read a configuration file.\"\"\"\n",
    "        if not isinstance(value, str):\n            raise TypeError(",
    "    def __repr__(self):\n        return ",
    "try:\n    import threading\nexcept ImportError:\n",
]


def held_out_prompts(count: int, tail_chars: int = 60000) -> list[str]:
    """``count`` function / method openings from the end of the standard library corpus, the text
    the zoo pair holds out of training (its last ``eval_tokens``, about the last 50k characters):
    prompts no method was tuned on. Each is a ``def`` line and the line after it."""
    from . import zoo

    tail = "".join(zoo.stdlib_corpus())[-tail_chars:]
    lines = tail.splitlines(keepends=True)
    prompts = [lines[i] + lines[i + 1] for i in range(len(lines) - 1)
               if lines[i].lstrip().startswith("def ") and lines[i].rstrip().endswith(":")]
    if len(prompts) < count:
        raise ValueError(f"the held-out text has {len(prompts)} function openings, {count} were asked for")
    step = len(prompts) / count  # spread over the held-out text
    return [prompts[int(i * step)] for i in range(count)]


@dataclass
class Pair:
    target_dir: Path
    draft_dir: Path | None
    tokenizer: object
    target: object  # built-in model
    draft: object | None


def load_pair(target_dir=None, draft_dir=None, dtype=torch.float32, device="cpu", zoo_spec="default",
              log=print, threads: int = 0) -> Pair:
    """The given HF checkpoint folders, or the zoo pair (trained the first time, with torch's own
    thread count); then ``threads`` (if > 0) becomes torch's thread count for decoding."""
    from transformers import AutoTokenizer

    from . import models, zoo

    if target_dir is None:
        target_dir, zoo_draft = zoo.get_pair(zoo.SPECS[zoo_spec], log=log)
        draft_dir = draft_dir or zoo_draft
    if threads > 0:
        torch.set_num_threads(threads)
    target_dir = Path(target_dir)
    target = models.load(target_dir, dtype=dtype, device=device)
    draft = models.load(draft_dir, dtype=dtype, device=device) if draft_dir else None
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
    except Exception as exc:  # noqa: BLE001 - any failure means the same thing to the user
        raise FileNotFoundError(f"{target_dir}: no tokenizer that transformers can load ({exc})") from exc
    return Pair(target_dir, Path(draft_dir) if draft_dir else None, tokenizer, target, draft)


def encode(tokenizer, prompts: list[str]) -> list[list[int]]:
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]


def engine_group(decoder: SpeculativeDecoder, group: list[list[int]], **kw) -> dict:
    """One ``generate`` call on a batch of prompts: its counts, time and outputs (see ``combine``)."""
    out = decoder.generate(group, **kw)
    m = out.metrics
    return dict(tokens=m.new_tokens, seconds=m.seconds, row_steps=m.row_steps,
                after_prefill=m.new_tokens_after_prefill, drafted=sum(m.drafted), accepted=sum(m.accepted),
                outputs=out.tokens)


def hf_group(model, group: list[list[int]], max_new_tokens: int, eos: int | None, assistant=None) -> dict:
    """transformers ``generate`` (greedy) on one prompt, optionally with ``assistant_model``."""
    (prompt,) = group
    ids = torch.tensor([prompt], device=model.device)
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos, pad_token_id=eos, assistant_model=assistant)
    seconds = time.perf_counter() - start
    new = out[0, len(prompt):].tolist()
    return dict(tokens=len(new), seconds=seconds, row_steps=0, after_prefill=0, drafted=0, accepted=0,
                outputs=[new])


def combine(parts: list[dict]) -> dict:
    """Totals over groups: tokens/s over all of them, τ (tokens per target forward after the first
    token, per row), acceptance (accepted / drafted), outputs in prompt order."""
    total = {key: sum(p[key] for p in parts) for key in ("tokens", "seconds", "row_steps", "after_prefill",
                                                         "drafted", "accepted")}
    return dict(tokens=total["tokens"], seconds=total["seconds"], tokens_per_s=total["tokens"] / total["seconds"],
                tau=total["after_prefill"] / total["row_steps"] if total["row_steps"] else None,
                acceptance=total["accepted"] / total["drafted"] if total["drafted"] else None,
                outputs=[o for p in parts for o in p["outputs"]])


def run_engine(decoder: SpeculativeDecoder, prompts: list[list[int]], batch: int, **kw) -> dict:
    """Decode ``prompts`` in batches of ``batch``; see ``combine`` for what is returned."""
    return combine([engine_group(decoder, prompts[i: i + batch], **kw) for i in range(0, len(prompts), batch)])


def print_table(rows: list[dict], baseline: str) -> None:
    base = next(r for r in rows if r["method"] == baseline)["tokens_per_s"]
    width = max(44, *(len(r["method"]) for r in rows))
    print(f"\n{'method':{width}s} {'tokens/s':>9s} {'tau':>6s} {'accept':>7s} {'speedup':>8s} {'greedy identical':>17s}")
    for r in rows:
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"
        acc = f"{100 * r['acceptance']:.0f}%" if r.get("acceptance") is not None else "-"
        same = {True: "yes", False: "NO", None: "-"}[r.get("identical")]
        print(f"{r['method']:{width}s} {r['tokens_per_s']:9.1f} {tau:>6s} {acc:>7s} "
              f"{r['tokens_per_s'] / base:7.2f}x {same:>17s}")


def demo(args) -> int:
    pair = load_pair(args.target, args.draft, device=args.device, zoo_spec=args.zoo, threads=args.threads)
    if pair.draft is None:
        raise SystemExit("the demo needs a draft model: pass --draft with --target")
    tok, eos = pair.tokenizer, pair.tokenizer.eos_token_id
    prompts = PROMPTS[: args.prompts]
    ids = encode(tok, prompts)
    ar = SpeculativeDecoder(pair.target)
    methods = {
        "autoregressive": ar,
        f"draft model, k={args.k}": SpeculativeDecoder(pair.target, "draft", draft=pair.draft, k=args.k,
                                                         policy="fixed"),
        f"draft model, adaptive k from {args.k}": SpeculativeDecoder(
            pair.target, "draft", draft=pair.draft, k=args.k, adaptive_k=True,
            confidence_threshold=args.confidence_threshold or None, policy="fixed"),
        f"draft model, cost-aware policy, k<={2 * args.k}": SpeculativeDecoder(
            pair.target, "draft", draft=pair.draft, k=args.k, adaptive_k=True),
    }
    common = dict(max_new_tokens=args.max_new_tokens, eos_token_id=eos)
    for decoder in methods.values():  # warm-up: allocator, first-call overheads, caches
        decoder.generate(ids[:1], max_new_tokens=32, eos_token_id=eos)
    rows, greedy_ref = [], None
    for label, temperature in (("greedy", 0.0), (f"sampled T={args.temperature}", args.temperature)):
        for name, decoder in methods.items():
            r = run_engine(decoder, ids, batch=1, temperature=temperature, seed=args.seed, **common)
            if temperature == 0.0:
                greedy_ref = greedy_ref or r["outputs"]
                r["identical"] = r["outputs"] == greedy_ref
            rows.append(dict(method=f"{name} ({label})", **r))
    print(f"\ntarget {pair.target_dir}\ndraft  {pair.draft_dir}")
    for i, prompt in enumerate(prompts):
        print("\n" + "=" * 80)
        print(f"prompt {i}:\n{prompt}")
        for r in rows:
            if r["method"].startswith(("autoregressive (greedy)", f"draft model, k={args.k} (sampled")):
                print(f"--- {r['method']}:\n{prompt}{tok.decode(r['outputs'][i])}")
    print_table(rows, "autoregressive (greedy)")
    print(f"\n{len(prompts)} prompts, {args.max_new_tokens} new tokens each, {torch.get_num_threads()} CPU thread(s); "
          "one run per method (bench/bench_e2e.py repeats and interleaves them)")
    diffusion_demo(args, prompts)
    return 0


def diffusion_demo(args, prompts: list[str]) -> None:
    """The zoo's masked-diffusion LM on the same prompts, LOSSY (its own text, not the target's):
    Fast-dLLM threshold rule with the dual cache. Shown when cached, or trained with --diffusion."""
    from . import zoo, zoo_diffusion
    from .diffusion_generate import DiffusionGenerator

    spec = zoo_diffusion.SPECS.get(args.zoo)
    if spec is None:  # zoo v4 has no diffusion LM (yet)
        print(f"\n(diffusion generation, lossy: no zoo diffusion LM for --zoo {args.zoo})")
        return
    cached = (zoo.zoo_root() / spec.name / "report.json").exists()
    if args.target or not (cached or getattr(args, "diffusion", False)):
        print("\n(diffusion generation, lossy: pass --diffusion to train the zoo diffusion LM and show it)")
        return
    model, tok = zoo_diffusion.load_zoo_diffusion(spec, device=args.device)
    gen = DiffusionGenerator(model, block_length=32, threshold=0.9, use_cache="dual")
    max_new = min(args.max_new_tokens, 64)
    out = gen.generate(encode(tok, prompts), max_new_tokens=max_new, eos_token_id=model.config.eos_token_id)
    print("\n" + "=" * 80 + "\ndiffusion LM (LOSSY: a different model's text, not lossless decoding), "
          "threshold 0.9, dual cache")
    for prompt, tokens in zip(prompts, out.tokens):
        print(f"--- diffusion (lossy):\n{prompt}{tok.decode(tokens)}")
    m = out.metrics
    print(f"diffusion (lossy): {m.tokens_per_s:.1f} tokens/s, {m.unmasked_per_forward:.2f} positions unmasked "
          f"per forward, {m.target_forwards} forwards")


def bench(args) -> int:
    """Batch 1 and batch 8, this engine vs transformers generate (plain and assisted).

    Timings on a shared CPU drift and jump (other tenants share the last-level cache the models
    stream from), so every configuration runs ``--repeats`` times, finely interleaved: for each
    prompt (batch 1) or the whole batch (batch 8), every configuration runs once before the next
    repeat starts. Each configuration's time per prompt is the median of its repeats.
    """
    from transformers import AutoModelForCausalLM

    pair = load_pair(args.target, args.draft, device=args.device, zoo_spec=args.zoo, threads=args.threads)
    tok, eos = pair.tokenizer, pair.tokenizer.eos_token_id
    prompts = encode(tok, PROMPTS)
    max_new = 32 if args.quick else args.max_new_tokens
    hf_target = AutoModelForCausalLM.from_pretrained(pair.target_dir, dtype=torch.float32).to(args.device).eval()
    hf_draft = AutoModelForCausalLM.from_pretrained(pair.draft_dir, dtype=torch.float32).to(args.device).eval()
    ar = SpeculativeDecoder(pair.target)
    spec = SpeculativeDecoder(pair.target, "draft", draft=pair.draft, k=args.k, policy="fixed")
    adaptive = SpeculativeDecoder(pair.target, "draft", draft=pair.draft, k=args.k, adaptive_k=True,
                                  confidence_threshold=args.confidence_threshold or None, policy="fixed")
    common = dict(max_new_tokens=max_new, eos_token_id=eos, temperature=0.0)
    sampled = dict(common, temperature=0.8, seed=0)  # acceptance below 100% even on repetitive text
    for decoder in (ar, spec, adaptive):  # warm-up: allocator, first-call overheads, caches
        decoder.generate(prompts[:1], max_new_tokens=32, eos_token_id=eos)
    hf_group(hf_target, prompts[:1], 4, eos)

    n = len(prompts)
    groups = {1: [[p] for p in prompts], n: [prompts]}
    # (method, batch, greedy reference method or None, run on one group)
    jobs = [
        ("engine autoregressive, batch 1", 1, None, lambda g: engine_group(ar, g, **common)),
        (f"engine draft k={args.k}, batch 1", 1, "engine autoregressive, batch 1",
         lambda g: engine_group(spec, g, **common)),
        ("engine draft adaptive k, batch 1", 1, "engine autoregressive, batch 1",
         lambda g: engine_group(adaptive, g, **common)),
        ("transformers generate, batch 1", 1, "engine autoregressive, batch 1",
         lambda g: hf_group(hf_target, g, max_new, eos)),
        ("transformers generate + assistant_model, batch 1", 1, "engine autoregressive, batch 1",
         lambda g: hf_group(hf_target, g, max_new, eos, assistant=hf_draft)),
        ("engine autoregressive T=0.8, batch 1", 1, None, lambda g: engine_group(ar, g, **sampled)),
        (f"engine draft k={args.k} T=0.8, batch 1", 1, None, lambda g: engine_group(spec, g, **sampled)),
        (f"engine autoregressive, batch {n}", n, None, lambda g: engine_group(ar, g, **common)),
        (f"engine draft k={args.k}, batch {n}", n, f"engine autoregressive, batch {n}",
         lambda g: engine_group(spec, g, **common)),
        (f"engine draft adaptive k, batch {n}", n, f"engine autoregressive, batch {n}",
         lambda g: engine_group(adaptive, g, **common)),
    ]
    runs = {name: [[] for _ in groups[batch]] for name, batch, _, _ in jobs}
    for repeat in range(args.repeats):
        for gi in range(max(len(g) for g in groups.values())):
            for name, batch, _, job in jobs:
                if gi < len(groups[batch]):
                    runs[name][gi].append(job(groups[batch][gi]))
        print(f"[bench] repeat {repeat + 1}/{args.repeats} done", flush=True)
    rows, by_name = [], {}
    for name, batch, reference, _ in jobs:
        r = combine([sorted(reps, key=lambda x: x["seconds"])[len(reps) // 2] for reps in runs[name]])
        if reference is not None:
            r["identical"] = r["outputs"] == by_name[reference]["outputs"]
        by_name[name] = r
        rows.append(dict(method=name, batch=batch, repeats=args.repeats, **r))
    by = {r["method"]: r["tokens_per_s"] for r in rows}
    ratios = {
        "speculative / engine AR (batch 1)": by[f"engine draft k={args.k}, batch 1"] / by["engine autoregressive, batch 1"],
        "speculative / transformers assisted (batch 1)":
            by[f"engine draft k={args.k}, batch 1"] / by["transformers generate + assistant_model, batch 1"],
        "speculative / engine AR, sampled T=0.8 (batch 1)":
            by[f"engine draft k={args.k} T=0.8, batch 1"] / by["engine autoregressive T=0.8, batch 1"],
        "engine AR / transformers plain (batch 1)":
            by["engine autoregressive, batch 1"] / by["transformers generate, batch 1"],
        "adaptive-k speculative / engine AR (batch 1)":
            by["engine draft adaptive k, batch 1"] / by["engine autoregressive, batch 1"],
        "adaptive-k speculative / transformers assisted (batch 1)":
            by["engine draft adaptive k, batch 1"] / by["transformers generate + assistant_model, batch 1"],
        f"speculative / engine AR (batch {n})":
            by[f"engine draft k={args.k}, batch {n}"] / by[f"engine autoregressive, batch {n}"],
        f"adaptive-k speculative / engine AR (batch {n})":
            by[f"engine draft adaptive k, batch {n}"] / by[f"engine autoregressive, batch {n}"],
    }
    # The CPU targets (batch 1): name -> (ratio, at least).
    targets = {
        "speculative >= 1.5x engine AR": (ratios["speculative / engine AR (batch 1)"], 1.5),
        "adaptive-k speculative >= 1.5x engine AR": (ratios["adaptive-k speculative / engine AR (batch 1)"], 1.5),
        "speculative >= 2x transformers assisted": (ratios["speculative / transformers assisted (batch 1)"], 2.0),
        "adaptive-k speculative >= 2x transformers assisted":
            (ratios["adaptive-k speculative / transformers assisted (batch 1)"], 2.0),
        "engine AR >= 1x transformers plain": (ratios["engine AR / transformers plain (batch 1)"], 1.0),
    }
    print_table(rows, "engine autoregressive, batch 1")
    print()
    for name, value in ratios.items():
        print(f"{name:58s} {value:6.2f}x")
    print()
    for name, (value, floor) in targets.items():
        print(f"target {name:50s} {value:6.2f}x  {'met' if value >= floor else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "target": str(pair.target_dir), "draft": str(pair.draft_dir), "max_new_tokens": max_new,
        "prompts": n, "device": args.device, "threads": torch.get_num_threads(), "repeats": args.repeats,
        "ratios": ratios, "targets": {k: dict(ratio=v, at_least=f, met=v >= f) for k, (v, f) in targets.items()},
        "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows]}, indent=2))
    print(f"\nwrote {out}")
    return 0
