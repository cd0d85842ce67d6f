"""What ranking the target's LM head costs a drafter that drafts through it (Medusa heads, MTP
modules, a DFlash block), over the whole vocabulary and over draft vocabularies (FR-Spec), as a
multiple of the target's one-token step.

    python bench/bench_head_rank.py [--model DIR|NAME] [--weights gguf|safetensors] [--rows 1,4]
                                    [--draft-vocab 32768,16384] [--threads 2] [--repeats 7]

Rows are drafted positions ranked in one call (``TargetHead.topk``, k = 1: Medusa's four heads are
4 rows); a draft vocabulary of N is ids 0 .. N - 1 (the merge order of a byte-level BPE vocabulary,
about its frequency order; ``models.draft_vocab``). The head is held as the target holds it (GGUF
blocks, packed panels). Medians of ``--repeats`` calls after one warm-up. ``--model`` takes a
folder or a registry name (default ``qwen2.5-coder-1.5b``); absent, the bench says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench/

from bench.bench_real_step import find_model  # noqa: E402
from bench.timing import time_cpu  # noqa: E402
from specdec_cuda import models  # noqa: E402
from specdec_cuda.models.draft_vocab import target_vocab_subset  # noqa: E402
from specdec_cuda.models.heads import target_head  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    return 1e3 * time_cpu(lambda _: fn(), repeats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--weights", choices=("gguf", "safetensors"), default="gguf")
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--draft-vocab", default="32768,16384")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = find_model(args.model)
    if folder is None:
        print(f"{args.model}: not found; `python -m specdec_cuda models fetch {args.model}` first")
        return 0
    model = models.load(folder, weights=args.weights)
    cache = model.new_cache(1, 128)
    model.forward(torch.randint(0, 1000, (1, 64)), torch.arange(64)[None], cache)
    step = median_ms(lambda: model.forward(torch.tensor([[5]]), torch.tensor([[64]]), cache), args.repeats)
    print(f"{folder.name} ({args.weights}, {args.threads} threads): one-token step {step:.1f} ms")
    heads = {"whole vocabulary": target_head(model)}
    for n in (int(v) for v in args.draft_vocab.split(",") if v):
        head = target_head(model)
        head.vocab = target_vocab_subset(model, n, head.lm_head)
        heads[f"draft vocabulary {n}"] = head
    print(f"{'head':28s} {'rows':>4s} {'ms':>7s} {'/ step':>7s}")
    for rows in (int(r) for r in args.rows.split(",")):
        h = torch.randn(rows, model.hidden_size, generator=torch.Generator().manual_seed(rows))
        for name, head in heads.items():
            ms = median_ms(lambda: head.topk(h, 1), args.repeats)
            print(f"{name:28s} {rows:4d} {ms:7.1f} {ms / step:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
