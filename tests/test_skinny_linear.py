"""``skinny_linear`` (float32 linear for a few rows, CPU) against its reference ``F.linear``, and its
batch invariance: a row's output does not depend on the other rows."""

from __future__ import annotations

import pytest
import torch
from _isolated import run_capped

from specdec_cuda.ops.skinny_linear import (MAX_ROWS, PANEL, linear, pack_weight, packed_bf16_tier, skinny_linear,
                                            skinny_linear_packed)
from specdec_cuda.reference import skinny_linear as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M,K,N", [(1, 64, 7), (5, 2048, 131), (6, 48, 64), (7, 160, 9), (13, 33, 5), (33, 256, 111)])
def test_matches_reference(M, K, N, bias):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g) if bias else None
    torch.testing.assert_close(skinny_linear(x, w, b), ref.skinny_linear(x, w, b), rtol=1e-4, atol=1e-4 * K ** 0.5)


@pytest.mark.parametrize("K", [128, 72])  # the AVX-512 kernel (K % 16 == 0) and the portable one
def test_a_row_gives_the_same_bits_alone_or_in_a_batch(K):
    g = torch.Generator().manual_seed(K)
    x, w, b = torch.randn(17, K, generator=g), torch.randn(37, K, generator=g), torch.randn(37, generator=g)
    together = skinny_linear(x, w, b)
    for m in range(17):
        assert torch.equal(skinny_linear(x[m : m + 1], w, b)[0], together[m]), m
        assert torch.equal(skinny_linear(x[: m + 1], w, b)[m], together[m]), m


def test_leading_dims_and_the_dispatching_linear():
    x, w = torch.randn(2, 3, 32), torch.randn(16, 32)
    assert skinny_linear(x, w).shape == (2, 3, 16)
    torch.testing.assert_close(linear(x, w), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)
    big = torch.randn(MAX_ROWS + 1, 32)  # beyond the kernel's rows: BLAS
    torch.testing.assert_close(linear(big, w), torch.nn.functional.linear(big, w))
    assert torch.equal(linear(x.double(), w.double()), torch.nn.functional.linear(x.double(), w.double()))


def test_bad_inputs_raise_naming_the_input():
    with pytest.raises(TypeError, match="weight"):
        skinny_linear(torch.randn(2, 8), torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="agree on K"):
        skinny_linear(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(RuntimeError, match="bias"):
        torch.ops.specdec.skinny_linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5), torch.empty(2, 4))
    with pytest.raises(RuntimeError, match="out"):
        torch.ops.specdec.skinny_linear(torch.randn(2, 8), torch.randn(4, 8), None, torch.empty(2, 5))


def test_opcheck():
    torch.library.opcheck(torch.ops.specdec.skinny_linear.default,
                          (torch.randn(3, 32), torch.randn(8, 32), torch.randn(8), torch.empty(3, 8)))


def test_portable_kernel_matches_reference():
    # SPECDEC_CPU_ISA=baseline picks the portable loop (read once at load: a fresh process).
    code = ("import torch; from specdec_cuda.ops.skinny_linear import skinny_linear; "
            "x, w = torch.randn(5, 128), torch.randn(40, 128); "
            "torch.testing.assert_close(skinny_linear(x, w), x @ w.T, rtol=1e-4, atol=1e-3); "
            "assert torch.equal(skinny_linear(x[2:3], w)[0], skinny_linear(x, w)[2])")
    run_capped("baseline", code)


