"""Train a drafter for your own target: ``python -m specdec_cuda.train {medusa,mtp,dflash,eagle3,exit}``.

The same from Python::

    from specdec_cuda import train
    result = train.train("medusa", "path/to/target", prompts="prompts.jsonl")
    specdec_cuda.generate(target, ids, method="medusa")   # finds the heads in the drafter cache

Steps (each resumable: run the same command again after an interruption):

1. prompts: the user's (``prompts``: a file, see ``texts``; or token-id lists) or windows cut from
   the user's texts (``data``), chat-templated for instruct models; a fixed part is held out;
2. self-distillation (``features``): the target continues every prompt and its hidden states over
   the sequences are cached on disk once, for every drafter kind and every epoch (with
   ``gen_tokens = 0``, for the kinds of ``TEACHER_FORCED``, it only reads them; a cache of the
   same sequences with more layers serves a kind that reads fewer);
3. the drafter is trained on them (``heads``, ``dflash``, ``eagle3``, ``exit_adapter``: the exit
   adapter of ``method="layer_skip"``, on the stream after its exit layer and by default on the
   target reading the prompts, not continuing them; ``teacher``: the target's head, whose
   distributions label the exit adapter and EAGLE-3 (Medusa and MTP: ``heads``); the shared loop
   ``loop`` writes checkpoints; ``init`` fine-tunes a trained drafter), then scored on the
   held-out prompts (``metrics``: agreement and chain acceptance per draft position);
4. it is saved into the drafter cache under the target's fingerprint (``specdec_cuda.drafters``),
   or to ``out``, with ``report.json`` beside its weights.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..drafters import target_folder
from .features import DistillSpec
from .loop import LoopSpec

KINDS = ("medusa", "mtp", "dflash", "eagle3", "exit")
# The kinds whose labels are the target's own distributions, so they can learn from text the target
# only reads (``DistillSpec.gen_tokens = 0``); DFlash's labels are the tokens it generated.
TEACHER_FORCED = ("exit", "eagle3", "medusa", "mtp")
# The kinds ``init=`` fine-tunes (a drafter trained on one text, tuned on another).
FINE_TUNED = ("eagle3", "medusa", "mtp")


@dataclass
class DrafterSpec:
    """The drafter's size (each kind reads its own fields)."""

    medusa_heads: int = 4
    mtp_modules: int = 2
    dflash_layers: int = 2
    dflash_block_size: int = 16
    dflash_gamma: float = 7.0  # decay of the block loss's position weights exp(-(i - 1) / gamma)
    # The DFlash drafter's own draft vocabulary (FR-Spec): the n ids most frequent in the training
    # sequences, which its LM head then runs over by default; None: the whole vocabulary.
    dflash_draft_vocab: int | None = None
    # "bfloat16": the trained DFlash drafter's weights rounded to bfloat16 before its held-out report
    # and saved so (half the file; the CPU decoding path then streams bfloat16 panels, half the
    # bytes of a block's drafting); "float32": as trained.
    dflash_weights: str = "float32"
    eagle3_steps: int = 7  # EAGLE-3's training-time test: rolled-out steps per position
    eagle3_draft_vocab: int = 32768  # the reduced draft vocabulary (the whole one when it is smaller)
    # EAGLE-3's MLP width (None: the target's, as published drafters have it). Narrower drafts
    # faster where the drafter's weights are read from memory each token, as on a CPU.
    eagle3_intermediate: int | None = None
    exit_layer: int | None = None  # the exit adapter's: after this many target layers (None: ~30% of them)
    exit_intermediate: int = 2048  # the exit adapter's MLP width (0: attention only, Kangaroo's)
    exit_draft_vocab: int = 32768  # the exit adapter's draft vocabulary


@dataclass
class TrainResult:
    folder: Path
    report: dict = field(default_factory=dict)


def _load_target(target, weights: str, dtype: torch.dtype):
    from ..api import as_causal_lm

    if isinstance(target, (str, Path)):
        from .. import models

        folder = Path(target)
        try:
            return models.load(folder, dtype=dtype, weights=weights)
        except models.UnsupportedModelError:  # another architecture: transformers runs it
            from transformers import AutoModelForCausalLM

            return models.HFCausalLM(AutoModelForCausalLM.from_pretrained(folder, dtype=dtype))
    return as_causal_lm(target)


