"""``python -m specdec_cuda.train {medusa,mtp,dflash,eagle3,exit} --target DIR (--prompts FILE | --data PATH)``.

Trains a drafter for the target by self-distillation and stores it in the drafter cache, where
``method="medusa"`` / ``"mtp"`` / ``"dflash"`` / ``"ddtree"`` / ``"eagle3"`` find it when no drafter
is passed (``exit``: ``method="layer_skip", adapter=True``). Run the same command again to resume an
interrupted run. See ``specdec_cuda.train``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from . import KINDS, DrafterSpec, train
from .features import DistillSpec
from .loop import LoopSpec


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec_cuda.train", description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--target", required=True, help="the target's checkpoint folder (Hugging Face layout)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="prompts file: .jsonl / .json (strings, or objects with prompt / text / "
                                       "messages) or plain text, one prompt per line")
    src.add_argument("--data", help="a text file or a folder of them: prompts are windows cut at line starts")
    p.add_argument("--held-out", default=None,
                   help="prompts file for the report (default: every 16th prompt, not trained on)")
    p.add_argument("--out", default=None, help="where to save the drafter (default: the drafter cache)")
    p.add_argument("--glob", default="*", help="--data folder: which files (default: all), e.g. '*.py'")
    p.add_argument("--num-prompts", type=int, default=1024, help="--data: prompts cut from the texts (default 1024)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="--data: tokens per prompt (default 64)")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="--prompts: longer prompts keep their end")
    p.add_argument("--chat", choices=("auto", "on", "off"), default="auto",
                   help="--prompts through the tokenizer's chat template (auto: when it has one)")
    p.add_argument("--gen-tokens", type=int, default=None,
                   help=f"tokens the target generates per prompt (default {DistillSpec.gen_tokens}; exit: 0). 0: "
                        "the target only reads the prompts (teacher forcing, one forward per prompt) and its own "
                        "next-token distributions are the labels (exit, eagle3)")
    p.add_argument("--sampled-fraction", type=float, default=DistillSpec.sampled_fraction,
                   help="share of prompts continued by sampling at --temperature (the rest greedily)")
    p.add_argument("--temperature", type=float, default=DistillSpec.temperature)
    p.add_argument("--gen-batch", type=int, default=DistillSpec.batch_size, help="prompts the target continues at once")
    p.add_argument("--steps", type=int, default=LoopSpec.steps)
    p.add_argument("--lr", type=float, default=LoopSpec.lr)
    p.add_argument("--batch-size", type=int, default=LoopSpec.batch_size, help="sequences per training step")
    p.add_argument("--seed", type=int, default=LoopSpec.seed)
    p.add_argument("--checkpoint-seconds", type=float, default=LoopSpec.checkpoint_seconds)
    p.add_argument("--heads", type=int, default=None,
                   help="medusa: heads (default 4); mtp: modules (default 2); dflash: layers (default 2)")
    p.add_argument("--block-size", type=int, default=DrafterSpec.dflash_block_size, help="dflash: block size")
    p.add_argument("--gamma", type=float, default=DrafterSpec.dflash_gamma,
                   help="dflash: decay of the loss's position weights exp(-(i - 1) / gamma); smaller puts the "
                        "training on the first drafted tokens, the ones a chain accepts when the drafter learns "
                        "the target slowly")
    p.add_argument("--ttt-steps", type=int, default=DrafterSpec.eagle3_steps, help="eagle3: rolled-out training steps")
    p.add_argument("--init", default=None,
                   help="eagle3, medusa, mtp: fine-tune this trained drafter (a folder) instead of starting a new "
                        "one")
    p.add_argument("--eagle3-mlp", type=int, default=None,
                   help="eagle3: the drafter's MLP width (default: the target's); narrower drafts faster on a CPU")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="eagle3 / dflash / exit: the draft vocabulary, the N ids most frequent in the training "
                        f"sequences (eagle3 and exit default {DrafterSpec.eagle3_draft_vocab}; dflash default: the "
                        "whole vocabulary)")
    p.add_argument("--dflash-weights", choices=("float32", "bfloat16"), default=DrafterSpec.dflash_weights,
                   help="dflash: the trained drafter's weights as saved (bfloat16: rounded before the held-out "
                        "report; half the bytes its CPU decoding path streams per block)")
    p.add_argument("--exit-layer", type=int, default=None,
                   help="exit: the adapter reads the stream after this many target layers (default ~30%% of them)")
    p.add_argument("--exit-mlp", type=int, default=DrafterSpec.exit_intermediate,
                   help="exit: the adapter's MLP width (0: attention only, as Kangaroo's)")
    p.add_argument("--weights", choices=("safetensors", "gguf"), default="safetensors",
                   help="which weights of the folder the target runs on (models.load)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the target's dtype (bfloat16 with SPECDEC_PACKED_LINEAR=0: torch's bf16 matmuls, AMX)")
    p.add_argument("--autocast", action="store_true", help="train under bfloat16 autocast (LoopSpec.autocast)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    for name in ("draft_vocab", "eagle3_mlp"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1, got {value}", file=sys.stderr)
            return 2
    drafter = DrafterSpec(dflash_block_size=args.block_size, dflash_gamma=args.gamma, eagle3_steps=args.ttt_steps,
                          eagle3_draft_vocab=args.draft_vocab or DrafterSpec.eagle3_draft_vocab,
                          dflash_draft_vocab=args.draft_vocab, dflash_weights=args.dflash_weights,
                          eagle3_intermediate=args.eagle3_mlp, exit_layer=args.exit_layer,
                          exit_intermediate=args.exit_mlp,
                          exit_draft_vocab=args.draft_vocab or DrafterSpec.exit_draft_vocab)
    if args.gen_tokens is None:
        args.gen_tokens = 0 if args.kind == "exit" else DistillSpec.gen_tokens
    if args.heads is not None:
        field = {"medusa": "medusa_heads", "mtp": "mtp_modules", "dflash": "dflash_layers"}.get(args.kind)
        if field is None:
            print(f"error: --heads does not apply to {args.kind}", file=sys.stderr)
            return 2
        setattr(drafter, field, args.heads)
    try:
        train(args.kind, args.target, prompts=args.prompts, data=args.data, held_out=args.held_out, out=args.out, chat=args.chat,
              num_prompts=args.num_prompts, prompt_tokens=args.prompt_tokens, max_prompt_tokens=args.max_prompt_tokens,
              glob=args.glob,
              distill=DistillSpec(gen_tokens=args.gen_tokens, sampled_fraction=args.sampled_fraction,
                                  temperature=args.temperature, batch_size=args.gen_batch, seed=args.seed),
              loop=LoopSpec(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
                            checkpoint_seconds=args.checkpoint_seconds, autocast=args.autocast),
              drafter=drafter, weights=args.weights, dtype=getattr(torch, args.dtype), init=args.init)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
