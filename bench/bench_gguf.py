"""Benchmark gguf_matmul (GGUF blocks read as stored) against dense paths on the same shapes.

    python bench/bench_gguf.py [--quick] [--threads N] [--out PATH]
    python bench/bench_gguf.py --device cuda [--quick] [--out PATH]     # bench/gpu_check.sh, family gguf

Shapes are the real models' [N, K] = (out_features, in_features): Qwen2.5-Coder-1.5B's attention
(1536 x 1536), MLP up / gate (8960 x 1536) and down (1536 x 8960) in Q4_K, every format on
8960 x 1536, and the Q6_K LM head (151936 x 1536). For M = 1, 5, 16, 64 activation rows, per case:
median time and weight GB/s (the blocks' bytes / time) of gguf_matmul, and in the same run

  * dequant+mm: gguf_dequantize to float32 then torch.matmul, per call (what reading the blocks
    without a fused kernel costs);
  * fp32 mm: torch.matmul with the float32 weight dequantised once (8 bytes read per 4.5 bits);
  * bf16 linear: torch.nn.functional.linear in bfloat16 with a bf16 weight of the shape (the
    project's bf16 path), x in bf16;

as ratios baseline time / gguf time (> 1: gguf faster), and q8: gguf_matmul(activations="q8")
(x quantised to int8 per 32-value block, integer dot products; quantisation included in the
time), its weight GB/s and its speedup over the float32-activation gguf_matmul. Every weight is held in enough copies,
rotated, that the one read is not in the last-level cache (--cache-mib, default 64). Each case
first checks gguf_matmul against x · dequant(W)ᵀ (max_rel_err), so a wrong kernel reports no
speed. Writes JSON (default bench/results/gguf.json, bench/results/gguf_cuda.json with --device
cuda) and prints a table.

``--device cuda``: the same cases on the GPU (GPU time per call, ``timing.time_cuda``; the
copies rotated past the L2 cache), float32 activations only (the q8 kernel is CPU-only), the
weight GB/s also as a share of the HBM bandwidth measured in the same run (a device-to-device copy),
against dequant+mm, fp32 mm and bf16 ``F.linear`` (cuBLAS) on the device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import specdec_cuda  # noqa: E402,F401
import timing  # noqa: E402  (bench/timing.py, beside this script)
from specdec_cuda.ops import gguf as g  # noqa: E402

Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 3, 6, 8, 12, 14
CASES = [(Q4_K, 1536, 1536), (Q4_K, 8960, 1536), (Q4_K, 1536, 8960),
         (Q6_K, 8960, 1536), (Q8_0, 8960, 1536), (Q5_0, 8960, 1536), (Q4_1, 8960, 1536),
         (Q6_K, 151936, 1536)]
CASES_QUICK = [(Q4_K, 8960, 1536), (Q6_K, 8960, 1536), (Q8_0, 8960, 1536), (Q5_0, 8960, 1536), (Q4_1, 8960, 1536)]
MS = [1, 5, 16, 64]
MS_QUICK = [1, 5, 16]
RTOL = 1e-5  # tests/test_gguf.py's float32 bound, relative to max(|x|·|W|ᵀ)
Q8_RTOL = 1e-2  # tests/test_gguf_q8.py's bound for int8 activations
# fp16 fields (byte offset) of each format's block, set to sane scales in the random blocks
HALVES = {Q4_1: [(0, 1e-3, 2e-2), (2, -0.2, 0.2)], Q5_0: [(0, -2e-2, 2e-2)], Q8_0: [(0, -2e-2, 2e-2)],
          Q4_K: [(0, 1e-4, 5e-3), (2, 1e-4, 5e-3)], Q6_K: [(208, -5e-3, 5e-3)]}


def random_weight(qtype: int, n: int, k: int, seed: int) -> g.GgufWeight:
    """Random blocks (every code value) with sane fp16 scales."""
    name, qk, nbytes = g.FORMATS[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // qk, nbytes), dtype=np.uint8)
    for off, lo, hi in HALVES[qtype]:
        raw[:, :, off:off + 2] = rng.uniform(lo, hi, size=raw.shape[:2]).astype(np.float16).view(np.uint8).reshape(
            *raw.shape[:2], 2)
    return g.gguf_weight(torch.from_numpy(raw.reshape(n, -1)), qtype, (n, k))


def copies_for(nbytes: int, cache_bytes: int) -> int:
    return max(1, min(16, math.ceil(4 * cache_bytes / max(nbytes, 1))))


def run(quick: bool, cache_bytes: int, repeats: int, device: str = "cpu") -> dict:
    cuda = device == "cuda"
    clock = timing.time_cuda if cuda else timing.time_cpu
    hbm = timing.hbm_bytes_per_s() if cuda else None
    rows = []
    for qtype, n, k in (CASES_QUICK if quick else CASES):
        name = g.FORMATS[qtype][0]
        big = n * k > 50_000_000  # the LM head: fewer copies and repeats, or the bench takes minutes
        w_cpu = random_weight(qtype, n, k, seed=n + k)
        w0 = w_cpu._replace(data=w_cpu.data.to(device))
        wbytes = w0.data.numel()
        weights = [w0] + [w0._replace(data=w0.data.clone()) for _ in range(copies_for(wbytes, cache_bytes) - 1)]
        exact_w = g.gguf_dequantize(w_cpu).double()  # the reference, on the CPU
        dense = [g.gguf_dequantize(w0)]  # fp32 [N, K]
        dense += [dense[0].clone() for _ in range(0 if big else copies_for(n * k * 4, cache_bytes) - 1)]
        bf16 = [d.bfloat16() for d in dense[:1]]
        bf16 += [bf16[0].clone() for _ in range(0 if big else copies_for(n * k * 2, cache_bytes) - 1)]
        reps = max(3, repeats // 4) if big else repeats
        for m in (MS_QUICK if quick else MS):
            x = torch.randn(m, k)
            xd = x.to(device)
            xb = xd.bfloat16()
            exact = x.double() @ exact_w.T
            scale = (x.double().abs() @ exact_w.abs().T).max()
            err = ((g.gguf_matmul(xd, w0).cpu().double() - exact).abs().max() / scale).item()
            err8 = None if cuda else (
                (g.gguf_matmul(x, w0, activations="q8").double() - exact).abs().max() / scale).item()
            row = {"format": name, "N": n, "K": k, "M": m, "weight_bytes": wbytes, "max_rel_err": err,
                   "q8_max_rel_err": err8}
            if not (err <= RTOL and (err8 is None or err8 <= Q8_RTOL)):
                row["error"] = f"max_rel_err {err:.3g} (> {RTOL}?) or q8 {err8} (> {Q8_RTOL}?): not timed"
                rows.append(row)
                print(row)
                continue
            t = clock(lambda r: g.gguf_matmul(xd, weights[r % len(weights)]), reps)
            t_dq = clock(lambda r: xd @ g.gguf_dequantize(weights[r % len(weights)]).T, max(3, reps // 4))
            t_fp32 = clock(lambda r: xd @ dense[r % len(dense)].T, reps)
            t_bf16 = clock(lambda r: torch.nn.functional.linear(xb, bf16[r % len(bf16)]), reps)
            row.update({
                "gguf_ms": t * 1e3, "gguf_weight_gbps": wbytes / t / 1e9,
                "dequant_mm_ms": t_dq * 1e3, "fp32_mm_ms": t_fp32 * 1e3, "bf16_linear_ms": t_bf16 * 1e3,
                "bf16_weight_gbps": n * k * 2 / t_bf16 / 1e9,
                "speedup_vs_dequant_mm": t_dq / t, "speedup_vs_fp32_mm": t_fp32 / t,
                "speedup_vs_bf16_linear": t_bf16 / t,
            })
            q8 = ""
            if not cuda:
                t_q8 = clock(lambda r: g.gguf_matmul(x, weights[r % len(weights)], activations="q8"), reps)
                row.update({"q8_ms": t_q8 * 1e3, "q8_weight_gbps": wbytes / t_q8 / 1e9, "q8_speedup_vs_gguf": t / t_q8})
                q8 = f"q8 {t_q8 * 1e3:8.3f} ms {wbytes / t_q8 / 1e9:6.2f} GB/s x{t / t_q8:4.2f} | "
            if hbm:
                row["gguf_pct_hbm"] = 100 * wbytes / t / hbm
            rows.append(row)
            print(f"{name:5s} {n:6d}x{k:<5d} M={m:<3d} gguf {t * 1e3:8.3f} ms {wbytes / t / 1e9:6.2f} GB/s | {q8}"
                  f"dequant+mm x{t_dq / t:6.2f}  fp32 mm x{t_fp32 / t:5.2f}  bf16 linear x{t_bf16 / t:5.2f} "
                  f"({n * k * 2 / t_bf16 / 1e9:5.2f} GB/s)", flush=True)
        del weights, dense, bf16
    if cuda:
        return {"device": "cuda", "gpu": torch.cuda.get_device_name(), "hbm_gbps": hbm / 1e9,
                "cache_bytes": cache_bytes, "rows": rows}
    return {"device": "cpu", "isa": g.cpu_isa(), "q8_isa": g.q8_cpu_isa(), "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cache_bytes": cache_bytes, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the 8960 x 1536 shapes only, M up to 16")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cache-mib", type=int, default=64, help="last-level cache to defeat, MiB")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", default=None, help="default bench/results/gguf.json (gguf_cuda.json on CUDA)")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gguf.py --device cuda: no CUDA device here")
    if args.out is None:
        name = "gguf_cuda.json" if args.device == "cuda" else "gguf.json"
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    result = run(args.quick, args.cache_mib << 20, args.repeats, args.device)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    where = f"isa {result['isa']}, {result['threads']} threads" if args.device == "cpu" else result["gpu"]
    print(f"wrote {args.out} ({where})")


if __name__ == "__main__":
    main()
