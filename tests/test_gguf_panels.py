"""GGUF weights in panels of 16 rows (``gguf_repack_panels``, csrc/kernels/gguf/panels.h), the
layout a model decodes from where ``panels_pay()``: the k-quants on the Q8K kernel, the legacy
formats on the lanes kernel in Q8's order, at every row count.

Checked, for every format: the repack equals ``reference.gguf.to_panels`` byte for byte and turns
back exactly; in every activations mode ``gguf_linear`` on panels gives the bits of the file's
blocks (the int8 modes read them natively on a VNNI CPU, a prompt's AMX tiles on an AMX CPU, the
others through the file's order),
also where a chunk of rows starts inside a group (a legacy part of 8 rows first) and on the
portable tier; "q8k_q8" runs legacy parts in Q8; dequantisation, row lookups and a draft
vocabulary's rows read panels; ``gguf_matmul`` refuses them with a message that names the way back.
"""

from __future__ import annotations

import pytest
import torch

from _gguf_testlib import random_blocks
from _isolated import run_capped
from specdec_cuda.models.draft_vocab import gguf_rows_of
from specdec_cuda.ops import gguf as g
from specdec_cuda.reference import gguf as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

gguf = pytest.importorskip("gguf")
Q4_K, Q6_K, Q5_0, Q8_0, Q4_1 = 12, 14, 6, 8, 3
NAMES = {Q4_K: "Q4_K", Q6_K: "Q6_K", Q8_0: "Q8_0", Q5_0: "Q5_0", Q4_1: "Q4_1"}
FORMATS = pytest.mark.parametrize("qtype", list(NAMES), ids=list(NAMES.values()))


def file_weight(qtype: int, n: int, k: int, seed: int) -> g.GgufWeight:
    return g.gguf_weight(torch.from_numpy(random_blocks(qtype, n, k, seed=seed)), qtype, (n, k))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@FORMATS
def test_repack_equals_the_reference_and_turns_back(qtype):
    w = file_weight(qtype, 48, 768, seed=1)
    p = g.gguf_repack_panels(w)
    assert p.qtype == ref.PANELS[qtype] == 512 + qtype and p.data.shape == w.data.shape
    assert torch.equal(p.data, ref.to_panels(w.data, qtype))
    assert torch.equal(ref.from_panels(p.data, p.qtype), w.data)
    back = g.gguf_repack_panels(p, inverse=True)
    assert back.qtype == qtype and torch.equal(back.data, w.data)
    assert torch.equal(g.gguf_dequantize(p), ref.dequantize(w.data, qtype, 48, 768))


def test_what_panels_cannot_hold_is_returned_as_it_is():
    odd = file_weight(Q4_K, 20, 256, seed=2)  # not whole groups of 16 rows
    lanes = g.gguf_repack_lanes(file_weight(Q4_K, 16, 256, seed=2))
    assert g.gguf_repack_panels(odd) is odd and g.gguf_repack_panels(lanes) is lanes
    assert g.gguf_repack_panels(odd, inverse=True) is odd  # already the file's order


@FORMATS
@pytest.mark.parametrize("mode", ["float32", "q8", "q8k", "q8k_q8", "bf16"])
def test_linear_on_panels_gives_the_file_blocks_bits(qtype, mode):
    if mode == "bf16" and not g.bf16_tiles_available():
        pytest.skip("the AMX prefill kernel needs AMX-BF16")
    k = 512
    w = file_weight(qtype, 64, k, seed=3)
    legacy = file_weight(Q5_0, 8, k, seed=4)  # 8 rows first: chunks of rows start inside a group
    p = g.gguf_repack_panels(w)
    gen = torch.Generator().manual_seed(qtype)
    for m in (1, 2, 5, 9, 17, 40):  # the tiles: one x block, several, and pairs with a block missing
        x = torch.randn(m, k, generator=gen)
        want = g.gguf_linear(x, g.GgufLinear.of(legacy, w), activations=mode)
        got = g.gguf_linear(x, g.GgufLinear.of(legacy, p), activations=mode)
        assert torch.equal(bits(got), bits(want)), (mode, m)
        kquant = qtype in (Q4_K, Q6_K)
        spec = ref.matmul_q8k if mode == "q8k" or (mode == "q8k_q8" and kquant) else ref.matmul_q8
        if mode not in ("float32", "bf16"):  # bf16: tests/test_gguf_tiles.py holds the file order to its contract
            assert torch.equal(bits(got[:, 8:]), bits(spec(x, w.data, qtype, 64))), (mode, m)


def test_q8k_q8_runs_legacy_parts_in_q8():
    k = 512
    legacy, w = file_weight(Q5_0, 16, k, seed=5), g.gguf_repack_panels(file_weight(Q4_K, 32, k, seed=6))
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(5))
    y = g.gguf_linear(x, g.GgufLinear.of(legacy, w), activations="q8k_q8")
    assert torch.equal(bits(y[:, :16]), bits(ref.matmul_q8(x, legacy.data, Q5_0, 16)))
    assert torch.equal(bits(y[:, 16:]), bits(ref.matmul_q8k(x, ref.from_panels(w.data, w.qtype), Q4_K, 32)))


def test_the_portable_tier_reads_panels_with_the_same_bits():
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(7))
    raws = {qtype: file_weight(qtype, 32, 512, seed=8).data for qtype in NAMES}
    code = ("import sys, torch; from specdec_cuda.ops import gguf as g\n"
            "io = torch.load(sys.argv[1])\n"
            "lin = lambda q, raw: g.GgufLinear.of(g.gguf_repack_panels(g.gguf_weight(raw, q, (32, 512))))\n"
            "io['y'] = {(q, mode): g.gguf_linear(io['x'], lin(q, raw), activations=mode)\n"
            "           for q, raw in io['raws'].items() for mode in ('q8k_q8', 'q8k')}\n"
            "torch.save(io, sys.argv[1])\n")
    out = run_capped("avx2", code, payload={"x": x, "raws": raws})
    for qtype, raw in raws.items():
        decoding = ref.matmul_q8k if qtype in (Q4_K, Q6_K) else ref.matmul_q8
        assert torch.equal(bits(out["y"][qtype, "q8k_q8"]), bits(decoding(x, raw, qtype, 32))), qtype
        assert torch.equal(bits(out["y"][qtype, "q8k"]), bits(ref.matmul_q8k(x, raw, qtype, 32))), qtype


@FORMATS
def test_rows_and_a_draft_vocabulary_read_panels(qtype):
    w = file_weight(qtype, 64, 256, seed=9)
    p = g.gguf_repack_panels(w)
    index = torch.tensor([[3, 40], [63, 3]])
    assert torch.equal(g.gguf_rows(p, index), g.gguf_rows(w, index))
    ids = torch.arange(0, 64, 2)  # 32 rows: whole groups again, so the subset is in panels too
    sub = gguf_rows_of(g.GgufLinear.of(p, activations="q8k_q8"), ids)
    assert sub.parts[0].qtype == p.qtype
    assert torch.equal(g.gguf_dequantize(sub.parts[0]), g.gguf_dequantize(w)[ids])


def test_gguf_matmul_refuses_panels():
    p = g.gguf_repack_panels(file_weight(Q4_K, 16, 256, seed=10))
    with pytest.raises(RuntimeError, match="panel layout.*gguf_repack_panels"):
        g.gguf_matmul(torch.randn(1, 256), p)
