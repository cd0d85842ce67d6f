"""A drafter's LM head over part of the vocabulary (FR-Spec, Zhao et al. 2025: "frequency-ranked
speculative sampling").

A small drafter of a large-vocabulary target spends much of its step in the LM head: the
Qwen2.5-Coder-0.5B reads 145 MB of its 491 MB GGUF file for the 151,936-row head, once per drafted
token. Drafting needs only the tokens it is likely to propose, so the head runs over ``N`` chosen
rows; every other token gets the logit ``MASKED`` (probability 0 once exponentiated, finite so
that the samplers do not flag the row). Verification is unchanged and runs over the target's
whole vocabulary, so the output stays exactly the target's: a token outside the subset is simply
never drafted (the target emits it as the correction or bonus token).

Which rows: ``frequent_token_ids(tokenizer, texts, n)`` ranks token ids by their count in text of
the user's domain; an int ``n`` takes ids ``0 .. n - 1``, which for byte-level BPE vocabularies
(Qwen, Llama 3, GPT-2) is the merge order, roughly frequency order in the tokenizer's own corpus.
On HumanEval's prompts and solutions (Qwen2.5 tokenizer): ids below 32,768 cover 96.2% of the
tokens; the 16,384 most frequent in CPython's standard library 96.1%, its 32,768 most frequent 98.2%.

``VocabSubset`` holds the rows in the form each forward path multiplies: dense ``[N, H]`` (torch
path), packed panels (packed CPU path), GGUF blocks (a GGUF model: the rows' blocks gathered
as stored, no requantisation). Built once per drafter (``LlamaModel.vocab_subset``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from ..ops.gguf import GgufLinear, GgufWeight, gguf_repack_panels
from ..ops.skinny_linear import PackedWeight

# The logit of a token outside the subset: exp(MASKED / T - max) is 0 in float32 for any
# temperature, and it is finite, which the sampling kernels require of every logit.
MASKED = -1e30


@dataclass(frozen=True)
class VocabSubset:
    """The LM-head rows of ``ids`` (sorted, unique) of one model, in the form its forward multiplies.

    ``weight``: dense ``[N, H]`` rows (the torch path), or None; ``packed``: packed panels or GGUF
    blocks of the same rows, or None; ``model_id``: ``id()`` of the model it was made from and
    ``form``: how that model held its head then (its forward refuses another model's subset, or
    one made before a ``.to()`` or a change of path). ``prefix``: ids are ``0 .. N - 1``."""

    ids: torch.Tensor  # [N] int64, sorted, unique
    vocab_size: int
    weight: torch.Tensor | None
    packed: PackedWeight | GgufLinear | None
    model_id: int
    form: str
    _dense: dict = field(default_factory=dict, compare=False, repr=False)  # rows(dtype), decoded on demand

    @property
    def prefix(self) -> bool:
        return int(self.ids[-1]) == self.ids.numel() - 1

    def __len__(self) -> int:
        return self.ids.numel()

    def rows(self, dtype: torch.dtype) -> torch.Tensor:
        """The rows as a dense ``[N, H]`` tensor: ``weight``, or ``packed`` decoded once per dtype
        (a drafter off the packed path over a packed or GGUF target's subset)."""
        if self.weight is not None:
            return self.weight
        dense = self._dense.get(dtype)
        if dense is None:
            from .layers import dense_of

            dense = self._dense[dtype] = dense_of(self.packed, dtype)
        return dense

    def expand(self, logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Subset logits [..., N] -> full-vocabulary logits [..., V], ``MASKED`` outside the subset.
        ``out`` (optional, [..., V], same dtype): written in place and returned."""
        shape = (*logits.shape[:-1], self.vocab_size)
        if out is None:
            out = logits.new_full(shape, MASKED)
        else:
            out.fill_(MASKED)
        if self.prefix:
            out[..., : len(self)] = logits
        else:
            out.index_copy_(-1, self.ids.to(out.device), logits)
        return out


def subset_ids(spec: int | Sequence[int] | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The sorted unique ids ``spec`` names: an int ``n`` (ids ``0 .. n - 1``) or the ids themselves.
    ValueError for an empty set or an id outside ``[0, vocab_size)``."""
    if isinstance(spec, bool):
        raise TypeError("a draft vocabulary is an int (its size) or a sequence of token ids, not a bool")
    if isinstance(spec, int):
        if not 1 <= spec <= vocab_size:
            raise ValueError(f"a draft vocabulary of {spec} tokens: it must hold 1 .. {vocab_size} (the vocabulary)")
        return torch.arange(spec, dtype=torch.int64)
    ids = torch.as_tensor(spec)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"a draft vocabulary's ids must be a non-empty 1-D integer sequence, got "
                         f"{ids.dtype} of shape {tuple(ids.shape)}")
    ids = torch.unique(ids.to(torch.int64))  # sorted
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size}); got {int(ids[0])} .. {int(ids[-1])}")
    return ids


def target_vocab_subset(target, spec, head: torch.Tensor) -> VocabSubset:
    """The rows ``spec`` (as ``subset_ids`` takes it) of ``target``'s LM head for a drafter that
    drafts through that head (DFlash, Medusa, MTP): in the form the target's own forward multiplies
    them (``vocab_subset``: GGUF blocks, packed panels), or dense rows of ``head`` [V, H] for a
    target without that extension (a transformers model)."""
    if hasattr(target, "vocab_subset"):
        return target.vocab_subset(spec)
    ids = subset_ids(spec, head.shape[0])
    return VocabSubset(ids, head.shape[0], head[ids.to(head.device)].contiguous(), None, id(target), "dense")


def gguf_rows_of(linear: GgufLinear, ids: torch.Tensor) -> GgufLinear:
    """The rows ``ids`` (sorted) of a GGUF weight, as stored: each part's rows gathered (a row of
    blocks is self-contained; a part in panels is turned back into the file's order first and its
    rows put in panels again), parts that keep no row dropped."""
    parts, start = [], 0
    for part in linear.parts:
        stored = part
        part = gguf_repack_panels(part, inverse=True)  # panels mix rows; the file's order keeps them apart
        mine = ids[(ids >= start) & (ids < start + part.out_features)] - start
        if mine.numel():
            rows = part.data[: mine.numel()] if int(mine[-1]) == mine.numel() - 1 else part.data[mine]
            subset = GgufWeight(rows, part.qtype, mine.numel(), part.in_features)
            parts.append(gguf_repack_panels(subset) if stored.qtype != part.qtype else subset)
        start += part.out_features
    return GgufLinear(tuple(parts), linear.activations)


def frequent_token_ids(tokenizer, texts: Iterable[str], n: int, always: Iterable[int] = ()) -> list[int]:
    """The ``n`` token ids most frequent in ``texts`` under ``tokenizer`` (anything whose
    ``encode(text)`` gives ids: a transformers or ``tokenizers`` tokenizer's ``.ids`` aside), plus
    ``always`` (e.g. the end-of-turn ids); ties by lower id. Fewer than ``n`` when the texts hold
    fewer distinct tokens."""
    counts: Counter = Counter()
    for text in texts:
        ids = tokenizer.encode(text)
        counts.update(getattr(ids, "ids", ids))
    ranked = sorted(counts, key=lambda i: (-counts[i], i))[:n]
    return sorted(set(ranked) | set(int(i) for i in always))
