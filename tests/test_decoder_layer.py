"""``decoder_layer`` (one Llama/Qwen layer as one CPU op) against its reference, the caches it
writes, its batch invariance, and the model's fused path against its torch path; ``context_kv``
(the DFlash drafter's context K/V as one CPU op) against its reference and the drafter's torch path."""

from __future__ import annotations

import os

import pytest
import torch
from _isolated import run_capped

from specdec_cuda.ops.decoder_layer import decoder_layer
from specdec_cuda.ops.skinny_linear import pack_weight, packed_bf16_tier
from specdec_cuda.reference import decoder_layer as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

HIDDEN, I, T = 48, 40, 24


def make_layer(Hq, Hkv, D, bias, qk_norm, seed=0, bf16=False, inter=I):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        t = torch.randn(*shape, generator=g) * 0.3
        return t.bfloat16().float() if bf16 else t

    w = dict(qkv_w=rand((Hq + 2 * Hkv) * D, HIDDEN), o_w=rand(HIDDEN, Hq * D), gate_up_w=rand(2 * inter, HIDDEN),
             down_w=rand(HIDDEN, inter), norm1=1 + rand(HIDDEN), norm2=1 + rand(HIDDEN))
    for name, n in (("qkv_b", (Hq + 2 * Hkv) * D), ("o_b", HIDDEN), ("gate_up_b", 2 * inter), ("down_b", HIDDEN)):
        w[name] = rand(n) if bias else None
    w["q_norm"], w["k_norm"] = (1 + rand(D), 1 + rand(D)) if qk_norm else (None, None)
    return w


