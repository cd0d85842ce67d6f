"""Benchmark w4a16_matmul against the dense matmul of the same shape and activation dtype.

    python bench/bench_quant.py [--quick] [--out PATH] [--device cpu|cuda] [--tune]

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

CUDA times (``*_ms``) are GPU times per call, with calls queued so that the host's dispatch is not
in them (bench/timing.py ``time_cuda``); the targets are judged on those. ``*_eager_ms`` are the
latency of one call issued to an idle GPU, dispatch included, for comparison. ``--tune`` also
times every launch configuration of the CUDA kernel (``cuda_tunings()``) that takes M rows, checks
each one's output, and reports the fastest correct one per case next to the automatic choice.
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
# H200 targets, for M = 1 on 8192 x 8192-class shapes
TARGET_PCT_HBM = 70.0
TARGET_SPEEDUP_BF16 = 2.5
# what tests/test_quant.py holds the kernel to (max-abs error relative to max |reference|)
REL_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


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


def run(device: str, quick: bool, group: int, hbm_gbps: float | None = None, tune: bool = False) -> dict:
    cuda = device == "cuda"
    shapes = (CUDA_SHAPES_QUICK if quick else CUDA_SHAPES) if cuda else (CPU_SHAPES_QUICK if quick else CPU_SHAPES)
    dtypes = [torch.float16, torch.bfloat16] if cuda else ([torch.float32] if quick else [torch.float32, torch.bfloat16])
    ms = [1, 4, 16]
    reps = 50 if cuda else (7 if quick else 11)
    cache_bytes = (60 << 20) if cuda else (48 << 20)  # H200 L2: 50 MiB (60 for margin); this CPU's L3: 48 MiB
    timer = timing.time_cuda if cuda else timing.time_cpu
    peak = (hbm_gbps * 1e9 if hbm_gbps else timing.hbm_bytes_per_s()) if cuda else None
    tunings = q.cuda_tunings() if cuda and tune else []
    rows, sweep = [], []
    for n, k in shapes:
        for dtype in dtypes:
            elem = torch.finfo(dtype).bits // 8
            dense, packed = make_weights(n, k, dtype, device, group, cache_bytes)
            for m in ms:
                x = torch.randn(m, k, device=device).to(dtype)
                expected = x.float() @ q.w4_dequantize(packed[0], dtype if cuda else torch.float32).float().T

                def max_rel_err(**kw) -> float:
                    y = q.w4a16_matmul(x, packed[0], **kw).float()
                    return ((y - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()

                err = max_rel_err()
                t_dense = timer(lambda i: x @ dense[i % len(dense)].T, reps)
                t_int4 = timer(lambda i: q.w4a16_matmul(x, packed[i % len(packed)]), reps)
                nbytes = int4_bytes(packed[0], m, elem)
                row = {
                    "device": device, "N": n, "K": k, "M": m, "dtype": str(dtype).replace("torch.", ""),
                    "group_size": group, "dense_ms": t_dense * 1e3, "int4_ms": t_int4 * 1e3,
                    "speedup_vs_dense": t_dense / t_int4, "int4_GBps": nbytes / t_int4 / 1e9,
                    "dense_GBps": (n * k + m * (n + k)) * elem / t_dense / 1e9,
                    "max_rel_err": err,
                }
                if cuda:  # one call from an idle GPU, host dispatch included (not what the targets are about)
                    t_dense_eager = timing.time_cuda_eager(lambda i: x @ dense[i % len(dense)].T, reps)
                    t_int4_eager = timing.time_cuda_eager(lambda i: q.w4a16_matmul(x, packed[i % len(packed)]), reps)
                    row.update(dense_eager_ms=t_dense_eager * 1e3, int4_eager_ms=t_int4_eager * 1e3,
                               speedup_vs_dense_eager=t_dense_eager / t_int4_eager,
                               int4_pct_of_hbm=100 * nbytes / t_int4 / peak)
                if cuda and m == 1 and n * k >= 8192 * 8192:
                    row["targets"] = {"pct_of_hbm": TARGET_PCT_HBM, "speedup_vs_bf16_cublas": TARGET_SPEEDUP_BF16}
                    row["meets_target"] = row["int4_pct_of_hbm"] >= TARGET_PCT_HBM and (
                        dtype != torch.bfloat16 or row["speedup_vs_dense"] >= TARGET_SPEEDUP_BF16)
                rows.append(row)
                pct = f" {row['int4_pct_of_hbm']:5.1f}%" if cuda else ""
                eager = (f"  (eager: dense {row['dense_eager_ms']:.3f} int4 {row['int4_eager_ms']:.3f} ms)"
                         if cuda else "")
                print(f"{device:4} {n:6}x{k:<6} M={m:<3} {row['dtype']:8} dense {row['dense_ms']:8.4f} ms  "
                      f"int4 {row['int4_ms']:8.4f} ms  x{row['speedup_vs_dense']:5.2f}  "
                      f"{row['int4_GBps']:7.1f} GB/s{pct}  err {err:.1e}"
                      + (f"  target {'met' if row['meets_target'] else 'MISSED'}" if "meets_target" in row else "")
                      + eager, flush=True)
                for t in tunings:  # every launch configuration that takes M rows, checked, then timed
                    if m > t["rows"]:
                        continue
                    t_err = max_rel_err(tuning=t["index"])
                    t_s = timer(lambda i: q.w4a16_matmul(x, packed[i % len(packed)], tuning=t["index"]), reps)
                    sweep.append({"N": n, "K": k, "M": m, "dtype": row["dtype"], "tuning": t,
                                  "int4_ms": t_s * 1e3, "pct_of_hbm": 100 * nbytes / t_s / peak,
                                  "speedup_vs_dense": t_dense / t_s, "max_rel_err": t_err,
                                  "correct": t_err <= REL_TOL[dtype]})
                    print(f"       tuning {t['index']:2} rows {t['rows']:2} tiles_n {t['tiles_n']} stages "
                          f"{t['stages']} warps {t['warps']}: {t_s * 1e3:8.4f} ms  {sweep[-1]['pct_of_hbm']:5.1f}% "
                          f"x{sweep[-1]['speedup_vs_dense']:5.2f}  err {t_err:.1e}", flush=True)
            del dense, packed
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "build": specdec_cuda.build_info()}
    if cuda:
        info["gpu"] = torch.cuda.get_device_name()
        info["hbm_copy_GBps"] = peak / 1e9
        info["timing"] = ("*_ms: GPU time per call (calls queued behind a spin kernel, bench/timing.py time_cuda); "
                          "*_eager_ms: one call issued to an idle GPU, host dispatch included")
    else:
        info["cpu_isa"] = torch.backends.cpu.get_cpu_capability()
    baseline = ("cuBLAS (torch matmul) with the dense weight of the same shape and activation dtype" if cuda
                else "dense torch matmul of the same shape and dtype")
    result = {"bench": "quant", "baseline": baseline, "info": info, "rows": rows}
    if tunings:
        result["tuning_sweep"] = sweep
        result["best_tuning"] = best_tunings(sweep)
        for b in result["best_tuning"]:
            print(f"best for {b['N']}x{b['K']} M={b['M']} {b['dtype']}: tuning {b['index']} "
                  f"({b['int4_ms']:.4f} ms, {b['pct_of_hbm']:.1f}% of HBM; automatic {b['auto_ms']:.4f} ms)")
    return result


def best_tunings(sweep: list[dict]) -> list[dict]:
    """Per (shape, M, dtype): the fastest correct configuration, next to the automatic one's time."""
    best = {}
    for s in sweep:
        if not s["correct"]:
            continue
        key = (s["N"], s["K"], s["M"], s["dtype"])
        if key not in best or s["int4_ms"] < best[key]["int4_ms"]:
            best[key] = s
    out = []
    for (n, k, m, dtype), s in best.items():
        auto = [a["int4_ms"] for a in sweep if (a["N"], a["K"], a["M"], a["dtype"]) == (n, k, m, dtype)
                and m in a["tuning"]["auto_for_rows"]]
        out.append({"N": n, "K": k, "M": m, "dtype": dtype, "index": s["tuning"]["index"], "int4_ms": s["int4_ms"],
                    "pct_of_hbm": s["pct_of_hbm"], "auto_ms": auto[0] if auto else float("nan")})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes / dtypes / repetitions")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "quant.json"))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth measured elsewhere (skips the copy)")
    ap.add_argument("--tune", action="store_true",
                    help="CUDA: also time every launch configuration of the W4A16 kernel (cuda_tunings())")
    args = ap.parse_args()
    if args.tune and args.device != "cuda":
        ap.error("--tune sweeps the CUDA kernel's launch configurations; it needs --device cuda")
    result = run(args.device, args.quick, args.group_size, args.hbm_gbps, args.tune)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
