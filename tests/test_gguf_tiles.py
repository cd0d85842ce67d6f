"""The GGUF prefill kernel on AMX tiles (``gguf_linear(..., activations="bf16")``,
csrc/kernels/gguf/bf16_amx.h) and the model's use of the prompt's kernels (``LlamaModel.forward(
prefill=True)``: the tiles, or the Q8K kernel of test_gguf_q8k.py on a VNNI CPU without AMX).

Checked: every weight enters the products as its dequantised value rounded to bfloat16, exactly
(one-hot rows read it back), and a product equals the float64 product of the bfloat16-rounded
inputs to float32 summation error; each row's bits do not depend on the other rows, their number,
the weight's parts or the thread count; a model prefills on its prompt kernels only when asked, at
least ``TILE_PREFILL_MIN_ROWS`` rows; greedy speculative decoding stays token for token
autoregressive decoding with long prompts (which take them); without AMX the mode is refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec_cuda
from _gguf_testlib import random_blocks
from _isolated import run_capped
from specdec_cuda import models
from specdec_cuda.models.llama import TILE_PREFILL_MIN_ROWS
from specdec_cuda.ops import gguf as g

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
FORMATS = [Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K]
ODD_K = {Q.Q4_1: 224, Q.Q5_0: 224, Q.Q8_0: 224, Q.Q4_K: 768, Q.Q6_K: 768}
tiles = pytest.mark.skipif(not g.bf16_tiles_available(), reason="no AMX-BF16 on this CPU")
# A prompt's own kernels: AMX tiles, or the Q8K kernel on a VNNI CPU without AMX (test_gguf_q8k.py).
prefill_kernels = pytest.mark.skipif(not (g.bf16_tiles_available() or g.q8k_prefill_pays()),
                                     reason="neither AMX-BF16 nor VNNI on this CPU")


def linear(qtype, n: int, k: int, seed: int) -> tuple[g.GgufLinear, torch.Tensor]:
    """A random GGUF weight and its exact dequantised values (float32 [n, k])."""
    raw = random_blocks(qtype, n, k, seed=seed)
    w = g.gguf_weight(torch.from_numpy(raw), qtype, (n, k))
    return g.GgufLinear.of(w), torch.from_numpy(gguf.quants.dequantize(raw, qtype).astype(np.float32))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@tiles
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_weights_enter_as_their_bf16_rounding_and_products_sum_in_float32(qtype):
    n, k = 111, ODD_K[qtype]  # n: three groups of 32 rows and a partial one
    lin, dense = linear(qtype, n, k, seed=int(qtype))
    w_bf16 = dense.bfloat16().double()
    # One-hot rows: y[m, n] = 1 * W[n, m], a single product, so each weight's value shows exactly.
    assert torch.equal(g.gguf_linear(torch.eye(k), lin, activations="bf16").double(), w_bf16.T)
    for m in (1, 5, 17, 40):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        y = g.gguf_linear(x, lin, activations="bf16").double()
        xb = x.bfloat16().double()
        err = ((y - xb @ w_bf16.T).abs().max() / (xb.abs() @ w_bf16.abs().T).max()).item()
        assert err < 1e-6, (m, err)  # float32 sums of exact products (measured ~3e-8)
        # ... and not the unrounded activations' product: the rounding is there.
        assert (y - x.double() @ dense.double().T).abs().max() > 10 * (y - xb @ w_bf16.T).abs().max()


@pytest.mark.parametrize("mode", [pytest.param("bf16", marks=tiles), "q8k"])
def test_rows_parts_and_threads_do_not_change_the_bits(mode):
    # Both prompt kernels ("q8k": test_gguf_q8k.py; it runs on any CPU, its portable tier without VNNI).
    k = 256
    q, _ = linear(Q.Q4_K, 40, k, seed=1)
    v, _ = linear(Q.Q6_K, 72, k, seed=2)
    lin = g.GgufLinear.of(*q.parts, *v.parts)  # a chunk of 32 (16) rows spans both parts
    bias = torch.randn(112)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(37, k, generator=gen)
    alone = torch.cat([g.gguf_linear(x[i:i + 1], lin, bias, activations=mode) for i in range(37)])
    for m in (2, 4, 5, 16, 17, 33, 37):
        assert torch.equal(bits(g.gguf_linear(x[:m], lin, bias, activations=mode)), bits(alone[:m])), m
    perm = torch.randperm(37, generator=gen)
    assert torch.equal(bits(g.gguf_linear(x[perm], lin, bias, activations=mode)), bits(alone[perm]))
    # the parts one by one, the bias added after
    y_q = g.gguf_linear(x, q, activations=mode)
    y_v = g.gguf_linear(x, v, activations=mode)
    assert torch.equal(bits(torch.cat((y_q, y_v), 1) + bias), bits(alone))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = g.gguf_linear(x, lin, bias, activations=mode)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(bits(one), bits(alone))


def test_without_amx_the_mode_is_refused_by_name():
    code = ("import torch; from specdec_cuda.ops import gguf as g\n"
            "w = g.gguf_weight(torch.zeros(4, 144, dtype=torch.uint8), 'Q4_K', (4, 256))\n"
            "assert not g.bf16_tiles_available()\n"
            "try:\n"
            "    g.gguf_linear(torch.randn(2, 256), g.GgufLinear.of(w), activations='bf16')\n"
            "except ValueError as e:\n"
            "    assert 'AMX' in str(e), e\n"
            "else:\n"
            "    raise AssertionError('bf16 tiles ran under SPECDEC_CPU_ISA=avx2')\n")
    run_capped("avx2", code)
    with pytest.raises(ValueError, match="activations must be one of"):
        g.gguf_linear(torch.randn(2, 256), g.GgufLinear.of(
            g.gguf_weight(torch.zeros(4, 144, dtype=torch.uint8), "Q4_K", (4, 256))), activations="int4")


# ---- the model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from test_gguf_model import write_model

    path = tmp_path_factory.mktemp("tiles") / "model.gguf"
    write_model(path, "qwen2", seed=4)
    return path


def prefill_logits(model, tokens: torch.Tensor, prefill: bool) -> tuple[torch.Tensor, object]:
    cache = model.new_cache(tokens.shape[0], tokens.shape[1] + 8)
    out = model.forward(tokens, torch.arange(tokens.shape[1]).expand(tokens.shape), cache, prefill=prefill)
    return out.logits, cache


@prefill_kernels
def test_a_prefill_takes_its_kernels_only_when_asked_and_long_enough(model_path):
    model = models.load(model_path)
    gen = torch.Generator().manual_seed(5)
    long = torch.randint(0, 300, (1, TILE_PREFILL_MIN_ROWS + 9), generator=gen)
    plain, _ = prefill_logits(model, long, prefill=False)
    fast, cache = prefill_logits(model, long, prefill=True)
    assert not torch.equal(plain, fast)  # another numeric contract, as near the float32 products as Q8's:
    exact, _ = prefill_logits(models.load(model_path, gguf_activations="float32"), long, prefill=False)
    scale = exact.abs().max()
    err_tiles, err_q8 = ((fast - exact).abs().max() / scale).item(), ((plain - exact).abs().max() / scale).item()
    # AMX tiles: measured 0.074 against 0.149 (random weights, 2 layers); Q8K, x per 256 values
    # instead of 32, within a few times Q8's
    assert err_tiles <= (1 if g.bf16_tiles_available() else 4) * err_q8, (err_tiles, err_q8)
    # The prompt's K/V went in: the next token's logits follow from them.
    cache.commit(torch.tensor([long.shape[1]]))
    nxt = model.forward(long[:, :1], torch.tensor([[long.shape[1]]]), cache).logits
    assert torch.isfinite(nxt).all()
    # Short prompts, and a model told not to, keep the decoding kernels' bits.
    short = long[:, : TILE_PREFILL_MIN_ROWS - 1]
    assert torch.equal(prefill_logits(model, short, True)[0], prefill_logits(model, short, False)[0])
    model.fast_prefill = False
    assert torch.equal(prefill_logits(model, long, True)[0], plain)


@pytest.mark.parametrize("method, options", [("prompt_lookup", {}), ("draft", {"k": 3, "policy": "fixed"}),
                                             ("lookahead", {})])
def test_greedy_speculation_with_long_prompts_equals_autoregressive_decoding(model_path, method, options):
    # Prompts of 40+ tokens prefill on the tiles or the Q8K kernel where the CPU has them (and the
    # drafter's catch-up too); the verification rows run the decoding kernels either way.
    model = models.load(model_path)
    if method == "draft":
        options = {**options, "draft": models.load(model_path)}
    gen = torch.Generator().manual_seed(6)
    base = torch.randint(0, 300, (8,), generator=gen).tolist()
    prompts = [base * 6, torch.randint(0, 300, (41,), generator=gen).tolist()]
    expected = specdec_cuda.generate(model, prompts, method="autoregressive", max_new_tokens=20).tokens
    assert specdec_cuda.generate(model, prompts, method=method, max_new_tokens=20, **options).tokens == expected
    for i, p in enumerate(prompts):  # and one row alone: batch invariance of the tile prefill
        alone = specdec_cuda.generate(model, [p], method=method, max_new_tokens=20, **options).tokens
        assert alone == [expected[i]]
