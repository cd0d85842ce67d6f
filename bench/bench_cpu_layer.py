"""The CPU decoding path: one ``decoder_layer`` op per layer over packed weights, against the same
model's torch path (``packed_linear = False``: BLAS projections, SDPA, ~35 torch ops per layer).

Usage: python bench/bench_cpu_layer.py [--quick] [--target DIR] [--rows 1,2,3,5,9,17,33]
                                       [--context 200] [--repeats 5] [--threads 1] [--out PATH]

For each forward width n (token rows of a decoding step: 1 for autoregressive decoding, k + 1 for
a chain of k drafts, a tree's node count), the zoo target runs one forward over a cache holding
``--context`` tokens, on both paths, interleaved (each repeat times both paths in turn; the table
shows medians of per-forward times and their ratio from the same run). Also shown: the forward's
cost against one token's (what a speculative step pays for its width) and the weight bytes each
forward streams (the packed path holds a bf16 checkpoint's weights as bf16). Logits of the two
paths are checked to agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: zoo/, bench/

from specdec_cuda import models
from zoo import pairs  # noqa: E402


def forward_ms(model, n: int, context: int, iters: int) -> tuple[float, torch.Tensor]:
    """Median milliseconds of a forward of n new tokens over ``context`` committed ones."""
    g = torch.Generator().manual_seed(n)
    cache = model.new_cache(1, context + n)
    model.forward(torch.randint(0, model.vocab_size, (1, context), generator=g), torch.arange(context)[None], cache)
    cache.commit(torch.tensor([context]))
    tokens = torch.randint(0, model.vocab_size, (1, n), generator=g)
    positions = torch.arange(context, context + n)[None]
    logits = model.forward(tokens, positions, cache).logits
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        model.forward(tokens, positions, cache)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), logits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="rows 1, 5 and 17, two rounds")
    p.add_argument("--target", default=None, help="model folder (default: the demo's zoo target)")
    p.add_argument("--rows", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 3, 5, 9, 17, 33])
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (each: 20 forwards per path)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_layer.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.repeats = [1, 5, 17], 2
    torch.set_num_threads(args.threads)
    folder = Path(args.target) if args.target else pairs.default_pair_dir() / "target"
    packed, plain = models.load(folder), models.load(folder)
    plain.packed_linear = False
    samples: dict[tuple[str, int], list[float]] = {}
    for r in range(args.repeats):
        for n in args.rows:
            for name, model in (("packed", packed), ("torch", plain)):
                ms, logits = forward_ms(model, n, args.context, 20)
                samples.setdefault((name, n), []).append(ms)
                if r == 0:
                    samples.setdefault(("logits", n), []).append(logits)
        print(f"round {r + 1}/{args.repeats} done", flush=True)
    for n in args.rows:
        a, b = samples[("logits", n)]
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    packed._bind()
    if packed._head_packed is None:
        print("note: no AVX-512 on this CPU (or SPECDEC_PACKED_LINEAR=0): both columns are the torch path")
    packed_bytes = sum(pw.nbytes for layer in packed.layers for pw in (*layer._bound[4][7:], *layer._bound[5][4:])
                       if pw is not None)
    packed_bytes += packed._head_packed.nbytes if packed._head_packed is not None else 0
    torch_bytes = sum(t.numel() * 4 for layer in plain.layers for t in (layer.self_attn.qkv_proj.weight,
                      layer.self_attn.o_proj.weight, layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight))
    torch_bytes += (plain.lm_head.weight if plain.lm_head is not None else plain.embed_tokens.weight).numel() * 4
    rows = []
    one = {name: statistics.median(samples[(name, args.rows[0])]) for name in ("packed", "torch")}
    print(f"\n{folder}: {args.context} tokens of context, {args.threads} thread(s); projection weights streamed per "
          f"forward: packed {packed_bytes / 1e6:.1f} MB, torch {torch_bytes / 1e6:.1f} MB")
    print(f"{'rows':>4}  {'packed ms':>9}  {'torch ms':>8}  {'speedup':>7}  {'packed / 1 row':>14}  {'torch / 1 row':>13}")
    for n in args.rows:
        pm, tm = (statistics.median(samples[(name, n)]) for name in ("packed", "torch"))
        rows.append({"rows": n, "packed_ms": pm, "torch_ms": tm, "speedup": tm / pm,
                     "packed_vs_one_row": pm / one["packed"], "torch_vs_one_row": tm / one["torch"]})
        print(f"{n:4d}  {pm:9.3f}  {tm:8.3f}  {tm / pm:6.2f}x  {pm / one['packed']:13.2f}x  {tm / one['torch']:12.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"target": str(folder), "context": args.context, "threads": args.threads,
                               "packed_weight_bytes": packed_bytes, "torch_weight_bytes": torch_bytes,
                               "note": "CPU timings on a shared machine: compare ratios of the same run",
                               "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
