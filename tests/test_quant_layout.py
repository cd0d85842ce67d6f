"""LAYOUT_CUDA checked on the CPU: pack / unpack, and an emulation of the tensor-core kernel's registers.

csrc/kernels/quant/w4a16_cuda.cu cannot run here, so this file re-does, with integer tensor ops,
what each lane of its warps does: which 16 bytes it copies (weights, x, scales), how the dtype's
bit trick turns a packed word into B registers (lop3 / prmt emulated bit for bit, then
``.view(float16 / bfloat16)``), and how the PTX ISA places the A / B / C register elements of
mma.m16n8k16 in the 16x16, 16x8 and 16x8 tiles. Only the PTX fragment tables below and the
kernel's address arithmetic are assumed; the mapping from packed bits to (row, k) is not, so a
wrong interleave or fragment order fails these tests.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from specdec_cuda.reference import quant as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

DTYPES = [torch.float16, torch.bfloat16]
MASK32 = 0xFFFFFFFF


# ---- PTX ISA, mma.m16n8k16 with .f16 / .bf16 inputs and .f32 accumulators -----------------------
# groupID g = lane >> 2, threadID_in_group t = lane % 4; each 32-bit register holds two 16-bit
# elements, the lower-numbered one in the low half.

def ptx_a(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(row, col) of A (16 x 16) element a_i, i = 2 reg + half: rows g for i in {0,1,4,5}, else g + 8;
    cols 2t + (i & 1), + 8 for i >= 4."""
    g, t, i = lane >> 2, lane % 4, 2 * reg + half
    row = g if i in (0, 1, 4, 5) else g + 8
    col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def ptx_b(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(row k, col n) of B (16 x 8) element b_i, i = 2 reg + half: rows 2t + (i & 1), + 8 for i >= 2; col g."""
    g, t, i = lane >> 2, lane % 4, 2 * reg + half
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of C / D (16 x 8) element c_i: row g (+ 8 for i >= 2), col 2t + (i & 1)."""
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), 2 * t + (i & 1)


# ---- the kernel's instructions on 32-bit words (int64 tensors holding unsigned values) ----------

def lop3_and_or(a: torch.Tensor, b: int, c: int) -> torch.Tensor:
    """lop3.b32 with LUT 0xea: (a & b) | c."""
    return (a & b) | c


def prmt(a: torch.Tensor, b: int, selector: int) -> torch.Tensor:
    """prmt.b32 d, a, b, selector (default mode): byte j of d = byte (selector nibble j) of {b:a}."""
    pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [torch.full_like(a, (b >> (8 * i)) & 0xFF) for i in range(4)]
    out = torch.zeros_like(a)
    for j in range(4):
        out |= pool[(selector >> (4 * j)) & 0x7] << (8 * j)  # selector's sign bit (8) unused here
    return out


