"""sample / verify_chain kernels equal the reference (python/specdec_cuda/reference/sampling.py).

Integer outputs (tokens, counts, acceptance, statuses) must match exactly: the kernels draw the same
Philox numbers as the reference, and the float work only differs by rounding, which could flip a
decision only at an exact near-tie (not met by these fixed seeds).
"""

from __future__ import annotations

import math

import pytest
import torch

import specdec_cuda.ops as ops
from specdec_cuda.reference import sampling as ref
from sampling_cases import llm_like_logits, make_chain_batch

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def reference_verify(case):
    return ref.verify_chain(case["draft_tokens"], case["cu_num_draft"], case["target_logits"],
                            case["draft_logits"], case["temperature"], case["top_k"], case["top_p"],
                            case["seed"], case["position"], case.get("typical", False))


def assert_verify_equal(case, strategy="auto", device="cpu"):
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    out = ops.verify_chain(**moved, strategy=strategy)
    tokens, num_accepted, accepted, status = reference_verify(case)
    assert torch.equal(out.status.cpu(), status), (out.status, status)
    assert torch.equal(out.num_accepted.cpu(), num_accepted), (out.num_accepted, num_accepted)
    assert torch.equal(out.accepted.cpu(), accepted)
    assert torch.equal(out.tokens.cpu(), tokens), (out.tokens, tokens)
    return out


# ---- verify_chain vs reference ----------------------------------------------------------------

@pytest.mark.parametrize("batch,k", [(1, 1), (1, 16), (7, 4), (7, 8), (64, 1), (64, 4)])
@pytest.mark.parametrize("strategy", ["serial", "parallel"])
def test_verify_small_vocab_matches_reference(batch, k, strategy):
    dtype = DTYPES[(batch + k) % 3]
    case = make_chain_batch(batch, k, 111, seed=batch * 100 + k, dtype=dtype, ragged=batch > 1)
    assert_verify_equal(case, strategy)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_draft_logits", [True, False])
def test_verify_mixed_kinds_and_flags(dtype, with_draft_logits):
    case = make_chain_batch(9, 5, 111, seed=7, dtype=dtype, ragged=True, flagged=True,
                            with_draft_logits=with_draft_logits)
    out = assert_verify_equal(case, "serial")
    assert out.status[1] == ops.STATUS_NONFINITE_LOGITS
    assert out.status[3] == ops.STATUS_BAD_PARAMS
    assert_verify_equal(case, "parallel")


