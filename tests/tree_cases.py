"""Tree generators shared by the tree tests and bench/bench_tree.py."""

from __future__ import annotations

import torch


def random_parents(n: int, gen: torch.Generator, max_children: int | None = None) -> list[int]:
    """A random tree of n nodes in BFS order (each node's parent precedes it)."""
    parents = [-1]
    frontier = [0]
    while len(parents) < n:
        p = frontier[int(torch.randint(len(frontier), (1,), generator=gen))]
        if max_children is not None and parents.count(p) >= max_children:
            frontier.remove(p)
            continue
        parents.append(p)
        frontier.append(len(parents) - 1)
    # relabel into BFS order so children of a node are contiguous
    children = {v: [c for c in range(n) if parents[c] == v] for v in range(n)}
    order, queue = [], [0]
    while queue:
        v = queue.pop(0)
        order.append(v)
        queue.extend(children[v])
    new = {old: i for i, old in enumerate(order)}
    return [-1] + [new[parents[old]] for old in order[1:]]


def chain(n: int) -> list[int]:
    return [-1] + list(range(n - 1))


def flatten(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents (N,), cu_num_nodes (B + 1,)) of a list of parent lists."""
    cu = [0]
    for r in rows:
        cu.append(cu[-1] + len(r))
    return torch.tensor([p for r in rows for p in r], dtype=torch.int64), torch.tensor(cu)
