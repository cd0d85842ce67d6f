"""The fused MTP-head ops against their reference, and the Medusa / MTP proposers' own invariants.

(Losslessness of both methods is the conformance suite's job: tests/test_conformance.py.)
"""

from __future__ import annotations

import pytest
import torch
from _isolated import run_capped

from specdec_cuda.ops import mtp as mtp_ops
from specdec_cuda.reference import mtp as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _head_inputs(M, H, V, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g)
    w = 1 + 0.1 * torch.randn(H, generator=g)
    lm = torch.randn(V, H, generator=g) / H ** 0.5
    return x.to(dtype).to(device), w.to(dtype).to(device), lm.to(dtype).to(device)


def _tol(dtype):
    return dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)


def _assert_same_topk(out, values, indices):
    """Tokens exactly, except where the reference itself has a near-tie (summation order)."""
    assert torch.allclose(out.values.double(), values.double(), rtol=1e-4, atol=1e-4)
    gaps = (values[:, :-1] - values[:, 1:]).abs().double()
    clear = torch.ones_like(indices, dtype=torch.bool)
    clear[:, 1:] &= gaps > 1e-4
    clear[:, :-1] &= gaps > 1e-4
    assert torch.equal(out.indices[clear], indices[clear])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,H,V,k", [(1, 64, 111, 1), (7, 48, 1000, 5), (16, 32, 257, 64), (3, 96, 600, 10)])
def test_head_topk_matches_reference(dtype, M, H, V, k):
    x, w, lm = _head_inputs(M, H, V, dtype, seed=M + V)
    values, indices, logits, _ = ref.mtp_head_topk(x, w, lm, k, 1e-5)
    out = mtp_ops.mtp_head_topk(x, w, lm, k, 1e-5, return_logits=True)
    assert out.values.dtype == values.dtype and out.indices.dtype == torch.int64
    torch.testing.assert_close(out.logits, logits, **_tol(dtype))
    _assert_same_topk(out, values, indices)
    plain = mtp_ops.mtp_head_topk(x, w, lm, k, 1e-5)
    assert plain.logits is None
    assert torch.equal(plain.indices, out.indices) and torch.equal(plain.values, out.values)


@pytest.mark.parametrize("M,H", [(1, 256), (5, 64), (12, 40)])  # H = 40: the portable kernel
def test_bf16_head_equals_the_float_head_on_its_widened_weights(M, H):
    # The bf16 LM-head read widens each weight exactly, then the same float32 kernel runs: the
    # logits are bit-identical to a float32 head holding the same values.
    x, w, lm = _head_inputs(M, H, 300, torch.bfloat16, seed=H)
    half = mtp_ops.mtp_head_topk(x, w, lm, 8, 1e-5, return_logits=True)
    full = mtp_ops.mtp_head_topk(x.float(), w.float(), lm.float(), 8, 1e-5, return_logits=True)
    assert torch.equal(half.logits, full.logits) and torch.equal(half.indices, full.indices)


def test_head_topk_rank0_is_argmax_and_ties_go_to_the_lower_id():
    H, V = 16, 40
    x = torch.randn(4, H, dtype=torch.float64)
    lm = torch.randn(V, H, dtype=torch.float64)
    lm[30] = lm[7]  # an exact tie between ids 7 and 30
    lm[7] = lm[30] = x[0] * 10  # ... that is row 0's maximum
    out = mtp_ops.mtp_head_topk(x, torch.ones(H, dtype=torch.float64), lm, 3, 1e-6, return_logits=True)
    assert out.indices[0, :2].tolist() == [7, 30]
    assert torch.equal(out.indices[:, 0], out.logits.argmax(-1))


def test_head_topk_flags_non_finite_logits_naming_the_row():
    x, w, lm = _head_inputs(3, 16, 50, torch.float32)
    x[1, 3] = float("nan")
    with pytest.raises(RuntimeError, match="row 1"):
        mtp_ops.mtp_head_topk(x, w, lm, 2, 1e-6)


