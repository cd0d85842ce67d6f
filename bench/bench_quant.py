"""Benchmark w4a16_matmul against the dense matmul of the same shape and activation dtype.

    python bench/bench_quant.py [--quick] [--out PATH] [--device cpu|cuda]

Weights are [N, K] = (out_features, in_features); M activation rows. Several copies of every
weight (int4 and dense) are rotated so that no cache holds the one being read (the working set of
the rotation exceeds the last-level cache / L2 several times). Reported per case: median time of
both, the ratio dense / int4 (> 1: int4 faster), and the effective bandwidth of the int4 kernel
(packed weight + scales + x + y bytes per second); on CUDA also the percentage of the HBM
bandwidth measured in the same run (a device-to-device copy, or --hbm-gbps). On CUDA the dense
baseline is cuBLAS (torch matmul with the dense fp16 / bf16 weight) and the int4 kernel is the
tensor-core W4A16 kernel for M <= 16; the issue's H200 targets (M = 1, 8192 x 8192: >= 70 % of
HBM and >= 2.5x over bf16 cuBLAS) are flagged per row (``meets_target``). Every case first checks
the int4 output against x · w4_dequantize(W)ᵀ (``max_rel_err``), so a wrong kernel cannot report
a speed. Writes JSON (default bench/results/quant.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import specdec_cuda  # noqa: E402
import timing  # noqa: E402  (bench/timing.py, beside this script)
from specdec_cuda.ops import quant as q  # noqa: E402

CPU_SHAPES_QUICK = [(14336, 4096)]
CPU_SHAPES = [(14336, 4096), (4096, 4096), (4096, 14336)]
CUDA_SHAPES_QUICK = [(8192, 8192), (14336, 4096), (4096, 14336)]
CUDA_SHAPES = [(8192, 8192), (4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]
# H200 targets of issue 5, for M = 1 on 8192 x 8192-class shapes
TARGET_PCT_HBM = 70.0
TARGET_SPEEDUP_BF16 = 2.5


def copies_for(nbytes: int, cache_bytes: int) -> int:
    return max(2, min(16, math.ceil(4 * cache_bytes / max(nbytes, 1))))


def make_weights(n: int, k: int, dtype: torch.dtype, device: str, group: int, cache_bytes: int):
    """Independent dense and int4 copies, enough of each that their rotation overflows the cache."""
    elem = torch.finfo(dtype).bits // 8
    dense_copies = copies_for(n * k * elem, cache_bytes)
    int4_copies = copies_for(n * k // 2, cache_bytes)
    dense, packed = [], []
    for i in range(max(dense_copies, int4_copies)):
        g = torch.Generator(device=device).manual_seed(i)
        w = torch.randn(n, k, generator=g, device=device) * 0.02
        if i < int4_copies:
            packed.append(q.quantize_w4(w, group, device=device, scale_dtype=dtype if device == "cuda" else None))
        if i < dense_copies:
            dense.append(w.to(device=device, dtype=dtype))
        del w
    return dense, packed


def int4_bytes(pw: q.PackedW4, m: int, elem: int) -> int:
    return pw.packed.numel() * pw.packed.element_size() + pw.scales.numel() * pw.scales.element_size() + \
        m * (pw.in_features + pw.out_features) * elem


def run(device: str, quick: bool, group: int, hbm_gbps: float | None = None) -> dict:
    cuda = device == "cuda"
    shapes = (CUDA_SHAPES_QUICK if quick else CUDA_SHAPES) if cuda else (CPU_SHAPES_QUICK if quick else CPU_SHAPES)
    dtypes = [torch.float16, torch.bfloat16] if cuda else ([torch.float32] if quick else [torch.float32, torch.bfloat16])
    ms = [1, 4, 16]
    reps = 50 if cuda else (7 if quick else 11)
    cache_bytes = (60 << 20) if cuda else (48 << 20)  # H200 L2: 50 MiB (60 for margin); this CPU's L3: 48 MiB
    timer = timing.time_cuda if cuda else timing.time_cpu
    peak = (hbm_gbps * 1e9 if hbm_gbps else timing.hbm_bytes_per_s()) if cuda else None
    rows = []
    for n, k in shapes:
        for dtype in dtypes:
            elem = torch.finfo(dtype).bits // 8
            dense, packed = make_weights(n, k, dtype, device, group, cache_bytes)
            for m in ms:
                x = torch.randn(m, k, device=device).to(dtype)
                check = q.w4a16_matmul(x, packed[0]).float()
                expected = x.float() @ q.w4_dequantize(packed[0], dtype if cuda else torch.float32).float().T
                max_rel_err = ((check - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()
                t_dense = timer(lambda i: x @ dense[i % len(dense)].T, reps)
                t_int4 = timer(lambda i: q.w4a16_matmul(x, packed[i % len(packed)]), reps)
                bw = int4_bytes(packed[0], m, elem) / t_int4
                row = {
                    "device": device, "N": n, "K": k, "M": m, "dtype": str(dtype).replace("torch.", ""),
                    "group_size": group, "dense_ms": t_dense * 1e3, "int4_ms": t_int4 * 1e3,
                    "speedup_vs_dense": t_dense / t_int4, "int4_GBps": bw / 1e9,
                    "dense_GBps": (n * k + m * (n + k)) * elem / t_dense / 1e9,
                    "max_rel_err": max_rel_err,
                }
                if peak:
                    row["int4_pct_of_hbm"] = 100 * bw / peak
                if cuda and m == 1 and n * k >= 8192 * 8192:
                    row["targets"] = {"pct_of_hbm": TARGET_PCT_HBM, "speedup_vs_bf16_cublas": TARGET_SPEEDUP_BF16}
                    row["meets_target"] = row["int4_pct_of_hbm"] >= TARGET_PCT_HBM and (
                        dtype != torch.bfloat16 or row["speedup_vs_dense"] >= TARGET_SPEEDUP_BF16)
                rows.append(row)
                pct = f" {row['int4_pct_of_hbm']:5.1f}%" if peak else ""
                print(f"{device:4} {n:6}x{k:<6} M={m:<3} {row['dtype']:8} dense {row['dense_ms']:8.3f} ms  "
                      f"int4 {row['int4_ms']:8.3f} ms  x{row['speedup_vs_dense']:5.2f}  "
                      f"{row['int4_GBps']:7.1f} GB/s{pct}  err {max_rel_err:.1e}"
                      + (f"  target {'met' if row['meets_target'] else 'MISSED'}" if "meets_target" in row else ""),
                      flush=True)
            del dense, packed
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "build": specdec_cuda.build_info()}
    if cuda:
        info["gpu"] = torch.cuda.get_device_name()
        info["hbm_copy_GBps"] = peak / 1e9
    else:
        info["cpu_isa"] = torch.backends.cpu.get_cpu_capability()
    baseline = ("cuBLAS (torch matmul) with the dense weight of the same shape and activation dtype" if cuda
                else "dense torch matmul of the same shape and dtype")
    return {"bench": "quant", "baseline": baseline, "info": info,
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes / dtypes / repetitions")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "quant.json"))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth measured elsewhere (skips the copy)")
    args = ap.parse_args()
    result = run(args.device, args.quick, args.group_size, args.hbm_gbps)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
