"""A ``.gguf`` file of a Llama / Qwen2 / Qwen3 model, read for ``LlamaModel`` without dequantising.

``GgufCheckpoint(path)`` parses the file's header (``read_header``: metadata and tensor offsets;
the weights' bytes are memory-mapped) and gives

* ``config``: a ``LlamaConfig`` from the file's metadata (``{arch}.embedding_length``,
  ``block_count``, ``attention.head_count`` ...), or from a Hugging Face ``config.json`` given
  beside it (the fetched real models have both: the JSON is then the one ``transformers`` reads);
* ``weight(name)``: a quantised tensor as a ``GgufWeight`` (its blocks copied once into memory,
  in the file's layout), or a float one (norms, biases) as a float32 tensor.

Names are ggml's (``blk.{i}.attn_q.weight``, ``token_embd.weight``, ``output.weight``, ...).
llama.cpp's converter reorders the rows of a ``llama`` model's q and k projections (its RoPE pairs
dimension 2j with 2j + 1; Hugging Face's, and this project's, pairs j with j + D/2); the rows of a
quantised weight are independent runs of blocks, so ``weight`` puts them back in Hugging Face's
order exactly (``qwen2`` / ``qwen3`` files are not reordered).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..ops.gguf import FORMATS, GgufWeight, gguf_weight
from .config import LlamaConfig, UnsupportedModelError

__all__ = ["GgufCheckpoint", "FAMILIES"]

# general.architecture values this loader reads, as Hugging Face's model_type.
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# ggml tensor types kept as float tensors (F32, F16, BF16).
_FLOAT_TYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


class GgufCheckpoint:
    """The tensors and metadata of one ``.gguf`` file (see the module docs).

    Raises FileNotFoundError for a missing file, ValueError for one whose header does not parse,
    UnsupportedModelError for an architecture other than llama / qwen2 / qwen3.
    """

    def __init__(self, path: str | Path, hf_config: dict | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file {str(self.path)!r} does not exist")
        try:
            self._fields, self._tensors = read_header(self.path)
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.path}: not a readable GGUF file ({exc})") from None
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.architecture = str(self._field("general.architecture", ""))
        if self.architecture not in FAMILIES:
            raise UnsupportedModelError(f"{self.path}: architecture {self.architecture!r} is not one the built-in "
                                        f"model runs (supported: {', '.join(FAMILIES)})")
        self.config = LlamaConfig.from_hf_dict(hf_config if hf_config is not None else self._hf_config(),
                                               source=str(self.path))

    def _field(self, key: str, default=None):
        return self._fields.get(key, default)

    def _hf_config(self) -> dict:
        """The metadata as the ``config.json`` keys ``LlamaConfig.from_hf_dict`` reads."""
        a = self.architecture
        if str(self._field(f"{a}.rope.scaling.type", "none")) not in ("none", ""):
            raise UnsupportedModelError(f"{self.path}: RoPE scaling "
                                        f"{self._field(f'{a}.rope.scaling.type')!r} is not read from GGUF metadata "
                                        f"yet; load the Hugging Face folder instead")
        embed = self._tensors.get("token_embd.weight")
        if embed is None:
            raise ValueError(f"{self.path}: no token_embd.weight tensor")
        for key in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count"):
            if f"{a}.{key}" not in self._fields:
                raise ValueError(f"{self.path}: metadata lacks {a}.{key}")
        hidden = int(self._field(f"{a}.embedding_length"))
        heads = int(self._field(f"{a}.attention.head_count"))
        eos = [int(v) for v in (self._field("tokenizer.ggml.eos_token_id"), self._field("tokenizer.ggml.eot_token_id"))
               if v is not None]
        cfg = {
            "model_type": FAMILIES[a],
            "hidden_size": hidden,
            "num_hidden_layers": int(self._field(f"{a}.block_count")),
            "intermediate_size": int(self._field(f"{a}.feed_forward_length")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._field(f"{a}.attention.head_count_kv", heads)),
            "head_dim": int(self._field(f"{a}.attention.key_length", hidden // heads)),
            "rope_theta": float(self._field(f"{a}.rope.freq_base", 10000.0)),
            "rms_norm_eps": float(self._field(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            "max_position_embeddings": int(self._field(f"{a}.context_length", 4096)),
            "vocab_size": embed.shape[0],
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "attention_bias": "blk.0.attn_q.bias" in self._tensors,
            "eos_token_id": sorted(set(eos)) or None,
            "bos_token_id": self._field("tokenizer.ggml.bos_token_id"),
        }
        return cfg

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def qtype(self, name: str) -> int:
        return self._tensors[name].qtype

    def weight(self, name: str, shape: tuple[int, ...]) -> GgufWeight | torch.Tensor:
        """Tensor ``name`` as a ``GgufWeight`` (quantised) or a float32 tensor (float types), of
        torch ``shape`` (``[N, K]`` for a weight, ``[N]`` for a vector; a GGUF lists dimensions
        innermost first). ValueError for a missing tensor, a shape mismatch or an unsupported type."""
        t = self._tensors.get(name)
        if t is None:
            raise ValueError(f"{self.path} lacks tensor {name!r}")
        if t.shape != tuple(shape):
            raise ValueError(f"{self.path}: tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        rows = shape[0] if len(shape) > 1 else 1
        if t.qtype in _FLOAT_TYPES:
            dtype = _FLOAT_TYPES[t.qtype]
            size = math.prod(shape) * dtype.itemsize
            data = torch.from_numpy(np.array(self._data[t.offset : t.offset + size]))
            return self._hf_row_order(name, data.view(dtype).reshape(rows, -1)).reshape(shape).float()
        if t.qtype not in FORMATS:
            raise UnsupportedModelError(f"{self.path}: tensor {name} has GGML type {t.qtype}; the GGUF kernels read "
                                        + ", ".join(f"{n} ({q})" for q, (n, _, _) in FORMATS.items()))
        _, qk, nbytes = FORMATS[t.qtype]
        if shape[-1] % qk:
            raise ValueError(f"{self.path}: tensor {name} [{list(shape)}] is not whole {qk}-weight blocks")
        size = math.prod(shape) // qk * nbytes
        blocks = torch.from_numpy(np.array(self._data[t.offset : t.offset + size])).reshape(rows, -1)
        return gguf_weight(self._hf_row_order(name, blocks), t.qtype, shape)

    def _hf_row_order(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """A llama file's q / k rows back in Hugging Face's order (see the module docs): GGUF row
        ``h D + 2 j + t`` is Hugging Face row ``h D + t D/2 + j`` (head h, j < D/2, t in {0, 1})."""
        if self.architecture != "llama" or not (name.endswith("attn_q.weight") or name.endswith("attn_k.weight")
                                                 or name.endswith("attn_q.bias") or name.endswith("attn_k.bias")):
            return rows
        c = self.config
        heads = c.num_attention_heads if "attn_q" in name else c.num_key_value_heads
        d = c.head_dim
        return rows.reshape(heads, d // 2, 2, rows.shape[1]).transpose(1, 2).reshape(rows.shape).contiguous()


# -- the file's header ------------------------------------------------------------------------------
#
# GGUF (version 2 and 3; little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata
# count; each metadata entry a string key, a u32 value type and the value; each tensor a string
# name, u32 dims, u64 extent per dim (innermost first), u32 ggml type, u64 offset from the data
# section, which starts at the next multiple of general.alignment (default 32). Strings are a u64
# length and UTF-8 bytes. Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool,
# 8 string, 9 array (u32 element type, u64 count, elements), 10 u64, 11 i64, 12 f64.
# This reader keeps scalars and strings, and skips arrays (the tokenizer's 150k-entry vocabulary:
# the gguf package's reader spends ~25 s building them as numpy views).

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]  # torch order (outermost first)
    qtype: int
    offset: int  # absolute, in the file


def read_header(path: Path) -> tuple[dict, dict[str, TensorInfo]]:
    """(metadata: key -> scalar or string, arrays left out; tensors: name -> TensorInfo)."""
    with open(path, "rb") as f:
        buf = f.read(1 << 20)
        pos = 0

        def need(n: int) -> None:
            nonlocal buf
            while pos + n > len(buf):
                more = f.read(max(n, 1 << 20))
                if not more:
                    raise ValueError("the file ends inside its header")
                buf += more

        def unpack(fmt: str):
            nonlocal pos
            size = struct.calcsize(fmt)
            need(size)
            value = struct.unpack_from(fmt, buf, pos)[0]
            pos += size
            return value

        def string() -> str:
            nonlocal pos
            n = unpack("<Q")
            need(n)
            value = bytes(buf[pos : pos + n]).decode("utf-8")
            pos += n
            return value

        def skip_array() -> None:
            nonlocal pos
            etype, count = unpack("<I"), unpack("<Q")
            if etype in _SCALARS:
                size = struct.calcsize(_SCALARS[etype]) * count
                need(size)
                pos += size
            elif etype == 8:
                for _ in range(count):
                    n = unpack("<Q")
                    need(n)
                    pos += n
            elif etype == 9:
                for _ in range(count):
                    skip_array()
            else:
                raise ValueError(f"unknown metadata array type {etype}")

        need(24)
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("no GGUF magic at the start")
        pos = 4
        version = unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (this reader knows 2 and 3)")
        n_tensors, n_fields = unpack("<Q"), unpack("<Q")
        fields: dict = {}
        for _ in range(n_fields):
            key, vtype = string(), unpack("<I")
            if vtype in _SCALARS:
                fields[key] = unpack(_SCALARS[vtype])
            elif vtype == 8:
                fields[key] = string()
            elif vtype == 9:
                skip_array()
            else:
                raise ValueError(f"metadata {key!r} has unknown type {vtype}")
        infos = []
        for _ in range(n_tensors):
            name, dims = string(), unpack("<I")
            extents = [unpack("<Q") for _ in range(dims)]
            infos.append((name, tuple(reversed(extents)), unpack("<I"), unpack("<Q")))
        alignment = int(fields.get("general.alignment", 32))
        start = (pos + alignment - 1) // alignment * alignment
    size = path.stat().st_size
    tensors = {}
    for name, shape, qtype, offset in infos:
        tensors[name] = TensorInfo(shape, qtype, start + offset)
        if start + offset > size:
            raise ValueError(f"tensor {name} starts past the end of the file")
    return fields, tensors
