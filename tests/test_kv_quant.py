"""Hierarchical 4-bit KV cache ops against reference/kv_quant.py, and their error bounds (the cache
itself, models.QuantKVCache, is tested in test_quantspec.py; attention over it in
test_quant_attention.py)."""

from __future__ import annotations

import pytest
import torch

from specdec_cuda.ops import kv_quant as kv
from specdec_cuda.reference import kv_quant as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def fill(cache, k, v, start, kg, vg):
    kv.kv_quantize_keys(k, start, kg, cache["k_upper"], cache["k_lower"], cache["k_scale"], cache["k_zero"])
    kv.kv_quantize_values(v, start, vg, cache["v_upper"], cache["v_lower"], cache["v_scale"], cache["v_zero"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,h,d,kg,vg", [(1, 1, 64, 32, 32), (3, 5, 128, 64, 64), (2, 3, 48, 16, 16)])
def test_codes_match_reference_exactly(dtype, b, h, d, kg, vg):
    torch.manual_seed(b * 100 + d)
    capacity = 4 * kg
    k = torch.randn(b, h, 2 * kg, d).to(dtype)
    v = torch.randn(b, h, 2 * kg, d).to(dtype) * 3
    v[0, 0, 1] = 0.5  # a constant value group: scale 0
    cache = kv.allocate_kv_cache(b, h, capacity, d, kg, vg)
    start = torch.tensor([kg * (i % 3) for i in range(b)])
    fill(cache, k, v, start, kg, vg)
    ku, kl, ks, kz = ref.quantize_keys(k, kg)
    vu, vl, vs, vz = ref.quantize_values(v, vg)
    for i in range(b):
        t0 = int(start[i])
        sl = slice(t0, t0 + 2 * kg)
        assert torch.equal(cache["k_upper"][i, :, sl], ku[i]) and torch.equal(cache["k_lower"][i, :, sl], kl[i])
        gs = slice(t0 // kg, t0 // kg + 2)
        assert torch.equal(cache["k_scale"][i, :, gs], ks[i]) and torch.equal(cache["k_zero"][i, :, gs], kz[i])
        assert torch.equal(cache["v_upper"][i, :, sl], vu[i]) and torch.equal(cache["v_lower"][i, :, sl], vl[i])
        assert torch.equal(cache["v_scale"][i, :, sl], vs[i]) and torch.equal(cache["v_zero"][i, :, sl], vz[i])


@pytest.mark.parametrize("use_lower", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_dequantize_matches_reference(use_lower, out_dtype):
    torch.manual_seed(1)
    b, h, t, d, kg, vg = 2, 3, 96, 64, 32, 16
    cache = kv.allocate_kv_cache(b, h, t, d, kg, vg)
    fill(cache, torch.randn(b, h, t, d), torch.randn(b, h, t, d), 0, kg, vg)
    c = cache
    k = kv.kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], kg, 80, use_lower, out_dtype)
    v = kv.kv_dequantize_values(c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"], vg, 80, use_lower, out_dtype)
    lower_k = c["k_lower"] if use_lower else None
    lower_v = c["v_lower"] if use_lower else None
    k_ref = ref.dequantize_keys(c["k_upper"], lower_k, c["k_scale"], c["k_zero"], kg)[:, :, :80]
    v_ref = ref.dequantize_values(c["v_upper"], lower_v, c["v_scale"], c["v_zero"], vg)[:, :, :80]
    assert torch.equal(k, k_ref.to(out_dtype)) and torch.equal(v, v_ref.to(out_dtype))


def int8_error(groups: torch.Tensor) -> torch.Tensor:
    """Asymmetric min-max 8-bit quantisation error of groups along the last dim."""
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    step = (hi - lo) / 255
    return torch.round((groups - lo) / step) * step + lo - groups


def test_reconstruction_error_bounds():
    torch.manual_seed(2)
    b, h, t, d, kg, vg = 1, 4, 256, 128, 64, 32
    # Keys with outlier channels (as in real models), values plain Gaussian.
    k = torch.randn(b, h, t, d) * (1 + 10 * (torch.arange(d) % 17 == 0))
    v = torch.randn(b, h, t, d)
    cache = kv.allocate_kv_cache(b, h, t, d, kg, vg)
    fill(cache, k, v, 0, kg, vg)
    c = cache
    for name, x, deq, scale, grouped in [
        ("keys", k, lambda lower: kv.kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], kg, t, lower),
         c["k_scale"].repeat_interleave(kg, dim=2), lambda y: y.reshape(b, h, t // kg, kg, d).transpose(-1, -2)),
        ("values", v, lambda lower: kv.kv_dequantize_values(c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"], vg, t, lower),
         c["v_scale"].repeat_interleave(vg, dim=3), lambda y: y.reshape(b, h, t, d // vg, vg)),
    ]:
        err_upper = deq(False) - x
        err_both = deq(True) - x
        # Per-element bounds: half an upper step, and a lower step / 2 (= upper step / 32), except
        # where the residual code clamps at +7 (then one full lower step).
        assert torch.all(err_upper.abs() <= scale / 2 * (1 + 1e-5) + 1e-6), name
        assert torch.all(err_both.abs() <= scale / 16 * (1 + 1e-5) + 1e-6), name
        rms = lambda e: e.pow(2).mean().sqrt().item()  # noqa: E731
        # Upper + lower is near int8 (a 240-level code vs 256 levels) and >= 10x better than upper only.
        assert rms(err_both) <= 1.25 * rms(int8_error(grouped(x))), name
        assert rms(err_upper) >= 10 * rms(err_both), name


def test_rejects_bad_input():
    cache = kv.allocate_kv_cache(2, 2, 64, 32, 32, 16)
    c = cache
    with pytest.raises(RuntimeError, match="start"):
        kv.kv_quantize_keys(torch.randn(2, 2, 32, 32), torch.tensor([0, 16]), 32, c["k_upper"], c["k_lower"],
                            c["k_scale"], c["k_zero"])
    with pytest.raises(RuntimeError, match="capacity"):
        kv.kv_quantize_values(torch.randn(2, 2, 8, 32), torch.tensor([0, 60]), 16, c["v_upper"], c["v_lower"],
                              c["v_scale"], c["v_zero"])
    with pytest.raises(RuntimeError, match="multiple of group_size"):
        kv.kv_quantize_keys(torch.randn(2, 2, 20, 32), 0, 32, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"])
    with pytest.raises(RuntimeError, match="k_scale"):
        kv.kv_quantize_keys(torch.randn(2, 2, 32, 32), 0, 32, c["k_upper"], c["k_lower"], c["v_scale"], c["k_zero"])


def test_opcheck_and_compile():
    torch.manual_seed(3)
    c = kv.allocate_kv_cache(1, 2, 64, 32, 32, 16)
    k, v, start = torch.randn(1, 2, 32, 32), torch.randn(1, 2, 32, 32), torch.tensor([32])
    torch.library.opcheck(torch.ops.specdec.kv_quantize_keys.default,
                          (k, start, 32, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"]))
    torch.library.opcheck(torch.ops.specdec.kv_quantize_values.default,
                          (v, start, 16, c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"]))
    torch.library.opcheck(torch.ops.specdec.kv_dequantize_keys.default,
                          (c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], 32, True, torch.empty(1, 2, 64, 32)))
    torch.library.opcheck(torch.ops.specdec.kv_dequantize_values.default,
                          (c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"], 16, False, torch.empty(1, 2, 40, 32)))

    def read(cache):
        return kv.kv_dequantize_keys(cache["k_upper"], cache["k_lower"], cache["k_scale"], cache["k_zero"], 32, 64) * 2

    compiled = torch.compile(read, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(c), read(c))


# ---- CUDA --------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_equals_cpu(dtype):
    torch.manual_seed(7)
    b, h, t, d, kg, vg = 3, 2, 128, 64, 32, 32
    k, v = torch.randn(b, h, 64, d).to(dtype), torch.randn(b, h, 64, d).to(dtype)
    start = torch.tensor([0, 32, 64])
    cpu = kv.allocate_kv_cache(b, h, t, d, kg, vg)
    gpu = kv.allocate_kv_cache(b, h, t, d, kg, vg, device="cuda")
    fill(cpu, k, v, start, kg, vg)
    fill(gpu, k.cuda(), v.cuda(), start.cuda(), kg, vg)
    for name in cpu:
        assert torch.equal(cpu[name], gpu[name].cpu()), name
    for lower in (False, True):
        a = kv.kv_dequantize_keys(gpu["k_upper"], gpu["k_lower"], gpu["k_scale"], gpu["k_zero"], kg, t, lower)
        e = kv.kv_dequantize_keys(cpu["k_upper"], cpu["k_lower"], cpu["k_scale"], cpu["k_zero"], kg, t, lower)
        assert torch.equal(a.cpu(), e)
        a = kv.kv_dequantize_values(gpu["v_upper"], gpu["v_lower"], gpu["v_scale"], gpu["v_zero"], vg, t, lower)
        e = kv.kv_dequantize_values(cpu["v_upper"], cpu["v_lower"], cpu["v_scale"], cpu["v_zero"], vg, t, lower)
        assert torch.equal(a.cpu(), e)
