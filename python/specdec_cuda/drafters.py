"""The drafter cache: drafters trained for a target, found by the target's fingerprint.

Medusa heads, MTP modules, DFlash and EAGLE-3 drafters only work on the target they were trained
for. ``python -m specdec_cuda.train KIND --target DIR`` writes what it trains here, and a method
given no drafter (``method="medusa"`` without ``heads=``, ``"dflash"`` without ``drafter=`` ...)
looks here for the one trained for *this* target; finding none, it raises FileNotFoundError naming
the train command. Nothing is guessed from another model.

Layout: ``<root>/<fingerprint>/<kind>/`` (a drafter folder: ``config.json`` plus weights), ``kind``
one of ``KINDS``. The root that ``train`` writes to is ``$SPECDEC_DRAFTERS_DIR`` (default
``~/.cache/specdec_cuda/drafters``); ``$SPECDEC_DRAFTERS_PATH`` (``os.pathsep``-separated) adds
read-only roots, e.g. a team's shared folder. ``register`` adds one folder for one target in this
process only (a source checkout's zoo registers its shipped drafters this way).

The fingerprint (``fingerprint``) hashes what decides a drafter's fit: the target's shape (vocab,
hidden size, layers, heads, intermediate size) and the values of its input embedding, final norm
and LM head at fixed, spread-out rows, as float32. The same weights loaded in another float dtype
that holds them exactly (a bf16 checkpoint read as float32) keep the fingerprint; weights that
differ (another fine-tune, a GGUF-quantised copy) get another one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

KINDS = ("medusa", "mtp", "dflash", "eagle3", "exit")
SAMPLED_ROWS = 64  # rows of the embedding / LM head hashed: enough to tell fine-tunes apart

_registered: dict[tuple[str, str], Path] = {}  # (fingerprint, kind) -> folder, this process only
_fingerprints: dict[int, tuple[object, str]] = {}  # id(target) -> (target, fingerprint), computed once


def write_root() -> Path:
    """Where ``train`` stores drafters: ``$SPECDEC_DRAFTERS_DIR`` or ``~/.cache/specdec_cuda/drafters``."""
    env = os.environ.get("SPECDEC_DRAFTERS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec_cuda" / "drafters"


def roots() -> list[Path]:
    """The roots searched, in order: the write root, then ``$SPECDEC_DRAFTERS_PATH``'s entries."""
    extra = [Path(p).expanduser() for p in os.environ.get("SPECDEC_DRAFTERS_PATH", "").split(os.pathsep) if p]
    return [write_root(), *extra]


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"drafter kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def _spread_rows(n: int, count: int = SAMPLED_ROWS) -> torch.Tensor:
    """``count`` row indices spread over ``0 .. n - 1``, first and last included."""
    return torch.linspace(0, n - 1, min(n, count)).round().long().unique()


def fingerprint(target) -> str:
    """16 hex digits naming ``target``'s weights (see the module docstring). Computed once per
    target object (a few hundred rows read: milliseconds even for a large model)."""
    seen = _fingerprints.get(id(target))
    if seen is not None and seen[0] is target:
        return seen[1]
    from .models.heads import target_head
    from .models.llama import LlamaModel

    h = hashlib.sha256()
    if isinstance(target, LlamaModel):
        # The sampled rows only: a packed or GGUF model keeps its head (and a tied or GGUF embedding)
        # as panels or blocks, which target_head would decode whole.
        c, norm = target.config, target.norm.weight
        rows = _spread_rows(c.vocab_size).to(target.device)
        sampled = (("embed", target.embed(rows)), ("lm_head", target.output_rows(rows)))
    else:
        head = target_head(target)
        c, norm = head.config, head.norm_weight
        sampled = tuple((name, w.detach().index_select(0, _spread_rows(w.shape[0]).to(w.device)))
                        for name, w in (("embed", head.embed), ("lm_head", head.lm_head)))
    shape = (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
             c.intermediate_size)
    h.update(repr(shape).encode())
    for name, picked in sampled:
        h.update(name.encode())
        h.update(picked.detach().float().cpu().contiguous().numpy().tobytes())
    h.update(norm.detach().float().cpu().contiguous().numpy().tobytes())
    value = h.hexdigest()[:16]
    _fingerprints[id(target)] = (target, value)
    return value


def drafter_dir(target, kind: str) -> Path:
    """Where ``train`` writes ``target``'s drafter of ``kind``: ``<write root>/<fingerprint>/<kind>``."""
    return write_root() / fingerprint(target) / _check_kind(kind)


def register(target, kind: str, folder: str | os.PathLike) -> None:
    """Make ``folder`` the ``kind`` drafter of ``target`` for this process (before the cache)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: not a drafter folder (no config.json)")
    _registered[(fingerprint(target), _check_kind(kind))] = folder


def find(target, kind: str) -> Path | None:
    """The folder of ``target``'s ``kind`` drafter (registered, then each root), or None."""
    fp = fingerprint(target)
    found = _registered.get((fp, _check_kind(kind)))
    if found is not None:
        return found
    for root in roots():
        folder = root / fp / kind
        if (folder / "config.json").is_file():
            return folder
    return None


def target_folder(target) -> Path | None:
    """The checkpoint folder ``target`` was loaded from, when known: the one ``models.load``
    records, or for an ``HFCausalLM`` the folder transformers read."""
    folder = getattr(target, "checkpoint_dir", None)
    if folder is None:
        folder = getattr(getattr(getattr(target, "model", None), "config", None), "_name_or_path", None) or None
    return Path(folder) if folder else None


def train_command(target, kind: str) -> str:
    """The command that trains ``target``'s ``kind`` drafter, with its folder when it is known."""
    return f"python -m specdec_cuda.train {kind} --target {target_folder(target) or 'DIR'} --prompts FILE"


def cached_drafter(target, kind: str) -> Path:
    """``find``, or FileNotFoundError naming the fingerprint, where it looked and the train command."""
    folder = find(target, kind)
    if folder is not None:
        return folder
    looked = ", ".join(str(r) for r in roots())
    raise FileNotFoundError(
        f"no {kind} drafter for this target (fingerprint {fingerprint(target)}; looked in {looked}): "
        f"pass one explicitly, or train one with `{train_command(target, kind)}`")
