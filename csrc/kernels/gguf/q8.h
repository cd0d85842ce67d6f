// GGUF matmul with int8 activations ("Q8 activations"), torch-free: the rows of x are quantised
// once per call to int8 blocks of 32, and every weight block is multiplied against them with
// integer dot products (AVX2 vpmaddubsw / vpmaddwd): 1.4-2x the weight bandwidth of the
// float32-activation kernel of gguf_cpu.h at M = 1, ~2x at M = 5..64 (bench/bench_gguf.py). The
// result is that of x rounded to 8 bits per 32-value block: relative error ~1e-3 .. 1e-2 of
// max|x|·|W| next to gguf_matmul (reference/gguf.py's matmul_q8 reproduces it bit for bit).
//
// Tiers: portable (q8_cpu.cpp, scalar, written straight from the order below), AVX2 (q8_avx2.cpp
// over q8_body.h), AVX-512 (q8_avx512.cpp: the same body with two rows of W per zmm) and AVX-512 +
// VNNI (q8_avx512_vnni.cpp). All give the same bits for finite fp16 scales (the vector tiers widen
// fp16 with F16C, which may quiet a NaN scale's payload).
//
// ---- The activation format --------------------------------------------------------------------
// One row of x [K] (K a multiple of 32) has G = K / 32 groups of 32 values and T = ceil(G / 8)
// "octets" of 8 groups (256 values, a k-quant super-block). Its q8_row_bytes(K) bytes hold,
// structure of arrays, so that a super-block's 8 scales and 16 half sums are one 32-byte load each:
//
//   offset           type      count   what
//   0                int8      K       q[k], the codes
//   K                float32   8 T     d[g], group g's scale (entries g >= G are 0)
//   K + 32 T         int16     16 T    s[h] = q[16h] + ... + q[16h + 15], the sum over half h of
//                                      16 codes (entries h >= 2G are 0)
//   K + 64 T         zero      ..      padding to a multiple of 64 bytes
//
// Quantising group g (values v = x[32g .. 32g + 31]), the same float operations in every tier
// (there is one implementation, quantize_rows_q8):
//   amax = max |v_i|                      (exact)
//   d    = amax / 127                     (one float32 division, rounded to nearest even)
//   q_i  = 0 if d == 0, else clamp(rne(v_i / d), -127, 127)
//          (one float32 division per value; rne = round half to even; -128 never occurs, so
//          negating a code cannot overflow)
// A division rather than a multiply by 1/d: 1/d overflows to inf for a tiny (subnormal) d, where
// v / d is still the right code. Non-finite x gives unspecified (but in-bounds) codes.
//
// ---- The float order of the matmul ------------------------------------------------------------
// Integer sums are exact, so only the float steps need an order; it depends on K alone (never on
// M, on the other rows of x, on [n_begin, n_end), or on the ISA tier). For output y[m, n], with
// an 8-lane float32 accumulator A = 0, for each octet t in order and each lane j = 0..7 (group
// g = 8t + j: a legacy block, or sub-block j of a k-quant super-block t), dx = d[g] of row m,
// q the activation codes of group g, w the weight codes, fp16 values widened exactly, mul = one
// rounded float32 product, fma / fnma = a * b + c / c - a * b rounded once, float() exact:
//
//   Q8_0  A[j] = fma(float(Σ w q), mul(d_w, dx), A[j])
//   Q5_0  A[j] = fma(float(Σ (w - 16) q), mul(d_w, dx), A[j])
//   Q4_1  A[j] = fma(float(Σ w q), mul(d_w, dx), A[j]);  A[j] = fma(float(Σ q), mul(m_w, dx), A[j])
//   Q4_K  A[j] = fma(float(sc_j Σ w q), mul(d, dx), A[j]); A[j] = fnma(float(m_j Σ q), mul(dmin, dx), A[j])
//   Q6_K  A[j] = fma(float(sc_2j Σ_lo16 (w - 32) q + sc_2j+1 Σ_hi16 (w - 32) q), mul(d, dx), A[j])
//   end   y = ((A0 + A4) + (A2 + A6)) + ((A1 + A5) + (A3 + A7))
//
// Lanes j with g >= G (the last octet of a legacy row whose G is not a multiple of 8) are left
// as they are. Every integer above fits an int32 and a float32 exactly (|Q6_K's| < 2^24).
#pragma once

#include <cstdint>

namespace specdec::gguf {

// Bytes of one quantised activation row of K values (K a multiple of 32): K + 64 ceil(K / 256),
// rounded up to a multiple of 64.
int64_t q8_row_bytes(int64_t K);

// xq [M, q8_row_bytes(K)] = the Q8 activations of x [M, K] (row-major float32), in the format
// above, padding included (so the bytes are a function of x alone).
void quantize_rows_q8(const float* x, int64_t M, int64_t K, uint8_t* xq);

// y[m * ldy + n] for n in [n_begin, n_end), m in [0, M), from the Q8 activations xq [M,
// q8_row_bytes(K)] and the weight's blocks (N rows of K / QK blocks of `type`), in the float order
// above. K is a multiple of the format's block; type is one of blocks.h's Type ids (callers check).
void matmul_q8_cpu_rows(int32_t type, const uint8_t* xq, int64_t M, int64_t K, const uint8_t* weight, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end);

// The tier matmul_q8_cpu_rows runs: "avx512-vnni", "avx512", "avx2" or "portable"
// (SPECDEC_CPU_ISA caps it).
const char* matmul_q8_cpu_isa();

}  // namespace specdec::gguf
