"""``quant_kv_attention`` (attention over the hierarchical 4-bit KV cache) against its reference,
dequantise + SDPA (``specdec_cuda.reference.quant_attention``)."""

from __future__ import annotations

import pytest
import torch

from specdec_cuda.ops import kv_quant as kv
from specdec_cuda.ops.quant_attention import quant_kv_attention
from specdec_cuda.reference import quant_attention as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


def make_case(B=3, Hq=4, Hkv=2, n=3, D=16, capacity=96, key_group=16, value_group=8, F=64, seed=0,
              tree=False, device="cpu", lengths=(40, 17, 55)):
    """A filled cache, a buffer and per-row lengths / boundaries that exercise every read path:
    rows of different lengths, queries whose quant_len differs within a row, a buffer that
    overlaps the quantised tokens."""
    g = torch.Generator().manual_seed(seed)
    cache = kv.allocate_kv_cache(B, Hkv, capacity, D, key_group, value_group)
    keys = torch.randn(B, Hkv, capacity, D, generator=g) * 2 + torch.linspace(-1, 1, D)
    values = torch.randn(B, Hkv, capacity, D, generator=g)
    kv.kv_quantize_keys(keys, 0, key_group, cache["k_upper"], cache["k_lower"], cache["k_scale"], cache["k_zero"])
    kv.kv_quantize_values(values, 0, value_group, cache["v_upper"], cache["v_lower"], cache["v_scale"],
                          cache["v_zero"])
    lengths = torch.tensor(list(lengths)[:B] + [30] * max(0, B - len(lengths)))
    buffer_start = (lengths // key_group - 1).clamp(min=0) * key_group
    # quant_len per query: between buffer_start and a group boundary at most lengths + i
    quant_len = torch.stack([torch.clamp((lengths + i - 5) // key_group * key_group, min=0) for i in range(n)], 1)
    quant_len = torch.minimum(torch.maximum(quant_len, buffer_start[:, None]), torch.tensor(capacity))
    k_buffer = torch.randn(B, Hkv, F, D, generator=g)
    v_buffer = torch.randn(B, Hkv, F, D, generator=g)
    q = torch.randn(B, Hq, n, D, generator=g)
    tree_mask = (torch.rand(B, n, n, generator=g) < 0.5) if tree else None
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return dict(q=move(q), cache={k: move(v) for k, v in cache.items()}, k_buffer=move(k_buffer),
                v_buffer=move(v_buffer), quant_len=move(quant_len), buffer_start=move(buffer_start),
                lengths=move(lengths), tree_mask=move(tree_mask), key_group=key_group, value_group=value_group)


def run_kernel(case, use_lower):
    c = dict(case)
    return quant_kv_attention(c.pop("q"), c.pop("cache"), c.pop("k_buffer"), c.pop("v_buffer"), c.pop("quant_len"),
                              c.pop("buffer_start"), c.pop("lengths"), c.pop("tree_mask"), use_lower=use_lower, **c)


def run_reference(case, use_lower):
    c = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    cache = {k: v.cpu() for k, v in case["cache"].items()}
    return ref.quant_kv_attention(c["q"], cache, c["k_buffer"], c["v_buffer"], c["quant_len"], c["buffer_start"],
                                  c["lengths"], c["tree_mask"], c["key_group"], c["value_group"], use_lower,
                                  c["q"].shape[-1] ** -0.5)


@pytest.mark.parametrize("use_lower", [True, False])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("shape", [dict(), dict(Hq=6, Hkv=2, n=1, D=8, value_group=4),
                                   dict(B=1, Hq=3, Hkv=3, n=5, D=32, key_group=32, value_group=32),
                                   dict(B=4, Hq=8, Hkv=1, n=2, D=64, capacity=128, key_group=64),
                                   # the GPU-shaped model's heads: GQA 4:1, D = 128, a 5-token verification
                                   dict(B=3, Hq=8, Hkv=2, n=5, D=128, capacity=192, key_group=64, value_group=32,
                                        F=96, lengths=(150, 70, 130)),
                                   dict(B=1, Hq=4, Hkv=1, n=1, D=128, capacity=192, key_group=64, value_group=32,
                                        F=96, lengths=(150,))])
def test_matches_dequantise_then_sdpa(shape, tree, use_lower):
    case = make_case(tree=tree, **shape)
    torch.testing.assert_close(run_kernel(case, use_lower), run_reference(case, use_lower), rtol=1e-5, atol=1e-5)


def test_upper_only_reads_no_lower_bits_and_differs_from_upper_plus_lower():
    case = make_case()
    full, upper = run_kernel(case, True), run_kernel(case, False)
    assert not torch.allclose(full, upper)
    garbled = dict(case, cache=dict(case["cache"], k_lower=torch.randint_like(case["cache"]["k_lower"], 256),
                                    v_lower=torch.randint_like(case["cache"]["v_lower"], 256)))
    assert torch.equal(run_kernel(garbled, False), upper)


def test_each_query_reads_its_own_boundary():
    # Moving one query's boundary changes that query's output only.
    case = make_case(n=3)
    base = run_kernel(case, True)
    moved = case["quant_len"].clone()
    moved[0, 2] -= case["key_group"]
    other = run_kernel(dict(case, quant_len=moved), True)
    changed = (other - base).abs().amax(dim=-1) > 0  # [B, Hq, n]
    assert changed[0, :, 2].all() and not changed[0, :, :2].any() and not changed[1:].any()


@pytest.mark.parametrize("n,shape", [(3, dict()), (40, dict()),
                                     (5, dict(Hq=8, Hkv=2, D=128, key_group=64, value_group=32,
                                              lengths=(150, 70, 130))),
                                     (5, dict(Hq=8, Hkv=2, D=64, key_group=16, value_group=8))])
def test_a_query_gives_the_same_bits_alone_or_in_a_batch(n, shape):
    # Query i of a forward over n new tokens and the same token decoded alone (n = 1, its
    # predecessors committed) read the same tokens from the same places: equal to the bit, which is
    # what makes speculative verification on this cache equal to autoregressive decoding.
    case = make_case(n=n, capacity=192, F=96, **shape)
    together = run_kernel(case, True)
    for i in range(n):
        alone = dict(case, q=case["q"][:, :, i : i + 1].contiguous(), quant_len=case["quant_len"][:, i : i + 1],
                     lengths=case["lengths"] + i)
        assert torch.equal(run_kernel(alone, True)[:, :, 0], together[:, :, i]), i


def test_half_precision_query_returns_its_dtype():
    case = make_case()
    out = run_kernel(dict(case, q=case["q"].to(torch.bfloat16)), True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), run_reference(dict(case, q=case["q"].to(torch.bfloat16).float()), True),
                               rtol=2e-2, atol=2e-2)


def test_bad_inputs_raise_naming_the_input():
    case = make_case()
    bad = case["quant_len"].clone()
    bad[1, 0] = 10_000
    with pytest.raises(RuntimeError, match="quant_len"):
        run_kernel(dict(case, quant_len=bad), True)
    with pytest.raises(RuntimeError, match="buffer"):
        run_kernel(dict(case, lengths=case["lengths"] + 100), True)
    with pytest.raises(RuntimeError, match="k_buffer"):
        run_kernel(dict(case, k_buffer=case["k_buffer"][:, :, :, :8].contiguous()), True)
    with pytest.raises(RuntimeError, match="KV heads"):
        run_kernel(dict(case, q=torch.randn(3, 3, 3, 16)), True)
    with pytest.raises(RuntimeError, match="tree_mask"):
        run_kernel(dict(case, tree_mask=torch.ones(3, 2, 2, dtype=torch.bool)), True)


def test_opcheck():
    for tree in (False, True):
        c = make_case(tree=tree)
        out = torch.empty_like(c["q"])
        args = (c["q"], *(c["cache"][k] for k in ("k_upper", "k_lower", "k_scale", "k_zero", "v_upper", "v_lower",
                                                   "v_scale", "v_zero")),
                c["k_buffer"], c["v_buffer"], c["quant_len"], c["buffer_start"], c["lengths"], c["tree_mask"],
                c["key_group"], c["value_group"], True, 0.25, out)
        torch.library.opcheck(torch.ops.specdec.quant_kv_attention.default, args)


@pytest.mark.cuda
@pytest.mark.parametrize("use_lower", [True, False])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("shape", [dict(), dict(B=2, Hq=32, Hkv=8, n=4, D=128, capacity=256, key_group=64,
                                                value_group=32, F=200)])
def test_cuda_equals_cpu(shape, tree, use_lower):
    cpu = make_case(tree=tree, **shape)
    cuda = make_case(tree=tree, device="cuda", **shape)
    torch.testing.assert_close(run_kernel(cuda, use_lower).cpu(), run_kernel(cpu, use_lower), rtol=1e-4, atol=1e-4)


def test_portable_kernel_matches_reference_on_an_avx512_machine():
    # SPECDEC_CPU_ISA=baseline picks the portable kernel (read once at load: a fresh process); the
    # default run above takes the AVX-512 one where the CPU has it.
    import os

    from _isolated import run_capped

    code = ("import sys; sys.path.insert(0, %r); import test_quant_attention as t; "
            "c = t.make_case(B=2, Hq=8, Hkv=2, n=5, D=128, capacity=192, key_group=64, value_group=32, F=96, "
            "lengths=(150, 130)); import torch; "
            "torch.testing.assert_close(t.run_kernel(c, True), t.run_reference(c, True), rtol=1e-5, atol=1e-5)"
            % os.path.dirname(os.path.abspath(__file__)))
    run_capped("baseline", code, timeout=300)
