"""The compute side of the int8-activation GGUF matmul: nanoseconds per 256 weights of one output
row, per activation row, with the weights resident in the caches.

    python bench/bench_gguf_compute.py [--rows 1,2,5,8] [--repeats 200] [--out PATH]

A decoding step streams each weight once, so the matmul's speed at one row is the smaller of the
memory's and the kernel's own; on a CPU without VNNI the kernel's is the lower (bench/bench_gguf.py
measures the mix). This bench isolates it: a [4096, 1536] weight of each format (inside the last-level cache;
Q4_K and Q6_K also as ``gguf_repack_lanes`` repacks them, *_LANES), one thread, CPU time (``time.thread_time``, so a busy machine's preemptions do not count; the
minimum over ``--repeats`` calls). Per format and row count M it reports ns per super-block (256
weights of one output row: a k-quant super-block, 8 legacy blocks) for the whole call, and per
super-block and row; the difference between M = 1 and the per-row cost at large M is the decode
of the weight's blocks, which a call pays once for all its rows. JSON to
bench/results/gguf_compute.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from specdec_cuda.ops import gguf as g  # noqa: E402

# 268, 270: Q4_K and Q6_K as gguf_repack_lanes repacks them
FORMATS = {"Q4_K": 12, "Q4_K_LANES": 268, "Q6_K": 14, "Q6_K_LANES": 270, "Q8_0": 8, "Q5_0": 6, "Q4_1": 3}
N, K = 4096, 1536  # 3.4 .. 5 MB of blocks: in the last-level cache, the per-call overhead (~20 us) < 1 ns per super-block


# Byte offsets of each format's fp16 scales in its block (the rest of a block is codes).
HALF_FIELDS = {12: (0, 2), 14: (208,), 8: (0,), 6: (0,), 3: (0, 2)}


def random_weight(qtype: int, seed: int = 0) -> g.GgufWeight:
    """Random codes with small finite fp16 scales (only the work per block matters here)."""
    if qtype in (g.Q4_K_LANES_ID, g.Q6_K_LANES_ID):
        return g.gguf_repack_lanes(random_weight(12 if qtype == g.Q4_K_LANES_ID else 14, seed))
    _, qk, nbytes = g.FORMATS[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(N * K // qk, nbytes), dtype=np.uint8)
    for offset in HALF_FIELDS[qtype]:
        blocks[:, offset : offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    return g.gguf_weight(torch.from_numpy(blocks).reshape(N, -1), qtype, (N, K))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 5, 8])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "gguf_compute.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    superblocks = N * K / 256
    results = []
    print(f"{'format':6s} {'rows':>4s} {'ns/sb':>8s} {'ns/sb/row':>10s}")
    for name, qtype in FORMATS.items():
        w = random_weight(qtype)
        for m in args.rows:
            x = torch.randn(m, K)
            for _ in range(5):
                g.gguf_matmul(x, w, activations="q8")
            best = float("inf")
            for _ in range(args.repeats):
                start = time.thread_time_ns()
                g.gguf_matmul(x, w, activations="q8")
                best = min(best, time.thread_time_ns() - start)
            per_sb = best / superblocks
            results.append(dict(format=name, rows=m, ns_per_superblock=per_sb, ns_per_superblock_row=per_sb / m))
            print(f"{name:6s} {m:4d} {per_sb:8.2f} {per_sb / m:10.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(N=N, K=K, threads=1, clock="thread_time, min over repeats", isa=g.q8_cpu_isa(),
                       results=results), f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
