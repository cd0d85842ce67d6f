"""Diffusion-LM generation (LOSSY): speed and quality against steps, threshold and the KV cache.

For the zoo diffusion LM (trained on first use) on held-out prompts of the zoo corpus, every
configuration generates the same prompts and reports
  * tokens per forward (positions unmasked per model forward per row) and tokens/s (generated
    positions per second, text after EOS included: the work done);
  * quality: the perplexity of the generated continuation under the zoo autoregressive target
    (NLL of each continuation token given the prompt and the tokens before it), and for the cached
    runs the share of generated positions equal to the same configuration without the cache,
beside the same figures for the zoo target's own greedy and sampled continuations, and for the
diffusion model at one token per step (LLaDA's slowest, most careful setting), the baseline of the
issue's target: threshold rule + cache at >= 3x its tokens/s with <= 10% higher perplexity.

Also the confidence profile that decides whether the threshold rule can fire at all: on held-out
text, the share of positions of a masked block (clean prompt before it, masks after it) whose
diffusion confidence reaches each threshold, beside the AR target's next-token confidence on the
same tokens.

Usage: python bench/bench_diffusion.py [--quick] [--zoo default|scratch|small] [--model DIR --ar-target DIR]
                                       [--out PATH] [--threads N]
Writes JSON (default bench/results/diffusion.json), a PNG plot beside it, and prints a table.
Timings are wall-clock on the CPU: on a shared machine they are noisy (say so when reporting).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: zoo/, bench/

import torch  # noqa: E402

from zoo import pairs
from zoo import diffusion as zoo_diffusion  # noqa: E402
from specdec_cuda.decoding import SamplingParams  # noqa: E402
from specdec_cuda.diffusion_generate import DiffusionGenerator  # noqa: E402


def held_out_prompts(tokenizer, count: int, prompt_tokens: int, pair_dir: Path) -> list[list[int]]:
    """``count`` prompts of ``prompt_tokens`` tokens, each starting at a line start, from text the
    pair in ``pair_dir`` held out: zoo v4's held-out stdlib modules (a third, a half and two thirds
    into each), or for a v3 pair the last files of the stdlib stream (its held-out tail)."""
    modulo = pairs.pair_heldout_modulo(pair_dir)
    if modulo:
        from zoo import v4 as zoo_v4

        texts = [t for _, t in zoo_v4.stdlib_heldout(pairs.V4Spec(heldout_modulo=modulo))]
        starts = [(t, f) for f in (1 / 3, 1 / 2, 2 / 3) for t in texts]
    else:
        starts = [(t, 1 / 3) for t in pairs.stdlib_corpus()[-count * 2:]]
    prompts = []
    for text, fraction in starts:
        lines = text.splitlines(keepends=True)
        start = int(len(lines) * fraction)
        ids = tokenizer("".join(lines[start:start + 40]), add_special_tokens=False)["input_ids"]
        if len(ids) >= prompt_tokens:
            prompts.append(ids[:prompt_tokens])
        if len(prompts) == count:
            break
    return prompts


@torch.no_grad()
def perplexity(ar_model, prompts, continuations) -> float:
    """exp(mean NLL) of the continuation tokens under the AR model, given each prompt."""
    nll, count = 0.0, 0
    for prompt, cont in zip(prompts, continuations):
        if not cont:
            continue
        ids = torch.tensor([prompt + cont])
        logp = torch.log_softmax(ar_model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        targets = ids[0, 1:]
        token_logp = logp[torch.arange(targets.numel()), targets][len(prompt) - 1:]
        nll -= float(token_logp.sum())
        count += token_logp.numel()
    return math.exp(nll / count) if count else float("nan")


PROFILE_THRESHOLDS = (0.3, 0.5, 0.7, 0.9, 0.95)


@torch.no_grad()
def confidence_profile(model, ar_model, windows: list[list[int]], prompt_tokens: int, block: int) -> dict:
    """Per threshold, the share of block positions whose confidence reaches it: the diffusion
    model's (prompt clean, the block and everything after it masked, as at a block's first step)
    and the AR target's next-token max probability on the same true text (teacher forced).

    Shape: windows: lists of at least prompt_tokens + block token ids.
    """
    x = torch.tensor([w[: prompt_tokens + block] for w in windows])  # [N, P + block]
    masked = x.clone()
    masked[:, prompt_tokens:] = model.mask_token_id
    diff = model(masked).logits[:, prompt_tokens:].softmax(-1).amax(-1)  # [N, block]
    ar = ar_model(input_ids=x).logits[:, prompt_tokens - 1: -1].float().softmax(-1).amax(-1)  # [N, block]
    share = lambda c, th: float((c >= th).float().mean())  # noqa: E731
    return {"thresholds": list(PROFILE_THRESHOLDS),
            "diffusion_block": [share(diff, th) for th in PROFILE_THRESHOLDS],
            "diffusion_first_position": [share(diff[:, 0], th) for th in PROFILE_THRESHOLDS],
            "ar_next_token": [share(ar, th) for th in PROFILE_THRESHOLDS],
            "positions": diff.numel()}


def run_diffusion(model, prompts, eos, gen_length, block_length, temperature=0.0, **options) -> dict:
    gen = DiffusionGenerator(model, gen_length=gen_length, block_length=block_length, **options)
    params = SamplingParams.make(len(prompts), temperature=temperature, seed=list(range(len(prompts))))
    start = time.perf_counter()
    out = gen.generate(prompts, params, max_new_tokens=gen_length, eos_token_id=eos)
    seconds = time.perf_counter() - start
    m = out.metrics
    positions = gen_length * len(prompts)
    return dict(outputs=out.tokens, seconds=seconds, forwards=m.target_forwards,
                tokens_per_forward=m.unmasked_per_forward, tokens_per_s=m.unmasked / seconds,
                positions=positions)


def run_ar(ar_model, prompts, eos, max_new: int, temperature: float) -> dict:
    """The zoo target's own continuations (transformers generate, one prompt at a time)."""
    outputs, seconds = [], 0.0
    torch.manual_seed(0)
    for p in prompts:
        ids = torch.tensor([p])
        start = time.perf_counter()
        with torch.no_grad():
            sampling = dict(do_sample=True, temperature=temperature, top_k=0) if temperature > 0 else dict(do_sample=False)
            res = ar_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                    eos_token_id=eos, pad_token_id=eos, **sampling)
        seconds += time.perf_counter() - start
        new = res[0, len(p):].tolist()
        outputs.append(new[: new.index(eos) + 1] if eos in new else new)
    tokens = sum(len(o) for o in outputs)
    return dict(outputs=outputs, seconds=seconds, forwards=tokens, tokens_per_forward=1.0,
                tokens_per_s=tokens / seconds, positions=tokens)


