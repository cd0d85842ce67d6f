"""The demo and the end-to-end benchmark: the zoo pair (or any HF checkpoint folders) decoded
autoregressively and speculatively, next to ``transformers`` ``generate`` on the same models."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specdec_cuda.api import SpeculativeDecoder

from .configs import configurations

# No prompt ends in a bare newline: the byte-level BPE merges a newline with the next line's
# indentation ("\n    " is one token), so a prompt cut after "\n" ends on a boundary the model
# rarely saw in training, and the v4 target answers it with comment lines ("#\n#\n...").
PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\n\ndef main():",
    "class Stack:\n    def __init__(self):",
    "    for i in range(len(self.items)):",
    "def read_config(path):\n    \"\"\"Read a configuration file.\"\"\"",
    "        if not isinstance(value, str):\n            raise TypeError(",
    "    def __repr__(self):\n        return ",
    "try:\n    import threading\nexcept ImportError:",
]


def held_out_workload(count: int, pair_dir=None) -> tuple[list[str], str]:
    """``count`` prompts that the pair in ``pair_dir`` (a folder holding ``target``, ``draft`` and
    the training ``report.json``; default: the zoo pair the demo uses) never trained on and no
    method was tuned on, and a line saying where they come from.

    * A v4 pair (its report's spec has ``heldout_modulo``), or folders without a zoo report: code
      openings from the held-out stdlib modules of ``zoo_v4`` (``zoo_v4.heldout_prompts``).
    * A v3 pair: ``def`` lines and the line after each, from its held-out text, the last
      ``eval_tokens`` tokens of the standard library's token stream (``pairs.tokenize_split``),
      recovered exactly with the pair's tokenizer.
    """
    from zoo import pairs
    from zoo import v4 as zoo_v4

    pair_dir = Path(pair_dir) if pair_dir is not None else _default_pair_dir()
    report_path = pair_dir / "report.json"
    spec = json.loads(report_path.read_text()).get("spec") if report_path.exists() else None
    if not spec or "heldout_modulo" in spec:
        modulo = (spec or {}).get("heldout_modulo", pairs.V4_SPEC.heldout_modulo)
        prompts = zoo_v4.heldout_prompts(count, pairs.V4Spec(heldout_modulo=modulo))
        return prompts, f"code openings from the held-out stdlib modules (zoo v4 split, 1 in {modulo})"
    from transformers import AutoTokenizer

    eval_tokens = spec.get("eval_tokens", pairs.DEFAULT_SPEC.eval_tokens)
    text = _v3_heldout_text(AutoTokenizer.from_pretrained(pair_dir / "target"), eval_tokens)
    lines = text.splitlines(keepends=True)
    prompts = [lines[i] + lines[i + 1] for i in range(len(lines) - 1)
               if lines[i].lstrip().startswith("def ") and lines[i].rstrip().endswith(":")]
    if len(prompts) < count:
        raise ValueError(f"the held-out text of {pair_dir} has {len(prompts)} function openings, "
                         f"{count} were asked for")
    step = len(prompts) / count  # spread over the held-out text
    return ([prompts[int(i * step)] for i in range(count)],
            f"def openings from the last {eval_tokens} tokens of the stdlib (zoo v3 held-out split)")


def held_out_prompts(count: int, pair_dir=None) -> list[str]:
    """The prompts of ``held_out_workload`` (the held-out split of the pair in ``pair_dir``)."""
    return held_out_workload(count, pair_dir)[0]


def _default_pair_dir() -> Path:
    from zoo import pairs

    folder = pairs.default_pair_dir()
    if not (folder / "report.json").exists():
        raise FileNotFoundError(f"no {folder.name} zoo pair yet (python -m zoo.train trains it)")
    return folder


def _v3_heldout_text(tokenizer, eval_tokens: int) -> str:
    """The text of the last ``eval_tokens`` tokens of the stdlib stream (files EOS-separated, as
    ``pairs.tokenize_split`` builds it), files joined by a blank line."""
    from zoo import pairs

    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in reversed(pairs.stdlib_corpus()):  # only the last few files are tokenised
        ids[:0] = tokenizer(text)["input_ids"] + [eos]
        if len(ids) >= eval_tokens:
            break
    tail, files, current = ids[-eval_tokens:], [], []
    for token in tail:
        if token == eos:
            files.append(current)
            current = []
        else:
            current.append(token)
    return "\n\n".join(tokenizer.decode(f) for f in files + [current] if f)


@dataclass
class Pair:
    target_dir: Path
    draft_dir: Path | None
    tokenizer: object
    target: object  # built-in model
    draft: object | None


def load_pair(target_dir=None, draft_dir=None, dtype=torch.float32, device="cpu", zoo_spec=None,
              log=print, threads: int = 0) -> Pair:
    """The given HF checkpoint folders, or the zoo pair ``zoo_spec`` (a ``pairs.SPECS`` key; default
    ``pairs.default_zoo()``: the shipped v4 pair when present, else v3, trained the first time with
    torch's own thread count), loaded in ``dtype`` (fp32: a shipped bf16 pair is cast); then
    ``threads`` (if > 0) becomes torch's thread count for decoding."""
    from transformers import AutoTokenizer

    from specdec_cuda import models
    from zoo import pairs

    if target_dir is None:
        target_dir, zoo_draft = pairs.get_pair(pairs.SPECS[zoo_spec or pairs.default_zoo()], log=log)
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
                target_forwards=m.target_forwards, target_seconds=m.target_seconds,
                propose_seconds=m.propose_seconds, one_time_seconds=m.one_time_seconds,
                accept_seconds=m.accept_seconds, outputs=out.tokens)


def hf_group(model, group: list[list[int]], max_new_tokens: int, eos: int | None, temperature: float = 0.0,
             seed: int = 0, **options) -> dict:
    """transformers ``generate`` on a batch of prompts (left-padded, with an attention mask):
    greedy, or sampled at ``temperature`` with top-k and top-p off (as this engine's defaults),
    seeded; ``options`` such as ``assistant_model`` or ``prompt_lookup_num_tokens`` pass through.
    Each row's new tokens stop after its first EOS (transformers pads the rest)."""
    pad = eos if eos is not None else 0
    width = max(len(p) for p in group)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=model.device)
    sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
                else dict(do_sample=False))
    torch.manual_seed(seed)
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=eos,
                             pad_token_id=pad, **sampling, **options)
    if ids.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    rows = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        rows.append(row)
    return dict(tokens=sum(map(len, rows)), seconds=seconds, row_steps=0, after_prefill=0, drafted=0,
                accepted=0, outputs=rows)