def test_verify_typical_matches_reference():
    case = make_chain_batch(12, 6, 111, seed=11, typical=True, ragged=True)
    out = assert_verify_equal(case, "serial")
    assert_verify_equal(case, "parallel")
    assert 0 < int(out.num_accepted.sum()) < int(case["cu_num_draft"][-1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_verify_vocab_32000(dtype):
    case = make_chain_batch(7, 4, 32000, seed=3, dtype=dtype, ragged=True)
    assert_verify_equal(case, "parallel")


def test_verify_vocab_128256():
    case = make_chain_batch(2, 4, 128256, seed=5, dtype=torch.bfloat16)
    assert_verify_equal(case, "serial")


@pytest.mark.slow
@pytest.mark.parametrize("batch,k,vocab", [(64, 8, 111), (64, 16, 111), (7, 16, 32000),
                                           (1, 8, 128256), (7, 4, 128256)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_verify_sweep_slow(batch, k, vocab, dtype):
    case = make_chain_batch(batch, k, vocab, seed=batch + k + vocab, dtype=dtype, ragged=batch > 1)
    assert_verify_equal(case, "auto")


def test_verify_strategies_agree_and_accept_some():
    case = make_chain_batch(16, 8, 500, seed=21, ragged=True)
    serial = ops.verify_chain(**case, strategy="serial")
    parallel = ops.verify_chain(**case, strategy="parallel")
    for a, b in zip(serial, parallel):
        assert torch.equal(a, b)
    total = int(case["cu_num_draft"][-1])
    assert 0 < int(serial.num_accepted.sum()) < total  # the case exercises accepts and rejects


def test_verify_batch_order_independence():
    case = make_chain_batch(10, 6, 111, seed=9, ragged=True)
    out = ops.verify_chain(**case)
    perm = torch.tensor([3, 7, 0, 9, 1, 5, 2, 8, 6, 4])
    cu = case["cu_num_draft"]
    counts = (cu[1:] - cu[:-1])[perm]
    new_cu = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    drafts = torch.cat([case["draft_tokens"][int(cu[i]):int(cu[i + 1])] for i in perm])
    target = torch.cat([case["target_logits"][int(cu[i]) + i:int(cu[i + 1]) + i + 1] for i in perm])
    dl = torch.cat([case["draft_logits"][int(cu[i]):int(cu[i + 1])] for i in perm])
    permuted = ops.verify_chain(drafts, new_cu, target, dl, case["temperature"][perm],
                                case["top_k"][perm], case["top_p"][perm], case["seed"][perm],
                                case["position"][perm], max_draft=out.tokens.shape[1] - 1)
    for a, b in zip(permuted, out):
        assert torch.equal(a, b[perm])


def test_verify_edge_cases():
    vocab = 50
    g = torch.Generator().manual_seed(0)
    target = llm_like_logits(4, vocab, g)
    # a zero-probability target token (-inf) is never accepted, whatever the draft's q says
    target[0, 7] = -math.inf
    draft = torch.full((3, vocab), -math.inf)
    draft[:, 7] = 0.0  # q one-hot on token 7
    out = ops.verify_chain(torch.tensor([7, 7, 7]), torch.tensor([0, 3]), target, draft,
                           temperature=1.0, seed=123)
    assert out.accepted[0, 0] == 0 and out.num_accepted[0] == 0 and out.tokens[0, 0] != 7
    # draft equal to target: everything accepted, a bonus token emitted
    out = ops.verify_chain(torch.tensor([1, 2, 3]), torch.tensor([0, 3]), target, target[:3],
                           temperature=0.9, seed=5)
    assert out.num_accepted.tolist() == [3] and (out.tokens >= 0).all()
    assert out.accepted.tolist() == [[1, 1, 1]]
    # a row without drafts: only the bonus token; empty batch
    out = ops.verify_chain(torch.zeros(0, dtype=torch.int64), torch.tensor([0, 0, 0]), target[:2])
    assert out.tokens.shape == (2, 1) and out.accepted.shape == (2, 0)
    assert out.tokens[:, 0].tolist() == [int(target[0].argmax()), int(target[1].argmax())]
    out = ops.verify_chain(torch.zeros(0, dtype=torch.int64), torch.tensor([0]), target[:0])
    assert out.tokens.shape == (0, 1)
    # NaN after the first rejection is never read: not flagged, by either strategy
    t2 = target.clone()
    t2[1:, :] = float("nan")
    d = torch.tensor([(int(target[0].argmax()) + 1) % vocab, 0, 0])
    for strategy in ("serial", "parallel"):
        out = ops.verify_chain(d, torch.tensor([0, 3]), t2, strategy=strategy)
        assert out.status.tolist() == [0] and out.num_accepted.tolist() == [0]
    # max_draft wider than needed pads with -1
    out = ops.verify_chain(torch.tensor([1]), torch.tensor([0, 1]), target[:2], max_draft=3)
    assert out.tokens.shape == (1, 4) and out.tokens[0, 2:].tolist() == [-1, -1]
    assert out.accepted[0, 1:].tolist() == [-1, -1]


def test_verify_status_codes():
    target = torch.randn(6, 20)
    cu = torch.tensor([0, 1, 2, 3])
    bad = target.clone()
    bad[2, 4] = float("inf")  # row 1, position 0
    out = ops.verify_chain(torch.tensor([0, 1, 25]), cu, bad, temperature=torch.tensor([1.0, 1.0, 1.0]))
    assert out.status.tolist() == [0, 1, 2]
    assert (out.tokens[1:] == -1).all() and out.num_accepted[1:].tolist() == [0, 0]
    assert (out.accepted[1:] == -1).all()
    out = ops.verify_chain(torch.tensor([0, 1, 2]), cu, target,
                           temperature=torch.tensor([float("nan"), 1.0, 1.0]),
                           top_p=torch.tensor([1.0, 0.0, 1.5]))
    assert out.status.tolist() == [3, 3, 3]
    with pytest.raises(ValueError, match="row 0: status 3"):
        ops.raise_on_status(out.status)
    ops.raise_on_status(torch.zeros(3, dtype=torch.int32))
    # an all -inf bonus row is flagged once the walk reaches it (row 0 accepts its greedy draft)
    allinf = target.clone()
    allinf[1] = -math.inf
    drafts = torch.tensor([int(target[0].argmax()), (int(target[2].argmax()) + 1) % 20, 0])
    out = ops.verify_chain(drafts, cu, allinf, temperature=0.0)
    assert out.status.tolist()[:2] == [1, 0] and out.num_accepted[1] == 0


def test_verify_bad_inputs_raise():
    t = torch.randn(3, 10)
    with pytest.raises(ValueError, match="target_logits must have N"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2]), torch.randn(4, 10))
    with pytest.raises(TypeError, match="target_logits must be float"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2]), t.long())
    with pytest.raises(ValueError, match="draft_logits must have shape"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2]), t, torch.randn(3, 10))
    with pytest.raises(RuntimeError, match="max_draft"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2]), t, max_draft=1)
    with pytest.raises(RuntimeError, match="non-decreasing"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2, 1]), torch.randn(4, 10),
                         max_draft=3)
    with pytest.raises(ValueError, match="temperature must be a scalar or have shape"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2]), t, temperature=torch.ones(2))
    with pytest.raises(ValueError, match="strategy"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2]), t, strategy="fast")