def cut_at_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    markers = {"none": "o", "prefix": "s", "dual": "^"}
    for r in rows:
        if r["kind"] != "diffusion":
            continue
        ax.scatter(r["tokens_per_s"], r["perplexity"], marker=markers[r["cache"]],
                   color="tab:red" if r["rule"] == "threshold" else "tab:blue")
        ax.annotate(r["label"], (r["tokens_per_s"], r["perplexity"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    for r in rows:
        if r["kind"] == "ar":
            ax.axhline(r["perplexity"], linestyle="--", color="gray", linewidth=0.8)
            ax.annotate(r["label"], (ax.get_xlim()[0], r["perplexity"]), fontsize=7, color="gray")
    ax.set_xscale("log")
    ax.set_xlabel("generated positions / s (CPU, wall clock; log scale)")
    ax.set_ylabel("perplexity under the zoo AR target (lower is better)")
    ax.set_title("Diffusion-LM generation (lossy): quality / speed\n"
                 "blue: top-n steps, red: threshold; o no cache, s prefix cache, ^ dual cache")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 prompts, L = 64, fewer configurations")
    parser.add_argument("--zoo", choices=sorted(zoo_diffusion.SPECS), default=None,
                        help="which zoo diffusion model (and its pair's AR target) to use (default: the one "
                             "of the demo's pair, v4 when shipped)")
    parser.add_argument("--model", default=None,
                        help="a diffusion checkpoint folder instead of the zoo's (e.g. one adapted from a newer target)")
    parser.add_argument("--ar-target", default=None,
                        help="the AR target that scores perplexity (default: the zoo pair's; give it with --model "
                             "when the model uses another tokenizer)")
    parser.add_argument("--out", default="bench/results/diffusion.json")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="diffusion sampling temperature (default 0: greedy, LLaDA's setting)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = zoo_diffusion.SPECS[args.zoo or pairs.default_zoo()]
    target_dir = Path(args.ar_target) if args.ar_target else pairs.get_pair(pairs.SPECS[spec.pair])[0]
    if args.model:
        from transformers import PreTrainedTokenizerFast

        from specdec_cuda.models.diffusion_lm import load_diffusion

        model_dir = Path(args.model)
        model, tokenizer = load_diffusion(model_dir), PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    else:
        model_dir = zoo_diffusion.get_diffusion(spec)
        model, tokenizer = zoo_diffusion.load_zoo_diffusion(spec)
    ar_model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ar_vocab = AutoTokenizer.from_pretrained(target_dir).get_vocab()
    mine = {t: i for t, i in tokenizer.get_vocab().items() if i != model.mask_token_id}
    if mine != ar_vocab:
        raise SystemExit(f"the diffusion model's tokenizer differs from the AR target's ({target_dir}): "
                         "perplexities would compare different token ids; retrain it with the pair cached")
    eos = model.config.eos_token_id
    count, gen_length, block = (4, 64, 32) if args.quick else (8, 128, 32)
    prompts = held_out_prompts(tokenizer, count, 48, target_dir.parent)
    profile = confidence_profile(model, ar_model, held_out_prompts(tokenizer, 32, 48 + block, target_dir.parent),
                                 48, block)
    print("confidence profile (share of positions >= threshold; diffusion: a masked block after a clean "
          f"prompt, {profile['positions']} positions; AR: next token, teacher forced):")
    for i, th in enumerate(profile["thresholds"]):
        print(f"  >= {th:4.2f}: diffusion block {100 * profile['diffusion_block'][i]:5.1f}%  first block position "
              f"{100 * profile['diffusion_first_position'][i]:5.1f}%  AR next token {100 * profile['ar_next_token'][i]:5.1f}%")

    # (label, rule, cache, options)
    configs = [("1 token/step", "top-n", "none", dict(steps=block))]
    for steps in ((8, 4) if args.quick else (16, 8, 4)):
        configs.append((f"{block // steps} tokens/step", "top-n", "none", dict(steps=steps)))
    thresholds = (0.9, 0.7, 0.5) if args.quick else (0.95, 0.9, 0.8, 0.7, 0.5)
    for th in thresholds:
        configs.append((f"threshold {th}", "threshold", "none", dict(threshold=th)))
    for cache in ("prefix", "dual"):
        for th in thresholds:
            configs.append((f"threshold {th} + {cache} cache", "threshold", cache, dict(threshold=th, use_cache=cache)))
    configs.append(("1 token/step + prefix cache", "top-n", "prefix", dict(steps=block, use_cache="prefix")))
    configs.append(("1 token/step + dual cache", "top-n", "dual", dict(steps=block, use_cache="dual")))

    run_diffusion(model, prompts[:1], eos, block, block, steps=4)  # warm-up
    rows, uncached = [], {}
    for label, rule, cache, options in configs:
        r = run_diffusion(model, prompts, eos, gen_length, block, args.temperature, **options)
        raw = r.pop("outputs")
        outputs = [cut_at_eos(o, eos) for o in raw]
        # the approximate cache's effect on the output: positions equal to the uncached run's
        key = (rule, options.get("threshold"), options.get("steps"))
        if cache == "none":
            uncached[key] = raw
        same = sum(a == b for x, y in zip(raw, uncached.get(key, raw)) for a, b in zip(x, y))
        r.update(label=label, kind="diffusion", rule=rule, cache=cache,
                 perplexity=perplexity(ar_model, prompts, outputs),
                 same_as_uncached=same / sum(len(x) for x in raw) if cache != "none" and key in uncached else None,
                 sample=tokenizer.decode(outputs[0]))
        rows.append(r)
        print(f"[bench] {label:32s} {r['tokens_per_s']:8.1f} tok/s  {r['tokens_per_forward']:5.2f} tok/fwd  "
              f"ppl {r['perplexity']:8.2f}", flush=True)
    for label, temperature in (("AR target greedy", 0.0), ("AR target sampled T=1", 1.0)):
        r = run_ar(ar_model, prompts, eos, gen_length, temperature)
        outputs = r.pop("outputs")
        r.update(label=label, kind="ar", rule="-", cache="-", perplexity=perplexity(ar_model, prompts, outputs),
                 sample=tokenizer.decode(outputs[0]))
        rows.append(r)

    base = rows[0]
    print(f"\n{'configuration (diffusion rows are LOSSY)':40s} {'tok/fwd':>8s} {'tok/s':>8s} {'speedup':>8s} "
          f"{'ppl':>8s} {'ppl vs 1/step':>14s} {'= uncached':>11s}")
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["ppl_ratio"] = r["perplexity"] / base["perplexity"]
        same = f"{100 * r['same_as_uncached']:.0f}%" if r.get("same_as_uncached") is not None else "-"
        print(f"{r['label']:40s} {r['tokens_per_forward']:8.2f} {r['tokens_per_s']:8.1f} {r['speedup']:7.2f}x "
              f"{r['perplexity']:8.2f} {r['ppl_ratio']:13.2f}x {same:>11s}")
    # The target: threshold rule + cache, >= 3x the tokens/s of one token per step at no
    # more than 10% higher perplexity. Reported for the best qualifying configuration; a run whose
    # threshold rule never fired (about one position per forward) does not qualify: its gain is the
    # cache's alone, which the 1-token/step + cache rows measure.
    candidates = [r for r in rows if r["kind"] == "diffusion" and r["rule"] == "threshold" and r["cache"] != "none"]

    def qualifies(r):
        return r["speedup"] >= 3.0 and r["ppl_ratio"] <= 1.10 and r["tokens_per_forward"] >= 1.05

    meeting = [r for r in candidates if qualifies(r)]
    best = max(meeting or candidates, key=lambda r: (qualifies(r), r["speedup"]))
    met = bool(meeting)
    # At temperature > 0 the confidence is the token's probability under the tempered (and
    # filtered) distribution the token was drawn from, sharper than the model's softmax for T < 1:
    # the verdict says at which temperature it was reached.
    setting = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g} (tempered confidences)"
    print(f"\ntarget: threshold + cache >= 3x tokens/s of 1 token/step at <= 1.10x perplexity, {setting}: "
          f"{'met' if met else 'NOT met'} (best: {best['label']}, {best['speedup']:.2f}x, "
          f"perplexity {best['ppl_ratio']:.2f}x, {best['tokens_per_forward']:.2f} tokens/forward)")
    # Split the best configuration's speedup into the cache's (1 token/step with the same cache)
    # and the rule's (the rest): a verdict met with a rule gain near 1x is the cache's doing.
    same_cache = next(r for r in rows if r["kind"] == "diffusion" and r["rule"] == "top-n"
                      and r["cache"] == best["cache"] and r["tokens_per_forward"] == 1.0)
    rule_gain = best["tokens_per_s"] / same_cache["tokens_per_s"]
    print(f"of which the {best['cache']} cache: {same_cache['speedup']:.2f}x (1 token/step with it), "
          f"the threshold rule: {rule_gain:.2f}x on top")
    if best["tokens_per_forward"] < 1.05:
        print("note: the threshold rule unmasked ~1 position per forward (confidences below the thresholds): "
              "the speedup is the cache's alone, plus timing noise; the model is too weak for the rule to fire")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "diffusion_model": str(model_dir), "ar_target": str(target_dir), "confidence_profile": profile,
        "prompts": len(prompts), "prompt_tokens": 48, "gen_length": gen_length, "block_length": block,
        "threads": torch.get_num_threads(), "quick": args.quick, "temperature": args.temperature,
        "target": {"best": best["label"], "speedup": best["speedup"], "ppl_ratio": best["ppl_ratio"], "met": met,
                   "cache_speedup": same_cache["speedup"], "rule_gain": rule_gain},
        "rows": rows}, indent=2))
    png = out.with_suffix(".png")
    plot(rows, png)
    print(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
