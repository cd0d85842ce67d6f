"""Benchmark the hierarchical 4-bit KV cache ops against full-precision reads.

    python bench/bench_kv_quant.py [--quick] [--out PATH] [--device cpu|cuda]

Per context length: quantising a block into the cache (keys + values), reading it back upper-only
(a draft's read) and upper + lower (verification's read), each against copying the same K/V held in
full precision (the baseline: what a plain cache moves), medians measured in the same run, and the
effective bandwidth of the reads (quantised bytes read + float32 bytes written per second). On
CUDA the times are GPU time (calls queued so the host's dispatch is not timed).
Writes JSON (default bench/results/kv_quant.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import specdec_cuda  # noqa: E402
import timing  # noqa: E402  (bench/timing.py, beside this script)
from specdec_cuda.ops import kv_quant as kv  # noqa: E402


def timed(fn, reps: int, cuda: bool) -> float:
    """Median seconds of fn(): GPU time on CUDA (bench/timing.py time_cuda), wall time on the CPU."""
    return (timing.time_cuda if cuda else timing.time_cpu)(lambda _r: fn(), reps)


def run(device: str, quick: bool) -> dict:
    cuda = device == "cuda"
    b, h, d, kg, vg = (1, 8, 128, 64, 32)
    lengths = [1024] if quick else [1024, 4096] + ([32768] if cuda else [])
    reps = 20 if cuda else 5
    rows = []
    for t in lengths:
        cache = kv.allocate_kv_cache(b, h, t, d, kg, vg, device=device)
        k = torch.randn(b, h, t, d, device=device, dtype=torch.float16)
        v = torch.randn(b, h, t, d, device=device, dtype=torch.float16)
        c = cache

        def quantize():
            kv.kv_quantize_keys(k, 0, kg, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"])
            kv.kv_quantize_values(v, 0, vg, c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"])

        def read(lower):
            return lambda: (
                kv.kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], kg, t, lower),
                kv.kv_dequantize_values(c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"], vg, t, lower))

        t_quant = timed(quantize, reps, cuda)
        t_upper = timed(read(False), reps, cuda)
        t_both = timed(read(True), reps, cuda)
        t_full = timed(lambda: (k.float(), v.float()), reps, cuda)  # baseline: fp16 cache -> fp32
        code_bytes = c["k_upper"].numel()  # per tensor
        param_bytes = 4 * (c["k_scale"].numel() + c["k_zero"].numel() + c["v_scale"].numel() + c["v_zero"].numel())
        out_bytes = 2 * b * h * t * d * 4
        row = {
            "device": device, "tokens": t, "heads": h, "head_dim": d, "key_group": kg, "value_group": vg,
            "quantize_ms": t_quant * 1e3, "read_upper_ms": t_upper * 1e3, "read_upper_lower_ms": t_both * 1e3,
            "read_fp16_ms": t_full * 1e3,
            "read_upper_GBps": (2 * code_bytes + param_bytes + out_bytes) / t_upper / 1e9,
            "read_upper_lower_GBps": (4 * code_bytes + param_bytes + out_bytes) / t_both / 1e9,
            "upper_vs_fp16": t_full / t_upper, "upper_lower_vs_fp16": t_full / t_both,
        }
        rows.append(row)
        print(f"{device:4} T={t:<6} quantise {row['quantize_ms']:8.3f} ms  read upper {row['read_upper_ms']:8.3f} ms "
              f"(x{row['upper_vs_fp16']:.2f})  upper+lower {row['read_upper_lower_ms']:8.3f} ms "
              f"(x{row['upper_lower_vs_fp16']:.2f})  fp16->fp32 copy {row['read_fp16_ms']:8.3f} ms", flush=True)
    return {"bench": "kv_quant", "baseline": "fp16 K/V converted to fp32 (same output)",
            "info": {"torch": torch.__version__, "threads": torch.get_num_threads(), "build": specdec_cuda.build_info()},
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kv_quant.json"))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    result = run(args.device, args.quick)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
