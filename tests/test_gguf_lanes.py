"""Q4_K_LANES / Q6_K_LANES: a Q4_K / Q6_K weight repacked once for the CPU's int8 kernel
(``gguf_repack_lanes``). The permutation against reference/gguf.py's ``to_lanes`` and its documented
formula, and every op on a repacked weight against the same op on the weight it came from, bit for
bit: both activation modes, every row count the tiles take (odd N: the VNNI tier's last row on its
own), the narrower CPU tiers, CUDA's dequantisation and matmul where a GPU is present."""

from __future__ import annotations

import pytest
import torch

from _gguf_testlib import random_blocks
from _isolated import run_capped
from specdec_cuda.ops import gguf as g
from specdec_cuda.reference import gguf as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


KQUANTS = [ref.Q4_K, ref.Q6_K]
NAMES = {ref.Q4_K: "Q4_K", ref.Q6_K: "Q6_K"}


def blocks(qtype: int, n: int, k: int, seed: int = 0) -> g.GgufWeight:
    return g.gguf_weight(torch.from_numpy(random_blocks(qtype, n, k, seed)), qtype, (n, k))


def q4_k(n: int, k: int, seed: int = 0) -> g.GgufWeight:
    return blocks(ref.Q4_K, n, k, seed)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def test_repack_is_the_reference_permutation_and_round_trips():
    w = q4_k(9, 768, seed=1)
    lanes = g.gguf_repack_lanes(w)
    assert lanes.qtype == ref.Q4_K_LANES == 268 and lanes.data.shape == w.data.shape
    assert (lanes.out_features, lanes.in_features) == (9, 768)
    assert torch.equal(lanes.data, ref.to_lanes(w.data))
    assert torch.equal(ref.from_lanes(lanes.data), w.data)
    assert not torch.equal(lanes.data, w.data)
    blocks, orig = lanes.data.reshape(-1, 144), w.data.reshape(-1, 144)
    assert torch.equal(blocks[:, :16], orig[:, :16])  # d, dmin, scales stay
    # blocks.h: byte 16 + 32c + 4j + b = code 8c + b of sub-block j | code 8c + 4 + b << 4, where
    # the file keeps code l of sub-block j in qs[32 (j // 2) + l], nibble j % 2
    qs, lq = orig[:, 16:].long(), blocks[:, 16:].long()

    def code(blk, j, l):
        return (qs[blk, 32 * (j // 2) + l] >> (4 * (j % 2))) & 15

    for blk in (0, 5, blocks.shape[0] - 1):
        for c in range(4):
            for j in range(8):
                for b in range(4):
                    byte = int(lq[blk, 32 * c + 4 * j + b])
                    assert byte & 15 == int(code(blk, j, 8 * c + b))
                    assert byte >> 4 == int(code(blk, j, 8 * c + 4 + b))


def test_q6_k_repack_is_the_reference_permutation_and_round_trips():
    w = blocks(ref.Q6_K, 9, 768, seed=1)
    lanes = g.gguf_repack_lanes(w)
    assert lanes.qtype == ref.Q6_K_LANES == 270 and lanes.data.shape == w.data.shape
    assert torch.equal(lanes.data, ref.to_lanes(w.data, ref.Q6_K))
    assert torch.equal(ref.from_lanes(lanes.data, ref.Q6_K), w.data)
    assert not torch.equal(lanes.data, w.data)
    assert torch.equal(lanes.data.reshape(-1, 210)[:, 192:], w.data.reshape(-1, 210)[:, 192:])  # scales, d
    # blocks.h: the place of code 32i + l of half h holds code 4 (4h + i) + l % 4 of group l // 4,
    # a place's code being (ql nibble | qh bits << 4) as the file stores them
    def codes(data):
        b = data.reshape(-1, 210).long()
        out = torch.empty(b.shape[0], 2, 4, 32, dtype=torch.long)
        for h in range(2):
            for i in range(4):
                low = (b[:, 64 * h + 32 * (i & 1): 64 * h + 32 * (i & 1) + 32] >> (4 * (i >> 1))) & 15
                out[:, h, i] = low | ((b[:, 128 + 32 * h: 160 + 32 * h] >> (2 * i)) & 3) << 4
        return out

    file, lane = codes(w.data), codes(lanes.data)
    for g_ in range(8):
        for k in range(32):
            assert torch.equal(lane[:, k >> 4, (k >> 2) & 3, 4 * g_ + (k & 3)], file[:, g_ >> 2, g_ & 3, k])


def test_other_formats_and_bad_inputs():
    q8 = g.gguf_weight(torch.from_numpy(random_blocks(ref.Q8_0, 4, 256)), "Q8_0", (4, 256))
    assert g.gguf_repack_lanes(q8) is q8
    with pytest.raises(TypeError, match="GgufWeight"):
        g.gguf_repack_lanes(torch.zeros(4, 144, dtype=torch.uint8))
    w = q4_k(4, 256)
    with pytest.raises(RuntimeError, match="shaped like weight"):
        torch.ops.specdec.gguf_repack_lanes(w.data, 12, 256, torch.empty(4, 100, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="shaped like weight"):
        torch.ops.specdec.gguf_repack_lanes(w.data, 12, 256, w.data)  # not in place
    with pytest.raises(RuntimeError, match="Q4_K"):
        torch.ops.specdec.gguf_repack_lanes(w.data, 12, 512, torch.empty_like(w.data))  # K does not fit the bytes
    with pytest.raises(RuntimeError, match="Q4_K .12. or Q6_K .14."):
        torch.ops.specdec.gguf_repack_lanes(q8.data, 8, 256, torch.empty_like(q8.data))


@pytest.mark.parametrize("qtype", KQUANTS, ids=NAMES.get)
@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_dequantize_and_matmuls_keep_the_file_formats_bits(qtype, n):
    k = 1536
    w = blocks(qtype, n, k, seed=n)
    lanes = g.gguf_repack_lanes(w)
    assert lanes.qtype == ref.LANES[qtype]
    assert torch.equal(g.gguf_dequantize(lanes), g.gguf_dequantize(w))
    assert torch.equal(g.gguf_dequantize(lanes, torch.bfloat16), g.gguf_dequantize(w, torch.bfloat16))
    assert torch.equal(g.gguf_rows(lanes, torch.tensor([0, n - 1])), g.gguf_rows(w, torch.tensor([0, n - 1])))
    x = torch.randn(9, k)
    for m in (1, 2, 3, 5, 8, 9):  # the tiles' heights, and 9 = a tile of 8 and one of 1
        y = g.gguf_matmul(x[:m], lanes, activations="q8")
        assert torch.equal(bits(y), bits(g.gguf_matmul(x[:m], w, activations="q8"))), m
        assert torch.equal(bits(y), bits(ref.matmul_q8(x[:m], lanes.data, lanes.qtype, n))), m
        assert torch.equal(bits(g.gguf_matmul(x[:m], lanes)), bits(g.gguf_matmul(x[:m], w))), m


def test_linear_parts_and_threads_keep_the_bits():
    # A fused projection of repacked parts beside a file-order one, split over threads in any chunks.
    k = 512
    q6, q8 = blocks(ref.Q6_K, 33, k, 3), blocks(ref.Q8_0, 8, k, 4)
    w = q4_k(97, k, seed=2)
    plain = g.GgufLinear.of(w, q6, q8, activations="q8")
    lanes = g.GgufLinear.of(g.gguf_repack_lanes(w), g.gguf_repack_lanes(q6), q8, activations="q8")
    x = torch.randn(6, k)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            assert torch.equal(bits(g.gguf_linear(x, lanes)), bits(g.gguf_linear(x, plain)))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("cap", ["baseline", "avx2", "avx512-novnni"])
def test_narrower_cpu_tiers_read_a_repacked_weight(cap):
    # Weights repacked on a VNNI CPU and multiplied under a narrower SPECDEC_CPU_ISA (the portable
    # loop reads the lane order there): the bits of this process's own kernels.
    x = torch.randn(9, 512)
    cases = [g.gguf_repack_lanes(blocks(q, 41, 512, seed=5)) for q in KQUANTS]
    here = [[g.gguf_matmul(x[:m], w, activations="q8") for m in (1, 3, 9)] for w in cases]
    code = ("import sys, torch; from specdec_cuda.ops import gguf as g; "
            "cases, x = torch.load(sys.argv[1]); "
            "torch.save([[g.gguf_matmul(x[:m], g.GgufWeight(d, q, 41, 512), activations='q8') for m in (1, 3, 9)] "
            "for d, q in cases], sys.argv[1])")
    theirs = run_capped(cap, code, ([(w.data, w.qtype) for w in cases], x), timeout=300,
                        env=dict(OMP_NUM_THREADS="1"))
    for a_list, b_list in zip(here, theirs):
        for a, b in zip(a_list, b_list):
            assert torch.equal(bits(a), bits(b))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("qtype", KQUANTS, ids=NAMES.get)
def test_cuda_reads_a_repacked_weight(qtype):
    w = blocks(qtype, 40, 512, seed=6)
    lanes = g.gguf_repack_lanes(w)
    on_gpu = g.GgufWeight(lanes.data.cuda(), lanes.qtype, 40, 512)
    assert torch.equal(g.gguf_dequantize(on_gpu).cpu(), g.gguf_dequantize(w))
    x = torch.randn(3, 512)
    plain = g.GgufWeight(w.data.cuda(), w.qtype, 40, 512)
    assert torch.equal(g.gguf_matmul(x.cuda(), on_gpu).cpu(), g.gguf_matmul(x.cuda(), plain).cpu())
