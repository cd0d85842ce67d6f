"""Drafting with a model of another tokenizer (universal assisted generation): ``method="cross_tokenizer"``.

A small LM whose vocabulary differs from the target's drafts *text*: each step its greedy tokens
are decoded to a string, the string is encoded with the target's tokenizer, and the target tokens
that follow the committed sequence go to the loop as a chain of deterministic guesses
(``DraftKind.GUESS``). The loop verifies them on the target's own logits, greedily at T = 0 and by
sample-and-match at T > 0 (the target samples its token with the Philox draw of that position and
the guess is accepted iff it is that token), so the output is exactly the target's: the drafter's
probabilities are over another vocabulary and are never used.

Keeping the two tokenizations in sync, per row (``RowText``):

* target ids -> text: the committed target tokens are decoded incrementally. Each new token's text
  is the difference between decoding it with a few tokens before it and decoding those tokens
  alone, so decoders that depend on the neighbours (leading spaces, byte-level merges) give the
  text they give for the whole sequence. A token that ends inside a UTF-8 character (the decode
  ends in U+FFFD) waits until the character is complete (``MAX_PARTIAL`` tokens at most).
* text -> drafter ids: the drafter's context is the drafter tokenization of the committed text.
  The text before an *anchor* (a drafter token boundary ``lookbehind`` tokens behind the end) is
  frozen; every sync re-encodes the text from the anchor on, so a drafter token that straddles the
  old end of the text (``"hel"`` + ``"lo"`` becoming ``"hello"``) is re-tokenized, and the anchor
  then moves up. The drafter's KV cache keeps the longest common prefix of what it holds and the
  new context, and is fed the rest.
* drafter text -> target ids: the drafted string is appended to the text of the last
  ``lookbehind`` committed target tokens and the whole is encoded; when the encoding starts with
  those committed tokens, the tokens after them are the draft. When it does not (the proposal
  merges with the last committed token: the target's text ends in ``"hel"``, the drafter says
  ``"lo"``), the proposal is encoded on its own, as the continuation after the committed boundary.

Drafting stops for a row once its text gives more target tokens than the row was granted (so the
last one proposed is followed by more text, not cut mid-word), or after ``max_draft_steps`` drafter
tokens. Text is host work (Python strings, the tokenizers' own encode / decode); the drafter runs
batched, rows of any length together.

Both tokenizers see special tokens as text (decoded with them, encoded with them recognised), so
chat-template markers that both vocabularies hold (``<|im_start|>``, ``<|im_end|>``) carry over.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..contract import Draft, DraftKind, Outcome, PrefillContext, Proposer, StepState
from ..methods import MethodSpec, register

REPLACEMENT = "\ufffd"  # what a byte-level decoder gives for an incomplete UTF-8 sequence
DECODE_CONTEXT = 4  # tokens decoded before a new one, so its text is the one it has in the sequence
MAX_PARTIAL = 4  # a UTF-8 character has at most 4 bytes: tokens held back waiting for the rest of one


class TextTokenizer:
    """A tokenizer seen as text <-> ids: ``encode`` adds no special tokens (BOS), ``decode`` keeps
    them. Wraps a ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._backend = _is_tokenizers(tokenizer)

    def encode(self, text: str) -> list[int]:
        if self._backend:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self._backend:
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def vocab(self) -> dict[str, int]:
        if self._backend:
            return self.tokenizer.get_vocab(with_added_tokens=True)
        return dict(self.tokenizer.get_vocab())


def _is_tokenizers(obj) -> bool:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - tokenizers comes with transformers
        return False
    return isinstance(obj, Tokenizer)


