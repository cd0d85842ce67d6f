"""W4A16: quantize_w4 / w4a16_matmul / w4_dequantize against reference/quant.py, W4Linear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import specdec_cuda
from specdec_cuda.ops import quant as q
from specdec_cuda.quant import W4Linear, quantize_linears
from specdec_cuda.reference import quant as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


# Max-abs error relative to max |reference| (both rounded to the output dtype once; fp32 sees only
# summation-order differences).
REL_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rel_err(y: torch.Tensor, expected: torch.Tensor) -> float:
    return ((y.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-30)).item()


def reference_output(x: torch.Tensor, w: torch.Tensor, group_size: int) -> torch.Tensor:
    codes, scales = ref.quantize_w4(w, group_size)
    return ref.w4a16_matmul(x.cpu(), codes, scales, group_size)


# ---- quantisation and layouts ------------------------------------------------------------------


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_quantize_codes_and_scales(group_size):
    torch.manual_seed(0)
    w = torch.randn(37, 256) * 0.02
    w[3, :] = 0.0  # an all-zero row: scale 0, codes 8
    codes, scales = ref.quantize_w4(w, group_size)
    g = 256 if group_size == -1 else group_size
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert scales.shape == (37, 256 // g)
    assert torch.all(codes[3] == 8) and torch.all(scales[3] == 0)
    # Symmetric rounding: the dequantisation error is at most half a step.
    err = (ref.dequantize_w4(codes, scales, group_size) - w).abs().reshape(37, 256 // g, g)
    assert torch.all(err <= scales[..., None] / 2 + 1e-7)


@pytest.mark.parametrize("n", [1, 16, 37, 111])
@pytest.mark.parametrize("group_size", [32, -1])
def test_pack_unpack_round_trip(n, group_size):
    torch.manual_seed(n)
    codes = torch.randint(0, 16, (n, 96), dtype=torch.uint8)
    scales = torch.rand(n, 96 // (96 if group_size == -1 else group_size))
    packed, s = ref.pack_cpu(codes, scales)
    assert packed.shape == ((n + 15) // 16, 48, 16) and s.shape[0] == (n + 15) // 16
    c2, s2 = ref.unpack_cpu(packed, s, n)
    assert torch.equal(c2, codes) and torch.equal(s2, scales)
    for dtype in (torch.float16, torch.bfloat16):  # LAYOUT_CUDA in detail: tests/test_quant_layout.py
        words, s16 = ref.pack_cuda(codes, scales, dtype)
        assert words.dtype == torch.int32 and words.shape == ((n + 7) // 8, 1, 128)
        c3, s3 = ref.unpack_cuda(words, s16, n, 96)
        assert torch.equal(c3, codes) and torch.equal(s3, scales.to(dtype))


def test_quantize_w4_packs_reference_codes():
    torch.manual_seed(1)
    w = torch.randn(50, 128)
    pw = q.quantize_w4(w, 64)
    codes, scales = ref.quantize_w4(w, 64)
    c2, s2 = ref.unpack_cpu(pw.packed, pw.scales, 50)
    assert torch.equal(c2, codes) and torch.equal(s2, scales)
    assert torch.equal(q.w4_dequantize(pw), ref.dequantize_w4(codes, scales, 64))


# ---- matmul ------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 33, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matmul_batch_sizes(m, dtype):
    torch.manual_seed(m)
    w = torch.randn(111, 256)
    x = torch.randn(m, 256).to(dtype)
    y = q.w4a16_matmul(x, q.quantize_w4(w, 128))
    assert y.dtype == dtype and y.shape == (m, 111)
    assert rel_err(y, reference_output(x, w, 128)) <= REL_TOL[dtype]


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("shape", [(7, 96), (33, 384), (100, 512)])
def test_matmul_group_sizes_and_odd_shapes(group_size, shape):
    n, k = shape
    g = k if group_size == -1 else group_size
    if k % g:
        pytest.skip("group does not divide K")
    torch.manual_seed(n + k)
    w, x = torch.randn(n, k), torch.randn(5, k)
    y = q.w4a16_matmul(x, q.quantize_w4(w, group_size))
    assert rel_err(y, reference_output(x, w, group_size)) <= REL_TOL[torch.float32]


def test_matmul_leading_dims_and_empty():
    torch.manual_seed(2)
    pw = q.quantize_w4(torch.randn(64, 128), 32)
    x = torch.randn(2, 3, 128)
    assert torch.allclose(q.w4a16_matmul(x, pw), q.w4a16_matmul(x.reshape(6, 128), pw).reshape(2, 3, 64))
    assert q.w4a16_matmul(torch.randn(0, 128), pw).shape == (0, 64)


@pytest.mark.parametrize("m", [1, 16])
def test_matmul_4096x4096(m):
    torch.manual_seed(3)
    w = torch.randn(4096, 4096) * 0.02
    x = torch.randn(m, 4096, dtype=torch.bfloat16)
    y = q.w4a16_matmul(x, q.quantize_w4(w, 128))
    assert rel_err(y, reference_output(x, w, 128)) <= REL_TOL[torch.bfloat16]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(14336, 4096), (4096, 14336)])
def test_matmul_real_layer_shapes(shape):
    torch.manual_seed(4)
    w = torch.randn(*shape) * 0.02
    codes, scales = ref.quantize_w4(w, 128)
    dense = ref.dequantize_w4(codes, scales, 128)
    pw = q.quantize_w4(w, 128)
    for m in (1, 4, 16, 33):
        x = torch.randn(m, shape[1])
        assert rel_err(q.w4a16_matmul(x, pw), x @ dense.T) <= 1e-4, m


def test_large_m_dense_path_matches_gemv_path():
    torch.manual_seed(5)
    pw = q.quantize_w4(torch.randn(48, 256), 64)
    x = torch.randn(70, 256)
    y = q.w4a16_matmul(x, pw)  # M >= 64: dequantise + BLAS
    y_small = torch.cat([q.w4a16_matmul(x[i:i + 8], pw) for i in range(0, 70, 8)])
    assert rel_err(y, y_small) <= 2e-5


# ---- errors ------------------------------------------------------------------------------------


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\[8, 100\]"):
        q.quantize_w4(torch.randn(8, 100), 32)
    with pytest.raises(ValueError, match="group_size"):
        q.quantize_w4(torch.randn(8, 96), 64)
    pw = q.quantize_w4(torch.randn(8, 96), 32)
    with pytest.raises(ValueError, match="features"):
        q.w4a16_matmul(torch.randn(2, 64), pw)
    with pytest.raises(RuntimeError, match="scales"):
        out = torch.empty(2, 8)
        torch.ops.specdec.w4a16_matmul(torch.randn(2, 96), pw.packed, pw.scales[:, :1].contiguous(), 32, 0, out)
    with pytest.raises(RuntimeError, match="LAYOUT_CPU"):
        torch.ops.specdec.w4a16_matmul(torch.randn(2, 96), pw.packed, pw.scales, 32, 1, torch.empty(2, 8))


def cuda_layout_on_cpu(w: torch.Tensor, group_size: int, dtype: torch.dtype) -> q.PackedW4:
    """A LAYOUT_CUDA weight held in CPU tensors (what quantize_w4(..., device='cuda') would build)."""
    codes, scales = ref.quantize_w4(w, group_size)
    packed, s = ref.pack_cuda(codes, scales, dtype)
    return q.PackedW4(packed, s, group_size, w.shape[0], w.shape[1])


def test_cuda_weight_dtype_mismatch_is_an_error():
    pw = cuda_layout_on_cpu(torch.randn(24, 128), 64, torch.bfloat16)
    assert q.layout_of(pw.packed) == q.LAYOUT_CUDA
    with pytest.raises(ValueError, match="bfloat16.*float16.*repack_w4"):
        q.w4a16_matmul(torch.randn(2, 128, dtype=torch.float16), pw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_repack_w4_is_exact(dtype):
    torch.manual_seed(10)
    w = torch.randn(37, 192)
    codes, scales = ref.quantize_w4(w, 64)
    pw_cuda = cuda_layout_on_cpu(w, 64, dtype)
    back = q.repack_w4(pw_cuda, "cpu")  # LAYOUT_CUDA -> LAYOUT_CPU from the integer codes
    assert q.layout_of(back.packed) == q.LAYOUT_CPU
    c2, s2 = ref.unpack_cpu(back.packed, back.scales, 37)
    assert torch.equal(c2, codes) and torch.equal(s2, scales.to(dtype).float())
    cpu = q.quantize_w4(w, 64)
    assert q.repack_w4(cpu, "cpu") is cpu


# ---- registration ----# ---- registration ------------------------------------------------------------------------------


def test_opcheck():
    torch.manual_seed(6)
    pw = q.quantize_w4(torch.randn(20, 64), 32)
    x = torch.randn(3, 64)
    torch.library.opcheck(torch.ops.specdec.w4a16_matmul.default,
                          (x, pw.packed, pw.scales, 32, q.LAYOUT_CPU, torch.empty(3, 20)))
    torch.library.opcheck(torch.ops.specdec.w4_dequantize.default,
                          (pw.packed, pw.scales, 32, q.LAYOUT_CPU, torch.empty(20, 64)))


def test_torch_compile_fullgraph():
    torch.manual_seed(7)
    lin = W4Linear.from_linear(nn.Linear(64, 48), group_size=32)
    x = torch.randn(4, 64)
    compiled = torch.compile(lambda t: lin(t).relu(), fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), lin(x).relu())


# ---- modules -----------------------------------------------------------------------------------


def test_w4linear_from_linear():
    torch.manual_seed(8)
    lin = nn.Linear(128, 40)
    ql = W4Linear.from_linear(lin, group_size=64)
    x = torch.randn(6, 128)
    codes, scales = ref.quantize_w4(lin.weight.detach(), 64)
    expected = x @ ref.dequantize_w4(codes, scales, 64).T + lin.bias.detach()
    assert rel_err(ql(x), expected) <= 2e-5
    assert (ql(x) - lin(x)).abs().max() < 0.1 * lin(x).abs().max()  # int4 is close to the original
    assert "group_size=64" in repr(ql)


def test_quantize_linears_only_mlp():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.Module()
            self.attn.q_proj = nn.Linear(64, 64)
            self.mlp = nn.Module()
            self.mlp.up_proj = nn.Linear(64, 128)
            self.mlp.down_proj = nn.Linear(128, 64)
            self.mlp.odd = nn.Linear(40, 8)  # in_features not a multiple of 32: skipped

    model = nn.Module()
    model.layers = nn.ModuleList([Block(), Block()])
    model.lm_head = nn.Linear(64, 10)
    replaced = quantize_linears(model, include=["*mlp*"], group_size=32)
    assert replaced == ["layers.0.mlp.up_proj", "layers.0.mlp.down_proj", "layers.1.mlp.up_proj",
                        "layers.1.mlp.down_proj"]
    assert isinstance(model.layers[1].mlp.down_proj, W4Linear)
    assert isinstance(model.layers[0].attn.q_proj, nn.Linear) and isinstance(model.lm_head, nn.Linear)
    assert isinstance(model.layers[0].mlp.odd, nn.Linear)


# ---- CUDA ----------------------------------------------------------------------------------------


def cuda_expected(x: torch.Tensor, w: torch.Tensor, group_size: int) -> torch.Tensor:
    """x · dequant(W)ᵀ with the CUDA rounding: scales in x's dtype and each weight rounded to it once."""
    codes, scales = ref.quantize_w4(w.cpu(), group_size)
    dense = ref.dequantize_w4(codes, scales.to(x.dtype).float(), group_size).to(x.dtype)
    return (x.cpu().float() @ dense.float().T).to(x.dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 16, 17, 33, 70, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_cuda_matches_reference(m, dtype, group_size):
    torch.manual_seed(m)
    w = torch.randn(111, 512) * 0.05  # odd N: a partial n8 tile and a partial 16-column block
    x = torch.randn(m, 512).to(dtype)
    pw = q.quantize_w4(w, group_size, device="cuda", scale_dtype=dtype)
    y = q.w4a16_matmul(x.cuda(), pw)
    assert rel_err(y.cpu(), cuda_expected(x, w, group_size)) <= REL_TOL[dtype]
    codes, scales = ref.quantize_w4(w, group_size)
    dense = q.w4_dequantize(pw, dtype).cpu()
    assert torch.equal(dense, ref.dequantize_w4(codes, scales.to(dtype).float(), group_size).to(dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(7, 96), (33, 352), (100, 640), (64, 4096)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_odd_shapes(shape, dtype):
    """K not a multiple of 128 (padded chunk), N not a multiple of 8 or 16, few chunks per warp."""
    n, k = shape
    torch.manual_seed(n)
    w = torch.randn(n, k) * 0.05
    pw = q.quantize_w4(w, 32, device="cuda", scale_dtype=dtype)
    for m in (1, 4, 11, 16):
        x = torch.randn(m, k).to(dtype)
        assert rel_err(q.w4a16_matmul(x.cuda(), pw).cpu(), cuda_expected(x, w, 32)) <= REL_TOL[dtype], m


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(4096, 4096), (14336, 4096), (4096, 14336)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_real_layer_shapes(shape, dtype):
    torch.manual_seed(11)
    w = torch.randn(*shape, device="cuda") * 0.02
    pw = q.quantize_w4(w, 128, device="cuda", scale_dtype=dtype)
    dense = q.w4_dequantize(pw, dtype)  # checked bit-exact against the reference above
    for m in (1, 4, 16, 33):
        x = torch.randn(m, shape[1], device="cuda").to(dtype)
        expected = (x.float() @ dense.float().T).to(dtype)
        assert rel_err(q.w4a16_matmul(x, pw), expected) <= REL_TOL[dtype], m


@pytest.mark.skipif(not specdec_cuda.build_info()["with_cuda"], reason="a build without CUDA kernels")
def test_cuda_tuning_table():
    """Every entry is launchable; the automatic choice names exactly one entry for each M <= 16."""
    tunings = q.cuda_tunings()
    assert [t["index"] for t in tunings] == list(range(len(tunings)))
    for t in tunings:
        assert t["rows"] in (1, 8, 16) and 1 <= t["tiles_n"] <= t["warps"] and t["stages"] >= 2, t
        assert all(m <= t["rows"] for m in t["auto_for_rows"]), t
    assert sorted(m for t in tunings for m in t["auto_for_rows"]) == list(range(1, 17))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_every_tuning_matches_reference(dtype):
    """The sweep's configurations are held to the same reference as the automatic one, for M up to
    each entry's rows and beyond (sliced), on a shape with a partial tile, a padded K chunk and few
    chunks per warp."""
    torch.manual_seed(5)
    n, k = 111, 352
    w = torch.randn(n, k) * 0.05
    pw = q.quantize_w4(w, 32, device="cuda", scale_dtype=dtype)
    for t in q.cuda_tunings():
        for m in sorted({1, t["rows"], t["rows"] + 3}):
            x = torch.randn(m, k).to(dtype)
            y = q.w4a16_matmul(x.cuda(), pw, tuning=t["index"])
            assert rel_err(y.cpu(), cuda_expected(x, w, 32)) <= REL_TOL[dtype], (t, m)
    with pytest.raises(ValueError, match="tuning"):
        q.w4a16_matmul(torch.randn(1, k).to(dtype).cuda(), pw, tuning=len(q.cuda_tunings()))
    torch.library.opcheck(torch.ops.specdec._w4a16_matmul_tuned.default,
                          (torch.randn(3, k).to(dtype).cuda(), pw.packed, pw.scales, 32, 2,
                           torch.empty(3, n, dtype=dtype, device="cuda")))


@pytest.mark.cuda
def test_cuda_dtype_mismatch_and_repack():
    torch.manual_seed(12)
    w = torch.randn(40, 256) * 0.05
    pw = q.quantize_w4(w, 64, device="cuda", scale_dtype=torch.bfloat16)
    x = torch.randn(3, 256).half()
    with pytest.raises(ValueError, match="repack_w4"):
        q.w4a16_matmul(x.cuda(), pw)
    with pytest.raises(RuntimeError, match="packed for"):
        torch.ops.specdec.w4a16_matmul(x.cuda(), pw.packed, pw.scales, 64, q.LAYOUT_CUDA,
                                       torch.empty(3, 40, dtype=torch.float16, device="cuda"))
    pw16 = q.repack_w4(pw, scale_dtype=torch.float16)
    assert pw16.scales.dtype == torch.float16
    codes, _ = ref.quantize_w4(w, 64)
    assert torch.equal(ref.unpack_cuda(pw16.packed.cpu(), pw16.scales.cpu(), 40, 256)[0], codes)
    expected = (x.float() @ q.w4_dequantize(pw16, torch.float16).cpu().float().T).half()
    assert rel_err(q.w4a16_matmul(x.cuda(), pw16).cpu(), expected) <= REL_TOL[torch.float16]


@pytest.mark.cuda
def test_cuda_equals_cpu_and_moves():
    torch.manual_seed(9)
    lin = nn.Linear(256, 96).half()
    ql = W4Linear.from_linear(lin, group_size=64)
    x = torch.randn(4, 256, dtype=torch.float16)
    y_cpu = ql(x.float()).half()
    ql_cuda = W4Linear.from_linear(lin, group_size=64, device="cuda")
    assert rel_err(ql_cuda(x.cuda()).cpu(), y_cpu) <= REL_TOL[torch.float16]
    moved = ql.cuda()
    assert rel_err(moved(x.cuda()).cpu(), y_cpu) <= REL_TOL[torch.float16]
    # cast to bf16: the CUDA weight is repacked for bf16 activations
    assert rel_err(moved.to(torch.bfloat16)(x.cuda().bfloat16()).cpu(), y_cpu) <= REL_TOL[torch.bfloat16]
    assert moved.scales.dtype == torch.bfloat16
    pw = q.quantize_w4(lin.weight.float(), 64, device="cuda", scale_dtype=torch.float16)
    torch.library.opcheck(torch.ops.specdec.w4a16_matmul.default,
                          (x.cuda(), pw.packed, pw.scales, 64, q.LAYOUT_CUDA,
                           torch.empty(4, 96, dtype=torch.float16, device="cuda")))
    torch.library.opcheck(torch.ops.specdec.w4_dequantize.default,
                          (pw.packed, pw.scales, 64, q.LAYOUT_CUDA, torch.empty(96, 256, dtype=torch.float16,
                                                                                device="cuda")))


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 5, 16, 70])
def test_cuda_graph_capture_and_replay(m):
    """An engine captures decoding steps in CUDA graphs: the op must capture (no allocation or host
    sync inside at M < 64; the dense path at M >= 64 allocates from the graph's pool) and a replay
    must see new inputs written into the captured x."""
    torch.manual_seed(m)
    w = torch.randn(200, 256, device="cuda") * 0.05
    pw = q.quantize_w4(w, 64, device="cuda", scale_dtype=torch.float16)
    x = torch.randn(m, 256, device="cuda", dtype=torch.float16)
    q.w4a16_matmul(x, pw)  # warm-up outside the capture (per-device setup happens once)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = q.w4a16_matmul(x, pw)
    for _ in range(2):
        x.copy_(torch.randn(m, 256, device="cuda", dtype=torch.float16))
        graph.replay()
        torch.cuda.synchronize()
        eager = q.w4a16_matmul(x, pw)
        if m < 64:  # our kernel: deterministic, so bit-identical
            assert torch.equal(y, eager)
        else:  # cuBLAS may pick another algorithm inside a capture
            assert rel_err(y, eager) <= REL_TOL[torch.float16]


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_narrower_cpu_kernels(isa):
    """The AVX2 and baseline kernels (picked on CPUs without AVX-512) against the reference."""
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from specdec_cuda.ops import quant as q\n"
        "from specdec_cuda.reference import quant as ref\n"
        "torch.manual_seed(0)\n"
        "for m, g in [(1, 32), (5, -1), (9, 64)]:\n"
        "    w, x = torch.randn(37, 192), torch.randn(m, 192)\n"
        "    codes, scales = ref.quantize_w4(w, g)\n"
        "    e = ref.w4a16_matmul(x, codes, scales, g)\n"
        "    y = q.w4a16_matmul(x, q.quantize_w4(w, g))\n"
        "    assert ((y - e).abs().max() / e.abs().max()).item() < 2e-5, (m, g)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, SPECDEC_CPU_ISA=isa)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "python"),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
