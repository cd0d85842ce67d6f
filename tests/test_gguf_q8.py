"""gguf_matmul(activations="q8"): int8 activations, integer dot products, against reference/gguf.py
bit for bit (quantize_q8, matmul_q8), across ISA tiers, batch sizes and row splits."""

from __future__ import annotations

import pytest
import torch

from _gguf_testlib import random_blocks as random_block_bytes
from _isolated import run_capped
from specdec_cuda.ops import gguf as g
from specdec_cuda.reference import gguf as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 3, 6, 8, 12, 14
FORMATS = [Q4_1, Q5_0, Q8_0, Q4_K, Q6_K]
NAMES = {q: g.FORMATS[q][0] for q in FORMATS}
# K per format: legacy 224 = 7 blocks (a partial octet), 288 = 9 (a whole octet and a partial one),
# 1536 = 6 octets; k-quants 256 .. 1536
SHAPES = {Q4_1: [224, 288, 512, 1536], Q5_0: [224, 288, 512, 1536], Q8_0: [224, 288, 512, 1536],
          Q4_K: [256, 512, 1536], Q6_K: [256, 512, 1536]}
# |q8 - float32 gguf_matmul| <= Q8_RTOL * max(|x|·|W|ᵀ): x rounded to 8 bits per block of 32
Q8_RTOL = 1e-2