def as_text_tokenizer(tokenizer, what: str, folder=None) -> TextTokenizer:
    """``tokenizer`` (a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or the path of a
    tokenizer.json or of a folder holding one) as a ``TextTokenizer``; None: ``folder``'s
    tokenizer.json. ``what`` names the option in the errors."""
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer
    if tokenizer is None:
        if folder is None or not (Path(folder) / "tokenizer.json").is_file():
            where = f" ({folder} holds no tokenizer.json)" if folder is not None else ""
            raise ValueError(f"method 'cross_tokenizer' needs {what}=...: a tokenizers.Tokenizer, a transformers "
                             f"tokenizer, or the path of a tokenizer.json or of a folder holding one{where}")
        tokenizer = folder
    if isinstance(tokenizer, (str, os.PathLike)):
        from tokenizers import Tokenizer

        path = Path(tokenizer)
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{what}: no tokenizer file {path}")
        return TextTokenizer(Tokenizer.from_file(str(path)))
    if _is_tokenizers(tokenizer) or all(hasattr(tokenizer, a) for a in ("encode", "decode", "get_vocab")):
        return TextTokenizer(tokenizer)
    raise TypeError(f"{what}: expected a tokenizers.Tokenizer, a transformers tokenizer or a path, "
                    f"got {type(tokenizer).__name__}")


def _common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, given that they agree before ``start``."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class RowText:
    """One request's committed sequence in both tokenizations (see the module docstring).

    ``target_ids``: the committed target tokens (prompt, then output, through the next root).
    ``text``: the text of ``target_ids[:n_text]``; ``ends[i]``: ``len(text)`` once token ``i`` is
    in it (tokens folded in together share an end). ``draft_ids``: the drafter's tokens for
    ``text``; ``draft_ids[:anchor_tok]`` is frozen and is the encoding of ``text[:anchor_char]``.
    ``cached``: the tokens the drafter's KV cache holds for this row (a context, then the drafts
    it was fed).
    """

    target_ids: list[int]
    text: str = ""
    n_text: int = 0
    ends: list[int] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)
    anchor_tok: int = 0
    anchor_char: int = 0
    cached: list[int] = field(default_factory=list)

    def extend_text(self, tok: TextTokenizer, keep_exact: int) -> None:
        """Fold the target tokens not yet in ``text`` into it. Tokens more than ``keep_exact`` from
        the end are folded in one decode (a prompt), the last ones one at a time with exact ends."""
        ids = self.target_ids
        bulk = len(ids) - keep_exact
        if bulk - self.n_text > DECODE_CONTEXT:
            ctx = max(0, self.n_text - DECODE_CONTEXT)
            head, full = tok.decode(ids[ctx:self.n_text]), tok.decode(ids[ctx:bulk])
            if not full.endswith(REPLACEMENT) and full.startswith(head):
                self.text += full[len(head):]
                self.ends.extend([len(self.text)] * (bulk - self.n_text))
                self.n_text = bulk
        while self.n_text < len(ids):
            ctx = max(0, self.n_text - DECODE_CONTEXT)
            head = tok.decode(ids[ctx:self.n_text])
            for end in range(self.n_text + 1, len(ids) + 1):
                full = tok.decode(ids[ctx:end])
                if not full.endswith(REPLACEMENT) or end - self.n_text >= MAX_PARTIAL:
                    break
            else:
                return  # the newest tokens end inside a character: wait for its other bytes
            # A decoder that is not prefix-stable here (it rewrote the head): the tokens' own text.
            self.text += full[len(head):] if full.startswith(head) else tok.decode(ids[self.n_text:end])
            self.ends.extend([len(self.text)] * (end - self.n_text))
            self.n_text = end

    def sync_draft_ids(self, tok: TextTokenizer, lookbehind: int) -> None:
        """Re-encode the text from the anchor on; then move the anchor up to ``lookbehind`` drafter
        tokens before the end, at a boundary whose decode gives back the text before it."""
        window = self.text[self.anchor_char:]
        ids = tok.encode(window)
        self.draft_ids = self.draft_ids[: self.anchor_tok] + ids
        if len(ids) <= 2 * lookbehind:
            return
        for j in range(len(ids) - lookbehind, len(ids) - lookbehind - MAX_PARTIAL, -1):
            prefix = tok.decode(ids[:j])
            if prefix and not prefix.endswith(REPLACEMENT) and window.startswith(prefix):
                self.anchor_char += len(prefix)
                self.anchor_tok += j
                return
        # No clean boundary (a normalising tokenizer, whose decode is not the text): the window
        # grows and is re-encoded whole until one is found.

    def drafted_text(self, tok: TextTokenizer, generated: list[int]) -> str:
        """The text the drafter's ``generated`` tokens add after its context (an incomplete
        character at the end left out)."""
        ctx = self.draft_ids[-DECODE_CONTEXT:]
        head, full = tok.decode(ctx), tok.decode(ctx + generated)
        text = full[len(head):] if full.startswith(head) else tok.decode(generated)
        return text.rstrip(REPLACEMENT)

    def target_continuation(self, tok: TextTokenizer, text: str, lookbehind: int, vocab_size: int) -> list[int]:
        """Target ids for ``text`` following the committed target tokens (see the module docstring)."""
        if not text:
            return []
        start = max(0, self.n_text - lookbehind)
        committed = self.target_ids[start:]  # the window, with any tokens still waiting for their text
        ids = tok.encode(self.text[(self.ends[start - 1] if start else 0):] + text)
        if ids[: len(committed)] == committed:
            ids = ids[len(committed):]
        elif self.n_text == len(self.target_ids):
            ids = tok.encode(text)  # the proposal merges with the last committed token: start afresh after it
        else:
            return []  # committed bytes of a character the text does not continue
        for i, t in enumerate(ids):
            if not 0 <= t < vocab_size:
                return ids[:i]
        return ids


