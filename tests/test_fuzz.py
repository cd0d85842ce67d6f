"""Fuzz / property suite: seeded random inputs for every op.

* Valid inputs: each op against its plain-PyTorch reference, integer outputs exactly (tokens,
  statuses, tree layouts, 4-bit codes), floats bit for bit where the kernels promise it.
* Invalid inputs (shapes, dtypes, ranges, extreme values, malformed trees, corrupt checkpoints):
  each must end in a Python exception that names something, or in a documented per-row status —
  never a crash. They run in a child process (tests/_isolated.py), so a crash fails the test.

Every case is drawn from a fixed seed, so a failure reproduces. The amount is scaled by
SPECDEC_FUZZ_SCALE (default 1, the CI setting, well under two minutes on two cores; e.g.
SPECDEC_FUZZ_SCALE=20 for a long local run) and the seed by SPECDEC_FUZZ_SEED (default 0).
"""

from __future__ import annotations

import os
import random
from textwrap import dedent

import pytest
import torch

import specdec_cuda.ops as ops
from specdec_cuda.ops import kv_quant as kvops
from specdec_cuda.reference import kv_quant as kvref
from specdec_cuda.reference import quant as qref
from specdec_cuda.reference import sampling as sref
from specdec_cuda.reference import tree as tref

from _isolated import run_isolated

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

SCALE = max(1, int(os.environ.get("SPECDEC_FUZZ_SCALE", "1")))
SEED = int(os.environ.get("SPECDEC_FUZZ_SEED", "0"))
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Every fuzz test runs on the CPU and, where a GPU is present, on CUDA (its name then says cuda, so
# bench/gpu_check.sh's compute-sanitizer steps, which select -k cuda, include it).
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]


def on(device, *tensors):
    """The tensors moved to ``device`` (None stays None); a dict's tensor values likewise."""
    moved = [t.to(device) if isinstance(t, torch.Tensor) else
             ({k: v.to(device) for k, v in t.items()} if isinstance(t, dict) else t) for t in tensors]
    return moved[0] if len(moved) == 1 else moved


def dtypes_for(device):
    return DTYPES if device == "cpu" else DTYPES[:3]  # float64 logits are CPU-only


def rng(name: str) -> random.Random:
    return random.Random(f"{SEED}:{name}")