def _prompt_ids(target, prompts, data, tokenizer, chat, num_prompts, prompt_tokens, max_prompt_tokens, glob, seed):
    """Token-id prompts from ``prompts`` (file or id lists) or ``data`` (texts)."""
    from . import texts

    if (prompts is None) == (data is None):
        raise ValueError("give exactly one of prompts= (your prompts) or data= (texts to cut prompts from)")
    if prompts is not None and not isinstance(prompts, (str, Path)):
        ids = [list(map(int, p))[-max_prompt_tokens:] for p in prompts]
        if not all(ids):
            raise ValueError("an empty prompt was given")
        return ids
    if tokenizer is None:
        folder = target_folder(target)
        if folder is None:
            raise ValueError("text prompts need a tokenizer: pass tokenizer=, or a target loaded from its folder")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
    if prompts is not None:
        return texts.encode_prompts(tokenizer, texts.read_prompts(prompts), chat, max_prompt_tokens)
    return texts.prompts_from_texts(tokenizer, texts.read_texts(data, glob), num_prompts, prompt_tokens, seed)


def _eos(target) -> tuple[int, ...]:
    return tuple(int(t) for t in getattr(target, "eos_token_ids", ()) or ())


def train(kind: str, target, *, prompts=None, data=None, held_out=None, out: str | Path | None = None, tokenizer=None,
          chat: str = "auto", num_prompts: int = 1024, prompt_tokens: int = 64, max_prompt_tokens: int = 512,
          glob: str = "*", distill: DistillSpec = DistillSpec(), loop: LoopSpec = LoopSpec(),
          drafter: DrafterSpec = DrafterSpec(), weights: str = "safetensors", dtype: torch.dtype = torch.float32,
          init: str | Path | None = None, log: Callable[[str], None] = print) -> TrainResult:
    """Train a ``kind`` drafter for ``target`` (a checkpoint folder or a loaded model); see the
    module docstring. ``prompts``: a prompts file or token-id lists; ``data``: a text file or folder
    (``num_prompts`` windows of ``prompt_tokens`` tokens are cut from it); ``held_out``: the report's
    prompts (a prompts file or token-id lists; default: a fixed part of the prompts, not trained
    on). ``weights`` / ``dtype``: how a folder is loaded (``models.load``). ``init``: fine-tune this
    trained drafter (``FINE_TUNED`` kinds: a folder in this library's or a published layout; its
    shape, and EAGLE-3's draft vocabulary, are kept) instead of starting a new one. Returns the
    saved folder and the held-out report."""
    from .. import drafters
    from .allocator import bound_allocator_growth
    from .features import cached_features, feature_layers
    from .texts import split_held_out

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if init is not None and kind not in FINE_TUNED:
        raise ValueError(f"init= (fine-tuning a trained drafter) is supported for {', '.join(FINE_TUNED)}, not {kind}")
    if distill.gen_tokens == 0 and kind not in TEACHER_FORCED:
        raise ValueError(f"{kind} learns from the tokens the target generates: gen_tokens 0 (the target only reading "
                         f"the prompts) is for {', '.join(TEACHER_FORCED)}")
    started = time.perf_counter()
    bound_allocator_growth()  # else glibc's heap fragments over the steps' changing shapes (allocator.py)
    model = _load_target(target, weights, dtype)
    fp = drafters.fingerprint(model)
    out = Path(out) if out is not None else drafters.drafter_dir(model, kind)
    log(f"[train] {kind} drafter for {target_folder(model) or type(model).__name__} (fingerprint {fp}) -> {out}")
    ids = _prompt_ids(model, prompts, data, tokenizer, chat, num_prompts, prompt_tokens, max_prompt_tokens, glob,
                      loop.seed)
    if held_out is None:
        train_ids, held_ids = split_held_out(ids)
    else:
        train_ids = ids
        held_ids = _prompt_ids(model, held_out, None, tokenizer, chat, num_prompts, prompt_tokens, max_prompt_tokens,
                               glob, loop.seed)
    layers, eos, config, start = feature_layers(model), _eos(model), None, None
    if kind == "exit":  # the stream after the exit layer and the final hidden state (its teacher's logits)
        from ..models.exit_adapter import ExitAdapterConfig

        config = ExitAdapterConfig.for_target(model, drafter.exit_layer, drafter.exit_intermediate,
                                              min(drafter.exit_draft_vocab, int(model.vocab_size)))
        layers = (config.exit_layer - 1, -1)
    elif kind == "eagle3":
        from ..models.eagle3 import Eagle3Config
        from ..models.published import load_eagle3

        start = None if init is None else load_eagle3(init).attach(model)  # the drafter fine-tuned
        reads = (Eagle3Config.for_target(model) if start is None else start.config).target_layers
        # Teacher forcing is cheap to redo (one forward per window), so its cache holds only what
        # EAGLE-3 reads: its low / middle / high layers and the final state (its labels' logits),
        # not the union every kind reads (a third of the bytes on the 1.5B).
        layers = tuple(sorted({*reads, -1} if distill.gen_tokens == 0 else {*layers, *reads}))
    elif kind in ("medusa", "mtp"):
        start = None if init is None else _heads_to_tune(init, kind, model)
        if distill.gen_tokens == 0:
            layers = (-1,)  # they read the final state alone (a cache with more layers serves too: cached_features)
    root = drafters.write_root() / fp / "features"
    t0 = time.perf_counter()
    features = cached_features(model, train_ids, root, distill, layers, eos, log, "training")
    held_spec = DistillSpec(**dict(asdict(distill), sampled_fraction=0.0))  # greedy: what greedy decoding meets
    held_out = cached_features(model, held_ids, root, held_spec, layers, eos, log, "held-out")
    data_seconds = time.perf_counter() - t0
    log(f"[train] data: {len(features)} training sequences ({features.generated_tokens()} generated tokens of "
        f"{int(features.lengths.sum())}), "
        f"{len(held_out)} held out, ready in {data_seconds:.0f}s")

    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    checkpoint = partial / "checkpoint.pt"
    t1 = time.perf_counter()
    module, report = _train_kind(kind, model, features, held_out, loop, drafter, checkpoint, log, config, start)
    train_seconds = time.perf_counter() - t1
    report = dict(kind=kind, target_fingerprint=fp, target=str(target_folder(model) or ""),
                  training_sequences=len(features), held_out_sequences=len(held_out),
                  generated_tokens=features.generated_tokens(), distill=asdict(distill), loop=asdict(loop),
                  drafter=asdict(drafter), data_seconds=round(data_seconds, 1), train_seconds=round(train_seconds, 1),
                  seconds=round(time.perf_counter() - started, 1), held_out=report)
    _save(kind, module, out, report)
    shutil.rmtree(partial, ignore_errors=True)
    pos = report["held_out"]["positions"]
    top1 = ", ".join(f"{100 * p['top1']:.0f}%" for p in pos)
    chain = ", ".join(f"{100 * p['chain_acceptance']:.0f}%" for p in pos)
    log(f"[train] saved {out} in {report['seconds']:.0f}s; held-out per draft position: top-1 {top1}; chain "
        f"acceptance {chain}; {report['held_out']['mean_accepted']} accepted per greedy step")
    return TrainResult(out, report)


