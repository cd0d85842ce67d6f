"""What the cost policy learned about a (model, method, machine), kept across processes.

A ``SpeculativeDecoder`` keeps its policy for its life, so its later calls skip the exploration of
the first. This file carries the same knowledge to the next process: the measured step costs per
(active rows, draft length) and the pooled acceptance per kind of sampling, in one small JSON file
per key under ``$SPECDEC_POLICY_CACHE`` (default ``~/.cache/specdec_cuda/policy``; ``off``
disables it).

The key names what the costs belong to: the target (its class, config, dtype and device), the
method and its options (a model passed as an option by its class and config), and the machine
(CPU model, torch's thread count, the package version). Anything else that changes a step's cost
(another process on the same cores, a different prompt length) is what the policy's moving
averages follow anyway.

What is remembered only decides draft lengths of rows whose output does not depend on them
(``Proposer.matches_samples`` and greedy rows), so a file never changes what a run emits.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

FORMAT = 1


def cache_dir() -> Path | None:
    """``$SPECDEC_POLICY_CACHE`` (``off``, ``0`` or empty: None, nothing kept), else
    ``~/.cache/specdec_cuda/policy``."""
    value = os.environ.get("SPECDEC_POLICY_CACHE")
    if value is None:
        return Path.home() / ".cache" / "specdec_cuda" / "policy"
    if value.strip().lower() in ("", "0", "off", "none"):
        return None
    return Path(value).expanduser()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(value: Any) -> Any:
    """A JSON-able description of an option value: models by class, config, dtype, device and
    activations (a step's cost depends on them); tensors by shape and dtype; plain values as they
    are."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, os.PathLike):
        return str(Path(value).resolve())
    config = getattr(value, "config", None)
    out = {"class": type(value).__name__}
    if config is not None:
        out["config"] = repr(config.to_dict() if hasattr(config, "to_dict") else config)
    for attr in ("dtype", "device", "shape", "activations"):  # activations: LlamaModel.set_activations
        if hasattr(value, attr):
            out[attr] = str(getattr(value, attr))
    return out


def memory_key(target, method: str, options: dict) -> str:
    """The file name (a hash) of what the policy learns for ``target`` under ``method(**options)``
    on this machine."""
    import torch

    from ._native import _C

    facts = {"format": FORMAT, "target": describe(target), "method": method, "options": describe(options),
             "cpu": _cpu_model(), "threads": torch.get_num_threads(), "version": _C.build_info()["version"],
             "cuda": torch.cuda.get_device_name() if getattr(target, "device", None) is not None
             and str(target.device).startswith("cuda") else None}
    blob = json.dumps(facts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


class PolicyMemory:
    """One key's file: ``load()`` what an earlier process saved, ``save(state)`` atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def for_decoder(cls, target, method: str, options: dict) -> "PolicyMemory | None":
        root = cache_dir()
        return None if root is None else cls(root / f"{memory_key(target, method, options)}.json")

    def load(self) -> dict | None:
        """The saved state, or None when there is none (or it is unreadable: then it is ignored,
        and overwritten at the next save)."""
        try:
            state = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) and state.get("format") == FORMAT else None

    def save(self, state: dict) -> None:
        """Write ``state`` (JSON-able); a failure to write (read-only home, full disk) is not an
        error of the decoding that learned it, so it is swallowed."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(dict(state, format=FORMAT)))
            os.replace(tmp, self.path)
        except OSError:
            pass