def combine(parts: list[dict]) -> dict:
    """Totals over groups: tokens/s over all of them, τ (tokens per target forward after the first
    token, per row), acceptance (accepted / drafted), outputs in prompt order; for this engine's
    runs also ``step_seconds`` (the mean target forward of a decoding step: a verification, for a
    speculative method) and ``draft_seconds_per_token`` (the proposer's time per drafted token:
    its ``propose`` and ``accept``, so a drafter fed the accepted path after each step, and a draft
    model's catch-up on the prompt, included)."""
    keys = ("tokens", "seconds", "row_steps", "after_prefill", "drafted", "accepted", "target_forwards",
            "target_seconds", "propose_seconds", "one_time_seconds", "accept_seconds")
    total = {key: sum(p.get(key, 0) for p in parts) for key in keys}
    return dict(tokens=total["tokens"], seconds=total["seconds"], tokens_per_s=total["tokens"] / total["seconds"],
                tau=total["after_prefill"] / total["row_steps"] if total["row_steps"] else None,
                acceptance=total["accepted"] / total["drafted"] if total["drafted"] else None,
                step_seconds=total["target_seconds"] / total["target_forwards"] if total["target_forwards"] else None,
                draft_seconds_per_token=((total["propose_seconds"] + total["accept_seconds"]) / total["drafted"]
                                         if total["drafted"] else None),
                # Per decoding step (a block, for a drafter that drafts one per step): propose / accept,
                # and the one-time part of propose (a drafter's prefill of the prompt: Metrics.one_time_seconds).
                propose_seconds_per_step=(total["propose_seconds"] / total["target_forwards"]
                                          if total["target_forwards"] else None),
                one_time_seconds_per_step=(total["one_time_seconds"] / total["target_forwards"]
                                           if total["target_forwards"] else None),
                accept_seconds_per_step=(total["accept_seconds"] / total["target_forwards"]
                                         if total["target_forwards"] else None),
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


DEMO_DRAFT_VOCAB = 32768  # the demo's draft_vocab row, for drafters of larger vocabularies


def demo(args) -> int:
    pair = load_pair(args.target, args.draft, device=args.device, zoo_spec=args.zoo, threads=args.threads)
    if pair.draft is None:
        raise SystemExit("the demo needs a draft model: pass --draft with --target")
    tok, eos = pair.tokenizer, pair.tokenizer.eos_token_id
    if getattr(args, "real_prompts", False):  # an instruct model: HumanEval problems as chat requests
        from bench import humaneval

        chosen = humaneval.prompts("chat", "bench", tokenizer=tok)[: args.prompts]
        problems = humaneval.load_problems()
        prompts, ids = [problems[p.task_id]["prompt"] for p in chosen], [p.token_ids for p in chosen]
    else:
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
        # No second model: drafts copied from the request's own text (a code reply repeats much of
        # its prompt; on the real pair's bf16 folder 1.87x, the fastest method of the real bench).
        "prompt lookup, k=8": SpeculativeDecoder(pair.target, "prompt_lookup", k=8),
    }
    if pair.draft.vocab_size > DEMO_DRAFT_VOCAB and hasattr(pair.draft, "vocab_subset"):
        # A large vocabulary: the drafter's LM head over its first ids only (lossless; the real
        # 0.5B's head is a quarter of its step).
        methods[f"draft model, k={args.k}, draft vocab {DEMO_DRAFT_VOCAB}"] = SpeculativeDecoder(
            pair.target, "draft", draft=pair.draft, k=args.k, policy="fixed", draft_vocab=DEMO_DRAFT_VOCAB)
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
                shown = "" if getattr(args, "real_prompts", False) else prompt  # a chat reply stands alone
                print(f"--- {r['method']}:\n{shown}{tok.decode(r['outputs'][i])}")
    print_table(rows, "autoregressive (greedy)")
    print(f"\n{len(prompts)} prompts, {args.max_new_tokens} new tokens each, {torch.get_num_threads()} CPU thread(s); "
          "one run per method (bench/bench_e2e.py repeats and interleaves them)")
    diffusion_demo(args, prompts)
    return 0


