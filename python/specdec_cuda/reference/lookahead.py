"""Reference for ``lookahead_mask``: the layout of one lookahead-decoding step (Fu et al. 2024).

One row feeds ``T = 1 + G * K + W * L`` tokens: the root (the newest committed token), G guessed
n-grams of up to K tokens each (slots ``1 + g * K + i``), and a Jacobi window of L levels by W
columns (slots ``1 + G * K + l * W + j``). Written as sets of visible slots, one slot at a time, so
that it reads differently from the kernel's closed-form rules (``csrc/kernels/tree/lookahead_mask.h``).
"""

from __future__ import annotations

import torch


def lookahead_mask(cache_len, guess_lens, guess_len: int, window: int, levels: int):
    """Positions and attention mask of a lookahead step, per row.

    * root: position ``cache_len``, sees itself.
    * guess g, token i < guess_lens[g]: position ``cache_len + 1 + i``; sees the root and tokens
      ``0 .. i`` of guess g. Tokens ``i >= guess_lens[g]`` are padding: position ``cache_len``,
      they see only themselves.
    * window level l, column j: position ``cache_len + 1 + l + j``; sees the root, level 0's
      columns ``0 .. j`` and column j's levels ``1 .. l``: its Jacobi trajectory.

    A row with a guess length outside ``[0, K]`` or a negative ``cache_len`` gets status 4
    (malformed) and is laid out with every guess length 0 and ``cache_len`` 0.

    Shape:
        cache_len: (B,) int64; guess_lens: (B, G) int64.
        returns positions (B, T) int64, tree_mask (B, T, T) bool ([b, v, u]: v sees u),
        status (B,) int32; T = 1 + G * guess_len + window * levels.
    """
    cache_len = torch.as_tensor(cache_len, dtype=torch.int64).cpu()
    guess_lens = torch.as_tensor(guess_lens, dtype=torch.int64).cpu()
    batch, num_guesses = guess_lens.shape
    t = 1 + num_guesses * guess_len + window * levels
    positions = torch.zeros(batch, t, dtype=torch.int64)
    mask = torch.zeros(batch, t, t, dtype=torch.bool)
    status = torch.zeros(batch, dtype=torch.int32)
    for b in range(batch):
        lens = guess_lens[b].tolist()
        base = int(cache_len[b])
        if base < 0 or any(n < 0 or n > guess_len for n in lens):
            status[b], lens, base = 4, [0] * num_guesses, 0
        visible: list[set[int]] = [{0}]
        offsets = [0]
        for g in range(num_guesses):
            for i in range(guess_len):
                slot = 1 + g * guess_len + i
                if i < lens[g]:
                    visible.append({0} | {1 + g * guess_len + h for h in range(i + 1)})
                    offsets.append(1 + i)
                else:
                    visible.append({slot})
                    offsets.append(0)
        start = 1 + num_guesses * guess_len
        for l in range(levels):
            for j in range(window):
                slot = start + l * window + j
                trajectory = {start + c for c in range(j + 1)} | {start + h * window + j for h in range(1, l + 1)}
                visible.append({0} | trajectory)
                offsets.append(1 + l + j)
        for v, seen in enumerate(visible):
            positions[b, v] = base + offsets[v]
            mask[b, v, sorted(seen)] = True
    return positions, mask, status
