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


def run_op(w, x, cos, sin, kc, vc, lengths, Hq, tree_mask=None, pack=pack_weight, activations="float32"):
    return decoder_layer(x, w["norm1"], w["norm2"], 1e-5, pack(w["qkv_w"]), pack(w["o_w"]), pack(w["gate_up_w"]),
                         pack(w["down_w"]), cos, sin, kc, vc, lengths, Hq,
                         biases=(w["qkv_b"], w["o_b"], w["gate_up_b"], w["down_b"]),
                         qk_norm=None if w["q_norm"] is None else (w["q_norm"], w["k_norm"]), tree_mask=tree_mask,
                         activations=activations)


def run_ref(w, x, cos, sin, kc, vc, lengths, Hq, tree_mask=None, activations="float32"):
    return ref.decoder_layer(x, w["norm1"], w["norm2"], 1e-5, w["qkv_w"], w["qkv_b"], w["o_w"], w["o_b"],
                             w["gate_up_w"], w["gate_up_b"], w["down_w"], w["down_b"], w["q_norm"], w["k_norm"],
                             cos, sin, kc, vc, lengths, tree_mask, Hq, activations=activations)


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


rounded_tier = pytest.mark.skipif(packed_bf16_tier() != "amx",
                                  reason="bfloat16-rounded activations run on the AMX tier only")


@rounded_tier
@pytest.mark.parametrize("inter", [40, 41])  # 41: down's K odd (a zero-padded last 32-k chunk)
def test_rounded_activations_match_the_reference_with_rounded_inputs(inter):
    # activations="bfloat16" on bfloat16 panels on AMX tiles: each projection multiplies x rounded
    # to bfloat16 (the products themselves: test_skinny_linear.py).
    # Against the reference only to bf16 rounding: an input the op's own SiLU or norm puts on the
    # other side of a bfloat16 rounding boundary moves its products by one bf16 ulp.
    Hq, Hkv, D = 4, 2, 16
    w = make_layer(Hq, Hkv, D, True, False, seed=11, bf16=True, inter=inter)
    g = torch.Generator().manual_seed(12)
    lengths, n = torch.tensor([5, 9]), 13
    x = torch.randn(2, n, HIDDEN, generator=g)
    kc, vc = torch.randn(2, Hkv, T, D, generator=g), torch.randn(2, Hkv, T, D, generator=g)
    cos, sin = rope(2, n, D, lengths)
    bf16 = lambda t: pack_weight(t, torch.bfloat16)  # noqa: E731
    got = run_op(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq, pack=bf16, activations="bfloat16")
    want = run_ref(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq, activations="bfloat16")
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-2
    rows_close = ((got - want).abs().amax(-1) < 1e-4).float().mean().item()
    assert rows_close > 0.75  # most rows: float32 rounding only (no input crossed a boundary)
    exact = run_op(w, x, cos, sin, kc.clone(), vc.clone(), lengths, Hq, pack=bf16)
    assert not torch.equal(got, exact)  # the rounding is real
    # Each row alone gets its bits from the whole batch (the property greedy exactness needs).
    for b, i in ((0, 0), (1, 7), (1, 12)):
        L = lengths[b:b + 1] + i
        kc1, vc1 = kc[b:b + 1].clone(), vc[b:b + 1].clone()
        kc1[:, :, L[0]:], vc1[:, :, L[0]:] = 0, 0
        if i:  # the rows before it, which write their K/V as in the batch
            run_op(w, x[b:b + 1, :i], cos[b:b + 1, :i].contiguous(), sin[b:b + 1, :i].contiguous(), kc1, vc1,
                   lengths[b:b + 1], Hq, pack=bf16, activations="bfloat16")
        alone = run_op(w, x[b:b + 1, i:i + 1], cos[b:b + 1, i:i + 1].contiguous(), sin[b:b + 1, i:i + 1].contiguous(),
                       kc1, vc1, L, Hq, pack=bf16, activations="bfloat16")
        assert torch.equal(alone[0, 0], got[b, i])


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


# -- dflash_block_topk: the DFlash drafter's block forward as one op (draft_topk / draft_tokens) --

def _dflash_drafter():
    """A random drafter with a random embedding and LM head in place of a target's, its cache
    holding contexts of unequal lengths (4 and 9 tokens) from the torch path's extend."""
    from specdec_cuda.models.dflash import DFlashConfig, DFlashDrafter

    c = DFlashConfig(hidden_size=HIDDEN, vocab_size=64, target_layers=(0, 2, 3), num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=12, intermediate_size=40, block_size=5)
    drafter = DFlashDrafter.random(c, seed=3, std=0.2)
    g = torch.Generator().manual_seed(5)
    drafter._embed, drafter._head = torch.randn(64, HIDDEN, generator=g), torch.randn(64, HIDDEN, generator=g) * 0.3
    cache = drafter.new_cache(2, T)
    drafter.extend(cache, {i: torch.randn(2, 9, HIDDEN, generator=g) for i in c.target_layers}, torch.tensor([4, 9]))
    return drafter, cache