class CrossTokenizerProposer(Proposer):
    """Chains of up to ``k`` target tokens from a drafter of another tokenizer (module docstring).

    Parameters
    ----------
    draft : the drafter, a model behind the protocol (``models.CausalLM``).
    draft_tokenizer, target_tokenizer : ``TextTokenizer`` of the drafter and of the target.
    target_vocab_size : the target's vocabulary (target ids the tokenizer gives beyond it are cut).
    k : most target tokens drafted per step.
    max_draft_steps : most drafter tokens generated per step (default 2k + 2).
    lookbehind : tokens re-tokenized on each side at the text boundary (default 8).
    """

    def __init__(self, draft, draft_tokenizer: TextTokenizer, target_tokenizer: TextTokenizer,
                 target_vocab_size: int, k: int = 4, max_draft_steps: int | None = None, lookbehind: int = 8) -> None:
        max_draft_steps = 2 * k + 2 if max_draft_steps is None else max_draft_steps
        if k < 1 or max_draft_steps < 1 or lookbehind < 1:
            raise ValueError(f"need k >= 1, max_draft_steps >= 1 and lookbehind >= 1, got k={k}, "
                             f"max_draft_steps={max_draft_steps}, lookbehind={lookbehind}")
        self.draft, self.draft_tok, self.target_tok = draft, draft_tokenizer, target_tokenizer
        self.target_vocab_size = int(target_vocab_size)
        self.k, self.max_draft_steps, self.lookbehind = int(k), int(max_draft_steps), int(lookbehind)
        self.max_draft = self.k
        self.rows: list[RowText] = []
        self.cache = None

    def prefill(self, ctx: PrefillContext) -> None:
        prompts, lens, first = ctx.prompts.tolist(), ctx.prompt_lens.tolist(), ctx.first_tokens.tolist()
        self.rows = [RowText(p[:n] + [t]) for p, n, t in zip(prompts, lens, first)]
        # The drafter's cache is made at the first proposal, when the prompts' drafter lengths are
        # known; a run whose policy never drafts never runs the drafter or its tokenizer.
        self.cache, self.capacity, self.target_max_length = None, 0, ctx.max_length

    def _ensure_capacity(self, need: int) -> bool:
        """A drafter cache of at least ``need`` slots per row; True when a new (empty) one was made."""
        if self.cache is not None and need <= self.capacity:
            return False
        # Drafter tokens per target token so far, times the target tokens still to come; doubled on
        # each regrowth, so a run that outgrows the estimate re-feeds its contexts O(log n) times.
        ratio = max(len(r.draft_ids) / max(1, r.n_text) for r in self.rows)
        estimate = need + int(1.25 * ratio * max(0, self.target_max_length - min(len(r.target_ids) for r in self.rows)))
        self.capacity = max(need, estimate + 16, 2 * self.capacity)
        self.cache = self.draft.new_cache(len(self.rows), self.capacity)
        for r in self.rows:
            r.cached = []
        return True

    def matches_samples(self) -> bool:
        return True  # the re-tokenized text is a guess, sample-and-match at T > 0

    def propose(self, state: StepState) -> Draft | None:
        limits = torch.where(state.active, state.max_draft, 0).tolist()  # [B] target tokens granted
        started = time.perf_counter()
        for b, row in enumerate(self.rows):
            if limits[b] > 0:
                row.extend_text(self.target_tok, keep_exact=self.lookbehind + DECODE_CONTEXT)
                row.sync_draft_ids(self.draft_tok, self.lookbehind)
                if not row.draft_ids:
                    limits[b] = 0  # no text yet (a prompt of special bytes only): nothing to draft from
        drafting = [b for b, n in enumerate(limits) if n > 0]
        if not drafting:
            return None
        batch, device = len(self.rows), self.draft.device

        # Catch up: keep each drafting row's common prefix of cache and context, feed the rest
        # (one token at least, for the logits of the first draft).
        def plan():
            keep = [len(r.cached) for r in self.rows]
            for b in drafting:
                r = self.rows[b]
                keep[b] = min(_common_prefix(r.cached, r.draft_ids, r.anchor_tok), len(r.draft_ids) - 1)
            width = max(len(self.rows[b].draft_ids) - keep[b] for b in drafting)
            return keep, width

        keep, width = plan()
        if self._ensure_capacity(max(keep) + width + self.max_draft_steps):
            keep, width = plan()
        feeds = [self.rows[b].draft_ids[keep[b]:] if limits[b] > 0 else [] for b in range(batch)]
        if any(n < len(r.cached) for n, r in zip(keep, self.rows)):
            self.cache.truncate(torch.tensor(keep, dtype=torch.int64, device=device))
        tokens = torch.tensor([f + [0] * (width - len(f)) for f in feeds], dtype=torch.int64, device=device)
        positions = torch.tensor(keep, device=device)[:, None] + torch.arange(width, device=device)
        last = torch.tensor([max(0, len(f) - 1) for f in feeds], device=device)
        cur = self.draft.forward(tokens, positions, self.cache, logits_at=last).logits[:, 0]  # [B, V_draft]
        self.cache.commit(torch.tensor([len(f) for f in feeds], dtype=torch.int64, device=device))
        for b in drafting:
            self.rows[b].cached = self.rows[b].draft_ids[:]
        # A steady step feeds the text the last step committed; more is a catch-up (the prompt, a
        # regrown cache, tokens decoded without drafting) that later steps do not repeat.
        one_time = time.perf_counter() - started if width > self.max_draft_steps + self.lookbehind else 0.0

        # Draft greedily in the drafter's vocabulary until each row's text gives more target tokens
        # than it was granted.
        generated = {b: [] for b in drafting}
        proposal = {b: [] for b in drafting}
        running = list(drafting)
        for step in range(self.max_draft_steps):
            next_tokens = cur.argmax(-1).tolist()  # [B]
            still = []
            for b in running:
                row = self.rows[b]
                generated[b].append(next_tokens[b])
                text = row.drafted_text(self.draft_tok, generated[b])
                proposal[b] = row.target_continuation(self.target_tok, text, self.lookbehind, self.target_vocab_size)
                if len(proposal[b]) <= limits[b]:
                    still.append(b)
            running = still
            if not running or step + 1 == self.max_draft_steps:
                break
            fed = torch.zeros(batch, dtype=torch.int64)
            fed[running] = 1
            positions = torch.tensor([len(r.cached) for r in self.rows], device=device)[:, None]
            cur = self.draft.forward(torch.tensor(next_tokens, device=device)[:, None], positions,
                                     self.cache).logits[:, 0]
            self.cache.commit(fed.to(device))
            for b in running:
                self.rows[b].cached.append(next_tokens[b])

        num_nodes = [min(len(proposal.get(b, ())), limits[b]) for b in range(batch)]
        n = max(num_nodes)
        if n == 0:
            return None
        draft_tokens = torch.zeros(batch, n, dtype=torch.int64)
        for b in drafting:
            draft_tokens[b, : num_nodes[b]] = torch.tensor(proposal[b][: num_nodes[b]], dtype=torch.int64)
        target_device = state.lengths.device
        return Draft(draft_tokens.to(target_device), torch.tensor(num_nodes, device=target_device), DraftKind.GUESS,
                     one_time_seconds=one_time)

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """Append each running row's committed tokens (accepted drafts, then the next root); the
        text and the drafter follow at the row's next proposal."""
        committed = torch.where(outcome.active, outcome.num_accepted + 1, 0).tolist()
        for row, tokens, n in zip(self.rows, outcome.tokens.tolist(), committed):
            row.target_ids.extend(tokens[:n])


