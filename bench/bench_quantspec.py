"""Benchmark QuantSpec: acceptance, speed, KV memory and the attention kernel.

    python bench/bench_quantspec.py [--quick] [--device cpu|cuda] [--target DIR] [--out PATH]
                                    [--parts kernel,matmul,kv_bytes,acceptance,speed] [--speed-reps N]

Five parts, all in one run (JSON + a printed table + a PNG plot beside the JSON):

* ``acceptance``: tau (tokens per target forward) and the acceptance rate of quantspec on the zoo
  target (``--target``, default the v3 pair's target) against the draft length k and against the
  context length (prompts of 512 .. 8k tokens, the held-out text, repeated where shorter; the target was
  trained to its config's max_position_embeddings and RoPE is extrapolated past it), greedy and
  at T = 0.8;
* ``kv_bytes``: KV-cache bytes per token (all layers) of the hierarchical cache against a plain
  float32 / bfloat16 cache;
* ``speed``: tokens/s of quantspec against this engine's autoregressive decoding at batch 1 on a
  GPU-shaped random model (8 layers, width 2048, GQA 4:1) at a 4k-token context: against the
  plain-cache model (``LlamaModel``) and against the same model on the quantised cache
  (``QuantKVModel``, the baseline quantspec's output equals); runs interleaved, medians;
* ``kernel``: ``quant_kv_attention`` against dequantise + SDPA (the ``kv_dequantize_*`` kernels,
  then ``scaled_dot_product_attention``) and against the plain-PyTorch reference, 4k context;
* ``matmul`` (CPU): ``w4a16_matmul`` (the draft's 4-bit linears) and ``skinny_linear`` (the
  quantised-cache forward's float32 linears) against ``F.linear`` at the model's shapes, 1 and 5
  rows, weights streamed from memory.

Timings on a shared CPU are noisy: compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the checkout: zoo/, bench/

import specdec_cuda  # noqa: E402
import timing  # noqa: E402  (bench/timing.py)
from specdec_cuda import models  # noqa: E402
from specdec_cuda.models import QuantKVModel  # noqa: E402
from specdec_cuda.ops import kv_quant as kv  # noqa: E402
from specdec_cuda.ops.quant_attention import quant_kv_attention  # noqa: E402
from specdec_cuda.reference import quant_attention as ref  # noqa: E402
from zoo.pairs import zoo_root  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEFAULT_TARGET = os.path.join(zoo_root(), "pystdlib-v3", "target")  # $SPECDEC_ZOO_DIR or <repo>/.cache/zoo
KEY_GROUP, RESIDUAL = 64, 32


def held_out_ids(target_dir: str) -> list[int]:
    """The zoo's held-out text (the end of the standard-library corpus) as token ids."""
    from transformers import AutoTokenizer

    from zoo import pairs

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    return tokenizer("".join(pairs.stdlib_corpus())[-60000:], add_special_tokens=False)["input_ids"]


