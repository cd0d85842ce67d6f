"""Benchmark of verify_chain and sample (the sampling family).

    python bench/bench_sampling.py [--quick] [--out PATH] [--device cpu|cuda] [--hbm-gbps X]

Shapes: B in {8, 32}, k = 8 drafts per row, V in {32000, 128256}, fp32 and bf16 logits, LLM-like
logits (a N(0, 2^2) bulk plus a few boosted tokens per row), temperature 1, drafts sampled from the
draft distribution (draft logits = target logits + N(0, 1.5^2) noise), so chains are partly
accepted as in real speculative decoding. verify_chain runs rejection sampling with draft logits,
both strategies (parallel / serial) and auto.

Baselines, measured in the same run:
* reference: python/specdec_cuda/reference/sampling.py (the specification; per-row PyTorch). On the
  CPU only; at large shapes it is timed on the first rows and scaled to B (it is per-row
  sequential), which the table marks with '~'.
* torch: a fair vectorised PyTorch implementation of the same decision (batched softmax of all
  rows, gather of p(x), q(x), uniform accept test, residual / bonus sampled for every row with
  exponential races, first rejection by cumprod), and for `sample` softmax + torch.multinomial.

On CUDA: GPU time per call (calls queued behind a spin kernel so the host's dispatch is not
timed: bench/timing.py time_cuda), warm-up, inputs rotated over enough copies to defeat L2, and the effective
bandwidth counting every logit read once, as a fraction of the measured HBM bandwidth (a large
device-to-device copy, or --hbm-gbps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import specdec_cuda.ops as ops  # noqa: E402
from specdec_cuda.reference import sampling as ref  # noqa: E402
import timing  # noqa: E402  (bench/timing.py, beside this script)


# ---- inputs -------------------------------------------------------------------------------------

def llm_like_logits(rows, vocab, g, spread=2.0, peak=6.0):
    logits = torch.randn(rows, vocab, generator=g) * spread
    peaks = torch.randint(0, vocab, (rows, 8), generator=g)
    logits.scatter_add_(1, peaks, torch.rand(rows, 8, generator=g) * peak)
    return logits


def make_inputs(batch, k, vocab, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.arange(batch + 1, dtype=torch.int64) * k
    target = llm_like_logits(batch * (k + 1), vocab, g)
    own = torch.cat([torch.arange(i * (k + 1), i * (k + 1) + k) for i in range(batch)])
    draft = target[own] + torch.randn(batch * k, vocab, generator=g) * 1.5
    drafts = torch.multinomial(torch.softmax(draft, -1), 1, generator=g).flatten()
    return dict(draft_tokens=drafts.to(device), cu_num_draft=cu.to(device),
                target_logits=target.to(dtype).to(device), draft_logits=draft.to(dtype).to(device),
                temperature=torch.ones(batch, device=device),
                seed=torch.arange(batch, dtype=torch.int64, device=device) + 17,
                position=torch.full((batch,), 1000, dtype=torch.int64, device=device))


# ---- baselines ----------------------------------------------------------------------------------

def torch_verify_chain(draft_tokens, cu_num_draft, target_logits, draft_logits, temperature, k):
    """Vectorised rejection sampling for equal-length chains (k drafts per row)."""
    batch = cu_num_draft.numel() - 1
    vocab = target_logits.shape[1]
    t = temperature.repeat_interleave(k + 1)[:, None]
    p = torch.softmax(target_logits.float() / t, -1).view(batch, k + 1, vocab)
    q = torch.softmax(draft_logits.float() / temperature.repeat_interleave(k)[:, None], -1)
    q = q.view(batch, k, vocab)
    x = draft_tokens.view(batch, k)
    p_x = p[:, :k].gather(-1, x[..., None]).squeeze(-1)
    q_x = q.gather(-1, x[..., None]).squeeze(-1)
    accept = torch.rand_like(p_x) * q_x < p_x
    num_accepted = accept.int().cumprod(-1).sum(-1)
    residual = torch.clamp(p[:, :k] - q, min=0)
    residual_tok = (residual / torch.empty_like(residual).exponential_()).argmax(-1)
    bonus = (p[:, k] / torch.empty_like(p[:, k]).exponential_()).argmax(-1)
    emitted = torch.cat([residual_tok, bonus[:, None]], 1).gather(1, num_accepted[:, None].long())
    tokens = torch.where(torch.arange(k + 1, device=x.device) < num_accepted[:, None],
                         torch.cat([x, x[:, :1]], 1), -1)
    tokens.scatter_(1, num_accepted[:, None].long(), emitted)
    return tokens, num_accepted


def torch_sample(logits, temperature):
    return torch.multinomial(torch.softmax(logits.float() / temperature[:, None], -1), 1)


# ---- timing -------------------------------------------------------------------------------------

def timer_ms(on_cuda):
    """bench/timing.py's median timer for the device, in milliseconds."""
    timer = timing.time_cuda if on_cuda else timing.time_cpu
    return lambda fn, repeats: timer(fn, repeats) * 1e3


