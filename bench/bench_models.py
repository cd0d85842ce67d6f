"""Per-token greedy decoding latency: the built-in model vs transformers on one tiny checkpoint.

Usage: python bench/bench_models.py [--quick] [--out PATH] [--threads N] [--device cpu|cuda]

A random-initialised Llama checkpoint (seeded) is saved with ``save_pretrained`` and loaded both
by ``specdec_cuda.models.load`` and by ``transformers``. For batch 1 and 8, each method generates
the same number of tokens greedily from the same prompts:

* ``builtin``   : the built-in model and its static cache, one forward + commit per token;
* ``adapter``   : the same loop over ``HFCausalLM`` (transformers model behind the protocol);
* ``hf_generate``: ``transformers`` ``model.generate(do_sample=False)`` (the baseline).

Each repetition runs the methods one after another (interleaved, so machine noise hits all of
them alike); the table shows median ms per generated token (prefill included, the same for all)
and the ratio against ``hf_generate``. Greedy tokens of all methods are checked to be identical.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from specdec_cuda import models  # noqa: E402

CONFIGS = {
    # Small enough that per-op overhead, not matmul time, dominates on a CPU: the regime where
    # a lean forward matters most.
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),
    "small": dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4),
}


def greedy_protocol(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding over any protocol model: prefill, then one forward + commit per token."""
    B, T = prompts.shape
    device = model.device
    cache = model.new_cache(B, T + new_tokens)
    out = model.forward(prompts, torch.arange(T, device=device).expand(B, T), cache)
    cache.commit(torch.full((B,), T, device=device))
    ones = torch.ones(B, dtype=torch.int64, device=device)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    generated = [token]
    for _ in range(new_tokens - 1):
        out = model.forward(token, cache.lengths[:, None], cache)
        cache.commit(ones)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        generated.append(token)
    return torch.cat(generated, 1)


def hf_generate(hf, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    # No EOS: every method generates exactly new_tokens (min_new_tokens would instead mask the
    # EOS logit and change the greedy choice).
    out = hf.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[:, prompts.shape[1]:]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repetitions")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "models.json"))
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    new_tokens, reps, prompt_len = (24, 3, 16) if args.quick else (64, 7, 32)

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(max_position_embeddings=512, initializer_range=0.1, **CONFIGS[args.config])
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval().to(device)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        builtin = models.load(folder, device=device)
    adapter = models.HFCausalLM(hf)

    methods = {
        "builtin": lambda p: greedy_protocol(builtin, p, new_tokens),
        "adapter": lambda p: greedy_protocol(adapter, p, new_tokens),
        "hf_generate": lambda p: hf_generate(hf, p, new_tokens),
    }
    rows = []
    for batch in (1, 8):
        generator = torch.Generator().manual_seed(batch)
        prompts = torch.randint(1, cfg.vocab_size, (batch, prompt_len), generator=generator).to(device)
        outputs = {name: fn(prompts) for name, fn in methods.items()}  # warm-up and correctness
        same = {name: bool(torch.equal(out, outputs["hf_generate"])) for name, out in outputs.items()}
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(reps):
            for name, fn in methods.items():
                sync(device)
                start = time.perf_counter()
                with torch.no_grad():
                    fn(prompts)
                sync(device)
                times[name].append((time.perf_counter() - start) / new_tokens * 1e3)
        base = statistics.median(times["hf_generate"])
        for name, ts in times.items():
            ms = statistics.median(ts)
            rows.append(dict(
                batch=batch, method=name, ms_per_token=ms, tokens_per_s=batch * 1e3 / ms,
                speedup_vs_hf_generate=base / ms, same_tokens_as_hf_generate=same[name], times_ms=ts,
            ))

    result = dict(
        bench="models", config=args.config, model_config=CONFIGS[args.config], new_tokens=new_tokens,
        prompt_len=prompt_len, reps=reps, device=str(device), threads=torch.get_num_threads(),
        torch=torch.__version__, transformers=transformers.__version__,
        machine=platform.processor() or platform.machine(),
        results=rows,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))

    print(f"greedy decoding, {args.config} Llama ({CONFIGS[args.config]}), {new_tokens} new tokens, "
          f"prompt {prompt_len}, median of {reps}, {device}, {torch.get_num_threads()} threads")
    print(f"{'batch':>5}  {'method':<12} {'ms/token':>9} {'tokens/s':>9} {'vs hf_generate':>15}  same tokens")
    for r in rows:
        print(f"{r['batch']:>5}  {r['method']:<12} {r['ms_per_token']:>9.3f} {r['tokens_per_s']:>9.1f} "
              f"{r['speedup_vs_hf_generate']:>14.2f}x  {r['same_tokens_as_hf_generate']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
