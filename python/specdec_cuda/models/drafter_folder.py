"""A drafter's checkpoint folder in this library's format: ``config.json`` (with ``model_type`` and
``format``) and ``model.safetensors``, written beside the folder and renamed into place, so a
reader never sees half a checkpoint. Used by the EAGLE-3 drafter and the exit adapter."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch


def write_drafter_folder(folder, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """Write ``config`` and ``tensors`` (float ones as float32) to ``folder``, replacing it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
             for k, v in tensors.items()}
    save_file(state, str(tmp / "model.safetensors"))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def read_drafter_folder(folder, model_type: str, fmt: int, what: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the config without ``model_type`` / ``format``, the tensors) of a folder written by
    ``write_drafter_folder``; FileNotFoundError / ValueError naming ``what`` it is not."""
    from safetensors.torch import load_file

    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file() or not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder}: not an {what} folder (needs config.json and model.safetensors)")
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or raw.pop("model_type", None) != model_type:
        raise ValueError(f"{path}: not an {what} config (model_type must be {model_type!r})")
    found = raw.pop("format", fmt)
    if found != fmt:
        raise ValueError(f"{path}: format {found!r} is not this library's ({fmt})")
    return raw, load_file(str(folder / "model.safetensors"))
