"""N-gram index for prompt-lookup / n-gram drafting (C++ in csrc/kernels/ngram, via pybind11).

Each request keeps an :class:`NgramIndex` of its committed tokens (prompt and output): every n-gram
of orders ``n_min..n_max`` that has a following token, mapped to where it occurred. Committing
tokens costs O(n_max) per new token; nothing is rescanned and nothing is rolled back (only
committed tokens enter). :func:`lookup` turns the suffix of every row's tokens into a draft tree in
one call: the longest suffix that occurred before, up to ``num_candidates`` of its continuations of
up to ``k`` tokens ranked by count, then length, then recency, merged into one prefix tree per
row in BFS order.
A static corpus index (:meth:`NgramIndex.from_corpus`, :meth:`NgramIndex.save` /
:meth:`NgramIndex.load`) can be shared read-only by all requests; it fills the candidate slots a
row's own index leaves empty.

The exact rules (documents, ranking, the node budget, padding) are in
``specdec_cuda.reference.ngram``, the plain-Python specification the tests hold this to.

Example
-------
>>> from specdec_cuda.ngram import NgramIndex, lookup
>>> index = NgramIndex(n_min=1, n_max=3)
>>> index.extend([5, 6, 7, 8, 5, 6])
>>> draft = lookup([index], k=3)
>>> draft.tokens.tolist(), draft.parents.tolist(), draft.num_nodes.tolist()
([[7, 8, 5]], [[0, 1, 2]], [3])
"""

from __future__ import annotations

import os
from typing import Iterable, NamedTuple, Sequence

import torch

from ._native import _C
from .ops import args

__all__ = ["NgramIndex", "NgramDraft", "lookup", "extend_rows"]


def _tokens_1d(tokens, name: str) -> torch.Tensor:
    if isinstance(tokens, (list, tuple, range)) and len(tokens) == 0:  # torch makes [] a float tensor
        return torch.zeros(0, dtype=torch.int64)
    t = args.index_tensor(tokens, name, torch.device("cpu"))
    if t.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of token ids, got shape {tuple(t.shape)}")
    return t


class NgramIndex:
    """N-gram index of one request's committed tokens (or of a static corpus).

    Parameters
    ----------
    n_min, n_max : the n-gram orders indexed, ``1 <= n_min <= n_max <= 32``.

    Lookup prefers the longest order that matches, so ``n_max`` bounds how much context a guess
    can rest on, and ``n_min`` is the shortest match still trusted (1 = any repeated token).
    """

    def __init__(self, n_min: int = 1, n_max: int = 4):
        self._index = _C.NgramIndex(int(n_min), int(n_max))

    @classmethod
    def _wrap(cls, native) -> "NgramIndex":
        self = cls.__new__(cls)
        self._index = native
        return self

    def extend(self, tokens) -> None:
        """Appends committed tokens to the current document.

        Shape:
            tokens: (n,) int64 / int32 (a tensor, list or array), ids in [0, 2^31).
        """
        self._index.extend(_tokens_1d(tokens, "tokens"))

    def start_document(self) -> None:
        """Later tokens start a new document: no n-gram or continuation crosses the boundary."""
        self._index.start_document()

    def tokens(self) -> torch.Tensor:
        """The indexed tokens.

        Shape:
            (len(self),) int64.
        """
        return self._index.tokens()

    def count(self, ngram) -> int:
        """How many times ``ngram`` (``n_min <= len <= n_max`` tokens) occurred with a following token.

        Shape:
            ngram: (n,) int64 / int32.
        """
        return int(self._index.count(_tokens_1d(ngram, "ngram")))

    def memory_bytes(self) -> int:
        """Bytes this index holds (tokens, document starts, hash tables, chains; capacity included)."""
        return int(self._index.memory_bytes())

    def __len__(self) -> int:
        return len(self._index)

    @property
    def n_min(self) -> int:
        return self._index.n_min

    @property
    def n_max(self) -> int:
        return self._index.n_max

    @property
    def num_documents(self) -> int:
        return self._index.num_documents

    @classmethod
    def from_corpus(cls, documents: Iterable, n_min: int = 1, n_max: int = 4) -> "NgramIndex":
        """A static index over ``documents`` (each a 1-D sequence of token ids), one document each."""
        self = cls(n_min, n_max)
        for doc in documents:
            self.start_document()
            self.extend(doc)
        return self

    def save(self, path: str | os.PathLike) -> None:
        """Writes the index file: a header (magic ``SDNGRAM``, format version, orders, sizes), the
        tokens, the document starts and a checksum. Hash tables are rebuilt on load."""
        with open(path, "wb") as f:
            f.write(self._index.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NgramIndex":
        """Reads a file written by :meth:`save`; ``ValueError`` naming the file if it is corrupt."""
        with open(path, "rb") as f:
            image = f.read()
        try:
            return cls._wrap(_C.NgramIndex.from_bytes(image))
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}: {exc}") from None

    def __repr__(self) -> str:
        return (f"NgramIndex(n_min={self.n_min}, n_max={self.n_max}, tokens={len(self)}, "
                f"documents={self.num_documents}, memory_bytes={self.memory_bytes()})")