def rope(B, n, D, lengths, seed=1):
    pos = lengths[:, None] + torch.arange(n)
    angles = pos[..., None].float() * torch.cat([torch.linspace(0.02, 1.0, D // 2)] * 2)
    sin = angles.sin()
    sin[..., : D // 2].neg_()
    return angles.cos().contiguous(), sin.contiguous()


def run_op(w, x, cos, sin, kc, vc, lengths, Hq, tree_mask=None, pack=pack_weight):
    return decoder_layer(x, w["norm1"], w["norm2"], 1e-5, pack(w["qkv_w"]), pack(w["o_w"]), pack(w["gate_up_w"]),
                         pack(w["down_w"]), cos, sin, kc, vc, lengths, Hq,
                         biases=(w["qkv_b"], w["o_b"], w["gate_up_b"], w["down_b"]),
                         qk_norm=None if w["q_norm"] is None else (w["q_norm"], w["k_norm"]), tree_mask=tree_mask)


def run_ref(w, x, cos, sin, kc, vc, lengths, Hq, tree_mask=None):
    return ref.decoder_layer(x, w["norm1"], w["norm2"], 1e-5, w["qkv_w"], w["qkv_b"], w["o_w"], w["o_b"],
                             w["gate_up_w"], w["gate_up_b"], w["down_w"], w["down_b"], w["q_norm"], w["k_norm"],
                             cos, sin, kc, vc, lengths, tree_mask, Hq)


@pytest.mark.parametrize("Hq,Hkv,D,bias,qk_norm", [(4, 2, 16, False, False), (4, 4, 8, True, False),
                                                   (4, 1, 16, True, False), (2, 2, 24, False, True)])
@pytest.mark.parametrize("n,tree", [(1, False), (3, False), (6, True)])
def test_matches_reference_and_writes_the_cache(Hq, Hkv, D, bias, qk_norm, n, tree):
    B = 2
    w = make_layer(Hq, Hkv, D, bias, qk_norm)
    g = torch.Generator().manual_seed(n)
    lengths = torch.tensor([5, 9])
    x = torch.randn(B, n, HIDDEN, generator=g)
    kc, vc = torch.randn(B, Hkv, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g)
    tree_mask = torch.rand(B, n, n, generator=g) < 0.5 if tree else None
    cos, sin = rope(B, n, D, lengths)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    out = run_op(w, x, cos, sin, kc, vc, lengths, Hq, tree_mask)
    expected = run_ref(w, x, cos, sin, kc_ref, vc_ref, lengths, Hq, tree_mask)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kc, kc_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc, vc_ref, rtol=1e-5, atol=1e-5)


def test_an_mlp_width_off_the_vector_width_matches_reference():
    # 43 intermediate features: SiLU's vector loops end in a tail (AVX-512 masked, AVX2 padded).
    Hq, Hkv, D, n = 4, 2, 16, 3
    w = make_layer(Hq, Hkv, D, True, False, seed=5, inter=43)
    g = torch.Generator().manual_seed(6)
    lengths = torch.tensor([4])
    x = torch.randn(1, n, HIDDEN, generator=g)
    kc, vc = torch.randn(1, Hkv, T, D, generator=g), torch.randn(1, Hkv, T, D, generator=g)
    cos, sin = rope(1, n, D, lengths)
    expected = run_ref(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq)
    torch.testing.assert_close(run_op(w, x, cos, sin, kc, vc, lengths, Hq), expected, rtol=1e-4, atol=1e-4)


def test_a_token_gets_the_same_bits_alone_or_verified_with_others():
    Hq, Hkv, D, n = 4, 2, 16, 5
    w = make_layer(Hq, Hkv, D, True, False, seed=3)
    g = torch.Generator().manual_seed(4)
    lengths = torch.tensor([7])
    x = torch.randn(1, n, HIDDEN, generator=g)
    kc, vc = torch.randn(1, Hkv, T, D, generator=g), torch.randn(1, Hkv, T, D, generator=g)
    cos, sin = rope(1, n, D, lengths)
    together = run_op(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq)
    for i in range(n):  # one token at a time, each on top of the previous ones' cache slots
        alone = run_op(w, x[:, i : i + 1], cos[:, i : i + 1].contiguous(), sin[:, i : i + 1].contiguous(), kc, vc,
                       lengths + i, Hq)
        assert torch.equal(alone[0, 0], together[0, i]), i


# Head dims of the vector attention: AVX-512 takes 16 .. 128 in 16s (tiles of 4 or 2 queries), AVX2
# 8 .. 128 in 8s (tiles of 4, 3, 2 or 1).
@pytest.mark.parametrize("D", [8, 16, 32, 40, 48, 64, 128])
@pytest.mark.parametrize("n,tree", [(1, False), (6, False), (9, True)])
def test_longer_caches_match_reference(D, n, tree):
    # Caches longer than a few 16-slot blocks, so the masked tails of the vector softmax run.
    Hq, Hkv, B, slots = 4, 2, 2, 140
    w = make_layer(Hq, Hkv, D, False, False, seed=D)
    g = torch.Generator().manual_seed(D + n)
    lengths = torch.tensor([37, 101])
    x = torch.randn(B, n, HIDDEN, generator=g)
    kc, vc = torch.randn(B, Hkv, slots, D, generator=g), torch.randn(B, Hkv, slots, D, generator=g)
    tree_mask = torch.rand(B, n, n, generator=g) < 0.5 if tree else None
    cos, sin = rope(B, n, D, lengths)
    expected = run_ref(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq, tree_mask)
    torch.testing.assert_close(run_op(w, x, cos, sin, kc, vc, lengths, Hq, tree_mask), expected, rtol=1e-4, atol=1e-4)


def test_a_tree_node_gets_the_bits_of_its_path_decoded_as_a_chain():
    # After a tree verification the accepted path is compacted to contiguous cache slots; decoding
    # the path's tokens as a chain on top must give each the bits it had as a tree node.
    Hq, Hkv, D, slots = 4, 2, 64, 80
    w = make_layer(Hq, Hkv, D, True, False, seed=7)
    g = torch.Generator().manual_seed(8)
    parents = [-1, 0, 0, 1, 2, 2]  # nodes in topological order; the path 0 -> 2 -> 5
    n = len(parents)
    mask = torch.zeros(1, n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[0, i, j], j = True, parents[j]
    lengths = torch.tensor([45])
    x = torch.randn(1, n, HIDDEN, generator=g)
    kc, vc = torch.randn(1, Hkv, slots, D, generator=g), torch.randn(1, Hkv, slots, D, generator=g)
    depth = torch.tensor([0, 1, 1, 2, 2, 2])
    angles = (lengths + depth)[None, :, None].float() * torch.cat([torch.linspace(0.02, 1.0, D // 2)] * 2)
    sin = angles.sin()
    sin[..., : D // 2].neg_()
    cos = angles.cos().contiguous()
    tree = run_op(w, x, cos, sin.contiguous(), kc.clone(), vc.clone(), lengths, Hq, mask)
    path = [0, 2, 5]
    chain = run_op(w, x[:, path], cos[:, path].contiguous(), sin[:, path].contiguous(), kc, vc, lengths, Hq)
    assert torch.equal(chain, tree[:, path])


def test_bf16_packed_weights_give_the_float32_bits():
    Hq, Hkv, D = 4, 2, 16
    w = make_layer(Hq, Hkv, D, False, False, seed=5, bf16=True)
    lengths = torch.tensor([3])
    x = torch.randn(1, 2, HIDDEN)
    kc, vc = torch.randn(1, Hkv, T, D), torch.randn(1, Hkv, T, D)
    cos, sin = rope(1, 2, D, lengths)
    as_bf16 = run_op(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq)
    as_f32 = run_op(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq, pack=lambda t: pack_weight(t, torch.float32))
    if packed_bf16_tier() == "amx":  # exact products, float32 sums in the tile unit's order
        torch.testing.assert_close(as_bf16, as_f32, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(as_bf16, as_f32)


def test_bad_inputs_raise_naming_the_input():
    Hq, Hkv, D = 4, 2, 16
    w = make_layer(Hq, Hkv, D, False, False)
    x, kc, vc = torch.randn(1, 2, HIDDEN), torch.zeros(1, Hkv, T, D), torch.zeros(1, Hkv, T, D)
    cos, sin = rope(1, 2, D, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="cache slots"):
        run_op(w, x, cos, sin, kc, vc, torch.tensor([T - 1]), Hq)
    with pytest.raises(RuntimeError, match="query heads"):
        run_op(w, x, cos, sin, kc, vc, torch.tensor([0]), 3)
    with pytest.raises(RuntimeError, match="cos"):
        run_op(w, x, cos[:, :1].contiguous(), sin, kc, vc, torch.tensor([0]), Hq)
    with pytest.raises(RuntimeError, match="tree_mask"):
        run_op(w, x, cos, sin, kc, vc, torch.tensor([0]), Hq, tree_mask=torch.ones(1, 3, 3, dtype=torch.bool))
    bad = dict(w, o_w=torch.randn(HIDDEN, Hq * D + 1))  # K does not match the attention width
    with pytest.raises(RuntimeError, match="o must be a packed"):
        run_op(bad, x, cos, sin, kc, vc, torch.tensor([0]), Hq)


def test_opcheck():
    Hq, Hkv, D = 4, 2, 16
    w = make_layer(Hq, Hkv, D, True, True)
    p = {k: pack_weight(w[k]).panels for k in ("qkv_w", "o_w", "gate_up_w", "down_w")}
    cos, sin = rope(1, 2, D, torch.tensor([1]))
    torch.library.opcheck(torch.ops.specdec.decoder_layer.default, (
        torch.randn(1, 2, HIDDEN), w["norm1"], w["norm2"], 1e-5, p["qkv_w"], w["qkv_b"], p["o_w"], w["o_b"],
        p["gate_up_w"], w["gate_up_b"], p["down_w"], w["down_b"], w["q_norm"], w["k_norm"], cos, sin,
        torch.zeros(1, Hkv, T, D), torch.zeros(1, Hkv, T, D), torch.tensor([1]), None, Hq, Hkv, D ** -0.5,
        torch.empty(1, 2, HIDDEN)))


# -- context_kv: KV injection's context keys and values (the DFlash drafter's extend) -------------

def make_context(L, Hkv, D, bias, layers_read=3, seed=7):
    g = torch.Generator().manual_seed(seed)
    return dict(fc_w=torch.randn(HIDDEN, layers_read * HIDDEN, generator=g) * 0.1,
                context_norm=1 + 0.3 * torch.randn(HIDDEN, generator=g),
                kv_w=torch.randn(L * 2 * Hkv * D, HIDDEN, generator=g) * 0.3,
                kv_b=torch.randn(L * 2 * Hkv * D, generator=g) * 0.3 if bias else None,
                k_norm=1 + 0.3 * torch.randn(L, D, generator=g))


def run_context_op(w, hidden, cos, sin, kc, vc, lengths):
    from specdec_cuda.ops.decoder_layer import context_kv

    context_kv(hidden, pack_weight(w["fc_w"]), w["context_norm"], pack_weight(w["kv_w"]), w["kv_b"], w["k_norm"],
               1e-5, cos, sin, kc, vc, lengths)


@pytest.mark.parametrize("L,Hkv,D,bias", [(2, 1, 16, False), (3, 2, 8, True), (1, 2, 24, False)])
@pytest.mark.parametrize("n", [1, 4])
def test_context_kv_matches_reference_and_leaves_other_slots(L, Hkv, D, bias, n):
    B = 2
    w = make_context(L, Hkv, D, bias)
    g = torch.Generator().manual_seed(n)
    lengths = torch.tensor([3, 11])  # rows of different lengths: each writes its own slots
    hidden = torch.randn(B, n, 3 * HIDDEN, generator=g)
    kc, vc = torch.randn(L, B, Hkv, T, D, generator=g), torch.randn(L, B, Hkv, T, D, generator=g)
    cos, sin = rope(B, n, D, lengths)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    run_context_op(w, hidden, cos, sin, kc, vc, lengths)
    ref.context_kv(hidden, w["fc_w"], w["context_norm"], w["kv_w"], w["kv_b"], w["k_norm"], 1e-5, cos, sin, kc_ref,
                   vc_ref, lengths)
    torch.testing.assert_close(kc, kc_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc, vc_ref, rtol=1e-5, atol=1e-5)
    written = torch.zeros(T, dtype=torch.bool)
    for b, start in enumerate(lengths.tolist()):
        untouched = torch.ones(T, dtype=torch.bool)
        untouched[start: start + n] = False
        assert torch.equal(kc[:, b, :, untouched], kc_ref[:, b, :, untouched])
        written |= ~untouched
    assert not torch.allclose(kc[:, :, :, written], torch.zeros(()))  # something was written


def test_context_kv_matches_the_dflash_drafters_torch_path():
    # The op is the drafter's context_features + context_kv: the same keys and values.
    from specdec_cuda.models.dflash import DFlashConfig, DFlashDrafter

    c = DFlashConfig(hidden_size=HIDDEN, vocab_size=64, target_layers=(0, 2, 3), num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=12, intermediate_size=40)
    drafter = DFlashDrafter.random(c, seed=3, std=0.2)
    hidden = {i: torch.randn(2, 5, HIDDEN) for i in c.target_layers}
    lengths = torch.tensor([4, 9])
    slots = lengths[:, None] + torch.arange(5)
    with torch.no_grad():
        cos, sin = drafter.rope(slots)
        k, v = drafter.context_kv(drafter.context_features(hidden), cos, sin)  # [L, B, Hkv, n, D]
        weight, bias, k_norm = drafter._stacked_kv()
        kc, vc = torch.zeros(2, 2, 2, T, 12), torch.zeros(2, 2, 2, T, 12)
        from specdec_cuda.ops.decoder_layer import context_kv

        context_kv(torch.cat([hidden[i] for i in c.target_layers], -1), pack_weight(drafter.fc.weight),
                   drafter.context_norm, pack_weight(weight), bias, k_norm.reshape(2, 12), c.rms_norm_eps,
                   cos[:, :, 0].contiguous(), sin[:, :, 0].contiguous(), kc, vc, lengths)
    for b, start in enumerate(lengths.tolist()):
        torch.testing.assert_close(kc[:, b, :, start: start + 5], k[:, b], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vc[:, b, :, start: start + 5], v[:, b], rtol=1e-5, atol=1e-5)


def test_context_kv_bad_inputs_raise_naming_the_input():
    L, Hkv, D = 3, 2, 16  # k|v of 192 outputs: 3 panels (a packed weight knows N to a panel)
    w = make_context(L, Hkv, D, False)
    hidden = torch.randn(1, 2, 3 * HIDDEN)
    kc, vc = torch.zeros(L, 1, Hkv, T, D), torch.zeros(L, 1, Hkv, T, D)
    cos, sin = rope(1, 2, D, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="cache slots"):
        run_context_op(w, hidden, cos, sin, kc, vc, torch.tensor([T - 1]))
    with pytest.raises(RuntimeError, match="k_norm"):
        run_context_op(dict(w, k_norm=w["k_norm"][:1]), hidden, cos, sin, kc, vc, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="fc_w"):
        run_context_op(w, torch.randn(1, 2, 2 * HIDDEN), cos, sin, kc, vc, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="kv_w"):
        run_context_op(dict(w, kv_w=w["kv_w"][: 2 * Hkv * D]), hidden, cos, sin, kc, vc, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="v_cache"):
        run_context_op(w, hidden, cos, sin, kc, vc[:, :, :, :-1], torch.tensor([0]))


def test_context_kv_opcheck():
    L, Hkv, D = 2, 1, 16
    w = make_context(L, Hkv, D, True)
    cos, sin = rope(1, 2, D, torch.tensor([1]))
    torch.library.opcheck(torch.ops.specdec.context_kv.default, (
        torch.randn(1, 2, 3 * HIDDEN), pack_weight(w["fc_w"]).panels, w["context_norm"], pack_weight(w["kv_w"]).panels,
        w["kv_b"], w["k_norm"], 1e-5, cos, sin, torch.zeros(L, 1, Hkv, T, D), torch.zeros(L, 1, Hkv, T, D),
        torch.tensor([1])))


@pytest.mark.parametrize("cap", ["baseline", "avx2"])
def test_narrower_tiers_match_reference(cap):
    # SPECDEC_CPU_ISA picks a narrower tier than the machine's widest (read once at load: a fresh
    # process): "baseline" the portable loops, "avx2" the AVX2 kernels where the CPU has AVX2.
    isa = "avx2" if cap == "avx2" and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "portable"
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    code = ("import sys; sys.path.insert(0, %r); import test_decoder_layer as t; "
            f"from specdec_cuda._native import _C; assert _C.skinny_linear_packed_isa() == {isa!r}; "
            "t.test_matches_reference_and_writes_the_cache(4, 2, 16, True, True, 3, True); "
            "t.test_matches_reference_and_writes_the_cache(2, 2, 24, False, True, 6, True); "
            "t.test_longer_caches_match_reference(40, 9, True); "
            "t.test_an_mlp_width_off_the_vector_width_matches_reference(); "
            "t.test_a_token_gets_the_same_bits_alone_or_verified_with_others(); "
            "t.test_a_tree_node_gets_the_bits_of_its_path_decoded_as_a_chain(); "
            "t.test_context_kv_matches_reference_and_leaves_other_slots(3, 2, 8, True, 4)") % tests_dir
    run_capped(cap, code)