def _dflash_op_args(drafter, cache, anchors, depth, k, head_rows=None, log_probs=True):
    from specdec_cuda.ops.dflash import LAYER_WEIGHTS

    layers = [w for args in drafter.inference().native for w in args[:2] + args[3:]]
    assert len(layers) == len(LAYER_WEIGHTS) * drafter.config.num_layers
    head = drafter._head if head_rows is None else drafter._head[head_rows]
    block = drafter.block_input(anchors, drafter.config.block_size).contiguous()
    block[:, 0] = float("nan")  # the op writes the anchors' row
    cos, sin = drafter._rope_table(64, "cpu")
    c = drafter.config
    return (anchors, drafter._embed, block, cos, sin, layers, c.rms_norm_eps, cache.keys, cache.values, cache.lengths,
            c.num_heads, c.head_dim ** -0.5, depth, drafter.norm.detach(), pack_weight(head).panels, head.shape[0],
            head_rows, k, log_probs)


@pytest.mark.parametrize("depth", [1, 3, 4])
def test_dflash_block_topk_matches_the_drafters_torch_path(monkeypatch, depth):
    # The op is the drafter's torch block (layers over the cache, the block seeing itself whole,
    # rows of unequal context lengths) then log_softmax and topk over the whole vocabulary or a
    # draft vocabulary's head rows (ids mapped back), as log-probabilities or logits.
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the drafter's packed weights are not made")
    drafter, cache = _dflash_drafter()
    anchors = torch.tensor([7, 30])
    monkeypatch.setenv("SPECDEC_PACKED_LINEAR", "0")
    with torch.no_grad():
        logits = drafter.draft(cache, anchors, 5, depth)  # [2, depth, 64]: the torch layers
    monkeypatch.setenv("SPECDEC_PACKED_LINEAR", "1")
    sub = torch.arange(1, 64, 3)
    for rows, log_probs in ((None, True), (sub, True), (sub, False)):
        part = logits if rows is None else logits[..., rows]
        want, index = (torch.log_softmax(part, -1) if log_probs else part).topk(6, -1)
        values, ids, status = torch.ops.specdec.dflash_block_topk(
            *_dflash_op_args(drafter, cache, anchors, depth, 6, rows, log_probs))
        assert values.shape == ids.shape == (2, depth, 6) and status.tolist() == [0] * (2 * depth)
        torch.testing.assert_close(values, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(ids, index if rows is None else rows[index])
    assert cache.lengths.tolist() == [4, 9]  # the context is not extended


def test_dflash_block_topk_bad_inputs_raise_naming_the_input():
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the drafter's packed weights are not made")
    drafter, cache = _dflash_drafter()
    args = _dflash_op_args(drafter, cache, torch.tensor([7, 30]), 2, 4)
    op = torch.ops.specdec.dflash_block_topk

    def call(**changed):
        names = ("anchors", "embed", "block", "rope_cos", "rope_sin", "layers", "norm_eps", "k_caches", "v_caches",
                 "lengths", "num_heads", "sm_scale", "depth", "final_norm", "head", "vocab_size", "vocab_ids", "k",
                 "log_probs")
        return op(*(changed.get(n, a) for n, a in zip(names, args)))

    with pytest.raises(RuntimeError, match="depth must lie in"):
        call(depth=5)
    with pytest.raises(RuntimeError, match=r"anchors\[1\] = 64 is outside the vocabulary"):
        call(anchors=torch.tensor([7, 64]))
    with pytest.raises(RuntimeError, match="past the rope tables"):
        call(rope_cos=args[3][:12].contiguous(), rope_sin=args[4][:12].contiguous())
    with pytest.raises(RuntimeError, match="layer weights do not make layers"):
        call(layers=args[5][:-1])
    with pytest.raises(RuntimeError, match="cache slots"):
        call(lengths=torch.tensor([4, T - 2]))
    with pytest.raises(RuntimeError, match="vocab_ids must be"):
        call(vocab_ids=torch.arange(10))
    values, ids, status = call(final_norm=torch.full((HIDDEN,), float("nan")))
    assert status.tolist() == [1] * 4  # STATUS_NONFINITE_LOGITS on every drafted row


def test_dflash_block_topk_opcheck():
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the drafter's packed weights are not made")
    drafter, cache = _dflash_drafter()
    torch.library.opcheck(torch.ops.specdec.dflash_block_topk.default,
                          _dflash_op_args(drafter, cache, torch.tensor([7, 30]), 3, 4, torch.arange(0, 64, 2)))


def test_dflash_extend_matches_the_drafters_torch_path(monkeypatch):
    # The op is the drafter's torch extend (context_features, context_kv, the keys and values
    # written at slots lengths[b] + j, lengths += num_new): the same caches and lengths, rows of
    # unequal lengths and a row that takes none of the tokens given included.
    from specdec_cuda.models.dflash import DFlashConfig, DFlashDrafter
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the drafter's packed weights are not made")
    c = DFlashConfig(hidden_size=HIDDEN, vocab_size=64, target_layers=(0, 2, 3), num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=12, intermediate_size=40, block_size=5)
    drafter = DFlashDrafter.random(c, seed=3, std=0.2)
    g = torch.Generator().manual_seed(6)
    steps = [({i: torch.randn(2, 9, HIDDEN, generator=g) for i in c.target_layers}, torch.tensor([4, 9])),
             ({i: torch.randn(2, 3, HIDDEN, generator=g) for i in c.target_layers}, torch.tensor([2, 0]))]

    def extended(packed: str):
        monkeypatch.setenv("SPECDEC_PACKED_LINEAR", packed)
        run = drafter.inference()
        assert (run.io is not None) == (packed == "1")
        cache = drafter.new_cache(2, T)
        for hidden, num_new in steps:
            drafter.extend(cache, hidden, num_new, run)
        return cache

    got, want = extended("1"), extended("0")
    assert got.lengths.tolist() == want.lengths.tolist() == [6, 9]
    torch.testing.assert_close(got.all_keys, want.all_keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.all_values, want.all_values, rtol=1e-5, atol=1e-5)


def _dflash_extend_args(drafter, cache, n=3):
    run = drafter.inference()
    _, bias, k_norm = run.stacked
    c = drafter.config
    cos, sin = drafter._rope_table(64, "cpu")
    hidden = [torch.randn(2, n, HIDDEN) for _ in c.target_layers]
    return (hidden, run.io.fc.panels, drafter.context_norm.detach(), run.io.kv.panels, bias,
            k_norm.reshape(c.num_layers, c.head_dim).contiguous(), c.rms_norm_eps, cos, sin, cache.all_keys,
            cache.all_values, cache.lengths.clone(), torch.tensor([1, n]))


def test_dflash_extend_bad_inputs_raise_naming_the_input():
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the drafter's packed weights are not made")
    drafter, cache = _dflash_drafter()
    args = _dflash_extend_args(drafter, cache)
    names = ("hidden", "fc_w", "context_norm", "kv_w", "kv_b", "k_norm", "norm_eps", "rope_cos", "rope_sin", "k_cache",
             "v_cache", "lengths", "num_new")

    def call(**changed):
        return torch.ops.specdec.dflash_extend(*(changed.get(n, a) for n, a in zip(names, args)))

    with pytest.raises(RuntimeError, match=r"hidden\[1\] must be a contiguous float32"):
        call(hidden=[args[0][0], args[0][1][:, :2].contiguous(), args[0][2]])
    with pytest.raises(RuntimeError, match=r"num_new\[1\] = 4 is outside \[0, 3\]"):
        call(num_new=torch.tensor([0, 4]))
    with pytest.raises(RuntimeError, match="past the rope tables"):
        call(rope_cos=args[7][:10].contiguous(), rope_sin=args[8][:10].contiguous())
    with pytest.raises(RuntimeError, match="fc_w"):
        call(hidden=args[0][:2])  # two layers' features where fc reads three
    with pytest.raises(RuntimeError, match="cache slots"):
        call(lengths=torch.tensor([4, T - 2]))
    lengths = args[11]
    call()
    assert lengths.tolist() == [5, 12]  # 4 + 1, 9 + 3: advanced in place


def test_dflash_extend_opcheck():
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the drafter's packed weights are not made")
    drafter, cache = _dflash_drafter()
    torch.library.opcheck(torch.ops.specdec.dflash_extend.default, _dflash_extend_args(drafter, cache))


def test_the_dflash_wrappers_call_the_ops():
    from specdec_cuda import ops
    from specdec_cuda.models.layers import packed_kernel_available

    if not packed_kernel_available():
        pytest.skip("no vectorised packed kernel on this CPU: the drafter's packed weights are not made")
    drafter, cache = _dflash_drafter()
    args = _dflash_op_args(drafter, cache, torch.tensor([7, 30]), 3, 4)
    want = torch.ops.specdec.dflash_block_topk(*args)
    got = ops.dflash_block_topk(*args[:10], drafter.config.num_heads, 3, args[13], pack_weight(drafter._head), 4)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    run = drafter.inference()
    x = _dflash_extend_args(drafter, cache)
    kc, vc, lengths = x[9].clone(), x[10].clone(), x[11].clone()
    torch.ops.specdec.dflash_extend(*x)
    ops.dflash_extend(x[0], run.io.fc, *x[2:3], run.io.kv, *x[4:9], kc, vc, lengths, x[12])
    assert torch.equal(kc, x[9]) and torch.equal(vc, x[10]) and torch.equal(lengths, x[11])