def _folder_of(model):
    """The checkpoint folder a model was loaded from, when it says (built-in or transformers)."""
    folder = getattr(model, "checkpoint_dir", None)
    if folder is None:
        folder = getattr(getattr(model, "model", None), "name_or_path", None) or None
    return folder if folder is not None and Path(folder).is_dir() else None


def make_cross_tokenizer_proposer(target, draft=None, draft_tokenizer=None, target_tokenizer=None, k: int = 4,
                                  max_draft_steps: int | None = None, lookbehind: int = 8) -> CrossTokenizerProposer:
    """The ``method="cross_tokenizer"`` proposer for ``target``. ``draft``: a model, transformers
    model or checkpoint folder with a tokenizer of its own (loaded in the target's dtype, on its
    device). A tokenizer left out is read from its model's folder (tokenizer.json)."""
    from ..api import as_causal_lm

    drafter = as_causal_lm(draft, dtype=target.dtype, device=target.device)
    draft_folder = draft if isinstance(draft, (str, os.PathLike)) else _folder_of(drafter)
    draft_tok = as_text_tokenizer(draft_tokenizer, "draft_tokenizer", draft_folder)
    target_tok = as_text_tokenizer(target_tokenizer, "target_tokenizer", _folder_of(target))
    draft_vocab, target_vocab = draft_tok.vocab(), target_tok.vocab()
    if draft_vocab == target_vocab:
        raise ValueError("the draft and target tokenizers are the same (identical vocabularies): use "
                         "method='draft', which needs no text conversion and verifies the drafter's own "
                         "probabilities (rejection sampling)")
    for what, vocab, model in (("draft_tokenizer", draft_vocab, drafter), ("target_tokenizer", target_vocab, target)):
        top = max(vocab.values(), default=-1)
        if top >= model.vocab_size:
            raise ValueError(f"{what} has token ids up to {top}, beyond its model's vocabulary of "
                             f"{model.vocab_size}: not that model's tokenizer")
    return CrossTokenizerProposer(drafter, draft_tok, target_tok, target.vocab_size, k=k,
                                  max_draft_steps=max_draft_steps, lookbehind=lookbehind)


register(MethodSpec(
    name="cross_tokenizer",
    summary="a drafter of another tokenizer drafts text, re-tokenized for the target (universal assisted "
            "generation); greedy / sample-and-match verification",
    lossless=True,
    make=make_cross_tokenizer_proposer,
    required=("draft",),
    options={
        "draft": "the drafter: a model, transformers model or checkpoint folder (its own tokenizer)",
        "draft_tokenizer": "the drafter's tokenizer: tokenizers / transformers tokenizer or tokenizer.json path "
                           "(default: the draft folder's)",
        "target_tokenizer": "the target's tokenizer, as draft_tokenizer (default: the target folder's)",
        "k": "most target tokens drafted per step (default 4)",
        "max_draft_steps": "most drafter tokens generated per step (default 2k + 2)",
        "lookbehind": "tokens re-tokenized on each side of the text boundary (default 8)",
    },
))
