"""Plain-Python n-gram index and draft-tree lookup: the specification of csrc/kernels/ngram.

Short on purpose: dicts of lists instead of hash tables and chains. ``specdec_cuda.ngram`` must
give exactly the same trees.

Rules
-----
* Documents: tokens are appended to the current document; ``start_document`` begins a new one. An
  n-gram is indexed once it has a following token in its document, under that token's position p
  (``tokens[p - n:p]`` is the n-gram). A request's index is one document.
* Candidates for a context: the longest order ``n`` (``n_max`` down to ``n_min``, at most the
  context's length) whose last ``n`` context tokens were indexed; its newest ``max_occurrences``
  occurrences, newest first, give the continuations ``tokens[p:min(p + k, end of p's document)]``;
  equal continuations are one candidate whose count is how many of those occurrences gave it;
  candidates are ranked by count (descending), then by length (longer first: an occurrence near
  the end of the text has a cut continuation, and a cut one drafts fewer tokens for the same
  verification), then by their newest occurrence (newest first).
* Lookup of a row: the row index's candidates, the top ``num_candidates``; a corpus index, when
  given and slots are left, adds its own ranked candidates for the same context (the row's
  tokens), skipping continuations equal to one of the row's. The candidates are inserted in rank
  order into a prefix tree rooted at the last committed token, each as far as the node budget
  ``min(max_nodes[b], k * num_candidates)`` allows, each cut to ``max_depth[b]`` tokens (ranking
  is over the k-token continuations regardless); the tree is written in BFS order (children in
  insertion order): ``tokens[b, j]`` is draft node j, ``parents[b, j]`` its parent as a node index
  (0 = the root, i + 1 = draft node i); the tail is padded with 0 in both.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from typing import Sequence

import torch

__all__ = ["NgramIndexRef", "lookup_ref"]


class NgramIndexRef:
    def __init__(self, n_min: int, n_max: int):
        if not 1 <= n_min <= n_max <= 32:
            raise ValueError(f"need 1 <= n_min <= n_max <= 32, got n_min={n_min}, n_max={n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.doc_starts = [0]
        # (n-gram as a tuple) -> continuation positions, oldest first
        self.occurrences: dict[tuple[int, ...], list[int]] = defaultdict(list)

    def start_document(self) -> None:
        if len(self.tokens) > self.doc_starts[-1]:
            self.doc_starts.append(len(self.tokens))

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            p = len(self.tokens)
            self.tokens.append(int(t))
            for n in range(self.n_min, self.n_max + 1):
                if p - n >= self.doc_starts[-1]:
                    self.occurrences[tuple(self.tokens[p - n:p])].append(p)

    def document_end(self, p: int) -> int:
        i = bisect_right(self.doc_starts, p)
        return self.doc_starts[i] if i < len(self.doc_starts) else len(self.tokens)

    def count(self, ngram: Sequence[int]) -> int:
        return len(self.occurrences.get(tuple(int(t) for t in ngram), ()))

    def candidates(self, context: Sequence[int], k: int, max_occurrences: int) -> list[tuple[int, ...]]:
        """Ranked continuations (tuples of tokens) for the suffix of ``context``."""
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):
            positions = self.occurrences.get(tuple(context[len(context) - n:]))
            if not positions:
                continue
            counts: dict[tuple[int, ...], int] = {}  # insertion order = newest occurrence first
            for p in reversed(positions[-max_occurrences:]):
                cont = tuple(self.tokens[p:min(p + k, self.document_end(p))])
                counts[cont] = counts.get(cont, 0) + 1
            return sorted(counts, key=lambda c: (-counts[c], -len(c)))  # stable: ties stay newest first
        return []


def _tree(candidates: list[tuple[int, ...]], budget: int) -> tuple[list[int], list[int]]:
    children: dict[int, list[int]] = {0: []}  # node -> children in insertion order (node 0 = root)
    token = {0: -1}
    for cand in candidates:
        cur = 0
        for t in cand:
            nxt = next((c for c in children[cur] if token[c] == t), None)
            if nxt is None:
                if len(token) - 1 == budget:
                    break
                nxt = len(token)
                token[nxt] = t
                children[nxt] = []
                children[cur].append(nxt)
            cur = nxt
    tokens, parents, slot, queue = [], [], {0: 0}, [0]
    for v in queue:
        for c in children[v]:
            tokens.append(token[c])
            parents.append(slot[v])
            slot[c] = len(tokens)
            queue.append(c)
    return tokens, parents


def lookup_ref(indexes: Sequence[NgramIndexRef | None], k: int, num_candidates: int = 1, *,
               max_nodes=None, max_depth=None, corpus: NgramIndexRef | None = None,
               max_occurrences: int = 64):
    """Reference of ``specdec_cuda.ngram.lookup``: (tokens [B, W], parents [B, W], num_nodes [B])."""
    width = k * num_candidates
    batch = len(indexes)
    if max_nodes is None:
        max_nodes = [width] * batch
    max_nodes = [int(m) for m in torch.as_tensor(max_nodes).reshape(-1).expand(batch).tolist()]
    if max_depth is None:
        max_depth = [k] * batch
    max_depth = [int(m) for m in torch.as_tensor(max_depth).reshape(-1).expand(batch).tolist()]
    tokens = torch.zeros(batch, width, dtype=torch.int64)
    parents = torch.zeros(batch, width, dtype=torch.int64)
    num_nodes = torch.zeros(batch, dtype=torch.int64)
    for b, index in enumerate(indexes):
        budget, depth = min(max_nodes[b], width), min(max_depth[b], k)
        if index is None or budget <= 0 or depth <= 0:
            continue
        chosen = index.candidates(index.tokens, k, max_occurrences)[:num_candidates]
        own = list(chosen)
        if corpus is not None and len(chosen) < num_candidates:
            for cand in corpus.candidates(index.tokens, k, max_occurrences):
                if len(chosen) == num_candidates:
                    break
                if cand not in own:
                    chosen.append(cand)
        t, p = _tree([cand[:depth] for cand in chosen], budget)
        tokens[b, :len(t)] = torch.tensor(t, dtype=torch.int64)
        parents[b, :len(p)] = torch.tensor(p, dtype=torch.int64)
        num_nodes[b] = len(t)
    return tokens, parents, num_nodes
