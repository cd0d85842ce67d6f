"""``load(path)``: a Hugging Face checkpoint folder (config.json + safetensors) -> ``LlamaModel``.

Reads one ``*.safetensors`` file, several, or a sharded set listed by
``model.safetensors.index.json``. Tensors are read one at a time straight into the model's
parameters (allocated uninitialised on the target device), so peak memory is about one model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from .config import LlamaConfig, eos_token_ids
from .llama import LlamaModel

_INDEX = "model.safetensors.index.json"


def read_checkpoint_config(path, expected: str) -> tuple[Path, Path, dict]:
    """A checkpoint folder's ``config.json`` as a dict: (folder, config path, config).

    FileNotFoundError for a missing folder or config.json (the message says ``expected``, e.g.
    "a Hugging Face checkpoint folder"), ValueError for a file that is not a JSON object.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder {str(folder)!r} does not exist or is not a folder")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json; expected {expected}")
    try:
        raw = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{config_path}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{config_path}: expected a JSON object, got {type(raw).__name__}")
    return folder, config_path, raw


def load(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
         weights: str = "safetensors", gguf_activations: str = "q8", activations: str = "float32") -> LlamaModel:
    """Load a Llama / Qwen2 / Qwen3 checkpoint folder, or a ``.gguf`` file, into the built-in model.

    Parameters
    ----------
    path : folder with ``config.json`` and ``*.safetensors`` (optionally sharded with
        ``model.safetensors.index.json``), as written by ``save_pretrained``; or a ``.gguf`` file
        (llama.cpp's format), whose quantised weights are kept as stored (``load_gguf``).
    dtype : parameter and cache dtype (fp32, bf16, fp16 or fp64); the file's dtype is cast. A GGUF
        model is float32 (its activations and cache; the weights stay in their blocks).
    device : where the parameters live (a GGUF model: the CPU).
    weights : for a folder, which weights to read: ``"safetensors"`` (default), or ``"gguf"``, the
        folder's ``model.gguf`` (as the real models keep it beside their converted weights) with
        the folder's ``config.json``.
    gguf_activations : a GGUF model's products: "q8" (default: int8 activations, integer dot
        products, llama.cpp's numerics and speed), "q8_32" (int8 per 32 values for every format) or
        "float32" (``LlamaModel.load_gguf``).
    activations : a folder's model: "float32" (default, exact) or "bfloat16" (each projection's
        input rounded to bfloat16, as a bf16 model in ``transformers`` multiplies; bfloat16 panels
        on a CPU with AMX only: ``LlamaModel.set_activations``).

    Raises
    ------
    FileNotFoundError : the folder, its config.json or its weights are missing.
    UnsupportedModelError (a ValueError) : a family other than llama / qwen2 / qwen3, or a feature
        of it that the built-in model lacks (e.g. sliding windows); it names what it found.
    ValueError : tensors missing from the files, or with the wrong shape.

    Example
    -------
    >>> model = specdec_cuda.models.load("zoo/target", dtype=torch.bfloat16)  # doctest: +SKIP
    """
    if weights not in ("safetensors", "gguf"):
        raise ValueError(f"weights must be 'safetensors' or 'gguf', got {weights!r}")
    if activations != "float32" and (weights == "gguf" or Path(path).suffix == ".gguf"):
        raise ValueError(f"activations={activations!r} is for a folder's bfloat16 panels; a GGUF model picks its "
                         f"products with gguf_activations")
    if Path(path).suffix == ".gguf" or (weights == "gguf" and Path(path).is_file()):
        return load_gguf(path, dtype=dtype, device=device, activations=gguf_activations)
    folder, config_path, raw = read_checkpoint_config(path, "a Hugging Face checkpoint folder")
    if weights == "gguf":
        model = load_gguf(folder / "model.gguf", dtype=dtype, device=device, hf_config=raw,
                          activations=gguf_activations)
        model.checkpoint_dir = folder
        return model
    config = LlamaConfig.from_hf_dict(raw, source=str(config_path))
    config = with_generation_eos(config, folder)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"dtype must be float32, bfloat16, float16 or float64, got {dtype}")

    tensors = SafetensorsFolder(folder)
    with torch.device("meta"):
        model = LlamaModel(config, dtype=dtype)
    model.to_empty(device=device)
    model.load_hf_state_dict(tensors, source=str(folder))
    model.checkpoint_dir = folder  # where method="mtp" finds MTP layers the checkpoint carries (native_mtp.py)
    model.set_activations(activations)
    return model.eval()


