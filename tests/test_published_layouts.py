"""Published drafter layouts (``models.published``): FasterDecoding Medusa heads, z-lab DFlash
drafters and EAGLE-3 drafters (EAGLE authors / SpecForge), written here with the names, dtypes and
config fields their repositories write.

Each loaded module is held to a plain forward of the layout's math written below or in
``_eagle3_testlib`` (independently of the library's modules), and ``method="medusa"`` /
``"dflash"`` / ``"ddtree"`` / ``"eagle3"`` with such a drafter decode greedily token for token like
the target alone.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from decoding_models import make_checkpoint
from specdec_cuda import generate, models
from specdec_cuda.models.dflash import DFlashDrafter
from specdec_cuda.models.heads import MedusaHeads, target_head
from specdec_cuda.models.draft_vocab import MASKED
from specdec_cuda.models.published import load_dflash, load_eagle3, load_heads
from specdec_cuda.models.published import load_dflash_zlab, load_medusa_fasterdecoding

VOCAB, HIDDEN = 64, 32
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("published") / "target", vocab=VOCAB, hidden=HIDDEN,
                             layers=4, seed=0)
    return models.load(folder, dtype=torch.float64)


def _autoregressive(target, max_new_tokens=12):
    return generate(target, PROMPTS, max_new_tokens=max_new_tokens).tokens


# -- Medusa (FasterDecoding) ------------------------------------------------------------------

def _medusa_state(target, num_heads, num_layers, own_lm_head, dtype, seed=0):
    """A ``medusa_head`` state dict as the repository's ModuleList of Sequentials names it: one
    ResBlock object repeated ``num_layers`` times (so every layer key holds the same tensors), then
    the head's own LM head at index ``num_layers`` (current layout) or nothing (legacy)."""
    g = torch.Generator().manual_seed(seed)
    lm = target_head(target).lm_head.float()
    state = {}
    for i in range(num_heads):
        w = torch.randn(HIDDEN, HIDDEN, generator=g) * 0.5 / HIDDEN ** 0.5
        b = torch.randn(HIDDEN, generator=g) * 0.1
        for j in range(num_layers):
            state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"] = w, b
        if own_lm_head:  # started from the base LM head, as the repository's training does
            state[f"{i}.{num_layers}.weight"] = lm + 0.05 * torch.randn(lm.shape, generator=g)
    return {k: v.to(dtype) for k, v in state.items()}


def _write_medusa(folder, state, num_heads, num_layers, fmt):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
        "base_model_name_or_path": "tiny/target", "version": "2", "transformers_version": "4.40.0"}))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "medusa_lm_head.safetensors"))
    else:
        # torch.save keeps the repeated block's tensors shared, as the repository's state dict is.
        torch.save(state, folder / "medusa_lm_head.pt")
    return folder


def _medusa_reference_logits(state, h, num_heads, num_layers, base_lm_head):
    """``lm_head_i(ResBlock_i^L(h))``, ResBlock(x) = x + silu(W x + b). Shape: h [B, H] -> [B, K, V]."""
    out = []
    for i in range(num_heads):
        w, b = state[f"{i}.0.linear.weight"].double(), state[f"{i}.0.linear.bias"].double()
        x = h
        for _ in range(num_layers):
            x = x + F.silu(x @ w.T + b)
        lm = state.get(f"{i}.{num_layers}.weight")
        out.append(x @ (base_lm_head if lm is None else lm.double()).T)
    return torch.stack(out, dim=1)


MEDUSA_CASES = [  # (num_heads, num_layers, own LM head, dtype, file format)
    (3, 1, True, torch.float16, "safetensors"),   # the current layout, as trained heads ship
    (2, 2, True, torch.float32, "pt"),            # medusa_lm_head.pt, a repeated ResBlock
    (3, 1, False, torch.bfloat16, "safetensors"),  # legacy heads on the base model's LM head
]


