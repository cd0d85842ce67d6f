"""MTP layers that ship inside checkpoints (``models/native_mtp.py``, ``models/native_mtp_hf.py``): the
layouts recognised; each layout's modules against a plain-PyTorch float64 reference of that
architecture's MTP forward written here (MiMo on the built-in model; DeepSeek-V3, GLM-4.5 and
Qwen3-Next on transformers' blocks behind ``HFCausalLM``); and ``method="mtp"`` with no options equal
to autoregressive greedy decoding. The conformance suite runs every layout too (``mtp-native*``)."""

from __future__ import annotations

import json

import pytest
import torch

import specdec_cuda
from _models_testlib import (load_hf_mtp_target, make_hf_model, save_checkpoint, write_hf_mtp_checkpoint,
                             write_mimo_checkpoint)
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
    assert (mimo.layout, mimo.num_layers, mimo.backend) == ("mimo", 1, "builtin")
    ds = native_mtp.detect({"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_nextn_predict_layers": 1},
                           dense + ["model.layers.61.eh_proj.weight", "model.layers.61.shared_head.norm.weight"])
    assert (ds.layout, ds.backend) == ("deepseek_v3", "transformers") and "latent attention" in ds.describe()
    glm = native_mtp.detect({"model_type": "glm4_moe", "num_hidden_layers": 46, "num_nextn_predict_layers": 1},
                            dense + ["model.layers.46.eh_proj.weight"])
    assert (glm.layout, glm.backend) == ("glm4_moe", "transformers")
    q3 = native_mtp.detect({"model_type": "qwen3_next"}, dense + ["mtp.fc.weight", "mtp.layers.0.mlp.gate.weight"])
    assert (q3.layout, q3.num_layers, q3.backend) == ("qwen3_next", 1, "transformers")
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


# -- DeepSeek-V3 / R1, GLM-4.5, Qwen3-Next: transformers' blocks behind HFCausalLM --------------------

HF_LAYOUTS = {"deepseek_v3": 2, "glm4_moe": 1, "qwen3_next": 2}  # layout -> MTP layers in its fixture
# transformers' blocks compute their RMSNorms (and routers, eager softmax) in float32 whatever the
# parameters' dtype, so a float64 module carries float32 rounding (relative ~6e-8 per norm) into
# logits of size ~3: measured differences from the float64 reference are ~1e-7. A wrong norm,
# order or chaining rule moves them by O(0.1 .. 1).
HF_TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=list(HF_LAYOUTS))
def hf_mtp(request, tmp_path_factory):
    layout = request.param
    folder = write_hf_mtp_checkpoint(layout, tmp_path_factory.mktemp(layout), HF_LAYOUTS[layout], seed=3)
    return layout, folder, load_hf_mtp_target(folder)