# ---- runs ---------------------------------------------------------------------------------------

def bench_shape(batch, k, vocab, dtype, device, quick, hbm_gbps):
    on_cuda = device == "cuda"
    base = make_inputs(batch, k, vocab, dtype, device)
    logit_bytes = (base["target_logits"].numel() + base["draft_logits"].numel()) * \
        base["target_logits"].element_size()
    # rotate over copies so that L2 never holds the logits between calls (GPU)
    copies = [base]
    if on_cuda:  # >= 400 MiB of distinct logits in rotation (an H200's L2 is 50 MiB)
        for _ in range(max(1, min(8, (400 * 2**20) // max(1, logit_bytes)))):
            copies.append({key: v.clone() for key, v in base.items()})
    repeats = 5 if quick else (50 if on_cuda else 9)
    timer = timer_ms(on_cuda)
    records = []

    torch_ms = timer(lambda r: torch_verify_chain(
        **{key: copies[r % len(copies)][key] for key in
           ("draft_tokens", "cu_num_draft", "target_logits", "draft_logits", "temperature")}, k=k),
        repeats)
    ref_ms, ref_note = None, ""
    if not on_cuda:
        rows = batch if (vocab <= 32000 and not quick) else min(batch, 2)
        sub = {key: v for key, v in base.items()}
        sub["cu_num_draft"] = base["cu_num_draft"][:rows + 1]
        sub["draft_tokens"] = base["draft_tokens"][:rows * k]
        sub["target_logits"] = base["target_logits"][:rows * (k + 1)]
        sub["draft_logits"] = base["draft_logits"][:rows * k]
        start = time.perf_counter()
        ref.verify_chain(sub["draft_tokens"], sub["cu_num_draft"], sub["target_logits"],
                         sub["draft_logits"], sub["temperature"][:rows],
                         torch.zeros(rows, dtype=torch.int32), torch.ones(rows), sub["seed"][:rows],
                         sub["position"][:rows])
        ref_ms = (time.perf_counter() - start) * 1e3 * batch / rows
        ref_note = "" if rows == batch else f"~ (timed on {rows} rows)"
    for strategy in ("parallel", "serial", "auto"):
        ms = timer(lambda r: ops.verify_chain(**copies[r % len(copies)], strategy=strategy,
                                              max_draft=k), repeats)
        out = ops.verify_chain(**base, strategy=strategy, max_draft=k)
        rec = dict(op="verify_chain", device=device, dtype=str(dtype).replace("torch.", ""),
                   B=batch, k=k, V=vocab, strategy=strategy, ms=ms, torch_ms=torch_ms,
                   reference_ms=ref_ms, reference_note=ref_note,
                   vs_torch=torch_ms / ms, vs_reference=(ref_ms / ms) if ref_ms else None,
                   mean_accepted=float(out.num_accepted.float().mean()))
        if on_cuda:
            rec["gbps"] = logit_bytes / (ms * 1e-3) / 1e9
            rec["pct_hbm"] = 100 * rec["gbps"] / hbm_gbps
        records.append(rec)

    # sample: one row per request, the bonus-position logits
    rows_logits = [c["target_logits"][k::k + 1] for c in copies]
    temperature = base["temperature"]
    torch_ms = timer(lambda r: torch_sample(rows_logits[r % len(rows_logits)], temperature), repeats)
    ms = timer(lambda r: ops.sample(rows_logits[r % len(rows_logits)], temperature, seed=base["seed"],
                                    position=base["position"]), repeats)
    ref_ms = None
    if not on_cuda:
        lg = rows_logits[0].cpu()
        start = time.perf_counter()
        ref.sample(lg, temperature.cpu(), torch.zeros(batch, dtype=torch.int32), torch.ones(batch),
                   base["seed"].cpu(), base["position"].cpu())
        ref_ms = (time.perf_counter() - start) * 1e3
    rec = dict(op="sample", device=device, dtype=str(dtype).replace("torch.", ""), B=batch, k=0,
               V=vocab, strategy="-", ms=ms, torch_ms=torch_ms, reference_ms=ref_ms,
               reference_note="", vs_torch=torch_ms / ms,
               vs_reference=(ref_ms / ms) if ref_ms else None)
    if on_cuda:
        rec["gbps"] = rows_logits[0].numel() * rows_logits[0].element_size() / (ms * 1e-3) / 1e9
        rec["pct_hbm"] = 100 * rec["gbps"] / hbm_gbps
    records.append(rec)
    return records


def print_table(records):
    head = (f"{'op':<13}{'dev':<5}{'dtype':<9}{'B':>3}{'k':>3}{'V':>7} {'strategy':<9}{'ms':>9}"
            f"{'torch ms':>10}{'x torch':>8}{'ref ms':>11}{'x ref':>8}{'GB/s':>8}{'%HBM':>6}")
    print(head)
    print("-" * len(head))
    for r in records:
        ref_ms = "-" if r["reference_ms"] is None else f"{r['reference_ms']:.1f}"
        if r.get("reference_note"):
            ref_ms = "~" + ref_ms
        vs_ref = "-" if r["vs_reference"] is None else f"{r['vs_reference']:.1f}"
        gbps = f"{r['gbps']:.0f}" if "gbps" in r else "-"
        pct = f"{r['pct_hbm']:.0f}" if "pct_hbm" in r else "-"
        print(f"{r['op']:<13}{r['device']:<5}{r['dtype']:<9}{r['B']:>3}{r['k']:>3}{r['V']:>7} "
              f"{r['strategy']:<9}{r['ms']:>9.3f}{r['torch_ms']:>10.3f}{r['vs_torch']:>8.2f}"
              f"{ref_ms:>11}{vs_ref:>8}{gbps:>8}{pct:>6}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "sampling.json"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hbm-gbps", type=float, default=None,
                        help="measured HBM bandwidth (GB/s); measured here when omitted on CUDA")
    args = parser.parse_args()
    hbm = None
    if args.device == "cuda":
        hbm = args.hbm_gbps or timing.hbm_bytes_per_s() / 1e9
        print(f"HBM bandwidth (device-to-device copy): {hbm:.0f} GB/s")
    shapes = [(b, 8, v, dt) for v in (32000, 128256) for b in (8, 32)
              for dt in (torch.float32, torch.bfloat16)]
    # The real bench's vocabulary (Qwen2.5, 151,936) at its batch-1 chain (k = 4) and a batch of 8.
    shapes += [(b, 4, 151936, torch.float32) for b in (1, 8)]
    if args.quick:
        shapes = [(8, 8, 32000, torch.bfloat16), (32, 8, 128256, torch.bfloat16)]
    records = []
    for batch, k, vocab, dtype in shapes:
        records += bench_shape(batch, k, vocab, dtype, args.device, args.quick, hbm)
    print_table(records)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    meta = dict(torch=torch.__version__, device=args.device, threads=torch.get_num_threads(),
                hbm_gbps=hbm, quick=args.quick,
                gpu=torch.cuda.get_device_name() if args.device == "cuda" else None)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
