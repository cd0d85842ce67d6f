"""GGUF blocks read natively: gguf_dequantize / gguf_matmul against gguf-py and reference/gguf.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

gguf = pytest.importorskip("gguf")

from _gguf_testlib import HALF_FIELDS, random_blocks  # noqa: E402
from _isolated import run_capped  # noqa: E402
from specdec_cuda.ops import gguf as g  # noqa: E402
from specdec_cuda.reference import gguf as ref  # noqa: E402

Q = gguf.GGMLQuantizationType
FORMATS = [Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K]
# K of the odd shapes: not a power of two, a few blocks (k-quants: 256 per block, others 32).
ODD_K = {Q.Q4_1: 224, Q.Q5_0: 224, Q.Q8_0: 224, Q.Q4_K: 768, Q.Q6_K: 768}

# gguf_matmul accumulates in float32: max |y - x·Wᵀ| <= MATMUL_RTOL * max(|x|·|W|ᵀ) for K up to a
# few thousand (measured ~2e-8 at K = 512..1536); bf16 / fp16 outputs add one rounding.
MATMUL_RTOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def quantized_blocks(qtype, n: int, k: int, seed: int = 0) -> np.ndarray:
    """gguf-py's own quantisation of a random weight where it has one (legacy formats), else random blocks."""
    if qtype in (Q.Q4_K, Q.Q6_K):  # gguf-py dequantizes these but does not quantize them
        return random_blocks(qtype, n, k, seed)
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.02
    return gguf.quants.quantize(w, qtype)


def weight(raw: np.ndarray, qtype, n: int, k: int) -> g.GgufWeight:
    return g.gguf_weight(torch.from_numpy(np.ascontiguousarray(raw)), qtype, (n, k))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def matmul_err(y: torch.Tensor, x: torch.Tensor, raw: np.ndarray, qtype, n: int) -> float:
    w = torch.from_numpy(gguf.quants.dequantize(raw, qtype)).double()
    exact = x.double() @ w.T
    return ((y.double() - exact).abs().max() / (x.double().abs() @ w.abs().T).max()).item()


# ---- dequantisation -----------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("source", ["quantized", "random"])
def test_dequantize_equals_gguf_bit_for_bit(qtype, source):
    n, k = 111, ODD_K[qtype]
    raw = (quantized_blocks if source == "quantized" else random_blocks)(qtype, n, k, seed=int(qtype))
    expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    w = weight(raw, qtype, n, k)
    out = g.gguf_dequantize(w)
    assert out.shape == (n, k) and out.dtype == torch.float32
    assert torch.equal(bits(out), bits(expected))
    assert torch.equal(bits(ref.dequantize(w.data, int(qtype), n, k)), bits(expected))
    # bfloat16: the float32 value rounded once (as torch rounds it)
    assert torch.equal(g.gguf_dequantize(w, torch.bfloat16).view(torch.int16), expected.bfloat16().view(torch.int16))