def diffusion_demo(args, prompts: list[str]) -> None:
    """The zoo's masked-diffusion LM on the same prompts, LOSSY (its own text, not the target's):
    Fast-dLLM threshold rule (0.7) with the dual cache. Shown when cached, or trained with --diffusion."""
    from zoo import diffusion as zoo_diffusion
    from specdec_cuda.diffusion_generate import DiffusionGenerator

    spec = zoo_diffusion.SPECS.get(args.zoo)
    if spec is None:
        print(f"\n(diffusion generation, lossy: no zoo diffusion LM for --zoo {args.zoo})")
        return
    cached = zoo_diffusion.trained_diffusion_dir(spec) is not None
    if args.target or not (cached or getattr(args, "diffusion", False)):
        print("\n(diffusion generation, lossy: pass --diffusion to train the zoo diffusion LM and show it)")
        return
    model, tok = zoo_diffusion.load_zoo_diffusion(spec, device=args.device)
    # Threshold 0.7: bench_diffusion's best setting within 10% of one-token-per-step perplexity on
    # the v4-adapted model (at 0.9 the rule almost never fires on a model this small).
    gen = DiffusionGenerator(model, block_length=32, threshold=0.7, use_cache="dual")
    max_new = min(args.max_new_tokens, 64)
    out = gen.generate(encode(tok, prompts), max_new_tokens=max_new, eos_token_id=model.config.eos_token_id)
    print("\n" + "=" * 80 + "\ndiffusion LM (LOSSY: a different model's text, not lossless decoding), "
          "threshold 0.7, dual cache")
    for prompt, tokens in zip(prompts, out.tokens):
        print(f"--- diffusion (lossy):\n{prompt}{tok.decode(tokens)}")
    m = out.metrics
    print(f"diffusion (lossy): {m.tokens_per_s:.1f} tokens/s, {m.unmasked_per_forward:.2f} positions unmasked "
          f"per forward, {m.target_forwards} forwards")


