// GGUF quantized weights on the CPU, read as stored in the file (blocks.h), torch-free:
// dequantisation to float32 / bfloat16 rows, and y[M, N] = x[M, K] · Wᵀ straight from the blocks,
// so a decoding step streams 4.5 bits per weight (Q4_K) instead of 16.
//
// The matmul is written for the few activation rows of decoding and speculative verification
// (M = 1 .. ~128): each output row n of W is one contiguous run of K / QK blocks, decoded in
// registers and multiplied against every row of x while it is in L1.
//
// Accumulation order (the same in the portable, AVX2 and AVX-512 kernels, bit for bit, and
// depending only on K: never on M, on the other rows of x, or on which rows n a thread owns):
// y[m, n] is built from two 8-lane float32 accumulators A and B (zero at the start) and, for Q4_1,
// a scalar S. With q the integer codes of row n (exact small integers in float32), xb = the K / QK
// block's x, fma = one rounding, lanes j = 0..7, blocks in order:
//
//   dot(w, u)  = the 8-lane partial dot of 8r weights: P[j] = w[j] * u[j], then for r' = 1 .. r-1
//                P[j] = fma(w[8r' + j], u[8r' + j], P[j])
//   Q4_K  for c = 0..3:  A = fma(dot32(q sub-block 2c, xb[64c ..]),      d * sc_2c,     A)
//                        B = fma(dot32(q sub-block 2c+1, xb[64c + 32 ..]), d * sc_2c+1, B)
//         then lane s:   A[s] = fma(-(dmin * m_s), xsum_s, A[s])   (s = 0..7, xsum_s = the sum of
//                        xb over sub-block s, added left to right)
//   Q6_K  for s = 0..15: X = fma(dot16(q_s - 32, xb[16s ..]), d * sc_s, X),  X = A (s even), B (odd)
//   Q8_0  X = fma(dot32(q, xb), d, X),         X = A for even blocks, B for odd ones
//   Q5_0  X = fma(dot32(q - 16, xb), d, X),    likewise
//   Q4_1  X = fma(dot32(q, xb), d, X), likewise, and S = fma(m, xsum of the block, S)
//   end   y = h(A + B) (+ S), h(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))
//
// (d * sc and dmin * m are rounded products; d, m are the fp16 values widened exactly.) The
// lanes are what the AVX2 kernel holds in one ymm register; the AVX-512 kernel runs two rows n in
// the two halves of a zmm register, so each half performs exactly this sequence. Pulling the
// Q4_K / Q4_1 mins out through the sub-block sums of x costs one FMA per sub-block instead of one
// per weight.
//
// Rows n of W are independent: callers split [0, N) over threads.
#pragma once

#include <cstdint>

namespace specdec::gguf {

// y[m * ldy + n] for n in [n_begin, n_end), m in [0, M), from x [M, K] (row-major float32) and
// the weight's blocks (N rows of K / QK blocks of `type`). K is a multiple of QK; type is one of
// blocks.h's Type ids (callers check both).
void matmul_cpu_rows(int32_t type, const float* x, int64_t M, int64_t K, const uint8_t* weight, float* y,
                     int64_t ldy, int64_t n_begin, int64_t n_end);

// Rows [n_begin, n_end) of the dense weight: out[n * K + k] = dequant(W)[n, k], float32 or
// bfloat16 (raw bits, rounded to nearest even from the float32 value), exactly as blocks.h.
void dequantize_cpu_rows(int32_t type, const uint8_t* weight, int64_t K, float* out, int64_t n_begin, int64_t n_end);
void dequantize_cpu_rows_bf16(int32_t type, const uint8_t* weight, int64_t K, uint16_t* out, int64_t n_begin,
                              int64_t n_end);

// The matmul kernel SPECDEC_CPU_ISA and the CPU allow: "avx512", "avx2" or "portable".
const char* matmul_cpu_isa();

}  // namespace specdec::gguf
