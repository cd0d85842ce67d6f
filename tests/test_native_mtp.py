"""MTP layers that ship inside checkpoints (``models/native_mtp.py``): the layouts recognised, MiMo's
layers against a plain-PyTorch reference of MiMo's MTP forward, and ``method="mtp"`` with no options.
The conformance suite runs the MiMo layers too (``mtp-native``)."""

from __future__ import annotations

import json

import pytest
import torch

import specdec_cuda
from _models_testlib import make_hf_model, save_checkpoint, write_mimo_checkpoint
from specdec_cuda import models
from specdec_cuda.models import native_mtp
from specdec_cuda.models.config import UnsupportedModelError
from specdec_cuda.models.heads import target_head


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    root = tmp_path_factory.mktemp("mimo")
    base = save_checkpoint(make_hf_model("qwen2", seed=4).double(), root / "qwen2")
    return write_mimo_checkpoint(base, root / "mimo", num_mtp=2, seed=5, noise=0.3)


def reference_mtp(folder, depth: int, h_prev: torch.Tensor, next_tokens: torch.Tensor):
    """MiMo's MTP layer ``depth`` as its modeling code defines it, in plain float64 PyTorch from the
    checkpoint's tensors (transformers' Qwen2 norms compute in float32, too coarse for 1e-10):
    token_layernorm(embedding of the next token), hidden_layernorm(h_prev), input_proj over
    [hidden; embedding], one Qwen2 decoder layer (pre-norm attention with q/k/v biases and RoPE,
    causal over positions 0..n-1; pre-norm SwiGLU MLP), final_layernorm, the LM head.
    Returns (logits [1, n, V], the output after final_layernorm [1, n, H])."""
    from safetensors.torch import load_file

    c = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    p = f"model.mtp_layers.{depth}."
    eps, heads, kv_heads = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c["hidden_size"] // heads

    def norm(x, name):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * t[p + name + ".weight"]

    def linear(x, name, bias=False):
        return x @ t[p + name + ".weight"].T + (t[p + name + ".bias"] if bias else 0)

    def rope(x, positions):  # x [1, heads, n, d], rotate-half convention
        theta = c.get("rope_theta") or c["rope_parameters"]["rope_theta"]  # (transformers 5 nests it)
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.cat([positions[:, None].double() * inv] * 2, -1)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * angles.cos() + torch.cat([-x2, x1], -1) * angles.sin()

    n = h_prev.shape[1]
    e = torch.nn.functional.embedding(next_tokens, t["model.embed_tokens.weight"])
    x = torch.cat([norm(h_prev, "hidden_layernorm"), norm(e, "token_layernorm")], -1) @ t[p + "input_proj.weight"].T
    a = norm(x, "input_layernorm")
    positions = torch.arange(n)
    q = rope(linear(a, "self_attn.q_proj", True).view(1, n, heads, d).transpose(1, 2), positions)
    k = rope(linear(a, "self_attn.k_proj", True).view(1, n, kv_heads, d).transpose(1, 2), positions)
    v = linear(a, "self_attn.v_proj", True).view(1, n, kv_heads, d).transpose(1, 2)
    k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    scores = (q @ k.transpose(-1, -2)) / d ** 0.5 + torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, n, heads * d)
    x = x + linear(attn, "self_attn.o_proj")
    m = norm(x, "post_attention_layernorm")
    x = x + linear(torch.nn.functional.silu(linear(m, "mlp.gate_proj")) * linear(m, "mlp.up_proj"), "mlp.down_proj")
    y = norm(x, "final_layernorm")
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return y @ head.T, y


