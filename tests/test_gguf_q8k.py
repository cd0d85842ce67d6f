"""The GGUF prefill kernel of CPUs without AMX (``gguf_linear(..., activations="q8k")``,
csrc/kernels/gguf/q8k.h); the model's use of it is tested with the AMX tiles' in test_gguf_tiles.py.

Checked: the bits equal ``reference.gguf.matmul_q8k`` for Q4_K, Q6_K and their lane-order layouts,
and for the legacy formats (Q8_0, Q5_0, Q4_1: their own order over x's Q8 form), at row counts
around the kernels' tiles (4 rows of x, 16 of W), on the VNNI tiers and the portable ones alike;
legacy parts in the same call as k-quant ones; the error is Q8's order of magnitude. (That a
row's bits do not depend on the other rows, the parts or the thread count is test_gguf_tiles.py's.)
"""

from __future__ import annotations

import pytest
import torch

from _gguf_testlib import random_blocks
from _isolated import run_capped
from specdec_cuda.ops import gguf as g
from specdec_cuda.reference import gguf as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

gguf = pytest.importorskip("gguf")
Q4_K, Q6_K, Q5_0, Q8_0, Q4_1 = 12, 14, 6, 8, 3
LEGACY = {"Q8_0": Q8_0, "Q5_0": Q5_0, "Q4_1": Q4_1}


def weight(qtype: int, n: int, k: int, seed: int, lanes: bool = False) -> tuple[g.GgufWeight, torch.Tensor]:
    raw = torch.from_numpy(random_blocks(qtype, n, k, seed=seed))
    w = g.gguf_weight(raw, qtype, (n, k))
    if lanes:
        w = g.GgufWeight(ref.to_lanes(w.data, qtype), ref.LANES[qtype], n, k)
    return w, raw


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("lanes", [False, True], ids=["file", "lanes"])
@pytest.mark.parametrize("qtype", [Q4_K, Q6_K], ids=["Q4_K", "Q6_K"])
def test_matmul_equals_reference_bit_for_bit(qtype, lanes):
    gen = torch.Generator().manual_seed(qtype)
    for k, n in ((256, 37), (512, 16), (1536, 19)):
        w, raw = weight(qtype, n, k, seed=k, lanes=lanes)
        lin = g.GgufLinear.of(w)
        for m in (1, 3, 4, 5, 9, 33):
            x = torch.randn(m, k, generator=gen) * torch.linspace(0.1, 3.0, k)  # unequal super-block scales
            y = g.gguf_linear(x, lin, activations="q8k")
            assert torch.equal(bits(y), bits(ref.matmul_q8k(x, raw, qtype, n))), (k, n, m)


@pytest.mark.parametrize("qtype", list(LEGACY.values()), ids=list(LEGACY))
def test_legacy_matmul_equals_reference_bit_for_bit(qtype):
    # K = 896: the 0.5B's rows, not whole super-blocks; 288: one group past an octet
    gen = torch.Generator().manual_seed(qtype)
    for k, n in ((32, 5), (288, 16), (896, 37)):
        w, raw = weight(qtype, n, k, seed=k)
        lin = g.GgufLinear.of(w)
        for m in (1, 3, 4, 5, 9):
            x = torch.randn(m, k, generator=gen) * torch.linspace(0.1, 3.0, k)  # unequal group scales
            y = g.gguf_linear(x, lin, activations="q8k")
            assert torch.equal(bits(y), bits(ref.matmul_q8k(x, raw, qtype, n))), (k, n, m)


def test_the_portable_tier_gives_the_same_bits():
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(2))
    raws = {qtype: weight(qtype, 21, 512, seed=3)[1] for qtype in (Q4_K, Q6_K, Q8_0, Q5_0, Q4_1)}
    code = ("import sys, torch; from specdec_cuda.ops import gguf as g\n"
            "io = torch.load(sys.argv[1])\n"
            "io['y'] = {q: g.gguf_linear(io['x'], g.GgufLinear.of(g.gguf_weight(raw, q, (21, 512))), activations='q8k')\n"
            "           for q, raw in io['raws'].items()}\n"
            "torch.save(io, sys.argv[1])\n")
    out = run_capped("avx2", code, payload={"x": x, "raws": raws})
    for qtype, raw in raws.items():
        assert torch.equal(bits(out["y"][qtype]), bits(ref.matmul_q8k(x, raw, qtype, 21))), qtype


def test_legacy_and_kquant_parts_in_the_same_call():
    # (Rows, parts and threads: test_gguf_tiles.py's test_rows_parts_and_threads_do_not_change_the_bits.)
    k = 512
    q, raw_q = weight(Q4_K, 40, k, seed=1, lanes=True)
    legacy, raw_l = weight(Q5_0, 8, k, seed=3)
    bias = torch.randn(48)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(3))
    y = g.gguf_linear(x, g.GgufLinear.of(q, legacy), bias, activations="q8k")
    assert torch.equal(bits(y[:, 40:]), bits(ref.matmul_q8k(x, raw_l, Q5_0, 8) + bias[40:]))  # the bias added last
    assert torch.equal(bits(y[:, :40]), bits(ref.matmul_q8k(x, raw_q, Q4_K, 40) + bias[:40]))


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K, Q5_0], ids=["Q4_K", "Q6_K", "Q5_0"])
def test_error_is_q8s_order_of_magnitude(qtype):
    w, raw = weight(qtype, 64, 1536, seed=4)
    x = torch.randn(7, 1536)
    dense = ref.dequantize(raw, qtype, 64, 1536).double()
    exact = x.double() @ dense.T
    scale = (x.double().abs() @ dense.abs().T).max()
    err_q8k = ((g.gguf_linear(x, g.GgufLinear.of(w), activations="q8k").double() - exact).abs().max() / scale).item()
    err_q8 = ((g.gguf_linear(x, g.GgufLinear.of(w), activations="q8").double() - exact).abs().max() / scale).item()
    assert err_q8k < 1e-2 and err_q8k < 4 * err_q8, (err_q8k, err_q8)