def logits_like(r: random.Random, rows: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Random logits: sometimes peaked, sometimes with -inf entries (never a whole row)."""
    gen = torch.Generator().manual_seed(r.getrandbits(32))
    x = torch.randn(rows, vocab, generator=gen) * r.choice([0.5, 2.0, 8.0])
    if r.random() < 0.3 and vocab > 1:
        x[torch.rand(rows, vocab, generator=gen) < 0.3] = -float("inf")
        x[:, r.randrange(vocab)] = 0.0
    return x.to(dtype)


def row_params(r: random.Random, batch: int, vocab: int) -> dict:
    return dict(
        temperature=torch.tensor([r.choice([0.0, 0.0, 0.6, 1.0, 2.5]) for _ in range(batch)],
                                 dtype=torch.float32),
        top_k=torch.tensor([r.choice([0, -1, 1, 3, vocab, vocab + 4]) for _ in range(batch)],
                           dtype=torch.int32),
        top_p=torch.tensor([r.choice([1.0, 1.0, 0.9, 0.3, 1e-6]) for _ in range(batch)], dtype=torch.float32),
        seed=torch.tensor([r.randint(I64_MIN, I64_MAX) for _ in range(batch)], dtype=torch.int64),
        position=torch.tensor([r.randint(0, 2**40) for _ in range(batch)], dtype=torch.int64),
    )


def random_tree(r: random.Random, n: int) -> list[int]:
    return [-1] + [r.randrange(v) if r.random() < 0.7 else v - 1 for v in range(1, n)]


# ---- valid inputs against the references --------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_sample_matches_reference(device):
    r = rng("sample")
    for _ in range(6 * SCALE):
        rows, vocab = r.randint(1, 6), r.choice([1, 2, 7, 111, 300])
        logits = logits_like(r, rows, vocab, r.choice(dtypes_for(device)))
        p = row_params(r, rows, vocab)
        got = ops.sample(on(device, logits), **on(device, p))
        want = sref.sample(logits, p["temperature"], p["top_k"], p["top_p"], p["seed"], p["position"])
        assert torch.equal(got.tokens.cpu(), want[0]) and torch.equal(got.status.cpu(), want[1]), (vocab, p)


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_verify_chain_matches_reference(device):
    r = rng("verify_chain")
    for _ in range(6 * SCALE):
        batch, vocab = r.randint(0, 5), r.choice([2, 7, 111])
        ks = [r.randint(0, 4) for _ in range(batch)]
        cu = torch.tensor([0] + [sum(ks[:i + 1]) for i in range(batch)], dtype=torch.int64)
        n = int(cu[-1])
        dtype = r.choice(dtypes_for(device))
        target = logits_like(r, n + batch, vocab, dtype)
        draft_logits = logits_like(r, n, vocab, dtype) if r.random() < 0.5 else None
        # drafts: the target's argmax half of the time (so chains get accepted), else random
        arg = target.float().argmax(-1)
        drafts = torch.tensor([int(arg[i + b]) if r.random() < 0.5 else r.randrange(vocab)
                               for b in range(batch) for i in range(int(cu[b]), int(cu[b + 1]))],
                              dtype=torch.int64)
        p = row_params(r, batch, vocab)
        typical = draft_logits is None and r.random() < 0.2
        strategy = r.choice(["auto", "parallel", "serial"])
        got = ops.verify_chain(*on(device, drafts, cu, target, draft_logits), **on(device, p),
                               typical=typical, strategy=strategy)
        want = sref.verify_chain(drafts, cu, target, draft_logits, p["temperature"], p["top_k"],
                                 p["top_p"], p["seed"], p["position"], typical)
        for name, w in zip(("tokens", "num_accepted", "accepted", "status"), want):
            assert torch.equal(getattr(got, name).cpu(), w.to(getattr(got, name).dtype)), (name, strategy)


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_build_and_verify_tree_match_reference(device):
    r = rng("tree")
    for _ in range(5 * SCALE):
        sizes = [r.randint(1, 12) for _ in range(r.randint(1, 5))]
        rows = [random_tree(r, n) for n in sizes]
        parents = torch.tensor([p for row in rows for p in row], dtype=torch.int64)
        cu = torch.tensor([0] + [sum(sizes[:i + 1]) for i in range(len(sizes))])
        batch, m = len(sizes), max(sizes) + r.randint(0, 2)
        cache_len = torch.tensor([r.randint(0, 20) for _ in range(batch)])
        hf = r.choice([None, torch.float32, torch.bfloat16])
        prefix = r.randint(0, 24)
        got = ops.build_tree(*on(device, parents, cu, cache_len), m, hf_mask_dtype=hf, max_prefix=prefix,
                             check=False)
        want = tref.build_tree(parents, cu, cache_len, m, hf, prefix)
        for name in ("depth", "positions", "tree_mask", "packed_mask", "first_child", "next_sibling",
                     "status"):
            assert torch.equal(getattr(got, name).cpu(), want[name]), name
        if hf is not None:
            assert torch.equal(got.hf_mask.cpu(), want["hf_mask"])

        vocab, dtype = r.choice([5, 33]), r.choice(dtypes_for(device))
        n = int(cu[-1])
        target = logits_like(r, n, vocab, dtype)
        draft = logits_like(r, n, vocab, dtype) if r.random() < 0.5 else None
        tokens = torch.tensor([r.randrange(vocab) for _ in range(n)])
        p = row_params(r, batch, vocab)
        got = ops.verify_tree(*on(device, tokens, parents, cu, target, draft), **on(device, p), max_nodes=m)
        want = tref.verify_tree(tokens, parents, cu, target, draft, p["temperature"], p["top_k"],
                                p["top_p"], p["seed"], p["position"], m)
        for name, w in zip(("tokens", "accepted_nodes", "num_accepted", "status"), want):
            assert torch.equal(getattr(got, name).cpu(), w), name


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_compact_kv_matches_reference(device):
    r = rng("compact")
    for _ in range(6 * SCALE):
        batch, heads, slots, d = r.randint(1, 4), r.randint(1, 3), r.randint(2, 24), r.choice([1, 3, 8])
        width = r.randint(1, 6)
        nodes = torch.full((batch, width), -1, dtype=torch.int64)
        num_acc, src, dst = [], [], []
        for b in range(batch):
            s = r.randint(0, slots - 1)
            room = slots - s
            count = r.randint(1, min(width, room))
            path = sorted(r.sample(range(room), count)) if r.random() < 0.8 else []
            if path:
                nodes[b, :count] = torch.tensor(path)
            num_acc.append(max(count - 1, 0))
            src.append(s)
            dst.append(r.randint(0, s))
        caches = [torch.randn(batch, heads, slots, d) for _ in range(r.randint(1, 3))]
        want = [c.clone() for c in caches]
        caches = [c.to(device) for c in caches]
        status = ops.compact_kv(caches, *on(device, nodes, torch.tensor(num_acc), torch.tensor(src),
                                            torch.tensor(dst)))
        tref.compact_kv(want, nodes, torch.tensor(num_acc), torch.tensor(src), torch.tensor(dst))
        assert status.eq(0).all()
        for c, w in zip(caches, want):
            assert torch.equal(c.cpu(), w)


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_w4_matches_reference(device):
    r = rng("w4")
    for _ in range(4 * SCALE):
        n, k = r.randint(1, 70), 32 * r.randint(1, 6)
        group = r.choice([-1] + [g for g in (32, 64, 96, 128) if k % g == 0])
        gen = torch.Generator().manual_seed(r.getrandbits(32))
        w = torch.randn(n, k, generator=gen)
        dtype = r.choice([torch.float32, torch.bfloat16, torch.float16] if device == "cpu" else
                         [torch.bfloat16, torch.float16])
        q = ops.quantize_w4(w, group, device=device, scale_dtype=None if device == "cpu" else dtype)
        codes, scales = qref.quantize_w4(w, group)
        g = qref.resolve_group_size(k, group)
        if device == "cpu":  # (CUDA scales are 16-bit: compared through the matmul below)
            assert torch.equal(ops.w4_dequantize(q), qref.dequantize_w4(codes, scales, g))
        x = torch.randn(r.choice([1, 3, 17, 70]), k, generator=gen).to(dtype)
        want = qref.w4a16_matmul(x, codes, scales.to(q.scales.dtype).float(), g)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(ops.w4a16_matmul(x.to(device), q).cpu(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_kv_quant_matches_reference_with_non_finite(device):
    r = rng("kv_quant")
    for _ in range(5 * SCALE):
        b, h, d = r.randint(1, 3), r.randint(1, 3), 2 * r.randint(1, 12)
        kg = r.choice([1, 2, 8, 32])
        vg = r.choice([g for g in range(2, d + 1, 2) if d % g == 0])
        groups = r.randint(1, 3)
        cap = kg * (groups + r.randint(0, 2))
        t = kg * groups
        start = kg * r.randint(0, cap // kg - groups)
        gen = torch.Generator().manual_seed(r.getrandbits(32))
        dtype = r.choice([torch.float32, torch.float16, torch.bfloat16])
        k = (torch.randn(b, h, t, d, generator=gen) * r.choice([1e-3, 1.0, 1e3])).to(dtype)
        v = (torch.randn(b, h, t, d, generator=gen) * r.choice([1e-3, 1.0, 1e3])).to(dtype)
        for x in (k, v):
            for _ in range(r.randint(0, 3)):  # NaN / inf at random places
                x[r.randrange(b), r.randrange(h), r.randrange(t), r.randrange(d)] = r.choice(
                    [float("nan"), float("inf"), -float("inf")])
        c = kvops.allocate_kv_cache(b, h, cap, d, kg, vg, device=device)
        kvops.kv_quantize_keys(k.to(device), start, kg, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"])
        kvops.kv_quantize_values(v.to(device), start, vg, c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"])
        ku, kl, ks, kz = kvref.quantize_keys(k, kg)
        vu, vl, vs, vz = kvref.quantize_values(v, vg)
        on_device, c = c, {name: t.cpu() for name, t in c.items()}
        sl, gl = slice(start, start + t), slice(start // kg, start // kg + groups)
        exact = dict(rtol=0, atol=0, equal_nan=True)
        assert torch.equal(c["k_upper"][:, :, sl], ku) and torch.equal(c["k_lower"][:, :, sl], kl)
        assert torch.equal(c["v_upper"][:, :, sl], vu) and torch.equal(c["v_lower"][:, :, sl], vl)
        torch.testing.assert_close(c["k_scale"][:, :, gl], ks, **exact)
        torch.testing.assert_close(c["k_zero"][:, :, gl], kz, **exact)
        torch.testing.assert_close(c["v_scale"][:, :, sl], vs, **exact)
        torch.testing.assert_close(c["v_zero"][:, :, sl], vz, **exact)
        use_lower = r.random() < 0.5
        c = on_device
        out_k = kvops.kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], kg, cap,
                                         use_lower).cpu()
        out_v = kvops.kv_dequantize_values(c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"], vg, cap,
                                           use_lower).cpu()
        want_k = kvref.dequantize_keys(ku, kl if use_lower else None, ks, kz, kg)
        want_v = kvref.dequantize_values(vu, vl if use_lower else None, vs, vz, vg)
        torch.testing.assert_close(out_k[:, :, sl], want_k, **exact)
        torch.testing.assert_close(out_v[:, :, sl], want_v, **exact)
        # a NaN / inf input never reads back as a finite number
        assert torch.isnan(out_k[:, :, sl][~torch.isfinite(k.float())]).all()
        assert torch.isnan(out_v[:, :, sl][~torch.isfinite(v.float())]).all()


# ---- invalid inputs: an exception or a documented status, never a crash (child process) ---------

# What each random invalid call may end in: these exception types (with a message) or these
# per-row status codes. Anything else — a crash, another exception type, an empty message, an
# undocumented status, a write outside the request — fails.
CHILD_COMMON = f'''
import random
SEED, SCALE = {SEED}, {SCALE}
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
ALLOWED = ("RuntimeError", "ValueError", "TypeError", "IndexError")
DEV = "cpu"  # the invalid-input tests that run on CUDA too set it after this block

def dev(*ts):
    moved = [t.to(DEV) if isinstance(t, torch.Tensor) else t for t in ts]
    return moved[0] if len(moved) == 1 else moved

def extreme(r):
    return r.choice([-1, 0, 1, 2, 5, 64, 2**31 - 1, 2**31, 2**32 + 3, I64_MAX, I64_MAX - 1, I64_MIN,
                     I64_MIN + 1, -2**31, r.randint(I64_MIN, I64_MAX)])

def bad_logits(r, rows, vocab):
    kind = r.randrange(8)
    if kind == 0:
        return torch.randint(0, 5, (rows, vocab))                    # integer dtype
    if kind == 1:
        return torch.randn(rows, vocab, 2)                           # wrong rank
    if kind == 2:
        return torch.randn(rows + r.choice([-1, 1, 3]), vocab)       # wrong rows
    if kind == 3:
        return torch.randn(rows, 0)                                  # empty vocab
    if kind == 4:
        x = torch.randn(rows, vocab); x[r.randrange(rows)] = float("nan"); return x
    if kind == 5:
        x = torch.randn(rows, vocab); x[r.randrange(rows)] = -float("inf"); return x
    if kind == 6:
        return torch.randn(vocab, rows).t()                          # not contiguous
    return torch.randn(rows, vocab).to(torch.bool)
'''


def _check_records(records, statuses):
    assert records, "the child ran no case"
    for rec in records:
        if rec["raised"] is not None:
            assert rec["raised"] in ("RuntimeError", "ValueError", "TypeError", "IndexError"), rec
            assert len(rec["message"]) > 10, rec
            # a device fault surfaces as a RuntimeError too: never an acceptable answer
            assert not any(word in rec["message"] for word in (
                "CUDA error", "illegal memory access", "device-side assert", "misaligned address")), rec
        else:
            assert rec["result"]["ok"], rec
            assert set(rec["result"]["status"]) <= statuses, rec


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_invalid_sampling_inputs_never_crash(device):
    records = run_isolated(CHILD_COMMON + f"DEV = {device!r}\n" + dedent('''
    r = random.Random(f"{SEED}:bad_sampling")
    def run_sample(logits, params):
        out = ops.sample(dev(logits), **{k: dev(v) for k, v in params.items()})
        ok = bool(((out.tokens >= -1) & (out.tokens < max(logits.shape[-1], 1))).all())
        ok &= bool((out.tokens[out.status != 0] == -1).all())
        return {"ok": ok, "status": sorted(set(out.status.tolist()))}

    def run_chain(drafts, cu, target, draft_logits, max_draft, strategy):
        out = ops.verify_chain(*dev(drafts, cu, target, draft_logits), temperature=r.choice([0.0, 1.0]),
                               max_draft=max_draft, strategy=strategy)
        flagged = out.status != 0
        ok = bool((out.tokens[flagged] == -1).all()) and bool((out.num_accepted[flagged] == 0).all())
        return {"ok": ok, "status": sorted(set(out.status.tolist()))}

    for i in range(40 * SCALE):
        rows, vocab = r.randint(1, 4), r.choice([1, 3, 50])
        logits = bad_logits(r, rows, vocab) if r.random() < 0.5 else torch.randn(rows, vocab)
        params = {}
        for name in r.sample(["temperature", "top_k", "top_p", "seed", "position"], r.randint(0, 3)):
            params[name] = r.choice([
                float("nan"), -1.0, float("inf"), 0.0, 1e-30, 2.0, extreme(r),
                torch.tensor([extreme(r)] * rows), torch.randn(rows + 1), "x", None, True,
                torch.tensor([float("nan")] * rows)])
        case(f"sample-{i}", lambda: run_sample(logits, params))

    for i in range(40 * SCALE):
        batch, vocab = r.randint(0, 3), r.choice([2, 20])
        n = r.randint(0, 6)
        cu = torch.tensor([0] + sorted(r.randint(0, n) for _ in range(max(batch - 1, 0))) + ([n] if batch else []))
        if r.random() < 0.6 and cu.numel() > 1:
            cu[r.randrange(cu.numel())] = extreme(r)
        drafts = torch.tensor([r.choice([r.randrange(vocab), extreme(r)]) for _ in range(n)], dtype=torch.int64)
        target = torch.randn(n + batch, vocab) if r.random() < 0.8 else bad_logits(r, n + batch, vocab)
        draft_logits = r.choice([None, torch.randn(n, vocab), torch.randn(n, vocab + 1), torch.randn(n, vocab).half()])
        max_draft = r.choice([None, 0, 1, 4, 8, -1])
        strategy = r.choice(["auto", "parallel", "serial"])
        case(f"chain-{i}", lambda: run_chain(drafts, cu, target, draft_logits, max_draft, strategy))
    '''))
    _check_records(records, {0, 1, 2, 3})


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_invalid_tree_inputs_never_crash(device):
    records = run_isolated(CHILD_COMMON + f"DEV = {device!r}\n" + dedent('''
    r = random.Random(f"{SEED}:bad_tree")

    def parents_and_cu():
        sizes = [r.randint(0, 6) for _ in range(r.randint(1, 4))]
        parents = [r.choice([-1, r.randint(-3, 8), extreme(r)]) if r.random() < 0.3 else (v - 1 if v else -1)
                   for n in sizes for v in range(n)]
        cu = [0]
        for n in sizes:
            cu.append(cu[-1] + n)
        if r.random() < 0.4:
            cu[r.randrange(len(cu))] = extreme(r)
        return torch.tensor(parents, dtype=torch.int64), torch.tensor(cu)

    def run_build():
        parents, cu = parents_and_cu()
        batch = cu.numel() - 1
        # (no mid-sized extremes: a cache_len of 2**31 with max_prefix=None would honestly allocate
        # a mask of gigabytes; the int64 ends and negatives must be refused or flagged)
        cache_len = torch.tensor([r.choice([0, 3, -5, I64_MAX, I64_MAX - 1, I64_MIN]) for _ in range(batch)])
        hf = r.choice([None, torch.float16, torch.float64])
        out = ops.build_tree(*dev(parents, cu, cache_len), r.choice([None, 1, 4, 8]), hf_mask_dtype=hf,
                             max_prefix=r.choice([None, 0, 5]), check=False)
        ok = bool((out.depth[out.status != 0] == -1).all())
        return {"ok": ok, "status": sorted(set(out.status.tolist()))}

    def run_verify():
        parents, cu = parents_and_cu()
        n, batch, vocab = parents.numel(), cu.numel() - 1, r.choice([3, 17])
        tokens = torch.tensor([r.choice([r.randrange(vocab), extreme(r)]) for _ in range(n)], dtype=torch.int64)
        target = torch.randn(max(n, 1) if r.random() < 0.9 else n + 2, vocab)
        if r.random() < 0.3 and n:
            target[r.randrange(n)] = float("nan")
        draft = r.choice([None, torch.randn(target.shape[0], vocab)])
        out = ops.verify_tree(*dev(tokens, parents, cu, target, draft), temperature=r.choice([0.0, 0.7, -1.0]),
                              top_p=r.choice([1.0, 0.0, 0.5]), max_nodes=r.choice([None, 1, 6]), check=False)
        flagged = out.status != 0
        ok = bool((out.tokens[flagged] == -1).all())
        return {"ok": ok, "status": sorted(set(out.status.tolist()))}

    def run_compact():
        batch, width, slots = r.randint(1, 3), r.randint(1, 4), r.randint(1, 10)
        nodes = torch.tensor([[r.choice([-1, 0, 1, 2, 5, 9, extreme(r)]) for _ in range(width)] for _ in range(batch)])
        num_acc = torch.tensor([r.choice([0, 1, 2, 3, extreme(r)]) for _ in range(batch)])
        src = torch.tensor([r.choice([0, 1, 4, extreme(r)]) for _ in range(batch)])
        dst = torch.tensor([r.choice([0, 1, extreme(r)]) for _ in range(batch)])
        cache = dev(torch.randn(batch, 2, slots, 3))
        before = cache.clone()
        status = ops.compact_kv([cache], *dev(nodes, num_acc, src, dst), check=False).cpu()
        # a flagged row, or one whose path starts with -1, is left exactly as it was
        untouched = (status != 0) | (nodes[:, 0] < 0)
        ok = bool((cache.cpu()[untouched] == before.cpu()[untouched]).all())
        return {"ok": ok, "status": sorted(set(status.tolist()))}

    for i in range(30 * SCALE):
        case(f"build-{i}", run_build)
        case(f"verify-{i}", run_verify)
        case(f"compact-{i}", run_compact)
    '''))
    _check_records(records, {0, 1, 2, 3, 4, 5})  # 5: compact_kv's STATUS_BAD_COMPACTION


def test_fuzz_invalid_quant_inputs_never_crash(tmp_path):
    records = run_isolated(CHILD_COMMON + dedent(f'''
    from specdec_cuda.ops import kv_quant as kvops
    from specdec_cuda.models import QuantKVCache
    from specdec_cuda.quant import W4Linear
    from specdec_cuda.models.loader import load
    from pathlib import Path
    r = random.Random(f"{{SEED}}:bad_quant")
    tmp = Path({str(tmp_path)!r})

    def run_w4():
        k = r.choice([32, 64])
        q = ops.quantize_w4(torch.randn(r.randint(1, 20), k), r.choice([32, -1]))
        x = r.choice([torch.randn(2, k), torch.randn(2, k + 32), torch.randint(0, 3, (2, k)),
                      torch.ones(2, k, dtype=torch.bool), torch.randn(k), torch.randn(2, k).double()])
        if r.random() < 0.3:
            q = q._replace(group_size=r.choice([0, -2, 16, 33, extreme(r)]))
        if r.random() < 0.3:
            q = q._replace(packed=q.packed[:, :-1] if r.random() < 0.5 else q.packed.to(torch.int32))
        out = ops.w4a16_matmul(x, q)
        return {{"ok": bool(out.is_floating_point()), "status": []}}

    def run_kv():
        b, h, cap, d = r.randint(1, 2), 1, r.choice([0, 32, 64]), r.choice([2, 8])
        kg, vg = r.choice([0, 1, 3, 32, -32, 64]), r.choice([0, 2, 3, 8, -2])
        c = {{n: torch.zeros(1) for n in ("k_upper", "k_lower", "k_scale", "k_zero", "v_upper", "v_lower",
                                           "v_scale", "v_zero")}}
        try:
            c = kvops.allocate_kv_cache(b, h, cap, d, max(kg, 1), max(vg, 2))
        except ValueError:
            pass
        before = {{n: t.clone() for n, t in c.items()}}
        x = torch.randn(r.choice([b, b + 1]), h, r.choice([0, 1, 32, 64, 96]), r.choice([d, d + 2, 3]))
        start = r.choice([0, 32, extreme(r), torch.tensor([extreme(r)] * b)])
        try:
            if r.random() < 0.5:
                kvops.kv_quantize_keys(x, start, kg, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"])
            else:
                kvops.kv_quantize_values(x, start, vg, c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"])
        except Exception:
            # a rejected call must not have written anything
            assert all(torch.equal(before[n], c[n]) for n in c), "cache written by a rejected call"
            raise
        out = kvops.kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], kg,
                                       r.choice([0, 16, 32, cap + 32]))
        return {{"ok": True, "status": []}}

    def run_cache():
        cache = QuantKVCache(1, 2, 1, 64, 8, key_group=16, value_group=8, residual=4)
        op = r.randrange(4)
        if op == 0:
            cache.truncate(r.choice([[1], [1, 2, 3], torch.tensor([1.5, 0.5]), "ab", torch.tensor([[0, 0]]),
                                     [extreme(r), 0], [-1, 0]]))
        elif op == 1:
            cache.commit(r.choice([[1], [1, 2, 3], torch.tensor([1.5, 0.5]), "ab", [extreme(r), 0], [-1, 0]]))
        elif op == 2:
            QuantKVCache(*r.choice([(1, 2, 1, 64, 7), (0, 2, 1, 64, 8), (1, 2, 1, -1, 8),
                                    (1, 2, 1, 64, 8.0)]), key_group=r.choice([16, 0, -16]))
        else:
            cache.begin_forward(r.choice([65, extreme(r)]))
        return {{"ok": True, "status": []}}

    def run_checkpoint(i):
        folder = tmp / f"ckpt{{i}}"
        folder.mkdir()
        kind = r.randrange(5)
        config = {{"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
                   "num_hidden_layers": 1, "num_attention_heads": 2}}
        if kind == 0:
            (folder / "config.json").write_bytes(bytes(r.getrandbits(8) for _ in range(40)))
        else:
            if kind == 1:
                config[r.choice(list(config))] = r.choice([0, -3, None, "x", 2.5, [1]])
            (folder / "config.json").write_text(json.dumps(config))
        if kind == 2:
            (folder / "model.safetensors.index.json").write_text(r.choice(["{{", "[]", '{{"weight_map": 3}}']))
        elif kind == 3:
            (folder / "model.safetensors").write_bytes(bytes(r.getrandbits(8) for _ in range(64)))
        elif kind == 4:
            (folder / "model.safetensors").write_bytes((2**60).to_bytes(8, "little") + b"{{}}")
        load(folder)
        return {{"ok": True, "status": []}}

    for i in range(25 * SCALE):
        case(f"w4-{{i}}", run_w4)
        case(f"kv-{{i}}", run_kv)
        case(f"cache-{{i}}", run_cache)
        case(f"checkpoint-{{i}}", lambda: run_checkpoint(i))
    '''))
    # a checkpoint that is simply missing its weights is a FileNotFoundError: allowed here too
    for rec in records:
        if rec["raised"] == "FileNotFoundError":
            rec["raised"] = "ValueError"
        if rec["raised"] == "UnsupportedModelError":
            rec["raised"] = "ValueError"
    _check_records(records, set())
