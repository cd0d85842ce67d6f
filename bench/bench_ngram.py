"""Benchmark of the n-gram index: one decoding step (batched lookup + commit) against the reference.

    python bench/bench_ngram.py [--quick] [--out PATH]

A step is what prompt lookup does per verification: ``lookup`` of a draft tree for every row, then
``extend_rows`` with the tokens the step committed (3 per row here). Rows hold C committed tokens of
repetitive text (copies of a few source-like blocks with point edits, vocabulary 32000, so long
suffixes recur) and C is swept up to 32k; batch 1 and 8; a chain (k = 8, one candidate) and a tree
(k = 8, four candidates, 64 occurrences ranked). The C++ index (specdec_cuda.ngram) and the
plain-Python reference (python/specdec_cuda/reference/ngram.py) run the same steps on the same
tokens in the same run; their drafts are compared before timing. Also reported: the time to index
the C tokens (prefill, per token), the lookup alone (the index unchanged between calls) and the
memory per request (``NgramIndex.memory_bytes``).

Times are medians of single steps on the host (CPU only: the index is host state). Writes JSON
(default bench/results/ngram.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import specdec_cuda  # noqa: E402
import timing  # noqa: E402  (bench/timing.py, beside this script)
from specdec_cuda.ngram import NgramIndex, extend_rows, lookup  # noqa: E402
from specdec_cuda.reference.ngram import NgramIndexRef, lookup_ref  # noqa: E402

VOCAB = 32000
N_MIN, N_MAX = 1, 4
COMMIT = 3  # tokens committed per row per step


def repetitive_text(rng: random.Random, n: int) -> list[int]:
    blocks = [[rng.randrange(VOCAB) for _ in range(rng.randrange(20, 200))] for _ in range(8)]
    out: list[int] = []
    while len(out) < n:
        block = list(rng.choice(blocks))
        for _ in range(rng.randrange(3)):
            block[rng.randrange(len(block))] = rng.randrange(VOCAB)
        out += block
    return out[:n]


def run_case(context: int, batch: int, k: int, num_candidates: int, steps: int, seed: int) -> dict:
    rng = random.Random(seed)
    texts = [repetitive_text(rng, context + COMMIT * (steps + 2)) for _ in range(batch)]

    start = time.perf_counter()
    fast = [NgramIndex(N_MIN, N_MAX) for _ in range(batch)]
    for ix, t in zip(fast, texts):
        ix.extend(t[:context])
    prefill_fast = (time.perf_counter() - start) / (batch * context)
    start = time.perf_counter()
    slow = [NgramIndexRef(N_MIN, N_MAX) for _ in range(batch)]
    for ix, t in zip(slow, texts):
        ix.extend(t[:context])
    prefill_ref = (time.perf_counter() - start) / (batch * context)

    # same drafts before timing
    got = lookup(fast, k, num_candidates)
    want = lookup_ref(slow, k, num_candidates)
    for g, w in zip(got, want):
        if not torch.equal(g, w):
            raise SystemExit(f"C++ and reference drafts differ at context {context}, batch {batch}")
    drafted = float(got.num_nodes.float().mean())

    def chunk(r: int) -> torch.Tensor:
        lo = context + COMMIT * r
        return torch.tensor([t[lo:lo + COMMIT] for t in texts], dtype=torch.int64)

    counts = torch.full((batch,), COMMIT, dtype=torch.int64)

    def step_fast(r: int) -> None:
        lookup(fast, k, num_candidates)
        extend_rows(fast, chunk(r), counts)

    def step_ref(r: int) -> None:
        lookup_ref(slow, k, num_candidates)
        new = chunk(r)
        for ix, row in zip(slow, new.tolist()):
            ix.extend(row)

    # lookup alone (the index unchanged between calls), then whole steps that grow the index
    t_lookup = timing.time_cpu(lambda r: lookup(fast, k, num_candidates), steps)
    t_lookup_ref = timing.time_cpu(lambda r: lookup_ref(slow, k, num_candidates), steps)
    # chunk() is built inside both steps, so its cost is in both times alike
    t_fast = timing.time_cpu(step_fast, steps, warmup=0)
    t_ref = timing.time_cpu(step_ref, steps, warmup=0)
    return {
        "context": context, "batch": batch, "k": k, "num_candidates": num_candidates,
        "mean_draft_nodes": drafted,
        "lookup_us": t_lookup * 1e6, "ref_lookup_us": t_lookup_ref * 1e6,
        "step_us": t_fast * 1e6, "ref_step_us": t_ref * 1e6, "speedup": t_ref / t_fast,
        "prefill_ns_per_token": prefill_fast * 1e9, "ref_prefill_ns_per_token": prefill_ref * 1e9,
        "memory_bytes_per_request": sum(ix.memory_bytes() for ix in fast) / batch,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sweep (1k and 8k tokens, fewer steps)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "ngram.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    contexts = [1024, 8192] if args.quick else [1024, 8192, 32768]
    steps = 20 if args.quick else 50
    rows = []
    for context in contexts:
        for batch in (1, 8):
            for k, cands in ((8, 1), (8, 4)):
                rows.append(run_case(context, batch, k, cands, steps, seed=context + batch))
    header = (f"{'context':>8} {'B':>2} {'k':>2} {'cand':>4} {'nodes':>6} {'lookup us':>9} "
              f"{'ref us':>9} {'step us':>9} "
              f"{'ref us':>10} {'x':>7} {'ns/tok':>7} {'ref ns/tok':>10} {'MiB/req':>8}")
    print(header)
    for r in rows:
        print(f"{r['context']:>8} {r['batch']:>2} {r['k']:>2} {r['num_candidates']:>4} "
              f"{r['mean_draft_nodes']:>6.1f} {r['lookup_us']:>9.1f} {r['ref_lookup_us']:>9.1f} "
              f"{r['step_us']:>9.1f} {r['ref_step_us']:>10.1f} "
              f"{r['speedup']:>7.1f} {r['prefill_ns_per_token']:>7.0f} "
              f"{r['ref_prefill_ns_per_token']:>10.0f} {r['memory_bytes_per_request'] / 2**20:>8.2f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": "ngram", "build": specdec_cuda.build_info(), "n_min": N_MIN,
                   "n_max": N_MAX, "commit_per_step": COMMIT, "vocab": VOCAB, "quick": args.quick,
                   "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