def random_blocks(qtype: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """``_gguf_testlib.random_blocks`` as a tensor.  Shape: uint8 [n, row_bytes]."""
    return torch.from_numpy(random_block_bytes(qtype, n, k, seed))


def weight(qtype: int, n: int, k: int, seed: int = 0) -> g.GgufWeight:
    return g.gguf_weight(random_blocks(qtype, n, k, seed), qtype, (n, k))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


# ---- quantisation -------------------------------------------------------------------------------


def test_quantize_equals_reference_bytes():
    gen = torch.Generator().manual_seed(0)
    for k in (32, 224, 256, 512, 1536):
        x = torch.randn(7, k, generator=gen) * torch.logspace(-3, 3, 7)[:, None]
        xq = g.quantize_q8(x)
        assert xq.shape == (7, g.q8_row_bytes(k)) and xq.dtype == torch.uint8
        assert torch.equal(xq, ref.quantize_q8(x)), k


def test_quantize_edge_values():
    k = 256
    rows = []
    rows.append(torch.zeros(k))                                        # all-zero blocks: d = 0, codes 0
    rows.append(torch.full((k,), -3.5))                                # constant: every code -127
    t = torch.zeros(k)
    t[0], t[1:32] = 127.0, torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5] * 5 + [126.5])  # d = 1: ties
    rows.append(t)
    rows.append(torch.tensor([3.0e38, -3.0e38] * (k // 2)))            # near the float32 maximum
    rows.append(torch.tensor([1e-45, -2e-45, 0.0, 1.2e-38] * (k // 4)))  # subnormal: d = 0 or tiny
    rows.append(torch.randn(k) * 1e-30)
    mixed = torch.randn(k)
    mixed[32:64] = 0.0                                                 # one zero block among others
    mixed[64] = -1e4                                                   # one large outlier in a block
    rows.append(mixed)
    x = torch.stack(rows)
    xq = g.quantize_q8(x)
    assert torch.equal(xq, ref.quantize_q8(x))
    q, d, s = ref.quantize_q8_parts(x)
    assert torch.equal(q[0], torch.zeros(k, dtype=torch.int8)) and torch.equal(d[0], torch.zeros(k // 32))
    assert bool((q[1] == -127).all())
    assert q[2, :32].tolist() == [127, 0, 2, 2, 0, -2, -2, 0, 2, 2, 0, -2, -2, 0, 2, 2, 0, -2, -2, 0, 2, 2, 0,
                                  -2, -2, 0, 2, 2, 0, -2, -2, 126]  # round half to even
    assert int(q.abs().max()) <= 127
    assert torch.equal(s.to(torch.int32), q.reshape(x.shape[0], -1, 16).to(torch.int32).sum(-1))
    # bytes: codes, scales, half sums, zero padding
    t_ = (k // 32 + 7) // 8
    assert torch.equal(xq[:, :k].view(torch.int8), q)
    assert torch.equal(xq[:, k:k + 32 * t_].contiguous().view(torch.float32), d)
    assert bool((xq[:, k + 64 * t_:] == 0).all())


def test_quantize_16_bit_inputs_widen_exactly():
    x = torch.randn(3, 512)
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(g.quantize_q8(x.to(dtype)), ref.quantize_q8(x.to(dtype).float()))


# ---- matmul -------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: NAMES[q])
def test_matmul_equals_reference_bit_for_bit(qtype):
    gen = torch.Generator().manual_seed(qtype)
    for k in SHAPES[qtype]:
        n = 37 if k > 512 else 111  # neither a multiple of any tile
        raw = random_blocks(qtype, n, k, seed=k)
        w = g.gguf_weight(raw, qtype, (n, k))
        for m in (1, 2, 5, 7, 16, 33, 64):
            if k == 1536 and m not in (1, 7, 33):
                continue  # keep the reference's float64 einsums small
            x = torch.randn(m, k, generator=gen)
            y = g.gguf_matmul(x, w, activations="q8")
            assert y.shape == (m, n) and y.dtype == torch.float32
            assert torch.equal(bits(y), bits(ref.matmul_q8(x, raw, qtype, n))), (k, m)


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K], ids=lambda q: NAMES[q])
def test_extreme_codes_keep_the_bits(qtype):
    # Every weight code and scale at its largest and every activation code at +-127: the AVX2
    # tier's lane dots add vpmaddubsw words in int16 (Q4_K: 8 registers' words, up to 30480; Q6_K:
    # 2, up to 32004), here at that bound, where a wrap would change the bits.
    k, n = 512, 19
    raw = random_blocks(qtype, n, k, seed=5).view(n, k // 256, -1).clone()
    if qtype == Q4_K:
        raw[:, :, 4:144] = 0xFF  # 6-bit scales and mins 63, codes 15
    else:
        raw[:, :, 0:192] = 0xFF  # codes 63 (weight 31)
        raw[:, :, 192:208] = torch.tensor([0x7F, 0x80] * 8, dtype=torch.uint8)  # scales 127, -128
    raw = raw.reshape(n, -1)
    w = g.gguf_weight(raw, qtype, (n, k))
    x = torch.ones(6, k)  # codes 127
    x[1] = -1.0
    x[3, ::2] = -1.0
    x[5, 256:] = -1.0
    for m in (1, 2, 6):
        y = g.gguf_matmul(x[:m], w, activations="q8")
        assert torch.equal(bits(y), bits(ref.matmul_q8(x[:m], raw, qtype, n))), m


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: NAMES[q])
def test_matmul_is_close_to_the_float32_kernel(qtype):
    k = SHAPES[qtype][-1]
    raw = random_blocks(qtype, 64, k, seed=1)
    w = g.gguf_weight(raw, qtype, (64, k))
    x = torch.randn(5, k)
    y = g.gguf_matmul(x, w, activations="q8")
    yf = g.gguf_matmul(x, w)
    dense = ref.dequantize(raw, qtype, 64, k).double()
    scale = (x.double().abs() @ dense.abs().T).max()
    assert ((y.double() - yf.double()).abs().max() / scale).item() <= Q8_RTOL


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: NAMES[q])
def test_a_row_gets_the_same_bits_alone_or_in_any_batch(qtype):
    k = SHAPES[qtype][1]
    w = weight(qtype, 45, k, seed=3)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(17, k, generator=gen)
    alone = [g.gguf_matmul(x[i:i + 1], w, activations="q8")[0] for i in range(17)]
    for m in (2, 5, 8, 9, 17):
        y = g.gguf_matmul(x[:m], w, activations="q8")
        for i in range(m):
            assert torch.equal(bits(y[i]), bits(alone[i])), (m, i)
    perm = torch.randperm(17, generator=gen)
    y = g.gguf_matmul(x[perm], w, activations="q8")
    for j, i in enumerate(perm.tolist()):
        assert torch.equal(bits(y[j]), bits(alone[i]))


def test_thread_count_does_not_change_bits():
    w = weight(Q4_K, 301, 512, seed=9)
    x = torch.randn(6, 512)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = g.gguf_matmul(x, w, activations="q8")
        torch.set_num_threads(max(2, threads))
        many = g.gguf_matmul(x, w, activations="q8")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(bits(one), bits(many))


def test_16_bit_activations_and_leading_dims():
    w = weight(Q6_K, 40, 512, seed=4)
    x = torch.randn(2, 3, 512)
    y = g.gguf_matmul(x, w, activations="q8")
    assert y.shape == (2, 3, 40) and torch.equal(y, g.gguf_matmul(x.reshape(6, 512), w, activations="q8").reshape(2, 3, 40))
    for dtype in (torch.bfloat16, torch.float16):
        yd = g.gguf_matmul(x.to(dtype), w, activations="q8")
        assert yd.dtype == dtype
        assert torch.equal(yd, g.gguf_matmul(x.to(dtype).float(), w, activations="q8").to(dtype))
    assert g.gguf_matmul(torch.randn(0, 512), w, activations="q8").shape == (0, 40)


_TIER_CODE = ("import sys, torch; from specdec_cuda.ops import gguf as g; "
              "assert g.q8_cpu_isa() == ISA, g.q8_cpu_isa(); "
              "cases = torch.load(sys.argv[1]); "
              "out = [(g.quantize_q8(x), [g.gguf_matmul(x[:m], g.gguf_weight(raw, q, (n, k)), activations='q8') "
              "for m in (1, 3, 8, 9)]) for q, raw, n, k, x in cases]; "
              "torch.save(out, sys.argv[1])")


def _run_tier(cap: str, isa: str, cases) -> list:
    return run_capped(cap, f"ISA = {isa!r}; " + _TIER_CODE, cases, timeout=300, env=dict(OMP_NUM_THREADS="1"))


_TIERS = ("portable", "avx2", "avx512", "avx512-vnni")  # narrowest first


@pytest.mark.parametrize("cap", ["baseline", "avx2", "avx512-novnni"])
def test_narrower_cpu_tiers_give_the_same_bits(cap):
    # The portable loop (written straight from q8.h's order), the AVX2 kernel, the AVX-512 one (two
    # rows of W per zmm) and the same with VNNI: each narrower tier against this CPU's widest.
    wide = g.q8_cpu_isa()
    capped = {"baseline": "portable", "avx2": "avx2", "avx512-novnni": "avx512"}[cap]
    isa = min(capped, wide, key=_TIERS.index)
    if isa == wide:
        pytest.skip(f"this CPU's widest Q8 tier is already {wide}")
    cases = []
    for qtype in FORMATS:
        k = SHAPES[qtype][1] if qtype in (Q4_K, Q6_K) else 224
        cases.append((qtype, random_blocks(qtype, 41, k, seed=qtype + 20), 41, k, torch.randn(9, k)))
    here = [(g.quantize_q8(x), [g.gguf_matmul(x[:m], g.gguf_weight(raw, q, (n, k)), activations="q8")
                                for m in (1, 3, 8, 9)]) for q, raw, n, k, x in cases]
    theirs = _run_tier(cap, isa, cases)
    for (q, *_), (xa, ya), (xb, yb) in zip(cases, here, theirs):
        assert torch.equal(xa, xb), NAMES[q]
        for a, b in zip(ya, yb):
            assert torch.equal(bits(a), bits(b)), NAMES[q]


def test_direct_row_ranges_match_the_full_call():
    # The op splits rows of W over threads; any split gives the same bits (each output's order
    # depends on K only): check odd splits through a 1-thread call on row slices of W.
    k, n = 512, 53
    raw = random_blocks(Q4_K, n, k, seed=5)
    x = torch.randn(4, k)
    full = g.gguf_matmul(x, g.gguf_weight(raw, Q4_K, (n, k)), activations="q8")
    rb = raw.shape[1]
    for lo, hi in ((0, 1), (1, 8), (8, 9), (9, 53)):
        part = g.gguf_matmul(x, g.gguf_weight(raw[lo:hi].clone(), Q4_K, (hi - lo, k)), activations="q8")
        assert torch.equal(bits(part), bits(full[:, lo:hi]))
    assert rb == k // 256 * 144


# ---- registration, compile, errors --------------------------------------------------------------


def test_opcheck_and_compile():
    n, k = 16, 256
    w = weight(Q4_K, n, k)
    torch.library.opcheck(torch.ops.specdec.gguf_matmul_q8.default, (torch.randn(3, k), w.data, w.qtype, torch.empty(3, n)))
    torch.library.opcheck(torch.ops.specdec.gguf_quantize_q8.default,
                          (torch.randn(3, k), torch.empty(3, g.q8_row_bytes(k), dtype=torch.uint8)))
    f = torch.compile(lambda x: g.gguf_matmul(x, w, activations="q8") * 2, fullgraph=True)
    x = torch.randn(2, k)
    assert torch.equal(f(x), g.gguf_matmul(x, w, activations="q8") * 2)


def test_bad_inputs_are_named():
    n, k = 8, 256
    raw = random_blocks(Q4_K, n, k)
    w = g.gguf_weight(raw, Q4_K, (n, k))
    with pytest.raises(ValueError, match="activations must be one of"):
        g.gguf_matmul(torch.randn(2, k), w, activations="int8")
    with pytest.raises(TypeError, match="float32"):
        g.gguf_matmul(torch.ones(2, k, dtype=torch.int32), w, activations="q8")
    with pytest.raises(ValueError, match="multiple of 32"):
        g.quantize_q8(torch.randn(2, 48))
    op = torch.ops.specdec.gguf_matmul_q8
    with pytest.raises(RuntimeError, match="GGML type id"):
        op(torch.randn(2, k), raw, 2, torch.empty(2, n))
    with pytest.raises(RuntimeError, match=r"Q4_K's 256-weight block"):
        op(torch.randn(2, 288), raw, 12, torch.empty(2, n))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        op(torch.randn(2, 250), raw, 12, torch.empty(2, n))
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        op(torch.randn(2, k, dtype=torch.float64), raw, 12, torch.empty(2, n, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="out must be"):
        op(torch.randn(2, k), raw, 12, torch.empty(2, n, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"Q4_K weight \[9, 256\]"):
        op(torch.randn(2, k), raw, 12, torch.empty(2, n + 1))
    with pytest.raises(RuntimeError, match="uint8"):
        op(torch.randn(2, k), raw.to(torch.int16), 12, torch.empty(2, n))
    with pytest.raises(RuntimeError, match="out must be a contiguous uint8"):
        torch.ops.specdec.gguf_quantize_q8(torch.randn(2, k), torch.empty(2, 10, dtype=torch.uint8))
