"""CUDA kernels of sample / verify_chain equal the CPU kernels (and so the reference).

Skipped without a GPU. Integer outputs must match exactly (both devices draw the same Philox
numbers; float rounding differs only in the last bits, which flips nothing at these fixed seeds).
"""

from __future__ import annotations

import pytest
import torch

import specdec_cuda.ops as ops
from specdec_cuda.reference import sampling as ref
from sampling_cases import llm_like_logits, make_chain_batch

pytestmark = [pytest.mark.kernels, pytest.mark.cuda]  # skipped without a GPU or CUDA kernels (tests/conftest.py)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def to_cuda(case):
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def assert_same(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x.cpu(), y.cpu()), (x, y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [111, 32000, 128256])
@pytest.mark.parametrize("with_draft_logits", [True, False])
def test_verify_cuda_equals_cpu(dtype, vocab, with_draft_logits):
    case = make_chain_batch(9, 6, vocab, seed=vocab + 1, dtype=dtype, ragged=True, flagged=True,
                            with_draft_logits=with_draft_logits)
    cpu = ops.verify_chain(**case, strategy="serial")
    for strategy in ("parallel", "serial", "auto"):
        assert_same(ops.verify_chain(**to_cuda(case), strategy=strategy), cpu)


@pytest.mark.parametrize("batch,k", [(1, 1), (7, 16), (64, 8)])
def test_verify_cuda_equals_reference(batch, k):
    case = make_chain_batch(batch, k, 111, seed=batch * k, ragged=batch > 1)
    out = ops.verify_chain(**to_cuda(case))
    expected = ref.verify_chain(case["draft_tokens"], case["cu_num_draft"], case["target_logits"],
                                case["draft_logits"], case["temperature"], case["top_k"],
                                case["top_p"], case["seed"], case["position"])
    assert_same(out, expected)


def test_verify_cuda_typical_and_greedy():
    case = make_chain_batch(16, 5, 1000, seed=3, typical=True, ragged=True)
    assert_same(ops.verify_chain(**to_cuda(case)), ops.verify_chain(**case))
    case = make_chain_batch(16, 5, 1000, seed=4, greedy_fraction=1.0)
    assert_same(ops.verify_chain(**to_cuda(case)), ops.verify_chain(**case))


def test_verify_cuda_bad_layout_flags_rows_without_sync():
    # on CUDA the offsets are not read on the host: an overlong row is flagged, not read
    target = torch.randn(5, 50, device="cuda")
    out = ops.verify_chain(torch.tensor([1, 2, 3], device="cuda"),
                           torch.tensor([0, 3, 3], device="cuda"), target, max_draft=2)
    assert out.status.tolist() == [ops.STATUS_DRAFT_OUT_OF_RANGE, 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [111, 50000, 128256])
def test_sample_cuda_equals_cpu(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    rows = 12
    logits = llm_like_logits(rows, vocab, g).to(dtype)
    logits[5, 3] = float("nan")
    temperature = torch.rand(rows, generator=g) + 0.2
    temperature[0] = 0.0
    temperature[6] = -1.0
    top_k = torch.tensor([0, 5, 0, 0, 40, 0, 3, 0, 1, 0, 0, 7], dtype=torch.int32)
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 0.7, 1.0, 1.0, 0.95, 1.0, 0.3, 1.0, 0.8])
    seed = torch.randint(0, 2**62, (rows,), generator=g)
    position = torch.randint(0, 2**40, (rows,), generator=g)
    cpu = ops.sample(logits, temperature, top_k, top_p, seed, position, purpose=ops.Purpose.DRAFT,
                     substream=2)
    gpu = ops.sample(logits.cuda(), temperature.cuda(), top_k.cuda(), top_p.cuda(), seed.cuda(),
                     position.cuda(), purpose=ops.Purpose.DRAFT, substream=2)
    assert_same(gpu, cpu)


def test_opcheck_cuda():
    case = to_cuda(make_chain_batch(5, 3, 64, seed=1, ragged=True))
    batch, width = 5, int((case["cu_num_draft"][1:] - case["cu_num_draft"][:-1]).max())
    args = (case["draft_tokens"], case["cu_num_draft"], case["target_logits"], case["draft_logits"],
            case["temperature"], case["top_k"], case["top_p"], case["seed"], case["position"],
            False, 0.3, 0.09, 0, torch.empty(batch, width + 1, dtype=torch.int64, device="cuda"),
            torch.empty(batch, dtype=torch.int64, device="cuda"),
            torch.empty(batch, width, dtype=torch.int8, device="cuda"),
            torch.empty(batch, dtype=torch.int32, device="cuda"))
    torch.library.opcheck(torch.ops.specdec.verify_chain.default, args)
    logits = torch.randn(4, 64, device="cuda")
    sargs = (logits, torch.full((4,), 0.7, device="cuda"), torch.zeros(4, dtype=torch.int32,
             device="cuda"), torch.ones(4, device="cuda"), torch.arange(4, device="cuda"),
             torch.arange(4, device="cuda"), 3, 0, torch.empty(4, dtype=torch.int64, device="cuda"),
             torch.empty(4, dtype=torch.int32, device="cuda"))
    torch.library.opcheck(torch.ops.specdec.sample.default, sargs)
