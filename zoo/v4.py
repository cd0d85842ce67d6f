"""Zoo v4: a longer, resumable training of the zoo pair on a larger Python corpus.

v3 (``pairs.py``) trains in minutes on the standard library alone and stays far from converged
(about 2.25 bits per character on held-out text, greedy output that loops). v4 trains the same
family of models (a deep, narrow Llama target and a one-layer draft of its width, started from
the target and distilled) for hours of one CPU core, in the background, across sessions:

* Corpus: the running interpreter's standard library (every ``Lib/**/*.py``) plus the Python
  sources installed beside the project's dependencies (site-packages: torch, transformers, numpy,
  scipy, sympy, ...; each package capped so that none dominates), exact duplicates removed. A
  fixed tenth of the standard library's top-level modules (chosen by a hash of the file name,
  so it is the same on every machine with the same Python) is the held-out split: never trained
  on, and any training file that mostly repeats a held-out file's lines (vendored copies) is
  dropped. :func:`heldout_prompts` cuts prompts from that split for the end-to-end bench.
* Training is resumable: model, optimizer, step, RNG state and data position are checkpointed
  atomically every few minutes (and on SIGTERM / SIGINT) to a run folder outside the work tree
  (``$SPECDEC_ZOO_V4_DIR``, default the checkout's ``.cache/zoo-v4-train``); a progress line (step, loss,
  tokens/s, ETA) goes to ``train.log`` there. Running the same command again resumes.
* Between the target and the draft, a sequence-level unlikelihood fine-tune of the target
  against its own greedy loops (``zoo_unlikelihood``, :func:`unlikelihood_phase`); a pair trained
  before that phase existed gets it through :func:`refine_pair` (``zoo --zoo v4 --unlikelihood``).
* Evaluation in bits per character on the held-out split (independent of the tokenizer), the
  distinct-n-gram ratio of greedy output on held-out prompts against the real continuations', and
  the draft's greedy agreement with the target.

Entry point: ``python -m zoo.train --zoo v4 [--run-dir DIR] [--threads 1]``. When the run
finishes, the pair is exported as Hugging Face folders (``target``, ``draft``, ``report.json``) to
``RUN_DIR/export`` and to the zoo cache (``pairs.zoo_root() / spec.name``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import itertools
import json
import math
import os
import shutil
import signal
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .pairs import (EOS, V4_SPEC, V4Spec, _llama, agreement, init_draft_from_target, lm_loss, save_pair,
                  train_tokenizer)

RUN_DIR_ENV = "SPECDEC_ZOO_V4_DIR"
DEFAULT_RUN_DIR = Path(__file__).resolve().parents[1] / ".cache" / "zoo-v4-train"
CHECKPOINT = "checkpoint.pt"




def default_run_dir() -> Path:
    """``$SPECDEC_ZOO_V4_DIR`` or the checkout's ``.cache/zoo-v4-train`` (ignored by git)."""
    return Path(os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)


# ----------------------------------------------------------------------------------- corpus


@dataclass
class Corpus:
    """Training and held-out texts. ``train`` and ``heldout`` are lists of (name, text)."""

    train: list[tuple[str, str]]
    heldout: list[tuple[str, str]]
    stats: dict = field(default_factory=dict)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode("utf-8", "surrogatepass")).digest()[:8], "little")