def _heads_to_tune(folder, kind: str, model):
    """The ``kind`` heads of ``folder`` (this library's layout or a published Medusa one), checked
    against the target's width."""
    from ..models.published import load_heads

    heads = load_heads(folder)
    found = "medusa" if hasattr(heads, "num_heads") else "mtp"
    if found != kind:
        raise ValueError(f"init={folder}: holds {found} heads, not {kind}")
    width, theirs = int(model.config.hidden_size), int(heads.config.hidden_size if found == "mtp" else heads.hidden_size)
    if theirs != width:
        raise ValueError(f"init={folder}: heads of width {theirs}, the target's hidden size is {width}")
    return heads


def _train_kind(kind, model, features, held_out, loop, drafter, checkpoint, log, config=None, start=None):
    if kind == "medusa":
        from .heads import train_medusa

        return train_medusa(model, features, drafter.medusa_heads, loop, checkpoint, log, held_out, start)
    if kind == "mtp":
        from .heads import train_mtp

        return train_mtp(model, features, drafter.mtp_modules, loop, checkpoint, log, held_out, start)
    if kind == "dflash":
        from ..models.dflash import DFlashConfig
        from .dflash import train_dflash

        config = DFlashConfig.for_target(model, num_layers=drafter.dflash_layers, block_size=drafter.dflash_block_size,
                                         intermediate_size=int(model.config.intermediate_size))
        return train_dflash(model, features, config, loop, checkpoint, log, held_out, gamma=drafter.dflash_gamma,
                            draft_vocab=drafter.dflash_draft_vocab, weights=drafter.dflash_weights)
    if kind == "exit":
        from .exit_adapter import train_exit

        return train_exit(model, features, config, loop, checkpoint, log, held_out)
    from .eagle3 import train_eagle3

    return train_eagle3(model, features, drafter.eagle3_steps, drafter.eagle3_draft_vocab, loop, checkpoint, log,
                        held_out, intermediate_size=drafter.eagle3_intermediate, start=start)


def _save(kind: str, module, out: Path, report: dict) -> None:
    """Write the drafter and ``report.json`` to ``out`` (through a temporary folder renamed into place)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    extra = {"target_fingerprint": report["target_fingerprint"]}
    if kind in ("medusa", "mtp"):
        from ..models.heads import save_heads

        save_heads(tmp, module, extra)
    else:
        module.config.extra = dict(module.config.extra or {}, **extra)
        module.save(tmp)
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