def test_head_topk_rejects_bad_inputs_naming_them():
    x, w, lm = _head_inputs(2, 16, 50, torch.float32)
    with pytest.raises(RuntimeError, match="lm_head"):
        mtp_ops.mtp_head_topk(x, w, lm[:, :8].contiguous(), 2, 1e-6)
    with pytest.raises(RuntimeError, match="norm_weight"):
        mtp_ops.mtp_head_topk(x, w.double(), lm, 2, 1e-6)
    with pytest.raises(ValueError, match="k must"):
        mtp_ops.mtp_head_topk(x, w, lm, 0, 1e-6)
    with pytest.raises(ValueError, match="k must"):
        mtp_ops.mtp_head_topk(x, w, lm[:3].contiguous(), 4, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,H,V,k,group", [(1, 64, 111, 1, 32), (5, 128, 1000, 8, -1), (16, 96, 300, 64, 32)])
def test_head_topk_w4_matches_reference(dtype, M, H, V, k, group):
    from specdec_cuda import ops

    x, w, lm = _head_inputs(M, H, V, dtype, seed=V)
    q = ops.quantize_w4(lm.float(), group_size=group, device="cpu")
    values, indices, logits, _ = ref.mtp_head_topk_w4(x, w, q.packed, q.scales, q.group_size, V, k, 1e-5)
    out = mtp_ops.mtp_head_topk_w4(x, w, q, k, 1e-5, return_logits=True)
    torch.testing.assert_close(out.logits, logits, rtol=1e-4, atol=1e-4)
    _assert_same_topk(out, values, indices)
    assert torch.equal(mtp_ops.mtp_head_topk_w4(x, w, q, k, 1e-5).indices, out.indices)


def test_head_topk_w4_opcheck_and_shape_errors():
    from specdec_cuda import ops

    x, w, lm = _head_inputs(3, 64, 70, torch.float32)
    q = ops.quantize_w4(lm, group_size=32, device="cpu")
    args = (x, w, q.packed, q.scales, 32, 70, 1e-6, torch.empty(3, 4), torch.empty(3, 4, dtype=torch.int64),
            torch.empty(3, 70), torch.empty(3, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.mtp_head_topk_w4.default, args)
    with pytest.raises(RuntimeError, match="packed must be"):
        torch.ops.specdec.mtp_head_topk_w4(x, w, q.packed[:2].contiguous(), q.scales, 32, 70, 1e-6,
                                           *args[7:])
    with pytest.raises(ValueError, match="takes 64 features"):
        mtp_ops.mtp_head_topk_w4(x[:, :32].contiguous(), w[:32].contiguous(), q, 2, 1e-6)


@pytest.mark.parametrize("M,H,V,k", [(1, 64, 111, 1), (7, 48, 1000, 5), (17, 32, 300, 64)])
@pytest.mark.parametrize("bf16", [True, False])  # bfloat16 panels (a bf16 checkpoint's values) or float32
def test_head_topk_packed_matches_reference(M, H, V, k, bf16):
    from specdec_cuda import ops

    x, w, lm = _head_inputs(M, H, V, torch.float32, seed=M + V)
    lm = lm.bfloat16().float() if bf16 else lm
    packed = ops.pack_weight(lm)
    assert packed.panels.dtype == (torch.bfloat16 if bf16 else torch.float32)
    values, indices, logits, _ = ref.mtp_head_topk(x, w, lm, k, 1e-5)
    out = mtp_ops.mtp_head_topk_packed(x, w, packed, k, 1e-5, return_logits=True)
    torch.testing.assert_close(out.logits, logits, rtol=1e-4, atol=1e-4)
    _assert_same_topk(out, values, indices)
    plain = mtp_ops.mtp_head_topk_packed(x, w, packed, k, 1e-5)
    assert plain.logits is None and plain.lse is None and torch.equal(plain.indices, out.indices)
    # the log-sum-exp over the vocabulary, taken range by range (V = 1000: four ranges of 256)
    ranked = mtp_ops.mtp_head_topk_packed(x, w, packed, k, 1e-5, return_lse=True)
    torch.testing.assert_close(ranked.lse, torch.logsumexp(logits, -1), rtol=1e-5, atol=1e-4)
    assert torch.equal(ranked.indices, out.indices) and ranked.logits is None


@pytest.mark.parametrize("cap", ["baseline", "avx2"])
def test_head_rank_and_lse_on_each_tier_match_reference(cap):
    # SPECDEC_CPU_ISA is read once at load: a fresh process per tier ("baseline": every logit
    # through the running top-k and libm's expf; "avx2": groups of 8 dismissed by one compare, the
    # 8-lane exp, where the CPU has it). Logits spread over a wide range, so that most exponentials
    # underflow and the largest dominate, as in a trained head; exact ties in row 0's top-k, in
    # one range and across ranges (ids 3, 5, 700, 1050: the lower id first); a NaN row flagged.
    code = (
        "import pytest, torch, specdec_cuda.ops as ops, specdec_cuda.ops.mtp as mtp\n"
        "g = torch.Generator().manual_seed(3)\n"
        "x, w = torch.randn(5, 64, generator=g) * 4, torch.ones(64)\n"
        "lm = torch.randn(1100, 64, generator=g) * 3\n"
        "lm[3] = lm[5] = lm[700] = lm[1050] = x[0] / 2\n"
        "out = mtp.mtp_head_topk_packed(x, w, ops.pack_weight(lm), 16, 1e-6, return_logits=True, return_lse=True)\n"
        "order = [sorted(range(1100), key=lambda j: (-z[j], j))[:16] for z in out.logits.tolist()]\n"
        "assert out.indices.tolist() == order and order[0][:4] == [3, 5, 700, 1050]\n"
        "assert torch.equal(out.values, out.logits.gather(1, out.indices))\n"
        "torch.testing.assert_close(out.lse, torch.logsumexp(out.logits, -1), rtol=1e-6, atol=1e-5)\n"
        "lp = torch.log_softmax(out.logits, -1).topk(16, -1).values\n"
        "torch.testing.assert_close(out.values - out.lse[:, None], lp, rtol=1e-5, atol=1e-4)\n"
        "x[2, 7] = float('nan')\n"
        "with pytest.raises(RuntimeError, match='row 2'):\n"
        "    mtp.mtp_head_topk_packed(x, w, ops.pack_weight(lm), 16, 1e-6)\n")
    run_capped(cap, code, timeout=300)


def test_head_topk_packed_opcheck_and_shape_errors():
    from specdec_cuda import ops

    x, w, lm = _head_inputs(3, 64, 70, torch.float32)
    packed = ops.pack_weight(lm)
    outs = (torch.empty(3, 4), torch.empty(3, 4, dtype=torch.int64), torch.empty(3, 70), torch.empty(3, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.mtp_head_topk_packed.default, (x, w, packed.panels, 70, 1e-6, *outs))
    torch.library.opcheck(torch.ops.specdec.mtp_head_topk_packed.default,
                          (x, w, packed.panels, 70, 1e-6, *outs, torch.empty(3)))
    with pytest.raises(RuntimeError, match="lse must be"):
        torch.ops.specdec.mtp_head_topk_packed(x, w, packed.panels, 70, 1e-6, *outs, torch.empty(4))
    with pytest.raises(RuntimeError, match="panels must be"):
        torch.ops.specdec.mtp_head_topk_packed(x, w, packed.panels, 200, 1e-6, *outs[:2], None, outs[3])
    with pytest.raises(RuntimeError, match="x must be a contiguous float32"):
        torch.ops.specdec.mtp_head_topk_packed(x.double(), w, packed.panels, 70, 1e-6, *outs)
    with pytest.raises(ValueError, match="takes 64 features"):
        mtp_ops.mtp_head_topk_packed(x[:, :32].contiguous(), w[:32].contiguous(), packed, 2, 1e-6)


def _input_inputs(M, H, V, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(M, H, generator=g)
    tokens = torch.randint(0, V, (M,), generator=g)
    embed = torch.randn(V, H, generator=g)
    en, hn = 1 + 0.1 * torch.randn(H, generator=g), 1 + 0.1 * torch.randn(H, generator=g)
    eh = torch.randn(H, 2 * H, generator=g) / (2 * H) ** 0.5
    cast = lambda t: t.to(dtype).to(device)  # noqa: E731
    return cast(h), tokens.to(device), cast(embed), cast(en), cast(hn), cast(eh)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,H,V", [(1, 64, 111), (9, 48, 77), (16, 40, 300)])
def test_mtp_input_matches_reference(dtype, M, H, V):
    args = _input_inputs(M, H, V, dtype, seed=M)
    out = mtp_ops.mtp_input(*args, 1e-5)
    torch.testing.assert_close(out, ref.mtp_input(*args, 1e-5), **_tol(dtype))


def test_mtp_input_rejects_out_of_range_tokens_and_bad_shapes():
    h, tokens, embed, en, hn, eh = _input_inputs(4, 16, 20, torch.float32)
    with pytest.raises(RuntimeError, match=r"tokens\[2\] = 20"):
        mtp_ops.mtp_input(h, torch.tensor([0, 1, 20, 3]), embed, en, hn, eh, 1e-6)
    with pytest.raises(RuntimeError, match="eh_proj"):
        mtp_ops.mtp_input(h, tokens, embed, en, hn, eh[:, :16].contiguous(), 1e-6)


def test_opcheck():
    x, w, lm = _head_inputs(3, 16, 50, torch.float32)
    M, k = 3, 4
    args = (x, w, lm, 1e-6, torch.empty(M, k), torch.empty(M, k, dtype=torch.int64), torch.empty(M, 50),
            torch.empty(M, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.mtp_head_topk.default, args)
    args = (x, w, lm, 1e-6, torch.empty(M, k), torch.empty(M, k, dtype=torch.int64), None,
            torch.empty(M, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.mtp_head_topk.default, args)
    h, tokens, embed, en, hn, eh = _input_inputs(3, 16, 20, torch.float32)
    torch.library.opcheck(torch.ops.specdec.mtp_input.default,
                          (h, tokens, embed, en, hn, eh, 1e-6, torch.empty(3, 16), torch.empty(3, dtype=torch.int32)))


def test_torch_compile_fullgraph():
    x, w, lm = _head_inputs(5, 32, 70, torch.float32)
    h, tokens, embed, en, hn, eh = _input_inputs(5, 32, 70, torch.float32)

    def f(x, h):
        top = mtp_ops.mtp_head_topk(x, w, lm, 3, 1e-6)
        return top.indices, mtp_ops.mtp_input(h, tokens, embed, en, hn, eh, 1e-6)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, want = compiled(x, h), f(x, h)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,H,V,k", [(1, 4096, 128256, 8), (16, 4096, 32000, 10), (7, 192, 2048, 1), (3, 100, 111, 64)])
def test_cuda_equals_cpu(dtype, M, H, V, k):
    x, w, lm = _head_inputs(M, H, V, dtype, seed=V)
    cpu = mtp_ops.mtp_head_topk(x, w, lm, k, 1e-5, return_logits=True)
    gpu = mtp_ops.mtp_head_topk(x.cuda(), w.cuda(), lm.cuda(), k, 1e-5, return_logits=True)
    torch.testing.assert_close(gpu.logits.cpu(), cpu.logits, **_tol(dtype))
    _assert_same_topk(type(gpu)(gpu.values.cpu(), gpu.indices.cpu(), None), cpu.values, cpu.indices)
    args = _input_inputs(M, min(H, 512), V, dtype, seed=M)
    want = mtp_ops.mtp_input(*args, 1e-5)
    got = mtp_ops.mtp_input(*[a.cuda() for a in args], 1e-5)
    torch.testing.assert_close(got.cpu(), want, **_tol(dtype))


# -- the proposers ----------------------------------------------------------------------------------

def test_static_tree_is_prefix_closed_bfs_and_takes_the_best_paths():
    from specdec_cuda.proposers.medusa import static_tree

    acc = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.2]]
    tree = static_tree(acc, 9)
    assert len(tree) == 9 and len(set(tree)) == 9
    assert tree == sorted(tree, key=lambda p: (len(p), p))
    assert all(p[:-1] in tree for p in tree if len(p) > 1)

    def score(p):
        s = 1.0
        for d, r in enumerate(p):
            s *= acc[d][r]
        return s

    worst_in = min(score(p) for p in tree)
    outside = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)]
    outside += [(a, b, c) for a in range(3) for b in range(3) for c in range(2)]
    assert all(score(p) <= worst_in + 1e-12 for p in outside if p not in tree)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from decoding_models import make_checkpoint

    from specdec_cuda import models

    folder = make_checkpoint(tmp_path_factory.mktemp("mtp") / "target", seed=0)
    return models.load(folder, dtype=torch.float64)


def test_medusa_candidates_are_the_reference_top_k_of_each_head(tiny_target):
    from specdec_cuda.models.heads import random_heads, target_head
    from specdec_cuda.proposers.medusa import MedusaProposer

    head = target_head(tiny_target)
    heads = random_heads(tiny_target, "medusa", 3, seed=1)
    prop = MedusaProposer(head, heads, budget=10)
    prop.hidden = torch.randn(4, tiny_target.hidden_size, dtype=torch.float64)
    cand = prop.candidates(3)
    for i in range(3):
        out = heads(prop.hidden)[:, i]
        _, want, _, _ = ref.mtp_head_topk(out, head.norm_weight, head.lm_head, prop.topk, head.eps)
        assert torch.equal(cand[:, i], want)


def test_mtp_drafts_equal_a_from_scratch_recomputation(tiny_target):
    """After several steps of commits and rollbacks, the proposer's cached state gives the same
    greedy draft as running every module over the whole committed text from scratch."""
    from specdec_cuda.decoding import SamplingParams, decode
    from specdec_cuda.models.heads import random_heads, target_head
    from specdec_cuda.proposers.mtp import MTPProposer

    head = target_head(tiny_target)
    modules = random_heads(tiny_target, "mtp", 2, seed=3, scale=3.0)

    drafts = []

    class Recording(MTPProposer):
        def propose(self, state):
            draft = super().propose(state)
            if draft is not None:
                drafts.append((self.seq.clone(), state.lengths.clone(), draft.tokens.clone()))
            return draft

    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    params = SamplingParams.make(3, 0.0)
    decode(tiny_target, prompts, params, 14, proposer=Recording(head, modules, k=4))
    assert len(drafts) > 3
    for seq, lengths, tokens in drafts[1:]:
        for b in range(3):
            L = int(lengths[b])
            text = seq[b, : L + 1][None]  # committed text through the root
            want = _scratch_greedy_draft(tiny_target, head, modules, text, k=tokens.shape[1])
            assert tokens[b].tolist() == want


def _scratch_greedy_draft(target, head, modules, text, k):
    """Module chain over the whole text, no cached state; the last module reused past D."""
    T = text.shape[1]
    cache = target.new_cache(1, T)
    hidden = target.forward(text, torch.arange(T)[None], cache, hidden_layers=(-1,)).hidden_states[-1]
    seq = text[0].tolist()
    D, L = modules.num_modules, T - 1
    hs = [hidden[0, :L]]  # hs[d][i]: module d's output at position i (target's for d = 0)
    out = []
    for d in range(1, min(D, k) + 1):
        n = L
        toks = torch.tensor([seq[i + d] for i in range(n)])[None]
        c = modules.new_cache(1, n + k)[d - 1]
        h = modules(d - 1, hs[d - 1][None, :n], toks, torch.arange(n)[None], c, head)[0]
        hs.append(h)
        t = int(ref.mtp_head_topk(h[-1:], head.norm_weight, head.lm_head, 1, head.eps)[1][0, 0])
        out.append(t)
        seq.append(t)
    for j in range(D + 1, k + 1):
        n = L + (j - D)  # positions 0 .. L - 1 + (j - D), the tail fed the module's own outputs
        prev = torch.cat([hs[D - 1][: L], hs[D][L - 1 : n - 1]])
        toks = torch.tensor([seq[i + D] for i in range(n)])[None]
        c = modules.new_cache(1, n + 1)[D - 1]
        h = modules(D - 1, prev[None], toks, torch.arange(n)[None], c, head)[0]
        hs[D] = h
        t = int(ref.mtp_head_topk(h[-1:], head.norm_weight, head.lm_head, 1, head.eps)[1][0, 0])
        out.append(t)
        seq.append(t)
    return out


def test_heads_save_and_load_round_trip(tmp_path, tiny_target):
    from specdec_cuda.models.heads import load_heads, random_heads, save_heads

    for kind in ("medusa", "mtp"):
        heads = random_heads(tiny_target, kind, 2, seed=4)
        heads.topk_accuracy = [[0.5, 0.1], [0.3, 0.1]]
        save_heads(tmp_path / kind, heads)
        back = load_heads(tmp_path / kind, dtype=torch.float64)
        assert type(back) is type(heads) and back.topk_accuracy == heads.topk_accuracy
        for (n1, p1), (n2, p2) in zip(heads.state_dict().items(), back.state_dict().items()):
            assert n1 == n2 and torch.equal(p1, p2)
    with pytest.raises(FileNotFoundError, match="not a heads checkpoint"):
        load_heads(tmp_path / "nothing")


def test_methods_without_heads_say_how_to_train_them(tiny_target):
    # The library never falls back to heads trained for another model (the zoo's).
    import specdec_cuda

    for method in ("medusa", "mtp"):
        with pytest.raises(FileNotFoundError, match=f"specdec_cuda.train {method} --target"):
            specdec_cuda.generate(tiny_target, [[1, 2]], method=method, max_new_tokens=2)


@pytest.mark.parametrize("method,options", [("medusa", dict(budget=8)), ("mtp", dict(k=3))])
def test_w4_lm_head_drafting_keeps_greedy_output(tiny_target, method, options):
    import specdec_cuda
    from specdec_cuda.models.heads import random_heads

    heads = random_heads(tiny_target, method, 3 if method == "medusa" else 2, seed=2)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    ar = specdec_cuda.generate(tiny_target, prompts, max_new_tokens=16).tokens
    out = specdec_cuda.generate(tiny_target, prompts, method=method, max_new_tokens=16, heads=heads,
                                w4_lm_head=True, policy="fixed", **options)
    assert out.tokens == ar and sum(out.metrics.drafted) > 0


def test_training_forward_equals_the_inference_forward(tiny_target):
    """The trainer's whole-sequence path (autograd, plain torch input side, scratch K/V) computes
    what drafting computes (fused input op, static cache), and the Medusa loss's logits are the
    fused op's candidates."""
    from specdec_cuda.models.heads import random_heads, target_head
    from specdec_cuda.train.heads import mtp_outputs

    head = target_head(tiny_target)
    seq = torch.randint(0, tiny_target.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = tiny_target.forward(seq, torch.arange(12).expand(2, 12), tiny_target.new_cache(2, 12), hidden_layers=(-1,))
    hidden = out.hidden_states[-1].double()
    modules = random_heads(tiny_target, "mtp", 2, seed=7)
    with torch.no_grad():
        infer = mtp_outputs(modules, head, hidden, seq)
    modules.requires_grad_(True)
    train = mtp_outputs(modules, head, hidden, seq)
    for a, b in zip(train, infer):
        torch.testing.assert_close(a.detach(), b)
    medusa = random_heads(tiny_target, "medusa", 2, seed=8)
    with torch.no_grad():
        logits = head.logits(medusa(hidden))  # [2, 12, K, V]: what the Medusa loss scores
        top = head.topk(medusa(hidden).reshape(-1, hidden.shape[-1]), 1).indices.view(2, 12, 2)
    assert torch.equal(logits.argmax(-1), top)


@pytest.mark.parametrize("method", ["medusa", "mtp"])
def test_cost_policy_keeps_the_output(tiny_target, method):
    """Under the cost policy, which grants 0 drafts on some steps (accept() with
    no proposal, rows drafting different lengths): the output stays the autoregressive one (at
    T > 0 token for token only for Medusa's sample-and-match; MTP's rejection sampling is equal in
    distribution, which the conformance suite's chi-square test checks)."""
    import specdec_cuda
    from specdec_cuda.models.heads import random_heads

    heads = random_heads(tiny_target, method, 3 if method == "medusa" else 2, seed=9)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    for temperature in (0.0, 0.9) if method == "medusa" else (0.0,):
        kw = dict(max_new_tokens=20, temperature=temperature, seed=[3, 4, 5])
        ar = specdec_cuda.generate(tiny_target, prompts, **kw).tokens
        extra = dict(budget=8) if method == "medusa" else dict(k=3)
        dec = specdec_cuda.SpeculativeDecoder(tiny_target, method=method, heads=heads, policy="cost", **extra)
        assert dec.policy is not None
        for _ in range(2):  # the policy's measurements carry over between calls
            assert dec.generate(prompts, **kw).tokens == ar


def test_mtp_blocks_take_the_packed_cpu_path_and_still_train(tmp_path, monkeypatch):
    """A float32 target's MTP blocks run as one ``decoder_layer`` op each at inference (as the
    target's own layers do), matching the torch path; a training step afterwards gets gradients."""
    from decoding_models import make_checkpoint

    from specdec_cuda import models
    from specdec_cuda.models.heads import random_heads, target_head
    from specdec_cuda.ops.skinny_linear import packed_kernel_available
    from specdec_cuda.train.heads import mtp_outputs

    if not packed_kernel_available():
        pytest.skip("the packed path needs the AVX-512 or AVX2 kernel")
    target = models.load(make_checkpoint(tmp_path / "target", seed=0))
    head, modules = target_head(target), random_heads(target, "mtp", 1, seed=3)
    g = torch.Generator().manual_seed(1)
    H = head.norm_weight.shape[0]
    h_prev, tokens = torch.randn(2, 7, H, generator=g), torch.randint(0, target.vocab_size, (2, 7), generator=g)
    positions = torch.arange(7).expand(2, 7)

    def run():
        cache = modules.new_cache(2, 16)[0]
        first = modules(0, h_prev[:, :4], tokens[:, :4], positions[:, :4], cache, head)
        cache.commit(torch.tensor([4, 4]))
        return torch.cat([first, modules(0, h_prev[:, 4:], tokens[:, 4:], positions[:, 4:], cache, head)], 1)

    with torch.no_grad():
        packed = run()
        assert modules._binding is not None
        monkeypatch.setenv("SPECDEC_PACKED_LINEAR", "0")
        plain = run()
    torch.testing.assert_close(packed, plain, rtol=1e-4, atol=1e-4)
    monkeypatch.delenv("SPECDEC_PACKED_LINEAR")
    with torch.no_grad():
        run()  # bound packed again
    modules.requires_grad_(True)
    mtp_outputs(modules, head, h_prev, tokens)[0].square().sum().backward()  # the trainer's path
    assert modules._binding is None
    assert all(p.grad is not None for p in modules.modules_[0].block.parameters())