class NgramDraft(NamedTuple):
    """Draft trees in the layout of ``proposers.base.Draft``.

    Shape:
        tokens: (B, W) int64, draft node j of row b (the root, the last committed token, is not
            included); tail padded with 0.
        parents: (B, W) int64, parent of node j as a node index (0 = the root, i + 1 = draft node
            i), BFS order so ``parents[b, j] <= j``; tail padded with 0.
        num_nodes: (B,) int64, real draft nodes per row (0 = no draft).
        W = k * num_candidates.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    num_nodes: torch.Tensor


def _indexes(indexes: Sequence[NgramIndex | None], name: str = "indexes") -> list:
    out = []
    for b, ix in enumerate(indexes):
        if ix is not None and not isinstance(ix, NgramIndex):
            raise TypeError(f"{name}[{b}]: expected an NgramIndex or None, got {type(ix).__name__}")
        out.append(None if ix is None else ix._index)
    return out


def lookup(indexes: Sequence[NgramIndex | None], k: int, num_candidates: int = 1, *,
           max_nodes=None, max_depth=None, corpus: NgramIndex | None = None, max_occurrences: int = 64,
           device: torch.device | str | None = None) -> NgramDraft:
    """Draft trees for every row from the suffix of its committed tokens, in one call.

    Row b looks up the longest suffix of ``indexes[b]``'s tokens that occurred before (orders
    ``n_max`` down to ``n_min``), takes up to ``num_candidates`` of its continuations (up to ``k``
    tokens each) ranked by count, then length, then recency among its newest ``max_occurrences``
    occurrences, lets ``corpus`` fill the slots left, and merges them into one prefix tree of at most
    ``max_nodes[b]`` nodes (candidates inserted in rank order, each as deep as the budget allows)
    and at most ``max_depth[b]`` deep. ``num_candidates=1`` gives a chain.

    Parameters
    ----------
    indexes : one index per row; None = no draft for that row.
    k : most tokens per candidate (the tree's depth).
    num_candidates : most candidates merged per row.
    max_nodes : node budget per row, an int or (B,) ints (0 = no draft); default ``k * num_candidates``.
    max_depth : most tokens of each candidate per row, an int or (B,) ints (0 = no draft); default
        ``k``. Candidates are ranked on their k-token continuations either way.
    corpus : a static index shared read-only by all rows, or None.
    max_occurrences : newest occurrences of the matched n-gram that are ranked (bounds the cost).
    device : where the outputs go (default CPU).

    Shape:
        max_nodes, max_depth: () or (B,) int.
        returns NgramDraft(tokens (B, W), parents (B, W), num_nodes (B,)), W = k * num_candidates.
    """
    batch = len(indexes)
    rows = _indexes(indexes)
    if corpus is not None and not isinstance(corpus, NgramIndex):
        raise TypeError(f"corpus: expected an NgramIndex or None, got {type(corpus).__name__}")
    width = int(k) * int(num_candidates)
    cpu = torch.device("cpu")  # the lookup runs on the host
    budget = args.per_row(width if max_nodes is None else max_nodes, "max_nodes", batch, torch.int64, cpu)
    depth = None if max_depth is None else args.per_row(max_depth, "max_depth", batch, torch.int64, cpu)
    tokens, parents, num_nodes = _C.ngram_lookup(rows, None if corpus is None else corpus._index,
                                                 int(k), int(num_candidates), int(max_occurrences),
                                                 budget, depth)
    if device is not None:
        tokens, parents, num_nodes = (t.to(device) for t in (tokens, parents, num_nodes))
    return NgramDraft(tokens, parents, num_nodes)


def extend_rows(indexes: Sequence[NgramIndex | None], tokens, num_tokens) -> None:
    """Commits ``tokens[b, :num_tokens[b]]`` to ``indexes[b]`` for every row (one call).

    Every row is checked before any index changes. Rows whose index is None must commit nothing.

    Shape:
        tokens: (B, m) int64 / int32 (the tail past num_tokens[b] is ignored, e.g. -1 padding);
        num_tokens: (B,) int.
    """
    _C.ngram_extend_rows(_indexes(indexes), torch.as_tensor(tokens), torch.as_tensor(num_tokens))