def is_heldout_module(name: str, modulo: int = V4_SPEC.heldout_modulo) -> bool:
    """Whether a top-level stdlib module file (e.g. ``"csv.py"``) is in the held-out split."""
    return _hash("heldout:" + name) % modulo == 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _long_lines(text: str) -> set[str]:
    # Lines long enough to be specific to their file (short ones like `return x` are everywhere).
    return {s for s in (line.strip() for line in text.splitlines()) if len(s) >= 40}


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _site_dirs() -> list[Path]:
    return sorted({Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")})


def stdlib_heldout(spec: V4Spec = V4_SPEC, stdlib: Path | None = None) -> list[tuple[str, str]]:
    """The held-out split: (file name, text) of the held-out top-level stdlib modules, by name."""
    lib = Path(stdlib or _stdlib_dir())
    out = []
    for path in sorted(lib.glob("*.py")):
        if is_heldout_module(path.name, spec.heldout_modulo):
            text = _read(path)
            if text and text.strip():
                out.append((f"stdlib/{path.name}", text))
    if not out:
        raise RuntimeError(f"no held-out stdlib modules found under {lib}")
    return out


def _python_files(root: Path, max_bytes: int) -> list[Path]:
    files = []
    for path in root.rglob("*.py"):
        if "__pycache__" in path.parts or "site-packages" in path.relative_to(root).parts[:-1]:
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if 0 < size <= max_bytes and path.is_file():
            files.append(path)
    return files


def code_corpus(spec: V4Spec = V4_SPEC, log: Callable[[str], None] = print, stdlib: Path | None = None,
                site_dirs: Sequence[Path] | None = None) -> Corpus:
    """The v4 corpus: stdlib minus the held-out split, plus site-packages sources, deduplicated.

    Each site-packages top-level package contributes at most ``spec.package_cap_bytes`` (its
    files taken in a fixed hash order), so the corpus is not mostly transformers and torch.
    ``stdlib`` / ``site_dirs`` default to the running interpreter's.
    """
    lib = Path(stdlib or _stdlib_dir())
    heldout = stdlib_heldout(spec, lib)
    held_hashes = {_hash(_normalise(t)) for _, t in heldout}
    held_lines: set[str] = set()
    for _, text in heldout:
        held_lines |= _long_lines(text)
    groups: dict[str, list[Path]] = {"stdlib": []}
    for path in _python_files(lib, spec.max_file_bytes):
        rel = path.relative_to(lib)
        if len(rel.parts) == 1 and is_heldout_module(rel.name, spec.heldout_modulo):
            continue
        groups["stdlib"].append(path)
    for root in sorted({Path(d) for d in (_site_dirs() if site_dirs is None else site_dirs)}):
        if not root.is_dir() or root.resolve() == lib.resolve():
            continue
        for path in _python_files(root, spec.max_file_bytes):
            top = path.relative_to(root).parts[0]
            groups.setdefault(top.removesuffix(".py"), []).append(path)
    seen: set[int] = set()
    train: list[tuple[str, str]] = []
    stats = {"files": {}, "bytes": {}, "dropped_duplicates": 0, "dropped_heldout_overlap": 0}
    for group, paths in sorted(groups.items()):
        cap = math.inf if group == "stdlib" else spec.package_cap_bytes
        used = 0
        for path in sorted(paths, key=lambda p: _hash(str(p))):
            text = _read(path)
            if not text or not text.strip():
                continue
            key = _hash(_normalise(text))
            if key in seen:
                stats["dropped_duplicates"] += 1
                continue
            lines = _long_lines(text)
            if key in held_hashes or (len(lines) >= 5 and len(lines & held_lines) >= 0.3 * len(lines)):
                stats["dropped_heldout_overlap"] += 1
                continue
            if used + len(text) > cap:
                continue
            seen.add(key)
            used += len(text)
            train.append((f"{group}/{path.name}", text))
        if used:
            stats["files"][group] = sum(1 for n, _ in train if n.split("/")[0] == group)
            stats["bytes"][group] = used
    # A fixed shuffle so that packages are interleaved in the token stream.
    train.sort(key=lambda item: _hash(item[0] + item[1][:200]))
    stats["train_chars"] = sum(len(t) for _, t in train)
    stats["heldout_chars"] = sum(len(t) for _, t in heldout)
    stats["heldout_files"] = [n for n, _ in heldout]
    log(f"[zoo-v4] corpus: {len(train)} training files, {stats['train_chars'] / 1e6:.1f}M chars "
        f"({len(stats['bytes'])} sources); held out: {len(heldout)} stdlib modules, "
        f"{stats['heldout_chars'] / 1e6:.2f}M chars; dropped {stats['dropped_duplicates']} duplicates, "
        f"{stats['dropped_heldout_overlap']} overlapping the held-out split")
    return Corpus(train, heldout, stats)


def opening_cases(texts: Sequence[str], n: int | None, max_prompt_chars: int = 600,
                  continuation_chars: int = 400) -> list[tuple[str, str]]:
    """(prompt, real continuation) pairs cut from texts at ``def`` / ``class`` lines.

    A prompt is the code before a definition (at most ``max_prompt_chars``, starting at a line)
    through the definition's first line, without its newline: the BPE merges a newline with the
    next line's indentation (``"\\n        "`` is one token), so a prompt that ended in a bare
    newline would show the model a token that in training means "the next line is not indented"
    (the v4 target then answered with an end of file or a comment; a token-healing problem).
    The real continuation starts with that newline. Candidates are spread evenly over all
    texts; ``n=None`` returns all of them.
    """
    candidates = []
    for text in texts:
        offset = 0
        for line in text.splitlines(keepends=True):
            stripped = line.lstrip()
            if (stripped.startswith("def ") or stripped.startswith("class ")) and line.rstrip().endswith(":"):
                end = offset + len(line.rstrip())
                start = max(0, end - max_prompt_chars)
                start = text.find("\n", start, end) + 1 if start else 0
                if end - start > len(line) + 40 and len(text) - end > 80:
                    candidates.append((text[start:end], text[end:end + continuation_chars]))
            offset += len(line)
    if not candidates:
        raise ValueError("no def/class line with enough text around it in the texts")
    if n is None:
        return candidates
    step = len(candidates) / min(n, len(candidates))
    return [candidates[int(i * step)] for i in range(min(n, len(candidates)))]


def heldout_prompts(n: int = 16, spec: V4Spec = V4_SPEC) -> list[str]:
    """Prompts from the stdlib held-out split, which no model or method is trained or tuned on.

    For the end-to-end bench's held-out workload: code openings ending at a ``def`` / ``class``
    line, spread over the held-out modules of the running Python.
    """
    return [p for p, _ in opening_cases([t for _, t in stdlib_heldout(spec)], n)]


# ----------------------------------------------------------------------------------- metrics


@torch.no_grad()
def bits_per_char(model, tokenizer, texts: Sequence[str], seq_len: int, eos_id: int,
                  batch: int = 8) -> dict:
    """Held-out loss in bits per character: every token of each text predicted from EOS + prefix.

    Each text is encoded as ``[EOS] + tokens`` (files are EOS-separated in training) and cut
    into windows of ``seq_len + 1`` tokens overlapping by one, so every token is predicted once
    from the preceding tokens of its window. The sum of -log2 p over all tokens, divided by the
    number of characters, does not depend on how the tokenizer splits the text.
    Shapes: windows ``(batch, <= seq_len + 1)`` of token ids.
    """
    nats = 0.0
    tokens = chars = 0
    full, tails = [], []
    for text in texts:
        ids = [eos_id] + tokenizer(text)["input_ids"]
        chars += len(text)
        tokens += len(ids) - 1
        for s in range(0, len(ids) - 1, seq_len):
            window = ids[s: s + seq_len + 1]
            (full if len(window) == seq_len + 1 else tails).append(window)
    groups = [full[i: i + batch] for i in range(0, len(full), batch)] + [[w] for w in tails]
    for group in groups:
        x = torch.tensor(group, dtype=torch.int64)
        logits = model(input_ids=x[:, :-1]).logits.float()
        nats += float(F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum"))
    if chars == 0:
        raise ValueError("bits_per_char needs at least one non-empty text")
    return {"bits_per_char": nats / math.log(2) / chars, "nats_per_token": nats / tokens,
            "chars_per_token": chars / tokens, "chars": chars, "tokens": tokens}


def distinct_ngram_ratio(ids: Sequence[int], n: int = 4) -> float:
    """Distinct n-grams / all n-grams of a sequence (1.0: no repeats; low: a loop)."""
    grams = [tuple(ids[i: i + n]) for i in range(len(ids) - n + 1)]
    if not grams:
        raise ValueError(f"distinct_ngram_ratio needs at least n={n} ids, got {len(ids)}")
    return len(set(grams)) / len(grams)


def collapsed(ids: Sequence[int], max_period: int = 16, min_span: int = 24) -> bool:
    """Whether the sequence ends in one token or phrase (period <= max_period) repeated.

    True when the last ``max(3 * period, min_span)`` ids repeat with some period <= max_period.
    """
    ids = list(ids)
    for p in range(1, max_period + 1):
        span = max(3 * p, min_span)
        if span <= len(ids) and all(ids[-i] == ids[-i - p] for i in range(1, span - p + 1)):
            return True
    return False


@torch.no_grad()
def greedy_quality(model, tokenizer, cases: Sequence[tuple[str, str]], new_tokens: int, eos_id: int,
                   n: int = 4) -> dict:
    """Distinct-n ratio and collapse count of greedy output vs the real continuations' ids."""
    ours, theirs, loops, samples = [], [], 0, []
    for prompt, continuation in cases:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=eos_id, eos_token_id=None)
        gen = out[0, ids.shape[1]:].tolist()
        real = tokenizer(continuation)["input_ids"][:new_tokens]
        ours.append(distinct_ngram_ratio(gen, n))
        theirs.append(distinct_ngram_ratio(real, n))
        loops += collapsed(gen)
        if len(samples) < 3:
            samples.append(tokenizer.decode(gen))
    return {f"distinct_{n}_greedy": sum(ours) / len(ours), f"distinct_{n}_corpus": sum(theirs) / len(theirs),
            "collapsed": loops, "prompts": len(cases), "samples": samples}


# ----------------------------------------------------------------------------------- training


def lr_at(step: int, total: int, peak: float, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from ``peak`` to ``min_ratio * peak``."""
    warmup = min(warmup, max(1, total // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class WindowSampler:
    """Training windows by position: epoch ``e`` is a seeded permutation of the windows of
    ``seq_len + 1`` tokens (overlapping by one) starting at a seeded offset, so the data position
    is one integer and resuming at position ``pos`` replays exactly what an uninterrupted run sees.
    Shape of a batch: ``(rows, seq_len + 1)``.
    """

    def __init__(self, data: torch.Tensor, seq_len: int, seed: int):
        self.data, self.seq_len, self.seed = data, seq_len, seed
        self.per_epoch = (data.numel() - 1 - seq_len) // seq_len
        if self.per_epoch < 1:
            raise ValueError(f"training data of {data.numel()} tokens is shorter than 2 windows of {seq_len}")
        self._epoch, self._order, self._offset = -1, None, 0

    def _epoch_order(self, epoch: int):
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._offset = int(torch.randint(0, self.seq_len, (1,), generator=gen))
            self._order = torch.randperm(self.per_epoch, generator=gen)
            self._epoch = epoch
        return self._order, self._offset

    def batch(self, pos: int, rows: int) -> torch.Tensor:
        out = []
        for p in range(pos, pos + rows):
            order, offset = self._epoch_order(p // self.per_epoch)
            s = offset + int(order[p % self.per_epoch]) * self.seq_len
            out.append(self.data[s: s + self.seq_len + 1])
        return torch.stack(out).long()


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _Stop:
    """SIGTERM / SIGINT ask the loop to checkpoint and return instead of dying mid-step."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        if hasattr(signal, "SIGTERM") and _in_main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _leading_texts(named: Sequence[tuple[str, str]], chars: int) -> list[str]:
    """The texts of ``(name, text)`` pairs, whole and in order, until ``chars`` characters are taken."""
    texts, used = [], 0
    for _, text in named:
        if used >= chars:
            break
        texts.append(text)
        used += len(text)
    return texts


def encode_files(texts: Sequence[str], tokenizer, eos_id: int, vocab_size: int) -> torch.Tensor:
    """The training token stream: each text's ids followed by EOS. Shape ``(tokens,)``, int16 when
    the vocabulary fits (encoded 256 files at a time: a Python list of ~40M ints takes 1.5 GB)."""
    dtype = torch.int16 if vocab_size <= 32767 else torch.int32
    chunks = [torch.tensor([t for enc in tokenizer(list(texts[i: i + 256]))["input_ids"] for t in enc + [eos_id]],
                           dtype=dtype) for i in range(0, len(texts), 256)]
    return torch.cat(chunks)


def _prepare(run_dir: Path, spec: V4Spec, corpus: Corpus | None, log) -> tuple:
    """Corpus, tokenizer and token ids, built once and stored in the run folder (resumes reuse them)."""
    from transformers import PreTrainedTokenizerFast

    data_path, tok_dir, held_path = run_dir / "train_ids.pt", run_dir / "tokenizer", run_dir / "heldout.json"
    if not (data_path.exists() and tok_dir.exists() and held_path.exists()):
        started = time.perf_counter()
        corpus = corpus or code_corpus(spec, log)
        # The shuffled order: a sample of every source.
        tokenizer = train_tokenizer(_leading_texts(corpus.train, spec.tokenizer_sample_bytes), spec.vocab_size)
        eos_id = tokenizer.convert_tokens_to_ids(EOS)
        texts = [t for _, t in corpus.train]
        ids = encode_files(texts, tokenizer, eos_id, spec.vocab_size)
        _atomic_save(ids, data_path)
        _atomic_write(held_path, json.dumps({"heldout": corpus.heldout, "stats": corpus.stats}))
        shutil.rmtree(tok_dir, ignore_errors=True)
        tokenizer.save_pretrained(tok_dir)
        log(f"[zoo-v4] tokenizer: vocab {len(tokenizer)}, {ids.numel() / 1e6:.1f}M training tokens "
            f"({sum(len(t) for t in texts) / ids.numel():.2f} chars/token); "
            f"prepared in {time.perf_counter() - started:.0f}s")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    held = json.loads(held_path.read_text())
    return torch.load(data_path), tokenizer, [tuple(x) for x in held["heldout"]], held["stats"]


def _quick_texts(heldout: list[tuple[str, str]], chars: int) -> list[str]:
    out, used = [], 0
    for _, text in heldout:
        if used >= chars:
            break
        out.append(text[: chars - used])
        used += len(out[-1])
    return out


def _new_optimizer(model, spec: V4Spec, lr: float):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def _step(model, opt, batch: torch.Tensor, spec: V4Spec, lr: float, teacher=None) -> float:
    """One optimizer step over ``batch`` (rows, seq_len + 1), micro-batched; returns the mean loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    total = 0.0
    chunks = batch.split(spec.micro_batch)
    for chunk in chunks:
        inputs, labels = chunk[:, :-1], chunk[:, 1:]
        loss = lm_loss(model, inputs, labels, teacher)
        (loss / len(chunks)).backward()
        total += float(loss.detach()) / len(chunks)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return total


def _training_texts(data: torch.Tensor, tokenizer, eos_id: int, chars: int) -> list[str]:
    """The first files of the training token stream, decoded (about ``chars`` characters): text
    to fine-tune and judge the unlikelihood phase by without looking at the held-out split."""
    ends = (data[: 64 * chars // 3] == eos_id).nonzero().flatten().tolist()
    texts, start, used = [], 0, 0
    for end in ends:
        if used >= chars:
            break
        texts.append(tokenizer.decode(data[start:end].tolist()))
        used += len(texts[-1])
        start = end + 1
    return texts


def opening_prefixes(texts: Sequence[str], tokenizer, length: int) -> torch.Tensor:
    """The last ``length`` tokens of every code opening (:func:`opening_cases`) in ``texts``
    that has that many: prompts of the held-out workload's shape, from training text.
    Shape: ``(openings, length)`` int64."""
    prompts = [p for p, _ in opening_cases(texts, None)]
    rows = [ids[-length:] for ids in tokenizer(prompts)["input_ids"] if len(ids) >= length]
    if not rows:
        raise ValueError(f"no code opening of {length} tokens or more in the texts")
    return torch.tensor(rows, dtype=torch.int64)


def unlikelihood_round(spec: V4Spec, round_: int) -> tuple[int, int, int]:
    """(longest loop period penalised, continuation length, prefix seed) of unlikelihood round
    ``round_`` (1-based): its entry of ``spec.unlikelihood_rounds``, the continuation capped at a
    quarter of ``spec.seq_len``; a round past the table repeats the last entry with the next seeds."""
    if round_ < 1:
        raise ValueError(f"unlikelihood rounds count from 1, got {round_}")
    rounds = spec.unlikelihood_rounds
    max_period, continuation, seed_offset = rounds[min(round_, len(rounds)) - 1]
    seed_offset += max(0, round_ - len(rounds))
    return max_period, min(continuation, spec.seq_len // 4), spec.seed + seed_offset


def unlikelihood_phase(target, data: torch.Tensor, tokenizer, eos_id: int, heldout: list[tuple[str, str]],
                       spec: V4Spec, log, should_stop=None, round_: int = 1) -> dict | None:
    """Sequence-level unlikelihood fine-tune of ``target`` in place (``zoo_unlikelihood``), sized
    from ``spec``. The greedy continuations it penalises start from code openings of training
    text (``spec.unlikelihood_openings`` of them; the rest from random windows); it is judged on
    ``3 * spec.prompts`` other openings of training text (greedy collapse, distinct-4) and on the
    quick held-out slice (bits per character). ``round_``: how many times this target has been
    through the phase, this one included; the round's entry of ``spec.unlikelihood_rounds``
    gives the longest loop period penalised, the continuation length and the prefix seed's
    offset (so each round draws its own prefixes), and the judge stays the same. Returns the
    history (with ``round``), None when stopped."""
    from . import unlikelihood

    max_period, continuation, seed = unlikelihood_round(spec, round_)
    ul = unlikelihood.UnlikelihoodSpec(
        steps=spec.unlikelihood_steps, lr=spec.unlikelihood_lr, alpha=spec.unlikelihood_alpha,
        opening_fraction=spec.unlikelihood_openings, prefix_len=min(48, spec.seq_len // 4),
        continuation_len=continuation, max_period=max_period, mle_seq_len=min(256, spec.seq_len), seed=seed,
        log_every=spec.log_every, eval_every=max(1, spec.unlikelihood_steps // 4))
    # The first files judge, the next ones (50x as much text) give the prefixes: disjoint.
    judge_chars = 4 * spec.quick_eval_chars
    texts = _training_texts(data, tokenizer, eos_id, 51 * judge_chars)
    split = next((i + 1 for i, used in enumerate(itertools.accumulate(map(len, texts))) if used >= judge_chars),
                 len(texts))
    cases = opening_cases(texts[:split], 3 * spec.prompts)
    prefixes = opening_prefixes(texts[split:], tokenizer, ul.prefix_len) if split < len(texts) else None
    quick = _quick_texts(heldout, spec.quick_eval_chars)

    def evaluate(model) -> dict:
        model.eval()
        q = greedy_quality(model, tokenizer, cases, spec.prompt_new_tokens, eos_id)
        return {"train_prompts": q["prompts"], "train_prompts_collapsed": q["collapsed"],
                "train_prompts_distinct_4": q["distinct_4_greedy"],
                "quick_bpc": bits_per_char(model, tokenizer, quick, spec.seq_len, eos_id)["bits_per_char"]}

    log(f"[zoo-v4] unlikelihood fine-tune of the target (round {round_}): {ul.steps} steps, "
        f"{0 if prefixes is None else len(prefixes)} code openings to continue from")
    history = unlikelihood.finetune(target, data, ul, evaluate, log, should_stop, prefixes)
    if history is not None:
        history.pop("steps")  # per-step losses: in the log, not the report
        history["round"] = round_
    return history


def _spec_dict(spec: V4Spec) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(spec)))


def train_v4(run_dir: Path | None = None, spec: V4Spec = V4_SPEC, corpus: Corpus | None = None,
             log: Callable[[str], None] | None = None, stop_after: int | None = None,
             export_to: Path | None = None) -> dict:
    """Start or resume the v4 run in ``run_dir``; returns the state summary (or the final report).

    ``stop_after``: checkpoint and return once this many steps (target then draft steps,
    counted together) are done, as an interrupted run would (tests; the CLI runs to the end).
    ``corpus``: texts to use instead of :func:`code_corpus` (only read when the run starts).
    When both phases are done, the evaluation report is written to ``run_dir/report.json`` and
    the pair exported to ``run_dir/export`` and to ``export_to`` when given.
    """
    run_dir = Path(run_dir or default_run_dir())
    run_dir.mkdir(parents=True, exist_ok=True)
    # Two processes on one run folder would overwrite each other's checkpoints: one at a time.
    with open(run_dir / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another process is training in {run_dir} (it holds {run_dir / 'lock'})") from None
        return _train_locked(run_dir, spec, corpus, log, stop_after, export_to)


def _train_locked(run_dir: Path, spec: V4Spec, corpus: Corpus | None, log, stop_after: int | None,
                  export_to: Path | None) -> dict:
    log_file = run_dir / "train.log"

    def out(line: str) -> None:
        stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}"
        with open(log_file, "a") as f:
            f.write(stamped + "\n")
        (log or print)(line)

    spec_path = run_dir / "spec.json"
    if spec_path.exists():
        frozen = json.loads(spec_path.read_text())
        if frozen != _spec_dict(spec):
            diff = {k: (frozen.get(k), v) for k, v in _spec_dict(spec).items() if frozen.get(k) != v}
            raise ValueError(f"run folder {run_dir} holds a run of another spec (frozen, given): {diff}; "
                             f"use another --run-dir or the same spec")
    else:
        _atomic_write(spec_path, json.dumps(_spec_dict(spec), indent=2))
    data, tokenizer, heldout, stats = _prepare(run_dir, spec, corpus, out)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    sampler = WindowSampler(data, spec.seq_len, spec.seed)
    quick = _quick_texts(heldout, spec.quick_eval_chars)

    ckpt_path = run_dir / CHECKPOINT
    torch.manual_seed(spec.seed)
    target = _llama(spec.target, spec, eos_id)
    torch.manual_seed(spec.seed + 1)
    draft = _llama(spec.draft, spec, eos_id)
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        target.load_state_dict(state["target"])
        if state["draft"] is not None:
            draft.load_state_dict(state["draft"])
        torch.set_rng_state(state["rng"])
        out(f"[zoo-v4] resuming {state['phase']} at step {state['step']} (data position {state['pos']})")
    else:
        state = {"phase": "target", "step": 0, "pos": 0, "tokens": 0, "seconds": 0.0, "evals": [],
                 "results": {}}
        torch.manual_seed(spec.seed)
    params = {"target": sum(p.numel() for p in target.parameters()),
              "draft": sum(p.numel() for p in draft.parameters())}

    def checkpoint(opt) -> None:
        state["rng"] = torch.get_rng_state()
        state["target"] = target.state_dict()
        state["draft"] = draft.state_dict() if state["phase"] in ("draft", "done") else None
        state["optimizer"] = opt.state_dict() if opt is not None else None
        _atomic_save(state, ckpt_path)

    offsets = {"target": 0, "unlikelihood": spec.target_steps,
               "draft": spec.target_steps + spec.unlikelihood_steps}
    done_steps = lambda: state["step"] + offsets[state["phase"]]  # noqa: E731

    def stopped(opt) -> dict:
        checkpoint(opt)
        out(f"[zoo-v4] stopped at {state['phase']} step {state['step']}; checkpoint saved, run again to resume")
        return {k: state[k] for k in ("phase", "step", "pos", "tokens")}

    def start_draft() -> None:
        if spec.draft_from_target:
            init_draft_from_target(draft, target)
        state.update(phase="draft", step=0, optimizer=None)

    with _Stop() as stop:
        for phase in ("target", "unlikelihood", "draft"):
            if state["phase"] != phase:
                continue
            if phase == "unlikelihood":
                # Minutes long and checkpointed only at its end: a stop restarts it from the
                # target phase's weights, which the checkpoint still holds.
                began = time.perf_counter()
                asked = lambda: stop.requested or (stop_after is not None and done_steps() >= stop_after)  # noqa: E731
                history = None if asked() else unlikelihood_phase(target, data, tokenizer, eos_id, heldout,
                                                                   spec, out, asked)
                if history is None:
                    target.load_state_dict(torch.load(ckpt_path, weights_only=False)["target"])
                    return stopped(None)
                state["results"]["unlikelihood"] = history
                state["results"]["target_heldout"] = bits_per_char(
                    target, tokenizer, [t for _, t in heldout], spec.seq_len, eos_id)
                out(f"[zoo-v4] unlikelihood done: held-out "
                    f"{state['results']['target_heldout']['bits_per_char']:.3f} bits/char")
                start_draft()
                state["seconds"] += time.perf_counter() - began
                checkpoint(None)
                continue
            model = target if phase == "target" else draft
            teacher = target if phase == "draft" else None
            steps = spec.target_steps if phase == "target" else spec.draft_steps
            peak = spec.target_lr if phase == "target" else spec.draft_lr
            opt = _new_optimizer(model, spec, peak)
            if state.get("optimizer") is not None:
                opt.load_state_dict(state["optimizer"])
            if teacher is not None:
                teacher.eval()
                teacher.requires_grad_(False)
            model.train()
            tokens_per_step = spec.batch_size * spec.seq_len
            out(f"[zoo-v4] {phase}: {params[phase] / 1e6:.2f}M params, steps {state['step']}/{steps} "
                f"of {spec.batch_size}x{spec.seq_len} tokens; {torch.get_num_threads()} thread(s)")
            began, began_step, last_ckpt = time.perf_counter(), state["step"], time.perf_counter()
            cpu_began = time.process_time()
            smooth = None
            while state["step"] < steps:
                if stop.requested or (stop_after is not None and done_steps() >= stop_after):
                    state["seconds"] += time.perf_counter() - began
                    return stopped(opt)
                lr = lr_at(state["step"], steps, peak, spec.warmup_steps, spec.min_lr_ratio)
                loss = _step(model, opt, sampler.batch(state["pos"], spec.batch_size), spec, lr, teacher)
                state["step"] += 1
                state["pos"] += spec.batch_size
                state["tokens"] += tokens_per_step
                smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss
                now = time.perf_counter()
                if state["step"] % spec.log_every == 0 or state["step"] == steps:
                    rate = (state["step"] - began_step) * tokens_per_step / (now - began)
                    # Per CPU-second of this process: the cost in core-hours, whatever the load.
                    cpu_rate = ((state["step"] - began_step) * tokens_per_step
                                / max(1e-9, time.process_time() - cpu_began))
                    eta = (steps - state["step"]) * tokens_per_step / rate
                    if phase == "target":  # then the draft: a target forward and a 1-layer step each
                        eta += spec.draft_steps * tokens_per_step / rate * 0.6
                    out(f"  {phase} step {state['step']:5d}/{steps}  loss {loss:.3f} (avg {smooth:.3f})  "
                        f"lr {lr:.2e}  {rate:6.0f} tok/s ({cpu_rate:.0f}/cpu-s)  "
                        f"epoch {state['pos'] / sampler.per_epoch:.2f}  ETA {eta / 3600:5.2f} h")
                if phase == "target" and (state["step"] % spec.eval_every == 0):
                    model.eval()
                    bpc = bits_per_char(model, tokenizer, quick, spec.seq_len, eos_id)["bits_per_char"]
                    model.train()
                    state["evals"].append({"step": state["step"], "train_loss": smooth, "quick_bpc": bpc})
                    out(f"[zoo-v4] step {state['step']}: held-out {bpc:.3f} bits/char "
                        f"(first {spec.quick_eval_chars} chars of the held-out split)")
                if now - last_ckpt >= spec.checkpoint_seconds:
                    state["seconds"] += now - began
                    began, began_step, cpu_began = now, state["step"], time.process_time()
                    checkpoint(opt)
                    last_ckpt = time.perf_counter()
            model.eval()
            if phase == "target":
                res = bits_per_char(target, tokenizer, [t for _, t in heldout], spec.seq_len, eos_id)
                state["results"]["target_heldout"] = res
                out(f"[zoo-v4] target done: held-out {res['bits_per_char']:.3f} bits/char "
                    f"({res['nats_per_token']:.3f} nats/token, {res['chars_per_token']:.2f} chars/token)")
                if spec.unlikelihood_steps:
                    state["results"]["target_heldout_before_unlikelihood"] = res
                    state.update(phase="unlikelihood", step=0, optimizer=None)
                else:
                    start_draft()
            else:
                state.update(phase="done", step=0, optimizer=None)
            state["seconds"] += time.perf_counter() - began
            checkpoint(None)

    report = _finish(run_dir, spec, target, draft, tokenizer, heldout, stats, state, params, eos_id, out)
    if export_to is not None:
        copy_export(run_dir / "export", export_to)
    return report


def copy_export(export: Path, dest: Path) -> None:
    """Copy an exported pair folder to ``dest`` (the zoo cache), replacing it in one rename."""
    tmp = Path(dest).with_name(Path(dest).name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(export, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _finish(run_dir, spec, target, draft, tokenizer, heldout, stats, state, params, eos_id, out) -> dict:
    """Evaluate the finished pair, write report.json and the Hugging Face export folders."""
    report_path = run_dir / "report.json"
    if report_path.exists() and (run_dir / "export").exists():
        return json.loads(report_path.read_text())
    texts = [t for _, t in heldout]
    if "target_heldout" not in state["results"]:
        state["results"]["target_heldout"] = bits_per_char(target, tokenizer, texts, spec.seq_len, eos_id)
    draft_bpc = bits_per_char(draft, tokenizer, texts, spec.seq_len, eos_id)
    ids = torch.tensor([i for t in _quick_texts(heldout, 4 * spec.quick_eval_chars)
                        for i in [eos_id] + tokenizer(t)["input_ids"]])
    agree = agreement(target, draft, ids, spec.seq_len)
    cases = opening_cases(texts, spec.prompts)
    quality = greedy_quality(target, tokenizer, cases, spec.prompt_new_tokens, eos_id)
    report = {
        "spec": _spec_dict(spec), "corpus": {k: v for k, v in stats.items() if k != "heldout_files"},
        "heldout_files": stats.get("heldout_files"), "python": sys.version.split()[0],
        "params": params, "train_tokens_seen": state["tokens"], "train_seconds": state["seconds"],
        "target_heldout": state["results"]["target_heldout"], "draft_heldout": draft_bpc,
        "agreement": agree, "greedy_quality": quality, "evals": state["evals"],
    }
    for key in ("target_heldout_before_unlikelihood", "unlikelihood", "refined_from"):
        if key in state["results"]:
            report[key] = state["results"][key]
    out(f"[zoo-v4] done: target {report['target_heldout']['bits_per_char']:.3f} bits/char, draft "
        f"{draft_bpc['bits_per_char']:.3f}; draft agrees with target on {100 * agree['greedy']:.1f}% (greedy); "
        f"greedy distinct-4 {quality['distinct_4_greedy']:.2f} vs corpus {quality['distinct_4_corpus']:.2f}, "
        f"{quality['collapsed']}/{quality['prompts']} collapsed")
    save_pair(run_dir / "export", target, draft, tokenizer, eos_id, report)
    _atomic_write(report_path, json.dumps(report, indent=2))
    return report


def refine_pair(pair_dir: Path, out_dir: Path, spec: V4Spec = V4_SPEC, corpus: Corpus | None = None,
                draft_steps: int = 150, train_chars: int = 20_000_000,
                log: Callable[[str], None] | None = None) -> dict:
    """The unlikelihood phase and a shorter draft distillation, applied to a finished pair.

    For a pair trained before the unlikelihood phase existed (the shipped v4 pair was), or one
    more round for a pair that has been through it: its target is fine-tuned as
    :func:`unlikelihood_phase` does inside :func:`train_v4` (round 1 for a pair without an
    ``unlikelihood`` entry in its report, else the next round), its draft distilled again from
    the result for ``draft_steps`` steps (continuing from the old draft, at a quarter of
    ``spec.draft_lr``), and the pair evaluated and written to ``out_dir/export`` as a finished
    run writes it, with ``refined_from`` in the report: the old report's figures, and its own
    ``unlikelihood`` and ``refined_from`` where it had them (so the chain back to the trained
    pair stays readable). The training text is the first ``train_chars`` characters of the
    corpus's shuffled training files, encoded with the pair's own tokenizer; the held-out split
    is untouched.
    """
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    pair_dir, out_dir = Path(pair_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "train.log"

    def out(line: str) -> None:
        with open(log_file, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        (log or print)(line)

    started = time.perf_counter()
    old = json.loads((pair_dir / "report.json").read_text())
    # Reports from before rounds were counted hold one round without a "round" entry.
    round_ = old["unlikelihood"].get("round", 1) + 1 if "unlikelihood" in old else 1
    tokenizer = PreTrainedTokenizerFast.from_pretrained(pair_dir / "target")
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    target = AutoModelForCausalLM.from_pretrained(pair_dir / "target", dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(pair_dir / "draft", dtype=torch.float32)
    corpus = corpus or code_corpus(spec, out)
    data = encode_files(_leading_texts(corpus.train, train_chars), tokenizer, eos_id, len(tokenizer))
    out(f"[zoo-v4] refining {pair_dir} (unlikelihood round {round_}): {data.numel() / 1e6:.1f}M training tokens")

    history = unlikelihood_phase(target, data, tokenizer, eos_id, corpus.heldout, spec, out, round_=round_)
    target.eval().requires_grad_(False)
    sampler = WindowSampler(data, spec.seq_len, spec.seed)
    opt = _new_optimizer(draft, spec, spec.draft_lr / 4)
    draft.train()
    for step in range(draft_steps):
        lr = lr_at(step, draft_steps, spec.draft_lr / 4, spec.warmup_steps, spec.min_lr_ratio)
        loss = _step(draft, opt, sampler.batch(step * spec.batch_size, spec.batch_size), spec, lr, target)
        if (step + 1) % spec.log_every == 0 or step + 1 == draft_steps:
            out(f"  draft step {step + 1:4d}/{draft_steps}  KL {loss:.3f}  lr {lr:.2e}")
    draft.eval()
    keys = ("target_heldout", "draft_heldout", "agreement", "greedy_quality", "train_seconds", "train_tokens_seen",
            "unlikelihood", "refined_from")
    state = {"tokens": old.get("train_tokens_seen", 0) + draft_steps * spec.batch_size * spec.seq_len,
             "seconds": old.get("train_seconds", 0.0) + time.perf_counter() - started,
             "evals": old.get("evals", []),
             "results": {"unlikelihood": history,
                         "refined_from": {k: old[k] for k in keys if k in old} | {"draft_steps": draft_steps}}}
    params = {"target": sum(p.numel() for p in target.parameters()),
              "draft": sum(p.numel() for p in draft.parameters())}
    (out_dir / "report.json").unlink(missing_ok=True)  # _finish keeps a finished report
    shutil.rmtree(out_dir / "export", ignore_errors=True)
    return _finish(out_dir, spec, target, draft, tokenizer, corpus.heldout, corpus.stats, state, params, eos_id, out)
