"""Benchmark of the tree step: build_tree + verify_tree + compact_kv against the references.

    python bench/bench_tree.py [--quick] [--out PATH] [--device cpu|cuda]

For node budgets 16, 64, 256, 512 and batch 1 and 8 at V = 128256 (Llama 3), in three verification
modes (greedy, SpecInfer with draft logits, one-hot drafts at temperature 1), the kernels' median
times and the plain-PyTorch references' (python/specdec_cuda/reference/tree.py) measured in the same
run, and their ratio. Trees are random, BFS-ordered, with tokens that follow the target's argmax
with probability 0.7 so the walks go a few levels deep; the same inputs feed both sides and their
outputs are compared before timing.

Inputs: bf16 logits. On CPU the (B, M, V) logits share one (M, V) block across rows (stride 0 on the
batch dim) to keep memory within a shared machine; rows still differ by tree, seed and position.
On CUDA each row has its own logits and three input sets rotate so L2 (50 MB on H100/H200) cannot
hold the next call's rows; per-op times are CUDA-event medians after warm-up with each op issued
to an idle GPU (host dispatch included), and `gpu total` is the step's GPU time with steps queued
back to back so that dispatch is hidden (bench/timing.py time_cuda). KV caches: 8 layers x (K, V),
H_kv = 8, D = 128, bf16, 256 cached tokens per row.

Writes JSON (default bench/results/tree.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import specdec_cuda  # noqa: E402
import specdec_cuda.ops as ops  # noqa: E402
import timing  # noqa: E402  (bench/timing.py, beside this script)
from specdec_cuda.reference import tree as ref  # noqa: E402

VOCAB = 128256
LAYERS, KV_HEADS, HEAD_DIM, CACHED = 8, 8, 128, 256


def random_tree(n: int, gen: torch.Generator) -> list[int]:
    """BFS-ordered random tree: each node's parent is one of the last few nodes of the frontier."""
    parents = [-1]
    for v in range(1, n):
        lo = max(0, (v - 1) // 3)  # about three children per internal node
        parents.append(int(torch.randint(lo, v, (1,), generator=gen)) if v > 1 else 0)
    return [-1] + sorted(parents[1:])  # sorted parents: BFS order, still parent < node


def make_inputs(n: int, batch: int, mode: str, device: str, gen: torch.Generator, copies: int):
    rows = [random_tree(n, gen) for _ in range(batch)]
    parents = torch.tensor([p for r in rows for p in r], dtype=torch.int64)
    cu = torch.arange(batch + 1, dtype=torch.int64) * n
    shared = device == "cpu"
    shape = (1 if shared else batch, n, VOCAB)
    sets = []
    for _ in range(copies):
        target = torch.randn(shape, generator=gen).mul_(3).to(torch.bfloat16)
        draft = None
        if mode == "specinfer":
            draft = (target.float() + torch.randn(shape, generator=gen)).to(torch.bfloat16)
        if shared:
            target = target.expand(batch, n, VOCAB)
            draft = draft.expand(batch, n, VOCAB) if draft is not None else None
        sets.append((target.to(device), None if draft is None else draft.to(device)))
    # node tokens: the parent's argmax with probability 0.7, else random
    target0 = sets[0][0].cpu()
    tokens = torch.empty(batch * n, dtype=torch.int64)
    for b, r in enumerate(rows):
        best = target0[b].float().argmax(-1)
        for v, p in enumerate(r):
            hit = float(torch.rand((), generator=gen)) < 0.7
            tokens[b * n + v] = int(best[p]) if v > 0 and hit else int(torch.randint(VOCAB, (), generator=gen))
    temperature = 0.0 if mode == "greedy" else 1.0
    caches = [torch.randn(batch, KV_HEADS, CACHED + n, HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
              for _ in range(2 * LAYERS)]
    return dict(parents=parents.to(device), cu=cu.to(device), tokens=tokens.to(device), sets=sets,
                temperature=temperature, caches=caches,
                cache_len=torch.full((batch,), CACHED, dtype=torch.int64, device=device),
                seed=torch.arange(batch, dtype=torch.int64, device=device) + 1)


def kernel_step(x, target, draft, n):
    layout = ops.build_tree(x["parents"], x["cu"], x["cache_len"], n, hf_mask_dtype=torch.bfloat16,
                            max_prefix=CACHED, check=False)
    res = ops.verify_tree(x["tokens"], x["parents"], x["cu"], target, draft,
                          temperature=x["temperature"], seed=x["seed"],
                          position=x["cache_len"] + 1, max_nodes=n, check=False)
    ops.compact_kv(x["caches"], res.accepted_nodes, res.num_accepted, x["cache_len"], check=False)
    return layout, res


def time_kernel(x, n, device, reps):
    """Median seconds of the whole step (and of each op) over rotating input sets."""
    sets = x["sets"]
    for i in range(2):  # warm-up
        kernel_step(x, *sets[i % len(sets)], n)
    parts = {"build": [], "verify": [], "compact": [], "total": []}
    for i in range(reps):
        target, draft = sets[i % len(sets)]
        if device == "cuda":
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            ev[0].record()
            ops.build_tree(x["parents"], x["cu"], x["cache_len"], n, hf_mask_dtype=torch.bfloat16,
                           max_prefix=CACHED, check=False)
            ev[1].record()
            res = ops.verify_tree(x["tokens"], x["parents"], x["cu"], target, draft,
                                  temperature=x["temperature"], seed=x["seed"],
                                  position=x["cache_len"] + 1, max_nodes=n, check=False)
            ev[2].record()
            ops.compact_kv(x["caches"], res.accepted_nodes, res.num_accepted, x["cache_len"],
                           check=False)
            ev[3].record()
            torch.cuda.synchronize()
            t = [ev[0].elapsed_time(ev[k]) / 1e3 for k in (1, 2, 3)]
            times = [t[0], t[1] - t[0], t[2] - t[1], t[2]]
        else:
            t0 = time.perf_counter()
            ops.build_tree(x["parents"], x["cu"], x["cache_len"], n, hf_mask_dtype=torch.bfloat16,
                           max_prefix=CACHED, check=False)
            t1 = time.perf_counter()
            res = ops.verify_tree(x["tokens"], x["parents"], x["cu"], target, draft,
                                  temperature=x["temperature"], seed=x["seed"],
                                  position=x["cache_len"] + 1, max_nodes=n, check=False)
            t2 = time.perf_counter()
            ops.compact_kv(x["caches"], res.accepted_nodes, res.num_accepted, x["cache_len"],
                           check=False)
            t3 = time.perf_counter()
            times = [t1 - t0, t2 - t1, t3 - t2, t3 - t0]
        for key, value in zip(parts, times):
            parts[key].append(value)
    out = {k: statistics.median(v) for k, v in parts.items()}
    if device == "cuda":
        out["gpu_total"] = timing.time_cuda(lambda i: kernel_step(x, *sets[i % len(sets)], n), reps)
    return out


def time_reference(x, n, reps):
    """Median seconds of the reference step (and of each op); also its outputs of the first run."""
    target, draft = x["sets"][0]
    parts = {"build": [], "verify": [], "compact": [], "total": []}
    batch = x["cu"].numel() - 1
    outputs = None
    for _ in range(reps):
        t0 = time.perf_counter()
        layout = ref.build_tree(x["parents"].cpu(), x["cu"].cpu(), x["cache_len"].cpu(), n,
                                torch.bfloat16, CACHED)
        t1 = time.perf_counter()
        per_row = lambda v, dt: torch.full((batch,), v, dtype=dt)  # noqa: E731
        res = ref.verify_tree(x["tokens"].cpu(), x["parents"].cpu(), x["cu"].cpu(), target.cpu(),
                              None if draft is None else draft.cpu(),
                              per_row(x["temperature"], torch.float32), per_row(0, torch.int32),
                              per_row(1.0, torch.float32), x["seed"].cpu(),
                              x["cache_len"].cpu() + 1, n)
        t2 = time.perf_counter()
        caches = [c.cpu().clone() for c in x["caches"]]
        t2b = time.perf_counter()
        ref.compact_kv(caches, res[1], res[2], x["cache_len"].cpu(), x["cache_len"].cpu())
        t3 = time.perf_counter()
        for key, value in zip(parts, [t1 - t0, t2 - t1, t3 - t2b, (t1 - t0) + (t2 - t1) + (t3 - t2b)]):
            parts[key].append(value)
        if outputs is None:
            outputs = (layout, res, caches)
    return {k: statistics.median(v) for k, v in parts.items()}, outputs


def check_equal(x, n, want):
    """The kernels and the reference (its first timed run) agree on these inputs."""
    target, draft = x["sets"][0]
    caches = [c.clone() for c in x["caches"]]
    layout, res = kernel_step(dict(x, caches=caches), target, draft, n)
    want_layout, want_res, want_caches = want
    assert torch.equal(layout.tree_mask.cpu(), want_layout["tree_mask"])
    assert torch.equal(layout.hf_mask.cpu(), want_layout["hf_mask"])
    for got, exp in zip(res, want_res):
        assert torch.equal(got.cpu(), exp), "verify_tree differs from the reference"
    for got, exp in zip(caches, want_caches):
        assert torch.equal(got.cpu(), exp), "compact_kv differs from the reference"
    return float(res.num_accepted.float().mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="budgets 16 and 64, fewer repetitions")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "results", "tree.json"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", default="greedy,specinfer,onehot")
    parser.add_argument("--hbm-gbps", type=float, default=None,
                        help="measured HBM bandwidth (recorded in the JSON; gpu_check.sh passes it)")
    args = parser.parse_args()
    device = args.device
    budgets = [16, 64] if args.quick else [16, 64, 256, 512]
    reps = 5 if args.quick else 10
    if device == "cuda":
        reps *= 10
    ref_reps = 1 if args.quick else 2
    gen = torch.Generator().manual_seed(0)
    results = []
    header = (f"{'mode':10} {'nodes':>5} {'B':>2} {'tau':>5} {'build':>9} {'verify':>9} "
              f"{'compact':>9} {'total':>9} {'ref total':>10} {'ratio':>7}")
    print(f"tree step on {device}, V = {VOCAB}, bf16 logits; times in ms (median)")
    print(header)
    for mode in args.modes.split(","):
        for n in budgets:
            for batch in (1, 8):
                x = make_inputs(n, batch, mode, device, gen, copies=3 if device == "cuda" else 1)
                r, want = time_reference(x, n, ref_reps)
                mean_acc = check_equal(x, n, want)
                k = time_kernel(x, n, device, reps)
                ratio = r["total"] / k["total"]
                row = dict(mode=mode, nodes=n, batch=batch, vocab=VOCAB, device=device,
                           mean_accepted=mean_acc, kernel_s=k, reference_s=r, ratio=ratio)
                if device == "cuda" and n == 64 and batch == 8:  # the H200 target
                    row["target_total_under_100us"] = k["total"] < 100e-6
                    row["target_gpu_total_under_100us"] = k["gpu_total"] < 100e-6
                results.append(row)
                print(f"{mode:10} {n:5d} {batch:2d} {mean_acc + 1:5.2f} {k['build'] * 1e3:9.3f} "
                      f"{k['verify'] * 1e3:9.3f} {k['compact'] * 1e3:9.3f} {k['total'] * 1e3:9.3f} "
                      f"{r['total'] * 1e3:10.1f} {ratio:6.1f}x"
                      + (f"  gpu total {k['gpu_total'] * 1e3:.3f}" if "gpu_total" in k else ""), flush=True)
                del x
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(build_info=specdec_cuda.build_info(), torch=torch.__version__,
                       hbm_gbps=args.hbm_gbps,
                       threads=torch.get_num_threads(), quick=args.quick,
                       cache=dict(layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, cached=CACHED),
                       results=results), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