# ---- the packed form (skinny_linear_packed) ------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M,K,N", [(1, 64, 7), (5, 512, 131), (6, 48, 64), (7, 33, 65), (17, 192, 320), (33, 40, 1)])
def test_packed_matches_reference(M, K, N, bias):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g) if bias else None
    packed = pack_weight(w)
    assert packed.panels.dtype == torch.float32 and packed.panels.shape == (-(-N // PANEL), K, PANEL)
    torch.testing.assert_close(ref.unpack_weight(packed.panels, N), w, rtol=0, atol=0)
    torch.testing.assert_close(skinny_linear_packed(x, packed, b), ref.skinny_linear_packed(x, packed.panels, N, b),
                               rtol=1e-4, atol=1e-4 * K ** 0.5)


def test_packed_bf16_weights_give_the_float32_weights_bits():
    # A bf16 checkpoint loaded as float32 packs as bf16 (half the bytes) with the same product: the
    # same bits on the FMA tiers; on the AMX tier (exact products, float32 sums in another order)
    # the same to float32 rounding.
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 96, generator=g), torch.randn(130, 96, generator=g).bfloat16().float()
    as_bf16, as_f32 = pack_weight(w), pack_weight(w, torch.float32)
    assert as_bf16.panels.dtype == torch.bfloat16 and as_bf16.nbytes * 2 == as_f32.nbytes
    if packed_bf16_tier() == "amx":
        torch.testing.assert_close(skinny_linear_packed(x, as_bf16), skinny_linear_packed(x, as_f32),
                                   rtol=1e-5, atol=1e-5 * 96 ** 0.5)
    else:
        assert torch.equal(skinny_linear_packed(x, as_bf16), skinny_linear_packed(x, as_f32))
    with pytest.raises(ValueError, match="not bfloat16 numbers"):
        pack_weight(torch.randn(4, 8) / 3, torch.bfloat16)


def test_packed_row_gives_the_same_bits_alone_or_in_a_batch():
    g = torch.Generator().manual_seed(5)
    x, w, b = torch.randn(17, 80, generator=g), torch.randn(70, 80, generator=g), torch.randn(70, generator=g)
    packed = pack_weight(w)
    together = skinny_linear_packed(x, packed, b)
    for m in range(17):
        assert torch.equal(skinny_linear_packed(x[m : m + 1], packed, b)[0], together[m]), m
        assert torch.equal(skinny_linear_packed(x[: m + 1], packed, b)[m], together[m]), m


def test_packed_leading_dims_bad_inputs_and_opcheck():
    packed = pack_weight(torch.randn(16, 32))
    assert skinny_linear_packed(torch.randn(2, 3, 32), packed).shape == (2, 3, 16)
    with pytest.raises(ValueError, match="K=32"):
        skinny_linear_packed(torch.randn(2, 31), packed)
    with pytest.raises(TypeError, match="float32"):
        pack_weight(torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="panels"):  # out's N does not fit the panel count
        torch.ops.specdec.skinny_linear_packed(torch.randn(2, 32), packed.panels, None, torch.empty(2, 65))
    with pytest.raises(RuntimeError, match="bias"):
        torch.ops.specdec.skinny_linear_packed(torch.randn(2, 32), packed.panels, torch.randn(5), torch.empty(2, 16))
    torch.library.opcheck(torch.ops.specdec.skinny_linear_packed.default,
                          (torch.randn(3, 32), packed.panels, torch.randn(16), torch.empty(3, 16)))


@pytest.mark.parametrize("cap", ["baseline", "avx2"])
def test_packed_narrower_tiers_give_the_vector_kernels_bits(cap):
    # Every tier is one fma chain per output over K in order: the same bits. SPECDEC_CPU_ISA picks
    # the portable loop ("baseline") or the AVX2 kernel where the CPU has AVX2 (a fresh process
    # reads it at load). Odd widths and bias exercise the AVX2 kernel's masked tails.
    isa = "avx2" if cap == "avx2" and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "portable"
    g = torch.Generator().manual_seed(11)
    x, w, b = torch.randn(14, 72, generator=g), torch.randn(90, 72, generator=g), torch.randn(90, generator=g)
    wb = torch.randn(77, 72, generator=g).bfloat16().float()
    def run(cap, expect=None):  # every product in a fresh process capped to `cap`
        code = ("import sys, torch; from specdec_cuda._native import _C; "
                "from specdec_cuda.ops.skinny_linear import pack_weight, skinny_linear_packed; "
                f"assert {expect is None} or _C.skinny_linear_packed_isa() == {expect!r}, _C.skinny_linear_packed_isa(); "
                "x, w, b, wb = torch.load(sys.argv[1]); "
                "out = [skinny_linear_packed(x[:m], pack_weight(w), b) for m in range(1, 15)]; "
                "out += [skinny_linear_packed(x[:m], pack_weight(wb)) for m in range(1, 15)]; "
                "torch.save(out, sys.argv[1])")
        return run_capped(cap, code, (x, w, b, wb))

    # The widest FMA tier here: this process, unless its bf16 panels run the AMX tier (other bits).
    if packed_bf16_tier() == "amx":
        here = run("avx512-novnni")
    else:
        here = [skinny_linear_packed(x[:m], pack_weight(w), b) for m in range(1, 15)]
        here += [skinny_linear_packed(x[:m], pack_weight(wb)) for m in range(1, 15)]
    theirs = run(cap, isa)
    for m, (a, c) in enumerate(zip(theirs, here)):
        assert torch.equal(a, c), m


amx_only = pytest.mark.skipif(packed_bf16_tier() != "amx", reason="bfloat16 panels run the AMX tier only on AMX CPUs")


@amx_only
@pytest.mark.parametrize("activations", ["float32", "bfloat16"])
@pytest.mark.parametrize("M,K,N", [(1, 64, 7), (5, 33, 130), (16, 96, 64), (17, 1536, 200), (40, 100, 129)])
def test_amx_tier_matches_float64_to_float32_rounding(M, K, N, activations):
    # Exact products of the three-way split, or of x rounded to nearest bfloat16 ("bfloat16": one
    # tile product per weight, as a model set to bfloat16 activations and a prompt's prefill
    # multiply); float32 sums. Odd K (a zero-padded last 32-k chunk), partial panels, more than 16
    # rows (several row blocks), bias.
    g = torch.Generator().manual_seed(M * 7 + K + N)
    x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g).bfloat16(), torch.randn(N, generator=g)
    out = skinny_linear_packed(x, pack_weight(w), b, activations=activations)
    xd = (x.bfloat16() if activations == "bfloat16" else x).double()
    exact = xd @ w.double().T + b.double()
    scale = xd.abs() @ w.double().abs().T + b.double().abs()
    bound = 4 * K ** 0.5 * 2.0 ** -24 * scale
    assert ((out.double() - exact).abs() <= bound + 1e-30).all()
    if activations == "bfloat16":  # the rounding is real
        assert ((out.double() - (x.double() @ w.double().T + b.double())).abs() > bound).any()


