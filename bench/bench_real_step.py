"""One decoding step of a real model on the CPU, against the machine's own memory bandwidth.

Usage: python bench/bench_real_step.py [--model DIR|NAME] [--dtype bfloat16|float32|gguf]
                                       [--rows 1,5,16,64] [--threads 1,2] [--context 64]
                                       [--repeats 7] [--torch-path] [--rounded] [--q8-32]
                                       [--draft-vocab 32768,...]
                                       [--out PATH]

A decoding step is bound by streaming the weights: a one-token forward of a packed model reads
every projection's panels and the LM head's once (``weight bytes``, printed). This bench times
forwards of 1 token (autoregressive decoding), 5 (a verification of k = 4 drafts), 16 and 64 rows
over ``--context`` tokens of cache, at each thread count, and next to them the bandwidth of a 2 GiB
``torch.sum`` with the same threads, measured in the same rounds (each round: one bandwidth sample,
then one forward per width, the paths taking turns to go first; medians over the rounds). Reported
per row count: milliseconds, weight bytes / time in GB/s, that as a percentage of the measured
bandwidth, and the time over the one-token step's. Targets: a one-token step >= 85% of the
bandwidth, a 5-row verification <= 1.2x a one-token step. ``--torch-path`` also times the same
model with ``packed_linear = False`` (BLAS, SDPA: the path real models took before), in the same
rounds. ``--draft-vocab N,...`` also
times one-token steps whose LM head runs over ids 0 .. N - 1 only (``forward(vocab=...)``: a
drafter's ``draft_vocab``), as paths ``vocab N``, so a drafter's cost per drafted token can be read
against its whole-vocabulary step.

``--rounded`` (bf16 or fp32 folders, a CPU with AMX) also times the model set to bfloat16
activations (``activations="bfloat16"``: each projection's input rounded, one tile product per
weight), as path ``rounded``.

``--q8-32`` (with ``--dtype gguf``) also times the file with int8 activations per 32 values for
every format (``gguf_activations="q8_32"``: the Q8 kernel, no panels), the form a VNNI CPU ran
before its k-quants went to panels and the Q8K kernel, as path ``gguf q8_32``.

``--model`` takes a folder or a registry name (default ``qwen2.5-coder-1.5b``, fetched into the
model cache by ``python -m specdec_cuda models fetch NAME``); absent, the bench says so and exits 0.
CPU timings on a shared machine are noisy: compare ratios of the same run; the load average is
recorded with the results. JSON goes to bench/results/real_step_<model>_<dtype>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from specdec_cuda import models  # noqa: E402

TARGET_ONE_ROW = 0.85  # of the measured bandwidth
TARGET_FIVE_ROWS = 1.2  # x the one-token step


def find_model(spec: str) -> Path | None:
    """A checkpoint folder from a path or a registry name; None when it is not there."""
    folder = Path(spec)
    if folder.is_dir():
        return folder
    try:
        return Path(models.model_path(spec))
    except Exception:  # not fetched (or not a registry name): the caller explains
        return None


def weight_bytes(model) -> int:
    """Bytes a one-token step of ``model`` streams: the packed panels (or dense weights) of the four
    projections of every layer and of the LM head."""
    if model.packed:
        return (sum(p.nbytes for layer in model.layers for p in layer.panels.values()) + model._head_packed.nbytes)
    dense = [model.dense_weight(i, name) for i in range(model.num_layers) for name in ("qkv", "o", "gate_up", "down")]
    return sum(w.numel() * w.element_size() for w in dense + [model.output_weight()])


def bandwidth_gbs(buffer: torch.Tensor) -> float:
    start = time.perf_counter()
    buffer.sum()
    return buffer.numel() * buffer.element_size() / (time.perf_counter() - start) / 1e9


class Step:
    """Forwards of n new tokens at the end of a ``context``-token cache (not committed: each
    forward writes the same pending slots)."""

    def __init__(self, model, context: int, widths: list[int], vocab=None) -> None:
        self.model, self.widths, self.vocab = model, widths, vocab
        g = torch.Generator().manual_seed(0)
        self.cache = model.new_cache(1, context + max(widths))
        prompt = torch.randint(0, model.vocab_size, (1, context), generator=g)
        model.forward(prompt, torch.arange(context)[None], self.cache, logits_at=torch.tensor([context - 1]))
        self.cache.commit(torch.tensor([context]))
        self.inputs = {n: (torch.randint(0, model.vocab_size, (1, n), generator=g),
                           torch.arange(context, context + n)[None]) for n in widths}

    def seconds(self, n: int) -> float:
        tokens, positions = self.inputs[n]
        start = time.perf_counter()
        self.model.forward(tokens, positions, self.cache, vocab=self.vocab)
        return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="checkpoint folder or registry name")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "gguf"],
                   help="the folder's converted weights in bf16 / fp32, or gguf: its model.gguf's blocks as stored")
    p.add_argument("--rows", type=lambda v: [int(x) for x in v.split(",")], default=[1, 5, 16, 64])
    p.add_argument("--threads", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7, help="rounds per thread count (medians over them)")
    p.add_argument("--torch-path", action="store_true", help="also time packed_linear = False (BLAS)")
    p.add_argument("--q8-32", action="store_true",
                   help="with --dtype gguf: also time the file loaded with gguf_activations='q8_32' (int8 per 32 "
                        "values for every format, no panels), in the same rounds")
    p.add_argument("--rounded", action="store_true",
                   help="also time the model set to bfloat16 activations (each projection's input rounded; AMX "
                        "CPUs), as path 'rounded', in the same rounds")
    p.add_argument("--draft-vocab", type=lambda v: [int(x) for x in v.split(",")], default=[],
                   help="also time one-token steps with the LM head over ids 0 .. N - 1 (comma-separated N)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if 1 not in args.rows:
        args.rows = [1] + args.rows
    folder = find_model(args.model)
    if folder is None:
        print(f"bench_real_step: model {args.model!r} is not here (neither a folder nor fetched; "
              f"python -m specdec_cuda models fetch {args.model}); nothing to bench")
        return 0
    gguf = args.dtype == "gguf"

    def load():
        return models.load(folder, weights="gguf") if gguf else models.load(folder, dtype=getattr(torch, args.dtype))

    start = time.perf_counter()
    model = load()
    load_s = time.perf_counter() - start
    paths = {("gguf" if gguf else "packed") if model.packed else "torch": model}
    if not model.packed:
        print("note: this CPU or SPECDEC_PACKED_LINEAR=0 keeps the torch path; timing that")
    elif args.torch_path and not gguf:
        plain = load()
        plain.packed_linear = False
        paths["torch"] = plain
    if args.rounded and not gguf and model.packed:
        try:
            paths["rounded"] = models.load(folder, dtype=getattr(torch, args.dtype), activations="bfloat16")
        except ValueError as exc:  # LlamaModel.set_activations: no AMX tiles for these panels here
            print(f"note: --rounded not timed: {exc}")
    if gguf and args.q8_32:
        paths["gguf q8_32"] = models.load(folder, weights="gguf", gguf_activations="q8_32")
    steps = {name: Step(m, args.context, args.rows) for name, m in paths.items()}
    for n in args.draft_vocab:
        steps[f"vocab {n}"] = Step(model, args.context, [1], vocab=model.vocab_subset(n))
    main_path = next(iter(paths))
    nbytes = weight_bytes(model)
    buffer = torch.ones(2**29)  # 2 GiB of float32
    results = []
    load_before = os.getloadavg()
    for threads in args.threads:
        torch.set_num_threads(threads)
        for step in steps.values():  # warm-up at this thread count
            for n in step.widths:
                step.seconds(n)
        bw, times = [], {}
        order = list(steps.items())
        for r in range(args.repeats):
            bw.append(bandwidth_gbs(buffer))
            # The paths in turn first: the forward right after the 2 GiB sweep ran ~10% slower (its
            # threads waking behind the sweep's), which a fixed order charged to one path alone.
            for name, step in order[r % len(order):] + order[:r % len(order)]:
                for n in step.widths:
                    times.setdefault((name, n), []).append(step.seconds(n))
        bandwidth = statistics.median(bw)
        one = {name: statistics.median(times[(name, 1)]) for name in steps}
        for name in steps:  # a draft-vocabulary step against the whole-vocabulary one-token step
            if name.startswith("vocab "):
                one[name] = one[main_path]
        for (name, n), ts in times.items():
            t = statistics.median(ts)
            results.append({"path": name, "threads": threads, "rows": n, "ms": 1e3 * t, "gbs": nbytes / t / 1e9,
                            "pct_bandwidth": 100 * nbytes / t / 1e9 / bandwidth, "vs_one_row": t / one[name],
                            "bandwidth_gbs": bandwidth, "bandwidth_samples": bw})
    load_after = os.getloadavg()

    print(f"\n{folder.name} ({args.dtype}, {main_path} path; loaded in {load_s:.1f} s): weight bytes per step "
          f"{nbytes / 1e9:.3f} GB, {args.context} tokens of context; load average {load_before[0]:.1f} -> "
          f"{load_after[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'path':>11} {'thr':>3} {'bw GB/s':>8} {'rows':>4} {'ms':>8} {'GB/s':>6} {'% bw':>5} {'x 1 row':>7}")
    for r in results:
        print(f"{r['path']:>11} {r['threads']:3d} {r['bandwidth_gbs']:8.1f} {r['rows']:4d} {r['ms']:8.1f} "
              f"{r['gbs']:6.1f} {r['pct_bandwidth']:5.0f} {r['vs_one_row']:7.2f}")
    verdicts = []
    for threads in args.threads:
        rows = {r["rows"]: r for r in results if r["path"] == main_path and r["threads"] == threads}
        one_ok = rows[1]["pct_bandwidth"] >= 100 * TARGET_ONE_ROW
        line = f"{threads} thread(s): one-token step {rows[1]['pct_bandwidth']:.0f}% of bandwidth " \
               f"({'meets' if one_ok else 'misses'} >= {100 * TARGET_ONE_ROW:.0f}%)"
        if 5 in rows:
            five_ok = rows[5]["vs_one_row"] <= TARGET_FIVE_ROWS
            line += (f"; 5 rows {rows[5]['vs_one_row']:.2f}x one "
                     f"({'meets' if five_ok else 'misses'} <= {TARGET_FIVE_ROWS}x)")
        verdicts.append(line)
        print(line)

    out = Path(args.out) if args.out else \
        Path(__file__).parent / "results" / f"real_step_{folder.name}_{args.dtype}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": str(folder), "dtype": args.dtype, "path": main_path, "weight_bytes": nbytes,
        "context": args.context, "repeats": args.repeats, "load_seconds": load_s,
        "loadavg_before": load_before, "loadavg_after": load_after, "cpus": os.cpu_count(),
        "targets": {"one_row_pct_bandwidth": 100 * TARGET_ONE_ROW, "five_rows_vs_one": TARGET_FIVE_ROWS},
        "verdicts": verdicts, "note": "CPU timings on a shared machine: compare ratios of the same run",
        "rows": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