def with_generation_eos(config: LlamaConfig, folder: Path) -> LlamaConfig:
    """``config`` with the end-of-sequence ids of the folder's ``generation_config.json``, where it
    lists them (chat checkpoints often name their end-of-turn tokens only there)."""
    generation_path = folder / "generation_config.json"
    if generation_path.is_file():
        try:
            generation = json.loads(generation_path.read_text())
            eos = generation.get("eos_token_id") if isinstance(generation, dict) else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            eos = None
        if eos is not None:
            config = dataclasses.replace(config, eos_token_id=eos_token_ids(eos))
    return config


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
              hf_config: dict | None = None, activations: str = "q8") -> LlamaModel:
    """A ``.gguf`` file of a Llama / Qwen2 / Qwen3 model as a ``LlamaModel`` whose projections, LM
    head and embedding stay in the file's quantised blocks (``LlamaModel.load_gguf``): a decoding
    step reads 4.5 - 8.5 bits per weight. The configuration comes from the file's metadata, or from
    ``hf_config`` (a ``config.json`` dict) when given; a ``generation_config.json`` beside the file
    adds its end-of-sequence ids. ``activations``: "q8" (default, llama.cpp's integer products),
    "q8_32" or "float32" (see ``LlamaModel.load_gguf``). Float32 on a CPU with AVX-512 or AVX2 only
    (ValueError otherwise); UnsupportedModelError for a format or architecture the kernels lack.

    Example
    -------
    >>> model = specdec_cuda.models.load("qwen2.5-coder-1.5b-q4_k_m.gguf")  # doctest: +SKIP
    """
    from .gguf_file import GgufCheckpoint

    if dtype != torch.float32:
        raise ValueError(f"a GGUF model computes in float32 (its weights stay in their blocks); got dtype={dtype}")
    if torch.device(device).type != "cpu":
        raise ValueError(f"a GGUF model runs on the CPU for now; got device={device!r} (load the Hugging Face "
                         f"folder for a dense model on {device})")
    checkpoint = GgufCheckpoint(path, hf_config=hf_config)
    config = with_generation_eos(checkpoint.config, Path(path).parent)
    with torch.device("meta"):
        model = LlamaModel(config, dtype=torch.float32)
    model.to_empty(device="cpu")
    model.load_gguf(checkpoint, activations=activations)
    return model.eval()


class SafetensorsFolder(Mapping):
    """Read-only mapping tensor name -> tensor over the safetensors files of a folder (lazy)."""

    def __init__(self, folder: Path) -> None:
        index_path = folder / _INDEX
        if index_path.is_file():
            try:
                index = json.loads(index_path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"{index_path}: not valid JSON ({exc})") from None
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
                raise ValueError(f"{index_path}: expected a JSON object with a \"weight_map\" of tensor name -> "
                                 f"shard file name")
            files = {name: folder / f for name, f in weight_map.items()}
            for f in sorted(set(files.values())):
                if not f.is_file():
                    raise FileNotFoundError(f"{index_path} lists shard {f.name!r}, which is missing")
        else:
            shards = sorted(folder.glob("*.safetensors"))
            if not shards:
                others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
                hint = f" (found {', '.join(others)}; only safetensors are read)" if others else ""
                raise FileNotFoundError(f"{str(folder)!r} has no *.safetensors weights{hint}")
            files = {}
            for f in shards:
                try:
                    with safe_open(str(f), framework="pt") as handle:
                        files.update({name: f for name in handle.keys()})
                except Exception as exc:  # safetensors raises its own error type for a corrupt header
                    raise ValueError(f"{f}: not a readable safetensors file ({exc})") from None
        # Checkpoints of a bare decoder (saved without the LM wrapper) lack the "model." prefix.
        if "model.embed_tokens.weight" not in files and "embed_tokens.weight" in files:
            files = {(k if k.startswith("lm_head.") else f"model.{k}"): v for k, v in files.items()}
            self._strip = True
        else:
            self._strip = False
        self._files = files
        self._handles: dict[Path, object] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        f = self._files[name]
        key = name[len("model."):] if self._strip and name.startswith("model.") else name
        try:
            if f not in self._handles:
                self._handles[f] = safe_open(str(f), framework="pt")
            return self._handles[f].get_tensor(key)
        except Exception as exc:  # a corrupt shard, or an index naming a tensor the shard lacks
            raise ValueError(f"{f}: cannot read tensor {key!r} ({exc})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)
