"""``skinny_linear`` (float32 linear for a few rows, CPU) against its reference ``F.linear``, and its
batch invariance: a row's output does not depend on the other rows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from specdec_cuda.ops.skinny_linear import MAX_ROWS, linear, skinny_linear
from specdec_cuda.reference import skinny_linear as ref


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
    python_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
    env = dict(os.environ, SPECDEC_CPU_ISA="baseline",
               PYTHONPATH=os.pathsep.join([python_dir, os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