@amx_only
@pytest.mark.parametrize("activations", ["float32", "bfloat16"])
def test_amx_tier_gives_a_row_its_bits_alone_or_with_up_to_40_others(activations):
    g = torch.Generator().manual_seed(21)
    x, w, b = torch.randn(40, 160, generator=g), torch.randn(150, 160, generator=g).bfloat16(), torch.randn(150, generator=g)
    packed = pack_weight(w)

    def run(rows):
        return skinny_linear_packed(rows, packed, b, activations=activations)

    together = run(x)
    for m in range(40):
        assert torch.equal(run(x[m : m + 1])[0], together[m]), m
        assert torch.equal(run(x[: m + 1])[m], together[m]), m
        assert torch.equal(run(x[m:].flip(0))[-1], together[m]), m


@amx_only
def test_amx_tier_keeps_tiny_and_huge_activations_and_propagates_non_finite():
    w = torch.ones(64, 32).bfloat16()
    x = torch.zeros(3, 32)
    x[0, 0] = 1.0 + 2.0 ** -23  # needs all three parts: hi = 1, lo = 0, lo2 = 2^-23
    x[1, :] = 3.0e38 / 64
    x[2, 5] = float("nan")
    out = skinny_linear_packed(x, pack_weight(w))
    assert out[0, 0].item() == 1.0 + 2.0 ** -23
    assert torch.isfinite(out[1]).all() and out[1, 0].item() == pytest.approx(1.5e38, rel=1e-6)
    assert torch.isnan(out[2]).all()


