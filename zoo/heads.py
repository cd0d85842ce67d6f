"""Medusa heads and MTP modules for a zoo target: ``python -m zoo.train --heads``.

The training itself is the library's (``specdec_cuda.train``: self-distillation, cached hidden
states, the losses and the held-out report); what is the zoo's is the data. Prompts of
``prompt_len`` tokens come from the training part of the target's corpus, half mid-text windows
and half ending at a function opening (a ``def`` line and the next: the shape of the benchmark
prompts, whose continuations differ; heads trained on windows alone generalise poorly there).
The report's prompts are windows of the corpus's evaluation split. Results:
``<target folder>/../heads-medusa`` and ``heads-mtp`` (``models.heads`` checkpoints), and
``heads-report.json`` beside them.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch


@dataclass
class HeadsSpec:
    """Sizes and steps; the defaults take about 7 minutes on one core of a busy 2-core machine.

    Against the v4 target, 384 sequences and 200 steps each (the first setting) gave held-out
    top-1 27% (Medusa head 1) and 49% / 45% (MTP modules 1 / 2); three times the sequences and
    500 steps give 34% and 62% / 68%: the heads were short of data, not of capacity.
    """

    medusa_heads: int = 4
    mtp_modules: int = 2
    prompt_len: int = 32
    gen_len: int = 64
    train_sequences: int = 1152
    eval_sequences: int = 48
    batch_size: int = 16
    medusa_steps: int = 500
    mtp_steps: int = 500
    medusa_lr: float = 2e-3
    mtp_lr: float = 2e-3
    seed: int = 0


def zoo_prompts(target_dir: Path, spec: HeadsSpec) -> tuple[list[list[int]], list[list[int]]]:
    """(training prompts, report prompts) as token ids (see the module docstring)."""
    from transformers import PreTrainedTokenizerFast

    from .pairs import DEFAULT_SPEC, EOS, tokenize_split, training_texts

    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    texts = training_texts(target_dir)
    _, train_data, eval_data = tokenize_split(tokenizer, texts, tokenizer.convert_tokens_to_ids(EOS),
                                              DEFAULT_SPEC.eval_tokens)

    def windows(data: torch.Tensor, count: int, seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, data.numel() - spec.prompt_len, (count,), generator=g)
        return [data[s : s + spec.prompt_len].tolist() for s in starts.tolist()]

    held_out_chars = 60000  # the tail that e2e.held_out_prompts draws from: never a training prompt
    train_text = "".join(texts)[:-held_out_chars]

    def openings(count: int, seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        ends = [m.end() for m in re.finditer(r"^[ \t]*def [^\n]*:[ \t]*\n[^\n]*\n", train_text, re.M)]
        rows = []
        for i in torch.randperm(len(ends), generator=g)[:count].tolist():
            ids = tokenizer(train_text[max(0, ends[i] - 400) : ends[i]])["input_ids"]
            if len(ids) >= spec.prompt_len:
                rows.append(ids[-spec.prompt_len:])
        return rows

    n = spec.train_sequences
    train = windows(train_data, n - n // 2, spec.seed) + openings(n // 2, spec.seed)
    return train, windows(eval_data, spec.eval_sequences, spec.seed + 1)


def train_heads(target_dir: str | Path, out_root: str | Path | None = None, spec: HeadsSpec = HeadsSpec(),
                log: Callable[[str], None] = print) -> dict:
    """Train both head sets on the frozen target in ``target_dir``; write ``heads-medusa`` and
    ``heads-mtp`` beside it (or under ``out_root``) and return the report (also ``heads-report.json``)."""
    from specdec_cuda import train

    target_dir = Path(target_dir)
    out_root = Path(out_root) if out_root is not None else target_dir.parent
    started = time.perf_counter()
    prompts, held_out = zoo_prompts(target_dir, spec)
    distill = train.DistillSpec(gen_tokens=spec.gen_len, batch_size=64, seed=spec.seed)
    drafter = train.DrafterSpec(medusa_heads=spec.medusa_heads, mtp_modules=spec.mtp_modules)
    reports = {}
    for kind, steps, lr in (("medusa", spec.medusa_steps, spec.medusa_lr), ("mtp", spec.mtp_steps, spec.mtp_lr)):
        loop = train.LoopSpec(steps=steps, lr=lr, batch_size=spec.batch_size, seed=spec.seed)
        result = train.train(kind, target_dir, prompts=prompts, held_out=held_out, out=out_root / f"heads-{kind}",
                             distill=distill, loop=loop, drafter=drafter, log=log)
        reports[kind] = result.report["held_out"]
    report = {"target": str(target_dir), "spec": asdict(spec), **reports,
              "train_seconds": time.perf_counter() - started}
    (out_root / "heads-report.json").write_text(json.dumps(report, indent=2))
    return report
