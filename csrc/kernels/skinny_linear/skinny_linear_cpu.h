// y = x · Wᵀ (+ bias) in float32 for a few activation rows (decoding, speculative verification),
// torch-free: a weight-streaming kernel that reads each row of W once for up to kMaxBlockM rows
// of x, where a BLAS GEMM at 2..16 rows costs about twice its one-row GEMV on a CPU.
//
// Batch invariance: y[m, n] is one fixed sequence of operations on x[m, :] and W[n, :] (16-lane
// fused multiply-add chains over K in order, then a fixed reduction, then + bias), whatever the
// other rows of x are. So a verification forward over 5 tokens and one-token decoding compute
// each token's logits to the same bits (speculative output then equals autoregressive decoding
// exactly, not only up to near-ties).
#pragma once

#include <cstdint>

namespace specdec::skinny {

inline constexpr int64_t kMaxBlockM = 8;  // activation rows per pass over W (registers: see .cpp)

// Output features [n_begin, n_end) of y [M, N] (row-major float32) from x [M, K] and W [N, K]
// (row-major float32); bias [N] or nullptr.
void skinny_linear_cpu_rows(const float* x, int64_t M, int64_t K, const float* weight, const float* bias,
                            float* y, int64_t N, int64_t n_begin, int64_t n_end);

// The same with a bfloat16 weight (raw bits [N, K]), widened exactly to float32 as it streams in:
// the result equals skinny_linear_cpu_rows on the widened weight, bit for bit. (The fused MTP
// head's LM-head read, where a bf16 head halves the bytes.)
void skinny_linear_cpu_rows_bf16(const float* x, int64_t M, int64_t K, const uint16_t* weight,
                                 const float* bias, float* y, int64_t N, int64_t n_begin, int64_t n_end);

}  // namespace specdec::skinny