@pytest.mark.parametrize("num_heads,num_layers,own_lm,dtype,fmt", MEDUSA_CASES)
def test_medusa_heads_match_the_layout_math(target, tmp_path, num_heads, num_layers, own_lm, dtype, fmt):
    state = _medusa_state(target, num_heads, num_layers, own_lm, dtype)
    folder = _write_medusa(tmp_path / "medusa", state, num_heads, num_layers, fmt)
    heads = load_heads(folder, dtype=torch.float64)  # detected, dispatched to the published loader
    assert isinstance(heads, MedusaHeads) and heads.num_heads == num_heads and heads.num_layers == num_layers
    head = target_head(target)
    h = torch.randn(5, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = _medusa_reference_logits(state, h, num_heads, num_layers, head.lm_head)
    got = heads.candidates(h, num_heads, 4, head)  # [B, K, 4]
    assert torch.equal(got, want.topk(4, dim=-1).indices)
    # The heads file itself loads too.
    file = next(folder.glob("medusa_lm_head.*"))
    assert torch.equal(load_medusa_fasterdecoding(file, dtype=torch.float64).candidates(h, num_heads, 4, head), got)


@pytest.mark.parametrize("num_heads,num_layers,own_lm,dtype,fmt", MEDUSA_CASES)
@pytest.mark.parametrize("budget", [None, 8])
def test_medusa_with_published_heads_decodes_like_the_target(target, tmp_path, num_heads, num_layers, own_lm,
                                                            dtype, fmt, budget):
    folder = _write_medusa(tmp_path / "medusa", _medusa_state(target, num_heads, num_layers, own_lm, dtype),
                           num_heads, num_layers, fmt)
    result = generate(target, PROMPTS, method="medusa", max_new_tokens=12, heads=str(folder), budget=budget,
                      policy="fixed")
    assert result.tokens == _autoregressive(target)


def test_medusa_layouts_it_cannot_reproduce_are_refused_naming_the_field(target, tmp_path):
    state = _medusa_state(target, 2, 2, True, torch.float32)
    state["0.1.linear.weight"] = state["0.1.linear.weight"] + 1.0  # distinct weights per layer
    with pytest.raises(ValueError, match="medusa_num_layers"):
        load_heads(_write_medusa(tmp_path / "a", state, 2, 2, "pt"))
    state = _medusa_state(target, 2, 2, True, torch.float32)
    with pytest.raises(ValueError, match="medusa_num_layers"):
        load_heads(_write_medusa(tmp_path / "b", state, 2, 1, "pt"))  # config says fewer layers
    state = dict(_medusa_state(target, 2, 1, True, torch.float32), **{"0.2.extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="unexpected"):
        load_heads(_write_medusa(tmp_path / "c", state, 2, 1, "pt"))


# -- DFlash (z-lab) ---------------------------------------------------------------------------

ZLAB = dict(num_layers=2, heads=4, kv_heads=2, head_dim=8, inter=48, block=4, mask=VOCAB - 1,
            target_layers=[0, 2], rope_theta=1_000_000.0, eps=1e-6)


def _zlab_config(attention_bias=False, **overrides):
    z = ZLAB
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "hidden_size": HIDDEN, "num_hidden_layers": z["num_layers"], "num_attention_heads": z["heads"],
        "num_key_value_heads": z["kv_heads"], "head_dim": z["head_dim"], "intermediate_size": z["inter"],
        "vocab_size": VOCAB, "rms_norm_eps": z["eps"], "rope_theta": z["rope_theta"], "rope_scaling": None,
        "attention_bias": attention_bias, "attention_dropout": 0.0, "hidden_act": "silu",
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_sliding_window": False, "sliding_window": None, "layer_types": ["full_attention"] * z["num_layers"],
        "block_size": z["block"], "num_target_layers": 4,
        "dflash_config": {"mask_token_id": z["mask"], "target_layer_ids": z["target_layers"]},
    }
    cfg.update(overrides)
    return cfg


def _zlab_weights(attention_bias=False, seed=0, dtype=torch.bfloat16):
    z, g = ZLAB, torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.2):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(dtype)

    qd, kd = z["heads"] * z["head_dim"], z["kv_heads"] * z["head_dim"]
    w = {"fc.weight": rnd(HIDDEN, len(z["target_layers"]) * HIDDEN), "hidden_norm.weight": norm(HIDDEN),
         "norm.weight": norm(HIDDEN)}
    for i in range(z["num_layers"]):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = norm(HIDDEN), norm(HIDDEN)
        for name, (out, inp) in {"q_proj": (qd, HIDDEN), "k_proj": (kd, HIDDEN), "v_proj": (kd, HIDDEN),
                                 "o_proj": (HIDDEN, qd)}.items():
            w[p + f"self_attn.{name}.weight"] = rnd(out, inp)
            if attention_bias:
                w[p + f"self_attn.{name}.bias"] = rnd(out, std=0.1)
        w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = norm(z["head_dim"]), norm(z["head_dim"])
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = rnd(z["inter"], HIDDEN), rnd(z["inter"], HIDDEN)
        w[p + "mlp.down_proj.weight"] = rnd(HIDDEN, z["inter"])
    return w


def _write_zlab(folder, attention_bias=False, **overrides):
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_zlab_config(attention_bias, **overrides)))
    weights = _zlab_weights(attention_bias)
    save_file(weights, str(folder / "model.safetensors"))
    return folder, weights