def test_dequantize_edge_values():
    # Zero, subnormal and largest fp16 scales; all-zero and all-one code bytes.
    n, k = 4, 256
    for qtype in FORMATS:
        raw = random_blocks(qtype, n, k, seed=7)
        blocks = raw.reshape(n, k // gguf.GGML_QUANT_SIZES[qtype][0], -1)
        for row, (value, fill) in enumerate([(0.0, 0x00), (6e-8, 0xFF), (65504.0, 0x55), (-1.5e-5, 0xAA)]):
            blocks[row, :, :] = fill
            for off, _, _ in HALF_FIELDS[qtype]:
                blocks[row, :, off:off + 2] = np.array([value], np.float16).view(np.uint8)
        expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
        assert torch.equal(bits(g.gguf_dequantize(weight(raw, qtype, n, k))), bits(expected)), qtype.name


# ---- matmul -------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16, 33])
def test_matmul_matches_reference(qtype, m):
    n, k = 111, ODD_K[qtype]
    raw = random_blocks(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = g.gguf_matmul(x, weight(raw, qtype, n, k))
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert matmul_err(y, x, raw, qtype, n) <= MATMUL_RTOL[torch.float32]
    # reference/gguf.py's matmul is the same product
    exact = ref.matmul(x, torch.from_numpy(raw), int(qtype), n)
    assert ((y.double() - exact).abs().max() / exact.abs().max()).item() < 1e-4


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_16_bit_activations(qtype, dtype):
    n, k = 37, ODD_K[qtype]
    raw = quantized_blocks(qtype, n, k, seed=3)
    x = torch.randn(5, k).to(dtype)
    w = weight(raw, qtype, n, k)
    y = g.gguf_matmul(x, w)
    assert y.dtype == dtype
    # x widens exactly; the float32 result is rounded once
    assert torch.equal(y, g.gguf_matmul(x.float(), w).to(dtype))
    assert matmul_err(y, x.float(), raw, qtype, n) <= MATMUL_RTOL[dtype]


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_a_row_gets_the_same_bits_alone_or_in_any_batch(qtype):
    # Greedy verification is exact only if a token's logits do not depend on the batch around it.
    n, k = 111, ODD_K[qtype]
    w = weight(random_blocks(qtype, n, k, seed=5), qtype, n, k)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(9, k, generator=gen)
    alone = [g.gguf_matmul(x[i:i + 1], w)[0] for i in range(9)]
    for m in range(1, 10):
        y = g.gguf_matmul(x[:m], w)
        for i in range(m):
            assert torch.equal(bits(y[i]), bits(alone[i])), (m, i)
    for _ in range(3):
        perm = torch.randperm(9, generator=gen)
        y = g.gguf_matmul(x[perm], w)
        for j, i in enumerate(perm.tolist()):
            assert torch.equal(bits(y[j]), bits(alone[i]))


def test_thread_count_does_not_change_bits():
    n, k = 301, 512
    w = weight(random_blocks(Q.Q4_K, n, k, seed=9), Q.Q4_K, n, k)
    x = torch.randn(3, k)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = g.gguf_matmul(x, w)
        torch.set_num_threads(max(2, threads))
        many = g.gguf_matmul(x, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(bits(one), bits(many))


def test_leading_dims_empty_and_real_sizes():
    n, k = 64, 1536  # a real hidden size: 6 Q4_K blocks per row
    raw = random_blocks(Q.Q4_K, n, k, seed=11)
    w = weight(raw, Q.Q4_K, n, k)
    x = torch.randn(2, 3, k)
    y = g.gguf_matmul(x, w)
    assert y.shape == (2, 3, n) and torch.equal(y, g.gguf_matmul(x.reshape(6, k), w).reshape(2, 3, n))
    assert matmul_err(y.reshape(6, n), x.reshape(6, k), raw, Q.Q4_K, n) <= MATMUL_RTOL[torch.float32]
    assert g.gguf_matmul(torch.randn(0, k), w).shape == (0, n)


@pytest.mark.parametrize("cap", ["baseline", "avx2"])
def test_narrower_cpu_tiers_give_the_same_bits(cap):
    # The portable loop, the AVX2 kernel and the AVX-512 one run the same per-output operations.
    # SPECDEC_CPU_ISA picks a narrower tier (read once at load: a fresh process). N = 111 is odd, so
    # on an AVX-512 machine this process runs row pairs plus the AVX2 tail for the last row.
    isa = "avx2" if cap == "avx2" and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "portable"
    cases = []
    for qtype in FORMATS:
        n, k = 111, ODD_K[qtype]
        raw = random_blocks(qtype, n, k, seed=int(qtype) + 20)
        cases.append((int(qtype), torch.from_numpy(raw), n, k, torch.randn(6, k)))
    here = [[g.gguf_matmul(x[:m], g.gguf_weight(raw, q, (n, k))) for m in (1, 2, 3, 4, 6)] for q, raw, n, k, x in cases]
    code = ("import sys, torch; from specdec_cuda.ops import gguf as g; "
            f"assert g.cpu_isa() == {isa!r}, g.cpu_isa(); "
            "cases = torch.load(sys.argv[1]); "
            "out = [[g.gguf_matmul(x[:m], g.gguf_weight(raw, q, (n, k))) for m in (1, 2, 3, 4, 6)] "
            "for q, raw, n, k, x in cases]; "
            "torch.save(out, sys.argv[1])")
    theirs = run_capped(cap, code, cases, timeout=300)
    for (q, *_), a_list, b_list in zip(cases, here, theirs):
        for a, b in zip(a_list, b_list):
            assert torch.equal(bits(a), bits(b)), Q(q).name


# ---- registration, compile, errors --------------------------------------------------------------


def test_opcheck_and_compile():
    n, k = 16, 256
    w = weight(random_blocks(Q.Q4_K, n, k), Q.Q4_K, n, k)
    torch.library.opcheck(torch.ops.specdec.gguf_matmul.default, (torch.randn(3, k), w.data, w.qtype, torch.empty(3, n)))
    torch.library.opcheck(torch.ops.specdec.gguf_dequantize.default, (w.data, w.qtype, torch.empty(n, k)))
    f = torch.compile(lambda x: g.gguf_matmul(x, w) * 2, fullgraph=True)
    x = torch.randn(2, k)
    assert torch.equal(f(x), g.gguf_matmul(x, w) * 2)


def test_bad_inputs_are_named():
    n, k = 8, 256
    raw = torch.from_numpy(random_blocks(Q.Q4_K, n, k))
    w = g.gguf_weight(raw, "Q4_K", (n, k))
    with pytest.raises(ValueError, match="supported"):
        g.gguf_weight(raw, 2, (n, k))  # Q4_0: not one of the five
    with pytest.raises(ValueError, match="multiple of 256"):
        g.gguf_weight(raw, Q.Q4_K, (n * 2, 128))
    with pytest.raises(ValueError, match="bytes"):
        g.gguf_weight(raw, Q.Q4_K, (n + 1, k))
    with pytest.raises(TypeError, match="uint8"):
        g.gguf_weight(raw.to(torch.int16), Q.Q4_K, (n, k))
    with pytest.raises(ValueError, match=r"\[\.\.\., 256\]"):
        g.gguf_matmul(torch.randn(2, 255), w)
    with pytest.raises(TypeError, match="float32"):
        g.gguf_matmul(torch.ones(2, k, dtype=torch.int32), w)
    op = torch.ops.specdec.gguf_matmul
    with pytest.raises(RuntimeError, match="GGML type id"):
        op(torch.randn(2, k), raw, 2, torch.empty(2, n))
    with pytest.raises(RuntimeError, match=r"Q4_K's 256-weight block.*\[8, 320\]"):
        op(torch.randn(2, 320), raw, 12, torch.empty(2, n))
    with pytest.raises(RuntimeError, match=r"Q4_K weight \[9, 256\]"):
        op(torch.randn(2, k), raw, 12, torch.empty(2, n + 1))
    with pytest.raises(RuntimeError, match="out must be"):
        op(torch.randn(2, k), raw, 12, torch.empty(2, n, dtype=torch.float64))
    odd = torch.empty(raw.numel() + 1, dtype=torch.uint8)[1:]
    odd.copy_(raw.reshape(-1))
    with pytest.raises(RuntimeError, match="even address"):
        op(torch.randn(2, k), odd, 12, torch.empty(2, n))
    assert torch.equal(g.gguf_weight(odd, Q.Q4_K, (n, k)).data, raw)  # the Python API realigns it
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.specdec.gguf_dequantize(raw, 12, torch.empty(n, k, dtype=torch.float64))


# ---- CUDA against the CPU -----------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_cuda_dequantize_equals_gguf(qtype):
    n, k = 111, ODD_K[qtype]
    raw = random_blocks(qtype, n, k, seed=int(qtype))
    expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    w = weight(raw, qtype, n, k)
    wc = w._replace(data=w.data.cuda())
    assert torch.equal(bits(g.gguf_dequantize(wc).cpu()), bits(expected))
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(g.gguf_dequantize(wc, dtype).cpu(), expected.to(dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_matmul_matches_cpu(qtype, dtype):
    n, k = 111, ODD_K[qtype]
    raw = random_blocks(qtype, n, k, seed=int(qtype) + 1)
    w = weight(raw, qtype, n, k)
    wc = w._replace(data=w.data.cuda())
    for m in (1, 5, 9, 16, 64):  # 64: the dense (cuBLAS) path
        x = torch.randn(m, k).to(dtype)
        y = g.gguf_matmul(x.cuda(), wc).cpu()
        assert y.dtype == dtype
        assert matmul_err(y, x.float(), raw, qtype, n) <= MATMUL_RTOL[dtype], m
        if m < 64:
            cpu = g.gguf_matmul(x.float(), w)
            assert ((y.float() - cpu).abs().max() / cpu.abs().max()).item() <= 2 * MATMUL_RTOL[dtype]


@pytest.mark.cuda
def test_cuda_row_independence():
    n, k = 111, 768
    w = weight(random_blocks(Q.Q4_K, n, k, seed=3), Q.Q4_K, n, k)
    wc = w._replace(data=w.data.cuda())
    x = torch.randn(9, k, device="cuda")
    alone = [g.gguf_matmul(x[i:i + 1], wc)[0] for i in range(9)]
    for m in range(1, 10):
        y = g.gguf_matmul(x[:m], wc)
        for i in range(m):
            assert torch.equal(y[i], alone[i]), (m, i)