def test_fma_caps_turn_the_amx_tier_off():
    run_capped("avx512-novnni", "from specdec_cuda.ops.skinny_linear import packed_bf16_tier; "
                                "t = packed_bf16_tier(); assert t != 'amx', t")


def test_rounded_activations_are_ignored_by_float32_panels_and_the_fma_tiers_and_checked():
    g = torch.Generator().manual_seed(24)
    x, w = torch.randn(3, 64, generator=g), torch.randn(70, 64, generator=g).bfloat16()
    with pytest.raises(ValueError, match="activations"):
        skinny_linear_packed(x, pack_weight(w), activations="fp8")
    w32 = pack_weight(torch.randn(70, 64, generator=g))  # float32 panels: x as it is on every tier
    assert torch.equal(skinny_linear_packed(x, w32, activations="bfloat16"), skinny_linear_packed(x, w32))
    run_capped("avx512-novnni", "import torch; from specdec_cuda.ops.skinny_linear import pack_weight, "
                                "packed_bf16_tier, skinny_linear_packed; "
                                "assert packed_bf16_tier() != 'amx', packed_bf16_tier(); "
                                "x, w = torch.randn(3, 64), torch.randn(70, 64).bfloat16(); p = pack_weight(w); "
                                "assert torch.equal(skinny_linear_packed(x, p, activations='bfloat16'), "
                                "skinny_linear_packed(x, p))")


def test_pack_weight_takes_bf16_weights_and_unpacks_exactly():
    from specdec_cuda.ops.skinny_linear import unpack_weight

    g = torch.Generator().manual_seed(12)
    for N in (1, 64, 130):
        w = torch.randn(N, 40, generator=g)
        assert torch.equal(unpack_weight(pack_weight(w)), w)
        packed = pack_weight(w.bfloat16())  # a bf16 model's weight: bf16 panels, the same as its float32 copy's
        assert packed.panels.dtype == torch.bfloat16
        assert torch.equal(packed.panels, pack_weight(w.bfloat16().float()).panels)
        assert torch.equal(unpack_weight(packed), w.bfloat16())
        assert torch.equal(ref.unpack_weight(packed.panels, N), w.bfloat16().float())


@pytest.mark.parametrize("K", [100, 33])  # several k-blocks of the AVX2 kernel, and a partial one
def test_packed_rows_of_a_prefill_chunk_get_the_bits_of_one_row(K):
    # Up to 96 rows (a prefill chunk) in row blocks of 6 over each k-block: every row's outputs are
    # still one fma chain over k in order, the bits of that row alone.
    g = torch.Generator().manual_seed(K)
    x, b = torch.randn(96, K, generator=g), torch.randn(130, generator=g)
    w = torch.randn(130, K, generator=g).bfloat16()
    packed = pack_weight(w)
    together = skinny_linear_packed(x, packed, b)
    torch.testing.assert_close(together, ref.skinny_linear(x, w.float(), b), rtol=1e-4, atol=1e-4 * K ** 0.5)
    for m in (0, 5, 6, 11, 47, 95):
        assert torch.equal(skinny_linear_packed(x[m : m + 1], packed, b)[0], together[m]), m


def test_packed_threads_claim_panels_without_changing_bits():
    # The panels are claimed by whichever thread is free (ops/claim_parallel.h): many calls on 2
    # threads, and calls from two Python threads at once (one of them then runs serially), give
    # the bits of one thread.
    import threading

    g = torch.Generator().manual_seed(13)
    x, w = torch.randn(5, 256, generator=g), torch.randn(2048, 256, generator=g)
    packed = pack_weight(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = skinny_linear_packed(x, packed)
        torch.set_num_threads(2)
        for _ in range(200):
            assert torch.equal(skinny_linear_packed(x, packed), want)
        bad = []

        def worker():
            for _ in range(100):
                if not torch.equal(skinny_linear_packed(x, packed), want):
                    bad.append(1)

        pool = [threading.Thread(target=worker) for _ in range(2)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert not bad
    finally:
        torch.set_num_threads(threads)
