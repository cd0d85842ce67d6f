"""Speculation against batch size: every registered method with its defaults (the cost policy) as a
ratio to this engine's autoregressive decoding at the same batch size and temperature, on the zoo
pair and the real pair; and (``--sweep``) fixed draft lengths, adaptive k and the cost policy of the
draft model on the zoo pair.

    python bench/bench_policy.py [--pairs zoo real] [--methods M ...] [--batches 1 4 8 16]
                                 [--real-batches 1 4] [--temperatures 0 0.8] [--repeats N] [--quick]
    python bench/bench_policy.py --sweep [--batches 1 4 8 16] [--ks 1 2 4 8]

The grid: per pair, one ``SpeculativeDecoder`` per method, built once with the method's defaults and
the trained parts the pair has for it (a method needing parts the pair lacks is reported as not
benched). Each cell (pair, batch, temperature) first runs every configuration once on other
prompts of the same shape, as a server's earlier requests would (the policy learns this model's
and machine's costs at this batch size there, starting from a fresh memory folder), then times
them on held-out prompts the bench never tunes on (zoo: held-out openings of the corpus, the
warm-up on the next ones; real: the HumanEval held-out half, the warm-up on the bench half). Batch 1 decodes four prompts one at a time; batch b decodes b prompts as
one batch. Configurations run interleaved per repeat (15 on the zoo pair, ``--real-repeats`` 1 on
the real one), each cell's time the median of its repeats.
Each cell: method time / autoregressive time at the same batch and temperature, and whether the
output is the autoregressive output (greedy) or the same samples of the same seeds (T > 0: so for
methods verified by sample-and-match; rejection sampling gives other samples of the same
distribution). At batch 1, greedy, each method also runs with ``policy="fixed"`` (its default
draft length, always drafted): how much of always drafting's gain the policy keeps. Writes JSON, a
table, and a PNG heat map per pair next to the JSON.

The sweep (the earlier bench): fixed k, adaptive k and the cost policy at each batch size, greedy,
zoo pair, with a plot of speedup and tau against k.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: zoo/, bench/

import torch  # noqa: E402

from specdec_cuda import SpeculativeDecoder, methods  # noqa: E402
from bench import e2e  # noqa: E402
from bench.configs import CONFIGS, REAL_CONFIGS, configurations  # noqa: E402

# Options that name a method's trained parts (what the pair brings); every other option keeps the
# method's default.
PART_OPTIONS = ("draft", "heads", "drafter")
# Not in the grid: quantspec's baseline is decoding on its own 4-bit KV cache (bench_quantspec.py),
# cross_tokenizer needs a drafter of another tokenizer (bench_real.py --cross-draft), ngram is
# prompt_lookup under another name.
SKIPPED = {"quantspec": "its baseline is autoregressive decoding on its 4-bit KV cache (bench_quantspec.py)",
           "cross_tokenizer": "needs a drafter of another tokenizer (bench_real.py --cross-draft)",
           "ngram": "prompt_lookup under another name"}


def _sweep_configs(pair, ks: list[int], k_policy: int) -> dict[str, SpeculativeDecoder]:
    configs = {"autoregressive": SpeculativeDecoder(pair.target)}
    for k in ks:
        configs[f"fixed k={k}"] = SpeculativeDecoder(pair.target, "draft", draft=pair.draft, k=k, policy="fixed")
    configs[f"adaptive k<={2 * k_policy}"] = SpeculativeDecoder(
        pair.target, "draft", draft=pair.draft, k=k_policy, adaptive_k=True, policy="fixed")
    configs[f"cost policy k<={2 * k_policy}"] = SpeculativeDecoder(
        pair.target, "draft", draft=pair.draft, k=k_policy, adaptive_k=True, policy="cost")
    return configs


def _prompts(pair, count: int) -> list[list[int]]:
    texts = list(e2e.PROMPTS)
    if count > len(texts):
        texts += e2e.held_out_prompts(count - len(texts))
    return e2e.encode(pair.tokenizer, texts[:count])


def sweep(args) -> int:
    repeats = args.repeats or (2 if args.quick else 3)
    max_new = args.max_new_tokens or (24 if args.quick else 48)

    pair = e2e.load_pair(threads=args.threads)
    eos = pair.tokenizer.eos_token_id
    configs = _sweep_configs(pair, args.ks, args.k)
    prompts = _prompts(pair, max(args.batches))
    common = dict(max_new_tokens=max_new, eos_token_id=eos, temperature=0.0)
    for decoder in configs.values():  # warm-up: allocator, first-call overheads
        decoder.generate(prompts[:1], max_new_tokens=8, eos_token_id=eos)

    rows = []
    for batch in args.batches:
        # Batch b decodes the first b prompts as one batch (batch 1: each of the first 4 alone).
        groups = [[p] for p in prompts[:4]] if batch == 1 else [prompts[:batch]]
        times = {name: [] for name in configs}
        results = {}
        for _ in range(repeats):
            for name, decoder in configs.items():
                parts = [e2e.engine_group(decoder, g, **common) for g in groups]
                times[name].append(sum(p["seconds"] for p in parts))
                results[name] = e2e.combine(parts)
        base = statistics.median(times["autoregressive"])
        reference = results["autoregressive"]["outputs"]
        for name in configs:
            seconds = statistics.median(times[name])
            r = results[name]
            rows.append(dict(batch=batch, config=name, tokens=r["tokens"], seconds=seconds,
                             tokens_per_s=r["tokens"] / seconds, speedup=base / seconds, tau=r["tau"],
                             acceptance=r["acceptance"], identical=r["outputs"] == reference))
        print(f"[policy bench] batch {batch} done", flush=True)

    overhead = _host_overhead(configs[f"cost policy k<={2 * args.k}"], prompts[:1], common)
    _print(rows)
    by = {(r["batch"], r["config"]): r for r in rows}
    policy = f"cost policy k<={2 * args.k}"
    adaptive = f"adaptive k<={2 * args.k}"
    targets = {}
    if 1 in args.batches:
        targets["policy at batch 1 >= adaptive k's gain"] = dict(
            value=by[(1, policy)]["speedup"], at_least=by[(1, adaptive)]["speedup"])
    for b in args.batches:
        if b > 1:
            targets[f"policy at batch {b} >= 0.95x plain"] = dict(value=by[(b, policy)]["speedup"], at_least=0.95)
    print()
    for name, t in targets.items():
        t["met"] = t["value"] >= t["at_least"] - 1e-9
        print(f"target {name:42s} {t['value']:.2f}x (need {t['at_least']:.2f}x)  {'met' if t['met'] else 'NOT met'}")
    print(f"host overhead per step (cost policy, batch 1): {100 * overhead:.1f}% of the step")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(target=str(pair.target_dir), draft=str(pair.draft_dir), max_new_tokens=max_new,
                                   repeats=repeats, threads=torch.get_num_threads(), rows=rows, targets=targets,
                                   host_overhead_batch1=overhead), indent=2))
    png = out.with_suffix(".png")
    _plot(rows, args.ks, policy, png)
    print(f"\nwrote {out} and {png}")
    return 0


def _host_overhead(decoder: SpeculativeDecoder, prompts, common) -> float:
    """Share of a decoding step spent outside the target and drafter forwards (one batch-1 run)."""
    return decoder.generate(prompts, **common).metrics.host_overhead


def _print(rows: list[dict]) -> None:
    print(f"\n{'batch':>5s} {'config':24s} {'tokens/s':>9s} {'speedup':>8s} {'tau':>6s} {'accept':>7s} {'greedy same':>12s}")
    for r in rows:
        tau = f"{r['tau']:.2f}" if r["tau"] else "-"
        acc = f"{100 * r['acceptance']:.0f}%" if r["acceptance"] is not None else "-"
        print(f"{r['batch']:5d} {r['config']:24s} {r['tokens_per_s']:9.1f} {r['speedup']:7.2f}x {tau:>6s} "
              f"{acc:>7s} {'yes' if r['identical'] else 'NO':>12s}")


def _plot(rows: list[dict], ks: list[int], policy: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_speed, ax_tau) = plt.subplots(1, 2, figsize=(11, 4.2))
    for batch in sorted({r["batch"] for r in rows}):
        by = {r["config"]: r for r in rows if r["batch"] == batch}
        xs = [0] + ks
        speed = [1.0] + [by[f"fixed k={k}"]["speedup"] for k in ks]
        tau = [1.0] + [by[f"fixed k={k}"]["tau"] for k in ks]
        line, = ax_speed.plot(xs, speed, marker="o", label=f"batch {batch}")
        ax_tau.plot(xs, tau, marker="o", color=line.get_color(), label=f"batch {batch}")
        ax_speed.axhline(by[policy]["speedup"], color=line.get_color(), linestyle=":", linewidth=1)
    ax_speed.axhline(1.0, color="grey", linewidth=0.8)
    ax_speed.set(xlabel="draft length k (fixed)", ylabel="speedup over autoregressive",
                 title="speedup (dotted: cost-aware policy)")
    ax_tau.set(xlabel="draft length k (fixed)", ylabel="tau (tokens per target forward)", title="tau")
    ax_speed.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ the grid

def grid_decoders(pair, real: bool) -> tuple[dict[str, tuple[SpeculativeDecoder, SpeculativeDecoder]], dict[str, str]]:
    """{method: (decoder with its defaults, the same with policy="fixed")} for every registered
    lossless speculative method the pair has the parts for, and {method: why not benched}."""
    tables = (REAL_CONFIGS, CONFIGS) if real else (CONFIGS,)
    out, not_benched = {}, {}
    for spec in methods.available():
        if spec.kind != "speculative" or not spec.lossless:
            continue
        if spec.name in SKIPPED:
            not_benched[spec.name] = SKIPPED[spec.name]
            continue
        listed, reason = configurations(spec.name, pair, tables)
        if reason is not None or not listed:
            not_benched[spec.name] = reason or "no configuration for this pair"
            continue
        parts = {k: v for k, v in listed[0][1].items() if k in PART_OPTIONS}
        out[spec.name] = (SpeculativeDecoder(pair.target, spec.name, **parts),
                          SpeculativeDecoder(pair.target, spec.name, policy="fixed", **parts))
    return out, not_benched


def _groups(prompts: list[list[int]], batch: int) -> list[list[list[int]]]:
    return [[p] for p in prompts[:4]] if batch == 1 else [prompts[:batch]]


def _timed(decoder, groups, **kw) -> tuple[float, dict]:
    parts = [e2e.engine_group(decoder, g, seed=list(range(len(g))), **kw) for g in groups]
    return sum(p["seconds"] for p in parts), e2e.combine(parts)


def grid_pair(label: str, pair, warm: list[list[int]], held_out: list[list[int]], batches: list[int],
              temperatures: list[float], max_new: int, repeats: int, only: list[str] | None) -> tuple[list, dict]:
    decoders, not_benched = grid_decoders(pair, real=label != "zoo")
    if only:
        decoders = {m: d for m, d in decoders.items() if m in only}
    eos = pair.tokenizer.eos_token_id
    ar = SpeculativeDecoder(pair.target)
    common = dict(max_new_tokens=max_new, eos_token_id=eos)
    rows = []
    for t in temperatures:
        for batch in batches:
            groups = _groups(held_out, batch)
            fixed_too = batch == 1 and t == 0
            runs = {"autoregressive": ar, **{m: d for m, (d, _) in decoders.items()}}
            if fixed_too:
                runs.update({f"{m} (fixed)": f for m, (_, f) in decoders.items()})
            times = {name: [] for name in runs}
            results = {}
            # An earlier request of this shape on other prompts: what a server's decoder has seen
            # before (the policy's costs at this batch size; first-call allocations).
            for decoder in runs.values():
                _timed(decoder, _groups(warm, batch), temperature=t, **common)
            for _ in range(repeats):
                for name, decoder in runs.items():
                    seconds, results[name] = _timed(decoder, groups, temperature=t, **common)
                    times[name].append(seconds)
            base = statistics.median(times["autoregressive"])
            reference = results["autoregressive"]["outputs"]
            for name in runs:
                if name == "autoregressive":
                    continue
                r, seconds = results[name], statistics.median(times[name])
                method = name.split(" (")[0]
                rows.append(dict(pair=label, method=method, policy="fixed" if name.endswith("(fixed)") else "default",
                                 batch=batch, temperature=t, ratio=base / seconds, tau=r["tau"],
                                 ar_tokens_per_s=results["autoregressive"]["tokens"] / base,
                                 same_as_autoregressive=r["outputs"] == reference))
            print(f"[policy grid] {label}: T={t} batch {batch} done", flush=True)
    return rows, not_benched


def _print_grid(rows: list[dict], not_benched: dict) -> None:
    for label in sorted({r["pair"] for r in rows}):
        cells = [r for r in rows if r["pair"] == label and r["policy"] == "default"]
        cols = sorted({(r["temperature"], r["batch"]) for r in cells})
        print(f"\n{label} pair: ratio to autoregressive decoding (held-out prompts); * = not the autoregressive "
              f"output / samples")
        print(f"{'method':16s} " + " ".join(f"{f'T={t:g} b={b}':>11s}" for t, b in cols) + "   fixed b=1")
        by = {(r["method"], r["temperature"], r["batch"], r["policy"]): r for r in rows if r["pair"] == label}
        for m in sorted({r["method"] for r in cells}):
            line = []
            for t, b in cols:
                r = by.get((m, t, b, "default"))
                line.append(f"{r['ratio']:10.2f}{'' if r['same_as_autoregressive'] else '*'}" if r else f"{'-':>11s}")
            fixed = by.get((m, 0.0, 1, "fixed"))
            print(f"{m:16s} " + " ".join(f"{c:>11s}" for c in line) + (f"   {fixed['ratio']:.2f}" if fixed else ""))
    for m, why in sorted(not_benched.items()):
        print(f"  not benched: {m}: {why}")


def _plot_grid(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({r["pair"] for r in rows})
    fig, axes = plt.subplots(1, len(labels), figsize=(6.5 * len(labels), 4.6), squeeze=False)
    for ax, label in zip(axes[0], labels):
        cells = [r for r in rows if r["pair"] == label and r["policy"] == "default"]
        cols = sorted({(r["temperature"], r["batch"]) for r in cells})
        names = sorted({r["method"] for r in cells})
        by = {(r["method"], r["temperature"], r["batch"]): r["ratio"] for r in cells}
        values = [[by.get((m, t, b), float("nan")) for t, b in cols] for m in names]
        image = ax.imshow(values, cmap="RdYlGn", vmin=0.5, vmax=1.5, aspect="auto")
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if v == v:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(cols)), [f"T={t:g}\nb={b}" for t, b in cols], fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_title(f"{label} pair: ratio to autoregressive (defaults, held-out prompts)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grid(args) -> int:
    # A fresh memory: what the policy knows comes from this run's warm-up requests, not earlier runs.
    os.environ["SPECDEC_POLICY_CACHE"] = tempfile.mkdtemp(prefix="specdec-policy-bench-")
    # 15 repeats: on a shared 2-core VM a configuration's time moves +-10% between runs (the same
    # autoregressive decoding, 4 x 48 tokens: 233-287 ms over 30 runs), and with 3 a grid of 72
    # cells had 16 to 28 below 0.95x in two runs minutes apart, different ones each time.
    repeats = args.repeats or (1 if args.quick else 15)
    max_new = args.max_new_tokens or (24 if args.quick else 48)
    rows, not_benched = [], {}
    if "zoo" in args.pairs:
        pair = e2e.load_pair(threads=args.threads)
        # Measured on the first held-out openings; the warm-up requests on the next ones.
        both = e2e.encode(pair.tokenizer, e2e.held_out_prompts(2 * max(args.batches + [4])))
        held, warm = both[: len(both) // 2], both[len(both) // 2:]
        got, skipped = grid_pair("zoo", pair, warm, held, args.batches, args.temperatures, max_new, repeats,
                                 args.methods)
        rows += got
        not_benched.update({f"zoo {m}": why for m, why in skipped.items()})
    if "real" in args.pairs:
        from bench import bench_real, humaneval

        torch.set_num_threads(args.real_threads)
        real = bench_real.load_real_pair(argparse.Namespace(target=None, draft=None, pair="qwen2.5-coder",
                                                            weights="gguf", dtype="bfloat16"))
        tok = real.tokenizer
        warm = [p.token_ids for p in humaneval.prompts("chat", "bench", tok)[:max(max(args.real_batches), 4)]]
        held = [p.token_ids for p in humaneval.prompts("chat", "heldout", tok)[:max(max(args.real_batches), 4)]]
        got, skipped = grid_pair("real", real, warm, held, args.real_batches, args.temperatures,
                                 args.real_max_new_tokens, args.real_repeats, args.methods)
        rows += got
        not_benched.update({f"real {m}": why for m, why in skipped.items()})
    _print_grid(rows, not_benched)
    below = [r for r in rows if r["policy"] == "default" and r["ratio"] < 0.95]
    print(f"\ncells below 0.95x: {len(below)} of {sum(r['policy'] == 'default' for r in rows)}"
          + "".join(f"\n  {r['pair']} {r['method']} T={r['temperature']:g} b={r['batch']}: {r['ratio']:.2f}x"
                    for r in below))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(rows=rows, not_benched=not_benched, max_new_tokens=max_new, repeats=repeats,
                                   threads=args.threads, real_threads=args.real_threads), indent=2))
    png = out.with_suffix(".png")
    _plot_grid(rows, png)
    print(f"\nwrote {out} and {png}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="the draft model's fixed k / adaptive k / policy sweep")
    parser.add_argument("--quick", action="store_true", help="24 new tokens, fewer repeats")
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/policy_grid.json, "
                                                    "or policy.json with --sweep)")
    parser.add_argument("--pairs", nargs="*", choices=("zoo", "real"), default=["zoo"])
    parser.add_argument("--methods", nargs="*", default=None, help="registered methods to bench (default: all)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 4, 8, 16])
    parser.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 0.8])
    parser.add_argument("--ks", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--k", type=int, default=4, help="--sweep: policy / adaptive k start (up to 2k)")
    parser.add_argument("--repeats", type=int, default=None, help="grid: 15 on the zoo pair (1 with --quick); sweep: 3")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the zoo pair")
    parser.add_argument("--real-batches", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--real-max-new-tokens", type=int, default=32)
    parser.add_argument("--real-repeats", type=int, default=1)
    parser.add_argument("--real-threads", type=int, default=2)
    args = parser.parse_args()
    args.out = args.out or ("bench/results/policy.json" if args.sweep else "bench/results/policy_grid.json")
    return sweep(args) if args.sweep else grid(args)


if __name__ == "__main__":
    sys.exit(main())