# ------------------------------------------------------------------------------ the end-to-end bench

HEADLINE_TARGET = 1.5  # this engine's best method >= 1.5x the best transformers option
SAMPLED_TEMPERATURE = 0.8


@dataclass
class Runner:
    """One configuration of the bench: its row name, who runs it, and one call on a group.

    ``run(group, temperature, max_new_tokens)`` returns ``engine_group``'s dict; ``max_batch`` is
    the largest group it runs (None: any).
    """

    name: str
    system: str  # "engine" or "transformers"
    lossless: bool
    run: Callable[[list[list[int]], float, int], dict]
    max_batch: int | None = None


def engine_runners(pair: Pair, eos: int | None, seed: int = 0) -> tuple[list[Runner], dict[str, str]]:
    """Every registered method in each configuration ``bench/configs.py`` lists for it (the
    autoregressive baseline first), and {method: why it is not benched} for the others."""
    from specdec_cuda import methods

    runners, not_benched = [], {}
    for spec in sorted(methods.available(), key=lambda m: m.kind != "autoregressive"):
        configs, reason = configurations(spec.name, pair)
        if reason is not None:
            not_benched[spec.name] = reason
        for label, options in configs:
            options = dict(options)
            if spec.kind == "generation" and "model" not in options:
                raise ValueError(f"bench/configs.py: the generation method {spec.name!r} must name its model "
                                 f"under the option 'model' (configuration {label!r})")
            model = options.pop("model") if spec.kind == "generation" else pair.target
            decoder = SpeculativeDecoder(model, spec.name, **options)

            def run(group, temperature, max_new, decoder=decoder):
                return engine_group(decoder, group, max_new_tokens=max_new, eos_token_id=eos,
                                    temperature=temperature, seed=seed)

            name = f"engine {spec.name}" + (f" ({label})" if label else "")
            runners.append(Runner(name, "engine", spec.lossless, run))
    return runners, not_benched


def transformers_runners(pair: Pair, eos: int | None, device: str, prompt_lookup: int,
                         seed: int = 0) -> list[Runner]:
    """transformers ``generate`` on the same folders: plain (any batch), with ``assistant_model=``
    the draft and with ``prompt_lookup_num_tokens=`` (batch 1: transformers rejects larger batches
    for both)."""
    from transformers import AutoModelForCausalLM

    def load(folder):
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()

    target = load(pair.target_dir)

    def runner(name, max_batch=None, **options):
        def run(group, temperature, max_new):
            return hf_group(target, group, max_new, eos, temperature, seed, **options)
        return Runner(name, "transformers", True, run, max_batch)

    out = [runner("transformers generate")]
    if pair.draft_dir is not None:
        out.append(runner("transformers generate + assistant_model", 1, assistant_model=load(pair.draft_dir)))
    out.append(runner(f"transformers generate + prompt_lookup_num_tokens={prompt_lookup}", 1,
                      prompt_lookup_num_tokens=prompt_lookup))
    return out