def halves(reg: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The two 16-bit elements of a 32-bit register, low first.  Shape: [...] -> [..., 2] of dtype."""
    lo, hi = reg & 0xFFFF, (reg >> 16) & 0xFFFF
    bits = torch.stack([lo, hi], dim=-1)
    bits = torch.where(bits >= 2**15, bits - 2**16, bits).to(torch.int16)
    return bits.view(dtype)


def dequant_registers(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Ops<dtype>::dequant on words q (unsigned, int64) with the lane's scale (dtype, broadcast).

    Returns ``[..., 4 registers, 2 halves]`` of dtype: b[0..3] as the kernel builds them.
    """
    if dtype == torch.float16:
        q8 = q >> 8
        regs = [lop3_and_or(q, 0x000F000F, 0x64006400), lop3_and_or(q, 0x00F000F0, 0x64006400),
                lop3_and_or(q8, 0x000F000F, 0x64006400), lop3_and_or(q8, 0x00F000F0, 0x64006400)]
        v = [halves(r, dtype) for r in regs]
        low_bias = torch.tensor(1032.0, dtype=dtype)
        sixteenth, high_bias = torch.tensor(1 / 16, dtype=dtype), torch.tensor(-72.0, dtype=dtype)
        # (r - 1032) for the in-place low nibbles, r / 16 - 72 for the high ones (exact either way)
        v = [v[0] - low_bias, v[1] * sixteenth + high_bias, v[2] - low_bias, v[3] * sixteenth + high_bias]
    else:
        lo, hi = q & 0x0F0F0F0F, (q >> 4) & 0x0F0F0F0F
        regs = [prmt(lo, 0x43, 0x4140), prmt(lo, 0x43, 0x4342), prmt(hi, 0x43, 0x4140), prmt(hi, 0x43, 0x4342)]
        v = [halves(r, dtype) - torch.tensor(136.0, dtype=dtype) for r in regs]
    return torch.stack([r * scale[..., None] for r in v], dim=-2)  # one rounding to dtype, like hmul2


def lane_scales(scales: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """The scale each lane uses per (tile, chunk), fetched as the kernel does: the aligned pair of
    scales[nt, grp, (g & ~1) : +2], then the half of row g.  Shape: [tiles, chunks, 32] of the dtype."""
    tiles, groups, _ = scales.shape
    chunks = -(-k // ref.CUDA_CHUNK_K)
    g_size = k if group_size == -1 else group_size
    bits = scales.view(torch.int16).to(torch.int64) & 0xFFFF
    out = torch.empty(tiles, chunks, 32, dtype=torch.int64)
    for c in range(chunks):
        for lane in range(32):
            g, t = lane >> 2, lane % 4
            grp = min((128 * c + 32 * t) // g_size, groups - 1)
            pair = bits[:, grp, g & ~1] | (bits[:, grp, g | 1] << 16)  # the 4-byte cp.async
            sel = 0x3232 if g & 1 else 0x1010
            out[:, c, lane] = prmt(pair, 0, sel) & 0xFFFF  # __byte_perm(pair, 0, sel), one half of it
    out = torch.where(out >= 2**15, out - 2**16, out).to(torch.int16)
    return out.view(scales.dtype)


def kernel_b_tiles(packed: torch.Tensor, scales: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """The B operand of every mma the kernel issues.  Shape: [tiles, chunks, 8 steps, 16 (k), 8 (n)].

    Lane l of the warp copies int32 words [4l, 4l + 4) of (tile, chunk); word wd feeds k-steps
    2wd (b[0], b[1]) and 2wd + 1 (b[2], b[3]).
    """
    dtype = scales.dtype
    tiles, chunks, _ = packed.shape
    words = (packed.to(torch.int64) & MASK32).reshape(tiles, chunks, 32, 4)
    s = lane_scales(scales, k, group_size)  # [tiles, chunks, 32]
    regs = dequant_registers(words, s[..., None], dtype)  # [tiles, chunks, 32, 4 words, 4 regs, 2]
    b = torch.zeros(tiles, chunks, 8, 16, 8, dtype=dtype)
    for lane in range(32):
        for wd in range(4):
            for r in range(4):
                step, reg = 2 * wd + r // 2, r % 2  # b[0], b[1] of step 2wd; b[2], b[3] of step 2wd + 1
                for h in range(2):
                    row, col = ptx_b(lane, reg, h)
                    b[:, :, step, row, col] = regs[:, :, lane, wd, r, h]
    return b


def lane_x_words(x: torch.Tensor, k: int) -> torch.Tensor:
    """What lane (g, t) copies of x per chunk: x[g + 8r, 128c + 32t + 8wd + (0..7)], zero-filled for
    rows >= M and features >= K.  Shape: x [M <= 16, K] -> [chunks, 32 lanes, 2 (r), 4 (wd), 4 words, 2]."""
    m = x.shape[0]
    chunks = -(-k // ref.CUDA_CHUNK_K)
    xp = torch.zeros(16, chunks * ref.CUDA_CHUNK_K, dtype=x.dtype)
    xp[:m, :k] = x
    out = torch.zeros(chunks, 32, 2, 4, 4, 2, dtype=x.dtype)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for r in range(2):
            run = xp[g + 8 * r].reshape(chunks, 4, 32)[:, t]  # [chunks, 32]: the lane's 32 features
            out[:, lane, r] = run.reshape(chunks, 4, 4, 2)
    return out


# The kernel's two mma per (tile, chunk, word wd), for each A-tile variant: A registers as
# (row half r, word of the x piece), B registers as indices into b[0..3], and the accumulator.
MMA_PLAN = {
    # MT = 16: A = {x0 w0, x1 w0, x0 w1, x1 w1} with b[0], b[1]; then words 2, 3 with b[2], b[3]
    16: [([(0, 0), (1, 0), (0, 1), (1, 1)], (0, 1), 0), ([(0, 2), (1, 2), (0, 3), (1, 3)], (2, 3), 0)],
    # MT = 8: the quad {x0 w0, x0 w1, x0 w2, x0 w3} as loaded, with (b[0], b[2]) into acc, (b[1], b[3]) into acc2
    8: [([(0, 0), (0, 1), (0, 2), (0, 3)], (0, 2), 0), ([(0, 0), (0, 1), (0, 2), (0, 3)], (1, 3), 1)],
}


def emulate_kernel(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int, k: int,
                   group_size: int, mt: int) -> torch.Tensor:
    """y = x · Wᵀ through the emulated registers of every mma (float64 sums), reduced and stored
    as the kernel's epilogue does.  Shape: [M, N]."""
    tiles, chunks, _ = packed.shape
    xw = lane_x_words(x, k).double()  # [C, 32, 2, 4, 4, 2]
    words = (packed.to(torch.int64) & MASK32).reshape(tiles, chunks, 32, 4)
    b_regs = dequant_registers(words, lane_scales(scales, k, group_size)[..., None], scales.dtype).double()
    acc = torch.zeros(2, tiles, 16, 8, dtype=torch.float64)  # acc, acc2 as (row, col) tiles
    for wd in range(4):
        for a_plan, (b_lo, b_hi), which in MMA_PLAN[mt]:
            a = torch.zeros(chunks, 16, 16, dtype=torch.float64)
            b = torch.zeros(tiles, chunks, 16, 8, dtype=torch.float64)
            for lane in range(32):
                for reg, (r, word) in enumerate(a_plan):
                    for h in range(2):
                        row, col = ptx_a(lane, reg, h)
                        a[:, row, col] = xw[:, lane, r, wd, word, h]
                for reg, bi in enumerate((b_lo, b_hi)):
                    for h in range(2):
                        row, col = ptx_b(lane, reg, h)
                        b[:, :, row, col] = b_regs[:, :, lane, wd, bi, h]
            acc[which] += torch.einsum("cmk,tckn->tmn", a, b)
    y = torch.zeros(x.shape[0], n, dtype=torch.float64)
    for nt in range(tiles):
        for lane in range(32):
            g, t = lane >> 2, lane % 4
            regs = [acc[0, nt][ptx_c(lane, i)] for i in range(4)]
            regs2 = [acc[1, nt][ptx_c(lane, i)] for i in range(4)]
            # the kernel's partial[e] and store: MT = 16 c0..c3 -> rows g, g, g+8, g+8;
            # MT = 8 acc c0, c1 + acc2 c2, c3 -> row g
            v = regs if mt == 16 else [regs[0] + regs2[2], regs[1] + regs2[3], 0.0, 0.0]
            for e in range(4):
                m_out, n_out = g + 8 * (e >> 1), nt * 8 + 2 * t + (e & 1)
                if m_out < x.shape[0] and n_out < n:
                    y[m_out, n_out] = v[e]
    return y


# ---- tests ---------------------------------------------------------------------------------------


def make_weight(n: int, k: int, group_size: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    codes, scales = ref.quantize_w4(torch.randn(n, k, generator=gen), group_size)
    return codes, scales, ref.pack_cuda(codes, scales, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("shape", [(1, 32), (37, 96), (16, 256), (111, 384), (8, 640)])
def test_pack_unpack_cuda_round_trip(dtype, group_size, shape):
    n, k = shape
    g = k if group_size == -1 else group_size
    if k % g:
        pytest.skip("group does not divide K")
    codes, scales, (packed, s) = make_weight(n, k, group_size, dtype, seed=n + k)
    tiles, chunks = -(-n // 8), -(-k // 128)
    assert packed.dtype == torch.int32 and packed.shape == (tiles, chunks, 128)
    assert s.dtype == dtype and s.shape == (tiles, k // g, 8)
    c2, s2 = ref.unpack_cuda(packed, s, n, k)
    assert torch.equal(c2, codes) and torch.equal(s2, scales.to(dtype))
    # padding: codes 8 (weight 0) beyond N and K, scales 0 beyond N
    full, _ = ref.unpack_cuda(packed, s, tiles * 8, chunks * 128)
    assert torch.all(full[n:] == 8) and torch.all(full[:, k:] == 8)
    assert torch.all(s.permute(0, 2, 1).reshape(-1, k // g)[n:] == 0)


def test_interleaves_differ_and_are_as_specified():
    """Word 0 of lane 0 holds codes j = 0..7 of row 0; nibble p must hold j = NIBBLE_ORDER[dtype][p]."""
    codes = torch.full((8, 128), 8, dtype=torch.uint8)
    codes[0, :8] = torch.arange(8, dtype=torch.uint8) + 1  # code of j is j + 1
    scales = torch.ones(8, 1)
    words = {}
    for dtype, order in [(torch.float16, (0, 2, 4, 6, 1, 3, 5, 7)), (torch.bfloat16, (0, 4, 1, 5, 2, 6, 3, 7))]:
        packed, _ = ref.pack_cuda(codes, scales, dtype)
        w = int(packed[0, 0, 0]) & MASK32
        assert [(w >> (4 * p)) & 0xF for p in range(8)] == [j + 1 for j in order]
        words[dtype] = w
    assert words[torch.float16] != words[torch.bfloat16]
    # lane 1 (g = 0, t = 1) holds k = 32..39 of row 0; lane 4 (g = 1) row 1
    codes[0, 32] = 3
    codes[1, 0] = 5
    packed, _ = ref.pack_cuda(codes, scales, torch.float16)
    assert int(packed[0, 0, 4]) & 0xF == 3 and int(packed[0, 0, 16]) & 0xF == 5


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_registers_all_codes(dtype):
    """The bit trick on every code in every nibble: each element is exactly (code - 8) * scale."""
    torch.manual_seed(0)
    codes = torch.randint(0, 16, (4096, 8))
    codes[:16] = torch.arange(16)[:, None]  # every code in every position
    order = ref.NIBBLE_ORDER[dtype]
    q = torch.zeros(4096, dtype=torch.int64)
    for p in range(8):
        q |= codes[:, order[p]] << (4 * p)
    scale = (torch.rand(4096) * 0.1 + 1e-3).to(dtype)
    regs = dequant_registers(q, scale, dtype)  # [4096, 4, 2]
    # b[0] = (j0, j1), b[1] = (j2, j3), b[2] = (j4, j5), b[3] = (j6, j7)
    expected = ((codes.float() - 8) * scale.float()[:, None]).to(dtype).reshape(4096, 4, 2)
    assert torch.equal(regs, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_interleave_mismatch_is_detected(dtype):
    """Decoding a word packed for the other dtype gives wrong weights: the emulation is sensitive."""
    other = torch.bfloat16 if dtype == torch.float16 else torch.float16
    codes, scales, _ = make_weight(8, 128, 128, dtype)
    packed, s = ref.pack_cuda(codes, scales, other)
    b = kernel_b_tiles(packed, s.to(dtype), 128, 128)
    good = kernel_b_tiles(*ref.pack_cuda(codes, scales, dtype), 128, 128)
    assert not torch.equal(b, good)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_b_fragments_land_on_dequantised_weight(dtype, group_size):
    """Every B element of every emulated mma is dequant(W)[n, k] (rounded to dtype) for the
    kernel's k-permutation k = 128c + 32t(kappa) + 4s + 2 (kappa >= 8) + (kappa & 1), and 0 in the padding."""
    n, k = 37, 384 if group_size != -1 else 352  # 352: K padded within the last chunk
    codes, scales, (packed, s) = make_weight(n, k, group_size, dtype, seed=1)
    dense = ref.dequantize_w4(codes, scales.to(dtype).float(), group_size).to(dtype)
    b = kernel_b_tiles(packed, s, k, group_size)  # [T, C, 8, 16, 8]
    tiles, chunks = b.shape[:2]
    expected = torch.zeros_like(b)
    for c in range(chunks):
        for step in range(8):
            for kappa in range(16):
                kk = 128 * c + 32 * ((kappa & 7) >> 1) + 4 * step + 2 * (kappa >= 8) + (kappa & 1)
                if kk < k:
                    col = torch.zeros(tiles * 8, dtype=dtype)
                    col[:n] = dense[:, kk]
                    expected[:, c, step, kappa, :] = col.reshape(tiles, 8)
    assert torch.equal(b, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 8, 11, 16])
@pytest.mark.parametrize("group_size", [32, 96, -1])  # 96: groups straddle chunks
def test_emulated_kernel_matches_reference(dtype, m, group_size):
    """The whole register path (A from x, B from packed, C to y) against x · dequant(W)ᵀ, through
    the kernel's A-tile variant for this M (8 rows up to M = 8, else 16) and, up to M = 8, the other one too."""
    n, k = 21, 288  # odd N (a partial tile), K padded inside the last chunk
    codes, scales, (packed, s) = make_weight(n, k, group_size, dtype, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    dense = ref.dequantize_w4(codes, scales.to(dtype).float(), group_size).to(dtype)
    expected = x.double() @ dense.double().T
    for mt in ([8, 16] if m <= 8 else [16]):
        y = emulate_kernel(x, packed, s, n, k, group_size, mt)
        assert torch.allclose(y, expected, rtol=1e-12, atol=1e-12), mt


@pytest.mark.parametrize("mt", [8, 16])
def test_emulation_is_sensitive_to_the_register_plan(mt, monkeypatch):
    """Pairing the A quad with the naive B registers (b[0], b[1]) then (b[2], b[3]) is right only
    for the 16-row plan; for the 8-row plan (and swapped pairs for the 16-row one) it must fail."""
    codes, scales, (packed, s) = make_weight(16, 128, 128, torch.float16)
    x = torch.randn(5, 128).half()
    dense = ref.dequantize_w4(codes, scales.half().float(), 128).half()
    expected = x.double() @ dense.double().T
    assert torch.allclose(emulate_kernel(x, packed, s, 16, 128, 128, mt), expected, rtol=1e-12, atol=1e-12)
    plan = [(a, pair, which) for (a, _, which), pair in zip(MMA_PLAN[mt], [(0, 1), (2, 3)] if mt == 8 else
                                                             [(0, 2), (1, 3)])]
    monkeypatch.setitem(MMA_PLAN, mt, plan)
    assert not torch.allclose(emulate_kernel(x, packed, s, 16, 128, 128, mt), expected, rtol=1e-3, atol=1e-3)


def test_kernel_source_uses_the_emulated_constants():
    """The emulation above re-types the kernel's masks, exponents, biases and permute selectors;
    this ties them to csrc/kernels/quant/w4a16_cuda.cu so that neither changes alone."""
    src = (pathlib.Path(__file__).resolve().parents[1] / "csrc/kernels/quant/w4a16_cuda.cu").read_text()

    def body(dtype_enum: str) -> str:
        start = src.index(f"struct Ops<ActDType::{dtype_enum}>")
        return src[start:src.index("static __device__ __forceinline__ void mma", start)]

    fp16, bf16 = body("kFloat16"), body("kBFloat16")
    for const in ["0x000f000fu", "0x00f000f0u", "0x64006400u", "0x64086408u", "0x2c002c00u", "0xd480d480u", "q >> 8",
                  "and_or(q, kLow, kExp)", "and_or(q, kHigh, kExp)",
                  "and_or(q8, kLow, kExp)", "and_or(q8, kHigh, kExp)",
                  "__hsub2(r0, bias_low)", "__hfma2(r1, sixteenth, bias_high)", "__hsub2(r2, bias_low)",
                  "__hfma2(r3, sixteenth, bias_high)"]:
        assert const in fp16, const
    for const in ["q & 0x0f0f0f0fu", "(q >> 4) & 0x0f0f0f0fu", "kExp = 0x43u", "0x43084308u",
                  "__byte_perm(lo, kExp, 0x4140u)", "__byte_perm(lo, kExp, 0x4342u)",
                  "__byte_perm(hi, kExp, 0x4140u)", "__byte_perm(hi, kExp, 0x4342u)"]:
        assert const in bf16, const
    assert "0xea" in src  # and_or's LUT: (a & b) | c
    # the A quads and B pairs of MMA_PLAN
    assert "a_even[4] = {x0.x, x1.x, x0.y, x1.y}" in src and "a_odd[4] = {x0.z, x1.z, x0.w, x1.w}" in src
    assert "O::mma(acc[i], a_even, b[0], b[1])" in src and "O::mma(acc[i], a_odd, b[2], b[3])" in src
    assert "a[4] = {x0.x, x0.y, x0.z, x0.w}" in src
    assert "O::mma(acc[i], a, b[0], b[2])" in src and "O::mma(acc2[i], a, b[1], b[3])" in src
    assert "acc[i][e] + acc2[i][e + 2]" in src
    # the lane's copies: weights [nt, c, lane], x at 128c + 32t, scale pair at (g & ~1), half by g & 1
    assert "(static_cast<int64_t>(nt) * chunks + c_begin) * 32 + lane" in src
    assert "c_begin * kChunkK + 32 * t" in src and "(g & ~1)" in src and "(g & 1) ? 0x3232u : 0x1010u" in src
    assert re.search(r"nibble_j\(int p\) \{ return p < 4 \? 2 \* p : 2 \* \(p - 4\) \+ 1; \}", fp16)
    assert re.search(r"nibble_j\(int p\) \{ return \(p & 1\) \? 4 \+ p / 2 : p / 2; \}", bf16)
    # ... which the dequantiser of the dense path uses: the reference's NIBBLE_ORDER
    assert tuple(2 * p if p < 4 else 2 * (p - 4) + 1 for p in range(8)) == ref.NIBBLE_ORDER[torch.float16]
    assert tuple(4 + p // 2 if p & 1 else p // 2 for p in range(8)) == ref.NIBBLE_ORDER[torch.bfloat16]