def long_prompts(ids: list[int], length: int, rows: int) -> list[list[int]]:
    """``rows`` prompts of ``length`` held-out tokens starting at different places (the text
    repeated where it is shorter)."""
    text = ids * (length // len(ids) + 2)
    step = len(ids) // max(1, rows)
    return [text[r * step : r * step + length] for r in range(rows)]


# -- acceptance on the zoo target --------------------------------------------------------------------

def acceptance(target_dir: str, device: str, quick: bool) -> dict:
    model = models.load(target_dir, device=device)
    target = QuantKVModel(model, key_group=KEY_GROUP, residual=RESIDUAL)
    ids = held_out_ids(target_dir)
    new_tokens = 32 if quick else 64
    rows = []

    decoders = {}

    def one(k, context, temperature):
        prompts = long_prompts(ids, context, 4 if context <= 2048 else 2)  # fewer rows where prefill is long
        if k not in decoders:  # 4-bit weights made once per decoder
            decoders[k] = specdec_cuda.SpeculativeDecoder(target, method="quantspec", k=k, policy="fixed")
        out = decoders[k].generate(prompts, max_new_tokens=new_tokens, temperature=temperature,
                                   seed=list(range(len(prompts))))
        m = out.metrics
        rows.append(dict(k=k, context=context, temperature=temperature, tau=m.tau, acceptance=m.acceptance_rate,
                         rows=len(prompts), drafted=sum(m.drafted),
                         acceptance_per_position=m.acceptance))
        print(f"  k={k} context={context} T={temperature}: tau {m.tau:.2f} acceptance {m.acceptance_rate:.3f}",
              flush=True)

    for temperature in (0.0, 0.8):
        for k in ((2, 4) if quick else (1, 2, 4, 6, 8)):
            one(k, 512, temperature)
        for context in ((1024, 2048) if quick else (1024, 2048, 4096, 8192)):
            one(4, context, temperature)
    return dict(target=target_dir, max_position_embeddings=model.config.max_position_embeddings,
                key_group=KEY_GROUP, residual=RESIDUAL, new_tokens=new_tokens, rows=rows)


# -- memory -------------------------------------------------------------------------------------------

def kv_bytes(configs: dict) -> list[dict]:
    rows = []
    for name, (layers, kv_heads, head_dim) in configs.items():
        cache = models.QuantKVCache(1, 1, 1, KEY_GROUP, head_dim, key_group=KEY_GROUP, residual=RESIDUAL)
        per_head = cache.kv_bytes_per_token()  # codes (K and V, upper + lower) + scales / zeros
        quant = per_head * layers * kv_heads
        fp32, bf16 = 2 * 4 * head_dim * layers * kv_heads, 2 * 2 * head_dim * layers * kv_heads
        rows.append(dict(model=name, quantized=quant, fp32=fp32, bf16=bf16, saved_vs_fp32=1 - quant / fp32,
                         saved_vs_bf16=1 - quant / bf16,
                         buffer_tokens=2 * RESIDUAL + 2 * KEY_GROUP + 16))
    return rows


# -- speed on a GPU-shaped random model ------------------------------------------------------------

def gpu_shaped_model(device: str, layers: int, dtype: torch.dtype, layer_std: float):
    """8 layers of width 2048 with 16 query / 4 KV heads of 128 (GQA 4:1), vocabulary 4096. Random
    weights: std ``layer_std / sqrt(fan_in)`` in the layers, ``2 / sqrt(fan_in)`` for the embeddings
    and LM head (peaked next-token distributions). How much of the layers' output 4-bit noise may
    flip depends on ``layer_std``: the acceptance it gives is reported with the speed, and the zoo
    target's acceptance is the meaningful one."""
    from specdec_cuda.models.config import LlamaConfig

    config = LlamaConfig.from_hf_dict(dict(
        model_type="llama", vocab_size=4096, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=16384,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False))
    with torch.device("meta"):
        model = models.LlamaModel(config, dtype=dtype)
    model = model.to_empty(device=device)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                std = (layer_std if "layers." in name else 2.0) / math.sqrt(p.shape[-1])
                p.copy_((torch.randn(p.shape, generator=g) * std).to(p.dtype))
    return model


def decode_rate(m) -> float:
    """Tokens per second of the decoding steps (prefill excluded)."""
    steps = m.seconds - m.prefill_seconds
    return m.new_tokens_after_prefill / steps if steps > 0 else 0.0


SPEED_CONFIGS = "ar_plain,ar_quantized,quantspec_k4,quantspec_k4_attn,quantspec_k5_attn"


def make_decoder(name: str, model, qmodel):
    """``ar_plain`` (the plain-cache model), ``ar_quantized`` (the quantised-cache model), or
    ``quantspec_k<K>[_attn]`` (quantspec with k = K and its default draft, 4-bit MLPs; ``_attn``:
    the attention projections in 4 bits too, ``draft_attention=True``)."""
    if name == "ar_plain":
        return specdec_cuda.SpeculativeDecoder(model)
    if name == "ar_quantized":
        return specdec_cuda.SpeculativeDecoder(qmodel)
    parts = name.split("_")
    if len(parts) in (2, 3) and parts[0] == "quantspec" and parts[1][:1] == "k" and parts[1][1:].isdigit() and (
            len(parts) == 2 or parts[2] == "attn"):
        return specdec_cuda.SpeculativeDecoder(qmodel, method="quantspec", k=int(parts[1][1:]),
                                               draft_attention=len(parts) == 3, policy="fixed")
    raise ValueError(f"unknown speed configuration {name!r} (ar_plain, ar_quantized, quantspec_k<K>[_attn])")


def speed(device: str, quick: bool, context: int, layer_std: float, reps: int = 2,
          configs: str = SPEED_CONFIGS) -> dict:
    layers = 2 if quick else 8
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    # Both baselines always: the plain cache (the honest one) and the quantised cache (the one
    # quantspec's output must equal, token for token).
    configs = ["ar_plain", "ar_quantized"] + [c for c in configs.split(",") if c and c not in ("ar_plain", "ar_quantized")]
    model = gpu_shaped_model(device, layers, dtype, layer_std)
    qmodel = QuantKVModel(model, key_group=KEY_GROUP, residual=RESIDUAL)
    prompt = torch.randint(4, 4096, (context,), generator=torch.Generator().manual_seed(1)).tolist()
    new_tokens = 24 if quick else 48
    # One decoder per configuration: the 4-bit weights are made once, as a server would.
    runs = {name: make_decoder(name, model, qmodel) for name in configs}
    rates = {name: [] for name in runs}
    taus, accept, tokens, step_s, propose_s = {}, {}, {}, {}, {}
    for rep in range(1 if quick else reps):
        for name, decoder in runs.items():  # interleaved repeats
            out = decoder.generate([prompt], max_new_tokens=new_tokens)
            m = out.metrics
            rates[name].append(decode_rate(m))
            taus[name], accept[name], tokens[name] = m.tau, m.acceptance_rate, out.tokens[0]
            step_s[name] = m.target_seconds / max(1, m.target_forwards)
            propose_s[name] = m.propose_seconds / max(1, m.target_forwards)
            print(f"  {name} rep {rep}: {rates[name][-1]:.2f} tok/s (decode) tau {m.tau:.2f} acceptance "
                  f"{m.acceptance_rate:.2f}, prefill {m.prefill_seconds:.1f} s", flush=True)
    tps = {name: statistics.median(v) for name, v in rates.items()}
    return dict(layers=layers, hidden=2048, heads=16, kv_heads=4, context=context, dtype=str(dtype),
                layer_std=layer_std, new_tokens=new_tokens, tokens_per_s=tps, tau=taus, acceptance=accept,
                verify_step_s=step_s, propose_s=propose_s,
                speedup_vs_ar_plain={n: tps[n] / tps["ar_plain"] for n in tps},
                speedup_vs_ar_quantized={n: tps[n] / tps["ar_quantized"] for n in tps},
                quantspec_equals_ar_quantized={n: tokens[n] == tokens["ar_quantized"] for n in tokens
                                               if n.startswith("quantspec")})


# -- the linear layers: W4 and the skinny float32 kernel against F.linear ---------------------------

def matmul(quick: bool) -> list[dict]:
    """``w4a16_matmul`` (the draft pass's 4-bit linears) and ``skinny_linear`` (the quantised-cache
    forward's float32 linears) against ``F.linear`` at the GPU-shaped model's shapes, 1 and 5
    rows; weights rotated over copies larger than the caches (each call streams its weight from
    memory, as in a forward). CPU only."""
    from specdec_cuda.ops import quant as qops
    from specdec_cuda.ops.skinny_linear import skinny_linear

    rows = []
    reps = 5 if quick else 15
    for n_out, k_in in ((2048, 2048), (2048, 5632), (11264, 2048)):
        copies = max(2, int(256e6 // (n_out * k_in * 4)))  # >= 256 MB of float32 weights in rotation
        weights = [torch.randn(n_out, k_in) / math.sqrt(k_in) for _ in range(copies)]
        packed = [qops.quantize_w4(w, 128, device="cpu") for w in weights]
        for m in (1, 5):
            x = torch.randn(m, k_in)
            fns = {"f_linear": lambda r: torch.nn.functional.linear(x, weights[r % copies]),
                   "skinny": lambda r: skinny_linear(x, weights[r % copies]),
                   "w4": lambda r: qops.w4a16_matmul(x, packed[r % copies])}
            times = {name: [] for name in fns}
            for rep in range(reps):  # interleaved
                for name, fn in fns.items():
                    times[name].append(timing.time_cpu(lambda r, fn=fn, rep=rep: fn(rep * 3 + r), 3, warmup=0))
            med = {name: statistics.median(v) for name, v in times.items()}
            row = dict(n=n_out, k=k_in, m=m, seconds=med, w4_vs_f_linear=med["f_linear"] / med["w4"],
                       skinny_vs_f_linear=med["f_linear"] / med["skinny"],
                       f_linear_gb_s=n_out * k_in * 4 / med["f_linear"] / 1e9,
                       w4_gb_s=n_out * k_in / 2 / med["w4"] / 1e9)
            rows.append(row)
            print(f"  {n_out}x{k_in} M={m}: F.linear {med['f_linear'] * 1e3:.2f} ms, skinny {med['skinny'] * 1e3:.2f} ms "
                  f"({row['skinny_vs_f_linear']:.2f}x), w4 {med['w4'] * 1e3:.2f} ms ({row['w4_vs_f_linear']:.2f}x)",
                  flush=True)
        del weights, packed
    return rows


# -- the attention kernel ----------------------------------------------------------------------------

def kernel(device: str, quick: bool, context: int) -> list[dict]:
    B, Hq, Hkv, D = 1, 16, 4, 128
    cap, Fs = context, 2 * RESIDUAL + 2 * KEY_GROUP + 16
    cache = kv.allocate_kv_cache(B, Hkv, cap, D, KEY_GROUP, 32, device=device)
    k_all = torch.randn(B, Hkv, cap, D, device=device)
    v_all = torch.randn(B, Hkv, cap, D, device=device)
    kv.kv_quantize_keys(k_all, 0, KEY_GROUP, cache["k_upper"], cache["k_lower"], cache["k_scale"], cache["k_zero"])
    kv.kv_quantize_values(v_all, 0, 32, cache["v_upper"], cache["v_lower"], cache["v_scale"], cache["v_zero"])
    rows = []
    reps = 5 if quick else 15
    for n in (1, 5):
        length = context - n
        start = (length - 2 * RESIDUAL) // KEY_GROUP * KEY_GROUP
        quant = (length - RESIDUAL) // KEY_GROUP * KEY_GROUP
        q = torch.randn(B, Hq, n, D, device=device)
        kb = torch.randn(B, Hkv, Fs, D, device=device)
        vb = torch.randn(B, Hkv, Fs, D, device=device)
        ql = torch.full((B, n), quant, dtype=torch.int64, device=device)
        bs = torch.tensor([start], device=device)
        ln = torch.tensor([length], device=device)
        for use_lower in (False, True):
            fused = lambda: quant_kv_attention(q, cache, kb, vb, ql, bs, ln, key_group=KEY_GROUP, value_group=32,  # noqa: E731
                                               use_lower=use_lower)

            def dequant_sdpa():
                kq = kv.kv_dequantize_keys(cache["k_upper"], cache["k_lower"], cache["k_scale"], cache["k_zero"],
                                           KEY_GROUP, quant, use_lower)
                vq = kv.kv_dequantize_values(cache["v_upper"], cache["v_lower"], cache["v_scale"], cache["v_zero"],
                                             32, quant, use_lower)
                tail = slice(quant - start, length + n - start)
                keys = torch.cat([kq, kb[:, :, tail]], 2)
                values = torch.cat([vq, vb[:, :, tail]], 2)
                mask = torch.ones(n, keys.shape[2], dtype=torch.bool, device=device).tril(keys.shape[2] - n)
                return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                                        enable_gqa=True)

            torch.testing.assert_close(fused(), dequant_sdpa(), rtol=1e-4, atol=1e-4)
            cuda = device == "cuda"
            t = (timing.time_cuda if cuda else timing.time_cpu)
            # Interleaved: one timing of each per round, medians over the rounds (a busy CPU's
            # load moves both alike).
            fused_times, base_times = [], []
            for _ in range(reps):
                fused_times.append(t(lambda _r: fused(), 3, warmup=1))
                base_times.append(t(lambda _r: dequant_sdpa(), 3, warmup=1))
            t_fused, t_base = statistics.median(fused_times), statistics.median(base_times)
            row = dict(n=n, context=context, use_lower=use_lower, fused_s=t_fused, dequant_sdpa_s=t_base,
                       speedup_vs_dequant_sdpa=t_base / t_fused)
            if not cuda and n == 1:
                cpu = {k: v.cpu() for k, v in cache.items()}
                t_ref = timing.time_cpu(lambda _r: ref.quant_kv_attention(
                    q, cpu, kb, vb, ql, bs, ln, None, KEY_GROUP, 32, use_lower, D ** -0.5), 3 if quick else 5)
                row.update(reference_s=t_ref, speedup_vs_reference=t_ref / t_fused)
            rows.append(row)
            print(f"  kernel n={n} lower={use_lower}: fused {t_fused * 1e3:.2f} ms, dequant+SDPA "
                  f"{t_base * 1e3:.2f} ms ({t_base / t_fused:.2f}x)", flush=True)
    return rows


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    rows = result["acceptance"]["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for temperature, style in ((0.0, "o-"), (0.8, "s--")):
        by_k = sorted((r["k"], r["acceptance"]) for r in rows if r["temperature"] == temperature and r["context"] == 512)
        by_c = sorted((r["context"], r["acceptance"]) for r in rows if r["temperature"] == temperature and r["k"] == 4)
        axes[0].plot(*zip(*by_k), style, label=f"T={temperature}")
        axes[1].plot(*zip(*by_c), style, label=f"T={temperature}")
    axes[0].set(xlabel="draft length k (context 512)", ylabel="acceptance rate", title="quantspec: acceptance vs k")
    axes[1].set(xlabel="context tokens (k = 4)", ylabel="acceptance rate", xscale="log", title="vs context")
    contexts = sorted({r["context"] for r in rows})
    axes[1].set_xticks(contexts, [str(c) for c in contexts])
    axes[1].minorticks_off()
    for ax in axes:
        ax.axhline(0.85, color="gray", lw=0.5)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer points, a 2-layer speed model")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--target", default=DEFAULT_TARGET, help="zoo target folder (default: the v3 target)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "quantspec.json"))
    parser.add_argument("--parts", default="kernel,matmul,kv_bytes,acceptance,speed")
    parser.add_argument("--speed-reps", type=int, default=2, help="interleaved repeats of the speed runs")
    parser.add_argument("--speed-configs", default=SPEED_CONFIGS,
                        help=f"comma-separated speed runs (default {SPEED_CONFIGS})")
    parser.add_argument("--layer-std", type=float, default=0.2,
                        help="the speed model's layer weights: std layer_std / sqrt(fan_in) (default 0.2)")
    args = parser.parse_args()
    torch.manual_seed(0)
    parts = args.parts.split(",")
    result: dict = dict(device=args.device, quick=args.quick, torch_threads=torch.get_num_threads())
    started = time.time()
    if "kernel" in parts:
        print("kernel: quant_kv_attention vs dequantise + SDPA at 4k context")
        result["kernel"] = kernel(args.device, args.quick, 4096)
    if "matmul" in parts and args.device == "cpu":
        print("matmul: w4a16_matmul and skinny_linear vs F.linear (weights streamed from memory)")
        result["matmul"] = matmul(args.quick)
    if "kv_bytes" in parts:
        zoo = models.load(args.target).config if os.path.isdir(args.target) else None
        configs = {"gpu-shaped (8 x 4 KV heads x 128)": (8, 4, 128)}
        if zoo is not None:
            configs["zoo target"] = (pairs.num_hidden_layers, pairs.num_key_value_heads, pairs.head_dim)
        result["kv_bytes"] = kv_bytes(configs)
    if "acceptance" in parts:
        if os.path.isdir(args.target):
            print(f"acceptance on {args.target}")
            result["acceptance"] = acceptance(args.target, args.device, args.quick)
        else:
            print(f"no zoo target at {args.target}: acceptance skipped")
    if "speed" in parts:
        print("speed on a GPU-shaped random model at 4k context")
        result["speed"] = speed(args.device, args.quick, 4096, args.layer_std, args.speed_reps, args.speed_configs)
    result["seconds"] = time.time() - started
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nresults: {args.out}")
    for row in result.get("kernel", []):
        print(f"kernel n={row['n']} lower={row['use_lower']}: {row['speedup_vs_dequant_sdpa']:.2f}x vs dequant+SDPA"
              + (f", {row['speedup_vs_reference']:.1f}x vs reference" if "speedup_vs_reference" in row else "")
              + "  (target >= 2x at 4k on CPU)")
    for row in result.get("matmul", []):
        print(f"matmul {row['n']}x{row['k']} M={row['m']}: w4 {row['w4_vs_f_linear']:.2f}x, skinny "
              f"{row['skinny_vs_f_linear']:.2f}x vs F.linear (F.linear {row['f_linear_gb_s']:.1f} GB/s, "
              f"w4 {row['w4_gb_s']:.1f} GB/s of packed weight)")
    for row in result.get("kv_bytes", []):
        print(f"KV bytes/token {row['model']}: {row['quantized']:.0f} vs fp32 {row['fp32']} / bf16 {row['bf16']} "
              f"(saves {row['saved_vs_fp32']:.0%} / {row['saved_vs_bf16']:.0%})")
    if "acceptance" in result:
        print(f"\nacceptance on the zoo target (target: >= 0.85 greedy)\n{'k':>3} {'context':>8} {'T':>4} {'tau':>6} {'accept':>7}")
        for r in result["acceptance"]["rows"]:
            print(f"{r['k']:>3} {r['context']:>8} {r['temperature']:>4} {r['tau']:>6.2f} {r['acceptance']:>7.3f} "
                  f"({r['drafted']} drafts, {r['rows']} rows)")
        plot(result, os.path.splitext(args.out)[0] + ".png")
    if "speed" in result:
        s = result["speed"]
        print(f"\nspeed, batch 1, {s['layers']} layers x 2048, GQA 4:1, {s['context']}-token context (decode steps only)")
        for name, tps in s["tokens_per_s"].items():
            print(f"{name:<22} {tps:8.2f} tok/s  tau {s['tau'][name]:.2f} acc {s['acceptance'][name]:.2f}  "
                  f"{s['speedup_vs_ar_plain'][name]:.2f}x vs AR "
                  f"(plain cache), {s['speedup_vs_ar_quantized'][name]:.2f}x vs AR (quantised cache)")
        print("target: >= 1.8x over autoregressive at batch 1, 4k context")


if __name__ == "__main__":
    main()
