"""Plain-PyTorch specification of ``diffusion_unmask``: one step of masked-diffusion generation.

Slow on purpose: one position at a time. The kernels must give the same tokens, keep masks and
statuses (exactly) and the same confidences (to float rounding) for the same inputs.

For one row ``b`` with a window of ``W`` positions (absolute position ``position[b] + w``):

1. Every masked position (``tokens[b, w] == mask_id``) gets a token and a confidence, with the
   sampling transform of ``reference.sampling`` (temperature, top-k, top-p, greedy at temperature
   0): the token is drawn by the Gumbel race on the Philox stream
   ``(seed, position + w, Purpose.DIFFUSION, substream = step)``, so each step draws afresh; the
   confidence is the token's probability under that distribution (``softmax(logits)`` when
   greedy), LLaDA's low-confidence score.
2. The masked positions are ranked by confidence, ties to the lower index. Top-n rule
   (``threshold <= 0``): keep the ``num_transfer`` best. Threshold rule (Fast-dLLM,
   ``threshold > 0``): keep every one with ``confidence >= threshold``, and always the best one, so
   every step makes progress.

Statuses: 3 for temperature < 0 or NaN, top_p outside (0, 1], a NaN threshold or a negative
``num_transfer`` under the top-n rule; else 1 when a masked position's logits hold NaN / +inf (after
the temperature) or only -inf. A flagged row keeps nothing; its sampled tokens are -1 and its
confidences -inf.
"""

from __future__ import annotations

import math

import torch

from .philox import Purpose
from .sampling import (STATUS_BAD_PARAMS, STATUS_OK, RowError, check_params, greedy_token, probs_of,
                       race, scaled_logits)


def unmask_position(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int,
                    position: int, step: int) -> tuple[int, float]:
    """Token and confidence of one masked position.  Shape: logits [V].  Raises RowError(1)."""
    if temperature == 0.0:
        token = greedy_token(logits)
        return token, float(torch.softmax(logits.to(torch.float32), dim=0)[token])
    s = scaled_logits(logits, temperature, top_k, top_p)
    token = race(s, seed, position, Purpose.DIFFUSION, step)
    return token, float(probs_of(s)[token])


def select(confidence: torch.Tensor, masked: torch.Tensor, num_transfer: int,
           threshold: float) -> torch.Tensor:
    """Positions to unmask.  Shape: confidence [W] float32, masked [W] bool -> keep [W] bool."""
    order = sorted((w for w in range(confidence.numel()) if masked[w]),
                   key=lambda w: (-float(confidence[w]), w))
    keep = torch.zeros(confidence.numel(), dtype=torch.bool)
    for rank, w in enumerate(order):
        if threshold > 0.0:
            keep[w] = rank == 0 or float(confidence[w]) >= threshold
        else:
            keep[w] = rank < num_transfer
    return keep


def diffusion_unmask(logits, tokens, mask_id, temperature, top_k, top_p, seed, position, step,
                     num_transfer, threshold):
    """Reference of ``specdec_cuda.ops.diffusion_unmask``.

    Shape: logits [B, W, V]; tokens [B, W] int64; per-row temperature, top_k, top_p, seed,
    position, step, num_transfer, threshold [B].
    Returns sampled [B, W] int64 (-1 where not masked), confidence [B, W] float32 (-inf where not
    masked), keep [B, W] bool, status [B] int32.
    """
    batch, width = tokens.shape
    sampled = torch.full((batch, width), -1, dtype=torch.int64)
    confidence = torch.full((batch, width), -math.inf, dtype=torch.float32)
    keep = torch.zeros((batch, width), dtype=torch.bool)
    status = torch.zeros(batch, dtype=torch.int32)
    for b in range(batch):
        masked = tokens[b].cpu() == mask_id
        row_sampled = torch.full((width,), -1, dtype=torch.int64)
        row_conf = torch.full((width,), -math.inf, dtype=torch.float32)
        try:
            check_params(float(temperature[b]), float(top_p[b]))
            th = float(threshold[b])
            if math.isnan(th) or (not th > 0.0 and int(num_transfer[b]) < 0):
                raise RowError(STATUS_BAD_PARAMS)
            for w in range(width):
                if masked[w]:
                    row_sampled[w], row_conf[w] = unmask_position(
                        logits[b, w].cpu(), float(temperature[b]), int(top_k[b]), float(top_p[b]),
                        int(seed[b]), int(position[b]) + w, int(step[b]))
        except RowError as err:
            status[b] = err.status
            continue
        sampled[b], confidence[b] = row_sampled, row_conf
        keep[b] = select(row_conf, masked, int(num_transfer[b]), th)
        status[b] = STATUS_OK
    return sampled, confidence, keep, status