def _median(reps: list[dict]) -> dict:
    return sorted(reps, key=lambda x: x["seconds"])[len(reps) // 2]


def best_ratios(rows: list[dict]) -> list[dict]:
    """Per (workload, batch, temperature): this engine's fastest lossless configuration (greedy:
    only those whose output was identical) against the fastest transformers option."""
    out = []
    settings = dict.fromkeys((r["workload"], r["batch"], r["temperature"]) for r in rows)
    for workload, batch, temperature in settings:
        rs = [r for r in rows if (r["workload"], r["batch"], r["temperature"]) == (workload, batch, temperature)]
        engine = [r for r in rs if r["system"] == "engine" and r["lossless"] and r.get("identical") is not False]
        hf = [r for r in rs if r["system"] == "transformers"]
        if not engine or not hf:
            continue
        e, h = max(engine, key=lambda r: r["tokens_per_s"]), max(hf, key=lambda r: r["tokens_per_s"])
        out.append(dict(workload=workload, batch=batch, temperature=temperature, engine=e["method"],
                        transformers=h["method"], ratio=e["tokens_per_s"] / h["tokens_per_s"]))
    return out


def print_bench_table(rows: list[dict]) -> None:
    width = max(len(r["method"]) for r in rows)
    head = (f"{'workload':14s} {'batch':>5s} {'T':>4s}  {'method':{width}s} {'tokens/s':>9s} {'tau':>6s} "
            f"{'accept':>7s} {'vs AR':>6s} {'identical':>9s} {'step/AR':>7s} {'draft/AR':>8s}")
    print("\n" + head + "\n" + "-" * len(head))
    last = None
    for r in rows:
        setting = (r["workload"], r["batch"], r["temperature"])
        if last is not None and setting != last:
            print()
        last = setting
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"
        acc = f"{100 * r['acceptance']:.0f}%" if r.get("acceptance") is not None else "-"
        same = {True: "yes", False: "NO", None: "-"}[r.get("identical")]
        if r["lossless"] is False:  # None: not known (a peer's sampled row)
            same = "lossy"
        # a step's target forward and a drafted token's propose time, in autoregressive steps
        step = f"{r['step_vs_ar']:.2f}" if r.get("step_vs_ar") is not None else "-"
        draft = f"{r['draft_vs_ar_step']:.2f}" if r.get("draft_vs_ar_step") is not None else "-"
        print(f"{r['workload']:14s} {r['batch']:5d} {r['temperature']:4.1f}  {r['method']:{width}s} "
              f"{r['tokens_per_s']:9.1f} {tau:>6s} {acc:>7s} {r['vs_engine_ar']:5.2f}x {same:>9s} "
              f"{step:>7s} {draft:>8s}")


def bench(args) -> int:
    """The end-to-end bench, one table in one run: this engine's autoregressive decoding and every
    registered method (in the configurations ``bench/configs.py`` lists) against transformers
    ``generate`` (plain, ``assistant_model=`` the draft, ``prompt_lookup_num_tokens=``), on two
    workloads (the built-in prompts and the pair's held-out split), batch 1 and ``--batch``,
    greedy and T = 0.8. Greedy rows are checked token for token against this engine's
    autoregressive output of the same setting.

    Timings on a shared CPU drift and jump (other tenants share the last-level cache the models
    stream from), so every configuration runs ``--repeats`` times, finely interleaved: for each
    group of prompts (one prompt at batch 1, the whole batch otherwise) every configuration runs
    once before the next group, and every group before the next repeat. Each configuration's time
    per group is the median of its repeats.

    The headline: on the held-out workload at batch 1, greedy, this engine's fastest lossless
    method against the fastest transformers option (target >= 1.5x).
    """
    pair = load_pair(args.target, args.draft, device=args.device, zoo_spec=args.zoo, threads=args.threads)
    tok, eos = pair.tokenizer, pair.tokenizer.eos_token_id
    count, batch = (4, 4) if args.quick else (args.prompts, args.batch)
    if not 1 <= count <= len(PROMPTS) or batch < 1:
        raise ValueError(f"--prompts must be in [1, {len(PROMPTS)}] and --batch >= 1, got {count} and {batch}")
    max_new = 32 if args.quick else args.max_new_tokens
    try:
        held, held_source = held_out_workload(count, pair.target_dir.parent)
    except ValueError as exc:  # a pair whose own held-out text is too short (tiny test pairs)
        from zoo import v4 as zoo_v4

        held = zoo_v4.heldout_prompts(count)
        held_source = f"code openings from the held-out stdlib modules (zoo v4 split), since {exc}"
    workloads = {"bench prompts": encode(tok, PROMPTS[:count]), "held-out": encode(tok, held)}
    runners, not_benched = engine_runners(pair, eos)
    runners += transformers_runners(pair, eos, args.device, args.prompt_lookup)
    for runner in runners:  # warm-up: allocator, first-call overheads, caches, the cost policy's timings
        runner.run(workloads["bench prompts"][:1], 0.0, 8)

    batches = sorted({1, batch})
    temperatures = (0.0, SAMPLED_TEMPERATURE)
    groups = {(w, b): [ids[i: i + b] for i in range(0, len(ids), b)] for w, ids in workloads.items() for b in batches}
    jobs = [(w, b, t, r) for w in workloads for b in batches for t in temperatures for r in runners
            if r.max_batch is None or b <= r.max_batch]
    runs = {(w, b, t, r.name): [[] for _ in groups[w, b]] for w, b, t, r in jobs}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for w in workloads:
            for b in batches:
                for gi, group in enumerate(groups[w, b]):
                    for jw, jb, t, r in jobs:
                        if (jw, jb) == (w, b):
                            runs[w, b, t, r.name][gi].append(r.run(group, t, max_new))
        elapsed = time.perf_counter() - started
        print(f"[bench] repeat {repeat + 1}/{args.repeats} done, {elapsed:.0f}s "
              f"(ETA {elapsed / (repeat + 1) * (args.repeats - repeat - 1):.0f}s)", flush=True)

    rows = []
    for w, b, t, r in jobs:
        result = combine([_median(reps) for reps in runs[w, b, t, r.name]])
        rows.append(dict(workload=w, batch=b, temperature=t, method=r.name, system=r.system,
                         lossless=r.lossless, repeats=args.repeats, **result))
    for row in rows:
        ar = next(r for r in rows if r["method"] == "engine autoregressive"
                  and (r["workload"], r["batch"], r["temperature"]) == (row["workload"], row["batch"], row["temperature"]))
        row["vs_engine_ar"] = row["tokens_per_s"] / ar["tokens_per_s"]
        row["identical"] = row["outputs"] == ar["outputs"] if row["temperature"] == 0.0 else None

    print(f"\ntarget {pair.target_dir}\ndraft  {pair.draft_dir}\nheld-out workload: {held_source}")
    print_bench_table(rows)
    for name, reason in not_benched.items():
        print(f"not benched: {name}: {reason}")
    broken = [f"{r['method']} ({r['workload']}, batch {r['batch']})" for r in rows
              if r["system"] == "engine" and r["lossless"] and r["identical"] is False]
    for name in broken:
        print(f"NOT IDENTICAL to autoregressive greedy output (a lossless method): {name}")
    best = best_ratios(rows)
    print()
    for b in best:
        print(f"best engine / best transformers, {b['workload']:13s} batch {b['batch']} T={b['temperature']:.1f}: "
              f"{b['ratio']:5.2f}x  ({b['engine']} vs {b['transformers']})")
    headline = next((b for b in best if (b["workload"], b["batch"], b["temperature"]) == ("held-out", 1, 0.0)), None)
    if headline is not None:
        headline = dict(headline, at_least=HEADLINE_TARGET, met=headline["ratio"] >= HEADLINE_TARGET)
        print(f"\nheadline (held-out, batch 1, greedy): this engine's best / transformers' best = "
              f"{headline['ratio']:.2f}x (target >= {HEADLINE_TARGET}x: {'met' if headline['met'] else 'NOT met'})")
    print(f"{count} prompts per workload, {max_new} new tokens, {torch.get_num_threads()} CPU thread(s), "
          f"medians of {args.repeats} interleaved repeats")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "target": str(pair.target_dir), "draft": str(pair.draft_dir), "max_new_tokens": max_new,
        "prompts_per_workload": count, "batches": batches, "temperatures": list(temperatures),
        "held_out_source": held_source, "device": args.device, "threads": torch.get_num_threads(),
        "repeats": args.repeats, "headline": headline, "best_by_setting": best, "not_benched": not_benched,
        "not_identical": broken,
        "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows]}, indent=2))
    print(f"\nwrote {out}")
    return 0