# ---- sample vs reference ------------------------------------------------------------------------

def reference_sample(logits, temperature, top_k, top_p, seed, position, purpose, substream):
    return ref.sample(logits, temperature, top_k, top_p, seed, position, purpose, substream)


@pytest.mark.parametrize("vocab,dtype", [
    (111, torch.float32), (111, torch.float16), (111, torch.bfloat16), (32000, torch.float32),
    (32000, torch.float16), (32000, torch.bfloat16), (128256, torch.bfloat16),
    pytest.param(128256, torch.float32, marks=pytest.mark.slow),
    pytest.param(128256, torch.float16, marks=pytest.mark.slow),
])
def test_sample_matches_reference(vocab, dtype):
    rows = 7 if vocab <= 32000 else 3
    g = torch.Generator().manual_seed(vocab)
    logits = llm_like_logits(rows, vocab, g).to(dtype)
    temperature = torch.rand(rows, generator=g) + 0.2
    temperature[0] = 0.0
    top_k = torch.tensor([0, 5, 0, 0, 40, 0, 3][:rows], dtype=torch.int32)
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 0.7, 1.0, 1.0][:rows])
    seed = torch.randint(0, 2**62, (rows,), generator=g)
    position = torch.randint(0, 2**40, (rows,), generator=g)
    for purpose, substream in [(ops.Purpose.SAMPLE, 0), (ops.Purpose.DRAFT, 3)]:
        out = ops.sample(logits, temperature, top_k, top_p, seed, position, purpose=purpose,
                         substream=substream)
        tokens, status = reference_sample(logits, temperature, top_k, top_p, seed, position,
                                          purpose, substream)
        assert torch.equal(out.status, status)
        assert torch.equal(out.tokens, tokens), (out.tokens, tokens)