class ReferenceMTP:
    """The MTP layers of a DeepSeek-V3 / GLM-4.5 / Qwen3-Next checkpoint as the architectures define
    them, in plain float64 PyTorch from the checkpoint's tensors (experts as stored, one by one):

    * DeepSeek-V3 / GLM-4.5, layer i under ``model.layers.{N + i}``: ``x = eh_proj([enorm(e);
      hnorm(h)])``; one pre-norm decoder block (DeepSeek: multi-head latent attention with a
      low-rank query and interleaved RoPE on the rotary part; GLM: grouped-query attention with
      biases, per-head q/k norms and RoPE on half of each head; both: sigmoid-scored experts chosen
      by group then by score + correction bias, weights renormalised and scaled, plus a shared
      expert); logits ``shared_head.head(shared_head.norm(x))``; the next depth reads ``x``.
      ``e`` from the layer's own ``embed_tokens`` where stored, the head its own ``shared_head.head``.
    * Qwen3-Next: ``x = fc([pre_fc_norm_embedding(e); pre_fc_norm_hidden(h)])``; block i of
      ``mtp.layers`` (gated attention: the query projection also gives a per-channel sigmoid gate on
      the attention output; zero-centred per-head q/k norms; RoPE on a quarter of each head;
      softmax-routed experts plus a sigmoid-gated shared expert); ``y = mtp.norm(x)``; logits
      ``lm_head(y)``; the next depth reads ``y``. Every RMSNorm multiplies by ``1 + w``.

    Attention is causal over positions 0 .. n - 1 of one row."""

    def __init__(self, layout: str, folder):
        from safetensors.torch import load_file

        self.layout, self.c = layout, json.loads((folder / "config.json").read_text())
        self.t = load_file(str(folder / "model.safetensors"))
        self.eps = self.c["rms_norm_eps"]
        theta = self.c.get("rope_theta") or self.c["rope_parameters"]["rope_theta"]
        self.theta = theta

    def norm(self, x, name):
        w = self.t[name]
        if self.layout == "qwen3_next":
            w = 1.0 + w
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def linear(self, x, name, bias=False):
        return x @ self.t[name + ".weight"].T + (self.t[name + ".bias"] if bias else 0)

    def angles(self, n, dims):  # [n, dims / 2]: position p, frequency j -> p * theta^(-2j / dims)
        return torch.arange(n, dtype=torch.float64)[:, None] / self.theta ** (
            torch.arange(0, dims, 2, dtype=torch.float64) / dims)

    def rope_half(self, x, dims):  # rotate-half convention on the first `dims` channels; x [..., n, d]
        a = self.angles(x.shape[-2], dims)
        r, rest = x[..., :dims], x[..., dims:]
        x1, x2 = r[..., : dims // 2], r[..., dims // 2 :]
        return torch.cat([x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin(), rest], -1)

    def rope_pairs(self, x):  # interleaved pairs (x0, x1), (x2, x3), ... each turned by one frequency
        a = self.angles(x.shape[-2], x.shape[-1])
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = even * a.cos() - odd * a.sin()
        out[..., 1::2] = odd * a.cos() + even * a.sin()
        return out

    @staticmethod
    def attend(q, k, v, scale):  # [heads, n, d] each (k, v already per query head)
        n = q.shape[-2]
        scores = q @ k.transpose(-1, -2) * scale + torch.full((n, n), float("-inf"), dtype=q.dtype).triu(1)
        return scores.softmax(-1) @ v

    def expert(self, x, name):
        return self.linear(torch.nn.functional.silu(self.linear(x, name + ".gate_proj")) * self.linear(x, name + ".up_proj"),
                           name + ".down_proj")

    def attention(self, x, p):
        c, n = self.c, x.shape[0]
        heads = c["num_attention_heads"]
        if self.layout == "deepseek_v3":
            dn, dr, dv, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
            q = self.linear(self.norm(self.linear(x, p + "self_attn.q_a_proj"), p + "self_attn.q_a_layernorm.weight"),
                            p + "self_attn.q_b_proj").view(n, heads, dn + dr).transpose(0, 1)
            latent, k_rot = self.linear(x, p + "self_attn.kv_a_proj_with_mqa").split([r, dr], -1)
            kv = self.linear(self.norm(latent, p + "self_attn.kv_a_layernorm.weight"), p + "self_attn.kv_b_proj")
            k_nope, v = kv.view(n, heads, dn + dv).transpose(0, 1).split([dn, dv], -1)
            k_rot = self.rope_pairs(k_rot)[None].expand(heads, n, dr)  # one rotary key shared by the heads
            q = torch.cat([q[..., :dn], self.rope_pairs(q[..., dn:])], -1)
            out = self.attend(q, torch.cat([k_nope, k_rot], -1), v, (dn + dr) ** -0.5)
            return self.linear(out.transpose(0, 1).reshape(n, heads * dv), p + "self_attn.o_proj")
        d, kv_heads = c["head_dim"], c["num_key_value_heads"]
        bias = self.layout == "glm4_moe" and c.get("attention_bias", False)
        q = self.linear(x, p + "self_attn.q_proj", bias)
        gate = None
        if self.layout == "qwen3_next":  # per head: d query channels, then d gate channels
            q, gate = q.view(n, heads, 2 * d).split([d, d], -1)
            gate = gate.reshape(n, heads * d)
        q = q.reshape(n, heads, d)
        k = self.linear(x, p + "self_attn.k_proj", bias).view(n, kv_heads, d)
        v = self.linear(x, p + "self_attn.v_proj", bias).view(n, kv_heads, d)
        if self.layout == "qwen3_next" or c.get("use_qk_norm", False):
            q, k = self.norm(q, p + "self_attn.q_norm.weight"), self.norm(k, p + "self_attn.k_norm.weight")
        factor = c.get("partial_rotary_factor") or (c.get("rope_parameters") or {}).get("partial_rotary_factor")
        dims = int(d * factor)
        q, k = self.rope_half(q.transpose(0, 1), dims), self.rope_half(k.transpose(0, 1), dims)
        k, v = (z.repeat_interleave(heads // kv_heads, dim=0) for z in (k, v.transpose(0, 1)))
        out = self.attend(q, k, v, d ** -0.5).transpose(0, 1).reshape(n, heads * d)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.linear(out, p + "self_attn.o_proj")

    def moe(self, x, p):
        c = self.c
        if self.layout == "qwen3_next":
            probs = self.linear(x, p + "mlp.gate").softmax(-1)
            weights, chosen = probs.topk(c["num_experts_per_tok"], -1)
            if c.get("norm_topk_prob", True):
                weights = weights / weights.sum(-1, keepdim=True)
            shared = torch.sigmoid(self.linear(x, p + "mlp.shared_expert_gate")) * self.expert(x, p + "mlp.shared_expert")
        else:
            E, groups = c["n_routed_experts"], c["n_group"]
            scores = torch.sigmoid(self.linear(x, p + "mlp.gate"))
            choice = scores + self.t[p + "mlp.gate.e_score_correction_bias"]
            group_score = choice.view(-1, groups, E // groups).topk(2, -1).values.sum(-1)
            keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(c["topk_group"], -1).indices, 1.0)
            choice = choice.masked_fill(keep.repeat_interleave(E // groups, -1) == 0, float("-inf"))
            chosen = choice.topk(c["num_experts_per_tok"], -1).indices
            weights = scores.gather(-1, chosen)
            if c.get("norm_topk_prob", True):
                weights = weights / weights.sum(-1, keepdim=True)
            weights = weights * c["routed_scaling_factor"]
            shared = self.expert(x, p + "mlp.shared_experts")
        out = shared.clone()
        for row in range(x.shape[0]):
            for w, e in zip(weights[row], chosen[row].tolist()):
                out[row] += w * self.expert(x[row], f"{p}mlp.experts.{e}")
        return out

    def block(self, x, p):
        x = x + self.attention(self.norm(x, p + "input_layernorm.weight"), p)
        return x + self.moe(self.norm(x, p + "post_attention_layernorm.weight"), p)

    def __call__(self, depth: int, h_prev, next_tokens):
        """Layer ``depth`` over one row: h_prev [n, H], next_tokens [n] -> (logits [n, V], what the
        next depth reads [n, H])."""
        t = self.t
        if self.layout == "qwen3_next":
            e = t["model.embed_tokens.weight"][next_tokens]
            x = torch.cat([self.norm(e, "mtp.pre_fc_norm_embedding.weight"),
                           self.norm(h_prev, "mtp.pre_fc_norm_hidden.weight")], -1) @ t["mtp.fc.weight"].T
            y = self.norm(self.block(x, f"mtp.layers.{depth}."), "mtp.norm.weight")
            return y @ t["lm_head.weight"].T, y
        p = f"model.layers.{self.c['num_hidden_layers'] + depth}."
        e = t.get(p + "embed_tokens.weight", t["model.embed_tokens.weight"])[next_tokens]
        x = torch.cat([self.norm(e, p + "enorm.weight"), self.norm(h_prev, p + "hnorm.weight")], -1) @ t[p + "eh_proj.weight"].T
        x = self.block(x, p)
        return self.norm(x, p + "shared_head.norm.weight") @ t.get(p + "shared_head.head.weight", t["lm_head.weight"]).T, x


def test_hf_layout_modules_equal_the_reference(hf_mtp):
    layout, folder, target = hf_mtp
    modules = native_mtp.native_modules(target)
    head, reference = target_head(target), ReferenceMTP(layout, folder)
    assert modules.num_modules == HF_LAYOUTS[layout]
    n = 13
    tokens = torch.randint(0, target.vocab_size, (1, n + 1), generator=torch.Generator().manual_seed(1))
    # Depth 1 reads the main model's final normed hidden state at t and the embedding of token t + 1.
    h = target.forward(tokens, torch.arange(n + 1)[None], target.new_cache(1, n + 1), hidden_layers=(-1,)
                       ).hidden_states[-1][:, :n]
    ref_h = h[0]
    caches = modules.new_cache(1, 16)
    for depth in range(modules.num_modules):
        m = n - depth  # positions 0 .. m - 1 have token t + depth + 1
        ref_logits, ref_h = reference(depth, ref_h[:m], tokens[0, depth + 1 : depth + 1 + m])
        out = modules(depth, h[:, :m], tokens[:, depth + 1 : depth + 1 + m], torch.arange(m)[None], caches[depth],
                      head)
        logits = modules.head_for(depth, head).logits(out)[0]
        assert (logits - ref_logits).abs().max() < HF_TOLERANCE, (layout, depth)
        # A wrong rule shows: the logits are far from uniform and differ across depths' heads.
        assert ref_logits.std() > 0.1
        h = modules.chain_input(depth, out, head)
    if layout == "deepseek_v3":  # layer 0 stored copies of the main embeddings / head (kept once), layer 1 a head of its own
        assert modules.embeds[0] is None and modules.lm_heads[0] is None and modules.lm_heads[1] is not None


def test_hf_layout_cache_commits_and_truncates_like_one_forward(hf_mtp):
    """The modules' own caches (HFCache): a forward of 8 positions keeping 5, then the rest, gives
    the one-forward outputs; a truncation back to 3 then the rest again, too (ragged over two rows)."""
    layout, _folder, target = hf_mtp
    modules, head = native_mtp.native_modules(target), target_head(target)
    g = torch.Generator().manual_seed(4)
    n, H = 12, target.hidden_size
    h = torch.randn(2, n, H, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, target.vocab_size, (2, n), generator=g)
    positions = torch.arange(n).expand(2, n)
    whole = modules(0, h, tokens, positions, modules.new_cache(2, 16)[0], head)
    cache = modules.new_cache(2, 16)[0]
    modules(0, h[:, :8], tokens[:, :8], positions[:, :8], cache, head)
    cache.commit(torch.tensor([5, 7]))
    cache.truncate(torch.tensor([5, 3]))  # ragged rows: holes in the physical slots
    for row, start in ((0, 5), (1, 3)):
        out = modules(0, h[row : row + 1, start:].expand(2, -1, -1), tokens[row : row + 1, start:].expand(2, -1),
                      positions[row : row + 1, start:].expand(2, -1), cache, head)
        torch.testing.assert_close(out[row], whole[row, start:], rtol=0, atol=1e-9)


@pytest.mark.filterwarnings("ignore::specdec_cuda.InexactVerificationWarning")  # transformers: not batch invariant
@pytest.mark.parametrize("k", [1, 2, 3])  # one layer, all of DeepSeek's / Qwen3-Next's two, then the last again
def test_method_mtp_runs_hf_layouts_with_no_options(hf_mtp, k):
    layout, _folder, target = hf_mtp
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, target.vocab_size, (n,), generator=g).tolist() for n in (5, 11, 3)]
    ar = specdec_cuda.generate(target, prompts, method="autoregressive", max_new_tokens=20)
    out = specdec_cuda.generate(target, prompts, method="mtp", max_new_tokens=20, k=k, policy="fixed")
    assert out.tokens == ar.tokens and out.metrics.acceptance_rate > 0


def test_methods_cli_reports_hf_layouts_as_runnable(hf_mtp, capsys):
    from specdec_cuda.__main__ import main

    layout, folder, _target = hf_mtp
    assert main(["methods", "--model", str(folder)]) == 0
    out = capsys.readouterr().out
    mtp_line = next(line for line in out.splitlines() if line.startswith("mtp "))
    assert mtp_line.split()[1] == "yes" and f"{layout} layout" in mtp_line and "HFCausalLM" in mtp_line
