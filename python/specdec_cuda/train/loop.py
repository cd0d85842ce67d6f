"""The optimisation loop every drafter kind shares: AdamW with warm-up and cosine decay, gradient
clipping, progress with an ETA, and checkpoints that let an interrupted run resume where it was.

Resuming is exact: a step's batch is drawn from a generator seeded by (seed, step), so a run
stopped at step s and restarted draws the batches it would have drawn, and the checkpoint holds
the parameters, the optimiser's moments and the step.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch


@dataclass(frozen=True)
class LoopSpec:
    steps: int = 500
    lr: float = 2e-3
    batch_size: int = 16
    seed: int = 0
    checkpoint_seconds: float = 300.0  # how often a checkpoint is written (and at the end)
    # Forward and loss under bfloat16 autocast (the parameters and optimiser stay float32): several
    # times faster where the matrix units take bf16 (AMX, recent GPUs), a little less precise.
    autocast: bool = False


def learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of the steps, then cosine decay to a tenth of ``peak``."""
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


def batch_rows(step: int, n: int, spec: LoopSpec) -> torch.Tensor:
    """The training sequences of ``step``: ``batch_size`` indices below ``n``, fixed by (seed, step)."""
    g = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
    return torch.randint(0, n, (spec.batch_size,), generator=g)


def optimise(module: torch.nn.Module, loss_fn: Callable[[torch.Tensor, int], torch.Tensor], n: int, spec: LoopSpec,
             checkpoint: str | Path, log: Callable[[str], None] = print, what: str = "drafter") -> float:
    """Train ``module``'s trainable parameters on ``loss_fn(rows, step)`` for ``spec.steps`` steps
    over ``n`` sequences (``step`` seeds any other randomness of the step, e.g. DFlash's anchors), resuming from ``checkpoint`` when it holds a run of the same spec. Returns
    the mean loss of the last tenth of the steps."""
    checkpoint = Path(checkpoint)
    params = [p for p in module.parameters() if p.requires_grad]
    device = params[0].device
    opt = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    start, recent = 0, []
    if checkpoint.is_file():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if state.get("spec") == asdict(spec):
            module.load_state_dict(state["module"])
            opt.load_state_dict(state["optimizer"])
            start, recent = int(state["step"]), list(state.get("recent", []))
            log(f"[train] {what}: resuming at step {start}/{spec.steps} from {checkpoint}")
        else:
            log(f"[train] {what}: {checkpoint} is from other settings; starting over")

    def save(step: int) -> None:
        tmp = checkpoint.with_suffix(".tmp")
        torch.save(dict(spec=asdict(spec), step=step, module=module.state_dict(), optimizer=opt.state_dict(),
                        recent=recent), tmp)
        tmp.rename(checkpoint)

    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    began = last_save = time.perf_counter()
    every = max(1, spec.steps // 20)
    tail = max(1, spec.steps // 10)
    window = []
    for step in range(start, spec.steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, spec.steps, spec.lr)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.autocast):
            loss = loss_fn(batch_rows(step, n, spec), step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        value = float(loss.detach())
        window.append(value)
        recent = (recent + [value])[-tail:]
        done = step + 1
        if done % every == 0 or done == spec.steps:
            elapsed = time.perf_counter() - began
            eta = elapsed / (done - start) * (spec.steps - done)
            log(f"[train] {what} step {done:5d}/{spec.steps}  loss {sum(window) / len(window):7.4f}  "
                f"elapsed {elapsed:6.0f}s  ETA {eta:6.0f}s")
            window = []
        if time.perf_counter() - last_save > spec.checkpoint_seconds or done == spec.steps:
            save(done)
            last_save = time.perf_counter()
    return sum(recent) / max(1, len(recent))
