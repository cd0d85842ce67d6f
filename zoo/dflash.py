"""Train the DFlash drafter (``models.dflash``) on a frozen zoo target: ``python -m zoo.train --dflash``.

Recipe (DFlash, Chen et al. 2026):

1. Data the target would say: prompts cut from the training part of the corpus (the standard
   library text the zoo target was trained on, never its held-out tail), each continued by the
   target itself (half greedy, half sampled at T = 1), so the drafter learns the target's outputs.
2. The frozen target runs once over every sequence; its hidden states at the drafter's
   ``target_layers`` are kept (the context features are recomputed through the trainable
   projection at each step).
3. Per sequence, random anchor positions inside the response; each anchor is one block
   ``[x_anchor, MASK x (blk - 1)]``. All blocks of a sequence go through one forward under the
   block mask (``DFlashDrafter.train_forward``): a block sees the context features strictly
   before its anchor, itself bidirectionally, and no other block.
4. Cross-entropy without label shift (block position ``i`` predicts ``x_{anchor + i}``), position
   0 excluded, position ``i`` weighted by ``exp(-(i - 1) / gamma)`` (early positions decide the
   accepted length).

The drafter's decoder layers start from the target's last layers where shapes allow (a warm
start; the attention then learns to read the injected context). The result is a checkpoint folder
``dflash`` beside the target folder (``<zoo>/pystdlib-v3/dflash`` by default) with a
``report.json``: held-out per-position agreement with the target's greedy continuation.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class DFlashTrainSpec:
    """Everything that determines the trained drafter: about 9.5 minutes on one core of a busy
    2-core machine (regenerating the responses ~2.5, the target's hidden states, 700 steps ~6.5)."""

    num_layers: int = 2
    block_size: int = 16
    num_target_layers: int = 4
    prompt_tokens: int = 24
    response_tokens: int = 88
    num_sequences: int = 384
    anchors_per_sequence: int = 8
    batch_size: int = 16
    steps: int = 700
    lr: float = 2e-3
    gamma: float = 7.0  # the paper's choice for blocks of 16
    heldout_prompts: int = 24
    seed: int = 0


def default_target_dir() -> Path:
    from . import pairs

    return pairs.default_pair_dir() / "target"


def default_drafter_dir(target_dir=None) -> Path:
    """Where the drafter of ``target_dir`` (default: the zoo target) is cached: beside it."""
    target_dir = Path(target_dir) if target_dir else default_target_dir()
    return target_dir.parent / "dflash"


def _log(line: str) -> None:
    print(line, flush=True)


@torch.no_grad()
def regenerate(target, prompts: torch.Tensor, new_tokens: int, temperature: float, seed: int) -> torch.Tensor:
    """Each prompt continued by the target. Shape: prompts [B, P] -> [B, P + new_tokens]."""
    from specdec_cuda.decoding import SamplingParams, decode

    params = SamplingParams.make(prompts.shape[0], temperature, 0, 1.0, list(range(seed, seed + prompts.shape[0])))
    out = decode(target, prompts.tolist(), params, new_tokens)
    rows = [p + o + [0] * (new_tokens - len(o)) for p, o in zip(prompts.tolist(), out.tokens)]
    return torch.tensor(rows, dtype=torch.int64)


@torch.no_grad()
def target_hidden(target, tokens: torch.Tensor, layers, batch: int = 32) -> torch.Tensor:
    """The target's hidden states at ``layers``, concatenated. Shape: tokens [N, L] -> [N, L, k*H]."""
    chunks = []
    N, L = tokens.shape
    for i in range(0, N, batch):
        part = tokens[i:i + batch]
        cache = target.new_cache(part.shape[0], L)
        out = target.forward(part, torch.arange(L).expand(part.shape[0], L), cache, hidden_layers=tuple(layers))
        chunks.append(torch.cat([out.hidden_states[l] for l in layers], dim=-1))
    return torch.cat(chunks)


def block_loss(drafter, tokens, hidden, anchors, gamma: float) -> torch.Tensor:
    """Weighted CE of all blocks (no label shift, position 0 excluded, labels past the end dropped).

    Shape: tokens [B, L]; hidden [B, L, k*H] (concatenated target states); anchors [B, A]."""
    blk, L = drafter.config.block_size, tokens.shape[1]
    layers = drafter.config.target_layers
    H = drafter.config.hidden_size
    feats = drafter.context_features({l: hidden[..., i * H:(i + 1) * H] for i, l in enumerate(layers)})
    logits = drafter.train_forward(tokens, feats, anchors)[:, :, 1:]  # [B, A, blk - 1, V]
    pos = anchors[:, :, None] + torch.arange(1, blk)  # [B, A, blk - 1]
    valid = pos < L
    labels = tokens.gather(1, pos.clamp(max=L - 1).flatten(1)).view_as(pos)
    weight = torch.exp(-torch.arange(blk - 1, dtype=torch.float32) / gamma)[None, None] * valid
    ce = F.cross_entropy(logits.flatten(0, 2).float(), labels.flatten(), reduction="none").view_as(pos)
    return (ce * weight).sum() / weight.sum()


def _warm_start(drafter, target) -> int:
    """Copy the target's last decoder layers into the drafter's where shapes agree; returns how many."""
    if not hasattr(target, "layers"):
        return 0
    copied = 0
    c = drafter.config
    with torch.no_grad():
        for layer, src in zip(drafter.layers, list(target.layers)[-c.num_layers:]):
            attn, mlp = src.self_attn, src.mlp
            q, k, v = attn.qkv_proj.weight.split([layer.q_proj.out_features, layer.k_proj.out_features,
                                                  layer.v_proj.out_features])
            pairs = [(layer.q_proj.weight, q), (layer.k_proj.weight, k), (layer.v_proj.weight, v),
                     (layer.o_proj.weight, attn.o_proj.weight), (layer.gate_up.weight, mlp.gate_up_proj.weight),
                     (layer.down.weight, mlp.down_proj.weight), (layer.input_norm, src.input_layernorm.weight),
                     (layer.post_norm, src.post_attention_layernorm.weight)]
            if all(dst.shape == s.shape for dst, s in pairs):
                for dst, s in pairs:
                    dst.copy_(s.float())
                copied += 1
    return copied


@torch.no_grad()
def agreement(drafter, target, prompts: list[list[int]], new_tokens: int, blocks: int = 8) -> dict:
    """Held-out agreement with the target: per block position ``i``, how often the drafter's argmax
    equals the target's greedy token, over anchors spread across the target's greedy continuations;
    also the mean accepted run length per block (greedy chain acceptance)."""
    blk = drafter.config.block_size
    P = min(len(p) for p in prompts)
    seqs = regenerate(target, torch.tensor([p[:P] for p in prompts]), new_tokens, 0.0, 0)
    hidden = target_hidden(target, seqs, drafter.config.target_layers)
    L = seqs.shape[1]
    anchors = torch.linspace(P - 1, L - blk, blocks).round().long().expand(seqs.shape[0], blocks)
    H = drafter.config.hidden_size
    feats = drafter.context_features({l: hidden[..., i * H:(i + 1) * H].to(drafter.dtype)
                                      for i, l in enumerate(drafter.config.target_layers)})
    guess = drafter.train_forward(seqs, feats, anchors)[:, :, 1:].argmax(-1)  # [B, A, blk - 1]
    labels = seqs.gather(1, (anchors[:, :, None] + torch.arange(1, blk)).flatten(1)).view_as(guess)
    match = (guess == labels).float()
    run = match.cumprod(-1).sum(-1)  # accepted drafts per block
    return dict(per_position=[round(float(x), 4) for x in match.mean((0, 1))],
                mean_accepted_per_block=round(float(run.mean()), 3), blocks=int(match.shape[0] * match.shape[1]))


def train_dflash(target_dir=None, out_dir=None, spec: DFlashTrainSpec = DFlashTrainSpec(),
                 log: Callable[[str], None] = _log, force: bool = False) -> Path:
    """Train (once) the drafter of the target in ``target_dir`` and save it to ``out_dir``
    (default: beside the target). Returns the folder. Re-running returns the cached folder."""
    from bench import e2e
    from specdec_cuda import models
    from . import pairs
    from specdec_cuda.models.dflash import DFlashConfig, DFlashDrafter

    target_dir = Path(target_dir) if target_dir else default_target_dir()
    out_dir = Path(out_dir) if out_dir else default_drafter_dir(target_dir)
    if (out_dir / "config.json").is_file() and not force:
        log(f"DFlash drafter cached at {out_dir}")
        return out_dir
    if not (target_dir / "config.json").is_file():
        raise FileNotFoundError(f"{target_dir}: no target checkpoint (train the zoo pair first: python -m zoo.train)")
    torch.manual_seed(spec.seed)
    start = time.perf_counter()
    target = models.load(target_dir, dtype=torch.float32)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    eos_id = tokenizer.convert_tokens_to_ids(pairs.EOS)
    _, train_ids, _ = pairs.tokenize_split(tokenizer, pairs.training_texts(target_dir), eos_id,
                                       pairs.DEFAULT_SPEC.eval_tokens)

    # 1. Prompts from the training text, continued by the target (half greedy, half sampled).
    g = torch.Generator().manual_seed(spec.seed)
    starts = torch.randint(0, train_ids.numel() - spec.prompt_tokens, (spec.num_sequences,), generator=g)
    prompts = torch.stack([train_ids[s:s + spec.prompt_tokens] for s in starts.tolist()])
    seqs = []
    chunk = 32
    for i in range(0, spec.num_sequences, chunk):
        temperature = 0.0 if (i // chunk) % 2 == 0 else 1.0
        seqs.append(regenerate(target, prompts[i:i + chunk], spec.response_tokens, temperature, spec.seed + i))
        done = min(i + chunk, spec.num_sequences)
        log(f"  regenerating responses {done}/{spec.num_sequences}  elapsed {time.perf_counter() - start:5.0f}s")
    tokens = torch.cat(seqs)

    # 2. The frozen target's hidden states, once.
    config = DFlashConfig.for_target(target, num_layers=spec.num_layers, block_size=spec.block_size,
                                     num_target_layers=spec.num_target_layers,
                                     intermediate_size=target.config.intermediate_size)
    hidden = target_hidden(target, tokens, config.target_layers)
    log(f"  target hidden states {tuple(hidden.shape)} (layers {list(config.target_layers)})  "
        f"elapsed {time.perf_counter() - start:5.0f}s")

    # 3-4. Blocks at random anchors inside the responses, weighted CE.
    drafter = DFlashDrafter.random(config, seed=spec.seed).attach(target)
    warm = _warm_start(drafter, target)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0, betas=(0.9, 0.95))
    L, lo = tokens.shape[1], spec.prompt_tokens - 1
    train_start = time.perf_counter()
    for step in range(1, spec.steps + 1):
        lr = spec.lr * min(1.0, step / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / spec.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        rows = torch.randint(0, tokens.shape[0], (spec.batch_size,), generator=g)
        anchors = torch.randint(lo, L - 1, (spec.batch_size, spec.anchors_per_sequence), generator=g)
        loss = block_loss(drafter, tokens[rows], hidden[rows], anchors, spec.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 10 == 0 or step == spec.steps:
            elapsed = time.perf_counter() - train_start
            log(f"  dflash step {step:4d}/{spec.steps}  loss {loss.item():6.3f}  elapsed {elapsed:5.0f}s  "
                f"ETA {elapsed / step * (spec.steps - step):5.0f}s")

    drafter.eval()
    heldout = e2e.encode(tokenizer, e2e.held_out_prompts(spec.heldout_prompts))
    report = dict(spec=asdict(spec), target_dir=str(target_dir), warm_started_layers=warm,
                  seconds=round(time.perf_counter() - start, 1),
                  heldout_agreement=agreement(drafter, target, heldout, spec.response_tokens))
    drafter.config.extra = dict(report=report)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    drafter.save(tmp)
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    a = report["heldout_agreement"]
    log(f"DFlash drafter saved to {out_dir}: held-out agreement per position "
        f"{[f'{100 * x:.0f}%' for x in a['per_position']]}, {a['mean_accepted_per_block']} accepted per block")
    return out_dir