def _zlab_reference_block_logits(w, target, tokens, attention_bias):
    """The z-lab drafter's block after ``tokens`` (anchor = the last), in plain torch float64:
    context = the target's layers' outputs over ``tokens[:-1]``, block = [anchor, MASK...] at the
    positions after it, attention over [context ; block] without a mask. Returns [blk - 1, V]."""
    z = ZLAB
    w = {k: v.double() for k, v in w.items()}
    D, nh, nkv, blk, eps = z["head_dim"], z["heads"], z["kv_heads"], z["block"], z["eps"]

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(x, pos):  # x [n, heads, D]; rotate-half convention
        inv = 1.0 / z["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = pos[:, None].double() * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
        rot = torch.cat([-x[..., D // 2:], x[..., : D // 2]], -1)
        return x * cos + rot * sin

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if attention_bias and name.endswith("_proj") and "self_attn" in name else y

    ctx_tokens = torch.tensor([tokens[:-1]])
    n = ctx_tokens.shape[1]
    cache = target.new_cache(1, 64)
    out = target.forward(ctx_tokens, torch.arange(n)[None], cache, hidden_layers=z["target_layers"])
    cat = torch.cat([out.hidden_states[l][0].double() for l in z["target_layers"]], -1)
    ctx = rms(cat @ w["fc.weight"].T, w["hidden_norm.weight"])  # [n, H]
    embed = target.embed_tokens.weight.double()
    x = embed[torch.tensor([tokens[-1]] + [z["mask"]] * (blk - 1))]  # [blk, H]
    pos_ctx, pos_blk = torch.arange(n), torch.arange(n, n + blk)
    for i in range(z["num_layers"]):
        p = f"layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope(rms(lin(h, p + "self_attn.q_proj").view(blk, nh, D), w[p + "self_attn.q_norm.weight"]), pos_blk)
        kv_in = torch.cat([ctx, h])
        k = rms(lin(kv_in, p + "self_attn.k_proj").view(n + blk, nkv, D), w[p + "self_attn.k_norm.weight"])
        k = rope(k, torch.cat([pos_ctx, pos_blk]))
        v = lin(kv_in, p + "self_attn.v_proj").view(n + blk, nkv, D)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / D ** 0.5, -1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(blk, nh * D)
        x = x + lin(o, p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + lin(F.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    logits = rms(x, w["norm.weight"]) @ target.output_weight().double().T
    return logits[1:]


@pytest.mark.parametrize("attention_bias", [False, True])
def test_dflash_drafter_matches_the_layout_math(target, tmp_path, attention_bias):
    folder, weights = _write_zlab(tmp_path / "dflash", attention_bias)
    drafter = load_dflash(folder).attach(target)  # detected, dispatched to the published loader
    assert drafter.config.mask_token_id == ZLAB["mask"] and drafter.config.target_layers == (0, 2)
    seq = [3, 9, 4, 1, 7, 7, 2]
    cache = drafter.new_cache(1, 32)
    out = target.forward(torch.tensor([seq[:-1]]), torch.arange(len(seq) - 1)[None], target.new_cache(1, 32),
                         hidden_layers=drafter.config.target_layers)
    drafter.extend(cache, out.hidden_states, torch.tensor([len(seq) - 1]))
    got = drafter.draft(cache, torch.tensor([seq[-1]]))[0]
    want = _zlab_reference_block_logits(weights, target, seq, attention_bias)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("method,options", [("dflash", {}), ("dflash", {"draft_sampling": "greedy"}),
                                            ("ddtree", {"budget": 6})])
def test_dflash_with_a_published_drafter_decodes_like_the_target(target, tmp_path, method, options):
    folder, _ = _write_zlab(tmp_path / "dflash")
    result = generate(target, PROMPTS, method=method, max_new_tokens=12, drafter=str(folder), policy="fixed",
                      **options)
    assert result.tokens == _autoregressive(target)


def test_zlab_default_target_layers_and_mask_override(tmp_path):
    folder, _ = _write_zlab(tmp_path / "d", dflash_config={})  # no target_layer_ids: the reference's rule
    assert load_dflash_zlab(folder, mask_token_id=5).config.target_layers == (1, 1)  # 4 target layers: 1 .. 1, twice
    with pytest.raises(ValueError, match="mask_token_id"):
        load_dflash_zlab(folder)


@pytest.mark.parametrize("overrides,field", [
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_hidden_layers": 3}, "missing"),  # config names a layer the weights lack
])
def test_zlab_layouts_it_cannot_reproduce_are_refused_naming_the_field(tmp_path, overrides, field):
    if "num_hidden_layers" in overrides:
        overrides["layer_types"] = ["full_attention"] * 3
    folder, _ = _write_zlab(tmp_path / "d", **overrides)
    with pytest.raises(ValueError, match=field):
        load_dflash(folder)


def test_medusa_full_model_folder_and_save_round_trip(target, tmp_path):
    """A full Medusa model folder (heads under ``medusa_head.`` among the base weights) loads; the
    loaded heads save and load back as the library's own folder, with the same candidates."""
    from safetensors.torch import save_file

    from specdec_cuda.models.heads import save_heads

    state = _medusa_state(target, 2, 1, True, torch.bfloat16)
    folder = tmp_path / "full"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["MedusaModelLlama"], "hidden_size": HIDDEN,
                                                    "medusa_num_heads": 2, "medusa_num_layers": 1}))
    save_file(dict({f"medusa_head.{k}": v for k, v in state.items()},
                   **{"model.embed_tokens.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)}),
              str(folder / "model.safetensors"))
    heads = load_heads(folder, dtype=torch.float64)
    head = target_head(target)
    h = torch.randn(3, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want = _medusa_reference_logits(state, h, 2, 1, head.lm_head).topk(3, dim=-1).indices
    assert torch.equal(heads.candidates(h, 2, 3, head), want)
    again = load_heads(save_heads(tmp_path / "ours", heads), dtype=torch.float64)
    assert (again.num_layers, again.renorm, again.lm_heads.shape) == (1, False, (2, VOCAB, HIDDEN))
    assert torch.equal(again.candidates(h, 2, 3, head), want)
    with pytest.raises(ValueError, match="w4_lm_head"):
        generate(target, PROMPTS, method="medusa", max_new_tokens=4, heads=heads, w4_lm_head=True, policy="fixed")


# -- EAGLE-3 (EAGLE authors, SpecForge) ---------------------------------------------------------

EAGLE3 = dict(heads=4, kv_heads=2, head_dim=8, inter=48, draft_vocab=40, eps=1e-5, theta=500_000.0,
              aux=[1, 2, 0])  # aux layer ids in SGLang's numbering (outputs of those layers), unsorted on purpose


def _eagle3_config(**overrides):
    e = EAGLE3
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
           "intermediate_size": e["inter"], "num_attention_heads": e["heads"], "num_key_value_heads": e["kv_heads"],
           "head_dim": e["head_dim"], "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": e["eps"],
           "rope_theta": e["theta"], "rope_scaling": None, "vocab_size": VOCAB, "draft_vocab_size": e["draft_vocab"],
           "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bias": False,
           "pretraining_tp": 1, "eagle_config": {"eagle_aux_hidden_state_layer_ids": e["aux"],
                                                 "use_aux_hidden_state": True}}
    cfg.update(overrides)
    return cfg


def _eagle3_weights(seed=0, dtype=torch.bfloat16, embed=False):
    """Random weights with the published names (``midlayer.*``), and a draft vocabulary of every id
    but a random 24."""
    e, g = EAGLE3, torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.3):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(dtype)

    qd, kd, H = e["heads"] * e["head_dim"], e["kv_heads"] * e["head_dim"], HIDDEN
    w = {"fc.weight": rnd(H, 3 * H), "norm.weight": norm(H), "lm_head.weight": rnd(e["draft_vocab"], H),
         "midlayer.input_layernorm.weight": norm(H), "midlayer.hidden_norm.weight": norm(H),
         "midlayer.post_attention_layernorm.weight": norm(H),
         "midlayer.self_attn.q_proj.weight": rnd(qd, 2 * H), "midlayer.self_attn.k_proj.weight": rnd(kd, 2 * H),
         "midlayer.self_attn.v_proj.weight": rnd(kd, 2 * H), "midlayer.self_attn.o_proj.weight": rnd(H, qd),
         "midlayer.mlp.gate_proj.weight": rnd(e["inter"], H), "midlayer.mlp.up_proj.weight": rnd(e["inter"], H),
         "midlayer.mlp.down_proj.weight": rnd(H, e["inter"])}
    ids = torch.randperm(VOCAB, generator=g)[: e["draft_vocab"]].sort().values
    w["d2t"] = ids - torch.arange(e["draft_vocab"])
    w["t2d"] = torch.zeros(VOCAB, dtype=torch.bool)
    w["t2d"][ids] = True
    if embed:
        w["embed_tokens.weight"] = rnd(VOCAB, H, std=1.0)
    return w


def _rename(weights, style):
    if style == "midlayer":
        return dict(weights)
    out = {}
    for k, v in weights.items():
        k = k.replace("midlayer.", "layers.0.")
        out[("model." + k) if style == "model" and k not in ("lm_head.weight", "d2t", "t2d") else k] = v
    return out


def _write_eagle3(folder, weights, fmt="safetensors", style="midlayer", **overrides):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_eagle3_config(**overrides)))
    weights = _rename(weights, style)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(weights, folder / "pytorch_model.bin")
    return folder


EAGLE3_CASES = [  # (file format, tensor names, own embedding)
    ("safetensors", "midlayer", False),  # SpecForge / EAGLE repositories
    ("bin", "midlayer", True),           # pytorch_model.bin with its own embed_tokens
    ("safetensors", "model", False),     # model.layers.0.* (vLLM-style names under model.)
]


@pytest.mark.parametrize("fmt,style,embed", EAGLE3_CASES)
def test_eagle3_drafter_matches_the_layout_math(target, tmp_path, fmt, style, embed):
    from transformers import LlamaForCausalLM

    from _eagle3_testlib import reference_layer, reference_logits

    weights = _eagle3_weights(embed=embed)
    drafter = load_eagle3(_write_eagle3(tmp_path / "eagle3", weights, fmt, style)).attach(target)
    e = EAGLE3
    assert drafter.config.target_layers == tuple(e["aux"]) and drafter.hidden_layers == (0, 1, 2)
    assert drafter.config.own_embedding == embed
    seq = torch.tensor([[3, 9, 4, 1, 7, 7, 2, 11]])
    T = seq.shape[1]
    out = target.forward(seq, torch.arange(T)[None], target.new_cache(1, 16), hidden_layers=drafter.hidden_layers)
    # Aux layer l as SGLang captures it: transformers' hidden_states[l + 1], the output of layer l
    # (to transformers' float32 RoPE angles: the built-in model computes them in float64 here).
    hf = LlamaForCausalLM.from_pretrained(target.checkpoint_dir, dtype=torch.float64)
    states = hf(seq, output_hidden_states=True).hidden_states
    for l in e["aux"]:
        torch.testing.assert_close(out.hidden_states[l][0], states[l + 1][0], rtol=1e-4, atol=1e-4)
    fused = torch.cat([out.hidden_states[l][0] for l in e["aux"]], -1) @ weights["fc.weight"].double().T  # [T, H]
    g = drafter.features(out.hidden_states)[0]
    torch.testing.assert_close(g, fused, rtol=1e-9, atol=1e-9)
    # Position t reads g_t and token t + 1.
    emb = (weights["embed_tokens.weight"] if embed else target.embed_tokens.weight).double()
    cfg = dict(heads=e["heads"], kv_heads=e["kv_heads"], head_dim=e["head_dim"], eps=e["eps"], theta=e["theta"],
               vocab=VOCAB)
    want = reference_layer(weights, cfg, emb[seq[0, 1:]], fused[:-1], torch.arange(T - 1))
    got = drafter.step(g[None, :-1], seq[:, 1:], torch.arange(T - 1)[None], drafter.new_cache(1, 16))[0]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    ref = reference_logits(weights, cfg, want)
    logits = drafter.target_logits(got)
    inside = weights["t2d"]
    torch.testing.assert_close(logits[:, inside], ref[:, inside], rtol=1e-9, atol=1e-9)
    assert bool((logits[:, ~inside] == MASKED).all())


@pytest.mark.parametrize("options", [dict(tree=False, k=3), dict(tree=True, budget=10)], ids=["chain", "tree"])
def test_eagle3_with_a_published_drafter_decodes_like_the_target(target, tmp_path, options):
    folder = _write_eagle3(tmp_path / "eagle3", _eagle3_weights())
    result = generate(target, PROMPTS, method="eagle3", max_new_tokens=12, drafter=str(folder), policy="fixed",
                      **options)
    assert result.tokens == _autoregressive(target)


def test_eagle3_defaults_without_aux_ids_or_vocabulary_maps(target, tmp_path):
    weights = {k: v for k, v in _eagle3_weights().items() if k not in ("d2t", "t2d")}
    weights["lm_head.weight"] = torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)  # a full-vocabulary head
    folder = _write_eagle3(tmp_path / "d", weights, eagle_config={}, draft_vocab_size=VOCAB)
    drafter = load_eagle3(folder)
    assert drafter.config.target_layers is None and bool(drafter.t2d.all())
    assert drafter.attach(target).config.target_layers == (0, 1, 1)  # EAGLE-3's default for 4 layers


@pytest.mark.parametrize("change,field", [
    (dict(num_hidden_layers=2), "num_hidden_layers"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(architectures=["Eagle3Speculator"]), "speculators"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_type"),
    (dict(draft_vocab_size=None), "draft_vocab_size"),
    (dict(intermediate_size=64), "shapes"),            # the weights say 48
    (dict(drop="midlayer.hidden_norm.weight"), "missing"),
    (dict(draft_vocab_size=VOCAB, drop="d2t"), "missing"),  # a full-size config, but t2d without d2t
])
def test_eagle3_layouts_it_cannot_reproduce_are_refused_naming_the_field(tmp_path, change, field):
    change = dict(change)
    weights = _eagle3_weights()
    if "drop" in change:
        weights.pop(change.pop("drop"))
    config = _eagle3_config(**change)
    if config.get("draft_vocab_size") is None:
        config.pop("draft_vocab_size")
    folder = _write_eagle3(tmp_path / "d", weights)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=field):
        load_eagle3(folder)


def test_published_drafters_on_a_transformers_target(target, tmp_path_factory, tmp_path):
    """The same loaders serve a ``transformers`` model behind ``HFCausalLM``."""
    from decoding_models import load_backend

    folder = make_checkpoint(tmp_path_factory.mktemp("published_hf") / "target", vocab=VOCAB, hidden=HIDDEN,
                             layers=4, seed=0)
    hf = load_backend(folder, "hf")
    want = _autoregressive(hf)
    assert want == _autoregressive(target)
    heads = _write_medusa(tmp_path / "medusa", _medusa_state(target, 3, 1, True, torch.float16), 3, 1,
                          "safetensors")
    assert generate(hf, PROMPTS, method="medusa", max_new_tokens=12, heads=str(heads), budget=8,
                    policy="fixed").tokens == want
    drafter, _ = _write_zlab(tmp_path / "dflash")
    assert generate(hf, PROMPTS, method="dflash", max_new_tokens=12, drafter=str(drafter),
                    policy="fixed").tokens == want
    eagle3 = _write_eagle3(tmp_path / "eagle3", _eagle3_weights())
    assert generate(hf, PROMPTS, method="eagle3", max_new_tokens=12, drafter=str(eagle3),
                    policy="fixed").tokens == want