def test_sample_statuses_and_scalars():
    logits = torch.randn(5, 30)
    logits[1, 3] = float("nan")
    logits[2] = -math.inf
    logits[3, 0] = 3e38  # finite, but +inf after dividing by temperature 0.5
    out = ops.sample(logits, temperature=torch.tensor([1.0, 1.0, 1.0, 0.5, -1.0]), seed=3)
    assert out.status.tolist() == [0, 1, 1, 1, 3]
    assert out.tokens.tolist()[1:] == [-1, -1, -1, -1]
    tokens, status = reference_sample(logits, torch.tensor([1.0, 1.0, 1.0, 0.5, -1.0]),
                                      torch.zeros(5), torch.ones(5), torch.full((5,), 3),
                                      torch.zeros(5), ops.Purpose.SAMPLE, 0)
    assert torch.equal(out.tokens, tokens) and torch.equal(out.status, status)
    greedy = ops.sample(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), temperature=0.0)
    assert greedy.tokens.tolist() == [1]  # ties to the lowest index
    # top_k = 1 is greedy whatever the seed; the row does not depend on its neighbours
    x = torch.randn(4, 100)
    assert torch.equal(ops.sample(x, 1.0, top_k=1, seed=9).tokens, x.argmax(1))
    both = ops.sample(x, 0.8, seed=torch.tensor([1, 2, 3, 4]), position=10).tokens
    alone = torch.cat([ops.sample(x[i:i + 1], 0.8, seed=i + 1, position=10).tokens for i in range(4)])
    assert torch.equal(both, alone)
    with pytest.raises(ValueError, match="logits must have shape"):
        ops.sample(torch.randn(3))
    with pytest.raises(TypeError, match="top_k must be an integer"):
        ops.sample(x, top_k=2.5)


# ---- registration: opcheck and torch.compile -----------------------------------------------------

def test_opcheck_sample():
    g = torch.Generator().manual_seed(0)
    logits = llm_like_logits(4, 64, g)
    args = (logits, torch.full((4,), 0.7), torch.tensor([0, 3, 0, 0], dtype=torch.int32),
            torch.tensor([1.0, 1.0, 0.8, 1.0]), torch.arange(4), torch.arange(4) + 5, 3, 0,
            torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.sample.default, args)


@pytest.mark.parametrize("with_draft_logits", [True, False])
def test_opcheck_verify_chain(with_draft_logits):
    case = make_chain_batch(5, 3, 64, seed=1, ragged=True, with_draft_logits=with_draft_logits)
    batch = case["cu_num_draft"].numel() - 1
    width = int((case["cu_num_draft"][1:] - case["cu_num_draft"][:-1]).max())
    args = (case["draft_tokens"], case["cu_num_draft"], case["target_logits"], case["draft_logits"],
            case["temperature"], case["top_k"], case["top_p"], case["seed"], case["position"],
            False, 0.3, 0.09, 0, torch.empty(batch, width + 1, dtype=torch.int64),
            torch.empty(batch, dtype=torch.int64), torch.empty(batch, width, dtype=torch.int8),
            torch.empty(batch, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.verify_chain.default, args)


def test_torch_compile_fullgraph():
    case = make_chain_batch(4, 3, 64, seed=2)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(draft_tokens, cu, target, draft, temperature, seed, position):
        out = ops.verify_chain(draft_tokens, cu, target, draft, temperature, seed=seed,
                               position=position, max_draft=3)
        nxt = ops.sample(target[:4], temperature, seed=seed, position=position + 3)
        return out.tokens, out.num_accepted, nxt.tokens

    got = step(case["draft_tokens"], case["cu_num_draft"], case["target_logits"],
               case["draft_logits"], case["temperature"], case["seed"], case["position"])
    eager = ops.verify_chain(case["draft_tokens"], case["cu_num_draft"], case["target_logits"],
                             case["draft_logits"], case["temperature"], seed=case["seed"],
                             position=case["position"], max_draft=3)
    assert torch.equal(got[0], eager.tokens) and torch.equal(got[1], eager.num_accepted)
    assert torch.equal(got[2], ops.sample(case["target_logits"][:4], case["temperature"],
                                          seed=case["seed"], position=case["position"] + 3).tokens)
