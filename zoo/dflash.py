"""The DFlash drafter (``models.dflash``) of a zoo target: ``python -m zoo.train --dflash``.

The training is the library's (``specdec_cuda.train``, ``train.dflash``: self-distillation, the
target's cached hidden states, blocks at random anchors, the position-weighted loss, a warm start
from the target's last layers). What is the zoo's is the data: prompts cut from the training part
of the target's corpus (never its held-out tail), half continued greedily and half sampled at
T = 1, and the report's prompts, the benchmark's held-out ones (``bench.e2e.held_out_prompts``).
The result is a checkpoint folder ``dflash`` beside the target folder with a ``report.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch


@dataclass
class DFlashTrainSpec:
    """Everything that determines the trained drafter: about 17 minutes on one core of an AVX2
    EPYC (the target's continuations and hidden states ~3, 2500 steps ~14).

    A short block and a fast-decaying loss: on the v4 target the recipe of the DFlash paper
    (blocks of 16, gamma 7, 700 steps over 384 sequences) agreed with the target's next token at
    block position 1 only 15% of the time held out, with the later positions near chance, so a
    16-row block paid for 15 drafts that were almost never accepted; blocks of 6 with gamma 2 over
    3x the sequences learn the first positions instead (docs/zoo.md)."""

    num_layers: int = 2
    block_size: int = 6
    gamma: float = 2.0
    prompt_tokens: int = 24
    response_tokens: int = 88
    num_sequences: int = 1152
    batch_size: int = 16
    steps: int = 2500
    lr: float = 2e-3
    heldout_prompts: int = 24
    # The LM head over the 1024 ids most frequent in the training sequences (89% of their tokens;
    # FR-Spec): the block's head ~0.4 ms -> ~0.15 on an AVX2 EPYC, tau unchanged on held-out code
    # (1.41 either way; 512 ids 1.40). docs/benchmarks.md "DFlash and DDTree".
    draft_vocab: int = 1024
    # Weights rounded to bfloat16 after training (the target's own precision): a block's drafting
    # streams half the bytes (propose ~0.04 of a target step less on an AVX2 EPYC), held-out
    # acceptance as with the float32 weights (docs/benchmarks.md "DFlash and DDTree").
    weights: str = "bfloat16"
    seed: int = 0


def default_target_dir() -> Path:
    from . import pairs

    return pairs.default_pair_dir() / "target"


def default_drafter_dir(target_dir=None) -> Path:
    """Where the drafter of ``target_dir`` (default: the zoo target) is cached: beside it."""
    target_dir = Path(target_dir) if target_dir else default_target_dir()
    return target_dir.parent / "dflash"


def train_dflash(target_dir=None, out_dir=None, spec: DFlashTrainSpec = DFlashTrainSpec(),
                 log: Callable[[str], None] = print, force: bool = False) -> Path:
    """Train (once) the drafter of the target in ``target_dir`` and save it to ``out_dir``
    (default: beside the target). Returns the folder. Re-running returns the cached folder."""
    from transformers import AutoTokenizer

    from bench import e2e
    from specdec_cuda import train
    from . import pairs

    target_dir = Path(target_dir) if target_dir else default_target_dir()
    out_dir = Path(out_dir) if out_dir else default_drafter_dir(target_dir)
    if (out_dir / "config.json").is_file() and not force:
        log(f"DFlash drafter cached at {out_dir}")
        return out_dir
    if not (target_dir / "config.json").is_file():
        raise FileNotFoundError(f"{target_dir}: no target checkpoint (train the zoo pair first: python -m zoo.train)")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    eos_id = tokenizer.convert_tokens_to_ids(pairs.EOS)
    _, train_ids, _ = pairs.tokenize_split(tokenizer, pairs.training_texts(target_dir), eos_id,
                                           pairs.DEFAULT_SPEC.eval_tokens)
    g = torch.Generator().manual_seed(spec.seed)
    starts = torch.randint(0, train_ids.numel() - spec.prompt_tokens, (spec.num_sequences,), generator=g)
    prompts = [train_ids[s : s + spec.prompt_tokens].tolist() for s in starts.tolist()]
    held_out = e2e.encode(tokenizer, e2e.held_out_prompts(spec.heldout_prompts))
    started = time.perf_counter()
    train.train("dflash", target_dir, prompts=prompts, held_out=held_out, out=out_dir,
                distill=train.DistillSpec(gen_tokens=spec.response_tokens, sampled_fraction=0.5, temperature=1.0,
                                          batch_size=32, seed=spec.seed),
                loop=train.LoopSpec(steps=spec.steps, lr=spec.lr, batch_size=spec.batch_size, seed=spec.seed),
                drafter=train.DrafterSpec(dflash_layers=spec.num_layers, dflash_block_size=spec.block_size,
                                          dflash_gamma=spec.gamma, dflash_draft_vocab=spec.draft_vocab,
                                          dflash_weights=spec.weights), log=log)
    log(f"DFlash drafter trained in {time.perf_counter() - started:.0f}s")
    return out_dir
