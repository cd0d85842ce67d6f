"""MTP heads: the fused head op against the unfused torch sequence, and Medusa / MTP end to end.

Kernel part: ``ops.mtp.mtp_head_topk`` (final RMSNorm + LM head + top-k, no [M, V] logits) against
``torch.topk(F.linear(F.rms_norm(x), lm_head), k)`` (argmax for k = 1) at the zoo target's shapes
(H = 192, V = 2048) and at Llama-3-8B's (H = 4096, V = 128256), M = 1..16; interleaved repeats,
medians, the speedup as a ratio of the same run, and the LM-head read bandwidth. On the CPU also
``mtp_head_topk_packed`` (the LM head packed for the CPU decoding path: float32 panels of a float32
head, bfloat16 panels of a bfloat16 one, float32 activations) and ``mtp_head_topk_w4``.

End-to-end part (CPU, zoo target, heads from ``python -m zoo.train --heads``): tokens/s, tau
and speedup over this engine's autoregressive decoding for Medusa chain, Medusa tree (each budget),
MTP chain and the draft-model method, batch 1 and 8, greedy and T = 0.8, on held-out prompts.

Usage: python bench/bench_mtp.py [--quick] [--part kernel|e2e|all] [--device cpu|cuda] [--out PATH]
Targets: CPU fused >= 1.5x unfused at M = 1 for the 8B shape; on an H200 >= 70% of HBM
bandwidth for the LM-head read; Medusa tree and MTP >= 1.5x autoregressive at batch 1 greedy; MTP
tau >= draft-model tau at k = 4.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: zoo/, bench/
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specdec_cuda import ops  # noqa: E402
from specdec_cuda.ops import mtp as mtp_ops  # noqa: E402

SHAPES = {"zoo": (192, 2048), "llama3-8b": (4096, 128256)}


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved(fns: dict, repeats: int, device: str) -> dict:
    """Median seconds per callable, the callables alternating within each repeat."""
    times = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    _sync(device)
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_kernel(args) -> list[dict]:
    rows = []
    eps = 1e-5
    dtypes = [torch.float32, torch.bfloat16] if args.device == "cpu" else [torch.bfloat16, torch.float16]
    for shape, (H, V) in SHAPES.items():
        Ms = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16]
        for dtype in dtypes:
            g = torch.Generator().manual_seed(0)
            lm = (torch.randn(V, H, generator=g) / H ** 0.5).to(dtype).to(args.device)
            w = torch.ones(H, dtype=dtype, device=args.device)
            # The 4-bit LM head (CPU layout, group 128, or 64 where H is not a multiple of 128), built once per shape and dtype.
            w4 = ops.quantize_w4(lm.float(), group_size=128 if H % 128 == 0 else 64, device="cpu") if args.device == "cpu" else None
            # The packed LM head of the CPU decoding path (float32 activations): float32 panels of a
            # float32 head, bfloat16 panels of a bfloat16 one (the same values, widened exactly).
            packed = ops.pack_weight(lm.float()) if args.device == "cpu" else None
            for M in Ms:
                x = torch.randn(M, H, generator=g).to(dtype).to(args.device)
                for k in (1, 8):
                    def unfused():
                        logits = F.linear(F.rms_norm(x, (H,), w, eps), lm)
                        return logits.argmax(-1) if k == 1 else torch.topk(logits, k).indices

                    def fused():
                        return mtp_ops.mtp_head_topk(x, w, lm, k, eps).indices

                    if not args.quick or k == 8 or M == 1:
                        big = shape != "zoo"
                        reps = (3 if args.quick else 7) if big else (30 if args.quick else 100)
                        fns = {"fused": fused, "unfused": unfused}
                        if packed is not None:
                            xf, wf = x.float(), w.float()

                            def fused_packed():
                                return mtp_ops.mtp_head_topk_packed(xf, wf, packed, k, eps).indices

                            fns.update(fused_packed=fused_packed)
                        if w4 is not None:
                            def fused_w4():
                                return mtp_ops.mtp_head_topk_w4(x, w, w4, k, eps).indices

                            def unfused_w4():  # the same 4-bit weight through the unfused op sequence
                                logits = ops.w4a16_matmul(F.rms_norm(x, (H,), w, eps).float(), w4)
                                return logits.argmax(-1) if k == 1 else torch.topk(logits, k).indices

                            fns.update(fused_w4=fused_w4, unfused_w4=unfused_w4)
                        t = interleaved(fns, reps, args.device)
                        gbps = V * H * lm.element_size() / t["fused"] / 1e9
                        rows.append(dict(shape=shape, H=H, V=V, dtype=str(dtype).replace("torch.", ""), M=M, k=k,
                                         fused_s=t["fused"], unfused_s=t["unfused"],
                                         speedup=t["unfused"] / t["fused"], lm_head_GBps=gbps))
                        r = rows[-1]
                        w4_note = ""
                        if packed is not None:
                            r.update(fused_packed_s=t["fused_packed"], speedup_packed=t["unfused"] / t["fused_packed"])
                            w4_note += (f"  | packed ({str(packed.panels.dtype).replace('torch.', '')} panels) "
                                        f"{1e3 * t['fused_packed']:8.3f} ms: {r['speedup_packed']:5.2f}x")
                        if w4 is not None:
                            r.update(fused_w4_s=t["fused_w4"], unfused_w4_s=t["unfused_w4"],
                                     speedup_w4_vs_unfused_dense=t["unfused"] / t["fused_w4"],
                                     speedup_w4_vs_unfused_w4=t["unfused_w4"] / t["fused_w4"])
                            w4_note += (f"  | 4-bit fused {1e3 * t['fused_w4']:8.3f} ms: "
                                       f"{r['speedup_w4_vs_unfused_dense']:5.2f}x unfused dense, "
                                       f"{r['speedup_w4_vs_unfused_w4']:5.2f}x unfused 4-bit")
                        print(f"{shape:10s} {r['dtype']:9s} M={M:2d} k={k}  fused {1e3 * r['fused_s']:8.3f} ms  "
                              f"unfused {1e3 * r['unfused_s']:8.3f} ms  speedup {r['speedup']:5.2f}x  "
                              f"lm_head read {gbps:7.1f} GB/s{w4_note}", flush=True)
            del lm, w4, packed
    return rows


def bench_e2e(args) -> list[dict]:
    from bench import e2e
    from zoo import pairs
    from specdec_cuda.api import SpeculativeDecoder

    torch.set_num_threads(args.threads)
    pair = e2e.load_pair(args.target, None, device=args.device, threads=args.threads)
    target_dir, draft_dir = pairs.get_pair(pairs.SPECS[pairs.default_zoo()])
    draft = e2e.load_pair(target_dir, draft_dir, device=args.device, threads=args.threads).draft
    heads_root = Path(args.heads) if args.heads else pairs.default_pair_dir()
    medusa, mtp = heads_root / "heads-medusa", heads_root / "heads-mtp"
    n_prompts = 8 if args.quick else 16
    prompts = e2e.encode(pair.tokenizer, e2e.held_out_prompts(n_prompts))
    max_new = 48 if args.quick else 96
    budgets = (16, 32, 64)
    methods = [("autoregressive", "autoregressive", {}),
               ("draft k=4", "draft", dict(draft=draft, k=4, policy="fixed")),
               ("medusa chain", "medusa", dict(heads=medusa, policy="fixed"))]
    methods += [(f"medusa tree {b}", "medusa", dict(heads=medusa, budget=b, policy="fixed")) for b in budgets]
    methods += [("medusa typical (LOSSY)", "medusa", dict(heads=medusa, verification="typical", policy="fixed"))]
    methods += [("mtp chain k=D", "mtp", dict(heads=mtp, policy="fixed")),
                ("mtp chain k=4", "mtp", dict(heads=mtp, k=4, policy="fixed"))]
    decoders = {name: SpeculativeDecoder(pair.target, method=m, **opts) for name, m, opts in methods}
    rows = []
    for batch in (1, 8):
        for temperature in (0.0, 0.8):
            results = {name: [] for name in decoders}
            outputs = {}
            for _ in range(args.repeats):  # interleaved repeats; the median run per method
                for name, dec in decoders.items():
                    res = e2e.run_engine(dec, prompts, batch, max_new_tokens=max_new, temperature=temperature,
                                         seed=list(range(batch)) if batch > 1 else 0)
                    results[name].append(res)
                    outputs.setdefault(name, res["outputs"])
            base = statistics.median(r["tokens_per_s"] for r in results["autoregressive"])
            for name, runs in results.items():
                tps = statistics.median(r["tokens_per_s"] for r in runs)
                same = outputs[name] == outputs["autoregressive"] if temperature == 0 else None
                rows.append(dict(batch=batch, temperature=temperature, method=name, tokens_per_s=tps,
                                 tau=runs[0]["tau"], acceptance=runs[0]["acceptance"], speedup=tps / base,
                                 greedy_identical=same))
                r = rows[-1]
                tau = f"{r['tau']:.2f}" if r["tau"] else "-"
                print(f"batch {batch} T={temperature:.1f}  {name:22s} {tps:8.1f} tok/s  tau {tau:>5s}  "
                      f"speedup {r['speedup']:5.2f}x  identical {same}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--part", choices=("kernel", "e2e", "all"), default="all")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads for both sides (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="e2e: interleaved runs per configuration")
    p.add_argument("--target", default=None, help="e2e: target folder (default: the zoo target)")
    p.add_argument("--heads", default=None, help="e2e: folder holding heads-medusa / heads-mtp (default: beside "
                                                  "the zoo target)")
    p.add_argument("--out", default="bench/results/mtp.json")
    args = p.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    result = {"device": args.device, "threads": args.threads, "quick": args.quick,
              "note": "CPU timings on a shared machine: compare ratios measured in the same run"}
    if args.part in ("kernel", "all"):
        result["kernel"] = bench_kernel(args)
    if args.part in ("e2e", "all") and args.device == "cpu":
        result["e2e"] = bench_e2e(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
