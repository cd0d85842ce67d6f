"""Self-distillation data: the target's own continuations of the prompts, and its hidden states
over them, computed once and kept on disk.

A drafter should predict what the target will say, not what some corpus says, so the labels are
the target's continuations of the training prompts (greedy, and a ``sampled_fraction`` sampled at
``temperature``, which widens what the drafter sees). The drafters read the target's hidden
states over those sequences: the final normed state (Medusa, MTP) and a few inner layers (DFlash,
EAGLE-3). One target forward per sequence gives them all; they are stored for the union of the
layers every drafter kind needs (``feature_layers``), so one cache serves every kind and every
epoch. With ``gen_tokens = 0`` the target only reads the prompts (teacher forcing, the exit
adapter's default): the sequences are the prompts, and the labels come from the target's own
distributions over them (its final normed state), not from the text.

On disk (``<drafter cache>/<target fingerprint>/features/<key>/``): shards of ``SHARD`` prompts,
``shard-00000.safetensors`` ..., each with ``tokens`` [S] int64 (the sequences, concatenated),
``offsets`` [n + 1], ``prompt_lens`` [n] and one ``layer.<i>`` [S, H] float16 per layer, written
atomically; an interrupted run resumes at the first missing shard. ``key`` hashes the prompts,
the layers and the generation settings, so other prompts or settings get another folder.
``cached_features`` also takes a finished folder of the same prompts and settings that holds more
layers than asked (one made for a drafter kind that reads more: teacher-forced EAGLE-3 data serves
Medusa and MTP, which read only the final state) and loads just the layers asked for.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..models.protocol import prefill_kwargs

SHARD = 32  # prompts per shard: a few minutes of a 1.5B target on CPU, so little is lost to an interrupt


@dataclass(frozen=True)
class DistillSpec:
    """How the target continues the prompts."""

    gen_tokens: int = 64  # tokens generated per prompt (fewer when it emits EOS); 0: the prompts only
    sampled_fraction: float = 0.0  # this share of the prompts is continued by sampling, the rest greedily
    temperature: float = 1.0  # of the sampled continuations
    batch_size: int = 16  # prompts decoded (and run for hidden states) together
    seed: int = 0


def feature_layers(target) -> tuple[int, ...]:
    """The hidden-state layers every drafter kind reads, sorted (``-1``: the final normed state):
    Medusa and MTP read ``-1``, DFlash its default target layers, EAGLE-3 its low / middle / high
    layers."""
    from ..models.dflash import DFlashConfig
    from ..models.eagle3 import Eagle3Config

    layers = {-1, *DFlashConfig.for_target(target).target_layers, *Eagle3Config.for_target(target).target_layers}
    return tuple(sorted(layers))


@dataclass
class FeatureSet:
    """Sequences (prompt + target continuation) and the target's hidden states over them, flat.

    Shape: tokens [S] int64; offsets [N + 1] (sequence i is ``offsets[i]:offsets[i + 1]``);
    prompt_lens [N]; hidden: layer -> [S, H] float16.
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    prompt_lens: torch.Tensor
    hidden: dict[int, torch.Tensor]

    def __len__(self) -> int:
        return self.prompt_lens.numel()

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def generated_tokens(self) -> int:
        return int((self.lengths - self.prompt_lens).sum())

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each id occurs in the sequences (what draft vocabularies are chosen by).
        Shape: [vocab_size] int64."""
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        return counts.index_add_(0, self.tokens, torch.ones_like(self.tokens))

    def batch(self, rows, layers=(), dtype=torch.float32, start: int = 0):
        """Sequences ``rows``, right-padded, from token ``start`` on (a common cut of the prompt).

        Returns tokens [B, T] int64 (padding 0), mask [B, T] bool (True on tokens the target
        generated), hidden {layer: [B, T, H] dtype} for ``layers`` (padding 0).
        """
        rows = torch.as_tensor(rows, dtype=torch.int64).reshape(-1)
        lo = self.offsets[rows] + start
        n = (self.offsets[rows + 1] - lo).clamp(min=0)
        T = int(n.max())
        col = torch.arange(T)
        valid = col[None] < n[:, None]  # [B, T]
        index = (lo[:, None] + col[None]).clamp(max=self.tokens.numel() - 1)
        tokens = torch.where(valid, self.tokens[index], 0)
        generated = valid & (col[None] + start >= self.prompt_lens[rows, None])
        hidden = {l: torch.where(valid[..., None], self.hidden[l][index].to(dtype), 0) for l in layers}
        return tokens, generated, hidden


def cache_key(prompts: list[list[int]], layers: tuple[int, ...], spec: DistillSpec, eos: tuple[int, ...]) -> str:
    h = hashlib.sha256(json.dumps([prompts, list(layers), asdict(spec), list(eos)]).encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def continue_prompts(target, prompts: list[list[int]], spec: DistillSpec, eos: tuple[int, ...],
                     first_index: int) -> list[list[int]]:
    """Each prompt followed by the target's continuation: greedy, or sampled for the prompts whose
    global index falls in the sampled share (seeded per prompt, so a resumed run repeats it)."""
    from ..decoding import SamplingParams, decode

    temps = [spec.temperature if _sampled(first_index + i, spec.sampled_fraction) else 0.0 for i in range(len(prompts))]
    seeds = [spec.seed * 1_000_003 + first_index + i for i in range(len(prompts))]
    params = SamplingParams.make(len(prompts), temps, 0, 1.0, seeds, device=_device(target))
    out = decode(target, prompts, params, spec.gen_tokens, eos_token_id=eos)
    return [p + o for p, o in zip(prompts, out.tokens)]


def _sampled(index: int, fraction: float) -> bool:
    # Spread evenly: prompt i is sampled when floor((i + 1) * f) > floor(i * f).
    return int((index + 1) * fraction) > int(index * fraction)


def _device(target) -> torch.device:
    return torch.device(getattr(target, "device", "cpu"))  # the protocol's (a packed model's parameters are meta)


@torch.no_grad()
def hidden_states(target, sequences: list[list[int]], layers: tuple[int, ...]) -> dict[int, list[torch.Tensor]]:
    """The target's hidden states at ``layers`` over each sequence (one forward, right-padded; only
    the first logit is computed). Returns layer -> one [len_i, H] float16 tensor per sequence."""
    device = _device(target)
    B, T = len(sequences), max(len(s) for s in sequences)
    tokens = torch.zeros(B, T, dtype=torch.int64)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = torch.tensor(s)
    cache = target.new_cache(B, T)
    positions = torch.arange(T).expand(B, T)
    # Run as a prompt (``prefill_kwargs``): features need not carry a verification's bits, and a
    # GGUF target on an AMX CPU then reads them on its faster prompt kernels (bfloat16 tiles).
    out = target.forward(tokens.to(device), positions.to(device), cache, hidden_layers=layers,
                         logits_at=torch.zeros(B, dtype=torch.int64, device=device), **prefill_kwargs(target))
    return {l: [out.hidden_states[l][i, : len(s)].to("cpu", torch.float16) for i, s in enumerate(sequences)]
            for l in layers}


def _write_shard(path: Path, sequences: list[list[int]], prompt_lens: list[int],
                 hidden: dict[int, list[torch.Tensor]]) -> None:
    from safetensors.torch import save_file

    lengths = torch.tensor([len(s) for s in sequences])
    tensors = {"tokens": torch.tensor([t for s in sequences for t in s], dtype=torch.int64),
               "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
               "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int64)}
    for l, parts in hidden.items():
        tensors[f"layer.{l}"] = torch.cat(parts).contiguous()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.rename(path)


def load_features(folder: str | Path, layers: tuple[int, ...] | None = None) -> FeatureSet:
    """Every shard of a features folder, concatenated; of its hidden states only ``layers`` (None:
    all it holds)."""
    from safetensors import safe_open

    folder = Path(folder)
    shards = sorted(folder.glob("shard-*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{folder}: no feature shards")
    parts = []
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            keys = [k for k in f.keys()
                    if not k.startswith("layer.") or layers is None or int(k.split(".", 1)[1]) in layers]
            parts.append({k: f.get_tensor(k) for k in keys})
    held = sorted(int(k.split(".", 1)[1]) for k in parts[0] if k.startswith("layer."))
    if layers is not None and sorted(set(layers)) != held:
        raise ValueError(f"{folder}: holds layers {held}, not all of {sorted(set(layers))}")
    layers = held
    tokens = torch.cat([p["tokens"] for p in parts])
    offsets, base = [torch.zeros(1, dtype=torch.int64)], 0
    for p in parts:
        offsets.append(p["offsets"][1:] + base)
        base += int(p["offsets"][-1])
    return FeatureSet(tokens, torch.cat(offsets), torch.cat([p["prompt_lens"] for p in parts]),
                      {l: torch.cat([p[f"layer.{l}"] for p in parts]) for l in layers})


def _shard_path(folder: Path, start: int) -> Path:
    """The shard of the prompts from index ``start`` on (a multiple of ``SHARD``)."""
    return folder / f"shard-{start // SHARD:05d}.safetensors"


def _missing_shards(folder: Path, prompts: list[list[int]]) -> list[int]:
    """The first prompt index of each shard of ``prompts`` not yet written under ``folder``."""
    return [s for s in range(0, len(prompts), SHARD) if not _shard_path(folder, s).is_file()]


def find_features(root: str | Path, prompts: list[list[int]], layers: tuple[int, ...], spec: DistillSpec,
                  eos: tuple[int, ...]) -> Path:
    """The folder under ``root`` for these prompts, layers and settings: a finished one of the same
    prompts, settings and EOS that holds at least ``layers`` when there is one, else the folder of
    exactly these (``cache_key``; built or resumed there)."""
    root, wanted = Path(root), set(layers)
    for meta_path in sorted(root.glob("*/features.json")):
        try:
            held = tuple(json.loads(meta_path.read_text())["layers"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        folder = meta_path.parent
        if (held != tuple(layers) and wanted <= set(held) and folder.name == cache_key(prompts, held, spec, eos)
                and not _missing_shards(folder, prompts)):
            return folder
    return root / cache_key(prompts, layers, spec, eos)


def cached_features(target, prompts: list[list[int]], root: str | Path, spec: DistillSpec, layers: tuple[int, ...],
                    eos: tuple[int, ...], log: Callable[[str], None] = print, what: str = "training") -> FeatureSet:
    """``build_features`` in the folder ``find_features`` picks: a finished cache holding more
    layers is loaded for ``layers`` only, with nothing computed."""
    folder = find_features(root, prompts, layers, spec, eos)
    if folder.name != cache_key(prompts, layers, spec, eos):
        log(f"[train] {what} data: the cache {folder} holds these sequences with more layers; "
            f"reading layers {list(layers)} of it")
        return load_features(folder, tuple(layers))
    return build_features(target, prompts, folder, spec, layers, eos, log, what)


def build_features(target, prompts: list[list[int]], folder: str | Path, spec: DistillSpec = DistillSpec(),
                   layers: tuple[int, ...] | None = None, eos: tuple[int, ...] = (),
                   log: Callable[[str], None] = print, what: str = "training") -> FeatureSet:
    """Continue ``prompts`` with ``target`` and keep its hidden states under ``folder`` (resuming
    at the first missing shard; a finished folder is just loaded). See the module docstring."""
    folder = Path(folder)
    layers = feature_layers(target) if layers is None else tuple(layers)
    folder.mkdir(parents=True, exist_ok=True)
    meta = dict(layers=list(layers), spec=asdict(spec), eos=list(eos), prompts=len(prompts))
    meta_path = folder / "features.json"
    if meta_path.is_file() and json.loads(meta_path.read_text()) != meta:
        raise ValueError(f"{folder}: its features.json describes other data; remove the folder to rebuild it")
    meta_path.write_text(json.dumps(meta, indent=1))
    shards = range(0, len(prompts), SHARD)
    todo = _missing_shards(folder, prompts)
    if todo:
        reads = f"continues {len(prompts)} prompts by {spec.gen_tokens} tokens" if spec.gen_tokens else \
            f"reads {len(prompts)} prompts"
        log(f"[train] {what} data: the target {reads} and its hidden states at layers {list(layers)} are kept "
            f"({len(shards) - len(todo)} of {len(shards)} shards already in {folder})")
    started, done = time.perf_counter(), 0
    for s in todo:
        chunk = prompts[s : s + SHARD]
        sequences = [] if spec.gen_tokens else [list(p) for p in chunk]  # 0: the target reads the prompts
        for b in range(0, len(chunk) if spec.gen_tokens else 0, spec.batch_size):
            sequences += continue_prompts(target, chunk[b : b + spec.batch_size], spec, eos, s + b)
        hidden: dict[int, list[torch.Tensor]] = {l: [] for l in layers}
        for b in range(0, len(sequences), spec.batch_size):
            for l, parts in hidden_states(target, sequences[b : b + spec.batch_size], layers).items():
                hidden[l] += parts
        _write_shard(_shard_path(folder, s), sequences, [len(p) for p in chunk], hidden)
        done += 1
        elapsed = time.perf_counter() - started
        log(f"[train] {what} data: shard {len(shards) - len(todo) + done}/{len(shards)}  "
            f"elapsed {elapsed:6.0f}s  ETA {elapsed / done * (len(todo) - done):6.0f}s")
    return load_features(folder)
