"""specdec_cuda.models.load on bad checkpoint folders: each problem gets a clear error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from _models_testlib import make_hf_model, save_checkpoint

from specdec_cuda import models
from specdec_cuda.models import UnsupportedModelError


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory):
    return save_checkpoint(make_hf_model("qwen2"), tmp_path_factory.mktemp("good"))


def copy_of(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "copy")


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.load(tmp_path / "nowhere")


def test_missing_config(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        models.load(folder)


def test_missing_weights(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors weights \(found pytorch_model.bin"):
        models.load(folder)


def test_missing_shard(tmp_path):
    folder = save_checkpoint(make_hf_model("llama3"), tmp_path / "sharded", max_shard_size="40KB")
    shard = sorted(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()))[-1]
    (folder / shard).unlink()
    with pytest.raises(FileNotFoundError, match=f"lists shard '{shard}', which is missing"):
        models.load(folder)


def test_unknown_family_is_named(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=r"'gpt2' is not supported.*llama, qwen2, qwen3"):
        models.load(folder)


def test_family_from_architectures_alone(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["model_type"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert models.load(folder).config.family == "qwen2"


def test_unsupported_features_are_named(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "use_sliding_window": True, "sliding_window": 16}))
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        models.load(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}))
    with pytest.raises(UnsupportedModelError, match="rope_type 'yarn'"):
        models.load(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(UnsupportedModelError, match="hidden_act 'gelu'"):
        models.load(folder)


def test_missing_tensor_is_named(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks tensors .*model\.layers\.1\.mlp\.down_proj\.weight"):
        models.load(folder)


def test_wrong_shape_is_named(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(3,\), expected \(64,\)"):
        models.load(folder)


def test_old_style_rope_scaling_config(tmp_path):
    # transformers 4.x files: rope_theta at the top level and rope_scaling with "type".
    hf = make_hf_model("llama_bias_tied")
    folder = save_checkpoint(hf, tmp_path / "old")
    cfg = json.loads((folder / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params["rope_theta"]
    cfg["rope_scaling"] = {"type": "linear", "factor": params["factor"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    model = models.load(folder)
    assert model.config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    tokens = torch.arange(20)[None] % 101
    with torch.no_grad():
        ref = hf(input_ids=tokens).logits
    torch.testing.assert_close(model.forward(tokens, torch.arange(20)[None], model.new_cache(1, 20)).logits, ref)


def test_bad_dtype(good_folder):
    with pytest.raises(ValueError, match="dtype must be"):
        models.load(good_folder, dtype=torch.int8)


def test_eos_token_ids_from_generation_config(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "eos_token_id": 7}))
    (folder / "generation_config.json").unlink(missing_ok=True)
    assert models.load(folder).eos_token_ids == (7,)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert models.load(folder).eos_token_ids == (7, 9)
