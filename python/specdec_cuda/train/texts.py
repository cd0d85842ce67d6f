"""The prompts a drafter is trained on: the user's own prompts, or windows cut from their texts.

Two sources (``prompts_from_file`` / ``prompts_from_texts``), both ending as token-id prompts for
the target to continue (``distill``):

* ``--prompts FILE``: prompts as users send them. ``.jsonl``: one JSON value per line, a string
  or an object with ``"prompt"``, ``"text"`` or ``"messages"`` (chat turns); ``.json``: a list of
  the same; any other file: one prompt per non-empty line. With a chat template (``chat``:
  ``"auto"`` uses the tokenizer's when it has one), each prompt becomes one user turn, or its
  ``messages``, with the generation prompt appended, as an instruct model is served.
* ``--data PATH``: a text file or a folder of them (``--glob``, default every file): raw text, as
  a base model continues it. Prompts are the ``prompt_tokens`` tokens before randomly chosen line
  starts, so continuations begin where code and prose do.

``split_held_out`` sets aside a fixed part of the prompts (every ``HELD_OUT_EVERY``-th, at least
``MIN_HELD_OUT``): the report's acceptance is measured on prompts never trained on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_EVERY = 16
MIN_HELD_OUT = 8


@dataclass
class Prompt:
    """One prompt: its text (or chat turns) before tokenization."""

    text: str | None = None
    messages: list[dict] | None = None


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a ``.jsonl`` / ``.json`` / plain-text file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--prompts {path}: no such file")
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        values = [(i + 1, json.loads(line)) for i, line in enumerate(raw.splitlines()) if line.strip()]
    elif path.suffix == ".json":
        data = json.loads(raw)
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json prompts file holds a list of prompts")
        values = list(enumerate(data, start=1))
    else:
        return [Prompt(text=line) for line in raw.splitlines() if line.strip()]
    out = []
    for where, value in values:
        if isinstance(value, str):
            out.append(Prompt(text=value))
        elif isinstance(value, dict) and isinstance(value.get("messages"), list):
            out.append(Prompt(messages=value["messages"]))
        elif isinstance(value, dict) and isinstance(value.get("prompt", value.get("text")), str):
            out.append(Prompt(text=value.get("prompt", value.get("text"))))
        else:
            raise ValueError(f"{path}:{where}: expected a string or an object with 'prompt', 'text' or 'messages'")
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def encode_prompts(tokenizer, prompts: list[Prompt], chat: str = "auto", max_tokens: int = 512) -> list[list[int]]:
    """Token ids of each prompt, chat-templated when ``chat`` asks for it (``"auto"``: when the
    tokenizer has a template; ``"on"`` / ``"off"``), keeping the last ``max_tokens`` tokens."""
    if chat not in ("auto", "on", "off"):
        raise ValueError(f"chat must be 'auto', 'on' or 'off', got {chat!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat == "on" and not has_template:
        raise ValueError("chat='on' but the target's tokenizer has no chat template")
    templated = chat == "on" or (chat == "auto" and has_template)
    out = []
    for p in prompts:
        if templated or p.messages is not None:
            if not has_template:
                raise ValueError("a prompt gives chat messages but the target's tokenizer has no chat template")
            messages = p.messages if p.messages is not None else [{"role": "user", "content": p.text}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            # The template wrote the special tokens already: no BOS again (as the bench encodes).
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(p.text, add_special_tokens=True)["input_ids"]
        if ids:
            out.append(list(ids)[-max_tokens:])
    return out


def read_texts(path: str | Path, glob: str = "*") -> list[str]:
    """The texts of a file, or of the files under a folder matching ``glob`` (sorted; unreadable
    or non-UTF-8 files are skipped)."""
    path = Path(path)
    if path.is_file():
        return [path.read_text(encoding="utf-8", errors="replace")]
    if not path.is_dir():
        raise FileNotFoundError(f"--data {path}: no such file or folder")
    texts = []
    for f in sorted(path.rglob(glob)):
        if f.is_file():
            try:
                texts.append(f.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue
    if not texts:
        raise ValueError(f"--data {path}: no readable text files matching {glob!r}")
    return texts


def prompts_from_texts(tokenizer, texts: list[str], count: int, prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``prompt_tokens`` tokens, each ending at a line start of one of
    ``texts`` (chosen uniformly over all line starts with enough text before them)."""
    rng = random.Random(seed)
    starts = []  # (text index, char offset of a line start)
    for i, text in enumerate(texts):
        offset = 0
        for line in text.splitlines(keepends=True)[:-1]:  # a line start with a line after it
            offset += len(line)
            if offset >= 2 * prompt_tokens:  # room for the prompt at two characters a token or more
                starts.append((i, offset))
    if not starts:
        raise ValueError("the texts are too short to cut prompts from")
    out, tries = [], 0
    while len(out) < count and tries < 20 * count:
        tries += 1
        i, end = rng.choice(starts)
        # Enough characters for prompt_tokens tokens at any plausible tokenizer (>= 1 char a token).
        ids = tokenizer(texts[i][max(0, end - 12 * prompt_tokens):end], add_special_tokens=False)["input_ids"]
        if len(ids) >= prompt_tokens:
            out.append(ids[-prompt_tokens:])
    if not out:
        raise ValueError(f"no prompt of {prompt_tokens} tokens could be cut from the texts")
    return out


def split_held_out(prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """(training prompts, held-out prompts): every ``HELD_OUT_EVERY``-th prompt, at least
    ``MIN_HELD_OUT`` (and at most half), is held out."""
    n = len(prompts)
    if n < 2:
        raise ValueError(f"need at least 2 prompts (one is held out for the report), got {n}")
    step = max(2, min(HELD_OUT_EVERY, n // MIN_HELD_OUT))
    held = set(range(step - 1, n, step))
    return [p for i, p in enumerate(prompts) if i not in held], [p for i, p in enumerate(prompts) if i in held]