def test_mimo_modules_equal_the_reference(mimo):
    target = models.load(mimo, dtype=torch.float64)
    modules = native_mtp.native_modules(target)
    head = target_head(target)
    assert modules.num_modules == 2 and modules.chain_normed and modules.final_norms is not None
    tokens = torch.randint(0, target.vocab_size, (1, 14), generator=torch.Generator().manual_seed(1))
    h0 = target.forward(tokens, torch.arange(14)[None], target.new_cache(1, 16), hidden_layers=(-1,)).hidden_states[-1]
    # Depth 1 at positions 0..12: h of position t, embedding of token t + 1.
    n = 13
    ref1, y1 = reference_mtp(mimo, 0, h0[:, :n], tokens[:, 1 : n + 1])
    caches = modules.new_cache(1, 16)
    h1 = modules(0, h0[:, :n], tokens[:, 1 : n + 1], torch.arange(n)[None], caches[0], head)
    torch.testing.assert_close(modules.head_for(0, head).logits(h1), ref1, rtol=0, atol=1e-10)
    # Depth 2 reads depth 1's output after its final norm, and the embedding of token t + 2.
    ref2, _ = reference_mtp(mimo, 1, y1[:, : n - 1], tokens[:, 2 : n + 1])
    h2 = modules(1, modules.chain_input(0, h1[:, : n - 1], head), tokens[:, 2 : n + 1], torch.arange(n - 1)[None],
                 caches[1], head)
    torch.testing.assert_close(modules.head_for(1, head).logits(h2), ref2, rtol=0, atol=1e-10)


@pytest.mark.parametrize("k", [1, 2, 4])  # one module, both, both then the last again
def test_method_mtp_uses_the_checkpoints_layers_with_no_options(mimo, k):
    target = models.load(mimo, dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, target.vocab_size, (n,), generator=g).tolist() for n in (5, 11, 3)]
    ar = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=24)
    out = specdec_cuda.generate(target, prompts, method="mtp", max_new_tokens=24, k=k, policy="fixed")
    assert out.tokens == ar.tokens and out.metrics.acceptance_rate > 0


def test_layouts_are_recognised():
    dense = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    assert native_mtp.detect({"model_type": "qwen2"}, dense) is None
    mimo = native_mtp.detect({"model_type": "mimo"}, dense + ["model.mtp_layers.0.input_proj.weight"])
    assert (mimo.layout, mimo.num_layers, mimo.runnable) == ("mimo", 1, True)
    ds = native_mtp.detect({"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_nextn_predict_layers": 1},
                           dense + ["model.layers.61.eh_proj.weight", "model.layers.61.shared_head.norm.weight"])
    assert (ds.layout, ds.runnable) == ("deepseek_v3", False) and "latent attention" in ds.describe()
    glm = native_mtp.detect({"model_type": "glm4_moe", "num_hidden_layers": 46, "num_nextn_predict_layers": 1},
                            dense + ["model.layers.46.eh_proj.weight"])
    assert (glm.layout, glm.runnable) == ("glm4_moe", False)
    q3 = native_mtp.detect({"model_type": "qwen3_next"}, dense + ["mtp.fc.weight", "mtp.layers.0.mlp.gate.weight"])
    assert (q3.layout, q3.num_layers, q3.runnable) == ("qwen3_next", 1, False)
    # num_nextn_predict_layers without the tensors (a checkpoint saved without its MTP layers): none.
    assert native_mtp.detect({"model_type": "deepseek_v3", "num_hidden_layers": 61,
                              "num_nextn_predict_layers": 1}, dense) is None


def test_no_layers_or_unrunnable_layers_are_clear_errors(tmp_path, mimo):
    plain = save_checkpoint(make_hf_model("qwen2", seed=1), tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="carries no MTP layers"):
        specdec_cuda.generate(models.load(plain), [[1, 2]], method="mtp", max_new_tokens=4)
    odd = tmp_path / "deepseek_like"
    odd.mkdir()
    from safetensors.torch import load_file, save_file

    t = load_file(str(plain / "model.safetensors"))
    t["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)
    save_file(t, str(odd / "model.safetensors"))
    cfg = json.loads((plain / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (odd / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="deepseek_v3 layout"):
        specdec_cuda.generate(models.load(odd), [[1, 2]], method="mtp", max_new_tokens=4)


def test_methods_cli_says_what_a_checkpoint_supports(mimo, tmp_path, capsys):
    from specdec_cuda.__main__ import main

    assert main(["methods", "--model", str(mimo)]) == 0
    out = capsys.readouterr().out
    mtp_line = next(line for line in out.splitlines() if line.startswith("mtp "))
    assert "yes" in mtp_line and "mimo layout" in mtp_line
    assert next(line for line in out.splitlines() if line.startswith("draft ")).split()[1] == "no"
